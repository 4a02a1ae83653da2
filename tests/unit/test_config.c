/*
 * test_config -- sluiced's configuration (src/conf, src/daemon/daemon_config.c): the
 * errors of the blocks read from tables name file, line and key as before the tables,
 * the checks across keys still run, and config_load_client() reads what the sluice
 * command needs.
 *
 * Table-driven: a configuration and the exact error its load gives (daemon_config_load(),
 * or config_load_client() for the sluice command's rows).
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
#include "config_schema.h"
#include "daemon_config.h"
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
	return client ? config_load_client(path, ret, err, el) : daemon_config_load(path, ret, err, el);
}

/* Frees what load_text() made: sluiced's whole configuration, or a client's. */
static void conf_free(struct sluice_config *c)
{
	if (c && c->client)
		config_free(c);
	else
		daemon_config_free(c);
}

/* Writes a secret file (owned by whoever runs the test: root, or the daemon's user). */
static void write_secret(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(chmod(path, mode), 0);
}

#define M "milter { listen = \"unix:m.sock\"; }\n"
/* an intake, and a route with provider lanes */
#define I "intake { listen = \"unix:i.sock\"; }\n"
#define PR "route \"d\" { domains = \"*\"; mx = true; lanes = \"provider\"; }\n"

static const struct {
	const char *text;
	const char *err; /* after "DIR/" */
} bad[] = {
	{ "milter { }\n", "t.conf:1: milter: listen is required" },
	{ "milter { listen = \"tcp:1\"; }\n",
	  "t.conf:1: milter.listen: \"tcp:1\": unknown socket type \"tcp\"; expected "
	  "unix:/path, local:/path, inet:host:port, inet:port@host, inet6:[addr]:port or "
	  "inet6:port@[addr]" },
	/* libmilter's forms are checked as closely as sluice's own (sockspec.c) */
	{ "milter {\n listen = [\"inet:8891@127.0.0.1\",\n \"inet:0@127.0.0.1\"]; }\n",
	  "t.conf:3: milter.listen[1]: \"inet:0@127.0.0.1\": port 0 is out of range 1-65535" },
	{ "policy { listen = \"inet:70000\"; }\n",
	  "t.conf:1: policy.listen: \"inet:70000\": port 70000 is out of range 1-65535" },
	{ "milter { listen = \"inet:8891@\"; }\n",
	  "t.conf:1: milter.listen: \"inet:8891@\": empty host" },
	{ "milter { listen = \"inet:@localhost\"; }\n",
	  "t.conf:1: milter.listen: \"inet:@localhost\": missing port" },
	{ "milter { listen = \"local:\"; }\n",
	  "t.conf:1: milter.listen: \"local:\": empty unix socket path" },
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
	/* an inet control socket takes a password */
	{ M "control {\n listen = \"unix:c.sock\";\n listen = \"inet:127.0.0.1:9999\";\n}\n",
	  "t.conf:4: control.listen: \"inet:127.0.0.1:9999\" is an inet address, whose clients "
	  "carry no credentials: give password_file = \"/etc/sluice/control.secret\"; (a file "
	  "only root and sluiced's user may read), or use a unix socket" },
	{ M "control { listen = [\"unix:c.sock\", \"inet6:[::1]:9999\"]; }\n",
	  "t.conf:2: control.listen[1]: \"inet6:[::1]:9999\" is an inet address, whose clients "
	  "carry no credentials: give password_file = \"/etc/sluice/control.secret\"; (a file "
	  "only root and sluiced's user may read), or use a unix socket" },
	/* ... and one other hosts reach sends it in clear: asked for (the addresses are
	 * checked before the password file is read) */
	{ M "control {\n listen = \"unix:c.sock\";\n listen = \"inet:9999\";\n"
	  " password_file = \"/nonexistent\";\n}\n",
	  "t.conf:4: control.listen: \"inet:9999\" can be reached from other hosts, and the "
	  "control password crosses the network in clear: use a unix socket or 127.0.0.1/::1, "
	  "or set allow_remote = true" },
	{ M "control { listen = [\"inet:127.0.0.1:9999\", \"inet6:[2001:db8::1]:9999\"];\n"
	  " password_file = \"/nonexistent\"; }\n",
	  "t.conf:2: control.listen[1]: \"inet6:[2001:db8::1]:9999\" can be reached from other "
	  "hosts, and the control password crosses the network in clear: use a unix socket or "
	  "127.0.0.1/::1, or set allow_remote = true" },
	{ M "control { listen = \"inet:127.0.0.1:9999\";\n password_file = \"/nonexistent\"; }\n",
	  "t.conf:3: control.password_file: /nonexistent: No such file or directory" },
	{ M "control { listen = \"unix:c.sock\";\n read_password_file = \"/nonexistent\"; }\n",
	  "t.conf:3: control.read_password_file: read_password_file needs password_file (the "
	  "password that runs every command)" },
	/* a listen host name is looked up at load: sluiced -t names the line */
	{ M "policy {\n listen = \"inet:18891@nonexistent.invalid\";\n}\n",
	  "t.conf:3: policy.listen: \"inet:18891@nonexistent.invalid\": nonexistent.invalid: "
	  "Name or service not known" },
	{ "milter { listen = [\"unix:m.sock\", \"inet6:[fe80::1%nosuchif0]:25\"]; }\n",
	  "t.conf:1: milter.listen[1]: \"inet6:[fe80::1%nosuchif0]:25\": fe80::1%nosuchif0: "
	  "Name or service not known" },
	/* libmilter's inet6 wildcard takes IPv4 too: an inet listener on its port cannot bind */
	{ "milter { listen = [\"inet:8891\", \"inet6:8891\"]; }\n",
	  "t.conf:1: milter.listen[1]: \"inet6:8891\" takes IPv4 clients on port 8891 too (as "
	  "libmilter's inet6:PORT does), so \"inet:8891\" cannot bind beside it: drop the inet "
	  "one, or write inet6:[::]:8891 for IPv6 only" },
	{ "milter { listen = [\"inet6:8891@[::]\", \"inet:127.0.0.1:8891\"]; }\n",
	  "t.conf:1: milter.listen[1]: \"inet6:8891@[::]\" takes IPv4 clients on port 8891 too "
	  "(as libmilter's inet6:PORT does), so \"inet:127.0.0.1:8891\" cannot bind beside it: "
	  "drop the inet one, or write inet6:[::]:8891 for IPv6 only" },
	{ M "metrics { listen = \"inet:0.0.0.0:9187\"; }\n",
	  "t.conf:2: metrics.listen: \"inet:0.0.0.0:9187\" can be reached from other hosts, and "
	  "the metrics have no authentication: listen on 127.0.0.1 or ::1, or set "
	  "allow_remote = true" },
	{ "intake { listen = \"unix:i.sock\"; hostname = \"a b\"; }\n",
	  "t.conf:1: intake.hostname: a host name has no spaces" },
	{ "intake { listen = \"unix:i.sock\"; allow = [\"300.1.1.1\"]; }\n",
	  "t.conf:1: intake.allow: \"300.1.1.1\": expected an address or a network (ADDR/BITS)" },
	{ M "queue { min_free = 2t; }\n",
	  "t.conf:2: queue.min_free: expected a size in bytes such as 512, 64KiB, 10MiB or "
	  "1GiB (KiB, MiB, GiB: 2^10, 2^20, 2^30 bytes), got \"2t\"" },
	/* a size with a bare k/M/G meant 2^10..: refused rather than silently changed */
	{ M "intake {\n listen = \"unix:i.sock\";\n max_message_size = 10M;\n}\n",
	  "t.conf:4: intake.max_message_size: \"10M\" is ambiguous: write 10MiB (10485760 "
	  "bytes) or 10000000" },
	{ M "intake {\n listen = \"unix:i.sock\";\n max_message_size = 10MB;\n}\n",
	  "t.conf:4: intake.max_message_size: \"10MB\" is ambiguous: write 10MiB (10485760 "
	  "bytes) or 10000000" },
	{ M "queue { min_free = 2000G; }\n",
	  "t.conf:2: queue.min_free: \"2000G\" is ambiguous, and out of range "
	  "[0, 1099511627776] bytes either way" },
	{ M "policy { listen = \"unix:p.sock\"; max_request = 64kb; }\n",
	  "t.conf:2: policy.max_request: \"64kb\" is ambiguous: write 64KiB (65536 bytes) or "
	  "64000" },
	{ M "intake { listen = \"unix:i.sock\"; max_line_length = 2kb; }\n",
	  "t.conf:2: intake.max_line_length: \"2kb\" is ambiguous: write 2KiB (2048 bytes) "
	  "or 2000" },
	{ M "intake { listen = \"unix:i.sock\"; max_line_length = 2k; }\n",
	  "t.conf:2: intake.max_line_length: \"2k\" is ambiguous: write 2KiB (2048 bytes) "
	  "or 2000" },
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
	/* provider lanes and signal thresholds */
	{ I PR "provider \"p\" { rate = \"3/10s\"; }\n", "t.conf:3: provider \"p\": mx is required" },
	{ I PR "provider \"p\" { mx = []; }\n",
	  "t.conf:3: provider \"p\".mx: a provider needs at least one MX host pattern, "
	  "e.g. mx = [\"*.mx.example.net\"]" },
	{ I PR "provider \"p\" { mx = [\"a.example\", \"mx*.example\"]; }\n",
	  "t.conf:3: provider \"p\".mx: \"mx*.example\": expected an MX host name, *.domain or *" },
	{ I PR "provider \"p\" { mx = [\"*.mx.example.net.\"]; }\n",
	  "t.conf:3: provider \"p\".mx: \"*.mx.example.net.\": expected an MX host name, "
	  "*.domain or *" },
	{ I PR "provider \"p\" { mx = \"a.example\"; }\nprovider \"p\" { mx = \"b.example\"; }\n",
	  "t.conf:4: provider \"p\": a second provider named \"p\"" },
	{ I PR "provider \"p\" { mx = \"a.example\"; connection = 3; }\n",
	  "t.conf:3: provider \"p\".connection: unknown key" },
	{ I PR "provider \"p\" { mx = \"a.example\"; connections = 0; }\n",
	  "t.conf:3: provider \"p\".connections: \"0\" is out of range [1, 1000]" },
	{ I PR "provider \"p\" { mx = \"a.example\"; rate = \"3/ever\"; }\n",
	  "t.conf:3: provider \"p\".rate: bad rate window '3/ever': the period must be [N]s, m, "
	  "h, d or w" },
	{ I PR "provider \"a b\" { mx = \"a.example\"; }\n",
	  "t.conf:3: provider \"a b\": expected provider \"name\" { mx = [\"*.mx.example.net\"]; ... } "
	  "(a name without spaces, tabs, ',', ':', '\"' or '\\')" },
	{ I PR "route \"e\" { domains = \"x.example\"; mx = true; }\n"
	  "route \"f\" { domains = \"y.example\"; mx = true; lanes = \"provider\"; }\n"
	  "provider \"p\" { mx = \"a.example\"; }\n",
	  "t.conf:4: route \"f\".lanes: lanes = \"provider\" on a second route: a provider's "
	  "budget is one lane's, and one route's" },
	{ I PR, "t.conf:2: route \"d\".lanes: lanes = \"provider\" needs provider \"name\" { mx = [...]; } blocks" },
	{ I "route \"d\" { domains = \"*\"; mx = true; }\nprovider \"p\" { mx = \"a.example\"; }\n",
	  "t.conf:3: provider \"p\": provider blocks are used by mx routes with lanes = \"provider\", "
	  "and no route has it" },
	{ I "route \"s\" { domains = \"*\"; smarthost = \"[127.0.0.1]:25\"; lanes = \"provider\"; }\n",
	  "t.conf:2: route \"s\".lanes: lanes = \"mx\" or \"provider\" groups the domains of an mx = "
	  "true route; a smarthost route is one lane already" },
	{ I "route \"d\" { domains = \"*\"; mx = true; lanes = \"site\"; }\n",
	  "t.conf:2: route \"d\".lanes: expected domain, mx or provider" },
	{ I "route \"d\" { domains = \"*\"; mx = true;\n  signal { match = \"x\"; after = 3; } }\n",
	  "t.conf:3: route \"d\".signal.after: after = 3 needs within = DURATION, the window in "
	  "which the 3 matching replies count" },
	{ I "route \"d\" { domains = \"*\"; mx = true;\n  signal { match = \"x\"; within = 1m; } }\n",
	  "t.conf:3: route \"d\".signal.within: within needs after = N (N > 1): how many "
	  "matching replies within it act" },
	{ I "route \"d\" { domains = \"*\"; mx = true;\n  signal { match = \"x\"; after = 0; within = 1m; } }\n",
	  "t.conf:3: route \"d\".signal.after: \"0\" is out of range [1, 1000]" },
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

/* Providers as loaded, and which one an MX host name belongs to. */
static void test_providers(void **state)
{
	(void)state;
	struct sluice_config *c = NULL;
	char err[1024];
	int r = load_text(I "route \"d\" { domains = \"*\"; mx = true; lanes = \"provider\";\n"
			  "  signal { match = \"^451 \"; after = 5; within = 10m; } }\n"
			  "provider \"big\" { mx = [\"*.mx.big.example\", \"mx.big.example\"];\n"
			  "  rate = [\"3/10s\", \"100/1h\"]; connections = 2; }\n"
			  "provider \"small\" { mx = \"mx1.small.example\"; }\n", false, &c, err,
			  sizeof(err));
	if (r < 0)
		fail_msg("%s", err);
	const struct relay_conf *rl = &daemon_config_of(c)->relay;
	assert_int_equal(rl->nproviders, 2);
	assert_int_equal(rl->routes[0].lanes, ROUTE_LANES_PROVIDER);
	assert_int_equal(rl->routes[0].signals[0].after, 5);
	assert_int_equal(rl->routes[0].signals[0].within_ms, 600000);
	assert_string_equal(rl->providers[0].name, "big");
	assert_int_equal(rl->providers[0].rate.n, 2);
	assert_int_equal(rl->providers[0].connections, 2);
	assert_int_equal(rl->providers[1].connections, 4); /* the default */
	static const struct {
		const char *host;
		const char *provider;
	} match[] = {
		{ "a.mx.big.example", "big" },
		{ "A.MX.BIG.EXAMPLE.", "big" },
		{ "x.y.mx.big.example", "big" },
		{ "mx.big.example", "big" },
		{ "big.example", NULL },
		{ "amx.big.example", NULL },
		{ "mx1.small.example", "small" },
		{ "mx2.small.example", NULL },
		{ "mx1.small.example.org", NULL },
		{ "", NULL },
	};
	for (size_t i = 0; i < ARRAY_SIZE(match); i++) {
		const struct provider_conf *p = relay_conf_provider(rl, match[i].host);
		if (!p != !match[i].provider || (p && strcmp(p->name, match[i].provider) != 0))
			fail_msg("%s: got %s, want %s", match[i].host, p ? p->name : "none",
				 match[i].provider ? match[i].provider : "none");
	}
	/* the relay's own copy keeps them */
	struct relay_conf copy;
	assert_int_equal(relay_conf_copy(rl, &copy), 0);
	assert_int_equal(copy.nproviders, 2);
	assert_string_equal(relay_conf_provider(&copy, "q.mx.big.example")->name, "big");
	assert_string_equal(copy.providers[1].mx[0], "mx1.small.example");
	assert_null(copy.providers[1].mx[1]);
	relay_conf_clear(&copy);
	conf_free(c);
}

static void test_errors(void **state)
{
	(void)state;
	config_resolve_listen_hosts(true); /* as sluiced -t and the start load */
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		struct sluice_config *c = NULL;
		char err[1024], want[1024];
		int r = load_text(bad[i].text, false, &c, err, sizeof(err));
		snprintf(want, sizeof(want), "%s/%s", dir, bad[i].err);
		if (r >= 0 || strcmp(err, want) != 0)
			fail_msg("case %zu: got %d \"%s\"\n  want \"%s\"", i, r, r < 0 ? err : "",
				 want);
		conf_free(c);
	}
	/* a reload looks no listen host up (it binds nothing): the name is the start's */
	config_resolve_listen_hosts(false);
	struct sluice_config *c = NULL;
	char err[1024];
	assert_int_equal(load_text(M "policy {\n listen = \"inet:18891@nonexistent.invalid\";\n}\n",
				   false, &c, err, sizeof(err)), 0);
	conf_free(c);
}

static void test_defaults_and_values(void **state)
{
	(void)state;
	struct sluice_config *c = NULL;
	char err[1024];
	assert_int_equal(load_text("intake { listen = [\"unix:i.sock\", \"inet:127.0.0.1:2525\"];\n"
				   "  max_message_size = 10MiB; }\n"
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
	assert_int_equal(daemon_config_of(c)->relay.retry_min_ms, 300000);
	assert_int_equal(daemon_config_of(c)->relay.idle_ms, 10000);
	assert_false(c->store.redis);
	assert_int_equal(c->store.timeout_ms, 50);
	assert_string_equal(c->state_dir, "/var/lib/sluice");
	conf_free(c);
}

/* control.allow_remote lets an inet control socket on every address; loopback needs none */
static void test_control_allow_remote(void **state)
{
	(void)state;
	struct sluice_config *c = NULL;
	char err[1024];
	char pw[300], text[1024];
	snprintf(pw, sizeof(pw), "%s/control.secret", dir);
	write_secret(pw, "pw\n", 0600);
	snprintf(text, sizeof(text), M "control { listen = \"inet:9999\"; allow_remote = true; "
		 "password_file = \"%s\"; }\n", pw);
	assert_int_equal(load_text(text, false, &c, err, sizeof(err)), 0);
	assert_true(c->control_allow_remote);
	conf_free(c);
	snprintf(text, sizeof(text), M "control { listen = [\"inet:9999@127.0.0.1\", "
		 "\"inet6:[::1]:9999\", \"unix:c.sock\"]; password_file = \"%s\"; }\n", pw);
	assert_int_equal(load_text(text, false, &c, err, sizeof(err)), 0);
	assert_false(c->control_allow_remote);
	conf_free(c);
	unlink(pw);
}

/*
 * The passwords of an inet control socket: read by sluiced (first line), checked as every
 * secret file, not the same twice; the sluice command gets the paths, not the passwords.
 */
static void test_control_passwords(void **state)
{
	(void)state;
	struct sluice_config *c = NULL;
	char err[1024], adm[300], rd[300], text[1200];
	snprintf(adm, sizeof(adm), "%s/admin.secret", dir);
	snprintf(rd, sizeof(rd), "%s/read.secret", dir);
	write_secret(adm, "the admin's % password\nsecond line\n", 0600);
	write_secret(rd, "reader\n", 0640);
	snprintf(text, sizeof(text), M "control { listen = [\"unix:c.sock\", "
		 "\"inet:127.0.0.1:9999\"];\n password_file = \"%s\";\n read_password_file = "
		 "\"%s\"; }\n", adm, rd);
	assert_int_equal(load_text(text, false, &c, err, sizeof(err)), 0);
	assert_string_equal(c->control_password, "the admin's % password");
	assert_string_equal(c->control_read_password, "reader");
	assert_string_equal(c->control_password_file, adm);
	conf_free(c);
	/* the sluice command: the paths, never the passwords */
	assert_int_equal(load_text(text, true, &c, err, sizeof(err)), 0);
	assert_null(c->control_password);
	assert_null(c->control_read_password);
	assert_string_equal(c->control_read_password_file, rd);
	conf_free(c);
	/* readable by others */
	assert_int_equal(chmod(rd, 0644), 0);
	assert_int_equal(load_text(text, false, &c, err, sizeof(err)), -EINVAL);
	char want[1024];
	snprintf(want, sizeof(want), "/t.conf:4: control.read_password_file: %s has mode 0644: "
		 "others may read it; fix: chmod 0640 %s", rd, rd);
	assert_non_null(strstr(err, want));
	/* the same password twice */
	write_secret(rd, "the admin's % password\n", 0600);
	assert_int_equal(load_text(text, false, &c, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "/t.conf:4: control.read_password_file: %s holds the same "
		 "password as %s: the read-only password must be another", rd, adm);
	assert_non_null(strstr(err, want));
	/* empty */
	write_secret(adm, "\n", 0600);
	assert_int_equal(load_text(text, false, &c, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "/t.conf:3: control.password_file: %s is empty", adm);
	assert_non_null(strstr(err, want));
	/* the first line, for the sluice command */
	char *line = NULL;
	assert_int_equal(config_secret_line(adm, &line), -ENODATA);
	assert_int_equal(config_secret_line(rd, &line), 0);
	assert_string_equal(line, "the admin's % password");
	free(line);
	assert_int_equal(config_secret_line("/nonexistent", &line), -ENOENT);
	unlink(adm);
	unlink(rd);
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
	assert_true(c->client); /* no rules: a client's struct has none */
	conf_free(c);
}

/* What a reload cannot apply is the tables' restart column: one group per warning. */
static void test_restart_changes(void **state)
{
	(void)state;
	static const struct {
		const char *text;
		unsigned groups; /* against base */
	} cases[] = {
		{ M "queue { commit_batch = 8; }\nstore { max_keys = 5000; }\n", 0 },
		/* what a reload applies: timeouts, log, limits, the memory store's bound */
		{ "milter { listen = \"unix:m.sock\"; command_timeout = 1m; }\n"
		  "log { level = \"debug\"; }\n"
		  "queue { commit_batch = 8; }\nstore { max_keys = 6000; }\n"
		  "limit \"l\" { stage = rcpt; key = rcpt; rate = 1/1m; }\n", 0 },
		{ "milter { listen = \"unix:other.sock\"; }\nqueue { commit_batch = 8; }\n"
		  "store { max_keys = 5000; }\n", 1u << CONFIG_RESTART_LISTEN },
		{ M "intake { listen = \"unix:i.sock\"; }\nqueue { commit_batch = 8; }\n"
		  "store { max_keys = 5000; }\n", 1u << CONFIG_RESTART_LISTEN },
		{ M "metrics { }\nqueue { commit_batch = 8; }\nstore { max_keys = 5000; }\n",
		  1u << CONFIG_RESTART_LISTEN },
		{ M "workers = 3;\nstate_dir = \"s\";\nqueue { commit_batch = 9; }\n"
		  "store { max_keys = 5000; }\n", 1u << CONFIG_RESTART_WORKERS |
		  1u << CONFIG_RESTART_STATE_DIR | 1u << CONFIG_RESTART_QUEUE },
		{ M "user = \"root\";\nqueue { commit_batch = 8; }\nstore { max_keys = 5000; }\n",
		  1u << CONFIG_RESTART_USER },
		{ M "queue { commit_batch = 8; }\nstore { type = \"redis\"; }\n",
		  1u << CONFIG_RESTART_STORE },
	};
	struct sluice_config *base = NULL, *c = NULL;
	char err[1024];
	assert_int_equal(load_text(cases[0].text, false, &base, err, sizeof(err)), 0);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		if (load_text(cases[i].text, false, &c, err, sizeof(err)) < 0)
			fail_msg("case %zu: %s", i, err);
		unsigned got = config_restart_changes(base, c);
		if (got != cases[i].groups)
			fail_msg("case %zu: groups %#x, want %#x", i, got, cases[i].groups);
		assert_int_equal(config_restart_changes(c, c), 0);
		conf_free(c);
	}
	conf_free(base);
	assert_string_equal(config_restart_text(CONFIG_RESTART_LISTEN),
			    "listen addresses changed; they take effect at the next restart");
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
		cmocka_unit_test(test_providers),
		cmocka_unit_test(test_defaults_and_values),
		cmocka_unit_test(test_control_allow_remote),
		cmocka_unit_test(test_control_passwords),
		cmocka_unit_test(test_client),
		cmocka_unit_test(test_restart_changes),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
