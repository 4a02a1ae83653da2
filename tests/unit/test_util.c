/*
 * test_util -- lib/util's shared helpers: text_sanitize, jitter, fmt_duration.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "util.h"

static struct str S(const char *s)
{
	return str_cstr(s);
}

static void test_sanitize(void **state)
{
	(void)state;
	char out[64];
	static const struct {
		const char *in;
		size_t max, dstlen;
		unsigned flags;
		const char *want;
	} cases[] = {
		{ "plain text", SIZE_MAX, 64, 0, "plain text" },
		{ "a\001b\x80\xff\x7f", SIZE_MAX, 64, 0, "a?b???" },
		{ "say \"hi\"", SIZE_MAX, 64, 0, "say \"hi\"" },
		{ "say \"hi\"", SIZE_MAX, 64, TEXT_NO_QUOTES, "say ?hi?" },
		{ "abcdefghij", 4, 64, 0, "abcd" },
		{ "abcdefghij", 4, 64, TEXT_MARK_CUT, "abcd..." },
		{ "abcd", 4, 64, TEXT_MARK_CUT, "abcd" },
		{ "abcdefghij", SIZE_MAX, 6, 0, "abcde" },
		{ "abcdefghij", SIZE_MAX, 6, TEXT_MARK_CUT, "abcde" }, /* no room for "..." */
		{ "  one\r\n\ttwo  three \n", SIZE_MAX, 64, TEXT_FOLD_SPACE, "one two three" },
		{ "a\0b", SIZE_MAX, 64, TEXT_FOLD_SPACE, "ab" },
		{ "ab cd", 3, 64, TEXT_FOLD_SPACE, "ab" }, /* no lone trailing space */
		{ "ab cd", 4, 64, TEXT_FOLD_SPACE, "ab c" },
		{ "", SIZE_MAX, 64, TEXT_MARK_CUT, "" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct str in = S(cases[i].in);
		if (strcmp(cases[i].in, "a") == 0)
			in.len = 3; /* "a\0b" */
		size_t n = text_sanitize(out, cases[i].dstlen, in, cases[i].max, cases[i].flags);
		if (strcmp(out, cases[i].want) != 0 || n != strlen(out))
			fail_msg("case %zu: \"%s\" (%zu), want \"%s\"", i, out, n, cases[i].want);
	}
	assert_int_equal(text_sanitize(out, 0, S("x"), 1, 0), 0);
}

static void test_jitter(void **state)
{
	(void)state;
	uint64_t lo = UINT64_MAX, hi = 0;
	for (int i = 0; i < 20000; i++) {
		uint64_t v = jitter(1000, 10, 20);
		assert_true(v >= 900 && v <= 1200);
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
	}
	/* spread over the range, not stuck at a point */
	assert_true(lo < 920 && hi > 1180);
	assert_int_equal(jitter(0, 20, 20), 0);
	assert_int_equal(jitter(7, 0, 0), 7);
	assert_true(jitter(UINT64_MAX, 0, 50) == UINT64_MAX);
	for (int i = 0; i < 1000; i++)
		assert_true(jitter(UINT64_MAX / 2, 100, 0) <= UINT64_MAX / 2);
}

static void test_duration(void **state)
{
	(void)state;
	char b[32];
	static const struct {
		uint64_t ms;
		enum duration_style style;
		const char *want;
	} cases[] = {
		{ 90000, DURATION_EXACT, "90s" },
		{ 3600000, DURATION_EXACT, "1h" },
		{ 1500, DURATION_EXACT, "1500ms" },
		{ 0, DURATION_EXACT, "0ms" },
		{ 14 * 86400000ULL, DURATION_EXACT, "2w" },
		{ 86400000, DURATION_EXACT, "1d" },
		{ 45000, DURATION_UP, "45s" },
		{ 44001, DURATION_UP, "45s" },
		{ 200000, DURATION_UP, "3m20s" },
		{ 180000, DURATION_UP, "3m" },
		{ 7500000, DURATION_UP, "2h5m" },
		{ 7470000, DURATION_UP, "2h5m" }, /* 2h4m30s, rounded up */
		{ 97200000, DURATION_UP, "1d3h" },
		{ 86400000, DURATION_UP, "1d" },
		{ 0, DURATION_UP, "0s" },
		{ 250, DURATION_BRIEF, "250ms" },
		{ 1500, DURATION_BRIEF, "1.5s" },
		{ 125000, DURATION_BRIEF, "2m05s" },
		{ 3720000, DURATION_BRIEF, "1h02m" },
		{ 3599000, DURATION_BRIEF, "59m59s" },
		{ 59900, DURATION_BRIEF, "59.9s" },
		{ 7320000, DURATION_BRIEF, "2h02m" },
		{ 86400000, DURATION_BRIEF, "1d00h" },
		{ 273600000, DURATION_BRIEF, "3d04h" },
		{ UINT64_MAX, DURATION_BRIEF, "never" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		fmt_duration(b, sizeof(b), cases[i].ms, cases[i].style);
		if (strcmp(b, cases[i].want) != 0)
			fail_msg("case %zu: %llu ms: \"%s\", want \"%s\"", i,
				 (unsigned long long)cases[i].ms, b, cases[i].want);
	}
}

/* A password compared: equal only byte for byte and length for length. */
static void test_secret_equal(void **state)
{
	(void)state;
	static const struct {
		const char *given;
		size_t glen;
		const char *want;
		size_t wlen;
		bool equal;
	} cases[] = {
		{ "secret", 6, "secret", 6, true },
		{ "secreT", 6, "secret", 6, false },
		{ "Secret", 6, "secret", 6, false },
		{ "secre", 5, "secret", 6, false },    /* a prefix */
		{ "secrets", 7, "secret", 6, false },  /* longer */
		{ "secret\0", 7, "secret", 6, false }, /* a NUL after it */
		{ "", 0, "secret", 6, false },
		{ "", 0, "", 0, true },
		{ "x", 1, "", 0, false },
		{ "a\0b", 3, "a\0c", 3, false },
		{ "a\0b", 3, "a\0b", 3, true },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (secret_equal(str_make(cases[i].given, cases[i].glen),
				 str_make(cases[i].want, cases[i].wlen)) != cases[i].equal)
			fail_msg("case %zu: expected %s", i, cases[i].equal ? "equal" : "different");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sanitize),
		cmocka_unit_test(test_jitter),
		cmocka_unit_test(test_duration),
		cmocka_unit_test(test_secret_equal),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
