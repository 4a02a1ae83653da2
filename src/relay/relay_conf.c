/*
 * relay_conf -- the relay's configuration (relay.h): the keys of relay { }, route "name"
 * { } with its auth { } and signal { }, and provider "name" { } as tables (cfg_schema.h),
 * with the types of a route's own (domains, smarthost, source, rates, timeouts: each
 * fills its member and the one that goes with it); relay_conf_load(), which reads them
 * with the schema walker and keeps the checks across keys and routes; a deep copy for
 * the relay's thread; and the route of a recipient domain.
 *
 * What it reads is what sluiced -D writes from the same tables (src/daemon): every type
 * formats its value so that it parses into the same member again.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cfg_schema.h"
#include "relay.h"
#include "threshold.h"
#include "util.h"

/* ---- the keys of route "name" { } ---- */

_Static_assert(sizeof(enum smtp_out_tls) == sizeof(int), "stored by cfg_type_enum");
_Static_assert(sizeof(enum route_count) == sizeof(int), "stored by cfg_type_enum");
_Static_assert(sizeof(enum route_lanes) == sizeof(int), "stored by cfg_type_enum");

static int check_readable(const struct cfg_node *n, const void *field, char *err, size_t el)
{
	const char *file = *(char *const *)field;
	if (file && access(file, R_OK) < 0) {
		cfg_error(n, err, el, "%s: %s", file, strerror(errno));
		return -EINVAL;
	}
	return 0;
}

static const struct cfg_enum route_tls[] = {
	{ "none", SMTP_TLS_NONE }, { "may", SMTP_TLS_MAY }, { "require", SMTP_TLS_REQUIRE },
	{ "verify", SMTP_TLS_VERIFY }, { "dane", SMTP_TLS_DANE }, { "dane-only", SMTP_TLS_DANE_ONLY },
	{ NULL, 0 },
};

static const struct cfg_enum route_lanes[] = {
	{ "domain", ROUTE_LANES_DOMAIN }, { "mx", ROUTE_LANES_MX },
	{ "provider", ROUTE_LANES_PROVIDER }, { NULL, 0 },
};

static const struct cfg_enum route_count[] = {
	{ "messages", ROUTE_COUNT_MESSAGES }, { "recipients", ROUTE_COUNT_RECIPIENTS },
	{ NULL, 0 },
};

_Static_assert(sizeof(enum classify_verdict) == sizeof(int), "stored by cfg_type_enum");

static const struct cfg_enum signal_actions[] = {
	{ "suspend", CLASSIFY_SUSPEND }, { "slow", CLASSIFY_SLOW }, { "retry", CLASSIFY_RETRY },
	{ "bounce", CLASSIFY_FAIL }, { NULL, 0 },
};

#define SIGNAL(field) offsetof(struct classify_signal_conf, field)

/* A duration whose 0 means "not given" (int64_t ms): nothing is written for it. */
static int optional_duration_parse(const struct cfg_node *n, const struct cfg_key *k,
				   void *field, char *err, size_t el)
{
	return cfg_type_duration.parse(n, k, field, err, el);
}

static bool optional_duration_format(const struct cfg_key *k, const void *field, char *buf,
				     size_t size)
{
	return *(const int64_t *)field && cfg_type_duration.format(k, field, buf, size);
}

static const struct cfg_type type_optional_duration = { "duration", optional_duration_parse,
							optional_duration_format, NULL };

const struct cfg_key route_signal_keys[] = {
	{ "match", &cfg_type_string, SIGNAL(match), NULL, .flags = CFG_REQUIRED,
	  .help = "a regular expression over the relay's reply" },
	{ "action", &cfg_type_enum, SIGNAL(action), "suspend", .names = signal_actions,
	  .help = "what a matching reply does to the lane or the recipient" },
	{ "for", &type_optional_duration, SIGNAL(for_ms), NULL, 1000, INT64_C(30) * 86400 * 1000,
	  .help = "the suspension or slow-down (default: the lane's backoff)" },
	{ "after", &cfg_type_uint, SIGNAL(after), "1", 1, THRESHOLD_AFTER_MAX,
	  .help = "act on this many matching replies within `within` (per lane)" },
	{ "within", &type_optional_duration, SIGNAL(within_ms), NULL, 1000, INT64_C(30) * 86400 * 1000,
	  .help = "the window in which `after` matching replies act (required with after)" },
	{ .name = NULL },
};

/* ---- types of a route's own ---- */

/* The route_conf that holds field, the key's member: these types fill a member and the
 * one that goes with it (a count, a length, a port). */
#define ROUTE_OF(field, member) \
	((struct route_conf *)(void *)((char *)(field) - offsetof(struct route_conf, member)))

static bool domain_ok(const char *s, const char **why)
{
	bool ok = *s && strlen(s) < 256 && !strpbrk(s, " \t@[]");
	if (ok && strchr(s, '*'))
		ok = strcmp(s, "*") == 0 || (s[0] == '*' && s[1] == '.' && s[2] && !strchr(s + 1, '*'));
	if (!ok)
		*why = "expected a domain, *.domain or *";
	return ok;
}

/* domains: a list (NULL-terminated) and its count */
static int domains_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			 char *err, size_t el)
{
	int r = cfg_list_check(n, domain_ok, err, el);
	char **list = NULL;
	if (r == 0)
		r = cfg_type_list.parse(n, k, &list, err, el);
	if (r < 0)
		return r;
	struct route_conf *rc = ROUTE_OF(field, domains);
	for (size_t i = 0; i < rc->ndomains; i++)
		free(rc->domains[i]);
	free(rc->domains);
	rc->domains = list;
	for (rc->ndomains = 0; list[rc->ndomains]; rc->ndomains++)
		;
	return 0;
}

static bool domains_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	return cfg_type_list.format(k, field, buf, size);
}

static const struct cfg_type type_domains = { "list", domains_parse, domains_format, NULL };

/* smarthost: "[host]:port", "host:port", "host", "[v6]:port" into host and port */
static int smarthost_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			   char *err, size_t el)
{
	(void)k;
	const char *s;
	int r = cfg_string(n, &s, err, el);
	if (r < 0)
		return r;
	const char *host = s, *port = NULL;
	size_t hl;
	if (s[0] == '[') {
		const char *end = strchr(s, ']');
		if (!end || (end[1] && end[1] != ':')) {
			cfg_error(n, err, el, "\"%.100s\": expected [host]:port", s);
			return -EINVAL;
		}
		host = s + 1;
		hl = (size_t)(end - host);
		port = end[1] == ':' ? end + 2 : NULL;
	} else {
		const char *colon = strrchr(s, ':');
		if (colon && strchr(s, ':') != colon) {
			cfg_error(n, err, el, "\"%.100s\": write an IPv6 address in brackets, "
				  "[::1]:25", s);
			return -EINVAL;
		}
		hl = colon ? (size_t)(colon - s) : strlen(s);
		port = colon ? colon + 1 : NULL;
	}
	if (hl == 0 || hl > 253) {
		cfg_error(n, err, el, "\"%.100s\": no host name", s);
		return -EINVAL;
	}
	uint16_t p = 25;
	if (port) {
		char *end;
		unsigned long v = strtoul(port, &end, 10);
		if (!*port || *end || v == 0 || v > 65535) {
			cfg_error(n, err, el, "\"%.100s\": bad port", s);
			return -EINVAL;
		}
		p = (uint16_t)v;
	}
	char *h = strndup(host, hl);
	if (!h)
		return -ENOMEM;
	struct route_conf *rc = ROUTE_OF(field, host);
	free(rc->host);
	rc->host = h;
	rc->port = p;
	return 0;
}

static bool smarthost_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const struct route_conf *rc = ROUTE_OF(field, host);
	if (!rc->host)
		return false;
	char text[300];
	snprintf(text, sizeof(text), "[%s]:%u", rc->host, rc->port);
	cfg_quote(text, buf, size);
	return true;
}

static const struct cfg_type type_smarthost = { "[host]:port", smarthost_parse, smarthost_format,
						NULL };

/* source: an IP address into source and sourcelen */
static int source_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			char *err, size_t el)
{
	(void)k;
	const char *s;
	int r = cfg_string(n, &s, err, el);
	if (r < 0)
		return r;
	struct route_conf *rc = ROUTE_OF(field, source);
	struct sockaddr_storage ss = { .ss_family = AF_UNSPEC };
	struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
	socklen_t len;
	if (inet_pton(AF_INET, s, &v4->sin_addr) == 1) {
		v4->sin_family = AF_INET;
		len = sizeof(*v4);
	} else if (inet_pton(AF_INET6, s, &v6->sin6_addr) == 1) {
		v6->sin6_family = AF_INET6;
		len = sizeof(*v6);
	} else {
		cfg_error(n, err, el, "\"%.100s\": expected an IP address", s);
		return -EINVAL;
	}
	rc->source = ss;
	rc->sourcelen = len;
	return 0;
}

static bool source_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const struct sockaddr_storage *ss = field;
	char text[INET6_ADDRSTRLEN];
	const void *a = ss->ss_family == AF_INET ?
		(const void *)&((const struct sockaddr_in *)ss)->sin_addr :
		(const void *)&((const struct sockaddr_in6 *)ss)->sin6_addr;
	if ((ss->ss_family != AF_INET && ss->ss_family != AF_INET6) ||
	    !inet_ntop(ss->ss_family, a, text, sizeof(text)))
		return false;
	cfg_quote(text, buf, size);
	return true;
}

static const struct cfg_type type_source = { "IP address", source_parse, source_format, NULL };

/* rate: windows "COUNT/PERIOD[:BURST]" into a struct rate_limits */
static int add_window(void *arg, const struct cfg_node *it, const char *s, char *err, size_t el)
{
	struct rate_limits *rl = arg;
	if (rl->n == RATE_MAX_WINDOWS) {
		cfg_error(it, err, el, "more than %d windows", RATE_MAX_WINDOWS);
		return -EINVAL;
	}
	char e[200];
	struct rate_window w;
	if (rate_window_parse(str_cstr(s), &w, e, sizeof(e)) < 0) {
		cfg_error(it, err, el, "%s", e);
		return -EINVAL;
	}
	if (w.count > 10000000) {
		cfg_error(it, err, el, "\"%.100s\": a lane counts at most 10000000 sends per window",
			  s);
		return -EINVAL;
	}
	rl->w[rl->n++] = w;
	return 0;
}

static int rate_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	(void)k;
	struct rate_limits rl = { .n = 0 };
	int r = cfg_list_each(n, add_window, &rl, err, el);
	if (r == 0)
		*(struct rate_limits *)field = rl;
	return r;
}

static bool rate_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const struct rate_limits *rl = field;
	if (!rl->n)
		return false;
	size_t o = (size_t)snprintf(buf, size, "[");
	for (unsigned i = 0; i < rl->n && o < size; i++) {
		char w[64];
		o += (size_t)snprintf(buf + o, size - o, "%s\"%s\"", i ? ", " : "",
				      rate_window_format(&rl->w[i], w, sizeof(w)));
	}
	if (o < size)
		snprintf(buf + o, size - o, "]");
	return true;
}

static const struct cfg_type type_rate = { "list", rate_parse, rate_format, NULL };

/* connect_timeout and data_timeout: one stage's deadline (0: smtp_out's default) */
static int stage_timeout_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			       char *err, size_t el)
{
	int64_t ms;
	int r = cfg_duration_ms(n, k->min, k->max, &ms, err, el);
	if (r == 0)
		*(uint64_t *)field = (uint64_t)ms;
	return r;
}

static bool stage_timeout_format(const struct cfg_key *k, const void *field, char *buf,
				 size_t size)
{
	(void)k;
	uint64_t ms = *(const uint64_t *)field;
	if (!ms)
		return false;
	fmt_duration(buf, size, ms, DURATION_EXACT);
	return true;
}

static const struct cfg_type type_stage_timeout = { "duration", stage_timeout_parse,
						    stage_timeout_format, NULL };

/* command_timeout: every stage's from the greeting on, but the final dot's (field: the
 * greeting's) */
static int command_timeout_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
				 char *err, size_t el)
{
	int64_t ms;
	int r = cfg_duration_ms(n, k->min, k->max, &ms, err, el);
	if (r < 0)
		return r;
	uint64_t *t = (uint64_t *)field - SMTP_STAGE_GREETING;
	for (unsigned i = SMTP_STAGE_GREETING; i < SMTP_STAGE_COUNT; i++)
		if (i != SMTP_STAGE_DOT)
			t[i] = (uint64_t)ms;
	return 0;
}

static const struct cfg_type type_command_timeout = { "duration", command_timeout_parse,
						      stage_timeout_format, NULL };

#define ROUTE(field) offsetof(struct route_conf, field)

static bool route_is_mx(const void *base)
{
	return ((const struct route_conf *)base)->mx;
}

const struct cfg_key route_conf_keys[] = {
	{ "domains", &type_domains, ROUTE(domains), NULL,
	  .help = "the recipient domains: \"example.com\", \"*.example.com\" or \"*\"" },
	{ "smarthost", &type_smarthost, ROUTE(host), NULL,
	  .help = "deliver to this relay, \"[host]:port\" (or mx = true)" },
	{ "mx", &cfg_type_bool, ROUTE(mx), "false",
	  .help = "deliver to the domains' MX hosts (or smarthost)" },
	{ "helo", &cfg_type_string, ROUTE(helo), NULL,
	  .help = "the EHLO name (default: relay.hostname)" },
	{ "tls", &cfg_type_enum, ROUTE(tls), "may", .names = route_tls,
	  .help = "STARTTLS: none, may (when offered), require, verify the certificate, or "
		  "dane / dane-only (mx routes: TLSA records)" },
	{ "ca_file", &cfg_type_string, ROUTE(ca_file), NULL, .check = check_readable,
	  .help = "the CAs that verify trusts (default: the system's)" },
	{ "sni", &cfg_type_string, ROUTE(sni), NULL,
	  .help = "the name sent and verified (default: the smarthost's or the MX's)" },
	{ "count", &cfg_type_enum, ROUTE(count), "messages", .names = route_count,
	  .help = "what the rate counts" },
	{ "connections", &cfg_type_uint, ROUTE(connections), NULL, 1, 1000,
	  .help = "simultaneous connections per lane (default 2, 4 with mx)" },
	{ "messages_per_connection", &cfg_type_uint, ROUTE(messages_per_connection), "100", 1,
	  1000000, .help = "messages sent over one connection before it is closed" },
	{ "recipients_per_message", &cfg_type_uint, ROUTE(recipients_per_message), "50", 1,
	  SMTP_OUT_RCPT_MAX, .help = "RCPT TO per transaction" },
	{ "guard", &cfg_type_duration, ROUTE(guard_ms), "100ms", 0, 60000,
	  .help = "added to every window, against clock skew with the smarthost" },
	{ "port", &cfg_type_uint, ROUTE(mx_port), "25", 1, 65535, .active = route_is_mx,
	  .help = "the port of the MX hosts (mx = true only)" },
	{ "shared", &cfg_type_bool, ROUTE(shared), "false",
	  .help = "the lane's budget is in the Redis store, shared by the nodes" },
	{ "lanes", &cfg_type_enum, ROUTE(lanes), "domain", .names = route_lanes,
	  .help = "mx routes: a lane per domain, per set of MX hosts, or per provider" },
	{ "source", &type_source, ROUTE(source), NULL,
	  .help = "the local address connections are made from" },
	{ "rate", &type_rate, ROUTE(rate), NULL,
	  .help = "the lane's budget: windows \"COUNT/PERIOD[:BURST]\"" },
	{ "connect_timeout", &type_stage_timeout, ROUTE(timeout_ms[SMTP_STAGE_CONNECT]), NULL,
	  1000, 3600000, .help = "a connection's setup (default 30s)" },
	{ "command_timeout", &type_command_timeout, ROUTE(timeout_ms[SMTP_STAGE_GREETING]), NULL,
	  1000, 3600000, .help = "each command's reply (default 5m, 2m for some)" },
	{ "data_timeout", &type_stage_timeout, ROUTE(timeout_ms[SMTP_STAGE_DOT]), NULL,
	  1000, 3600000, .help = "the reply to the final dot (default 10m)" },
	{ .name = NULL },
};

const struct cfg_key route_auth_keys[] = {
	{ "user", &cfg_type_string, ROUTE(auth_user), NULL, .help = "the SASL user" },
	{ "password_file", &cfg_type_string, ROUTE(auth_password_file), NULL,
	  .help = "the file whose first line is the password" },
	{ "mechanisms", &cfg_type_string, ROUTE(auth_mechanisms), NULL,
	  .help = "the SASL mechanisms allowed, by preference (default: the library's)" },
	{ "plaintext", &cfg_type_bool, ROUTE(auth_plaintext), "false",
	  .help = "allow AUTH over tls = \"none\"" },
	{ .name = NULL },
};

/* ---- provider "name" { } ---- */

/* "host", "*.suffix" or "*": what an MX host name is matched against. */
static bool mx_pattern_ok(const char *s)
{
	if (!*s || strlen(s) > 253 || strpbrk(s, " \t@[]:/"))
		return false;
	/* "mx.example.net." would never match: the hosts are compared without their dot */
	if (s[strlen(s) - 1] == '.' || s[0] == '.' || strstr(s, ".."))
		return false;
	if (strchr(s, '*'))
		return strcmp(s, "*") == 0 || (s[0] == '*' && s[1] == '.' && s[2] && !strchr(s + 1, '*'));
	return true;
}

static int check_mx_patterns(const struct cfg_node *n, const void *field, char *err, size_t el)
{
	char *const *list = *(char **const *)field;
	if (!list || !list[0]) {
		cfg_error(n, err, el, "a provider needs at least one MX host pattern, "
			  "e.g. mx = [\"*.mx.example.net\"]");
		return -EINVAL;
	}
	for (char *const *p = list; *p; p++)
		if (!mx_pattern_ok(*p)) {
			cfg_error(n, err, el, "\"%.100s\": expected an MX host name, *.domain or *", *p);
			return -EINVAL;
		}
	return 0;
}

#define PROVIDER(field) offsetof(struct provider_conf, field)

const struct cfg_key provider_conf_keys[] = {
	{ "mx", &cfg_type_list, PROVIDER(mx), NULL, .flags = CFG_REQUIRED,
	  .check = check_mx_patterns,
	  .help = "the MX host names of the provider: \"host\" or \"*.domain\"" },
	{ "rate", &type_rate, PROVIDER(rate), NULL,
	  .help = "the provider lane's budget: windows \"COUNT/PERIOD[:BURST]\"" },
	{ "connections", &cfg_type_uint, PROVIDER(connections), "4", 1, 1000,
	  .help = "simultaneous connections of the provider's lane" },
	{ .name = NULL },
};

/* ---- relay { } ---- */

_Static_assert(sizeof(enum relay_uncertain) == sizeof(int), "stored by cfg_type_enum");

#define RELAY(field) offsetof(struct relay_conf, field)
#define DAY INT64_C(86400000)

static int check_host_name(const struct cfg_node *n, const void *field, char *err, size_t el)
{
	const char *s = *(char *const *)field;
	if (s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") !=
		     strlen(s)) {
		cfg_error(n, err, el, "\"%.100s\": expected a host name (letters, digits, '.', '-')", s);
		return -EINVAL;
	}
	return 0;
}

static const struct cfg_key relay_retry_keys[] = {
	{ "min", &cfg_type_duration, RELAY(retry_min_ms), "5m", 1000, DAY,
	  .help = "a recipient's first retry after a 4xx" },
	{ "max", &cfg_type_duration, RELAY(retry_max_ms), "4h", 1000, 7 * DAY,
	  .help = "the longest wait between retries" },
	{ .name = NULL },
};

static const struct cfg_key relay_suspend_keys[] = {
	{ "min", &cfg_type_duration, RELAY(suspend_min_ms), "1m", 1000, DAY,
	  .help = "a lane's first suspension without a hint" },
	{ "max", &cfg_type_duration, RELAY(suspend_max_ms), "1h", 1000, 7 * DAY,
	  .help = "the longest suspension" },
	{ .name = NULL },
};

static const struct cfg_enum uncertain[] = {
	{ "retry", RELAY_UNCERTAIN_RETRY }, { "hold", RELAY_UNCERTAIN_HOLD }, { NULL, 0 },
};

const struct cfg_key relay_conf_keys[] = {
	{ "hostname", &cfg_type_string, RELAY(hostname), NULL, .check = check_host_name,
	  .help = "EHLO and Reporting-MTA (default: the intake's, else the host's)" },
	{ "retry", &cfg_type_block, 0, .sub = relay_retry_keys, .help = "retries after a 4xx" },
	{ "suspend", &cfg_type_block, 0, .sub = relay_suspend_keys,
	  .help = "a lane's suspension" },
	{ "uncertain", &cfg_type_enum, RELAY(uncertain), "retry", .names = uncertain,
	  .help = "a message whose fate a broken connection left unknown" },
	{ "postmaster", &cfg_type_string, RELAY(postmaster), NULL,
	  .help = "where DSNs that cannot go back go" },
	{ "dns_servers", &cfg_type_string, RELAY(dns_servers), NULL,
	  .help = "ip[:port],... (default: /etc/resolv.conf)" },
	{ "idle_timeout", &cfg_type_duration, RELAY(idle_ms), "10s", 100, 3600000,
	  .help = "an idle connection is closed after this" },
	{ "dns_min_ttl", &cfg_type_duration, RELAY(dns_min_ttl_ms), "10s", 0, DAY,
	  .help = "DNS answers are used at least this long, whatever their TTL" },
	{ "dns_max_ttl", &cfg_type_duration, RELAY(dns_max_ttl_ms), "1h", 1000, 7 * DAY,
	  .help = "and at most this long" },
	{ "dns_retry_min", &cfg_type_duration, RELAY(dns_retry_min_ms), "5s", 100, DAY,
	  .help = "a failed DNS lookup is tried again after this, doubling" },
	{ "dns_retry_max", &cfg_type_duration, RELAY(dns_retry_max_ms), "5m", 100, DAY,
	  .help = "up to this" },
	{ "delay_warning", &cfg_type_duration, RELAY(delay_warning_ms), "0", 0, 365 * DAY,
	  .help = "a delay notice after this; 0: none" },
	{ .name = NULL },
};

/* ---- loading: relay { }, route "name" { }, provider "name" { } ---- */

int route_conf_defaults(struct route_conf *rc, bool mx)
{
	int r = cfg_schema_defaults(route_conf_keys, rc);
	if (r == 0)
		r = cfg_schema_defaults(route_auth_keys, rc);
	rc->connections = mx ? 4 : 2;
	return r;
}

static int signal_load(struct cfg_node *s, struct route_conf *rc, char *err, size_t el)
{
	if (s->kind != CFG_OBJECT) {
		cfg_error(s, err, el, "expected signal { match = \"regex\"; action = suspend; }");
		return -EINVAL;
	}
	struct classify_signal_conf sc = { .for_ms = 0 };
	int r = cfg_schema_defaults(route_signal_keys, &sc);
	if (r == 0)
		r = cfg_schema_load(s, route_signal_keys, &sc, err, el);
	char *match = (char *)sc.match; /* owned here until the route has it */
	if (r == 0 && sc.after > 1 && !sc.within_ms) {
		cfg_error(cfg_get(s, "after"), err, el, "after = %u needs within = DURATION, the "
			  "window in which the %u matching replies count", sc.after, sc.after);
		r = -EINVAL;
	}
	if (r == 0 && sc.within_ms && sc.after <= 1) {
		cfg_error(cfg_get(s, "within"), err, el, "within needs after = N (N > 1): how many "
			  "matching replies within it act");
		r = -EINVAL;
	}
	if (r == 0) {
		/* the pattern is checked here, so that a bad one names its line */
		char e[256];
		struct classify *cl = classify_new(&sc, 1, e, sizeof(e));
		if (!cl) {
			cfg_error(cfg_get(s, "match"), err, el, "%s", e);
			r = -EINVAL;
		}
		classify_free(cl);
	}
	if (r == 0) {
		struct classify_signal_conf *a = realloc(rc->signals, (rc->nsignals + 1) * sizeof(*a));
		if (!a) {
			r = -ENOMEM;
		} else {
			rc->signals = a;
			a[rc->nsignals++] = sc;
			match = NULL;
		}
	}
	free(match);
	return r;
}

static int route_load(struct cfg_node *n, struct route_conf *rc, bool shared_store,
		      relay_conf_secret_fn *read_secret, void *arg, char *err, size_t el)
{
	if (!n->label || !*n->label || strlen(n->label) > 200 || strpbrk(n->label, " \t:\"\\") ||
	    n->kind != CFG_OBJECT) {
		cfg_error(n, err, el, "expected route \"name\" { ... } (a name without spaces or ':')");
		return -EINVAL;
	}
	if (!(rc->name = strdup(n->label)))
		return -ENOMEM;
	if (!cfg_get(n, "domains")) {
		cfg_error(n, err, el, "domains is required: [\"*\"] for every domain");
		return -EINVAL;
	}
	int r = route_conf_defaults(rc, false);
	if (r == 0)
		r = cfg_schema_load(n, route_conf_keys, rc, err, el);
	if (r == 0 && !cfg_get(n, "connections"))
		rc->connections = rc->mx ? 4 : 2;
	if (r == 0 && !rc->ndomains) {
		cfg_error(n, err, el, "domains is required: [\"*\"] for every domain");
		r = -EINVAL;
	}
	if (r == 0 && !rc->host == !rc->mx) {
		cfg_error(n, err, el, "give either smarthost = \"[host]:port\" or mx = true");
		r = -EINVAL;
	}
	if (r == 0 && !rc->mx && (rc->tls == SMTP_TLS_DANE || rc->tls == SMTP_TLS_DANE_ONLY)) {
		cfg_error(cfg_get(n, "tls"), err, el, "tls = \"dane\" and \"dane-only\" are for "
			  "mx = true routes (a smarthost has no MX records to validate)");
		r = -EINVAL;
	}
	if (r == 0 && !rc->mx && cfg_get(n, "port")) {
		cfg_error(cfg_get(n, "port"), err, el, "port is for mx = true routes (a smarthost's "
			  "port is in smarthost = \"[host]:port\")");
		r = -EINVAL;
	}
	struct cfg_node *auth = cfg_get(n, "auth");
	if (r == 0 && auth) {
		if (auth->kind == CFG_OBJECT)
			r = cfg_schema_load(auth, route_auth_keys, rc, err, el);
		if (r == 0 && (!rc->auth_user || !rc->auth_password_file)) {
			cfg_error(auth, err, el, "auth needs user and password_file");
			r = -EINVAL;
		}
		if (r == 0 && read_secret)
			r = read_secret(arg, cfg_get(auth, "password_file"), rc->auth_password_file,
					&rc->auth_password, err, el);
		if (r == 0 && rc->tls == SMTP_TLS_NONE && !rc->auth_plaintext) {
			cfg_error(auth, err, el, "auth over tls = \"none\" sends the password in "
				  "clear: say plaintext = true if that is what you want");
			r = -EINVAL;
		}
	}
	if (r == 0 && rc->shared && rc->count == ROUTE_COUNT_RECIPIENTS) {
		cfg_error(cfg_get(n, "shared"), err, el, "a shared lane counts messages (count = "
			  "\"recipients\" is for a lane of one node)");
		r = -EINVAL;
	}
	if (r == 0 && rc->shared && !shared_store) {
		cfg_error(cfg_get(n, "shared"), err, el, "a shared lane needs store { type = "
			  "\"redis\"; }");
		r = -EINVAL;
	}
	if (r == 0 && rc->shared && !rc->rate.n) {
		cfg_error(cfg_get(n, "shared"), err, el, "a shared lane needs a rate");
		r = -EINVAL;
	}
	for (struct cfg_node *sg = cfg_get(n, "signal"); r == 0 && sg; sg = cfg_next_same(sg))
		r = signal_load(sg, rc, err, el);
	if (r == 0 && !rc->mx && rc->lanes != ROUTE_LANES_DOMAIN) {
		cfg_error(cfg_get(n, "lanes"), err, el, "lanes = \"mx\" or \"provider\" groups the "
			  "domains of an mx = true route; a smarthost route is one lane already");
		r = -EINVAL;
	}
	return r;
}

static int provider_load(struct cfg_node *n, struct provider_conf *p, char *err, size_t el)
{
	if (!n->label || !*n->label || strlen(n->label) > 100 || strpbrk(n->label, " \t:\"\\,") ||
	    n->kind != CFG_OBJECT) {
		cfg_error(n, err, el, "expected provider \"name\" { mx = [\"*.mx.example.net\"]; ... } "
			  "(a name without spaces, tabs, ',', ':', '\"' or '\\')");
		return -EINVAL;
	}
	if (!(p->name = strdup(n->label)))
		return -ENOMEM;
	int r = cfg_schema_defaults(provider_conf_keys, p);
	if (r == 0)
		r = cfg_schema_load(n, provider_conf_keys, p, err, el);
	return r;
}

static int providers_load(struct cfg_node *root, struct relay_conf *rl, char *err, size_t el)
{
	size_t count = 0;
	for (struct cfg_node *x = cfg_get(root, "provider"); x; x = cfg_next_same(x))
		count++;
	if (count > 1000) {
		cfg_error(cfg_get(root, "provider"), err, el, "more than 1000 providers");
		return -EINVAL;
	}
	if (count && !(rl->providers = calloc(count, sizeof(*rl->providers))))
		return -ENOMEM;
	int r = 0;
	for (struct cfg_node *x = cfg_get(root, "provider"); r == 0 && x; x = cfg_next_same(x)) {
		struct provider_conf *p = &rl->providers[rl->nproviders++];
		r = provider_load(x, p, err, el);
		for (size_t i = 0; r == 0 && i + 1 < rl->nproviders; i++)
			if (strcmp(rl->providers[i].name, p->name) == 0) {
				cfg_error(x, err, el, "a second provider named \"%s\"", p->name);
				r = -EINVAL;
			}
	}
	bool used = false;
	struct cfg_node *user = cfg_get(root, "route"); /* the first route that uses them */
	for (size_t i = 0; i < rl->nroutes && !used; i++) {
		used = rl->routes[i].lanes == ROUTE_LANES_PROVIDER;
		if (!used)
			user = cfg_next_same(user);
	}
	if (r == 0 && count && !used) {
		cfg_error(cfg_get(root, "provider"), err, el, "provider blocks are used by mx routes "
			  "with lanes = \"provider\", and no route has it");
		r = -EINVAL;
	}
	/* one lane and one budget per provider: a second route would make a second lane of
	 * it (with its own connections, TLS and source), each with the provider's whole rate */
	size_t nusers = 0;
	struct cfg_node *rn = cfg_get(root, "route");
	for (size_t i = 0; r == 0 && i < rl->nroutes; i++, rn = rn ? cfg_next_same(rn) : NULL)
		if (rl->routes[i].lanes == ROUTE_LANES_PROVIDER && ++nusers == 2) {
			cfg_error(rn ? cfg_get(rn, "lanes") : NULL, err, el, "lanes = \"provider\" on "
				  "a second route: a provider's budget is one lane's, and one route's");
			r = -EINVAL;
		}
	if (r == 0 && used && !count) {
		cfg_error(cfg_get(user, "lanes"), err, el, "lanes = \"provider\" needs provider "
			  "\"name\" { mx = [...]; } blocks");
		r = -EINVAL;
	}
	return r;
}

int relay_conf_load(struct cfg_node *root, struct relay_conf *rl, bool shared_store,
		    relay_conf_secret_fn *read_secret, void *arg, char *err, size_t el)
{
	struct cfg_node *n = cfg_get(root, "relay");
	int r = cfg_schema_defaults(relay_conf_keys, rl);
	if (r == 0 && n) {
		r = cfg_schema_load(n, relay_conf_keys, rl, err, el);
		if (r == 0 && rl->retry_max_ms < rl->retry_min_ms) {
			cfg_error(cfg_get(n, "retry"), err, el, "max is below min");
			r = -EINVAL;
		}
		if (r == 0 && rl->suspend_max_ms < rl->suspend_min_ms) {
			cfg_error(cfg_get(n, "suspend"), err, el, "max is below min");
			r = -EINVAL;
		}
		if (r == 0 && rl->dns_max_ttl_ms < rl->dns_min_ttl_ms) {
			cfg_error(cfg_get(n, "dns_max_ttl"), err, el, "below dns_min_ttl");
			r = -EINVAL;
		}
		if (r == 0 && rl->dns_retry_max_ms < rl->dns_retry_min_ms) {
			cfg_error(cfg_get(n, "dns_retry_max"), err, el, "below dns_retry_min");
			r = -EINVAL;
		}
	}
	size_t count = 0;
	for (struct cfg_node *x = cfg_get(root, "route"); x; x = cfg_next_same(x))
		count++;
	if (r == 0 && count > 1000) {
		cfg_error(cfg_get(root, "route"), err, el, "more than 1000 routes");
		r = -EINVAL;
	}
	if (r == 0 && count && !(rl->routes = calloc(count, sizeof(*rl->routes))))
		r = -ENOMEM;
	for (struct cfg_node *x = cfg_get(root, "route"); r == 0 && x; x = cfg_next_same(x)) {
		struct route_conf *rc = &rl->routes[rl->nroutes++];
		r = route_load(x, rc, shared_store, read_secret, arg, err, el);
		for (size_t i = 0; r == 0 && i + 1 < rl->nroutes; i++)
			if (strcmp(rl->routes[i].name, rc->name) == 0) {
				cfg_error(x, err, el, "a second route named \"%s\"", rc->name);
				r = -EINVAL;
			}
	}
	if (r == 0)
		r = providers_load(root, rl, err, el);
	return r;
}

void provider_conf_clear(struct provider_conf *p)
{
	free(p->name);
	for (char **m = p->mx; m && *m; m++)
		free(*m);
	free(p->mx);
	memset(p, 0, sizeof(*p));
}

void relay_conf_init(struct relay_conf *c)
{
	memset(c, 0, sizeof(*c));
	/* the table's defaults allocate nothing (no string has one): this cannot fail */
	if (cfg_schema_defaults(relay_conf_keys, c) < 0)
		abort();
	c->lifetime_ms = INT64_C(5) * 86400 * 1000; /* queue.lifetime's default */
}

void route_conf_clear(struct route_conf *r)
{
	free(r->name);
	for (size_t i = 0; i < r->ndomains; i++)
		free(r->domains[i]);
	free(r->domains);
	free(r->host);
	free(r->helo);
	free(r->ca_file);
	free(r->sni);
	free(r->auth_user);
	free(r->auth_password_file);
	if (r->auth_password) {
		explicit_bzero(r->auth_password, strlen(r->auth_password));
		free(r->auth_password);
	}
	free(r->auth_mechanisms);
	for (size_t i = 0; i < r->nsignals; i++)
		free((char *)r->signals[i].match);
	free(r->signals);
	memset(r, 0, sizeof(*r));
}

void relay_conf_clear(struct relay_conf *c)
{
	for (size_t i = 0; i < c->nroutes; i++)
		route_conf_clear(&c->routes[i]);
	free(c->routes);
	for (size_t i = 0; i < c->nproviders; i++)
		provider_conf_clear(&c->providers[i]);
	free(c->providers);
	free(c->hostname);
	free(c->postmaster);
	free(c->dns_servers);
	free(c->state_dir);
	memset(c, 0, sizeof(*c));
}

static int dup_str(const char *s, char **ret)
{
	*ret = NULL;
	if (!s)
		return 0;
	return (*ret = strdup(s)) ? 0 : -ENOMEM;
}

static int route_copy(const struct route_conf *s, struct route_conf *d)
{
	*d = *s;
	d->name = d->host = d->helo = d->ca_file = d->sni = NULL;
	d->auth_user = d->auth_password = d->auth_mechanisms = d->auth_password_file = NULL;
	d->domains = NULL;
	d->ndomains = 0;
	d->signals = NULL;
	d->nsignals = 0;
	int r = 0;
	r = r ? r : dup_str(s->name, &d->name);
	r = r ? r : dup_str(s->host, &d->host);
	r = r ? r : dup_str(s->helo, &d->helo);
	r = r ? r : dup_str(s->ca_file, &d->ca_file);
	r = r ? r : dup_str(s->sni, &d->sni);
	r = r ? r : dup_str(s->auth_user, &d->auth_user);
	r = r ? r : dup_str(s->auth_password, &d->auth_password);
	r = r ? r : dup_str(s->auth_password_file, &d->auth_password_file);
	r = r ? r : dup_str(s->auth_mechanisms, &d->auth_mechanisms);
	if (r == 0 && s->ndomains) {
		d->domains = calloc(s->ndomains + 1, sizeof(*d->domains)); /* NULL-terminated */
		if (!d->domains)
			r = -ENOMEM;
		for (size_t i = 0; r == 0 && i < s->ndomains; i++, d->ndomains++)
			r = dup_str(s->domains[i], &d->domains[i]);
	}
	if (r == 0 && s->nsignals) {
		d->signals = calloc(s->nsignals, sizeof(*d->signals));
		if (!d->signals)
			r = -ENOMEM;
		for (size_t i = 0; r == 0 && i < s->nsignals; i++, d->nsignals++) {
			d->signals[i] = s->signals[i];
			char *m;
			r = dup_str(s->signals[i].match, &m);
			d->signals[i].match = m;
		}
	}
	if (r < 0)
		route_conf_clear(d);
	return r;
}

static int provider_copy(const struct provider_conf *s, struct provider_conf *d)
{
	*d = *s;
	d->name = NULL;
	d->mx = NULL;
	size_t n = 0;
	while (s->mx && s->mx[n])
		n++;
	int r = dup_str(s->name, &d->name);
	if (r == 0 && !(d->mx = calloc(n + 1, sizeof(*d->mx))))
		r = -ENOMEM;
	for (size_t i = 0; r == 0 && i < n; i++)
		r = dup_str(s->mx[i], &d->mx[i]);
	if (r < 0)
		provider_conf_clear(d);
	return r;
}

int relay_conf_copy(const struct relay_conf *src, struct relay_conf *ret)
{
	struct relay_conf c = *src;
	c.routes = NULL;
	c.nroutes = 0;
	c.providers = NULL;
	c.nproviders = 0;
	c.hostname = c.postmaster = c.dns_servers = c.state_dir = NULL;
	int r = 0;
	r = r ? r : dup_str(src->hostname, &c.hostname);
	r = r ? r : dup_str(src->postmaster, &c.postmaster);
	r = r ? r : dup_str(src->dns_servers, &c.dns_servers);
	r = r ? r : dup_str(src->state_dir, &c.state_dir);
	if (r == 0 && src->nroutes) {
		c.routes = calloc(src->nroutes, sizeof(*c.routes));
		if (!c.routes)
			r = -ENOMEM;
		for (size_t i = 0; r == 0 && i < src->nroutes; i++) {
			r = route_copy(&src->routes[i], &c.routes[i]);
			if (r == 0)
				c.nroutes++;
		}
	}
	if (r == 0 && src->nproviders) {
		c.providers = calloc(src->nproviders, sizeof(*c.providers));
		if (!c.providers)
			r = -ENOMEM;
		for (size_t i = 0; r == 0 && i < src->nproviders; i++) {
			r = provider_copy(&src->providers[i], &c.providers[i]);
			if (r == 0)
				c.nproviders++;
		}
	}
	if (r < 0) {
		relay_conf_clear(&c);
		return r;
	}
	*ret = c;
	return 0;
}

/* "*" matches all; "*.example.com" the subdomains of example.com; else the exact name
 * (ASCII case-insensitive). */
static bool domain_match(const char *pat, const char *dom)
{
	if (strcmp(pat, "*") == 0)
		return true;
	if (pat[0] == '*' && pat[1] == '.') {
		size_t pl = strlen(pat + 1), dl = strlen(dom);
		return dl > pl && strcasecmp(dom + dl - pl, pat + 1) == 0;
	}
	return strcasecmp(pat, dom) == 0;
}

const struct route_conf *relay_conf_route(const struct relay_conf *c, const char *domain)
{
	for (size_t i = 0; i < c->nroutes; i++)
		for (size_t j = 0; j < c->routes[i].ndomains; j++)
			if (domain_match(c->routes[i].domains[j], domain))
				return &c->routes[i];
	return NULL;
}

const struct provider_conf *relay_conf_provider(const struct relay_conf *c, const char *host)
{
	char h[256];
	size_t n = strlen(host);
	if (n && host[n - 1] == '.')
		n--;
	if (n >= sizeof(h))
		return NULL;
	memcpy(h, host, n);
	h[n] = '\0';
	for (size_t i = 0; i < c->nproviders; i++)
		for (char **p = c->providers[i].mx; p && *p; p++)
			if (domain_match(*p, h))
				return &c->providers[i];
	return NULL;
}
