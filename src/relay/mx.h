/*
 * mx -- where mail for a domain goes: MX lookup with c-ares on a libevent loop (RFC 5321
 * section 5: MX records in preference order, equal preferences shuffled, fallback to the
 * domain's A/AAAA when there is no MX, a null MX (RFC 7505) is a permanent failure), and
 * the addresses of a smarthost name.
 *
 * One resolver per loop, used only by the thread that runs that loop; lookups never block
 * (except that c-ares reads /etc/hosts, a local file).  Answers are bounded: at most
 * MX_MAX_TARGETS addresses per lookup.  Names are absolute: no search domains are applied.
 *
 * When done() runs: always from the loop, in a callback of its own, never inside
 * mx_lookup() or mx_cancel() -- except for an IP literal, answered inside mx_lookup().
 * done() may start lookups, cancel other lookups, and free the resolver.
 */
#ifndef SLUICE_MX_H
#define SLUICE_MX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct mx_resolver;
struct mx_query;

#define MX_MAX_TARGETS 32
/* A lookup starts only while fewer requests than this are out in c-ares; the others wait
 * in order (TLSA and address lookups first).  c-ares 1.18 walks every request in flight
 * after each event (ares_timeout(), read_answers()), so a list post to 20,000 domains,
 * one lookup per domain at once, cost O(n) per answer: O(n^2) in all.  An MX lookup is
 * one request, then two per MX host (at most 2 * MX_MAX_TARGETS more, so the count may
 * pass the bound by that much per started lookup); 512 keep a resolver busy (about
 * 25,000 lookups a second at 20 ms each). */
#define MX_MAX_REQUESTS 512

struct mx_target {
	char host[256];                 /* the MX (or smarthost) name, for SNI and logs */
	unsigned preference;            /* MX preference; 0 for A/AAAA fallback */
	struct sockaddr_storage addr;   /* with the port set */
	socklen_t addrlen;
	uint32_t ttl;                   /* seconds the answer may be used: the least TTL of
					   the MX and address records it came from;
					   UINT32_MAX: none (an IP literal, /etc/hosts) */
	bool secure;                    /* the MX answer (or its NODATA) was validated by the
					   resolver (AD bit): DANE may apply (RFC 7672 2.2) */
};

/*
 * Create a resolver on base.  servers: "ip[:port],[ip6]:port,..." (tests point it at a
 * local server), or NULL for /etc/resolv.conf.  Each query waits 3 s and is tried 3 times
 * per server (the wait doubling each round).  NULL with err on failure.
 */
struct mx_resolver *mx_resolver_new(struct event_base *base, const char *servers, char *err,
				    size_t errlen);
/*
 * Cancels every pending lookup (their done() runs with -ECANCELED, inside this call; a
 * mx_lookup() from such a done() returns -ECANCELED), frees.  May be called from a done().
 * Accepts NULL.
 */
struct mx_resolver *mx_resolver_free(struct mx_resolver *r);
/*
 * How long one DNS query waits for its first answer (ms, 1-60000; doubled at each round
 * of retries) and how often it is tried per server (1-10).  0, -EINVAL, -EBUSY (lookups
 * are pending), -ECANCELED (being freed), or -ENOMEM / -EIO.
 */
int mx_resolver_set_timeout(struct mx_resolver *r, unsigned timeout_ms, unsigned tries);

/*
 * done(arg, error, targets, n): error 0 with n >= 1 targets in the order to try them;
 * -ENOENT (the domain does not exist, or has no address: permanent), -ENODATA (a null
 * MX: the domain takes no mail, permanent), -EAGAIN (a temporary DNS failure or
 * timeout), -ECANCELED (only from mx_resolver_free()).  targets is valid during the call
 * only.  Within one MX host IPv4 addresses come before IPv6 ones; an address is listed
 * once (under its lowest preference).
 */
typedef void mx_done_fn(void *arg, int error, const struct mx_target *targets, size_t n);

/*
 * Look up name: with use_mx, its MX hosts and their addresses (A and AAAA); without, the
 * addresses of name itself (a smarthost).  "[name]" is name without MX lookup (Postfix's
 * notation).  A name that is an IP literal ("192.0.2.1", "::1", "[192.0.2.1]",
 * "[IPv6:2001:db8::1]") is answered at once, without DNS, through done() before this
 * returns, with *ret set to NULL before done() runs; its target's host is the address
 * text (not a name for SNI).  Names must be ASCII (IDNs as A-labels), labels 1-63 of
 * letters, digits, '-', '_', at most 253 bytes and one final dot.  port is set in every
 * address.  0 and *ret (the query, for mx_cancel(); ret may be NULL), or -ENOMEM,
 * -EINVAL (a bad name or argument), -ECANCELED (the resolver is being freed); done() is
 * not called on an error.
 */
int mx_lookup(struct mx_resolver *r, const char *name, bool use_mx, uint16_t port,
	      mx_done_fn *done, void *arg, struct mx_query **ret);
/* done() will not run.  Accepts NULL, and a query whose done() is running (no-op); after
 * done() returned the query is gone: callers drop their pointer in done(). */
void mx_cancel(struct mx_query *q);

/*
 * The TLSA records of _PORT._tcp.HOST (RFC 6698, RFC 7672 2.2.2), asked with the AD bit.
 * done(arg, error, answer): error 0 with answer->n >= 0 records (answer->malformed more
 * that were too short); -ENOENT: none (NXDOMAIN or NODATA; answer->secure says whether
 * the denial was validated); -EAGAIN: the lookup failed (SERVFAIL, which is what a
 * validating resolver answers for bogus data, REFUSED, a timeout, a malformed answer):
 * DANE must not fall back to less then; -ECANCELED (mx_resolver_free).  answer->secure:
 * the AD bit; answer->ttl: the answer's least TTL, or its denial's (UINT32_MAX: none).
 * answer and its records are valid during the call only.  Same rules as mx_lookup() for
 * when done() runs and for mx_cancel().  0 and *ret, -EINVAL (a bad name), -ENOMEM,
 * -ECANCELED.
 */
struct dns_tlsa;
struct mx_tlsa_answer {
	bool secure;
	uint32_t ttl;
	size_t n;
	size_t malformed;
	const struct dns_tlsa *recs;
};
typedef void mx_tlsa_fn(void *arg, int error, const struct mx_tlsa_answer *answer);
int mx_tlsa_lookup(struct mx_resolver *r, const char *host, uint16_t port, mx_tlsa_fn *done,
		   void *arg, struct mx_query **ret);

/* How long an answer with TTL ttl_s (UINT32_MAX: none, then max_ms) is used: its TTL
 * within [min_ms, max_ms] (the configuration's floor and ceiling; min_ms <= max_ms). */
uint64_t mx_ttl_ms(uint32_t ttl_s, uint64_t min_ms, uint64_t max_ms);
/* The wait before retrying a lookup that failed failures (>= 1) times in a row: min_ms,
 * doubling, at most max_ms. */
uint64_t mx_retry_ms(unsigned failures, uint64_t min_ms, uint64_t max_ms);

#endif
