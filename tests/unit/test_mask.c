/*
 * test_mask -- unit tests of mask lists (src/policy/mask.c).
 *
 * Table-driven: every kind of mask added to every type of list, with the exact message
 * when the list refuses it; then matching, each case a small list, one matcher and one
 * subject: addresses and prefixes (/0, full length, IPv4-mapped), names and *.domain at
 * their boundaries, the case rules of names and addresses, the null sender, angle
 * brackets, and matchers that must ignore the entries that do not concern them.
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

#include "mask.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define LIT(s) s, sizeof(s) - 1

#define STAR_RULE "'*' is only allowed alone or as '*.' before a domain"
#define NOT_ADDRESS "not an address mask (user@domain, @domain, *.domain, <> or *)"

/* ---- adding ---------------------------------------------------------------------- */

static const struct {
	enum mask_type type;
	const char *mask;
	size_t len;
	const char *err; /* NULL: accepted */
} adds[] = {
	/* "*" everywhere */
	{ MASK_HOSTS, LIT("*"), NULL },
	{ MASK_IP, LIT("*"), NULL },
	{ MASK_NAME, LIT("*"), NULL },
	{ MASK_ADDRESS, LIT("*"), NULL },
	{ MASK_STRING, LIT("*"), NULL },
	/* empty everywhere */
	{ MASK_HOSTS, LIT(""), "empty mask" },
	{ MASK_IP, LIT(""), "empty mask" },
	{ MASK_NAME, LIT(""), "empty mask" },
	{ MASK_ADDRESS, LIT(""), "empty mask" },
	{ MASK_STRING, LIT(""), "empty mask" },
	/* NUL bytes everywhere */
	{ MASK_HOSTS, LIT("a\0b"), "'a\\x00b': NUL byte in mask" },
	{ MASK_STRING, LIT("a\0"), "'a\\x00': NUL byte in mask" },

	/* host lists: addresses, CIDR, names, *.domain */
	{ MASK_HOSTS, LIT("192.0.2.0/24"), NULL },
	{ MASK_HOSTS, LIT("192.0.2.7"), NULL },
	{ MASK_HOSTS, LIT("[192.0.2.7]"), NULL },
	{ MASK_HOSTS, LIT("0.0.0.0/0"), NULL },
	{ MASK_HOSTS, LIT("::1"), NULL },
	{ MASK_HOSTS, LIT("::/0"), NULL },
	{ MASK_HOSTS, LIT("2001:db8::/32"), NULL },
	{ MASK_HOSTS, LIT("IPv6:2001:db8::1"), NULL },
	{ MASK_HOSTS, LIT("::ffff:192.0.2.0/120"), NULL },
	{ MASK_HOSTS, LIT("mx.example.com"), NULL },
	{ MASK_HOSTS, LIT("MX.Example.COM."), NULL },
	{ MASK_HOSTS, LIT("localhost"), NULL },
	{ MASK_HOSTS, LIT("host_1-a.example"), NULL },
	{ MASK_HOSTS, LIT("*.example.com"), NULL },
	{ MASK_HOSTS, LIT("*.example.com."), NULL },
	{ MASK_HOSTS, LIT("*.com"), NULL },
	{ MASK_HOSTS, LIT("10.0.0.0/33"), "bad CIDR prefix '10.0.0.0/33'" },
	{ MASK_HOSTS, LIT("10.0.0.0/"), "bad CIDR prefix '10.0.0.0/'" },
	{ MASK_HOSTS, LIT("2001:db8::/129"), "bad CIDR prefix '2001:db8::/129'" },
	{ MASK_HOSTS, LIT("example.com/24"), "bad CIDR prefix 'example.com/24'" },
	{ MASK_HOSTS, LIT("192.0.2.256"), "bad IP address '192.0.2.256'" },
	{ MASK_HOSTS, LIT("192.0.2"), "bad IP address '192.0.2'" },
	{ MASK_HOSTS, LIT("2001:db8::g"), "bad IP address '2001:db8::g'" },
	{ MASK_HOSTS, LIT("[mx.example.com]"), "bad IP address '[mx.example.com]'" },
	{ MASK_HOSTS, LIT("*."), "'*.': empty domain" },
	{ MASK_HOSTS, LIT("*.."), "'*..': empty domain" },
	{ MASK_HOSTS, LIT("."), "'.': empty name" },
	{ MASK_HOSTS, LIT(".."), "'..': empty label in name" },
	{ MASK_HOSTS, LIT("1.2.3.4.5"), "bad IP address '1.2.3.4.5'" },
	{ MASK_HOSTS, LIT("3com.example"), NULL },
	{ MASK_HOSTS, LIT("**"), "'**': " STAR_RULE },
	{ MASK_HOSTS, LIT("*example.com"), "'*example.com': " STAR_RULE },
	{ MASK_HOSTS, LIT("*.*.example.com"), "'*.*.example.com': " STAR_RULE },
	{ MASK_HOSTS, LIT("mx.*.example.com"), "'mx.*.example.com': " STAR_RULE },
	{ MASK_HOSTS, LIT("mx.example.*"), "'mx.example.*': " STAR_RULE },
	{ MASK_HOSTS, LIT("a..b"), "'a..b': empty label in name" },
	{ MASK_HOSTS, LIT("*.a..b"), "'*.a..b': empty label in domain" },
	{ MASK_HOSTS, LIT("*..a"), "'*..a': empty label in domain" },
	{ MASK_HOSTS, LIT("a.b.."), "'a.b..': empty label in name" },
	{ MASK_HOSTS, LIT(".example.com"), "'.example.com': a name cannot start with '.' "
					   "(write *.example.com for the domain and the names "
					   "below it)" },
	{ MASK_HOSTS, LIT(".ex\x01"), "'.ex\\x01': invalid character byte 0x01 in name" },
	{ MASK_NAME, LIT(".example.com."), "'.example.com.': a name cannot start with '.' "
					   "(write *.example.com. for the domain and the names "
					   "below it)" },
	{ MASK_HOSTS, LIT("ex ample.com"), "'ex ample.com': invalid character byte 0x20 in name" },
	{ MASK_HOSTS, LIT("exa!mple.com"), "'exa!mple.com': invalid character '!' in name" },
	{ MASK_HOSTS, LIT("*.exa!mple.com"), "'*.exa!mple.com': invalid character '!' in domain" },
	{ MASK_HOSTS, LIT("caf\xc3\xa9.example"),
	  "'caf\xc3\xa9.example': invalid character byte 0xc3 in name" },
	{ MASK_HOSTS, LIT("user@example.com"), "'user@example.com': an address mask in a host list" },
	{ MASK_HOSTS, LIT("@example.com"), "'@example.com': an address mask in a host list" },
	{ MASK_HOSTS, LIT("<>"), "'<>': an address mask in a host list" },

	/* IP lists: addresses and CIDR only */
	{ MASK_IP, LIT("192.0.2.0/24"), NULL },
	{ MASK_IP, LIT("192.0.2.7/32"), NULL },
	{ MASK_IP, LIT("127.0.0.0/8"), NULL },
	{ MASK_IP, LIT("::1"), NULL },
	{ MASK_IP, LIT("2001:db8::/32"), NULL },
	{ MASK_IP, LIT("[IPv6:2001:db8::1]"), NULL },
	{ MASK_IP, LIT("mx.example.com"), "bad IP address 'mx.example.com'" },
	{ MASK_IP, LIT("*.example.com"), "bad IP address '*.example.com'" },
	{ MASK_IP, LIT("user@example.com"), "bad IP address 'user@example.com'" },
	{ MASK_IP, LIT("10.0.0.0/33"), "bad CIDR prefix '10.0.0.0/33'" },
	{ MASK_IP, LIT("10.0.0.0/8 "), "bad CIDR prefix '10.0.0.0/8 '" },
	{ MASK_IP, LIT("::/129"), "bad CIDR prefix '::/129'" },
	{ MASK_IP, LIT(" 10.0.0.1"), "bad IP address ' 10.0.0.1'" },

	/* name lists: names, *.domain; loose characters, no '@', '/' or stray '*' */
	{ MASK_NAME, LIT("mx.example.com"), NULL },
	{ MASK_NAME, LIT("MX.EXAMPLE.COM."), NULL },
	{ MASK_NAME, LIT("*.example.com"), NULL },
	{ MASK_NAME, LIT("unknown"), NULL },
	{ MASK_NAME, LIT("[192.0.2.1]"), NULL },
	{ MASK_NAME, LIT("192.0.2.1"), NULL },
	{ MASK_NAME, LIT("[IPv6:2001:db8::1]"), NULL },
	{ MASK_NAME, LIT("caf\xc3\xa9.example"), NULL },
	{ MASK_NAME, LIT("10.0.0.0/8"), "'10.0.0.0/8': a CIDR prefix in a name list" },
	{ MASK_NAME, LIT("a/b"), "'a/b': invalid character '/' in name" },
	{ MASK_NAME, LIT("user@example.com"), "'user@example.com': an address mask in a name list" },
	{ MASK_NAME, LIT("@example.com"), "'@example.com': an address mask in a name list" },
	{ MASK_NAME, LIT("<>"), "'<>': an address mask in a name list" },
	{ MASK_NAME, LIT("*."), "'*.': empty domain" },
	{ MASK_NAME, LIT("*x"), "'*x': " STAR_RULE },
	{ MASK_NAME, LIT("a..b"), "'a..b': empty label in name" },
	{ MASK_NAME, LIT("a b"), "'a b': invalid character byte 0x20 in name" },
	{ MASK_NAME, LIT("a\tb"), "'a\\x09b': invalid character byte 0x09 in name" },
	{ MASK_NAME, LIT("a\x7f"), "'a\\x7f': invalid character byte 0x7f in name" },

	/* address lists */
	{ MASK_ADDRESS, LIT("<>"), NULL },
	{ MASK_ADDRESS, LIT("user@example.com"), NULL },
	{ MASK_ADDRESS, LIT("User@Example.COM."), NULL },
	{ MASK_ADDRESS, LIT("<user@example.com>"), NULL },
	{ MASK_ADDRESS, LIT("@example.com"), NULL },
	{ MASK_ADDRESS, LIT("<@example.com>"), NULL },
	{ MASK_ADDRESS, LIT("*.example.com"), NULL },
	{ MASK_ADDRESS, LIT("a@b@example.com"), NULL },
	{ MASK_ADDRESS, LIT("user@[192.0.2.1]"), NULL },
	{ MASK_ADDRESS, LIT("user+tag@example.com"), NULL },
	{ MASK_ADDRESS, LIT("example.com"), "'example.com': " NOT_ADDRESS },
	{ MASK_ADDRESS, LIT("postmaster"), "'postmaster': " NOT_ADDRESS },
	{ MASK_ADDRESS, LIT("192.0.2.0/24"), "'192.0.2.0/24': " NOT_ADDRESS },
	{ MASK_ADDRESS, LIT("<<>>"), "'<<>>': " NOT_ADDRESS },
	{ MASK_ADDRESS, LIT("user@"), "'user@': empty domain" },
	{ MASK_ADDRESS, LIT("user@."), "'user@.': empty domain" },
	{ MASK_ADDRESS, LIT("@"), "'@': empty domain" },
	{ MASK_ADDRESS, LIT("<@>"), "'<@>': empty domain" },
	{ MASK_ADDRESS, LIT("*."), "'*.': empty domain" },
	{ MASK_ADDRESS, LIT("*@example.com"), "'*@example.com': write @domain for any address at "
					      "a domain" },
	{ MASK_ADDRESS, LIT("user@*.example.com"), "'user@*.example.com': " STAR_RULE },
	{ MASK_ADDRESS, LIT("@*.example.com"), "'@*.example.com': " STAR_RULE },
	{ MASK_ADDRESS, LIT("us er@example.com"),
	  "'us er@example.com': invalid character byte 0x20 in the local part" },
	{ MASK_ADDRESS, LIT("user@exa mple.com"),
	  "'user@exa mple.com': invalid character byte 0x20 in domain" },
	{ MASK_ADDRESS, LIT("user@a..b"), "'user@a..b': empty label in domain" },
	{ MASK_ADDRESS, LIT("user@a/b"), "'user@a/b': invalid character '/' in domain" },

	/* string lists: any text as written */
	{ MASK_STRING, LIT("Subject: hello"), NULL },
	{ MASK_STRING, LIT("10.0.0.0/33"), NULL },
	{ MASK_STRING, LIT("<>"), NULL },
	{ MASK_STRING, LIT("*.example.com"), NULL },
	{ MASK_STRING, LIT("user@example.com"), NULL },
	{ MASK_STRING, LIT(" "), NULL },
	{ MASK_STRING, LIT("**"), NULL },
};

static void test_add(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(adds); i++) {
		struct mask_list *l = mask_list_new(adds[i].type);
		char err[512];
		assert_non_null(l);
		memset(err, 'x', sizeof(err));
		int r = mask_list_add(l, str_make(adds[i].mask, adds[i].len), err, sizeof(err));
		if (!adds[i].err) {
			if (r != 0)
				fail_msg("case %zu: '%s' refused: %s", i, adds[i].mask, err);
			assert_int_equal(mask_list_count(l), 1);
			assert_int_equal(mask_list_has_any(l), strcmp(adds[i].mask, "*") == 0);
		} else {
			if (r != -EINVAL || strcmp(err, adds[i].err) != 0)
				fail_msg("case %zu: '%s'\n  got      %d %s\n  expected %s", i,
					 adds[i].mask, r, err, adds[i].err);
			assert_int_equal(mask_list_count(l), 0);
			assert_false(mask_list_has_any(l));
		}
		assert_null(mask_list_free(l));
	}
}

static void test_limits(void **state)
{
	(void)state;
	struct mask_list *l = mask_list_new(MASK_STRING);
	char err[512], mask[1100];

	/* length: 1024 bytes, not 1025 (shown cut) */
	memset(mask, 'a', sizeof(mask));
	assert_int_equal(mask_list_add(l, str_make(mask, 1024), err, sizeof(err)), 0);
	assert_true(mask_list_match_string(l, str_make(mask, 1024)));
	assert_false(mask_list_match_string(l, str_make(mask, 1023)));
	assert_int_equal(mask_list_add(l, str_make(mask, 1025), err, sizeof(err)), -EINVAL);
	char want[200];
	want[0] = '\'';
	memset(want + 1, 'a', 100); /* the first 100 bytes are shown */
	snprintf(want + 101, sizeof(want) - 101, "'...: longer than 1024 bytes");
	assert_string_equal(err, want);
	mask_list_free(l);

	/* entries: 65536, not one more */
	l = mask_list_new(MASK_STRING);
	for (unsigned i = 0; i < 65536; i++) {
		int n = snprintf(mask, sizeof(mask), "k%u", i);
		assert_int_equal(mask_list_add(l, str_make(mask, (size_t)n), err, sizeof(err)), 0);
	}
	assert_int_equal(mask_list_count(l), 65536);
	assert_int_equal(mask_list_add(l, str_cstr("one more"), err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "'one more': more than 65536 masks in one list");
	assert_int_equal(mask_list_count(l), 65536);
	assert_true(mask_list_match_string(l, str_cstr("k65535")));
	assert_false(mask_list_match_string(l, str_cstr("k65536")));
	mask_list_free(l);

	/* errors are cut to any buffer, or not written at all */
	l = mask_list_new(MASK_IP);
	char tiny[6];
	assert_int_equal(mask_list_add(l, str_cstr("10.0.0.0/33"), tiny, sizeof(tiny)), -EINVAL);
	assert_string_equal(tiny, "bad C");
	assert_int_equal(mask_list_add(l, str_cstr("x.example"), tiny, 1), -EINVAL);
	assert_string_equal(tiny, "");
	assert_int_equal(mask_list_add(l, str_cstr("x.example"), NULL, 0), -EINVAL);
	assert_int_equal(mask_list_add(l, str_cstr(""), NULL, 0), -EINVAL);
	assert_int_equal(mask_list_count(l), 0);
	mask_list_free(l);

	/* no list, an invalid type, a NULL pointer with a length */
	assert_int_equal(mask_list_add(NULL, str_cstr("*"), err, sizeof(err)), -EINVAL);
	assert_null(mask_list_new((enum mask_type)42));
	assert_null(mask_list_free(NULL));
	assert_int_equal(mask_list_count(NULL), 0);
	assert_false(mask_list_has_any(NULL));
	l = mask_list_new(MASK_STRING);
	assert_int_equal(mask_list_add(l, str_make(NULL, 3), err, sizeof(err)), -EINVAL);
	mask_list_free(l);
}

/* Several masks in one list: count and "*" are kept; a refused mask changes nothing. */
static void test_count(void **state)
{
	(void)state;
	static const char *const masks[] = { "192.0.2.0/24", "*", "*.example.edu", "bad/33",
					     "mx.example.org", "*" };
	struct mask_list *l = mask_list_new(MASK_HOSTS);
	char err[256];
	size_t ok = 0;
	for (size_t i = 0; i < ARRAY_SIZE(masks); i++)
		ok += mask_list_add(l, str_cstr(masks[i]), err, sizeof(err)) == 0;
	assert_int_equal(ok, 5);
	assert_int_equal(mask_list_count(l), 5);
	assert_true(mask_list_has_any(l));
	mask_list_free(l);
}

/* ---- matching -------------------------------------------------------------------- */

enum matcher { M_IP = 0, M_NAME, M_HOST, M_ADDRESS, M_STRING };

static const struct {
	enum mask_type type;
	const char *masks[6];
	enum matcher m;
	const char *subject; /* M_IP, M_HOST: an address ("" for none) */
	const char *name;    /* M_HOST only */
	bool want;
} matches[] = {
	/* IP: prefixes, full length, /0, IPv4-mapped, families */
	{ MASK_IP, { "192.0.2.0/24" }, M_IP, "192.0.2.1", NULL, true },
	{ MASK_IP, { "192.0.2.0/24" }, M_IP, "192.0.2.255", NULL, true },
	{ MASK_IP, { "192.0.2.0/24" }, M_IP, "192.0.3.0", NULL, false },
	{ MASK_IP, { "192.0.2.0/24" }, M_IP, "::ffff:192.0.2.9", NULL, true },
	{ MASK_IP, { "192.0.2.0/24" }, M_IP, "", NULL, false },
	{ MASK_IP, { "192.0.2.77/24" }, M_IP, "192.0.2.1", NULL, true },
	{ MASK_IP, { "192.0.2.7" }, M_IP, "192.0.2.7", NULL, true },
	{ MASK_IP, { "192.0.2.7" }, M_IP, "192.0.2.6", NULL, false },
	{ MASK_IP, { "192.0.2.7/32" }, M_IP, "192.0.2.7", NULL, true },
	{ MASK_IP, { "192.0.2.7/32" }, M_IP, "192.0.2.8", NULL, false },
	{ MASK_IP, { "0.0.0.0/0" }, M_IP, "203.0.113.1", NULL, true },
	{ MASK_IP, { "0.0.0.0/0" }, M_IP, "::ffff:203.0.113.1", NULL, true },
	{ MASK_IP, { "0.0.0.0/0" }, M_IP, "2001:db8::1", NULL, false },
	{ MASK_IP, { "::/0" }, M_IP, "2001:db8::1", NULL, true },
	{ MASK_IP, { "::/0" }, M_IP, "192.0.2.1", NULL, false },
	{ MASK_IP, { "::/0" }, M_IP, "::ffff:192.0.2.1", NULL, false },
	{ MASK_IP, { "2001:db8::/32" }, M_IP, "2001:db8:ffff::1", NULL, true },
	{ MASK_IP, { "2001:db8::/32" }, M_IP, "2001:db9::1", NULL, false },
	{ MASK_IP, { "2001:db8::1/128" }, M_IP, "2001:db8::1", NULL, true },
	{ MASK_IP, { "2001:db8::1/128" }, M_IP, "2001:db8::2", NULL, false },
	{ MASK_IP, { "::1" }, M_IP, "::1", NULL, true },
	{ MASK_IP, { "::1" }, M_IP, "127.0.0.1", NULL, false },
	{ MASK_IP, { "::ffff:192.0.2.0/120" }, M_IP, "192.0.2.200", NULL, true },
	{ MASK_IP, { "::ffff:192.0.2.0/120" }, M_IP, "192.0.3.200", NULL, false },
	{ MASK_IP, { "::ffff:192.0.2.7" }, M_IP, "192.0.2.7", NULL, true },
	{ MASK_IP, { "[IPv6:2001:db8::1]" }, M_IP, "2001:db8::1", NULL, true },
	{ MASK_IP, { "2001:db8::/32", "10.0.0.0/8" }, M_IP, "10.1.2.3", NULL, true },
	{ MASK_IP, { "2001:db8::/32", "10.0.0.0/8" }, M_IP, "11.1.2.3", NULL, false },
	{ MASK_IP, { "*" }, M_IP, "192.0.2.1", NULL, true },
	{ MASK_IP, { "*" }, M_IP, "", NULL, true },
	{ MASK_IP, { NULL }, M_IP, "192.0.2.1", NULL, false },

	/* names: exact, case, one trailing dot */
	{ MASK_NAME, { "mx.example.com" }, M_NAME, "mx.example.com", NULL, true },
	{ MASK_NAME, { "mx.example.com" }, M_NAME, "MX.Example.COM", NULL, true },
	{ MASK_NAME, { "mx.example.com" }, M_NAME, "mx.example.com.", NULL, true },
	{ MASK_NAME, { "mx.example.com" }, M_NAME, "mx.example.com..", NULL, false },
	{ MASK_NAME, { "mx.example.com" }, M_NAME, "a.mx.example.com", NULL, false },
	{ MASK_NAME, { "mx.example.com" }, M_NAME, "example.com", NULL, false },
	{ MASK_NAME, { "mx.example.com" }, M_NAME, "mx.example.co", NULL, false },
	{ MASK_NAME, { "mx.example.com" }, M_NAME, "", NULL, false },
	{ MASK_NAME, { "MX.EXAMPLE.COM." }, M_NAME, "mx.example.com", NULL, true },
	{ MASK_NAME, { "MX.EXAMPLE.COM." }, M_NAME, "mx.example.com.", NULL, true },
	/* names: *.domain and its boundaries */
	{ MASK_NAME, { "*.example.com" }, M_NAME, "example.com", NULL, true },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "example.com.", NULL, true },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "a.example.com", NULL, true },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "a.b.example.com", NULL, true },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "A.EXAMPLE.COM.", NULL, true },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "badexample.com", NULL, false },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "a.badexample.com", NULL, false },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "example.com.evil", NULL, false },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "xample.com", NULL, false },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "com", NULL, false },
	{ MASK_NAME, { "*.example.com" }, M_NAME, "", NULL, false },
	{ MASK_NAME, { "*.Example.COM." }, M_NAME, "mx.example.com", NULL, true },
	{ MASK_NAME, { "*.com" }, M_NAME, "example.com", NULL, true },
	{ MASK_NAME, { "*.com" }, M_NAME, "examplecom", NULL, false },
	{ MASK_NAME, { "[192.0.2.1]" }, M_NAME, "[192.0.2.1]", NULL, true },
	{ MASK_NAME, { "192.0.2.1" }, M_NAME, "192.0.2.1", NULL, true },
	{ MASK_NAME, { "*" }, M_NAME, "", NULL, true },
	{ MASK_NAME, { "*" }, M_NAME, "anything at all", NULL, true },
	{ MASK_NAME, { "a.example", "b.example" }, M_NAME, "b.example", NULL, true },
	{ MASK_NAME, { NULL }, M_NAME, "a.example", NULL, false },

	/* hosts: the address against CIDR entries, the name against names and *.domain */
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST, "192.0.2.5",
	  "", true },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST,
	  "198.51.100.1", "a.example.edu", true },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST,
	  "198.51.100.1", "EXAMPLE.EDU.", true },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST,
	  "198.51.100.1", "mx.example.org", true },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST,
	  "198.51.100.1", "a.mx.example.org", false },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST,
	  "198.51.100.1", "badexample.edu", false },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST,
	  "198.51.100.1", "", false },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST, "",
	  "x.example.edu", true },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu", "mx.example.org" }, M_HOST, "", "",
	  false },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu" }, M_HOST, "::ffff:192.0.2.5", "", true },
	{ MASK_HOSTS, { "192.0.2.0/24" }, M_HOST, "198.51.100.1", "192.0.2.5", false },
	{ MASK_HOSTS, { "::1", "2001:db8::/32" }, M_HOST, "::1", "", true },
	{ MASK_HOSTS, { "::1", "2001:db8::/32" }, M_HOST, "::2", "", false },
	{ MASK_HOSTS, { "::1", "2001:db8::/32" }, M_HOST, "2001:db8::99", "", true },
	{ MASK_HOSTS, { "*" }, M_HOST, "", "", true },
	{ MASK_HOSTS, { "*" }, M_HOST, "192.0.2.1", "x", true },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu" }, M_IP, "192.0.2.5", NULL, true },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu" }, M_IP, "198.51.100.1", NULL, false },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu" }, M_NAME, "a.example.edu", NULL, true },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu" }, M_NAME, "192.0.2.5", NULL, false },
	{ MASK_HOSTS, { "192.0.2.0/24", "*.example.edu" }, M_NAME, "192.0.2.0/24", NULL, false },

	/* addresses: local part exact, domain case-insensitive */
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "user@example.com", NULL, true },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "user@EXAMPLE.COM", NULL, true },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "user@example.com.", NULL, true },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "<user@example.com>", NULL, true },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "User@example.com", NULL, false },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "xuser@example.com", NULL, false },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "user@sub.example.com", NULL, false },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "user@example.co", NULL, false },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "user@example.comm", NULL, false },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "user", NULL, false },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "<<user@example.com>>", NULL, false },
	{ MASK_ADDRESS, { "user@example.com" }, M_ADDRESS, "<>", NULL, false },
	{ MASK_ADDRESS, { "User@Example.COM." }, M_ADDRESS, "User@example.com", NULL, true },
	{ MASK_ADDRESS, { "User@Example.COM." }, M_ADDRESS, "user@example.com", NULL, false },
	{ MASK_ADDRESS, { "<user@example.com>" }, M_ADDRESS, "user@example.com", NULL, true },
	{ MASK_ADDRESS, { "a@b@example.com" }, M_ADDRESS, "a@b@EXAMPLE.com", NULL, true },
	{ MASK_ADDRESS, { "a@b@example.com" }, M_ADDRESS, "a@B@example.com", NULL, false },
	{ MASK_ADDRESS, { "user@[192.0.2.1]" }, M_ADDRESS, "<user@[192.0.2.1]>", NULL, true },
	/* @domain: exactly that domain, after the last '@' */
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "anyone@example.com", NULL, true },
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "Anyone@EXAMPLE.com.", NULL, true },
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "<x@example.com>", NULL, true },
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "@example.com", NULL, true },
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "x@sub.example.com", NULL, false },
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "x@badexample.com", NULL, false },
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "a@evil.com@example.com", NULL, true },
	{ MASK_ADDRESS, { "@evil.com" }, M_ADDRESS, "a@evil.com@example.com", NULL, false },
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "example.com", NULL, false },
	{ MASK_ADDRESS, { "@example.com" }, M_ADDRESS, "<>", NULL, false },
	/* *.domain on the address's domain */
	{ MASK_ADDRESS, { "*.example.com" }, M_ADDRESS, "x@example.com", NULL, true },
	{ MASK_ADDRESS, { "*.example.com" }, M_ADDRESS, "x@mx.Sub.Example.com", NULL, true },
	{ MASK_ADDRESS, { "*.example.com" }, M_ADDRESS, "<x@sub.example.com.>", NULL, true },
	{ MASK_ADDRESS, { "*.example.com" }, M_ADDRESS, "x@badexample.com", NULL, false },
	{ MASK_ADDRESS, { "*.example.com" }, M_ADDRESS, "x@example.com.evil", NULL, false },
	{ MASK_ADDRESS, { "*.example.com" }, M_ADDRESS, "example.com", NULL, false },
	{ MASK_ADDRESS, { "*.example.com" }, M_ADDRESS, "x.example.com@evil.org", NULL, false },
	{ MASK_ADDRESS, { "*.example.com" }, M_ADDRESS, "<>", NULL, false },
	/* the null sender */
	{ MASK_ADDRESS, { "<>" }, M_ADDRESS, "<>", NULL, true },
	{ MASK_ADDRESS, { "<>" }, M_ADDRESS, "", NULL, true },
	{ MASK_ADDRESS, { "<>" }, M_ADDRESS, "x@example.com", NULL, false },
	{ MASK_ADDRESS, { "<>" }, M_ADDRESS, "<x@example.com>", NULL, false },
	{ MASK_ADDRESS, { "<>" }, M_ADDRESS, "<<>>", NULL, false },
	{ MASK_ADDRESS, { "<>", "@example.com" }, M_ADDRESS, "x@example.com", NULL, true },
	{ MASK_ADDRESS, { "*" }, M_ADDRESS, "<>", NULL, true },
	{ MASK_ADDRESS, { "*" }, M_ADDRESS, "no-at-sign", NULL, true },
	{ MASK_ADDRESS, { NULL }, M_ADDRESS, "<>", NULL, false },
	/* an address list's *.domain serves the name matcher too, nothing else does */
	{ MASK_ADDRESS, { "*.example.com", "@example.org", "u@example.net" }, M_NAME,
	  "a.example.com", NULL, true },
	{ MASK_ADDRESS, { "*.example.com", "@example.org", "u@example.net" }, M_NAME,
	  "example.org", NULL, false },
	{ MASK_ADDRESS, { "*.example.com", "@example.org", "u@example.net" }, M_STRING,
	  "u@example.net", NULL, false },
	{ MASK_ADDRESS, { "*.example.com", "@example.org", "u@example.net" }, M_IP, "192.0.2.1",
	  NULL, false },

	/* strings: exact text, case-sensitive */
	{ MASK_STRING, { "Subject: hello" }, M_STRING, "Subject: hello", NULL, true },
	{ MASK_STRING, { "Subject: hello" }, M_STRING, "subject: hello", NULL, false },
	{ MASK_STRING, { "Subject: hello" }, M_STRING, "Subject: hello ", NULL, false },
	{ MASK_STRING, { "Subject: hello" }, M_STRING, "Subject: hell", NULL, false },
	{ MASK_STRING, { "Subject: hello" }, M_STRING, "", NULL, false },
	{ MASK_STRING, { "User@Example.com" }, M_STRING, "User@Example.com", NULL, true },
	{ MASK_STRING, { "User@Example.com" }, M_STRING, "User@example.com", NULL, false },
	{ MASK_STRING, { "<>" }, M_STRING, "<>", NULL, true },
	{ MASK_STRING, { "<>" }, M_STRING, "", NULL, false },
	{ MASK_STRING, { "*.example.com" }, M_STRING, "a.example.com", NULL, false },
	{ MASK_STRING, { "*.example.com" }, M_STRING, "*.example.com", NULL, true },
	{ MASK_STRING, { "*" }, M_STRING, "", NULL, true },
	{ MASK_STRING, { "*" }, M_STRING, "anything", NULL, true },
	{ MASK_STRING, { "mx.example.com" }, M_NAME, "mx.example.com", NULL, false },
	{ MASK_STRING, { "a@example.com" }, M_ADDRESS, "a@example.com", NULL, false },
	{ MASK_NAME, { "mx.example.com" }, M_STRING, "mx.example.com", NULL, false },
	{ MASK_NAME, { "*.example.com" }, M_ADDRESS, "a@example.com", NULL, true },
	{ MASK_STRING, { "*" }, M_IP, "192.0.2.1", NULL, true },
	{ MASK_STRING, { "*" }, M_HOST, "", "", true },
};

static bool run_match(size_t i, const struct mask_list *l)
{
	struct ipaddr a, *ap = NULL;
	const char *subject = matches[i].subject;

	switch (matches[i].m) {
	case M_IP:
	case M_HOST:
		if (subject[0] != '\0') {
			if (ipaddr_parse(str_cstr(subject), &a) != 0)
				fail_msg("case %zu: bad test address '%s'", i, subject);
			ap = &a;
		}
		if (matches[i].m == M_IP)
			return mask_list_match_ip(l, ap);
		return mask_list_match_host(l, ap, str_cstr(matches[i].name));
	case M_NAME:
		return mask_list_match_name(l, str_cstr(subject));
	case M_ADDRESS:
		return mask_list_match_address(l, str_cstr(subject));
	case M_STRING:
		return mask_list_match_string(l, str_cstr(subject));
	}
	return false;
}

static void test_match(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(matches); i++) {
		struct mask_list *l = mask_list_new(matches[i].type);
		char err[256];
		assert_non_null(l);
		for (size_t k = 0; k < ARRAY_SIZE(matches[i].masks) && matches[i].masks[k]; k++) {
			if (mask_list_add(l, str_cstr(matches[i].masks[k]), err, sizeof(err)) != 0)
				fail_msg("case %zu: '%s' refused: %s", i, matches[i].masks[k], err);
		}
		bool got = run_match(i, l);
		if (got != matches[i].want)
			fail_msg("case %zu: %s%s%s against '%s'... should be %s", i,
				 matches[i].subject, matches[i].name ? " / " : "",
				 matches[i].name ? matches[i].name : "", matches[i].masks[0],
				 matches[i].want ? "true" : "false");
		mask_list_free(l);
	}
}

/* Subjects with NUL bytes and odd lengths are compared as bytes; NULL lists match nothing. */
static void test_match_edges(void **state)
{
	(void)state;
	struct mask_list *l = mask_list_new(MASK_ADDRESS);
	char err[256];
	assert_int_equal(mask_list_add(l, str_cstr("user@example.com"), err, sizeof(err)), 0);
	assert_int_equal(mask_list_add(l, str_cstr("*.example.org"), err, sizeof(err)), 0);
	assert_false(mask_list_match_address(l, str_make(LIT("user@example.com\0"))));
	assert_false(mask_list_match_address(l, str_make(LIT("user\0@example.com"))));
	assert_false(mask_list_match_address(l, str_make(LIT("x@example.org\0"))));
	assert_true(mask_list_match_address(l, str_make("user@example.comXXX", 16)));
	assert_false(mask_list_match_address(l, str_make("<", 1)));
	assert_false(mask_list_match_address(l, str_make(">", 1)));
	assert_false(mask_list_match_address(l, str_make("@", 1)));
	assert_false(mask_list_match_address(l, STR_NULL));
	assert_false(mask_list_match_name(l, str_make("x.example.org", 0)));
	mask_list_free(l);

	l = mask_list_new(MASK_NAME);
	assert_int_equal(mask_list_add(l, str_cstr("*.example.com"), err, sizeof(err)), 0);
	assert_false(mask_list_match_name(l, str_make(LIT("a.example.com\0"))));
	assert_true(mask_list_match_name(l, str_make(LIT("a\0.example.com")))); /* just a byte */
	assert_false(mask_list_match_name(l, str_make(".", 1)));
	assert_false(mask_list_match_name(l, STR_NULL));
	assert_false(mask_list_match_host(l, NULL, STR_NULL));
	mask_list_free(l);

	assert_false(mask_list_match_ip(NULL, NULL));
	assert_false(mask_list_match_name(NULL, str_cstr("x")));
	assert_false(mask_list_match_host(NULL, NULL, str_cstr("x")));
	assert_false(mask_list_match_address(NULL, str_cstr("<>")));
	assert_false(mask_list_match_string(NULL, str_cstr("x")));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_add),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_count),
		cmocka_unit_test(test_match),
		cmocka_unit_test(test_match_edges),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
