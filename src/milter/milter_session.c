/*
 * milter_session -- milter protocol sessions on the engine (see milter_session.h).
 *
 * One struct milter_session per MTA connection.  The input callback takes whole packets
 * out of the stream (partial packets simply wait for more bytes), decodes them with the
 * pure codec in src/proto, updates the session state, asks the handler, and appends the
 * reply to `out`; all replies produced by one batch of input go out in one write.
 *
 * Reply discipline (the rule MTAs are strictest about): a step gets exactly one final
 * reply when the MTA waits for one (neg.reply_steps) and none at all otherwise, whatever
 * the handler does.  A peer protocol error closes this session only.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "milter_session.h"
#include "util.h"

/* Macro storage slots, in the MTA's stage order: C < H < M < R < T < EOH < EOM; U apart. */
enum macro_slot {
	SLOT_CONNECT = 0,
	SLOT_HELO,
	SLOT_MAIL,
	SLOT_RCPT,
	SLOT_DATA,
	SLOT_EOH,
	SLOT_EOM,
	SLOT_UNKNOWN,
	SLOT_COUNT,
};

struct milter_service {
	pthread_mutex_t lock;
	struct milter_handler *handler;
	struct milter_service_conf conf;
};

struct milter_session {
	struct session *s;
	struct milter_service *msvc;
	struct milter_handler *h;
	uint32_t want_steps; /* the handler's want.steps at negotiation */
	struct milter_neg neg;
	bool negotiated;
	bool active;     /* an SMTP session is under way: on_close is owed */
	bool in_message; /* a message is under way: on_abort is owed unless EOM ends it */
	bool skipping_body; /* SKIP answered: further chunks are not shown to the handler */
	enum milter_step step;
	bool pending;
	bool reply_needed; /* for the pending step */
	uint8_t pending_code;
	/* a tarpit: the step's reply waits delay_ms on the session's own timer (armed when
	 * the verdict is known; freed with the session) */
	uint64_t delay_ms;
	struct event *delay_ev;
	bool delaying;     /* the timer runs: the pending step's verdict is delayed_v */
	enum milter_verdict delayed_v;
	size_t max_packet;
	struct buf out;
	/* Macros of all stages in one buffer of records [slot][u32 length][name NUL value
	 * NUL ...], one record per slot at most: a session's resident state stays small. */
	struct buf macros;
	struct buf conn;   /* host NUL address NUL */
	size_t conn_host_len;
	char family;
	uint16_t port;
	struct buf helo;
	struct buf sender;
	struct buf rcpt;
	unsigned rcpt_count;
	uint64_t body_size;
	struct buf reply;
	const struct milter_cmd *cmd; /* the command being handled (valid during on_step) */
	void *handler_data;
};

static const char *const verdict_names[] = {
	[MILTER_CONTINUE] = "continue", [MILTER_ACCEPT] = "accept", [MILTER_REJECT] = "reject",
	[MILTER_TEMPFAIL] = "tempfail", [MILTER_DISCARD] = "discard", [MILTER_SKIP] = "skip",
	[MILTER_REPLY] = "reply",	[MILTER_PENDING] = "pending",
};

const char *milter_verdict_name(enum milter_verdict v)
{
	return (size_t)v < ARRAY_SIZE(verdict_names) ? verdict_names[v] : "?";
}

struct milter_handler *milter_handler_ref(struct milter_handler *h)
{
	atomic_fetch_add(&h->refs, 1);
	return h;
}

void milter_handler_unref(struct milter_handler *h)
{
	if (h && atomic_fetch_sub(&h->refs, 1) == 1) {
		if (h->destroy)
			h->destroy(h->ctx);
		free(h);
	}
}

/* ---- accessors ---- */

struct session *milter_session_session(const struct milter_session *ms) { return ms->s; }
enum milter_step milter_session_step(const struct milter_session *ms) { return ms->step; }
struct str milter_session_helo(const struct milter_session *ms) { return buf_str(&ms->helo); }
struct str milter_session_sender(const struct milter_session *ms) { return buf_str(&ms->sender); }
struct str milter_session_rcpt(const struct milter_session *ms) { return buf_str(&ms->rcpt); }
unsigned milter_session_rcpt_count(const struct milter_session *ms) { return ms->rcpt_count; }
char milter_session_client_family(const struct milter_session *ms) { return ms->family; }
unsigned milter_session_client_port(const struct milter_session *ms) { return ms->port; }
uint64_t milter_session_body_size(const struct milter_session *ms) { return ms->body_size; }
const struct milter_neg *milter_session_neg(const struct milter_session *ms) { return &ms->neg; }
void *milter_session_handler_data(const struct milter_session *ms) { return ms->handler_data; }
void milter_session_set_handler_data(struct milter_session *ms, void *d) { ms->handler_data = d; }

struct str milter_session_client_host(const struct milter_session *ms)
{
	if (!ms->conn.len)
		return str_make("", 0);
	return str_make(ms->conn.ptr, ms->conn_host_len);
}

struct str milter_session_client_addr(const struct milter_session *ms)
{
	if (!ms->conn.len)
		return str_make("", 0);
	const char *a = ms->conn.ptr + ms->conn_host_len + 1;
	return str_make(a, ms->conn.len - ms->conn_host_len - 2);
}

size_t milter_session_esmtp_args(const struct milter_session *ms, const struct str **ret)
{
	if (ms->cmd && (ms->cmd->code == MILTER_CMD_MAIL || ms->cmd->code == MILTER_CMD_RCPT)) {
		*ret = ms->cmd->envelope.args;
		return ms->cmd->envelope.nargs;
	}
	*ret = NULL;
	return 0;
}

struct str milter_session_header_name(const struct milter_session *ms)
{
	return ms->cmd && ms->cmd->code == MILTER_CMD_HEADER ? ms->cmd->header.name : STR_NULL;
}

struct str milter_session_header_value(const struct milter_session *ms)
{
	return ms->cmd && ms->cmd->code == MILTER_CMD_HEADER ? ms->cmd->header.value : STR_NULL;
}

struct str milter_session_body_chunk(const struct milter_session *ms)
{
	if (ms->cmd && (ms->cmd->code == MILTER_CMD_BODY || ms->cmd->code == MILTER_CMD_BODYEOB))
		return ms->cmd->body.chunk;
	return STR_NULL;
}

struct str milter_session_unknown(const struct milter_session *ms)
{
	return ms->cmd && ms->cmd->code == MILTER_CMD_UNKNOWN ? ms->cmd->unknown.line : STR_NULL;
}

/* Names compare with or without braces: "{x}" == "x" for names longer than one byte. */
static struct str macro_bare(struct str n)
{
	if (n.len > 2 && n.ptr[0] == '{' && n.ptr[n.len - 1] == '}')
		return str_make(n.ptr + 1, n.len - 2);
	return n;
}

static uint32_t rec_len(const char *p)
{
	uint32_t l;
	memcpy(&l, p, sizeof(l));
	return l;
}

/* Call fn for each record: slot and payload. */
#define MACRO_RECORDS(b, off, slot, pay)                                                   \
	for (size_t off = 0, _n; off + 5 <= (b)->len &&                                  \
	     ((slot) = (uint8_t)(b)->ptr[off], (pay) = str_make((b)->ptr + off + 5,          \
	      rec_len((b)->ptr + off + 1)), _n = 5 + (pay).len, 1);                           \
	     off += _n)

bool milter_session_macro(const struct milter_session *ms, const char *name, struct str *ret)
{
	struct str want = macro_bare(str_cstr(name));
	int best = -1;
	struct str found = STR_NULL;
	uint8_t slot;
	struct str pay;
	MACRO_RECORDS(&ms->macros, off, slot, pay) {
		size_t o = 0;
		while (o < pay.len) {
			struct str n = str_cstr(pay.ptr + o);
			o += n.len + 1;
			struct str v = str_cstr(pay.ptr + o);
			o += v.len + 1;
			if ((int)slot > best && str_eq(macro_bare(n), want)) {
				best = slot;
				found = v;
			}
		}
	}
	if (best < 0)
		return false;
	*ret = found;
	return true;
}

/* Remove the records of slots in [lo, hi]. */
static void macros_drop(struct milter_session *ms, int lo, int hi)
{
	struct buf *b = &ms->macros;
	size_t off = 0;
	while (off + 5 <= b->len) {
		uint8_t slot = (uint8_t)b->ptr[off];
		size_t n = 5 + rec_len(b->ptr + off + 1);
		if (slot >= lo && slot <= hi) {
			memmove(b->ptr + off, b->ptr + off + n, b->len - off - n);
			b->len -= n;
		} else {
			off += n;
		}
	}
	if (b->len == 0)
		buf_done(b); /* an idle session keeps no macro memory */
}

/* ---- actions ---- */

int milter_session_set_reply(struct milter_session *ms, struct str text)
{
	const char *why;
	if (milter_reply_check(text, &why) < 0)
		return -EINVAL;
	buf_reset(&ms->reply);
	return buf_append_str(&ms->reply, text);
}

static int may_modify(struct milter_session *ms, uint32_t action)
{
	if (ms->step != MILTER_STEP_EOM || !(ms->neg.actions & action))
		return -EPERM;
	return 0;
}

int milter_session_add_header(struct milter_session *ms, struct str name, struct str value)
{
	int r = may_modify(ms, MILTER_ACT_ADDHDRS);
	return r < 0 ? r : milter_put_header(&ms->out, MILTER_REPLY_ADDHEADER, 0, name, value);
}

int milter_session_insert_header(struct milter_session *ms, uint32_t index, struct str name,
				 struct str value)
{
	int r = may_modify(ms, MILTER_ACT_ADDHDRS);
	return r < 0 ? r : milter_put_header(&ms->out, MILTER_REPLY_INSHEADER, index, name, value);
}

int milter_session_change_header(struct milter_session *ms, uint32_t index, struct str name,
				 struct str value)
{
	int r = may_modify(ms, MILTER_ACT_CHGHDRS);
	return r < 0 ? r : milter_put_header(&ms->out, MILTER_REPLY_CHGHEADER, index, name, value);
}

int milter_session_add_rcpt(struct milter_session *ms, struct str addr, struct str args)
{
	if (args.len) {
		int r = may_modify(ms, MILTER_ACT_ADDRCPT_PAR);
		return r < 0 ? r : milter_put_addr(&ms->out, MILTER_REPLY_ADDRCPT_PAR, addr, args);
	}
	int r = may_modify(ms, MILTER_ACT_ADDRCPT);
	return r < 0 ? r : milter_put_addr(&ms->out, MILTER_REPLY_ADDRCPT, addr, STR_NULL);
}

int milter_session_del_rcpt(struct milter_session *ms, struct str addr)
{
	int r = may_modify(ms, MILTER_ACT_DELRCPT);
	return r < 0 ? r : milter_put_addr(&ms->out, MILTER_REPLY_DELRCPT, addr, STR_NULL);
}

int milter_session_change_from(struct milter_session *ms, struct str addr, struct str args)
{
	int r = may_modify(ms, MILTER_ACT_CHGFROM);
	return r < 0 ? r : milter_put_addr(&ms->out, MILTER_REPLY_CHGFROM, addr, args);
}

int milter_session_replace_body(struct milter_session *ms, struct str body)
{
	int r = may_modify(ms, MILTER_ACT_CHGBODY);
	return r < 0 ? r : milter_put_replbody(&ms->out, body);
}

int milter_session_quarantine(struct milter_session *ms, struct str reason)
{
	int r = may_modify(ms, MILTER_ACT_QUARANTINE);
	return r < 0 ? r : milter_put_quarantine(&ms->out, reason);
}

int milter_session_progress(struct milter_session *ms)
{
	/* Only while the MTA waits for an answer: at a no-reply step the packet would be
	 * read as the answer to something else (and Sendmail takes it at EOM only). */
	if (!(ms->neg.reply_steps & MILTER_STEP_BIT(ms->step)))
		return -EPERM;
	int r = milter_put_simple(&ms->out, MILTER_REPLY_PROGRESS);
	if (r == 0 && ms->pending) {
		/* Asynchronous: send it now, not with the final reply. */
		r = session_write(ms->s, ms->out.ptr, ms->out.len);
		buf_reset(&ms->out);
	}
	return r;
}

/* ---- state ---- */

/* End the message: notify the handler if asked and a message was open, and forget the
 * macros from slot macros_from (SLOT_MAIL, or SLOT_RCPT when a MAIL's own macros stay). */
static void reset_message(struct milter_session *ms, bool notify, int macros_from)
{
	if (notify && ms->in_message && ms->h->on_abort)
		ms->h->on_abort(ms->h->ctx, ms);
	ms->in_message = false;
	ms->skipping_body = false;
	buf_reset(&ms->sender);
	buf_reset(&ms->rcpt);
	ms->rcpt_count = 0;
	ms->body_size = 0;
	macros_drop(ms, macros_from, SLOT_EOM);
}

/* End the SMTP session: the open message, then the connection; forget the macros from
 * slot macros_from (0, or SLOT_HELO when a CONNECT's own macros stay). */
static void reset_connection(struct milter_session *ms, int macros_from)
{
	reset_message(ms, true, SLOT_MAIL);
	if (ms->active && ms->h->on_close)
		ms->h->on_close(ms->h->ctx, ms);
	ms->active = false;
	buf_reset(&ms->conn);
	buf_reset(&ms->helo);
	ms->conn_host_len = 0;
	ms->family = 0;
	ms->port = 0;
	macros_drop(ms, macros_from, SLOT_COUNT - 1);
}

static int macro_slot_for(uint8_t stage)
{
	switch (stage) {
	case MILTER_CMD_CONNECT: return SLOT_CONNECT;
	case MILTER_CMD_HELO: return SLOT_HELO;
	case MILTER_CMD_MAIL: return SLOT_MAIL;
	case MILTER_CMD_RCPT: return SLOT_RCPT;
	case MILTER_CMD_DATA: return SLOT_DATA;
	case MILTER_CMD_HEADER:
	case MILTER_CMD_EOH: return SLOT_EOH;
	case MILTER_CMD_BODY:
	case MILTER_CMD_BODYEOB: return SLOT_EOM;
	case MILTER_CMD_UNKNOWN: return SLOT_UNKNOWN;
	default: return -1;
	}
}

/* A command for a stage forgets the macros of all later stages. */
static void forget_later_macros(struct milter_session *ms, int slot)
{
	if (slot < 0 || slot == SLOT_UNKNOWN)
		return;
	macros_drop(ms, slot + 1, SLOT_EOM);
}

static int store_macros(struct milter_session *ms, const struct milter_cmd *c)
{
	int slot = macro_slot_for(c->macro.stage);
	if (slot < 0)
		return 0; /* a stage we do not know: accepted and ignored */
	macros_drop(ms, slot, slot);
	struct buf *b = &ms->macros;
	size_t start = b->len;
	uint32_t zero = 0;
	int r = buf_append_byte(b, (unsigned char)slot);
	if (r == 0)
		r = buf_append(b, &zero, sizeof(zero));
	for (size_t i = 0; i < c->macro.npairs && r == 0; i++) {
		const struct milter_macro_pair *p = &c->macro.pairs[i];
		/* Kept NUL-terminated; an embedded NUL cannot occur (the codec splits on NUL). */
		r = buf_append_str(b, p->name);
		if (r == 0)
			r = buf_append_byte(b, 0);
		if (r == 0)
			r = buf_append_str(b, p->value);
		if (r == 0)
			r = buf_append_byte(b, 0);
	}
	if (r < 0) {
		buf_truncate(b, start);
		return r;
	}
	uint32_t len = (uint32_t)(b->len - start - 5);
	memcpy(b->ptr + start + 1, &len, sizeof(len));
	return 0;
}

static int put_verdict(struct milter_session *ms, enum milter_verdict v)
{
	switch (v) {
	case MILTER_CONTINUE: return milter_put_simple(&ms->out, MILTER_REPLY_CONTINUE);
	case MILTER_ACCEPT: return milter_put_simple(&ms->out, MILTER_REPLY_ACCEPT);
	case MILTER_REJECT: return milter_put_simple(&ms->out, MILTER_REPLY_REJECT);
	case MILTER_TEMPFAIL: return milter_put_simple(&ms->out, MILTER_REPLY_TEMPFAIL);
	case MILTER_DISCARD: return milter_put_simple(&ms->out, MILTER_REPLY_DISCARD);
	case MILTER_SKIP: return milter_put_simple(&ms->out, MILTER_REPLY_SKIP);
	case MILTER_REPLY: return milter_put_replycode(&ms->out, buf_str(&ms->reply));
	case MILTER_PENDING: break;
	}
	return -EINVAL;
}

/* Make a handler's verdict legal for the step and the negotiation. */
static enum milter_verdict legal_verdict(struct milter_session *ms, enum milter_verdict v)
{
	if (v == MILTER_SKIP && (ms->step != MILTER_STEP_BODY || !(ms->neg.protocol & MILTER_P_SKIP)))
		return MILTER_CONTINUE;
	if (v == MILTER_REPLY && ms->reply.len == 0) {
		session_log(ms->s, LOG_LEVEL_ERROR, "handler %s: reply verdict without text at %s; "
			    "answering tempfail", ms->h->name, milter_step_name(ms->step));
		return MILTER_TEMPFAIL;
	}
	if (v > MILTER_PENDING)
		return MILTER_TEMPFAIL;
	return v;
}

/* The final reply of a step (when the MTA waits for one) and its effect on state. */
static void finish_step(struct milter_session *ms, enum milter_verdict v, bool reply_needed)
{
	v = legal_verdict(ms, v);
	if (v == MILTER_SKIP)
		ms->skipping_body = true;
	if (reply_needed && put_verdict(ms, v) < 0) {
		session_log(ms->s, LOG_LEVEL_ERROR, "cannot encode the %s reply", milter_step_name(ms->step));
		put_verdict(ms, MILTER_TEMPFAIL);
	}
	if (log_enabled(LOG_LEVEL_DEBUG))
		session_log(ms->s, LOG_LEVEL_DEBUG, "%s: %s%s", milter_step_name(ms->step),
			    milter_verdict_name(v), reply_needed ? "" : " (no reply)");
	if (ms->step == MILTER_STEP_EOM)
		reset_message(ms, false, SLOT_MAIL);
	buf_done(&ms->reply);
}

static void flush(struct milter_session *ms);

/* The delay is over: the step's reply goes out, and reading resumes (input that came
 * meanwhile is handled now and may end the session: ms is not used after). */
static void delay_fire(evutil_socket_t fd, short what, void *arg)
{
	struct milter_session *ms = arg;
	(void)fd;
	(void)what;
	ms->delaying = false;
	ms->pending = false;
	finish_step(ms, ms->delayed_v, ms->reply_needed);
	flush(ms);
	session_resume(ms->s);
}

/* Hold the verdict v of the current step for the delay the handler asked for.  0, or
 * -ENOMEM (then the reply goes out at once). */
static int start_delay(struct milter_session *ms, enum milter_verdict v, bool reply_needed)
{
	uint64_t d = ms->delay_ms;
	ms->delay_ms = 0;
	if (!ms->delay_ev && !(ms->delay_ev = evtimer_new(session_base(ms->s), delay_fire, ms)))
		return -ENOMEM;
	struct timeval tv = { .tv_sec = (time_t)(d / 1000), .tv_usec = (suseconds_t)(d % 1000) * 1000 };
	if (evtimer_add(ms->delay_ev, &tv) < 0)
		return -ENOMEM;
	ms->delaying = true;
	ms->delayed_v = v;
	ms->pending = true;
	ms->reply_needed = reply_needed;
	session_pause(ms->s);
	return 0;
}

/*
 * A step's verdict: answered now (true), or the reply waits (false, the session paused)
 * -- for the handler (MILTER_PENDING, then milter_session_resume()) or for the delay it
 * asked for with milter_session_delay() (a verdict that is not pending, delayed on the
 * session's timer; only where the MTA waits for the reply, as elsewhere holding it back
 * would slow nobody).
 */
static bool settle(struct milter_session *ms, enum milter_verdict v, bool reply_needed)
{
	if (v == MILTER_PENDING) {
		ms->pending = true;
		ms->reply_needed = reply_needed;
		session_pause(ms->s);
		return false;
	}
	if (ms->delay_ms && reply_needed) {
		if (start_delay(ms, v, reply_needed) == 0)
			return false;
		session_log(ms->s, LOG_LEVEL_ERROR, "cannot delay the %s reply: out of memory; "
			    "answering now", milter_step_name(ms->step));
	}
	ms->delay_ms = 0;
	finish_step(ms, v, reply_needed);
	return true;
}

/*
 * Run one step: ask the handler if it wants the step, then reply if the MTA waits.
 * Returns false when the step is pending.
 */
static bool run_step(struct milter_session *ms, enum milter_step step, const struct milter_cmd *c)
{
	uint32_t bit = MILTER_STEP_BIT(step);
	bool reply_needed = (ms->neg.reply_steps & bit) != 0;
	enum milter_verdict v = MILTER_CONTINUE;
	ms->step = step;
	ms->cmd = c;
	bool skip_handler = step == MILTER_STEP_BODY && ms->skipping_body;
	if ((ms->want_steps & bit || step == MILTER_STEP_EOM) && ms->h->on_step[step] && !skip_handler)
		v = ms->h->on_step[step](ms->h->ctx, ms);
	ms->cmd = NULL;
	return settle(ms, v, reply_needed);
}

static void flush(struct milter_session *ms)
{
	if (ms->out.len) {
		if (session_write(ms->s, ms->out.ptr, ms->out.len) < 0)
			session_log(ms->s, LOG_LEVEL_ERROR, "cannot queue reply: out of memory");
		buf_reset(&ms->out);
	}
}

void milter_session_resume(struct milter_session *ms, enum milter_verdict v)
{
	if (!ms->pending || ms->delaying || v == MILTER_PENDING)
		return;
	ms->pending = false;
	bool now = settle(ms, v, ms->reply_needed);
	flush(ms);
	if (now)
		session_resume(ms->s);
}

void milter_session_delay(struct milter_session *ms, uint64_t delay_ms)
{
	if (!ms->delaying)
		ms->delay_ms = delay_ms;
}

static int copy_str(struct buf *b, struct str s)
{
	buf_reset(b);
	return buf_append_str(b, s);
}

/*
 * Handle one decoded command.  Returns 0 to go on, 1 when the session must stop reading
 * (pending verdict, or the session was closed), or -EPROTO with *why.
 */
static int dispatch(struct milter_session *ms, const struct milter_cmd *c, const char **why)
{
	if (!ms->negotiated && c->code != MILTER_CMD_OPTNEG) {
		*why = "command before option negotiation";
		return -EPROTO;
	}
	bool was_active = ms->active;
	switch (c->code) {
	case MILTER_CMD_OPTNEG:
	case MILTER_CMD_MACRO: /* sent before the command it belongs to */
	case MILTER_CMD_QUIT:
	case MILTER_CMD_QUIT_NC:
	case MILTER_CMD_ABORT:
		break;
	case MILTER_CMD_RCPT:
	case MILTER_CMD_DATA:
	case MILTER_CMD_HEADER:
	case MILTER_CMD_EOH:
	case MILTER_CMD_BODY:
	case MILTER_CMD_BODYEOB:
		/* With NOMAIL agreed a message starts without MAIL. */
		ms->in_message = true;
		ms->active = true;
		break;
	default:
		ms->active = true;
		break;
	}
	switch (c->code) {
	case MILTER_CMD_OPTNEG: {
		if (ms->negotiated) {
			*why = "second option negotiation";
			return -EPROTO;
		}
		struct milter_want want = { 0 };
		if (ms->h->want)
			ms->h->want(ms->h->ctx, &want);
		ms->want_steps = want.steps;
		int r = milter_negotiate(c->optneg.version, c->optneg.actions, c->optneg.protocol,
					 &want, &ms->neg, why);
		if (r < 0)
			return r;
		if (milter_put_optneg(&ms->out, &ms->neg, want.macros) < 0) {
			*why = "cannot encode negotiation reply";
			return -EPROTO;
		}
		ms->negotiated = true;
		session_log(ms->s, LOG_LEVEL_DEBUG,
			    "negotiated version %u actions 0x%x protocol 0x%x (MTA offered %u 0x%x 0x%x)",
			    ms->neg.version, ms->neg.actions, ms->neg.protocol, c->optneg.version,
			    c->optneg.actions, c->optneg.protocol);
		return 0;
	}
	case MILTER_CMD_MACRO:
		if (store_macros(ms, c) < 0) {
			*why = "macros larger than the limit";
			return -EPROTO;
		}
		return 0;
	case MILTER_CMD_CONNECT:
		if (was_active) {
			/* A new SMTP session without QUIT_NC: end the previous one, keeping the
			 * CONNECT macros that were just sent for this one. */
			reset_connection(ms, SLOT_HELO);
			ms->active = true;
		}
		forget_later_macros(ms, SLOT_CONNECT);
		buf_reset(&ms->conn);
		if (buf_append_str(&ms->conn, c->connect.host) < 0 || buf_append_byte(&ms->conn, 0) < 0 ||
		    buf_append_str(&ms->conn, c->connect.address) < 0 || buf_append_byte(&ms->conn, 0) < 0) {
			*why = "CONNECT fields too long";
			return -EPROTO;
		}
		ms->conn_host_len = c->connect.host.len;
		ms->family = (char)c->connect.family;
		ms->port = c->connect.port;
		return run_step(ms, MILTER_STEP_CONNECT, c) ? 0 : 1;
	case MILTER_CMD_HELO:
		forget_later_macros(ms, SLOT_HELO);
		if (copy_str(&ms->helo, c->helo.name) < 0) {
			*why = "HELO argument too long";
			return -EPROTO;
		}
		return run_step(ms, MILTER_STEP_HELO, c) ? 0 : 1;
	case MILTER_CMD_MAIL: {
		/* A new MAIL starts a new message even without ABORT; this MAIL's macros, sent
		 * just before it, stay. */
		reset_message(ms, true, SLOT_RCPT);
		ms->in_message = true;
		if (copy_str(&ms->sender, c->envelope.addr) < 0) {
			*why = "sender address too long";
			return -EPROTO;
		}
		return run_step(ms, MILTER_STEP_MAIL, c) ? 0 : 1;
	}
	case MILTER_CMD_RCPT:
		forget_later_macros(ms, SLOT_RCPT);
		if (copy_str(&ms->rcpt, c->envelope.addr) < 0) {
			*why = "recipient address too long";
			return -EPROTO;
		}
		ms->rcpt_count++;
		return run_step(ms, MILTER_STEP_RCPT, c) ? 0 : 1;
	case MILTER_CMD_DATA:
		forget_later_macros(ms, SLOT_DATA);
		return run_step(ms, MILTER_STEP_DATA, c) ? 0 : 1;
	case MILTER_CMD_HEADER:
		return run_step(ms, MILTER_STEP_HEADER, c) ? 0 : 1;
	case MILTER_CMD_EOH:
		forget_later_macros(ms, SLOT_EOH);
		return run_step(ms, MILTER_STEP_EOH, c) ? 0 : 1;
	case MILTER_CMD_BODY:
		if (c->body.chunk.len > ms->neg.body_max) {
			*why = "BODY chunk larger than the negotiated data size";
			return -EPROTO;
		}
		ms->body_size += c->body.chunk.len;
		return run_step(ms, MILTER_STEP_BODY, c) ? 0 : 1;
	case MILTER_CMD_BODYEOB:
		if (c->body.chunk.len > ms->neg.body_max) {
			*why = "end-of-body chunk larger than the negotiated data size";
			return -EPROTO;
		}
		/* Data with EOB is one more body chunk (libmilter does the same); the handler
		 * sees it, no separate reply is sent for it. */
		if (c->body.chunk.len) {
			ms->body_size += c->body.chunk.len;
			if ((ms->want_steps & MILTER_STEP_BIT(MILTER_STEP_BODY)) &&
			    ms->h->on_step[MILTER_STEP_BODY] && !ms->skipping_body) {
				ms->step = MILTER_STEP_BODY;
				ms->cmd = c;
				enum milter_verdict bv = ms->h->on_step[MILTER_STEP_BODY](ms->h->ctx, ms);
				ms->cmd = NULL;
				/* As libmilter: a decisive body verdict is the answer to end of
				 * message, and the EOM handler is not called. */
				if (bv != MILTER_CONTINUE && bv != MILTER_SKIP) {
					ms->step = MILTER_STEP_EOM;
					return settle(ms, bv, true) ? 0 : 1;
				}
			}
		}
		return run_step(ms, MILTER_STEP_EOM, c) ? 0 : 1;
	case MILTER_CMD_UNKNOWN:
		return run_step(ms, MILTER_STEP_UNKNOWN, c) ? 0 : 1;
	case MILTER_CMD_ABORT:
		reset_message(ms, true, SLOT_MAIL);
		return 0;
	case MILTER_CMD_QUIT:
		reset_connection(ms, 0);
		flush(ms);
		session_close(ms->s);
		return 1;
	case MILTER_CMD_QUIT_NC:
		reset_connection(ms, 0);
		return 0;
	}
	*why = "unknown command";
	return -EPROTO;
}

static void milter_input(struct session *s, struct evbuffer *in)
{
	struct milter_session *ms = session_data(s);
	for (;;) {
		if (ms->pending)
			break;
		size_t avail = evbuffer_get_length(in);
		unsigned char hdr[4];
		size_t size;
		const char *why = NULL;
		int r = milter_frame_size(hdr, (size_t)evbuffer_copyout(in, hdr, 4), ms->max_packet,
					  &size, &why);
		if (r == 0)
			break;
		if (r < 0) {
			flush(ms);
			session_protocol_error(s, why);
			return;
		}
		if (avail < size)
			break; /* partial packet: wait for the rest (the engine times it out) */
		const unsigned char *p = evbuffer_pullup(in, (ev_ssize_t)size);
		if (!p) {
			session_protocol_error(s, "out of memory");
			return;
		}
		struct milter_frame f;
		r = milter_frame_parse(p, size, ms->max_packet, &f, &why);
		struct milter_cmd cmd;
		if (r == 1)
			r = milter_cmd_decode(&f, &cmd, &why);
		if (r == 0)
			r = dispatch(ms, &cmd, &why);
		if (r < 0) {
			session_protocol_error(s, why);
			return;
		}
		evbuffer_drain(in, size);
		if (r == 1)
			break; /* pending, or closed by QUIT */
	}
	flush(ms);
}

static int milter_open(struct session *s)
{
	struct milter_service *msvc = service_arg(session_service(s));
	struct milter_session *ms = calloc(1, sizeof(*ms));
	if (!ms)
		return -ENOMEM;
	ms->s = s;
	ms->msvc = msvc;
	pthread_mutex_lock(&msvc->lock);
	ms->h = milter_handler_ref(msvc->handler);
	ms->max_packet = msvc->conf.max_packet;
	size_t mm = msvc->conf.max_macros;
	pthread_mutex_unlock(&msvc->lock);
	buf_init(&ms->out, SIZE_MAX / 2);
	buf_init(&ms->macros, mm);
	/* Hosts and addresses are bounded by the packet size already; these caps keep a
	 * session's resident state small whatever the peer sends. */
	buf_init(&ms->conn, 4096);
	buf_init(&ms->helo, 4096);
	buf_init(&ms->sender, 4096);
	buf_init(&ms->rcpt, 4096);
	buf_init(&ms->reply, 64 * 1024);
	session_set_data(s, ms);
	return 0;
}

static void milter_close(struct session *s)
{
	struct milter_session *ms = session_data(s);
	if (!ms)
		return;
	if (ms->delay_ev)
		event_free(ms->delay_ev); /* a delayed reply is never sent */
	ms->delay_ev = NULL;
	ms->delaying = false;
	/* EOF without QUIT: ABORT + QUIT. */
	reset_connection(ms, 0);
	milter_handler_unref(ms->h);
	buf_done(&ms->out);
	buf_done(&ms->macros);
	buf_done(&ms->conn);
	buf_done(&ms->helo);
	buf_done(&ms->sender);
	buf_done(&ms->rcpt);
	buf_done(&ms->reply);
	free(ms);
}

static void milter_service_free(void *arg)
{
	struct milter_service *msvc = arg;
	milter_handler_unref(msvc->handler);
	pthread_mutex_destroy(&msvc->lock);
	free(msvc);
}

static const struct service_ops milter_ops = {
	.free_arg = milter_service_free,
	.open = milter_open,
	.input = milter_input,
	.close = milter_close,
	.refuse_msg = NULL, /* the protocol has no greeting: a close is the only refusal */
};

struct service *milter_service_new(struct engine *e, struct milter_handler *h,
				   const struct milter_service_conf *conf)
{
	struct milter_service *msvc = calloc(1, sizeof(*msvc));
	if (!msvc)
		return NULL;
	pthread_mutex_init(&msvc->lock, NULL);
	msvc->handler = h;
	msvc->conf = *conf;
	struct service *svc = service_new(e, "milter", &milter_ops, msvc);
	if (!svc) {
		free(msvc);
		return NULL;
	}
	return svc;
}

void milter_service_set_handler(struct service *svc, struct milter_handler *h)
{
	struct milter_service *msvc = service_arg(svc);
	pthread_mutex_lock(&msvc->lock);
	struct milter_handler *old = msvc->handler;
	msvc->handler = h;
	pthread_mutex_unlock(&msvc->lock);
	milter_handler_unref(old);
}

void milter_service_set_conf(struct service *svc, const struct milter_service_conf *conf)
{
	struct milter_service *msvc = service_arg(svc);
	pthread_mutex_lock(&msvc->lock);
	msvc->conf = *conf;
	pthread_mutex_unlock(&msvc->lock);
}
