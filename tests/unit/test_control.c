/*
 * test_control -- unit tests of the control line protocol codec (src/proto/control.c).
 *
 * Requests and replies from tables (complete, partial, malformed), every prefix of a good
 * input (always "need more", never an error), the length limits at and past the boundary,
 * several messages in one buffer, and a reply written by control_put_reply() read back by
 * control_reply_parse().
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"
#include "control.h"
#include "control_cmds.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define LIT(s) s, sizeof(s) - 1

/* Words joined by '|' for comparison. */
static void join_words(const struct control_request *r, char *out, size_t outlen)
{
	size_t pos = 0;
	out[0] = '\0';
	for (size_t i = 0; i < r->argc; i++) {
		int w = snprintf(out + pos, outlen - pos, "%s%.*s", i ? "|" : "", (int)r->argv[i].len,
				 r->argv[i].ptr);
		assert_true(w >= 0 && (size_t)w < outlen - pos);
		pos += (size_t)w;
	}
}

/* ---- requests --------------------------------------------------------------------- */

static const struct {
	const char *in;
	size_t len;
	int result;
	const char *words; /* result 1: the words joined by '|' */
	size_t used;
	const char *why; /* result -EPROTO */
} request_cases[] = {
	{ LIT("ping\n"), 1, "ping", 5, NULL },
	{ LIT("stats milter\n"), 1, "stats|milter", 13, NULL },
	{ LIT("stats milter\r\n"), 1, "stats|milter", 14, NULL },
	{ LIT("  stats \t milter\t\n"), 1, "stats|milter", 18, NULL },
	{ LIT("reload\nping\n"), 1, "reload", 7, NULL },
	{ LIT("a\r\n\r\n"), 1, "a", 3, NULL },
	{ LIT("caf\xc3\xa9 \xff\n"), 1, "caf\xc3\xa9|\xff", 8, NULL },
	/* a CR inside the line is part of a word; only the one before LF is dropped */
	{ LIT("a\rb\r\n"), 1, "a\rb", 5, NULL },
	{ LIT("a \r\r\n"), 1, "a|\r", 5, NULL },
	/* partial */
	{ LIT(""), 0, NULL, 0, NULL },
	{ LIT("ping"), 0, NULL, 0, NULL },
	{ LIT("ping\r"), 0, NULL, 0, NULL },
	{ LIT("   "), 0, NULL, 0, NULL },
	/* a NUL before the line is complete is noticed only with the newline */
	{ LIT("pi\0ng"), 0, NULL, 0, NULL },
	/* malformed */
	{ LIT("\n"), -EPROTO, NULL, 0, "empty request" },
	{ LIT("\r\n"), -EPROTO, NULL, 0, "empty request" },
	{ LIT(" \t \r\n"), -EPROTO, NULL, 0, "empty request" },
	{ LIT("pi\0ng\n"), -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("\0\n"), -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("ping \0\r\n"), -EPROTO, NULL, 0, "NUL byte in request" },
	/* a NUL after the line does not matter */
	{ LIT("ping\n\0"), 1, "ping", 5, NULL },
};

/* CONTROL_MAX_ARGS words are accepted (with trailing blanks too), one more is not. */
static void test_request_max_words(void **state)
{
	(void)state;
	for (int extra = 0; extra <= 2; extra++) {
		char line[CONTROL_MAX_ARGS * 4 + 8];
		size_t n = 0;
		size_t words = CONTROL_MAX_ARGS + (extra == 2);
		for (size_t i = 0; i < words; i++)
			n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%zu", i ? " " : "", i);
		n += (size_t)snprintf(line + n, sizeof(line) - n, "%s\n", extra == 1 ? " \t" : "");
		struct control_request req;
		size_t used = 0;
		const char *why = NULL;
		int r = control_request_parse(line, n, &req, &used, &why);
		if (extra == 2) {
			assert_int_equal(r, -EPROTO);
			assert_string_equal(why, "too many words in request");
		} else {
			assert_int_equal(r, 1);
			assert_int_equal(req.argc, CONTROL_MAX_ARGS);
			assert_int_equal(used, n);
			char last[16];
			snprintf(last, sizeof(last), "%d", CONTROL_MAX_ARGS - 1);
			assert_true(str_eq_cstr(req.argv[CONTROL_MAX_ARGS - 1], last));
		}
	}
}

static void test_request_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(request_cases); i++) {
		/* exact-size copy: ASan sees reads past the end */
		char *in = malloc(request_cases[i].len ? request_cases[i].len : 1);
		assert_non_null(in);
		memcpy(in, request_cases[i].in, request_cases[i].len);
		struct control_request req;
		memset(&req, 0x5a, sizeof(req));
		size_t used = 12345;
		const char *why = NULL;
		int r = control_request_parse(in, request_cases[i].len, &req, &used, &why);
		if (r != request_cases[i].result)
			fail_msg("case %zu: returned %d, expected %d (%s)", i, r, request_cases[i].result,
				 why ? why : "");
		if (r == 1) {
			char words[512];
			join_words(&req, words, sizeof(words));
			assert_string_equal(words, request_cases[i].words);
			assert_int_equal(used, request_cases[i].used);
			for (size_t k = 0; k < req.argc; k++) {
				assert_true(req.argv[k].len > 0);
				assert_true(req.argv[k].ptr >= in &&
					    req.argv[k].ptr + req.argv[k].len <= in + used);
			}
		} else {
			/* out-parameters untouched */
			assert_int_equal(used, 12345);
			unsigned char fill[sizeof(req)];
			memset(fill, 0x5a, sizeof(fill));
			assert_memory_equal(&req, fill, sizeof(req));
			if (r < 0)
				assert_string_equal(why, request_cases[i].why);
		}
		free(in);
	}
}

/* Every proper prefix of a good request needs more bytes. */
static void test_request_prefixes(void **state)
{
	(void)state;
	static const char line[] = "stats  milter\tjson\r\n";
	for (size_t k = 0; k < sizeof(line) - 1; k++) {
		char *in = malloc(k ? k : 1);
		assert_non_null(in);
		memcpy(in, line, k);
		struct control_request req;
		size_t used;
		const char *why = NULL;
		assert_int_equal(control_request_parse(in, k, &req, &used, &why), 0);
		free(in);
	}
}

/* CONTROL_LINE_MAX bytes include the newline. */
static void test_request_line_length(void **state)
{
	(void)state;
	char *in = malloc(CONTROL_LINE_MAX + 2);
	assert_non_null(in);
	struct control_request req;
	size_t used = 0;
	const char *why = NULL;

	/* CONTROL_LINE_MAX - 1 bytes and the newline: accepted */
	memset(in, 'x', CONTROL_LINE_MAX + 2);
	in[CONTROL_LINE_MAX - 1] = '\n';
	assert_int_equal(control_request_parse(in, CONTROL_LINE_MAX, &req, &used, &why), 1);
	assert_int_equal(used, CONTROL_LINE_MAX);
	assert_int_equal(req.argc, 1);
	assert_int_equal(req.argv[0].len, CONTROL_LINE_MAX - 1);
	/* same line with more bytes after it */
	assert_int_equal(control_request_parse(in, CONTROL_LINE_MAX + 2, &req, &used, &why), 1);
	assert_int_equal(used, CONTROL_LINE_MAX);

	/* CONTROL_LINE_MAX - 1 bytes, no newline yet: wait */
	assert_int_equal(control_request_parse(in, CONTROL_LINE_MAX - 1, &req, &used, &why), 0);
	/* CONTROL_LINE_MAX bytes without a newline: too long */
	memset(in, 'x', CONTROL_LINE_MAX + 2);
	assert_int_equal(control_request_parse(in, CONTROL_LINE_MAX, &req, &used, &why), -EPROTO);
	assert_string_equal(why, "request line too long");
	/* the newline one byte too late */
	in[CONTROL_LINE_MAX] = '\n';
	why = NULL;
	assert_int_equal(control_request_parse(in, CONTROL_LINE_MAX + 1, &req, &used, &why), -EPROTO);
	assert_string_equal(why, "request line too long");
	free(in);
}

/* Several requests in one buffer, consumed one by one. */
static void test_request_pipeline(void **state)
{
	(void)state;
	static const char in[] = "ping\r\nstats milter\n  reload  \nshutdown";
	static const char *const expect[] = { "ping", "stats|milter", "reload" };
	size_t off = 0;
	for (size_t i = 0; i < ARRAY_SIZE(expect); i++) {
		struct control_request req;
		size_t used = 0;
		const char *why = NULL;
		assert_int_equal(control_request_parse(in + off, sizeof(in) - 1 - off, &req, &used, &why), 1);
		char words[128];
		join_words(&req, words, sizeof(words));
		assert_string_equal(words, expect[i]);
		off += used;
	}
	struct control_request req;
	size_t used = 0;
	const char *why = NULL;
	assert_int_equal(control_request_parse(in + off, sizeof(in) - 1 - off, &req, &used, &why), 0);
	assert_string_equal(in + off, "shutdown");
}

/* ---- replies ---------------------------------------------------------------------- */

static const struct {
	const char *in;
	size_t len;
	int result;
	bool ok;
	const char *body;
	size_t body_len;
	size_t used;
	const char *why;
} reply_cases[] = {
	{ LIT("ok 0\n"), 1, true, LIT(""), 5, NULL },
	{ LIT("ok 5\nhello"), 1, true, LIT("hello"), 10, NULL },
	{ LIT("ok 5\nhello world"), 1, true, LIT("hello"), 10, NULL },
	{ LIT("error 14\nunknown stats\n"), 1, false, LIT("unknown stats\n"), 23, NULL },
	{ LIT("ok 3\na\0b"), 1, true, LIT("a\0b"), 8, NULL },
	{ LIT("ok 2\n\n\n"), 1, true, LIT("\n\n"), 7, NULL },
	{ LIT("ok 007\nabcdefg"), 1, true, LIT("abcdefg"), 14, NULL },
	/* a part of a streamed reply (ok is true, more says so) */
	{ LIT("more 3\nabcok 0\n"), 1, true, LIT("abc"), 10, NULL },
	{ LIT("more 0\n"), 1, true, LIT(""), 7, NULL },
	{ LIT("more 3\nab"), 0, false, NULL, 0, 0, NULL },
	{ LIT("more\n"), -EPROTO, false, NULL, 0, 0, "reply header is not 'ok LEN', 'more LEN' or 'error LEN'" },
	{ LIT("more 16777217\n"), -EPROTO, false, NULL, 0, 0, "reply body too large" },
	/* partial */
	{ LIT(""), 0, false, NULL, 0, 0, NULL },
	{ LIT("ok"), 0, false, NULL, 0, 0, NULL },
	{ LIT("ok 5"), 0, false, NULL, 0, 0, NULL },
	{ LIT("ok 5\nhell"), 0, false, NULL, 0, 0, NULL },
	{ LIT("error 1\n"), 0, false, NULL, 0, 0, NULL },
	{ LIT("ok 16777216\n"), 0, false, NULL, 0, 0, NULL },
	/* the whole header must fit in 32 bytes */
	{ LIT("ok 0000000000000000000000000005"), 0, false, NULL, 0, 0, NULL },
	{ LIT("ok 00000000000000000000000000005"), -EPROTO, false, NULL, 0, 0, "reply header too long" },
	{ LIT("ok 00000000000000000000000000005\nhello"), -EPROTO, false, NULL, 0, 0,
	  "reply header too long" },
	{ LIT("ok 0000000000000000000000000005\nhello"), 1, true, LIT("hello"), 37, NULL },
	/* malformed */
	{ LIT("ok\n"), -EPROTO, false, NULL, 0, 0, "reply header is not 'ok LEN', 'more LEN' or 'error LEN'" },
	{ LIT("ok \n"), -EPROTO, false, NULL, 0, 0, "reply without length" },
	{ LIT("error \n"), -EPROTO, false, NULL, 0, 0, "reply without length" },
	{ LIT("OK 1\nx"), -EPROTO, false, NULL, 0, 0, "reply header is not 'ok LEN', 'more LEN' or 'error LEN'" },
	{ LIT("okay 1\nx"), -EPROTO, false, NULL, 0, 0, "reply header is not 'ok LEN', 'more LEN' or 'error LEN'" },
	{ LIT("\n"), -EPROTO, false, NULL, 0, 0, "reply header is not 'ok LEN', 'more LEN' or 'error LEN'" },
	{ LIT("ok  1\nx"), -EPROTO, false, NULL, 0, 0, "reply length is not a number" },
	{ LIT("ok 1 \nx"), -EPROTO, false, NULL, 0, 0, "reply length is not a number" },
	{ LIT("ok 1\r\nx"), -EPROTO, false, NULL, 0, 0, "reply length is not a number" },
	{ LIT("ok -1\n"), -EPROTO, false, NULL, 0, 0, "reply length is not a number" },
	{ LIT("ok 0x10\n"), -EPROTO, false, NULL, 0, 0, "reply length is not a number" },
	{ LIT("ok 16777217\n"), -EPROTO, false, NULL, 0, 0, "reply body too large" },
	{ LIT("ok 99999999999999999999999\n"), -EPROTO, false, NULL, 0, 0, "reply body too large" },
};

static void test_reply_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(reply_cases); i++) {
		char *in = malloc(reply_cases[i].len ? reply_cases[i].len : 1);
		assert_non_null(in);
		memcpy(in, reply_cases[i].in, reply_cases[i].len);
		struct control_reply rep;
		memset(&rep, 0x5a, sizeof(rep));
		size_t used = 12345;
		const char *why = NULL;
		int r = control_reply_parse(in, reply_cases[i].len, &rep, &used, &why);
		if (r != reply_cases[i].result)
			fail_msg("case %zu: returned %d, expected %d (%s)", i, r, reply_cases[i].result,
				 why ? why : "");
		if (r == 1) {
			assert_int_equal(rep.ok, reply_cases[i].ok);
			assert_int_equal(rep.more, memcmp(reply_cases[i].in, "more", 4) == 0);
			assert_int_equal(rep.body.len, reply_cases[i].body_len);
			assert_memory_equal(rep.body.ptr, reply_cases[i].body, rep.body.len);
			assert_int_equal(used, reply_cases[i].used);
			assert_ptr_equal(rep.body.ptr + rep.body.len, in + used);
		} else {
			assert_int_equal(used, 12345);
			unsigned char fill[sizeof(rep)];
			memset(fill, 0x5a, sizeof(fill));
			assert_memory_equal(&rep, fill, sizeof(rep));
			if (r < 0)
				assert_string_equal(why, reply_cases[i].why);
		}
		free(in);
	}
}

/* Every proper prefix of a reply needs more bytes. */
static void test_reply_prefixes(void **state)
{
	(void)state;
	static const char reply[] = "error 11\nhello\nworld";
	for (size_t k = 0; k < sizeof(reply) - 1; k++) {
		char *in = malloc(k ? k : 1);
		assert_non_null(in);
		memcpy(in, reply, k);
		struct control_reply rep;
		size_t used;
		const char *why = NULL;
		assert_int_equal(control_reply_parse(in, k, &rep, &used, &why), 0);
		free(in);
	}
}

/* The largest body: CONTROL_BODY_MAX bytes, and a reply announcing one byte more. */
static void test_reply_body_bounds(void **state)
{
	(void)state;
	struct buf out;
	buf_init(&out, CONTROL_BODY_MAX + 64);
	char *body = malloc(CONTROL_BODY_MAX + 1);
	assert_non_null(body);
	memset(body, 'j', CONTROL_BODY_MAX + 1);
	assert_int_equal(control_put_reply(&out, true, str_make(body, CONTROL_BODY_MAX)), 0);
	assert_int_equal(out.len, 12 + CONTROL_BODY_MAX);
	assert_memory_equal(out.ptr, "ok 16777216\n", 12);
	struct control_reply rep;
	size_t used = 0;
	const char *why = NULL;
	assert_int_equal(control_reply_parse(out.ptr, out.len, &rep, &used, &why), 1);
	assert_int_equal(rep.body.len, CONTROL_BODY_MAX);
	assert_int_equal(used, out.len);
	assert_int_equal(control_reply_parse(out.ptr, out.len - 1, &rep, &used, &why), 0);
	/* one byte more is refused by the writer, and by the reader */
	buf_reset(&out);
	assert_int_equal(control_put_reply(&out, true, str_make(body, CONTROL_BODY_MAX + 1)), -EINVAL);
	assert_int_equal(out.len, 0);
	free(body);
	buf_done(&out);
}

/* control_put_reply() output, read back. */
static void test_reply_round_trip(void **state)
{
	(void)state;
	static const struct {
		bool ok;
		const char *body;
		size_t len;
	} cases[] = {
		{ true, LIT("") },
		{ false, LIT("") },
		{ true, LIT("pong\n") },
		{ false, LIT("unknown command \"frob\"\n") },
		{ true, LIT("{\"milter\":{\"sessions_current\":0}}") },
		{ true, LIT("ok 5\nnested header inside the body\n") },
		{ true, LIT("\0\0\n\0binary\xff") },
	};
	struct buf out;
	buf_init(&out, 1 << 20);
	/* all replies back to back in one buffer */
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
		assert_int_equal(control_put_reply(&out, cases[i].ok, str_make(cases[i].body, cases[i].len)), 0);
	size_t off = 0;
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct control_reply rep;
		size_t used = 0;
		const char *why = NULL;
		assert_int_equal(control_reply_parse(out.ptr + off, out.len - off, &rep, &used, &why), 1);
		assert_int_equal(rep.ok, cases[i].ok);
		assert_int_equal(rep.body.len, cases[i].len);
		assert_memory_equal(rep.body.ptr, cases[i].body, cases[i].len);
		off += used;
	}
	assert_int_equal(off, out.len);
	/* a streamed reply: parts, then the frame that ends it */
	buf_reset(&out);
	assert_int_equal(control_put_part(&out, str_cstr("one\n")), 0);
	assert_int_equal(control_put_part(&out, str_cstr("two\n")), 0);
	assert_int_equal(control_put_reply(&out, true, str_cstr("-- 2\n")), 0);
	static const char *const parts[] = { "one\n", "two\n", "-- 2\n" };
	off = 0;
	for (size_t i = 0; i < ARRAY_SIZE(parts); i++) {
		struct control_reply rep;
		size_t used = 0;
		const char *why = NULL;
		assert_int_equal(control_reply_parse(out.ptr + off, out.len - off, &rep, &used, &why), 1);
		assert_true(rep.ok);
		assert_int_equal(rep.more, i < 2);
		assert_int_equal(rep.body.len, strlen(parts[i]));
		assert_memory_equal(rep.body.ptr, parts[i], rep.body.len);
		off += used;
	}
	assert_int_equal(off, out.len);
	/* a writer whose buffer is too small fails */
	struct buf tiny;
	buf_init(&tiny, 4);
	assert_true(control_put_reply(&tiny, true, str_cstr("x")) < 0);
	buf_done(&tiny);
	buf_done(&out);
}

/* A request line and a reply header for each word count and each length parse back. */
static void test_request_round_trip(void **state)
{
	(void)state;
	for (size_t nwords = 1; nwords <= CONTROL_MAX_ARGS; nwords++) {
		struct buf line;
		buf_init(&line, CONTROL_LINE_MAX);
		for (size_t i = 0; i < nwords; i++)
			assert_int_equal(buf_printf(&line, "%sw%zu", i ? (i % 2 ? " " : "\t") : "", i), 0);
		assert_int_equal(buf_append(&line, "\r\n", 2), 0);
		struct control_request req;
		size_t used = 0;
		const char *why = NULL;
		assert_int_equal(control_request_parse(line.ptr, line.len, &req, &used, &why), 1);
		assert_int_equal(req.argc, nwords);
		assert_int_equal(used, line.len);
		for (size_t i = 0; i < nwords; i++) {
			char w[16];
			snprintf(w, sizeof(w), "w%zu", i);
			assert_true(str_eq_cstr(req.argv[i], w));
		}
		buf_done(&line);
	}
}

/* auth: the password %XX-encoded into one word, and read back; the malformed ones. */
static void test_auth(void **state)
{
	(void)state;
	static const struct {
		const char *line;
		int r;              /* control_auth_parse() */
		const char *secret; /* decoded, when r == 1 */
		size_t len;
	} cases[] = {
		{ "auth s3cret\n", 1, "s3cret", 6 },
		{ "auth a%20b%25c\n", 1, "a b%c", 5 },
		{ "auth %00%0a%FF\r\n", 1, "\0\n\xff", 3 },
		{ "auth %41%4a%4A\n", 1, "AJJ", 3 },
		{ "auth a b\n", -EPROTO, NULL, 0 },
		{ "auth\n", -EPROTO, NULL, 0 },
		{ "auth %zz\n", -EPROTO, NULL, 0 },
		{ "auth %4\n", -EPROTO, NULL, 0 },
		{ "auth x%\n", -EPROTO, NULL, 0 },
		{ "status\n", 0, NULL, 0 },
		{ "Auth x\n", 0, NULL, 0 },
		{ "authx y\n", 0, NULL, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct control_request req;
		size_t used, len = 0;
		const char *why = NULL;
		char secret[CONTROL_SECRET_MAX];
		const char *line = cases[i].line;
		assert_int_equal(control_request_parse(line, strlen(line), &req, &used, &why), 1);
		int r = control_auth_parse(&req, secret, &len, &why);
		if (r != cases[i].r)
			fail_msg("\"%s\": %d, expected %d", line, r, cases[i].r);
		if (r < 0)
			assert_true(why && *why);
		if (r == 1) {
			assert_int_equal(len, cases[i].len);
			assert_memory_equal(secret, cases[i].secret, len);
		}
	}
	/* written: spaces, '%', controls and 8-bit bytes as %XX; the rest as they are */
	struct buf b;
	buf_init(&b, CONTROL_LINE_MAX);
	assert_int_equal(control_put_auth(&b, str_make("a b%\t\xe9~\0", 8)), 0);
	assert_int_equal(b.len, strlen("auth a%20b%25%09%E9~%00\n"));
	assert_memory_equal(b.ptr, "auth a%20b%25%09%E9~%00\n", b.len);
	buf_reset(&b);
	assert_int_equal(control_put_auth(&b, str_make("", 0)), -EINVAL);
	assert_int_equal(b.len, 0);
	/* the longest password, every byte encoded, fits a line and reads back */
	static char big[CONTROL_SECRET_MAX + 1];
	memset(big, ' ', sizeof(big));
	assert_int_equal(control_put_auth(&b, str_make(big, sizeof(big))), -EINVAL);
	assert_int_equal(control_put_auth(&b, str_make(big, CONTROL_SECRET_MAX)), 0);
	struct control_request req;
	size_t used, len = 0;
	const char *why = NULL;
	assert_int_equal(control_request_parse(b.ptr, b.len, &req, &used, &why), 1);
	static char back[CONTROL_SECRET_MAX];
	assert_int_equal(control_auth_parse(&req, back, &len, &why), 1);
	assert_int_equal(len, CONTROL_SECRET_MAX);
	assert_memory_equal(back, big, len);
	/* one byte more, as the peer may send it: refused */
	buf_truncate(&b, b.len - 1);
	assert_int_equal(buf_append_cstr(&b, "x\n"), 0);
	assert_int_equal(control_request_parse(b.ptr, b.len, &req, &used, &why), 1);
	assert_int_equal(control_auth_parse(&req, back, &len, &why), -EPROTO);
	assert_string_equal(why, "password too long");
	buf_done(&b);
}

/*
 * The form of a request, by position (refused to readers when it changes state): the
 * words of the form decide, never an argument that happens to be a verb.
 */
static void test_cmds_match(void **state)
{
	(void)state;
	enum { READ = 0, CHANGE, NONE };
	static const struct {
		const char *line;
		int want;        /* READ, CHANGE, or NONE (no form: -ENOENT) */
		const char *sub; /* the matched row's sub, NULL for a row without */
	} cases[] = {
		{ "reload", CHANGE, NULL },
		{ "reload --json", CHANGE, NULL },
		{ "status", READ, NULL },
		{ "status --json", READ, NULL },
		{ "stats", READ, NULL },
		{ "stats --json", READ, NULL },
		{ "stats --reset", CHANGE, "--reset" },
		{ "stats --json --reset", CHANGE, "--reset" },
		{ "stats json --reset", CHANGE, "--reset" },
		{ "stats --reset --json", CHANGE, "--reset" },
		{ "decisions", READ, NULL },
		{ "top", READ, NULL },
		{ "limits top", READ, "top" },
		{ "limits top set", READ, "top" },       /* a rule named "set" */
		{ "limits show 10.0.0.1", READ, "show" },
		{ "limits show set", READ, "show" },     /* a key named like a verb */
		{ "limits show reset unset", READ, "show" },
		{ "limits --json show reset", READ, "show" },
		{ "limits overrides", READ, "overrides" },
		{ "limits reset 10.0.0.1", CHANGE, "reset" },
		{ "limits reset show", CHANGE, "reset" },
		{ "limits --json reset 10.0.0.1", CHANGE, "reset" },
		{ "limits set r k 10/1m", CHANGE, "set" },
		{ "limits set r k 10/1m --for 1h", CHANGE, "set" },
		{ "limits unset r k", CHANGE, "unset" },
		{ "limits", NONE, NULL },
		{ "limits --json", NONE, NULL },
		{ "limits nonsense", NONE, NULL },
		{ "limits Reset k", NONE, NULL },        /* words are matched exactly */
		{ "test client_ip=1.2.3.4", READ, NULL },
		{ "queue", READ, "list" },
		{ "queue --json", READ, "list" },
		{ "queue list domain=example.org", READ, "list" },
		{ "queue domain=example.org", READ, "list" },
		{ "queue 0123456789abcdef", READ, "list" },
		{ "queue list delete", READ, "list" },   /* an ID that is a verb: a listing */
		{ "queue show 0123456789abcdef", READ, "show" },
		{ "queue summary", READ, "summary" },
		{ "queue summary by=sender flush", READ, "summary" },
		{ "queue hold ids=1", CHANGE, "hold|release|delete|flush|bounce" },
		{ "queue json delete --all", CHANGE, "hold|release|delete|flush|bounce" },
		{ "queue --json flush --all", CHANGE, "hold|release|delete|flush|bounce" },
		{ "queue bounce state=deferred", CHANGE, "hold|release|delete|flush|bounce" },
		{ "lanes", READ, NULL },
		{ "lanes --json", READ, NULL },
		{ "lanes smarthost", READ, NULL },       /* the handler's usage error */
		{ "lanes suspend smarthost", CHANGE, "suspend" },
		{ "lanes --json resume smarthost", CHANGE, "resume" },
		{ "help", READ, NULL },
		{ "unknown", NONE, NULL },
		{ "sendmail", NONE, NULL },              /* run by sluice, not sent */
		{ "qmail-remote h s r", NONE, NULL },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct control_request req;
		size_t used;
		const char *why;
		char line[128];
		snprintf(line, sizeof(line), "%s\n", cases[i].line);
		assert_int_equal(control_request_parse(line, strlen(line), &req, &used, &why), 1);
		const struct control_cmd *c = NULL;
		int r = control_cmd_match(req.argc, req.argv, &c);
		if (cases[i].want == NONE) {
			if (r != -ENOENT)
				fail_msg("\"%s\": matched a form", cases[i].line);
			continue;
		}
		if (r != 0)
			fail_msg("\"%s\": no form", cases[i].line);
		assert_true(str_eq_cstr(req.argv[0], c->name));
		bool changes = c->flags & CONTROL_CMD_CHANGES;
		if (changes != (cases[i].want == CHANGE))
			fail_msg("\"%s\": expected %s", cases[i].line,
				 cases[i].want == CHANGE ? "a change" : "no change");
		if (!!c->sub != !!cases[i].sub || (c->sub && strcmp(c->sub, cases[i].sub) != 0))
			fail_msg("\"%s\": matched \"%s %s\"", cases[i].line, c->name,
				 c->sub ? c->sub : "");
	}
	/* no words: no form */
	const struct control_cmd *c = NULL;
	assert_int_equal(control_cmd_match(0, NULL, &c), -ENOENT);
	assert_null(c);
}

/* Every form the table holds is matched by its own words, as itself. */
static void test_cmds_match_every_row(void **state)
{
	(void)state;
	for (size_t i = 0; i < control_ncmds; i++) {
		const struct control_cmd *row = &control_cmds[i];
		if (row->flags & CONTROL_CMD_LOCAL)
			continue;
		for (const char *p = row->sub ? row->sub : ""; ; ) {
			size_t n = strcspn(p, "|");
			struct str argv[2] = { str_cstr(row->name), str_make(p, n) };
			const struct control_cmd *c = NULL;
			assert_int_equal(control_cmd_match(n ? 2 : 1, argv, &c), 0);
			if (c != row)
				fail_msg("\"%s %.*s\" matched another row", row->name, (int)n, p);
			if (!p[n])
				break;
			p += n + 1;
		}
	}
}

/* Every row has a name, help, and words the help can show; the daemon's commands are
 * known and the local ones are not. */
static void test_cmds_table(void **state)
{
	(void)state;
	assert_true(control_ncmds > 10);
	for (size_t i = 0; i < control_ncmds; i++) {
		const struct control_cmd *c = &control_cmds[i];
		assert_non_null(c->name);
		assert_non_null(c->args);
		assert_true(c->help && *c->help);
		assert_true(control_cmd_known(str_cstr(c->name)) != !!(c->flags & CONTROL_CMD_LOCAL));
	}
	assert_false(control_cmd_known(str_cstr("nonsense")));
	struct buf b;
	buf_init(&b, 1 << 20);
	assert_int_equal(control_cmds_help(&b, false), 0);
	assert_non_null(memmem(b.ptr, b.len, "  queue hold|release|delete|flush|bounce ", 41));
	assert_null(memmem(b.ptr, b.len, "sendmail", 8));
	buf_reset(&b);
	assert_int_equal(control_cmds_help(&b, true), 0);
	assert_non_null(memmem(b.ptr, b.len, "\n  sendmail ", 12));
	buf_done(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_request_table),
		cmocka_unit_test(test_request_max_words),
		cmocka_unit_test(test_request_prefixes),
		cmocka_unit_test(test_request_line_length),
		cmocka_unit_test(test_request_pipeline),
		cmocka_unit_test(test_request_round_trip),
		cmocka_unit_test(test_reply_table),
		cmocka_unit_test(test_reply_prefixes),
		cmocka_unit_test(test_reply_body_bounds),
		cmocka_unit_test(test_reply_round_trip),
		cmocka_unit_test(test_auth),
		cmocka_unit_test(test_cmds_match),
		cmocka_unit_test(test_cmds_match_every_row),
		cmocka_unit_test(test_cmds_table),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
