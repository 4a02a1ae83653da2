/*
 * test_outcome -- what happens to one recipient (src/relay/outcome.c): every event and
 * verdict against the status byte, the next try, the attempts, the DSN code, the words
 * of the log lines and the counter the one writer (msg_rcpt_settle) carries out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "outcome.h"
#include "queue_file.h"

static const struct smtp_reply r250 = { .code = 250, .enh_class = 2, .enh_subject = 1,
					.enh_detail = 5 };
static const struct smtp_reply r550 = { .code = 550, .enh_class = 5, .enh_subject = 1,
					.enh_detail = 1 };
static const struct smtp_reply r550_bare = { .code = 550 };
static const struct smtp_reply r451 = { .code = 451, .enh_class = 4, .enh_subject = 3,
					.enh_detail = 0 };
static const struct smtp_reply r452 = { .code = 452 };
static const struct smtp_reply r452_553 = { .code = 452, .enh_class = 4, .enh_subject = 5,
					    .enh_detail = 3 };
static const struct smtp_reply r452_422 = { .code = 452, .enh_class = 4, .enh_subject = 2,
					    .enh_detail = 2 };
static const struct smtp_reply r552_553 = { .code = 552, .enh_class = 5, .enh_subject = 5,
					    .enh_detail = 3 };
static const struct smtp_reply r552_522 = { .code = 552, .enh_class = 5, .enh_subject = 2,
					    .enh_detail = 2 };
static const struct smtp_reply r421 = { .code = 421, .enh_class = 4, .enh_subject = 7,
					.enh_detail = 0 };

static const struct classify_result ok = { .verdict = CLASSIFY_OK, .for_ms = -1 };
static const struct classify_result fail = { .verdict = CLASSIFY_FAIL, .for_ms = -1 };
static const struct classify_result retry = { .verdict = CLASSIFY_RETRY, .for_ms = -1 };
static const struct classify_result retry_hint = { .verdict = CLASSIFY_RETRY, .for_ms = 90000 };
static const struct classify_result suspend = { .verdict = CLASSIFY_SUSPEND, .for_ms = 60000 };
static const struct classify_result slow = { .verdict = CLASSIFY_SLOW, .for_ms = -1 };

struct want {
	char status;
	enum outcome_next next;
	int64_t hint_ms;
	int attempts;
	const char *dsn;
	const char *attempt;
	bool attempt_dsn;
	const char *word;
	enum log_level level;
	const char *note;              /* a part of it; NULL: none */
	enum outcome_count count;
	bool lane_signal;
};

struct tcase {
	const char *name;
	struct outcome_in in;
	struct want w;
};

#define INFO LOG_LEVEL_INFO
#define NOTICE LOG_LEVEL_NOTICE

static const struct tcase cases[] = {
	{ "delivered", { .ev = OUTCOME_REPLY, .cr = &ok, .rep = &r250 },
	  { QUEUE_DELIVERED, OUTCOME_NEXT_KEEP, 0, 0, "2.1.5", "sent", false, "sent", INFO, NULL,
	    OUTCOME_COUNT_DELIVERED, false } },
	{ "delivered, a relayed notice owed",
	  { .ev = OUTCOME_REPLY, .cr = &ok, .rep = &r250, .relayed = true },
	  { QUEUE_RELAYED, OUTCOME_NEXT_KEEP, 0, 0, "2.1.5", "relayed", false, "sent", INFO, NULL,
	    OUTCOME_COUNT_DELIVERED, false } },
	{ "delivered, no reply of its own", { .ev = OUTCOME_REPLY, .cr = &ok },
	  { QUEUE_DELIVERED, OUTCOME_NEXT_KEEP, 0, 0, "2.0.0", "sent", false, "sent", INFO, NULL,
	    OUTCOME_COUNT_DELIVERED, false } },
	{ "refused for good", { .ev = OUTCOME_REPLY, .cr = &fail, .rep = &r550 },
	  { QUEUE_FAILED, OUTCOME_NEXT_KEEP, 0, 0, "5.1.1", "failed", true, "bounced", NOTICE,
	    NULL, OUTCOME_COUNT_FAILED, false } },
	{ "refused for good, no enhanced code", { .ev = OUTCOME_REPLY, .cr = &fail, .rep = &r550_bare },
	  { QUEUE_FAILED, OUTCOME_NEXT_KEEP, 0, 0, "5.0.0", "failed", true, "bounced", NOTICE,
	    NULL, OUTCOME_COUNT_FAILED, false } },
	{ "deferred", { .ev = OUTCOME_REPLY, .cr = &retry, .rep = &r451 },
	  { 0, OUTCOME_NEXT_BACKOFF, -1, 0, "4.3.0", "deferred", false, "deferred", INFO, NULL,
	    OUTCOME_COUNT_NONE, false } },
	{ "deferred with the server's wait", { .ev = OUTCOME_REPLY, .cr = &retry_hint, .rep = &r451 },
	  { 0, OUTCOME_NEXT_BACKOFF, 90000, 0, "4.3.0", "deferred", false, "deferred", INFO, NULL,
	    OUTCOME_COUNT_NONE, false } },
	{ "452: too many recipients", { .ev = OUTCOME_REPLY, .cr = &retry, .rep = &r452 },
	  { 0, OUTCOME_NEXT_NOW, 0, -1, "4.0.0", "deferred", false, "deferred", INFO,
	    "too many recipients", OUTCOME_COUNT_NONE, false } },
	{ "452 4.5.3: too many recipients", { .ev = OUTCOME_REPLY, .cr = &retry, .rep = &r452_553 },
	  { 0, OUTCOME_NEXT_NOW, 0, -1, "4.5.3", "deferred", false, "deferred", INFO,
	    "too many recipients", OUTCOME_COUNT_NONE, false } },
	{ "452 4.2.2: a full mailbox, not too many recipients",
	  { .ev = OUTCOME_REPLY, .cr = &retry, .rep = &r452_422 },
	  { 0, OUTCOME_NEXT_BACKOFF, -1, 0, "4.2.2", "deferred", false, "deferred", INFO, NULL,
	    OUTCOME_COUNT_NONE, false } },
	{ "552 5.5.3 retried: too many recipients",
	  { .ev = OUTCOME_REPLY, .cr = &retry, .rep = &r552_553 },
	  { 0, OUTCOME_NEXT_NOW, 0, -1, "5.5.3", "deferred", false, "deferred", INFO,
	    "too many recipients", OUTCOME_COUNT_NONE, false } },
	{ "552 5.2.2 retried: the backoff", { .ev = OUTCOME_REPLY, .cr = &retry, .rep = &r552_522 },
	  { 0, OUTCOME_NEXT_BACKOFF, -1, 0, "5.2.2", "deferred", false, "deferred", INFO, NULL,
	    OUTCOME_COUNT_NONE, false } },
	{ "the lane suspended", { .ev = OUTCOME_REPLY, .cr = &suspend, .rep = &r421 },
	  { 0, OUTCOME_NEXT_NOW, 0, -1, "4.7.0", NULL, false, "suspended", INFO, "throttling",
	    OUTCOME_COUNT_NONE, true } },
	{ "the lane slowed", { .ev = OUTCOME_REPLY, .cr = &slow, .rep = &r421 },
	  { 0, OUTCOME_NEXT_NOW, 0, -1, "4.7.0", NULL, false, "deferred", INFO, "throttling",
	    OUTCOME_COUNT_NONE, true } },
	{ "lost after the dot", { .ev = OUTCOME_UNCERTAIN },
	  { QUEUE_UNCERTAIN, OUTCOME_NEXT_BACKOFF, -1, 0, "4.4.2", "uncertain", false, "uncertain",
	    LOG_LEVEL_WARNING, "possibly twice", OUTCOME_COUNT_UNCERTAIN, false } },
	{ "lost after the dot, held", { .ev = OUTCOME_UNCERTAIN, .hold = true },
	  { QUEUE_UNCERTAIN, OUTCOME_NEXT_BACKOFF, -1, 0, "4.4.2", "uncertain", false, "uncertain",
	    LOG_LEVEL_WARNING, "held", OUTCOME_COUNT_UNCERTAIN, false } },
	{ "not tried", { .ev = OUTCOME_NOT_TRIED },
	  { 0, OUTCOME_NEXT_NOW, 0, 0, "", NULL, false, NULL, INFO, NULL, OUTCOME_COUNT_NONE,
	    false } },
	{ "the operator's flush", { .ev = OUTCOME_DUE_NOW },
	  { 0, OUTCOME_NEXT_NOW, 0, 0, "", NULL, false, NULL, INFO, NULL, OUTCOME_COUNT_NONE,
	    false } },
	{ "deferred by DANE", { .ev = OUTCOME_DEFER, .dsn = "4.7.5", .note = "(DANE)" },
	  { 0, OUTCOME_NEXT_BACKOFF, -1, 1, "4.7.5", "deferred", true, "deferred", INFO, "(DANE)",
	    OUTCOME_COUNT_NONE, false } },
	{ "a domain that takes no mail", { .ev = OUTCOME_FAIL, .dsn = "5.1.10" },
	  { QUEUE_FAILED, OUTCOME_NEXT_KEEP, 0, 0, "5.1.10", "failed", true, "bounced", NOTICE,
	    NULL, OUTCOME_COUNT_FAILED, false } },
	{ "expired", { .ev = OUTCOME_FAIL, .dsn = "4.4.7" },
	  { QUEUE_FAILED, OUTCOME_NEXT_KEEP, 0, 0, "4.4.7", "failed", true, "bounced", NOTICE,
	    NULL, OUTCOME_COUNT_FAILED, false } },
};

static void test_every_outcome(void **state)
{
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		const struct tcase *c = &cases[k];
		const struct want *w = &c->w;
		struct outcome o;
		memset(&o, 0x5a, sizeof(o)); /* every field written, whatever was there */
		outcome_decide(&c->in, &o);
		print_message("%s\n", c->name);
		assert_int_equal(o.status, w->status);
		assert_int_equal(o.next, w->next);
		if (w->next == OUTCOME_NEXT_BACKOFF)
			assert_int_equal(o.hint_ms, w->hint_ms);
		assert_int_equal(o.attempts, w->attempts);
		if (w->word || w->attempt)
			assert_string_equal(o.dsn, w->dsn);
		if (w->attempt) {
			assert_non_null(o.attempt);
			assert_string_equal(o.attempt, w->attempt);
			assert_int_equal(o.attempt_dsn, w->attempt_dsn);
		} else {
			assert_null(o.attempt);
		}
		if (w->word) {
			assert_non_null(o.word);
			assert_string_equal(o.word, w->word);
			assert_int_equal(o.level, w->level);
		} else {
			assert_null(o.word);
		}
		if (w->note) {
			assert_non_null(o.note);
			assert_non_null(strstr(o.note, w->note));
		} else {
			assert_null(o.note);
		}
		assert_int_equal(o.count, w->count);
		assert_int_equal(o.lane_signal, w->lane_signal);
	}
}

/* Law 5: no throttling verdict fails a recipient or counts its attempt. */
static void test_throttling_is_not_failure(void **state)
{
	const struct classify_result *th[] = { &suspend, &slow };
	const struct smtp_reply *reps[] = { &r421, &r550, &r552_553, NULL };
	for (size_t a = 0; a < 2; a++)
		for (size_t b = 0; b < 4; b++) {
			struct outcome o;
			outcome_decide(&(struct outcome_in){ .ev = OUTCOME_REPLY, .cr = th[a],
							     .rep = reps[b] }, &o);
			assert_int_equal(o.status, 0);
			assert_int_equal(o.count, OUTCOME_COUNT_NONE);
			assert_int_equal(o.attempts, -1);
			assert_int_equal(o.next, OUTCOME_NEXT_NOW);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_outcome),
		cmocka_unit_test(test_throttling_is_not_failure),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
