/*
 * fuzz_control -- libFuzzer target for the control line protocol codec (src/proto/control.c).
 *
 * The input is read twice, as a stream of requests and as a stream of replies.  Each
 * parser's answer is compared with a plain reference reading of control.h's grammar
 * written here (the line limit counts the newline; words split on spaces and tabs; a CR
 * before the LF is dropped; a reply header fits in 32 bytes and announces at most
 * CONTROL_BODY_MAX bytes), and must not depend on how much of the input is visible:
 * a shorter prefix of a message only ever asks for more bytes.  Every request read is
 * written back as a line and every reply through control_put_reply(), and must read back
 * the same.  An "auth" request's password is decoded (control_auth_parse) and compared
 * with a plain %XX reading; a good one written again with control_put_auth() reads back
 * the same, and so does the whole input taken as a password.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "control.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                         \
	do {                                                                              \
		if (!(x)) {                                                               \
			fprintf(stderr, "fuzz_control: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #x);                                            \
			abort();                                                          \
		}                                                                         \
	} while (0)

/* ---- requests ---------------------------------------------------------------------- */

struct ref_request {
	int result;
	size_t used;
	size_t argc;
	size_t start[CONTROL_MAX_ARGS + 1], len[CONTROL_MAX_ARGS + 1];
};

static struct ref_request ref_request_parse(const char *p, size_t n)
{
	struct ref_request r = { 0 };
	size_t nl = SIZE_MAX;
	for (size_t i = 0; i < n && i < CONTROL_LINE_MAX; i++)
		if (p[i] == '\n') {
			nl = i;
			break;
		}
	if (nl == SIZE_MAX) {
		r.result = n >= CONTROL_LINE_MAX ? -EPROTO : 0;
		return r;
	}
	size_t len = nl;
	for (size_t i = 0; i < len; i++)
		if (p[i] == '\0') {
			r.result = -EPROTO;
			return r;
		}
	if (len && p[len - 1] == '\r')
		len--;
	size_t i = 0;
	while (i < len) {
		if (p[i] == ' ' || p[i] == '\t') {
			i++;
			continue;
		}
		size_t s = i;
		while (i < len && p[i] != ' ' && p[i] != '\t')
			i++;
		if (r.argc == CONTROL_MAX_ARGS) {
			r.result = -EPROTO;
			return r;
		}
		r.start[r.argc] = s;
		r.len[r.argc] = i - s;
		r.argc++;
	}
	if (r.argc == 0) {
		r.result = -EPROTO;
		return r;
	}
	r.result = 1;
	r.used = nl + 1;
	return r;
}

/* ---- auth ---------------------------------------------------------------------------- */

static int ref_hex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)(c | 0x20);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* control.h's auth: "auth" and one word, %XX two hex digits, at most the maximum. */
static int ref_auth(const struct control_request *req, char *out, size_t *ret_len)
{
	if (req->argv[0].len != 4 || memcmp(req->argv[0].ptr, "auth", 4) != 0)
		return 0;
	if (req->argc != 2)
		return -EPROTO;
	const char *w = req->argv[1].ptr;
	size_t wl = req->argv[1].len, n = 0;
	for (size_t i = 0; i < wl; i++) {
		int c = (unsigned char)w[i];
		if (w[i] == '%') {
			if (i + 2 >= wl || ref_hex(w[i + 1]) < 0 || ref_hex(w[i + 2]) < 0)
				return -EPROTO;
			c = ref_hex(w[i + 1]) * 16 + ref_hex(w[i + 2]);
			i += 2;
		}
		if (n == CONTROL_SECRET_MAX)
			return -EPROTO;
		out[n++] = (char)c;
	}
	*ret_len = n;
	return 1;
}

/* A password through control_put_auth() and back. */
static void check_auth_round_trip(struct str secret)
{
	struct buf line;
	buf_init(&line, CONTROL_LINE_MAX);
	int r = control_put_auth(&line, secret);
	if (secret.len == 0 || secret.len > CONTROL_SECRET_MAX) {
		CHECK(r == -EINVAL && line.len == 0);
		buf_done(&line);
		return;
	}
	CHECK(r == 0 && line.len <= CONTROL_LINE_MAX);
	struct control_request req;
	size_t used = 0;
	const char *why = NULL;
	CHECK(control_request_parse(line.ptr, line.len, &req, &used, &why) == 1);
	CHECK(used == line.len && req.argc == 2);
	static char back[CONTROL_SECRET_MAX];
	size_t blen = 0;
	CHECK(control_auth_parse(&req, back, &blen, &why) == 1);
	CHECK(blen == secret.len && memcmp(back, secret.ptr, blen) == 0);
	CHECK(secret_equal(str_make(back, blen), secret));
	back[blen / 2] ^= 1;
	CHECK(!secret_equal(str_make(back, blen), secret));
	CHECK(!secret_equal(str_make(back, blen - 1), secret));
	buf_done(&line);
}

static void check_auth(const struct control_request *req)
{
	static char got[CONTROL_SECRET_MAX], want[CONTROL_SECRET_MAX];
	size_t glen = 77, wlen = 0;
	const char *why = NULL;
	int r = control_auth_parse(req, got, &glen, &why);
	int ref = ref_auth(req, want, &wlen);
	CHECK(r == ref);
	if (r < 0)
		CHECK(why && why[0]);
	if (r <= 0) {
		CHECK(glen == 77);
		return;
	}
	CHECK(glen == wlen && memcmp(got, want, wlen) == 0);
	check_auth_round_trip(str_make(got, glen));
}

static void check_request(const char *p, size_t n, size_t *ret_used, bool *ret_more)
{
	struct control_request req;
	memset(&req, 0x5a, sizeof(req));
	size_t used = 77;
	const char *why = NULL;
	int r = control_request_parse(p, n, &req, &used, &why);
	struct ref_request ref = ref_request_parse(p, n);
	CHECK(r == ref.result);
	*ret_more = false;
	if (r <= 0) {
		CHECK(used == 77);
		if (r < 0)
			CHECK(why && why[0]);
		return;
	}
	CHECK(used == ref.used && used <= n && used <= CONTROL_LINE_MAX && p[used - 1] == '\n');
	CHECK(req.argc == ref.argc && req.argc >= 1 && req.argc <= CONTROL_MAX_ARGS);
	for (size_t i = 0; i < req.argc; i++) {
		CHECK(req.argv[i].ptr == p + ref.start[i] && req.argv[i].len == ref.len[i]);
		CHECK(req.argv[i].len > 0);
		CHECK(!memchr(req.argv[i].ptr, ' ', req.argv[i].len));
		CHECK(!memchr(req.argv[i].ptr, '\t', req.argv[i].len));
		CHECK(!memchr(req.argv[i].ptr, '\n', req.argv[i].len));
	}
	/* the same line, cut short, only asks for more */
	size_t cuts[3] = { 0, used / 2, used - 1 };
	for (int k = 0; k < 3; k++) {
		struct control_request tmp;
		size_t u;
		CHECK(control_request_parse(p, cuts[k], &tmp, &u, &why) == 0);
	}
	/* written back as a line, it reads the same */
	struct buf line;
	buf_init(&line, 2 * CONTROL_LINE_MAX);
	for (size_t i = 0; i < req.argc; i++) {
		if (i)
			CHECK(buf_append_byte(&line, ' ') == 0);
		CHECK(buf_append_str(&line, req.argv[i]) == 0);
	}
	/* a word may end with CR (only the CR right before LF is dropped): keep it a word */
	struct str lastw = req.argv[req.argc - 1];
	if (lastw.ptr[lastw.len - 1] == '\r')
		CHECK(buf_append_byte(&line, ' ') == 0);
	CHECK(buf_append_byte(&line, '\n') == 0);
	struct control_request again;
	size_t u2 = 0;
	CHECK(control_request_parse(line.ptr, line.len, &again, &u2, &why) == 1);
	CHECK(u2 == line.len && again.argc == req.argc);
	check_auth(&req);
	for (size_t i = 0; i < req.argc; i++)
		CHECK(again.argv[i].len == req.argv[i].len &&
		      memcmp(again.argv[i].ptr, req.argv[i].ptr, req.argv[i].len) == 0);
	buf_done(&line);
	*ret_used = used;
	*ret_more = true;
}

/* ---- replies ----------------------------------------------------------------------- */

struct ref_reply {
	int result;
	bool ok, more;
	size_t head, len;
};

static struct ref_reply ref_reply_parse(const char *p, size_t n)
{
	struct ref_reply r = { 0 };
	size_t nl = SIZE_MAX;
	for (size_t i = 0; i < n && i < 32; i++)
		if (p[i] == '\n') {
			nl = i;
			break;
		}
	if (nl == SIZE_MAX) {
		r.result = n >= 32 ? -EPROTO : 0;
		return r;
	}
	size_t i;
	if (nl > 3 && memcmp(p, "ok ", 3) == 0) {
		r.ok = true;
		i = 3;
	} else if (nl > 5 && memcmp(p, "more ", 5) == 0) {
		r.ok = r.more = true;
		i = 5;
	} else if (nl > 6 && memcmp(p, "error ", 6) == 0) {
		i = 6;
	} else {
		r.result = -EPROTO;
		return r;
	}
	unsigned long long len = 0;
	for (; i < nl; i++) {
		if (p[i] < '0' || p[i] > '9') {
			r.result = -EPROTO;
			return r;
		}
		len = len * 10 + (unsigned long long)(p[i] - '0');
		if (len > CONTROL_BODY_MAX) {
			r.result = -EPROTO;
			return r;
		}
	}
	r.head = nl + 1;
	r.len = (size_t)len;
	r.result = n - r.head >= r.len ? 1 : 0;
	return r;
}

static void check_reply(const char *p, size_t n, size_t *ret_used, bool *ret_more)
{
	struct control_reply rep;
	memset(&rep, 0x5a, sizeof(rep));
	size_t used = 77;
	const char *why = NULL;
	int r = control_reply_parse(p, n, &rep, &used, &why);
	struct ref_reply ref = ref_reply_parse(p, n);
	CHECK(r == ref.result);
	*ret_more = false;
	if (r <= 0) {
		CHECK(used == 77);
		if (r < 0)
			CHECK(why && why[0]);
		return;
	}
	CHECK(rep.ok == ref.ok && rep.more == ref.more);
	CHECK(rep.body.ptr == p + ref.head && rep.body.len == ref.len);
	CHECK(used == ref.head + ref.len && used <= n);
	/* cut short: more is needed */
	size_t cuts[3] = { 0, ref.head - 1, used - 1 };
	for (int k = 0; k < 3; k++) {
		struct control_reply tmp;
		size_t u;
		CHECK(control_reply_parse(p, cuts[k], &tmp, &u, &why) == 0);
	}
	/* written again, it reads the same */
	struct buf out;
	buf_init(&out, CONTROL_BODY_MAX + 64);
	CHECK((rep.more ? control_put_part(&out, rep.body)
			: control_put_reply(&out, rep.ok, rep.body)) == 0);
	struct control_reply again;
	size_t u2 = 0;
	CHECK(control_reply_parse(out.ptr, out.len, &again, &u2, &why) == 1);
	CHECK(u2 == out.len && again.ok == rep.ok && again.more == rep.more &&
	      again.body.len == rep.body.len);
	CHECK(rep.body.len == 0 || memcmp(again.body.ptr, rep.body.ptr, rep.body.len) == 0);
	buf_done(&out);
	*ret_used = used;
	*ret_more = true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *p = (const char *)data;
	/* as a stream of requests */
	size_t off = 0;
	bool more = true;
	while (more && off <= size) {
		size_t used = 0;
		check_request(p + off, size - off, &used, &more);
		off += used;
	}
	/* as a stream of replies */
	off = 0;
	more = true;
	while (more && off <= size) {
		size_t used = 0;
		check_reply(p + off, size - off, &used, &more);
		off += used;
	}
	/* any bytes as a password */
	check_auth_round_trip(str_make(p, size));
	/* any bytes as a reply body */
	struct buf out;
	buf_init(&out, size + 64);
	CHECK(control_put_reply(&out, size & 1, str_make(p, size)) == 0);
	struct control_reply rep;
	size_t used = 0;
	const char *why = NULL;
	CHECK(control_reply_parse(out.ptr, out.len, &rep, &used, &why) == 1);
	CHECK(used == out.len && rep.body.len == size && rep.ok == (size & 1));
	buf_done(&out);
	return 0;
}
