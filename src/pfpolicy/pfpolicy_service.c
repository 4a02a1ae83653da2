/*
 * pfpolicy_service -- Postfix policy delegation over the rule set (see the header).
 */
#include <errno.h>
#include <event2/buffer.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "live_sessions.h"
#include "pfpolicy.h"
#include "pfpolicy_service.h"
#include "util.h"

#define INSTANCE_MAX 128
#define SESSION_MAX 200

struct pf_service {
	pthread_mutex_t lock;
	struct policy *policy;  /* under lock */
	size_t max_request;     /* under lock */
};

struct pf_conn {
	struct pf_service *svc;
	struct pfpolicy_parser parser;
	size_t max_request;
	/* the SMTP session under way: client and server address and port */
	char session[SESSION_MAX + 1];
	int conn_done;          /* highest of connect, helo whose rules ran; -1 none */
	/* the SMTP session among the live ones (the milter looks there, and we there) */
	struct live_session_key live;
	bool live_held;
	/* the message under way (Postfix sets instance once MAIL is accepted) */
	char instance[INSTANCE_MAX + 1];
	struct policy *policy;  /* the rule set the message started with */
	bool mail_done;         /* the mail rules ran for this message */
	struct policy_msg msg;
	struct buf out;
	/* the request under way: its stages run in turn, and one may wait for the store
	 * (Redis), with the session paused and the request left in the input buffer */
	struct session *s;
	struct policy_pending *pending;
	bool draining;          /* sluiced is stopping: end once no request is under way */
	struct pfpolicy_request req;  /* slices into the input, or into held while pending */
	char *held;                   /* the request's bytes, copied when it must wait */
	int stage, cur, last_once;
	struct policy_decision best;
	uint64_t delay_ms;      /* the delays of the request's stages that passed */
	uint64_t now;
};

static struct policy *current_policy(struct pf_service *ps, size_t *max_request)
{
	pthread_mutex_lock(&ps->lock);
	struct policy *p = policy_ref(ps->policy);
	if (max_request)
		*max_request = ps->max_request;
	pthread_mutex_unlock(&ps->lock);
	return p;
}

static int pf_open(struct session *s)
{
	struct pf_service *ps = service_arg(session_service(s));
	struct pf_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->svc = ps;
	c->conn_done = -1;
	pthread_mutex_lock(&ps->lock);
	c->max_request = ps->max_request;
	pthread_mutex_unlock(&ps->lock);
	buf_init(&c->out, PFPOLICY_MAX_ACTION + 64);
	session_set_data(s, c);
	return 0;
}

static void end_message(struct pf_conn *c)
{
	if (c->policy) {
		/* The MTA does not say how a message ended; what was not refused by sluice
		 * stays counted. */
		policy_msg_end(c->policy, &c->msg, true, realtime_ns());
		policy_unref(c->policy);
		c->policy = NULL;
	}
	c->instance[0] = '\0';
	c->mail_done = false;
}

static void pf_close(struct session *s)
{
	struct pf_conn *c = session_data(s);
	if (!c)
		return;
	policy_pending_cancel(c->pending);
	if (c->live_held)
		live_sessions_leave(&c->live, LIVE_POLICY);
	free(c->held);
	end_message(c);
	policy_msg_clear(&c->msg);
	buf_done(&c->out);
	free(c);
}

static const struct {
	const char *name;
	enum policy_stage stage;
} states[] = {
	{ "CONNECT", POLICY_CONNECT }, { "EHLO", POLICY_HELO },	      { "HELO", POLICY_HELO },
	{ "MAIL", POLICY_MAIL },       { "RCPT", POLICY_RCPT },	      { "DATA", POLICY_DATA },
	{ "BDAT", POLICY_DATA },       { "END-OF-MESSAGE", POLICY_EOM },
};

static bool attr_macro(void *arg, const char *name, struct str *ret)
{
	const struct pfpolicy_request *r = arg;
	char tmp[PFPOLICY_MAX_NAME + 1];
	size_t n = strlen(name);
	if (n >= 2 && name[0] == '{' && name[n - 1] == '}' && n - 2 <= PFPOLICY_MAX_NAME) {
		memcpy(tmp, name + 1, n - 2);
		tmp[n - 2] = '\0';
		name = tmp;
	}
	struct str v = pfpolicy_get(r, name);
	if (!v.ptr)
		return false;
	*ret = v;
	return true;
}

static uint64_t parse_u64(struct str v, bool *ok)
{
	uint64_t n = 0;
	*ok = v.len > 0;
	for (size_t i = 0; i < v.len; i++) {
		if (v.ptr[i] < '0' || v.ptr[i] > '9' || n > UINT64_MAX / 10 - 10) {
			*ok = false;
			return 0;
		}
		n = n * 10 + (uint64_t)(v.ptr[i] - '0');
	}
	return n;
}

static void fill_txn(const struct pfpolicy_request *r, enum policy_stage st,
		     struct policy_txn *t)
{
	memset(t, 0, sizeof(*t));
	t->client_addr = pfpolicy_get(r, "client_address");
	t->client_name = pfpolicy_get(r, "client_name");
	t->helo = pfpolicy_get(r, "helo_name");
	t->sasl_user = pfpolicy_get(r, "sasl_username");
	t->have_sender = st >= POLICY_MAIL;
	t->sender = pfpolicy_get(r, "sender"); /* empty: the null sender */
	t->rcpt = st == POLICY_RCPT ? pfpolicy_get(r, "recipient") : STR_NULL;
	bool ok;
	uint64_t size = parse_u64(pfpolicy_get(r, "size"), &ok);
	t->size = size;
	t->have_size = ok && size > 0;
	uint64_t rc = parse_u64(pfpolicy_get(r, "recipient_count"), &ok);
	t->rcpt_count = ok && rc < 1000000 ? (unsigned)rc : 0;
	t->macro = attr_macro;
	t->arg = (void *)r;
}

static void log_over(struct session *s, const struct policy_decision *d, enum policy_stage st,
		     const struct pfpolicy_request *r)
{
	char peer[120], qid[40];
	log_quote(peer, sizeof(peer), pfpolicy_get(r, "client_address"), 60);
	log_quote(qid, sizeof(qid), pfpolicy_get(r, "queue_id"), 20);
	struct policy_log_ctx ctx = {
		.client = pfpolicy_get(r, "client_address"),
		.helo = pfpolicy_get(r, "helo_name"),
		.qid = pfpolicy_get(r, "queue_id"),
	};
	if (st >= POLICY_MAIL) {
		/* the null sender comes empty: shown <>, as the milter shows it */
		ctx.from = pfpolicy_get(r, "sender");
		if (ctx.from.len == 0)
			ctx.from = str_cstr("<>");
	}
	if (st == POLICY_RCPT)
		ctx.rcpt = pfpolicy_get(r, "recipient");
	policy_decision_log(d, st, &ctx, session_log_line, s);
	if (d->store_error == STORE_TEMPFAIL)
		session_log(s, LOG_LEVEL_WARNING, "limit store unavailable (on_failure tempfail): "
			    "answering \"%s\" client=%s qid=%s", d->reply, peer, qid);
	else if (d->store_error)
		session_log(s, LOG_LEVEL_ERROR, "limit store error (%s): answering DUNNO",
			    strerror(-d->store_error));
}

/* The action text for a decision at stage st. */
static void action_text(const struct policy_decision *d, const struct policy_msg *m,
			enum policy_stage st, char *out, size_t len)
{
	switch (d->action) {
	case POLICY_TEMPFAIL:
	case POLICY_REJECT:
		fmt_fixed(out, len, "%s", d->reply);
		return;
	case POLICY_DISCARD:
		fmt_fixed(out, len, "DISCARD sluice limit %s", policy_rule_name(d->rule));
		return;
	case POLICY_QUARANTINE:
		fmt_fixed(out, len, "HOLD sluice limit %s", policy_rule_name(d->rule));
		return;
	case POLICY_TAG:
		/* Postfix ignores PREPEND at END-OF-MESSAGE */
		if (st != POLICY_EOM) {
			fmt_fixed(out, len, "PREPEND X-Sluice-Limit: rule=%s; key=%s",
				  policy_rule_name(d->rule), d->key);
			return;
		}
		break;
	default:
		break;
	}
	fmt_fixed(out, len, "DUNNO");
}

static void answer(struct session *s, struct pf_conn *c, const char *action)
{
	buf_reset(&c->out);
	if (pfpolicy_put_action(&c->out, str_cstr(action)) < 0) {
		buf_reset(&c->out);
		pfpolicy_put_action(&c->out, str_cstr("DUNNO"));
	}
	session_write(s, c->out.ptr, c->out.len);
}

/* One stage's decision into the request's answer.  True when the request is decided. */
static bool stage_done(struct session *s, struct pf_conn *c, int st, struct policy_decision *d)
{
	if (d->nover || d->store_error)
		log_over(s, d, (enum policy_stage)st, &c->req);
	if (d->action > c->best.action)
		c->best = *d;
	/* each stage's event would have waited its own delay: the answer waits them all */
	c->delay_ms += d->delay_ms;
	if (c->best.action >= POLICY_DISCARD)
		return true;
	if (st <= POLICY_HELO)
		c->conn_done = st;
	else if (st == POLICY_MAIL)
		c->mail_done = true;
	return st == c->stage;
}

static void on_decided(void *arg, struct policy_decision *d);

/*
 * The stages before RCPT not run yet -- connect and helo once per SMTP session, mail once
 * per message -- then the request's own stage.  A stage that refused is not marked done:
 * it runs again at the next request (a refused event was not counted, so running it
 * again counts nothing twice).  Returns false when a stage waits for the store.
 */
static bool run_stages(struct session *s, struct pf_conn *c)
{
	for (;;) {
		int st = c->cur;
		if ((st <= POLICY_HELO && st <= c->conn_done) || (st == POLICY_MAIL && c->mail_done)) {
			if (st == c->stage)
				return true;
		} else {
			struct policy_txn t;
			struct policy_decision d;
			fill_txn(&c->req, (enum policy_stage)st, &t);
			d.results = NULL;
			d.max_results = 0;
			if (policy_check_start(c->policy, &t, (enum policy_stage)st, &c->msg,
					       STORE_CHECK, c->now, &d, on_decided, c,
					       &c->pending) == 1)
				return false;
			if (stage_done(s, c, st, &d))
				return true;
		}
		c->cur = st == c->last_once ? c->stage : st + 1;
	}
}

static void conclude(struct session *s, struct pf_conn *c)
{
	char action[PFPOLICY_MAX_ACTION];
	if (c->best.action >= POLICY_DISCARD && c->stage >= POLICY_DATA)
		policy_msg_end(c->policy, &c->msg, false, c->now);
	action_text(&c->best, &c->msg, (enum policy_stage)c->stage, action, sizeof(action));
	if (c->delay_ms && c->best.action < POLICY_DISCARD) {
		/*
		 * A tarpit through Postfix: an action that is no access(5) action is read as a
		 * list of restrictions (smtpd_check.c, check_table_result() -> generic_checks()),
		 * and the restriction "sleep N" pauses smtpd for N seconds, then goes on as
		 * DUNNO (postconf(5); Postfix 2.3 and later).  Whole seconds: rounded up.  One
		 * answer holds one action: a PREPEND or HOLD of the same decision wins.
		 */
		uint64_t ms = c->delay_ms > 300000 ? 300000 : c->delay_ms;
		if (strcmp(action, "DUNNO") == 0) {
			fmt_fixed(action, sizeof(action), "sleep %llu",
				  (unsigned long long)((ms + 999) / 1000));
			session_log(s, LOG_LEVEL_INFO, "delay stage=%s wait=%llums answer=\"%s\"",
				    policy_stage_name((enum policy_stage)c->stage),
				    (unsigned long long)ms, action);
		} else {
			session_log(s, LOG_LEVEL_INFO, "delay stage=%s wait=%llums not applied: the "
				    "answer is \"%.40s\" (one action per answer)",
				    policy_stage_name((enum policy_stage)c->stage),
				    (unsigned long long)ms, action);
		}
	}
	answer(s, c, action);
}

static void on_decided(void *arg, struct policy_decision *d)
{
	struct pf_conn *c = arg;
	struct session *s = c->s;
	int st = c->cur;
	c->pending = NULL;
	if (!stage_done(s, c, st, d)) {
		c->cur = st == c->last_once ? c->stage : st + 1;
		if (!run_stages(s, c))
			return;
	}
	conclude(s, c);
	free(c->held);
	c->held = NULL;
	if (c->draining && session_input_length(s) == 0) {
		session_close(s); /* after the answer is written */
		return;
	}
	session_resume(s); /* reads what came meanwhile; may end the session */
}

/*
 * A new SMTP session on this connection: it replaces the previous one among the live
 * sessions.  If the milter serves it too (the same client address and port), one MTA
 * uses both protocols and every event is decided, and counted, twice: it is counted for
 * `sluice status`, and logged once.  Only detected, not corrected: the two cannot share
 * the decisions exactly (Postfix asks the policy service at CONNECT, with
 * smtpd_delay_reject = no, before it tells the milter, and writes the milter's CONNECT,
 * HELO and MAIL, when they await no reply, only with its RCPT, after the policy
 * service's RCPT; and two MTAs may see one client address and port).
 */
static void note_live(struct session *s, struct pf_conn *c, const struct pfpolicy_request *r)
{
	if (c->live_held)
		live_sessions_leave(&c->live, LIVE_POLICY);
	c->live_held = false;
	bool ok;
	struct str addr = pfpolicy_get(r, "client_address");
	uint64_t port = parse_u64(pfpolicy_get(r, "client_port"), &ok);
	if (!ok || port > 65535 || live_sessions_key(addr, (unsigned)port, &c->live) < 0)
		return;
	int e = live_sessions_enter(&c->live, LIVE_POLICY);
	c->live_held = e >= 0;
	if (e == 1 && live_sessions_claim_warning()) {
		char peer[120];
		log_quote(peer, sizeof(peer), addr, 60);
		session_log(s, LOG_LEVEL_WARNING, "%s (first seen: client=%s port=%llu)",
			    LIVE_SESSIONS_WARNING, peer, (unsigned long long)port);
	}
}

/* Returns false when the answer waits for the store (the request stays in the input). */
static bool handle(struct session *s, struct pf_conn *c, const struct pfpolicy_request *r)
{
	struct str state = pfpolicy_get(r, "protocol_state");
	struct str request = pfpolicy_get(r, "request");
	if (!str_eq_cstr(request, "smtpd_access_policy")) {
		char q[80];
		log_quote(q, sizeof(q), request, 40);
		session_log(s, LOG_LEVEL_WARNING, "request=%s is not smtpd_access_policy: DUNNO", q);
		answer(s, c, "DUNNO");
		return true;
	}
	int stage = -1;
	for (size_t i = 0; i < ARRAY_SIZE(states); i++)
		if (state.len == strlen(states[i].name) &&
		    strncasecmp(state.ptr, states[i].name, state.len) == 0)
			stage = (int)states[i].stage;
	if (stage < 0) { /* VRFY, ETRN: nothing to count */
		answer(s, c, "DUNNO");
		return true;
	}
	/*
	 * One connection serves the SMTP sessions of one smtpd process in turn.  A session
	 * is told by its endpoints (client_port exists since Postfix 3.0); a message by
	 * instance, which Postfix sets only once MAIL is accepted: requests before it (with
	 * smtpd_delay_reject = no) belong to the message that follows.
	 */
	static const char *const ends[] = { "client_address", "client_port", "server_address",
					    "server_port" };
	char sess[SESSION_MAX + 1];
	struct buf sb;
	buf_init_fixed(&sb, sess, sizeof(sess));
	for (size_t i = 0; i < ARRAY_SIZE(ends); i++) {
		/* values are slices of the request, not NUL-terminated strings */
		struct str v = pfpolicy_get(r, ends[i]);
		if (v.len > SESSION_MAX / ARRAY_SIZE(ends) - 1)
			v.len = SESSION_MAX / ARRAY_SIZE(ends) - 1;
		buf_append_str(&sb, v);
		buf_append_byte(&sb, '|');
	}
	if (strcmp(sess, c->session) != 0) {
		end_message(c);
		memcpy(c->session, sess, sizeof(sess));
		c->conn_done = -1;
		note_live(s, c, r);
	}
	struct str inst = pfpolicy_get(r, "instance");
	if (inst.len > INSTANCE_MAX)
		inst.len = INSTANCE_MAX;
	if (inst.len && (inst.len != strlen(c->instance) ||
			 memcmp(inst.ptr, c->instance, inst.len) != 0)) {
		if (c->instance[0])
			end_message(c); /* the previous message of this session ended */
		memcpy(c->instance, inst.ptr, inst.len);
		c->instance[inst.len] = '\0';
	}
	if (!c->policy)
		c->policy = current_policy(c->svc, NULL);
	c->req = *r;
	c->stage = stage;
	c->last_once = stage < POLICY_RCPT ? stage : POLICY_MAIL;
	c->cur = 0;
	c->now = realtime_ns();
	c->best.action = POLICY_ACCEPT;
	c->best.rule = NULL;
	c->delay_ms = 0;
	c->s = s;
	if (!run_stages(s, c))
		return false;
	conclude(s, c);
	return true;
}

/* Copy the request's n bytes at p, and point its slices into the copy. */
static int hold_request(struct pf_conn *c, const char *p, size_t n)
{
	c->held = malloc(n ? n : 1);
	if (!c->held)
		return -ENOMEM;
	memcpy(c->held, p, n);
	for (size_t i = 0; i < c->req.n; i++) {
		struct pfpolicy_attr *a = &c->req.attr[i];
		if (a->name.ptr)
			a->name.ptr = c->held + (a->name.ptr - p);
		if (a->value.ptr)
			a->value.ptr = c->held + (a->value.ptr - p);
	}
	return 0;
}

static void pf_input(struct session *s, struct evbuffer *in)
{
	struct pf_conn *c = session_data(s);
	while (!c->pending) {
		size_t avail = evbuffer_get_length(in);
		if (avail == 0) {
			if (c->draining)
				session_close(s); /* after the answer is written */
			return;
		}
		size_t look = avail < c->max_request ? avail : c->max_request;
		const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)look);
		if (!p) {
			session_protocol_error(s, "out of memory");
			return;
		}
		struct pfpolicy_request req;
		const char *why = NULL;
		int n = pfpolicy_parse(&c->parser, p, look, c->max_request, &req, &why);
		if (n == 0)
			return;
		if (n == -EMSGSIZE) {
			session_protocol_error(s, "request larger than max_request");
			return;
		}
		if (n < 0) {
			session_protocol_error(s, why ? why : "malformed request");
			return;
		}
		if (!handle(s, c, &req)) {
			/* the answer waits for the store: the request leaves the input buffer
			 * (which may grow and move while the session waits) for a copy of its own */
			if (hold_request(c, p, (size_t)n) < 0) {
				session_protocol_error(s, "out of memory");
				return;
			}
			evbuffer_drain(in, (size_t)n);
			session_pause(s); /* on_decided answers and resumes */
			return;
		}
		evbuffer_drain(in, (size_t)n);
	}
}

/* Postfix reconnects for its next request (smtpd_policy_service_try_limit), so an idle
 * connection is closed at once when sluiced stops, and a busy one after its answer. */
static void pf_drain(struct session *s)
{
	struct pf_conn *c = session_data(s);
	c->draining = true;
	if (!c->pending && session_input_length(s) == 0)
		session_close(s);
}

static void pf_free_arg(void *arg)
{
	struct pf_service *ps = arg;
	policy_unref(ps->policy);
	pthread_mutex_destroy(&ps->lock);
	free(ps);
}

static const struct service_ops pf_ops = {
	.open = pf_open,
	.input = pf_input,
	.close = pf_close,
	.drain = pf_drain,
	.free_arg = pf_free_arg,
};

struct service *pfpolicy_service_new(struct engine *e, struct policy *p,
				     const struct pfpolicy_conf *conf)
{
	struct pf_service *ps = calloc(1, sizeof(*ps));
	if (!ps)
		return NULL;
	pthread_mutex_init(&ps->lock, NULL);
	ps->policy = policy_ref(p);
	ps->max_request = conf->max_request;
	struct service *svc = service_new(e, "policy", &pf_ops, ps);
	if (!svc)
		pf_free_arg(ps);
	return svc;
}

void pfpolicy_service_set_policy(struct service *svc, struct policy *p)
{
	struct pf_service *ps = service_arg(svc);
	pthread_mutex_lock(&ps->lock);
	struct policy *old = ps->policy;
	ps->policy = policy_ref(p);
	pthread_mutex_unlock(&ps->lock);
	policy_unref(old);
}

void pfpolicy_service_set_conf(struct service *svc, const struct pfpolicy_conf *conf)
{
	struct pf_service *ps = service_arg(svc);
	pthread_mutex_lock(&ps->lock);
	ps->max_request = conf->max_request;
	pthread_mutex_unlock(&ps->lock);
}
