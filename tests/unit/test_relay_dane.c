/*
 * test_relay_dane -- DANE for mx lanes (src/relay/relay_dane.c) in the harness of
 * relay_harness.h, with scripted DNS answers: DANE decides what a connection's TLS must
 * be, or that no MX host may be used, and the lane acts on that verdict -- it connects
 * with the TLS asked, tries the next MX host, or defers its due recipients (never bounces
 * them: a DANE failure may be an attack or a rollover, RFC 7672).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "relay_harness.h"

static void open_dane(struct harness *h, enum smtp_out_tls tls)
{
	harness_init(h);
	h->conf.routes[0].mx = true;
	h->conf.routes[0].tls = tls;
	harness_open(h);
	h->auto_ready = false;
}

/* dane-only, and the domain's MX answer is not validated: no MX host may be used. */
static void test_dane_only_without_dnssec_defers(void **state)
{
	(void)state;
	struct harness h;
	open_dane(&h, SMTP_TLS_DANE_ONLY);
	const char *rc = "a@plain.test";
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, id);
	assert_true(harness_dns_waits(&h, "plain.test", false));
	const char *mx[] = { "mx.plain.test" };
	harness_dns_answer(&h, "plain.test", mx, 1, false, 300, 0);
	assert_int_equal(h.opened, 0); /* no connection */
	struct rmsg *m = msg_find(h.r, id);
	assert_int_equal(m->r[0].status, QUEUE_TODO);
	assert_int_equal(harness_disk_status(&h, id, 0), QUEUE_TODO);
	assert_int_equal(m->r[0].attempts, 1);
	assert_true(m->r[0].next_try > h.now);
	char log[4096];
	harness_attempts(&h, id, log, sizeof(log));
	assert_non_null(strstr(log, "status=deferred"));
	assert_non_null(strstr(log, "dsn=4.7.5"));
	struct lane *l = lane_find(h.r, "r:plain.test");
	assert_non_null(l);
	assert_non_null(strstr(l->dane_status, "DEFERRED"));
	assert_non_null(strstr(l->dane_status, "not DNSSEC-validated"));
	assert_int_equal(l->failed, 0);
	assert_true(harness_logged(&h, "lane=r:plain.test", "DANE:", "1 recipient(s) deferred", NULL));
	harness_close(&h);
}

/* dane (not only), not validated: opportunistic TLS, and the mail goes. */
static void test_dane_without_dnssec_is_opportunistic(void **state)
{
	(void)state;
	struct harness h;
	open_dane(&h, SMTP_TLS_DANE);
	const char *rc = "a@plain.test";
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, id);
	const char *mx[] = { "mx.plain.test" };
	harness_dns_answer(&h, "plain.test", mx, 1, false, 300, 0);
	assert_int_equal(h.opened, 1);
	assert_int_equal(h.conns->tls, SMTP_TLS_MAY);
	assert_false(harness_dns_waits(&h, "mx.plain.test", true)); /* no TLSA asked */
	struct lane *l = lane_find(h.r, "r:plain.test");
	assert_non_null(strstr(l->dane_status, "opportunistic TLS"));
	harness_close(&h);
}

/* dane-only, validated, and an MX host without TLSA records: the next one is tried;
 * when none has any, the recipients wait. */
static void test_dane_only_tries_each_mx_host_then_defers(void **state)
{
	(void)state;
	struct harness h;
	open_dane(&h, SMTP_TLS_DANE_ONLY);
	const char *rc = "a@signed.test";
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, id);
	const char *mx[] = { "mx1.signed.test", "mx2.signed.test" };
	harness_dns_answer(&h, "signed.test", mx, 2, true, 300, 0);
	assert_true(harness_dns_waits(&h, "mx1.signed.test", true));
	harness_tlsa_answer(&h, "mx1.signed.test", true, -ENOENT);
	assert_true(harness_logged(&h, "mta=mx1.signed.test", "the next MX host", NULL));
	harness_advance_us(&h, 1); /* the lane is woken at once: a moment of the test's clock */
	assert_true(harness_dns_waits(&h, "mx2.signed.test", true));
	assert_int_equal(msg_find(h.r, id)->r[0].attempts, 0); /* not yet */
	harness_tlsa_answer(&h, "mx2.signed.test", true, -ENOENT);
	harness_advance_us(&h, 1);
	assert_int_equal(h.opened, 0);
	struct rmsg *m = msg_find(h.r, id);
	assert_int_equal(m->r[0].status, QUEUE_TODO);
	assert_int_equal(m->r[0].attempts, 1);
	assert_true(harness_logged(&h, "rcpt=<a@signed.test>", "status=deferred", "dsn=4.7.5",
				   "(DANE)", NULL));
	harness_close(&h);
}

/* dane (not only), validated, TLSA lookup answered with no usable record: TLS is still
 * required (RFC 7672 2.2: "encrypt"), never clear text. */
static void test_unusable_records_still_require_tls(void **state)
{
	(void)state;
	struct harness h;
	open_dane(&h, SMTP_TLS_DANE);
	const char *rc = "a@signed.test";
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, id);
	const char *mx[] = { "mx1.signed.test" };
	harness_dns_answer(&h, "signed.test", mx, 1, true, 300, 0);
	harness_tlsa_answer(&h, "mx1.signed.test", true, 0);
	assert_int_equal(h.opened, 1);
	assert_int_equal(h.conns->tls, SMTP_TLS_REQUIRE);
	assert_string_equal(h.conns->host, "mx1.signed.test");
	harness_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dane_only_without_dnssec_defers),
		cmocka_unit_test(test_dane_without_dnssec_is_opportunistic),
		cmocka_unit_test(test_dane_only_tries_each_mx_host_then_defers),
		cmocka_unit_test(test_unusable_records_still_require_tls),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
