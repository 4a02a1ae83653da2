/*
 * cfg_convert -- the converters of cfg.h: a scalar node to a string, a bool, an integer,
 * a duration or a size, each checked against its bounds, with errors that name the node
 * ("FILE:LINE: KEY: message").  Apart from the parser (cfg.c): no text is lexed here.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cfg.h"
#include "cfg_int.h"
#include "util.h"

/* ---- converters ------------------------------------------------------------------ */

/* The scalar's text, quoted, escaped and truncated, for an error message. */
static const char *show(const struct cfg_node *n, char *buf, size_t size)
{
	return cfg_show_text(n->value ? n->value : "", n->value ? n->value_len : 0, buf, size);
}

static int want_scalar(const struct cfg_node *n, const char *what, char *err, size_t errlen)
{
	if (!n) {
		if (err && errlen > 0)
			snprintf(err, errlen, "missing %s", what);
		return -EINVAL;
	}
	if (n->kind == CFG_SCALAR && n->value)
		return 0;
	cfg_error(n, err, errlen, "expected %s, not %s", what,
		  n->kind == CFG_OBJECT ? "an object" : n->kind == CFG_LIST ? "a list" : "nothing");
	return -EINVAL;
}

int cfg_string(const struct cfg_node *n, const char **ret, char *err, size_t errlen)
{
	int r = want_scalar(n, "a string", err, errlen);
	if (r < 0)
		return r;
	/* A C string cannot carry a \u0000; refusing it beats silently cutting the text. */
	if (memchr(n->value, '\0', n->value_len)) {
		cfg_error(n, err, errlen, "contains a NUL character");
		return -EINVAL;
	}
	*ret = n->value;
	return 0;
}

static bool value_is(const struct cfg_node *n, const char *word)
{
	size_t len = strlen(word);
	return n->value_len == len && strncasecmp(n->value, word, len) == 0;
}

int cfg_bool(const struct cfg_node *n, bool *ret, char *err, size_t errlen)
{
	static const char *const yes[] = { "yes", "true", "on", "1" };
	static const char *const no[] = { "no", "false", "off", "0" };
	char shown[80];
	int r = want_scalar(n, "yes or no", err, errlen);
	if (r < 0)
		return r;
	for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
		if (value_is(n, yes[i])) {
			*ret = true;
			return 0;
		}
		if (value_is(n, no[i])) {
			*ret = false;
			return 0;
		}
	}
	cfg_error(n, err, errlen, "expected yes/no, true/false, on/off or 1/0, got %s",
		  show(n, shown, sizeof(shown)));
	return -EINVAL;
}

static int lower(char c)
{
	return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

/*
 * Reads decimal digits from s[*i]; returns the count, sets *ret (saturating) and
 * *over when the value does not fit in a uint64_t.
 */
static size_t read_digits(const char *s, size_t len, size_t *i, uint64_t *ret, bool *over)
{
	size_t start = *i;
	uint64_t v = 0;
	while (*i < len && s[*i] >= '0' && s[*i] <= '9') {
		unsigned d = (unsigned)(s[*i] - '0');
		if (v > (UINT64_MAX - d) / 10)
			*over = true;
		else
			v = v * 10 + d;
		(*i)++;
	}
	*ret = v;
	return *i - start;
}

/*
 * Units (sluice.conf(5) UNITS): k, M, G are 10^3, 10^6, 10^9 and Ki, Mi, Gi (KiB, MiB,
 * GiB) 2^10, 2^20, 2^30.  A size (bytes) takes only the binary units: plain bytes, or
 * Ki/Mi/Gi/KiB/MiB/GiB.  k, M, G, kB, MB, GB in any case meant 2^10.. in a size before,
 * so they are refused as ambiguous there (naming both values), never read another way.
 * An integer (a count) takes k, M, G (either case) and Ki, Mi, Gi; its old kb, mb, gb
 * (2^10..) are refused the same way.
 */
struct unit {
	const char *name;
	uint64_t mult;
};

static const struct unit binary_units[] = {
	{ "Ki", 1ull << 10 }, { "Mi", 1ull << 20 }, { "Gi", 1ull << 30 },
	{ "KiB", 1ull << 10 }, { "MiB", 1ull << 20 }, { "GiB", 1ull << 30 },
};

/* The multiplier of the unit s[0..len) in table t, or 0. */
static uint64_t unit_find(const struct unit *t, size_t n, const char *s, size_t len)
{
	for (size_t i = 0; i < n; i++)
		if (strlen(t[i].name) == len && memcmp(t[i].name, s, len) == 0)
			return t[i].mult;
	return 0;
}

/* k, m, g (either case) followed by nothing or by b or B: the power of ten it names
 * (3, 6, 9), or 0. */
static int unit_letter_power(const char *s, size_t len)
{
	if (len < 1 || len > 2 || (len == 2 && lower(s[1]) != 'b'))
		return 0;
	int c = lower(s[0]);
	return c == 'k' ? 3 : c == 'm' ? 6 : c == 'g' ? 9 : 0;
}

/* Returns 0, -EINVAL (syntax), -EDOM (leading zero), -ERANGE or -EILSEQ (ambiguous). */
static int parse_int64(const char *s, size_t len, int64_t *ret)
{
	size_t i = 0, start;
	bool neg = false, over = false;
	uint64_t mag, mult = 1;

	if (i < len && (s[i] == '+' || s[i] == '-'))
		neg = s[i++] == '-';
	start = i;
	size_t digits = read_digits(s, len, &i, &mag, &over);
	if (digits == 0)
		return -EINVAL;
	if (len - i > 0) {
		int power = unit_letter_power(s + i, len - i);
		mult = unit_find(binary_units, ARRAY_SIZE(binary_units), s + i, len - i);
		if (power && len - i == 2)
			return -EILSEQ; /* "4kb": 4096 until the units were made one rule */
		if (power)
			mult = power == 3 ? 1000u : power == 6 ? 1000000u : 1000000000u;
		else if (!mult)
			return -EINVAL;
	}
	if (digits > 1 && s[start] == '0')
		return -EDOM;
	if (over || mag > UINT64_MAX / mult)
		return -ERANGE;
	mag *= mult;
	if (mag > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
		return -ERANGE;
	if (!neg)
		*ret = (int64_t)mag;
	else if (mag == (uint64_t)INT64_MAX + 1)
		*ret = INT64_MIN;
	else
		*ret = -(int64_t)mag;
	return 0;
}

static const struct {
	const char *name;
	int64_t ms;
} duration_units[] = {
	{ "w", 7 * 24 * 3600 * 1000LL },
	{ "d", 24 * 3600 * 1000LL },
	{ "h", 3600 * 1000LL },
	{ "m", 60 * 1000LL },
	{ "s", 1000LL },
	{ "ms", 1LL },
};

/* Returns 0, -EINVAL (syntax) or -ERANGE. */
static int parse_duration(const char *s, size_t len, int64_t *ret)
{
	int64_t total = 0;
	size_t i = 0, parts = 0, last = 0;
	bool over = false;

	if (len == 0)
		return -EINVAL;
	while (i < len) {
		uint64_t v;
		size_t u;
		if (read_digits(s, len, &i, &v, &over) == 0)
			return -EINVAL;
		if (i == len) {
			if (parts > 0)
				return -EINVAL; /* "1h30": a bare number only stands alone */
			u = 4;                  /* seconds */
		} else if (s[i] == 'm' && i + 1 < len && s[i + 1] == 's') {
			u = 5;
			i += 2;
		} else {
			for (u = 0; u < 5 && s[i] != duration_units[u].name[0]; u++)
				;
			if (u == 5)
				return -EINVAL;
			i++;
		}
		/* Largest unit first, each at most once: "30m1h" is a typo, not 90 minutes. */
		if (parts > 0 && u <= last)
			return -EINVAL;
		last = u;
		parts++;
		int64_t ms = duration_units[u].ms;
		if (over || v > (uint64_t)(INT64_MAX / ms)) {
			over = true;
			continue;
		}
		int64_t part = (int64_t)v * ms;
		if (total > INT64_MAX - part)
			over = true;
		else
			total += part;
	}
	if (over)
		return -ERANGE;
	*ret = total;
	return 0;
}

/* A bound of a duration key as sluice.conf writes it ("-5s" below zero). */
static const char *duration_shown(int64_t ms, char *buf, size_t size)
{
	if (ms >= 0)
		return fmt_duration(buf, size, (uint64_t)ms, DURATION_EXACT);
	buf[0] = '-';
	fmt_duration(buf + 1, size - 1, (uint64_t)0 - (uint64_t)ms, DURATION_EXACT);
	return buf;
}

/* Returns 0, -EINVAL (syntax), -ERANGE or -EILSEQ (k/M/G, kB/MB/GB: ambiguous). */
static int parse_size(const char *s, size_t len, uint64_t *ret)
{
	size_t i = 0;
	bool over = false;
	uint64_t v, mult = 1;

	if (read_digits(s, len, &i, &v, &over) == 0)
		return -EINVAL;
	if (i < len) {
		mult = unit_find(binary_units, ARRAY_SIZE(binary_units), s + i, len - i);
		if (!mult && lower(s[i]) == 'b' && len - i == 1)
			mult = 1; /* "512b" as before */
		if (!mult)
			return unit_letter_power(s + i, len - i) ? -EILSEQ : -EINVAL;
	}
	if (over || v > UINT64_MAX / mult)
		return -ERANGE;
	*ret = v * mult;
	return 0;
}

/*
 * The message for an ambiguous value (-EILSEQ): both readings with what they mean, e.g.
 * "\"10MB\" is ambiguous: write 10MiB (10485760 bytes) or 10000000" for a size,
 * "\"10kb\" is ambiguous: write 10Ki (10240) or 10k (10000)" for an integer.  A reading
 * outside [min, max] is not suggested; when neither fits, the range is given.
 */
static void ambiguous(const struct cfg_node *n, bool size, int64_t min, uint64_t max,
		      char *err, size_t errlen)
{
	const char *s = n->value;
	size_t len = n->value_len, i = 0;
	uint64_t v;
	bool over = false, neg = len && s[0] == '-';
	if (len && (s[0] == '+' || s[0] == '-'))
		i++;
	read_digits(s, len, &i, &v, &over);
	int power = unit_letter_power(s + i, len - i);
	static const char *const bin[] = { "Ki", "Mi", "Gi" }, *const dec[] = { "k", "M", "G" };
	unsigned u = (unsigned)power / 3 - 1;
	uint64_t b = 1ull << (10 * (u + 1)), d = power == 3 ? 1000 : power == 6 ? 1000000
									 : 1000000000;
	/* each reading's magnitude, and whether it is inside [min, max] */
	bool okb = !over && v <= UINT64_MAX / b, okd = !over && v <= UINT64_MAX / d;
	uint64_t vb = okb ? v * b : 0, vd = okd ? v * d : 0;
	uint64_t lo = neg ? (min < 0 ? (uint64_t)0 - (uint64_t)min : 0) : 0;
	if (neg) {
		okb = okb && min < 0 && vb <= lo;
		okd = okd && min < 0 && vd <= lo;
	} else {
		okb = okb && vb >= (uint64_t)(min > 0 ? min : 0) && vb <= max;
		okd = okd && vd >= (uint64_t)(min > 0 ? min : 0) && vd <= max;
	}
	char shown[80], sb[64] = "", sd[64] = "";
	cfg_show_text(s, len, shown, sizeof(shown));
	if (okb)
		snprintf(sb, sizeof(sb), "%.*s%s%s (%s%" PRIu64 "%s)", (int)i, s, bin[u],
			 size ? "B" : "", neg ? "-" : "", vb, size ? " bytes" : "");
	if (okd && size)
		snprintf(sd, sizeof(sd), "%" PRIu64, vd);
	else if (okd)
		snprintf(sd, sizeof(sd), "%.*s%s (%s%" PRIu64 ")", (int)i, s, dec[u],
			 neg ? "-" : "", vd);
	if (okb || okd)
		cfg_error(n, err, errlen, "%s is ambiguous: write %s%s%s", shown, sb,
			  okb && okd ? " or " : "", sd);
	else if (size)
		cfg_error(n, err, errlen, "%s is ambiguous, and out of range [%" PRId64 ", %"
			  PRIu64 "] bytes either way", shown, min, max);
	else
		cfg_error(n, err, errlen, "%s is ambiguous, and out of range [%" PRId64 ", %"
			  PRId64 "] either way", shown, min, (int64_t)max);
}

/* ---- the numeric converters: one pattern, three kinds ---- */

union num {
	int64_t i;
	uint64_t u;
};

struct num_kind {
	const char *what;   /* "expected WHAT, not a list" */
	bool is_unsigned;
	int (*parse)(const char *s, size_t len, union num *ret); /* 0, -EINVAL, -EDOM, -ERANGE */
	const char *(*fmt)(union num v, char *buf, size_t size); /* a bound, in a message */
	const char *unit;   /* after the range, e.g. " bytes" */
	const char *syntax; /* "expected ..., got " */
};

static int num_parse_int(const char *s, size_t len, union num *ret)
{
	return parse_int64(s, len, &ret->i);
}

static int num_parse_duration(const char *s, size_t len, union num *ret)
{
	return parse_duration(s, len, &ret->i);
}

static int num_parse_size(const char *s, size_t len, union num *ret)
{
	return parse_size(s, len, &ret->u);
}

static const char *num_fmt_int(union num v, char *buf, size_t size)
{
	snprintf(buf, size, "%" PRId64, v.i);
	return buf;
}

static const char *num_fmt_duration(union num v, char *buf, size_t size)
{
	return duration_shown(v.i, buf, size);
}

static const char *num_fmt_size(union num v, char *buf, size_t size)
{
	snprintf(buf, size, "%" PRIu64, v.u);
	return buf;
}

static const struct num_kind num_int = {
	"an integer", false, num_parse_int, num_fmt_int, "",
	"an integer (with an optional unit: k, M, G for 10^3, 10^6, 10^9; Ki, Mi, Gi for "
	"2^10, 2^20, 2^30)",
};
static const struct num_kind num_duration = {
	"a duration", false, num_parse_duration, num_fmt_duration, "",
	"a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m",
};
static const struct num_kind num_size = {
	"a size", true, num_parse_size, num_fmt_size, " bytes",
	"a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, GiB: 2^10, 2^20, 2^30 "
	"bytes)",
};

/* Converts n by kind k and checks it against [min, max]; the errors name n. */
static int num_convert(const struct cfg_node *n, const struct num_kind *k, union num min,
		       union num max, union num *ret, char *err, size_t errlen)
{
	char shown[80], lo[32], hi[32];
	union num v;
	int r = want_scalar(n, k->what, err, errlen);
	if (r < 0)
		return r;
	r = k->parse(n->value, n->value_len, &v);
	if (r == 0 && (k->is_unsigned ? v.u < min.u || v.u > max.u : v.i < min.i || v.i > max.i))
		r = -ERANGE;
	if (r == -EILSEQ && k->is_unsigned)
		ambiguous(n, true, min.u > INT64_MAX ? INT64_MAX : (int64_t)min.u, max.u, err,
			  errlen);
	else if (r == -EILSEQ)
		ambiguous(n, false, min.i, max.i < 0 ? 0 : (uint64_t)max.i, err, errlen);
	else if (r == -EDOM)
		cfg_error(n, err, errlen, "%s: leading zeros are not allowed (octal is not "
			  "supported)", show(n, shown, sizeof(shown)));
	else if (r == -ERANGE)
		cfg_error(n, err, errlen, "%s is out of range [%s, %s]%s",
			  show(n, shown, sizeof(shown)), k->fmt(min, lo, sizeof(lo)),
			  k->fmt(max, hi, sizeof(hi)), k->unit);
	else if (r < 0)
		cfg_error(n, err, errlen, "expected %s, got %s", k->syntax,
			  show(n, shown, sizeof(shown)));
	if (r < 0)
		return -EINVAL;
	*ret = v;
	return 0;
}

int cfg_int64(const struct cfg_node *n, int64_t min, int64_t max, int64_t *ret,
	      char *err, size_t errlen)
{
	union num v;
	int r = num_convert(n, &num_int, (union num){ .i = min }, (union num){ .i = max }, &v,
			    err, errlen);
	if (r == 0)
		*ret = v.i;
	return r;
}

int cfg_duration_ms(const struct cfg_node *n, int64_t min, int64_t max, int64_t *ret,
		    char *err, size_t errlen)
{
	union num v;
	int r = num_convert(n, &num_duration, (union num){ .i = min }, (union num){ .i = max },
			    &v, err, errlen);
	if (r == 0)
		*ret = v.i;
	return r;
}

int cfg_size(const struct cfg_node *n, uint64_t min, uint64_t max, uint64_t *ret,
	     char *err, size_t errlen)
{
	union num v;
	int r = num_convert(n, &num_size, (union num){ .u = min }, (union num){ .u = max }, &v,
			    err, errlen);
	if (r == 0)
		*ret = v.u;
	return r;
}
