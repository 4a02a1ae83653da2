/*
 * test_ipaddr -- unit tests of IPv4/IPv6 addresses and prefixes (src/lib/ipaddr.c).
 *
 * Table-driven: addresses in every form an MTA writes them (with the form they format
 * back to), text that must be refused, prefixes with their canonical form, membership
 * with /0, full length and odd lengths, and formatting into short buffers.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ipaddr.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* A string literal and its length, so that tables can hold NUL bytes. */
#define LIT(s) s, sizeof(s) - 1

/* ---- addresses ------------------------------------------------------------------- */

static const struct {
	const char *text;
	unsigned family;
	const char *formatted;
} good_addresses[] = {
	{ "192.0.2.1", 4, "192.0.2.1" },
	{ "0.0.0.0", 4, "0.0.0.0" },
	{ "255.255.255.255", 4, "255.255.255.255" },
	{ "[192.0.2.1]", 4, "192.0.2.1" },
	{ "2001:db8::1", 6, "2001:db8::1" },
	{ "2001:DB8:0:0:0:0:0:1", 6, "2001:db8::1" },
	{ "::", 6, "::" },
	{ "::1", 6, "::1" },
	{ "IPv6:2001:db8::1", 6, "2001:db8::1" },
	{ "ipv6:2001:db8::1", 6, "2001:db8::1" },
	{ "IPV6:::1", 6, "::1" },
	{ "[IPv6:2001:db8::1]", 6, "2001:db8::1" },
	{ "[2001:db8::1]", 6, "2001:db8::1" },
	{ "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 6, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" },
	/* IPv4-mapped: one host, one identity */
	{ "::ffff:192.0.2.1", 4, "192.0.2.1" },
	{ "::FFFF:c000:0201", 4, "192.0.2.1" },
	{ "[IPv6:::ffff:192.0.2.1]", 4, "192.0.2.1" },
	{ "::ffff:0.0.0.0", 4, "0.0.0.0" },
	/* not mapped: IPv4-compatible (deprecated) and NAT64 stay IPv6 */
	{ "::192.0.2.1", 6, "::192.0.2.1" },
	{ "64:ff9b::192.0.2.1", 6, "64:ff9b::c000:201" },
	{ "::fffe:192.0.2.1", 6, "::fffe:c000:201" },
};

static void test_parse_good(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(good_addresses); i++) {
		struct ipaddr a;
		char buf[IPADDR_TEXT_MAX];
		memset(&a, 0xaa, sizeof(a));
		if (ipaddr_parse(str_cstr(good_addresses[i].text), &a) != 0)
			fail_msg("case %zu: '%s' refused", i, good_addresses[i].text);
		assert_int_equal(a.family, good_addresses[i].family);
		if (a.family == 4) {
			for (size_t k = 4; k < 16; k++)
				assert_int_equal(a.b[k], 0);
		}
		int n = ipaddr_format(&a, 128, buf, sizeof(buf));
		assert_int_equal(n, (int)strlen(good_addresses[i].formatted));
		assert_string_equal(buf, good_addresses[i].formatted);
	}
}

static const struct {
	const char *text;
	size_t len;
} bad_addresses[] = {
	{ LIT("") },
	{ LIT("[]") },
	{ LIT("[") },
	{ LIT("]") },
	{ LIT("[192.0.2.1") },
	{ LIT("192.0.2.1]") },
	{ LIT("[[192.0.2.1]]") },
	{ LIT("192.0.2") },
	{ LIT("192.0.2.256") },
	{ LIT("192.0.2.1.") },
	{ LIT("192.0.2.01") },
	{ LIT(" 192.0.2.1") },
	{ LIT("192.0.2.1 ") },
	{ LIT("192.0.2.1\0") },
	{ LIT("192.0\0.2.1") },
	{ LIT("1.2.3.4/32") },
	{ LIT("IPv6:") },
	{ LIT("IPv6:192.0.2.1") },
	{ LIT("IPv4:192.0.2.1") },
	{ LIT("IPv6:[::1]") },
	{ LIT("[IPv6:]") },
	{ LIT("2001:db8::g") },
	{ LIT("2001:db8:::1") },
	{ LIT("1:2:3:4:5:6:7:8:9") },
	{ LIT("fe80::1%eth0") },
	{ LIT("example.com") },
	{ LIT("localhost") },
	{ LIT("0x7f.1") },
	/* longer than any address: refused before the copy */
	{ LIT("[IPv6:0000:0000:0000:0000:0000:0000:0000:0000:0000:0000:0000]") },
	{ LIT("::ffff:192.0.2.1::") },
};

static void test_parse_bad(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(bad_addresses); i++) {
		struct ipaddr a = { .family = 99 };
		int r = ipaddr_parse(str_make(bad_addresses[i].text, bad_addresses[i].len), &a);
		if (r != -EINVAL)
			fail_msg("case %zu: '%s' accepted", i, bad_addresses[i].text);
		assert_int_equal(a.family, 99); /* untouched */
	}
	struct ipaddr a = { .family = 99 };
	assert_int_equal(ipaddr_parse(STR_NULL, &a), -EINVAL);
	/* a long text is refused without reading past its length */
	char big[4096];
	memset(big, '1', sizeof(big));
	assert_int_equal(ipaddr_parse(str_make(big, sizeof(big)), &a), -EINVAL);
	assert_int_equal(a.family, 99);
}

/* ---- prefixes -------------------------------------------------------------------- */

static const struct {
	const char *text;
	unsigned family;
	unsigned bits;
	const char *formatted;
} good_prefixes[] = {
	{ "192.0.2.0/24", 4, 24, "192.0.2.0/24" },
	{ "192.0.2.77/24", 4, 24, "192.0.2.0/24" }, /* host bits cleared */
	{ "192.0.2.77/25", 4, 25, "192.0.2.0/25" },
	{ "192.0.2.255/31", 4, 31, "192.0.2.254/31" },
	{ "192.0.2.7/32", 4, 32, "192.0.2.7" },
	{ "192.0.2.7", 4, 32, "192.0.2.7" },
	{ "10.1.2.3/0", 4, 0, "0.0.0.0/0" },
	{ "10.1.2.3/8", 4, 8, "10.0.0.0/8" },
	{ "10.255.2.3/9", 4, 9, "10.128.0.0/9" },
	{ "[192.0.2.7]/32", 4, 32, "192.0.2.7" },
	{ "2001:db8::/32", 6, 32, "2001:db8::/32" },
	{ "2001:db8:ffff::1/33", 6, 33, "2001:db8:8000::/33" },
	{ "2001:db8::1/128", 6, 128, "2001:db8::1" },
	{ "2001:db8::1", 6, 128, "2001:db8::1" },
	{ "::/0", 6, 0, "::/0" },
	{ "::1/127", 6, 127, "::/127" },
	{ "IPv6:2001:db8::/48", 6, 48, "2001:db8::/48" },
	{ "[IPv6:2001:db8::]/48", 6, 48, "2001:db8::/48" },
	/* IPv4-mapped prefixes of at least 96 bits become IPv4 prefixes */
	{ "::ffff:192.0.2.0/120", 4, 24, "192.0.2.0/24" },
	{ "::ffff:192.0.2.9/128", 4, 32, "192.0.2.9" },
	{ "::ffff:192.0.2.9", 4, 32, "192.0.2.9" },
	{ "::ffff:0.0.0.0/96", 4, 0, "0.0.0.0/0" },
	{ "::ffff:10.0.0.0/104", 4, 8, "10.0.0.0/8" },
	/* shorter: not an IPv4 prefix any more, stays IPv6 (and cleared) */
	{ "::ffff:192.0.2.0/95", 6, 95, "::fffe:0:0/95" },
	{ "::ffff:192.0.2.0/80", 6, 80, "::/80" },
};

static void test_prefix_good(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(good_prefixes); i++) {
		struct ipaddr a;
		unsigned bits = 999;
		char buf[IPADDR_TEXT_MAX];
		if (ipaddr_parse_prefix(str_cstr(good_prefixes[i].text), &a, &bits) != 0)
			fail_msg("case %zu: '%s' refused", i, good_prefixes[i].text);
		assert_int_equal(a.family, good_prefixes[i].family);
		assert_int_equal(bits, good_prefixes[i].bits);
		assert_true(ipaddr_format(&a, bits, buf, sizeof(buf)) > 0);
		if (strcmp(buf, good_prefixes[i].formatted) != 0)
			fail_msg("case %zu: '%s' formats as '%s', expected '%s'", i,
				 good_prefixes[i].text, buf, good_prefixes[i].formatted);
		/* the canonical form parses back to itself */
		struct ipaddr b;
		unsigned bits2;
		assert_int_equal(ipaddr_parse_prefix(str_cstr(buf), &b, &bits2), 0);
		assert_int_equal(bits2, bits);
		assert_memory_equal(&a, &b, sizeof(a));
	}
}

static const char *const bad_prefixes[] = {
	"192.0.2.0/33", "192.0.2.0/", "192.0.2.0/-1", "192.0.2.0/+8", "192.0.2.0/ 8",
	"192.0.2.0/8 ", "192.0.2.0/1000", "192.0.2.0/0x8", "192.0.2.0/8/8", "/24",
	"192.0.2/24", "2001:db8::/129", "2001:db8::/", "::ffff:192.0.2.0/129", "[192.0.2.0/24]",
	"example.com/24", "", "/",
};

static void test_prefix_bad(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(bad_prefixes); i++) {
		struct ipaddr a = { .family = 99 };
		unsigned bits = 999;
		if (ipaddr_parse_prefix(str_cstr(bad_prefixes[i]), &a, &bits) != -EINVAL)
			fail_msg("case %zu: '%s' accepted", i, bad_prefixes[i]);
		assert_int_equal(a.family, 99);
		assert_int_equal(bits, 999);
	}
	struct ipaddr a;
	unsigned bits;
	assert_int_equal(ipaddr_parse_prefix(STR_NULL, &a, &bits), -EINVAL);
	/* "192.0.2.0/24\0" with the NUL inside the length */
	assert_int_equal(ipaddr_parse_prefix(str_make("192.0.2.0/24", 13), &a, &bits), -EINVAL);
}

/* ---- membership ------------------------------------------------------------------ */

static const struct {
	const char *addr;
	const char *prefix;
	bool in;
} membership[] = {
	{ "192.0.2.1", "192.0.2.0/24", true },
	{ "192.0.2.255", "192.0.2.0/24", true },
	{ "192.0.3.0", "192.0.2.0/24", false },
	{ "192.0.1.255", "192.0.2.0/24", false },
	{ "192.0.2.1", "192.0.2.1", true },
	{ "192.0.2.2", "192.0.2.1", false },
	{ "192.0.2.1", "192.0.2.1/32", true },
	{ "192.0.2.1", "192.0.2.0/31", true },
	{ "192.0.2.2", "192.0.2.0/31", false },
	{ "10.128.0.1", "10.128.0.0/9", true },
	{ "10.127.255.255", "10.128.0.0/9", false },
	{ "203.0.113.9", "0.0.0.0/0", true },
	{ "255.255.255.255", "0.0.0.0/0", true },
	{ "2001:db8::1", "2001:db8::/32", true },
	{ "2001:db9::1", "2001:db8::/32", false },
	{ "2001:db8::1", "::/0", true },
	{ "2001:db8::1", "2001:db8::1/128", true },
	{ "2001:db8::2", "2001:db8::1/128", false },
	{ "2001:db8:7fff::", "2001:db8::/33", true },
	{ "2001:db8:8000::", "2001:db8::/33", false },
	{ "::1", "::/127", true },
	/* mapped addresses are IPv4 */
	{ "::ffff:192.0.2.1", "192.0.2.0/24", true },
	{ "192.0.2.1", "::ffff:192.0.2.0/120", true },
	{ "::ffff:192.0.2.1", "::ffff:192.0.2.0/120", true },
	{ "::ffff:192.0.3.1", "::ffff:192.0.2.0/120", false },
	/* families never mix */
	{ "192.0.2.1", "::/0", false },
	{ "::ffff:192.0.2.1", "::/0", false },
	{ "::ffff:192.0.2.1", "::ffff:0:0/95", false },
	{ "2001:db8::1", "0.0.0.0/0", false },
	{ "::", "0.0.0.0/0", false },
	{ "::192.0.2.1", "192.0.2.0/24", false },
};

static void test_in_prefix(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(membership); i++) {
		struct ipaddr a, p;
		unsigned bits;
		assert_int_equal(ipaddr_parse(str_cstr(membership[i].addr), &a), 0);
		assert_int_equal(ipaddr_parse_prefix(str_cstr(membership[i].prefix), &p, &bits), 0);
		if (ipaddr_in_prefix(&a, &p, bits) != membership[i].in)
			fail_msg("case %zu: %s in %s should be %d", i, membership[i].addr,
				 membership[i].prefix, membership[i].in);
	}
}

/* A struct built by hand with an IPv4-mapped IPv6 address still matches as IPv4, and
 * bits past the family's length count as the full length. */
static void test_in_prefix_edges(void **state)
{
	(void)state;
	struct ipaddr mapped = { .family = 6 };
	mapped.b[10] = mapped.b[11] = 0xff;
	mapped.b[12] = 192;
	mapped.b[14] = 2;
	mapped.b[15] = 1;
	struct ipaddr p;
	unsigned bits;
	assert_int_equal(ipaddr_parse_prefix(str_cstr("192.0.2.0/24"), &p, &bits), 0);
	assert_true(ipaddr_in_prefix(&mapped, &p, bits));

	struct ipaddr a;
	assert_int_equal(ipaddr_parse(str_cstr("192.0.2.1"), &a), 0);
	assert_int_equal(ipaddr_parse(str_cstr("192.0.2.1"), &p), 0);
	assert_true(ipaddr_in_prefix(&a, &p, 200));
	assert_int_equal(ipaddr_parse(str_cstr("192.0.2.2"), &a), 0);
	assert_false(ipaddr_in_prefix(&a, &p, 200));
	assert_true(ipaddr_in_prefix(&a, &p, 30));
}

static void test_mask(void **state)
{
	(void)state;
	static const struct {
		const char *addr;
		unsigned bits;
		const char *formatted; /* with 128 bits, so never a "/" */
	} cases[] = {
		{ "192.0.2.255", 0, "0.0.0.0" },
		{ "192.0.2.255", 1, "128.0.0.0" },
		{ "192.0.2.255", 23, "192.0.2.0" },
		{ "192.0.2.255", 28, "192.0.2.240" },
		{ "192.0.2.255", 32, "192.0.2.255" },
		{ "192.0.2.255", 33, "192.0.2.255" },
		{ "2001:db8:ffff:ffff::ffff", 0, "::" },
		{ "2001:db8:ffff:ffff::ffff", 36, "2001:db8:f000::" },
		{ "2001:db8:ffff:ffff::ffff", 127, "2001:db8:ffff:ffff::fffe" },
		{ "2001:db8:ffff:ffff::ffff", 128, "2001:db8:ffff:ffff::ffff" },
		{ "2001:db8:ffff:ffff::ffff", 4000, "2001:db8:ffff:ffff::ffff" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct ipaddr a;
		char buf[IPADDR_TEXT_MAX];
		assert_int_equal(ipaddr_parse(str_cstr(cases[i].addr), &a), 0);
		ipaddr_mask(&a, cases[i].bits);
		assert_true(ipaddr_format(&a, 128, buf, sizeof(buf)) > 0);
		assert_string_equal(buf, cases[i].formatted);
		if (a.family == 4) {
			for (size_t k = 4; k < 16; k++)
				assert_int_equal(a.b[k], 0);
		}
	}
}

/* ---- formatting ------------------------------------------------------------------ */

static void test_format(void **state)
{
	(void)state;
	struct ipaddr a;
	unsigned bits;
	char buf[IPADDR_TEXT_MAX];

	/* the longest text fits in IPADDR_TEXT_MAX */
	assert_int_equal(ipaddr_parse_prefix(str_cstr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127"),
					     &a, &bits), 0);
	assert_int_equal(ipaddr_format(&a, bits, buf, sizeof(buf)), 43);
	assert_string_equal(buf, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127");
	assert_int_equal(ipaddr_parse(str_cstr("255.255.255.255"), &a), 0);
	assert_int_equal(ipaddr_format(&a, 32, buf, sizeof(buf)), 15);

	/* exact fit, one byte short, none at all */
	assert_int_equal(ipaddr_parse_prefix(str_cstr("192.0.2.0/24"), &a, &bits), 0);
	char small[13];
	assert_int_equal(ipaddr_format(&a, bits, small, sizeof(small)), 12);
	assert_string_equal(small, "192.0.2.0/24");
	memset(small, 'x', sizeof(small));
	assert_int_equal(ipaddr_format(&a, bits, small, 12), -ENOSPC);
	assert_string_equal(small, "");
	assert_int_equal(ipaddr_format(&a, bits, small, 0), -ENOSPC);
	assert_int_equal(ipaddr_format(&a, 24, small, 1), -ENOSPC);
	assert_string_equal(small, "");

	/* a struct that is not an address */
	struct ipaddr junk = { .family = 5 };
	assert_int_equal(ipaddr_format(&junk, 0, buf, sizeof(buf)), -EINVAL);
	assert_string_equal(buf, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_good),
		cmocka_unit_test(test_parse_bad),
		cmocka_unit_test(test_prefix_good),
		cmocka_unit_test(test_prefix_bad),
		cmocka_unit_test(test_in_prefix),
		cmocka_unit_test(test_in_prefix_edges),
		cmocka_unit_test(test_mask),
		cmocka_unit_test(test_format),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
