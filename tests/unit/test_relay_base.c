/*
 * test_relay_base -- the relay's floor (src/relay/relay_base.c): a server's reply, or
 * what went wrong without one, as the one line of text the logs, the attempt log and
 * the bounces carry.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "relay_int.h"

struct tcase {
	int code, cls, subj, det;
	const char *text;              /* NULL: no reply */
	enum smtp_out_stage stage;
	int error;
	const char *why;
	const char *want;
};

static const struct tcase cases[] = {
	{ 550, 5, 1, 1, "no such user", 0, 0, NULL, "550 5.1.1 no such user" },
	{ 550, 5, 1, 1, "5.1.1 no such user", 0, 0, NULL, "550 5.1.1 no such user" },
	{ 451, 0, 0, 0, "try later", 0, 0, NULL, "451 try later" },
	{ 554, 5, 7, 1, "bad\x01" "char", 0, 0, NULL, "554 5.7.1 bad?char" },
	{ 0, 0, 0, 0, NULL, SMTP_STAGE_CONNECT, -ECONNREFUSED, "", "connect: Connection refused" },
	{ 0, 0, 0, 0, NULL, SMTP_STAGE_STARTTLS, -EPERM, "certificate verify failed",
	  "starttls: Operation not permitted: certificate verify failed" },
};

static void test_reply_text(void **state)
{
	(void)state;
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		const struct tcase *c = &cases[k];
		struct smtp_reply rep = { .code = c->code, .enh_class = c->cls, .enh_subject = c->subj,
					  .enh_detail = c->det, .lines = 1 };
		snprintf(rep.text, sizeof(rep.text), "%s", c->text ? c->text : "");
		rep.text_len = strlen(rep.text);
		struct smtp_out_result res = { .stage = c->stage, .error = c->error, .why = c->why };
		char out[600];
		base_reply_text(&res, c->text ? &rep : NULL, out, sizeof(out));
		print_message("%zu: %s\n", k, out);
		assert_string_equal(out, c->want);
	}
	char out[64];
	base_reply_text(NULL, NULL, out, sizeof(out));
	assert_string_equal(out, "no reply");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reply_text),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
