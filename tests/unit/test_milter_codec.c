/*
 * test_milter_codec -- unit tests of the pure milter codec (src/proto/milter.c).
 *
 * Table-driven: packets are split at every prefix length; every command code is decoded
 * from good and malformed payloads and the result compared with a compact dump; the
 * negotiation runs over the real offers of Postfix and Sendmail (MILTER-PROTOCOL.md §3.1)
 * crossed with a set of handler wants, with the rules of §3.5 checked on every cell and
 * exact answers for the cells that matter most; every reply encoder is compared byte for
 * byte with the packet the MTA expects.
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
#include "milter.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* A string literal and its length, so that tables can hold NUL bytes. */
#define LIT(s) s, sizeof(s) - 1

/* ---- helpers ---------------------------------------------------------------------- */

struct dump {
	char buf[8192];
	size_t pos;
};

static void dump_printf(struct dump *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void dump_printf(struct dump *d, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int w = vsnprintf(d->buf + d->pos, sizeof(d->buf) - d->pos, fmt, ap);
	va_end(ap);
	assert_true(w >= 0 && (size_t)w < sizeof(d->buf) - d->pos);
	d->pos += (size_t)w;
}

/* A byte string in brackets, with non-printable bytes and '\' as \xNN. */
static void dump_str(struct dump *d, struct str s)
{
	dump_printf(d, "[");
	for (size_t i = 0; i < s.len; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		if (c < 0x20 || c >= 0x7f || c == '\\' || c == '[' || c == ']')
			dump_printf(d, "\\x%02x", c);
		else
			dump_printf(d, "%c", c);
	}
	dump_printf(d, "]");
}

/* Checks that a decoded slice lies inside the packet's payload. */
static void assert_inside(struct str s, const struct milter_frame *f)
{
	if (s.len == 0)
		return;
	assert_true(s.ptr >= f->data.ptr);
	assert_true(s.ptr + s.len <= f->data.ptr + f->data.len);
}

static void dump_cmd(struct dump *d, const struct milter_cmd *c, const struct milter_frame *f)
{
	d->pos = 0;
	d->buf[0] = '\0';
	dump_printf(d, "%c", c->code);
	switch (c->code) {
	case MILTER_CMD_OPTNEG:
		dump_printf(d, " %u 0x%x 0x%x", (unsigned)c->optneg.version,
			    (unsigned)c->optneg.actions, (unsigned)c->optneg.protocol);
		break;
	case MILTER_CMD_MACRO:
		dump_printf(d, " %c", c->macro.stage);
		assert_true(c->macro.npairs <= MILTER_MAX_MACRO_PAIRS);
		for (size_t i = 0; i < c->macro.npairs; i++) {
			dump_printf(d, " ");
			dump_str(d, c->macro.pairs[i].name);
			dump_printf(d, "=");
			dump_str(d, c->macro.pairs[i].value);
			assert_inside(c->macro.pairs[i].name, f);
			assert_inside(c->macro.pairs[i].value, f);
		}
		break;
	case MILTER_CMD_CONNECT:
		dump_printf(d, " ");
		dump_str(d, c->connect.host);
		dump_printf(d, " %c %u ", c->connect.family, (unsigned)c->connect.port);
		dump_str(d, c->connect.address);
		assert_inside(c->connect.host, f);
		assert_inside(c->connect.address, f);
		break;
	case MILTER_CMD_HELO:
		dump_printf(d, " ");
		dump_str(d, c->helo.name);
		assert_inside(c->helo.name, f);
		break;
	case MILTER_CMD_MAIL:
	case MILTER_CMD_RCPT:
		dump_printf(d, " ");
		dump_str(d, c->envelope.addr);
		assert_inside(c->envelope.addr, f);
		assert_true(c->envelope.nargs <= MILTER_MAX_ESMTP_ARGS);
		for (size_t i = 0; i < c->envelope.nargs; i++) {
			dump_printf(d, " ");
			dump_str(d, c->envelope.args[i]);
			assert_inside(c->envelope.args[i], f);
		}
		break;
	case MILTER_CMD_HEADER:
		dump_printf(d, " ");
		dump_str(d, c->header.name);
		dump_printf(d, " ");
		dump_str(d, c->header.value);
		assert_inside(c->header.name, f);
		assert_inside(c->header.value, f);
		break;
	case MILTER_CMD_BODY:
	case MILTER_CMD_BODYEOB:
		dump_printf(d, " ");
		dump_str(d, c->body.chunk);
		assert_inside(c->body.chunk, f);
		break;
	case MILTER_CMD_UNKNOWN:
		dump_printf(d, " ");
		dump_str(d, c->unknown.line);
		assert_inside(c->unknown.line, f);
		break;
	default:
		break;
	}
}

/* Builds a whole packet: length word, code, payload. */
static size_t make_packet(unsigned char *out, size_t outlen, uint8_t code, const void *data,
			  size_t len)
{
	assert_true(len + 5 <= outlen);
	uint32_t l = (uint32_t)len + 1;
	out[0] = (unsigned char)(l >> 24);
	out[1] = (unsigned char)(l >> 16);
	out[2] = (unsigned char)(l >> 8);
	out[3] = (unsigned char)l;
	out[4] = code;
	if (len)
		memcpy(out + 5, data, len);
	return len + 5;
}

static uint32_t get_u32(const void *p)
{
	const unsigned char *b = p;
	return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Asserts that out holds exactly the packets described by (code, payload) pairs. */
static void assert_bytes(const struct buf *out, const void *expect, size_t len)
{
	if (out->len != len || memcmp(out->ptr, expect, len) != 0) {
		struct dump a = { .pos = 0 }, b = { .pos = 0 };
		dump_str(&a, buf_str(out));
		dump_str(&b, str_make(expect, len));
		fail_msg("bytes differ\n  got      %s\n  expected %s", a.buf, b.buf);
	}
}

/* ---- framing ---------------------------------------------------------------------- */

static void test_frame_prefixes(void **state)
{
	(void)state;
	static const struct {
		const char *bytes;
		size_t len;
		uint8_t code;
		size_t datalen;
	} packets[] = {
		{ LIT("\0\0\0\x01" "c"), 'c', 0 },
		{ LIT("\0\0\0\x05" "Hmx.\0"), 'H', 4 },
		{ LIT("\0\0\0\x0d" "O\0\0\0\x06\0\0\x01\xff\0\x1f\xff\xff"), 'O', 12 },
		{ LIT("\0\0\x01\x00" "B"
		      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde"), 'B', 255 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(packets); i++) {
		const char *p = packets[i].bytes;
		size_t n = packets[i].len;
		/* An exact-size copy, so that ASan sees any read past the end. */
		for (size_t k = 0; k < n; k++) {
			unsigned char *copy = malloc(k ? k : 1);
			assert_non_null(copy);
			memcpy(copy, p, k);
			struct milter_frame f;
			memset(&f, 0xa5, sizeof(f));
			const char *why = "untouched";
			assert_int_equal(milter_frame_parse(copy, k, MILTER_LEN_CAP_DEFAULT, &f, &why), 0);
			assert_string_equal(why, "untouched");
			assert_int_equal(f.code, 0xa5); /* out-parameter untouched */
			free(copy);
		}
		unsigned char *copy = malloc(n);
		assert_non_null(copy);
		memcpy(copy, p, n);
		struct milter_frame f;
		const char *why = NULL;
		assert_int_equal(milter_frame_parse(copy, n, MILTER_LEN_CAP_DEFAULT, &f, &why), 1);
		assert_int_equal(f.code, packets[i].code);
		assert_int_equal(f.data.len, packets[i].datalen);
		assert_ptr_equal(f.data.ptr, (const char *)copy + 5);
		assert_int_equal(f.size, n);
		free(copy);
	}
}

static void test_frame_bad_length(void **state)
{
	(void)state;
	static const struct {
		const char *bytes;
		size_t len;
		size_t cap;
		int result;
		const char *why;
	} cases[] = {
		{ LIT("\0\0\0\0"), MILTER_LEN_CAP_DEFAULT, -EPROTO, "packet length 0" },
		{ LIT("\0\0\0\0c"), MILTER_LEN_CAP_DEFAULT, -EPROTO, "packet length 0" },
		{ LIT("\xff\xff\xff\xff"), MILTER_LEN_CAP_DEFAULT, -EPROTO, "packet length above limit" },
		{ LIT("\0\x10\x10\x01"), MILTER_LEN_CAP_DEFAULT, -EPROTO, "packet length above limit" },
		/* exactly the default cap: only waits for the rest */
		{ LIT("\0\x10\x10\x00"), MILTER_LEN_CAP_DEFAULT, 0, NULL },
		{ LIT("\0\0\0\x65" "B"), 100, -EPROTO, "packet length above limit" },
		{ LIT("\0\0\0\x64" "B"), 100, 0, NULL },
		{ LIT("\0\0\0\x02" "c"), 1, -EPROTO, "packet length above limit" },
		{ LIT("\0\0\0\x01" "c"), 1, 1, NULL },
	};
	assert_int_equal(MILTER_LEN_CAP_DEFAULT, 0x101000);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct milter_frame f;
		const char *why = NULL;
		int r = milter_frame_parse(cases[i].bytes, cases[i].len, cases[i].cap, &f, &why);
		if (r != cases[i].result)
			fail_msg("case %zu: got %d, expected %d", i, r, cases[i].result);
		if (cases[i].why)
			assert_string_equal(why, cases[i].why);
	}
}

static void test_frame_back_to_back(void **state)
{
	(void)state;
	static const char stream[] = "\0\0\0\x0a" "DCj\0mx.ex\0"
				     "\0\0\0\x14" "Cmx.ex\0" "4\x30\x39" "192.0.2.7\0"
				     "\0\0\0\x01" "Q"
				     "\0\0\0\x09" "Hpart"; /* truncated */
	size_t n = sizeof(stream) - 1, off = 0;
	const uint8_t codes[] = { 'D', 'C', 'Q' };
	for (size_t i = 0; i < ARRAY_SIZE(codes); i++) {
		struct milter_frame f;
		const char *why = NULL;
		assert_int_equal(milter_frame_parse(stream + off, n - off, 4096, &f, &why), 1);
		assert_int_equal(f.code, codes[i]);
		struct milter_cmd c;
		assert_int_equal(milter_cmd_decode(&f, &c, &why), 0);
		off += f.size;
	}
	struct milter_frame f;
	const char *why = NULL;
	assert_int_equal(milter_frame_parse(stream + off, n - off, 4096, &f, &why), 0);
	assert_int_equal(n - off, 9);
}

/* ---- command decoding ------------------------------------------------------------- */

static const struct {
	uint8_t code;
	const char *data;
	size_t len;
	const char *dump; /* NULL: must be refused with why */
	const char *why;
} decode_cases[] = {
	/* OPTNEG */
	{ 'O', LIT("\0\0\0\x06\0\0\x01\xff\0\x1f\xff\xff"), "O 6 0x1ff 0x1fffff", NULL },
	{ 'O', LIT("\0\0\0\x02\0\0\x01\xff\0\0\0\x7f"), "O 2 0x1ff 0x7f", NULL },
	{ 'O', LIT("\0\0\0\x06\0\0\x01\xff\x20\x1f\xff\xff"), "O 6 0x1ff 0x201fffff", NULL },
	{ 'O', LIT("\0\0\0\0\0\0\0\0\0\0\0\0"), "O 0 0x0 0x0", NULL },
	{ 'O', LIT("\0\0\0\x06\0\0\x01\xff\0\x1f\xff\xff" "more"), "O 6 0x1ff 0x1fffff", NULL },
	{ 'O', LIT("\0\0\0\x06\0\0\x01\xff\0\x1f\xff"), NULL, "OPTNEG shorter than 12 bytes" },
	{ 'O', LIT(""), NULL, "OPTNEG shorter than 12 bytes" },
	/* MACRO */
	{ 'D', LIT("C"), "D C", NULL },
	{ 'D', LIT("Cj\0mx.example.net\0{daemon_name}\0smtpd\0v\0Postfix 3.7.11\0"),
	  "D C [j]=[mx.example.net] [{daemon_name}]=[smtpd] [v]=[Postfix 3.7.11]", NULL },
	{ 'D', LIT("M{mail_addr}\0\0i\0"), "D M [{mail_addr}]=[]", NULL }, /* odd: trailing name */
	{ 'D', LIT("M\0\0"), "D M []=[]", NULL },
	{ 'D', LIT("R{rcpt_addr}\0caf\xc3\xa9@example.org\0"),
	  "D R [{rcpt_addr}]=[caf\\xc3\\xa9@example.org]", NULL },
	{ 'D', LIT("Z"), "D Z", NULL }, /* unknown stage: accepted */
	{ 'D', LIT(""), NULL, "MACRO without stage" },
	{ 'D', LIT("Cj"), NULL, "macro name without NUL" },
	{ 'D', LIT("Cj\0mx"), NULL, "macro value without NUL" },
	/* CONNECT */
	{ 'C', LIT("mx.example.net\0" "4\x30\x39" "192.0.2.7\0"),
	  "C [mx.example.net] 4 12345 [192.0.2.7]", NULL },
	{ 'C', LIT("[2001:db8::1]\0" "6\x00\x19" "2001:db8::1\0"),
	  "C [\\x5b2001:db8::1\\x5d] 6 25 [2001:db8::1]", NULL },
	{ 'C', LIT("localhost\0" "L\0\0" "/run/postfix/smtpd\0"), "C [localhost] L 0 [/run/postfix/smtpd]",
	  NULL },
	{ 'C', LIT("unknown\0U"), "C [unknown] U 0 []", NULL },
	{ 'C', LIT("\0U"), "C [] U 0 []", NULL },
	{ 'C', LIT("\0" "4\xff\xff\0"), "C [] 4 65535 []", NULL },
	{ 'C', LIT(""), NULL, "CONNECT host without NUL" },
	{ 'C', LIT("mx.example.net"), NULL, "CONNECT host without NUL" },
	{ 'C', LIT("mx.example.net\0"), NULL, "CONNECT without family" },
	{ 'C', LIT("mx.example.net\0X\x30\x39" "1.2.3.4\0"), NULL, "CONNECT with unknown family" },
	{ 'C', LIT("mx.example.net\0" "4"), NULL, "CONNECT without port" },
	{ 'C', LIT("mx.example.net\0" "4\x30"), NULL, "CONNECT without port" },
	{ 'C', LIT("mx.example.net\0" "4\x30\x39"), NULL, "CONNECT address without NUL" },
	{ 'C', LIT("mx.example.net\0" "4\x30\x39" "192.0.2.7"), NULL, "CONNECT address without NUL" },
	{ 'C', LIT("mx.example.net\0" "4\x30\x39" "192.0.2.7\0x"), NULL, "CONNECT with trailing bytes" },
	{ 'C', LIT("mx.example.net\0" "4\x30\x39" "192.0.2.7\0\0"), NULL, "CONNECT with trailing bytes" },
	/* HELO */
	{ 'H', LIT("mx.example.net\0"), "H [mx.example.net]", NULL },
	{ 'H', LIT("\0"), "H []", NULL },
	{ 'H', LIT("mx.example.net"), NULL, "HELO without NUL" },
	{ 'H', LIT(""), NULL, "HELO without NUL" },
	/* MAIL, RCPT */
	{ 'M', LIT("<a@example.org>\0"), "M [<a@example.org>]", NULL },
	{ 'M', LIT("<>\0"), "M [<>]", NULL },
	{ 'M', LIT("<a@example.org>\0SIZE=4096\0BODY=8BITMIME\0"),
	  "M [<a@example.org>] [SIZE=4096] [BODY=8BITMIME]", NULL },
	{ 'M', LIT("<a@example.org>\0\0"), "M [<a@example.org>] []", NULL },
	{ 'M', LIT("\0"), "M []", NULL },
	{ 'M', LIT(""), NULL, "address without NUL" },
	{ 'M', LIT("<a@example.org>"), NULL, "address without NUL" },
	{ 'M', LIT("<a@example.org>\0SIZE=1"), NULL, "ESMTP parameter without NUL" },
	{ 'R', LIT("<b@example.net>\0NOTIFY=NEVER\0ORCPT=rfc822;b@example.net\0"),
	  "R [<b@example.net>] [NOTIFY=NEVER] [ORCPT=rfc822;b@example.net]", NULL },
	{ 'R', LIT("<b@example.net>\0"), "R [<b@example.net>]", NULL },
	{ 'R', LIT(""), NULL, "address without NUL" },
	{ 'R', LIT("<b@example.net>\0x\0y"), NULL, "ESMTP parameter without NUL" },
	/* HEADER */
	{ 'L', LIT("Subject\0hello\0"), "L [Subject] [hello]", NULL },
	{ 'L', LIT("X-Empty\0\0"), "L [X-Empty] []", NULL },
	{ 'L', LIT("Received\0from a\n\tby b\0"), "L [Received] [from a\\x0a\\x09by b]", NULL },
	{ 'L', LIT("Subject\0 leading\xff\0"), "L [Subject] [ leading\\xff]", NULL },
	{ 'L', LIT("\0\0"), "L [] []", NULL },
	{ 'L', LIT(""), NULL, "HEADER name without NUL" },
	{ 'L', LIT("Subject"), NULL, "HEADER name without NUL" },
	{ 'L', LIT("Subject\0"), NULL, "HEADER value without NUL" },
	{ 'L', LIT("Subject\0hello"), NULL, "HEADER value without NUL" },
	{ 'L', LIT("Subject\0hello\0x"), NULL, "HEADER with trailing bytes" },
	{ 'L', LIT("Subject\0hello\0\0"), NULL, "HEADER with trailing bytes" },
	/* BODY, BODYEOB: raw bytes, NUL included */
	{ 'B', LIT("line 1\r\nline\0 2\r\n"), "B [line 1\\x0d\\x0aline\\x00 2\\x0d\\x0a]", NULL },
	{ 'B', LIT(""), "B []", NULL },
	{ 'E', LIT(""), "E []", NULL },
	{ 'E', LIT("tail\r\n"), "E [tail\\x0d\\x0a]", NULL },
	/* UNKNOWN */
	{ 'U', LIT("HELP me\0"), "U [HELP me]", NULL },
	{ 'U', LIT("\0"), "U []", NULL },
	{ 'U', LIT("HELP"), NULL, "UNKNOWN without NUL" },
	{ 'U', LIT(""), NULL, "UNKNOWN without NUL" },
	/* commands without payload; a payload is ignored, as libmilter does */
	{ 'T', LIT(""), "T", NULL },
	{ 'N', LIT(""), "N", NULL },
	{ 'A', LIT(""), "A", NULL },
	{ 'Q', LIT(""), "Q", NULL },
	{ 'K', LIT(""), "K", NULL },
	{ 'T', LIT("junk"), "T", NULL },
	{ 'A', LIT("\0"), "A", NULL },
	/* unknown codes, replies among them */
	{ 'Z', LIT(""), NULL, "unknown command" },
	{ 'c', LIT(""), NULL, "unknown command" },
	{ 'y', LIT("550 5.7.1 x\0"), NULL, "unknown command" },
	{ 0, LIT(""), NULL, "unknown command" },
	{ 0xff, LIT("x"), NULL, "unknown command" },
	{ 'P', LIT(""), NULL, "unknown command" },
};

static void test_decode_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(decode_cases); i++) {
		size_t plen = decode_cases[i].len + 5;
		unsigned char *pkt = malloc(plen);
		assert_non_null(pkt);
		make_packet(pkt, plen, decode_cases[i].code, decode_cases[i].data, decode_cases[i].len);
		struct milter_frame f;
		const char *why = NULL;
		assert_int_equal(milter_frame_parse(pkt, plen, MILTER_LEN_CAP_DEFAULT, &f, &why), 1);
		struct milter_cmd c;
		memset(&c, 0x5a, sizeof(c));
		int r = milter_cmd_decode(&f, &c, &why);
		if (decode_cases[i].dump) {
			if (r != 0)
				fail_msg("case %zu (%c): refused: %s", i, decode_cases[i].code, why);
			struct dump d;
			dump_cmd(&d, &c, &f);
			if (strcmp(d.buf, decode_cases[i].dump) != 0)
				fail_msg("case %zu:\n  got      %s\n  expected %s", i, d.buf,
					 decode_cases[i].dump);
		} else {
			if (r != -EPROTO)
				fail_msg("case %zu (%c): accepted, expected \"%s\"", i,
					 decode_cases[i].code, decode_cases[i].why);
			assert_non_null(why);
			if (strcmp(why, decode_cases[i].why) != 0)
				fail_msg("case %zu: why \"%s\", expected \"%s\"", i, why,
					 decode_cases[i].why);
			/* out-parameter untouched on failure */
			unsigned char fill[sizeof(c)];
			memset(fill, 0x5a, sizeof(fill));
			assert_memory_equal(&c, fill, sizeof(c));
		}
		free(pkt);
	}
}

/* MACRO packets with up to and past MILTER_MAX_MACRO_PAIRS pairs, and with an odd
 * number of strings (the trailing name is ignored). */
static void test_decode_macro_counts(void **state)
{
	(void)state;
	static const size_t counts[] = { 0, 1, 63, 64, 65, 200 };
	for (size_t ci = 0; ci < ARRAY_SIZE(counts); ci++) {
		for (int odd = 0; odd < 2; odd++) {
			struct buf b;
			buf_init(&b, 1 << 20);
			assert_int_equal(buf_append_byte(&b, 'E'), 0);
			for (size_t i = 0; i < counts[ci]; i++)
				assert_int_equal(buf_printf(&b, "{m%zu}%cvalue %zu%c", i, 0, i, 0), 0);
			if (odd)
				assert_int_equal(buf_append(&b, "{lonely}", 9), 0);
			struct milter_frame f = { .code = 'D', .data = buf_str(&b), .size = b.len + 5 };
			struct milter_cmd c;
			const char *why = NULL;
			int r = milter_cmd_decode(&f, &c, &why);
			if (counts[ci] > MILTER_MAX_MACRO_PAIRS) {
				assert_int_equal(r, -EPROTO);
				assert_string_equal(why, "too many macros");
			} else if (counts[ci] == MILTER_MAX_MACRO_PAIRS && odd) {
				/* the 65th name is one string too many, value or not */
				assert_int_equal(r, -EPROTO);
				assert_string_equal(why, "too many macros");
			} else {
				assert_int_equal(r, 0);
				assert_int_equal(c.macro.stage, 'E');
				assert_int_equal(c.macro.npairs, counts[ci]);
				for (size_t i = 0; i < c.macro.npairs; i++) {
					char n[32], v[32];
					snprintf(n, sizeof(n), "{m%zu}", i);
					snprintf(v, sizeof(v), "value %zu", i);
					assert_true(str_eq_cstr(c.macro.pairs[i].name, n));
					assert_true(str_eq_cstr(c.macro.pairs[i].value, v));
				}
			}
			buf_done(&b);
		}
	}
}

/* MAIL and RCPT with up to and past MILTER_MAX_ESMTP_ARGS parameters. */
static void test_decode_esmtp_counts(void **state)
{
	(void)state;
	static const size_t counts[] = { 0, 1, 31, 32, 33, 100 };
	static const uint8_t codes[] = { 'M', 'R' };
	for (size_t k = 0; k < ARRAY_SIZE(codes); k++)
		for (size_t ci = 0; ci < ARRAY_SIZE(counts); ci++) {
			struct buf b;
			buf_init(&b, 1 << 20);
			assert_int_equal(buf_append(&b, "<x@example.org>", 16), 0);
			for (size_t i = 0; i < counts[ci]; i++)
				assert_int_equal(buf_printf(&b, "X-P%zu=%zu%c", i, i, 0), 0);
			struct milter_frame f = { .code = codes[k], .data = buf_str(&b), .size = b.len + 5 };
			struct milter_cmd c;
			const char *why = NULL;
			int r = milter_cmd_decode(&f, &c, &why);
			if (counts[ci] > MILTER_MAX_ESMTP_ARGS) {
				assert_int_equal(r, -EPROTO);
				assert_string_equal(why, "too many ESMTP parameters");
			} else {
				assert_int_equal(r, 0);
				assert_true(str_eq_cstr(c.envelope.addr, "<x@example.org>"));
				assert_int_equal(c.envelope.nargs, counts[ci]);
				for (size_t i = 0; i < counts[ci]; i++) {
					char a[32];
					snprintf(a, sizeof(a), "X-P%zu=%zu", i, i);
					assert_true(str_eq_cstr(c.envelope.args[i], a));
				}
			}
			buf_done(&b);
		}
}

/* Every byte value as a code: only the 15 commands decode. */
static void test_decode_codes(void **state)
{
	(void)state;
	static const char known[] = "ABCDEHKLMNOQRTU";
	/* a payload that every known command accepts */
	static const char payload[] = "\0\0\0\x06\0\0\x01\xff\0\x1f\xff\xff";
	static const char helo[] = "x\0" "4\0\0" "1\0";
	for (unsigned code = 0; code < 256; code++) {
		const char *p = payload;
		size_t n = sizeof(payload) - 1;
		if (code == 'C' || code == 'H' || code == 'M' || code == 'R' || code == 'U' ||
		    code == 'D' || code == 'L') {
			p = helo;
			n = sizeof(helo) - 1;
			if (code == 'H' || code == 'U' || code == 'M' || code == 'R')
				n = 2;
			if (code == 'L')
				n = 4; /* "x\0" "4\0" */
		}
		struct milter_frame f = { .code = (uint8_t)code, .data = str_make(p, n), .size = n + 5 };
		struct milter_cmd c;
		const char *why = NULL;
		int r = milter_cmd_decode(&f, &c, &why);
		bool is_known = code != 0 && strchr(known, (int)code) != NULL;
		if (is_known != (r == 0))
			fail_msg("code 0x%02x: decode returned %d (%s)", code, r, why ? why : "");
		if (r == 0)
			assert_int_equal(c.code, code);
	}
}

/* ---- negotiation ------------------------------------------------------------------ */

#define ALL_STEPS ((1u << MILTER_STEP_COUNT) - 1)
#define STEP(s) MILTER_STEP_BIT(MILTER_STEP_##s)

struct offer {
	const char *name;
	uint32_t version, actions, protocol;
};

static const struct offer offers[] = {
	{ "postfix-6", 6, 0x1ff, 0x1fffff },
	{ "sendmail-256k", 6, 0x1ff, 0x1fffff | MILTER_P_MDS_256K },
	{ "sendmail-1m", 6, 0x1ff, 0x1fffff | MILTER_P_MDS_1M },
	{ "both-mds", 6, 0x1ff, 0x1fffff | MILTER_P_MDS_256K | MILTER_P_MDS_1M },
	{ "postfix-2", 2, 0x1ff, 0x7f },
	{ "postfix-2-nohdrreply", 2, 0x1ff, 0xff },
	{ "postfix-3", 3, 0x1ff, 0x17f },
	{ "postfix-4", 4, 0x1ff, 0x37f },
	{ "mta-5", 5, 0x1ff, 0x37f },
	{ "mta-6-v2-flags", 6, 0x3f, 0x7f },
	{ "mta-7", 7, 0x1ff, 0x1fffff },
	{ "v1-defaults", 2, 0, 0 },
	{ "v6-zero-words", 6, 0, 0 },
	{ "no-setsymlist", 6, 0xff, 0x1fffff },
	{ "internal-bits", 6, 0xffffffff, 0xffffffff },
};

struct want_case {
	const char *name;
	struct milter_want w;
};

static const struct want_case wants[] = {
	{ "nothing", { 0 } },
	{ "all-replies", { .steps = ALL_STEPS, .replies = ALL_STEPS } },
	{ "all-no-replies", { .steps = ALL_STEPS, .replies = 0 } },
	{ "some", { .steps = STEP(CONNECT) | STEP(RCPT) | STEP(HEADER) | STEP(BODY),
		    .replies = STEP(RCPT) | STEP(BODY) } },
	{ "data-unknown", { .steps = STEP(DATA) | STEP(UNKNOWN), .replies = STEP(DATA) } },
	{ "leadspc", { .steps = STEP(HEADER), .replies = STEP(HEADER), .header_leadspc = true } },
	{ "rcpt-rej", { .steps = STEP(RCPT), .replies = STEP(RCPT), .rcpt_rejected = true } },
	{ "skip", { .steps = STEP(BODY), .replies = STEP(BODY), .skip = true } },
	{ "all-flags", { .steps = ALL_STEPS, .replies = ALL_STEPS, .header_leadspc = true,
			 .rcpt_rejected = true, .skip = true, .actions = MILTER_ACT_ALL } },
	{ "macros", { .steps = STEP(MAIL), .replies = STEP(MAIL),
		      .macros = { [MILTER_MACROS_CONNECT] = "{client_addr} j",
				  [MILTER_MACROS_EOM] = "i" } } },
	{ "empty-macros", { .steps = STEP(MAIL), .macros = { [MILTER_MACROS_HELO] = "" } } },
	{ "actions-subset", { .actions = MILTER_ACT_ADDHDRS | MILTER_ACT_CHGFROM |
					MILTER_ACT_QUARANTINE | MILTER_ACT_SETSYMLIST } },
	{ "actions-all", { .actions = 0xffffffff } },
	{ "eom-only-bit", { .steps = STEP(EOM), .replies = 0 } },
};

static const uint32_t step_skip_flag[MILTER_STEP_COUNT] = {
	MILTER_P_NOCONNECT, MILTER_P_NOHELO, MILTER_P_NOMAIL, MILTER_P_NORCPT, MILTER_P_NODATA,
	MILTER_P_NOHDRS,    MILTER_P_NOEOH,  MILTER_P_NOBODY, 0,		 MILTER_P_NOUNKNOWN,
};
static const uint32_t step_nr_flag[MILTER_STEP_COUNT] = {
	MILTER_P_NR_CONN, MILTER_P_NR_HELO, MILTER_P_NR_MAIL, MILTER_P_NR_RCPT, MILTER_P_NR_DATA,
	MILTER_P_NR_HDR,  MILTER_P_NR_EOH,  MILTER_P_NR_BODY, 0,		MILTER_P_NR_UNKN,
};

/* Checks one cell of the matrix against MILTER-PROTOCOL.md §3 and doc/MILTER.md. */
static void check_negotiation(const struct offer *o, const struct want_case *wc)
{
	struct milter_neg n;
	const char *why = NULL;
	int r = milter_negotiate(o->version, o->actions, o->protocol, &wc->w, &n, &why);
	if (r != 0)
		fail_msg("%s x %s: refused: %s", o->name, wc->name, why);
	uint32_t acts = o->actions ? o->actions : 0x0f;
	uint32_t prot = o->protocol ? o->protocol : 0x3f;
	const char *cell = wc->name;

	/* version: min(offer, 6), never below 2 */
	uint32_t v = o->version < 6 ? o->version : 6;
	if (n.version != v)
		fail_msg("%s x %s: version %u", o->name, cell, n.version);
	/* never a bit outside the offer */
	if (n.actions & ~acts)
		fail_msg("%s x %s: actions 0x%x outside offer 0x%x", o->name, cell, n.actions, acts);
	if (n.protocol & ~prot)
		fail_msg("%s x %s: protocol 0x%x outside offer 0x%x", o->name, cell, n.protocol, prot);
	assert_int_equal(n.mta_protocol, prot);
	/* actions: exactly the wanted ones that were offered and defined (SETSYMLIST apart) */
	assert_int_equal(n.actions & ~MILTER_ACT_SETSYMLIST,
			 wc->w.actions & acts & MILTER_ACT_ALL & ~MILTER_ACT_SETSYMLIST);
	bool any_macros = false;
	for (int i = 0; i < MILTER_MACROS_COUNT; i++)
		if (wc->w.macros[i] && wc->w.macros[i][0])
			any_macros = true;
	bool symlist = any_macros && (acts & MILTER_ACT_SETSYMLIST);
	assert_int_equal(n.symlist, symlist);
	assert_int_equal(!!(n.actions & MILTER_ACT_SETSYMLIST), symlist);

	/* per step */
	for (int s = 0; s < MILTER_STEP_COUNT; s++) {
		uint32_t bit = MILTER_STEP_BIT(s);
		bool exists = !(s == MILTER_STEP_UNKNOWN && v < 3) && !(s == MILTER_STEP_DATA && v < 4);
		bool wanted = (wc->w.steps & bit) || s == MILTER_STEP_EOM;
		bool reply = wanted && ((wc->w.replies & bit) || s == MILTER_STEP_EOM);
		bool skip_offered = step_skip_flag[s] && (prot & step_skip_flag[s]);
		bool nr_offered = step_nr_flag[s] && (prot & step_nr_flag[s]);
		bool sent = exists && (wanted || !skip_offered);
		bool noreply = sent && !reply && nr_offered;
		if (!!(n.send_steps & bit) != sent)
			fail_msg("%s x %s: step %s sent=%d", o->name, cell, milter_step_name(s), !sent);
		if (!!(n.reply_steps & bit) != (sent && !noreply))
			fail_msg("%s x %s: step %s reply=%d", o->name, cell, milter_step_name(s),
				 !!(n.reply_steps & bit));
		if (step_skip_flag[s] && (prot & step_skip_flag[s]) &&
		    !!(n.protocol & step_skip_flag[s]) != (exists && !wanted))
			fail_msg("%s x %s: step %s skip flag", o->name, cell, milter_step_name(s));
		if (step_nr_flag[s] && !!(n.protocol & step_nr_flag[s]) != noreply)
			fail_msg("%s x %s: step %s no-reply flag", o->name, cell, milter_step_name(s));
	}
	/* EOM is always sent and answered */
	assert_true(n.send_steps & STEP(EOM));
	assert_true(n.reply_steps & STEP(EOM));
	assert_int_equal(n.reply_steps & ~n.send_steps, 0);
	/* requests */
	assert_int_equal(!!(n.protocol & MILTER_P_HDR_LEADSPC),
			 wc->w.header_leadspc && (prot & MILTER_P_HDR_LEADSPC));
	assert_int_equal(!!(n.protocol & MILTER_P_RCPT_REJ),
			 wc->w.rcpt_rejected && (prot & MILTER_P_RCPT_REJ));
	assert_int_equal(!!(n.protocol & MILTER_P_SKIP), wc->w.skip && (prot & MILTER_P_SKIP));
	/* the largest data size offered */
	if (prot & MILTER_P_MDS_1M) {
		assert_int_equal(n.protocol & (MILTER_P_MDS_1M | MILTER_P_MDS_256K), MILTER_P_MDS_1M);
		assert_int_equal(n.body_max, MILTER_DATA_1M);
	} else if (prot & MILTER_P_MDS_256K) {
		assert_int_equal(n.protocol & (MILTER_P_MDS_1M | MILTER_P_MDS_256K), MILTER_P_MDS_256K);
		assert_int_equal(n.body_max, MILTER_DATA_256K);
	} else {
		assert_int_equal(n.body_max, MILTER_DATA_64K);
	}
	/* nothing but defined bits: no reserved 0x40000000, nothing between 0x200000 and MDS */
	assert_int_equal(n.protocol & ~(MILTER_P_ALL | MILTER_P_MDS_256K | MILTER_P_MDS_1M), 0);
	/* never an undefined action bit, whatever both sides set */
	assert_int_equal(n.actions & ~MILTER_ACT_ALL, 0);
}

static void test_negotiate_matrix(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(offers); i++)
		for (size_t j = 0; j < ARRAY_SIZE(wants); j++)
			check_negotiation(&offers[i], &wants[j]);
}

/* Exact answers for the cells an MTA cares most about. */
static void test_negotiate_exact(void **state)
{
	(void)state;
	static const struct {
		uint32_t version, actions, protocol;
		size_t want;
		uint32_t r_version, r_actions, r_protocol, reply_steps, send_steps;
	} cases[] = {
		/* Postfix 6, handler wants nothing: every skippable step skipped */
		{ 6, 0x1ff, 0x1fffff, 0, 6, 0, 0x37f, STEP(EOM), STEP(EOM) },
		/* Postfix 6, all steps with replies: protocol 0 */
		{ 6, 0x1ff, 0x1fffff, 1, 6, 0, 0, ALL_STEPS, ALL_STEPS },
		/* Postfix 6, all steps observed only: every NR_* */
		{ 6, 0x1ff, 0x1fffff, 2, 6, 0, 0xff080, STEP(EOM), ALL_STEPS },
		/* Sendmail 1M: the MDS bit echoed */
		{ 6, 0x1ff, 0x1fffff | MILTER_P_MDS_1M, 1, 6, 0, MILTER_P_MDS_1M, ALL_STEPS, ALL_STEPS },
		/* Postfix milter_protocol=2: no DATA, no UNKNOWN, no NR_* */
		{ 2, 0x1ff, 0x7f, 0, 2, 0, 0x7f, STEP(EOM), STEP(EOM) },
		{ 2, 0x1ff, 0x7f, 2, 2, 0, 0, ALL_STEPS & ~STEP(DATA) & ~STEP(UNKNOWN),
		  ALL_STEPS & ~STEP(DATA) & ~STEP(UNKNOWN) },
		/* no_header_reply adds NR_HDR */
		{ 2, 0x1ff, 0xff, 2, 2, 0, MILTER_P_NR_HDR,
		  ALL_STEPS & ~STEP(DATA) & ~STEP(UNKNOWN) & ~STEP(HEADER),
		  ALL_STEPS & ~STEP(DATA) & ~STEP(UNKNOWN) },
		/* milter_protocol=3: UNKNOWN exists and can be skipped */
		{ 3, 0x1ff, 0x17f, 0, 3, 0, 0x17f, STEP(EOM), STEP(EOM) },
		/* milter_protocol=4: DATA too */
		{ 4, 0x1ff, 0x37f, 0, 4, 0, 0x37f, STEP(EOM), STEP(EOM) },
		{ 4, 0x1ff, 0x37f, 1, 4, 0, 0, ALL_STEPS, ALL_STEPS },
		/* v1 defaults (zero words): skip bits 0x01-0x20 only, so EOH is sent and answered */
		{ 2, 0, 0, 0, 2, 0, 0x3f, STEP(EOM) | STEP(EOH), STEP(EOM) | STEP(EOH) },
		{ 2, 0, 0, 11, 2, MILTER_ACT_ADDHDRS, 0x3f, STEP(EOM) | STEP(EOH),
		  STEP(EOM) | STEP(EOH) },
		/* actions subset; SETSYMLIST only with lists */
		{ 6, 0x1ff, 0x1fffff, 11, 6, MILTER_ACT_ADDHDRS | MILTER_ACT_CHGFROM | MILTER_ACT_QUARANTINE,
		  0x37f, STEP(EOM), STEP(EOM) },
		{ 6, 0x1ff, 0x1fffff, 12, 6, 0x0ff, 0x37f, STEP(EOM), STEP(EOM) },
		/* macros: SETSYMLIST when offered */
		{ 6, 0x1ff, 0x1fffff, 9, 6, MILTER_ACT_SETSYMLIST, 0x37b, STEP(EOM) | STEP(MAIL),
		  STEP(EOM) | STEP(MAIL) },
		{ 6, 0xff, 0x1fffff, 9, 6, 0, 0x37b, STEP(EOM) | STEP(MAIL), STEP(EOM) | STEP(MAIL) },
		/* an empty list is no list */
		{ 6, 0x1ff, 0x1fffff, 10, 6, 0, 0x37b | MILTER_P_NR_MAIL, STEP(EOM), STEP(EOM) | STEP(MAIL) },
		/* flags */
		{ 6, 0x1ff, 0x1fffff, 5, 6, 0, 0x35f | MILTER_P_HDR_LEADSPC, STEP(EOM) | STEP(HEADER),
		  STEP(EOM) | STEP(HEADER) },
		{ 6, 0x1ff, 0x1fffff, 6, 6, 0, 0x377 | MILTER_P_RCPT_REJ, STEP(EOM) | STEP(RCPT),
		  STEP(EOM) | STEP(RCPT) },
		{ 6, 0x1ff, 0x1fffff, 7, 6, 0, 0x36f | MILTER_P_SKIP, STEP(EOM) | STEP(BODY),
		  STEP(EOM) | STEP(BODY) },
		{ 2, 0x1ff, 0x7f, 8, 2, 0xff, 0, ALL_STEPS & ~STEP(DATA) & ~STEP(UNKNOWN),
		  ALL_STEPS & ~STEP(DATA) & ~STEP(UNKNOWN) },
		/* the version is capped at 6 */
		{ 7, 0x1ff, 0x1fffff, 0, 6, 0, 0x37f, STEP(EOM), STEP(EOM) },
		{ 0xffffffff, 0x1ff, 0x1fffff, 0, 6, 0, 0x37f, STEP(EOM), STEP(EOM) },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct milter_neg n;
		const char *why = NULL;
		assert_int_equal(milter_negotiate(cases[i].version, cases[i].actions, cases[i].protocol,
						  &wants[cases[i].want].w, &n, &why), 0);
		if (n.version != cases[i].r_version || n.actions != cases[i].r_actions ||
		    n.protocol != cases[i].r_protocol || n.reply_steps != cases[i].reply_steps ||
		    n.send_steps != cases[i].send_steps)
			fail_msg("case %zu (%s): got v%u a=0x%x p=0x%x reply=0x%x send=0x%x, expected "
				 "v%u a=0x%x p=0x%x reply=0x%x send=0x%x", i, wants[cases[i].want].name,
				 n.version, n.actions, n.protocol, n.reply_steps, n.send_steps,
				 cases[i].r_version, cases[i].r_actions, cases[i].r_protocol,
				 cases[i].reply_steps, cases[i].send_steps);
	}
}

static void test_negotiate_old_version(void **state)
{
	(void)state;
	for (uint32_t v = 0; v < 2; v++) {
		struct milter_neg n;
		memset(&n, 0x77, sizeof(n));
		const char *why = NULL;
		assert_int_equal(milter_negotiate(v, 0x1ff, 0x1fffff, &wants[1].w, &n, &why), -EPROTO);
		assert_non_null(why);
		unsigned char fill[sizeof(n)];
		memset(fill, 0x77, sizeof(fill));
		assert_memory_equal(&n, fill, sizeof(n));
	}
}

/* ---- OPTNEG reply ----------------------------------------------------------------- */

static void test_put_optneg(void **state)
{
	(void)state;
	struct buf out;
	buf_init(&out, 1 << 20);
	struct milter_neg n = { .version = 6, .actions = 0x101, .protocol = 0x37f };
	const char *macros[MILTER_MACROS_COUNT] = {
		[MILTER_MACROS_CONNECT] = "{client_addr} j",
		[MILTER_MACROS_HELO] = "",
		[MILTER_MACROS_EOM] = "i",
		[MILTER_MACROS_EOH] = "{x}",
	};
	/* without symlist the lists are not sent */
	assert_int_equal(milter_put_optneg(&out, &n, macros), 0);
	assert_bytes(&out, LIT("\0\0\0\x0d" "O" "\0\0\0\x06" "\0\0\x01\x01" "\0\0\x03\x7f"));
	buf_reset(&out);
	/* with symlist, in stage-index order, empty lists left out, EOM (5) before EOH (6) */
	n.symlist = true;
	assert_int_equal(milter_put_optneg(&out, &n, macros), 0);
	assert_bytes(&out, LIT("\0\0\0\x2f" "O" "\0\0\0\x06" "\0\0\x01\x01" "\0\0\x03\x7f"
			       "\0\0\0\0" "{client_addr} j\0"
			       "\0\0\0\x05" "i\0"
			       "\0\0\0\x06" "{x}\0"));
	assert_int_equal(get_u32(out.ptr), out.len - 4);
	buf_reset(&out);
	/* NULL lists */
	const char *none[MILTER_MACROS_COUNT] = { 0 };
	assert_int_equal(milter_put_optneg(&out, &n, none), 0);
	assert_int_equal(out.len, 17);
	buf_reset(&out);
	/* a list that would not fit in 64K */
	char *big = malloc(70000);
	assert_non_null(big);
	memset(big, 'x', 69999);
	big[69999] = '\0';
	const char *huge[MILTER_MACROS_COUNT] = { [MILTER_MACROS_DATA] = big };
	assert_int_equal(milter_put_optneg(&out, &n, huge), -EINVAL);
	assert_int_equal(out.len, 0);
	free(big);
	buf_done(&out);
}

/* ---- replies ---------------------------------------------------------------------- */

static void test_put_simple(void **state)
{
	(void)state;
	static const char codes[] = "carttydsp4";
	struct buf out;
	buf_init(&out, 64);
	for (size_t i = 0; i < sizeof(codes) - 1; i++) {
		buf_reset(&out);
		assert_int_equal(milter_put_simple(&out, (uint8_t)codes[i]), 0);
		char expect[5] = { 0, 0, 0, 1, codes[i] };
		assert_bytes(&out, expect, 5);
	}
	buf_done(&out);
}

static const struct {
	const char *text;
	size_t len;
	const char *payload; /* NULL: refused */
	size_t plen;
} replycode_cases[] = {
	{ LIT("550 5.7.1 Message refused"), LIT("550 5.7.1 Message refused\0") },
	{ LIT("451 4.7.1 Try again later"), LIT("451 4.7.1 Try again later\0") },
	{ LIT("550 Refused"), LIT("550 Refused\0") },
	{ LIT("421 4.3.2 Shutting down"), LIT("421 4.3.2 Shutting down\0") },
	{ LIT("550 5.7.1 x"), LIT("550 5.7.1 x\0") },
	{ LIT("550 5.7.1"), LIT("550 5.7.1\0") },
	/* multi-line: continuation markers set, CRLF joins */
	{ LIT("550-5.7.1 first\r\n550 5.7.1 last"), LIT("550-5.7.1 first\r\n550 5.7.1 last\0") },
	{ LIT("550 5.7.1 first\n550 5.7.1 last"), LIT("550-5.7.1 first\r\n550 5.7.1 last\0") },
	{ LIT("550-5.7.1 a\n550-5.7.1 b\n550-5.7.1 c"),
	  LIT("550-5.7.1 a\r\n550-5.7.1 b\r\n550 5.7.1 c\0") },
	{ LIT("450 a\r\n450 b\n450 c\r\n"), LIT("450-a\r\n450-b\r\n450 c\0") },
	{ LIT("550 5.7.1 trailing newline\n"), LIT("550 5.7.1 trailing newline\0") },
	/* percent doubled */
	{ LIT("452 4.2.2 Mailbox 100% full"), LIT("452 4.2.2 Mailbox 100%% full\0") },
	{ LIT("550 %%s %"), LIT("550 %%%%s %%\0") },
	{ LIT("550-a%\n550 b%"), LIT("550-a%%\r\n550 b%%\0") },
	/* tabs and 8-bit bytes are kept */
	{ LIT("550 5.7.1 tab\there caf\xc3\xa9"), LIT("550 5.7.1 tab\there caf\xc3\xa9\0") },
	/* refused */
	{ LIT(""), NULL, 0 },
	{ LIT("250 2.0.0 Ok"), NULL, 0 },
	{ LIT("354 go ahead"), NULL, 0 },
	{ LIT("221 bye"), NULL, 0 },
	{ LIT("650 x"), NULL, 0 },
	{ LIT("550"), NULL, 0 },
	{ LIT("550 "), NULL, 0 },
	{ LIT("550\r\n"), NULL, 0 },
	{ LIT("55 x"), NULL, 0 },
	{ LIT("5a0 x"), NULL, 0 },
	{ LIT("550xtext"), NULL, 0 },
	{ LIT("550 4.7.1 class mismatch"), NULL, 0 },
	{ LIT("450 5.7.1 class mismatch"), NULL, 0 },
	{ LIT("550-5.7.1 ok\r\n550 4.7.1 mismatch on line 2"), NULL, 0 },
	{ LIT("550 a\n450 b"), NULL, 0 },
	{ LIT("550 a\n551 b"), NULL, 0 },
	{ LIT("550 a\n\n550 b"), NULL, 0 },
	{ LIT("550 a\r\n\r\n"), NULL, 0 },
	{ LIT("550 a\0b"), NULL, 0 },
	{ LIT("550 a\x01"), NULL, 0 },
	{ LIT("550 a\rb"), NULL, 0 },
	{ LIT("550 a\x1b[0m"), NULL, 0 },
};

static void test_put_replycode_table(void **state)
{
	(void)state;
	struct buf out;
	buf_init(&out, 1 << 20);
	for (size_t i = 0; i < ARRAY_SIZE(replycode_cases); i++) {
		buf_reset(&out);
		assert_int_equal(buf_append(&out, "keep", 4), 0);
		struct str text = str_make(replycode_cases[i].text, replycode_cases[i].len);
		const char *why = NULL;
		int chk = milter_reply_check(text, &why);
		int r = milter_put_replycode(&out, text);
		if (!replycode_cases[i].payload) {
			if (r != -EINVAL || chk != -EINVAL)
				fail_msg("case %zu \"%s\": accepted", i, replycode_cases[i].text);
			assert_non_null(why);
			assert_int_equal(out.len, 4);
			continue;
		}
		if (r != 0 || chk != 0)
			fail_msg("case %zu \"%s\": refused: %s", i, replycode_cases[i].text, why);
		size_t plen = replycode_cases[i].plen;
		assert_int_equal(out.len, 4 + 5 + plen);
		assert_memory_equal(out.ptr, "keep", 4);
		assert_int_equal(get_u32(out.ptr + 4), plen + 1);
		assert_int_equal(out.ptr[8], 'y');
		if (memcmp(out.ptr + 9, replycode_cases[i].payload, plen) != 0) {
			struct dump a = { .pos = 0 };
			dump_str(&a, str_make(out.ptr + 9, plen));
			fail_msg("case %zu: payload %s", i, a.buf);
		}
	}
	buf_done(&out);
}

/* Line count and line length limits, at and past the boundary. */
static void test_put_replycode_limits(void **state)
{
	(void)state;
	struct buf text, out;
	buf_init(&text, 1 << 20);
	buf_init(&out, 1 << 20);
	/* 32 lines of 980 text bytes, all '%' (doubled on the wire): accepted, < 64K */
	for (int i = 0; i < 32; i++) {
		assert_int_equal(buf_append(&text, "550 ", 4), 0);
		for (int k = 0; k < 980; k++)
			assert_int_equal(buf_append_byte(&text, '%'), 0);
		if (i < 31)
			assert_int_equal(buf_append(&text, "\r\n", 2), 0);
	}
	assert_int_equal(milter_put_replycode(&out, buf_str(&text)), 0);
	size_t expect = 32 * (4 + 1960) + 31 * 2 + 1;
	assert_int_equal(out.len, 5 + expect);
	assert_int_equal(get_u32(out.ptr), expect + 1);
	assert_true(expect + 1 <= MILTER_DATA_64K);
	assert_memory_equal(out.ptr + 5, "550-%%%%", 8);
	assert_memory_equal(out.ptr + out.len - 1 - 1960 - 4, "550 ", 4);
	/* a 33rd line */
	buf_reset(&out);
	assert_int_equal(buf_append(&text, "\r\n550 x", 7), 0);
	const char *why = NULL;
	assert_int_equal(milter_reply_check(buf_str(&text), &why), -EINVAL);
	assert_string_equal(why, "more than 32 lines");
	assert_int_equal(milter_put_replycode(&out, buf_str(&text)), -EINVAL);
	assert_int_equal(out.len, 0);
	/* 981 bytes on a line */
	buf_reset(&text);
	assert_int_equal(buf_append(&text, "550 ", 4), 0);
	for (int k = 0; k < 981; k++)
		assert_int_equal(buf_append_byte(&text, 'x'), 0);
	assert_int_equal(milter_reply_check(buf_str(&text), &why), -EINVAL);
	assert_string_equal(why, "a line is longer than 980 bytes");
	text.len--;
	assert_int_equal(milter_reply_check(buf_str(&text), &why), 0);
	/* a long second line */
	buf_reset(&text);
	assert_int_equal(buf_append(&text, "550-short\n550 ", 14), 0);
	for (int k = 0; k < 981; k++)
		assert_int_equal(buf_append_byte(&text, 'x'), 0);
	assert_int_equal(milter_put_replycode(&out, buf_str(&text)), -EINVAL);
	/* whole reply over 64 K in one line is impossible: 980 bytes cap it */
	buf_done(&text);
	buf_done(&out);
}

static void test_put_header(void **state)
{
	(void)state;
	struct buf out;
	buf_init(&out, 4 << 20);
	assert_int_equal(milter_put_header(&out, 'h', 99, str_cstr("X-Spam"), str_cstr("yes")), 0);
	assert_bytes(&out, LIT("\0\0\0\x0c" "hX-Spam\0yes\0"));
	buf_reset(&out);
	assert_int_equal(milter_put_header(&out, 'i', 0, str_cstr("X-First"), str_cstr(" v")), 0);
	assert_bytes(&out, LIT("\0\0\0\x10" "i\0\0\0\0X-First\0 v\0"));
	buf_reset(&out);
	assert_int_equal(milter_put_header(&out, 'm', 0x01020304, str_cstr("Subject"), str_make("", 0)), 0);
	assert_bytes(&out, LIT("\0\0\0\x0e" "m\x01\x02\x03\x04Subject\0\0"));
	buf_reset(&out);
	/* folded value with bare LF kept as is; STR_NULL value as empty */
	assert_int_equal(milter_put_header(&out, 'h', 0, str_cstr("X-F"), str_cstr("a\n\tb")), 0);
	assert_bytes(&out, LIT("\0\0\0\x0a" "hX-F\0a\n\tb\0"));
	buf_reset(&out);
	assert_int_equal(milter_put_header(&out, 'm', 2, str_cstr("X-Del"), STR_NULL), 0);
	assert_bytes(&out, LIT("\0\0\0\x0c" "m\0\0\0\x02X-Del\0\0"));
	buf_reset(&out);
	/* refused: empty name, NUL in name or value; nothing appended */
	assert_int_equal(buf_append(&out, "k", 1), 0);
	assert_int_equal(milter_put_header(&out, 'h', 0, str_make("", 0), str_cstr("v")), -EINVAL);
	assert_int_equal(milter_put_header(&out, 'h', 0, str_make("a\0b", 3), str_cstr("v")), -EINVAL);
	assert_int_equal(milter_put_header(&out, 'i', 0, str_cstr("a"), str_make("v\0w", 3)), -EINVAL);
	/* a value above the 1M packet limit */
	char *big = malloc(MILTER_DATA_1M + 1);
	assert_non_null(big);
	memset(big, 'v', MILTER_DATA_1M + 1);
	assert_int_equal(milter_put_header(&out, 'h', 0, str_cstr("X-Big"), str_make(big, MILTER_DATA_1M)),
			 -EINVAL);
	assert_int_equal(out.len, 1);
	/* the largest that fits: 1 + name + 1 + value + 1 == MILTER_DATA_1M */
	assert_int_equal(milter_put_header(&out, 'h', 0, str_cstr("X"),
					   str_make(big, MILTER_DATA_1M - 4)), 0);
	assert_int_equal(get_u32(out.ptr + 1), MILTER_DATA_1M);
	free(big);
	buf_done(&out);
}

static void test_put_addr(void **state)
{
	(void)state;
	struct buf out;
	buf_init(&out, 1 << 20);
	static const struct {
		uint8_t code;
		const char *addr, *args;
		const char *bytes;
		size_t len;
	} cases[] = {
		{ '+', "<new@example.org>", "", LIT("\0\0\0\x13" "+<new@example.org>\0") },
		{ '+', "<new@example.org>", "NOTIFY=NEVER", LIT("\0\0\0\x13" "+<new@example.org>\0") },
		{ '-', "<old@example.org>", "ignored", LIT("\0\0\0\x13" "-<old@example.org>\0") },
		{ '2', "<p@example.org>", "NOTIFY=SUCCESS,FAILURE",
		  LIT("\0\0\0\x28" "2<p@example.org>\0NOTIFY=SUCCESS,FAILURE\0") },
		{ '2', "<p@example.org>", "", LIT("\0\0\0\x11" "2<p@example.org>\0") },
		{ 'e', "<bounce@example.org>", "RET=HDRS", LIT("\0\0\0\x1f" "e<bounce@example.org>\0RET=HDRS\0") },
		{ 'e', "<>", "", LIT("\0\0\0\x04" "e<>\0") },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		buf_reset(&out);
		assert_int_equal(milter_put_addr(&out, cases[i].code, str_cstr(cases[i].addr),
						 str_cstr(cases[i].args)), 0);
		assert_bytes(&out, cases[i].bytes, cases[i].len);
	}
	/* STR_NULL args */
	buf_reset(&out);
	assert_int_equal(milter_put_addr(&out, 'e', str_cstr("<a>"), STR_NULL), 0);
	assert_bytes(&out, LIT("\0\0\0\x05" "e<a>\0"));
	/* refused */
	buf_reset(&out);
	assert_int_equal(milter_put_addr(&out, '+', str_make("", 0), STR_NULL), -EINVAL);
	assert_int_equal(milter_put_addr(&out, '-', str_make("<a\0b>", 5), STR_NULL), -EINVAL);
	assert_int_equal(milter_put_addr(&out, 'e', str_cstr("<a>"), str_make("X=1\0", 4)), -EINVAL);
	assert_int_equal(milter_put_addr(&out, '2', str_cstr("<a>"), str_make("X=\0", 3)), -EINVAL);
	char *big = malloc(MILTER_DATA_64K);
	assert_non_null(big);
	memset(big, 'a', MILTER_DATA_64K);
	assert_int_equal(milter_put_addr(&out, '+', str_make(big, MILTER_DATA_64K - 1), STR_NULL), -EINVAL);
	assert_int_equal(out.len, 0);
	assert_int_equal(milter_put_addr(&out, '+', str_make(big, MILTER_DATA_64K - 2), STR_NULL), 0);
	assert_int_equal(get_u32(out.ptr), MILTER_DATA_64K);
	buf_reset(&out);
	assert_int_equal(milter_put_addr(&out, 'e', str_cstr("<a>"), str_make(big, MILTER_DATA_64K - 5)),
			 -EINVAL);
	assert_int_equal(milter_put_addr(&out, 'e', str_cstr("<a>"), str_make(big, MILTER_DATA_64K - 6)),
			 0);
	free(big);
	buf_done(&out);
}

static void test_put_quarantine(void **state)
{
	(void)state;
	struct buf out;
	buf_init(&out, 1 << 20);
	assert_int_equal(milter_put_quarantine(&out, str_cstr("spam score 12.5")), 0);
	assert_bytes(&out, LIT("\0\0\0\x11" "qspam score 12.5\0"));
	buf_reset(&out);
	assert_int_equal(milter_put_quarantine(&out, str_make("", 0)), -EINVAL);
	assert_int_equal(milter_put_quarantine(&out, str_make("a\0b", 3)), -EINVAL);
	char *big = malloc(MILTER_DATA_64K);
	assert_non_null(big);
	memset(big, 'r', MILTER_DATA_64K);
	assert_int_equal(milter_put_quarantine(&out, str_make(big, MILTER_DATA_64K - 1)), -EINVAL);
	assert_int_equal(out.len, 0);
	assert_int_equal(milter_put_quarantine(&out, str_make(big, MILTER_DATA_64K - 2)), 0);
	assert_int_equal(get_u32(out.ptr), MILTER_DATA_64K);
	free(big);
	buf_done(&out);
}

/* Walks the 'b' packets in out and checks they rebuild body, each <= 65535 bytes. */
static size_t check_replbody(const struct buf *out, const char *body, size_t len)
{
	size_t off = 0, got = 0, packets = 0;
	while (off < out->len) {
		struct milter_frame f;
		const char *why = NULL;
		assert_int_equal(milter_frame_parse(out->ptr + off, out->len - off, MILTER_DATA_64K + 1,
						    &f, &why), 1);
		assert_int_equal(f.code, 'b');
		assert_true(f.data.len <= MILTER_DATA_64K);
		assert_true(got + f.data.len <= len);
		assert_memory_equal(f.data.ptr, body + got, f.data.len);
		got += f.data.len;
		off += f.size;
		packets++;
		/* every packet but the last is full */
		if (off < out->len)
			assert_int_equal(f.data.len, MILTER_DATA_64K);
	}
	assert_int_equal(got, len);
	return packets;
}

static void test_put_replbody(void **state)
{
	(void)state;
	static const struct {
		size_t len;
		size_t packets;
	} cases[] = {
		{ 0, 1 }, { 1, 1 }, { 65534, 1 }, { 65535, 1 }, { 65536, 2 }, { 131070, 2 },
		{ 131071, 3 }, { 200000, 4 },
	};
	char *body = malloc(200000);
	assert_non_null(body);
	for (size_t i = 0; i < 200000; i++)
		body[i] = "line of text\r\n"[i % 14];
	body[100] = '\0'; /* raw: NUL allowed */
	struct buf out;
	buf_init(&out, 1 << 20);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		buf_reset(&out);
		assert_int_equal(milter_put_replbody(&out, str_make(body, cases[i].len)), 0);
		assert_int_equal(check_replbody(&out, body, cases[i].len), cases[i].packets);
		assert_int_equal(out.len, cases[i].len + 5 * cases[i].packets);
	}
	/* 200000 bytes: 3 x 65535 + 3395 */
	buf_reset(&out);
	assert_int_equal(milter_put_replbody(&out, str_make(body, 200000)), 0);
	assert_int_equal(get_u32(out.ptr), 65536);
	assert_int_equal(get_u32(out.ptr + 3 * 65540), 3396);
	/* a buffer that fills up half way: nothing is left behind */
	struct buf small;
	buf_init(&small, 100000);
	assert_int_equal(buf_append(&small, "x", 1), 0);
	assert_int_equal(milter_put_replbody(&small, str_make(body, 200000)), -ENOBUFS);
	assert_int_equal(small.len, 1);
	buf_done(&small);
	buf_done(&out);
	free(body);
}

/*
 * An encoder that fails leaves the buffer as it was (buf.h promises it for one append;
 * the encoders that append a packet in several pieces must undo the pieces).
 */
static void test_encoders_atomic(void **state)
{
	(void)state;
	/* which encoders left bytes behind, and the first max where they did */
	struct dump bad = { .pos = 0 };
	bad.buf[0] = '\0';
	bool seen[7] = { false };
	static const char *const names[7] = { "milter_put_simple", "milter_put_header",
					      "milter_put_addr", "milter_put_quarantine",
					      "milter_put_replycode", "milter_put_replbody",
					      "milter_put_optneg" };
	for (size_t max = 0; max < 40; max++) {
		for (int e = 0; e < 7; e++) {
			struct buf b;
			buf_init(&b, max);
			int r = 0;
			struct milter_neg n = { .version = 6, .symlist = true };
			const char *m[MILTER_MACROS_COUNT] = { "j", "{a} {b}" };
			switch (e) {
			case 0: r = milter_put_simple(&b, 'c'); break;
			case 1: r = milter_put_header(&b, 'i', 3, str_cstr("Name"), str_cstr("value")); break;
			case 2: r = milter_put_addr(&b, '2', str_cstr("<a@b>"), str_cstr("X=1")); break;
			case 3: r = milter_put_quarantine(&b, str_cstr("reason")); break;
			case 4: r = milter_put_replycode(&b, str_cstr("550-5.7.1 a\n550 5.7.1 b%")); break;
			case 5: r = milter_put_replbody(&b, str_cstr("body\r\n")); break;
			case 6: r = milter_put_optneg(&b, &n, m); break;
			}
			if (r != 0 && b.len != 0 && !seen[e]) {
				seen[e] = true;
				dump_printf(&bad, "\n  %s: max %zu, returned %d, left %zu bytes", names[e],
					    max, r, b.len);
			}
			buf_done(&b);
		}
	}
	if (bad.pos)
		fail_msg("encoders not atomic on failure:%s", bad.buf);
}

/* ---- step names ------------------------------------------------------------------- */

static void test_step_names(void **state)
{
	(void)state;
	static const char *const names[MILTER_STEP_COUNT] = {
		"connect", "helo", "mail", "rcpt", "data", "header", "eoh", "body", "eom", "unknown",
	};
	for (int s = 0; s < MILTER_STEP_COUNT; s++) {
		assert_string_equal(milter_step_name((enum milter_step)s), names[s]);
		enum milter_step r = MILTER_STEP_COUNT;
		assert_int_equal(milter_step_from_name(milter_step_name((enum milter_step)s), &r), 0);
		assert_int_equal(r, s);
	}
	static const char *const bad[] = { "", "CONNECT", "con", "eom ", "end", "?" };
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		enum milter_step r = MILTER_STEP_BODY;
		assert_int_equal(milter_step_from_name(bad[i], &r), -EINVAL);
		assert_int_equal(r, MILTER_STEP_BODY);
	}
	assert_string_equal(milter_step_name(MILTER_STEP_COUNT), "?");
	assert_string_equal(milter_step_name((enum milter_step)-1), "?");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frame_prefixes),
		cmocka_unit_test(test_frame_bad_length),
		cmocka_unit_test(test_frame_back_to_back),
		cmocka_unit_test(test_decode_table),
		cmocka_unit_test(test_decode_macro_counts),
		cmocka_unit_test(test_decode_esmtp_counts),
		cmocka_unit_test(test_decode_codes),
		cmocka_unit_test(test_negotiate_matrix),
		cmocka_unit_test(test_negotiate_exact),
		cmocka_unit_test(test_negotiate_old_version),
		cmocka_unit_test(test_put_optneg),
		cmocka_unit_test(test_put_simple),
		cmocka_unit_test(test_put_replycode_table),
		cmocka_unit_test(test_put_replycode_limits),
		cmocka_unit_test(test_put_header),
		cmocka_unit_test(test_put_addr),
		cmocka_unit_test(test_put_quarantine),
		cmocka_unit_test(test_put_replbody),
		cmocka_unit_test(test_encoders_atomic),
		cmocka_unit_test(test_step_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
