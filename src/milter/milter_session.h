/*
 * milter_session -- the milter server: sessions over the engine, and the handler interface.
 *
 * A milter service owns one handler (the policy engine, or the fixed-reply handler shipped
 * for testing); the handler says which protocol steps, replies, modifications and macros
 * it needs, and the session negotiates exactly that with each MTA connection, so the MTA
 * does not send what nobody reads.  The handler's per-step callback sees the session
 * (envelope, macros, the current header or body chunk) and returns a verdict, possibly
 * MILTER_PENDING to answer later with milter_session_resume() (e.g. after a Redis round
 * trip); while a verdict is pending the session reads nothing more.
 *
 * Handlers are reference counted: a session keeps the handler it started with, so a
 * reload that installs a new handler never changes the rules under a running session.
 */
#ifndef SLUICE_MILTER_SESSION_H
#define SLUICE_MILTER_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "milter.h"
#include "str.h"

enum milter_verdict {
	MILTER_CONTINUE = 0,
	MILTER_ACCEPT,
	MILTER_REJECT,
	MILTER_TEMPFAIL,
	MILTER_DISCARD,
	MILTER_SKIP,    /* BODY only; becomes CONTINUE when SKIP was not negotiated */
	MILTER_REPLY,   /* the text set with milter_session_set_reply() */
	MILTER_PENDING, /* answer later with milter_session_resume() */
};

const char *milter_verdict_name(enum milter_verdict v);

struct milter_session;

struct milter_handler {
	const char *name;
	/* Fill in what the handler needs; called at every negotiation. */
	void (*want)(void *ctx, struct milter_want *ret);
	/* Per step; NULL means "continue".  Called only for steps in want.steps. */
	enum milter_verdict (*on_step[MILTER_STEP_COUNT])(void *ctx, struct milter_session *ms);
	/* The message ended without EOM (ABORT, new MAIL, QUIT, EOF); may be NULL. */
	void (*on_abort)(void *ctx, struct milter_session *ms);
	/* The connection's SMTP session ended (QUIT, QUIT_NC, EOF); may be NULL. */
	void (*on_close)(void *ctx, struct milter_session *ms);
	/* Free ctx when the last reference goes. */
	void (*destroy)(void *ctx);
	void *ctx;
	_Atomic unsigned refs;
};

/* Take/drop a reference (thread-safe). */
struct milter_handler *milter_handler_ref(struct milter_handler *h);
void milter_handler_unref(struct milter_handler *h);

struct milter_service_conf {
	size_t max_packet;  /* cap on a packet's length word */
	size_t max_macros;  /* bytes of macro names and values kept per stage */
};

/*
 * Create the milter service on the engine with an initial handler (one reference is taken
 * over).  Returns NULL on allocation failure.
 */
struct service *milter_service_new(struct engine *e, struct milter_handler *h,
				   const struct milter_service_conf *conf);
/* Install a new handler (reference taken over) for sessions that start from now on. */
void milter_service_set_handler(struct service *svc, struct milter_handler *h);
void milter_service_set_conf(struct service *svc, const struct milter_service_conf *conf);

/* ---- what a handler can see ---- */
struct session *milter_session_session(const struct milter_session *ms);
enum milter_step milter_session_step(const struct milter_session *ms);
/* Macro value by name ("i", "{client_addr}" and "client_addr" alike), latest stage first. */
bool milter_session_macro(const struct milter_session *ms, const char *name, struct str *ret);
struct str milter_session_client_host(const struct milter_session *ms);
struct str milter_session_client_addr(const struct milter_session *ms);
char milter_session_client_family(const struct milter_session *ms);
unsigned milter_session_client_port(const struct milter_session *ms);
struct str milter_session_helo(const struct milter_session *ms);
struct str milter_session_sender(const struct milter_session *ms);
/* The recipient of the current RCPT step, and the count so far in this message. */
struct str milter_session_rcpt(const struct milter_session *ms);
unsigned milter_session_rcpt_count(const struct milter_session *ms);
/* The ESMTP arguments of the current MAIL or RCPT step. */
size_t milter_session_esmtp_args(const struct milter_session *ms, const struct str **ret);
/* HEADER step: the current header; BODY step: the current chunk; UNKNOWN: the line. */
struct str milter_session_header_name(const struct milter_session *ms);
struct str milter_session_header_value(const struct milter_session *ms);
struct str milter_session_body_chunk(const struct milter_session *ms);
struct str milter_session_unknown(const struct milter_session *ms);
uint64_t milter_session_body_size(const struct milter_session *ms);
const struct milter_neg *milter_session_neg(const struct milter_session *ms);
/* Per-session slot for the handler's own state (freed by the handler in on_close). */
void *milter_session_handler_data(const struct milter_session *ms);
void milter_session_set_handler_data(struct milter_session *ms, void *data);

/* ---- what a handler can do ---- */
/* Set the text for MILTER_REPLY (checked: 4xx/5xx, classes, 32 lines). 0 or -EINVAL. */
int milter_session_set_reply(struct milter_session *ms, struct str text);
/*
 * Modifications, at the EOM step only and only if the action was negotiated: 0, -EPERM
 * (wrong step or action not negotiated) or -EINVAL (bad argument).
 */
int milter_session_add_header(struct milter_session *ms, struct str name, struct str value);
int milter_session_insert_header(struct milter_session *ms, uint32_t index, struct str name,
				 struct str value);
int milter_session_change_header(struct milter_session *ms, uint32_t index, struct str name,
				 struct str value);
int milter_session_add_rcpt(struct milter_session *ms, struct str addr, struct str args);
int milter_session_del_rcpt(struct milter_session *ms, struct str addr);
int milter_session_change_from(struct milter_session *ms, struct str addr, struct str args);
int milter_session_replace_body(struct milter_session *ms, struct str body);
int milter_session_quarantine(struct milter_session *ms, struct str reason);
/* Tell the MTA to keep waiting (any step in Postfix, EOM in Sendmail); -EPERM at a step
 * whose answer the MTA does not wait for. */
int milter_session_progress(struct milter_session *ms);
/*
 * A tarpit: the reply to the step being handled goes out delay_ms later, on the session's
 * own timer (no thread waits), and the session reads nothing meanwhile.  Call it from
 * on_step, or before milter_session_resume() for a pending step; it applies to the
 * verdict given then.  Ignored where the MTA waits for no reply (nobody would be slowed)
 * and while a delay already runs.  Closing the session cancels the timer (the reply is
 * never sent).
 */
void milter_session_delay(struct milter_session *ms, uint64_t delay_ms);
/*
 * Deliver the verdict of a step that returned MILTER_PENDING.  Commands that arrived
 * meanwhile are processed at once, and one of them may end the session: the handler must
 * not use ms after this call returns.
 */
void milter_session_resume(struct milter_session *ms, enum milter_verdict v);

#endif
