/*
 * test_stats -- unit tests of the running statistics and their rendering
 * (src/engine/stats.c).
 *
 * Merging accumulators (as the stats reader does with the workers' shards) must give what
 * one accumulator over the union of the samples gives: the same count, min and max, and
 * mean and standard deviation within 1e-9, however the samples are split, including into
 * empty parts.  The text format is compared exactly; the JSON is checked by a small
 * parser written here (strict RFC 8259 syntax, no NaN or Infinity) and by its key paths.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"
#include "stats.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Direct two-pass computation, the reference. */
struct ref {
	uint64_t n;
	double min, max, mean, stddev;
};

static struct ref reference(const double *v, size_t n)
{
	struct ref r = { .n = n };
	if (n == 0)
		return r;
	double sum = 0;
	r.min = r.max = v[0];
	for (size_t i = 0; i < n; i++) {
		sum += v[i];
		if (v[i] < r.min)
			r.min = v[i];
		if (v[i] > r.max)
			r.max = v[i];
	}
	r.mean = sum / (double)n;
	double ss = 0;
	for (size_t i = 0; i < n; i++)
		ss += (v[i] - r.mean) * (v[i] - r.mean);
	r.stddev = n > 1 ? sqrt(ss / (double)(n - 1)) : 0.0;
	return r;
}

static void assert_close(double got, double want, const char *what)
{
	double tol = 1e-9 * (fabs(want) > 1.0 ? fabs(want) : 1.0);
	if (!(fabs(got - want) <= tol))
		fail_msg("%s: got %.17g, expected %.17g", what, got, want);
}

static void assert_matches(const struct stat_acc *a, const struct ref *r)
{
	assert_int_equal(a->n, r->n);
	if (r->n == 0) {
		assert_true(stat_acc_stddev(a) == 0.0);
		return;
	}
	assert_true(a->min == r->min);
	assert_true(a->max == r->max);
	assert_close(a->mean, r->mean, "mean");
	assert_close(stat_acc_stddev(a), r->stddev, "stddev");
}

/* Deterministic samples: several scales, negative values, repeated values. */
static uint64_t rng_state;

static double rng_next(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(rng_state >> 11) / 9007199254740992.0; /* [0, 1) */
}

static size_t make_samples(double *v, size_t n, int kind)
{
	for (size_t i = 0; i < n; i++) {
		double x = rng_next();
		switch (kind) {
		case 0: v[i] = x; break;                        /* seconds, < 1 */
		case 1: v[i] = 1000.0 + x * 1e-3; break;        /* large offset, tiny spread */
		case 2: v[i] = (x - 0.5) * 1e6; break;          /* wide, negative too */
		case 3: v[i] = 0.25; break;                      /* constant */
		case 4: v[i] = x < 0.5 ? 1e-6 : 3600.0; break;  /* bimodal */
		}
	}
	return n;
}

static void test_acc_single(void **state)
{
	(void)state;
	struct stat_acc a = { 0 };
	assert_true(stat_acc_stddev(&a) == 0.0);
	stat_acc_add(&a, 2.5);
	assert_int_equal(a.n, 1);
	assert_true(a.min == 2.5 && a.max == 2.5 && a.mean == 2.5);
	assert_true(stat_acc_stddev(&a) == 0.0);
	stat_acc_add(&a, 4.5);
	assert_true(a.min == 2.5 && a.max == 4.5);
	assert_close(a.mean, 3.5, "mean");
	assert_close(stat_acc_stddev(&a), sqrt(2.0), "stddev");
	/* a negative first sample must still set min and max */
	struct stat_acc b = { 0 };
	stat_acc_add(&b, -7.0);
	assert_true(b.min == -7.0 && b.max == -7.0);
	stat_acc_add(&b, -9.0);
	assert_true(b.min == -9.0 && b.max == -7.0);
}

/* Split points across the sample set, merged in both orders and from many shards. */
static void test_acc_merge_equals_union(void **state)
{
	(void)state;
	enum { N = 1000 };
	double *v = malloc(N * sizeof(*v));
	assert_non_null(v);
	static const size_t sizes[] = { 0, 1, 2, 3, 10, 999, 1000 };
	for (int kind = 0; kind < 5; kind++) {
		rng_state = 42 + (uint64_t)kind;
		for (size_t si = 0; si < ARRAY_SIZE(sizes); si++) {
			size_t n = make_samples(v, sizes[si], kind);
			struct ref r = reference(v, n);
			struct stat_acc whole = { 0 };
			for (size_t i = 0; i < n; i++)
				stat_acc_add(&whole, v[i]);
			assert_matches(&whole, &r);
			/* every split in two, merged a+b and b+a */
			size_t step = n > 50 ? n / 17 : 1;
			for (size_t cut = 0; cut <= n; cut += step) {
				struct stat_acc a = { 0 }, b = { 0 };
				for (size_t i = 0; i < cut; i++)
					stat_acc_add(&a, v[i]);
				for (size_t i = cut; i < n; i++)
					stat_acc_add(&b, v[i]);
				struct stat_acc ab = a, ba = b;
				stat_acc_merge(&ab, &b);
				stat_acc_merge(&ba, &a);
				assert_matches(&ab, &r);
				assert_matches(&ba, &r);
			}
			/* 8 shards, round robin, some empty, merged into an empty reader */
			struct stat_acc shards[8];
			memset(shards, 0, sizeof(shards));
			for (size_t i = 0; i < n; i++)
				stat_acc_add(&shards[(i * 5) % 7], v[i]); /* shard 7 stays empty */
			struct stat_acc reader = { 0 };
			for (int k = 0; k < 8; k++)
				stat_acc_merge(&reader, &shards[k]);
			assert_matches(&reader, &r);
		}
	}
	free(v);
}

static void test_acc_merge_empty(void **state)
{
	(void)state;
	struct stat_acc empty = { 0 }, e2 = { 0 };
	stat_acc_merge(&empty, &e2);
	assert_int_equal(empty.n, 0);
	assert_true(stat_acc_stddev(&empty) == 0.0);

	struct stat_acc a = { 0 };
	stat_acc_add(&a, 1.0);
	stat_acc_add(&a, 3.0);
	struct stat_acc before = a;
	stat_acc_merge(&a, &e2); /* nothing changes */
	assert_memory_equal(&a, &before, sizeof(a));
	struct stat_acc c = { 0 };
	stat_acc_merge(&c, &a); /* a copy */
	assert_memory_equal(&c, &a, sizeof(a));
	assert_close(stat_acc_stddev(&c), sqrt(2.0), "stddev");
}

static void test_counters_merge(void **state)
{
	(void)state;
	struct service_counters a = { .connections = 3, .refused = 1, .protocol_errors = 2,
				      .timeouts = 4, .sessions = 5 };
	struct service_counters b = { .connections = 10, .refused = 20, .protocol_errors = 30,
				      .timeouts = 40, .sessions = 50 };
	stat_acc_add(&a.duration, 1.0);
	stat_acc_add(&b.duration, 2.0);
	stat_acc_add(&b.duration, 3.0);
	stat_acc_add(&b.work, 0.5);
	service_counters_merge(&a, &b);
	assert_int_equal(a.connections, 13);
	assert_int_equal(a.refused, 21);
	assert_int_equal(a.protocol_errors, 32);
	assert_int_equal(a.timeouts, 44);
	assert_int_equal(a.sessions, 55);
	assert_int_equal(a.duration.n, 3);
	assert_close(a.duration.mean, 2.0, "duration mean");
	assert_int_equal(a.work.n, 1);
	assert_true(a.work.min == 0.5);
}

static struct service_stats sample_stats(void)
{
	struct service_stats st = {
		.name = "milter",
		.current = 3,
		.peak = 17,
		.interval_seconds = 60.4,
		.uptime_seconds = 86400.0,
	};
	st.total.connections = 1234;
	st.total.sessions = 1230;
	st.total.refused = 2;
	st.total.protocol_errors = 5;
	st.total.timeouts = 1;
	stat_acc_add(&st.total.duration, 0.5);
	stat_acc_add(&st.total.duration, 1.5);
	stat_acc_add(&st.total.work, 0.001);
	stat_acc_add(&st.total.work, 0.003);
	st.interval.connections = 10;
	st.interval.sessions = 9;
	stat_acc_add(&st.interval.duration, 2.0);
	st.last.connections = 40;
	st.last.sessions = 41;
	st.last.refused = 1;
	st.last.timeouts = 2;
	stat_acc_add(&st.last.duration, 11.5);
	stat_acc_add(&st.last.duration, 12.5);
	stat_acc_add(&st.last.work, 0.0425);
	st.last_seconds = 300.2;
	st.last_complete = true;
	return st;
}

static void test_format_text(void **state)
{
	(void)state;
	struct service_stats st[2] = { sample_stats(), { .name = "policy", .current = 1,
							 .interval_seconds = 12.4,
							 .last_seconds = 12.4 } };
	stat_acc_add(&st[1].total.duration, 0.25);
	st[1].total.connections = 1;
	struct buf out;
	buf_init(&out, 1 << 16);
	assert_int_equal(service_stats_format(&out, st, 2), 0);
	static const char expect[] =
		"service  connections    now   peak  refused  proto-err  timeouts  last-err\n"
		"milter          1234      3     17        2          5         1         3\n"
		"policy             1      1      0        0          0         0         0\n"
		"\n"
		"session duration (s)      sessions       min      mean       max   std-dev\n"
		"milter   last 300 s              2    11.500    12.000    12.500     0.707\n"
		"         since start             2     0.500     1.000     1.500     0.707\n"
		"policy   so far 12 s             0         -         -         -         -\n"
		"         since start             1     0.250     0.250     0.250     0.000\n"
		"\n"
		"work time (ms)            sessions       min      mean       max   std-dev\n"
		"milter   last 300 s              1    42.500    42.500    42.500     0.000\n"
		"         since start             2     1.000     2.000     3.000     1.414\n"
		"policy   so far 12 s             0         -         -         -         -\n"
		"         since start             0         -         -         -         -\n";
	assert_string_equal(out.ptr, expect);
	/* every line fits 80 columns */
	for (const char *p = out.ptr; *p;) {
		size_t len = strcspn(p, "\n");
		assert_true(len <= 80);
		p += len + (p[len] != 0);
	}
	/* appends; a buffer that is too small fails */
	assert_int_equal(service_stats_format(&out, st, 2), 0);
	assert_int_equal(out.len, 2 * (sizeof(expect) - 1));
	struct buf tiny;
	buf_init(&tiny, 40);
	assert_true(service_stats_format(&tiny, st, 2) < 0);
	buf_done(&tiny);
	buf_done(&out);
}

/* ---- a strict JSON reader, enough to validate and list key paths ---------------------- */

struct json {
	const char *p, *end;
	char paths[128][96]; /* "a.b.c" of every value seen */
	size_t npaths;
	double numbers[128];
	int depth;
};

static bool json_value(struct json *j, const char *path);

static void json_ws(struct json *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

static bool json_string(struct json *j, char *out, size_t outlen)
{
	size_t o = 0;
	if (j->p >= j->end || *j->p != '"')
		return false;
	j->p++;
	while (j->p < j->end && *j->p != '"') {
		unsigned char c = (unsigned char)*j->p;
		if (c < 0x20)
			return false;
		if (c == '\\') {
			j->p++;
			if (j->p >= j->end || !strchr("\"\\/bfnrtu", *j->p))
				return false;
			if (*j->p == 'u') {
				for (int k = 1; k <= 4; k++)
					if (j->p + k >= j->end || !strchr("0123456789abcdefABCDEF", j->p[k]))
						return false;
				j->p += 4;
			}
		}
		if (o + 1 < outlen)
			out[o++] = (char)c;
		j->p++;
	}
	if (j->p >= j->end)
		return false;
	j->p++;
	out[o] = '\0';
	return true;
}

static bool json_number(struct json *j, double *ret)
{
	const char *s = j->p;
	if (j->p < j->end && *j->p == '-')
		j->p++;
	if (j->p >= j->end || *j->p < '0' || *j->p > '9')
		return false;
	if (*j->p == '0')
		j->p++;
	else
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	if (j->p < j->end && *j->p == '.') {
		j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return false;
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return false;
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	char tmp[64];
	size_t n = (size_t)(j->p - s);
	if (n >= sizeof(tmp))
		return false;
	memcpy(tmp, s, n);
	tmp[n] = '\0';
	*ret = strtod(tmp, NULL);
	return true;
}

static bool json_object(struct json *j, const char *path)
{
	j->p++; /* '{' */
	json_ws(j);
	if (j->p < j->end && *j->p == '}') {
		j->p++;
		return true;
	}
	for (;;) {
		char key[64], sub[96];
		json_ws(j);
		if (!json_string(j, key, sizeof(key)))
			return false;
		json_ws(j);
		if (j->p >= j->end || *j->p != ':')
			return false;
		j->p++;
		snprintf(sub, sizeof(sub), "%s%s%s", path, path[0] ? "." : "", key);
		if (!json_value(j, sub))
			return false;
		json_ws(j);
		if (j->p < j->end && *j->p == ',') {
			j->p++;
			continue;
		}
		if (j->p < j->end && *j->p == '}') {
			j->p++;
			return true;
		}
		return false;
	}
}

static bool json_value(struct json *j, const char *path)
{
	if (++j->depth > 32)
		return false;
	json_ws(j);
	if (j->npaths < ARRAY_SIZE(j->paths)) {
		snprintf(j->paths[j->npaths], sizeof(j->paths[0]), "%s", path);
		j->numbers[j->npaths] = NAN;
	}
	size_t me = j->npaths++;
	bool ok;
	if (j->p >= j->end) {
		ok = false;
	} else if (*j->p == '{') {
		ok = json_object(j, path);
	} else if (*j->p == '"') {
		char tmp[128];
		ok = json_string(j, tmp, sizeof(tmp));
	} else if (*j->p == 't' || *j->p == 'f' || *j->p == 'n') {
		static const char *const lits[] = { "true", "false", "null" };
		ok = false;
		for (size_t i = 0; i < 3; i++) {
			size_t l = strlen(lits[i]);
			if ((size_t)(j->end - j->p) >= l && memcmp(j->p, lits[i], l) == 0) {
				j->p += l;
				ok = true;
			}
		}
	} else {
		double d = 0;
		ok = json_number(j, &d);
		if (ok && me < ARRAY_SIZE(j->numbers))
			j->numbers[me] = d;
	}
	j->depth--;
	return ok;
}

/* Parses text as one JSON document; fails the test with the position on a syntax error. */
static void json_parse(struct json *j, const char *text, size_t len)
{
	memset(j, 0, sizeof(*j));
	j->p = text;
	j->end = text + len;
	if (!json_value(j, "")) {
		fail_msg("invalid JSON at offset %td: %.40s", j->p - text, j->p);
	}
	json_ws(j);
	if (j->p != j->end)
		fail_msg("trailing bytes after JSON at offset %td", j->p - text);
}

static double json_get(const struct json *j, const char *path)
{
	for (size_t i = 0; i < j->npaths && i < ARRAY_SIZE(j->paths); i++)
		if (strcmp(j->paths[i], path) == 0)
			return j->numbers[i];
	fail_msg("JSON key %s missing", path);
	return NAN;
}

/* The reader itself: it must refuse what it should. */
static void test_json_reader(void **state)
{
	(void)state;
	static const char *const bad[] = { "{", "{\"a\":}", "{\"a\":1,}", "{\"a\":nan}", "{\"a\":inf}",
					   "{a:1}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":-}" };
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		struct json j;
		memset(&j, 0, sizeof(j));
		j.p = bad[i];
		j.end = bad[i] + strlen(bad[i]);
		bool ok = json_value(&j, "");
		json_ws(&j);
		if (ok && j.p == j.end)
			fail_msg("reader accepted %s", bad[i]);
	}
	struct json j;
	static const char good[] = " {\"a\":{\"b\":-1.5e3,\"c\":\"x\\\"y\"},\"d\":true} ";
	json_parse(&j, good, sizeof(good) - 1);
	assert_true(json_get(&j, "a.b") == -1500.0);
}

static void test_format_json(void **state)
{
	(void)state;
	struct service_stats st = sample_stats();
	struct buf out;
	buf_init(&out, 1 << 16);
	/* service_stats_json() writes one member, "name":{...}: wrap it as the daemon does */
	assert_int_equal(buf_append_byte(&out, '{'), 0);
	assert_int_equal(service_stats_json(&out, &st), 0);
	assert_int_equal(buf_append_byte(&out, '}'), 0);
	struct json j;
	json_parse(&j, out.ptr, out.len);
	static const struct {
		const char *path;
		double value;
	} keys[] = {
		{ "milter.sessions_current", 3 },
		{ "milter.sessions_peak", 17 },
		{ "milter.connections", 1234 },
		{ "milter.refused", 2 },
		{ "milter.protocol_errors", 5 },
		{ "milter.timeouts", 1 },
		{ "milter.duration.count", 2 },
		{ "milter.duration.min", 0.5 },
		{ "milter.duration.mean", 1.0 },
		{ "milter.duration.max", 1.5 },
		{ "milter.duration.stddev", 0.707106781 },
		{ "milter.work.count", 2 },
		{ "milter.work.mean", 0.002 },
		{ "milter.since_start.seconds", 86400 },
		{ "milter.since_start.connections", 1234 },
		{ "milter.since_start.sessions", 1230 },
		{ "milter.since_start.refused", 2 },
		{ "milter.since_start.protocol_errors", 5 },
		{ "milter.since_start.timeouts", 1 },
		{ "milter.since_start.duration.count", 2 },
		{ "milter.since_start.work.max", 0.003 },
		{ "milter.interval.seconds", 60.4 },
		{ "milter.interval.connections", 10 },
		{ "milter.interval.sessions", 9 },
		{ "milter.interval.refused", 0 },
		{ "milter.interval.protocol_errors", 0 },
		{ "milter.interval.timeouts", 0 },
		{ "milter.interval.duration.count", 1 },
		{ "milter.interval.duration.min", 2 },
		{ "milter.interval.duration.stddev", 0 },
		{ "milter.interval.work.count", 0 },
		{ "milter.interval.work.min", 0 },
		{ "milter.interval.work.max", 0 },
		{ "milter.last_interval.seconds", 300.2 },
		{ "milter.last_interval.connections", 40 },
		{ "milter.last_interval.refused", 1 },
		{ "milter.last_interval.timeouts", 2 },
		{ "milter.last_interval.duration.count", 2 },
		{ "milter.last_interval.duration.mean", 12 },
		{ "milter.last_interval.work.max", 0.0425 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		double v = json_get(&j, keys[i].path);
		if (!(fabs(v - keys[i].value) <= 1e-9))
			fail_msg("%s: %.12g, expected %.12g", keys[i].path, v, keys[i].value);
	}
	assert_non_null(strstr(out.ptr, "\"last_interval_complete\":true,"));
	/* no key twice in one object: the paths are unique */
	for (size_t a = 0; a < j.npaths; a++)
		for (size_t b = a + 1; b < j.npaths; b++)
			if (strcmp(j.paths[a], j.paths[b]) == 0)
				fail_msg("key %s appears twice", j.paths[a]);
	buf_done(&out);
}

/* Empty statistics and extreme counters still give valid JSON and text. */
static void test_format_extremes(void **state)
{
	(void)state;
	struct service_stats st = { .name = "control" };
	struct buf out;
	buf_init(&out, 1 << 16);
	assert_int_equal(buf_append_byte(&out, '{'), 0);
	assert_int_equal(service_stats_json(&out, &st), 0);
	assert_int_equal(buf_append_byte(&out, '}'), 0);
	struct json j;
	json_parse(&j, out.ptr, out.len);
	assert_true(json_get(&j, "control.duration.count") == 0);
	assert_true(json_get(&j, "control.duration.min") == 0);

	st.current = UINT64_MAX;
	st.total.connections = UINT64_MAX;
	stat_acc_add(&st.total.duration, 1e12);
	stat_acc_add(&st.total.duration, 1e-12);
	buf_reset(&out);
	assert_int_equal(buf_append_byte(&out, '{'), 0);
	assert_int_equal(service_stats_json(&out, &st), 0);
	assert_int_equal(buf_append_byte(&out, '}'), 0);
	json_parse(&j, out.ptr, out.len);
	assert_true(json_get(&j, "control.sessions_current") == 18446744073709551615.0);
	buf_reset(&out);
	assert_int_equal(service_stats_format(&out, &st, 1), 0);
	assert_non_null(strstr(out.ptr, "\ncontrol  18446744073709551615 18446744073709551615      0"));
	buf_done(&out);
}

/* Each value lands in the first bucket whose edge is >= it; edges themselves belong to
 * their own bucket (Prometheus's le is "less than or equal"). */
static void test_hist_index(void **state)
{
	static const struct {
		double v;
		unsigned idx;
	} cases[] = {
		{ -1.0, 0 },      { 0.0, 0 },      { 0.0005, 0 },   { 0.001, 0 },
		{ 0.0010001, 1 }, { 0.0025, 1 },   { 0.003, 2 },    { 0.01, 3 },
		{ 0.011, 4 },     { 0.5, 8 },      { 0.75, 9 },     { 1.0, 9 },
		{ 2.0, 10 },      { 10.0, 12 },    { 29.9, 13 },    { 60.0, 14 },
		{ 60.0001, 15 },  { 1e12, 15 },    { NAN, 0 },      { INFINITY, 15 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		if (stat_hist_index(cases[i].v) != cases[i].idx)
			fail_msg("value %g: bucket %u, expected %u", cases[i].v,
				 stat_hist_index(cases[i].v), cases[i].idx);
	}
	for (unsigned i = 0; i + 1 < STAT_HIST_EDGES; i++)
		assert_true(stat_hist_le[i] < stat_hist_le[i + 1]);
}

/* The accumulator's histogram counts every sample once and its sum is the samples' sum;
 * merged shards give the histogram of the union. */
static void test_hist_merge(void **state)
{
	struct stat_acc all = { 0 }, part[3] = { { 0 } }, merged = { 0 };
	for (unsigned i = 0; i < 3000; i++) {
		double v = (double)(i % 1000) * 0.07; /* 0 .. 69.93 s: every bucket, +Inf too */
		stat_acc_add(&all, v);
		stat_acc_add(&part[i % 2], v); /* part[2] stays empty */
	}
	for (unsigned b = 0; b < STAT_HIST_EDGES; b++) { /* an edge is in its own bucket */
		stat_acc_add(&all, stat_hist_le[b]);
		stat_acc_add(&part[1], stat_hist_le[b]);
	}
	for (unsigned i = 0; i < 3; i++)
		stat_acc_merge(&merged, &part[i]);
	assert_int_equal(stat_hist_count(&all.hist), 3015);
	assert_int_equal(stat_hist_count(&merged.hist), 3015);
	for (unsigned b = 0; b < STAT_HIST_BUCKETS; b++) {
		assert_int_equal(all.hist.bucket[b], merged.hist.bucket[b]);
		assert_true(all.hist.bucket[b] > 0);
	}
	assert_true(fabs(all.hist.sum - all.mean * 3015.0) < 1e-6);
	assert_true(fabs(merged.hist.sum - all.hist.sum) < 1e-6);
	/* 0, 0.07, 0.14 ... : exactly 15 values (0 .. 0.98) are <= 1 s, three times over, and
	 * the ten edges up to 1 s */
	uint64_t le1 = 0;
	for (unsigned b = 0; b <= 9; b++)
		le1 += all.hist.bucket[b];
	assert_int_equal(le1, 55);
	assert_int_equal(all.hist.bucket[STAT_HIST_EDGES], 3 * (1000 - 858));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_acc_single),
		cmocka_unit_test(test_acc_merge_equals_union),
		cmocka_unit_test(test_acc_merge_empty),
		cmocka_unit_test(test_counters_merge),
		cmocka_unit_test(test_format_text),
		cmocka_unit_test(test_json_reader),
		cmocka_unit_test(test_format_json),
		cmocka_unit_test(test_format_extremes),
		cmocka_unit_test(test_hist_index),
		cmocka_unit_test(test_hist_merge),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
