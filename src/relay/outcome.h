/*
 * outcome -- what happens to one recipient: a pure function from what was learned about
 * it (a classified reply, a lost connection, a deferral or failure decided without a
 * reply, the operator's flush) to what must change (its status byte, its next try, its
 * attempts, the DSN code, the words of its log lines, the counter it moves).
 *
 * The message room carries an outcome out (msg_rcpt_settle() in relay_msg.c), and is
 * the only code that writes a recipient's status, retry time and attempts: the end of a
 * transaction, a lane failing or deferring its due recipients, and the end of a
 * message's lifetime or the operator's bounce all decide here and write there.
 */
#ifndef SLUICE_OUTCOME_H
#define SLUICE_OUTCOME_H

#include <stdbool.h>
#include <stdint.h>

#include "classify.h"
#include "log.h"
#include "smtp_reply.h"

enum outcome_event {
	OUTCOME_REPLY = 0,            /* its transaction ended: cr classified its reply rep */
	OUTCOME_UNCERTAIN,            /* the connection broke after the message was sent */
	OUTCOME_NOT_TRIED,            /* its transaction ended before it was tried (a reused
				       * connection the server had closed, a RCPT never
				       * answered): due again at once, nothing logged */
	OUTCOME_DEFER,                /* deferred before any transaction (DANE): dsn, note */
	OUTCOME_FAIL,                 /* fails without a reply of its own (its domain cannot
				       * take mail, its lifetime ended, the operator): dsn */
	OUTCOME_DUE_NOW,              /* the operator's `sluice queue flush` */
};

struct outcome_in {
	enum outcome_event ev;
	const struct classify_result *cr; /* OUTCOME_REPLY */
	const struct smtp_reply *rep;     /* OUTCOME_REPLY: its reply, or NULL (none: the
					     DSN code is the verdict's class .0.0) */
	const char *dsn;                  /* OUTCOME_DEFER, OUTCOME_FAIL */
	const char *note;                 /* OUTCOME_DEFER: said after the log line */
	bool relayed;                     /* a delivery owes a "relayed" notice (RFC 3461
					     6.2.2): written N, not D */
	bool hold;                        /* OUTCOME_UNCERTAIN: relay.uncertain = "hold" */
};

enum outcome_next {
	OUTCOME_NEXT_KEEP = 0,        /* its retry time stays */
	OUTCOME_NEXT_NOW,             /* due at once */
	OUTCOME_NEXT_BACKOFF,         /* the retry backoff (hint_ms when > 0), journalled,
				       * and counted as a deferral */
};

enum outcome_count {
	OUTCOME_COUNT_NONE = 0,
	OUTCOME_COUNT_DELIVERED,
	OUTCOME_COUNT_FAILED,
	OUTCOME_COUNT_UNCERTAIN,
};

struct outcome {
	char status;                  /* its new status byte (QUEUE_*), or 0: unchanged */
	enum outcome_next next;
	int64_t hint_ms;              /* OUTCOME_NEXT_BACKOFF: the server's or the signal's
				       * wait; <= 0: the backoff of its attempts */
	int attempts;                 /* +1, or -1: this attempt does not count (never below
				       * 0), or 0 */
	char dsn[16];                 /* for the delivery line ("" with no line) */
	const char *attempt;          /* the attempt log's status word; NULL: no line */
	bool attempt_dsn;             /* the attempt line carries the DSN code */
	const char *word;             /* the delivery line's status=; NULL: no line */
	enum log_level level;         /* of the delivery line */
	const char *note;             /* after the delivery line, or NULL */
	enum outcome_count count;
	bool lane_signal;             /* the lane's throttling (suspend, slow): the lane acts
				       * on cr; the recipient is untouched but due again */
};

/* The outcome of in (pure: no I/O, no clock). */
void outcome_decide(const struct outcome_in *in, struct outcome *ret);

/* Whether rep says "too many recipients" (RFC 5321 4.5.3.1.10: 452, or 552 5.5.3 as
 * some servers send it): the rest go in the next transaction, not after a backoff. */
bool outcome_too_many_rcpts(const struct smtp_reply *rep);

#endif
