/*
 * mx -- where mail for a domain goes (RFC 5321 section 5.1), with c-ares on a libevent loop.
 *
 * With use_mx a lookup asks for the domain's MX records, sorts them by preference (equal
 * preferences in random order), and resolves every MX host's A and AAAA records.  The
 * targets are the first host's addresses, then the next host's, and so on: IPv4 before
 * IPv6 within a host (a relay is more often reachable over IPv4, and an IPv6 black hole
 * costs a connect timeout per address), each family shuffled, duplicates dropped, at most
 * MX_MAX_TARGETS.  A domain without MX records (NODATA) is its own MX at preference 0; a
 * null MX (RFC 7505: "." as the only exchange) takes no mail.  Without use_mx the name's
 * own addresses are the targets (a smarthost).
 *
 *   DNS answer                                   done() error
 *   MX records, some host has an address         0
 *   NXDOMAIN for the domain                      -ENOENT
 *   NODATA: the domain's own A/AAAA instead      (as for its addresses)
 *   null MX                                      -ENODATA
 *   SERVFAIL, REFUSED, timeout, malformed        -EAGAIN
 *   no host has an address                       -EAGAIN if a lookup failed temporarily,
 *                                                else -ENOENT
 *
 * Invariants:
 * - done() never runs inside a c-ares callback.  A finished lookup goes on the ready list
 *   and a deferred event delivers it from the loop, so done() may start lookups, cancel
 *   others, or free the resolver.  IP literals are the one exception (mx.h): done() runs
 *   inside mx_lookup(), and no query object exists for them.
 * - A query lives until its last c-ares callback has come back (inflight), whether it was
 *   delivered or cancelled: c-ares 1.18 cannot cancel one request, so mx_cancel() detaches
 *   the query (its done() will not run) and the remaining callbacks free it.
 *   ares_destroy() brings every outstanding callback back (ARES_EDESTRUCTION), so freeing
 *   the resolver frees every query.
 * - Bounded on hostile answers: at most MX_MAX_HOSTS MX hosts are resolved, at most
 *   MX_MAX_TARGETS addresses kept per host and family, and every name (ours or from an
 *   answer) is checked before it reaches c-ares or a target.  c-ares bounds the messages
 *   themselves (512 bytes over UDP, then 64 KiB over TCP).
 * - Each A and AAAA lookup is its own ares_getaddrinfo() call (AF_INET, then AF_INET6),
 *   not one AF_UNSPEC call: in c-ares 1.18 an AF_UNSPEC lookup reports the status of
 *   whichever family finished last, so a timed-out A with a NODATA AAAA could look like a
 *   permanent "no address" and bounce mail.  ares_getaddrinfo() keeps /etc/hosts, which
 *   a smarthost name may rely on; "localhost" is the loopback address (RFC 6761), answered
 *   without c-ares (see mx_fam_localhost()), but still through the loop.
 * - One resolver per loop and thread; nothing here is thread-safe.
 * - The MX and TLSA queries go out with the AD bit set (ares_send() of a query made by
 *   ares_create_query(): c-ares 1.18 has no flag for it), so that a validating resolver
 *   says whether it validated the answer (RFC 6840 5.7); the answer's header, TTLs and
 *   TLSA records are read by proto/dns_answer.c, bounded and fuzzed.  c-ares still checks
 *   that the answer is the one asked for (id, question).  It does not ask the next server
 *   after a SERVFAIL, REFUSED or NOTIMP (ARES_FLAG_NOCHECKRESP): a validating resolver's
 *   SERVFAIL is its verdict on records that do not validate (maybe an attack), and asking
 *   a server that does not validate would turn it into an unsigned answer, opportunistic
 *   TLS instead of a deferral.  Those answers come back as they are, and a SERVFAIL is a
 *   temporary failure here (mx_answer_status(), mx_tlsa_deliver()); ares_getaddrinfo()
 *   maps them itself (ARES_ESERVFAIL ...).  A timeout still moves on to the next server:
 *   under DANE every configured server must validate (doc/RELAY.md).
 * - A query starts only while fewer than MX_MAX_REQUESTS requests are out in c-ares
 *   (r->requests); the others wait, TLSA and address lookups (r->waiting_first) before MX
 *   lookups (r->waiting), each list first come first started, from the deliver event
 *   (never inside a c-ares callback).  A waiting query is cancelled, or ended by the
 *   resolver's free, as a running one is.
 * - TTLs: a target carries the least TTL of the answers it came from (MX, A/AAAA); a
 *   TLSA answer its own, or its denial's (RFC 2308).  mx_ttl_ms() clamps one into the
 *   configured range, mx_retry_ms() spaces the retries of a failed lookup.
 */
#include "mx.h"

#include <arpa/inet.h>
#include <ares.h>
#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dns_answer.h"
#include "ipaddr.h"
#include "str.h"
#include "util.h"

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

static void mx_list_push(struct mx_list *l, struct mx_query *q)
{
	q->next = NULL;
	q->prev = l->last;
	if (l->last)
		l->last->next = q;
	else
		l->first = q;
	l->last = q;
}

static void mx_list_remove(struct mx_list *l, struct mx_query *q)
{
	if (q->prev)
		q->prev->next = q->next;
	else
		l->first = q->next;
	if (q->next)
		q->next->prev = q->prev;
	else
		l->last = q->prev;
	q->prev = q->next = NULL;
}

/* Where q waits: a TLSA or address lookup (one request or two, and a delivery already
 * waits for it) goes before the MX lookups of a post to many domains. */
static struct mx_list *mx_waiting_list(struct mx_query *q)
{
	return q->kind == MXK_MX ? &q->r->waiting : &q->r->waiting_first;
}

/* The next waiting query, or NULL. */
static struct mx_query *mx_waiting_next(struct mx_resolver *r)
{
	return r->waiting_first.first ? r->waiting_first.first : r->waiting.first;
}

/* ---- names ---- */

static bool mx_name_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_';
}

/*
 * A host or domain name as DNS carries it for mail: labels of 1-63 letters, digits,
 * hyphens (and underscores, which some internal names have), at most 253 bytes, one final
 * dot allowed (dropped).  An internationalized name must come as A-labels (xn--).  0 and
 * out (NUL-terminated), or -EINVAL.
 */
static int mx_name_check(const char *in, size_t len, char out[MX_NAME_MAX + 1])
{
	size_t label = 0;

	if (len > 0 && in[len - 1] == '.')
		len--;
	if (len == 0 || len > MX_NAME_MAX)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)in[i];
		if (c == '.') {
			if (label == 0)
				return -EINVAL;
			label = 0;
		} else if (mx_name_char(c)) {
			if (++label > MX_LABEL_MAX)
				return -EINVAL;
		} else {
			return -EINVAL;
		}
	}
	if (label == 0)
		return -EINVAL;
	memcpy(out, in, len);
	out[len] = '\0';
	return 0;
}

/* ---- targets ---- */

static void mx_target_set(struct mx_target *t, const char *host, unsigned preference, int family,
			  const uint8_t *addr, uint16_t port)
{
	size_t hl = strlen(host);

	memset(t, 0, sizeof(*t));
	if (hl >= sizeof(t->host))
		hl = sizeof(t->host) - 1; /* cannot happen: names are <= MX_NAME_MAX */
	memcpy(t->host, host, hl);
	t->preference = preference;
	if (family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&t->addr;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
		memcpy(&sin->sin_addr, addr, 4);
		t->addrlen = sizeof(*sin);
	} else {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&t->addr;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(port);
		memcpy(&sin6->sin6_addr, addr, 16);
		t->addrlen = sizeof(*sin6);
	}
}

static bool mx_target_same_addr(const struct mx_target *t, int family, const uint8_t *addr)
{
	if (t->addr.ss_family != family)
		return false;
	if (family == AF_INET)
		return memcmp(&((const struct sockaddr_in *)&t->addr)->sin_addr, addr, 4) == 0;
	return memcmp(&((const struct sockaddr_in6 *)&t->addr)->sin6_addr, addr, 16) == 0;
}

/* ---- queries ---- */

static struct mx_query *mx_query_free(struct mx_query *q)
{
	if (!q)
		return NULL;
	free(q->hosts);
	free(q->targets);
	free(q->answer);
	free(q);
	return NULL;
}

/*
 * The targets in order, or the verdict when there is none: -EAGAIN if some lookup failed
 * temporarily (or memory ran out), else -ENOENT.
 */
static void mx_query_build(struct mx_query *q)
{
	size_t total = 0;
	bool temp = false;

	for (size_t i = 0; i < q->nhosts; i++)
		for (size_t f = 0; f < 2; f++) {
			total += q->hosts[i].fam[f].n;
			if (q->hosts[i].fam[f].state == MX_FAM_TEMP ||
			    q->hosts[i].fam[f].state == MX_FAM_PENDING)
				temp = true;
		}
	if (total == 0) {
		q->error = temp ? -EAGAIN : -ENOENT;
		return;
	}
	uint32_t ttl = q->ttl;
	for (size_t i = 0; i < q->nhosts; i++)
		for (size_t f = 0; f < 2; f++)
			if (q->hosts[i].fam[f].state == MX_FAM_OK && q->hosts[i].fam[f].ttl < ttl)
				ttl = q->hosts[i].fam[f].ttl;
	if (total > MX_MAX_TARGETS)
		total = MX_MAX_TARGETS;
	q->targets = calloc(total, sizeof(*q->targets));
	if (!q->targets) {
		q->error = -EAGAIN;
		return;
	}
	for (size_t i = 0; i < q->nhosts && q->ntargets < total; i++) {
		const struct mx_host *h = &q->hosts[i];
		for (size_t f = 0; f < 2; f++) {
			const struct mx_fam *fam = &h->fam[f];
			for (size_t k = 0; k < fam->n && q->ntargets < total; k++) {
				bool dup = false;
				for (size_t j = 0; j < q->ntargets && !dup; j++)
					dup = mx_target_same_addr(&q->targets[j], fam->family,
								  fam->addr[k]);
				if (!dup) {
					struct mx_target *t = &q->targets[q->ntargets++];
					mx_target_set(t, h->name, h->preference, fam->family,
						      fam->addr[k], q->port);
					t->ttl = ttl;
					t->secure = q->secure;
				}
			}
		}
	}
	q->error = 0;
}

/* Every c-ares callback is in: decide, and queue the query for delivery. */
static void mx_query_finish(struct mx_query *q)
{
	struct mx_resolver *r = q->r;

	if (q->error == 0 && !q->tlsa_done)
		mx_query_build(q);
	mx_list_remove(&r->running, q);
	q->state = MXQ_READY;
	mx_list_push(&r->ready, q);
	event_active(r->deliver, EV_TIMEOUT, 1);
}

/* An inflight reference of q is given back: q finishes, or is freed, with its last. */
static void mx_query_drop(struct mx_query *q)
{
	assert(q->inflight > 0);
	if (--q->inflight > 0)
		return;
	if (q->state == MXQ_RUNNING)
		mx_query_finish(q);
	else if (q->state == MXQ_DETACHED)
		mx_query_free(q);
	/* MXQ_DELIVERING: the deliverer frees it when done() returns */
}

static bool mx_anything_waits(const struct mx_resolver *r)
{
	return r->hosts_first || r->waiting_first.first || r->waiting.first;
}

/* One c-ares callback (or the set-up hold) is back. */
static void mx_query_unref(struct mx_query *q)
{
	struct mx_resolver *r = q->r;

	assert(q->inflight > 0 && r->requests > 0);
	r->requests--;
	if (mx_anything_waits(r) && !r->closing && r->requests < MX_MAX_REQUESTS)
		event_active(r->deliver, EV_TIMEOUT, 1); /* a waiting query may start */
	mx_query_drop(q);
}

static void mx_shuffle_addrs(struct mx_fam *fam)
{
	for (size_t i = fam->n; i > 1; i--) {
		size_t j = arc4random_uniform((uint32_t)i);
		uint8_t tmp[16];
		memcpy(tmp, fam->addr[i - 1], 16);
		memcpy(fam->addr[i - 1], fam->addr[j], 16);
		memcpy(fam->addr[j], tmp, 16);
	}
}

static void mx_fam_take(struct mx_fam *fam, int status, const struct ares_addrinfo *res)
{
	static const uint8_t zero[16];
	size_t len = fam->family == AF_INET ? 4 : 16;

	if (status != ARES_SUCCESS) {
		/* NXDOMAIN, NODATA or a name c-ares refuses: no address, permanently. Everything
		 * else (SERVFAIL, REFUSED, timeouts, malformed answers, no memory) may pass. */
		fam->state = (status == ARES_ENOTFOUND || status == ARES_ENODATA ||
			      status == ARES_EBADNAME) ? MX_FAM_NONE : MX_FAM_TEMP;
		return;
	}
	for (const struct ares_addrinfo_node *n = res ? res->nodes : NULL;
	     n && fam->n < MX_MAX_TARGETS; n = n->ai_next) {
		const uint8_t *a;
		if (n->ai_family != fam->family || !n->ai_addr)
			continue;
		if (fam->family == AF_INET) {
			if (n->ai_addrlen < sizeof(struct sockaddr_in))
				continue;
			a = (const uint8_t *)&((const struct sockaddr_in *)n->ai_addr)->sin_addr;
		} else {
			if (n->ai_addrlen < sizeof(struct sockaddr_in6))
				continue;
			a = (const uint8_t *)&((const struct sockaddr_in6 *)n->ai_addr)->sin6_addr;
		}
		/* 0.0.0.0 and :: reach this very host: no MX means that */
		if (memcmp(a, zero, len) == 0)
			continue;
		if (n->ai_ttl >= 0 && (uint32_t)n->ai_ttl < fam->ttl)
			fam->ttl = (uint32_t)n->ai_ttl;
		bool dup = false;
		for (size_t i = 0; i < fam->n && !dup; i++)
			dup = memcmp(fam->addr[i], a, len) == 0;
		if (dup)
			continue;
		memset(fam->addr[fam->n], 0, 16);
		memcpy(fam->addr[fam->n], a, len);
		fam->n++;
	}
	fam->state = fam->n > 0 ? MX_FAM_OK : MX_FAM_NONE;
	mx_shuffle_addrs(fam);
}

static void mx_on_addr(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
	struct mx_fam *fam = arg;
	struct mx_query *q = fam->q;

	if (q->state == MXQ_RUNNING)
		mx_fam_take(fam, status, res);
	if (res)
		ares_freeaddrinfo(res);
	mx_query_unref(q);
}

/*
 * "localhost" is the loopback address (RFC 6761 6.3), answered here and not by c-ares:
 * XXX c-ares 1.18.1 leaks the name on its own localhost path (ares__readaddrinfo() leaves
 * ai->name set when /etc/hosts lacks the family, ares__addrinfo_localhost() overwrites
 * it), 10 bytes per lookup of a smarthost "localhost".
 */
static bool mx_fam_localhost(struct mx_fam *fam, const char *name)
{
	if (strcasecmp(name, "localhost") != 0)
		return false;
	memset(fam->addr[0], 0, 16);
	if (fam->family == AF_INET) {
		static const uint8_t v4[4] = { 127, 0, 0, 1 };
		memcpy(fam->addr[0], v4, sizeof(v4));
	} else {
		fam->addr[0][15] = 1;
	}
	fam->n = 1;
	fam->state = MX_FAM_OK;
	return true;
}

/*
 * Start the A and AAAA lookups of every host.  The caller holds an inflight reference, so
 * a callback that c-ares makes at once (/etc/hosts, errors) cannot finish the query
 * before all are started.
 */
static void mx_query_start_hosts(struct mx_query *q)
{
	for (size_t i = 0; i < q->nhosts; i++) {
		for (size_t f = 0; f < 2; f++) {
			struct mx_fam *fam = &q->hosts[i].fam[f];
			struct ares_addrinfo_hints hints;

			fam->q = q;
			fam->family = f == 0 ? AF_INET : AF_INET6;
			fam->ttl = UINT32_MAX;
			if (mx_fam_localhost(fam, q->hosts[i].name))
				continue;
			memset(&hints, 0, sizeof(hints));
			hints.ai_family = fam->family;
			hints.ai_flags = ARES_AI_NOSORT; /* the RFC 6724 sort probes with sockets */
			q->inflight++;
			q->r->requests++;
			ares_getaddrinfo(q->r->channel, q->hosts[i].name, NULL, &hints, mx_on_addr,
					 fam);
		}
	}
}

/* After q's MX answer: its hosts are looked up now, or first of all once fewer than
 * MX_MAX_REQUESTS are out (an answer may name 32 hosts: 64 requests).  q is held
 * meanwhile by an inflight reference that is not a request (mx_query_drop()). */
static void mx_query_hosts_stage(struct mx_query *q)
{
	struct mx_resolver *r = q->r;

	if (r->requests < MX_MAX_REQUESTS && !r->hosts_first) {
		mx_query_start_hosts(q);
		return;
	}
	q->inflight++;
	q->hosts_next = NULL;
	if (r->hosts_last)
		r->hosts_last->hosts_next = q;
	else
		r->hosts_first = q;
	r->hosts_last = q;
}

/* The first query whose hosts wait, taken off that list, or NULL. */
static struct mx_query *mx_hosts_pop(struct mx_resolver *r)
{
	struct mx_query *q = r->hosts_first;

	if (q) {
		r->hosts_first = q->hosts_next;
		if (!r->hosts_first)
			r->hosts_last = NULL;
		q->hosts_next = NULL;
	}
	return q;
}

/* The name itself as the only host, preference 0: a smarthost, or the implicit MX. */
static int mx_query_set_self(struct mx_query *q)
{
	q->hosts = calloc(1, sizeof(*q->hosts));
	if (!q->hosts)
		return -ENOMEM;
	memcpy(q->hosts[0].name, q->name, sizeof(q->name));
	q->hosts[0].preference = 0;
	q->nhosts = 1;
	return 0;
}

struct mx_rec {
	const char *host;
	unsigned preference;
	uint32_t tiebreak; /* random: equal preferences in random order (RFC 5321 5.1) */
};

static int mx_rec_cmp(const void *a, const void *b)
{
	const struct mx_rec *x = a, *y = b;

	if (x->preference != y->preference)
		return x->preference < y->preference ? -1 : 1;
	if (x->tiebreak != y->tiebreak)
		return x->tiebreak < y->tiebreak ? -1 : 1;
	return 0;
}

/* The MX records of a successful answer become q->hosts, or q->error. */
static void mx_query_take_mx(struct mx_query *q, const struct ares_mx_reply *list)
{
	size_t n = 0, k = 0, nnull = 0, nh = 0;
	struct mx_rec *v;
	struct mx_host *hosts;

	for (const struct ares_mx_reply *p = list; p; p = p->next)
		n++;
	v = calloc(n ? n : 1, sizeof(*v));
	if (!v) {
		q->error = -EAGAIN;
		return;
	}
	for (const struct ares_mx_reply *p = list; p; p = p->next) {
		/* c-ares gives the root name as "" */
		if (!p->host || p->host[0] == '\0' || strcmp(p->host, ".") == 0) {
			nnull++;
			continue;
		}
		v[k++] = (struct mx_rec){ p->host, p->priority, arc4random() };
	}
	if (k == 0) {
		/* RFC 7505: "." as the exchange, and nothing else, takes no mail.  A null MX
		 * beside real ones is a misconfiguration: the real ones are used. */
		free(v);
		q->error = nnull > 0 ? -ENODATA : -ENOENT;
		return;
	}
	qsort(v, k, sizeof(*v), mx_rec_cmp);
	hosts = calloc(k < MX_MAX_HOSTS ? k : MX_MAX_HOSTS, sizeof(*hosts));
	if (!hosts) {
		free(v);
		q->error = -EAGAIN;
		return;
	}
	for (size_t i = 0; i < k && nh < MX_MAX_HOSTS; i++) {
		char name[MX_NAME_MAX + 1];
		struct ipaddr ip;
		bool dup = false;

		/* A malformed exchange, or an address where a name belongs (RFC 5321 5.1
		 * forbids it; Postfix skips it too), is a host that has no address. */
		if (mx_name_check(v[i].host, strlen(v[i].host), name) < 0 ||
		    ipaddr_parse(str_cstr(name), &ip) == 0)
			continue;
		for (size_t j = 0; j < nh && !dup; j++)
			dup = strcasecmp(hosts[j].name, name) == 0;
		if (dup)
			continue; /* the lower preference was kept */
		memcpy(hosts[nh].name, name, sizeof(name));
		hosts[nh].preference = v[i].preference;
		nh++;
	}
	free(v);
	if (nh == 0) {
		free(hosts);
		q->error = -ENOENT;
		return;
	}
	q->hosts = hosts;
	q->nhosts = nh;
	mx_query_hosts_stage(q);
}

/*
 * What ares_query() would have said of an answer to ares_send(): NXDOMAIN is
 * ARES_ENOTFOUND, NOERROR without an answer ARES_ENODATA, a malformed one ARES_EBADRESP.
 * The AD bit and the TTL of the answer go into q.
 */
static int mx_answer_status(struct mx_query *q, int status, const unsigned char *abuf, int alen,
			    uint16_t type)
{
	struct dns_answer a;

	if (status != ARES_SUCCESS)
		return status;
	if (!abuf || alen <= 0 || dns_answer_parse(abuf, (size_t)alen, type, &a) < 0)
		return ARES_EBADRESP;
	q->secure = a.ad;
	if (a.rcode == DNS_RCODE_NXDOMAIN)
		return ARES_ENOTFOUND;
	if (a.rcode != DNS_RCODE_NOERROR)
		return ARES_ESERVFAIL;
	if (a.n == 0) {
		if (a.neg_ttl < q->ttl)
			q->ttl = a.neg_ttl;
		return ARES_ENODATA;
	}
	if (a.ttl < q->ttl)
		q->ttl = a.ttl;
	return ARES_SUCCESS;
}

static void mx_query_on_mx(struct mx_query *q, int status, const unsigned char *abuf, int alen)
{
	struct ares_mx_reply *mx = NULL;
	int rc;

	status = mx_answer_status(q, status, abuf, alen, DNS_TYPE_MX);
	switch (status) {
	case ARES_SUCCESS:
		break;
	case ARES_ENODATA: /* NOERROR without MX: the domain is its own MX */
		if (mx_query_set_self(q) < 0)
			q->error = -EAGAIN;
		else
			mx_query_hosts_stage(q);
		return;
	case ARES_ENOTFOUND: /* NXDOMAIN */
		q->error = -ENOENT;
		return;
	default: /* SERVFAIL, REFUSED, timeout, FORMERR, NOTIMP, no memory ... */
		q->error = -EAGAIN;
		return;
	}
	rc = ares_parse_mx_reply(abuf, alen, &mx);
	if (rc == ARES_ENODATA || (rc == ARES_SUCCESS && !mx)) {
		/* answers, but no MX among them (a CNAME alone; c-ares 1.18 then says
		 * success with an empty list): as NODATA */
		if (mx_query_set_self(q) < 0)
			q->error = -EAGAIN;
		else
			mx_query_hosts_stage(q);
		return;
	}
	if (rc != ARES_SUCCESS) {
		q->error = -EAGAIN; /* malformed (or no memory): maybe a broken server */
		if (mx)
			ares_free_data(mx);
		return;
	}
	mx_query_take_mx(q, mx);
	ares_free_data(mx);
}

/*
 * Send one query for name with the AD bit set (RFC 6840 5.7: a validating resolver then
 * says whether it validated the answer); c-ares sets a random id.  The query holds one
 * more inflight reference, given back by cb.  0, or -ENOMEM (nothing sent).
 */
static int mx_send(struct mx_query *q, const char *name, int type, ares_callback cb)
{
	unsigned char *buf = NULL;
	int buflen = 0;

	if (ares_create_query(name, MX_DNS_CLASS_IN, type, 0, 1, &buf, &buflen, 0) !=
		    ARES_SUCCESS || buflen < 12) {
		if (buf)
			ares_free_string(buf);
		return -ENOMEM;
	}
	buf[3] |= 0x20; /* AD */
	q->inflight++;
	q->r->requests++;
	ares_send(q->r->channel, buf, buflen, cb, q);
	ares_free_string(buf);
	return 0;
}

static void mx_on_mx(void *arg, int status, int timeouts, unsigned char *abuf, int alen)
{
	struct mx_query *q = arg;

	if (q->state == MXQ_RUNNING)
		mx_query_on_mx(q, status, abuf, alen);
	mx_query_unref(q);
}

/* ---- the loop: sockets, timer, delivery ---- */

static void mx_rearm(struct mx_resolver *r)
{
	struct timeval tv, *tvp;

	if (!r->channel)
		return;
	tvp = ares_timeout(r->channel, NULL, &tv);
	if (tvp)
		evtimer_add(r->timer, tvp);
	else
		evtimer_del(r->timer);
}

static void mx_on_sock_event(evutil_socket_t fd, short what, void *arg)
{
	struct mx_sock *s = arg;
	struct mx_resolver *r = s->r; /* s may be freed by ares_process_fd() */

	ares_process_fd(r->channel, (what & EV_READ) ? (ares_socket_t)fd : ARES_SOCKET_BAD,
			(what & EV_WRITE) ? (ares_socket_t)fd : ARES_SOCKET_BAD);
	mx_rearm(r);
}

static void mx_on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct mx_resolver *r = arg;

	ares_process_fd(r->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
	mx_rearm(r);
}

static void mx_sock_free(struct mx_resolver *r, struct mx_sock *s)
{
	for (struct mx_sock **pp = &r->socks; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	/* event_free() may run inside this event's own callback: libevent 2.1 does not
	 * touch an event after calling its callback. */
	event_free(s->ev);
	free(s);
}

/*
 * c-ares tells which sockets to watch.  A change of interest replaces the event.  Without
 * memory for the event the socket goes unwatched, and its query ends by timeout (-EAGAIN):
 * there is no way to report the failure to c-ares.
 */
static void mx_on_sock_state(void *data, ares_socket_t fd, int readable, int writable)
{
	struct mx_resolver *r = data;
	struct mx_sock *s;
	short what = (short)((readable ? EV_READ : 0) | (writable ? EV_WRITE : 0));

	for (s = r->socks; s; s = s->next)
		if (s->fd == fd)
			break;
	if (s)
		mx_sock_free(r, s);
	if (what == 0)
		return;
	s = calloc(1, sizeof(*s));
	if (!s)
		return;
	s->r = r;
	s->fd = fd;
	s->ev = event_new(r->base, fd, (short)(what | EV_PERSIST), mx_on_sock_event, s);
	if (!s->ev || event_add(s->ev, NULL) < 0) {
		if (s->ev)
			event_free(s->ev);
		free(s);
		return;
	}
	s->next = r->socks;
	r->socks = s;
}

/* The resolver's memory, once nothing refers to it. */
static void mx_resolver_release(struct mx_resolver *r)
{
	free(r->servers);
	free(r);
}

/*
 * A TLSA lookup's answer, read now: error 0 with the records (secure when the AD bit was
 * set), -ENOENT for NXDOMAIN or NODATA (secure: a validated denial), -EAGAIN for the rest.
 */
static void mx_tlsa_deliver(struct mx_query *q, int error)
{
	struct mx_tlsa_answer ans;
	struct dns_tlsa recs[DNS_ANSWER_RR_MAX];
	struct dns_answer a;

	memset(&ans, 0, sizeof(ans));
	ans.ttl = UINT32_MAX;
	ans.recs = recs;
	if (error == 0) {
		if (!q->answer || dns_answer_parse(q->answer, q->answer_len, DNS_TYPE_TLSA, &a) < 0 ||
		    (a.rcode != DNS_RCODE_NOERROR && a.rcode != DNS_RCODE_NXDOMAIN)) {
			error = -EAGAIN;
		} else {
			ans.secure = a.ad;
			if (a.rcode == DNS_RCODE_NXDOMAIN || a.n == 0) {
				error = -ENOENT;
				ans.ttl = a.neg_ttl;
			} else {
				ans.ttl = a.ttl;
				for (size_t i = 0; i < a.n; i++)
					if (dns_tlsa_parse(&a.rr[i], &recs[ans.n]) == 0)
						ans.n++;
				ans.malformed = a.n - ans.n + a.dropped;
			}
		}
	} else if (error != -ECANCELED) {
		error = -EAGAIN;
	}
	q->tlsa_done(q->arg, error, &ans);
}

/* done() or tlsa_done() of a finished (or cancelled) query. */
static void mx_query_call(struct mx_query *q, int error)
{
	if (q->tlsa_done)
		mx_tlsa_deliver(q, error);
	else if (error == -ECANCELED)
		q->done(q->arg, error, NULL, 0);
	else
		q->done(q->arg, error, q->targets, q->ntargets);
}

static void mx_query_launch(struct mx_query *q);

static void mx_on_deliver(evutil_socket_t fd, short what, void *arg)
{
	struct mx_resolver *r = arg;
	struct mx_query *q;

	r->depth++;
	while (!r->closing && (q = r->ready.first) != NULL) {
		mx_list_remove(&r->ready, q);
		q->state = MXQ_DELIVERING;
		mx_query_call(q, q->error);
		q->state = MXQ_DETACHED;
		if (q->inflight == 0)
			mx_query_free(q);
	}
	/* room left by the requests that came back: the hosts of MX answers first (their
	 * queries are half done), then TLSA and address lookups, then MX lookups */
	while (!r->closing && r->requests < MX_MAX_REQUESTS) {
		if ((q = mx_hosts_pop(r)) != NULL) {
			if (q->state == MXQ_RUNNING)
				mx_query_start_hosts(q);
			mx_query_drop(q); /* the hold of mx_query_hosts_stage() */
			mx_rearm(r);
			continue;
		}
		if ((q = mx_waiting_next(r)) == NULL)
			break;
		mx_list_remove(mx_waiting_list(q), q);
		mx_query_launch(q);
	}
	if (--r->depth == 0 && r->closing)
		mx_resolver_release(r); /* done() freed the resolver */
}

/* ---- the channel ---- */

static pthread_once_t mx_once = PTHREAD_ONCE_INIT;
static int mx_library_status = ARES_ENOTINITIALIZED;

static void mx_library_init(void)
{
	mx_library_status = ares_library_init(ARES_LIB_INIT_ALL);
}

static void mx_err(char *err, size_t errlen, const char *what, int status)
{
	if (err && errlen > 0)
		(void)fmt_fixed(err, errlen, "%s: %s", what, ares_strerror(status));
}

/*
 * A channel with r's settings.  No search domains (mail names are absolute; a search
 * domain would turn a missing domain into somebody else's), no HOSTALIASES.
 */
static int mx_channel_new(struct mx_resolver *r, ares_channel *ret, char *err, size_t errlen)
{
	struct ares_options o;
	ares_channel ch;
	int mask = ARES_OPT_FLAGS | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_SOCK_STATE_CB |
		   ARES_OPT_DOMAINS;
	int rc;

	memset(&o, 0, sizeof(o));
	o.flags = ARES_FLAG_NOSEARCH | ARES_FLAG_NOALIASES | ARES_FLAG_NOCHECKRESP;
	o.timeout = (int)r->timeout_ms;
	o.tries = (int)r->tries;
	o.sock_state_cb = mx_on_sock_state;
	o.sock_state_cb_data = r;
	o.domains = NULL;
	o.ndomains = 0;
	rc = ares_init_options(&ch, &o, mask);
	if (rc != ARES_SUCCESS) {
		mx_err(err, errlen, "c-ares", rc);
		return rc == ARES_ENOMEM ? -ENOMEM : -EIO;
	}
	if (r->servers) {
		rc = ares_set_servers_ports_csv(ch, r->servers);
		if (rc != ARES_SUCCESS) {
			ares_destroy(ch);
			mx_err(err, errlen, "DNS servers", rc);
			return rc == ARES_ENOMEM ? -ENOMEM : -EINVAL;
		}
	}
	*ret = ch;
	return 0;
}

/* ---- API ---- */

struct mx_resolver *mx_resolver_new(struct event_base *base, const char *servers, char *err,
				    size_t errlen)
{
	struct mx_resolver *r;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!base) {
		if (err && errlen > 0)
			(void)fmt_fixed(err, errlen, "no event base");
		return NULL;
	}
	if (servers && (servers[0] == '\0' || strnlen(servers, MX_SERVERS_MAX + 1) >
						      MX_SERVERS_MAX)) {
		if (err && errlen > 0)
			(void)fmt_fixed(err, errlen, "DNS servers: empty or too long");
		return NULL;
	}
	pthread_once(&mx_once, mx_library_init);
	if (mx_library_status != ARES_SUCCESS) {
		mx_err(err, errlen, "c-ares", mx_library_status);
		return NULL;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		goto nomem;
	r->base = base;
	r->timeout_ms = MX_DEFAULT_TIMEOUT_MS;
	r->tries = MX_DEFAULT_TRIES;
	if (servers && !(r->servers = strdup(servers)))
		goto nomem;
	r->timer = evtimer_new(base, mx_on_timer, r);
	r->deliver = event_new(base, -1, 0, mx_on_deliver, r);
	if (!r->timer || !r->deliver)
		goto nomem;
	if (mx_channel_new(r, &r->channel, err, errlen) < 0)
		goto fail;
	return r;
nomem:
	if (err && errlen > 0)
		(void)fmt_fixed(err, errlen, "out of memory");
fail:
	if (r) {
		if (r->timer)
			event_free(r->timer);
		if (r->deliver)
			event_free(r->deliver);
		mx_resolver_release(r);
	}
	return NULL;
}

int mx_resolver_set_timeout(struct mx_resolver *r, unsigned timeout_ms, unsigned tries)
{
	ares_channel ch, old;
	unsigned old_timeout, old_tries;
	int rc;

	if (!r || timeout_ms == 0 || timeout_ms > 60000 || tries == 0 || tries > 10)
		return -EINVAL;
	if (r->closing)
		return -ECANCELED;
	if (r->running.first)
		return -EBUSY;
	old_timeout = r->timeout_ms;
	old_tries = r->tries;
	r->timeout_ms = timeout_ms;
	r->tries = tries;
	rc = mx_channel_new(r, &ch, NULL, 0);
	if (rc < 0) {
		r->timeout_ms = old_timeout;
		r->tries = old_tries;
		return rc;
	}
	/* Only detached (cancelled) queries can still wait on the old channel: destroying it
	 * brings their callbacks back and frees them, and closes its sockets. */
	old = r->channel;
	r->channel = ch;
	ares_destroy(old);
	mx_rearm(r);
	return 0;
}

struct mx_resolver *mx_resolver_free(struct mx_resolver *r)
{
	struct mx_query *q;

	if (!r || r->closing)
		return NULL; /* a done() freeing again during the cancellations below */
	r->closing = true;
	r->depth++;
	while ((q = r->running.first ? r->running.first
				     : r->ready.first ? r->ready.first : mx_waiting_next(r)) != NULL) {
		mx_list_remove(q->state == MXQ_RUNNING ? &r->running
			       : q->state == MXQ_READY ? &r->ready : mx_waiting_list(q), q);
		q->state = MXQ_DELIVERING;
		mx_query_call(q, -ECANCELED);
		q->state = MXQ_DETACHED;
		if (q->inflight == 0)
			mx_query_free(q);
	}
	/* those whose hosts waited are cancelled above: their holds go, and they with them */
	while ((q = mx_hosts_pop(r)) != NULL)
		mx_query_drop(q);
	/* Brings every outstanding callback back (ARES_EDESTRUCTION): the detached queries
	 * are freed, and each socket is reported closed (mx_on_sock_state()). */
	ares_destroy(r->channel);
	r->channel = NULL;
	while (r->socks)
		mx_sock_free(r, r->socks);
	event_free(r->timer);
	r->timer = NULL;
	event_free(r->deliver); /* may be the running event: see mx_sock_free() */
	r->deliver = NULL;
	if (--r->depth == 0)
		mx_resolver_release(r);
	return NULL;
}

/* An IP literal as the one target.  NUL-terminated text of a sane length only. */
static void mx_answer_literal(const struct ipaddr *ip, uint16_t port, mx_done_fn *done,
			      void *arg)
{
	struct mx_target t;
	char text[IPADDR_TEXT_MAX];

	if (ipaddr_format(ip, 128, text, sizeof(text)) < 0)
		text[0] = '\0';
	mx_target_set(&t, text, 0, ip->family == 4 ? AF_INET : AF_INET6, ip->b, port);
	t.ttl = UINT32_MAX; /* no DNS: relay.dns_max_ttl */
	done(arg, 0, &t, 1);
}

/* A query of name (len bytes, checked), not yet running.  0 and *ret, -EINVAL, -ENOMEM. */
static int mx_query_new(struct mx_resolver *r, const char *name, size_t len, void *arg,
			uint16_t port, struct mx_query **ret)
{
	struct mx_query *q = calloc(1, sizeof(*q));
	int rc;

	if (!q)
		return -ENOMEM;
	rc = mx_name_check(name, len, q->name);
	if (rc < 0) {
		mx_query_free(q);
		return rc;
	}
	q->r = r;
	q->arg = arg;
	q->port = port;
	q->ttl = UINT32_MAX;
	*ret = q;
	return 0;
}

/* q runs, held until its lookups are started (mx_query_started()). */
static void mx_query_run(struct mx_query *q)
{
	q->state = MXQ_RUNNING;
	q->inflight = 1;
	q->r->requests++;
	mx_list_push(&q->r->running, q);
}

/* Its lookups are started: the hold is given back, which may finish q (/etc/hosts,
 * localhost, a failure to send): done() comes later, from the loop. */
static void mx_query_started(struct mx_query *q)
{
	struct mx_resolver *r = q->r;

	mx_query_unref(q);
	mx_rearm(r);
}

static void mx_on_tlsa(void *arg, int status, int timeouts, unsigned char *abuf, int alen);

/* Hand q's first requests to c-ares. */
static void mx_query_launch(struct mx_query *q)
{
	mx_query_run(q);
	switch (q->kind) {
	case MXK_MX:
		if (mx_send(q, q->name, MX_DNS_TYPE_MX, mx_on_mx) < 0)
			q->error = -EAGAIN;
		break;
	case MXK_SELF:
		mx_query_start_hosts(q);
		break;
	case MXK_TLSA:
		if (mx_send(q, q->name, DNS_TYPE_TLSA, mx_on_tlsa) < 0)
			q->error = -EAGAIN;
		break;
	}
	mx_query_started(q);
}

/* q starts now, or waits its turn while MX_MAX_REQUESTS are out. */
static void mx_query_begin(struct mx_query *q, struct mx_query **ret)
{
	struct mx_resolver *r = q->r;

	if (ret)
		*ret = q;
	if (r->requests >= MX_MAX_REQUESTS || mx_anything_waits(r)) {
		q->state = MXQ_WAITING;
		mx_list_push(mx_waiting_list(q), q);
		return;
	}
	mx_query_launch(q);
}

int mx_lookup(struct mx_resolver *r, const char *name, bool use_mx, uint16_t port,
	      mx_done_fn *done, void *arg, struct mx_query **ret)
{
	struct mx_query *q;
	struct ipaddr ip;
	size_t len;
	int rc;

	if (!r || !name || !done)
		return -EINVAL;
	if (r->closing)
		return -ECANCELED;
	len = strnlen(name, MX_INPUT_MAX + 1);
	if (len > MX_INPUT_MAX)
		return -EINVAL;
	if (ipaddr_parse(str_make(name, len), &ip) == 0) {
		if (ret)
			*ret = NULL;
		mx_answer_literal(&ip, port, done, arg); /* may free r: touch nothing after */
		return 0;
	}
	/* "[name]": Postfix's notation for "this host, no MX lookup" */
	if (len >= 2 && name[0] == '[' && name[len - 1] == ']') {
		name++;
		len -= 2;
		use_mx = false;
	}
	rc = mx_query_new(r, name, len, arg, port, &q);
	if (rc < 0)
		return rc;
	q->done = done;
	if (!use_mx && mx_query_set_self(q) < 0) {
		mx_query_free(q);
		return -ENOMEM;
	}
	q->kind = use_mx ? MXK_MX : MXK_SELF;
	mx_query_begin(q, ret);
	return 0;
}

void mx_cancel(struct mx_query *q)
{
	if (!q)
		return;
	switch (q->state) {
	case MXQ_RUNNING:
		mx_list_remove(&q->r->running, q);
		q->state = MXQ_DETACHED;
		q->done = NULL; /* its callbacks still to come free it */
		break;
	case MXQ_READY:
	case MXQ_WAITING: /* no request out: nothing to wait for */
		mx_list_remove(q->state == MXQ_READY ? &q->r->ready : mx_waiting_list(q), q);
		q->state = MXQ_DETACHED;
		mx_query_free(q);
		break;
	case MXQ_DELIVERING: /* inside its own done(): nothing to do */
	case MXQ_DETACHED:
		break;
	}
}

/* ---- TLSA (RFC 6698, RFC 7672) ---- */

static void mx_on_tlsa(void *arg, int status, int timeouts, unsigned char *abuf, int alen)
{
	struct mx_query *q = arg;

	if (q->state == MXQ_RUNNING) {
		if (status != ARES_SUCCESS || !abuf || alen <= 0) {
			q->error = -EAGAIN; /* SERVFAIL (bogus), REFUSED, timeout, ... */
		} else if (!(q->answer = malloc((size_t)alen))) {
			q->error = -EAGAIN;
		} else {
			memcpy(q->answer, abuf, (size_t)alen);
			q->answer_len = (size_t)alen;
		}
	}
	mx_query_unref(q);
}

int mx_tlsa_lookup(struct mx_resolver *r, const char *host, uint16_t port, mx_tlsa_fn *done,
		   void *arg, struct mx_query **ret)
{
	struct mx_query *q;
	char name[MX_INPUT_MAX];
	size_t len;
	int n;

	if (!r || !host || !done || port == 0)
		return -EINVAL;
	if (r->closing)
		return -ECANCELED;
	n = snprintf(name, sizeof(name), "_%u._tcp.%s", (unsigned)port, host);
	if (n < 0 || (size_t)n >= sizeof(name))
		return -EINVAL;
	len = (size_t)n;
	int rc = mx_query_new(r, name, len, arg, port, &q);
	if (rc < 0)
		return rc;
	q->tlsa_done = done;
	q->kind = MXK_TLSA;
	mx_query_begin(q, ret);
	return 0;
}

/* ---- how long an answer is used ---- */

uint64_t mx_ttl_ms(uint32_t ttl_s, uint64_t min_ms, uint64_t max_ms)
{
	uint64_t ms = ttl_s == UINT32_MAX ? max_ms : (uint64_t)ttl_s * 1000u;

	if (ms > max_ms)
		ms = max_ms;
	if (ms < min_ms)
		ms = min_ms;
	return ms;
}

uint64_t mx_retry_ms(unsigned failures, uint64_t min_ms, uint64_t max_ms)
{
	uint64_t ms = min_ms;

	for (unsigned i = 1; i < failures && ms < max_ms; i++)
		ms *= 2;
	return ms < max_ms ? ms : max_ms;
}
