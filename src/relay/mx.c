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
 *   temporary failure here (mx_answer_status(), mx_tlsa_read()); ares_getaddrinfo()
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
 *
 * Rooms (mx_int.h): this file holds the channel, the queries and their queue, delivery
 * and the API; what an answer says (names, the MX records' order, addresses, targets, a
 * TLSA answer, TTLs) is read in mx_answer.c, which calls nothing here.
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
#include "mx_int.h"
#include "str.h"
#include "util.h"

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
	if (mx_query_take_mx(q, mx) == 0)
		mx_query_hosts_stage(q);
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

/* done() or tlsa_done() of a finished (or cancelled) query. */
static void mx_query_call(struct mx_query *q, int error)
{
	if (q->tlsa_done) {
		struct mx_tlsa_answer ans;
		struct dns_tlsa recs[DNS_ANSWER_RR_MAX];

		error = mx_tlsa_read(q, error, &ans, recs);
		q->tlsa_done(q->arg, error, &ans);
	} else if (error == -ECANCELED) {
		q->done(q->arg, error, NULL, 0);
	} else {
		q->done(q->arg, error, q->targets, q->ntargets);
	}
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

