/*
 * rate -- rate windows and per-key override files (see rate.h).
 *
 * Window grammar (no blanks inside; the overrides parser trims around each window):
 *
 *   window = count '/' period [ ':' count ]
 *   count  = DIGITS [ 'k' | 'M' | 'G' ]                   1 .. 10^15 after scaling
 *   period = [ DIGITS ] ( 's' | 'm' | 'h' | 'd' | 'w' )   1 s .. 366 d; "m" = "1m"
 *
 * Overrides file grammar (lines end with LF; a CR before it is a blank):
 *
 *   line    = blanks [ key blanks windows blanks ] [ comment ]
 *   key     = one or more bytes other than blanks, not starting with '#'
 *   windows = "0" | window { blanks ',' blanks window }     "0" alone: unlimited
 *   comment = '#' ...                                      after the key, '#' always
 *                                                          starts a comment
 *
 * Every error names the file and the 1-based line.  The first error in file order is the
 * one reported.
 *
 * Data layout, for a million keys loaded in well under a second with little memory:
 *   - keys (after normalization) are packed into one byte arena; an entry is 24 bytes
 *     (hash, key offset and length, line, index of its limits);
 *   - identical limits are stored once (most files use a handful of distinct limits), so
 *     rate_overrides_find() returns a pointer into a small array;
 *   - an open-addressing table with linear probing maps a key's XXH3 hash to its entry;
 *     a slot holds 32 bits of the hash (tag) and the entry index, 8 bytes, so a probe
 *     rarely leaves the slot array.  The load factor stays <= 1/2.
 *   - the table is built in one go after the lines are read, sized once, its slots
 *     prefetched a few entries ahead: with a million keys it is far larger than the
 *     caches, and inserting line by line would wait on one cache miss per line.
 *
 * Limits: the text is <= RATE_MAX_OVERRIDES_FILE bytes, so there are at most that many
 * lines, entries and distinct limits; keys are <= RATE_MAX_OVERRIDE_KEY bytes before and
 * after normalization; indexes are 32-bit and checked.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "rate.h"
#include "util.h"

#define RATE_MAX_COUNT 1000000000000000ull /* 10^15 */
#define RATE_MAX_PERIOD_S (366ull * 86400)
#define NS_PER_S 1000000000ull
#define SHOW_MAX 64 /* bytes of user text quoted in a message */

/* ---- messages -------------------------------------------------------------------- */

/* A bounded writer that never overruns and always NUL-terminates (when size > 0). */
struct msg {
	char *buf;
	size_t size;
	size_t pos;
};

static void msg_init(struct msg *m, char *buf, size_t size)
{
	*m = (struct msg){ buf, size, 0 };
	if (buf && size > 0)
		buf[0] = '\0';
}

static void msg_putc(struct msg *m, char c)
{
	if (m->buf && m->pos + 1 < m->size) {
		m->buf[m->pos++] = c;
		m->buf[m->pos] = '\0';
	}
}

static void msg_vprintf(struct msg *m, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));

static void msg_vprintf(struct msg *m, const char *fmt, va_list ap)
{
	if (!m->buf || m->pos + 1 >= m->size)
		return;
	int w = vsnprintf(m->buf + m->pos, m->size - m->pos, fmt, ap);
	if (w < 0)
		return;
	m->pos += (size_t)w;
	if (m->pos >= m->size)
		m->pos = m->size - 1; /* truncated */
}

static void msg_printf(struct msg *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void msg_printf(struct msg *m, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	msg_vprintf(m, fmt, ap);
	va_end(ap);
}

/* Writes 's' quoted, with control bytes escaped and cut after SHOW_MAX bytes. */
static void msg_show(struct msg *m, struct str s)
{
	bool cut = s.len > SHOW_MAX;
	size_t n = cut ? SHOW_MAX : s.len;

	msg_putc(m, '\'');
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		if (c == '\\') {
			msg_putc(m, '\\');
			msg_putc(m, '\\');
		} else if (c < 0x20 || c == 0x7f) {
			msg_printf(m, "\\x%02x", c);
		} else {
			msg_putc(m, (char)c);
		}
	}
	msg_putc(m, '\'');
	if (cut)
		msg_printf(m, "...");
}

/* Bytes a shown text can take: each byte escaped as \xNN, quotes, "..." and a NUL. */
#define SHOW_SIZE (SHOW_MAX * 4 + 6)

/* msg_show() into buf (SHOW_SIZE bytes), for a message argument; returns buf. */
static const char *show(struct str s, char *buf, size_t size)
{
	struct msg m;
	msg_init(&m, buf, size);
	msg_show(&m, s);
	return buf;
}

/* ---- windows --------------------------------------------------------------------- */

/*
 * Reads DIGITS [k|M|G] filling all of s.  0 and *ret_value (possibly 0), -EINVAL (syntax)
 * or -ERANGE (past 10^15 before or after scaling).
 */
static int parse_count(struct str s, uint64_t *ret_value)
{
	size_t i = 0;
	uint64_t v = 0, mult = 1;

	while (i < s.len && s.ptr[i] >= '0' && s.ptr[i] <= '9') {
		if (v <= RATE_MAX_COUNT) /* stays far from overflow: 10^16 + 9 */
			v = v * 10 + (uint64_t)(s.ptr[i] - '0');
		i++;
	}
	if (i == 0)
		return -EINVAL;
	if (i < s.len) {
		switch (s.ptr[i]) {
		case 'k':
			mult = 1000u;
			break;
		case 'M':
			mult = 1000000u;
			break;
		case 'G':
			mult = 1000000000u;
			break;
		default:
			return -EINVAL;
		}
		if (++i != s.len)
			return -EINVAL;
	}
	if (v > RATE_MAX_COUNT / mult)
		return -ERANGE;
	*ret_value = v * mult;
	return 0;
}

/* Reads [DIGITS] UNIT filling all of s into seconds: 0, -EINVAL or -ERANGE. */
static int parse_period(struct str s, uint64_t *ret_s)
{
	size_t i = 0;
	uint64_t n = 0, unit;

	while (i < s.len && s.ptr[i] >= '0' && s.ptr[i] <= '9') {
		if (n <= RATE_MAX_PERIOD_S)
			n = n * 10 + (uint64_t)(s.ptr[i] - '0');
		i++;
	}
	if (i == 0)
		n = 1;
	if (i + 1 != s.len)
		return -EINVAL;
	switch (s.ptr[i]) {
	case 's':
		unit = 1;
		break;
	case 'm':
		unit = 60;
		break;
	case 'h':
		unit = 3600;
		break;
	case 'd':
		unit = 86400;
		break;
	case 'w':
		unit = 7 * 86400;
		break;
	default:
		return -EINVAL;
	}
	if (n == 0 || n > RATE_MAX_PERIOD_S / unit)
		return -ERANGE;
	*ret_s = n * unit;
	return 0;
}

static int window_error(char *err, size_t errlen, struct str text, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int window_error(char *err, size_t errlen, struct str text, const char *fmt, ...)
{
	struct msg m;
	va_list ap;

	msg_init(&m, err, errlen);
	msg_printf(&m, "bad rate window ");
	msg_show(&m, text);
	msg_printf(&m, ": ");
	va_start(ap, fmt);
	msg_vprintf(&m, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

int rate_window_parse(struct str text, struct rate_window *ret, char *err, size_t errlen)
{
	struct msg m;
	uint64_t count = 0, period_s = 0, burst = 0;
	int r;

	if (!text.ptr || text.len == 0) {
		msg_init(&m, err, errlen);
		msg_printf(&m, "empty rate window");
		return -EINVAL;
	}
	const char *slash = memchr(text.ptr, '/', text.len);
	if (!slash)
		return window_error(err, errlen, text, "expected COUNT/PERIOD[:BURST] such as "
				    "10/1m, 2k/h or 5/30s:10");
	struct str cs = str_make(text.ptr, (size_t)(slash - text.ptr));
	struct str ps = str_make(slash + 1, text.len - cs.len - 1);
	struct str bs = STR_NULL;
	const char *colon = memchr(ps.ptr, ':', ps.len);
	if (colon) {
		bs = str_make(colon + 1, ps.len - (size_t)(colon - ps.ptr) - 1);
		ps.len = (size_t)(colon - ps.ptr);
	}

	r = parse_count(cs, &count);
	if (r == -EINVAL)
		return window_error(err, errlen, text, "the count must be a number with an "
				    "optional k, M or G");
	if (r < 0 || count == 0)
		return window_error(err, errlen, text, "the count must be in [1, 10^15]");
	r = parse_period(ps, &period_s);
	if (r == -EINVAL)
		return window_error(err, errlen, text, "the period must be [N]s, m, h, d or w");
	if (r < 0)
		return window_error(err, errlen, text, "the period must be in [1s, 366d]");
	if (colon) {
		r = parse_count(bs, &burst);
		if (r == -EINVAL)
			return window_error(err, errlen, text, "the burst must be a number with an "
					    "optional k, M or G");
		if (r < 0 || burst == 0)
			return window_error(err, errlen, text, "the burst must be in [1, 10^15]");
	} else {
		burst = count;
	}
	*ret = (struct rate_window){ .count = count, .period_ns = period_s * NS_PER_S,
				     .burst = burst };
	return 0;
}

/* 64 bytes always suffice: three 20-digit numbers and four more characters. */
const char *rate_window_format(const struct rate_window *w, char *buf, size_t len)
{
	static const struct {
		uint64_t s;
		char c;
	} units[] = { { 7 * 86400, 'w' }, { 86400, 'd' }, { 3600, 'h' }, { 60, 'm' }, { 1, 's' } };
	struct msg m;

	msg_init(&m, buf, len);
	msg_printf(&m, "%" PRIu64 "/", w->count);
	if (w->period_ns % NS_PER_S != 0 || w->period_ns == 0) {
		/* XXX not a window rate_window_parse() could return; shown, not parseable */
		msg_printf(&m, "%" PRIu64 "ns", w->period_ns);
	} else {
		uint64_t s = w->period_ns / NS_PER_S;
		for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
			if (s % units[i].s == 0) {
				msg_printf(&m, "%" PRIu64 "%c", s / units[i].s, units[i].c);
				break;
			}
		}
	}
	if (w->burst != w->count)
		msg_printf(&m, ":%" PRIu64, w->burst);
	return buf;
}

/* ---- overrides: storage ---------------------------------------------------------- */

struct entry {
	uint64_t hash;
	uint32_t key_off;
	uint32_t key_len;
	uint32_t line;
	uint32_t limits; /* index into o->limits */
};

struct slot {
	uint32_t tag; /* hash >> 32 (the slot number comes from the low bits) */
	uint32_t ref; /* index + 1; 0 = empty */
};

/* An open-addressing index (linear probing) over an array owned by the caller. */
struct table {
	struct slot *slots;
	size_t mask; /* capacity - 1; capacity is a power of two */
	size_t used;
};

struct rate_overrides {
	struct entry *entries;
	size_t n_entries, cap_entries;
	char *keys;
	size_t keys_len, keys_cap;
	struct rate_limits *limits;
	size_t n_limits, cap_limits;
	struct table by_key;    /* built once every line is read */
	struct table by_limits; /* only while loading */
};

/* Entries read ahead when the key table is built: their slots are fetched from memory
 * while earlier entries are inserted, instead of one cache miss after another. */
#define PREFETCH_AHEAD 16

static void table_free(struct table *t)
{
	free(t->slots);
	*t = (struct table){ 0 };
}

/*
 * Makes room in p (n elements of size bytes used, *cap allocated) for one more.  Returns
 * the array, moved or not, or NULL (p is still valid and *cap unchanged).
 */
static void *grow(void *p, size_t *cap, size_t n, size_t size)
{
	if (n < *cap)
		return p;
	size_t ncap = *cap ? *cap * 2 : 256;
	if (ncap > SIZE_MAX / size)
		return NULL;
	void *q = realloc(p, ncap * size);
	if (q)
		*cap = ncap;
	return q;
}

static uint64_t hash_key(struct str key)
{
	return XXH3_64bits(key.len ? key.ptr : "", key.len);
}

/* Hashes the fields, not the struct: its padding after n is not ours to read. */
static uint64_t hash_limits(const struct rate_limits *l)
{
	return XXH3_64bits_withSeed(l->w, l->n * sizeof(l->w[0]), l->n);
}

static bool limits_eq(const struct rate_limits *a, const struct rate_limits *b)
{
	return a->n == b->n && memcmp(a->w, b->w, a->n * sizeof(a->w[0])) == 0;
}

/* The index of limits equal to *l, adding a copy if there is none yet. */
static int intern_limits(struct rate_overrides *o, const struct rate_limits *l,
			 uint32_t *ret_index)
{
	struct table *t = &o->by_limits;
	uint64_t h = hash_limits(l);
	uint32_t tag = (uint32_t)(h >> 32);
	size_t i;

	/* consecutive lines usually share their limits */
	if (o->n_limits > 0 && limits_eq(&o->limits[o->n_limits - 1], l)) {
		*ret_index = (uint32_t)o->n_limits - 1;
		return 0;
	}
	if (t->slots) {
		for (i = (size_t)h & t->mask; t->slots[i].ref != 0; i = (i + 1) & t->mask) {
			const struct slot *s = &t->slots[i];
			if (s->tag == tag && limits_eq(&o->limits[s->ref - 1], l)) {
				*ret_index = s->ref - 1;
				return 0;
			}
		}
	}
	if (o->n_limits >= UINT32_MAX - 1)
		return -ENOMEM;
	struct rate_limits *a = grow(o->limits, &o->cap_limits, o->n_limits, sizeof(*a));
	if (!a)
		return -ENOMEM;
	o->limits = a;
	/* keep the load <= 1/2: double the table (rehashing from the array) when needed */
	size_t cap = t->slots ? t->mask + 1 : 0;
	if ((t->used + 1) * 2 > cap) {
		size_t ncap = cap ? cap * 2 : 64;
		struct slot *slots = calloc(ncap, sizeof(*slots));
		if (!slots)
			return -ENOMEM;
		for (size_t k = 0; k < o->n_limits; k++) {
			uint64_t hk = hash_limits(&o->limits[k]);
			size_t j = (size_t)hk & (ncap - 1);
			while (slots[j].ref != 0)
				j = (j + 1) & (ncap - 1);
			slots[j] = (struct slot){ (uint32_t)(hk >> 32), (uint32_t)k + 1 };
		}
		free(t->slots);
		t->slots = slots;
		t->mask = ncap - 1;
	}
	o->limits[o->n_limits] = *l;
	for (i = (size_t)h & t->mask; t->slots[i].ref != 0; i = (i + 1) & t->mask)
		;
	t->slots[i] = (struct slot){ tag, (uint32_t)o->n_limits + 1 };
	t->used++;
	*ret_index = (uint32_t)o->n_limits++;
	return 0;
}

static bool entry_key_eq(const struct rate_overrides *o, const struct entry *e, struct str key)
{
	return e->key_len == key.len && memcmp(o->keys + e->key_off, key.ptr, key.len) == 0;
}

/*
 * Builds o->by_key over every entry, in file order.  0, -ENOMEM, or -EEXIST with
 * *ret_dup the first entry whose key an earlier entry *ret_first already has.
 */
static int build_key_table(struct rate_overrides *o, size_t *ret_dup, size_t *ret_first)
{
	struct table *t = &o->by_key;
	size_t cap = 64;

	while (cap < o->n_entries * 2)
		cap *= 2; /* n_entries < 2^32: no overflow */
	t->slots = calloc(cap, sizeof(*t->slots));
	if (!t->slots)
		return -ENOMEM;
	t->mask = cap - 1;
	for (size_t n = 0; n < o->n_entries; n++) {
		const struct entry *e = &o->entries[n];
		uint32_t tag = (uint32_t)(e->hash >> 32);
		size_t i = (size_t)e->hash & t->mask;

		if (n + PREFETCH_AHEAD < o->n_entries)
			__builtin_prefetch(&t->slots[(size_t)o->entries[n + PREFETCH_AHEAD].hash &
						     t->mask], 1);
		for (;; i = (i + 1) & t->mask) {
			struct slot *s = &t->slots[i];
			if (s->ref == 0) {
				*s = (struct slot){ tag, (uint32_t)n + 1 };
				t->used++;
				break;
			}
			if (s->tag == tag &&
			    entry_key_eq(o, &o->entries[s->ref - 1],
					 str_make(o->keys + e->key_off, e->key_len))) {
				*ret_dup = n;
				*ret_first = s->ref - 1;
				return -EEXIST;
			}
		}
	}
	return 0;
}

struct rate_overrides *rate_overrides_free(struct rate_overrides *o)
{
	if (!o)
		return NULL;
	free(o->entries);
	free(o->keys);
	free(o->limits);
	table_free(&o->by_key);
	table_free(&o->by_limits);
	free(o);
	return NULL;
}

const struct rate_limits *rate_overrides_find(const struct rate_overrides *o, struct str key)
{
	if (!o || !o->by_key.slots || key.len > RATE_MAX_OVERRIDE_KEY || (!key.ptr && key.len))
		return NULL;
	const struct table *t = &o->by_key;
	uint64_t h = hash_key(key);
	uint32_t tag = (uint32_t)(h >> 32);
	for (size_t i = (size_t)h & t->mask; t->slots[i].ref != 0; i = (i + 1) & t->mask) {
		const struct slot *s = &t->slots[i];
		const struct entry *e = &o->entries[s->ref - 1];
		if (s->tag == tag && entry_key_eq(o, e, key))
			return &o->limits[e->limits];
	}
	return NULL;
}

size_t rate_overrides_count(const struct rate_overrides *o)
{
	return o ? o->n_entries : 0;
}

/* ---- overrides: parser ----------------------------------------------------------- */

struct parser {
	const char *file;
	unsigned line;
	rate_key_normalize_fn *normalize;
	void *arg;
	struct rate_overrides *o;
	char *err;
	size_t errlen;
};

static int line_error(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int line_error(struct parser *p, const char *fmt, ...)
{
	struct msg m;
	va_list ap;

	msg_init(&m, p->err, p->errlen);
	msg_printf(&m, "%s:%u: ", p->file, p->line);
	va_start(ap, fmt);
	msg_vprintf(&m, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int nomem(struct parser *p)
{
	struct msg m;
	msg_init(&m, p->err, p->errlen);
	msg_printf(&m, "%s:%u: out of memory", p->file, p->line);
	return -ENOMEM;
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static struct str trim(struct str s)
{
	while (s.len > 0 && is_blank(s.ptr[0])) {
		s.ptr++;
		s.len--;
	}
	while (s.len > 0 && is_blank(s.ptr[s.len - 1]))
		s.len--;
	return s;
}

/* Parses "0" or a comma-separated list of windows (already cut before any comment). */
static int parse_windows(struct parser *p, struct str text,
			 struct rate_limits *ret_limits)
{
	struct rate_limits l;
	char werr[512];

	memset(&l, 0, sizeof(l));
	text = trim(text);
	if (text.len == 1 && text.ptr[0] == '0') {
		*ret_limits = l;
		return 0;
	}
	for (;;) {
		const char *comma = memchr(text.ptr, ',', text.len);
		struct str item = str_make(text.ptr, comma ? (size_t)(comma - text.ptr) : text.len);
		struct str w = trim(item);
		if (w.len == 0)
			return line_error(p, comma ? "empty window before ','"
						   : "empty window after ','");
		for (size_t i = 0; i < w.len; i++) {
			if (is_blank(w.ptr[i])) {
				struct str rest = trim(str_make(w.ptr + i, w.len - i));
				return line_error(p, "expected ',' between windows, got %s",
						  show(rest, werr, sizeof(werr)));
			}
		}
		if (w.len == 1 && w.ptr[0] == '0')
			return line_error(p, "0 (unlimited) must be the only value on its line");
		if (l.n == RATE_MAX_WINDOWS)
			return line_error(p, "more than %u windows", (unsigned)RATE_MAX_WINDOWS);
		if (rate_window_parse(w, &l.w[l.n], werr, sizeof(werr)) < 0)
			return line_error(p, "%s", werr);
		l.n++;
		if (!comma)
			break;
		text = str_make(comma + 1, text.len - item.len - 1);
	}
	*ret_limits = l;
	return 0;
}

/* Appends an entry (its key copied into the arena); duplicates are found later. */
static int add_entry(struct parser *p, struct str key, const struct rate_limits *l)
{
	struct rate_overrides *o = p->o;
	uint32_t li;

	if (o->n_entries >= UINT32_MAX - 1 || o->keys_len > UINT32_MAX - key.len)
		return nomem(p);
	if (intern_limits(o, l, &li) < 0)
		return nomem(p);
	struct entry *e = grow(o->entries, &o->cap_entries, o->n_entries, sizeof(*e));
	if (!e)
		return nomem(p);
	o->entries = e;
	if (o->keys_len + key.len > o->keys_cap) {
		size_t ncap = o->keys_cap ? o->keys_cap : 4096;
		while (ncap < o->keys_len + key.len)
			ncap *= 2;
		char *k = realloc(o->keys, ncap);
		if (!k)
			return nomem(p);
		o->keys = k;
		o->keys_cap = ncap;
	}
	memcpy(o->keys + o->keys_len, key.ptr, key.len);
	o->entries[o->n_entries++] = (struct entry){ .hash = hash_key(key),
						     .key_off = (uint32_t)o->keys_len,
						     .key_len = (uint32_t)key.len,
						     .line = p->line, .limits = li };
	o->keys_len += key.len;
	return 0;
}

/* One line without its LF, known to hold no NUL byte. */
static int parse_line(struct parser *p, struct str line)
{
	char shown[SHOW_SIZE];
	char norm[RATE_MAX_OVERRIDE_KEY];
	struct rate_limits l;
	size_t i = 0;

	while (i < line.len && is_blank(line.ptr[i]))
		i++;
	if (i == line.len || line.ptr[i] == '#')
		return 0;
	size_t start = i;
	while (i < line.len && !is_blank(line.ptr[i]))
		i++;
	struct str key = str_make(line.ptr + start, i - start);
	struct str rest = str_make(line.ptr + i, line.len - i);
	const char *hash = memchr(rest.ptr, '#', rest.len);
	if (hash)
		rest.len = (size_t)(hash - rest.ptr);

	if (key.len > RATE_MAX_OVERRIDE_KEY)
		return line_error(p, "key %s longer than %u bytes", show(key, shown, sizeof(shown)),
				  (unsigned)RATE_MAX_OVERRIDE_KEY);
	if (trim(rest).len == 0)
		return line_error(p, "no limits for key %s (write 0 for unlimited)",
				  show(key, shown, sizeof(shown)));
	int r = parse_windows(p, rest, &l);
	if (r < 0)
		return r;
	if (p->normalize) {
		int n = p->normalize(key, norm, p->arg);
		if (n <= 0 || n > RATE_MAX_OVERRIDE_KEY)
			return line_error(p, "invalid key %s", show(key, shown, sizeof(shown)));
		key = str_make(norm, (size_t)n);
	}
	return add_entry(p, key, &l);
}

/*
 * Two passes: the lines are read in order into entries (stopping at the first error),
 * then the key table is built over the entries read, in order.  A duplicate key found
 * then is on an earlier line than any error of the first pass, so it is the one reported:
 * the error reported is always the first in file order.
 */
int rate_overrides_parse(const char *file_name, const char *text, size_t len,
			 rate_key_normalize_fn *normalize, void *arg,
			 struct rate_overrides **ret, char *err, size_t errlen)
{
	struct parser p = { .file = file_name ? file_name : "(overrides)", .line = 1,
			    .normalize = normalize, .arg = arg, .err = err, .errlen = errlen };
	char shown[SHOW_SIZE];
	struct msg m;
	int r = 0;

	msg_init(&m, err, errlen);
	if (!text && len > 0) {
		msg_printf(&m, "%s: no text", p.file);
		return -EINVAL;
	}
	if (len > RATE_MAX_OVERRIDES_FILE) {
		msg_printf(&m, "%s: larger than %u bytes", p.file,
			   (unsigned)RATE_MAX_OVERRIDES_FILE);
		return -EFBIG;
	}
	p.o = calloc(1, sizeof(*p.o));
	if (!p.o) {
		msg_printf(&m, "%s: out of memory", p.file);
		return -ENOMEM;
	}
	const char *nul = len ? memchr(text, '\0', len) : NULL;
	size_t pos = 0;
	while (pos < len) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t end = nl ? (size_t)(nl - text) : len;
		if (nul && nul < text + end) {
			r = line_error(&p, "NUL byte in input");
			break;
		}
		r = parse_line(&p, str_make(text + pos, end - pos));
		if (r < 0)
			break;
		pos = end + 1;
		p.line++;
	}
	table_free(&p.o->by_limits);
	if (r != -ENOMEM) {
		size_t dup, first;
		int b = build_key_table(p.o, &dup, &first);
		if (b == -EEXIST) {
			const struct entry *d = &p.o->entries[dup];
			p.line = d->line;
			r = line_error(&p, "duplicate key %s (first on line %u)",
				       show(str_make(p.o->keys + d->key_off, d->key_len), shown,
					    sizeof(shown)),
				       p.o->entries[first].line);
		} else if (b < 0 && r == 0) {
			r = nomem(&p);
		}
		/* XXX out of memory with a syntax error pending: the syntax error is reported
		 * even if an earlier line repeats a key */
	}
	if (r < 0) {
		rate_overrides_free(p.o);
		return r;
	}
	*ret = p.o;
	return 0;
}

int rate_overrides_load(const char *path, rate_key_normalize_fn *normalize, void *arg,
			struct rate_overrides **ret, char *err, size_t errlen)
{
	struct msg m;
	char *text = NULL;
	size_t len = 0;

	int r = file_read_all(path, RATE_MAX_OVERRIDES_FILE, &text, &len);
	if (r < 0) {
		msg_init(&m, err, errlen);
		if (r == -EFBIG)
			msg_printf(&m, "%s: larger than %u bytes", path,
				   (unsigned)RATE_MAX_OVERRIDES_FILE);
		else if (r == -EINVAL)
			msg_printf(&m, "%s: not a regular file", path);
		else
			msg_printf(&m, "%s: %s", path, strerror(-r));
		return r;
	}
	r = rate_overrides_parse(path, text, len, normalize, arg, ret, err, errlen);
	free(text);
	return r;
}
