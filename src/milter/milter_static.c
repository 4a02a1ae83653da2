/*
 * milter_static -- fixed replies and modifications (see milter_static.h).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cfg_schema.h"
#include "milter_static.h"
#include "util.h"

static void free_list(char **l)
{
	if (!l)
		return;
	for (char **p = l; *p; p++)
		free(*p);
	free(l);
}

void milter_static_conf_clear(struct milter_static_conf *c)
{
	for (int i = 0; i < MILTER_STEP_COUNT; i++)
		free(c->reply[i]);
	free_list(c->add_header);
	free_list(c->insert_header);
	free_list(c->change_header);
	free_list(c->add_rcpt);
	free_list(c->add_rcpt_par);
	free_list(c->del_rcpt);
	free(c->change_from);
	free(c->replace_body);
	free(c->quarantine);
	memset(c, 0, sizeof(*c));
}

static const struct {
	const char *name;
	enum milter_verdict v;
} words[] = {
	{ "continue", MILTER_CONTINUE }, { "accept", MILTER_ACCEPT },
	{ "reject", MILTER_REJECT },	 { "tempfail", MILTER_TEMPFAIL },
	{ "discard", MILTER_DISCARD },	 { "skip", MILTER_SKIP },
};

int milter_static_parse_action(const char *text, enum milter_step step,
			       enum milter_verdict *ret_verdict, char **ret_reply,
			       const char **ret_why)
{
	for (size_t i = 0; i < ARRAY_SIZE(words); i++)
		if (strcasecmp(text, words[i].name) == 0) {
			if (words[i].v == MILTER_SKIP && step != MILTER_STEP_BODY) {
				*ret_why = "skip is only valid for the body step";
				return -EINVAL;
			}
			if (words[i].v == MILTER_DISCARD &&
			    (step == MILTER_STEP_CONNECT || step == MILTER_STEP_HELO)) {
				*ret_why = "discard is only valid from the mail step on";
				return -EINVAL;
			}
			*ret_verdict = words[i].v;
			*ret_reply = NULL;
			return 0;
		}
	if (milter_reply_check(str_cstr(text), ret_why) < 0)
		return -EINVAL;
	char *copy = strdup(text);
	if (!copy) {
		*ret_why = "out of memory";
		return -ENOMEM;
	}
	*ret_verdict = MILTER_REPLY;
	*ret_reply = copy;
	return 0;
}

/* Split "Name: value" (value may be empty); name has no space, colon or control bytes. */
static int split_header(const char *text, struct str *name, struct str *value)
{
	const char *colon = strchr(text, ':');
	if (!colon || colon == text)
		return -EINVAL;
	for (const char *p = text; p < colon; p++)
		if ((unsigned char)*p <= 0x20 || *p == 0x7f)
			return -EINVAL;
	*name = str_make(text, (size_t)(colon - text));
	const char *v = colon + 1;
	if (*v == ' ')
		v++; /* the MTA adds its own space after the colon (no HDR_LEADSPC) */
	*value = str_cstr(v);
	return 0;
}

static int split_index(const char *text, uint32_t *index, const char **rest)
{
	char *end;
	unsigned long v = strtoul(text, &end, 10);
	if (end == text || *end != ' ' || v > UINT32_MAX)
		return -EINVAL;
	*index = (uint32_t)v;
	*rest = end + 1;
	return 0;
}

int milter_static_check_header(const char *text, bool indexed, const char **ret_why)
{
	struct str n, v;
	uint32_t idx;
	if (indexed && split_index(text, &idx, &text) < 0) {
		*ret_why = "expected \"INDEX Name: value\"";
		return -EINVAL;
	}
	if (split_header(text, &n, &v) < 0) {
		*ret_why = "expected \"Name: value\"";
		return -EINVAL;
	}
	return 0;
}

/* ---- the keys of milter { reply { } modify { } } ---- */

/* STEP = action: the key's name is the step; the field is the whole conf. */
static int answer_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			char *err, size_t el)
{
	struct milter_static_conf *h = field;
	enum milter_step s;
	const char *text, *why;
	if (milter_step_from_name(k->name, &s) < 0)
		abort(); /* a broken table */
	int r = cfg_string(n, &text, err, el);
	if (r < 0)
		return r;
	enum milter_verdict v;
	char *reply = NULL;
	r = milter_static_parse_action(text, s, &v, &reply, &why);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		cfg_error(n, err, el, "\"%.100s\": %s (expected continue, accept, reject, "
			  "tempfail, discard, or a 4xx/5xx reply)", text, why);
		return r;
	}
	free(h->reply[s]);
	h->verdict[s] = v;
	h->reply[s] = reply;
	h->set[s] = true;
	return 0;
}

static bool answer_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	const struct milter_static_conf *h = field;
	enum milter_step s;
	if (milter_step_from_name(k->name, &s) < 0 || !h->set[s])
		return false;
	if (h->verdict[s] == MILTER_REPLY) {
		cfg_quote(h->reply[s], buf, size);
		return true;
	}
	for (size_t i = 0; i < ARRAY_SIZE(words); i++)
		if (words[i].v == h->verdict[s]) {
			snprintf(buf, size, "%s", words[i].name);
			return true;
		}
	return false;
}

static const struct cfg_type type_answer = { "action", answer_parse, answer_format, NULL };

#define ANSWER(step, what) { step, &type_answer, 0, .help = "the answer to " what }

const struct cfg_key milter_static_reply_keys[] = {
	ANSWER("connect", "a connection"),
	ANSWER("helo", "HELO/EHLO"),
	ANSWER("mail", "MAIL FROM"),
	ANSWER("rcpt", "each RCPT TO"),
	ANSWER("data", "DATA"),
	ANSWER("header", "each header"),
	ANSWER("eoh", "the end of the headers"),
	ANSWER("body", "each body chunk"),
	ANSWER("eom", "the end of the message"),
	ANSWER("unknown", "an unknown command"),
	{ .name = NULL },
};
_Static_assert(ARRAY_SIZE(milter_static_reply_keys) == MILTER_STEP_COUNT + 1, "one per step");

static bool plain_header_ok(const char *s, const char **why)
{
	return milter_static_check_header(s, false, why) == 0;
}

static bool indexed_header_ok(const char *s, const char **why)
{
	return milter_static_check_header(s, true, why) == 0;
}

static bool addr_ok(const char *s, const char **why)
{
	if (!*s || strchr(s, ' ')) {
		*why = "expected one address, e.g. <user@example.org>";
		return false;
	}
	return true;
}

static bool addr_args_ok(const char *s, const char **why)
{
	const char *sp = strchr(s, ' ');
	if (sp)
		while (sp[1] == ' ')
			sp++;
	if (!sp || sp == s || !sp[1]) {
		*why = "expected an address and ESMTP parameters, e.g. <u@example.org> NOTIFY=NEVER";
		return false;
	}
	return true;
}

static bool from_ok(const char *s, const char **why)
{
	if (!*s || *s == ' ') {
		*why = "expected an address and optional ESMTP parameters, e.g. <u@example.org>";
		return false;
	}
	return true;
}

static int check_plain_header(const struct cfg_node *n, const void *field, char *err, size_t el)
{
	(void)field;
	return cfg_list_check(n, plain_header_ok, err, el);
}

static int check_indexed_header(const struct cfg_node *n, const void *field, char *err,
				size_t el)
{
	(void)field;
	return cfg_list_check(n, indexed_header_ok, err, el);
}

static int check_addr(const struct cfg_node *n, const void *field, char *err, size_t el)
{
	(void)field;
	return cfg_list_check(n, addr_ok, err, el);
}

static int check_addr_args(const struct cfg_node *n, const void *field, char *err, size_t el)
{
	(void)field;
	return cfg_list_check(n, addr_args_ok, err, el);
}

/* change_from: a string, or a list of one (there is one sender). */
static int sender_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			char *err, size_t el)
{
	int r = cfg_list_check(n, from_ok, err, el);
	char **list = NULL;
	if (r == 0)
		r = cfg_type_list.parse(n, k, &list, err, el);
	if (r < 0)
		return r;
	if (list[0] && list[1]) {
		cfg_error(n, err, el, "only one sender can be set");
		r = -EINVAL;
	} else {
		char **p = field;
		free(*p);
		*p = list[0];
		list[0] = NULL;
	}
	cfg_type_list.clear(&list);
	return r;
}

static bool sender_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const char *s = *(char *const *)field;
	if (!s)
		return false;
	cfg_quote(s, buf, size);
	return true;
}

static const struct cfg_type type_sender = { "string", sender_parse, sender_format, NULL };

#define MODIFY(field) offsetof(struct milter_static_conf, field)

const struct cfg_key milter_static_modify_keys[] = {
	{ "add_header", &cfg_type_list, MODIFY(add_header), .flags = CFG_REPEAT,
	  .check = check_plain_header, .help = "\"Name: value\" headers added" },
	{ "insert_header", &cfg_type_list, MODIFY(insert_header), .flags = CFG_REPEAT,
	  .check = check_indexed_header, .help = "\"INDEX Name: value\" headers inserted" },
	{ "change_header", &cfg_type_list, MODIFY(change_header), .flags = CFG_REPEAT,
	  .check = check_indexed_header,
	  .help = "\"INDEX Name: value\" headers changed (an empty value deletes)" },
	{ "add_rcpt", &cfg_type_list, MODIFY(add_rcpt), .flags = CFG_REPEAT,
	  .check = check_addr, .help = "recipients added" },
	{ "add_rcpt_par", &cfg_type_list, MODIFY(add_rcpt_par), .flags = CFG_REPEAT,
	  .check = check_addr_args, .help = "recipients added with ESMTP parameters" },
	{ "del_rcpt", &cfg_type_list, MODIFY(del_rcpt), .flags = CFG_REPEAT,
	  .check = check_addr, .help = "recipients removed" },
	{ "change_from", &type_sender, MODIFY(change_from), .flags = CFG_REPEAT,
	  .help = "the new sender, \"<addr> [ESMTP-ARGS]\"" },
	{ "replace_body", &cfg_type_string, MODIFY(replace_body), .help = "the new body" },
	{ "quarantine", &cfg_type_string, MODIFY(quarantine), .help = "the quarantine reason" },
	{ .name = NULL },
};

const struct cfg_key milter_static_keys[] = {
	{ "reply", &cfg_type_block, 0, .sub = milter_static_reply_keys,
	  .help = "fixed answers per step" },
	{ "modify", &cfg_type_block, 0, .sub = milter_static_modify_keys,
	  .help = "fixed modifications at the end of each message" },
	{ .name = NULL },
};

/* "<addr> args" -> addr, args */
static void split_addr(const char *text, struct str *addr, struct str *args)
{
	const char *sp = strchr(text, ' ');
	if (!sp) {
		*addr = str_cstr(text);
		*args = str_make("", 0);
		return;
	}
	*addr = str_make(text, (size_t)(sp - text));
	while (*sp == ' ')
		sp++;
	*args = str_cstr(sp);
}

static enum milter_verdict static_step(void *ctx, struct milter_session *ms)
{
	struct milter_static_conf *c = ctx;
	enum milter_step step = milter_session_step(ms);
	if (step == MILTER_STEP_EOM) {
		struct str n, v, a, args;
		uint32_t idx;
		const char *rest;
		int r = 0;
		for (char **p = c->add_header; p && *p && r == 0; p++)
			if ((r = split_header(*p, &n, &v)) == 0)
				r = milter_session_add_header(ms, n, v);
		for (char **p = c->insert_header; p && *p && r == 0; p++)
			if ((r = split_index(*p, &idx, &rest)) == 0 && (r = split_header(rest, &n, &v)) == 0)
				r = milter_session_insert_header(ms, idx, n, v);
		for (char **p = c->change_header; p && *p && r == 0; p++)
			if ((r = split_index(*p, &idx, &rest)) == 0 && (r = split_header(rest, &n, &v)) == 0)
				r = milter_session_change_header(ms, idx, n, v);
		for (char **p = c->add_rcpt; p && *p && r == 0; p++)
			r = milter_session_add_rcpt(ms, str_cstr(*p), STR_NULL);
		for (char **p = c->add_rcpt_par; p && *p && r == 0; p++) {
			split_addr(*p, &a, &args);
			r = milter_session_add_rcpt(ms, a, args);
		}
		for (char **p = c->del_rcpt; p && *p && r == 0; p++)
			r = milter_session_del_rcpt(ms, str_cstr(*p));
		if (c->change_from && r == 0) {
			split_addr(c->change_from, &a, &args);
			r = milter_session_change_from(ms, a, args);
		}
		if (c->replace_body && r == 0)
			r = milter_session_replace_body(ms, str_cstr(c->replace_body));
		if (c->quarantine && r == 0)
			r = milter_session_quarantine(ms, str_cstr(c->quarantine));
		if (r < 0) {
			session_log(milter_session_session(ms), LOG_LEVEL_WARNING,
				    "modification not sent: %s", r == -EPERM ?
				    "the MTA did not offer that action" : "invalid modification");
		}
		if (!c->set[step])
			return MILTER_ACCEPT;
	}
	if (c->verdict[step] == MILTER_REPLY &&
	    milter_session_set_reply(ms, str_cstr(c->reply[step])) < 0)
		return MILTER_TEMPFAIL;
	return c->verdict[step];
}

static void static_want(void *ctx, struct milter_want *ret)
{
	struct milter_static_conf *c = ctx;
	struct milter_want w = { 0 };
	for (int i = 0; i < MILTER_STEP_COUNT; i++)
		if (c->set[i]) {
			w.steps |= MILTER_STEP_BIT(i);
			w.replies |= MILTER_STEP_BIT(i);
		}
	if (c->add_header || c->insert_header)
		w.actions |= MILTER_ACT_ADDHDRS;
	if (c->change_header)
		w.actions |= MILTER_ACT_CHGHDRS;
	if (c->add_rcpt)
		w.actions |= MILTER_ACT_ADDRCPT;
	if (c->add_rcpt_par)
		w.actions |= MILTER_ACT_ADDRCPT_PAR;
	if (c->del_rcpt)
		w.actions |= MILTER_ACT_DELRCPT;
	if (c->change_from)
		w.actions |= MILTER_ACT_CHGFROM;
	if (c->replace_body)
		w.actions |= MILTER_ACT_CHGBODY;
	if (c->quarantine)
		w.actions |= MILTER_ACT_QUARANTINE;
	w.skip = c->set[MILTER_STEP_BODY] && c->verdict[MILTER_STEP_BODY] == MILTER_SKIP;
	*ret = w;
}

static void static_destroy(void *ctx)
{
	struct milter_static_conf *c = ctx;
	milter_static_conf_clear(c);
	free(c);
}

struct milter_handler *milter_static_new(struct milter_static_conf *conf)
{
	struct milter_handler *h = calloc(1, sizeof(*h));
	struct milter_static_conf *c = malloc(sizeof(*c));
	if (!h || !c) {
		free(h);
		free(c);
		return NULL;
	}
	*c = *conf;
	memset(conf, 0, sizeof(*conf));
	h->name = "static";
	h->want = static_want;
	for (int i = 0; i < MILTER_STEP_COUNT; i++)
		h->on_step[i] = static_step;
	h->destroy = static_destroy;
	h->ctx = c;
	atomic_init(&h->refs, 1);
	return h;
}
