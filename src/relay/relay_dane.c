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
 * DANE_DEFER_BATCH messages per event: the lane is kicked again for the rest.
 *
 * Each lane keeps the TLSA answers of its MX hosts (at most DANE_HOSTS, by name and
 * port, each allocated when first needed) for their TTL, within relay.dns_min_ttl and
 * dns_max_ttl; a failed lookup is asked again after relay.dns_retry_min, doubling up to
 * dns_retry_max.  An answer serves the connection attempt that asked for it even when its
 * TTL is already over (TTL 0 with dns_min_ttl = 0): "fresh".  A connection is reused only
 * while the answers it was made from hold (dane_reusable()).
 *
 * XXX the cache is per lane: domains sharing MX hosts each look up _PORT._tcp.HOST.
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

#define DANE_HOSTS MX_MAX_TARGETS
#define DANE_DSN "4.7.5"        /* RFC 3463: cryptographic failure */
#define DANE_DEFER_BATCH 256    /* messages deferred per event (law 8) */

enum dane_state {
	DH_EMPTY = 0,
	DH_LOOKING,   /* a lookup is under way (q) */
	DH_NONE,      /* no usable answer: no records, or not validated */
	DH_UNUSABLE,  /* validated records, none usable for SMTP */
	DH_RECORDS,   /* validated usable records */
	DH_FAILED,    /* the lookup failed: deliveries wait */
};

struct dane_host {
	struct lane_dane *ld;
	char host[256];
	uint16_t port;
	enum dane_state state;
	uint64_t until;               /* ns: the answer's end, or a failure's retry time */
	bool fresh;                   /* not yet used by the attempt that asked for it */
	unsigned failures;            /* lookups failed in a row */
	struct mx_query *q;
	struct smtp_out_tlsa *recs;   /* DH_RECORDS: the usable ones, data in the same block */
	size_t n;
	char why[400];
};

struct lane_dane {
	struct lane *l;
	struct dane_host *h[DANE_HOSTS]; /* allocated when used */
	size_t n;
};

static void dane_host_clear(struct dane_host *dh)
{
	free(dh->recs);
	dh->recs = NULL;
	dh->n = 0;
}

void dane_free(struct lane *l)
{
	struct lane_dane *ld = l->dane;
	if (!ld)
		return;
	for (size_t i = 0; i < ld->n; i++) {
		mx_cancel(ld->h[i]->q);
		dane_host_clear(ld->h[i]);
		free(ld->h[i]);
	}
	free(ld);
	l->dane = NULL;
}

/* The entry of host:port; a new one (or the oldest answer's, when all are taken). */
static struct dane_host *dane_host_get(struct lane *l, const char *host, uint16_t port)
{
	if (!l->dane) {
		l->dane = calloc(1, sizeof(*l->dane));
		if (!l->dane)
			return NULL;
		l->dane->l = l;
	}
	struct lane_dane *ld = l->dane;
	struct dane_host *old = NULL;
	for (size_t i = 0; i < ld->n; i++) {
		struct dane_host *dh = ld->h[i];
		if (dh->port == port && strcasecmp(dh->host, host) == 0)
			return dh;
		if (dh->state != DH_LOOKING && (!old || dh->until < old->until))
			old = dh;
	}
	struct dane_host *dh = old;
	if (ld->n < DANE_HOSTS) {
		dh = calloc(1, sizeof(*dh));
		if (!dh)
			return NULL;
		ld->h[ld->n++] = dh;
	}
	if (!dh)
		return NULL;
	dane_host_clear(dh);
	memset(dh, 0, sizeof(*dh));
	dh->ld = ld;
	dh->port = port;
	snprintf(dh->host, sizeof(dh->host), "%s", host);
	return dh;
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
		snprintf(dh->why, sizeof(dh->why), "the TLSA answer of %.200s has %zu record(s) "
			 "sluice does not read (malformed, too many, or too large), none usable",
			 dh->host, a->malformed);
		return;
	}
	if (n == 0) {
		dh->state = DH_UNUSABLE;
		snprintf(dh->why, sizeof(dh->why), "TLSA records of %.200s, none usable (usages 0 and 1 "
			 "are not for SMTP): TLS without verification", dh->host);
		return;
	}
	struct smtp_out_tlsa *recs = malloc(n * sizeof(*recs) + bytes);
	if (!recs) {
		dh->state = DH_FAILED;
		snprintf(dh->why, sizeof(dh->why), "out of memory for the TLSA records of %.200s", dh->host);
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
	snprintf(dh->why, sizeof(dh->why), "%zu usable TLSA record(s) of %.200s", n, dh->host);
}

static void dane_on_tlsa(void *arg, int error, const struct mx_tlsa_answer *a)
{
	struct dane_host *dh = arg;
	struct lane *l = dh->ld->l;
	struct relay *r = l->r;
	const struct relay_conf *c = &r->crt->conf;
	uint64_t now = realtime_ns();

	dh->q = NULL;
	if (error == -ECANCELED) {
		dh->state = DH_EMPTY;
		return;
	}
	dane_host_clear(dh);
	dh->fresh = true;
	if (error == 0 || error == -ENOENT) {
		dh->failures = 0;
		dh->until = now + mx_ttl_ms(a->ttl, (uint64_t)c->dns_min_ttl_ms,
					    (uint64_t)c->dns_max_ttl_ms) * 1000000u;
		if (error == -ENOENT || !a->secure) {
			dh->state = DH_NONE;
			snprintf(dh->why, sizeof(dh->why), "%s TLSA records for _%u._tcp.%.200s",
				 error == -ENOENT ? "no" : "no DNSSEC-validated", (unsigned)dh->port,
				 dh->host);
		} else {
			dane_take(dh, a);
			if (dh->state == DH_FAILED) {
				dh->until = now + mx_retry_ms(++dh->failures,
							      (uint64_t)c->dns_retry_min_ms,
							      (uint64_t)c->dns_retry_max_ms) * 1000000u;
				relay_logf(r, LOG_LEVEL_WARNING, "lane=%s dane: %s", l->name, dh->why);
			}
		}
	} else {
		dh->failures++;
		dh->state = DH_FAILED;
		dh->until = now + mx_retry_ms(dh->failures, (uint64_t)c->dns_retry_min_ms,
					      (uint64_t)c->dns_retry_max_ms) * 1000000u;
		snprintf(dh->why, sizeof(dh->why), "the TLSA lookup of _%u._tcp.%.200s failed (SERVFAIL: "
			 "records that do not validate, or no answer)", (unsigned)dh->port, dh->host);
	}
	relay_logf(r, LOG_LEVEL_DEBUG, "lane=%s dane: %s", l->name, dh->why);
	lane_kick(l);
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
 * The lane's due recipients wait for their next retry: text says why (the attempt log,
 * the log).  Each due recipient once, as a transaction would take them.
 */
void dane_defer(struct lane *l, const char *mta, const char *text)
{
	struct relay *r = l->r;
	size_t idx[64], n = 0, total = 0, msgs = 0;
	uint64_t now = realtime_ns(), next = UINT64_MAX;
	struct lane_item *it;

	dane_status(l, "%.200s: DEFERRED: %.300s", mta, text);
	l->targets_fresh = false; /* the next attempt looks the MX hosts up again if due */
	while (msgs++ < DANE_DEFER_BATCH &&
	       (it = lane_pick(l, now, sizeof(idx) / sizeof(idx[0]), idx, &n, &next)) != NULL) {
		struct rmsg *m = it->m;
		if (msg_open_file(r, m) < 0) {
			/* gone (deleted behind the relay's back) or unreadable: forgotten, as
			 * tx_start() does */
			if (m->busy == 0)
				msg_free(r, m);
			else
				m->deleted = true;
			continue;
		}
		for (size_t k = 0; k < n; k++) {
			size_t i = idx[k];
			m->r[i].attempts++;
			msg_rcpt_retry(r, m, i, -1);
			msg_attempt_log(r, m, i, "deferred", l->name, mta, DANE_DSN, text);
			msg_delivery_log(r, LOG_LEVEL_INFO, m, i, l->name, mta, "deferred", DANE_DSN,
					 text, "(DANE)");
		}
		total += n;
		msg_schedule_lane(r, m, l);
		msg_close_file(m);
	}
	relay_logf(r, LOG_LEVEL_WARNING, "lane=%s mta=%s DANE: %s: %zu recipient(s) deferred",
		   l->name, mta, text, total);
	lane_arm(l, 0); /* the rest, if any, on the next round */
}

/*
 * RFC 7672 2.2: a host whose TLSA lookup failed, or that has no DANE under dane-only,
 * is skipped as one that cannot be reached: the next MX host (past tg's other
 * addresses) is tried; once every one was, the due recipients are deferred.
 */
static void dane_skip(struct lane *l, const struct mx_target *tg, const char *text)
{
	size_t i = l->next_target % l->ntargets;
	while (i + 1 < l->ntargets && strcasecmp(l->targets[i + 1].host, tg->host) == 0)
		i++;
	if (i + 1 < l->ntargets) {
		relay_logf(l->r, LOG_LEVEL_NOTICE, "lane=%s mta=%s DANE: %s: the next MX host",
			   l->name, tg->host, text);
		l->next_target = (unsigned)(i + 1);
		lane_arm(l, 0);
		return;
	}
	l->next_target = 0;
	dane_defer(l, tg->host, text);
}

int dane_prepare(struct lane *l, const struct mx_target *tg, enum smtp_out_tls *ret_tls,
		 const struct dane_host **ret_dh, uint64_t *ret_until)
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
			dane_defer(l, tg->host, text);
			return -1;
		}
		dane_status(l, "%.200s: no DANE, %.300s: opportunistic TLS", tg->host, text);
		*ret_tls = SMTP_TLS_MAY;
		return 1;
	}
	uint16_t port = ntohs(tg->addr.ss_family == AF_INET
				      ? ((const struct sockaddr_in *)&tg->addr)->sin_port
				      : ((const struct sockaddr_in6 *)&tg->addr)->sin6_port);
	struct dane_host *dh = dane_host_get(l, tg->host, port);
	if (!dh) {
		lane_arm(l, UINT64_C(1000000000)); /* out of memory, or all hosts being looked up */
		return 0;
	}
	if (dh->state == DH_LOOKING)
		return 0;
	uint64_t now = realtime_ns();
	if (dh->state == DH_EMPTY || (now >= dh->until && !dh->fresh)) {
		struct mx_query *q = NULL;
		dh->state = DH_LOOKING;
		dh->q = (struct mx_query *)1; /* as lane_resolve(): done() may come first */
		int e = mx_tlsa_lookup(r->dns, dh->host, port, dane_on_tlsa, dh, &q);
		if (e == -EINVAL) {
			/* _PORT._tcp.HOST is longer than a name can be: no TLSA record can exist */
			dh->q = NULL;
			dh->state = DH_NONE;
			dh->until = now + (uint64_t)r->crt->conf.dns_max_ttl_ms * 1000000u;
			snprintf(dh->why, sizeof(dh->why), "no TLSA records can exist for _%u._tcp.%.200s "
				 "(too long a name)", (unsigned)port, dh->host);
		} else if (e < 0) {
			dh->q = NULL;
			dh->state = DH_FAILED;
			dh->failures++;
			dh->until = now + mx_retry_ms(dh->failures, (uint64_t)r->crt->conf.dns_retry_min_ms,
						      (uint64_t)r->crt->conf.dns_retry_max_ms) * 1000000u;
			snprintf(dh->why, sizeof(dh->why), "the TLSA lookup of %.200s cannot be made: %s",
				 dh->host, strerror(-e));
		} else {
			if (dh->q)
				dh->q = q;
			return 0;
		}
	}
	dh->fresh = false;
	if (dh->until < *ret_until)
		*ret_until = dh->until;
	switch (dh->state) {
	case DH_RECORDS:
		*ret_tls = SMTP_TLS_REQUIRE;
		*ret_dh = dh;
		return 1;
	case DH_UNUSABLE:
		if (!only) {
			dane_status(l, "%.200s: %.300s", tg->host, dh->why);
			*ret_tls = SMTP_TLS_REQUIRE; /* RFC 7672 2.2: "encrypt", no cleartext */
			return 1;
		}
		break;
	case DH_NONE:
		if (!only) {
			dane_status(l, "%.200s: no DANE, %.300s: opportunistic TLS", tg->host, dh->why);
			*ret_tls = SMTP_TLS_MAY;
			return 1;
		}
		break;
	default:
		break;
	}
	snprintf(text, sizeof(text), "%.400s%s", dh->why,
		 only && dh->state != DH_FAILED ? " (dane-only: no delivery without DANE)" : "");
	dane_skip(l, tg, text);
	return -1;
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
		relay_logf(l->r, LOG_LEVEL_INFO, "lane=%s mta=%s %s", l->name, smtp_out_peer(c), text);
	} else {
		relay_logf(l->r, LOG_LEVEL_INFO, "lane=%s mta=%s no DANE: TLS %s (%s)", l->name,
			   smtp_out_peer(c), *auth ? auth : "not used", l->dane_status);
	}
}
