/*
 * test_policy -- unit tests of the rule engine (src/policy/policy.c, selector.c, class.c)
 * driven the way an operator meets it: rule sets are written as configuration text, loaded
 * with cfg_parse() + policy_load(), decided against a memory store with explicit times.
 *
 * What is checked, table-driven where it fits:
 *   - every selector's key text (normalization, "no value" and the reason given for it);
 *   - configuration errors, each with its exact "FILE:LINE: KEY: message";
 *   - GCRA through the policy (burst, retry, the reply with its jittered retry);
 *   - several rules on one event: the strictest action wins, and a refused event charges
 *     no rule it passed (unless count_rejected);
 *   - the message ledger: per-message counting at stage rcpt, refunds at an aborted
 *     message, no refund of connect-stage charges;
 *   - except lists, overrides files (and their reload), host classes and their counters
 *     across a reload, tag / quarantine / warn.
 * Nothing sleeps: every decision is given its time (T0 + offsets, in ns).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "buf.h"
#include "cfg.h"
#include "ipaddr.h"
#include "policy.h"
#include "store.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define SEC 1000000000ULL
#define T0 (1700000000ULL * SEC)
#define MAX_RES 8

/* ---- environment: a loaded rule set over a fresh memory store ----------------------- */

struct env {
	struct policy *p;
	struct store *s;
};

static int load_text(const char *text, struct policy **ret, char *err, size_t errlen)
{
	struct cfg_node *root = NULL;
	int rc = cfg_parse("t.conf", text, strlen(text), &root, err, errlen);
	if (rc < 0)
		fail_msg("cfg_parse: %s\n--- input:\n%s", err, text);
	rc = policy_load(root, ret, err, errlen);
	/* the rule set must not point into the tree: free it at once (ASan checks) */
	cfg_free(root);
	return rc;
}

static void env_load(struct env *e, const char *text)
{
	char err[512] = "";
	e->p = NULL;
	if (load_text(text, &e->p, err, sizeof(err)) != 0)
		fail_msg("policy_load: %s\n--- input:\n%s", err, text);
	assert_non_null(e->p);
	struct store_memory_conf conf = { .max_keys = 0, .snapshot = NULL };
	char warn[256];
	e->s = store_memory_new(&conf, T0, warn, sizeof(warn));
	assert_non_null(e->s);
	assert_string_equal(warn, "");
	policy_set_store(e->p, e->s);
}

static void env_free(struct env *e)
{
	policy_unref(e->p);
	store_free(e->s);
	e->p = NULL;
	e->s = NULL;
}

/* ---- transactions -------------------------------------------------------------------- */

struct hv {
	const char *name, *value;
};

/* NULL = absent; sender NULL = no MAIL yet ("" after MAIL is the null sender). */
struct tx {
	const char *ip, *name, *helo, *sasl, *sender, *rcpt;
	struct hv hdr[4];
	struct hv mac[4];
};

static bool tx_lookup(const struct hv *list, size_t n, const char *name, struct str *ret)
{
	for (size_t i = 0; i < n && list[i].name; i++)
		if (strcasecmp(list[i].name, name) == 0) {
			*ret = str_cstr(list[i].value);
			return true;
		}
	return false;
}

static bool tx_header(void *arg, const char *name, struct str *ret)
{
	const struct tx *x = arg;
	return tx_lookup(x->hdr, ARRAY_SIZE(x->hdr), name, ret);
}

static bool tx_macro(void *arg, const char *name, struct str *ret)
{
	const struct tx *x = arg;
	return tx_lookup(x->mac, ARRAY_SIZE(x->mac), name, ret);
}

static struct policy_txn txn_of(const struct tx *x)
{
	struct policy_txn t;
	memset(&t, 0, sizeof(t));
	t.client_addr = str_cstr(x->ip ? x->ip : "");
	t.client_name = str_cstr(x->name ? x->name : "");
	t.helo = str_cstr(x->helo ? x->helo : "");
	t.sasl_user = str_cstr(x->sasl ? x->sasl : "");
	t.have_sender = x->sender != NULL;
	t.sender = str_cstr(x->sender ? x->sender : "");
	t.rcpt = str_cstr(x->rcpt ? x->rcpt : "");
	t.rcpt_count = x->rcpt ? 1 : 0;
	t.header = tx_header;
	t.macro = tx_macro;
	t.arg = (void *)x;
	return t;
}

struct run {
	struct policy_decision d;
	struct policy_rule_result res[MAX_RES];
};

static void run(struct env *e, const struct tx *x, enum policy_stage st, struct policy_msg *m,
		enum store_mode mode, uint64_t now, struct run *r)
{
	memset(r, 0, sizeof(*r));
	r->d.results = r->res;
	r->d.max_results = MAX_RES;
	struct policy_txn t = txn_of(x);
	assert_int_equal(policy_check(e->p, &t, st, m, mode, now, &r->d), 0);
	assert_int_equal(r->d.store_error, 0);
}

static const struct policy_rule_result *res_of(const struct run *r, const char *rule)
{
	for (size_t i = 0; i < r->d.nresults; i++)
		if (strcmp(policy_rule_name(r->res[i].rule), rule) == 0)
			return &r->res[i];
	fail_msg("no result for rule %s", rule);
	return NULL;
}

/* Decide (and charge) one event; returns the action. */
static enum policy_action act(struct env *e, const struct tx *x, enum policy_stage st,
			      struct policy_msg *m, uint64_t now)
{
	struct run r;
	run(e, x, st, m, STORE_CHECK, now, &r);
	return r.d.action;
}

/* Units of a rule's first window not yet restored, seen without changing anything. */
static uint64_t used(struct env *e, const struct tx *x, enum policy_stage st, const char *rule,
		     uint64_t now)
{
	struct run r;
	run(e, x, st, NULL, STORE_PEEK, now, &r);
	const struct policy_rule_result *res = res_of(&r, rule);
	assert_false(res->charged);
	return res->used[0];
}

/* ---- selectors ----------------------------------------------------------------------- */

static const struct {
	const char *spec;
	const char *stage;
	struct tx tx;
	const char *key; /* NULL: no value */
	const char *why; /* when no value */
} selector_cases[] = {
	/* client_ip: v4, v6, prefixes, mapped, decorations */
	{ "client_ip", "connect", { .ip = "192.0.2.7" }, "192.0.2.7", NULL },
	{ "client_ip", "connect", { .ip = " 192.0.2.7 " }, "192.0.2.7", NULL },
	{ "client_ip/24", "connect", { .ip = "192.0.2.7" }, "192.0.2.0/24", NULL },
	{ "client_ip/24", "connect", { .ip = "2001:db8:1:2:3:4:5:6" }, "2001:db8:1:2::/64", NULL },
	{ "client_ip/24/48", "connect", { .ip = "2001:db8:1:2::5" }, "2001:db8:1::/48", NULL },
	{ "client_ip/24/48", "connect", { .ip = "192.0.2.200" }, "192.0.2.0/24", NULL },
	{ "client_ip/32", "connect", { .ip = "2001:db8::1" }, "2001:db8::1", NULL },
	{ "client_ip", "connect", { .ip = "::ffff:192.0.2.77" }, "192.0.2.77", NULL },
	{ "client_ip/24", "connect", { .ip = "::ffff:192.0.2.77" }, "192.0.2.0/24", NULL },
	{ "client_ip", "connect", { .ip = "IPv6:2001:DB8::1" }, "2001:db8::1", NULL },
	{ "client_ip", "connect", { .ip = "[IPv6:2001:db8::2]" }, "2001:db8::2", NULL },
	{ "client_ip/24", "connect", { .ip = "[192.0.2.9]" }, "192.0.2.0/24", NULL },
	{ "client_ip", "connect", { .ip = "" }, NULL, "no client_ip" },
	{ "client_ip", "connect", { .ip = "not-an-address" }, NULL, "no client_ip" },
	{ "client_ip/24", "connect", { .ip = "" }, NULL, "no client_ip/24/64" },
	/* client_name: verified names only */
	{ "client_name", "connect", { .name = "MX.Example.COM." }, "mx.example.com", NULL },
	{ "client_name", "connect", { .name = "unknown" }, NULL, "no client_name" },
	{ "client_name", "connect", { .name = "UNKNOWN" }, NULL, "no client_name" },
	{ "client_name", "connect", { .name = "[1.2.3.4]" }, NULL, "no client_name" },
	{ "client_name", "connect", { .name = "" }, NULL, "no client_name" },
	/* helo: lowercased, one trailing dot removed */
	{ "helo", "helo", { .helo = "Mail.Example.ORG." }, "mail.example.org", NULL },
	{ "helo", "helo", { .helo = "[192.0.2.1]" }, "[192.0.2.1]", NULL },
	{ "helo", "mail", { .helo = "", .sender = "" }, NULL, "no helo" },
	/* sasl_user: as given */
	{ "sasl_user", "mail", { .sasl = "Alice", .sender = "" }, "Alice", NULL },
	{ "sasl_user", "mail", { .sasl = "", .sender = "" }, NULL, "no sasl_user" },
	/* sender: brackets stripped, domain lowercased, local part kept */
	{ "sender", "mail", { .sender = "<John.Doe@Example.COM>" }, "John.Doe@example.com", NULL },
	{ "sender", "mail", { .sender = "john@EXAMPLE.com" }, "john@example.com", NULL },
	{ "sender", "mail", { .sender = "<\"a@b\"@Example.COM>" }, "\"a@b\"@example.com", NULL },
	{ "sender", "mail", { .sender = "<a@Example.ORG.>" }, "a@example.org", NULL },
	{ "sender", "mail", { .sender = " <a@example.org> " }, "a@example.org", NULL },
	{ "sender", "mail", { .sender = "<>" }, "<>", NULL },
	{ "sender", "mail", { .sender = "" }, "<>", NULL },
	{ "sender", "mail", { .sender = NULL }, NULL, "no sender" },
	{ "sender_domain", "mail", { .sender = "<John@Example.COM>" }, "example.com", NULL },
	{ "sender_domain", "mail", { .sender = "<John@Example.COM.>" }, "example.com", NULL },
	{ "sender_domain", "mail", { .sender = "<>" }, "<>", NULL },
	{ "sender_domain", "mail", { .sender = "" }, "<>", NULL },
	{ "sender_domain", "mail", { .sender = "postmaster" }, NULL, "no sender_domain" },
	/* rcpt, rcpt_domain */
	{ "rcpt", "rcpt", { .sender = "", .rcpt = "<Bob@Example.NET>" }, "Bob@example.net", NULL },
	{ "rcpt", "rcpt", { .sender = "", .rcpt = "<Bob@Example.NET.>" }, "Bob@example.net", NULL },
	{ "rcpt", "rcpt", { .sender = "", .rcpt = "" }, NULL, "no rcpt" },
	{ "rcpt", "rcpt", { .sender = "", .rcpt = "<>" }, NULL, "no rcpt" },
	{ "rcpt_domain", "rcpt", { .sender = "", .rcpt = "<Bob@Example.NET.>" }, "example.net",
	  NULL },
	{ "rcpt_domain", "rcpt", { .sender = "", .rcpt = "postmaster" }, NULL, "no rcpt_domain" },
	/* header:NAME -- the first occurrence; a missing header means no value */
	{ "header:Subject",
	  "data",
	  { .sender = "", .hdr = { { "Subject", " first " }, { "Subject", "second" } } },
	  "first",
	  NULL },
	{ "header:X-Campaign",
	  "eom",
	  { .sender = "", .hdr = { { "Subject", "x" }, { "x-campaign", "Spring" } } },
	  "Spring",
	  NULL },
	{ "header:X-Missing",
	  "data",
	  { .sender = "", .hdr = { { "Subject", "x" } } },
	  NULL,
	  "no header:X-Missing" },
	/* macro:NAME */
	{ "macro:{auth_authen}",
	  "connect",
	  { .mac = { { "{auth_authen}", "alice@example.com" } } },
	  "alice@example.com",
	  NULL },
	{ "macro:{auth_authen}", "connect", { .mac = { { "j", "mx" } } }, NULL,
	  "no macro:{auth_authen}" },
	/* compound keys */
	{ "sender_domain+rcpt_domain",
	  "rcpt",
	  { .sender = "<a@Example.COM>", .rcpt = "<b@Example.NET>" },
	  "example.com+example.net",
	  NULL },
	{ "client_ip/24+sasl_user+helo",
	  "mail",
	  { .ip = "192.0.2.55", .sasl = "bob", .helo = "HOST.example", .sender = "" },
	  "192.0.2.0/24+bob+host.example",
	  NULL },
	{ "client_ip+sasl_user",
	  "mail",
	  { .ip = "192.0.2.55", .sasl = "", .sender = "" },
	  NULL,
	  "no sasl_user" },
};

static void test_selectors(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(selector_cases); i++) {
		char text[512];
		snprintf(text, sizeof(text),
			 "limit \"sel\" { stage = %s; key = \"%s\"; rate = \"10/1m\"; }\n",
			 selector_cases[i].stage, selector_cases[i].spec);
		struct env e;
		env_load(&e, text);
		struct tx x = selector_cases[i].tx;
		enum policy_stage st = policy_rule_stage(policy_rule_at(e.p, 0));
		struct run r;
		/* CHECK, not PEEK: a rule without a value must not be charged either */
		run(&e, &x, st, NULL, STORE_CHECK, T0, &r);
		assert_int_equal(r.d.action, POLICY_ACCEPT);
		assert_int_equal(r.d.nresults, 1);
		const struct policy_rule_result *res = &r.res[0];
		if (selector_cases[i].key) {
			if (res->state != POLICY_RULE_PASS || strcmp(res->key, selector_cases[i].key))
				fail_msg("case %zu %s: state %d key '%s', expected '%s'", i,
					 selector_cases[i].spec, res->state, res->key,
					 selector_cases[i].key);
			assert_true(res->charged);
			assert_int_equal(res->used[0], 1);
		} else {
			if (res->state != POLICY_RULE_NO_VALUE ||
			    strcmp(res->why, selector_cases[i].why) != 0)
				fail_msg("case %zu %s: state %d why '%s' key '%s', expected '%s'", i,
					 selector_cases[i].spec, res->state, res->why, res->key,
					 selector_cases[i].why);
			assert_false(res->charged);
		}
		env_free(&e);
	}
}

/* Equal things give equal keys: one budget whichever way the MTA wrote them. */
static void test_selector_keys_share_budget(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"net\" { stage = connect; key = \"client_ip/24\"; rate = \"3/1h\"; }\n"
		     "limit \"dom\" { stage = mail; key = sender_domain; rate = \"2/1h\"; }\n");
	const char *ips[] = { "192.0.2.1", "::ffff:192.0.2.99", "[192.0.2.200]" };
	for (size_t i = 0; i < ARRAY_SIZE(ips); i++)
		assert_int_equal(act(&e, &(struct tx){ .ip = ips[i] }, POLICY_CONNECT, NULL, T0),
				 POLICY_ACCEPT);
	assert_int_equal(act(&e, &(struct tx){ .ip = "IPv6:::ffff:192.0.2.3" }, POLICY_CONNECT,
			     NULL, T0),
			 POLICY_TEMPFAIL);
	/* another /24 has its own budget */
	assert_int_equal(act(&e, &(struct tx){ .ip = "192.0.3.1" }, POLICY_CONNECT, NULL, T0),
			 POLICY_ACCEPT);
	assert_int_equal(act(&e, &(struct tx){ .sender = "<a@Example.COM>" }, POLICY_MAIL, NULL,
			     T0),
			 POLICY_ACCEPT);
	assert_int_equal(act(&e, &(struct tx){ .sender = "b@example.com." }, POLICY_MAIL, NULL, T0),
			 POLICY_ACCEPT);
	assert_int_equal(act(&e, &(struct tx){ .sender = "<c@EXAMPLE.com>" }, POLICY_MAIL, NULL,
			     T0),
			 POLICY_TEMPFAIL);
	/* the null sender is a key of its own, not "no value" */
	assert_int_equal(act(&e, &(struct tx){ .sender = "<>" }, POLICY_MAIL, NULL, T0),
			 POLICY_ACCEPT);
	assert_int_equal(act(&e, &(struct tx){ .sender = "" }, POLICY_MAIL, NULL, T0),
			 POLICY_ACCEPT);
	assert_int_equal(act(&e, &(struct tx){ .sender = "<>" }, POLICY_MAIL, NULL, T0),
			 POLICY_TEMPFAIL);
	env_free(&e);
}

/* What the milter negotiates from a rule set. */
static void test_negotiation(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"a\" { stage = connect; key = \"macro:{daemon_name}\"; rate = 1/1m; }\n"
		     "limit \"b\" { stage = data; key = \"header:List-Id\"; rate = 1/1m; }\n"
		     "limit \"c\" { stage = rcpt; key = rcpt; rate = 1/1m; action = tag;\n"
		     "  except { \"macro:{auth_type}\" = [\"PLAIN\"]; } }\n");
	assert_int_equal(policy_rule_count(e.p), 3);
	assert_true(policy_has_stage(e.p, POLICY_CONNECT));
	assert_false(policy_has_stage(e.p, POLICY_HELO));
	assert_false(policy_has_stage(e.p, POLICY_MAIL));
	assert_true(policy_has_stage(e.p, POLICY_RCPT));
	assert_true(policy_has_stage(e.p, POLICY_DATA));
	assert_false(policy_has_stage(e.p, POLICY_EOM));
	assert_true(policy_needs(e.p)->headers.n > 0);
	assert_true(policy_needs(e.p)->message_actions);
	assert_false(policy_has_classes(e.p));
	const struct policy_names *macros = &policy_needs(e.p)->macros;
	assert_int_equal(macros->n, 2);
	assert_string_equal(macros->v[0], "{daemon_name}");
	assert_string_equal(macros->v[1], "{auth_type}");
	/* no rule at this stage: nothing to decide */
	struct run r;
	run(&e, &(struct tx){ .sender = "" }, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_int_equal(r.d.nresults, 0);
	env_free(&e);

	/* what only {} and of read is asked for too */
	env_load(&e, "limit \"d\" { stage = eom; key = sender; count = distinct;\n"
		     "  of = \"header:Message-ID\"; rate = 1/1m;\n"
		     "  only { \"macro:{daemon_name}\" = [\"submission\"]; } }\n");
	assert_int_equal(policy_needs(e.p)->headers.n, 1);
	assert_string_equal(policy_needs(e.p)->headers.v[0], "Message-ID");
	assert_int_equal(policy_needs(e.p)->macros.n, 1);
	assert_string_equal(policy_needs(e.p)->macros.v[0], "{daemon_name}");
	env_free(&e);

	env_load(&e, "");
	assert_int_equal(policy_rule_count(e.p), 0);
	assert_false(policy_needs(e.p)->headers.n > 0);
	assert_false(policy_needs(e.p)->message_actions);
	assert_false(policy_has_classes(e.p));
	env_free(&e);
}

/* ---- configuration errors ------------------------------------------------------------ */

static const struct {
	const char *text;
	const char *err;
} config_errors[] = {
	{ "limit \"a\" {\n  stage = connect;\n  key = client_addr;\n  rate = 10/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: unknown selector 'client_addr' (known: client_ip, "
	  "client_name, helo, sasl_user, sender, sender_domain, rcpt, rcpt_domain, header:NAME, "
	  "macro:NAME)" },
	{ "limit \"a\" {\n  stage = mail;\n  key = \"sender_domain+sender_dom\";\n  rate = 10/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: unknown selector 'sender_dom' (known: client_ip, "
	  "client_name, helo, sasl_user, sender, sender_domain, rcpt, rcpt_domain, header:NAME, "
	  "macro:NAME)" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = \"header:Subject\";\n  rate = 10/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: header:Subject has no value at stage rcpt (it needs stage "
	  "data or eom)" },
	{ "limit \"a\" {\n  stage = mail;\n  key = rcpt_domain;\n  rate = 10/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: rcpt_domain has no value at stage mail (it needs stage "
	  "rcpt)" },
	{ "limit \"a\" {\n  stage = data;\n  key = \"sender+rcpt\";\n  rate = 10/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: rcpt has no value at stage data (it needs stage rcpt)" },
	{ "limit \"a\" {\n  stage = connect;\n  key = helo;\n  rate = 10/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: helo has no value at stage connect (it needs stage helo or "
	  "later)" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt_domain;\n  count = connections;\n"
	  "  rate = 10/1m;\n}\n",
	  "t.conf:4: limit \"a\".count: count = connections needs stage = connect or helo" },
	{ "limit \"a\" {\n  stage = connect;\n  key = client_ip;\n  count = messages;\n"
	  "  rate = 10/1m;\n}\n",
	  "t.conf:4: limit \"a\".count: stage connect can only count connections, sessions or "
	  "distinct values" },
	{ "limit \"a\" {\n  stage = mail;\n  key = sender;\n  count = recipients;\n"
	  "  rate = 10/1m;\n}\n",
	  "t.conf:4: limit \"a\".count: recipients are known from stage rcpt on" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n  action = tempfail;\n"
	  "  reply = \"550 5.7.1 slow down\";\n}\n",
	  "t.conf:6: limit \"a\".reply: a tempfail reply starts with a 4xx code and a space" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n  action = reject;\n"
	  "  reply = \"451 4.7.1 slow down\";\n}\n",
	  "t.conf:6: limit \"a\".reply: a reject reply starts with a 5xx code and a space" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n"
	  "  reply = \"451 5.7.1 slow down\";\n}\n",
	  "t.conf:5: limit \"a\".reply: the enhanced status code's class differs from the reply "
	  "code's" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n"
	  "  reply = \"451 4.7 slow down\";\n}\n",
	  "t.conf:5: limit \"a\".reply: bad enhanced status code" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n"
	  "  reply = \"451 4.7.1\";\n}\n",
	  "t.conf:5: limit \"a\".reply: a reply needs text after its codes" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n"
	  "  reply = \"451 4.7.1 %{key} %{key} %{key} %{key} %{key}\";\n}\n",
	  "t.conf:5: limit \"a\".reply: the reply could grow past 511 bytes once its variables "
	  "are expanded: shorten it" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt_domain;\n  rate = 10/1m;\n"
	  "  action = discard;\n}\n",
	  "t.conf:5: limit \"a\".action: discard at stage rcpt would drop the whole message, "
	  "for every recipient: use stage mail, data or eom (or tempfail)" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n"
	  "  reply = \"421 4.7.1 go away\";\n}\n",
	  "t.conf:5: limit \"a\".reply: 421/521 close the SMTP session; use another code" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n"
	  "  reply = \"451 4.7.1 %{key} after %{wait}\";\n}\n",
	  "t.conf:5: limit \"a\".reply: unknown %{...} variable (known: %{rule} %{key} %{limit} "
	  "%{retry})" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n"
	  "  reply = \"451 4.7.1 %{key\";\n}\n",
	  "t.conf:5: limit \"a\".reply: unknown %{...} variable (known: %{rule} %{key} %{limit} "
	  "%{retry})" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n  action = warn;\n"
	  "  reply = \"451 4.7.1 slow down\";\n}\n",
	  "t.conf:6: limit \"a\".reply: only tempfail and reject rules send a reply" },
	{ "limit \"a\" {\n  stage = connect;\n  key = client_ip;\n  rate = 10/1m;\n"
	  "  action = tag;\n}\n",
	  "t.conf:5: limit \"a\".action: tag acts on a message: it needs stage mail or later" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 10/1m;\n  action = bounce;\n}\n",
	  "t.conf:5: limit \"a\".action: 'bounce' is not one of: warn, delay, tag, quarantine, "
	  "discard, tempfail, reject" },
	{ "limit \"a\" { stage = rcpt; key = rcpt; rate = 10/1m; }\n"
	  "limit \"b\" { stage = mail; key = sender; rate = 10/1m; }\n"
	  "limit \"a\" { stage = mail; key = sender; rate = 10/1m; }\n",
	  "t.conf:3: limit \"a\": a second rule named \"a\"" },
	{ "class \"campus\" { hosts = [\"*.example.edu\"]; sessions = 8; inbound = 8; }\n"
	  "class \"net\" {\n  hosts = [\"192.0.2.0/24\"];\n  sessions = 3;\n  inbound = 3;\n}\n",
	  "t.conf:2: class \"net\": the last class must match every host (hosts = [\"*\"]): a "
	  "host in no class would have no limit" },
	{ "class \"x\" { hosts = [\"*\"]; sessions = 3; inbound = 3; }\n"
	  "class \"x\" { hosts = [\"*\"]; sessions = 3; inbound = 3; }\n",
	  "t.conf:2: class \"x\": a second class named \"x\"" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = [\"10/1m\",\n    \"10/1x\"];\n}\n",
	  "t.conf:5: limit \"a\".rate[1]: bad rate window '10/1x': the period must be [N]s, m, h, "
	  "d or w" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = \"0/1m\";\n}\n",
	  "t.conf:4: limit \"a\".rate: bad rate window '0/1m': the count must be in [1, 10^15]" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = ten/1m;\n}\n",
	  "t.conf:4: limit \"a\".rate: bad rate window 'ten/1m': the count must be a number with "
	  "an optional k, M or G" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = [\"10/1m\", \"20/60s\"];\n}\n",
	  "t.conf:4: limit \"a\".rate[1]: two windows with the same period" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n}\n",
	  "t.conf:1: limit \"a\": missing 'rate' (e.g. rate = [\"10/1m\", \"500/1d\"])" },
	{ "limit \"a\" {\n  key = rcpt;\n  rate = 1/1m;\n}\n", "t.conf:1: limit \"a\": missing 'stage'" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 1/1m;\n"
	  "  except { client_ip/24 = [\"192.0.2.0/24\"]; }\n}\n",
	  "t.conf:5: limit \"a\".except.client_ip/24: write the prefix in the values "
	  "(client_ip = [\"192.0.2.0/24\"])" },
	{ "limit \"a\" {\n  stage = connect;\n  key = client_ip;\n  rate = 1/1m;\n"
	  "  except {\n    sender = [\"*.example.com\"];\n  }\n}\n",
	  "t.conf:6: limit \"a\".except.sender: sender has no value at stage connect (it needs "
	  "stage mail or later)" },
};

static void test_config_errors(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(config_errors); i++) {
		char err[1024] = "";
		struct policy *p = NULL;
		const char *want = config_errors[i].err;
		int rc = load_text(config_errors[i].text, &p, err, sizeof(err));
		if (rc != -EINVAL || strcmp(err, want) != 0)
			fail_msg("case %zu: rc %d\n got: %s\nwant: %s", i, rc, err, want);
		assert_null(p);
	}
}

/* ---- GCRA through the policy --------------------------------------------------------- */

/* The seconds of "try again in Ns" at the end of a reply. */
static unsigned reply_retry(const char *reply)
{
	const char *p = strstr(reply, "try again in ");
	assert_non_null(p);
	unsigned s = 0;
	char unit = 0;
	assert_int_equal(sscanf(p + 13, "%u%c", &s, &unit), 2);
	assert_int_equal(unit, 's');
	return s;
}

static void test_gcra(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"per-ip\" { stage = connect; key = client_ip; rate = \"10/1m\"; }\n");
	struct tx x = { .ip = "192.0.2.1" };
	struct run r;
	for (int i = 0; i < 10; i++) {
		run(&e, &x, POLICY_CONNECT, NULL, STORE_CHECK, T0, &r);
		assert_int_equal(r.d.action, POLICY_ACCEPT);
		assert_int_equal(r.res[0].state, POLICY_RULE_PASS);
		assert_int_equal(r.res[0].used[0], (uint64_t)i + 1);
		assert_string_equal(r.d.reply, "");
	}
	/* the 11th at the same instant; refused events are not charged, so it stays so */
	bool seen[3] = { false };
	for (int i = 0; i < 200; i++) {
		run(&e, &x, POLICY_CONNECT, NULL, STORE_CHECK, T0, &r);
		assert_int_equal(r.d.action, POLICY_TEMPFAIL);
		assert_string_equal(policy_rule_name(r.d.rule), "per-ip");
		assert_string_equal(r.d.key, "192.0.2.1");
		assert_int_equal(r.d.retry_s, 6);
		assert_int_equal(r.res[0].state, POLICY_RULE_OVER);
		assert_int_equal(r.res[0].retry_ns, 6 * SEC);
		assert_false(r.res[0].charged);
		assert_int_equal(r.d.nover, 1);
		assert_string_equal(r.d.over[0].limit, "10/1m");
		assert_int_equal(r.d.over[0].retry_s, 6);
		assert_ptr_equal(r.d.over[0].rule, r.d.rule);
		assert_true(strncmp(r.d.reply, "451 4.7.1 ", 10) == 0);
		assert_non_null(strstr(r.d.reply, "192.0.2.1"));
		unsigned shown = reply_retry(r.d.reply);
		/* jitter: at most a fifth more, plus less than a second */
		assert_true(shown >= 6 && shown <= 8);
		seen[shown - 6] = true;
	}
	assert_true(seen[0]); /* the exact wait is shown too (the spread is 6 + [0, 2)) */
	/* a nanosecond short of the wait: still refused, the retry rounded up */
	run(&e, &x, POLICY_CONNECT, NULL, STORE_CHECK, T0 + 6 * SEC - 1, &r);
	assert_int_equal(r.d.action, POLICY_TEMPFAIL);
	assert_int_equal(r.d.retry_s, 1);
	/* after 6 s one more passes, and only one */
	assert_int_equal(act(&e, &x, POLICY_CONNECT, NULL, T0 + 6 * SEC), POLICY_ACCEPT);
	assert_int_equal(act(&e, &x, POLICY_CONNECT, NULL, T0 + 6 * SEC), POLICY_TEMPFAIL);
	/* after a full minute idle, the whole burst again */
	for (int i = 0; i < 10; i++)
		assert_int_equal(act(&e, &x, POLICY_CONNECT, NULL, T0 + 200 * SEC), POLICY_ACCEPT);
	assert_int_equal(act(&e, &x, POLICY_CONNECT, NULL, T0 + 200 * SEC), POLICY_TEMPFAIL);
	/* another key has its own budget */
	assert_int_equal(act(&e, &(struct tx){ .ip = "192.0.2.2" }, POLICY_CONNECT, NULL, T0),
			 POLICY_ACCEPT);
	env_free(&e);
}

/* A reply template with every variable; two windows, the one that binds is named. */
static void test_reply_template(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"rcpt-dom\" {\n  stage = rcpt; key = rcpt_domain;\n"
		     "  rate = [\"100/1m\", \"2/1h\"];\n  action = reject;\n"
		     "  reply = \"550 5.7.1 %{rule}: %{key} is over %{limit}, retry in %{retry}\";\n}\n");
	struct tx x = { .sender = "", .rcpt = "<u@Example.ORG>" };
	assert_int_equal(act(&e, &x, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);
	assert_int_equal(act(&e, &x, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);
	struct run r;
	run(&e, &x, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_REJECT);
	assert_int_equal(r.d.retry_s, 1800); /* T = 30 min for 2/1h */
	/* 1800 s + jitter of up to 360 s: "30m" .. "36m" */
	const char *prefix = "550 5.7.1 rcpt-dom: example.org is over 2/1h, retry in ";
	assert_true(strncmp(r.d.reply, prefix, strlen(prefix)) == 0);
	unsigned m = 0;
	char rest[16] = "";
	int k = sscanf(r.d.reply + strlen(prefix), "%um%15s", &m, rest);
	assert_true(k >= 1);
	assert_true(m >= 30 && m <= 36);
	assert_string_equal(r.d.over[0].limit, "2/1h");
	env_free(&e);
}

/* ---- several rules on one event ------------------------------------------------------ */

static void test_strictest_wins(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"w\" { stage = mail; key = sender; rate = 1/1h; action = warn; }\n"
		     "limit \"t\" { stage = mail; key = sender_domain; rate = 1/1h; }\n"
		     "limit \"r\" { stage = mail; key = client_ip; rate = 1/1h; action = reject; }\n"
		     "limit \"ok\" { stage = mail; key = helo; rate = 100/1h; }\n");
	struct tx a = { .ip = "192.0.2.1", .helo = "h", .sender = "<a@example.com>" };
	struct run r;
	run(&e, &a, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_int_equal(r.d.nover, 0);
	for (size_t i = 0; i < 4; i++)
		assert_true(r.res[i].charged);

	/* all three over: reject wins over tempfail over warn; the passing rule is not
	 * charged by the refused event */
	run(&e, &a, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_REJECT);
	assert_string_equal(policy_rule_name(r.d.rule), "r");
	assert_string_equal(r.d.key, "192.0.2.1");
	assert_true(strncmp(r.d.reply, "550 5.7.1 Rate limit exceeded for 192.0.2.1", 43) == 0);
	assert_int_equal(r.d.nover, 3);
	assert_int_equal(res_of(&r, "ok")->state, POLICY_RULE_PASS);
	assert_false(res_of(&r, "ok")->charged);
	assert_int_equal(used(&e, &a, POLICY_MAIL, "ok", T0), 1);

	/* another client: the reject rule passes, tempfail wins over warn, and the reject
	 * rule's new key is not charged */
	struct tx b = { .ip = "192.0.2.2", .helo = "h", .sender = "<a@example.com>" };
	run(&e, &b, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_TEMPFAIL);
	assert_string_equal(policy_rule_name(r.d.rule), "t");
	assert_string_equal(r.d.key, "example.com");
	assert_true(strncmp(r.d.reply, "451 4.7.1 Rate limit exceeded for example.com, try "
				       "again in ", 53) == 0);
	assert_int_equal(r.d.nover, 2);
	assert_int_equal(res_of(&r, "r")->state, POLICY_RULE_PASS);
	assert_false(res_of(&r, "r")->charged);
	assert_int_equal(used(&e, &b, POLICY_MAIL, "r", T0), 0);
	assert_int_equal(used(&e, &b, POLICY_MAIL, "ok", T0), 1);

	env_free(&e);

	/* only warn is over.  The decision reports WARN (rule, key, retry, an over entry) but
	 * no reply, and the event passes: every other rule is charged, the warn rule itself is
	 * not (it stays at its limit) */
	env_load(&e, "limit \"w\" { stage = mail; key = sender; rate = 1/1h; action = warn; }\n"
		     "limit \"t\" { stage = mail; key = client_ip; rate = 5/1h; }\n"
		     "limit \"ok\" { stage = mail; key = helo; rate = 100/1h; }\n");
	struct tx v = { .ip = "192.0.2.5", .helo = "h", .sender = "<v@example.com>" };
	assert_int_equal(act(&e, &v, POLICY_MAIL, NULL, T0), POLICY_ACCEPT);
	run(&e, &v, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_WARN);
	assert_string_equal(policy_rule_name(r.d.rule), "w");
	assert_string_equal(r.d.key, "v@example.com");
	assert_string_equal(r.d.reply, "");
	assert_int_equal(r.d.retry_s, 3600);
	assert_int_equal(r.d.nover, 1);
	assert_string_equal(r.d.over[0].limit, "1/1h");
	assert_int_equal(res_of(&r, "w")->state, POLICY_RULE_OVER);
	assert_false(res_of(&r, "w")->charged);
	assert_true(res_of(&r, "t")->charged);
	assert_true(res_of(&r, "ok")->charged);
	assert_int_equal(used(&e, &v, POLICY_MAIL, "w", T0), 1);
	assert_int_equal(used(&e, &v, POLICY_MAIL, "t", T0), 2);
	assert_int_equal(used(&e, &v, POLICY_MAIL, "ok", T0), 2);
	/* warn never refuses: the client can go on until a blocking rule says no */
	for (int i = 0; i < 3; i++)
		assert_int_equal(act(&e, &v, POLICY_MAIL, NULL, T0), POLICY_WARN);
	assert_int_equal(act(&e, &v, POLICY_MAIL, NULL, T0), POLICY_TEMPFAIL);
	env_free(&e);
}

/* The order of the actions, one pair at a time: the stricter wins whatever the rule order. */
static void test_action_order(void **state)
{
	(void)state;
	static const char *const acts[] = { "warn", "delay; delay = 1ms", "tag", "quarantine",
					    "discard", "tempfail", "reject" };
	static const enum policy_action codes[] = { POLICY_WARN, POLICY_DELAY, POLICY_TAG,
						    POLICY_QUARANTINE, POLICY_DISCARD,
						    POLICY_TEMPFAIL, POLICY_REJECT };
	for (size_t i = 0; i < ARRAY_SIZE(acts); i++)
		for (size_t j = 0; j < ARRAY_SIZE(acts); j++) {
			if (i == j)
				continue;
			char text[512];
			snprintf(text, sizeof(text),
				 "limit \"x\" { stage = mail; key = sender; rate = 1/1h; action = %s; }\n"
				 "limit \"y\" { stage = mail; key = sender_domain; rate = 1/1h; "
				 "action = %s; }\n",
				 acts[i], acts[j]);
			struct env e;
			env_load(&e, text);
			struct tx x = { .sender = "<u@example.com>" };
			struct policy_msg m;
			memset(&m, 0, sizeof(m));
			assert_int_equal(act(&e, &x, POLICY_MAIL, &m, T0), POLICY_ACCEPT);
			/* the next message */
			policy_msg_end(e.p, &m, true, T0);
			struct run r;
			run(&e, &x, POLICY_MAIL, &m, STORE_CHECK, T0, &r);
			enum policy_action want = codes[i > j ? i : j];
			if (r.d.action != want)
				fail_msg("%s vs %s: got %s", acts[i], acts[j],
					 policy_action_name(r.d.action));
			assert_string_equal(policy_rule_name(r.d.rule), i > j ? "x" : "y");
			assert_int_equal(r.d.nover, 2);
			policy_msg_clear(&m);
			env_free(&e);
		}
}

static void test_count_rejected(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"gate\" { stage = rcpt; key = rcpt; rate = 1/1h; action = reject; }\n"
		     "limit \"tries\" { stage = rcpt; key = client_ip; rate = 100/1h;\n"
		     "  count = recipients; count_rejected = yes; }\n"
		     "limit \"plain\" { stage = rcpt; key = client_ip; rate = 100/1h;\n"
		     "  count = recipients; }\n");
	struct tx x = { .ip = "192.0.2.1", .sender = "", .rcpt = "<u@example.com>" };
	assert_int_equal(act(&e, &x, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);
	for (int i = 0; i < 4; i++) {
		struct run r;
		run(&e, &x, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
		assert_int_equal(r.d.action, POLICY_REJECT);
		assert_true(res_of(&r, "tries")->charged);
		assert_false(res_of(&r, "plain")->charged);
	}
	assert_int_equal(used(&e, &x, POLICY_RCPT, "tries", T0), 5);
	assert_int_equal(used(&e, &x, POLICY_RCPT, "plain", T0), 1);

	/* PEEK changes nothing, even for count_rejected */
	struct run r;
	run(&e, &x, POLICY_RCPT, NULL, STORE_PEEK, T0, &r);
	assert_int_equal(r.d.action, POLICY_REJECT);
	assert_int_equal(used(&e, &x, POLICY_RCPT, "tries", T0), 5);
	env_free(&e);
}

/* ---- the message ledger: per-message counting and refunds ----------------------------- */

static void test_refunds(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"conn\" { stage = connect; key = client_ip; rate = 100/1h; }\n"
		     "limit \"from\" { stage = mail; key = sender; rate = 100/1h; }\n"
		     "limit \"dom\" { stage = rcpt; key = rcpt_domain; count = messages;\n"
		     "  rate = 1/1h; }\n"
		     "limit \"rcpts\" { stage = rcpt; key = client_ip; count = recipients;\n"
		     "  rate = 100/1h; }\n");
	struct policy_msg m;
	memset(&m, 0, sizeof(m));
	struct tx c = { .ip = "192.0.2.1" };
	struct tx mail = { .ip = "192.0.2.1", .sender = "<s@example.org>" };
	struct tx r1 = { .ip = "192.0.2.1", .sender = "<s@example.org>", .rcpt = "<a@example.com>" };
	struct tx r2 = { .ip = "192.0.2.1", .sender = "<s@example.org>", .rcpt = "<b@Example.COM>" };
	struct run r;

	/* connect-stage charges are never in the ledger */
	assert_int_equal(act(&e, &c, POLICY_CONNECT, &m, T0), POLICY_ACCEPT);
	assert_int_equal(m.n, 0);

	/* message 1: two recipients of one domain count the message once */
	assert_int_equal(act(&e, &mail, POLICY_MAIL, &m, T0), POLICY_ACCEPT);
	assert_int_equal(m.n, 1);
	run(&e, &r1, POLICY_RCPT, &m, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_int_equal(res_of(&r, "dom")->state, POLICY_RULE_PASS);
	assert_true(res_of(&r, "dom")->charged);
	run(&e, &r2, POLICY_RCPT, &m, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_int_equal(res_of(&r, "dom")->state, POLICY_RULE_COUNTED);
	assert_string_equal(res_of(&r, "dom")->key, "example.com");
	assert_false(res_of(&r, "dom")->charged);
	assert_int_equal(res_of(&r, "rcpts")->state, POLICY_RULE_PASS);
	assert_true(res_of(&r, "rcpts")->charged);
	assert_int_equal(m.n, 4); /* from, dom, rcpts x2 */
	assert_int_equal(used(&e, &r1, POLICY_RCPT, "dom", T0), 1);
	assert_int_equal(used(&e, &r1, POLICY_RCPT, "rcpts", T0), 2);
	assert_int_equal(used(&e, &mail, POLICY_MAIL, "from", T0), 1);

	/* aborted: every charge of the message goes back, the connection's stays */
	policy_msg_end(e.p, &m, false, T0 + SEC);
	assert_int_equal(m.n, 0);
	assert_int_equal(used(&e, &r1, POLICY_RCPT, "dom", T0 + SEC), 0);
	assert_int_equal(used(&e, &r1, POLICY_RCPT, "rcpts", T0 + SEC), 0);
	assert_int_equal(used(&e, &mail, POLICY_MAIL, "from", T0 + SEC), 0);
	assert_int_equal(used(&e, &c, POLICY_CONNECT, "conn", T0 + SEC), 1);

	/* message 2 sees the budget again (1/1h would refuse it otherwise), and is delivered */
	assert_int_equal(act(&e, &mail, POLICY_MAIL, &m, T0 + 2 * SEC), POLICY_ACCEPT);
	assert_int_equal(act(&e, &r2, POLICY_RCPT, &m, T0 + 2 * SEC), POLICY_ACCEPT);
	assert_int_equal(act(&e, &r1, POLICY_RCPT, &m, T0 + 2 * SEC), POLICY_ACCEPT);
	policy_msg_end(e.p, &m, true, T0 + 3 * SEC);
	assert_int_equal(m.n, 0);
	assert_int_equal(used(&e, &r1, POLICY_RCPT, "dom", T0 + 3 * SEC), 1);
	assert_int_equal(used(&e, &r1, POLICY_RCPT, "rcpts", T0 + 3 * SEC), 2);

	/* message 3: the domain's budget is spent; the refused recipient charges nothing */
	assert_int_equal(act(&e, &mail, POLICY_MAIL, &m, T0 + 4 * SEC), POLICY_ACCEPT);
	run(&e, &r1, POLICY_RCPT, &m, STORE_CHECK, T0 + 4 * SEC, &r);
	assert_int_equal(r.d.action, POLICY_TEMPFAIL);
	assert_false(res_of(&r, "rcpts")->charged);
	/* a later recipient of the same domain in the same message is decided again (it was
	 * not counted for this message) */
	run(&e, &r2, POLICY_RCPT, &m, STORE_CHECK, T0 + 4 * SEC, &r);
	assert_int_equal(res_of(&r, "dom")->state, POLICY_RULE_OVER);
	assert_int_equal(m.n, 1);
	/* a recipient elsewhere passes; then the message is refused at DATA: refunded */
	struct tx r3 = { .ip = "192.0.2.1", .sender = "<s@example.org>", .rcpt = "<c@example.net>" };
	assert_int_equal(act(&e, &r3, POLICY_RCPT, &m, T0 + 4 * SEC), POLICY_ACCEPT);
	assert_int_equal(m.n, 3);
	policy_msg_end(e.p, &m, false, T0 + 5 * SEC);
	assert_int_equal(used(&e, &r3, POLICY_RCPT, "dom", T0 + 5 * SEC), 0);
	assert_int_equal(used(&e, &r3, POLICY_RCPT, "rcpts", T0 + 5 * SEC), 2);
	assert_int_equal(used(&e, &mail, POLICY_MAIL, "from", T0 + 5 * SEC), 1);
	/* the earlier delivered message is not refunded by a later abort */
	assert_int_equal(used(&e, &r1, POLICY_RCPT, "dom", T0 + 5 * SEC), 1);

	/* without a ledger (msg NULL) each recipient counts */
	assert_int_equal(act(&e, &r3, POLICY_RCPT, NULL, T0 + 6 * SEC), POLICY_ACCEPT);
	assert_int_equal(act(&e, &r3, POLICY_RCPT, NULL, T0 + 6 * SEC), POLICY_TEMPFAIL);
	policy_msg_clear(&m);
	env_free(&e);
}

/* Charges of a count_rejected rule stay even when the message is aborted. */
static void test_refund_skips_count_rejected(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"plain\" { stage = mail; key = sender; rate = 10/1h; }\n"
		     "limit \"sticky\" { stage = mail; key = sender; rate = 10/1h;\n"
		     "  count_rejected = yes; }\n");
	struct policy_msg m;
	memset(&m, 0, sizeof(m));
	struct tx x = { .ip = "192.0.2.1", .sender = "<s@example.org>" };
	assert_int_equal(act(&e, &x, POLICY_MAIL, &m, T0), POLICY_ACCEPT);
	assert_int_equal(m.n, 2);
	policy_msg_end(e.p, &m, false, T0);
	assert_int_equal(used(&e, &x, POLICY_MAIL, "plain", T0), 0);
	assert_int_equal(used(&e, &x, POLICY_MAIL, "sticky", T0), 1);
	/* PEEK writes nothing to the ledger */
	struct run r;
	run(&e, &x, POLICY_MAIL, &m, STORE_PEEK, T0, &r);
	assert_int_equal(m.n, 0);
	policy_msg_clear(&m);
	env_free(&e);
}

/* ---- except lists -------------------------------------------------------------------- */

static const struct {
	struct tx tx;
	enum policy_rule_state state;
	const char *why;
} except_cases[] = {
	{ { .ip = "127.0.0.5", .sender = "<a@x.example>", .rcpt = "<r@x.example>" },
	  POLICY_RULE_EXCEPT, "except client_ip" },
	{ { .ip = "::ffff:127.0.0.1", .sender = "<a@x.example>", .rcpt = "<r@x.example>" },
	  POLICY_RULE_EXCEPT, "except client_ip" },
	{ { .ip = "2001:db8:ffff::1", .sender = "<a@x.example>", .rcpt = "<r@x.example>" },
	  POLICY_RULE_EXCEPT, "except client_ip" },
	{ { .ip = "2001:db9::1", .sender = "<a@x.example>", .rcpt = "<r@x.example>" },
	  POLICY_RULE_PASS, "" },
	{ { .ip = "192.0.2.1", .sender = "<a@example.org>", .rcpt = "<r@x.example>" },
	  POLICY_RULE_EXCEPT, "except sender" },
	{ { .ip = "192.0.2.1", .sender = "<a@lists.Example.ORG>", .rcpt = "<r@x.example>" },
	  POLICY_RULE_EXCEPT, "except sender" },
	{ { .ip = "192.0.2.1", .sender = "a@example.org.", .rcpt = "<r@x.example>" },
	  POLICY_RULE_EXCEPT, "except sender" },
	{ { .ip = "192.0.2.1", .sender = " <a@example.org> ", .rcpt = "<r@x.example>" },
	  POLICY_RULE_EXCEPT, "except sender" },
	{ { .ip = "192.0.2.1", .sender = "<a@notexample.org>", .rcpt = "<r@x.example>" },
	  POLICY_RULE_PASS, "" },
	{ { .ip = "192.0.2.1", .sender = "<a@x.example>", .rcpt = "<abuse@X.Example.>" },
	  POLICY_RULE_EXCEPT, "except rcpt" },
	{ { .ip = "192.0.2.1", .sender = "<a@x.example>", .rcpt = "abuse@x.example " },
	  POLICY_RULE_EXCEPT, "except rcpt" },
	{ { .ip = "192.0.2.1", .sender = "<a@x.example>", .rcpt = "<Abuse@x.example>" },
	  POLICY_RULE_PASS, "" },
	{ { .ip = "192.0.2.1", .sender = "<>", .rcpt = "<r@x.example>" }, POLICY_RULE_PASS, "" },
	{ { .ip = "192.0.2.1", .sender = "<a@x.example>", .rcpt = "<r@Postmaster.Example>" },
	  POLICY_RULE_EXCEPT, "except rcpt_domain" },
	{ { .ip = "192.0.2.1", .sender = "<a@x.example>", .rcpt = "<r@sub.postmaster.example>" },
	  POLICY_RULE_PASS, "" },
	{ { .ip = "192.0.2.1", .sender = "<a@x.example>", .rcpt = "<r@x.example>" },
	  POLICY_RULE_PASS, "" },
};

static void test_except(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"e\" {\n  stage = rcpt; key = sender; rate = 1/1h;\n"
		     "  except {\n"
		     "    client_ip = [\"127.0.0.0/8\", \"2001:db8::/32\"];\n"
		     "    sender = \"*.example.org\";\n"
		     "    rcpt_domain = [\"postmaster.example\"];\n"
		     "    rcpt = [\"abuse@x.example\"];\n"
		     "  }\n}\n");
	for (size_t i = 0; i < ARRAY_SIZE(except_cases); i++) {
		struct tx x = except_cases[i].tx;
		struct run r;
		run(&e, &x, POLICY_RCPT, NULL, STORE_PEEK, T0, &r);
		assert_int_equal(r.d.nresults, 1);
		if (r.res[0].state != except_cases[i].state ||
		    strcmp(r.res[0].why, except_cases[i].why) != 0)
			fail_msg("case %zu: state %d why '%s'", i, r.res[0].state, r.res[0].why);
	}
	/* an excepted client is never limited, nor charged */
	struct tx x = { .ip = "127.0.0.1", .sender = "<a@x.example>", .rcpt = "<r@x.example>" };
	for (int i = 0; i < 5; i++)
		assert_int_equal(act(&e, &x, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);
	x.ip = "192.0.2.1";
	assert_int_equal(used(&e, &x, POLICY_RCPT, "e", T0), 0);
	assert_int_equal(act(&e, &x, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);
	assert_int_equal(act(&e, &x, POLICY_RCPT, NULL, T0), POLICY_TEMPFAIL);
	env_free(&e);
}

/* ---- overrides ----------------------------------------------------------------------- */

static void write_file(const char *path, const char *text, time_t mtime)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
	struct timespec ts[2] = { { mtime, 0 }, { mtime, 0 } };
	assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

struct tmpdir {
	char dir[64];
	char file[128];
};

static void tmp_make(struct tmpdir *t, const char *name)
{
	snprintf(t->dir, sizeof(t->dir), "/tmp/test_policy.XXXXXX");
	assert_non_null(mkdtemp(t->dir));
	snprintf(t->file, sizeof(t->file), "%s/%s", t->dir, name);
}

static void tmp_remove(struct tmpdir *t)
{
	unlink(t->file);
	assert_int_equal(rmdir(t->dir), 0);
}

static const struct rate_limits *limits_for(struct env *e, const char *rule, const char *key,
					    bool *ret_ov)
{
	static struct rate_limits copy; /* valid until the next call */
	const struct policy_rule *r = policy_rule_find(e->p, rule);
	assert_non_null(r);
	return policy_rule_limits(r, str_cstr(key), &copy, ret_ov) ? &copy : NULL;
}

static void test_overrides(void **state)
{
	(void)state;
	struct tmpdir td;
	tmp_make(&td, "rcpt.limits");
	write_file(td.file,
		   "# per recipient domain\n"
		   "Example.COM.   3/1m      # a big customer\n"
		   "bulk.example   0\n"
		   "two.example    1/1m, 2/1h\n",
		   1700000000);
	char text[512];
	snprintf(text, sizeof(text),
		 "limit \"dom\" { stage = rcpt; key = rcpt_domain; rate = 1/1m;\n"
		 "  overrides = \"%s\"; }\n",
		 td.file);
	struct env e;
	env_load(&e, text);
	struct run r;
	bool ov;

	/* a key in the file: its limits, whatever case it was written in */
	struct tx big = { .sender = "", .rcpt = "<u@example.com>" };
	for (int i = 0; i < 3; i++) {
		run(&e, &big, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
		assert_int_equal(r.d.action, POLICY_ACCEPT);
		assert_true(r.res[0].overridden);
		assert_int_equal(r.res[0].limits.n, 1);
		assert_int_equal(r.res[0].limits.w[0].count, 3);
	}
	run(&e, &big, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_TEMPFAIL);
	assert_string_equal(r.d.over[0].limit, "3/1m");
	assert_int_equal(r.d.retry_s, 20);

	/* 0 = unlimited: never charged, never refused */
	struct tx bulk = { .sender = "", .rcpt = "<u@BULK.example>" };
	for (int i = 0; i < 20; i++) {
		run(&e, &bulk, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
		assert_int_equal(r.d.action, POLICY_ACCEPT);
		assert_int_equal(r.res[0].state, POLICY_RULE_UNLIMITED);
		assert_true(r.res[0].overridden);
		assert_string_equal(r.res[0].key, "bulk.example");
		assert_false(r.res[0].charged);
	}
	assert_null(limits_for(&e, "dom", "bulk.example", &ov));
	assert_true(ov);

	/* two windows for one key */
	const struct rate_limits *l = limits_for(&e, "dom", "two.example", &ov);
	assert_non_null(l);
	assert_true(ov);
	assert_int_equal(l->n, 2);

	/* a key not in the file: the rule's limits */
	struct tx other = { .sender = "", .rcpt = "<u@other.example>" };
	run(&e, &other, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_false(r.res[0].overridden);
	assert_int_equal(r.res[0].limits.w[0].count, 1);
	assert_int_equal(act(&e, &other, POLICY_RCPT, NULL, T0), POLICY_TEMPFAIL);

	/* operator keys are normalized like the rule's keys */
	char norm[RATE_MAX_OVERRIDE_KEY + 1];
	const struct policy_rule *rule = policy_rule_find(e.p, "dom");
	int n = policy_rule_normalize_key(rule, str_cstr("EXAMPLE.com."), norm);
	assert_int_equal(n, 11);
	assert_memory_equal(norm, "example.com", 11);

	/* nothing changed on disk: nothing reloaded */
	struct buf err;
	buf_init(&err, 4096);
	assert_int_equal(policy_reload_overrides(e.p, &err), 0);
	assert_int_equal(err.len, 0);

	/* a changed file is picked up */
	write_file(td.file, "example.com 5/1m\n", 1700000100);
	assert_int_equal(policy_reload_overrides(e.p, &err), 1);
	assert_int_equal(err.len, 0);
	l = limits_for(&e, "dom", "example.com", &ov);
	assert_true(ov);
	assert_int_equal(l->w[0].count, 5);
	l = limits_for(&e, "dom", "bulk.example", &ov); /* gone from the file */
	assert_false(ov);
	assert_non_null(l);
	assert_int_equal(l->w[0].count, 1);
	/* the store keeps one record per (key, window): a changed window starts afresh, so
	 * the 3 units taken under 3/1m do not count against 5/1m */
	for (int i = 0; i < 5; i++)
		assert_int_equal(act(&e, &big, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);
	assert_int_equal(act(&e, &big, POLICY_RCPT, NULL, T0), POLICY_TEMPFAIL);

	/* a bad file keeps the table in use and says where it is wrong */
	write_file(td.file, "example.com 7/1m\nbad.example ten/1m\n", 1700000200);
	assert_int_equal(policy_reload_overrides(e.p, &err), 0);
	char where[200];
	snprintf(where, sizeof(where), "%s:2:", td.file);
	if (!strstr(buf_str(&err).ptr, where))
		fail_msg("error '%s' does not name '%s'", buf_str(&err).ptr, where);
	assert_non_null(strstr(buf_str(&err).ptr, "limit \"dom\""));
	l = limits_for(&e, "dom", "example.com", &ov);
	assert_true(ov);
	assert_int_equal(l->w[0].count, 5);
	/* reported once per change of the file, not at every check */
	buf_reset(&err);
	assert_int_equal(policy_reload_overrides(e.p, &err), 0);
	assert_int_equal(err.len, 0);
	/* fixed again: picked up */
	write_file(td.file, "example.com 0\n", 1700000300);
	assert_int_equal(policy_reload_overrides(e.p, &err), 1);
	assert_null(limits_for(&e, "dom", "example.com", &ov));
	assert_true(ov);
	assert_int_equal(act(&e, &big, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);

	buf_done(&err);
	env_free(&e);

	/* a bad file at load: the rule set does not load, the error names file and line */
	write_file(td.file, "ok.example 1/1m\nok.example 2/1m\n", 1700000400);
	struct policy *p = NULL;
	char msg[1024];
	assert_int_equal(load_text(text, &p, msg, sizeof(msg)), -EINVAL);
	assert_null(p);
	char head[256];
	snprintf(head, sizeof(head), "t.conf:2: limit \"dom\".overrides: %s:2: ", td.file);
	if (strncmp(msg, head, strlen(head)) != 0)
		fail_msg("got '%s'", msg);
	tmp_remove(&td);
}

/* Keys of compound rules in an overrides file; a key at the length limit. */
static void test_overrides_compound(void **state)
{
	(void)state;
	struct tmpdir td;
	tmp_make(&td, "pairs.limits");
	/* 256 + '+' + 255 = 512 bytes: the longest key a file may hold */
	char longkey[RATE_MAX_OVERRIDE_KEY + 1];
	memset(longkey, 'a', 256);
	longkey[256] = '+';
	memset(longkey + 257, 'B', 255);
	longkey[512] = '\0';
	char file[1024];
	snprintf(file, sizeof(file), "Example.COM+Example.NET 2/1m\n%s 0\n", longkey);
	write_file(td.file, file, 1700000000);
	char text[512];
	snprintf(text, sizeof(text),
		 "limit \"pair\" { stage = rcpt; key = \"sender_domain+rcpt_domain\";\n"
		 "  rate = 1/1m; overrides = \"%s\"; }\n",
		 td.file);
	struct env e;
	env_load(&e, text);
	struct tx x = { .sender = "<a@example.com>", .rcpt = "<b@EXAMPLE.net>" };
	struct run r;
	run(&e, &x, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
	assert_string_equal(r.res[0].key, "example.com+example.net");
	assert_true(r.res[0].overridden);
	assert_int_equal(act(&e, &x, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);
	assert_int_equal(act(&e, &x, POLICY_RCPT, NULL, T0), POLICY_TEMPFAIL);

	/* the long key, met in a transaction whose values are that long */
	char sender[300], rcpt[300];
	snprintf(sender, sizeof(sender), "<x@%.256s>", longkey);
	snprintf(rcpt, sizeof(rcpt), "<y@%.255s>", longkey + 257);
	struct tx y = { .sender = sender, .rcpt = rcpt };
	run(&e, &y, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.res[0].state, POLICY_RULE_UNLIMITED);
	assert_int_equal(strlen(r.res[0].key), 512);
	env_free(&e);
	tmp_remove(&td);
}

/* ---- classes ------------------------------------------------------------------------- */

static struct ipaddr ip_of(const char *text)
{
	struct ipaddr a;
	assert_int_equal(ipaddr_parse(str_cstr(text), &a), 0);
	return a;
}

static const struct {
	const char *ip; /* NULL: unknown */
	const char *name;
	const char *class;
} class_cases[] = {
	{ "198.51.100.1", "mx.example.net", "m-host" },
	{ "192.0.2.1", "mx.example.net", "m-host" }, /* first match, though in m-net too */
	{ "203.0.113.1", "MX.Example.NET.", "m-host" },
	{ "198.51.100.1", "example.com", "m-dom" },
	{ "198.51.100.1", "a.b.example.com", "m-dom" },
	{ "192.0.2.1", "x.example.com", "m-dom" },
	{ "198.51.100.1", "notexample.com", "m-any" },
	{ "198.51.100.1", "mx.example.net.evil", "m-any" },
	{ "192.0.2.1", "", "m-net" },
	{ "::ffff:192.0.2.1", "", "m-net" },
	{ "2001:db8::1", "", "m-net" },
	{ "2001:db9::1", "", "m-any" },
	{ NULL, "", "m-any" },
	{ NULL, "sub.example.com", "m-dom" },
};

static void test_class_match(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "class \"m-host\" { hosts = \"mx.example.net\"; sessions = 5; inbound = 1; }\n"
		     "class \"m-dom\" { hosts = [\"*.example.com\"]; sessions = 5; inbound = 2; }\n"
		     "class \"m-net\" { hosts = [\"192.0.2.0/24\", \"2001:db8::/32\"];\n"
		     "  sessions = 5; inbound = 2; }\n"
		     "class \"m-any\" { hosts = [\"*\"]; sessions = 3; inbound = 3; }\n");
	assert_true(policy_has_classes(e.p));
	for (size_t i = 0; i < ARRAY_SIZE(class_cases); i++) {
		struct ipaddr a;
		if (class_cases[i].ip)
			a = ip_of(class_cases[i].ip);
		const char *c = policy_class_match(e.p, class_cases[i].ip ? &a : NULL,
						   str_cstr(class_cases[i].name));
		if (!c || strcmp(c, class_cases[i].class) != 0)
			fail_msg("case %zu: %s %s -> %s, expected %s", i,
				 class_cases[i].ip ? class_cases[i].ip : "(null)",
				 class_cases[i].name, c ? c : "(null)", class_cases[i].class);
		/* policy_class_enter picks the same class */
		struct class_slot *slot = NULL;
		const char *name = NULL;
		assert_int_equal(policy_class_enter(e.p, class_cases[i].ip ? &a : NULL,
						    str_cstr(class_cases[i].name), &slot, &name),
				 1);
		assert_non_null(slot);
		assert_string_equal(name, class_cases[i].class);
		assert_string_equal(class_slot_name(slot), class_cases[i].class);
		class_slot_release(slot);
	}
	struct class_stats st[4];
	assert_int_equal(policy_class_stats(e.p, st, 4), 4);
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(st[i].used, 0);
	assert_string_equal(st[0].name, "m-host");
	assert_int_equal(st[0].inbound, 1);
	assert_int_equal(st[3].sessions, 3);
	env_free(&e);

	/* no classes: no slot, always admitted */
	env_load(&e, "");
	struct class_slot *slot = (struct class_slot *)&e;
	const char *name = NULL;
	struct ipaddr a = ip_of("192.0.2.1");
	assert_int_equal(policy_class_enter(e.p, &a, str_cstr(""), &slot, &name), 1);
	assert_null(slot);
	assert_null(policy_class_match(e.p, &a, str_cstr("")));
	class_slot_release(NULL);
	env_free(&e);
}

static void test_class_slots(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "class \"s-any\" { hosts = [\"*\"]; sessions = 3; inbound = 3; }\n");
	struct ipaddr a = ip_of("198.51.100.7");
	struct class_slot *slots[3];
	const char *name;
	for (int i = 0; i < 3; i++) {
		name = NULL;
		assert_int_equal(policy_class_enter(e.p, &a, str_cstr(""), &slots[i], &name), 1);
		assert_string_equal(name, "s-any");
	}
	struct class_slot *extra = NULL;
	name = NULL;
	assert_int_equal(policy_class_enter(e.p, &a, str_cstr(""), &extra, &name), 0);
	assert_string_equal(name, "s-any"); /* to name in the 421 */
	struct class_stats st;
	assert_int_equal(policy_class_stats(e.p, &st, 1), 1);
	assert_int_equal(st.used, 3);
	assert_int_equal(st.peak, 3);
	assert_int_equal(st.entered, 3);
	assert_int_equal(st.refused, 1);
	/* one leaves, one more gets in */
	class_slot_release(slots[1]);
	policy_class_stats(e.p, &st, 1);
	assert_int_equal(st.used, 2);
	assert_int_equal(policy_class_enter(e.p, &a, str_cstr(""), &slots[1], &name), 1);
	assert_int_equal(policy_class_enter(e.p, &a, str_cstr(""), &extra, &name), 0);
	policy_class_stats(e.p, &st, 1);
	assert_int_equal(st.used, 3);
	assert_int_equal(st.peak, 3);
	assert_int_equal(st.entered, 4);
	assert_int_equal(st.refused, 2);
	for (int i = 0; i < 3; i++)
		class_slot_release(slots[i]);
	policy_class_stats(e.p, &st, 1);
	assert_int_equal(st.used, 0);
	env_free(&e);
}

/* A reload that keeps a class name keeps its counter; a slot taken under the old rule set
 * is given back to the same counter, even after the old rule set is gone. */
static void test_class_reload(void **state)
{
	(void)state;
	struct env e1, e2;
	env_load(&e1, "class \"r-keep\" { hosts = [\"*\"]; sessions = 3; inbound = 3; }\n");
	struct ipaddr a = ip_of("198.51.100.7");
	struct class_slot *s1, *s2, *s3;
	const char *name;
	assert_int_equal(policy_class_enter(e1.p, &a, str_cstr(""), &s1, &name), 1);
	assert_int_equal(policy_class_enter(e1.p, &a, str_cstr(""), &s2, &name), 1);

	/* the new rule set: the same name with other limits, and a new class before it */
	env_load(&e2, "class \"r-new\" { hosts = [\"192.0.2.0/24\"]; sessions = 1; inbound = 1; }\n"
		      "class \"r-keep\" { hosts = [\"*\"]; sessions = 5; inbound = 4; }\n");
	struct class_stats st[2];
	assert_int_equal(policy_class_stats(e2.p, st, 2), 2);
	assert_string_equal(st[0].name, "r-new");
	assert_int_equal(st[0].used, 0);
	assert_string_equal(st[1].name, "r-keep");
	assert_int_equal(st[1].used, 2);
	assert_int_equal(st[1].inbound, 4);
	assert_int_equal(st[1].entered, 2);
	/* the old rule set goes away while its sessions still hold slots */
	policy_unref(e1.p);
	e1.p = NULL;
	store_free(e1.s);
	class_slot_release(s1);
	policy_class_stats(e2.p, st, 2);
	assert_int_equal(st[1].used, 1);
	/* the new limit counts the old sessions: 1 old + 3 new = inbound 4 */
	struct class_slot *n[3];
	for (int i = 0; i < 3; i++)
		assert_int_equal(policy_class_enter(e2.p, &a, str_cstr(""), &n[i], &name), 1);
	assert_int_equal(policy_class_enter(e2.p, &a, str_cstr(""), &s3, &name), 0);
	class_slot_release(s2);
	policy_class_stats(e2.p, st, 2);
	assert_int_equal(st[1].used, 3);
	for (int i = 0; i < 3; i++)
		class_slot_release(n[i]);
	policy_class_stats(e2.p, st, 2);
	assert_int_equal(st[1].used, 0);

	/* a renamed class starts from zero; a failed load touches no live counter */
	struct env e3;
	struct class_slot *k;
	assert_int_equal(policy_class_enter(e2.p, &a, str_cstr(""), &k, &name), 1);
	env_load(&e3, "class \"r-renamed\" { hosts = [\"*\"]; sessions = 3; inbound = 3; }\n");
	policy_class_stats(e3.p, st, 1);
	assert_int_equal(st[0].used, 0);
	struct policy *bad = NULL;
	char err[512];
	assert_int_equal(load_text("class \"r-keep\" { hosts = [\"*\"]; sessions = 3; inbound = 3; }\n"
				   "limit \"x\" { stage = rcpt; key = nothing; rate = 1/1m; }\n",
				   &bad, err, sizeof(err)),
			 -EINVAL);
	policy_class_stats(e2.p, st, 2);
	assert_int_equal(st[1].used, 1);
	class_slot_release(k);
	env_free(&e3);
	env_free(&e2);
}

/* ---- tag, quarantine ----------------------------------------------------------------- */

static void test_tag_quarantine(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"tagit\" { stage = mail; key = sender_domain; rate = 1/1h;\n"
		     "  action = tag; }\n"
		     "limit \"quar\" { stage = rcpt; key = rcpt_domain; rate = 1/1h;\n"
		     "  action = quarantine; }\n"
		     "limit \"tag2\" { stage = rcpt; key = rcpt; rate = 1/1h; action = tag; }\n");
	assert_true(policy_needs(e.p)->message_actions);
	struct policy_msg m;
	memset(&m, 0, sizeof(m));
	struct tx mail = { .sender = "<s@Example.ORG>" };
	struct tx rcpt = { .sender = "<s@Example.ORG>", .rcpt = "<r@Example.NET>" };
	/* first message: within every limit */
	assert_int_equal(act(&e, &mail, POLICY_MAIL, &m, T0), POLICY_ACCEPT);
	assert_int_equal(act(&e, &rcpt, POLICY_RCPT, &m, T0), POLICY_ACCEPT);
	assert_int_equal(m.ntags, 0);
	assert_false(m.quarantine);
	policy_msg_end(e.p, &m, true, T0);

	/* second message: over all three; the message is accepted, and marked */
	struct run r;
	run(&e, &mail, POLICY_MAIL, &m, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_TAG);
	assert_string_equal(r.d.reply, "");
	assert_int_equal(m.ntags, 1);
	assert_string_equal(m.marks->tags[0], "rule=tagit; key=example.org");
	run(&e, &rcpt, POLICY_RCPT, &m, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_QUARANTINE);
	assert_string_equal(policy_rule_name(r.d.rule), "quar");
	assert_int_equal(r.d.nover, 2);
	assert_true(m.quarantine);
	assert_string_equal(m.marks->quarantine_reason, "sluice limit quar for example.net");
	assert_int_equal(m.ntags, 2);
	assert_string_equal(m.marks->tags[1], "rule=tag2; key=r@example.net");
	/* a second quarantining recipient keeps the first reason */
	struct tx rcpt2 = { .sender = "<s@Example.ORG>", .rcpt = "<q@example.net>" };
	assert_int_equal(act(&e, &rcpt2, POLICY_RCPT, &m, T0), POLICY_QUARANTINE);
	assert_string_equal(m.marks->quarantine_reason, "sluice limit quar for example.net");
	/* the end of the message clears the marks */
	policy_msg_end(e.p, &m, true, T0);
	assert_int_equal(m.ntags, 0);
	assert_false(m.quarantine);
	assert_string_equal(m.marks->quarantine_reason, "");

	/* PEEK and a NULL ledger decide the same, and mark nothing */
	run(&e, &mail, POLICY_MAIL, &m, STORE_PEEK, T0, &r);
	assert_int_equal(r.d.action, POLICY_TAG);
	assert_int_equal(m.ntags, 0);
	run(&e, &mail, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_TAG);

	/* one tag per rule and key, however often it is over */
	policy_msg_end(e.p, &m, true, T0);
	for (int i = 0; i < POLICY_MAX_TAGS + 3; i++)
		assert_int_equal(act(&e, &mail, POLICY_MAIL, &m, T0), POLICY_TAG);
	assert_int_equal(m.ntags, 1);
	policy_msg_clear(&m);
	env_free(&e);

	/* a recipient refused at RCPT is no part of the message: the rules it was over do
	 * not tag or quarantine what the other recipients get */
	env_load(&e, "limit \"q\" { stage = rcpt; key = rcpt_domain; rate = 1/1h;\n"
		     "  action = quarantine; }\n"
		     "limit \"t\" { stage = rcpt; key = rcpt_domain; rate = 1/1h; action = tag; }\n"
		     "limit \"rej\" { stage = rcpt; key = rcpt; rate = 1/1h; action = reject; }\n");
	memset(&m, 0, sizeof(m));
	struct tx a = { .sender = "", .rcpt = "<a@example.com>" };
	struct tx other = { .sender = "", .rcpt = "<o@example.net>" };
	assert_int_equal(act(&e, &a, POLICY_RCPT, &m, T0), POLICY_ACCEPT);
	policy_msg_end(e.p, &m, true, T0);
	run(&e, &a, POLICY_RCPT, &m, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_REJECT);
	assert_int_equal(r.d.nover, 3); /* all three reported for the log */
	assert_false(m.quarantine);
	assert_int_equal(m.ntags, 0);
	assert_int_equal(act(&e, &other, POLICY_RCPT, &m, T0), POLICY_ACCEPT);
	assert_false(m.quarantine);
	assert_int_equal(m.ntags, 0);
	/* an accepted recipient over them does */
	struct tx b = { .sender = "", .rcpt = "<b@example.com>" };
	assert_int_equal(act(&e, &b, POLICY_RCPT, &m, T0), POLICY_QUARANTINE);
	assert_true(m.quarantine);
	assert_int_equal(m.ntags, 1);
	assert_string_equal(m.marks->tags[0], "rule=t; key=example.com");
	policy_msg_clear(&m);
	env_free(&e);
}

/* A result array shorter than the stage's rules: the decision is still whole. */
/* The decision line of each rule over its limit, and the rules' counters. */
static void test_decision_lines_and_counters(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"t\" { stage = mail; key = sender_domain; rate = 1/1h; }\n"
		     "limit \"r\" { stage = mail; key = client_ip; rate = [\"5/1m\", \"1/1h\"]; "
		     "action = reject; }\n"
		     "limit \"w\" { stage = mail; key = sender; rate = 1/1h; action = warn; }\n");
	struct tx a = { .ip = "192.0.2.1", .helo = "h", .sender = "<a@example.com>" };
	struct run r;
	run(&e, &a, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.nover, 0);
	run(&e, &a, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_REJECT);
	assert_int_equal(r.d.nover, 3);
	struct policy_log_ctx ctx = {
		.client = str_cstr("192.0.2.1"),
		.helo = str_cstr("evil\" x=1 \x01"),
		.from = str_cstr("<a@example.com>"),
		.qid = str_cstr("Q 1"),
	};
	static const char *const expect[] = {
		"over rule=t action=tempfail key=\"example.com\" count=1 limit=1/1h stage=mail "
		"retry=3600s client=192.0.2.1 helo=\"evil\\\" x=1 \\x01\" from=<a@example.com> "
		"qid=\"Q 1\"",
		"decision rule=r action=reject key=\"192.0.2.1\" count=1 limit=1/1h stage=mail "
		"retry=3600s client=192.0.2.1 helo=\"evil\\\" x=1 \\x01\" from=<a@example.com> "
		"qid=\"Q 1\"",
		"decision rule=w action=warn key=\"a@example.com\" count=1 limit=1/1h stage=mail "
		"retry=3600s client=192.0.2.1 helo=\"evil\\\" x=1 \\x01\" from=<a@example.com> "
		"qid=\"Q 1\"",
	};
	static const enum log_level levels[] = { LOG_LEVEL_NOTICE, LOG_LEVEL_NOTICE,
						 LOG_LEVEL_WARNING };
	for (size_t i = 0; i < r.d.nover; i++) {
		char line[1024];
		enum log_level lv = policy_decision_line(&r.d, i, POLICY_MAIL, &ctx, line,
							 sizeof(line));
		assert_string_equal(line, expect[i]);
		assert_int_equal(lv, levels[i]);
		/* a small buffer cuts the line and still ends it */
		char tiny[20];
		policy_decision_line(&r.d, i, POLICY_MAIL, &ctx, tiny, sizeof(tiny));
		assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
	}
	/* without a context: the rule's part only */
	char bare[256];
	policy_decision_line(&r.d, 1, POLICY_MAIL, NULL, bare, sizeof(bare));
	assert_string_equal(bare, "decision rule=r action=reject key=\"192.0.2.1\" count=1 "
			    "limit=1/1h stage=mail retry=3600s");

	/* counters: two checks per rule, the second over; peeks do not count */
	run(&e, &a, POLICY_MAIL, NULL, STORE_PEEK, T0, &r);
	struct policy_rule_counters rc[4];
	assert_int_equal(policy_counters(e.p, rc, 4), 3);
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(rc[i].passed, 1);
		assert_int_equal(rc[i].over, 1);
		assert_int_equal(rc[i].stage, POLICY_MAIL);
	}
	assert_string_equal(rc[1].name, "r");
	assert_int_equal(rc[1].action, POLICY_REJECT);
	assert_int_equal(policy_counters(e.p, rc, 1), 1);
	env_free(&e);
}

static void test_results_bounded(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"a\" { stage = mail; key = sender; rate = 10/1h; }\n"
		     "limit \"b\" { stage = mail; key = sender_domain; rate = 1/1h; action = reject; }\n");
	struct tx x = { .sender = "<a@example.com>" };
	struct policy_rule_result one[1];
	struct policy_decision d;
	memset(&d, 0, sizeof(d));
	d.results = one;
	d.max_results = 1;
	struct policy_txn t = txn_of(&x);
	assert_int_equal(policy_check(e.p, &t, POLICY_MAIL, NULL, STORE_CHECK, T0, &d), 0);
	assert_int_equal(d.nresults, 1);
	assert_int_equal(d.action, POLICY_ACCEPT);
	assert_int_equal(policy_check(e.p, &t, POLICY_MAIL, NULL, STORE_CHECK, T0, &d), 0);
	assert_int_equal(d.action, POLICY_REJECT);
	assert_string_equal(policy_rule_name(d.rule), "b");
	/* no results wanted */
	d.results = NULL;
	d.max_results = 0;
	assert_int_equal(policy_check(e.p, &t, POLICY_MAIL, NULL, STORE_CHECK, T0, &d), 0);
	assert_int_equal(d.action, POLICY_REJECT);
	assert_int_equal(d.nresults, 0);
	env_free(&e);
}

/* Decisions made on a thread that then ends leave nothing behind (the per-thread scratch
 * space is freed with the thread: LeakSanitizer checks it in the sanitizer build). */
static void *decide_on_thread(void *arg)
{
	struct env *e = arg;
	struct tx x = { .ip = "192.0.2.1" };
	struct policy_decision d;
	memset(&d, 0, sizeof(d));
	struct policy_txn t = txn_of(&x);
	policy_check(e->p, &t, POLICY_CONNECT, NULL, STORE_CHECK, T0, &d);
	return (void *)(uintptr_t)d.action;
}

static void test_worker_threads(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"c\" { stage = connect; key = client_ip; rate = 2/1h; }\n");
	enum policy_action want[] = { POLICY_ACCEPT, POLICY_ACCEPT, POLICY_TEMPFAIL };
	for (size_t i = 0; i < ARRAY_SIZE(want); i++) {
		pthread_t th;
		void *ret;
		assert_int_equal(pthread_create(&th, NULL, decide_on_thread, &e), 0);
		assert_int_equal(pthread_join(th, &ret), 0);
		assert_int_equal((uintptr_t)ret, want[i]);
	}
	env_free(&e);
}


/* ---- chains of keys, escaped compound keys, scopes ------------------------------------ */

/* key = "a|b|c": the first alternative with a value gives the key, named by it. */
static void test_key_chain(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"chain\" { stage = mail; key = \"sasl_user|sender|client_ip/24\";\n"
		     "  rate = 1/1h; }\n");
	const struct policy_rule *r = policy_rule_at(e.p, 0);
	static const struct {
		struct tx tx;
		const char *key, *via;
	} cases[] = {
		{ { .ip = "192.0.2.7", .sasl = "bob", .sender = "<a@Example.COM>" }, "sasl_user:bob",
		  "sasl_user" },
		{ { .ip = "192.0.2.7", .sender = "<a@Example.COM>" }, "sender:a@example.com",
		  "sender" },
		{ { .ip = "192.0.2.7", .sender = NULL }, "client_ip/24/64:192.0.2.0/24",
		  "client_ip/24/64" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct run x;
		run(&e, &cases[i].tx, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
		assert_int_equal(x.res[0].state, POLICY_RULE_PASS);
		assert_string_equal(x.res[0].key, cases[i].key);
		assert_string_equal(x.res[0].via, cases[i].via);
		/* each alternative is its own key: the second event of each is over */
		run(&e, &cases[i].tx, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
		assert_int_equal(x.res[0].state, POLICY_RULE_OVER);
	}
	struct tx none = { .ip = "", .sender = NULL };
	struct run x;
	run(&e, &none, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
	assert_int_equal(x.res[0].state, POLICY_RULE_NO_VALUE);
	/* a bounce is counted by what follows the sender, not as "sender:<>" */
	struct tx bounce = { .ip = "192.0.2.7", .sender = "<>" };
	run(&e, &bounce, POLICY_MAIL, NULL, STORE_PEEK, T0, &x);
	assert_string_equal(x.res[0].key, "client_ip/24/64:192.0.2.0/24");
	struct env e2;
	env_load(&e2, "limit \"last\" { stage = mail; key = \"sasl_user|sender\"; rate = 1/1h; }\n");
	run(&e2, &bounce, POLICY_MAIL, NULL, STORE_PEEK, T0, &x);
	assert_string_equal(x.res[0].key, "sender:<>"); /* unless it is the last */
	env_free(&e2);
	/* an operator's key names its alternative (any case) and is normalized by it */
	char out[SELECTOR_MAX_KEY + 1];
	int n = policy_rule_normalize_key(r, str_cstr("SENDER:a@EXAMPLE.com"), out);
	assert_int_equal(n, (int)strlen("sender:a@example.com"));
	assert_memory_equal(out, "sender:a@example.com", (size_t)n);
	n = policy_rule_normalize_key(r, str_cstr("client_ip/24/64:192.0.2.99"), out);
	assert_memory_equal(out, "client_ip/24/64:192.0.2.0/24", (size_t)n);
	assert_int_equal(policy_rule_normalize_key(r, str_cstr("helo:x"), out), -1);
	assert_int_equal(policy_rule_normalize_key(r, str_cstr("bob"), out), -1);
	env_free(&e);
}

/* A '+' or '%' inside a value of a compound key is escaped: no two pairs share a key. */
static void test_compound_escaped(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"pair\" { stage = mail; key = \"sasl_user+helo\"; rate = 1/1h; }\n");
	struct tx a = { .sasl = "a+b", .helo = "c", .sender = "" };
	struct tx b = { .sasl = "a", .helo = "b+c", .sender = "" };
	struct tx c = { .sasl = "50%", .helo = "x", .sender = "" };
	struct run x;
	run(&e, &a, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
	assert_string_equal(x.res[0].key, "a%2Bb+c");
	run(&e, &b, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
	assert_string_equal(x.res[0].key, "a+b%2Bc");
	assert_int_equal(x.res[0].state, POLICY_RULE_PASS); /* not a's key */
	run(&e, &c, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
	assert_string_equal(x.res[0].key, "50%25+x");
	/* operators write keys escaped; each part is normalized, then escaped again */
	const struct policy_rule *r = policy_rule_at(e.p, 0);
	char out[SELECTOR_MAX_KEY + 1];
	int n = policy_rule_normalize_key(r, str_cstr("a%2bb+C.Example"), out);
	assert_int_equal(n, (int)strlen("a%2Bb+c.example"));
	assert_memory_equal(out, "a%2Bb+c.example", (size_t)n);
	/* an unescaped '+' makes three parts of a two-part key */
	assert_int_equal(policy_rule_normalize_key(r, str_cstr("a+b+c"), out), -1);
	/* a value of pluses is cut where its escaped form reaches 256 bytes */
	char pluses[300];
	memset(pluses, '+', 299);
	pluses[299] = '\0';
	struct tx d = { .sasl = pluses, .helo = "h", .sender = "" };
	run(&e, &d, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
	assert_int_equal(x.res[0].state, POLICY_RULE_PASS);
	assert_int_equal(strlen(x.res[0].key), 85 * 3 + 2);
	env_free(&e);
}

/* only {} applies a rule where every entry matches; except still excepts. */
static void test_only_scope(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"campus\" { stage = mail; key = sender; rate = 1/1h;\n"
		     "  only { client_ip = [\"192.0.2.0/24\"]; sender_domain = [\"*.example.edu\"]; }\n"
		     "  except { sender = [\"boss@cs.example.edu\"]; } }\n");
	struct tx in = { .ip = "192.0.2.9", .sender = "<u@cs.example.edu>" };
	struct tx out_ip = { .ip = "198.51.100.1", .sender = "<u@cs.example.edu>" };
	struct tx out_dom = { .ip = "192.0.2.9", .sender = "<u@example.com>" };
	struct tx boss = { .ip = "192.0.2.9", .sender = "<boss@cs.example.edu>" };
	struct run x;
	assert_int_equal(act(&e, &in, POLICY_MAIL, NULL, T0), POLICY_ACCEPT);
	assert_int_equal(act(&e, &in, POLICY_MAIL, NULL, T0), POLICY_TEMPFAIL);
	run(&e, &out_ip, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
	assert_int_equal(x.res[0].state, POLICY_RULE_OUT_OF_SCOPE);
	assert_string_equal(x.res[0].why, "only client_ip: no match");
	run(&e, &out_dom, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
	assert_int_equal(x.res[0].state, POLICY_RULE_OUT_OF_SCOPE);
	assert_string_equal(x.res[0].why, "only sender_domain: no match");
	run(&e, &boss, POLICY_MAIL, NULL, STORE_CHECK, T0, &x);
	assert_int_equal(x.res[0].state, POLICY_RULE_EXCEPT);
	env_free(&e);
}

/* ---- blocks, distinct values, sessions, delays ---------------------------------------- */

/* block: a refused key stays refused for the block, then its windows decide again. */
static void test_block(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"box\" { stage = mail; key = sender; rate = 2/1m; block = 1h;\n"
		     "  action = reject; }\n");
	struct tx x = { .sender = "<spam@example.com>" };
	struct tx other = { .sender = "<ok@example.com>" };
	assert_int_equal(act(&e, &x, POLICY_MAIL, NULL, T0), POLICY_ACCEPT);
	assert_int_equal(act(&e, &x, POLICY_MAIL, NULL, T0), POLICY_ACCEPT);
	struct run r;
	run(&e, &x, POLICY_MAIL, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_REJECT);
	assert_false(r.res[0].blocked); /* this refusal starts the block */
	assert_int_equal(r.d.retry_s, 3600); /* the refusal that starts a block says so */
	/* two minutes on, the window has room again, but the block holds */
	run(&e, &x, POLICY_MAIL, NULL, STORE_PEEK, T0 + 120 * SEC, &r);
	assert_int_equal(r.res[0].state, POLICY_RULE_OVER);
	assert_true(r.res[0].blocked);
	assert_int_equal(r.res[0].retry_ns, 3600 * SEC - 120 * SEC);
	/* attempts during the block do not extend it */
	assert_int_equal(act(&e, &x, POLICY_MAIL, NULL, T0 + 1800 * SEC), POLICY_REJECT);
	assert_int_equal(act(&e, &x, POLICY_MAIL, NULL, T0 + 3600 * SEC - 1), POLICY_REJECT);
	assert_int_equal(act(&e, &x, POLICY_MAIL, NULL, T0 + 3600 * SEC), POLICY_ACCEPT);
	/* other keys never saw it */
	assert_int_equal(act(&e, &other, POLICY_MAIL, NULL, T0 + 60 * SEC), POLICY_ACCEPT);
	/* limits reset ends a block */
	assert_int_equal(act(&e, &other, POLICY_MAIL, NULL, T0 + 60 * SEC), POLICY_ACCEPT);
	assert_int_equal(act(&e, &other, POLICY_MAIL, NULL, T0 + 60 * SEC), POLICY_REJECT);
	const struct policy_rule *rule = policy_rule_at(e.p, 0);
	struct rate_limits lim;
	bool ov;
	assert_int_equal(policy_rule_limits(rule, str_cstr("ok@example.com"), &lim, &ov), 1);
	uint64_t h = policy_rule_key_hash(e.p, rule, str_cstr("ok@example.com"));
	assert_int_equal(e.s->ops->reset(e.s->ctx, h, &lim), 1);
	assert_int_equal(act(&e, &other, POLICY_MAIL, NULL, T0 + 61 * SEC), POLICY_ACCEPT);
	env_free(&e);
}

/* count = distinct: at most N new values per key, a known value passes again. */
static void test_distinct(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"fan-out\" { stage = rcpt; key = sasl_user; count = distinct;\n"
		     "  of = rcpt; rate = 2/1h; }\n");
	struct tx a = { .sasl = "alice", .sender = "", .rcpt = "<one@example.net>" };
	struct tx b = { .sasl = "alice", .sender = "", .rcpt = "<two@example.net>" };
	struct tx c = { .sasl = "alice", .sender = "", .rcpt = "<three@example.net>" };
	struct tx a2 = { .sasl = "alice", .sender = "", .rcpt = "<ONE@Example.NET>" };
	struct policy_msg m;
	memset(&m, 0, sizeof(m));
	struct run r;
	run(&e, &a, POLICY_RCPT, &m, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_false(r.res[0].known);
	assert_int_equal(act(&e, &b, POLICY_RCPT, &m, T0), POLICY_ACCEPT);
	run(&e, &c, POLICY_RCPT, &m, STORE_CHECK, T0 + SEC, &r);
	assert_int_equal(r.d.action, POLICY_TEMPFAIL);
	assert_false(r.res[0].known);
	/* a known recipient passes whatever the count, and costs nothing ("ONE" is another
	 * local part: a new value) */
	run(&e, &a, POLICY_RCPT, &m, STORE_CHECK, T0 + 2 * SEC, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_true(r.res[0].known);
	assert_int_equal(r.res[0].used[0], 2);
	assert_int_equal(act(&e, &a2, POLICY_RCPT, &m, T0 + 2 * SEC), POLICY_TEMPFAIL);
	/* the message is refused later: distinct values stay counted (no refund) */
	policy_msg_end(e.p, &m, false, T0 + 3 * SEC);
	assert_int_equal(used(&e, &c, POLICY_RCPT, "fan-out", T0 + 3 * SEC), 2);
	/* a value is remembered an hour after it was last seen: "one" at T0+2s */
	run(&e, &a, POLICY_RCPT, NULL, STORE_PEEK, T0 + 3600 * SEC + SEC, &r);
	assert_true(r.res[0].known);
	run(&e, &b, POLICY_RCPT, NULL, STORE_PEEK, T0 + 3600 * SEC + SEC, &r);
	assert_false(r.res[0].known);
	policy_msg_clear(&m);
	env_free(&e);
}

/* count = sessions: slots per key held until the session ends; the policy service (no
 * sessions tracked) does not count them. */
static void test_sessions(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"per-ip\" { stage = connect; key = client_ip; count = sessions;\n"
		     "  max = 2; }\n"
		     "limit \"per-user\" { stage = mail; key = sasl_user; count = sessions; max = 1;\n"
		     "  action = reject; }\n"
		     "limit \"mail-rate\" { stage = mail; key = sender; rate = 1/1h; }\n");
	struct tx x = { .ip = "192.0.2.9" };
	struct tx y = { .ip = "198.51.100.1" };
	struct policy_msg s[4];
	memset(s, 0, sizeof(s));
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(policy_msg_track_sessions(&s[i]), 0);
	struct run r;
	run(&e, &x, POLICY_CONNECT, &s[0], STORE_CHECK, T0, &r);
	assert_int_equal(r.res[0].state, POLICY_RULE_PASS);
	assert_int_equal(r.res[0].sessions, 1);
	assert_int_equal(act(&e, &x, POLICY_CONNECT, &s[1], T0), POLICY_ACCEPT);
	run(&e, &x, POLICY_CONNECT, &s[2], STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_TEMPFAIL);
	assert_int_equal(r.d.nover, 1);
	assert_string_equal(r.d.over[0].limit, "2");
	assert_int_equal(act(&e, &y, POLICY_CONNECT, &s[3], T0), POLICY_ACCEPT);
	/* a session that holds the slot passes again (a second CONNECT stage of it) */
	run(&e, &x, POLICY_CONNECT, &s[0], STORE_CHECK, T0, &r);
	assert_int_equal(r.res[0].state, POLICY_RULE_HELD);
	/* the policy service: not counted there */
	struct policy_msg ps;
	memset(&ps, 0, sizeof(ps));
	run(&e, &x, POLICY_CONNECT, &ps, STORE_CHECK, T0, &r);
	assert_int_equal(r.res[0].state, POLICY_RULE_NOT_HERE);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	/* a session ends: its slot is free */
	policy_sessions_end(&s[0]);
	run(&e, &x, POLICY_CONNECT, &s[2], STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	/* at mail: a slot taken by an event another rule refused goes back at once */
	struct tx m1 = { .ip = "192.0.2.9", .sasl = "carol", .sender = "<c@example.com>" };
	assert_int_equal(act(&e, &m1, POLICY_MAIL, &s[1], T0), POLICY_ACCEPT);
	policy_sessions_end(&s[1]); /* carol's session ends */
	run(&e, &m1, POLICY_MAIL, &s[2], STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_TEMPFAIL); /* the sender's rate */
	assert_int_equal(res_of(&r, "per-user")->state, POLICY_RULE_PASS);
	run(&e, &m1, POLICY_MAIL, NULL, STORE_PEEK, T0, &r);
	assert_int_equal(res_of(&r, "per-user")->sessions, 0); /* given back */
	/* refused by the sessions rule: the rate rule is not charged */
	struct tx m2 = { .ip = "192.0.2.9", .sasl = "dave", .sender = "<d@example.com>" };
	assert_int_equal(act(&e, &m2, POLICY_MAIL, &s[3], T0), POLICY_ACCEPT);
	struct tx m3 = { .ip = "192.0.2.9", .sasl = "dave", .sender = "<e@example.com>" };
	run(&e, &m3, POLICY_MAIL, &s[2], STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_REJECT);
	assert_string_equal(policy_rule_name(r.d.rule), "per-user");
	assert_int_equal(used(&e, &m3, POLICY_MAIL, "mail-rate", T0), 0);
	for (size_t i = 0; i < 4; i++)
		policy_msg_clear(&s[i]);
	policy_msg_clear(&ps);
	/* every slot went back */
	run(&e, &x, POLICY_CONNECT, NULL, STORE_PEEK, T0, &r);
	assert_int_equal(r.res[0].sessions, 0);
	env_free(&e);
}

/* action = delay: the event passes, and the decision says how long to wait. */
static void test_delay(void **state)
{
	(void)state;
	struct env e;
	env_load(&e, "limit \"slow\" { stage = rcpt; key = client_ip; count = recipients;\n"
		     "  rate = 1/1h; action = delay; delay = 1500ms; }\n"
		     "limit \"hard\" { stage = rcpt; key = client_ip; count = recipients;\n"
		     "  rate = 2/1h; }\n");
	struct tx x = { .ip = "192.0.2.9", .sender = "", .rcpt = "<a@example.net>" };
	struct run r;
	run(&e, &x, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_int_equal(r.d.delay_ms, 0);
	run(&e, &x, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_DELAY);
	assert_int_equal(r.d.delay_ms, 1500);
	run(&e, &x, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
	assert_int_equal(r.d.action, POLICY_TEMPFAIL);
	assert_int_equal(r.d.delay_ms, 1500); /* kept: the caller decides */
	env_free(&e);
}

static const struct {
	const char *text, *err;
} new_key_errors[] = {
	{ "limit \"a\" {\n  stage = connect;\n  key = client_ip;\n  count = sessions;\n}\n",
	  "t.conf:1: limit \"a\": missing 'max' (sessions at once per key, e.g. max = 3)" },
	{ "limit \"a\" {\n  stage = connect;\n  key = client_ip;\n  count = sessions;\n"
	  "  max = 3;\n  rate = 1/1m;\n}\n",
	  "t.conf:6: limit \"a\".rate: a sessions rule counts sessions at once: it takes max = N, "
	  "not rate" },
	{ "limit \"a\" {\n  stage = connect;\n  key = client_ip;\n  rate = 1/1m;\n  max = 3;\n}\n",
	  "t.conf:5: limit \"a\".max: max = N goes with count = \"sessions\" (rates use rate = "
	  "[...])" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = sasl_user;\n  count = distinct;\n"
	  "  rate = 1/1m;\n}\n",
	  "t.conf:1: limit \"a\": missing 'of' (the selector whose distinct values are counted, "
	  "e.g. of = \"rcpt\")" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  count = distinct;\n  of = rcpt;\n"
	  "  rate = 1/1m;\n}\n",
	  "t.conf:5: limit \"a\".of: rcpt is part of the key: each key would have one value" },
	{ "limit \"a\" {\n  stage = mail;\n  key = sasl_user;\n  count = distinct;\n  of = rcpt;\n"
	  "  rate = 1/1m;\n}\n",
	  "t.conf:5: limit \"a\".of: rcpt has no value at stage mail (it needs stage rcpt)" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 1/1m;\n  of = helo;\n}\n",
	  "t.conf:5: limit \"a\".of: of = SELECTOR goes with count = \"distinct\"" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 1/1m;\n  action = delay;\n}\n",
	  "t.conf:5: limit \"a\".action: action = \"delay\" needs delay = DURATION (e.g. 10s)" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 1/1m;\n  delay = 1s;\n}\n",
	  "t.conf:5: limit \"a\".delay: delay = DURATION goes with action = \"delay\"" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 1/1m;\n  action = delay;\n"
	  "  delay = 1s;\n  block = 1h;\n}\n",
	  "t.conf:7: limit \"a\".block: a delay rule refuses nothing, so it blocks nothing: use "
	  "action = \"tempfail\" with block" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 1/1m;\n  block = 500ms;\n}\n",
	  "t.conf:5: limit \"a\".block: \"500ms\" is out of range [1s, 30d]" },
	{ "limit \"a\" {\n  stage = connect;\n  key = client_ip;\n  count = sessions;\n"
	  "  max = 2;\n  block = 1h;\n}\n",
	  "t.conf:6: limit \"a\".block: a sessions rule counts sessions at once: it takes max = "
	  "N, not block" },
	{ "limit \"a\" {\n  stage = mail;\n  key = \"sasl_user||sender\";\n  rate = 1/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: empty alternative in 'sasl_user||sender'" },
	{ "limit \"a\" {\n  stage = mail;\n  key = \"sender|sasl_user|sender\";\n  rate = 1/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: alternative 'sender' given twice" },
	{ "limit \"a\" {\n  stage = connect;\n  key = \"client_ip|sender\";\n  rate = 1/1m;\n}\n",
	  "t.conf:3: limit \"a\".key: sender has no value at stage connect (it needs stage mail "
	  "or later)" },
	{ "limit \"a\" {\n  stage = rcpt;\n  key = rcpt;\n  rate = 1/1m;\n  only = yes;\n}\n",
	  "t.conf:5: limit \"a\".only: expected only { SELECTOR = [values...]; }" },
	{ "limit \"a\" {\n  stage = connect;\n  key = client_ip;\n  rate = 1/1m;\n"
	  "  only {\n    rcpt = [\"x@y\"];\n  }\n}\n",
	  "t.conf:6: limit \"a\".only.rcpt: rcpt has no value at stage connect (it needs stage "
	  "rcpt)" },
};

/* One store round trip asks every sessions rule of a stage: at most 4 of them. */
static void test_sessions_rules_per_stage(void **state)
{
	(void)state;
	char text[2048] = "", err[512] = "";
	for (int i = 0; i < 5; i++) {
		char one[200];
		snprintf(one, sizeof(one), "limit \"s%d\" { stage = connect; key = client_ip; "
			 "count = sessions; max = %d; }\n", i, i + 1);
		strcat(text, one);
	}
	struct policy *p = NULL;
	assert_int_equal(load_text(text, &p, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:5: limit \"s4\": more than 4 sessions rules at stage "
			    "connect");
	*strstr(text, "limit \"s4\"") = '\0'; /* four */
	assert_int_equal(load_text(text, &p, err, sizeof(err)), 0);
	policy_unref(p);
}

static void test_new_key_errors(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(new_key_errors); i++) {
		char err[1024] = "";
		struct policy *p = NULL;
		int rc = load_text(new_key_errors[i].text, &p, err, sizeof(err));
		if (rc != -EINVAL || strcmp(err, new_key_errors[i].err) != 0)
			fail_msg("case %zu: rc %d\n got: %s\nwant: %s", i, rc, err,
				 new_key_errors[i].err);
		assert_null(p);
	}
}

/* Overrides files reloaded back to back while threads decide: each reload retires the
 * table that workers may be reading, and reloads come microseconds apart, so a table
 * freed under a reader is a use after free that ASan reports (the sanitizer build); the
 * limits read must always be those of a whole table (the other build). */
#define STRESS_DECIDERS 3
#define STRESS_RELOAD_NS (1200 * 1000000ULL)

struct reload_stress {
	struct env *e;
	_Atomic bool stop;
	_Atomic unsigned long decisions, bad;
};

static void *reload_stress_decide(void *arg)
{
	struct reload_stress *rs = arg;
	static const char *const rcpts[] = { "<u@k0.example>", "<u@k1.example>",
					     "<u@k9.example>", "<u@zero.example>",
					     "<u@other.example>" };
	unsigned long n = 0;
	while (!rs->stop) {
		struct tx x = { .sender = "", .rcpt = rcpts[n % ARRAY_SIZE(rcpts)] };
		struct policy_rule_result res[1];
		struct policy_decision d;
		memset(&d, 0, sizeof(d));
		d.results = res;
		d.max_results = 1;
		struct policy_txn t = txn_of(&x);
		policy_check(rs->e->p, &t, POLICY_RCPT, NULL, STORE_CHECK, T0, &d);
		/* every table's windows are "C/1m, C/1h" with C in [100, 196]; else the
		 * rule's own 1000000/1m */
		const struct rate_limits *l = &res[0].limits;
		if (d.nresults != 1)
			rs->bad++;
		else if (res[0].state == POLICY_RULE_UNLIMITED)
			rs->bad += !res[0].overridden;
		else if (res[0].overridden)
			rs->bad += l->n != 2 || l->w[0].count < 100 || l->w[0].count > 196 ||
				   l->w[1].count != l->w[0].count;
		else
			rs->bad += l->n != 1 || l->w[0].count != 1000000;
		n++;
	}
	rs->decisions += n;
	return NULL;
}

static void test_overrides_reload_stress(void **state)
{
	(void)state;
	struct tmpdir td;
	tmp_make(&td, "stress.limits");
	write_file(td.file, "k0.example 100/1m, 100/1h\n", 1700000000);
	char text[512];
	snprintf(text, sizeof(text),
		 "limit \"dom\" { stage = rcpt; key = rcpt_domain; rate = 1000000/1m;\n"
		 "  overrides = \"%s\"; }\n",
		 td.file);
	struct env e;
	env_load(&e, text);
	struct reload_stress rs = { .e = &e };
	pthread_t th[STRESS_DECIDERS];
	for (size_t i = 0; i < STRESS_DECIDERS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, reload_stress_decide, &rs), 0);

	struct buf err;
	buf_init(&err, 4096);
	unsigned long reloads = 0;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	uint64_t end = (uint64_t)now.tv_sec * SEC + (uint64_t)now.tv_nsec + STRESS_RELOAD_NS;
	for (unsigned i = 1;; i++) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((uint64_t)now.tv_sec * SEC + (uint64_t)now.tv_nsec >= end)
			break;
		/* 2 to 41 keys: the size changes at every write (and so does the mtime) */
		char file[4096];
		size_t len = 0;
		unsigned c = 100 + i % 97;
		for (unsigned k = 0; k < 2 + i % 40; k++)
			len += (size_t)snprintf(file + len, sizeof(file) - len,
						"k%u.example %u/1m, %u/1h\n", k, c, c);
		if (i % 2)
			snprintf(file + len, sizeof(file) - len, "zero.example 0\n");
		write_file(td.file, file, 1700000000 + (time_t)i);
		assert_int_equal(policy_reload_overrides(e.p, &err), 1);
		assert_int_equal(err.len, 0);
		reloads++;
	}
	rs.stop = true;
	for (size_t i = 0; i < STRESS_DECIDERS; i++)
		assert_int_equal(pthread_join(th[i], NULL), 0);
	/* nothing changed: nothing reloaded, and the last retired tables are freed */
	assert_int_equal(policy_reload_overrides(e.p, &err), 0);
	print_message("overrides reload stress: %lu reloads, %lu decisions by %d threads, "
		      "%lu bad\n", reloads, (unsigned long)rs.decisions, STRESS_DECIDERS,
		      (unsigned long)rs.bad);
	assert_int_equal(rs.bad, 0);
	assert_true(reloads > 0);
	assert_true(rs.decisions > 0);
	buf_done(&err);
	env_free(&e);
	tmp_remove(&td);
}

/* ---- run-time limits (sluice limits set): precedence over the overrides file and the rate */

/* A run-time limit in e's store for (rule, key). */
static void runtime_set(struct env *e, const char *rule, const char *key, unsigned nwin,
			uint64_t count, uint64_t until)
{
	struct store_ov_entry x = { .until_ns = until, .rule = str_cstr(rule),
				    .key = str_cstr(key) };
	x.key_hash = store_key_hash(e->s, x.rule, x.key);
	x.limits.n = nwin;
	for (unsigned i = 0; i < nwin; i++)
		x.limits.w[i] = (struct rate_window){ count, (i + 1) * 3600 * SEC, count };
	assert_int_equal(store_ov_put(e->s->ov, &x, T0), 0);
}

static void test_runtime_limits(void **state)
{
	(void)state;
	struct tmpdir td;
	tmp_make(&td, "rt.limits");
	write_file(td.file, "file.example 3/1m\nfree.example 0\n", 1700000000);
	char text[512];
	snprintf(text, sizeof(text),
		 "limit \"dom\" { stage = rcpt; key = rcpt_domain; rate = 1/1m;\n"
		 "  overrides = \"%s\"; }\n", td.file);
	struct env e;
	env_load(&e, text);
	struct run r;
	struct tx file = { .sender = "", .rcpt = "<u@file.example>" };
	struct tx free_ = { .sender = "", .rcpt = "<u@free.example>" };
	struct tx plain = { .sender = "", .rcpt = "<u@plain.example>" };

	/* no run-time limit: the file, then the rate */
	run(&e, &file, POLICY_RCPT, NULL, STORE_PEEK, T0, &r);
	assert_true(r.res[0].overridden && !r.res[0].runtime);
	assert_int_equal(r.res[0].limits.w[0].count, 3);

	/* a run-time limit beats the file's line */
	runtime_set(&e, "dom", "file.example", 1, 2, 0);
	for (int i = 0; i < 2; i++) {
		run(&e, &file, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
		assert_int_equal(r.d.action, POLICY_ACCEPT);
		assert_true(r.res[0].runtime && !r.res[0].overridden);
		assert_int_equal(r.res[0].runtime_until, 0);
		assert_int_equal(r.res[0].limits.w[0].count, 2);
	}
	assert_int_equal(act(&e, &file, POLICY_RCPT, NULL, T0), POLICY_TEMPFAIL);

	/* ... and beats a 0 in the file; a run-time 0 beats the rate: unlimited */
	runtime_set(&e, "dom", "free.example", 1, 1, 0);
	assert_int_equal(act(&e, &free_, POLICY_RCPT, NULL, T0), POLICY_ACCEPT);
	assert_int_equal(act(&e, &free_, POLICY_RCPT, NULL, T0), POLICY_TEMPFAIL);
	runtime_set(&e, "dom", "plain.example", 0, 0, T0 + 60 * SEC);
	for (int i = 0; i < 5; i++) {
		run(&e, &plain, POLICY_RCPT, NULL, STORE_CHECK, T0, &r);
		assert_int_equal(r.d.action, POLICY_ACCEPT);
		assert_int_equal(r.res[0].state, POLICY_RULE_UNLIMITED);
		assert_true(r.res[0].runtime);
		assert_true(r.res[0].runtime_until == T0 + 60 * SEC);
		assert_false(r.res[0].charged);
	}
	/* at its until it ends: the rate again (1/1m, nothing charged while unlimited) */
	run(&e, &plain, POLICY_RCPT, NULL, STORE_CHECK, T0 + 60 * SEC, &r);
	assert_int_equal(r.d.action, POLICY_ACCEPT);
	assert_false(r.res[0].runtime);
	assert_int_equal(r.res[0].limits.w[0].count, 1);
	assert_int_equal(act(&e, &plain, POLICY_RCPT, NULL, T0 + 60 * SEC), POLICY_TEMPFAIL);

	/* unset: the file applies again */
	assert_int_equal(store_ov_del(e.s->ov, store_key_hash(e.s, str_cstr("dom"),
					str_cstr("file.example")), T0), 1);
	run(&e, &file, POLICY_RCPT, NULL, STORE_PEEK, T0, &r);
	assert_true(r.res[0].overridden && !r.res[0].runtime);
	assert_int_equal(r.res[0].limits.w[0].count, 3);
	/* another rule's run-time limit on the same key text is not this rule's */
	runtime_set(&e, "other", "plain.example", 1, 100, 0);
	run(&e, &plain, POLICY_RCPT, NULL, STORE_PEEK, T0 + 61 * SEC, &r);
	assert_false(r.res[0].runtime);
	env_free(&e);
	tmp_remove(&td);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_selectors),
		cmocka_unit_test(test_selector_keys_share_budget),
		cmocka_unit_test(test_negotiation),
		cmocka_unit_test(test_config_errors),
		cmocka_unit_test(test_gcra),
		cmocka_unit_test(test_reply_template),
		cmocka_unit_test(test_strictest_wins),
		cmocka_unit_test(test_action_order),
		cmocka_unit_test(test_count_rejected),
		cmocka_unit_test(test_refunds),
		cmocka_unit_test(test_refund_skips_count_rejected),
		cmocka_unit_test(test_except),
		cmocka_unit_test(test_overrides),
		cmocka_unit_test(test_overrides_compound),
		cmocka_unit_test(test_class_match),
		cmocka_unit_test(test_class_slots),
		cmocka_unit_test(test_class_reload),
		cmocka_unit_test(test_tag_quarantine),
		cmocka_unit_test(test_results_bounded),
		cmocka_unit_test(test_decision_lines_and_counters),
		cmocka_unit_test(test_worker_threads),
		cmocka_unit_test(test_overrides_reload_stress),
		cmocka_unit_test(test_key_chain),
		cmocka_unit_test(test_compound_escaped),
		cmocka_unit_test(test_only_scope),
		cmocka_unit_test(test_block),
		cmocka_unit_test(test_distinct),
		cmocka_unit_test(test_sessions),
		cmocka_unit_test(test_delay),
		cmocka_unit_test(test_new_key_errors),
		cmocka_unit_test(test_sessions_rules_per_stage),
		cmocka_unit_test(test_runtime_limits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
