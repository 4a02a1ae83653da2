/*
 * mx_answer -- what a DNS answer says for the MX resolver, with no I/O (mx_int.h).
 *
 * Names are checked before they reach c-ares or a target (labels of 1-63 bytes, at most
 * 253 bytes).  An MX answer's records are sorted by preference, equal preferences in
 * random order (RFC 5321 5.1); a null MX (RFC 7505) alone takes no mail; at most
 * MX_MAX_HOSTS hosts are kept, each once (its lowest preference), and an address where a
 * name belongs is dropped.  A host's A or AAAA answer keeps at most MX_MAX_TARGETS
 * addresses, without duplicates nor 0.0.0.0/::, shuffled.  The targets are the hosts in
 * order, IPv4 before IPv6 within a host, each address once, at most MX_MAX_TARGETS, with
 * the least TTL of the answers they came from.  A TLSA answer is read by
 * proto/dns_answer.c, bounded and fuzzed.
 *
 * Invariants: these functions touch the fields of the query they are given, never its
 * lists, the channel or the loop, and call no other room of the resolver; they run on
 * the resolver's thread.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dns_answer.h"
#include "ipaddr.h"
#include "mx_int.h"
#include "str.h"
#include "util.h"

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
int mx_name_check(const char *in, size_t len, char out[MX_NAME_MAX + 1])
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

void mx_target_set(struct mx_target *t, const char *host, unsigned preference, int family,
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

/*
 * The targets in order, or the verdict when there is none: -EAGAIN if some lookup failed
 * temporarily (or memory ran out), else -ENOENT.
 */
void mx_query_build(struct mx_query *q)
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

void mx_fam_take(struct mx_fam *fam, int status, const struct ares_addrinfo *res)
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

/*
 * "localhost" is the loopback address (RFC 6761 6.3), answered here and not by c-ares:
 * XXX c-ares 1.18.1 leaks the name on its own localhost path (ares__readaddrinfo() leaves
 * ai->name set when /etc/hosts lacks the family, ares__addrinfo_localhost() overwrites
 * it), 10 bytes per lookup of a smarthost "localhost".
 */
bool mx_fam_localhost(struct mx_fam *fam, const char *name)
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

/* The MX records of a successful answer become q->hosts (0: the caller looks them up), or
 * q->error (-1). */
int mx_query_take_mx(struct mx_query *q, const struct ares_mx_reply *list)
{
	size_t n = 0, k = 0, nnull = 0, nh = 0;
	struct mx_rec *v;
	struct mx_host *hosts;

	for (const struct ares_mx_reply *p = list; p; p = p->next)
		n++;
	v = calloc(n ? n : 1, sizeof(*v));
	if (!v) {
		q->error = -EAGAIN;
		return -1;
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
		return -1;
	}
	qsort(v, k, sizeof(*v), mx_rec_cmp);
	hosts = calloc(k < MX_MAX_HOSTS ? k : MX_MAX_HOSTS, sizeof(*hosts));
	if (!hosts) {
		free(v);
		q->error = -EAGAIN;
		return -1;
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
		return -1;
	}
	q->hosts = hosts;
	q->nhosts = nh;
	return 0;
}

/*
 * What ares_query() would have said of an answer to ares_send(): NXDOMAIN is
 * ARES_ENOTFOUND, NOERROR without an answer ARES_ENODATA, a malformed one ARES_EBADRESP.
 * The AD bit and the TTL of the answer go into q.
 */
int mx_answer_status(struct mx_query *q, int status, const unsigned char *abuf, int alen,
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

/*
 * A TLSA lookup's answer, read now: error 0 with the records (secure when the AD bit was
 * set), -ENOENT for NXDOMAIN or NODATA (secure: a validated denial), -EAGAIN for the rest.
 */
int mx_tlsa_read(const struct mx_query *q, int error, struct mx_tlsa_answer *ret,
		 struct dns_tlsa *recs)
{
	struct mx_tlsa_answer ans;
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
	*ret = ans;
	return error;
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
