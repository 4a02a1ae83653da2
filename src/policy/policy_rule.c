/*
 * policy_rule -- loading a rule set, its accessors, and the overrides tables (see
 * policy_int.h).
 */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "log.h"
#include "policy_int.h"
#include "util.h"


static const char *const stage_names[] = { "connect", "helo", "mail", "rcpt", "data", "eom" };
static const char *const action_names[] = { "accept",  "warn",	  "delay",  "tag",
					     "quarantine", "discard", "tempfail", "reject" };
static const char *const count_names[] = { "connections", "messages", "recipients", "bytes",
					    "sessions",	   "distinct" };

const char *policy_stage_name(enum policy_stage s)
{
	return (unsigned)s < ARRAY_SIZE(stage_names) ? stage_names[s] : "?";
}

const char *policy_action_name(enum policy_action a)
{
	return (unsigned)a < ARRAY_SIZE(action_names) ? action_names[a] : "?";
}

const char *policy_count_name(enum policy_count c)
{
	return (unsigned)c < ARRAY_SIZE(count_names) ? count_names[c] : "?";
}

static int lookup_word(const char *w, const char *const *names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (strcasecmp(w, names[i]) == 0)
			return (int)i;
	return -1;
}

/* ---- loading ---- */

static int get_word(struct cfg_node *obj, const char *key, const char *const *names,
		    size_t n, int dflt, int *ret, char *err, size_t errlen)
{
	struct cfg_node *node = cfg_get(obj, key);
	const char *text;
	if (!node) {
		if (dflt < 0) {
			cfg_error(obj, err, errlen, "missing '%s'", key);
			return -EINVAL;
		}
		*ret = dflt;
		return 0;
	}
	if (cfg_string(node, &text, err, errlen) < 0)
		return -EINVAL;
	int v = lookup_word(text, names, n);
	if (v < 0) {
		char list[200] = "";
		for (size_t i = 0; i < n; i++)
			fmt_fixed(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
				  i ? ", " : "", names[i]);
		cfg_error(node, err, errlen, "'%.100s' is not one of: %s", text, list);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

/* Walk a scalar or a list of scalars. */
#define FOR_EACH_VALUE(v, node) \
	for (struct cfg_node *v = (node)->kind == CFG_LIST ? (node)->child : (node); v; \
	     v = (node)->kind == CFG_LIST ? v->next : NULL)

static int load_rates(struct policy_rule *r, struct cfg_node *obj, char *err, size_t errlen)
{
	struct cfg_node *rate = cfg_get(obj, "rate");
	if (!rate) {
		cfg_error(obj, err, errlen, "missing 'rate' (e.g. rate = [\"10/1m\", \"500/1d\"])");
		return -EINVAL;
	}
	FOR_EACH_VALUE(v, rate) {
		const char *text;
		char why[200];
		if (cfg_string(v, &text, err, errlen) < 0)
			return -EINVAL;
		if (r->limits.n == RATE_MAX_WINDOWS) {
			cfg_error(v, err, errlen, "at most %d windows", RATE_MAX_WINDOWS);
			return -EINVAL;
		}
		if (rate_window_parse(str_cstr(text), &r->limits.w[r->limits.n], why,
				      sizeof(why)) < 0) {
			cfg_error(v, err, errlen, "%s", why);
			return -EINVAL;
		}
		for (unsigned i = 0; i < r->limits.n; i++)
			if (r->limits.w[i].period_ns == r->limits.w[r->limits.n].period_ns) {
				cfg_error(v, err, errlen, "two windows with the same period");
				return -EINVAL;
			}
		r->limits.n++;
	}
	if (r->limits.n == 0) {
		cfg_error(rate, err, errlen, "an empty rate list");
		return -EINVAL;
	}
	struct cfg_node *burst = cfg_get(obj, "burst");
	if (burst) {
		/* applies to the windows whose text gave no burst of their own */
		int64_t b;
		if (cfg_int64(burst, 1, 1000000000000000LL, &b, err, errlen) < 0)
			return -EINVAL;
		unsigned i = 0;
		FOR_EACH_VALUE(v, rate)
			if (!strchr(v->value, ':'))
				r->limits.w[i++].burst = (uint64_t)b;
			else
				i++;
	}
	return 0;
}

static bool stage_has(enum policy_stage st, const struct selector *s)
{
	switch (s->kind) {
	case SEL_CLIENT_IP:
	case SEL_CLIENT_NAME:
	case SEL_MACRO:
		return true;
	case SEL_HELO:
		return st >= POLICY_HELO;
	case SEL_SASL_USER:
	case SEL_SENDER:
	case SEL_SENDER_DOMAIN:
		return st >= POLICY_MAIL;
	case SEL_RCPT:
	case SEL_RCPT_DOMAIN:
		return st == POLICY_RCPT;
	case SEL_HEADER:
		return st >= POLICY_DATA;
	}
	return false;
}

static const char *selector_stage_hint(const struct selector *s)
{
	switch (s->kind) {
	case SEL_HELO:
		return "helo or later";
	case SEL_SASL_USER:
	case SEL_SENDER:
	case SEL_SENDER_DOMAIN:
		return "mail or later";
	case SEL_RCPT:
	case SEL_RCPT_DOMAIN:
		return "rcpt";
	case SEL_HEADER:
		return "data or eom";
	default:
		return "any";
	}
}

/*
 * A reply template: "NNN X.Y.Z text" on one line, code class matching the action, the
 * enhanced code optional (but then of the same class), only known %{...} variables.
 */
static int check_reply(const char *t, enum policy_action a, const char **why)
{
	size_t len = strlen(t);
	char cls = a == POLICY_TEMPFAIL ? '4' : '5';
	if (len > REPLY_TEMPLATE_MAX) {
		*why = "longer than 400 bytes";
		return -EINVAL;
	}
	if (len < 4 || t[0] != cls || t[1] < '0' || t[1] > '9' || t[2] < '0' || t[2] > '9' ||
	    t[3] != ' ') {
		*why = a == POLICY_TEMPFAIL ? "a tempfail reply starts with a 4xx code and a space"
					    : "a reject reply starts with a 5xx code and a space";
		return -EINVAL;
	}
	if (t[1] == '2' && t[2] == '1') {
		*why = "421/521 close the SMTP session; use another code";
		return -EINVAL;
	}
	const char *p = t + 4;
	if (p[0] >= '2' && p[0] <= '5' && p[1] == '.') {
		if (p[0] != cls) {
			*why = "the enhanced status code's class differs from the reply code's";
			return -EINVAL;
		}
		size_t i = 2;
		unsigned digits = 0, dots = 0;
		for (; p[i] && p[i] != ' '; i++) {
			if (p[i] == '.') {
				if (digits == 0 || ++dots > 1) {
					*why = "bad enhanced status code";
					return -EINVAL;
				}
				digits = 0;
			} else if (p[i] >= '0' && p[i] <= '9' && digits < 3) {
				digits++;
			} else {
				*why = "bad enhanced status code";
				return -EINVAL;
			}
		}
		if (dots != 1 || digits == 0) {
			*why = "bad enhanced status code";
			return -EINVAL;
		}
		p += i;
	}
	while (*p == ' ')
		p++;
	if (!*p) {
		*why = "a reply needs text after its codes";
		return -EINVAL;
	}
	for (const char *q = t; *q; q++) {
		if ((unsigned char)*q < ' ' || *q == 0x7f) {
			*why = "control characters (one line only)";
			return -EINVAL;
		}
		if (q[0] == '%' && q[1] == '{') {
			const char *end = strchr(q, '}');
			static const char *const vars[] = { "rule", "key", "limit", "retry" };
			bool ok = false;
			for (size_t i = 0; end && i < ARRAY_SIZE(vars); i++)
				if ((size_t)(end - q - 2) == strlen(vars[i]) &&
				    strncmp(q + 2, vars[i], strlen(vars[i])) == 0)
					ok = true;
			if (!ok) {
				*why = "unknown %{...} variable (known: %{rule} %{key} %{limit} "
				       "%{retry})";
				return -EINVAL;
			}
		}
	}
	return 0;
}

/* except { ... } or only { ... }: entries into list[*n..]. */
static int load_except(struct policy_rule *r, struct cfg_node *ex, struct policy_except *list,
		       size_t *n, char *err, size_t errlen)
{
	if (ex->kind != CFG_OBJECT) {
		cfg_error(ex, err, errlen, "expected %s { SELECTOR = [values...]; }", ex->key);
		return -EINVAL;
	}
	for (struct cfg_node *c = ex->child; c; c = c->next) {
		char why[300];
		c->used = true;
		if (*n == POLICY_MAX_EXCEPT) {
			cfg_error(c, err, errlen, "more than %d %s entries", POLICY_MAX_EXCEPT, ex->key);
			return -EINVAL;
		}
		struct policy_except *e = &list[*n];
		if (selector_parse(str_cstr(c->key), &e->sel, why, sizeof(why)) < 0) {
			cfg_error(c, err, errlen, "%s", why);
			return -EINVAL;
		}
		if (e->sel.kind == SEL_CLIENT_IP && (e->sel.v4_bits != 32 || e->sel.v6_bits != 128)) {
			cfg_error(c, err, errlen, "write the prefix in the values "
				  "(client_ip = [\"192.0.2.0/24\"])");
			return -EINVAL;
		}
		if (!stage_has(r->stage, &e->sel)) {
			cfg_error(c, err, errlen, "%s has no value at stage %s (it needs stage %s)",
				  c->key, policy_stage_name(r->stage), selector_stage_hint(&e->sel));
			return -EINVAL;
		}
		e->masks = mask_list_new(selector_mask_type(&e->sel));
		if (!e->masks) {
			fmt_fixed(err, errlen, "out of memory");
			return -ENOMEM;
		}
		(*n)++;
		FOR_EACH_VALUE(v, c) {
			const char *text;
			if (cfg_string(v, &text, err, errlen) < 0)
				return -EINVAL;
			int rc = mask_list_add(e->masks, str_cstr(text), why, sizeof(why));
			if (rc < 0) {
				cfg_error(v, err, errlen, "%s", why);
				return rc;
			}
		}
	}
	return 0;
}

static int resolve_path(const struct cfg_node *n, const char *path, char **ret)
{
	char *out;
	if (path[0] == '/' || !n->file || !strchr(n->file, '/')) {
		out = strdup(path);
	} else {
		char *copy = strdup(n->file);
		if (!copy)
			return -ENOMEM;
		const char *dir = dirname(copy);
		size_t len = strlen(dir) + strlen(path) + 2;
		out = malloc(len);
		if (out)
			snprintf(out, len, "%s/%s", dir, path);
		free(copy);
	}
	if (!out)
		return -ENOMEM;
	*ret = out;
	return 0;
}


static void rule_clear(struct policy_rule *r)
{
	free(r->shards);
	free(r->name);
	free(r->key_spec);
	free(r->reply);
	free(r->ov_path);
	policy_overrides_clear(r);
	for (size_t i = 0; i < r->nex; i++)
		mask_list_free(r->ex[i].masks);
	for (size_t i = 0; i < r->nonly; i++)
		mask_list_free(r->only[i].masks);
	memset(r, 0, sizeof(*r));
}

/* The keys that depend on what a rule counts: rate (and burst, block), or max, or of. */
static int load_count_kind(struct policy_rule *r, struct cfg_node *n, char *err, size_t errlen)
{
	struct cfg_node *max = cfg_get(n, "max"), *of = cfg_get(n, "of"), *block = cfg_get(n, "block");
	if (r->count == POLICY_COUNT_SESSIONS) {
		static const char *const rate_keys[] = { "rate", "burst", "block", "count_rejected" };
		for (size_t i = 0; i < ARRAY_SIZE(rate_keys); i++) {
			struct cfg_node *k = cfg_get(n, rate_keys[i]);
			if (k) {
				cfg_error(k, err, errlen, "a sessions rule counts sessions at once: it "
					  "takes max = N, not %s", rate_keys[i]);
				return -EINVAL;
			}
		}
		int64_t m;
		if (!max) {
			cfg_error(n, err, errlen, "missing 'max' (sessions at once per key, e.g. max = 3)");
			return -EINVAL;
		}
		if (cfg_int64(max, 1, 1000000, &m, err, errlen) < 0)
			return -EINVAL;
		r->max_sessions = (unsigned)m;
	} else if (max) {
		cfg_error(max, err, errlen, "max = N goes with count = \"sessions\" (rates use rate = [...])");
		return -EINVAL;
	} else if (load_rates(r, n, err, errlen) < 0) {
		return -EINVAL;
	}
	if (r->count == POLICY_COUNT_DISTINCT) {
		const char *text;
		char why[300];
		if (!of) {
			cfg_error(n, err, errlen, "missing 'of' (the selector whose distinct values "
				  "are counted, e.g. of = \"rcpt\")");
			return -EINVAL;
		}
		if (cfg_string(of, &text, err, errlen) < 0)
			return -EINVAL;
		if (selector_parse(str_cstr(text), &r->of, why, sizeof(why)) < 0) {
			cfg_error(of, err, errlen, "%s", why);
			return -EINVAL;
		}
		if (!stage_has(r->stage, &r->of)) {
			cfg_error(of, err, errlen, "%s has no value at stage %s (it needs stage %s)",
				  text, policy_stage_name(r->stage), selector_stage_hint(&r->of));
			return -EINVAL;
		}
		for (size_t i = 0; i < r->nsel; i++)
			if (memcmp(&r->sel[i], &r->of, sizeof(r->of)) == 0) {
				cfg_error(of, err, errlen, "%s is part of the key: each key would have "
					  "one value", text);
				return -EINVAL;
			}
	} else if (of) {
		cfg_error(of, err, errlen, "of = SELECTOR goes with count = \"distinct\"");
		return -EINVAL;
	}
	if (block) {
		int64_t ms;
		if (cfg_duration_ms(block, 1000, 30LL * 86400 * 1000, &ms, err, errlen) < 0)
			return -EINVAL;
		r->block_ns = (uint64_t)ms * 1000000ULL;
	}
	return 0;
}

/* action = "delay" and its delay = DURATION, which nothing else takes. */
static int load_delay(struct policy_rule *r, struct cfg_node *n, struct cfg_node *action,
		      char *err, size_t errlen)
{
	struct cfg_node *delay = cfg_get(n, "delay");
	if (r->action != POLICY_DELAY) {
		if (delay) {
			cfg_error(delay, err, errlen, "delay = DURATION goes with action = \"delay\"");
			return -EINVAL;
		}
		return 0;
	}
	if (!delay) {
		cfg_error(action, err, errlen, "action = \"delay\" needs delay = DURATION (e.g. 10s)");
		return -EINVAL;
	}
	int64_t ms;
	if (cfg_duration_ms(delay, 1, 300000, &ms, err, errlen) < 0)
		return -EINVAL;
	r->delay_ms = (uint64_t)ms;
	if (cfg_get(n, "block")) {
		cfg_error(cfg_get(n, "block"), err, errlen, "a delay rule refuses nothing, so it "
			  "blocks nothing: use action = \"tempfail\" with block");
		return -EINVAL;
	}
	return 0;
}

static int load_rule(struct cfg_node *n, struct policy_rule *r, char *err, size_t errlen)
{
	const char *text;
	const char *why;
	char why_buf[300];
	int v;
	if (!n->label || !*n->label || strlen(n->label) >= STORE_TOP_RULE || n->kind != CFG_OBJECT) {
		cfg_error(n, err, errlen, "expected limit \"NAME\" { ... } with a name of 1-%d bytes",
			  STORE_TOP_RULE - 1);
		return -EINVAL;
	}
	for (const char *p = n->label; *p; p++)
		if ((unsigned char)*p <= ' ' || *p == 0x7f) {
			cfg_error(n, err, errlen, "a rule name has no spaces or control characters");
			return -EINVAL;
		}
	r->name = strdup(n->label);
	if (!r->name)
		goto nomem;
	r->name_str = str_cstr(r->name);
	if (get_word(n, "stage", stage_names, ARRAY_SIZE(stage_names), -1, &v, err, errlen) < 0)
		return -EINVAL;
	r->stage = (enum policy_stage)v;
	struct cfg_node *key = cfg_get(n, "key");
	if (!key) {
		cfg_error(n, err, errlen, "missing 'key' (e.g. key = \"rcpt_domain\")");
		return -EINVAL;
	}
	if (cfg_string(key, &text, err, errlen) < 0)
		return -EINVAL;
	if (selector_parse_key(text, r->sel, SELECTOR_MAX, &r->nsel, r->alt, &r->nalt, why_buf,
			       sizeof(why_buf)) < 0) {
		cfg_error(key, err, errlen, "%s", why_buf);
		return -EINVAL;
	}
	for (size_t i = 0; i < r->nsel; i++)
		if (!stage_has(r->stage, &r->sel[i])) {
			char name[100];
			cfg_error(key, err, errlen, "%s has no value at stage %s (it needs stage %s)",
				  selector_name(&r->sel[i], name, sizeof(name)),
				  policy_stage_name(r->stage), selector_stage_hint(&r->sel[i]));
			return -EINVAL;
		}
	r->key_spec = strdup(text);
	if (!r->key_spec)
		goto nomem;
	int dflt = r->stage <= POLICY_HELO ? POLICY_COUNT_CONNECTIONS : POLICY_COUNT_MESSAGES;
	struct cfg_node *count = cfg_get(n, "count");
	if (get_word(n, "count", count_names, ARRAY_SIZE(count_names), dflt, &v, err, errlen) < 0)
		return -EINVAL;
	r->count = (enum policy_count)v;
	bool any_stage = r->count == POLICY_COUNT_SESSIONS || r->count == POLICY_COUNT_DISTINCT;
	if (!any_stage && (r->count == POLICY_COUNT_CONNECTIONS) != (r->stage <= POLICY_HELO)) {
		cfg_error(count ? count : n, err, errlen,
			  r->count == POLICY_COUNT_CONNECTIONS ?
				  "count = connections needs stage = connect or helo" :
				  "stage %s can only count connections, sessions or distinct values",
			  policy_stage_name(r->stage));
		return -EINVAL;
	}
	if (r->count == POLICY_COUNT_RECIPIENTS && r->stage == POLICY_MAIL) {
		cfg_error(count, err, errlen, "recipients are known from stage rcpt on");
		return -EINVAL;
	}
	if (load_count_kind(r, n, err, errlen) < 0)
		return -EINVAL;
	if (get_word(n, "action", action_names + 1, ARRAY_SIZE(action_names) - 1,
		     POLICY_TEMPFAIL - 1, &v, err, errlen) < 0)
		return -EINVAL;
	r->action = (enum policy_action)(v + 1);
	struct cfg_node *action = cfg_get(n, "action");
	if (load_delay(r, n, action, err, errlen) < 0)
		return -EINVAL;
	if (r->stage <= POLICY_HELO &&
	    (r->action == POLICY_DISCARD || r->action == POLICY_QUARANTINE ||
	     r->action == POLICY_TAG)) {
		cfg_error(action, err, errlen, "%s acts on a message: it needs stage mail or later",
			  policy_action_name(r->action));
		return -EINVAL;
	}
	if (r->action == POLICY_DISCARD && r->stage == POLICY_RCPT) {
		cfg_error(action, err, errlen, "discard at stage rcpt would drop the whole message, "
			  "for every recipient: use stage mail, data or eom (or tempfail)");
		return -EINVAL;
	}
	struct cfg_node *reply = cfg_get(n, "reply");
	if (reply) {
		if (cfg_string(reply, &text, err, errlen) < 0)
			return -EINVAL;
		if (r->action != POLICY_TEMPFAIL && r->action != POLICY_REJECT) {
			cfg_error(reply, err, errlen, "only tempfail and reject rules send a reply");
			return -EINVAL;
		}
		if (check_reply(text, r->action, &why) < 0) {
			cfg_error(reply, err, errlen, "%s", why);
			return -EINVAL;
		}
		/* worst case: %{key} 103 bytes, %{rule} 63, %{limit} 31, %{retry} 16 */
		size_t worst = strlen(text);
		for (const char *q = text; (q = strstr(q, "%{")); q += 2)
			worst += strncmp(q, "%{key}", 6) == 0 ? 103 : strncmp(q, "%{rule}", 7) == 0 ? 63 :
				 strncmp(q, "%{limit}", 8) == 0 ? 31 : 16;
		if (worst >= POLICY_REPLY_MAX) {
			cfg_error(reply, err, errlen, "the reply could grow past %d bytes once its "
				  "variables are expanded: shorten it", POLICY_REPLY_MAX - 1);
			return -EINVAL;
		}
		r->reply = strdup(text);
	} else if (r->action == POLICY_TEMPFAIL && r->count == POLICY_COUNT_SESSIONS) {
		/* a slot frees when a session ends: there is no wait to tell */
		r->reply = strdup("451 4.7.1 Too many sessions at once for %{key}, try again later");
	} else if (r->action == POLICY_REJECT && r->count == POLICY_COUNT_SESSIONS) {
		r->reply = strdup("550 5.7.1 Too many sessions at once for %{key}");
	} else if (r->action == POLICY_TEMPFAIL) {
		r->reply = strdup("451 4.7.1 Rate limit exceeded for %{key}, try again in %{retry}");
	} else if (r->action == POLICY_REJECT) {
		r->reply = strdup("550 5.7.1 Rate limit exceeded for %{key}");
	}
	if ((r->action == POLICY_TEMPFAIL || r->action == POLICY_REJECT) && !r->reply)
		goto nomem;
	struct cfg_node *cr = cfg_get(n, "count_rejected");
	if (cr && cfg_bool(cr, &r->count_rejected, err, errlen) < 0)
		return -EINVAL;
	struct cfg_node *ex = cfg_get(n, "except");
	if (ex && load_except(r, ex, r->ex, &r->nex, err, errlen) < 0)
		return -EINVAL;
	struct cfg_node *only = cfg_get(n, "only");
	if (only && load_except(r, only, r->only, &r->nonly, err, errlen) < 0)
		return -EINVAL;
	struct cfg_node *ov = cfg_get(n, "overrides");
	if (ov && r->count == POLICY_COUNT_SESSIONS) {
		cfg_error(ov, err, errlen, "a sessions rule has no rates to override");
		return -EINVAL;
	}
	if (ov) {
		if (cfg_string(ov, &text, err, errlen) < 0)
			return -EINVAL;
		if (resolve_path(ov, text, &r->ov_path) < 0)
			goto nomem;
		char msg[400];
		if (policy_overrides_load(r, msg, sizeof(msg)) < 0) {
			cfg_error(ov, err, errlen, "%s", msg);
			return -EINVAL;
		}
	}
	return 0;
nomem:
	fmt_fixed(err, errlen, "out of memory");
	return -ENOMEM;
}

static void policy_free(struct policy *p)
{
	for (size_t i = 0; i < p->nrules; i++)
		rule_clear(&p->rules[i]);
	free(p->rules);
	for (size_t i = 0; i < POLICY_STAGE_COUNT; i++)
		free(p->stage_rules[i]);
	for (size_t i = 0; i < p->nclasses; i++)
		class_clear(&p->classes[i]);
	free(p->classes);
	free(p);
}

/* Add a name once (names compare as the MTA does: header names without case). */
static void names_add(struct policy_names *l, const char *name, bool nocase)
{
	for (size_t i = 0; i < l->n; i++)
		if ((nocase ? strcasecmp : strcmp)(l->v[i], name) == 0)
			return;
	if (l->n < ARRAY_SIZE(l->v))
		l->v[l->n++] = name;
}

/* What the MTA must tell for this selector (milter negotiation). */
static void note_selector(struct policy_needs *n, const struct selector *sel)
{
	switch (sel->kind) {
	case SEL_CLIENT_IP:
	case SEL_CLIENT_NAME:
		n->client = true;
		break;
	case SEL_HELO:
		n->helo = true;
		break;
	case SEL_SENDER:
	case SEL_SENDER_DOMAIN:
	case SEL_SASL_USER:
		n->sender = true; /* the MAIL command and its macros */
		break;
	case SEL_HEADER:
		names_add(&n->headers, sel->name, true);
		break;
	case SEL_MACRO:
		names_add(&n->macros, sel->name, false);
		break;
	default:
		break;
	}
}

int policy_load(struct cfg_node *root, struct policy **ret, char *err, size_t errlen)
{
	int rc = -EINVAL;
	struct policy *p = calloc(1, sizeof(*p));
	if (!p)
		goto nomem;
	atomic_init(&p->refs, 1);
	size_t nl = 0, nc = 0;
	for (struct cfg_node *n = cfg_get(root, "limit"); n; n = cfg_next_same(n))
		nl++;
	for (struct cfg_node *n = cfg_get(root, "class"); n; n = cfg_next_same(n))
		nc++;
	if (nl > POLICY_MAX_RULES) {
		cfg_error(cfg_get(root, "limit"), err, errlen, "more than %d limit rules",
			  POLICY_MAX_RULES);
		goto fail;
	}
	p->rules = calloc(nl ? nl : 1, sizeof(*p->rules));
	p->classes = calloc(nc ? nc : 1, sizeof(*p->classes));
	if (!p->rules || !p->classes)
		goto nomem;
	for (struct cfg_node *n = cfg_get(root, "limit"); n; n = cfg_next_same(n)) {
		struct policy_rule *r = &p->rules[p->nrules++];
		int lr = load_rule(n, r, err, errlen);
		if (lr < 0) {
			rc = lr;
			goto fail;
		}
		if (!(r->shards = calloc(THREAD_SHARDS, sizeof(*r->shards)))) {
			cfg_error(n, err, errlen, "out of memory");
			rc = -ENOMEM;
			goto fail;
		}
		for (size_t i = 0; i + 1 < p->nrules; i++)
			if (strcmp(p->rules[i].name, r->name) == 0) {
				cfg_error(n, err, errlen, "a second rule named \"%s\"", r->name);
				goto fail;
			}
		size_t same = 0;
		for (size_t i = 0; i < p->nrules; i++)
			same += p->rules[i].count == POLICY_COUNT_SESSIONS &&
				p->rules[i].stage == r->stage;
		if (r->count == POLICY_COUNT_SESSIONS && same > POLICY_MAX_SESSIONS_RULES) {
			cfg_error(n, err, errlen, "more than %d sessions rules at stage %s",
				  POLICY_MAX_SESSIONS_RULES, policy_stage_name(r->stage));
			goto fail;
		}
		struct policy_needs *nd = &p->needs;
		if (r->action == POLICY_TAG || r->action == POLICY_QUARANTINE)
			nd->message_actions = true;
		if (r->count == POLICY_COUNT_BYTES && r->stage == POLICY_EOM)
			nd->eom_bytes = true;
		else if (r->count == POLICY_COUNT_BYTES)
			nd->mail_size = true;
		for (size_t i = 0; i < r->nsel + r->nex; i++)
			note_selector(nd, i < r->nsel ? &r->sel[i] : &r->ex[i - r->nsel].sel);
		for (size_t i = 0; i < r->nonly; i++)
			note_selector(nd, &r->only[i].sel);
		if (r->count == POLICY_COUNT_DISTINCT)
			note_selector(nd, &r->of);
	}
	struct cfg_node *last_class = NULL;
	for (struct cfg_node *n = cfg_get(root, "class"); n; n = cfg_next_same(n)) {
		struct policy_class *c = &p->classes[p->nclasses];
		if (class_load(n, c, err, errlen) < 0)
			goto fail;
		p->nclasses++;
		for (size_t i = 0; i + 1 < p->nclasses; i++)
			if (strcmp(p->classes[i].name, c->name) == 0) {
				cfg_error(n, err, errlen, "a second class named \"%s\"", c->name);
				goto fail;
			}
		last_class = n;
	}
	if (p->nclasses && !mask_list_has_any(p->classes[p->nclasses - 1].hosts)) {
		cfg_error(last_class, err, errlen, "the last class must match every host "
			  "(hosts = [\"*\"]): a host in no class would have no limit");
		goto fail;
	}
	for (int st = 0; st < POLICY_STAGE_COUNT; st++) {
		p->stage_rules[st] = calloc(p->nrules ? p->nrules : 1, sizeof(size_t));
		if (!p->stage_rules[st])
			goto nomem;
		for (size_t i = 0; i < p->nrules; i++)
			if (p->rules[i].stage == (enum policy_stage)st)
				p->stage_rules[st][p->stage_n[st]++] = i;
	}
	for (size_t i = 0; i < p->nclasses; i++)
		if (class_attach(&p->classes[i]) < 0)
			goto nomem;
	*ret = p;
	return 0;
nomem:
	fmt_fixed(err, errlen, "out of memory");
	rc = -ENOMEM;
fail:
	if (p)
		policy_free(p);
	return rc;
}

struct policy *policy_ref(struct policy *p)
{
	if (p)
		atomic_fetch_add(&p->refs, 1);
	return p;
}

void policy_unref(struct policy *p)
{
	if (p && atomic_fetch_sub(&p->refs, 1) == 1)
		policy_free(p);
}

void policy_set_store(struct policy *p, struct store *s)
{
	p->store = s;
}

struct store *policy_store(const struct policy *p)
{
	return p->store;
}

bool policy_has_stage(const struct policy *p, enum policy_stage s)
{
	return p->stage_n[s] > 0;
}

bool policy_has_classes(const struct policy *p)
{
	return p->nclasses > 0;
}

const struct policy_needs *policy_needs(const struct policy *p)
{
	return &p->needs;
}

size_t policy_rule_count(const struct policy *p)
{
	return p->nrules;
}


/* ---- accessors ---- */

const char *policy_rule_name(const struct policy_rule *r)
{
	return r->name;
}

enum policy_action policy_rule_action(const struct policy_rule *r)
{
	return r->action;
}

enum policy_stage policy_rule_stage(const struct policy_rule *r)
{
	return r->stage;
}

enum policy_count policy_rule_count_kind(const struct policy_rule *r)
{
	return r->count;
}

const char *policy_rule_key_spec(const struct policy_rule *r)
{
	return r->key_spec;
}

unsigned policy_rule_max_sessions(const struct policy_rule *r)
{
	return r->max_sessions;
}

uint64_t policy_rule_block_ns(const struct policy_rule *r)
{
	return r->block_ns;
}

const struct policy_rule *policy_rule_at(const struct policy *p, size_t i)
{
	return i < p->nrules ? &p->rules[i] : NULL;
}

const struct policy_rule *policy_rule_find(const struct policy *p, const char *name)
{
	for (size_t i = 0; i < p->nrules; i++)
		if (strcmp(p->rules[i].name, name) == 0)
			return &p->rules[i];
	return NULL;
}


uint64_t policy_rule_key_hash(const struct policy *p, const struct policy_rule *r,
			      struct str key)
{
	return store_key_hash(p->store, r->name_str, key);
}

int policy_rule_normalize_key(const struct policy_rule *r, struct str key, char *out)
{
	struct selector_set set = rule_selectors(r);
	return selector_normalize_key(key, out, &set);
}
