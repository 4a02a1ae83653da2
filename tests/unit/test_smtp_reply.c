/*
 * test_smtp_reply -- the SMTP reply reader (src/proto/smtp_reply.c): replies as relays
 * send them, malformed ones, the limits, and every way of cutting the input.
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

#include "smtp_reply.h"

struct rcase {
	const char *in;
	int result;        /* 1, 0 or -EPROTO */
	int code;
	const char *enh;   /* "4.7.28" or "" */
	const char *text;
	size_t lines;
	size_t len;        /* of in, when it holds a NUL; 0: strlen */
};

static const struct rcase cases[] = {
	{ "250 2.0.0 Ok: queued as 4XyZ\r\n", 1, 250, "2.0.0", "2.0.0 Ok: queued as 4XyZ", 1, 0 },
	{ "220 mx.example.org ESMTP\r\n", 1, 220, "", "mx.example.org ESMTP", 1, 0 },
	{ "250-mx.example.org\r\n250-PIPELINING\r\n250 8BITMIME\r\n", 1, 250, "",
	  "mx.example.org PIPELINING 8BITMIME", 3, 0 },
	{ "421 4.7.28 Unusual rate of mail\r\n", 1, 421, "4.7.28", "4.7.28 Unusual rate of mail", 1, 0 },
	{ "550-5.7.1 Daily quota exceeded.\r\n550 5.7.1 Try again in 92 seconds\r\n", 1, 550,
	  "5.7.1", "5.7.1 Daily quota exceeded. 5.7.1 Try again in 92 seconds", 2, 0 },
	{ "354\r\n", 1, 354, "", "", 1, 0 },
	{ "250 ok\n", 1, 250, "", "ok", 1, 0 },                 /* bare LF */
	{ "250 5.0.0 class differs\r\n", 1, 250, "", "5.0.0 class differs", 1, 0 },
	{ "451 4.3.0\r\n", 1, 451, "4.3.0", "4.3.0", 1, 0 },
	{ "450 4.2.1x not enhanced\r\n", 1, 450, "", "4.2.1x not enhanced", 1, 0 },
	{ "250-partial\r\n", 0, 0, "", "", 0, 0 },
	{ "250 no end", 0, 0, "", "", 0, 0 },
	{ "", 0, 0, "", "", 0, 0 },
	{ "25\r\n", -EPROTO, 0, "", "", 0, 0 },
	{ "199 low\r\n", -EPROTO, 0, "", "", 0, 0 },
	{ "600 high\r\n", -EPROTO, 0, "", "", 0, 0 },
	{ "2a0 x\r\n", -EPROTO, 0, "", "", 0, 0 },
	{ "250_x\r\n", -EPROTO, 0, "", "", 0, 0 },
	{ "250-a\r\n251 b\r\n", -EPROTO, 0, "", "", 0, 0 },
	{ "250 a\0b\r\n", -EPROTO, 0, "", "", 0, 9 },
};

static void check_case(const struct rcase *c, const char *in, size_t n)
{
	/* whole, then cut at every point (the reader keeps its state between calls) */
	for (size_t cut = 0; cut <= n; cut++) {
		struct smtp_reply_reader rd;
		smtp_reply_reader_init(&rd);
		struct smtp_reply r;
		size_t used = 0, off = 0;
		int res = smtp_reply_read(&rd, in, cut, &r, &used, NULL);
		if (res == 0) {
			off = used;
			res = smtp_reply_read(&rd, in + off, n - off, &r, &used, NULL);
		}
		assert_int_equal(res, c->result);
		if (res != 1)
			continue;
		assert_int_equal(off + used, n);
		assert_int_equal(r.code, c->code);
		assert_int_equal(r.lines, c->lines);
		assert_string_equal(r.text, c->text);
		char enh[32] = "";
		if (r.enh_class)
			snprintf(enh, sizeof(enh), "%d.%d.%d", r.enh_class, r.enh_subject, r.enh_detail);
		assert_string_equal(enh, c->enh);
	}
}

static void test_cases(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct rcase *c = &cases[i];
		check_case(c, c->in, c->len ? c->len : strlen(c->in));
	}
}

static void test_two_replies_in_one_read(void **state)
{
	(void)state;
	const char *in = "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 go\r\n";
	struct smtp_reply_reader rd;
	smtp_reply_reader_init(&rd);
	struct smtp_reply r;
	size_t used, off = 0;
	int codes[] = { 250, 250, 354 };
	for (int i = 0; i < 3; i++) {
		assert_int_equal(smtp_reply_read(&rd, in + off, strlen(in) - off, &r, &used, NULL), 1);
		assert_int_equal(r.code, codes[i]);
		off += used;
	}
	assert_int_equal(off, strlen(in));
	assert_int_equal(smtp_reply_read(&rd, in + off, 0, &r, &used, NULL), 0);
}

static void test_limits(void **state)
{
	(void)state;
	struct smtp_reply_reader rd;
	struct smtp_reply r;
	size_t used;
	const char *why = NULL;

	/* a line of exactly the limit (CRLF included) passes; one more octet does not */
	char *line = malloc(SMTP_REPLY_LINE_MAX + 8);
	assert_non_null(line);
	memset(line, 'x', SMTP_REPLY_LINE_MAX + 8);
	memcpy(line, "250 ", 4);
	memcpy(line + SMTP_REPLY_LINE_MAX - 2, "\r\n", 2);
	smtp_reply_reader_init(&rd);
	assert_int_equal(smtp_reply_read(&rd, line, SMTP_REPLY_LINE_MAX, &r, &used, NULL), 1);
	assert_int_equal(r.text_len, SMTP_REPLY_TEXT_MAX); /* kept text is cut, not refused */
	memset(line, 'x', SMTP_REPLY_LINE_MAX + 8);
	memcpy(line, "250 ", 4);
	memcpy(line + SMTP_REPLY_LINE_MAX - 1, "\r\n", 2);
	smtp_reply_reader_init(&rd);
	assert_int_equal(smtp_reply_read(&rd, line, SMTP_REPLY_LINE_MAX + 1, &r, &used, &why),
			 -EPROTO);
	assert_non_null(why);
	/* and when no LF comes at all, the reader says so once the limit is reached */
	smtp_reply_reader_init(&rd);
	assert_int_equal(smtp_reply_read(&rd, line, SMTP_REPLY_LINE_MAX - 1, &r, &used, NULL), 0);
	assert_int_equal(smtp_reply_read(&rd, line, SMTP_REPLY_LINE_MAX, &r, &used, NULL), -EPROTO);
	free(line);

	/* SMTP_REPLY_LINES lines pass, one more does not */
	size_t cap = (SMTP_REPLY_LINES + 2) * 8;
	char *many = malloc(cap);
	assert_non_null(many);
	for (int extra = 0; extra < 2; extra++) {
		size_t n = 0, total = SMTP_REPLY_LINES + (size_t)extra;
		for (size_t i = 0; i + 1 < total; i++) {
			memcpy(many + n, "250-a\r\n", 7);
			n += 7;
		}
		memcpy(many + n, "250 b\r\n", 7);
		n += 7;
		smtp_reply_reader_init(&rd);
		assert_int_equal(smtp_reply_read(&rd, many, n, &r, &used, NULL), extra ? -EPROTO : 1);
	}
	free(many);
}

/* The EHLO keyword reader that both SMTP clients use. */
static void test_ehlo(void **state)
{
	(void)state;
	static const char *lines[] = {
		"PIPELINING", "size 10485760", "AUTH=LOGIN PLAIN", "auth cram-md5 XOAUTH2",
		"AUTH A-VERY-LONG-MECHANISM-NAME-OVER-TWENTY", "DSN", "8BITMIME", "SMTPUTF8",
		"STARTTLS", "X-UNKNOWN keyword", "", "SIZEX 5",
	};
	struct smtp_ehlo e;
	memset(&e, 0, sizeof(e));
	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
		smtp_ehlo_line(&e, str_cstr(lines[i]));
	assert_int_equal(e.ext, SMTP_EHLO_PIPELINING | SMTP_EHLO_SIZE | SMTP_EHLO_AUTH |
				SMTP_EHLO_DSN | SMTP_EHLO_8BITMIME | SMTP_EHLO_SMTPUTF8 |
				SMTP_EHLO_STARTTLS);
	assert_int_equal(e.size_max, 10485760);
	/* upper case, in order, the over-long name dropped */
	assert_string_equal(e.auth, "LOGIN PLAIN CRAM-MD5 XOAUTH2");

	memset(&e, 0, sizeof(e));
	smtp_ehlo_line(&e, str_cstr("SIZE 99999999999999999999999"));
	assert_int_equal(e.ext, SMTP_EHLO_SIZE);
	assert_int_equal(e.size_max, 0); /* not a number we can hold: no limit known */
	smtp_ehlo_line(&e, str_cstr("SIZE"));
	assert_int_equal(e.size_max, 0);

	/* a flood of mechanisms stops at the buffer, terminated */
	memset(&e, 0, sizeof(e));
	for (int i = 0; i < 100; i++)
		smtp_ehlo_line(&e, str_cstr("AUTH MECHANISM-NAME1 MECHANISM-NAME2"));
	assert_true(strlen(e.auth) < sizeof(e.auth));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cases),
		cmocka_unit_test(test_two_replies_in_one_read),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_ehlo),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
