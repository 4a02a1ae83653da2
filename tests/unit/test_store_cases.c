/*
 * test_store_cases -- tests/cases/store.cases against the memory store and slide.c.
 *
 * The table is shared with tests/func/test_redis_scripts.py, which runs the same cases
 * through the Redis scripts: what one store decides, to the nanosecond, the other must
 * too.  Its format is described at the top of the file.  Each case is one cmocka test on
 * a fresh memory store (no snapshot) and fresh sliding windows; a mismatch names the line
 * of the table.
 *
 * Beside the table, what a table cannot hold: random sends against the promise of
 * slide.h (never N + 1 sends within any window of length W, every wait exact to the
 * nanosecond), slide.c against a brute-force model of the same microsecond rule with a
 * clock that steps back and limits that change, and slide's own edges.
 *
 * The table's path comes from argv[1] (meson passes it) or $SLUICE_STORE_CASES.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "slide.h"
#include "store.h"

#define MAX_KEYS 16
#define MAX_ITEMS 8
#define MAX_SLIDES 8
#define MAX_NAME 32
#define MAX_TOKENS 32
#define SLIDE_CAP 1024           /* the largest N a case may use */
#define DEFAULT_EPOCH 1700000000000000000ull
#define NEVER UINT64_MAX

__extension__ typedef __int128 i128; /* GCC and clang */

static const char *cases_path;

/* ---- the table, parsed ----------------------------------------------------------------- */

struct tkey {
	char name[MAX_NAME];
	struct rate_limits limits;
	uint64_t block_ns;      /* block=DURATION: every item of the key carries it */
};

struct titem {
	unsigned key;
	uint64_t cost;
	unsigned flags;
	uint64_t value;         /* flag d: the value_hash */
	/* expected */
	bool ok, charged, known, blocked;
	uint64_t retry;
	uint64_t used[RATE_MAX_WINDOWS];
};

enum step_kind {
	STEP_DECIDE = 0,
	STEP_REFUND,
	STEP_SLIDE,
};

struct tstep {
	unsigned line;
	enum step_kind kind;
	uint64_t now;
	/* decide, refund */
	enum store_mode mode;
	size_t n;
	struct titem it[MAX_ITEMS];
	bool pass;
	/* slide */
	bool take;
	unsigned slide;
	uint64_t limit, window;
	bool ok;
	uint64_t wait, count;
};

struct tcase {
	char name[128];
	unsigned line;
	uint64_t epoch;
	struct tkey keys[MAX_KEYS];
	size_t nkeys;
	char slides[MAX_SLIDES][MAX_NAME];
	size_t nslides;
	struct tstep *steps;
	size_t nsteps, cap;
};

struct parser {
	const char *path;
	unsigned line;
	char err[256];
};

__attribute__((format(printf, 2, 3)))
static bool perr(struct parser *p, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p->err, sizeof(p->err), fmt, ap);
	va_end(ap);
	return false;
}

static bool parse_u64(const char *s, uint64_t *ret)
{
	if (*s < '0' || *s > '9')
		return false;
	uint64_t v = 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || __builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
			return false;
	}
	*ret = v;
	return true;
}

/* DURATION = TERM (('+' | '-') TERM)*, TERM = DIGITS[UNIT]; the result must be >= 0. */
static bool parse_duration(const char *s, uint64_t *ret)
{
	static const struct {
		const char *name;
		uint64_t ns;
	} units[] = {
		{ "ns", 1 }, { "us", 1000 }, { "ms", 1000000 }, { "s", 1000000000 },
		{ "m", 60000000000 }, { "h", 3600000000000 }, { "d", 86400000000000 },
	};
	i128 total = 0;
	int sign = 1;
	for (;;) {
		uint64_t v = 0;
		const char *start = s;
		while (*s >= '0' && *s <= '9') {
			if (__builtin_mul_overflow(v, 10, &v) ||
			    __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
				return false;
			s++;
		}
		if (s == start)
			return false;
		size_t ulen = 0;
		while (s[ulen] >= 'a' && s[ulen] <= 'z')
			ulen++;
		uint64_t mul = ulen ? 0 : 1;
		for (size_t u = 0; u < sizeof(units) / sizeof(units[0]) && ulen; u++)
			if (strlen(units[u].name) == ulen && memcmp(s, units[u].name, ulen) == 0)
				mul = units[u].ns;
		if (mul == 0)
			return false;
		s += ulen;
		total += sign * (i128)v * mul;
		if (total > (i128)UINT64_MAX || total < -(i128)UINT64_MAX)
			return false;
		if (*s == '\0')
			break;
		if (*s != '+' && *s != '-')
			return false;
		sign = *s == '+' ? 1 : -1;
		s++;
	}
	if (total < 0)
		return false;
	*ret = (uint64_t)total;
	return true;
}

static bool parse_time(struct parser *p, const struct tcase *c, const char *s, uint64_t *ret)
{
	uint64_t d;
	if (!parse_duration(s, &d) || __builtin_add_overflow(c->epoch, d, ret))
		return perr(p, "bad time \"%s\"", s);
	return true;
}

/* COUNT/PERIOD[:BURST] */
static bool parse_window(struct parser *p, const char *s, struct rate_window *ret)
{
	char buf[64];
	if ((size_t)snprintf(buf, sizeof(buf), "%s", s) >= sizeof(buf))
		return perr(p, "window too long");
	char *slash = strchr(buf, '/');
	if (!slash)
		return perr(p, "window \"%s\" has no '/'", s);
	*slash = '\0';
	char *colon = strchr(slash + 1, ':');
	if (colon)
		*colon = '\0';
	struct rate_window w;
	if (!parse_u64(buf, &w.count) || w.count == 0 || !parse_duration(slash + 1, &w.period_ns) ||
	    w.period_ns == 0)
		return perr(p, "bad window \"%s\"", s);
	w.burst = w.count;
	if (colon && (!parse_u64(colon + 1, &w.burst) || w.burst == 0))
		return perr(p, "bad burst in \"%s\"", s);
	*ret = w;
	return true;
}

static int find_key(const struct tcase *c, const char *name, size_t len)
{
	for (size_t i = 0; i < c->nkeys; i++)
		if (strlen(c->keys[i].name) == len && memcmp(c->keys[i].name, name, len) == 0)
			return (int)i;
	return -1;
}

/*
 * KEY:COST:FLAGS[:VALUE] (a decision's item), or KEY:COST[:FLAGS[:VALUE]] (a refund's).
 * FLAGS: - or letters b, c, d; d (distinct) requires VALUE, a decimal > 0, and VALUE
 * requires d.
 */
static bool parse_item(struct parser *p, const struct tcase *c, const char *s, bool want_flags,
		       struct titem *ret)
{
	char buf[96];
	if ((size_t)snprintf(buf, sizeof(buf), "%s", s) >= sizeof(buf))
		return perr(p, "item too long");
	char *part[4];
	int np = 0;
	part[np++] = buf;
	for (char *q = buf; *q && np < 4; q++)
		if (*q == ':') {
			*q = '\0';
			part[np++] = q + 1;
		}
	if (np < 2 || (want_flags && np < 3) || strchr(part[np - 1], ':'))
		return perr(p, "bad item \"%s\"", s);
	int k = find_key(c, part[0], strlen(part[0]));
	if (k < 0)
		return perr(p, "unknown key \"%s\"", part[0]);
	*ret = (struct titem){ .key = (unsigned)k };
	if (!parse_u64(part[1], &ret->cost))
		return perr(p, "bad cost in \"%s\"", s);
	if (np > 2 && strcmp(part[2], "-") != 0) {
		for (const char *f = part[2]; *f; f++) {
			if (*f == 'b')
				ret->flags |= STORE_BLOCKING;
			else if (*f == 'c')
				ret->flags |= STORE_COUNT_REJECTED;
			else if (*f == 'd')
				ret->flags |= STORE_DISTINCT;
			else
				return perr(p, "bad flags in \"%s\"", s);
		}
		if (!part[2][0])
			return perr(p, "empty flags in \"%s\"", s);
	}
	bool distinct = ret->flags & STORE_DISTINCT;
	if (distinct != (np == 4))
		return perr(p, "flag d and a VALUE go together in \"%s\"", s);
	if (distinct && (!parse_u64(part[3], &ret->value) || ret->value == 0))
		return perr(p, "bad value in \"%s\" (a decimal > 0)", s);
	return true;
}

/* KEY=OK,CHARGED,RETRY,USED[/USED...][,known][,blocked] for item it */
static bool parse_result(struct parser *p, const struct tcase *c, const char *s, struct titem *it)
{
	char buf[160];
	if ((size_t)snprintf(buf, sizeof(buf), "%s", s) >= sizeof(buf))
		return perr(p, "result too long");
	char *eq = strchr(buf, '=');
	if (!eq)
		return perr(p, "bad result \"%s\"", s);
	*eq = '\0';
	if (strcmp(buf, c->keys[it->key].name) != 0)
		return perr(p, "result \"%s\" is not for item %s", s, c->keys[it->key].name);
	char *field[6], *save = NULL, *f = strtok_r(eq + 1, ",", &save);
	int nf = 0;
	for (; f && nf < 6; f = strtok_r(NULL, ",", &save))
		field[nf++] = f;
	if (nf < 4 || f)
		return perr(p, "result \"%s\" needs 4 fields, then known, blocked", s);
	for (int i = 4; i < nf; i++) {
		if (strcmp(field[i], "known") == 0 && i == 4)
			it->known = true;
		else if (strcmp(field[i], "blocked") == 0 && !it->blocked)
			it->blocked = true;
		else
			return perr(p, "known then blocked after the 4 fields, not \"%s\"", field[i]);
	}
	if (it->known && !(it->flags & STORE_DISTINCT))
		return perr(p, "only a distinct item (flag d) can be known");
	if (it->blocked && !c->keys[it->key].block_ns)
		return perr(p, "only an item of a key with a block can be blocked");
	if (strcmp(field[0], "ok") != 0 && strcmp(field[0], "over") != 0)
		return perr(p, "ok or over, not \"%s\"", field[0]);
	it->ok = strcmp(field[0], "ok") == 0;
	if (strcmp(field[1], "charged") != 0 && strcmp(field[1], "-") != 0)
		return perr(p, "charged or -, not \"%s\"", field[1]);
	it->charged = strcmp(field[1], "charged") == 0;
	if (!parse_duration(field[2], &it->retry))
		return perr(p, "bad retry \"%s\"", field[2]);
	unsigned nw = c->keys[it->key].limits.n, j = 0;
	char *save2 = NULL;
	for (char *u = strtok_r(field[3], "/", &save2); u; u = strtok_r(NULL, "/", &save2)) {
		if (j == nw || !parse_u64(u, &it->used[j]))
			return perr(p, "bad used \"%s\" (key %s has %u windows)", field[3],
				    c->keys[it->key].name, nw);
		j++;
	}
	if (j != nw)
		return perr(p, "used needs %u values", nw);
	return true;
}

static struct tstep *add_step(struct tcase *c, unsigned line)
{
	if (c->nsteps == c->cap) {
		size_t ncap = c->cap ? 2 * c->cap : 16;
		struct tstep *ns = realloc(c->steps, ncap * sizeof(*ns));
		if (!ns)
			return NULL;
		c->steps = ns;
		c->cap = ncap;
	}
	struct tstep *st = &c->steps[c->nsteps++];
	memset(st, 0, sizeof(*st));
	st->line = line;
	return st;
}

static int arrow_at(char **tok, int n)
{
	for (int i = 0; i < n; i++)
		if (strcmp(tok[i], "=>") == 0)
			return i;
	return -1;
}

static bool parse_decide(struct parser *p, struct tcase *c, char **tok, int n)
{
	int arrow = arrow_at(tok, n);
	if (n < 4 || arrow < 4)
		return perr(p, "decide MODE TIME ITEM... => PASS RESULT...");
	struct tstep *st = add_step(c, p->line);
	if (!st)
		return perr(p, "out of memory");
	st->kind = STEP_DECIDE;
	if (strcmp(tok[1], "check") == 0)
		st->mode = STORE_CHECK;
	else if (strcmp(tok[1], "peek") == 0)
		st->mode = STORE_PEEK;
	else
		return perr(p, "mode check or peek, not \"%s\"", tok[1]);
	if (!parse_time(p, c, tok[2], &st->now))
		return false;
	st->n = (size_t)(arrow - 3);
	if (st->n > MAX_ITEMS)
		return perr(p, "at most %d items", MAX_ITEMS);
	for (size_t i = 0; i < st->n; i++)
		if (!parse_item(p, c, tok[3 + i], true, &st->it[i]))
			return false;
	if (n - arrow - 2 != (int)st->n)
		return perr(p, "one result per item after the pass");
	if (strcmp(tok[arrow + 1], "pass") != 0 && strcmp(tok[arrow + 1], "refuse") != 0)
		return perr(p, "pass or refuse, not \"%s\"", tok[arrow + 1]);
	st->pass = strcmp(tok[arrow + 1], "pass") == 0;
	for (size_t i = 0; i < st->n; i++)
		if (!parse_result(p, c, tok[(size_t)arrow + 2 + i], &st->it[i]))
			return false;
	return true;
}

static bool parse_refund(struct parser *p, struct tcase *c, char **tok, int n)
{
	if (n < 3 || n - 2 > MAX_ITEMS)
		return perr(p, "refund TIME ITEM... (1 to %d items)", MAX_ITEMS);
	struct tstep *st = add_step(c, p->line);
	if (!st)
		return perr(p, "out of memory");
	st->kind = STEP_REFUND;
	if (!parse_time(p, c, tok[1], &st->now))
		return false;
	st->n = (size_t)(n - 2);
	for (size_t i = 0; i < st->n; i++)
		if (!parse_item(p, c, tok[2 + i], false, &st->it[i]))
			return false;
	return true;
}

static bool parse_slide(struct parser *p, struct tcase *c, char **tok, int n)
{
	if (n != 10 || strcmp(tok[6], "=>") != 0)
		return perr(p, "slide MODE TIME NAME N W => OK WAIT COUNT");
	struct tstep *st = add_step(c, p->line);
	if (!st)
		return perr(p, "out of memory");
	st->kind = STEP_SLIDE;
	if (strcmp(tok[1], "take") != 0 && strcmp(tok[1], "peek") != 0)
		return perr(p, "mode take or peek, not \"%s\"", tok[1]);
	st->take = strcmp(tok[1], "take") == 0;
	if (!parse_time(p, c, tok[2], &st->now))
		return false;
	size_t i = 0;
	while (i < c->nslides && strcmp(c->slides[i], tok[3]) != 0)
		i++;
	if (i == c->nslides) {
		if (i == MAX_SLIDES || strlen(tok[3]) >= MAX_NAME)
			return perr(p, "too many sliding windows, or a long name");
		snprintf(c->slides[c->nslides++], MAX_NAME, "%s", tok[3]);
	}
	st->slide = (unsigned)i;
	if (!parse_u64(tok[4], &st->limit) || st->limit > SLIDE_CAP)
		return perr(p, "bad N \"%s\" (at most %d)", tok[4], SLIDE_CAP);
	if (!parse_duration(tok[5], &st->window))
		return perr(p, "bad W \"%s\"", tok[5]);
	if (strcmp(tok[7], "ok") != 0 && strcmp(tok[7], "no") != 0)
		return perr(p, "ok or no, not \"%s\"", tok[7]);
	st->ok = strcmp(tok[7], "ok") == 0;
	if (strcmp(tok[8], "never") == 0)
		st->wait = NEVER;
	else if (!parse_duration(tok[8], &st->wait))
		return perr(p, "bad wait \"%s\"", tok[8]);
	if (!parse_u64(tok[9], &st->count))
		return perr(p, "bad count \"%s\"", tok[9]);
	return true;
}

/* Split a line into blank-separated tokens, dropping a comment. */
static int tokenize(char *line, char **tok)
{
	int n = 0;
	char *s = line;
	for (;;) {
		while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
			s++;
		if (*s == '\0' || *s == '#')
			return n;
		if (n == MAX_TOKENS)
			return -1;
		tok[n++] = s;
		while (*s && *s != ' ' && *s != '\t' && *s != '\r' && *s != '\n')
			s++;
		if (*s)
			*s++ = '\0';
	}
}

static struct tcase *cases;
static size_t ncases;

static bool parse_line(struct parser *p, char *line)
{
	char *tok[MAX_TOKENS];
	int n = tokenize(line, tok);
	if (n < 0)
		return perr(p, "too many tokens");
	if (n == 0)
		return true;
	if (strcmp(tok[0], "case") == 0) {
		if (n < 2)
			return perr(p, "case needs a name");
		struct tcase *nc = realloc(cases, (ncases + 1) * sizeof(*nc));
		if (!nc)
			return perr(p, "out of memory");
		cases = nc;
		struct tcase *c = &cases[ncases++];
		memset(c, 0, sizeof(*c));
		c->line = p->line;
		c->epoch = DEFAULT_EPOCH;
		for (int i = 1; i < n; i++) {
			size_t len = strlen(c->name);
			snprintf(c->name + len, sizeof(c->name) - len, "%s%s", i > 1 ? " " : "", tok[i]);
		}
		for (size_t i = 0; i + 1 < ncases; i++)
			if (strcmp(cases[i].name, c->name) == 0)
				return perr(p, "case \"%s\" again (line %u)", c->name, cases[i].line);
		return true;
	}
	if (ncases == 0)
		return perr(p, "\"%s\" before the first case", tok[0]);
	struct tcase *c = &cases[ncases - 1];
	if (strcmp(tok[0], "epoch") == 0) {
		if (n != 2 || !parse_u64(tok[1], &c->epoch) || c->nsteps)
			return perr(p, "epoch NS, before the first step");
		return true;
	}
	if (strcmp(tok[0], "key") == 0) {
		uint64_t block_ns = 0;
		if (n > 3 && strncmp(tok[n - 1], "block=", 6) == 0) {
			if (!parse_duration(tok[n - 1] + 6, &block_ns) || block_ns == 0)
				return perr(p, "bad block \"%s\"", tok[n - 1]);
			n--;
		}
		if (n < 3 || n - 2 > RATE_MAX_WINDOWS)
			return perr(p, "key NAME WINDOW... [block=DURATION] (1 to %d windows)",
				    RATE_MAX_WINDOWS);
		if (c->nkeys == MAX_KEYS || strlen(tok[1]) >= MAX_NAME ||
		    find_key(c, tok[1], strlen(tok[1])) >= 0)
			return perr(p, "key \"%s\": again, too long, or too many keys", tok[1]);
		struct tkey *k = &c->keys[c->nkeys];
		memset(k, 0, sizeof(*k));
		snprintf(k->name, sizeof(k->name), "%s", tok[1]);
		k->block_ns = block_ns;
		for (int i = 2; i < n; i++)
			if (!parse_window(p, tok[i], &k->limits.w[k->limits.n++]))
				return false;
		c->nkeys++;
		return true;
	}
	if (strcmp(tok[0], "decide") == 0)
		return parse_decide(p, c, tok, n);
	if (strcmp(tok[0], "refund") == 0)
		return parse_refund(p, c, tok, n);
	if (strcmp(tok[0], "slide") == 0)
		return parse_slide(p, c, tok, n);
	return perr(p, "unknown directive \"%s\"", tok[0]);
}

static int load_cases(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return -1;
	}
	struct parser p = { .path = path };
	char line[1024];
	int rc = 0;
	while (fgets(line, sizeof(line), f)) {
		p.line++;
		if (!strchr(line, '\n') && !feof(f)) {
			fprintf(stderr, "%s:%u: line too long\n", path, p.line);
			rc = -1;
			break;
		}
		if (!parse_line(&p, line)) {
			fprintf(stderr, "%s:%u: %s\n", path, p.line, p.err);
			rc = -1;
			break;
		}
	}
	fclose(f);
	if (rc == 0 && ncases == 0) {
		fprintf(stderr, "%s: no case\n", path);
		rc = -1;
	}
	return rc;
}

/* ---- running a case ------------------------------------------------------------------------ */

static struct store_item to_item(struct store *s, const struct tcase *c, const struct titem *t)
{
	const struct tkey *k = &c->keys[t->key];
	return (struct store_item){
		.key_hash = store_key_hash(s, str_cstr("case"), str_cstr(k->name)),
		.rule = str_cstr("case"),
		.key = str_cstr(k->name),
		.limits = &k->limits,
		.cost = t->cost,
		.flags = t->flags,
		.block_ns = k->block_ns, /* peek too: it reads a running block, starts none */
		.value_hash = t->value,
	};
}

static void used_text(char *buf, size_t len, const uint64_t *used, unsigned n)
{
	size_t at = 0;
	buf[0] = '\0';
	for (unsigned j = 0; j < n && at < len; j++) {
		int w = snprintf(buf + at, len - at, "%s%" PRIu64, j ? "/" : "", used[j]);
		if (w < 0)
			break;
		at += (size_t)w;
	}
}

static void run_decide(struct store *s, const struct tcase *c, const struct tstep *st)
{
	struct store_item items[MAX_ITEMS];
	for (size_t i = 0; i < st->n; i++)
		items[i] = to_item(s, c, &st->it[i]);
	int rc = store_decide(s, items, st->n, st->mode, st->now);
	if (rc != (int)st->pass)
		fail_msg("%s:%u: decide returned %d, expected %s", cases_path, st->line, rc,
			 st->pass ? "pass (1)" : "refuse (0)");
	for (size_t i = 0; i < st->n; i++) {
		const struct titem *want = &st->it[i];
		const struct store_item *got = &items[i];
		unsigned nw = c->keys[want->key].limits.n;
		if (got->ok == want->ok && got->charged == want->charged &&
		    got->known == want->known && got->blocked == want->blocked &&
		    got->retry_ns == want->retry &&
		    memcmp(got->used, want->used, nw * sizeof(got->used[0])) == 0)
			continue;
		char gu[128], wu[128];
		used_text(gu, sizeof(gu), got->used, nw);
		used_text(wu, sizeof(wu), want->used, nw);
		fail_msg("%s:%u: item %zu (%s): got %s,%s,%" PRIu64 ",%s%s%s expected %s,%s,%" PRIu64
			 ",%s%s%s",
			 cases_path, st->line, i, c->keys[want->key].name, got->ok ? "ok" : "over",
			 got->charged ? "charged" : "-", got->retry_ns, gu, got->known ? ",known" : "",
			 got->blocked ? ",blocked" : "", want->ok ? "ok" : "over",
			 want->charged ? "charged" : "-", want->retry, wu, want->known ? ",known" : "",
			 want->blocked ? ",blocked" : "");
	}
}

static void run_refund(struct store *s, const struct tcase *c, const struct tstep *st)
{
	struct store_item items[MAX_ITEMS];
	for (size_t i = 0; i < st->n; i++) {
		items[i] = to_item(s, c, &st->it[i]);
		items[i].ok = true;
		items[i].charged = true;
	}
	store_refund(s, items, st->n, st->now);
}

static void run_slide(struct slide *sl, const struct tstep *st)
{
	uint64_t wait = 12345;
	bool ok = st->take ? slide_take(sl, st->limit, st->window, st->now, &wait) :
			     slide_peek(sl, st->limit, st->window, st->now, &wait);
	uint64_t count = slide_count(sl, st->window, st->now);
	if (ok != st->ok || wait != st->wait || count != st->count)
		fail_msg("%s:%u: got %s %" PRIu64 " %" PRIu64 ", expected %s %" PRIu64 " %" PRIu64,
			 cases_path, st->line, ok ? "ok" : "no", wait, count, st->ok ? "ok" : "no",
			 st->wait, st->count);
}

static void test_case(void **state)
{
	const struct tcase *c = *state;
	struct store_memory_conf conf = { .snapshot = NULL };
	char warn[256];
	struct store *s = store_memory_new(&conf, c->epoch, warn, sizeof(warn));
	assert_non_null(s);
	assert_string_equal(warn, "");
	struct slide sl[MAX_SLIDES];
	for (size_t i = 0; i < c->nslides; i++)
		assert_int_equal(slide_init(&sl[i], SLIDE_CAP), 0);
	for (size_t i = 0; i < c->nsteps; i++) {
		const struct tstep *st = &c->steps[i];
		switch (st->kind) {
		case STEP_DECIDE:
			run_decide(s, c, st);
			break;
		case STEP_REFUND:
			run_refund(s, c, st);
			break;
		case STEP_SLIDE:
			run_slide(&sl[st->slide], st);
			break;
		}
	}
	for (size_t i = 0; i < c->nslides; i++)
		slide_done(&sl[i]);
	store_free(s);
}

/* ---- the sliding window beyond the table ------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/*
 * Random sends, the clock only going forward: no N + 1 admitted sends within any
 * half-open window [t, t + W), and every refusal's wait exact (one ns earlier it is still
 * refused, at the wait it is admitted).  W is often off the microsecond and sends often
 * come at once, so the rounding is exercised.
 */
static void test_slide_bound_random(void **state)
{
	(void)state;
	enum { EVENTS = 4000 };
	static uint64_t admitted[EVENTS];
	for (int round = 0; round < 40; round++) {
		uint64_t n = 1 + rnd_below(8);
		uint64_t w = rnd_below(3) ? 1 + rnd_below(5000000) : 1000 * (1 + rnd_below(5000));
		uint64_t now = DEFAULT_EPOCH + rnd_below(1000000);
		size_t na = 0, refused = 0;
		struct slide sl;
		assert_int_equal(slide_init(&sl, 8), 0);
		for (int e = 0; e < EVENTS; e++) {
			uint64_t r = rnd_below(100);
			now += r < 30 ? 0 : r < 60 ? rnd_below(2000) : rnd_below(w / n + 2);
			uint64_t wait;
			if (slide_take(&sl, n, w, now, &wait)) {
				assert_true(wait == 0);
				admitted[na++] = now;
				continue;
			}
			refused++;
			assert_true(wait > 0 && wait != NEVER);
			assert_false(slide_peek(&sl, n, w, now + wait - 1, NULL));
			assert_true(slide_peek(&sl, n, w, now + wait, NULL));
		}
		if (refused == 0 || na < n)
			fail_msg("round %d: %zu admitted, %zu refused", round, na, refused);
		/* sorted, since time went forward: a sweep finds the densest windows */
		for (size_t i = 0, j = 0; i < na; i++) {
			while (j < na && admitted[j] < admitted[i] + w)
				j++;
			if (j - i > n)
				fail_msg("round %d: %zu sends in [%" PRIu64 ", +%" PRIu64 "), N = %" PRIu64,
					 round, j - i, admitted[i], w, n);
		}
		slide_done(&sl);
	}
}

/* The microsecond rule of slide.h, by brute force over every send remembered. */
struct model {
	uint64_t at[SLIDE_CAP];
	size_t n;
};

static bool model_decide(struct model *m, bool take, uint64_t n, uint64_t window, uint64_t now,
			 uint64_t *ret_wait, uint64_t *ret_count)
{
	uint64_t w = (window + 999) / 1000, fl = now / 1000;
	uint64_t live[SLIDE_CAP];
	size_t count = 0, kept = 0;
	for (size_t i = 0; i < m->n; i++) {
		if (m->at[i] + w > fl)
			live[count++] = m->at[i];
		if (take && m->at[i] + w > fl)
			m->at[kept++] = m->at[i];
	}
	if (take)
		m->n = kept;
	if (count < n) {
		if (take)
			m->at[m->n++] = (now + 999) / 1000;
		*ret_wait = 0;
		*ret_count = count + take;
		return true;
	}
	*ret_count = count;
	if (n == 0) {
		*ret_wait = NEVER;
		return false;
	}
	/* the (count - n)-th smallest */
	for (size_t i = 0; i < count; i++)
		for (size_t j = i + 1; j < count; j++)
			if (live[j] < live[i]) {
				uint64_t t = live[i];
				live[i] = live[j];
				live[j] = t;
			}
	*ret_wait = (live[count - n] + w - fl) * 1000 - now % 1000;
	return false;
}

/* slide.c against the model: the clock steps back now and then, N and W change. */
static void test_slide_model(void **state)
{
	(void)state;
	enum { CAP = 16 };
	static struct model m;
	for (int round = 0; round < 30; round++) {
		struct slide sl;
		assert_int_equal(slide_init(&sl, CAP), 0);
		m.n = 0;
		uint64_t now = DEFAULT_EPOCH + rnd_below(1000000000);
		uint64_t w = 1 + rnd_below(100000000), n = 1 + rnd_below(CAP);
		for (int e = 0; e < 3000; e++) {
			uint64_t r = rnd_below(1000);
			if (r < 20)
				now -= rnd_below(w);                /* the clock steps back */
			else if (r < 30)
				n = rnd_below(CAP + 1);             /* the limit changes */
			else if (r < 35)
				w = 1 + rnd_below(100000000);
			else
				now += rnd_below(w / (n + 1) + 1500);
			bool take = rnd_below(4) != 0;
			uint64_t gw = 0, mw, mc;
			bool got = take ? slide_take(&sl, n, w, now, &gw) : slide_peek(&sl, n, w, now, &gw);
			uint64_t gc = slide_count(&sl, w, now);
			bool want = model_decide(&m, take, n, w, now, &mw, &mc);
			if (got != want || gw != mw || gc != mc)
				fail_msg("round %d event %d (%s n %" PRIu64 " w %" PRIu64 "): got %d %" PRIu64
					 " %" PRIu64 ", model %d %" PRIu64 " %" PRIu64, round, e,
					 take ? "take" : "peek", n, w, got, gw, gc, want, mw, mc);
		}
		slide_done(&sl);
	}
}

static void test_slide_edges(void **state)
{
	(void)state;
	struct slide sl = { 0 };
	slide_done(&sl); /* a zeroed slide may be freed */
	assert_int_equal(slide_init(&sl, 0), -EINVAL);
	assert_int_equal(slide_init(&sl, 2), 0);
	uint64_t now = DEFAULT_EPOCH, wait = 1;
	/* XXX of slide.h: a limit above the ring's capacity is enforced as the capacity */
	assert_true(slide_take(&sl, 5, 60000000000, now, &wait));
	assert_true(wait == 0);
	assert_true(slide_take(&sl, 5, 60000000000, now, NULL));
	assert_false(slide_take(&sl, 5, 60000000000, now, &wait));
	assert_true(wait == 60000000000);
	/* clear forgets, and the ring is reused */
	slide_reset(&sl);
	assert_true(slide_count(&sl, 60000000000, now) == 0);
	assert_true(slide_take(&sl, 1, 60000000000, now, NULL));
	assert_false(slide_peek(&sl, 1, 60000000000, now, &wait));
	assert_true(wait == 60000000000);
	/* a window of 0: a send never counts, even at the same ns */
	assert_true(slide_take(&sl, 1, 0, now, NULL));
	assert_true(slide_take(&sl, 1, 0, now, NULL));
	/* the ring wraps many times: 2 per 2 us, a send every us */
	slide_reset(&sl);
	assert_true(slide_take(&sl, 2, 2000, now, NULL));
	for (uint64_t i = 1; i < 100; i++) {
		assert_true(slide_take(&sl, 2, 2000, now + i * 1000, &wait));
		assert_false(slide_take(&sl, 2, 2000, now + i * 1000, &wait));
		assert_true(wait == 1000);
		assert_true(slide_count(&sl, 2000, now + i * 1000) == 2);
	}
	slide_done(&sl);
	slide_done(&sl);
}

int main(int argc, char **argv)
{
	cases_path = argc > 1 ? argv[1] : getenv("SLUICE_STORE_CASES");
	if (!cases_path) {
		fprintf(stderr, "usage: %s tests/cases/store.cases (or set SLUICE_STORE_CASES)\n",
			argv[0]);
		return 2;
	}
	if (load_cases(cases_path) < 0)
		return 1;
	size_t ntests = ncases + 3;
	struct CMUnitTest *tests = calloc(ntests, sizeof(*tests));
	if (!tests)
		return 1;
	for (size_t i = 0; i < ncases; i++)
		tests[i] = (struct CMUnitTest){ .name = cases[i].name, .test_func = test_case,
						.initial_state = &cases[i] };
	tests[ncases] = (struct CMUnitTest)cmocka_unit_test(test_slide_bound_random);
	tests[ncases + 1] = (struct CMUnitTest)cmocka_unit_test(test_slide_model);
	tests[ncases + 2] = (struct CMUnitTest)cmocka_unit_test(test_slide_edges);
	int rc = _cmocka_run_group_tests("store_cases", tests, ntests, NULL, NULL);
	for (size_t i = 0; i < ncases; i++)
		free(cases[i].steps);
	free(cases);
	free(tests);
	return rc;
}
