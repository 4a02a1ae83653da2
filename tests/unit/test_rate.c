/*
 * test_rate -- unit tests of rate windows and override files (src/lib/rate.c).
 *
 * Table-driven: windows that parse (with their canonical text, which must parse back to
 * the same window), windows that do not (with the exact message), override files that
 * load (every key checked), and every override error with its file and line.  Then the
 * normalizer callback, the key length limit, the I/O errors of rate_overrides_load(), and
 * a 100,000-line file whose every key must be found.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "rate.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* A string literal and its length, so that tables can hold NUL bytes. */
#define LIT(s) s, sizeof(s) - 1

#define S 1000000000ull /* ns */
#define MIN (60 * S)
#define HOUR (3600 * S)
#define DAY (86400 * S)
#define WEEK (7 * DAY)
#define E15 1000000000000000ull

/* ---- windows --------------------------------------------------------------------- */

static const struct {
	const char *text;
	uint64_t count, period_ns, burst;
	const char *canonical;
} good_windows[] = {
	{ "10/1m", 10, MIN, 10, "10/1m" },
	{ "10/m", 10, MIN, 10, "10/1m" },
	{ "10/60s", 10, MIN, 10, "10/1m" },
	{ "10/0060s", 10, MIN, 10, "10/1m" },
	{ "500/1d", 500, DAY, 500, "500/1d" },
	{ "500/1d:600", 500, DAY, 600, "500/1d:600" },
	{ "2k/h", 2000, HOUR, 2000, "2000/1h" },
	{ "5/30s:10", 5, 30 * S, 10, "5/30s:10" },
	{ "10/1m:1", 10, MIN, 1, "10/1m:1" },
	{ "3/90s", 3, 90 * S, 3, "3/90s" },
	{ "1/s", 1, S, 1, "1/1s" },
	{ "1/w", 1, WEEK, 1, "1/1w" },
	{ "1/14d", 1, 2 * WEEK, 1, "1/2w" },
	{ "1/25h", 1, 25 * HOUR, 1, "1/25h" },
	{ "1/120m", 1, 2 * HOUR, 1, "1/2h" },
	{ "1M/1d", 1000000, DAY, 1000000, "1000000/1d" },
	{ "10G/1w:1k", 10000000000ull, WEEK, 1000, "10000000000/1w:1000" },
	{ "1000000G/s", E15, S, E15, "1000000000000000/1s" },
	{ "1000000000000k/s", E15, S, E15, "1000000000000000/1s" },
	{ "1000000000000000/1s:1000000000000000", E15, S, E15, "1000000000000000/1s" },
	{ "007/1m", 7, MIN, 7, "7/1m" },
	/* period bounds: 1 s .. 366 d */
	{ "1/1s", 1, S, 1, "1/1s" },
	{ "1/366d", 1, 366 * DAY, 1, "1/366d" },
	{ "1/52w", 1, 52 * WEEK, 1, "1/52w" },
	{ "1/8784h", 1, 366 * DAY, 1, "1/366d" },
	{ "1/527040m", 1, 366 * DAY, 1, "1/366d" },
	{ "1/31622400s", 1, 366 * DAY, 1, "1/366d" },
};

static void test_window_good(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(good_windows); i++) {
		struct rate_window w, back;
		char err[256] = "", buf[64];
		if (rate_window_parse(str_cstr(good_windows[i].text), &w, err, sizeof(err)) != 0)
			fail_msg("case %zu: '%s' refused: %s", i, good_windows[i].text, err);
		assert_int_equal(w.count, good_windows[i].count);
		assert_int_equal(w.period_ns, good_windows[i].period_ns);
		assert_int_equal(w.burst, good_windows[i].burst);
		assert_ptr_equal(rate_window_format(&w, buf, sizeof(buf)), buf);
		if (strcmp(buf, good_windows[i].canonical) != 0)
			fail_msg("case %zu: '%s' formats as '%s', expected '%s'", i,
				 good_windows[i].text, buf, good_windows[i].canonical);
		assert_int_equal(rate_window_parse(str_cstr(buf), &back, err, sizeof(err)), 0);
		assert_memory_equal(&w, &back, sizeof(w));
	}
}

#define SYNTAX "expected COUNT/PERIOD[:BURST] such as 10/1m, 2k/h or 5/30s:10"
#define COUNT_SYNTAX "the count must be a number with an optional k, M or G"
#define COUNT_RANGE "the count must be in [1, 10^15]"
#define PERIOD_SYNTAX "the period must be [N]s, m, h, d or w"
#define PERIOD_RANGE "the period must be in [1s, 366d]"
#define BURST_SYNTAX "the burst must be a number with an optional k, M or G"
#define BURST_RANGE "the burst must be in [1, 10^15]"

static const struct {
	const char *text;
	size_t len;
	const char *err;
} bad_windows[] = {
	{ LIT(""), "empty rate window" },
	{ LIT("10"), "bad rate window '10': " SYNTAX },
	{ LIT("0"), "bad rate window '0': " SYNTAX },
	{ LIT("10 per minute"), "bad rate window '10 per minute': " SYNTAX },
	{ LIT("/1m"), "bad rate window '/1m': " COUNT_SYNTAX },
	{ LIT("x/1m"), "bad rate window 'x/1m': " COUNT_SYNTAX },
	{ LIT("10x/1m"), "bad rate window '10x/1m': " COUNT_SYNTAX },
	{ LIT("10K/1m"), "bad rate window '10K/1m': " COUNT_SYNTAX },
	{ LIT("10m/1h"), "bad rate window '10m/1h': " COUNT_SYNTAX },
	{ LIT("10g/1h"), "bad rate window '10g/1h': " COUNT_SYNTAX },
	{ LIT("10kk/1m"), "bad rate window '10kk/1m': " COUNT_SYNTAX },
	{ LIT("k/1m"), "bad rate window 'k/1m': " COUNT_SYNTAX },
	{ LIT("-1/1m"), "bad rate window '-1/1m': " COUNT_SYNTAX },
	{ LIT("+1/1m"), "bad rate window '+1/1m': " COUNT_SYNTAX },
	{ LIT(" 10/1m"), "bad rate window ' 10/1m': " COUNT_SYNTAX },
	{ LIT("1.5/1m"), "bad rate window '1.5/1m': " COUNT_SYNTAX },
	{ LIT("0/1m"), "bad rate window '0/1m': " COUNT_RANGE },
	{ LIT("0k/1m"), "bad rate window '0k/1m': " COUNT_RANGE },
	{ LIT("1000000000000001/1m"), "bad rate window '1000000000000001/1m': " COUNT_RANGE },
	{ LIT("1000001G/1m"), "bad rate window '1000001G/1m': " COUNT_RANGE },
	{ LIT("1000000000001k/1m"), "bad rate window '1000000000001k/1m': " COUNT_RANGE },
	{ LIT("99999999999999999999999999/1m"),
	  "bad rate window '99999999999999999999999999/1m': " COUNT_RANGE },
	{ LIT("10/"), "bad rate window '10/': " PERIOD_SYNTAX },
	{ LIT("10/1"), "bad rate window '10/1': " PERIOD_SYNTAX },
	{ LIT("10/1x"), "bad rate window '10/1x': " PERIOD_SYNTAX },
	{ LIT("10/1M"), "bad rate window '10/1M': " PERIOD_SYNTAX },
	{ LIT("10/1mm"), "bad rate window '10/1mm': " PERIOD_SYNTAX },
	{ LIT("10/ms"), "bad rate window '10/ms': " PERIOD_SYNTAX },
	{ LIT("10/1 m"), "bad rate window '10/1 m': " PERIOD_SYNTAX },
	{ LIT("10/1m "), "bad rate window '10/1m ': " PERIOD_SYNTAX },
	{ LIT("10/1m/2"), "bad rate window '10/1m/2': " PERIOD_SYNTAX },
	{ LIT("10/-1m"), "bad rate window '10/-1m': " PERIOD_SYNTAX },
	{ LIT("10/0m"), "bad rate window '10/0m': " PERIOD_RANGE },
	{ LIT("10/0s"), "bad rate window '10/0s': " PERIOD_RANGE },
	{ LIT("10/367d"), "bad rate window '10/367d': " PERIOD_RANGE },
	{ LIT("10/53w"), "bad rate window '10/53w': " PERIOD_RANGE },
	{ LIT("10/31622401s"), "bad rate window '10/31622401s': " PERIOD_RANGE },
	{ LIT("10/8785h"), "bad rate window '10/8785h': " PERIOD_RANGE },
	{ LIT("10/99999999999999999999999d"),
	  "bad rate window '10/99999999999999999999999d': " PERIOD_RANGE },
	{ LIT("10/1m:"), "bad rate window '10/1m:': " BURST_SYNTAX },
	{ LIT("10/1m:x"), "bad rate window '10/1m:x': " BURST_SYNTAX },
	{ LIT("10/1m:5:6"), "bad rate window '10/1m:5:6': " BURST_SYNTAX },
	{ LIT("10/1m:-5"), "bad rate window '10/1m:-5': " BURST_SYNTAX },
	{ LIT("10/1m:0"), "bad rate window '10/1m:0': " BURST_RANGE },
	{ LIT("10/1m:2000000G"), "bad rate window '10/1m:2000000G': " BURST_RANGE },
	{ LIT("10/:5"), "bad rate window '10/:5': " PERIOD_SYNTAX },
	/* the user's text is escaped and cut */
	{ LIT("10/1\x01"), "bad rate window '10/1\\x01': " PERIOD_SYNTAX },
	{ LIT("10/1\0m"), "bad rate window '10/1\\x00m': " PERIOD_SYNTAX },
	{ LIT("a\\b"), "bad rate window 'a\\\\b': " SYNTAX },
	{ LIT("1111111111222222222233333333334444444444555555555566666666667777777777/1m"),
	  "bad rate window '1111111111222222222233333333334444444444555555555566666666667777'"
	  "...: " COUNT_RANGE },
};

static void test_window_bad(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(bad_windows); i++) {
		struct rate_window w = { 42, 42, 42 };
		char err[512] = "";
		int r = rate_window_parse(str_make(bad_windows[i].text, bad_windows[i].len), &w,
					  err, sizeof(err));
		if (r != -EINVAL || strcmp(err, bad_windows[i].err) != 0)
			fail_msg("case %zu: '%s'\n  got      %d %s\n  expected %s", i,
				 bad_windows[i].text, r, err, bad_windows[i].err);
		assert_int_equal(w.count, 42); /* untouched */
		assert_int_equal(w.period_ns, 42);
		assert_int_equal(w.burst, 42);
	}
	/* a NULL text, tiny and absent error buffers */
	struct rate_window w;
	char tiny[6];
	assert_int_equal(rate_window_parse(STR_NULL, &w, NULL, 0), -EINVAL);
	assert_int_equal(rate_window_parse(str_cstr("10/1x"), &w, tiny, sizeof(tiny)), -EINVAL);
	assert_string_equal(tiny, "bad r");
	assert_int_equal(rate_window_parse(str_cstr("10/1x"), &w, tiny, 1), -EINVAL);
	assert_string_equal(tiny, "");
}

static void test_window_format(void **state)
{
	(void)state;
	char buf[64];
	struct rate_window w = { .count = 10, .period_ns = MIN, .burst = 20 };

	/* every format of a parseable window parses back to it */
	static const uint64_t periods_s[] = { 1, 59, 60, 61, 3599, 3600, 86400, 604800,
					      1209600, 31622400, 90061 };
	static const uint64_t counts[] = { 1, 9, 1000, 999999, E15 };
	for (size_t p = 0; p < ARRAY_SIZE(periods_s); p++) {
		for (size_t c = 0; c < ARRAY_SIZE(counts); c++) {
			for (size_t b = 0; b < ARRAY_SIZE(counts); b++) {
				struct rate_window x = { counts[c], periods_s[p] * S, counts[b] },
						   y;
				char err[256];
				rate_window_format(&x, buf, sizeof(buf));
				if (rate_window_parse(str_cstr(buf), &y, err, sizeof(err)) != 0)
					fail_msg("'%s': %s", buf, err);
				assert_memory_equal(&x, &y, sizeof(x));
			}
		}
	}

	/* truncation is safe; nothing is written to a zero-length buffer */
	assert_string_equal(rate_window_format(&w, buf, 6), "10/1m");
	assert_string_equal(rate_window_format(&w, buf, 5), "10/1");
	assert_string_equal(rate_window_format(&w, buf, 1), "");
	buf[0] = 'x';
	assert_ptr_equal(rate_window_format(&w, buf, 0), buf);
	assert_int_equal(buf[0], 'x');

	/* the largest values fit in 64 bytes */
	struct rate_window big = { UINT64_MAX, UINT64_MAX - UINT64_MAX % S, UINT64_MAX - 1 };
	rate_window_format(&big, buf, sizeof(buf));
	assert_string_equal(buf, "18446744073709551615/18446744073s:18446744073709551614");
	/* a period that is not whole seconds cannot be written as a window; it is shown */
	struct rate_window odd = { 1, 1500000000, 1 };
	assert_string_equal(rate_window_format(&odd, buf, sizeof(buf)), "1/1500000000ns");
}

/* ---- overrides: good files ------------------------------------------------------- */

static struct rate_overrides *parse_ok(const char *text, size_t len,
				       rate_key_normalize_fn *normalize, void *arg)
{
	struct rate_overrides *o = NULL;
	char err[512] = "";
	int r = rate_overrides_parse("t.limits", text, len, normalize, arg, &o, err, sizeof(err));
	if (r != 0)
		fail_msg("parse failed (%d): %s\n--- input:\n%.*s", r, err, (int)len, text);
	assert_non_null(o);
	return o;
}

/* Limits written as text, "-" for NULL, "0" for unlimited, windows joined by ", ". */
static const char *limits_text(const struct rate_limits *l, char *buf, size_t size)
{
	size_t pos = 0;
	if (!l)
		return "-";
	if (l->n == 0)
		return "0";
	assert_true(l->n <= RATE_MAX_WINDOWS);
	buf[0] = '\0';
	for (unsigned i = 0; i < l->n; i++) {
		char w[64];
		rate_window_format(&l->w[i], w, sizeof(w));
		int n = snprintf(buf + pos, size - pos, "%s%s", i ? ", " : "", w);
		assert_true(n > 0 && (size_t)n < size - pos);
		pos += (size_t)n;
	}
	return buf;
}

static void expect_key(const struct rate_overrides *o, const char *key, const char *want)
{
	char buf[256];
	const char *got = limits_text(rate_overrides_find(o, str_cstr(key)), buf, sizeof(buf));
	if (strcmp(got, want) != 0)
		fail_msg("key '%s': got '%s', expected '%s'", key, got, want);
}

static const char design_file[] =
	"# per-recipient-domain limits\n"
	"example.com        100/1m, 5000/1d\n"
	"bulk.example.org   0                  # unlimited\n"
	"\n"
	"   # an indented comment\n"
	"  indented.example 10/1m:20   # after the windows\n"
	"tabs\t1/s,2/m,3/h,4/d\t\n"
	"crlf.example 5/1m\r\n"
	"\r\n"
	"#not-a-key 1/s\n"
	"hash#inside 7/h#no blank before the comment\n"
	"spaced   1/s ,  2/m  ,3/h\n"
	"zero.comment 0#\n"
	"Case.Example 1/s\n"
	"case.example 2/s\n"
	"last.example 9/w";

static void test_overrides_good(void **state)
{
	(void)state;
	struct rate_overrides *o = parse_ok(design_file, sizeof(design_file) - 1, NULL, NULL);

	assert_int_equal(rate_overrides_count(o), 11);
	expect_key(o, "example.com", "100/1m, 5000/1d");
	expect_key(o, "bulk.example.org", "0");
	expect_key(o, "indented.example", "10/1m:20");
	expect_key(o, "tabs", "1/1s, 2/1m, 3/1h, 4/1d");
	expect_key(o, "crlf.example", "5/1m");
	expect_key(o, "hash#inside", "7/1h");
	expect_key(o, "spaced", "1/1s, 2/1m, 3/1h");
	expect_key(o, "zero.comment", "0");
	expect_key(o, "Case.Example", "1/1s"); /* no normalizer: keys are exact */
	expect_key(o, "case.example", "2/1s");
	expect_key(o, "last.example", "9/1w");
	expect_key(o, "CASE.EXAMPLE", "-");
	expect_key(o, "#not-a-key", "-");
	expect_key(o, "not-a-key", "-");
	expect_key(o, "example.co", "-");
	expect_key(o, "example.com.", "-");
	expect_key(o, "", "-");
	expect_key(o, "crlf.example\r", "-");
	assert_null(rate_overrides_find(o, STR_NULL));
	assert_non_null(rate_overrides_find(o, str_make("example.com!", 11)));
	const struct rate_limits *u = rate_overrides_find(o, str_cstr("bulk.example.org"));
	assert_non_null(u);
	assert_int_equal(u->n, 0);
	assert_null(rate_overrides_free(o));
}

/* Files with no entries: empty, comments only, blank lines only. */
static void test_overrides_empty(void **state)
{
	(void)state;
	static const struct {
		const char *text;
		size_t len;
	} cases[] = {
		{ LIT("") }, { LIT("\n") }, { LIT("# c\n# d") }, { LIT("  \t\r\n\n \n") },
		{ LIT("#") }, { LIT("   #x 1/s\n") },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct rate_overrides *o = parse_ok(cases[i].text, cases[i].len, NULL, NULL);
		assert_int_equal(rate_overrides_count(o), 0);
		assert_null(rate_overrides_find(o, str_cstr("x")));
		assert_null(rate_overrides_find(o, str_cstr("")));
		rate_overrides_free(o);
	}
	struct rate_overrides *o = parse_ok(NULL, 0, NULL, NULL);
	assert_int_equal(rate_overrides_count(o), 0);
	rate_overrides_free(o);

	assert_null(rate_overrides_find(NULL, str_cstr("x")));
	assert_int_equal(rate_overrides_count(NULL), 0);
	assert_null(rate_overrides_free(NULL));
}

/* ---- overrides: errors ----------------------------------------------------------- */

static const struct {
	const char *text;
	size_t len;
	const char *err;
} bad_files[] = {
	{ LIT("key\n"), "t.limits:1: no limits for key 'key' (write 0 for unlimited)" },
	{ LIT("a 1/s\nkey   # comment\n"),
	  "t.limits:2: no limits for key 'key' (write 0 for unlimited)" },
	{ LIT("a 1/s\n\n# c\nkey 10/1x\n"),
	  "t.limits:4: bad rate window '10/1x': the period must be [N]s, m, h, d or w" },
	{ LIT("key 10/1m, 0/1d"),
	  "t.limits:1: bad rate window '0/1d': the count must be in [1, 10^15]" },
	{ LIT("key 10/1m 20/1h"), "t.limits:1: expected ',' between windows, got '20/1h'" },
	{ LIT("key 10/1m, 5/1h 20/1d # c"),
	  "t.limits:1: expected ',' between windows, got '20/1d'" },
	{ LIT("key 0 0"), "t.limits:1: expected ',' between windows, got '0'" },
	{ LIT("key ,10/1m"), "t.limits:1: empty window before ','" },
	{ LIT("key 10/1m,,5/1h"), "t.limits:1: empty window before ','" },
	{ LIT("key 10/1m,"), "t.limits:1: empty window after ','" },
	{ LIT("key 10/1m, # c"), "t.limits:1: empty window after ','" },
	{ LIT("key 0, 10/1m"), "t.limits:1: 0 (unlimited) must be the only value on its line" },
	{ LIT("key 10/1m, 0"), "t.limits:1: 0 (unlimited) must be the only value on its line" },
	{ LIT("key 00"), "t.limits:1: bad rate window '00': expected COUNT/PERIOD[:BURST] such as "
			 "10/1m, 2k/h or 5/30s:10" },
	{ LIT("key 1/s,2/s,3/s,4/s,5/s"), "t.limits:1: more than 4 windows" },
	{ LIT("a 1/s\nb 2/s\r\nc 3/s\na 4/s\n"), "t.limits:4: duplicate key 'a' (first on line 1)" },
	{ LIT("a 0\n\n\na 0\n"), "t.limits:4: duplicate key 'a' (first on line 1)" },
	{ LIT("a 1/s\nb\0 1/s\n"), "t.limits:2: NUL byte in input" },
	{ LIT("a 1/s # \0\n"), "t.limits:1: NUL byte in input" },
	{ LIT("a 1/s\n\n\n\n\n\n\n\n\nk\x01y 1/x"),
	  "t.limits:10: bad rate window '1/x': the period must be [N]s, m, h, d or w" },
	{ LIT("k\x01y\\ \n"), "t.limits:1: no limits for key 'k\\x01y\\\\' (write 0 for unlimited)" },
	/* the first error in file order is the one reported */
	{ LIT("a 1/s\na 1/x\n"),
	  "t.limits:2: bad rate window '1/x': the period must be [N]s, m, h, d or w" },
	{ LIT("a 1/x\na 1/s\n"),
	  "t.limits:1: bad rate window '1/x': the period must be [N]s, m, h, d or w" },
};

static void test_overrides_bad(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(bad_files); i++) {
		struct rate_overrides *o = (struct rate_overrides *)&o; /* must stay untouched */
		struct rate_overrides *sentinel = o;
		char err[512] = "";
		int r = rate_overrides_parse("t.limits", bad_files[i].text, bad_files[i].len, NULL,
					     NULL, &o, err, sizeof(err));
		if (r != -EINVAL || strcmp(err, bad_files[i].err) != 0)
			fail_msg("case %zu: %s\n  got      %d %s\n  expected %s", i,
				 bad_files[i].text, r, err, bad_files[i].err);
		assert_ptr_equal(o, sentinel);
	}
}

static void test_overrides_error_buffers(void **state)
{
	(void)state;
	struct rate_overrides *o = NULL;
	char err[8];

	memset(err, 'x', sizeof(err));
	assert_int_equal(rate_overrides_parse("t.limits", LIT("key"), NULL, NULL, &o, err,
					      sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.limit");
	assert_int_equal(rate_overrides_parse("t.limits", LIT("key"), NULL, NULL, &o, err, 1),
			 -EINVAL);
	assert_string_equal(err, "");
	assert_int_equal(rate_overrides_parse("t.limits", LIT("a 0\na 0"), NULL, NULL, &o, NULL,
					      0), -EINVAL);
	assert_null(o);

	/* no file name, no text, too much text (never read: the length alone is refused) */
	char big[128];
	assert_int_equal(rate_overrides_parse(NULL, LIT("key"), NULL, NULL, &o, big,
					      sizeof(big)), -EINVAL);
	assert_string_equal(big, "(overrides):1: no limits for key 'key' (write 0 for unlimited)");
	assert_int_equal(rate_overrides_parse("t.limits", NULL, 3, NULL, NULL, &o, big,
					      sizeof(big)), -EINVAL);
	assert_string_equal(big, "t.limits: no text");
	assert_int_equal(rate_overrides_parse("t.limits", "x", (size_t)RATE_MAX_OVERRIDES_FILE + 1,
					      NULL, NULL, &o, big, sizeof(big)), -EFBIG);
	assert_string_equal(big, "t.limits: larger than 67108864 bytes");
	assert_null(o);
}

/* ---- keys: normalizer and length ------------------------------------------------- */

struct norm_state {
	unsigned calls;
	int fixed; /* if not 0, return this instead */
};

/* Lowercases ASCII; rejects keys holding '!'. */
static int lower_key(struct str key, char *out, void *arg)
{
	struct norm_state *st = arg;
	st->calls++;
	if (st->fixed)
		return st->fixed;
	if (memchr(key.ptr, '!', key.len))
		return -1;
	for (size_t i = 0; i < key.len; i++) {
		char c = key.ptr[i];
		out[i] = c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
	}
	return (int)key.len;
}

static int empty_key(struct str key, char *out, void *arg)
{
	(void)key, (void)out, (void)arg;
	return 0;
}

/* Writes the longest key allowed whatever the input. */
static int long_key(struct str key, char *out, void *arg)
{
	(void)arg;
	memset(out, 'z', RATE_MAX_OVERRIDE_KEY);
	out[0] = key.ptr[0];
	return RATE_MAX_OVERRIDE_KEY;
}

static void test_normalize(void **state)
{
	(void)state;
	struct norm_state st = { 0, 0 };
	struct rate_overrides *o = NULL;
	char err[512];

	static const char text[] = "# c\nExample.COM 1/s\nother.example 2/s\n";
	o = parse_ok(LIT(text), lower_key, &st);
	assert_int_equal(st.calls, 2); /* once per key, never for comments */
	expect_key(o, "example.com", "1/1s");
	expect_key(o, "Example.COM", "-"); /* lookups take normalized keys */
	expect_key(o, "other.example", "2/1s");
	rate_overrides_free(o);

	/* duplicates are found after normalization, and shown normalized */
	o = NULL;
	assert_int_equal(rate_overrides_parse("t.limits", LIT("Example.COM 1/s\nexample.com 2/s"),
					      lower_key, &st, &o, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.limits:2: duplicate key 'example.com' (first on line 1)");
	assert_null(o);

	/* rejected keys, and the normalizer's bad answers, are shown as written */
	static const struct {
		int fixed;
		const char *text;
		const char *err;
	} rejects[] = {
		{ 0, "ok 1/s\nBad!Key 1/s\n", "t.limits:2: invalid key 'Bad!Key'" },
		{ -1, "k 1/s", "t.limits:1: invalid key 'k'" },
		{ -5, "k 1/s", "t.limits:1: invalid key 'k'" },
		{ 0, "# c\n\nk 1/s", NULL },
	};
	for (size_t i = 0; i < ARRAY_SIZE(rejects); i++) {
		struct norm_state s2 = { 0, rejects[i].fixed };
		int r = rate_overrides_parse("t.limits", rejects[i].text, strlen(rejects[i].text),
					     lower_key, &s2, &o, err, sizeof(err));
		if (!rejects[i].err) {
			assert_int_equal(r, 0);
			rate_overrides_free(o);
			o = NULL;
			continue;
		}
		assert_int_equal(r, -EINVAL);
		assert_string_equal(err, rejects[i].err);
	}
	/* an empty result and a result longer than the limit are invalid keys */
	assert_int_equal(rate_overrides_parse("t.limits", LIT("k 1/s"), empty_key, NULL, &o, err,
					      sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.limits:1: invalid key 'k'");
	struct norm_state over = { 0, RATE_MAX_OVERRIDE_KEY + 1 };
	assert_int_equal(rate_overrides_parse("t.limits", LIT("k 1/s"), lower_key, &over, &o, err,
					      sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.limits:1: invalid key 'k'");

	/* the normalizer may write the whole RATE_MAX_OVERRIDE_KEY bytes */
	o = parse_ok(LIT("a 1/s\nb 2/s"), long_key, NULL);
	char want[RATE_MAX_OVERRIDE_KEY];
	memset(want, 'z', sizeof(want));
	want[0] = 'b';
	const struct rate_limits *l = rate_overrides_find(o, str_make(want, sizeof(want)));
	assert_non_null(l);
	assert_int_equal(l->w[0].count, 2);
	rate_overrides_free(o);
}

static void test_key_length(void **state)
{
	(void)state;
	char text[RATE_MAX_OVERRIDE_KEY + 64], err[512];
	struct rate_overrides *o = NULL;

	/* exactly the limit */
	memset(text, 'k', RATE_MAX_OVERRIDE_KEY);
	memcpy(text + RATE_MAX_OVERRIDE_KEY, " 3/h\n", 5);
	o = parse_ok(text, RATE_MAX_OVERRIDE_KEY + 5, NULL, NULL);
	assert_non_null(rate_overrides_find(o, str_make(text, RATE_MAX_OVERRIDE_KEY)));
	assert_null(rate_overrides_find(o, str_make(text, RATE_MAX_OVERRIDE_KEY - 1)));
	assert_null(rate_overrides_find(o, str_make(text, RATE_MAX_OVERRIDE_KEY + 1)));
	rate_overrides_free(o);

	/* one byte more, on line 2 */
	text[0] = '\n';
	memset(text + 1, 'k', RATE_MAX_OVERRIDE_KEY + 1);
	memcpy(text + RATE_MAX_OVERRIDE_KEY + 2, " 3/h\n", 5);
	o = NULL;
	assert_int_equal(rate_overrides_parse("t.limits", text, RATE_MAX_OVERRIDE_KEY + 7, NULL,
					      NULL, &o, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.limits:2: key "
			    "'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk'... "
			    "longer than 512 bytes");
	assert_null(o);

	/* a very long key (1 MB, one line) is refused without trouble, even normalized */
	size_t n = 1u << 20;
	char *huge = malloc(n + 8);
	assert_non_null(huge);
	memset(huge, 'k', n);
	memcpy(huge + n, " 1/s", 4);
	struct norm_state st = { 0, 0 };
	assert_int_equal(rate_overrides_parse("t.limits", huge, n + 4, lower_key, &st, &o, err,
					      sizeof(err)), -EINVAL);
	assert_int_equal(st.calls, 0);
	assert_non_null(strstr(err, "longer than 512 bytes"));
	/* and a 1 MB lookup key is simply not found */
	o = parse_ok(LIT("k 1/s"), NULL, NULL);
	assert_null(rate_overrides_find(o, str_make(huge, n)));
	rate_overrides_free(o);
	free(huge);
}

/* ---- files ----------------------------------------------------------------------- */

static void write_file(const char *path, const char *text, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	close(fd);
}

static void test_load(void **state)
{
	(void)state;
	char path[] = "/tmp/test_rate.XXXXXX";
	char err[512], want[600];
	struct rate_overrides *o = NULL;
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);

	write_file(path, LIT(design_file));
	assert_int_equal(rate_overrides_load(path, NULL, NULL, &o, err, sizeof(err)), 0);
	assert_int_equal(rate_overrides_count(o), 11);
	expect_key(o, "example.com", "100/1m, 5000/1d");
	rate_overrides_free(o);

	o = NULL;
	write_file(path, LIT("a 1/s\nb 1/s\nc\n"));
	assert_int_equal(rate_overrides_load(path, NULL, NULL, &o, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "%s:3: no limits for key 'c' (write 0 for unlimited)", path);
	assert_string_equal(err, want);
	assert_null(o);

	/* larger than allowed (a sparse file: nothing is read) */
	assert_int_equal(truncate(path, (off_t)RATE_MAX_OVERRIDES_FILE + 1), 0);
	assert_int_equal(rate_overrides_load(path, NULL, NULL, &o, err, sizeof(err)), -EFBIG);
	snprintf(want, sizeof(want), "%s: larger than 67108864 bytes", path);
	assert_string_equal(err, want);
	assert_null(o);

	unlink(path);
	assert_int_equal(rate_overrides_load(path, NULL, NULL, &o, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "%s: No such file or directory", path);
	assert_string_equal(err, want);
	assert_int_equal(rate_overrides_load("/tmp", NULL, NULL, &o, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "/tmp: not a regular file");
	assert_null(o);
}

/* 100,000 keys with 1 to 4 windows each: every key is found with its own limits. */
static void test_many_keys(void **state)
{
	(void)state;
	enum { N = 100000 };
	size_t cap = (size_t)N * 64, len = 0;
	char *text = malloc(cap);
	assert_non_null(text);
	for (unsigned i = 0; i < N; i++) {
		int w;
		if (i % 1000 == 0)
			w = snprintf(text + len, cap - len, "# block %u\n\n", i / 1000);
		else if (i % 7 == 0)
			w = snprintf(text + len, cap - len, "key%u.example 0\n", i);
		else
			w = snprintf(text + len, cap - len, "key%u.example %u/1m, %u/1d:%u\n", i,
				     i % 13 + 1, i % 5 + 100, i + 1);
		assert_true(w > 0 && (size_t)w < cap - len);
		len += (size_t)w;
	}
	struct rate_overrides *o = parse_ok(text, len, NULL, NULL);
	assert_int_equal(rate_overrides_count(o), N - N / 1000);
	for (unsigned i = 0; i < N; i++) {
		char key[32];
		snprintf(key, sizeof(key), "key%u.example", i);
		const struct rate_limits *l = rate_overrides_find(o, str_cstr(key));
		if (i % 1000 == 0) {
			assert_null(l);
			continue;
		}
		if (!l)
			fail_msg("key %s not found", key);
		if (i % 7 == 0) {
			assert_int_equal(l->n, 0);
			continue;
		}
		assert_int_equal(l->n, 2);
		assert_int_equal(l->w[0].count, i % 13 + 1);
		assert_int_equal(l->w[0].period_ns, MIN);
		assert_int_equal(l->w[0].burst, i % 13 + 1);
		assert_int_equal(l->w[1].count, i % 5 + 100);
		assert_int_equal(l->w[1].period_ns, DAY);
		assert_int_equal(l->w[1].burst, i + 1);
		key[0] = 'K';
		assert_null(rate_overrides_find(o, str_cstr(key)));
	}
	assert_null(rate_overrides_find(o, str_cstr("key100000.example")));

	/* the same file with one duplicate near the end names both lines */
	int w = snprintf(text + len, cap - len, "key4242.example 1/s\n");
	char err[512];
	struct rate_overrides *o2 = NULL;
	assert_int_equal(rate_overrides_parse("t.limits", text, len + (size_t)w, NULL, NULL, &o2, err,
					      sizeof(err)), -EINVAL);
	assert_null(o2);
	/* key i is on line i + 1 plus the two-line headers of blocks 0..i/1000 */
	assert_string_equal(err, "t.limits:100101: duplicate key 'key4242.example' "
			    "(first on line 4248)");
	rate_overrides_free(o);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_window_good),
		cmocka_unit_test(test_window_bad),
		cmocka_unit_test(test_window_format),
		cmocka_unit_test(test_overrides_good),
		cmocka_unit_test(test_overrides_empty),
		cmocka_unit_test(test_overrides_bad),
		cmocka_unit_test(test_overrides_error_buffers),
		cmocka_unit_test(test_normalize),
		cmocka_unit_test(test_key_length),
		cmocka_unit_test(test_load),
		cmocka_unit_test(test_many_keys),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
