/*
 * smtp_out_int -- the SMTP client's private declarations, shared by its rooms
 * (smtp_out.h is the public side), from the top down:
 *   smtp_out.c       the session and the interface: the replies read and dispatched by
 *                    the connection's phase, the set-up (greeting, EHLO or HELO, then
 *                    STARTTLS and AUTH in that order), RSET and QUIT, the libevent
 *                    callbacks, the public functions and the teardown
 *   smtp_out_tls.c   STARTTLS and SASL authentication, and the process-wide TLS contexts
 *                    and SASL library
 *   smtp_out_tx.c    one transaction: MAIL, RCPT, DATA, the body, the final dot, and
 *                    their replies
 *   smtp_out_conn.c  the floor: stages, timers, commands into the output, closing, and
 *                    the reports and failures every room ends with
 * Calls go down this list only: smtp_out.c calls the three others, smtp_out_tls.c and
 * smtp_out_tx.c call smtp_out_conn.c, which calls none.  A room below hands the session
 * back what it decided (smtp_out_on_auth_reply's result), never calls it.
 * All of it runs on the loop of the connection's owner (the relay's thread), but the
 * process-wide TLS and SASL state, which is locked.
 */
#ifndef SLUICE_SMTP_OUT_INT_H
#define SLUICE_SMTP_OUT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "smtp_out.h"

#define BODY_PENDING_MAX (256u * 1024) /* body bytes queued in the output, at most */
#define BODY_LOW_WATER (64u * 1024)    /* refill when the output is down to this */
#define TLS_UNDER_HIGH (64u * 1024)    /* ciphertext queued below the TLS filter */
#define INPUT_MAX (64u * 1024)         /* read high watermark */
#define READ_WINDOW (4u * SMTP_REPLY_LINE_MAX) /* bytes handed to the reader at a time */
#define PEER_MAX 320
#define QUIT_TIMEOUT_MS 10000
#define BODY_TIMEOUT_MS 180000

enum phase {
	PH_CONNECT = 0,
	PH_GREETING,
	PH_EHLO,
	PH_HELO,
	PH_STARTTLS,
	PH_HANDSHAKE,
	PH_AUTH,
	PH_READY,
	PH_MAIL,
	PH_RCPT,
	PH_DATA,
	PH_BODY,
	PH_DOT,
	PH_RSET,
	PH_QUIT,
	PH_CLOSED,
};

struct smtp_out {
	struct smtp_out *q_prev, *q_next; /* on the quitting list (smtp_out_quit) */
	bool on_quit_list;
	void (*freed)(void *arg);     /* smtp_out_set_freed */
	void *freed_arg;
	struct event_base *base;
	const struct smtp_out_conf *conf;
	int fd;                      /* until the bufferevent owns it */
	struct event *conn_ev;       /* connect() completion */
	struct bufferevent *bev;     /* the socket, or the TLS filter over it */
	SSL *ssl;                    /* owned by bev */
	struct event *timer;
	struct event *kick;          /* starts or reports a send outside smtp_out_send() */
	enum phase phase;
	struct smtp_reply_reader rd;
	size_t reply_lines;          /* lines of the reply being read (EHLO parsing) */

	/* the session */
	struct smtp_ehlo ehlo, seen;  /* in force; being read */
	bool tls;
	const char *tls_version;
	char tls_auth[48];           /* smtp_out_tls_auth() */
	long tls_verify;             /* the failed handshake's verify result (X509_V_...) */
	bool authenticated;
	char auth_mech[GSASL_MAX_MECHANISM_SIZE + 1];
	Gsasl_session *sasl;
	bool sasl_finished;          /* the mechanism gave its last output */
	bool sasl_aborted;           /* "*" sent: the next reply ends AUTH */
	bool xoauth2;
	bool session_ready;          /* reached READY once */
	bool unusable;               /* no further transaction */
	bool quitting;
	bool fail_pending;           /* a set-up failure the first transaction reports */
	enum smtp_out_stage fail_stage;
	int fail_error;
	const char *fail_why;
	struct smtp_reply fail_reply;

	/* the relay's view of an idle connection (smtp_out_set_ready) */
	smtp_out_ready_fn *ready;
	void *ready_arg;
	bool ready_failed;           /* ready(failure) was called: never again */

	/* the transaction */
	const struct smtp_out_msg *msg; /* accepted by smtp_out_send, until done() */
	smtp_out_done_fn *done;
	void *arg;
	bool active;                 /* msg's commands are under way */
	struct smtp_reply *rcpt;     /* msg->nrcpt */
	size_t rcpt_got, rcpt_ok;
	bool mail_failed;
	struct smtp_reply end_reply; /* MAIL's refusal, or the last RCPT refusal */
	size_t body_i, body_off;
	bool at_line_start, body_any, body_done;
	char tail[2];                /* the body's last two bytes */
	unsigned ntrans;

	int in_cb;
	bool free_pending;
	char peer_addr[INET6_ADDRSTRLEN + 16]; /* "[addr]:port" */
	char peer[PEER_MAX];
};

/* ---- smtp_out.c: nothing the other rooms call ---- */

/* ---- smtp_out_tls.c ---- */
void smtp_out_start_tls(struct smtp_out *c);
/* The handshake is done: how the server was authenticated, into c->tls_auth. */
void smtp_out_tls_done(struct smtp_out *c);
bool smtp_out_offered(const char *list, struct str mech);
void smtp_out_start_auth(struct smtp_out *c);
bool smtp_out_on_auth_reply(struct smtp_out *c, const struct smtp_reply *r);

/* ---- smtp_out_tx.c ---- */
bool smtp_out_addr_ok(struct str a);
int smtp_out_tx_check(const struct smtp_out *c, const struct smtp_out_msg *m, const char **why);
int smtp_out_tx_write_mail(struct smtp_out *c);
void smtp_out_start_transaction(struct smtp_out *c);
int smtp_out_body_fill(struct smtp_out *c);
void smtp_out_tx_on_reply(struct smtp_out *c, const struct smtp_reply *r);

/* ---- smtp_out_conn.c ---- */
bool smtp_out_is_2xx(const struct smtp_reply *r);
bool smtp_out_is_refusal(const struct smtp_reply *r);
enum smtp_out_stage smtp_out_stage_of(const struct smtp_out *c);
void smtp_out_arm(struct smtp_out *c);
void smtp_out_arm_quit(struct smtp_out *c);
struct evbuffer *smtp_out_out_buf(struct smtp_out *c);
int smtp_out_send_cmd(struct smtp_out *c, const char *s);
void smtp_out_close_io(struct smtp_out *c);
void smtp_out_release(struct smtp_out *c);
void smtp_out_report(struct smtp_out *c, enum smtp_out_stage st, int error, const char *why,
		   const struct smtp_reply *reply);
void smtp_out_report_ready_failure(struct smtp_out *c, enum smtp_out_stage st, int error,
				   const char *why, const struct smtp_reply *reply);
void smtp_out_fail(struct smtp_out *c, enum smtp_out_stage st, int error, const char *why,
		 const struct smtp_reply *reply, bool broken);
void smtp_out_fail_nomem(struct smtp_out *c);
void smtp_out_fail_proto(struct smtp_out *c, const char *why);

#endif
