/*
 * fuzz_smtp -- libFuzzer target for the SMTP server codec (src/proto/smtp.c).
 *
 * Input: two header bytes, then the bytes a client sends (at most MAX_STREAM).
 *   data[0] picks the line limit: % 4 == 0 SMTP_LINE_MAX, otherwise data[0] / 4 + 1
 *     (1..64), so that long lines are common.  ASCII '0' gives SMTP_LINE_MAX, '1' 13.
 *   data[1] seeds the sizes of the pieces the stream arrives in (1..data[1] % 64 + 1
 *     bytes) and of the decoder's output buffers (SMTP_DATA_MIN_OUT and up).
 *
 * Command lines: the stream is read as a connection would, all at once and piece by
 * piece, each call on a fresh exact-size copy of what the caller holds (so ASan sees any
 * read past it); both readings must give the same lines and too-long lines, at the same
 * offsets, as a plain split of the stream at each LF says, and the caller must never hold
 * max bytes after "read more".  Every line goes through smtp_command_parse(), and every
 * argument through smtp_parse_mail() and smtp_parse_rcpt() with UTF-8 off and on, and
 * smtp_check_helo(): results within the documented codes, slices inside their input,
 * addresses of at most SMTP_MAX_ADDR bytes, 8-bit bytes only when allowed and then valid
 * UTF-8, allowing UTF-8 never refusing more, and an accepted address accepted again,
 * unchanged, when given back in angle brackets.
 *
 * DATA: the stream decoded whole (with an output buffer of SMTP_DATA_OUT_BOUND) and piece
 * by piece with small output buffers must give the same bytes, counters and end, equal to
 * a plain line-by-line reference decoder written here, whose end must be the first
 * "\r\n.\r\n" in "\r\n" + stream; the bare line ends (LF and CR apart) are counted
 * alike, and smtp_data_bare_why() names the one a refusal would.  A command line with a
 * CR is refused as a bare CR whatever else it holds.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smtp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                           \
	do {                                                                                \
		if (!(x)) {                                                                 \
			fprintf(stderr, "fuzz_smtp: %s:%d: check failed: %s\n", __FILE__,     \
				__LINE__, #x);                                              \
			abort();                                                            \
		}                                                                           \
	} while (0)

#define MAX_STREAM (64u * 1024)
#define NONE SIZE_MAX

static uint32_t prng_next(uint32_t *s)
{
	/* xorshift32 */
	uint32_t x = *s;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return *s = x;
}

/* Well-formed UTF-8 (RFC 3629), written independently of smtp.c. */
static bool utf8_ok(const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		unsigned c = s[i];
		uint32_t cp;
		size_t len;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			len = 2, cp = c & 0x1f;
		} else if ((c & 0xf0) == 0xe0) {
			len = 3, cp = c & 0x0f;
		} else if ((c & 0xf8) == 0xf0) {
			len = 4, cp = c & 0x07;
		} else {
			return false;
		}
		if (n - i < len)
			return false;
		for (size_t k = 1; k < len; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + k] & 0x3f);
		}
		static const uint32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
		if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += len;
	}
	return true;
}

static bool has_8bit(struct str s)
{
	for (size_t i = 0; i < s.len; i++)
		if ((unsigned char)s.ptr[i] >= 0x80)
			return true;
	return false;
}

static bool inside(struct str part, struct str whole)
{
	return part.ptr >= whole.ptr && part.ptr + part.len <= whole.ptr + whole.len;
}

/* ---- commands and addresses ----------------------------------------------------------- */

/* An accepted address, given back as "<addr>", is accepted again unchanged. */
static void check_again(struct str addr, bool is_mail, bool utf8)
{
	static char again[SMTP_MAX_ADDR + 16];
	CHECK(addr.len <= SMTP_MAX_ADDR);
	again[0] = '<';
	memcpy(again + 1, addr.ptr, addr.len);
	again[addr.len + 1] = '>';
	memcpy(again + addr.len + 2, is_mail && utf8 ? " SMTPUTF8" : "", is_mail && utf8 ? 9 : 0);
	struct str a = str_make(again, addr.len + 2 + (is_mail && utf8 ? 9 : 0));
	const char *why = NULL;
	if (is_mail) {
		struct smtp_mail m;
		CHECK(smtp_parse_mail(a, utf8, &m, &why) == 0);
		CHECK(m.addr.len == addr.len && memcmp(m.addr.ptr, addr.ptr, addr.len) == 0);
	} else {
		struct smtp_rcpt r;
		CHECK(smtp_parse_rcpt(a, utf8, &r, &why) == 0);
		CHECK(r.addr.len == addr.len && memcmp(r.addr.ptr, addr.ptr, addr.len) == 0);
	}
}

static void check_mail(struct str arg)
{
	struct smtp_mail m[2];
	int r[2];
	for (int u = 0; u < 2; u++) {
		const char *why = NULL;
		memset(&m[u], 0x5a, sizeof(m[u]));
		r[u] = smtp_parse_mail(arg, u, &m[u], &why);
		CHECK(r[u] == 0 || r[u] == -EINVAL || r[u] == -EPROTO || r[u] == -ENOTSUP ||
		      r[u] == -EILSEQ);
		if (r[u] < 0) {
			CHECK(why && why[0]);
			continue;
		}
		CHECK(!why);
		CHECK(inside(m[u].addr, arg) && m[u].addr.len <= SMTP_MAX_ADDR);
		CHECK(m[u].body <= SMTP_BODY_8BITMIME);
		CHECK(!m[u].smtputf8 || u);
		if (has_8bit(m[u].addr))
			CHECK(m[u].smtputf8 && utf8_ok((const unsigned char *)m[u].addr.ptr,
						      m[u].addr.len));
		if (m[u].addr.len)
			check_again(m[u].addr, true, m[u].smtputf8);
	}
	/* allowing SMTPUTF8 changes nothing for an argument without it */
	if (r[0] == 0)
		CHECK(r[1] == 0 && !m[1].smtputf8 && m[0].addr.ptr == m[1].addr.ptr &&
		      m[0].addr.len == m[1].addr.len && m[0].size == m[1].size);
	if (r[0] != 0 && r[0] != -ENOTSUP)
		CHECK(r[1] == r[0]);
}

static void check_rcpt(struct str arg)
{
	struct smtp_rcpt rc[2];
	int r[2];
	for (int u = 0; u < 2; u++) {
		const char *why = NULL;
		r[u] = smtp_parse_rcpt(arg, u, &rc[u], &why);
		CHECK(r[u] == 0 || r[u] == -EINVAL || r[u] == -EPROTO || r[u] == -ENOTSUP ||
		      r[u] == -EILSEQ);
		if (r[u] < 0) {
			CHECK(why && why[0]);
			continue;
		}
		CHECK(inside(rc[u].addr, arg) && rc[u].addr.len > 0 &&
		      rc[u].addr.len <= SMTP_MAX_ADDR);
		if (rc[u].postmaster)
			CHECK(rc[u].addr.len == 10 && !memchr(rc[u].addr.ptr, '@', 10));
		if (has_8bit(rc[u].addr))
			CHECK(u && utf8_ok((const unsigned char *)rc[u].addr.ptr, rc[u].addr.len));
		check_again(rc[u].addr, false, u);
	}
	if (r[0] == 0)
		CHECK(r[1] == 0 && rc[0].addr.ptr == rc[1].addr.ptr);
	if (r[1] != 0 && r[1] != -EILSEQ)
		CHECK(r[0] == r[1]);
}

static void check_line(struct str line)
{
	struct smtp_command c;
	const char *why = NULL;
	int r = smtp_command_parse(line, &c, &why);
	bool ctl = false, blank = true, cr = false;
	for (size_t i = 0; i < line.len; i++) {
		unsigned char b = (unsigned char)line.ptr[i];
		if (b == '\r')
			cr = true;
		if ((b < 0x20 && b != '\t') || b == 0x7f)
			ctl = true;
		if (b != ' ' && b != '\t')
			blank = false;
	}
	if (cr) {
		/* a bare CR is named as such, whatever else the line holds */
		CHECK(r == -EBADMSG && why);
	} else if (ctl || blank) {
		CHECK(r == -EINVAL && why);
	} else {
		CHECK(r == 0 && !why);
		CHECK(inside(c.name, line) && inside(c.arg, line) && c.name.len > 0);
		const char *vn = smtp_verb_name(c.verb);
		if (c.verb != SMTP_VERB_UNKNOWN) {
			CHECK(c.name.len == strlen(vn));
			for (size_t i = 0; i < c.name.len; i++)
				CHECK((c.name.ptr[i] & ~0x20) == vn[i]);
		}
		CHECK(!c.bad_form || c.verb == SMTP_VERB_MAIL || c.verb == SMTP_VERB_RCPT);
		CHECK(c.arg.len == 0 ||
		      (c.arg.ptr[0] != ' ' && c.arg.ptr[0] != '\t' &&
		       c.arg.ptr[c.arg.len - 1] != ' ' && c.arg.ptr[c.arg.len - 1] != '\t'));
	}
	/* the argument parsers on any text, command or not */
	struct str arg = r == 0 ? c.arg : line;
	check_mail(arg);
	check_rcpt(arg);
	bool is_domain;
	int h = smtp_check_helo(arg, &is_domain);
	CHECK(h == 0 || h == -EINVAL);
	if (h == 0)
		CHECK(arg.len >= 1 && arg.len <= SMTP_MAX_DOMAIN);
}

/* ---- command lines --------------------------------------------------------------------- */

struct event {
	size_t start, len; /* the line (OK) or the whole long line with its LF (TOO_LONG) */
	bool ok, bare;
};

struct line_reading {
	size_t count;
	struct event ev[MAX_STREAM];
};

/* The reference: the stream split at each LF; each piece fits or does not. */
static void ref_lines(const char *p, size_t n, size_t max, struct line_reading *rd)
{
	rd->count = 0;
	size_t s = 0;
	for (;;) {
		const char *lf = s < n ? memchr(p + s, '\n', n - s) : NULL;
		if (!lf)
			return;
		size_t e = (size_t)(lf - p);
		struct event *v = &rd->ev[rd->count++];
		v->start = s;
		v->ok = e + 1 - s <= max;
		if (v->ok) {
			v->bare = !(e > s && p[e - 1] == '\r');
			v->len = e - s - (v->bare ? 0 : 1);
		} else {
			v->bare = false;
			v->len = e + 1 - s;
		}
		s = e + 1;
	}
}

/* A connection receiving the stream in pieces (piece_max 0: all at once). */
static void read_lines(const char *p, size_t n, size_t max, uint32_t seed, size_t piece_max,
		       bool parse, struct line_reading *rd)
{
	struct smtp_line_reader r;
	smtp_line_reader_init(&r);
	uint32_t prng = 0x9e3779b9u ^ seed;
	size_t start = 0, got = 0; /* the caller holds p[start..got) */
	size_t long_start = NONE;  /* where the line being discarded began */
	rd->count = 0;
	while (got < n) {
		size_t piece = piece_max ? 1 + prng_next(&prng) % piece_max : n;
		got = n - got > piece ? got + piece : n;
		for (;;) {
			size_t len = got - start;
			char *win = malloc(len ? len : 1);
			CHECK(win);
			memcpy(win, p + start, len);
			struct str line = STR_NULL;
			size_t used = SIZE_MAX;
			enum smtp_line_status st = smtp_line_next(&r, win, len, max, &line, &used);
			CHECK(used <= len);
			if (st == SMTP_LINE_OK) {
				CHECK(line.ptr == win && used >= 1 && used <= max && win[used - 1] == '\n');
				CHECK(line.len == used - (r.bare_lf ? 1 : 2));
				struct event *v = &rd->ev[rd->count++];
				*v = (struct event){ start, line.len, true, r.bare_lf };
				if (parse)
					check_line(line);
			} else if (st == SMTP_LINE_TOO_LONG) {
				CHECK(used >= 1 && win[used - 1] == '\n');
				CHECK(!memchr(win, '\n', used - 1));
				/* the line began where discarding began, if it did */
				size_t ls = long_start != NONE ? long_start : start;
				rd->ev[rd->count++] = (struct event){ ls, start + used - ls, false, false };
				long_start = NONE;
			} else {
				CHECK(st == SMTP_LINE_MORE && (used == 0 || used == len));
				CHECK(!memchr(win, '\n', len));
				if (used > 0 && long_start == NONE)
					long_start = start;
			}
			free(win);
			start += used;
			if (st == SMTP_LINE_MORE) {
				/* never a whole max of one line held */
				CHECK(got - start < max || (max == 0 && got == start));
				break;
			}
		}
	}
}

static bool same_lines(const struct line_reading *a, const struct line_reading *b)
{
	if (a->count != b->count)
		return false;
	for (size_t i = 0; i < a->count; i++)
		if (a->ev[i].start != b->ev[i].start || a->ev[i].len != b->ev[i].len ||
		    a->ev[i].ok != b->ev[i].ok || a->ev[i].bare != b->ev[i].bare)
			return false;
	return true;
}

/* ---- DATA ------------------------------------------------------------------------------ */

struct data_reading {
	char *out;
	size_t len;
	size_t end;
	uint64_t bare, bare_cr, lines;
	size_t max_line;
};

/* The reference decoder: see test_smtp.c's ref_decode(); written again here. */
static void ref_data(const char *in, size_t n, struct data_reading *r)
{
	r->len = 0;
	r->end = NONE;
	r->bare = r->bare_cr = r->lines = 0;
	r->max_line = 0;
	bool after_crlf = true;
	size_t i = 0;
	while (i < n) {
		size_t s = i;
		while (i < n && in[i] != '\r' && in[i] != '\n')
			i++;
		size_t tl = i - s;
		bool unfinished = false, crlf = false;
		if (i == n) {
			unfinished = true;
		} else if (in[i] == '\n') {
			i++;
		} else if (i + 1 == n) {
			unfinished = true; /* a CR, and nothing yet after it */
			i++;
		} else if (in[i + 1] == '\n') {
			crlf = true;
			i += 2;
		} else {
			r->bare_cr++; /* a bare CR: its line is complete, and not the end */
			i++;
		}
		if (tl == 1 && in[s] == '.') {
			if (after_crlf && crlf) {
				r->end = i;
				break;
			}
			if (unfinished)
				break;
			r->out[r->len++] = '.';
			if (r->max_line < 1)
				r->max_line = 1;
		} else {
			size_t skip = tl && in[s] == '.';
			memcpy(r->out + r->len, in + s + skip, tl - skip);
			r->len += tl - skip;
			if (r->max_line < tl - skip)
				r->max_line = tl - skip;
		}
		if (unfinished)
			break;
		r->out[r->len++] = '\r';
		r->out[r->len++] = '\n';
		r->lines++;
		if (!crlf)
			r->bare++;
		after_crlf = crlf;
	}
}

static void decode(const char *p, size_t n, uint32_t seed, size_t piece_max,
		   struct data_reading *rd)
{
	struct smtp_data d;
	smtp_data_init(&d);
	uint32_t prng = 0x7f4a7c15u ^ seed;
	rd->len = 0;
	rd->end = NONE;
	size_t at = 0;
	while (at < n) {
		size_t piece = piece_max ? 1 + prng_next(&prng) % piece_max : n - at;
		if (piece > n - at)
			piece = n - at;
		size_t outcap = piece_max ? SMTP_DATA_MIN_OUT + prng_next(&prng) % 8 :
					    SMTP_DATA_OUT_BOUND(piece);
		char *win = malloc(piece);
		char *out = malloc(outcap);
		CHECK(win && out);
		memcpy(win, p + at, piece);
		size_t used = SIZE_MAX, made = SIZE_MAX;
		int r = smtp_data_decode(&d, win, piece, out, outcap, &used, &made);
		CHECK(used <= piece && made <= outcap && (used || made));
		if (outcap >= SMTP_DATA_OUT_BOUND(piece))
			CHECK(r || used == piece);
		memcpy(rd->out + rd->len, out, made);
		rd->len += made;
		free(win);
		free(out);
		at += used;
		if (r) {
			rd->end = at;
			break;
		}
	}
	CHECK(d.done == (rd->end != NONE) && d.size == rd->len);
	CHECK(d.line_len <= d.max_line);
	rd->bare = d.bare_eol;
	rd->bare_cr = d.bare_cr;
	rd->lines = d.lines;
	/* what a service refusing bare line ends answers */
	const char *why = smtp_data_bare_why(&d);
	CHECK(d.bare_cr <= d.bare_eol);
	CHECK(!why == !d.bare_eol);
	if (why)
		CHECK(strcmp(why, d.bare_eol > d.bare_cr ? "bare <LF> received" :
							   "bare <CR> received") == 0);
	rd->max_line = d.max_line;
}

static bool same_data(const struct data_reading *a, const struct data_reading *b)
{
	return a->len == b->len && memcmp(a->out, b->out, a->len) == 0 && a->end == b->end &&
	       a->bare == b->bare && a->bare_cr == b->bare_cr && a->lines == b->lines &&
	       a->max_line == b->max_line;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	const char *p = (const char *)data + 2;
	size_t n = size - 2 < MAX_STREAM ? size - 2 : MAX_STREAM;
	size_t max = data[0] % 4 == 0 ? SMTP_LINE_MAX : (size_t)data[0] / 4 + 1;
	size_t piece_max = (size_t)(data[1] % 64) + 1;

	static struct line_reading ref, whole, pieces;
	ref_lines(p, n, max, &ref);
	read_lines(p, n, max, data[1], 0, true, &whole);
	read_lines(p, n, max, data[1], piece_max, false, &pieces);
	CHECK(same_lines(&ref, &whole));
	CHECK(same_lines(&ref, &pieces));

	static char out_ref[2 * MAX_STREAM + 3], out_whole[2 * MAX_STREAM + 3],
		out_pieces[2 * MAX_STREAM + 3], out_bytes[2 * MAX_STREAM + 3];
	struct data_reading dref = { .out = out_ref }, dwhole = { .out = out_whole },
			    dpieces = { .out = out_pieces }, dbytes = { .out = out_bytes };
	ref_data(p, n, &dref);
	/* the end, defined once more: the first "\r\n.\r\n" in "\r\n" + stream */
	{
		char *buf = malloc(n + 2);
		CHECK(buf);
		memcpy(buf, "\r\n", 2);
		memcpy(buf + 2, p, n);
		const char *at = memmem(buf, n + 2, "\r\n.\r\n", 5);
		CHECK(dref.end == (at ? (size_t)(at - buf) + 3 : NONE));
		free(buf);
	}
	decode(p, n, data[1], 0, &dwhole);
	decode(p, n, data[1], piece_max, &dpieces);
	CHECK(same_data(&dref, &dwhole));
	CHECK(same_data(&dref, &dpieces));
	if (n <= 4096) {
		decode(p, n, data[1], 1, &dbytes);
		CHECK(same_data(&dref, &dbytes));
	}
	return 0;
}
