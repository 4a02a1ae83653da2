/*
 * mx -- where mail for a domain goes: MX lookup with c-ares on a libevent loop (RFC 5321
 * section 5: MX records in preference order, equal preferences shuffled, fallback to the
 * domain's A/AAAA when there is no MX, a null MX (RFC 7505) is a permanent failure), and
 * the addresses of a smarthost name.
 *
 * One resolver per loop; lookups never block.  Answers are bounded: at most MX_MAX_TARGETS
 * addresses per lookup.
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

struct mx_target {
	char host[256];                 /* the MX (or smarthost) name, for SNI and logs */
	unsigned preference;            /* MX preference; 0 for A/AAAA fallback */
	struct sockaddr_storage addr;   /* with the port set */
	socklen_t addrlen;
};

/*
 * Create a resolver on base.  servers: "ip[:port],ip[:port]" (tests point it at a local
 * server), or NULL for /etc/resolv.conf.  NULL with err on failure.
 */
struct mx_resolver *mx_resolver_new(struct event_base *base, const char *servers, char *err,
				    size_t errlen);
/* Cancels every pending lookup (their done() runs with -ECANCELED), frees.  Accepts NULL. */
struct mx_resolver *mx_resolver_free(struct mx_resolver *r);

/*
 * done(arg, error, targets, n): error 0 with n >= 1 targets in the order to try them;
 * -ENOENT (the domain does not exist, or has no address: permanent), -ENODATA (a null
 * MX: the domain takes no mail, permanent), -EAGAIN (a temporary DNS failure or
 * timeout), -ECANCELED.  targets is valid during the call only.
 */
typedef void mx_done_fn(void *arg, int error, const struct mx_target *targets, size_t n);

/*
 * Look up name: with use_mx, its MX hosts and their addresses (A and AAAA); without, the
 * addresses of name itself (a smarthost).  A name that is an IP literal ("192.0.2.1",
 * "::1") is answered at once, without DNS, through done() before this returns.  port is
 * set in every address.  0 and *ret (the query, for mx_cancel(); ret may be NULL), or
 * -ENOMEM / -EINVAL.
 */
int mx_lookup(struct mx_resolver *r, const char *name, bool use_mx, uint16_t port,
	      mx_done_fn *done, void *arg, struct mx_query **ret);
/* done() will not run.  Accepts a query that has finished (no-op) only until its done()
 * returned; callers drop their pointer in done(). */
void mx_cancel(struct mx_query *q);

#endif
