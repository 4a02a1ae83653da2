/*
 * milter_policy -- the rule set behind the milter (see milter_policy.h).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "live_sessions.h"
#include "milter_policy.h"
#include "util.h"

#define TAG_HEADER "X-Sluice-Limit"
#define MAX_HEADERS_KEPT 64
#define MAX_HEADER_BYTES (MAX_HEADERS_KEPT * (SELECTOR_MAX_NAME + SELECTOR_MAX_VALUE))

struct mp_handler {
	struct policy *policy;
	char macros[512]; /* "{auth_authen} ..." requested at every stage */
};

/* Per session (handler data). */
struct mp_session {
	struct policy_msg msg;
	struct class_slot *slot;
	/* a decision the store answers later (Redis): the session waits for it */
	struct policy_pending *pending;
	enum policy_stage pending_stage;
	struct mp_handler *h;
	struct milter_session *ms;
	const char *pending_class;
	/* the SMTP session in the table of live ones (the policy service looks there) */
	struct live_session_key live;
	bool live_held;
	unsigned accepted_rcpts;
	bool helo_done;           /* the helo rules ran for this SMTP session */
	uint64_t mail_size;       /* SIZE= given with MAIL */
	bool have_mail_size;
	/* first occurrence of each header, for header: selectors; the array is allocated
	 * with the first header kept (1 KiB that most sessions never need) */
	size_t nheaders;
	struct kept_header { uint32_t name_off, name_len, value_off, value_len; } *headers;
	struct buf header_bytes;
	uint64_t header_size;
};

struct txn_ctx {
	struct milter_session *ms;
	struct mp_session *st;
};

static struct mp_session *state(struct milter_session *ms)
{
	struct mp_session *st = milter_session_handler_data(ms);
	if (!st) {
		st = calloc(1, sizeof(*st));
		if (!st)
			return NULL;
		/* the milter sees where an SMTP session ends: sessions rules apply */
		if (policy_msg_track_sessions(&st->msg) < 0) {
			free(st);
			return NULL;
		}
		buf_init(&st->header_bytes, MAX_HEADER_BYTES);
		milter_session_set_handler_data(ms, st);
	}
	return st;
}

static bool txn_header(void *arg, const char *name, struct str *ret)
{
	struct txn_ctx *c = arg;
	struct mp_session *st = c->st;
	size_t nlen = strlen(name);
	for (size_t i = 0; i < st->nheaders; i++)
		if (st->headers[i].name_len == nlen &&
		    strncasecmp(st->header_bytes.ptr + st->headers[i].name_off, name, nlen) == 0) {
			*ret = str_make(st->header_bytes.ptr + st->headers[i].value_off,
					st->headers[i].value_len);
			return true;
		}
	return false;
}

static bool txn_macro(void *arg, const char *name, struct str *ret)
{
	struct txn_ctx *c = arg;
	return milter_session_macro(c->ms, name, ret);
}

static void fill_txn(struct milter_session *ms, struct mp_session *st, struct txn_ctx *c,
		     struct policy_txn *t)
{
	enum milter_step step = milter_session_step(ms);
	memset(t, 0, sizeof(*t));
	c->ms = ms;
	c->st = st;
	t->client_addr = milter_session_client_addr(ms);
	t->client_name = milter_session_client_host(ms);
	t->helo = milter_session_helo(ms);
	struct str v;
	if (milter_session_macro(ms, "{auth_authen}", &v))
		t->sasl_user = v;
	if (step >= MILTER_STEP_MAIL && step != MILTER_STEP_UNKNOWN) {
		t->have_sender = true;
		t->sender = milter_session_sender(ms);
	}
	if (step == MILTER_STEP_RCPT)
		t->rcpt = milter_session_rcpt(ms);
	t->rcpt_count = st->accepted_rcpts;
	if (step == MILTER_STEP_EOM) {
		t->size = st->header_size + milter_session_body_size(ms);
		t->have_size = true;
	} else {
		/* SIZE= from MAIL, remembered there (the session keeps only the current
		 * step's arguments) */
		t->size = st->mail_size;
		t->have_size = st->have_mail_size;
	}
	t->header = txn_header;
	t->macro = txn_macro;
	t->arg = c;
}

static uint64_t mail_size_arg(struct milter_session *ms, bool *found)
{
	const struct str *args;
	size_t n = milter_session_esmtp_args(ms, &args);
	*found = false;
	for (size_t i = 0; i < n; i++)
		if (args[i].len > 5 && strncasecmp(args[i].ptr, "SIZE=", 5) == 0) {
			uint64_t v = 0;
			for (size_t k = 5; k < args[i].len; k++) {
				char ch = args[i].ptr[k];
				if (ch < '0' || ch > '9' || v > UINT64_MAX / 10 - 10)
					return 0;
				v = v * 10 + (uint64_t)(ch - '0');
			}
			*found = true;
			return v;
		}
	return 0;
}

static void log_over(struct milter_session *ms, const struct policy_decision *d,
		     enum policy_stage st)
{
	struct session *s = milter_session_session(ms);
	char peer[120];
	struct str addr = milter_session_client_addr(ms);
	log_quote(peer, sizeof(peer), addr, 60);
	struct policy_log_ctx ctx = { .client = addr, .helo = milter_session_helo(ms) };
	if (st >= POLICY_MAIL)
		ctx.from = milter_session_sender(ms);
	if (st == POLICY_RCPT)
		ctx.rcpt = milter_session_rcpt(ms);
	/* the MTA's queue id, macro i (Postfix sends it from MAIL FROM on) */
	milter_session_macro(ms, "i", &ctx.qid);
	policy_decision_log(d, st, &ctx, session_log_line, s);
	if (d->store_error == STORE_TEMPFAIL)
		session_log(s, LOG_LEVEL_WARNING, "limit store unavailable (on_failure tempfail): "
			    "answering the %s with \"%s\" client=%s", policy_stage_name(st), d->reply,
			    peer);
	else if (d->store_error)
		session_log(s, LOG_LEVEL_ERROR, "limit store error (%s): letting the %s through",
			    strerror(-d->store_error), policy_stage_name(st));
}

static enum milter_verdict verdict(struct milter_session *ms, struct policy_decision *d)
{
	switch (d->action) {
	case POLICY_TEMPFAIL:
	case POLICY_REJECT:
		if (milter_session_set_reply(ms, str_cstr(d->reply)) < 0)
			return d->action == POLICY_REJECT ? MILTER_REJECT : MILTER_TEMPFAIL;
		return MILTER_REPLY;
	case POLICY_DISCARD:
		return MILTER_DISCARD;
	default:
		return MILTER_CONTINUE;
	}
}

/* Forget the message's own state (at its end, and at MAIL when MAIL is negotiated). */
static void message_reset(struct mp_session *st)
{
	st->accepted_rcpts = 0;
	st->mail_size = 0;
	st->have_mail_size = false;
	st->nheaders = 0;
	st->header_size = 0;
	buf_reset(&st->header_bytes);
}

/* End of message, accepted so far: tags and quarantine, then the ledger is closed. */
static enum milter_verdict eom_accept(struct mp_handler *h, struct milter_session *ms,
				      struct mp_session *st)
{
	for (size_t i = 0; i < st->msg.ntags; i++)
		if (milter_session_add_header(ms, str_cstr(TAG_HEADER), str_cstr(st->msg.marks->tags[i])) < 0)
			session_log(milter_session_session(ms), LOG_LEVEL_WARNING,
				    "cannot add the %s header: the MTA did not offer it", TAG_HEADER);
	if (st->msg.quarantine &&
	    milter_session_quarantine(ms, str_cstr(st->msg.marks->quarantine_reason)) < 0)
		session_log(milter_session_session(ms), LOG_LEVEL_WARNING,
			    "cannot quarantine: the MTA did not offer it");
	policy_msg_end(h->policy, &st->msg, true, realtime_ns());
	message_reset(st);
	return MILTER_ACCEPT;
}

/* What a stage does with its decision (NULL: no rule ran, so it passes), answered now or
 * after the store's round trip. */
static enum milter_verdict after(struct mp_handler *h, struct milter_session *ms,
				 struct mp_session *st, enum policy_stage stage,
				 struct policy_decision *d)
{
	if (d && (d->nover || d->store_error))
		log_over(ms, d, stage);
	enum milter_verdict v = d ? verdict(ms, d) : MILTER_CONTINUE;
	if (v != MILTER_CONTINUE && stage >= POLICY_DATA)
		policy_msg_end(h->policy, &st->msg, false, realtime_ns());
	switch (stage) {
	case POLICY_HELO:
		/* HELO comes again after STARTTLS, and clients repeat EHLO: the rules run once
		 * per SMTP session, or a per-connection count would charge twice */
		if (v == MILTER_CONTINUE)
			st->helo_done = true;
		break;
	case POLICY_RCPT:
		if (v == MILTER_CONTINUE)
			st->accepted_rcpts++;
		break;
	case POLICY_EOM:
		if (v != MILTER_CONTINUE)
			message_reset(st); /* refused: its charges went back above */
		else
			v = eom_accept(h, ms, st);
		break;
	default:
		break;
	}
	/* a tarpit: an event that passes is answered after the longest delay of the delay
	 * rules over their limits (a refusal is not delayed) */
	if (d && d->delay_ms && (v == MILTER_CONTINUE || v == MILTER_ACCEPT)) {
		milter_session_delay(ms, d->delay_ms);
		session_log(milter_session_session(ms), LOG_LEVEL_INFO, "delay stage=%s wait=%llums",
			    policy_stage_name(stage), (unsigned long long)d->delay_ms);
	}
	return v;
}

static void on_decided(void *arg, struct policy_decision *d)
{
	struct mp_session *st = arg;
	st->pending = NULL;
	milter_session_resume(st->ms, after(st->h, st->ms, st, st->pending_stage, d));
}

static enum milter_verdict run(struct mp_handler *h, struct milter_session *ms,
			       enum policy_stage stage)
{
	struct mp_session *st = state(ms);
	if (!st)
		return MILTER_TEMPFAIL;
	if (!policy_has_stage(h->policy, stage))
		return after(h, ms, st, stage, NULL);
	struct txn_ctx c;
	struct policy_txn t;
	fill_txn(ms, st, &c, &t);
	struct policy_decision d;
	d.results = NULL;
	d.max_results = 0;
	st->h = h;
	st->ms = ms;
	st->pending_stage = stage;
	if (policy_check_start(h->policy, &t, stage, &st->msg, STORE_CHECK, realtime_ns(), &d,
			       on_decided, st, &st->pending) == 1)
		return MILTER_PENDING;
	return after(h, ms, st, stage, &d);
}

static enum milter_verdict class_full(struct milter_session *ms, const char *cls)
{
	char peer[120];
	log_quote(peer, sizeof(peer), milter_session_client_addr(ms), 60);
	char reply[160];
	fmt_fixed(reply, sizeof(reply), "421 4.7.0 Too many sessions from your "
		  "network (class %s), try again later", cls);
	/* a decision line as the rules' (class names have no spaces: checked at load) */
	session_log(milter_session_session(ms), LOG_LEVEL_NOTICE,
		    "decision class=%s action=tempfail reply=\"%s\" stage=connect client=%s%s%s",
		    cls, reply, strchr(peer, ' ') ? "\"" : "", peer, strchr(peer, ' ') ? "\"" : "");
	if (milter_session_set_reply(ms, str_cstr(reply)) < 0)
		return MILTER_TEMPFAIL;
	return MILTER_REPLY;
}

/* After the class: the connect rules. */
static enum milter_verdict connect_rules(struct mp_handler *h, struct milter_session *ms)
{
	if (!policy_has_stage(h->policy, POLICY_CONNECT))
		return MILTER_CONTINUE;
	return run(h, ms, POLICY_CONNECT);
}

static void on_class_done(void *arg, int rc)
{
	struct mp_session *st = arg;
	st->pending = NULL;
	enum milter_verdict v = rc ? connect_rules(st->h, st->ms) : class_full(st->ms, st->pending_class);
	if (v != MILTER_PENDING)
		milter_session_resume(st->ms, v);
}

/* The SMTP session of this milter connection ended (a new CONNECT follows, or the
 * connection closes): its sessions rules' slots and its place among the live sessions go. */
static void smtp_session_end(struct mp_session *st)
{
	policy_sessions_end(&st->msg);
	if (st->live_held)
		live_sessions_leave(&st->live, LIVE_MILTER);
	st->live_held = false;
}

/* The SMTP session starts: recorded among the live ones, where the policy service finds
 * it if the same MTA asks it too (or where the milter finds the policy service's). */
static void note_live(struct milter_session *ms, struct mp_session *st)
{
	struct str addr = milter_session_client_addr(ms);
	unsigned port = milter_session_client_port(ms);
	if (live_sessions_key(addr, port, &st->live) < 0)
		return;
	int r = live_sessions_enter(&st->live, LIVE_MILTER);
	st->live_held = r >= 0;
	if (r == 1 && live_sessions_claim_warning()) {
		char peer[120];
		log_quote(peer, sizeof(peer), addr, 60);
		session_log(milter_session_session(ms), LOG_LEVEL_WARNING,
			    "%s (first seen: client=%s port=%u)", LIVE_SESSIONS_WARNING, peer, port);
	}
}

static enum milter_verdict on_connect(void *ctx, struct milter_session *ms)
{
	struct mp_handler *h = ctx;
	struct mp_session *st = state(ms);
	if (!st)
		return MILTER_TEMPFAIL;
	smtp_session_end(st); /* a second CONNECT on one milter connection (after QUIT_NC) */
	note_live(ms, st);
	if (policy_has_classes(h->policy)) {
		st->helo_done = false;
		struct ipaddr ip;
		bool have_ip = ipaddr_parse(milter_session_client_addr(ms), &ip) == 0;
		struct str name = milter_session_client_host(ms);
		if (name.len && name.ptr[0] == '[')
			name = STR_NULL; /* Postfix: no verified name */
		const char *cls = NULL;
		if (st->slot) {
			/* a second CONNECT on one milter connection (after QUIT_NC) */
			policy_class_release(h->policy, st->slot);
			st->slot = NULL;
		}
		st->h = h;
		st->ms = ms;
		int r = policy_class_enter_start(h->policy, have_ip ? &ip : NULL, name, &st->slot,
						 &cls, on_class_done, st, &st->pending);
		if (r == 2) {
			st->pending_class = cls;
			return MILTER_PENDING;
		}
		if (r == 0)
			return class_full(ms, cls);
	}
	return connect_rules(h, ms);
}

static enum milter_verdict on_helo(void *ctx, struct milter_session *ms)
{
	struct mp_handler *h = ctx;
	struct mp_session *st = state(ms);
	if (!st)
		return MILTER_TEMPFAIL;
	if (!policy_has_stage(h->policy, POLICY_HELO) || st->helo_done)
		return MILTER_CONTINUE;
	return run(h, ms, POLICY_HELO);
}

static enum milter_verdict on_mail(void *ctx, struct milter_session *ms)
{
	struct mp_session *st = state(ms);
	if (!st)
		return MILTER_TEMPFAIL;
	message_reset(st);
	st->mail_size = mail_size_arg(ms, &st->have_mail_size);
	struct mp_handler *h = ctx;
	if (!policy_has_stage(h->policy, POLICY_MAIL))
		return MILTER_CONTINUE;
	return run(h, ms, POLICY_MAIL);
}

static enum milter_verdict on_rcpt(void *ctx, struct milter_session *ms)
{
	/* without rcpt rules too: recipients are counted (after()) */
	return run(ctx, ms, POLICY_RCPT);
}

static enum milter_verdict on_header(void *ctx, struct milter_session *ms)
{
	struct mp_handler *h = ctx;
	struct mp_session *st = state(ms);
	if (!st)
		return MILTER_TEMPFAIL;
	struct str n = milter_session_header_name(ms), v = milter_session_header_value(ms);
	st->header_size += n.len + v.len + 4;
	/* Only the headers rules read, so that no amount of other headers can push them out
	 * of what is kept; each value cut to what a key uses. */
	const struct policy_names *names = &policy_needs(h->policy)->headers;
	bool wanted = false;
	for (size_t i = 0; i < names->n && !wanted; i++)
		wanted = strlen(names->v[i]) == n.len && strncasecmp(names->v[i], n.ptr, n.len) == 0;
	if (!wanted || st->nheaders == MAX_HEADERS_KEPT)
		return MILTER_CONTINUE;
	if (!st->headers && !(st->headers = calloc(MAX_HEADERS_KEPT, sizeof(*st->headers))))
		return MILTER_CONTINUE; /* XXX out of memory: the header's rules see no value */
	if (v.len > SELECTOR_MAX_VALUE)
		v.len = SELECTOR_MAX_VALUE;
	for (size_t i = 0; i < st->nheaders; i++)
		if (st->headers[i].name_len == n.len &&
		    strncasecmp(st->header_bytes.ptr + st->headers[i].name_off, n.ptr, n.len) == 0)
			return MILTER_CONTINUE; /* the first occurrence counts */
	size_t off = st->header_bytes.len;
	if (buf_append_str(&st->header_bytes, n) < 0 || buf_append_str(&st->header_bytes, v) < 0) {
		buf_truncate(&st->header_bytes, off); /* over the cap: not kept */
		return MILTER_CONTINUE;
	}
	st->headers[st->nheaders].name_off = (uint32_t)off;
	st->headers[st->nheaders].name_len = (uint32_t)n.len;
	st->headers[st->nheaders].value_off = (uint32_t)(off + n.len);
	st->headers[st->nheaders].value_len = (uint32_t)v.len;
	st->nheaders++;
	return MILTER_CONTINUE;
}

static enum milter_verdict on_eoh(void *ctx, struct milter_session *ms)
{
	struct mp_handler *h = ctx;
	if (!policy_has_stage(h->policy, POLICY_DATA))
		return MILTER_CONTINUE;
	return run(h, ms, POLICY_DATA);
}

static enum milter_verdict on_body(void *ctx, struct milter_session *ms)
{
	(void)ctx;
	(void)ms;
	return MILTER_CONTINUE; /* only counted (body size) by the session */
}

static enum milter_verdict on_eom(void *ctx, struct milter_session *ms)
{
	/* without eom rules too: tags, quarantine and the ledger's end (after()) */
	return run(ctx, ms, POLICY_EOM);
}

static void on_abort(void *ctx, struct milter_session *ms)
{
	struct mp_handler *h = ctx;
	struct mp_session *st = milter_session_handler_data(ms);
	if (st) {
		policy_msg_end(h->policy, &st->msg, false, realtime_ns());
		message_reset(st);
	}
}

static void on_close(void *ctx, struct milter_session *ms)
{
	struct mp_handler *h = ctx;
	struct mp_session *st = milter_session_handler_data(ms);
	if (!st)
		return;
	policy_pending_cancel(st->pending);
	st->pending = NULL;
	policy_msg_end(h->policy, &st->msg, false, realtime_ns());
	smtp_session_end(st);
	policy_msg_clear(&st->msg);
	policy_class_release(h->policy, st->slot);
	buf_done(&st->header_bytes);
	free(st->headers);
	free(st);
	milter_session_set_handler_data(ms, NULL);
}

static void mp_want(void *ctx, struct milter_want *ret)
{
	struct mp_handler *h = ctx;
	struct policy *p = h->policy;
	const struct policy_needs *nd = policy_needs(p);
	struct milter_want w = { 0 };
	uint32_t need = 0, reply = 0;
	bool message = false;
	if (policy_has_classes(p) || policy_has_stage(p, POLICY_CONNECT)) {
		need |= MILTER_STEP_BIT(MILTER_STEP_CONNECT);
		reply |= MILTER_STEP_BIT(MILTER_STEP_CONNECT);
	}
	/* later rules that read the client or the HELO name need those steps, without a
	 * reply when no rule decides there */
	if (nd->client)
		need |= MILTER_STEP_BIT(MILTER_STEP_CONNECT);
	if (nd->helo)
		need |= MILTER_STEP_BIT(MILTER_STEP_HELO);
	/* a decision's log line names the client, the HELO name and the sender: with any
	 * rule, those steps come too (without a reply, the MTA does not wait for them) */
	if (policy_rule_count(p))
		need |= MILTER_STEP_BIT(MILTER_STEP_CONNECT) | MILTER_STEP_BIT(MILTER_STEP_HELO) |
			MILTER_STEP_BIT(MILTER_STEP_MAIL);
	static const struct {
		enum policy_stage ps;
		enum milter_step ms;
	} map[] = {
		{ POLICY_HELO, MILTER_STEP_HELO }, { POLICY_MAIL, MILTER_STEP_MAIL },
		{ POLICY_RCPT, MILTER_STEP_RCPT }, { POLICY_DATA, MILTER_STEP_EOH },
		{ POLICY_EOM, MILTER_STEP_EOM },
	};
	for (size_t i = 0; i < ARRAY_SIZE(map); i++)
		if (policy_has_stage(p, map[i].ps)) {
			need |= MILTER_STEP_BIT(map[i].ms);
			reply |= MILTER_STEP_BIT(map[i].ms);
			if (map[i].ps >= POLICY_MAIL)
				message = true;
		}
	if (message || nd->message_actions) {
		/* the message's fate decides refunds (the session says where a message ends,
		 * with or without MAIL); recipients are counted */
		need |= MILTER_STEP_BIT(MILTER_STEP_RCPT) | MILTER_STEP_BIT(MILTER_STEP_EOM);
		reply |= MILTER_STEP_BIT(MILTER_STEP_EOM);
	}
	if (nd->mail_size || nd->sender)
		need |= MILTER_STEP_BIT(MILTER_STEP_MAIL); /* the sender, SIZE=, {auth_authen} */
	/* headers for header: selectors; headers and body for the real size of bytes rules
	 * at eom (otherwise the body does not pass through sluice at all) */
	if (nd->eom_bytes || nd->headers.n)
		need |= MILTER_STEP_BIT(MILTER_STEP_HEADER);
	if (nd->eom_bytes)
		need |= MILTER_STEP_BIT(MILTER_STEP_BODY);
	if (nd->message_actions)
		w.actions |= MILTER_ACT_ADDHDRS | MILTER_ACT_QUARANTINE;
	w.steps = need;
	w.replies = reply;
	if (h->macros[0])
		for (int i = 0; i < MILTER_MACROS_COUNT; i++)
			w.macros[i] = h->macros;
	*ret = w;
}

static void mp_destroy(void *ctx)
{
	struct mp_handler *h = ctx;
	policy_unref(h->policy);
	free(h);
}

struct milter_handler *milter_policy_new(struct policy *p)
{
	struct milter_handler *mh = calloc(1, sizeof(*mh));
	struct mp_handler *h = calloc(1, sizeof(*h));
	if (!mh || !h) {
		free(mh);
		free(h);
		return NULL;
	}
	h->policy = policy_ref(p);
	/* {auth_authen} for sasl_user, i (the queue id) for the logs, and what macro:
	 * selectors name */
	const struct policy_names *names = &policy_needs(p)->macros;
	struct buf b;
	buf_init_fixed(&b, h->macros, sizeof(h->macros));
	buf_append_cstr(&b, "{auth_authen} i");
	for (size_t i = 0; i < names->n; i++) {
		buf_append_byte(&b, ' ');
		if (names->v[i][0] != '{' && strlen(names->v[i]) > 1)
			buf_printf(&b, "{%s}", names->v[i]);
		else
			buf_append_cstr(&b, names->v[i]);
	}
	mh->name = "policy";
	mh->want = mp_want;
	mh->on_step[MILTER_STEP_CONNECT] = on_connect;
	mh->on_step[MILTER_STEP_HELO] = on_helo;
	mh->on_step[MILTER_STEP_MAIL] = on_mail;
	mh->on_step[MILTER_STEP_RCPT] = on_rcpt;
	mh->on_step[MILTER_STEP_HEADER] = on_header;
	mh->on_step[MILTER_STEP_EOH] = on_eoh;
	mh->on_step[MILTER_STEP_BODY] = on_body;
	mh->on_step[MILTER_STEP_EOM] = on_eom;
	mh->on_abort = on_abort;
	mh->on_close = on_close;
	mh->destroy = mp_destroy;
	mh->ctx = h;
	atomic_init(&mh->refs, 1);
	return mh;
}
