/*
 * relay_harness -- the relay's rooms in one process, for their unit tests: a real queue in
 * a private directory, the relay made by relay_new() but driven on the test's own thread
 * (no relay thread, no flusher: flushes are made where they are asked), a clock the test
 * moves (relay.clock), every log line kept, and in place of the SMTP client (smtp_out*.c,
 * left out of the link) a scripted peer: each connection the relay opens is listed, made
 * ready when the test says, and each transaction waits for the reply the test gives.
 *
 * In place of the DNS channel (mx.c, left out of the link too) the lookups wait for the
 * test's answers (harness_dns_answer, harness_tlsa_answer); a smarthost that is an
 * address is answered at once, as the channel does.  Routes are smarthosts at
 * [127.0.0.1]:2525 unless a test makes one an mx route.
 */
#ifndef SLUICE_RELAY_HARNESS_H
#define SLUICE_RELAY_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "queue.h"
#include "relay.h"
#include "relay_int.h"

#define HARNESS_LOG_MAX 4096

/* A connection of the scripted peer (the struct smtp_out the relay holds). */
struct smtp_out {
	struct harness *h;
	smtp_out_ready_fn *ready;
	void *ready_arg;
	void (*freed)(void *arg);
	void *freed_arg;
	smtp_out_done_fn *done;       /* the transaction waiting for its reply, or NULL */
	void *done_arg;
	const struct smtp_out_msg *msg;
	char peer[300];
	enum smtp_out_tls tls;        /* the TLS the relay asked of it */
	char host[256];               /* the name its certificate must hold, or "" */
	unsigned transactions;
	bool is_ready, usable, quit;
	struct smtp_out *next;
};

/* A lookup waiting for the test's answer (the struct mx_query the relay holds). */
struct mx_query {
	struct harness *h;
	char name[256];
	bool tlsa;
	uint16_t port;
	mx_done_fn *done;
	mx_tlsa_fn *tlsa_done;
	void *arg;
	struct mx_query *next;
};

struct harness {
	char dir[64];
	struct queue *q;
	struct relay *r;
	struct relay_conf conf;
	uint64_t now;                 /* the relay's clock */
	char *log[HARNESS_LOG_MAX];
	size_t nlog;
	struct smtp_out *conns;       /* open (not freed) connections, newest first */
	unsigned opened;              /* connections made */
	bool auto_ready;              /* a new connection is ready at the next run */
	struct mx_query *queries;     /* lookups waiting for an answer, newest first */
	unsigned lookups;             /* lookups asked */
};

/* The relay's configuration before harness_open(): one smarthost route "r" for every
 * domain, unlimited, one connection; conf may be changed in between. */
void harness_init(struct harness *h);
/* A second route for domain (after harness_init, before harness_open). */
struct route_conf *harness_route(struct harness *h, const char *name, const char *domain);
/* Queue and relay made and loaded (fails the test on error). */
void harness_open(struct harness *h);
void harness_close(struct harness *h);
/* The relay and the queue stop, and start again over the same directories (the queue's
 * messages are loaded and announced again, the send history read back). */
void harness_restart(struct harness *h);

/* Run the relay's loop until nothing is left to do at once. */
void harness_run(struct harness *h);
/* Queue a message from sender to the n recipients (committed, and known to the relay);
 * its id into id. */
void harness_put(struct harness *h, const char *sender, const char *const *rcpts, size_t n,
		 char id[QUEUE_ID_LEN + 1]);
/* The same, each recipient with its NOTIFY= (QUEUE_NOTIFY_* bits; 0: none). */
void harness_put_dsn(struct harness *h, const char *sender, const char *const *rcpts,
		     const unsigned *notify, size_t n, char id[QUEUE_ID_LEN + 1]);
/* The clock moves on by ms, and every lane is kicked (as its timer would). */
void harness_advance(struct harness *h, uint64_t ms);
void harness_advance_us(struct harness *h, uint64_t us);

/* The connection that waits for a transaction's reply (the oldest), or NULL. */
struct smtp_out *harness_busy(struct harness *h);
/* Make c's session ready (or failed, with failure) as the SMTP client would. */
void harness_ready(struct harness *h, struct smtp_out *c, const struct smtp_out_result *failure);
/* End c's transaction: code (250...) to the final dot, and per recipient its RCPT reply
 * (rcpt[i], NULL: all 250; 4xx ones say 4.2.0, but 452, which says 4.5.3 "too many
 * recipients"; 5xx ones 5.1.1).  reply_text is the final reply's text. */
void harness_reply(struct harness *h, struct smtp_out *c, int code, const char *enh,
		   const int *rcpt, const char *reply_text);
/* End c's transaction with a raw result. */
void harness_result(struct harness *h, struct smtp_out *c, const struct smtp_out_result *res);

/* Whether a lookup of name (MX, or TLSA for tlsa) waits for its answer. */
bool harness_dns_waits(struct harness *h, const char *name, bool tlsa);
/* Answer the MX lookup of name: n MX hosts (each at 127.0.0.1, preference 10 * (i + 1)),
 * validated or not, with a TTL of ttl s; or error (-ENOENT no such domain, -ENODATA a null
 * MX, -EAGAIN a failure) when n is 0. */
void harness_dns_answer(struct harness *h, const char *name, const char *const *hosts, size_t n,
			bool secure, uint32_t ttl, int error);
/* Answer the TLSA lookup of host: no records (-ENOENT), records none of which is usable
 * (0), or a failure (another error). */
void harness_tlsa_answer(struct harness *h, const char *host, bool secure, int error);

/* The message's recipient i status byte as on disk. */
char harness_disk_status(struct harness *h, const char *id, size_t i);
/* Whether a log line contains every one of the NULL-terminated words. */
bool harness_logged(struct harness *h, ...);
void harness_log_clear(struct harness *h);
/* The message's attempt log (queue_log), into out; its length. */
size_t harness_attempts(struct harness *h, const char *id, char *out, size_t len);

#endif
