/*
 * test_dns_answer -- the DNS response reader (src/proto/dns_answer.c) on answers as a
 * validating resolver sends them (AD bit, TLSA, CNAME, denials with a SOA) and on broken
 * ones, cut at every byte; and how long the relay uses an answer (mx_ttl_ms) and waits
 * after a failed lookup (mx_retry_ms).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dns_answer.h"
#include "mx.h"

struct msg {
	uint8_t b[4096];
	size_t n;
};

static void put8(struct msg *m, uint8_t v)
{
	assert_true(m->n < sizeof(m->b));
	m->b[m->n++] = v;
}

static void put16(struct msg *m, uint16_t v)
{
	put8(m, (uint8_t)(v >> 8));
	put8(m, (uint8_t)v);
}

static void put32(struct msg *m, uint32_t v)
{
	put16(m, (uint16_t)(v >> 16));
	put16(m, (uint16_t)v);
}

/* "a.b.c" as labels */
static void put_name(struct msg *m, const char *name)
{
	while (*name) {
		const char *dot = strchr(name, '.');
		size_t len = dot ? (size_t)(dot - name) : strlen(name);
		put8(m, (uint8_t)len);
		for (size_t i = 0; i < len; i++)
			put8(m, (uint8_t)name[i]);
		name += len + (dot ? 1 : 0);
	}
	put8(m, 0);
}

static void header(struct msg *m, uint8_t flags3, unsigned an, unsigned ns)
{
	m->n = 0;
	put16(m, 0x1234);
	put8(m, 0x81); /* QR, RD */
	put8(m, flags3);
	put16(m, 1);
	put16(m, (uint16_t)an);
	put16(m, (uint16_t)ns);
	put16(m, 0);
	put_name(m, "_25._tcp.mx.example.test");
	put16(m, DNS_TYPE_TLSA);
	put16(m, DNS_CLASS_IN);
}

static void rr_tlsa(struct msg *m, uint32_t ttl, uint8_t u, uint8_t s, uint8_t t, size_t len)
{
	put8(m, 0xC0); /* a pointer to the question's name */
	put8(m, 12);
	put16(m, DNS_TYPE_TLSA);
	put16(m, DNS_CLASS_IN);
	put32(m, ttl);
	put16(m, (uint16_t)(3 + len));
	put8(m, u);
	put8(m, s);
	put8(m, t);
	for (size_t i = 0; i < len; i++)
		put8(m, (uint8_t)i);
}

static void rr_cname(struct msg *m, uint32_t ttl)
{
	put8(m, 0xC0);
	put8(m, 12);
	put16(m, DNS_TYPE_CNAME);
	put16(m, DNS_CLASS_IN);
	put32(m, ttl);
	put16(m, 7);
	put8(m, 2);
	put8(m, 'm');
	put8(m, 'x');
	put8(m, 0xC0);
	put8(m, 12);
	put8(m, 0); /* padding inside RDLENGTH: skipped with the record */
	put8(m, 0);
}

static void rr_soa(struct msg *m, uint32_t ttl, uint32_t minimum)
{
	size_t start;
	put_name(m, "example.test");
	put16(m, DNS_TYPE_SOA);
	put16(m, DNS_CLASS_IN);
	put32(m, ttl);
	put16(m, 0); /* patched */
	start = m->n;
	put_name(m, "ns.example.test");
	put_name(m, "hostmaster.example.test");
	for (int i = 0; i < 4; i++)
		put32(m, 100);
	put32(m, minimum);
	m->b[start - 2] = (uint8_t)((m->n - start) >> 8);
	m->b[start - 1] = (uint8_t)(m->n - start);
}

static void test_tlsa_answer(void **state)
{
	struct msg m;
	struct dns_answer a;
	struct dns_tlsa t;

	header(&m, 0x20 | 0x80, 3, 0); /* AD, RA */
	rr_cname(&m, 30);
	rr_tlsa(&m, 300, 3, 1, 1, 32);
	rr_tlsa(&m, 60, 0, 0, 1, 32);
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), 0);
	assert_true(a.ad);
	assert_int_equal(a.rcode, 0);
	assert_int_equal(a.n, 2);
	assert_int_equal(a.ttl, 30); /* the CNAME's is the least */
	assert_int_equal(a.neg_ttl, DNS_TTL_NONE);
	assert_int_equal(dns_tlsa_parse(&a.rr[0], &t), 0);
	assert_int_equal(t.usage, 3);
	assert_int_equal(t.selector, 1);
	assert_int_equal(t.mtype, 1);
	assert_int_equal(t.len, 32);
	assert_true(dns_tlsa_usable(&t));
	assert_int_equal(dns_tlsa_parse(&a.rr[1], &t), 0);
	assert_false(dns_tlsa_usable(&t)); /* PKIX-TA: not for SMTP */

	/* not validated: the same records without AD */
	header(&m, 0x80, 1, 0);
	rr_tlsa(&m, 300, 3, 1, 1, 32);
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), 0);
	assert_false(a.ad);

	/* every cut of a good message is refused or reads fewer records, never past it */
	header(&m, 0xA0, 2, 0);
	rr_tlsa(&m, 300, 3, 1, 1, 32);
	rr_tlsa(&m, 300, 2, 0, 2, 64);
	for (size_t cut = 0; cut < m.n; cut++) {
		uint8_t *copy = malloc(cut ? cut : 1);
		memcpy(copy, m.b, cut);
		assert_int_equal(dns_answer_parse(copy, cut, DNS_TYPE_TLSA, &a), -EBADMSG);
		free(copy);
	}
}

static void test_denials(void **state)
{
	struct msg m;
	struct dns_answer a;

	/* NXDOMAIN with a SOA: neg_ttl = min(TTL, MINIMUM) */
	header(&m, 0xA0 | DNS_RCODE_NXDOMAIN, 0, 1);
	rr_soa(&m, 600, 45);
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), 0);
	assert_int_equal(a.rcode, DNS_RCODE_NXDOMAIN);
	assert_int_equal(a.n, 0);
	assert_int_equal(a.neg_ttl, 45);
	assert_int_equal(a.ttl, DNS_TTL_NONE);
	/* NODATA, TTL below MINIMUM */
	header(&m, 0x80, 0, 1);
	rr_soa(&m, 20, 3600);
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), 0);
	assert_int_equal(a.neg_ttl, 20);
	/* SERVFAIL: read, the caller decides */
	header(&m, 0x80 | DNS_RCODE_SERVFAIL, 0, 0);
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), 0);
	assert_int_equal(a.rcode, DNS_RCODE_SERVFAIL);
}

static void test_malformed(void **state)
{
	struct msg m;
	struct dns_answer a;
	struct dns_rr rr = { .type = DNS_TYPE_TLSA, .len = 3, .data = (const uint8_t *)"\3\1\1" };
	struct dns_tlsa t;

	/* a query, not a response */
	header(&m, 0, 0, 0);
	m.b[2] = 0x01;
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), -EBADMSG);
	/* RDLENGTH past the end */
	header(&m, 0x80, 1, 0);
	rr_tlsa(&m, 1, 3, 1, 1, 32);
	m.b[m.n - 36] = 0x7f;
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), -EBADMSG);
	/* a label type 0x40 */
	header(&m, 0x80, 0, 0);
	m.b[12] = 0x41;
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), -EBADMSG);
	/* more answers announced than there are */
	header(&m, 0x80, 2, 0);
	rr_tlsa(&m, 1, 3, 1, 1, 32);
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), -EBADMSG);
	/* a TTL with its top bit set is 0 (RFC 2181 8) */
	header(&m, 0x80, 1, 0);
	rr_tlsa(&m, 0x80000000u, 3, 1, 1, 32);
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), 0);
	assert_int_equal(a.ttl, 0);
	/* a TLSA RDATA without data; lengths that do not fit their matching type */
	assert_int_equal(dns_tlsa_parse(&rr, &t), -EBADMSG);
	struct dns_tlsa bad[] = {
		{ 3, 1, 1, 31, (const uint8_t *)"" }, { 3, 1, 2, 32, (const uint8_t *)"" },
		{ 3, 2, 1, 32, (const uint8_t *)"" }, { 3, 1, 3, 32, (const uint8_t *)"" },
		{ 2, 0, 0, DNS_TLSA_FULL_MAX + 1, (const uint8_t *)"" }, { 4, 1, 1, 32, NULL },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_false(dns_tlsa_usable(&bad[i]));
	/* more records than are kept: counted */
	header(&m, 0x80, DNS_ANSWER_RR_MAX + 3, 0);
	for (int i = 0; i < DNS_ANSWER_RR_MAX + 3; i++)
		rr_tlsa(&m, 10, 3, 1, 1, 32);
	assert_int_equal(dns_answer_parse(m.b, m.n, DNS_TYPE_TLSA, &a), 0);
	assert_int_equal(a.n, DNS_ANSWER_RR_MAX);
	assert_int_equal(a.dropped, 3);
}

static void test_ttl_and_retry(void **state)
{
	/* TTL within the floor and the ceiling */
	assert_int_equal(mx_ttl_ms(300, 10000, 3600000), 300000);
	assert_int_equal(mx_ttl_ms(2, 10000, 3600000), 10000);
	assert_int_equal(mx_ttl_ms(0, 0, 3600000), 0);
	assert_int_equal(mx_ttl_ms(86400, 10000, 3600000), 3600000);
	assert_int_equal(mx_ttl_ms(UINT32_MAX, 10000, 3600000), 3600000);
	assert_int_equal(mx_ttl_ms(UINT32_MAX - 1, 1000, 7 * 86400000ull), 7 * 86400000ull);
	/* a failed lookup: 5s, 10s, 20s ... at most 5m */
	assert_int_equal(mx_retry_ms(1, 5000, 300000), 5000);
	assert_int_equal(mx_retry_ms(2, 5000, 300000), 10000);
	assert_int_equal(mx_retry_ms(4, 5000, 300000), 40000);
	assert_int_equal(mx_retry_ms(7, 5000, 300000), 300000);
	assert_int_equal(mx_retry_ms(1000000, 5000, 300000), 300000);
	assert_int_equal(mx_retry_ms(0, 5000, 300000), 5000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tlsa_answer),
		cmocka_unit_test(test_denials),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_ttl_and_retry),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
