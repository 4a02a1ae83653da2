/*
 * relay_conf -- the relay's configuration as the daemon loaded it (relay.h): defaults,
 * a deep copy for the relay's thread, and the route of a recipient domain.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cfg_schema.h"
#include "relay.h"
#include "threshold.h"

/* ---- the keys of route "name" { } that are plain values ---- */

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

const struct cfg_key route_signal_keys[] = {
	{ "match", &cfg_type_string, SIGNAL(match), NULL, .flags = CFG_REQUIRED,
	  .help = "a regular expression over the relay's reply" },
	{ "action", &cfg_type_enum, SIGNAL(action), "suspend", .names = signal_actions,
	  .help = "what a matching reply does to the lane or the recipient" },
	{ "for", &cfg_type_duration, SIGNAL(for_ms), NULL, 1000, INT64_C(30) * 86400 * 1000,
	  .help = "the suspension or slow-down (default: the lane's backoff)" },
	{ "after", &cfg_type_uint, SIGNAL(after), "1", 1, THRESHOLD_AFTER_MAX,
	  .help = "act on this many matching replies within `within` (per lane)" },
	{ "within", &cfg_type_duration, SIGNAL(within_ms), NULL, 1000, INT64_C(30) * 86400 * 1000,
	  .help = "the window in which `after` matching replies act (required with after)" },
	{ .name = NULL },
};

#define ROUTE(field) offsetof(struct route_conf, field)

const struct cfg_key route_conf_keys[] = {
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
	{ "port", &cfg_type_uint, ROUTE(mx_port), "25", 1, 65535,
	  .help = "the port of the MX hosts (mx = true only)" },
	{ "shared", &cfg_type_bool, ROUTE(shared), "false",
	  .help = "the lane's budget is in the Redis store, shared by the nodes" },
	{ "lanes", &cfg_type_enum, ROUTE(lanes), "domain", .names = route_lanes,
	  .help = "mx routes: a lane per domain, per set of MX hosts, or per provider" },
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
	c->retry_min_ms = 5 * 60 * 1000;
	c->retry_max_ms = 4 * 3600 * 1000;
	c->suspend_min_ms = 60 * 1000;
	c->suspend_max_ms = 3600 * 1000;
	c->uncertain = RELAY_UNCERTAIN_RETRY;
	c->lifetime_ms = INT64_C(5) * 86400 * 1000;
	c->idle_ms = 10 * 1000;
	c->dns_min_ttl_ms = 10 * 1000;
	c->dns_max_ttl_ms = 3600 * 1000;
	c->dns_retry_min_ms = 5 * 1000;
	c->dns_retry_max_ms = 5 * 60 * 1000;
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
	d->auth_user = d->auth_password = d->auth_mechanisms = NULL;
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
	r = r ? r : dup_str(s->auth_mechanisms, &d->auth_mechanisms);
	if (r == 0 && s->ndomains) {
		d->domains = calloc(s->ndomains, sizeof(*d->domains));
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
