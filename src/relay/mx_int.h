/*
 * mx_int.h -- the rooms of the MX resolver (mx.h), and what they share.
 *
 *   mx.c         the resolver: the c-ares channel on the loop (its sockets and timer),
 *                the queries' life and their request queue (MX_MAX_REQUESTS), delivery
 *                from the loop, and the API of mx.h.
 *   mx_answer.c  what an answer says, with no I/O: names checked, MX records sorted by
 *                preference (equal ones shuffled), each host's addresses taken and
 *                shuffled, the targets built in order with their TTL, a TLSA answer read
 *                (through proto/dns_answer.c), and how long an answer is used.
 *
 * Calls go one way: mx.c calls mx_answer.c, which calls no other room of the resolver
 * (it touches a query's fields, never its lists, the channel or the loop).
 *
 * Threads: one resolver per event loop; everything below is touched only by the thread
 * that runs that loop (mx.h).
 */
#ifndef SLUICE_MX_INT_H
#define SLUICE_MX_INT_H

#include <ares.h>
#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mx.h"

struct dns_tlsa;

#define MX_NAME_MAX 253           /* a domain name in text, without the final dot */
#define MX_LABEL_MAX 63
#define MX_MAX_HOSTS MX_MAX_TARGETS /* more hosts could never add a target */
#define MX_INPUT_MAX 1024         /* longer input is not looked at */
#define MX_SERVERS_MAX 1024
#define MX_DEFAULT_TIMEOUT_MS 3000u
#define MX_DEFAULT_TRIES 3u
#define MX_DNS_CLASS_IN 1           /* RFC 1035 3.2.4 */
#define MX_DNS_TYPE_MX 15           /* RFC 1035 3.2.2 */

enum mx_fam_state {
	MX_FAM_PENDING = 0,
	MX_FAM_OK,   /* at least one address */
	MX_FAM_NONE, /* permanently none: NXDOMAIN, NODATA, a bad name */
	MX_FAM_TEMP, /* a temporary failure */
};

enum mx_query_state {
	MXQ_RUNNING = 0, /* in r->running, c-ares callbacks outstanding */
	MXQ_WAITING,     /* in r->waiting or waiting_first: not yet handed to c-ares
			    (MX_MAX_REQUESTS) */
	MXQ_READY,       /* in r->ready: finished, done() not yet called */
	MXQ_DELIVERING,  /* in no list: done() is running */
	MXQ_DETACHED,    /* in no list: delivered or cancelled; freed when inflight is 0 */
};

struct mx_host;

enum mx_kind {
	MXK_MX = 0,  /* the domain's MX records, then their hosts' addresses */
	MXK_SELF,    /* the name's own addresses (a smarthost, or use_mx off) */
	MXK_TLSA,    /* TLSA records */
};

/* One A or AAAA lookup of one host; the argument of its c-ares callback. */
struct mx_fam {
	struct mx_query *q;
	int family; /* AF_INET or AF_INET6 */
	enum mx_fam_state state;
	uint32_t ttl; /* the least of its addresses'; UINT32_MAX: none known */
	size_t n;
	uint8_t addr[MX_MAX_TARGETS][16]; /* IPv4 in the first 4 bytes */
};

struct mx_host {
	char name[MX_NAME_MAX + 1];
	unsigned preference;
	struct mx_fam fam[2]; /* [0] A, [1] AAAA: the order targets take */
};

struct mx_query {
	struct mx_resolver *r;
	struct mx_query *prev, *next; /* in r->running, r->waiting or r->ready, by state */
	enum mx_query_state state;
	enum mx_kind kind;        /* what it asks, once it starts */
	mx_done_fn *done;
	mx_tlsa_fn *tlsa_done;    /* a TLSA lookup (mx_tlsa_lookup) instead of done */
	void *arg;
	uint16_t port;
	bool secure;              /* the MX answer had the AD bit */
	uint32_t ttl;             /* the MX answer's least TTL; UINT32_MAX: none */
	uint8_t *answer;          /* a TLSA lookup's answer, as received */
	size_t answer_len;
	unsigned inflight;        /* c-ares callbacks to come, + 1 while being set up, + 1
				     while its hosts wait (r->hosts_first) */
	struct mx_query *hosts_next;
	int error;                /* set by the MX stage; else decided when finishing */
	struct mx_host *hosts;    /* in the order to try them */
	size_t nhosts;
	struct mx_target *targets; /* built when finished */
	size_t ntargets;
	char name[MX_NAME_MAX + 1];
};

struct mx_list {
	struct mx_query *first, *last;
};

/* One socket c-ares asked us to watch. */
struct mx_sock {
	struct mx_sock *next;
	struct mx_resolver *r;
	struct event *ev;
	ares_socket_t fd;
};

struct mx_resolver {
	struct event_base *base;
	ares_channel channel;
	struct event *timer;   /* c-ares' next timeout (ares_timeout()) */
	struct event *deliver; /* made active when r->ready is not empty */
	struct mx_sock *socks;
	struct mx_list running, ready;
	struct mx_list waiting; /* MX queries beyond MX_MAX_REQUESTS, started in order */
	struct mx_list waiting_first; /* TLSA and address queries: started before those */
	struct mx_query *hosts_first, *hosts_last; /* running MX queries whose answer came
				  while MX_MAX_REQUESTS were out: their hosts' address lookups
				  wait, first of all (linked by hosts_next, each holding an
				  inflight reference that is not a request) */
	unsigned requests;      /* the queries' inflight, summed: c-ares requests out, and
				   the holds of queries being set up */
	char *servers;         /* NULL: /etc/resolv.conf */
	unsigned timeout_ms, tries;
	unsigned depth;        /* mx_on_deliver() and mx_resolver_free() frames with done() */
	bool closing;          /* mx_resolver_free() has begun */
};

/* ---- mx_answer.c ---- */

/*
 * A host or domain name as DNS carries it for mail: labels of 1-63 letters, digits,
 * hyphens (and underscores, which some internal names have), at most 253 bytes, one final
 * dot allowed (dropped).  An internationalized name must come as A-labels (xn--).  0 and
 * out (NUL-terminated), or -EINVAL.
 */
int mx_name_check(const char *in, size_t len, char out[MX_NAME_MAX + 1]);
/* t: host (its name, or an IP literal's text) at preference, family's address addr
 * (4 or 16 bytes) and port; its ttl and secure are 0. */
void mx_target_set(struct mx_target *t, const char *host, unsigned preference, int family,
		   const uint8_t *addr, uint16_t port);
/* q's targets in order from its hosts' addresses, or q->error: -EAGAIN if some lookup
 * failed temporarily (or memory ran out), else -ENOENT. */
void mx_query_build(struct mx_query *q);
/* One A or AAAA answer of c-ares (status, res) into fam: its addresses, shuffled. */
void mx_fam_take(struct mx_fam *fam, int status, const struct ares_addrinfo *res);
/* fam answered without c-ares when name is "localhost": true. */
bool mx_fam_localhost(struct mx_fam *fam, const char *name);
/* The MX records of a successful answer become q->hosts: 0 (the hosts are to be looked
 * up), or -1 with q->error set. */
int mx_query_take_mx(struct mx_query *q, const struct ares_mx_reply *list);
/* What ares_query() would have said of an answer to ares_send(); the AD bit and the
 * answer's TTL go into q. */
int mx_answer_status(struct mx_query *q, int status, const unsigned char *abuf, int alen,
		     uint16_t type);
/* A finished TLSA query's answer (q->answer; error: q's verdict so far) into ret, its
 * records in recs[DNS_ANSWER_RR_MAX]: the error its tlsa_done() is given. */
int mx_tlsa_read(const struct mx_query *q, int error, struct mx_tlsa_answer *ret,
		 struct dns_tlsa *recs);

#endif
