/*
 * milter_static -- fixed replies and modifications (see milter_static.h).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

int milter_static_parse_action(const char *text, enum milter_step step,
			       enum milter_verdict *ret_verdict, char **ret_reply,
			       const char **ret_why)
{
	static const struct {
		const char *name;
		enum milter_verdict v;
	} words[] = {
		{ "continue", MILTER_CONTINUE }, { "accept", MILTER_ACCEPT },
		{ "reject", MILTER_REJECT },	 { "tempfail", MILTER_TEMPFAIL },
		{ "discard", MILTER_DISCARD },	 { "skip", MILTER_SKIP },
	};
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
