/*
 * fuzz_dsn_params -- libFuzzer target for the DSN parameters of the SMTP server codec
 * (RFC 3461, src/proto/smtp.c): xtext both ways, and NOTIFY=, ORCPT=, RET=, ENVID= as
 * smtp_parse_mail() and smtp_parse_rcpt() read them.
 *
 * Input: the parameters that follow a path, as a client sends them ("NOTIFY=... ORCPT=").
 * The input is also taken whole as xtext.
 *
 * Checks, against rules written here independently: smtp_xtext_decode() accepts only
 * xtext whose bytes decode to 0x20..0x7e and never lengthens; encoding what it decoded and
 * decoding that again gives the same bytes; encoding any input gives bytes that are all
 * xchar or "+XX" and decode back to the input when it is printable ASCII.  A MAIL or
 * RCPT accepted with DSN parameters returns values within their limits (ENVID 1..100
 * characters, ORCPT 1..500 with its type), slices inside the input, a NOTIFY that is
 * NEVER alone or a set of the others, and results within the documented codes.
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
			fprintf(stderr, "fuzz_dsn_params: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #x);                                              \
			abort();                                                            \
		}                                                                           \
	} while (0)

#define MAX_IN 2048

static bool inside(struct str s, const char *p, size_t n)
{
	return s.len == 0 || (s.ptr >= p && s.ptr + s.len <= p + n);
}

static bool is_xchar(unsigned char c)
{
	return c >= 0x21 && c <= 0x7e && c != '+' && c != '=';
}

static bool is_hex_upper(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
}

/* the xtext of RFC 3461 4 with any-case hex, decoding to printable ASCII: a reference */
static bool ref_xtext_ok(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (is_xchar(s[i]))
			continue;
		if (s[i] != '+' || n - i < 3)
			return false;
		char h[3] = { (char)s[i + 1], (char)s[i + 2], 0 };
		char *end;
		for (int k = 0; k < 2; k++)
			if (!((h[k] >= '0' && h[k] <= '9') ||
			      ((h[k] | 0x20) >= 'a' && (h[k] | 0x20) <= 'f')))
				return false;
		unsigned long v = strtoul(h, &end, 16);
		if (v < 0x20 || v > 0x7e)
			return false;
		i += 2;
	}
	return true;
}

static void check_xtext(const uint8_t *data, size_t size)
{
	char dec[MAX_IN], enc[3 * MAX_IN], dec2[3 * MAX_IN];
	size_t dn = 0, en = 0, dn2 = 0;
	struct str in = str_make((const char *)data, size);
	int r = smtp_xtext_decode(in, dec, sizeof(dec), &dn);
	CHECK(r == 0 || r == -EINVAL);
	CHECK((r == 0) == ref_xtext_ok(data, size));
	if (r == 0) {
		CHECK(dn <= size);
		for (size_t i = 0; i < dn; i++)
			CHECK(dec[i] >= 0x20 && dec[i] <= 0x7e);
		CHECK(smtp_xtext_encode(str_make(dec, dn), enc, sizeof(enc), &en) == 0);
		CHECK(smtp_xtext_decode(str_make(enc, en), dec2, sizeof(dec2), &dn2) == 0);
		CHECK(dn2 == dn && memcmp(dec, dec2, dn) == 0);
		/* a buffer one short is refused, not overrun */
		if (dn > 0)
			CHECK(smtp_xtext_decode(in, dec2, dn - 1, &dn2) == -ENOBUFS);
	}
	/* any bytes encode to xtext of xchar and "+XX" */
	CHECK(smtp_xtext_encode(in, enc, sizeof(enc), &en) == 0);
	CHECK(en >= size && en <= 3 * size);
	for (size_t i = 0; i < en; i++) {
		if (enc[i] == '+') {
			CHECK(i + 2 < en && is_hex_upper((unsigned char)enc[i + 1]) &&
			      is_hex_upper((unsigned char)enc[i + 2]));
			i += 2;
		} else {
			CHECK(is_xchar((unsigned char)enc[i]));
		}
	}
	if (size > 0)
		CHECK(smtp_xtext_encode(in, enc, en - 1, &en) == -ENOBUFS);
}

static void check_params(const uint8_t *data, size_t size)
{
	static const char mail_pre[] = "<a@example.org> ", rcpt_pre[] = "<b@example.net> ";
	char arg[MAX_IN + 32];
	size_t n = strlen(mail_pre);
	memcpy(arg, mail_pre, n);
	memcpy(arg + n, data, size);
	struct smtp_mail m;
	const char *why = NULL;
	int r = smtp_parse_mail(str_make(arg, n + size), true, &m, &why);
	CHECK(r == 0 || r == -EINVAL || r == -EPROTO || r == -ENOTSUP || r == -EILSEQ);
	CHECK(r == 0 || why);
	if (r == 0) {
		CHECK(m.ret == SMTP_RET_NONE || m.ret == SMTP_RET_FULL || m.ret == SMTP_RET_HDRS);
		CHECK(inside(m.envid, arg, n + size));
		CHECK(m.envid.len <= SMTP_DSN_ENVID_MAX);
		if (m.envid.len)
			CHECK(ref_xtext_ok((const unsigned char *)m.envid.ptr, m.envid.len));
	}
	n = strlen(rcpt_pre);
	memcpy(arg, rcpt_pre, n);
	memcpy(arg + n, data, size);
	struct smtp_rcpt rc;
	r = smtp_parse_rcpt(str_make(arg, n + size), true, &rc, &why);
	CHECK(r == 0 || r == -EINVAL || r == -EPROTO || r == -ENOTSUP || r == -EILSEQ);
	if (r == 0) {
		CHECK(rc.notify == 0 || rc.notify == SMTP_NOTIFY_NEVER ||
		      (rc.notify & ~(unsigned)(SMTP_NOTIFY_SUCCESS | SMTP_NOTIFY_FAILURE |
					       SMTP_NOTIFY_DELAY)) == 0);
		CHECK(inside(rc.orcpt_type, arg, n + size) && inside(rc.orcpt, arg, n + size));
		CHECK((rc.orcpt_type.len == 0) == (rc.orcpt.len == 0));
		if (rc.orcpt.len) {
			CHECK(rc.orcpt_type.len + 1 + rc.orcpt.len <= SMTP_DSN_ORCPT_MAX);
			CHECK(rc.orcpt_type.ptr + rc.orcpt_type.len + 1 == rc.orcpt.ptr);
			CHECK(ref_xtext_ok((const unsigned char *)rc.orcpt.ptr, rc.orcpt.len));
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > MAX_IN)
		return 0;
	check_xtext(data, size);
	check_params(data, size);
	return 0;
}
