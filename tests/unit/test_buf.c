/*
 * test_buf -- unit tests of the JSON string writer of src/lib/buf.c.
 *
 * Table-driven: ASCII and what JSON requires escaped; valid multibyte UTF-8 at each length
 * and at the edges of each range of table 3-7 of the Unicode Standard; each class of
 * ill-formed input (stray continuation, overlong, surrogate, beyond U+10FFFF, truncated,
 * bytes that never occur), each byte of which becomes one \ufffd; U+2028/U+2029 escaped.
 * Every output is checked to be valid UTF-8 with no control byte.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static const struct {
	const char *in;
	const char *out; /* without the surrounding quotes */
} cases[] = {
	/* ASCII, and what JSON requires */
	{ "", "" },
	{ "plain@example.org", "plain@example.org" },
	{ "a\"b\\c/d", "a\\\"b\\\\c/d" },
	{ "\x01\x1f\n\r\t", "\\u0001\\u001f\\u000a\\u000d\\u0009" },
	{ "del\x7f", "del\\u007f" },
	{ " ~", " ~" },
	/* valid UTF-8 passes through: 2, 3 and 4 bytes, and each range's edges */
	{ "\xc3\xbc@ex\xc3\xa4mple.org", "\xc3\xbc@ex\xc3\xa4mple.org" },
	{ "\xc2\x80", "\xc2\x80" },                 /* U+0080 */
	{ "\xdf\xbf", "\xdf\xbf" },                 /* U+07FF */
	{ "\xe0\xa0\x80", "\xe0\xa0\x80" },         /* U+0800 */
	{ "\xed\x9f\xbf", "\xed\x9f\xbf" },         /* U+D7FF */
	{ "\xee\x80\x80", "\xee\x80\x80" },         /* U+E000 */
	{ "\xef\xbf\xbd", "\xef\xbf\xbd" },         /* U+FFFD as sent: kept as it is */
	{ "\xef\xbf\xbf", "\xef\xbf\xbf" },         /* U+FFFF */
	{ "\xf0\x90\x80\x80", "\xf0\x90\x80\x80" }, /* U+10000 */
	{ "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80" }, /* U+1F600 */
	{ "\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf" }, /* U+10FFFF */
	{ "\xe5\xb1\xb1\xe7\x94\xb0@\xe4\xbe\x8b\xe3\x81\x88.jp",
	  "\xe5\xb1\xb1\xe7\x94\xb0@\xe4\xbe\x8b\xe3\x81\x88.jp" },
	/* U+2028, U+2029 escaped (JavaScript); their neighbour U+2027 not */
	{ "a\xe2\x80\xa8" "b\xe2\x80\xa9", "a\\u2028b\\u2029" },
	{ "\xe2\x80\xa7", "\xe2\x80\xa7" },
	/* ill-formed: one \ufffd per byte */
	{ "\x80", "\\ufffd" },                         /* stray continuation */
	{ "a\xbf" "b", "a\\ufffdb" },
	{ "\xc0\xaf", "\\ufffd\\ufffd" },             /* overlong '/' */
	{ "\xc1\xbf", "\\ufffd\\ufffd" },             /* overlong 2-byte */
	{ "\xe0\x80\xaf", "\\ufffd\\ufffd\\ufffd" },   /* overlong 3-byte */
	{ "\xe0\x9f\xbf", "\\ufffd\\ufffd\\ufffd" },   /* overlong U+07FF */
	{ "\xf0\x80\x80\xaf", "\\ufffd\\ufffd\\ufffd\\ufffd" }, /* overlong 4-byte */
	{ "\xf0\x8f\xbf\xbf", "\\ufffd\\ufffd\\ufffd\\ufffd" }, /* overlong U+FFFF */
	{ "\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd" },   /* U+D800 */
	{ "\xed\xbf\xbf", "\\ufffd\\ufffd\\ufffd" },   /* U+DFFF */
	{ "\xed\xa0\xbd\xed\xb8\x80", "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd" }, /* CESU */
	{ "\xf4\x90\x80\x80", "\\ufffd\\ufffd\\ufffd\\ufffd" }, /* U+110000 */
	{ "\xf5\x80\x80\x80", "\\ufffd\\ufffd\\ufffd\\ufffd" },
	{ "\xfe\xff", "\\ufffd\\ufffd" },             /* never in UTF-8 */
	{ "\xc3", "\\ufffd" },                         /* truncated at the end */
	{ "\xe2\x82", "\\ufffd\\ufffd" },
	{ "\xf0\x9f\x98", "\\ufffd\\ufffd\\ufffd" },
	{ "\xc3" "a", "\\ufffda" },                    /* truncated by ASCII */
	{ "\xe2\x82\"", "\\ufffd\\ufffd\\\"" },
	{ "\xc3\xc3\xbc", "\\ufffd\xc3\xbc" },         /* truncated by another lead */
	{ "\xe9t\xe9@example.org", "\\ufffdt\\ufffd@example.org" }, /* Latin-1 */
	{ "\xc3\xa9\xe9\xc3\xa9", "\xc3\xa9\\ufffd\xc3\xa9" },
};

/* Valid UTF-8 (the same rules as the writer, written independently: by code point). */
static int valid_utf8(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned c = p[i];
		size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
								: (c & 0xf8) == 0xf0 ? 4 : 0;
		if (!len || i + len > n)
			return 0;
		uint32_t cp = len == 1 ? c : c & (0x7f >> len);
		for (size_t k = 1; k < len; k++) {
			if ((p[i + k] & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (p[i + k] & 0x3f);
		}
		static const uint32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
		if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		if (cp < 0x20 || cp == 0x7f)
			return 0; /* and no raw control */
		i += len;
	}
	return 1;
}

static void test_json_string(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct buf b;
		buf_init(&b, 4096);
		assert_int_equal(buf_append_json_string(&b, cases[i].in), 0);
		char want[512];
		snprintf(want, sizeof(want), "\"%s\"", cases[i].out);
		if (b.len != strlen(want) || memcmp(b.ptr, want, b.len) != 0)
			fail_msg("case %zu: got %.*s, want %s", i, (int)b.len, b.ptr, want);
		if (!valid_utf8((const unsigned char *)b.ptr, b.len))
			fail_msg("case %zu: output is not valid UTF-8", i);
		buf_done(&b);
	}
}

/* Every byte value after every lead byte: the output is always valid UTF-8. */
static void test_every_pair_is_valid_utf8(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 4096);
	for (unsigned x = 1; x < 256; x++) {
		for (unsigned y = 1; y < 256; y++) {
			char in[] = { (char)x, (char)y, (char)0xbf, '\0' };
			b.len = 0;
			assert_int_equal(buf_append_json_string(&b, in), 0);
			if (!valid_utf8((const unsigned char *)b.ptr, b.len))
				fail_msg("%02x %02x bf: output is not valid UTF-8", x, y);
		}
	}
	buf_done(&b);
}

/* A buffer too small: the error of the append, never an overrun. */
static void test_bounded(void **state)
{
	(void)state;
	for (size_t max = 0; max < 24; max++) {
		struct buf b;
		buf_init(&b, max);
		int r = buf_append_json_string(&b, "\xc3\xbc\x01\xe2\x80\xa8\xff-abc");
		/* "\"" + 2 + 6 + 6 + 6 + 4 + "\"" = 26 bytes */
		assert_int_equal(r, -ENOBUFS);
		assert_true(b.len <= max);
		buf_done(&b);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_json_string),
		cmocka_unit_test(test_every_pair_is_valid_utf8),
		cmocka_unit_test(test_bounded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
