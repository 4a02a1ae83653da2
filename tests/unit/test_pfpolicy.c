/*
 * test_pfpolicy -- unit tests of the Postfix policy delegation codec (src/proto/pfpolicy.c).
 *
 * Requests from a table (good, incomplete, malformed), each read three ways that must agree:
 * in one call, one byte at a time from a buffer that moves on every call, and cut in two
 * at every position.  A full Postfix 3.8 request with every attribute of
 * MILTER-PROTOCOL.md 7.3, several requests back to back delivered in chunks of every
 * size, the byte and attribute limits at and past the boundary, errors that stay put when
 * more bytes arrive, and pfpolicy_put_action() good and bad, read back by the parser.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"
#include "pfpolicy.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define LIT(s) s, sizeof(s) - 1
#define MAX 4096
#define ALL INT_MAX /* in a table: the length of the whole input */

/* The request as "name=value\n" lines, in attribute order, into out. */
static void flatten(const struct pfpolicy_request *r, struct buf *out)
{
	buf_reset(out);
	for (size_t i = 0; i < r->n; i++) {
		assert_int_equal(buf_append_str(out, r->attr[i].name), 0);
		assert_int_equal(buf_append_byte(out, '='), 0);
		assert_int_equal(buf_append_str(out, r->attr[i].value), 0);
		assert_int_equal(buf_append_byte(out, '\n'), 0);
	}
}

/* Every slice lies inside in[0..used) and every name is valid. */
static void check_slices(const struct pfpolicy_request *r, const char *in, size_t used)
{
	assert_true(r->n >= 1 && r->n <= PFPOLICY_MAX_ATTRS);
	for (size_t i = 0; i < r->n; i++) {
		struct str nm = r->attr[i].name, v = r->attr[i].value;
		assert_true(nm.len >= 1 && nm.len <= PFPOLICY_MAX_NAME);
		assert_true(nm.ptr >= in && nm.ptr + nm.len < in + used);
		assert_true(nm.ptr[nm.len] == '=');
		assert_ptr_equal(v.ptr, nm.ptr + nm.len + 1);
		assert_true(v.ptr + v.len < in + used);
		assert_null(memchr(v.ptr, '\n', v.len));
		assert_null(memchr(v.ptr, '\0', v.len));
		for (size_t k = 0; k < nm.len; k++)
			assert_non_null(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
					       "0123456789_-",
					       nm.ptr[k]));
		for (size_t j = 0; j < i; j++)
			assert_false(str_eq(nm, r->attr[j].name));
	}
}

/* What one way of reading gave. */
struct outcome {
	int result;
	const char *why;
	struct buf flat; /* result > 0: flatten() of the request */
};

static void outcome_init(struct outcome *o)
{
	o->result = 12345;
	o->why = NULL;
	buf_init(&o->flat, 1 << 20);
}

static void outcome_set(struct outcome *o, int r, const char *why,
			const struct pfpolicy_request *req, const char *in)
{
	o->result = r;
	o->why = r < 0 ? why : NULL;
	if (r > 0) {
		check_slices(req, in, (size_t)r);
		flatten(req, &o->flat);
	}
}

/* One call over an exact-size copy. */
static void read_whole(const char *text, size_t len, size_t max, struct outcome *o)
{
	char *in = malloc(len ? len : 1);
	assert_non_null(in);
	memcpy(in, text, len);
	struct pfpolicy_parser st;
	pfpolicy_parser_reset(&st);
	static struct pfpolicy_request req;
	memset(&req, 0x5a, sizeof(req));
	const char *why = NULL;
	int r = pfpolicy_parse(&st, in, len, max, &req, &why);
	if (r <= 0) {
		/* *ret untouched */
		static unsigned char fill[sizeof(req)];
		memset(fill, 0x5a, sizeof(fill));
		assert_memory_equal(&req, fill, sizeof(req));
		if (r == 0)
			assert_int_equal(st.scanned, len < max ? len : max);
	} else {
		/* the parser is ready for the next request */
		assert_int_equal(st.scanned, 0);
	}
	outcome_set(o, r, why, &req, in);
	free(in);
}

/* One byte more per call, each time in a fresh exact-size buffer (so the bytes move). */
static void read_bytewise(const char *text, size_t len, size_t max, struct outcome *o)
{
	struct pfpolicy_parser st;
	pfpolicy_parser_reset(&st);
	static struct pfpolicy_request req;
	for (size_t k = 0; k <= len; k++) {
		char *in = malloc(k ? k : 1);
		assert_non_null(in);
		memcpy(in, text, k);
		const char *why = NULL;
		int r = pfpolicy_parse(&st, in, k, max, &req, &why);
		if (r != 0 || k == len) {
			outcome_set(o, r, why, &req, in);
			free(in);
			return;
		}
		/* nothing before st.scanned is looked at again: it reaches what was given */
		assert_int_equal(st.scanned, k);
		free(in);
	}
}

/* First k bytes, then all of them; the first call may already decide. */
static void read_split(const char *text, size_t len, size_t max, size_t k, struct outcome *o)
{
	char *in = malloc(len ? len : 1);
	assert_non_null(in);
	memcpy(in, text, len);
	struct pfpolicy_parser st;
	pfpolicy_parser_reset(&st);
	static struct pfpolicy_request req;
	const char *why = NULL;
	int r = pfpolicy_parse(&st, in, k, max, &req, &why);
	if (r == 0)
		r = pfpolicy_parse(&st, in, len, max, &req, &why);
	outcome_set(o, r, why, &req, in);
	free(in);
}

static void assert_same(const struct outcome *a, const struct outcome *b, const char *what,
			size_t ci)
{
	if (a->result != b->result)
		fail_msg("case %zu: %s returned %d, expected %d", ci, what, b->result, a->result);
	if (a->result < 0)
		assert_string_equal(a->why, b->why);
	if (a->result > 0) {
		assert_int_equal(a->flat.len, b->flat.len);
		assert_memory_equal(a->flat.ptr, b->flat.ptr, a->flat.len);
	}
}

/* Read text all three ways, check they agree, and return the whole-buffer outcome. */
static void read_all_ways(const char *text, size_t len, size_t max, struct outcome *whole,
			  size_t ci)
{
	read_whole(text, len, max, whole);
	struct outcome o;
	outcome_init(&o);
	read_bytewise(text, len, max, &o);
	assert_same(whole, &o, "byte by byte", ci);
	for (size_t k = 0; k <= len; k++) {
		read_split(text, len, max, k, &o);
		assert_same(whole, &o, "split", ci);
	}
	buf_done(&o.flat);
}

/* ---- table ------------------------------------------------------------------------- */

#define A(s) s, sizeof(s) - 1 /* expected flattening */

static const struct {
	const char *in;
	size_t len;
	size_t max;
	int result;
	const char *flat;
	size_t flat_len;
	const char *why;
} cases[] = {
	/* good */
	{ LIT("a=b\n\n"), MAX, ALL, A("a=b\n"), NULL },
	{ LIT("request=smtpd_access_policy\nprotocol_state=RCPT\n\n"), MAX, ALL,
	  A("request=smtpd_access_policy\nprotocol_state=RCPT\n"), NULL },
	/* empty values are data */
	{ LIT("queue_id=\nsender=\n\n"), MAX, ALL, A("queue_id=\nsender=\n"), NULL },
	/* 8-bit values, kept byte for byte */
	{ LIT("sender=j\xc3\xb6rg@b\xfc" "cher.example\nx=\x80\xff\xfe\n\n"), MAX, ALL,
	  A("sender=j\xc3\xb6rg@b\xfc" "cher.example\nx=\x80\xff\xfe\n"), NULL },
	/* '=' and spaces inside a value; nothing trimmed */
	{ LIT("ccert_subject=CN=mx,O=Ex=ample\nhelo_name=  a b\t\n\n"), MAX, ALL,
	  A("ccert_subject=CN=mx,O=Ex=ample\nhelo_name=  a b\t\n"), NULL },
	{ LIT("a==\n\n"), MAX, ALL, A("a==\n"), NULL },
	/* every name character, and the longest name */
	{ LIT("Az09_-=x\n\n"), MAX, ALL, A("Az09_-=x\n"), NULL },
	{ LIT("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa=1\n\n"), MAX, ALL,
	  A("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa=1\n"), NULL },
	/* a repeated attribute: last value, first place, counted once */
	{ LIT("a=1\nb=2\na=3\n\n"), MAX, ALL, A("a=3\nb=2\n"), NULL },
	{ LIT("a=1\na=\n\n"), MAX, ALL, A("a=\n"), NULL },
	{ LIT("a=\na=x\na=y\n\n"), MAX, ALL, A("a=y\n"), NULL },
	/* names are case-sensitive */
	{ LIT("a=1\nA=2\n\n"), MAX, ALL, A("a=1\nA=2\n"), NULL },
	/* names sharing a prefix are different names */
	{ LIT("size=1\nsize_x=2\nsiz=3\n\n"), MAX, ALL, A("size=1\nsize_x=2\nsiz=3\n"), NULL },
	/* one CR before LF is part of the line end; any other CR is data */
	{ LIT("a=b\r\n\r\n"), MAX, ALL, A("a=b\n"), NULL },
	{ LIT("a=b\r\n\n"), MAX, ALL, A("a=b\n"), NULL },
	{ LIT("a=b\n\r\n"), MAX, ALL, A("a=b\n"), NULL },
	{ LIT("a=\r\n\n"), MAX, ALL, A("a=\n"), NULL },
	{ LIT("a=b\r\r\n\n"), MAX, ALL, A("a=b\r\n"), NULL },
	{ LIT("a=\rb\rc\n\n"), MAX, ALL, A("a=\rb\rc\n"), NULL },
	/* only the first request counts; what follows does not matter yet */
	{ LIT("a=b\n\nc=d\n\n"), MAX, 5, A("a=b\n"), NULL },
	{ LIT("a=b\n\n\0\n"), MAX, 5, A("a=b\n"), NULL },
	{ LIT("a=b\n\n=\n"), MAX, 5, A("a=b\n"), NULL },
	/* incomplete */
	{ LIT(""), MAX, 0, NULL, 0, NULL },
	{ LIT("a"), MAX, 0, NULL, 0, NULL },
	{ LIT("a="), MAX, 0, NULL, 0, NULL },
	{ LIT("a=b"), MAX, 0, NULL, 0, NULL },
	{ LIT("a=b\n"), MAX, 0, NULL, 0, NULL },
	{ LIT("a=b\r"), MAX, 0, NULL, 0, NULL },
	{ LIT("a=b\n\r"), MAX, 0, NULL, 0, NULL },
	{ LIT("\r"), MAX, 0, NULL, 0, NULL },
	{ LIT("a=b\nc"), MAX, 0, NULL, 0, NULL },
	/* malformed */
	{ LIT("\n"), MAX, -EPROTO, NULL, 0, "empty request" },
	{ LIT("\r\n"), MAX, -EPROTO, NULL, 0, "empty request" },
	{ LIT("\na=b\n\n"), MAX, -EPROTO, NULL, 0, "empty request" },
	{ LIT("=b\n\n"), MAX, -EPROTO, NULL, 0, "empty attribute name" },
	{ LIT("a=b\n=c\n\n"), MAX, -EPROTO, NULL, 0, "empty attribute name" },
	{ LIT("a b=c\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT(" a=c\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("a.b=c\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("a:b=c\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("\xc3\xa9=c\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("a\rb=c\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("a\r=c\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("\rx=1\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("a=b\n\r=c\n\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("\r\r\n"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	/* a bad name is reported at once, before its line is complete */
	{ LIT("a b"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("\rx"), MAX, -EPROTO, NULL, 0, "bad character in attribute name" },
	{ LIT("foo\n"), MAX, -EPROTO, NULL, 0, "line without '='" },
	{ LIT("a=b\nfoo\n\n"), MAX, -EPROTO, NULL, 0, "line without '='" },
	{ LIT("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa=1\n\n"), MAX,
	  -EPROTO, NULL, 0, "attribute name too long" },
	{ LIT("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), MAX, -EPROTO,
	  NULL, 0, "attribute name too long" },
	/* a NUL anywhere, noticed as soon as it arrives */
	{ LIT("\0"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("a\0=b\n\n"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("a=\0\n\n"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("a=b\0c\n\n"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("a=b\0"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("a=b\r\0\n\n"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("a=b\n\0"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("a=b\n\r\0"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("\r\0"), MAX, -EPROTO, NULL, 0, "NUL byte in request" },
	/* the byte limit, counted through the empty line */
	{ LIT("a=b\n\n"), 5, ALL, A("a=b\n"), NULL },
	{ LIT("a=b\n\n"), 4, -EMSGSIZE, NULL, 0, "request too long" },
	{ LIT("a=b\r\n\r\n"), 6, -EMSGSIZE, NULL, 0, "request too long" },
	{ LIT("a=b\n"), 4, -EMSGSIZE, NULL, 0, "request too long" },
	{ LIT("a=b\n"), 5, 0, NULL, 0, NULL },
	{ LIT(""), 0, -EMSGSIZE, NULL, 0, "request too long" },
	{ LIT("a=b\n\n"), 0, -EMSGSIZE, NULL, 0, "request too long" },
	/* a bad byte past max is never looked at; one before it is */
	{ LIT("a=bc\0\n\n"), 4, -EMSGSIZE, NULL, 0, "request too long" },
	{ LIT("a=b\0c\n\n"), 4, -EPROTO, NULL, 0, "NUL byte in request" },
	{ LIT("\n"), 1, -EPROTO, NULL, 0, "empty request" },
};

static void test_table(void **state)
{
	(void)state;
	struct outcome whole;
	outcome_init(&whole);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		read_all_ways(cases[i].in, cases[i].len, cases[i].max, &whole, i);
		int want = cases[i].result == ALL ? (int)cases[i].len : cases[i].result;
		if (whole.result != want)
			fail_msg("case %zu: returned %d, expected %d (%s)", i, whole.result, want,
				 whole.why ? whole.why : "");
		if (whole.result < 0)
			assert_string_equal(whole.why, cases[i].why);
		if (whole.result > 0) {
			if (whole.flat.len != cases[i].flat_len ||
			    memcmp(whole.flat.ptr, cases[i].flat, cases[i].flat_len) != 0)
				fail_msg("case %zu: read \"%.*s\"", i, (int)whole.flat.len, whole.flat.ptr);
		}
	}
	buf_done(&whole.flat);
}

/* ---- a real Postfix request ---------------------------------------------------------- */

/* Postfix 3.8+ smtpd, at RCPT, over TLS: every attribute of MILTER-PROTOCOL.md 7.3, in the
 * order smtpd_check.c sends them. */
static const char *const postfix_rcpt[][2] = {
	{ "request", "smtpd_access_policy" },
	{ "protocol_state", "RCPT" },
	{ "protocol_name", "ESMTP" },
	{ "helo_name", "mail.example.net" },
	{ "queue_id", "" },
	{ "sender", "alice@example.net" },
	{ "recipient", "bob@example.org" },
	{ "recipient_count", "0" },
	{ "client_address", "2001:db8::25" },
	{ "client_name", "mail.example.net" },
	{ "reverse_client_name", "mail.example.net" },
	{ "instance", "2b4e1.6650f3a2.8c7d1.0" },
	{ "sasl_method", "" },
	{ "sasl_username", "" },
	{ "sasl_sender", "" },
	{ "size", "48213" },
	{ "ccert_subject", "" },
	{ "ccert_issuer", "" },
	{ "ccert_fingerprint", "" },
	{ "encryption_protocol", "TLSv1.3" },
	{ "encryption_cipher", "TLS_AES_256_GCM_SHA384" },
	{ "encryption_keysize", "256" },
	{ "etrn_domain", "" },
	{ "stress", "" },
	{ "ccert_pubkey_fingerprint", "" },
	{ "client_port", "52344" },
	{ "policy_context", "" },
	{ "server_address", "2001:db8::1" },
	{ "server_port", "25" },
	{ "compatibility_level", "3.6" },
	{ "mail_version", "3.8.6" },
	{ "tls_sni", "mx.example.org" },
};

static void build_request(struct buf *b, const char *const (*attrs)[2], size_t n)
{
	for (size_t i = 0; i < n; i++)
		assert_int_equal(buf_printf(b, "%s=%s\n", attrs[i][0], attrs[i][1]), 0);
	assert_int_equal(buf_append_byte(b, '\n'), 0);
}

static void test_real_request(void **state)
{
	(void)state;
	struct buf in;
	buf_init(&in, 1 << 16);
	build_request(&in, postfix_rcpt, ARRAY_SIZE(postfix_rcpt));

	struct pfpolicy_parser st;
	pfpolicy_parser_reset(&st);
	static struct pfpolicy_request req;
	const char *why = NULL;
	int r = pfpolicy_parse(&st, in.ptr, in.len, 8192, &req, &why);
	assert_int_equal(r, (int)in.len);
	assert_int_equal(req.n, ARRAY_SIZE(postfix_rcpt));
	check_slices(&req, in.ptr, in.len);
	for (size_t i = 0; i < ARRAY_SIZE(postfix_rcpt); i++) {
		assert_true(str_eq_cstr(req.attr[i].name, postfix_rcpt[i][0]));
		assert_true(str_eq_cstr(req.attr[i].value, postfix_rcpt[i][1]));
		struct str v = pfpolicy_get(&req, postfix_rcpt[i][0]);
		assert_non_null(v.ptr); /* present, even when empty */
		assert_true(str_eq_cstr(v, postfix_rcpt[i][1]));
	}
	assert_null(pfpolicy_get(&req, "client_helo").ptr);
	assert_null(pfpolicy_get(&req, "Request").ptr);
	assert_null(pfpolicy_get(&req, "").ptr);
	assert_null(pfpolicy_get(&req, NULL).ptr);

	/* the same request cut at every position, byte by byte, and bounded at 8192 bytes */
	struct outcome whole;
	outcome_init(&whole);
	read_all_ways(in.ptr, in.len, 8192, &whole, 0);
	assert_int_equal(whole.result, (int)in.len);
	assert_int_equal(whole.flat.len, in.len - 1);
	assert_memory_equal(whole.flat.ptr, in.ptr, in.len - 1);
	buf_done(&whole.flat);
	buf_done(&in);
}

/* ---- several requests on one connection ------------------------------------------------ */

static const char *const postfix_connect[][2] = {
	{ "request", "smtpd_access_policy" }, { "protocol_state", "CONNECT" },
	{ "protocol_name", "SMTP" },	      { "helo_name", "" },
	{ "queue_id", "" },		      { "client_address", "192.0.2.7" },
	{ "client_name", "unknown" },	      { "reverse_client_name", "unknown" },
	{ "instance", "" },		      { "client_port", "40022" },
};

static const char *const postfix_eom[][2] = {
	{ "request", "smtpd_access_policy" },
	{ "protocol_state", "END-OF-MESSAGE" },
	{ "protocol_name", "ESMTP" },
	{ "helo_name", "[192.0.2.7]" },
	{ "queue_id", "4VQm2k0Z3Cz9tP" },
	{ "sender", "" },
	{ "recipient", "postmaster@example.org" },
	{ "recipient_count", "1" },
	{ "client_address", "192.0.2.7" },
	{ "size", "1812" },
	{ "sasl_username", "j\xc3\xb6rg" },
};

static void test_pipeline(void **state)
{
	(void)state;
	struct buf in;
	buf_init(&in, 1 << 16);
	build_request(&in, postfix_connect, ARRAY_SIZE(postfix_connect));
	size_t first = in.len;
	build_request(&in, postfix_rcpt, ARRAY_SIZE(postfix_rcpt));
	size_t second = in.len;
	build_request(&in, postfix_eom, ARRAY_SIZE(postfix_eom));
	size_t third = in.len;
	assert_int_equal(buf_append_cstr(&in, "request=smtpd_access_policy\nprotocol_st"), 0);
	const size_t ends[] = { first, second, third };
	const size_t counts[] = { ARRAY_SIZE(postfix_connect), ARRAY_SIZE(postfix_rcpt),
				  ARRAY_SIZE(postfix_eom) };

	/* all at once: one parser, the window moved on after each request */
	struct pfpolicy_parser st;
	pfpolicy_parser_reset(&st);
	static struct pfpolicy_request req;
	const char *why = NULL;
	size_t off = 0;
	for (size_t i = 0; i < 3; i++) {
		int r = pfpolicy_parse(&st, in.ptr + off, in.len - off, 8192, &req, &why);
		assert_int_equal(r, (int)(ends[i] - off));
		assert_int_equal(req.n, counts[i]);
		check_slices(&req, in.ptr + off, (size_t)r);
		off += (size_t)r;
	}
	assert_true(str_eq_cstr(pfpolicy_get(&req, "protocol_state"), "END-OF-MESSAGE"));
	assert_true(str_eq_cstr(pfpolicy_get(&req, "sasl_username"), "j\xc3\xb6rg"));
	assert_int_equal(pfpolicy_parse(&st, in.ptr + off, in.len - off, 8192, &req, &why), 0);

	/* as a connection sees it: chunks of every size, consumed bytes dropped */
	for (size_t chunk = 1; chunk <= in.len; chunk++) {
		pfpolicy_parser_reset(&st);
		size_t start = 0, got = 0, seen = 0;
		while (got < in.len) {
			got = got + chunk < in.len ? got + chunk : in.len;
			for (;;) {
				/* a fresh copy of the window, as after a compacting read */
				size_t n = got - start;
				char *win = malloc(n ? n : 1);
				assert_non_null(win);
				memcpy(win, in.ptr + start, n);
				int r = pfpolicy_parse(&st, win, n, 8192, &req, &why);
				assert_true(r >= 0);
				if (r > 0) {
					assert_true(seen < 3);
					assert_int_equal(start + (size_t)r, ends[seen]);
					assert_int_equal(req.n, counts[seen]);
					check_slices(&req, win, (size_t)r);
					seen++;
					start += (size_t)r;
				}
				free(win);
				if (r == 0)
					break;
			}
		}
		assert_int_equal(seen, 3);
		assert_int_equal(start, third);
	}
	buf_done(&in);
}

/* ---- limits ------------------------------------------------------------------------ */

/* A request of exactly max bytes passes; with max one less it is too long, however the
 * bytes arrive. */
static void test_max_boundary(void **state)
{
	(void)state;
	struct buf in;
	buf_init(&in, 1 << 16);
	build_request(&in, postfix_rcpt, ARRAY_SIZE(postfix_rcpt));
	size_t len = in.len;
	/* grow the request to a round 8192 bytes with a long value */
	assert_true(len < 8192);
	buf_truncate(&in, len - 1);
	assert_int_equal(buf_append_cstr(&in, "x="), 0);
	while (in.len < 8192 - 2)
		assert_int_equal(buf_append_byte(&in, 'v'), 0);
	assert_int_equal(buf_append(&in, "\n\n", 2), 0);
	len = in.len;
	assert_int_equal(len, 8192);

	struct outcome o;
	outcome_init(&o);
	read_all_ways(in.ptr, len, len, &o, 0);
	assert_int_equal(o.result, (int)len);
	read_all_ways(in.ptr, len, len + 1, &o, 1);
	assert_int_equal(o.result, (int)len);
	read_all_ways(in.ptr, len, len - 1, &o, 2);
	assert_int_equal(o.result, -EMSGSIZE);

	struct pfpolicy_parser st;
	static struct pfpolicy_request req;
	const char *why = NULL;
	/* max - 1 bytes of a request that is max bytes long: wait */
	pfpolicy_parser_reset(&st);
	assert_int_equal(pfpolicy_parse(&st, in.ptr, len - 1, len, &req, &why), 0);
	/* n == max and no end yet: too long, also on every later call */
	pfpolicy_parser_reset(&st);
	assert_int_equal(pfpolicy_parse(&st, in.ptr, len - 1, len - 1, &req, &why), -EMSGSIZE);
	assert_string_equal(why, "request too long");
	assert_int_equal(pfpolicy_parse(&st, in.ptr, len, len - 1, &req, &why), -EMSGSIZE);
	/* bytes past max, even a whole second request, change nothing */
	assert_int_equal(buf_append_cstr(&in, "a=b\n\n"), 0);
	pfpolicy_parser_reset(&st);
	assert_int_equal(pfpolicy_parse(&st, in.ptr, in.len, len - 1, &req, &why), -EMSGSIZE);
	assert_int_equal(st.scanned, len - 1);
	buf_done(&o.flat);
	buf_done(&in);
}

/* PFPOLICY_MAX_ATTRS distinct names pass, one more does not; repeats do not count. */
static void test_attr_limit(void **state)
{
	(void)state;
	struct buf in;
	buf_init(&in, 1 << 16);
	for (int i = 0; i < PFPOLICY_MAX_ATTRS; i++)
		assert_int_equal(buf_printf(&in, "attr_%d=%d\n", i, i), 0);
	size_t full = in.len;
	/* repeats of every name, with new values */
	for (int i = 0; i < PFPOLICY_MAX_ATTRS; i++)
		assert_int_equal(buf_printf(&in, "attr_%d=again %d\n", i, i), 0);
	size_t repeated = in.len;
	assert_int_equal(buf_append_byte(&in, '\n'), 0);

	struct outcome o;
	outcome_init(&o);
	read_all_ways(in.ptr, in.len, MAX, &o, 0);
	assert_int_equal(o.result, (int)in.len);
	/* flattened: first places, last values */
	struct buf want;
	buf_init(&want, 1 << 16);
	for (int i = 0; i < PFPOLICY_MAX_ATTRS; i++)
		assert_int_equal(buf_printf(&want, "attr_%d=again %d\n", i, i), 0);
	assert_int_equal(o.flat.len, want.len);
	assert_memory_equal(o.flat.ptr, want.ptr, want.len);

	/* the 65th name, after the repeats or right after the first 64 */
	buf_truncate(&in, repeated);
	assert_int_equal(buf_append_cstr(&in, "one_more=x\n\n"), 0);
	read_all_ways(in.ptr, in.len, MAX, &o, 1);
	assert_int_equal(o.result, -EPROTO);
	assert_string_equal(o.why, "too many attributes");
	buf_truncate(&in, full);
	assert_int_equal(buf_append_cstr(&in, "one_more="), 0);
	read_all_ways(in.ptr, in.len, MAX, &o, 2);
	assert_int_equal(o.result, -EPROTO);
	assert_string_equal(o.why, "too many attributes");
	buf_done(&want);
	buf_done(&o.flat);
	buf_done(&in);
}

/* An error stays where it is when more bytes arrive, with the same reason. */
static void test_error_sticks(void **state)
{
	(void)state;
	static const struct {
		const char *in;
		size_t len, first;
		int result;
	} c[] = {
		{ LIT("a=b\0more=bytes\n\n"), 4, -EPROTO },
		{ LIT("a=b\nbad line\n\n"), 8, -EPROTO },
		{ LIT("\r=x\n\n"), 2, -EPROTO },
		{ LIT("\nb=c\n\n"), 1, -EPROTO },
		{ LIT("\r\nb=c\n\n"), 2, -EPROTO },
		{ LIT("a=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n\n"), 20, -EMSGSIZE },
	};
	for (size_t i = 0; i < ARRAY_SIZE(c); i++) {
		size_t max = c[i].result == -EMSGSIZE ? c[i].first : MAX;
		struct pfpolicy_parser st;
		pfpolicy_parser_reset(&st);
		static struct pfpolicy_request req;
		const char *why1 = NULL, *why2 = NULL;
		assert_int_equal(pfpolicy_parse(&st, c[i].in, c[i].first, max, &req, &why1),
				 c[i].result);
		size_t at = st.scanned;
		for (size_t n = c[i].first; n <= c[i].len; n++) {
			assert_int_equal(pfpolicy_parse(&st, c[i].in, n, max, &req, &why2), c[i].result);
			assert_string_equal(why1, why2);
			assert_int_equal(st.scanned, at);
		}
		/* a NULL ret_why is allowed */
		assert_int_equal(pfpolicy_parse(&st, c[i].in, c[i].len, max, &req, NULL), c[i].result);
	}
}

/* ---- replies ------------------------------------------------------------------------ */

static void test_put_action(void **state)
{
	(void)state;
	static char longest[PFPOLICY_MAX_ACTION + 1];
	memset(longest, 'x', sizeof(longest));
	static const struct {
		const char *text;
		size_t len;
		int result;
	} c[] = {
		{ LIT("DUNNO"), 0 },
		{ LIT("OK"), 0 },
		{ LIT("450 4.7.1 Try again later: rate limit for example.org"), 0 },
		{ LIT("DEFER_IF_PERMIT 100% busy"), 0 },
		{ LIT("PREPEND X-Sluice: class=bulk; n=3"), 0 },
		{ LIT("REJECT caf\xc3\xa9 \xff"), 0 }, /* 8-bit text is the caller's business */
		{ LIT(" "), 0 },
		{ LIT("x"), 0 },
		{ longest, PFPOLICY_MAX_ACTION, 0 },
		{ longest, PFPOLICY_MAX_ACTION + 1, -EINVAL },
		{ LIT(""), -EINVAL },
		{ NULL, 0, -EINVAL },
		{ LIT("DUNNO\n"), -EINVAL },
		{ LIT("DUNNO\r"), -EINVAL },
		{ LIT("REJECT a\r\nb"), -EINVAL },
		{ LIT("\nDUNNO"), -EINVAL },
		{ LIT("DUN\0NO"), -EINVAL },
		{ LIT("\0"), -EINVAL },
	};
	struct buf out;
	buf_init(&out, 1 << 16);
	for (size_t i = 0; i < ARRAY_SIZE(c); i++) {
		buf_reset(&out);
		assert_int_equal(buf_append_cstr(&out, "before"), 0);
		int r = pfpolicy_put_action(&out, str_make(c[i].text, c[i].len));
		if (r != c[i].result)
			fail_msg("case %zu: returned %d, expected %d", i, r, c[i].result);
		if (r < 0) {
			assert_int_equal(out.len, 6);
			assert_string_equal(out.ptr, "before");
			continue;
		}
		assert_int_equal(out.len, 6 + 7 + c[i].len + 2);
		assert_memory_equal(out.ptr + 6, "action=", 7);
		assert_memory_equal(out.ptr + 13, c[i].text, c[i].len);
		assert_memory_equal(out.ptr + 13 + c[i].len, "\n\n", 2);
		/* the reply has the request syntax: read it back */
		struct pfpolicy_parser st;
		pfpolicy_parser_reset(&st);
		static struct pfpolicy_request req;
		const char *why = NULL;
		assert_int_equal(pfpolicy_parse(&st, out.ptr + 6, out.len - 6, MAX + 16, &req, &why),
				 (int)(out.len - 6));
		assert_int_equal(req.n, 1);
		struct str v = pfpolicy_get(&req, "action");
		assert_int_equal(v.len, c[i].len);
		assert_memory_equal(v.ptr, c[i].text, c[i].len);
	}
	buf_done(&out);

	/* a full buffer: nothing half-written */
	struct buf small;
	buf_init(&small, 16);
	assert_int_equal(buf_append_cstr(&small, "ab"), 0);
	assert_int_equal(pfpolicy_put_action(&small, str_cstr("DUNNO")), 0); /* exactly 16 */
	assert_int_equal(small.len, 16);
	buf_done(&small);
	buf_init(&small, 16);
	assert_int_equal(buf_append_cstr(&small, "abcd"), 0);
	assert_int_equal(pfpolicy_put_action(&small, str_cstr("DUNNO")), -ENOBUFS);
	assert_int_equal(small.len, 4);
	assert_string_equal(small.ptr, "abcd");
	assert_int_equal(pfpolicy_put_action(&small, str_cstr("OK")), 0);
	assert_int_equal(small.len, 15);
	assert_string_equal(small.ptr, "abcdaction=OK\n\n");
	buf_done(&small);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_real_request),
		cmocka_unit_test(test_pipeline),
		cmocka_unit_test(test_max_boundary),
		cmocka_unit_test(test_attr_limit),
		cmocka_unit_test(test_error_sticks),
		cmocka_unit_test(test_put_action),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
