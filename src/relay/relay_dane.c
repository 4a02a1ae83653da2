/*
 * relay_dane -- DANE for direct delivery (RFC 7672), on the relay's thread: what TLS a
 * connection to one MX host of an mx lane must have, from the host's TLSA records.
 *
 * Under tls = "dane" (Postfix's smtp_tls_security_level = dane) and "dane-only":
 *
 *   the MX answer         the TLSA answer of _PORT._tcp.HOST      dane          dane-only
 *   not validated (no AD) (not asked)                              may           deferred
 *   validated             none, or not validated                   may           deferred
 *   validated             validated, none usable (usages 0 and 1)  TLS required  deferred
 *   validated             validated, usable records                verified      verified
 *   validated             lookup failed (SERVFAIL: bogus; timeout) deferred      deferred
 *
 * "Validated" is the resolver's AD bit: DANE needs a validating resolver on the machine
 * (or one reached over a trusted path), as Postfix does.  "Verified": the handshake must
 * match a usable record (OpenSSL's DANE, DANE-EE without name checks, DANE-TA against the
 * MX host's name); a mismatch fails the connection, and the next MX host is tried.
 * "Deferred": the next MX host is tried (RFC 7672 2.2: as one that cannot be reached);
 * once every one was, the lane's due recipients wait for their next retry (relay.retry),
 * with the reason in their attempt log (`sluice queue`), the log and `sluice lanes`;
 * never bounced: a DANE failure may be an attack, or a rollover, and passes.  At most
 * 256 messages per event (lane_defer_due): the lane is kicked again for the rest.  (An MX
 * answer that is not validated is every host's: dane-only defers at once.)  A TLSA
 * answer with records sluice does not read (past DNS_ANSWER_RR_MAX, too large, or
 * malformed) and none usable among those it read is a failed lookup, not unverified TLS;
 * a TLSA name too long to exist (_PORT._tcp. and a 253-character host) is "no records".
 *
 * The relay keeps the TLSA answers of MX hosts by name and port, shared by the lanes
 * (at most DANE_CACHE_MAX; expired ones go when it is full), for their TTL, within
 * relay.dns_min_ttl and dns_max_ttl; the lanes that wait for a lookup are kicked at its
 * end; a failed lookup is asked again after relay.dns_retry_min, doubling up to
 * dns_retry_max.  An answer serves the connection attempt that asked for it even when its
 * TTL is already over (TTL 0 with dns_min_ttl = 0): "fresh".  A connection is reused only
 * while the answers it was made from hold (dane_reusable()).
 *
 * XXX the MX hosts' address records are not checked for validation (RFC 7672 2.2.2 skips
 * TLSA lookups for a host whose addresses are insecure): a host in an unsigned zone has no
 * validated TLSA records either, so this costs a lookup, not security.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


#include "dns_answer.h"
#include "relay_int.h"
#include "util.h"

#define DANE_CACHE_MAX 65536    /* hosts in the relay's TLSA cache */

enum dane_state {
	DH_EMPTY = 0,
	DH_LOOKING,   /* a lookup is under way (q) */
	DH_NONE,      /* no usable answer: no records, or not validated */
	DH_UNUSABLE,  /* validated records, none usable for SMTP */
	DH_RECORDS,   /* validated usable records */
	DH_FAILED,    /* the lookup failed: deliveries wait */
};

enum dane_reason {  /* what why() says of a state */
	DR_NONE = 0,
	DR_NO_RECORDS, DR_NOT_VALIDATED, DR_TOO_LONG,          /* DH_NONE */
	DR_SERVFAIL, DR_CANNOT, DR_NOMEM, DR_UNREAD,           /* DH_FAILED */
};

/* One host:port's TLSA answer, shared by every lane whose MX hosts include it. */
struct dane_host {
	struct htab_node hnode;       /* in the relay's cache */
	struct relay *r;
	uint16_t port;
	uint8_t state;                /* enum dane_state */
	uint8_t reason;               /* enum dane_reason */
	bool fresh;                   /* not yet used by an attempt since it came */
	int err;                      /* DR_CANNOT: the errno */
	uint64_t until;               /* ns: the answer's end, or a failure's retry time */
	unsigned failures;            /* lookups failed in a row */
	struct mx_query *q;
	struct smtp_out_tlsa *recs;   /* DH_RECORDS: the usable ones, data in the same block */
	size_t n;                     /* DH_RECORDS: usable; DR_UNREAD: records not read */
	struct lane **waiters;        /* DH_LOOKING: the lanes kicked at its end */
	size_t nwait, wait_cap;
	char host[];
};

/* The relay's TLSA answers by host and port (a chained hash keyed with a secret: the
 * names come from peers' MX records). */
struct dane_cache {
	struct htab t;
	uint64_t swept;               /* ns: the last sweep of expired entries */
};

/* Why dh is in its state, for logs, attempt logs and `sluice lanes`. */
static const char *dane_why(const struct dane_host *dh, char *buf, size_t size)
{
	unsigned port = dh->port;
	switch ((enum dane_state)dh->state) {
	case DH_RECORDS:
		snprintf(buf, size, "%zu usable TLSA record(s) of %.200s", dh->n, dh->host);
		break;
	case DH_UNUSABLE:
		snprintf(buf, size, "TLSA records of %.200s, none usable (usages 0 and 1 are not "
			 "for SMTP): TLS without verification", dh->host);
		break;
	case DH_NONE:
		if (dh->reason == DR_TOO_LONG)
			snprintf(buf, size, "no TLSA records can exist for _%u._tcp.%.200s (too long "
				 "a name)", port, dh->host);
		else
			snprintf(buf, size, "%s TLSA records for _%u._tcp.%.200s",
				 dh->reason == DR_NO_RECORDS ? "no" : "no DNSSEC-validated", port,
				 dh->host);
		break;
	case DH_FAILED:
		if (dh->reason == DR_CANNOT)
			snprintf(buf, size, "the TLSA lookup of %.200s cannot be made: %s", dh->host,
				 strerror(dh->err));
		else if (dh->reason == DR_NOMEM)
			snprintf(buf, size, "out of memory for the TLSA records of %.200s", dh->host);
		else if (dh->reason == DR_UNREAD)
			snprintf(buf, size, "the TLSA answer of %.200s has %zu record(s) sluice does "
				 "not read (malformed, too many, or too large), none usable", dh->host,
				 dh->n);
		else
			snprintf(buf, size, "the TLSA lookup of _%u._tcp.%.200s failed (SERVFAIL: "
				 "records that do not validate, or no answer)", port, dh->host);
		break;
	default:
		snprintf(buf, size, "no TLSA answer yet for %.200s", dh->host);
		break;
	}
	return buf;
}

/* The hash of host:port, the host's case aside. */
static uint64_t dane_key_hash(struct dane_cache *dc, const char *host, uint16_t port)
{
	char key[300];
	int n = snprintf(key, sizeof(key), "%u:%s", (unsigned)port, host);
	for (int i = 0; i < n; i++)
		key[i] = (char)(key[i] >= 'A' && key[i] <= 'Z' ? key[i] + 32 : key[i]);
	return htab_hash(&dc->t, key, (size_t)(n < 0 ? 0 : n));
}

static void dane_host_clear(struct dane_host *dh)
{
	free(dh->recs);
	dh->recs = NULL;
	dh->n = 0;
}

/* l no longer waits for a lookup's end (it goes, or was kicked). */
static void dane_unwait(struct lane *l)
{
	struct dane_host *dh = l->dane_wait;
	if (!dh)
		return;
	for (size_t i = 0; i < dh->nwait; i++)
		if (dh->waiters[i] == l) {
			dh->waiters[i] = dh->waiters[--dh->nwait];
			break;
		}
	l->dane_wait = NULL;
}

void dane_free(struct lane *l)
{
	dane_unwait(l);
}

static void dane_host_free(struct dane_host *dh)
{
	for (size_t i = 0; i < dh->nwait; i++)
		dh->waiters[i]->dane_wait = NULL;
	free(dh->waiters);
	mx_cancel(dh->q);
	dane_host_clear(dh);
	free(dh);
}

static bool drop_any(struct htab_node *n, void *arg)
{
	(void)arg;
	dane_host_free(HTAB_ENTRY(n, struct dane_host, hnode));
	return true;
}

void dane_cache_free(struct relay *r)
{
	struct dane_cache *dc = r->dane;
	if (!dc)
		return;
	htab_drop_if(&dc->t, drop_any, NULL);
	htab_clear(&dc->t);
	free(dc);
	r->dane = NULL;
}

/* An entry whose answer is over and that no one waits for. */
static bool drop_expired(struct htab_node *n, void *arg)
{
	struct dane_host *dh = HTAB_ENTRY(n, struct dane_host, hnode);
	if (dh->state == DH_LOOKING || *(const uint64_t *)arg < dh->until)
		return false;
	dane_host_free(dh);
	return true;
}

/* Expired entries go: at most once a second, when the cache is full. */
static void dane_cache_sweep(struct dane_cache *dc, uint64_t now)
{
	if (now - dc->swept < UINT64_C(1000000000))
		return;
	dc->swept = now;
	htab_drop_if(&dc->t, drop_expired, &now);
}

/* The entry of host:port, a new one if need be; NULL without memory or room. */
static struct dane_host *dane_host_get(struct relay *r, const char *host, uint16_t port)
{
	struct dane_cache *dc = r->dane;
	if (!dc) {
		dc = r->dane = calloc(1, sizeof(*dc));
		if (!dc)
			return NULL;
	}
	uint64_t h = dane_key_hash(dc, host, port);
	for (struct htab_node *n = htab_chain(&dc->t, h); n; n = n->next) {
		struct dane_host *dh = HTAB_ENTRY(n, struct dane_host, hnode);
		if (n->hash == h && dh->port == port && strcasecmp(dh->host, host) == 0)
			return dh;
	}
	if (dc->t.n >= DANE_CACHE_MAX) {
		dane_cache_sweep(dc, relay_now(r));
		if (dc->t.n >= DANE_CACHE_MAX)
			return NULL;
	}
	size_t hl = strlen(host) + 1;
	struct dane_host *dh = calloc(1, sizeof(*dh) + hl);
	if (!dh)
		return NULL;
	dh->r = r;
	dh->port = port;
	memcpy(dh->host, host, hl);
	if (htab_add(&dc->t, &dh->hnode, h) < 0) {
		free(dh);
		return NULL;
	}
	return dh;
}

/* l waits for dh's lookup: kicked at its end.  False without memory (the lane polls). */
static bool dane_wait(struct lane *l, struct dane_host *dh)
{
	if (l->dane_wait == dh)
		return true;
	dane_unwait(l);
	if (dh->nwait == dh->wait_cap) {
		size_t nc = dh->wait_cap ? dh->wait_cap * 2 : 4;
		struct lane **nw = realloc(dh->waiters, nc * sizeof(*nw));
		if (!nw)
			return false;
		dh->waiters = nw;
		dh->wait_cap = nc;
	}
	dh->waiters[dh->nwait++] = l;
	l->dane_wait = dh;
	return true;
}

/* The usable records of a validated answer into dh (DH_RECORDS), or DH_UNUSABLE. */
static void dane_take(struct dane_host *dh, const struct mx_tlsa_answer *a)
{
	size_t n = 0, bytes = 0;
	for (size_t i = 0; i < a->n; i++)
		if (dns_tlsa_usable(&a->recs[i])) {
			n++;
			bytes += a->recs[i].len;
		}
	if (n == 0 && a->malformed) {
		/* records not kept (past DNS_ANSWER_RR_MAX, or over DNS_TLSA_FULL_MAX) may be
		 * the usable ones: not "TLS without verification" on a guess */
		dh->state = DH_FAILED;
		dh->reason = DR_UNREAD;
		dh->n = a->malformed;
		return;
	}
	if (n == 0) {
		dh->state = DH_UNUSABLE;
		return;
	}
	struct smtp_out_tlsa *recs = malloc(n * sizeof(*recs) + bytes);
	if (!recs) {
		dh->state = DH_FAILED;
		dh->reason = DR_NOMEM;
		return;
	}
	uint8_t *data = (uint8_t *)(recs + n);
	size_t k = 0;
	for (size_t i = 0; i < a->n; i++) {
		const struct dns_tlsa *t = &a->recs[i];
		if (!dns_tlsa_usable(t))
			continue;
		memcpy(data, t->data, t->len);
		recs[k++] = (struct smtp_out_tlsa){ t->usage, t->selector, t->mtype, t->len, data };
		data += t->len;
	}
	dh->recs = recs;
	dh->n = n;
	dh->state = DH_RECORDS;
}

static void dane_on_tlsa(void *arg, int error, const struct mx_tlsa_answer *a)
{
	struct dane_host *dh = arg;
	struct relay *r = dh->r;
	const struct relay_conf *c = &r->crt->conf;
	uint64_t now = relay_now(r);
	char why[600];

	dh->q = NULL;
	if (error == -ECANCELED) {
		dh->state = DH_EMPTY;
		for (size_t i = 0; i < dh->nwait; i++)
			dh->waiters[i]->dane_wait = NULL;
		dh->nwait = 0;
		return;
	}
	dane_host_clear(dh);
	dh->fresh = true;
	dh->reason = DR_NONE;
	if (error == 0 || error == -ENOENT) {
		dh->until = now + mx_ttl_ms(a->ttl, (uint64_t)c->dns_min_ttl_ms,
					    (uint64_t)c->dns_max_ttl_ms) * 1000000u;
		if (error == -ENOENT || !a->secure) {
			dh->state = DH_NONE;
			dh->reason = error == -ENOENT ? DR_NO_RECORDS : DR_NOT_VALIDATED;
		} else {
			dane_take(dh, a);
		}
	} else {
		dh->state = DH_FAILED;
		dh->reason = DR_SERVFAIL;
	}
	if (dh->state == DH_FAILED) {
		dh->failures++;
		dh->until = now + mx_retry_ms(dh->failures, (uint64_t)c->dns_retry_min_ms,
					      (uint64_t)c->dns_retry_max_ms) * 1000000u;
	} else {
		dh->failures = 0;
	}
	base_logf(r, dh->reason == DR_UNREAD ? LOG_LEVEL_WARNING : LOG_LEVEL_DEBUG, "dane: %s",
		  dane_why(dh, why, sizeof(why)));
	/* the waiters are kicked (lanes are not freed by a kick: relay_msg.c's sweep is a
	 * timer); one that looks up again meanwhile waits on a new list */
	struct lane **w = dh->waiters;
	size_t nw = dh->nwait;
	dh->waiters = NULL;
	dh->nwait = dh->wait_cap = 0;
	for (size_t i = 0; i < nw; i++)
		w[i]->dane_wait = NULL;
	for (size_t i = 0; i < nw; i++)
		r->up.kick(w[i]);
	free(w);
}

static void dane_status(struct lane *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What `sluice lanes` shows of the lane's DANE (peer text truncated). */
static void dane_status(struct lane *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(l->dane_status, sizeof(l->dane_status), fmt, ap);
	va_end(ap);
	if (n < 0)
		l->dane_status[0] = '\0';
}

/*
 * DANE found no server of l it may send to: `sluice lanes` says why, and the next attempt
 * looks the MX hosts up again if due.  The lane defers its due recipients
 * (lane_defer_due).
 */
void dane_defer_status(struct lane *l, const char *mta, const char *text)
{
	dane_status(l, "%.200s: DEFERRED: %.300s", mta, text);
	l->targets_fresh = false;
}

/*
 * RFC 7672 2.2: a host whose TLSA lookup failed, or that has no DANE under dane-only,
 * is skipped as one that cannot be reached: the next MX host (past tg's other
 * addresses) is tried; once every one was, the due recipients are deferred.
 */
static enum dane_verdict dane_skip(struct lane *l, const struct mx_target *tg, const char *text,
				   char *why, size_t whylen)
{
	size_t i = l->next_target % l->ntargets;
	while (i + 1 < l->ntargets && strcasecmp(l->targets[i + 1].host, tg->host) == 0)
		i++;
	if (i + 1 < l->ntargets) {
		base_logf(l->r, LOG_LEVEL_NOTICE, "lane=%s mta=%s DANE: %s: the next MX host",
			  l->name, tg->host, text);
		l->next_target = (unsigned)(i + 1);
		return DANE_NEXT_MX;
	}
	l->next_target = 0;
	dane_defer_status(l, tg->host, text);
	snprintf(why, whylen, "%s", text);
	return DANE_DEFER;
}

enum dane_verdict dane_prepare(struct lane *l, const struct mx_target *tg,
			       enum smtp_out_tls *ret_tls, const struct dane_host **ret_dh,
			       uint64_t *ret_until, char *why, size_t whylen)
{
	struct relay *r = l->r;
	bool only = l->rt->conf->tls == SMTP_TLS_DANE_ONLY;
	char text[600];

	*ret_dh = NULL;
	*ret_until = l->targets_until;
	if (!tg->secure) {
		snprintf(text, sizeof(text), "the MX records of %.200s are not DNSSEC-validated",
			 l->domain ? l->domain : "?");
		if (only) {
			dane_defer_status(l, tg->host, text);
			snprintf(why, whylen, "%s", text);
			return DANE_DEFER;
		}
		dane_status(l, "%.200s: no DANE, %.300s: opportunistic TLS", tg->host, text);
		*ret_tls = SMTP_TLS_MAY;
		return DANE_GO;
	}
	uint16_t port = ntohs(tg->addr.ss_family == AF_INET
				      ? ((const struct sockaddr_in *)&tg->addr)->sin_port
				      : ((const struct sockaddr_in6 *)&tg->addr)->sin6_port);
	struct dane_host *dh = dane_host_get(r, tg->host, port);
	if (!dh)
		return DANE_POLL; /* out of memory, or the cache is full */
	if (dh->state == DH_LOOKING)
		return dane_wait(l, dh) ? DANE_WAIT : DANE_POLL;
	uint64_t now = relay_now(l->r);
	if (dh->state == DH_EMPTY || (now >= dh->until && !dh->fresh)) {
		struct mx_query *q = NULL;
		dh->state = DH_LOOKING;
		dh->q = (struct mx_query *)1; /* as conn_resolve(): done() may come first */
		int e = mx_tlsa_lookup(r->dns, dh->host, port, dane_on_tlsa, dh, &q);
		if (e == -EINVAL) {
			/* _PORT._tcp.HOST is longer than a name can be: no TLSA record can exist */
			dh->q = NULL;
			dh->state = DH_NONE;
			dh->reason = DR_TOO_LONG;
			dh->until = now + (uint64_t)r->crt->conf.dns_max_ttl_ms * 1000000u;
		} else if (e < 0) {
			dh->q = NULL;
			dh->state = DH_FAILED;
			dh->failures++;
			dh->until = now + mx_retry_ms(dh->failures, (uint64_t)r->crt->conf.dns_retry_min_ms,
						      (uint64_t)r->crt->conf.dns_retry_max_ms) * 1000000u;
			dh->reason = DR_CANNOT;
			dh->err = -e;
		} else {
			if (dh->q)
				dh->q = q;
			return dane_wait(l, dh) ? DANE_WAIT : DANE_POLL;
		}
	}
	dh->fresh = false;
	if (dh->until < *ret_until)
		*ret_until = dh->until;
	char state[500];
	dane_why(dh, state, sizeof(state));
	switch (dh->state) {
	case DH_RECORDS:
		*ret_tls = SMTP_TLS_REQUIRE;
		*ret_dh = dh;
		return DANE_GO;
	case DH_UNUSABLE:
		if (!only) {
			dane_status(l, "%.200s: %.300s", tg->host, state);
			*ret_tls = SMTP_TLS_REQUIRE; /* RFC 7672 2.2: "encrypt", no cleartext */
			return DANE_GO;
		}
		break;
	case DH_NONE:
		if (!only) {
			dane_status(l, "%.200s: no DANE, %.300s: opportunistic TLS", tg->host, state);
			*ret_tls = SMTP_TLS_MAY;
			return DANE_GO;
		}
		break;
	default:
		break;
	}
	snprintf(text, sizeof(text), "%.400s%s", state,
		 only && dh->state != DH_FAILED ? " (dane-only: no delivery without DANE)" : "");
	return dane_skip(l, tg, text, why, whylen);
}

bool dane_reusable(const struct lane_conn *rc, uint64_t now)
{
	/* the first transaction is the one it was made for, even on an answer of TTL 0 */
	return !rc->until || now < rc->until || !rc->c || smtp_out_transactions(rc->c) == 0;
}

int dane_attach(struct lane_conn *rc, const struct dane_host *dh)
{
	size_t bytes = 0, hl = strlen(dh->host) + 1;
	for (size_t i = 0; i < dh->n; i++)
		bytes += dh->recs[i].len;
	struct smtp_out_dane *d = malloc(sizeof(*d) + dh->n * sizeof(struct smtp_out_tlsa) + bytes + hl);
	if (!d)
		return -ENOMEM;
	struct smtp_out_tlsa *recs = (struct smtp_out_tlsa *)(d + 1);
	uint8_t *data = (uint8_t *)(recs + dh->n);
	for (size_t i = 0; i < dh->n; i++) {
		recs[i] = dh->recs[i];
		memcpy(data, dh->recs[i].data, dh->recs[i].len);
		recs[i].data = data;
		data += dh->recs[i].len;
	}
	memcpy(data, dh->host, hl);
	d->base = (const char *)data;
	d->recs = recs;
	d->n = dh->n;
	rc->dane = d;
	rc->oc.dane = d;
	rc->oc.tls = SMTP_TLS_REQUIRE;
	return 0;
}

void dane_on_ready(struct lane_conn *rc, struct smtp_out *c)
{
	struct lane *l = rc->lane;
	const char *auth = smtp_out_tls_auth(c);
	if (rc->dane) {
		char text[160];
		snprintf(text, sizeof(text), "DANE verified: TLSA %s", auth);
		dane_status(l, "%.200s: %.90s", smtp_out_peer(c), text);
		base_logf(l->r, LOG_LEVEL_INFO, "lane=%s mta=%s %s", l->name, smtp_out_peer(c), text);
	} else {
		base_logf(l->r, LOG_LEVEL_INFO, "lane=%s mta=%s no DANE: TLS %s (%s)", l->name,
			  smtp_out_peer(c), *auth ? auth : "not used", l->dane_status);
	}
}
