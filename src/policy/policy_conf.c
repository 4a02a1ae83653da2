/*
 * policy_conf -- a rule's configuration: the keys of `limit "NAME" { }` as a table
 * (cfg_schema.h), read by the schema walker into a struct policy_rule, the checks across
 * them, the writer of limit and class blocks for sluiced -n and -D, and the names of
 * stages, actions and counts that logs and that writer use (see policy_int.h).
 * policy_rule.c, which assembles a rule set from what it reads, calls it, never the other
 * way.
 *
 * The table's order is the order of the checks: a key's type may read the keys before it
 * (key's selectors are checked against stage; of against key; reply against action), so
 * that an error names the line of the key that made the rule wrong.  What depends on keys
 * not given (count's default, the default replies, a missing rate) is checked after the
 * walk.  A rule keeps what it was given in the words it was given (key_spec, the rate
 * windows, the except and only values, the overrides path), so that what is written loads
 * into the same rule.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cfg_schema.h"
#include "policy_int.h"
#include "util.h"

#define RULE(field) offsetof(struct policy_rule, field)
/* The rule that holds field, its member: the types below read the keys before theirs. */
#define RULE_OF(field, member) \
	((struct policy_rule *)(void *)((char *)(field) - offsetof(struct policy_rule, member)))

_Static_assert(sizeof(enum policy_stage) == sizeof(int), "stored as int");
_Static_assert(sizeof(enum policy_count) == sizeof(int), "stored as int");
_Static_assert(sizeof(enum policy_action) == sizeof(int), "stored as int");

/* ---- the names of stages, actions and counts, for logs and what is written ---- */

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

/* ---- what a selector can see at a stage ---- */

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

/* The reply of a rule that gives none: NULL for actions that send none. */
static const char *default_reply(enum policy_action a, enum policy_count c)
{
	if (a == POLICY_TEMPFAIL && c == POLICY_COUNT_SESSIONS)
		/* a slot frees when a session ends: there is no wait to tell */
		return "451 4.7.1 Too many sessions at once for %{key}, try again later";
	if (a == POLICY_REJECT && c == POLICY_COUNT_SESSIONS)
		return "550 5.7.1 Too many sessions at once for %{key}";
	if (a == POLICY_TEMPFAIL)
		return "451 4.7.1 Rate limit exceeded for %{key}, try again in %{retry}";
	if (a == POLICY_REJECT)
		return "550 5.7.1 Rate limit exceeded for %{key}";
	return NULL;
}

static enum policy_count default_count(enum policy_stage st)
{
	return st <= POLICY_HELO ? POLICY_COUNT_CONNECTIONS : POLICY_COUNT_MESSAGES;
}

/* ---- the types of a rule's keys ---- */

/* A word of k->names, any case: "'X' is not one of: a, b, c". */
static int word_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	const char *text;
	if (cfg_string(n, &text, err, el) < 0)
		return -EINVAL;
	for (const struct cfg_enum *e = k->names; e->name; e++)
		if (strcasecmp(text, e->name) == 0) {
			*(int *)field = e->value;
			return 0;
		}
	char list[200] = "";
	for (const struct cfg_enum *e = k->names; e->name; e++)
		fmt_fixed(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
			  e == k->names ? "" : ", ", e->name);
	cfg_error(n, err, el, "'%.100s' is not one of: %s", text, list);
	return -EINVAL;
}

static bool word_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	return cfg_type_enum.format(k, field, buf, size);
}

static const struct cfg_type type_word = { "word", word_parse, word_format, NULL };

/* key: the selectors, each with a value at the rule's stage */
static int key_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		     size_t el)
{
	(void)k;
	struct policy_rule *r = RULE_OF(field, key_spec);
	const char *text;
	char why[300];
	if (cfg_string(n, &text, err, el) < 0)
		return -EINVAL;
	if (selector_parse_key(text, r->sel, SELECTOR_MAX, &r->nsel, r->alt, &r->nalt, why,
			       sizeof(why)) < 0) {
		cfg_error(n, err, el, "%s", why);
		return -EINVAL;
	}
	for (size_t i = 0; i < r->nsel; i++)
		if (!stage_has(r->stage, &r->sel[i])) {
			char name[100];
			cfg_error(n, err, el, "%s has no value at stage %s (it needs stage %s)",
				  selector_name(&r->sel[i], name, sizeof(name)),
				  policy_stage_name(r->stage), selector_stage_hint(&r->sel[i]));
			return -EINVAL;
		}
	char *copy = strdup(text);
	if (!copy)
		return -ENOMEM;
	free(r->key_spec);
	r->key_spec = copy;
	return 0;
}

static bool string_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	return cfg_type_string.format(k, field, buf, size);
}

static const struct cfg_type type_key = { "selectors", key_parse, string_format, NULL };

/* rate: windows with distinct periods */
static int add_window(void *arg, const struct cfg_node *v, const char *text, char *err,
		      size_t el)
{
	struct rate_limits *l = arg;
	char why[200];
	if (l->n == RATE_MAX_WINDOWS) {
		cfg_error(v, err, el, "at most %d windows", RATE_MAX_WINDOWS);
		return -EINVAL;
	}
	if (rate_window_parse(str_cstr(text), &l->w[l->n], why, sizeof(why)) < 0) {
		cfg_error(v, err, el, "%s", why);
		return -EINVAL;
	}
	for (unsigned i = 0; i < l->n; i++)
		if (l->w[i].period_ns == l->w[l->n].period_ns) {
			cfg_error(v, err, el, "two windows with the same period");
			return -EINVAL;
		}
	l->n++;
	return 0;
}

static int rate_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	(void)k;
	struct rate_limits l = { .n = 0 };
	int r = cfg_list_each(n, add_window, &l, err, el);
	if (r < 0)
		return r;
	if (l.n == 0) {
		cfg_error(n, err, el, "an empty rate list");
		return -EINVAL;
	}
	*(struct rate_limits *)field = l;
	return 0;
}

static bool rate_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const struct rate_limits *l = field;
	if (!l->n)
		return false;
	size_t o = (size_t)snprintf(buf, size, "[");
	for (unsigned i = 0; i < l->n && o < size; i++) {
		char w[64];
		o += (size_t)snprintf(buf + o, size - o, "%s\"%s\"", i ? ", " : "",
				      rate_window_format(&l->w[i], w, sizeof(w)));
	}
	if (o < size)
		snprintf(buf + o, size - o, "]");
	return true;
}

static const struct cfg_type type_rate = { "list", rate_parse, rate_format, NULL };

/* uint64_t, 0 when not given (nothing written) */
static int count_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
		       char *err, size_t el)
{
	return cfg_type_uint64.parse(n, k, field, err, el);
}

static bool count_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	return *(const uint64_t *)field && cfg_type_uint64.format(k, field, buf, size);
}

static const struct cfg_type type_opt_uint64 = { "integer", count_parse, count_format, NULL };

/* unsigned, 0 when not given */
static bool uint_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	return *(const unsigned *)field && cfg_type_uint.format(k, field, buf, size);
}

static int uint_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	return cfg_type_uint.parse(n, k, field, err, el);
}

static const struct cfg_type type_opt_uint = { "integer", uint_parse, uint_format, NULL };

/* a duration into uint64_t milliseconds, 0 when not given */
static int ms_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		    size_t el)
{
	int64_t ms;
	if (cfg_duration_ms(n, k->min, k->max, &ms, err, el) < 0)
		return -EINVAL;
	*(uint64_t *)field = (uint64_t)ms;
	return 0;
}

static bool ms_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	uint64_t ms = *(const uint64_t *)field;
	if (!ms)
		return false;
	fmt_duration(buf, size, ms, DURATION_EXACT);
	return true;
}

static const struct cfg_type type_opt_ms = { "duration", ms_parse, ms_format, NULL };

static int ns_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		    size_t el)
{
	int64_t ms;
	if (cfg_duration_ms(n, k->min, k->max, &ms, err, el) < 0)
		return -EINVAL;
	*(uint64_t *)field = (uint64_t)ms * 1000000ULL;
	return 0;
}

static bool ns_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	uint64_t ms = *(const uint64_t *)field / 1000000ULL;
	return ms_format(k, &ms, buf, size);
}

static const struct cfg_type type_opt_ns = { "duration", ns_parse, ns_format, NULL };

/* of: the selector whose distinct values are counted (not one of the key's) */
static int of_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		    size_t el)
{
	(void)k;
	struct policy_rule *r = RULE_OF(field, of);
	const char *text;
	char why[300];
	if (cfg_string(n, &text, err, el) < 0)
		return -EINVAL;
	if (selector_parse(str_cstr(text), &r->of, why, sizeof(why)) < 0) {
		cfg_error(n, err, el, "%s", why);
		return -EINVAL;
	}
	if (r->count != POLICY_COUNT_DISTINCT)
		return 0; /* "of goes with count = distinct", once the walk is done */
	if (!stage_has(r->stage, &r->of)) {
		cfg_error(n, err, el, "%s has no value at stage %s (it needs stage %s)", text,
			  policy_stage_name(r->stage), selector_stage_hint(&r->of));
		return -EINVAL;
	}
	for (size_t i = 0; i < r->nsel; i++)
		if (memcmp(&r->sel[i], &r->of, sizeof(r->of)) == 0) {
			cfg_error(n, err, el, "%s is part of the key: each key would have one value",
				  text);
			return -EINVAL;
		}
	return 0;
}

static bool of_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const struct policy_rule *r = RULE_OF(field, of);
	if (r->count != POLICY_COUNT_DISTINCT)
		return false;
	char name[100];
	cfg_quote(selector_name(&r->of, name, sizeof(name)), buf, size);
	return true;
}

static const struct cfg_type type_of = { "selector", of_parse, of_format, NULL };

/* reply: a template for tempfail and reject rules */
static int reply_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
		       char *err, size_t el)
{
	(void)k;
	struct policy_rule *r = RULE_OF(field, reply);
	const char *text, *why;
	if (cfg_string(n, &text, err, el) < 0)
		return -EINVAL;
	if (r->action != POLICY_TEMPFAIL && r->action != POLICY_REJECT) {
		cfg_error(n, err, el, "only tempfail and reject rules send a reply");
		return -EINVAL;
	}
	if (check_reply(text, r->action, &why) < 0) {
		cfg_error(n, err, el, "%s", why);
		return -EINVAL;
	}
	/* worst case: %{key} 103 bytes, %{rule} 63, %{limit} 31, %{retry} 16 */
	size_t worst = strlen(text);
	for (const char *q = text; (q = strstr(q, "%{")); q += 2)
		worst += strncmp(q, "%{key}", 6) == 0 ? 103 : strncmp(q, "%{rule}", 7) == 0 ? 63 :
			 strncmp(q, "%{limit}", 8) == 0 ? 31 : 16;
	if (worst >= POLICY_REPLY_MAX) {
		cfg_error(n, err, el, "the reply could grow past %d bytes once its variables are "
			  "expanded: shorten it", POLICY_REPLY_MAX - 1);
		return -EINVAL;
	}
	char *copy = strdup(text);
	if (!copy)
		return -ENOMEM;
	free(r->reply);
	r->reply = copy;
	return 0;
}

static const struct cfg_type type_reply = { "reply", reply_parse, string_format, NULL };

/* except { SELECTOR = [values]; } and only { ... }: entries into the rule's list */
static int except_add(void *arg, const struct cfg_node *v, const char *text, char *err,
		      size_t el)
{
	struct policy_except *e = arg;
	char why[300];
	int rc = mask_list_add(e->masks, str_cstr(text), why, sizeof(why));
	if (rc < 0) {
		cfg_error(v, err, el, "%s", why);
		return rc;
	}
	size_t n = 0;
	while (e->values && e->values[n])
		n++;
	char **v2 = realloc(e->values, (n + 2) * sizeof(*v2));
	if (!v2)
		return -ENOMEM;
	e->values = v2;
	if (!(v2[n] = strdup(text)))
		return -ENOMEM;
	v2[n + 1] = NULL;
	return 0;
}

static int except_parse(const struct cfg_node *ex, const struct cfg_key *k, void *field,
			char *err, size_t el)
{
	bool only = strcmp(k->name, "only") == 0;
	struct policy_rule *r = only ? RULE_OF(field, only) : RULE_OF(field, ex);
	struct policy_except *list = only ? r->only : r->ex;
	size_t *n = only ? &r->nonly : &r->nex;
	if (ex->kind != CFG_OBJECT) {
		cfg_error(ex, err, el, "expected %s { SELECTOR = [values...]; }", ex->key);
		return -EINVAL;
	}
	for (struct cfg_node *c = ex->child; c; c = c->next) {
		char why[300];
		c->used = true;
		if (*n == POLICY_MAX_EXCEPT) {
			cfg_error(c, err, el, "more than %d %s entries", POLICY_MAX_EXCEPT, ex->key);
			return -EINVAL;
		}
		struct policy_except *e = &list[*n];
		if (selector_parse(str_cstr(c->key), &e->sel, why, sizeof(why)) < 0) {
			cfg_error(c, err, el, "%s", why);
			return -EINVAL;
		}
		if (e->sel.kind == SEL_CLIENT_IP && (e->sel.v4_bits != 32 || e->sel.v6_bits != 128)) {
			cfg_error(c, err, el, "write the prefix in the values "
				  "(client_ip = [\"192.0.2.0/24\"])");
			return -EINVAL;
		}
		if (!stage_has(r->stage, &e->sel)) {
			cfg_error(c, err, el, "%s has no value at stage %s (it needs stage %s)", c->key,
				  policy_stage_name(r->stage), selector_stage_hint(&e->sel));
			return -EINVAL;
		}
		e->masks = mask_list_new(selector_mask_type(&e->sel));
		if (!e->masks) {
			fmt_fixed(err, el, "out of memory");
			return -ENOMEM;
		}
		(*n)++;
		/* this entry's values only: a selector given twice is two entries */
		int rc = cfg_items_each(c, except_add, e, err, el);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* except and only are written as blocks by policy_print(), not as one value */
static bool except_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	(void)field;
	(void)buf;
	(void)size;
	return false;
}

static void print_excepts(FILE *f, const char *name, const struct policy_except *list, size_t n)
{
	if (!n)
		return;
	fprintf(f, "  %s {\n", name);
	for (size_t i = 0; i < n; i++) {
		char sel[100], values[8192];
		if (!cfg_type_list.format(NULL, &list[i].values, values, sizeof(values)))
			snprintf(values, sizeof(values), "[]");
		fprintf(f, "    %s = %s;\n", selector_name(&list[i].sel, sel, sizeof(sel)), values);
	}
	fprintf(f, "  }\n");
}

static const struct cfg_type type_except = { "block", except_parse, except_format, NULL };

void policy_except_clear(struct policy_except *e)
{
	mask_list_free(e->masks);
	cfg_type_list.clear(&e->values);
	memset(e, 0, sizeof(*e));
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

/* overrides: a file of per-key limits, relative to the configuration file's directory */
static int overrides_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			   char *err, size_t el)
{
	(void)k;
	struct policy_rule *r = RULE_OF(field, ov_path);
	const char *text;
	if (r->count == POLICY_COUNT_SESSIONS) {
		cfg_error(n, err, el, "a sessions rule has no rates to override");
		return -EINVAL;
	}
	if (cfg_string(n, &text, err, el) < 0)
		return -EINVAL;
	free(r->ov_path);
	r->ov_path = NULL;
	if (resolve_path(n, text, &r->ov_path) < 0) {
		fmt_fixed(err, el, "out of memory");
		return -ENOMEM;
	}
	char msg[400];
	if (policy_overrides_load(r, msg, sizeof(msg)) < 0) {
		cfg_error(n, err, el, "%s", msg);
		return -EINVAL;
	}
	return 0;
}

/* written absolute: the file that reads it back may be elsewhere */
static bool overrides_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const char *path = *(char *const *)field;
	char abs[PATH_MAX];
	if (!path)
		return false;
	cfg_quote(realpath(path, abs) ? abs : path, buf, size);
	return true;
}

static const struct cfg_type type_overrides = { "path", overrides_parse, overrides_format,
						NULL };

/* ---- the table ---- */

static const struct cfg_enum stage_words[] = {
	{ "connect", POLICY_CONNECT }, { "helo", POLICY_HELO }, { "mail", POLICY_MAIL },
	{ "rcpt", POLICY_RCPT },       { "data", POLICY_DATA }, { "eom", POLICY_EOM },
	{ NULL, 0 },
};

static const struct cfg_enum count_words[] = {
	{ "connections", POLICY_COUNT_CONNECTIONS }, { "messages", POLICY_COUNT_MESSAGES },
	{ "recipients", POLICY_COUNT_RECIPIENTS },   { "bytes", POLICY_COUNT_BYTES },
	{ "sessions", POLICY_COUNT_SESSIONS },       { "distinct", POLICY_COUNT_DISTINCT },
	{ NULL, 0 },
};

/* accept is what a rule within its limits gives, not an action to take */
static const struct cfg_enum action_words[] = {
	{ "warn", POLICY_WARN },         { "delay", POLICY_DELAY },
	{ "tag", POLICY_TAG },           { "quarantine", POLICY_QUARANTINE },
	{ "discard", POLICY_DISCARD },   { "tempfail", POLICY_TEMPFAIL },
	{ "reject", POLICY_REJECT },     { NULL, 0 },
};

static bool counts_events(const void *base)
{
	return ((const struct policy_rule *)base)->count != POLICY_COUNT_SESSIONS;
}

const struct cfg_key policy_limit_keys[] = {
	{ "stage", &type_word, RULE(stage), NULL, .names = stage_words, .flags = CFG_REQUIRED,
	  .help = "the SMTP stage the rule is decided at" },
	{ "key", &type_key, RULE(key_spec), NULL, .flags = CFG_REQUIRED,
	  .help = "what a key is made of: selectors, joined with + and |" },
	{ "count", &type_word, RULE(count), NULL, .names = count_words,
	  .help = "what the rule counts (default connections at connect and helo, else "
		  "messages)" },
	{ "rate", &type_rate, RULE(limits), NULL,
	  .help = "the windows, \"COUNT/PERIOD[:BURST]\"" },
	{ "burst", &type_opt_uint64, RULE(burst), NULL, 1, 1000000000000000LL,
	  .help = "the burst of the windows that give none" },
	{ "block", &type_opt_ns, RULE(block_ns), NULL, 1000, 30LL * 86400 * 1000,
	  .help = "a refused key stays refused this long" },
	{ "max", &type_opt_uint, RULE(max_sessions), NULL, 1, 1000000,
	  .help = "sessions at once per key (count = sessions)" },
	{ "of", &type_of, RULE(of), NULL,
	  .help = "the selector whose distinct values are counted (count = distinct)" },
	{ "action", &type_word, RULE(action), "tempfail", .names = action_words,
	  .help = "what a key over its limits gets" },
	{ "delay", &type_opt_ms, RULE(delay_ms), NULL, 1, 300000,
	  .help = "how long the answer waits (action = delay)" },
	{ "reply", &type_reply, RULE(reply), NULL, .help = "the SMTP reply of tempfail and reject" },
	{ "count_rejected", &cfg_type_bool, RULE(count_rejected), "false", .active = counts_events,
	  .help = "a refused event is counted too" },
	{ "except", &type_except, RULE(ex), NULL,
	  .help = "the rule does not apply where one of these matches" },
	{ "only", &type_except, RULE(only), NULL,
	  .help = "the rule applies only where all of these match" },
	{ "overrides", &type_overrides, RULE(ov_path), NULL, .help = "a file of per-key limits" },
	{ .name = NULL },
};

/* ---- reading a limit ---- */

/* The keys that depend on what a rule counts: rate (and burst, block), or max, or of. */
static int check_count_kind(struct policy_rule *r, struct cfg_node *n, char *err, size_t el)
{
	struct cfg_node *max = cfg_get(n, "max"), *of = cfg_get(n, "of");
	if (r->count == POLICY_COUNT_SESSIONS) {
		static const char *const rate_keys[] = { "rate", "burst", "block", "count_rejected" };
		for (size_t i = 0; i < ARRAY_SIZE(rate_keys); i++) {
			struct cfg_node *k = cfg_get(n, rate_keys[i]);
			if (k) {
				cfg_error(k, err, el, "a sessions rule counts sessions at once: it "
					  "takes max = N, not %s", rate_keys[i]);
				return -EINVAL;
			}
		}
		if (!max) {
			cfg_error(n, err, el, "missing 'max' (sessions at once per key, e.g. max = 3)");
			return -EINVAL;
		}
	} else if (max) {
		cfg_error(max, err, el, "max = N goes with count = \"sessions\" (rates use rate = [...])");
		return -EINVAL;
	} else if (!r->limits.n) {
		cfg_error(n, err, el, "missing 'rate' (e.g. rate = [\"10/1m\", \"500/1d\"])");
		return -EINVAL;
	}
	if (r->count == POLICY_COUNT_DISTINCT && !of) {
		cfg_error(n, err, el, "missing 'of' (the selector whose distinct values are "
			  "counted, e.g. of = \"rcpt\")");
		return -EINVAL;
	}
	if (r->count != POLICY_COUNT_DISTINCT && of) {
		cfg_error(of, err, el, "of = SELECTOR goes with count = \"distinct\"");
		return -EINVAL;
	}
	if (r->burst) {
		/* applies to the windows whose text gave no burst of their own */
		struct cfg_node *rate = cfg_get(n, "rate");
		unsigned i = 0;
		for (struct cfg_node *v = rate->kind == CFG_LIST ? rate->child : rate;
		     v && i < r->limits.n; v = rate->kind == CFG_LIST ? v->next : NULL, i++)
			if (!strchr(v->value, ':'))
				r->limits.w[i].burst = r->burst;
		r->burst = 0; /* in the windows now, written with them */
	}
	return 0;
}

/* action = "delay" and its delay = DURATION, which nothing else takes. */
static int check_delay(struct policy_rule *r, struct cfg_node *n, char *err, size_t el)
{
	struct cfg_node *delay = cfg_get(n, "delay"), *action = cfg_get(n, "action");
	if (r->action != POLICY_DELAY) {
		if (delay) {
			cfg_error(delay, err, el, "delay = DURATION goes with action = \"delay\"");
			return -EINVAL;
		}
		return 0;
	}
	if (!delay) {
		cfg_error(action, err, el, "action = \"delay\" needs delay = DURATION (e.g. 10s)");
		return -EINVAL;
	}
	if (cfg_get(n, "block")) {
		cfg_error(cfg_get(n, "block"), err, el, "a delay rule refuses nothing, so it "
			  "blocks nothing: use action = \"tempfail\" with block");
		return -EINVAL;
	}
	return 0;
}

int policy_conf_rule_load(struct cfg_node *n, struct policy_rule *r, char *err, size_t el)
{
	if (!n->label || !*n->label || strlen(n->label) >= STORE_TOP_RULE || n->kind != CFG_OBJECT) {
		cfg_error(n, err, el, "expected limit \"NAME\" { ... } with a name of 1-%d bytes",
			  STORE_TOP_RULE - 1);
		return -EINVAL;
	}
	for (const char *p = n->label; *p; p++)
		if ((unsigned char)*p <= ' ' || *p == 0x7f) {
			cfg_error(n, err, el, "a rule name has no spaces or control characters");
			return -EINVAL;
		}
	if (!(r->name = strdup(n->label)))
		goto nomem;
	r->name_str = str_cstr(r->name);
	if (!cfg_get(n, "stage")) {
		cfg_error(n, err, el, "missing 'stage'");
		return -EINVAL;
	}
	if (!cfg_get(n, "key")) {
		cfg_error(n, err, el, "missing 'key' (e.g. key = \"rcpt_domain\")");
		return -EINVAL;
	}
	int rc = cfg_schema_defaults(policy_limit_keys, r);
	if (rc == 0) {
		/* count's default hangs on stage: read first, then the whole table */
		struct cfg_key stage_only[] = { policy_limit_keys[0], { .name = NULL } };
		rc = cfg_schema_load(n, stage_only, r, err, el);
		r->count = default_count(r->stage);
	}
	if (rc == 0)
		rc = cfg_schema_load(n, policy_limit_keys, r, err, el);
	if (rc == -ENOMEM)
		goto nomem;
	if (rc < 0)
		return rc;
	struct cfg_node *count = cfg_get(n, "count");
	bool any_stage = r->count == POLICY_COUNT_SESSIONS || r->count == POLICY_COUNT_DISTINCT;
	if (!any_stage && (r->count == POLICY_COUNT_CONNECTIONS) != (r->stage <= POLICY_HELO)) {
		cfg_error(count ? count : n, err, el,
			  r->count == POLICY_COUNT_CONNECTIONS ?
				  "count = connections needs stage = connect or helo" :
				  "stage %s can only count connections, sessions or distinct values",
			  policy_stage_name(r->stage));
		return -EINVAL;
	}
	if (r->count == POLICY_COUNT_RECIPIENTS && r->stage == POLICY_MAIL) {
		cfg_error(count, err, el, "recipients are known from stage rcpt on");
		return -EINVAL;
	}
	if (check_count_kind(r, n, err, el) < 0 || check_delay(r, n, err, el) < 0)
		return -EINVAL;
	struct cfg_node *action = cfg_get(n, "action");
	if (r->stage <= POLICY_HELO &&
	    (r->action == POLICY_DISCARD || r->action == POLICY_QUARANTINE ||
	     r->action == POLICY_TAG)) {
		cfg_error(action, err, el, "%s acts on a message: it needs stage mail or later",
			  policy_action_name(r->action));
		return -EINVAL;
	}
	if (r->action == POLICY_DISCARD && r->stage == POLICY_RCPT) {
		cfg_error(action, err, el, "discard at stage rcpt would drop the whole message, "
			  "for every recipient: use stage mail, data or eom (or tempfail)");
		return -EINVAL;
	}
	const char *dflt = default_reply(r->action, r->count);
	if (!r->reply && dflt && !(r->reply = strdup(dflt)))
		goto nomem;
	return 0;
nomem:
	fmt_fixed(err, el, "out of memory");
	return -ENOMEM;
}

/* ---- writing the rule set back ---- */

static void print_block(FILE *f, const char *name, const char *label, const struct cfg_key *keys,
			const void *base, const void *defaults, const struct policy_rule *r)
{
	char *text = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	if (!m)
		return;
	cfg_schema_print(m, keys, base, defaults, 1);
	if (r) {
		print_excepts(m, "except", r->ex, r->nex);
		print_excepts(m, "only", r->only, r->nonly);
	}
	fclose(m);
	char q[300];
	fprintf(f, "%s %s {\n%s}\n", name, cfg_quote(label, q, sizeof(q)), text);
	free(text);
}

void policy_print(FILE *f, const struct policy *p, bool all)
{
	struct policy_rule *d = calloc(1, sizeof(*d));
	struct policy_class cd = { .name = NULL };
	if (!d)
		return;
	for (size_t i = 0; p && i < p->nclasses; i++)
		print_block(f, "class", p->classes[i].name, policy_class_keys, &p->classes[i],
			    all ? NULL : &cd, NULL);
	for (size_t i = 0; p && i < p->nrules; i++) {
		const struct policy_rule *r = &p->rules[i];
		/* what this rule would be given only its stage, key and action */
		char reply[REPLY_TEMPLATE_MAX + 1] = "";
		const char *dr = default_reply(r->action, r->count);
		memset(d, 0, sizeof(*d));
		cfg_schema_defaults(policy_limit_keys, d);
		d->count = default_count(r->stage);
		d->reply = dr ? strcpy(reply, dr) : NULL;
		print_block(f, "limit", r->name, policy_limit_keys, r, all ? NULL : d, r);
	}
	free(d);
}
