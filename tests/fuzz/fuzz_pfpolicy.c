/*
 * fuzz_pfpolicy -- libFuzzer target for the Postfix policy delegation codec
 * (src/proto/pfpolicy.c).
 *
 * Input: two header bytes, then the bytes a policy client sends (at most MAX_STREAM).
 *   data[0] % 8 picks the byte limit: 0-3 8192 (the usual), 4 the stream's length,
 *     5 one less, 6 data[1] * 8, 7 64.  An ASCII '0' gives 8192.
 *   data[1] seeds the sizes of the pieces the stream arrives in: 1..(data[1] % 64 + 1)
 *     bytes each, from a small PRNG.
 *
 * The stream is read as a sequence of requests twice: all of it at once, and piece by
 * piece as a connection would receive it, each call on a fresh exact-size copy of the
 * unconsumed window (so the parser must keep offsets, and ASan sees any read past the
 * end).  Both must give the same requests and the same final answer, which must match a
 * plain line-by-line reading of pfpolicy.c's grammar written here.  Every request read
 * is checked for the codec's promises (length within n and max, slices inside the buffer,
 * names valid and distinct, values without NUL or LF); pfpolicy_get() finds every
 * attribute; every value, and every piece of the raw input, goes through
 * pfpolicy_put_action(), whose verdict and output are checked and read back.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "pfpolicy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                           \
	do {                                                                                \
		if (!(x)) {                                                                 \
			fprintf(stderr, "fuzz_pfpolicy: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #x);                                              \
			abort();                                                            \
		}                                                                           \
	} while (0)

/* The stream is cut to MAX_STREAM bytes, which hold at most MAX_REQUESTS requests
 * ("a=\n\n" is the shortest, 4 bytes). */
#define MAX_STREAM (256u * 1024)
#define MAX_REQUESTS (MAX_STREAM / 4)

static bool is_name_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-';
}

/* ---- the reference: one request, line by line, no state kept between calls ---------- */

enum ref_error { REF_OK = 0, REF_NUL, REF_EMPTY_NAME, REF_BAD_CHAR, REF_LONG_NAME, REF_NO_EQ,
		 REF_TOO_MANY, REF_EMPTY_REQUEST };

static const char *const ref_why[] = {
	[REF_NUL] = "NUL byte in request",
	[REF_EMPTY_NAME] = "empty attribute name",
	[REF_BAD_CHAR] = "bad character in attribute name",
	[REF_LONG_NAME] = "attribute name too long",
	[REF_NO_EQ] = "line without '='",
	[REF_TOO_MANY] = "too many attributes",
	[REF_EMPTY_REQUEST] = "empty request",
};

struct ref_request {
	int result;
	enum ref_error error;
	size_t n;
	size_t name_off[PFPOLICY_MAX_ATTRS], name_len[PFPOLICY_MAX_ATTRS];
	size_t value_off[PFPOLICY_MAX_ATTRS], value_len[PFPOLICY_MAX_ATTRS];
};

static int ref_fail(struct ref_request *r, enum ref_error e)
{
	r->error = e;
	return r->result = -EPROTO;
}

/* Read p[0..n) with limit max the simple way; the first bad byte decides the error. */
static int ref_parse(const char *p, size_t n, size_t max, struct ref_request *r)
{
	memset(r, 0, sizeof(*r));
	size_t lim = n < max ? n : max;
	if (lim > (size_t)INT_MAX)
		lim = INT_MAX;
	size_t s = 0;
	for (;;) {
		const char *nlp = s < lim ? memchr(p + s, '\n', lim - s) : NULL;
		size_t end = nlp ? (size_t)(nlp - p) : lim; /* the line, without its LF */
		const char *eqp = s < end ? memchr(p + s, '=', end - s) : NULL;
		size_t name_end = eqp ? (size_t)(eqp - p) : end;

		/* an empty line, "\r" and LF: the end of the request */
		if (nlp && (end == s || (end == s + 1 && p[s] == '\r'))) {
			if (r->n == 0)
				return ref_fail(r, REF_EMPTY_REQUEST);
			return r->result = (int)(end + 1);
		}
		/* a line opened by CR: an error once the byte after it is known */
		if (s < lim && p[s] == '\r') {
			if (s + 1 == lim)
				return r->result = n >= max || lim == (size_t)INT_MAX ? -EMSGSIZE : 0;
			if (p[s + 1] == '\0')
				return ref_fail(r, REF_NUL);
			return ref_fail(r, REF_BAD_CHAR);
		}
		/* the name, byte by byte */
		for (size_t j = s; j < name_end; j++) {
			if (p[j] == '\0')
				return ref_fail(r, REF_NUL);
			if (!is_name_char((unsigned char)p[j]))
				return ref_fail(r, REF_BAD_CHAR);
			if (j - s == PFPOLICY_MAX_NAME)
				return ref_fail(r, REF_LONG_NAME);
		}
		if (!eqp) {
			if (nlp)
				return ref_fail(r, REF_NO_EQ);
			return r->result = n >= max || lim == (size_t)INT_MAX ? -EMSGSIZE : 0;
		}
		if (name_end == s)
			return ref_fail(r, REF_EMPTY_NAME);
		size_t nlen = name_end - s, slot;
		for (slot = 0; slot < r->n; slot++)
			if (r->name_len[slot] == nlen && memcmp(p + r->name_off[slot], p + s, nlen) == 0)
				break;
		if (slot == r->n) {
			if (r->n == PFPOLICY_MAX_ATTRS)
				return ref_fail(r, REF_TOO_MANY);
			r->n++;
		}
		r->name_off[slot] = s;
		r->name_len[slot] = nlen;
		if (memchr(p + name_end + 1, '\0', end - name_end - 1))
			return ref_fail(r, REF_NUL);
		if (!nlp)
			return r->result = n >= max || lim == (size_t)INT_MAX ? -EMSGSIZE : 0;
		size_t vlen = end - name_end - 1;
		if (vlen && p[end - 1] == '\r')
			vlen--;
		r->value_off[slot] = name_end + 1;
		r->value_len[slot] = vlen;
		s = end + 1;
	}
}

/* ---- checks on what the codec returns ------------------------------------------------- */

/* A request read from p[0..n): its promises, and agreement with the reference. */
static void check_request(const char *p, size_t n, size_t max, int r,
			  const struct pfpolicy_request *req, const char *why)
{
	struct ref_request ref;
	ref_parse(p, n, max, &ref);
	CHECK(r == ref.result);
	if (r == 0) {
		CHECK(n < max);
		return;
	}
	if (r < 0) {
		CHECK(why && why[0]);
		if (r == -EPROTO)
			CHECK(strcmp(why, ref_why[ref.error]) == 0);
		else
			CHECK(r == -EMSGSIZE && n >= max);
		return;
	}
	size_t used = (size_t)r;
	CHECK(used <= n && used <= max && p[used - 1] == '\n');
	CHECK(req->n == ref.n && req->n >= 1 && req->n <= PFPOLICY_MAX_ATTRS);
	for (size_t i = 0; i < req->n; i++) {
		struct str nm = req->attr[i].name, v = req->attr[i].value;
		CHECK(nm.ptr == p + ref.name_off[i] && nm.len == ref.name_len[i]);
		CHECK(v.ptr == p + ref.value_off[i] && v.len == ref.value_len[i]);
		CHECK(nm.ptr >= p && nm.ptr + nm.len < p + used);
		CHECK(v.ptr >= p && v.ptr + v.len < p + used);
		CHECK(nm.len >= 1 && nm.len <= PFPOLICY_MAX_NAME && nm.ptr[nm.len] == '=');
		for (size_t k = 0; k < nm.len; k++)
			CHECK(is_name_char((unsigned char)nm.ptr[k]));
		CHECK(v.ptr == nm.ptr + nm.len + 1);
		CHECK(!memchr(v.ptr, '\0', v.len) && !memchr(v.ptr, '\n', v.len));
		for (size_t j = 0; j < i; j++)
			CHECK(!str_eq(nm, req->attr[j].name));
		/* found by name */
		char name[PFPOLICY_MAX_NAME + 1];
		memcpy(name, nm.ptr, nm.len);
		name[nm.len] = '\0';
		struct str g = pfpolicy_get(req, name);
		CHECK(g.ptr == v.ptr && g.len == v.len);
	}
}

/* pfpolicy_put_action() on any bytes: the verdict, the output, and the output read back. */
static void check_action(struct str text)
{
	bool good = text.len >= 1 && text.len <= PFPOLICY_MAX_ACTION;
	for (size_t i = 0; good && i < text.len; i++)
		if (text.ptr[i] == '\0' || text.ptr[i] == '\r' || text.ptr[i] == '\n')
			good = false;
	struct buf out;
	buf_init(&out, 2 * PFPOLICY_MAX_ACTION);
	CHECK(buf_append_cstr(&out, "x") == 0);
	int r = pfpolicy_put_action(&out, text);
	if (!good) {
		CHECK(r == -EINVAL && out.len == 1);
		buf_done(&out);
		return;
	}
	CHECK(r == 0 && out.len == 1 + 7 + text.len + 2);
	CHECK(memcmp(out.ptr + 1, "action=", 7) == 0);
	CHECK(memcmp(out.ptr + 8, text.ptr, text.len) == 0);
	CHECK(memcmp(out.ptr + 8 + text.len, "\n\n", 2) == 0);
	/* a reply reads like a one-attribute request (a CR at the end would be taken as part
	 * of the line end, but the text holds none) */
	struct pfpolicy_parser st;
	pfpolicy_parser_reset(&st);
	static struct pfpolicy_request req;
	const char *why = NULL;
	CHECK(pfpolicy_parse(&st, out.ptr + 1, out.len - 1, out.len - 1, &req, &why) ==
	      (int)(out.len - 1));
	struct str v = pfpolicy_get(&req, "action");
	CHECK(req.n == 1 && v.len == text.len && memcmp(v.ptr, text.ptr, text.len) == 0);
	/* a buffer one byte too small takes nothing */
	struct buf small;
	buf_init(&small, 7 + text.len + 1);
	CHECK(pfpolicy_put_action(&small, text) == -ENOBUFS && small.len == 0);
	buf_done(&small);
	buf_done(&out);
}

/* ---- the two readings ---------------------------------------------------------------- */

struct reading {
	size_t count;           /* requests read */
	size_t end[MAX_REQUESTS]; /* stream offset after each */
	size_t attrs[MAX_REQUESTS];
	int last;               /* the answer that stopped the reading: 0 or an error */
	const char *why;
};

static uint32_t prng_next(uint32_t *s)
{
	/* xorshift32 */
	uint32_t x = *s;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return *s = x;
}

/* All at once: each request read from the unconsumed rest of the stream. */
static void read_whole(const char *p, size_t n, size_t max, struct reading *rd)
{
	struct pfpolicy_parser st;
	pfpolicy_parser_reset(&st);
	static struct pfpolicy_request req;
	size_t off = 0;
	rd->count = 0;
	for (;;) {
		const char *why = NULL;
		int r = pfpolicy_parse(&st, p + off, n - off, max, &req, &why);
		check_request(p + off, n - off, max, r, &req, why);
		if (r <= 0) {
			CHECK(r == 0 || st.scanned <= n - off);
			rd->last = r;
			rd->why = why;
			return;
		}
		CHECK(st.scanned == 0 && rd->count < MAX_REQUESTS);
		/* every value as the text of a reply */
		for (size_t i = 0; i < req.n; i++)
			check_action(req.attr[i].value);
		off += (size_t)r;
		rd->end[rd->count] = off;
		rd->attrs[rd->count] = req.n;
		rd->count++;
	}
}

/* Piece by piece, each call on a fresh copy of the window not consumed yet. */
static void read_pieces(const char *p, size_t n, size_t max, uint8_t seed, struct reading *rd)
{
	struct pfpolicy_parser st;
	pfpolicy_parser_reset(&st);
	static struct pfpolicy_request req;
	uint32_t prng = 0x9e3779b9u ^ seed;
	size_t piece_max = (size_t)(seed % 64) + 1;
	size_t start = 0, got = 0;
	rd->count = 0;
	for (;;) {
		size_t piece = 1 + prng_next(&prng) % piece_max;
		got = n - got > piece ? got + piece : n;
		for (;;) {
			size_t len = got - start;
			char *win = malloc(len ? len : 1);
			CHECK(win);
			memcpy(win, p + start, len);
			const char *why = NULL;
			size_t before = st.scanned;
			int r = pfpolicy_parse(&st, win, len, max, &req, &why);
			/* a prefix of the stream that decides reads like the reference says */
			if (r != 0)
				check_request(win, len, max, r, &req, why);
			if (r > 0) {
				CHECK(rd->count < MAX_REQUESTS);
				start += (size_t)r;
				rd->end[rd->count] = start;
				rd->attrs[rd->count] = req.n;
				rd->count++;
				free(win);
				continue;
			}
			if (r < 0) {
				/* an error stays put: the same answer when asked again */
				const char *why2 = NULL;
				size_t at = st.scanned;
				CHECK(pfpolicy_parse(&st, win, len, max, &req, &why2) == r);
				CHECK(strcmp(why, why2) == 0 && st.scanned == at);
			}
			free(win);
			if (r == 0) {
				/* the scan only moves forward, and reaches what it was given */
				CHECK(len < max && st.scanned >= before && st.scanned == len);
				if (got < n)
					break; /* wait for the next piece */
			}
			rd->last = r;
			rd->why = why;
			return;
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	const char *p = (const char *)data + 2;
	size_t n = size - 2 < MAX_STREAM ? size - 2 : MAX_STREAM;
	size_t max;
	switch (data[0] % 8) {
	case 4:
		max = n;
		break;
	case 5:
		max = n ? n - 1 : 0;
		break;
	case 6:
		max = (size_t)data[1] * 8;
		break;
	case 7:
		max = 64;
		break;
	default:
		max = 8192;
	}

	static struct reading whole, pieces;
	read_whole(p, n, max, &whole);
	read_pieces(p, n, max, data[1], &pieces);
	CHECK(whole.count == pieces.count);
	for (size_t i = 0; i < whole.count; i++)
		CHECK(whole.end[i] == pieces.end[i] && whole.attrs[i] == pieces.attrs[i]);
	CHECK(whole.last == pieces.last);
	if (whole.last < 0)
		CHECK(strcmp(whole.why, pieces.why) == 0);

	/* the raw input, cut where the pieces were, as reply texts */
	uint32_t prng = 0x7f4a7c15u ^ data[1];
	for (size_t off = 0; off < n;) {
		size_t len = 1 + prng_next(&prng) % (size_t)(data[0] + 1u);
		if (len > n - off)
			len = n - off;
		check_action(str_make(p + off, len));
		off += len;
	}
	check_action(str_make(p, n));
	check_action(str_make(p, 0));
	return 0;
}
