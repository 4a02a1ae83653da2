/*
 * dns_answer -- the parts of a DNS response the relay reads itself (dns_answer.h).
 *
 * Every read is checked against the end of the message first; a name is skipped, never
 * expanded (its owner does not matter here: the resolver answered the question asked,
 * and the AD bit covers the whole answer), at most DNS_NAME_WIRE_MAX bytes of labels
 * before its end or a compression pointer.
 */
#include "dns_answer.h"

#include <errno.h>
#include <string.h>

#define DNS_HEADER_LEN 12
#define DNS_NAME_WIRE_MAX 255
#define DNS_SECTION_MAX 512     /* records looked at per section: more is not an answer */

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Skip the name at *off: 0 and *off past it, or -EBADMSG. */
static int skip_name(const uint8_t *buf, size_t len, size_t *off)
{
	size_t p = *off, wire = 0;

	for (;;) {
		if (p >= len)
			return -EBADMSG;
		uint8_t b = buf[p];
		if ((b & 0xC0) == 0xC0) {
			if (p + 2 > len)
				return -EBADMSG;
			*off = p + 2;
			return 0;
		}
		if (b & 0xC0)
			return -EBADMSG; /* 0x40, 0x80: no such label types in use */
		if (b == 0) {
			*off = p + 1;
			return 0;
		}
		wire += (size_t)b + 1;
		if (wire > DNS_NAME_WIRE_MAX || p + 1 + b > len)
			return -EBADMSG;
		p += 1 + (size_t)b;
	}
}

/* One record's header at *off: type, class, ttl, rdata; *off past the record. */
static int read_rr(const uint8_t *buf, size_t len, size_t *off, struct dns_rr *rr,
		   uint16_t *cls)
{
	size_t p = *off;

	if (skip_name(buf, len, &p) < 0 || p + 10 > len)
		return -EBADMSG;
	rr->type = get16(buf + p);
	*cls = get16(buf + p + 2);
	rr->ttl = get32(buf + p + 4);
	if (rr->ttl > INT32_MAX)
		rr->ttl = 0; /* RFC 2181 8: a TTL with the top bit set is zero */
	rr->len = get16(buf + p + 8);
	p += 10;
	if (rr->len > len - p)
		return -EBADMSG;
	rr->data = buf + p;
	*off = p + rr->len;
	return 0;
}

static uint32_t min32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

int dns_answer_parse(const uint8_t *buf, size_t len, uint16_t type, struct dns_answer *ret)
{
	struct dns_answer a;
	size_t off = DNS_HEADER_LEN;

	if (!buf || !ret || len < DNS_HEADER_LEN || !(buf[2] & 0x80)) /* QR: a response */
		return -EBADMSG;
	memset(&a, 0, sizeof(a));
	a.rcode = buf[3] & 0x0F;
	a.ad = (buf[3] & 0x20) != 0;
	a.tc = (buf[2] & 0x02) != 0;
	a.ttl = a.neg_ttl = DNS_TTL_NONE;
	unsigned qd = get16(buf + 4), an = get16(buf + 6), ns = get16(buf + 8);
	if (qd > 1 || an > DNS_SECTION_MAX || ns > DNS_SECTION_MAX)
		return -EBADMSG;
	for (unsigned i = 0; i < qd; i++) {
		if (skip_name(buf, len, &off) < 0 || off + 4 > len)
			return -EBADMSG;
		off += 4;
	}
	for (unsigned i = 0; i < an; i++) {
		struct dns_rr rr;
		uint16_t cls;
		if (read_rr(buf, len, &off, &rr, &cls) < 0)
			return -EBADMSG;
		if (cls != DNS_CLASS_IN || (rr.type != type && rr.type != DNS_TYPE_CNAME))
			continue;
		a.ttl = min32(a.ttl, rr.ttl);
		if (rr.type != type)
			continue;
		if (a.n < DNS_ANSWER_RR_MAX)
			a.rr[a.n++] = rr;
		else
			a.dropped++;
	}
	for (unsigned i = 0; i < ns; i++) {
		struct dns_rr rr;
		uint16_t cls;
		if (read_rr(buf, len, &off, &rr, &cls) < 0)
			return -EBADMSG;
		if (cls != DNS_CLASS_IN || rr.type != DNS_TYPE_SOA)
			continue;
		/* MNAME, RNAME, then SERIAL REFRESH RETRY EXPIRE MINIMUM: 20 bytes */
		size_t p = (size_t)(rr.data - buf), end = p + rr.len;
		if (skip_name(buf, end, &p) < 0 || skip_name(buf, end, &p) < 0 || p + 20 != end)
			return -EBADMSG;
		uint32_t minimum = get32(buf + p + 16);
		if (minimum > INT32_MAX)
			minimum = 0;
		a.neg_ttl = min32(a.neg_ttl, min32(rr.ttl, minimum));
	}
	*ret = a;
	return 0;
}

int dns_tlsa_parse(const struct dns_rr *rr, struct dns_tlsa *ret)
{
	if (!rr || !ret || rr->len < 4 || !rr->data)
		return -EBADMSG;
	ret->usage = rr->data[0];
	ret->selector = rr->data[1];
	ret->mtype = rr->data[2];
	ret->len = (uint16_t)(rr->len - 3);
	ret->data = rr->data + 3;
	return 0;
}

bool dns_tlsa_usable(const struct dns_tlsa *t)
{
	if (t->usage != 2 && t->usage != 3)
		return false;
	if (t->selector > 1)
		return false;
	switch (t->mtype) {
	case 0: return t->len > 0 && t->len <= DNS_TLSA_FULL_MAX;
	case 1: return t->len == 32;
	case 2: return t->len == 64;
	default: return false;
	}
}
