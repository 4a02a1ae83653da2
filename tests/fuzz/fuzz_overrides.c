/*
 * fuzz_overrides -- libFuzzer target for rate windows and override files (src/lib/rate.c).
 *
 * The input is an overrides file.  Besides "no crash, no leak, no UB" it checks what
 * rate.h promises, aborting when a promise is broken:
 *   - a failed parse leaves *ret alone and writes "fuzz:LINE: message" with a line that
 *     exists (or "fuzz: ..." for a whole-file error), also into a tiny buffer;
 *   - a parsed table holds exactly one entry per key line, every key taken from the input
 *     is found, and every limit found is in range and survives a format/parse round trip;
 *   - the same input with a lowercasing normalizer parses or fails at the same place, and
 *     finds every lowercased key;
 *   - lookups of arbitrary slices of the input never crash and return valid limits;
 *   - rate_window_parse() on the first line either fails with a message or gives a window
 *     in range that formats and parses back to itself.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                            \
	do {                                                                                 \
		if (!(x)) {                                                                  \
			fprintf(stderr, "fuzz_overrides: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #x);                                               \
			abort();                                                             \
		}                                                                            \
	} while (0)

#define MAX_COUNT 1000000000000000ull
#define NS 1000000000ull

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static void check_window(const struct rate_window *w)
{
	char buf[64], err[512];
	struct rate_window back;

	CHECK(w->count >= 1 && w->count <= MAX_COUNT);
	CHECK(w->burst >= 1 && w->burst <= MAX_COUNT);
	CHECK(w->period_ns >= NS && w->period_ns <= 366 * 86400 * NS && w->period_ns % NS == 0);
	rate_window_format(w, buf, sizeof(buf));
	CHECK(strlen(buf) < sizeof(buf) - 1);
	CHECK(rate_window_parse(str_cstr(buf), &back, err, sizeof(err)) == 0);
	CHECK(memcmp(w, &back, sizeof(back)) == 0);
	/* truncation stays inside a small buffer */
	char tiny[4] = { 'x', 'x', 'x', 'x' };
	rate_window_format(w, tiny, 3);
	CHECK(tiny[2] == '\0' || strlen(tiny) < 3);
	CHECK(tiny[3] == 'x');
}

static void check_limits(const struct rate_limits *l)
{
	CHECK(l->n <= RATE_MAX_WINDOWS);
	for (unsigned i = 0; i < l->n; i++)
		check_window(&l->w[i]);
}

/* Lowercases ASCII; rejects keys that hold '!' (so that rejection is fuzzed too). */
static int lower_key(struct str key, char *out, void *arg)
{
	(void)arg;
	CHECK(key.len >= 1 && key.len <= RATE_MAX_OVERRIDE_KEY);
	if (memchr(key.ptr, '!', key.len))
		return -1;
	for (size_t i = 0; i < key.len; i++) {
		char c = key.ptr[i];
		out[i] = c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
	}
	return (int)key.len;
}

/* The key of each line that holds one (the parser's own rules, restated). */
static size_t next_key(const char *text, size_t len, size_t *pos, struct str *ret_key)
{
	while (*pos < len) {
		const char *nl = memchr(text + *pos, '\n', len - *pos);
		size_t end = nl ? (size_t)(nl - text) : len, i = *pos;
		*pos = end + 1;
		while (i < end && is_blank(text[i]))
			i++;
		if (i == end || text[i] == '#')
			continue;
		size_t start = i;
		while (i < end && !is_blank(text[i]))
			i++;
		*ret_key = str_make(text + start, i - start);
		return 1;
	}
	return 0;
}

static unsigned error_line(const char *err)
{
	unsigned line = 0;
	if (sscanf(err, "fuzz:%u: ", &line) != 1)
		return 0;
	return line;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data;
	struct rate_overrides *o = (struct rate_overrides *)&o, *sentinel = o;
	char err[512];
	unsigned lines = 1;

	for (size_t k = 0; k < size; k++)
		lines += data[k] == '\n';

	/* the first line as one window */
	const char *nl = memchr(text, '\n', size);
	struct str first = str_make(text, nl ? (size_t)(nl - text) : size);
	struct rate_window w = { 7, 7, 7 };
	memset(err, 'x', sizeof(err));
	if (rate_window_parse(first, &w, err, sizeof(err)) == 0) {
		check_window(&w);
	} else {
		CHECK(w.count == 7 && w.period_ns == 7 && w.burst == 7);
		CHECK(memchr(err, '\0', sizeof(err)));
		CHECK(strncmp(err, "bad rate window '", 17) == 0 ||
		      strcmp(err, "empty rate window") == 0);
	}

	/* the whole input as a file, without a normalizer */
	memset(err, 'x', sizeof(err));
	int r = rate_overrides_parse("fuzz", text, size, NULL, NULL, &o, err, sizeof(err));
	unsigned line = 0;
	if (r < 0) {
		CHECK(r == -EINVAL);
		CHECK(o == sentinel);
		CHECK(memchr(err, '\0', sizeof(err)));
		line = error_line(err);
		CHECK(line >= 1 && line <= lines);
		char tiny[3] = { 'x', 'x', 'x' };
		CHECK(rate_overrides_parse("fuzz", text, size, NULL, NULL, &o, tiny,
					   sizeof(tiny)) == r);
		CHECK(tiny[2] == '\0');
		CHECK(o == sentinel);
	} else {
		CHECK(o && o != sentinel);
		size_t pos = 0, keys = 0;
		struct str key;
		while (next_key(text, size, &pos, &key)) {
			const struct rate_limits *l = rate_overrides_find(o, key);
			CHECK(l);
			check_limits(l);
			keys++;
		}
		CHECK(keys == rate_overrides_count(o));
		/* arbitrary slices: prefixes and suffixes of the input */
		for (size_t n = 0; n <= size && n <= 24; n++) {
			const struct rate_limits *l = rate_overrides_find(o, str_make(text, n));
			if (l)
				check_limits(l);
			l = rate_overrides_find(o, str_make(text + size - n, n));
			if (l)
				check_limits(l);
		}
		rate_overrides_free(o);
	}

	/* again with a normalizer: the same verdict unless a key is rejected or two keys
	 * become one, and then an error no later than before */
	struct rate_overrides *on = NULL;
	memset(err, 'x', sizeof(err));
	int rn = rate_overrides_parse("fuzz", text, size, lower_key, NULL, &on, err, sizeof(err));
	if (rn < 0) {
		CHECK(rn == -EINVAL);
		CHECK(!on);
		unsigned nline = error_line(err);
		CHECK(nline >= 1 && nline <= lines);
		if (r < 0)
			CHECK(nline <= line);
	} else {
		CHECK(r == 0);
		size_t pos = 0;
		struct str key;
		char low[RATE_MAX_OVERRIDE_KEY];
		while (next_key(text, size, &pos, &key)) {
			int n = lower_key(key, low, NULL);
			CHECK(n > 0);
			const struct rate_limits *l =
				rate_overrides_find(on, str_make(low, (size_t)n));
			CHECK(l);
			check_limits(l);
		}
		rate_overrides_free(on);
	}
	return 0;
}
