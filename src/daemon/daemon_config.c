/*
 * daemon_config -- daemon_config_load(): sluice.conf beyond src/conf (see
 * daemon_config.h, sluice.conf(5)).
 *
 * src/conf reads its blocks' tables; this file reads what needs the modules above it
 * -- the milter's fixed answers, the rules (policy_load), the relay's routes and their
 * signals -- and the checks that span those.  Then anything left unread in the
 * file is reported as an unknown key with its line (cfg_check_unused), so a typo never
 * silently falls back to a default.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "cfg.h"
#include "cfg_schema.h"
#include "config.h"
#include "config_core.h"
#include "config_schema.h"
#include "daemon_config.h"
#include "listen.h"
#include "util.h"

#define ERR(...) cfg_error(__VA_ARGS__)



static int get_duration(struct cfg_node *obj, const char *key, int64_t min, int64_t max,
			int64_t *ret, char *err, size_t el)
{
	struct cfg_node *n;
	int r = config_get_one(obj, key, &n, err, el);
	if (r < 0 || !n)
		return r;
	return cfg_duration_ms(n, min, max, ret, err, el);
}

/* milter { reply { } modify { } }: the fixed answers for testing an MTA's integration. */
static int load_milter_handler(struct cfg_node *m, struct daemon_config *dc, char *err, size_t el)
{
	struct milter_static_conf *h = &dc->milter_handler;
	int r = 0;
	struct cfg_node *reply = cfg_get(m, "reply");
	if (reply) {
		if (reply->kind != CFG_OBJECT) {
			ERR(reply, err, el, "expected a block { step = action; ... }");
			return -EINVAL;
		}
		r = cfg_schema_load(reply, milter_static_reply_keys, h, err, el);
		if (r == 0)
			r = cfg_check_unused(reply, err, el);
	}
	struct cfg_node *mod = cfg_get(m, "modify");
	if (r == 0 && mod) {
		if (mod->kind != CFG_OBJECT) {
			ERR(mod, err, el, "expected a block");
			return -EINVAL;
		}
		r = cfg_schema_load(mod, milter_static_modify_keys, h, err, el);
	}
	return r;
}

/* ---- the relay: relay {} and route "name" {} ---- */

static int get_bool(struct cfg_node *obj, const char *key, bool *ret, char *err, size_t el)
{
	struct cfg_node *n;
	int r = config_get_one(obj, key, &n, err, el);
	if (r < 0 || !n)
		return r;
	return cfg_bool(n, ret, err, el);
}

/* key = "a"; or key = ["a", "b"] (given once); each item passed to fn (cfg_list_each). */
static int each_string(struct cfg_node *obj, const char *key,
		       int (*fn)(void *arg, const struct cfg_node *item, const char *s, char *err,
				 size_t el),
		       void *arg, char *err, size_t el)
{
	struct cfg_node *n;
	int r = config_get_one(obj, key, &n, err, el);
	if (r < 0 || !n)
		return r;
	return cfg_list_each(n, fn, arg, err, el);
}

static int add_domain(void *arg, const struct cfg_node *it, const char *s, char *err, size_t el)
{
	struct route_conf *rc = arg;
	bool ok = *s && strlen(s) < 256 && !strpbrk(s, " \t@[]");
	if (ok && strchr(s, '*'))
		ok = strcmp(s, "*") == 0 || (s[0] == '*' && s[1] == '.' && s[2] && !strchr(s + 1, '*'));
	if (!ok) {
		ERR(it, err, el, "\"%.100s\": expected a domain, *.domain or *", s);
		return -EINVAL;
	}
	char **d = realloc(rc->domains, (rc->ndomains + 1) * sizeof(*d));
	if (!d)
		return -ENOMEM;
	rc->domains = d;
	if (!(d[rc->ndomains] = strdup(s)))
		return -ENOMEM;
	rc->ndomains++;
	return 0;
}

static int add_window(void *arg, const struct cfg_node *it, const char *s, char *err, size_t el)
{
	struct rate_limits *rl = arg;
	if (rl->n == RATE_MAX_WINDOWS) {
		ERR(it, err, el, "more than %d windows", RATE_MAX_WINDOWS);
		return -EINVAL;
	}
	char e[200];
	struct rate_window w;
	if (rate_window_parse(str_cstr(s), &w, e, sizeof(e)) < 0) {
		ERR(it, err, el, "%s", e);
		return -EINVAL;
	}
	if (w.count > 10000000) {
		ERR(it, err, el, "\"%.100s\": a lane counts at most 10000000 sends per window", s);
		return -EINVAL;
	}
	rl->w[rl->n++] = w;
	return 0;
}

/* "[host]:port", "host:port", "host", "[v6]:port" */
static int parse_smarthost(struct cfg_node *n, const char *s, struct route_conf *rc, char *err,
			   size_t el)
{
	const char *host = s, *port = NULL;
	size_t hl;
	if (s[0] == '[') {
		const char *end = strchr(s, ']');
		if (!end || (end[1] && end[1] != ':')) {
			ERR(n, err, el, "\"%.100s\": expected [host]:port", s);
			return -EINVAL;
		}
		host = s + 1;
		hl = (size_t)(end - host);
		port = end[1] == ':' ? end + 2 : NULL;
	} else {
		const char *colon = strrchr(s, ':');
		if (colon && strchr(s, ':') != colon) {
			ERR(n, err, el, "\"%.100s\": write an IPv6 address in brackets, [::1]:25", s);
			return -EINVAL;
		}
		hl = colon ? (size_t)(colon - s) : strlen(s);
		port = colon ? colon + 1 : NULL;
	}
	if (hl == 0 || hl > 253) {
		ERR(n, err, el, "\"%.100s\": no host name", s);
		return -EINVAL;
	}
	rc->port = 25;
	if (port) {
		char *end;
		unsigned long v = strtoul(port, &end, 10);
		if (!*port || *end || v == 0 || v > 65535) {
			ERR(n, err, el, "\"%.100s\": bad port", s);
			return -EINVAL;
		}
		rc->port = (uint16_t)v;
	}
	if (!(rc->host = strndup(host, hl)))
		return -ENOMEM;
	return 0;
}

static int load_signal(struct cfg_node *s, struct route_conf *rc, char *err, size_t el)
{
	if (s->kind != CFG_OBJECT) {
		ERR(s, err, el, "expected signal { match = \"regex\"; action = suspend; }");
		return -EINVAL;
	}
	struct classify_signal_conf sc = { .for_ms = 0 };
	int r = cfg_schema_defaults(route_signal_keys, &sc);
	if (r == 0)
		r = cfg_schema_load(s, route_signal_keys, &sc, err, el);
	char *match = (char *)sc.match; /* owned here until the route has it */
	if (r == 0 && sc.after > 1 && !sc.within_ms) {
		ERR(cfg_get(s, "after"), err, el, "after = %u needs within = DURATION, the window "
		    "in which the %u matching replies count", sc.after, sc.after);
		r = -EINVAL;
	}
	if (r == 0 && sc.within_ms && sc.after <= 1) {
		ERR(cfg_get(s, "within"), err, el, "within needs after = N (N > 1): how many "
		    "matching replies within it act");
		r = -EINVAL;
	}
	if (r == 0) {
		/* the pattern is checked here, so that a bad one names its line */
		char e[256];
		struct classify *cl = classify_new(&sc, 1, e, sizeof(e));
		if (!cl) {
			ERR(cfg_get(s, "match"), err, el, "%s", e);
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

static int load_route(struct cfg_node *n, struct route_conf *rc, const struct sluice_config *c,
		      bool shared_store, char *err, size_t el)
{
	if (!n->label || !*n->label || strlen(n->label) > 200 || strpbrk(n->label, " \t:\"\\") ||
	    n->kind != CFG_OBJECT) {
		ERR(n, err, el, "expected route \"name\" { ... } (a name without spaces or ':')");
		return -EINVAL;
	}
	if (!(rc->name = strdup(n->label)))
		return -ENOMEM;
	int r = cfg_schema_defaults(route_conf_keys, rc);
	if (r == 0)
		r = each_string(n, "domains", add_domain, rc, err, el);
	if (r == 0 && !rc->ndomains) {
		ERR(n, err, el, "domains is required: [\"*\"] for every domain");
		r = -EINVAL;
	}
	struct cfg_node *sh = NULL;
	if (r == 0)
		r = config_get_one(n, "smarthost", &sh, err, el);
	if (r == 0)
		r = get_bool(n, "mx", &rc->mx, err, el);
	if (r == 0 && !sh == !rc->mx) {
		ERR(n, err, el, "give either smarthost = \"[host]:port\" or mx = true");
		r = -EINVAL;
	}
	if (r == 0 && sh) {
		const char *s;
		r = cfg_string(sh, &s, err, el);
		if (r == 0)
			r = parse_smarthost(sh, s, rc, err, el);
	}
	rc->connections = rc->mx ? 4 : 2;
	if (r == 0)
		r = cfg_schema_load(n, route_conf_keys, rc, err, el);
	if (r == 0 && !rc->mx && (rc->tls == SMTP_TLS_DANE || rc->tls == SMTP_TLS_DANE_ONLY)) {
		ERR(cfg_get(n, "tls"), err, el, "tls = \"dane\" and \"dane-only\" are for mx = true "
		    "routes (a smarthost has no MX records to validate)");
		r = -EINVAL;
	}
	if (r == 0 && !rc->mx && cfg_get(n, "port")) {
		ERR(cfg_get(n, "port"), err, el, "port is for mx = true routes (a smarthost's port "
		    "is in smarthost = \"[host]:port\")");
		r = -EINVAL;
	}
	struct cfg_node *auth = cfg_get(n, "auth");
	if (r == 0 && auth) {
		char *file = NULL;
		r = config_get_string(auth, "user", &rc->auth_user, err, el);
		if (r == 0)
			r = config_get_string(auth, "password_file", &file, err, el);
		if (r == 0 && (!rc->auth_user || !file)) {
			ERR(auth, err, el, "auth needs user and password_file");
			r = -EINVAL;
		}
		if (r == 0)
			r = config_read_secret(cfg_get(auth, "password_file"), file, c, &rc->auth_password, err, el);
		free(file);
		if (r == 0)
			r = config_get_string(auth, "mechanisms", &rc->auth_mechanisms, err, el);
		if (r == 0)
			r = get_bool(auth, "plaintext", &rc->auth_plaintext, err, el);
		if (r == 0 && rc->tls == SMTP_TLS_NONE && !rc->auth_plaintext) {
			ERR(auth, err, el, "auth over tls = \"none\" sends the password in clear: "
			    "say plaintext = true if that is what you want");
			r = -EINVAL;
		}
	}
	char *s = NULL;
	if (r == 0)
		r = config_get_string(n, "source", &s, err, el);
	if (r == 0 && s) {
		struct sockaddr_in *v4 = (struct sockaddr_in *)&rc->source;
		struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&rc->source;
		if (inet_pton(AF_INET, s, &v4->sin_addr) == 1) {
			v4->sin_family = AF_INET;
			rc->sourcelen = sizeof(*v4);
		} else if (inet_pton(AF_INET6, s, &v6->sin6_addr) == 1) {
			v6->sin6_family = AF_INET6;
			rc->sourcelen = sizeof(*v6);
		} else {
			ERR(cfg_get(n, "source"), err, el, "\"%.100s\": expected an IP address", s);
			r = -EINVAL;
		}
	}
	free(s);
	s = NULL;
	if (r == 0)
		r = each_string(n, "rate", add_window, &rc->rate, err, el);
	if (r == 0 && rc->shared && rc->count == ROUTE_COUNT_RECIPIENTS) {
		ERR(cfg_get(n, "shared"), err, el, "a shared lane counts messages (count = "
		    "\"recipients\" is for a lane of one node)");
		r = -EINVAL;
	}
	if (r == 0 && rc->shared && !shared_store) {
		ERR(cfg_get(n, "shared"), err, el, "a shared lane needs store { type = \"redis\"; }");
		r = -EINVAL;
	}
	if (r == 0 && rc->shared && !rc->rate.n) {
		ERR(cfg_get(n, "shared"), err, el, "a shared lane needs a rate");
		r = -EINVAL;
	}
	int64_t t = 0;
	if (r == 0 && (r = get_duration(n, "connect_timeout", 1000, 3600000, &t, err, el)) == 0 && t)
		rc->timeout_ms[SMTP_STAGE_CONNECT] = (uint64_t)t;
	t = 0;
	if (r == 0 && (r = get_duration(n, "command_timeout", 1000, 3600000, &t, err, el)) == 0 && t)
		for (unsigned i = SMTP_STAGE_GREETING; i < SMTP_STAGE_COUNT; i++)
			if (i != SMTP_STAGE_DOT)
				rc->timeout_ms[i] = (uint64_t)t;
	t = 0;
	if (r == 0 && (r = get_duration(n, "data_timeout", 1000, 3600000, &t, err, el)) == 0 && t)
		rc->timeout_ms[SMTP_STAGE_DOT] = (uint64_t)t;
	for (struct cfg_node *sg = cfg_get(n, "signal"); r == 0 && sg; sg = cfg_next_same(sg))
		r = load_signal(sg, rc, err, el);
	if (r == 0 && !rc->mx && rc->lanes != ROUTE_LANES_DOMAIN) {
		ERR(cfg_get(n, "lanes"), err, el, "lanes = \"mx\" or \"provider\" groups the "
		    "domains of an mx = true route; a smarthost route is one lane already");
		r = -EINVAL;
	}
	return r;
}

/* provider "name" { mx = [...]; rate = [...]; connections = N; } */
static int load_provider(struct cfg_node *n, struct provider_conf *p, char *err, size_t el)
{
	if (!n->label || !*n->label || strlen(n->label) > 100 || strpbrk(n->label, " \t:\"\\,") ||
	    n->kind != CFG_OBJECT) {
		ERR(n, err, el, "expected provider \"name\" { mx = [\"*.mx.example.net\"]; ... } "
		    "(a name without spaces, tabs, ',', ':', '\"' or '\\')");
		return -EINVAL;
	}
	if (!(p->name = strdup(n->label)))
		return -ENOMEM;
	int r = cfg_schema_defaults(provider_conf_keys, p);
	if (r == 0)
		r = cfg_schema_load(n, provider_conf_keys, p, err, el);
	if (r == 0)
		r = each_string(n, "rate", add_window, &p->rate, err, el);
	return r;
}

static int load_providers(struct cfg_node *root, struct relay_conf *rl, char *err, size_t el)
{
	size_t count = 0;
	for (struct cfg_node *x = cfg_get(root, "provider"); x; x = cfg_next_same(x))
		count++;
	if (count > 1000) {
		ERR(cfg_get(root, "provider"), err, el, "more than 1000 providers");
		return -EINVAL;
	}
	if (count && !(rl->providers = calloc(count, sizeof(*rl->providers))))
		return -ENOMEM;
	int r = 0;
	for (struct cfg_node *x = cfg_get(root, "provider"); r == 0 && x; x = cfg_next_same(x)) {
		struct provider_conf *p = &rl->providers[rl->nproviders++];
		r = load_provider(x, p, err, el);
		for (size_t i = 0; r == 0 && i + 1 < rl->nproviders; i++)
			if (strcmp(rl->providers[i].name, p->name) == 0) {
				ERR(x, err, el, "a second provider named \"%s\"", p->name);
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
		ERR(cfg_get(root, "provider"), err, el, "provider blocks are used by mx routes with "
		    "lanes = \"provider\", and no route has it");
		r = -EINVAL;
	}
	/* one lane and one budget per provider: a second route would make a second lane of
	 * it (with its own connections, TLS and source), each with the provider's whole rate */
	size_t nusers = 0;
	struct cfg_node *rn = cfg_get(root, "route");
	for (size_t i = 0; r == 0 && i < rl->nroutes; i++, rn = rn ? cfg_next_same(rn) : NULL)
		if (rl->routes[i].lanes == ROUTE_LANES_PROVIDER && ++nusers == 2) {
			ERR(rn ? cfg_get(rn, "lanes") : NULL, err, el, "lanes = \"provider\" on a "
			    "second route: a provider's budget is one lane's, and one route's");
			r = -EINVAL;
		}
	if (r == 0 && used && !count) {
		ERR(cfg_get(user, "lanes"), err, el, "lanes = \"provider\" needs provider \"name\" "
		    "{ mx = [...]; } blocks");
		r = -EINVAL;
	}
	return r;
}

static int load_relay(struct cfg_node *root, struct daemon_config *dc, char *err, size_t el)
{
	const struct sluice_config *c = &dc->conf;
	struct relay_conf *rl = &dc->relay;
	struct cfg_node *n = cfg_get(root, "relay");
	int r = 0;
	if (n) {
		dc->has_relay = true;
		r = cfg_schema_load(n, relay_conf_keys, rl, err, el);
		if (r == 0 && rl->retry_max_ms < rl->retry_min_ms) {
			ERR(cfg_get(n, "retry"), err, el, "max is below min");
			r = -EINVAL;
		}
		if (r == 0 && rl->suspend_max_ms < rl->suspend_min_ms) {
			ERR(cfg_get(n, "suspend"), err, el, "max is below min");
			r = -EINVAL;
		}
		if (r == 0 && rl->dns_max_ttl_ms < rl->dns_min_ttl_ms) {
			ERR(cfg_get(n, "dns_max_ttl"), err, el, "below dns_min_ttl");
			r = -EINVAL;
		}
		if (r == 0 && rl->dns_retry_max_ms < rl->dns_retry_min_ms) {
			ERR(cfg_get(n, "dns_retry_max"), err, el, "below dns_retry_min");
			r = -EINVAL;
		}
	}
	size_t count = 0;
	for (struct cfg_node *x = cfg_get(root, "route"); x; x = cfg_next_same(x))
		count++;
	if (r == 0 && count > 1000) {
		ERR(cfg_get(root, "route"), err, el, "more than 1000 routes");
		r = -EINVAL;
	}
	if (r == 0 && count && !(rl->routes = calloc(count, sizeof(*rl->routes))))
		r = -ENOMEM;
	for (struct cfg_node *x = cfg_get(root, "route"); r == 0 && x; x = cfg_next_same(x)) {
		struct route_conf *rc = &rl->routes[rl->nroutes++];
		r = load_route(x, rc, c, c->store.redis, err, el);
		for (size_t i = 0; r == 0 && i + 1 < rl->nroutes; i++)
			if (strcmp(rl->routes[i].name, rc->name) == 0) {
				ERR(x, err, el, "a second route named \"%s\"", rc->name);
				r = -EINVAL;
			}
	}
	if (r == 0)
		r = load_providers(root, rl, err, el);
	if (r == 0 && rl->nroutes && !c->intake.enabled && !cfg_get(root, "queue")) {
		ERR(cfg_get(root, "route"), err, el, "routes deliver from the queue: give an "
		    "intake { } or a queue { } block");
		r = -EINVAL;
	}
	if (r == 0 && !rl->hostname) {
		/* the intake's name, when it is one DNS can hold; else the machine's */
		const char *h = c->intake.hostname;
		char host[256] = "localhost";
		if (!h || strspn(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
				 "0123456789.-_") != strlen(h)) {
			if (gethostname(host, sizeof(host) - 1) < 0 || !host[0] ||
			    strspn(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
				   "0123456789.-_") != strlen(host))
				snprintf(host, sizeof(host), "localhost");
			h = host;
		}
		rl->hostname = strdup(h);
		dc->relay_hostname_derived = true;
	}
	if (r == 0 && !rl->hostname)
		r = -ENOMEM;
	if (r == 0) {
		rl->lifetime_ms = c->queue.lifetime_ms;
		if (c->state_dir && !(rl->state_dir = strdup(c->state_dir)))
			r = -ENOMEM;
	}
	return r;
}

/* A tarpit's delay must end before the milter's own command timeout, which would close
 * the session first (no reply at all).  The rules are loaded and checked already. */
static int check_delays(struct cfg_node *root, int64_t timeout_ms, char *err, size_t el)
{
	for (struct cfg_node *n = cfg_get(root, "limit"); n; n = cfg_next_same(n)) {
		struct cfg_node *d = cfg_get(n, "delay");
		int64_t ms;
		if (!d || cfg_duration_ms(d, 1, 300000, &ms, err, el) < 0 || ms < timeout_ms)
			continue;
		char a[32], b[32];
		fmt_duration(a, sizeof(a), (uint64_t)ms, DURATION_UP);
		fmt_duration(b, sizeof(b), (uint64_t)timeout_ms, DURATION_UP);
		cfg_error(d, err, el, "a delay of %s is not below milter.command_timeout (%s): "
			  "sluiced would close the session before it answers (and the MTA's own "
			  "milter timeout, 30s in Postfix, is shorter still)", a, b);
		return -EINVAL;
	}
	return 0;
}

/* What the daemon reads beyond config_core_load(): the rules, the relay and the routes. */
static int load_daemon(struct cfg_node *root, struct daemon_config *dc, char *err, size_t el)
{
	const struct sluice_config *c = &dc->conf;
	struct cfg_node *milter = cfg_get(root, "milter");
	int r = 0;
	if (milter) {
		dc->milter_static = cfg_get(milter, "reply") || cfg_get(milter, "modify");
		r = load_milter_handler(milter, dc, err, el);
	}
	if (r == 0)
		r = policy_load(root, &dc->rules, err, el);
	if (r == 0 && milter)
		r = check_delays(root, c->milter.command_timeout_ms, err, el);
	if (r == 0)
		r = load_relay(root, dc, err, el);
	if (r == 0 && policy_has_classes(dc->rules) && !milter && !cfg_get(root, "route")) {
		cfg_error(cfg_get(root, "class"), err, el, "host classes need the milter (the "
			  "policy protocol has no end of session to give a slot back) or a route "
			  "(outgoing sessions take slots too)");
		r = -EINVAL;
	}
	if (r == 0 && dc->milter_static && policy_rule_count(dc->rules) +
	    (policy_has_classes(dc->rules) ? 1 : 0) > 0) {
		cfg_error(cfg_get(milter, "reply") ? cfg_get(milter, "reply") : cfg_get(milter, "modify"),
			  err, el, "milter reply {} and modify {} are fixed answers for testing an "
			  "MTA's integration; they cannot be combined with limit or class rules");
		r = -EINVAL;
	}
	if (r == 0)
		r = cfg_check_unused(root, err, el);
	return r;
}

struct sluice_config *daemon_config_free(struct sluice_config *c)
{
	if (!c)
		return NULL;
	struct daemon_config *dc = daemon_config_of(c);
	milter_static_conf_clear(&dc->milter_handler);
	relay_conf_clear(&dc->relay);
	policy_unref(dc->rules);
	config_clear(&dc->conf);
	free(dc);
	return NULL;
}

int daemon_config_load(const char *path, struct sluice_config **ret, char *err, size_t errlen)
{
	struct cfg_node *root = NULL;
	struct daemon_config *dc = calloc(1, sizeof(*dc));
	if (!dc)
		return -ENOMEM;
	int r = config_core_load(path, false, &root, &dc->conf, err, errlen);
	if (r < 0) {
		free(dc);
		return r;
	}
	r = cfg_schema_defaults(relay_conf_keys, &dc->relay);
	if (r == 0)
		r = load_daemon(root, dc, err, errlen);
	cfg_free(root);
	if (r < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
		daemon_config_free(&dc->conf);
		return r;
	}
	*ret = &dc->conf;
	return 0;
}

void daemon_config_print(FILE *f, const struct sluice_config *c, bool all)
{
	const struct daemon_config *dc = daemon_config_of(c);
	config_print(f, c, all);
	struct relay_conf d = { .hostname = NULL };
	if (cfg_schema_defaults(relay_conf_keys, &d) < 0) {
		fprintf(stderr, "sluiced: out of memory\n");
		return;
	}
	/* a value sluiced finds when none is given is its default (for -n) */
	if (dc->relay_hostname_derived && dc->relay.hostname &&
	    !(d.hostname = strdup(dc->relay.hostname))) {
		fprintf(stderr, "sluiced: out of memory\n");
		return;
	}
	if (dc->relay.nroutes > 0 || dc->has_relay)
		config_print_block(f, "relay", NULL, relay_conf_keys, &dc->relay, all ? NULL : &d,
				   true);
	cfg_schema_clear(relay_conf_keys, &d);
}
