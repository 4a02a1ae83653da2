/*
 * test_relay_group -- provider lanes (src/relay/relay_group.c) in the harness of
 * relay_harness.h, with scripted MX answers: a domain whose MX hosts match a provider's
 * patterns joins the provider's lane with its mail, a second domain joins the same lane,
 * a domain whose MX is no provider's keeps its own, and a group that loses its answer
 * sends every domain back to be looked up again.
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

#include "relay_harness.h"

static struct harness h;

static int setup(void **state)
{
	(void)state;
	harness_init(&h);
	h.conf.routes[0].mx = true;
	h.conf.routes[0].lanes = ROUTE_LANES_PROVIDER;
	h.conf.providers = calloc(1, sizeof(*h.conf.providers));
	assert_non_null(h.conf.providers);
	h.conf.providers[0].name = strdup("big");
	h.conf.providers[0].mx = calloc(2, sizeof(char *));
	h.conf.providers[0].mx[0] = strdup("*.big.test");
	h.conf.providers[0].connections = 2;
	h.conf.nproviders = 1;
	harness_open(&h);
	h.auto_ready = false;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	harness_close(&h);
	return 0;
}

static void put(const char *rcpt, char id[QUEUE_ID_LEN + 1])
{
	harness_put(&h, "s@sender.test", &rcpt, 1, id);
}

static void answer(const char *domain, const char *mx)
{
	assert_true(harness_dns_waits(&h, domain, false));
	harness_dns_answer(&h, domain, &mx, 1, false, 300, 0);
}

static void test_domains_join_their_providers_lane(void **state)
{
	(void)state;
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1], c[QUEUE_ID_LEN + 1];
	put("x@one.test", a);
	put("y@two.test", b);
	put("z@small.test", c);
	answer("one.test", "mx1.big.test");
	struct lane *g = lane_find(h.r, "r:provider:big");
	assert_non_null(g);
	assert_true(g->group);
	assert_int_equal(lane_max_conns(g), 2); /* the provider's connections */
	struct lane *one = lane_find(h.r, "r:one.test");
	assert_ptr_equal(one->fwd, g);
	assert_ptr_equal(msg_find(h.r, a)->r[0].lane, g); /* its mail moved */
	assert_int_equal(one->waiting, 0);
	assert_int_equal(g->waiting, 1);
	assert_int_equal(h.opened, 1); /* the group's lane connects to the provider */

	answer("two.test", "mx7.big.test");
	struct lane *two = lane_find(h.r, "r:two.test");
	assert_ptr_equal(two->fwd, g);
	assert_int_equal(g->nmembers, 2);
	assert_int_equal(g->waiting, 2);
	assert_ptr_equal(msg_find(h.r, b)->r[0].lane, g);
	assert_true(harness_logged(&h, "lane=r:two.test joins lane r:provider:big (2 domain(s))",
				   NULL));

	answer("small.test", "mx.small.test");
	struct lane *small = lane_find(h.r, "r:small.test");
	assert_null(small->fwd);
	assert_ptr_equal(msg_find(h.r, c)->r[0].lane, small);

	/* new mail for a member goes straight to the group while the answer holds */
	char d[QUEUE_ID_LEN + 1];
	put("w@one.test", d);
	assert_ptr_equal(msg_find(h.r, d)->r[0].lane, g);
	assert_false(harness_dns_waits(&h, "one.test", false));
}

static void test_a_group_that_loses_its_answer(void **state)
{
	(void)state;
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1];
	put("x@one.test", a);
	put("y@two.test", b);
	answer("one.test", "mx1.big.test");
	answer("two.test", "mx2.big.test");
	struct lane *g = lane_find(h.r, "r:provider:big");
	assert_int_equal(g->nmembers, 2);
	group_lost(g, "one.test: no such domain, or no address");
	assert_int_equal(g->nmembers, 0);
	/* each domain is looked up again, with its mail back in its own lane */
	struct lane *one = lane_find(h.r, "r:one.test"), *two = lane_find(h.r, "r:two.test");
	assert_null(one->fwd);
	assert_null(two->fwd);
	assert_ptr_equal(msg_find(h.r, a)->r[0].lane, one);
	assert_ptr_equal(msg_find(h.r, b)->r[0].lane, two);
	assert_true(harness_dns_waits(&h, "one.test", false));
	assert_true(harness_dns_waits(&h, "two.test", false));
	assert_true(harness_logged(&h, "lane=r:provider:big", "its 2 domain(s) are looked up again",
				   NULL));
	/* and it joins again from its next answer */
	answer("one.test", "mx1.big.test");
	assert_ptr_equal(one->fwd, g);
	assert_ptr_equal(msg_find(h.r, a)->r[0].lane, g);
}

/* A domain whose MX hosts do not exist: its recipients fail (not a group's affair). */
static void test_a_domain_without_mail_fails(void **state)
{
	(void)state;
	char a[QUEUE_ID_LEN + 1];
	put("x@nomail.test", a);
	harness_dns_answer(&h, "nomail.test", NULL, 0, false, 0, -ENODATA);
	assert_int_equal(harness_disk_status(&h, a, 0), QUEUE_FAILED);
	assert_true(harness_logged(&h, "rcpt=<x@nomail.test>", "status=bounced", "dsn=5.1.10",
				   "null MX", NULL));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_domains_join_their_providers_lane, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_group_that_loses_its_answer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_domain_without_mail_fails, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
