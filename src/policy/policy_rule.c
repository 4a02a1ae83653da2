/*
 * policy_rule -- a rule set assembled from its limit and class blocks (each read by
 * policy_conf.c and class.c), and its accessors (see policy_int.h).
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

static void rule_clear(struct policy_rule *r)
{
	free(r->shards);
	free(r->name);
	free(r->key_spec);
	free(r->reply);
	free(r->ov_path);
	policy_overrides_clear(r);
	for (size_t i = 0; i < r->nex; i++)
		policy_except_clear(&r->ex[i]);
	for (size_t i = 0; i < r->nonly; i++)
		policy_except_clear(&r->only[i]);
	memset(r, 0, sizeof(*r));
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
		int lr = policy_conf_rule_load(n, r, err, errlen);
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

uint64_t policy_rule_delay_ms(const struct policy_rule *r)
{
	return r->delay_ms;
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
