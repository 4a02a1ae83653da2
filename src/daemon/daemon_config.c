/*
 * daemon_config -- daemon_config_load(): sluice.conf beyond src/conf (see
 * daemon_config.h, sluice.conf(5)).
 *
 * src/conf reads its blocks' tables; the modules above it read theirs, each with the
 * schema walker over the keys it declares: the milter's fixed answers
 * (milter_static_reply_keys, milter_static_modify_keys), the rules (policy_load), the
 * relay and its routes and providers (relay_conf_load).  This file assembles them into
 * a struct daemon_config, reads the routes' secret files, and keeps the checks that span
 * modules.  Then anything left unread in the file is reported as an unknown key with its
 * line (cfg_check_unused), so a typo never silently falls back to a default; and
 * daemon_config_print() writes it all back, block by block, from the same tables.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cfg.h"
#include "cfg_schema.h"
#include "config.h"
#include "config_core.h"
#include "config_schema.h"
#include "daemon_config.h"
#include "util.h"

#define ERR(...) cfg_error(__VA_ARGS__)

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

/* ---- the relay: relay {} and route "name" {} (relay_conf.c reads them) ---- */

/* A route's password: a secret file, checked as the others. */
static int read_route_secret(void *arg, struct cfg_node *n, const char *file, char **ret,
			     char *err, size_t el)
{
	return config_read_secret(n, file, arg, ret, err, el);
}

static int load_relay(struct cfg_node *root, struct daemon_config *dc, char *err, size_t el)
{
	const struct sluice_config *c = &dc->conf;
	struct relay_conf *rl = &dc->relay;
	dc->has_relay = cfg_get(root, "relay") != NULL;
	int r = relay_conf_load(root, rl, c->store.redis, read_route_secret, (void *)c, err, el);
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
 * the session first (no reply at all).  The rules are loaded and checked already: the
 * i-th limit block is the i-th rule. */
static int check_delays(struct cfg_node *root, const struct policy *rules, int64_t timeout_ms,
			char *err, size_t el)
{
	struct cfg_node *n = cfg_get(root, "limit");
	for (size_t i = 0; i < policy_rule_count(rules); i++, n = cfg_next_same(n)) {
		uint64_t ms = policy_rule_delay_ms(policy_rule_at(rules, i));
		if (!ms || ms < (uint64_t)timeout_ms)
			continue;
		char a[32], b[32];
		fmt_duration(a, sizeof(a), ms, DURATION_UP);
		fmt_duration(b, sizeof(b), (uint64_t)timeout_ms, DURATION_UP);
		cfg_error(cfg_get(n, "delay"), err, el, "a delay of %s is not below "
			  "milter.command_timeout (%s): sluiced would close the session before it "
			  "answers (and the MTA's own milter timeout, 30s in Postfix, is shorter "
			  "still)", a, b);
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
		r = check_delays(root, dc->rules, c->milter.command_timeout_ms, err, el);
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

/* Lines of keys over base, as a sub-block "name {" ... "}" at depth 1. */
static size_t print_sub(FILE *f, const char *name, const struct cfg_key *keys, const void *base,
			const void *defaults)
{
	char *text = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	if (!m)
		return 0;
	size_t lines = cfg_schema_print(m, keys, base, defaults, 2);
	fclose(m);
	fprintf(f, "  %s {\n%s  }\n", name, text);
	free(text);
	return lines + 1;
}

/* milter { reply {} modify {} }: written inside src/conf's milter block */
static size_t print_inside(FILE *f, const char *block, bool all, const void *arg)
{
	const struct daemon_config *dc = arg;
	static const struct milter_static_conf none;
	if (strcmp(block, "milter") != 0)
		return 0;
	return cfg_schema_print(f, milter_static_keys, &dc->milter_handler, all ? NULL : &none, 1);
}

static void print_route(FILE *f, const struct route_conf *rc, bool all)
{
	struct route_conf d = { .name = NULL };
	struct classify_signal_conf ds = { .match = NULL };
	if (route_conf_defaults(&d, rc->mx) < 0 || cfg_schema_defaults(route_signal_keys, &ds) < 0)
		return;
	char *text = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	if (m) {
		cfg_schema_print(m, route_conf_keys, rc, all ? NULL : &d, 1);
		if (rc->auth_user)
			print_sub(m, "auth", route_auth_keys, rc, all ? NULL : &d);
		for (size_t i = 0; i < rc->nsignals; i++)
			print_sub(m, "signal", route_signal_keys, &rc->signals[i], all ? NULL : &ds);
		fclose(m);
		char q[1024];
		fprintf(f, "route %s {\n%s}\n", cfg_quote(rc->name, q, sizeof(q)), text);
		free(text);
	}
	route_conf_clear(&d);
	cfg_schema_clear(route_signal_keys, &ds);
}

void daemon_config_print(FILE *f, const struct sluice_config *c, bool all)
{
	const struct daemon_config *dc = daemon_config_of(c);
	config_print(f, c, all, print_inside, dc);
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
	for (size_t i = 0; i < dc->relay.nroutes; i++)
		print_route(f, &dc->relay.routes[i], all);
	for (size_t i = 0; i < dc->relay.nproviders; i++) {
		const struct provider_conf *p = &dc->relay.providers[i];
		struct provider_conf pd = { .name = NULL };
		if (cfg_schema_defaults(provider_conf_keys, &pd) < 0)
			return;
		config_print_block(f, "provider", p->name, provider_conf_keys, p, all ? NULL : &pd,
				   true);
		provider_conf_clear(&pd);
	}
	policy_print(f, dc->rules, all);
}
