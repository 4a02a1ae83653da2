/*
 * smtp_out -- one outgoing SMTP connection, the client side of RFC 5321, on a libevent
 * loop: the relay's delivery engine.
 *
 * A connection is made to one address (the relay chose it: smarthost or MX, in order),
 * sets up its session (greeting, EHLO with HELO fallback, STARTTLS, AUTH through GNU
 * SASL) and then runs transactions one at a time: MAIL, RCPT..., DATA, the body
 * (dot-stuffed here), the final dot.  With PIPELINING the MAIL and RCPT commands go in one
 * write and DATA follows once their replies are in (RFC 2920: DATA waits when no RCPT
 * may have succeeded).  SIZE: a message larger than the server's limit is not sent
 * (result error -EMSGSIZE, the server's advertised limit kept in the result).  8BITMIME
 * and SMTPUTF8 parameters are given when the message needs them and the server offers
 * them; a message that needs SMTPUTF8 to a server without it ends with -EPROTONOSUPPORT.
 * The DSN parameters (RFC 3461: RET, ENVID, NOTIFY, ORCPT) are passed on, xtext-encoded
 * again, when the server offers DSN, and dropped otherwise (result.dsn says which).
 *
 * Every stage has its own timeout (RFC 5321 4.5.3.2).  No call blocks; all callbacks run
 * on the loop given to smtp_out_new().  Peer input is hostile: replies go through the
 * bounded reader of proto/smtp_reply.h, and a malformed reply ends the connection.
 *
 * Lifetime: smtp_out_new() starts connecting; smtp_out_send() may be called at once (the
 * transaction waits for the session to be set up).  done() is called exactly once per
 * smtp_out_send().  After done(), the caller either sends the next transaction (when
 * smtp_out_usable()), or calls smtp_out_quit() (QUIT, then the connection frees itself)
 * or smtp_out_free() (closes at once).  Freeing cancels every timer and event and calls
 * no callback.
 *
 * done() is never called from inside smtp_out_send(), smtp_out_quit() or smtp_out_free():
 * always later, from the loop.  Inside done() the caller may call smtp_out_send() (the
 * next transaction), smtp_out_quit() or smtp_out_free() on the same connection; the
 * result (and its rcpt table) is valid only until done() returns, and the message may be
 * freed in done() (the body is copied piecewise as it is sent, never referenced).
 * After a transaction refused at MAIL, RCPT or DATA, RSET is already under way when
 * done() runs: smtp_out_usable() says yes, and a transaction sent then starts once RSET's
 * reply is in (a refused or missing RSET reply ends that transaction at stage RSET).
 * One connection belongs to one loop (thread); different connections may live on
 * different threads.
 */
#ifndef SLUICE_SMTP_OUT_H
#define SLUICE_SMTP_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "smtp_reply.h"
#include "str.h"

struct event_base;
struct smtp_out;

enum smtp_out_tls {
	SMTP_TLS_NONE = 0,   /* never STARTTLS */
	SMTP_TLS_MAY,        /* STARTTLS when offered, certificate not checked; a failed
				handshake ends the connection (the relay retries, never in clear
				on the same connection) */
	SMTP_TLS_REQUIRE,    /* STARTTLS or nothing is sent; certificate not checked */
	SMTP_TLS_VERIFY,     /* STARTTLS, certificate chain and name (server_name) checked */
	SMTP_TLS_DANE,       /* a route's setting (mx routes): the relay turns it into one of
				the above, with smtp_out_conf.dane when TLSA records apply */
	SMTP_TLS_DANE_ONLY,  /* the same, and no delivery without a DANE match */
};

/* The usable TLSA records (RFC 7672 3.1: usages 2 and 3) a connection verifies its
 * server with, through OpenSSL's DANE support, under tls SMTP_TLS_REQUIRE. */
struct smtp_out_tlsa {
	uint8_t usage, selector, mtype;
	uint16_t len;
	const uint8_t *data;
};
struct smtp_out_dane {
	const char *base;            /* the TLSA base domain: the MX host's name */
	const struct smtp_out_tlsa *recs;
	size_t n;
};

/* Where a connection or transaction ended. */
enum smtp_out_stage {
	SMTP_STAGE_CONNECT = 0,
	SMTP_STAGE_GREETING,
	SMTP_STAGE_EHLO,      /* EHLO, or HELO after a refused EHLO */
	SMTP_STAGE_STARTTLS,  /* the command, the handshake, or the EHLO after it */
	SMTP_STAGE_AUTH,
	SMTP_STAGE_MAIL,
	SMTP_STAGE_RCPT,
	SMTP_STAGE_DATA,      /* the DATA command's reply (354 expected) */
	SMTP_STAGE_DOT,       /* the body was sent; waiting for the final reply */
	SMTP_STAGE_RSET,
	SMTP_STAGE_QUIT,
	SMTP_STAGE_COUNT,
};
const char *smtp_out_stage_name(enum smtp_out_stage st); /* "connect", "greeting", ... */

struct smtp_out_conf {
	const char *helo;            /* our name in EHLO/HELO (required) */
	const char *server_name;     /* SNI and name checked under SMTP_TLS_VERIFY; NULL: none */
	enum smtp_out_tls tls;
	const struct smtp_out_dane *dane; /* not NULL: the certificate must match a TLSA
					record (a mismatch fails the set-up at stage starttls,
					error -EPERM, why from OpenSSL); tls must not be NONE */
	const char *ca_file;         /* SMTP_TLS_VERIFY: PEM bundle; NULL: OpenSSL's default paths */
	const char *auth_user;       /* NULL: no AUTH */
	const char *auth_password;
	const char *auth_mechanisms; /* space-separated, in preference order, among those the
					server offers; NULL: "SCRAM-SHA-256 SCRAM-SHA-1 PLAIN LOGIN" */
	bool auth_plaintext;         /* allow AUTH on a connection without TLS (off: -EPERM) */
	uint64_t timeout_ms[SMTP_STAGE_COUNT]; /* 0: RFC 5321 4.5.3.2 defaults (connect 30 s,
					greeting 5 min, MAIL 5 min, RCPT 5 min, DATA 2 min, each
					body write 3 min, dot 10 min, QUIT 10 s, others 2 min).
					The body writes use timeout_ms[SMTP_STAGE_DATA] when it is
					set (the DATA reply and each refill of the output) */
};

/* Bounds on a transaction (smtp_out_send: -EINVAL past them). */
#define SMTP_OUT_RCPT_MAX 1000
#define SMTP_OUT_ADDR_MAX 512        /* an address, without <> (RFC 5321 4.5.3.1.3: 256) */

/* A recipient's DSN parameters (RFC 3461), decoded: sent xtext-encoded. */
struct smtp_out_rcpt_dsn {
	unsigned notify;             /* SMTP_NOTIFY_* bits of proto/smtp.h; 0: none */
	struct str orcpt;            /* "type;address"; empty: none (dropped when its encoded
					value would pass RFC 3461's 500 characters) */
};

/* One transaction.  Everything it points to stays valid until done() has run. */
struct smtp_out_msg {
	struct str sender;           /* empty: the null sender <> */
	const struct str *rcpt;      /* addresses without <> */
	size_t nrcpt;
	const struct str *body;      /* the message as queued: CRLF lines, not dot-stuffed */
	size_t nbody;                /* chunks, sent in order as the output drains */
	uint64_t size;               /* total body bytes (for SIZE=) */
	bool eightbit;               /* BODY=8BITMIME when offered */
	bool smtputf8;               /* SMTPUTF8 required */
	unsigned ret;                /* RET=: SMTP_RET_* of proto/smtp.h, 0 none */
	struct str envid;            /* ENVID=, decoded (printable ASCII); empty: none */
	const struct smtp_out_rcpt_dsn *rcpt_dsn; /* nrcpt of them, or NULL: none */
};

/*
 * What became of a transaction (or of the session set-up it waited for).
 *   error == 0: stage and reply say where it ended: stage DOT with a 2xx reply is
 *     success; a reply at an earlier stage ended it (reply.code 4xx/5xx).
 *   error < 0: no usable reply -- -ECONNREFUSED, -ETIMEDOUT (at stage), -ECONNRESET (the
 *     peer closed), -EPROTO (a malformed reply; why), -EMSGSIZE (SIZE: not sent),
 *     -EPERM (TLS or AUTH policy: tls require/verify without STARTTLS offered, a failed
 *     certificate check, AUTH not offered or not allowed in plaintext; why),
 *     -EPROTONOSUPPORT (SMTPUTF8 needed and not offered), -ENOMEM.  At stage DOT this is
 *     the uncertain window: the server may have taken the message.
 *   rcpt[i]: RCPT reply of recipient i (code 0: no reply -- not sent or the transaction
 *     ended first).  Only the recipients with a 2xx here were in the transaction.
 */
struct smtp_out_result {
	enum smtp_out_stage stage;
	int error;
	const char *why;             /* static text for an error, "" otherwise */
	struct smtp_reply reply;     /* the deciding reply (code 0 when error) */
	const struct smtp_reply *rcpt; /* nrcpt of them, valid during done() */
	uint64_t size_limit;         /* the server's SIZE, 0 if none */
	bool tls;                    /* the session ran over TLS */
	const char *tls_version;     /* "TLSv1.3" ... or "" */
	const char *auth_mech;       /* the mechanism that authenticated, or "" */
	bool dsn;                    /* the server offers DSN: the parameters went with it */
};

typedef void smtp_out_done_fn(void *arg, struct smtp_out *c, const struct smtp_out_result *r);

/*
 * Connect to addr (AF_INET or AF_INET6; from source when given: bind before connect) and
 * set up the session.  conf must outlive the connection.  Returns NULL on ENOMEM, or
 * EINVAL for a missing conf/helo or an unusable address (errno set).  Connection and
 * set-up failures are reported through done() of the first transaction (also when it is
 * sent after the failure happened).
 */
struct smtp_out *smtp_out_new(struct event_base *base, const struct smtp_out_conf *conf,
			      const struct sockaddr *addr, socklen_t addrlen,
			      const struct sockaddr *source, socklen_t sourcelen);
/* Run one transaction; done(arg, c, result) once.  -EBUSY while one is under way,
 * -ENOTCONN when the connection is no longer usable (or quitting), -EINVAL for no or too
 * many recipients or an address with CR, LF, NUL, '<' or '>' or longer than
 * SMTP_OUT_ADDR_MAX (nothing is sent then), -ENOMEM. */
int smtp_out_send(struct smtp_out *c, const struct smtp_out_msg *m, smtp_out_done_fn *done,
		  void *arg);
/* Between transactions: may another one be sent on this connection?  (Also true while a
 * new connection is still being set up: the transaction waits for it.) */
bool smtp_out_usable(const struct smtp_out *c);
/* Transactions completed on this connection (reuse counting): those that got a reply
 * after the final dot, 2xx or not. */
unsigned smtp_out_transactions(const struct smtp_out *c);
/* How the server was authenticated, once TLS is up: "DANE-EE 3 1 1" (the TLSA record
 * that matched, RFC 7218 acronym and its three numbers), "verified" (tls verify),
 * "not verified", or "" without TLS. */
const char *smtp_out_tls_auth(const struct smtp_out *c);
/* Why a DANE handshake failed (the verify result, not OpenSSL's text): no TLSA record
 * matched, the certificate (DANE-TA) does not name the host, or something else. */
enum smtp_out_dane_fail { SMTP_DANE_FAIL_OTHER = 0, SMTP_DANE_FAIL_NO_MATCH, SMTP_DANE_FAIL_NAME };
enum smtp_out_dane_fail smtp_out_dane_failure(const struct smtp_out *c);
/* The peer as "host[addr]:port" for logs and Remote-MTA. */
const char *smtp_out_peer(const struct smtp_out *c);
/* Say QUIT and close; the connection frees itself (no callback): c must not be used
 * after this call.  QUIT is said when nothing is outstanding, or after the reply awaited
 * during set-up or RSET; in a transaction, a TLS handshake or AUTH the connection just
 * closes.  A transaction not yet done is dropped without its done().  Accepts NULL. */
void smtp_out_quit(struct smtp_out *c);
/* Close at once, calling nothing.  Accepts NULL; returns NULL. */
struct smtp_out *smtp_out_free(struct smtp_out *c);

/*
 * Between transactions, the relay learns when a connection becomes ready: ready(arg, c,
 * NULL) once the session is set up (greeting, EHLO, STARTTLS, AUTH) while no transaction
 * waits -- the caller then takes its budget and calls smtp_out_send(), which writes MAIL
 * at once, so that the send is counted when it is made -- and ready(arg, c, failure) when
 * the session cannot be set up, or an idle connection is closed by the peer, while no
 * transaction waits (the connection is then unusable: free it).  Set before the loop
 * runs again after smtp_out_new().
 * ready(c, NULL) comes once, when the set-up completes (not again after transactions or
 * RSETs); ready(c, failure) at most once, with failure->rcpt NULL, also for a refused RSET
 * or an idle connection's 421, EOF or stray reply.  A failure while a transaction waits
 * goes to that transaction's done() instead.  ready() may call smtp_out_send(),
 * smtp_out_quit() or smtp_out_free(); it is never called from inside smtp_out_* calls.
 */
typedef void smtp_out_ready_fn(void *arg, struct smtp_out *c, const struct smtp_out_result *failure);
void smtp_out_set_ready(struct smtp_out *c, smtp_out_ready_fn *ready, void *arg);

/* The peer's host name for smtp_out_peer() (the MX or smarthost name); copied. */
void smtp_out_set_peer_name(struct smtp_out *c, const char *name);

/* freed(arg) is called when the connection's memory is released -- by smtp_out_free(),
 * at the end of smtp_out_quit()'s QUIT, or by smtp_out_abandon_quitting() -- so that the
 * owner of what conf points to knows when it may go. */
void smtp_out_set_freed(struct smtp_out *c, void (*freed)(void *arg), void *arg);

/* Free at once, without waiting for the server, every connection of base that
 * smtp_out_quit() left to finish by itself: at shutdown, on the loop's thread after its
 * loop has stopped, before the loop is freed. */
void smtp_out_abandon_quitting(struct event_base *base);

/* The process-wide TLS client contexts (OpenSSL 3, one per ca_file, made on first use)
 * and the GNU SASL context: freed here, at exit or to reload CA files (connections alive
 * keep their own references to a TLS context; none may be in AUTH). */
void smtp_out_tls_cleanup(void);

#endif
