/*
 * fuzz_retry_hint -- reply classification (src/relay/classify.c) on hostile input: the
 * retry hint parser, and classify_reply() on replies made from the input.
 *
 * Input layout: byte 0 chooses the case, the rest is a server's reply as sent:
 *   bits 0-3  the stage (values past SMTP_STAGE_QUIT are impossible stages, tried too);
 *   bits 4-6  a connection error instead of a reply (0: none; see errors[]);
 *   bit 7     build the reply by hand instead of reading it: bytes 1-2 are the code (any
 *             int16, impossible ones included), byte 3 the enhanced code's class, the
 *             rest the text, cut at SMTP_REPLY_TEXT_MAX.
 * Without bit 7 the rest goes through the SMTP reply reader; when it does not make a
 * reply, it is built by hand as above.
 *
 * Invariants checked: a hint is -1 or 0..7 days, the same for the same text; a verdict
 * is one of the enum; a 2xx reply is OK and nothing else is; an error is never OK; a FAIL
 * without an operator signal is a 5xx or a message that cannot fit the server; for_ms is
 * -1 or within the cap, and without an operator signal it is the text's hint for a 4xx or
 * 5xx that is SUSPEND or SLOW, -1 otherwise; an operator classifier agrees with the plain one whenever no signal matched.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "classify.h"

#define CAP_MS ((int64_t)7 * 24 * 3600 * 1000)

static const int errors[8] = { 0, -ECONNREFUSED, -ETIMEDOUT, -ECONNRESET, -EPROTO,
			       -EHOSTUNREACH, -EMSGSIZE, -EPERM };

static const struct classify_signal_conf signals[] = {
	{ "^4[0-9][0-9] .*try again", CLASSIFY_SLOW, 0, 0, 0 },
	{ "(user|mailbox) unavailable", CLASSIFY_FAIL, 0, 0, 0 },
	{ "^connect: Connection (refused|reset)", CLASSIFY_SUSPEND, 120000, 0, 0 },
	{ "greylist", CLASSIFY_RETRY, 300000, 0, 0 },
	{ "^5[0-9][0-9] 5\\.7\\.[0-9]+ .*(spam|policy)", CLASSIFY_SUSPEND, -1, 0, 0 },
};

static struct classify *plain, *oper;

static void init(void)
{
	if (plain)
		return;
	plain = classify_new(NULL, 0, NULL, 0);
	oper = classify_new(signals, sizeof(signals) / sizeof(signals[0]), NULL, 0);
	if (!plain || !oper)
		abort();
}

static bool is_operator_signal(const char *s)
{
	for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
		if (strcmp(s, signals[i].match) == 0)
			return true;
	return false;
}

static void check_hint(const uint8_t *p, size_t n)
{
	struct str t = str_make((const char *)p, n);
	int64_t a = classify_retry_hint(t);
	if (a != -1 && (a < 0 || a > CAP_MS))
		abort();
	if (classify_retry_hint(t) != a)
		abort();
}

static void check_result(enum smtp_out_stage st, int error, const struct smtp_reply *r,
			 const struct classify_result *res, bool operator)
{
	if ((unsigned)res->verdict > CLASSIFY_SLOW || !res->signal)
		abort();
	if (res->for_ms != -1 && (res->for_ms < 0 || res->for_ms > CAP_MS))
		abort();
	if (error) {
		if (res->verdict == CLASSIFY_OK)
			abort();
		return;
	}
	bool two = r->code >= 200 && r->code <= 299;
	if (two != (res->verdict == CLASSIFY_OK) && !(res->verdict == CLASSIFY_OK &&
						      r->code >= 300 && r->code <= 399))
		abort();
	if (operator)
		return;
	if (res->verdict == CLASSIFY_FAIL && (r->code < 500 || r->code > 599))
		abort();
	/* a hint is read from a 4xx/5xx only: an impossible reply gets the lane's backoff */
	bool failure = r->code >= 400 && r->code <= 599;
	if (failure && (res->verdict == CLASSIFY_SUSPEND || res->verdict == CLASSIFY_SLOW)) {
		size_t tl = r->text_len < SMTP_REPLY_TEXT_MAX ? r->text_len : SMTP_REPLY_TEXT_MAX;
		if (res->for_ms != classify_retry_hint(str_make(r->text, tl)))
			abort();
	} else if (res->for_ms != -1) {
		abort();
	}
	(void)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 65536)
		return 0;
	init();
	check_hint(data + 1, size - 1);

	enum smtp_out_stage st = (enum smtp_out_stage)(data[0] & 0x0f);
	int error = errors[(data[0] >> 4) & 7];
	bool by_hand = data[0] & 0x80;
	const uint8_t *p = data + 1;
	size_t n = size - 1;

	static struct smtp_reply r;
	memset(&r, 0, sizeof(r));
	bool have = false;
	if (!by_hand) {
		struct smtp_reply_reader rd;
		smtp_reply_reader_init(&rd);
		size_t used = 0;
		have = smtp_reply_read(&rd, (const char *)p, n, &r, &used, NULL) == 1;
	}
	if (!have) {
		memset(&r, 0, sizeof(r));
		if (n >= 3) {
			r.code = (int16_t)(p[0] | p[1] << 8);
			r.enh_class = p[2] % 8;
			r.enh_subject = p[2] / 8 % 8;
			r.enh_detail = p[2] / 64;
			p += 3;
			n -= 3;
		}
		r.text_len = n < SMTP_REPLY_TEXT_MAX ? n : SMTP_REPLY_TEXT_MAX;
		memcpy(r.text, p, r.text_len);
		r.text[r.text_len] = '\0';
		r.lines = 1;
	}
	check_hint((const uint8_t *)r.text, r.text_len);

	struct classify_result a, b, z;
	classify_reply(plain, st, error, error ? NULL : &r, &a);
	check_result(st, error, &r, &a, false);
	classify_reply(oper, st, error, error ? NULL : &r, &b);
	check_result(st, error, &r, &b, true);
	if (!is_operator_signal(b.signal) &&
	    (a.verdict != b.verdict || a.for_ms != b.for_ms || strcmp(a.signal, b.signal) != 0))
		abort();
	/* no classifier: the rules alone, which the built-ins only refine */
	classify_reply(NULL, st, error, error ? NULL : &r, &z);
	check_result(st, error, &r, &z, false);
	if ((a.verdict == CLASSIFY_OK) != (z.verdict == CLASSIFY_OK))
		abort();
	return 0;
}
