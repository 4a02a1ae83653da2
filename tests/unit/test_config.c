/*
 * test_config -- sluiced's configuration (src/conf, src/daemon/config.c): the errors of
 * the blocks read from tables name file, line and key as before the tables, the checks
 * across keys still run, and config_load_client() reads what the sluice command needs.
 *
 * Table-driven: a configuration and the exact error config_load() gives.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "util.h"

static char dir[] = "/tmp/sluice-config-XXXXXX";

/* Writes text to DIR/t.conf (mode 0600) and loads it; 0 with *ret, or <0 with err. */
static int load_text(const char *text, bool client, struct sluice_config **ret, char *err,
		     size_t el)
{
	char path[300];
	snprintf(path, sizeof(path), "%s/t.conf", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(chmod(path, 0600), 0);
	return client ? config_load_client(path, ret, err, el) : config_load(path, ret, err, el);
}

#define M "milter { listen = \"unix:m.sock\"; }\n"

static const struct {
	const char *text;
	const char *err; /* after "DIR/" */
} bad[] = {
	{ "milter { }\n", "t.conf:1: milter: listen is required" },
	{ "milter { listen = \"tcp:1\"; }\n",
	  "t.conf:1: milter.listen: \"tcp:1\": expected unix:/path, inet:host:port or "
	  "inet6:[addr]:port" },
	{ M "workers = 300;\n", "t.conf:2: workers: \"300\" is out of range [0, 256]" },
	{ M "workers = 1;\nworkers = 2;\n", "t.conf:3: workers: given twice" },
	{ M "log { target = \"file\"; }\n", "t.conf:2: log.target: expected stderr or syslog" },
	{ M "log { facility = \"nope\"; }\n",
	  "t.conf:2: log.facility: unknown syslog facility \"nope\"" },
	{ M "log { level = \"loud\"; }\n",
	  "t.conf:2: log.level: expected debug, info, notice, warning or error" },
	{ M "control { listen = \"unix:c.sock\"; mode = \"0999\"; }\n",
	  "t.conf:2: control.mode: expected an octal mode such as \"0660\"" },
	{ M "control { listen = \"unix:c.sock\"; admin = \"all\"; }\n",
	  "t.conf:2: control.admin: expected group or root" },
	{ M "metrics { listen = \"inet:0.0.0.0:9187\"; }\n",
	  "t.conf:2: metrics.listen: \"inet:0.0.0.0:9187\" can be reached from other hosts, and "
	  "the metrics have no authentication: listen on 127.0.0.1 or ::1, or set "
	  "allow_remote = true" },
	{ "intake { listen = \"unix:i.sock\"; hostname = \"a b\"; }\n",
	  "t.conf:1: intake.hostname: a host name has no spaces" },
	{ "intake { listen = \"unix:i.sock\"; allow = [\"300.1.1.1\"]; }\n",
	  "t.conf:1: intake.allow: \"300.1.1.1\": expected an address or a network (ADDR/BITS)" },
	{ M "queue { min_free = 2t; }\n",
	  "t.conf:2: queue.min_free: expected a size such as 512, 64k, 10mb or 1g, got \"2t\"" },
	{ M "store { type = \"disk\"; }\n",
	  "t.conf:2: store.type: \"disk\": expected memory or redis" },
	{ M "store { server = \"127.0.0.1:6379\"; }\n",
	  "t.conf:2: store.server: only with type = \"redis\"" },
	{ M "store { type = \"redis\"; on_failure = \"panic\"; }\n",
	  "t.conf:2: store.on_failure: expected local, accept or tempfail" },
	{ M "store { type = \"redis\"; master_name = \"m\"; }\n",
	  "t.conf:2: store.master_name: master_name needs sentinels" },
	{ M "relay { retry { min = 2h; max = 1h; } }\n", "t.conf:2: relay.retry: max is below min" },
	{ M "relay { retry = 5m; }\n",
	  "t.conf:2: relay.retry: expected retry { min = ...; max = ...; }" },
	{ M "relay { uncertain = \"drop\"; }\n",
	  "t.conf:2: relay.uncertain: expected retry or hold" },
	{ M "relay { hostname = \"a/b\"; }\n",
	  "t.conf:2: relay.hostname: \"a/b\": expected a host name (letters, digits, '.', '-')" },
	{ "intake { listen = \"unix:i.sock\"; }\n"
	  "route \"r\" { domains = \"*\"; mx = true; tls = \"maybe\"; }\n",
	  "t.conf:2: route \"r\".tls: expected none, may, require, verify, dane or dane-only" },
	{ "intake { listen = \"unix:i.sock\"; }\n"
	  "route \"r\" { domains = \"*\"; smarthost = \"[127.0.0.1]:25\";\n tls = \"dane\"; }\n",
	  "t.conf:3: route \"r\".tls: tls = \"dane\" and \"dane-only\" are for mx = true routes (a "
	  "smarthost has no MX records to validate)" },
	{ "intake { listen = \"unix:i.sock\"; }\n"
	  "route \"r\" { domains = \"*\"; smarthost = \"[127.0.0.1]:25\"; port = 26; }\n",
	  "t.conf:2: route \"r\".port: port is for mx = true routes (a smarthost's port is in "
	  "smarthost = \"[host]:port\")" },
	{ M "relay { dns_min_ttl = 1h; dns_max_ttl = 1m; }\n",
	  "t.conf:2: relay.dns_max_ttl: below dns_min_ttl" },
	{ "intake { listen = \"unix:i.sock\"; }\n"
	  "route \"r\" { domains = \"*\"; mx = true; signal { action = \"slow\"; } }\n",
	  "t.conf:2: route \"r\".signal: match is required" },
	{ M "store { nodes = 2; }\n", "t.conf:2: store.nodes: only with type = \"redis\"" },
	{ M "user = \"no-such-user-xyz\";\n",
	  "t.conf:2: user: unknown user \"no-such-user-xyz\" (create it, e.g. adduser --system "
	  "--group no-such-user-xyz)" },
	{ M "group = \"root\";\n", "t.conf:2: group: group needs user" },
	{ M "user = \"root\";\ngroup = \"no-such-group-xyz\";\n",
	  "t.conf:3: group: unknown group \"no-such-group-xyz\"" },
	{ M "control { listen = \"unix:c.sock\"; owner = \"no-such-user-xyz\"; }\n",
	  "t.conf:2: control.owner: unknown user \"no-such-user-xyz\" (create it, e.g. adduser "
	  "--system --group no-such-user-xyz)" },
	{ M "polciy { }\n", "t.conf:2: polciy: unknown key" },
	{ M "queue { dirr = \"q\"; }\n", "t.conf:2: queue.dirr: unknown key" },
	{ "milter { listen = \"unix:m.sock\"; command_timeout = 20s; }\n"
	  "limit \"slow\" { stage = \"rcpt\"; key = \"client_ip\"; count = \"recipients\";\n"
	  "  rate = \"1/1m\"; action = \"delay\"; delay = 20s; }\n",
	  "t.conf:3: limit \"slow\".delay: a delay of 20s is not below milter.command_timeout "
	  "(20s): sluiced would close the session before it answers (and the MTA's own milter "
	  "timeout, 30s in Postfix, is shorter still)" },
};

static void test_errors(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		struct sluice_config *c = NULL;
		char err[1024], want[1024];
		int r = load_text(bad[i].text, false, &c, err, sizeof(err));
		snprintf(want, sizeof(want), "%s/%s", dir, bad[i].err);
		if (r >= 0 || strcmp(err, want) != 0)
			fail_msg("case %zu: got %d \"%s\"\n  want \"%s\"", i, r, r < 0 ? err : "",
				 want);
		config_free(c);
	}
}

static void test_defaults_and_values(void **state)
{
	(void)state;
	struct sluice_config *c = NULL;
	char err[1024];
	assert_int_equal(load_text("intake { listen = [\"unix:i.sock\", \"inet:127.0.0.1:2525\"];\n"
				   "  max_message_size = 10m; }\n"
				   "policy { listen = \"unix:p.sock\"; }\n", false, &c, err,
				   sizeof(err)), 0);
	assert_true(c->intake.enabled);
	assert_int_equal(c->intake.listen.n, 2);
	assert_int_equal(c->intake.listen.mode, 0666);
	assert_int_equal(c->intake.listen.owner, (uid_t)-1);
	assert_int_equal(c->intake.max_message_size, 10u << 20);
	assert_int_equal(c->intake.max_line_length, 998);
	assert_int_equal(c->intake.nallow, 2);
	assert_int_equal(c->policy.listen.mode, 0666);
	assert_int_equal(c->control.mode, 0660);
	assert_int_equal(c->milter.max_packet, 1052672);
	assert_int_equal(c->stats_interval_ms, 300000);
	assert_int_equal(c->queue.lifetime_ms, INT64_C(5) * 86400000);
	assert_int_equal(c->relay.retry_min_ms, 300000);
	assert_int_equal(c->relay.idle_ms, 10000);
	assert_false(c->store.redis);
	assert_int_equal(c->store.timeout_ms, 50);
	assert_string_equal(c->state_dir, "/var/lib/sluice");
	config_free(c);
}

/* The sluice command reads the intake and control blocks, and no secret. */
static void test_client(void **state)
{
	(void)state;
	struct sluice_config *c = NULL;
	char err[1024];
	assert_int_equal(load_text("control { listen = \"unix:c.sock\"; }\n"
				   "intake { listen = \"unix:i.sock\"; hostname = \"mx.example\"; }\n"
				   "queue { dir = \"q\"; }\n"
				   "store { type = \"redis\"; password_file = \"/nonexistent\"; }\n"
				   "route \"r\" { domains = \"*\"; mx = true; }\n", true, &c, err,
				   sizeof(err)), 0);
	assert_int_equal(c->control.n, 1);
	assert_string_equal(c->control.addr[0], "unix:c.sock");
	assert_string_equal(c->intake.hostname, "mx.example");
	assert_null(c->store.password);
	assert_null(c->rules);
	config_free(c);
}

static int setup(void **state)
{
	(void)state;
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char path[300];
	snprintf(path, sizeof(path), "%s/t.conf", dir);
	unlink(path);
	return rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_defaults_and_values),
		cmocka_unit_test(test_client),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
