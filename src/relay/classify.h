/*
 * classify -- what a relay's reply means for the mail and for the lane: the heart of
 * "throttling is not failure" (law 5, doc/ARCHITECTURE.md).
 *
 * A reply (or a connection error) at a stage of an SMTP transaction becomes one verdict:
 *   OK         2xx where success was expected;
 *   RETRY      this recipient or message, later, with backoff (4xx at RCPT, DATA, DOT);
 *   FAIL       this recipient failed for good (5xx at RCPT, DATA, DOT): bounced later;
 *   SUSPEND    the lane stops sending for a while; no recipient state changes (a
 *              connection refused or timed out, 421 at any stage, 4xx/5xx at greeting,
 *              EHLO, STARTTLS, AUTH or MAIL FROM, and throttling, quota, ban or policy
 *              replies at any stage);
 *   SLOW       like RETRY for the mail, and the lane's rate is cut (adaptive shaping).
 * Operators add signals (`signal { match = "regex"; action; for; }`), tried in order
 * before the built-in patterns (the table is in classify.c), which are tried before the
 * rules by stage and code.  Patterns are POSIX extended regexes, case-insensitive, matched
 * against the reply as "CODE[ ENH] text" (e.g. "550 5.7.1 Account suspended"); for a
 * connection error, against "connect: <error text>" (e.g. "connect: Connection refused";
 * built-in patterns are not tried on errors).  Patterns are tried only on 4xx/5xx replies
 * and errors: a 2xx is OK whatever its text says.
 *
 * A pure module: no I/O, no clock.  A classifier is immutable once built: it may be used
 * from any thread.
 */
#ifndef SLUICE_CLASSIFY_H
#define SLUICE_CLASSIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "smtp_out.h"
#include "smtp_reply.h"
#include "str.h"

enum classify_verdict {
	CLASSIFY_OK = 0,
	CLASSIFY_RETRY,
	CLASSIFY_FAIL,
	CLASSIFY_SUSPEND,
	CLASSIFY_SLOW,
};
const char *classify_verdict_name(enum classify_verdict v); /* "ok", "retry", ... */

/* A signal as configured: `signal { match; action; for; }` (action: suspend, slow,
 * retry or bounce -- bounce is CLASSIFY_FAIL; ok is refused).  for_ms is given to SUSPEND,
 * SLOW and RETRY verdicts; <= 0 means none (a retry hint in the text, else the lane's
 * backoff). */
struct classify_signal_conf {
	const char *match;           /* regex */
	enum classify_verdict action;
	int64_t for_ms;              /* suspension or slow-down length; 0: the lane's backoff */
	unsigned after;              /* act on the after-th matching reply within within_ms */
	int64_t within_ms;           /* (per lane: the relay counts); after <= 1: at once */
};

struct classify;

/* Build a classifier from the configured signals (n may be 0); the patterns are copied.
 * NULL with errno EINVAL and err saying "signal N: bad pattern \"...\": <regcomp's
 * message>" (N counts from 1), or errno ENOMEM and err "out of memory". */
struct classify *classify_new(const struct classify_signal_conf *sig, size_t n, char *err,
			      size_t errlen);
struct classify *classify_free(struct classify *c);

struct classify_result {
	enum classify_verdict verdict;
	int64_t for_ms;              /* SUSPEND/SLOW: from the matching signal, or from a
					retry hint in the text; -1: none (the lane's backoff) */
	const char *signal;          /* an operator's pattern as configured, a built-in's
					name ("ses-throttling"), or a rule's name ("error",
					"421", "stage", "code"): for logs and `sluice lanes`;
					valid as long as the classifier */
	long index;                  /* the operator's signal that decided (from 0), or -1 */
};

/*
 * Classify the end of a transaction at stage with reply r (error == 0), or a connection
 * error (error < 0: r may be NULL or have code 0; ECONNREFUSED, ETIMEDOUT, ECONNRESET,
 * EPROTO, EPERM, ENOMEM and any other -> SUSPEND; EMSGSIZE and EPROTONOSUPPORT -> FAIL:
 * this message can never go to this server.  At stage DOT the caller handles the
 * uncertain window and does not ask; if it does, the answer is SUSPEND).  For one
 * recipient's RCPT reply pass stage SMTP_STAGE_RCPT.  A reply that makes no sense (no
 * reply, a code outside 200..599, a 3xx other than at DATA or AUTH) is SUSPEND, the
 * verdict that changes no recipient state.  c may be NULL (rules only).
 */
void classify_reply(const struct classify *c, enum smtp_out_stage stage, int error,
		    const struct smtp_reply *r, struct classify_result *ret);

/*
 * classify_reply(), with the operator's signals i whose skip[i] is true passed over (skip
 * NULL: none; else classify_nsignals() entries): what the reply means when a signal with
 * a threshold has not seen enough matching replies yet.
 */
void classify_reply_skip(const struct classify *c, const bool *skip, enum smtp_out_stage stage,
			 int error, const struct smtp_reply *r, struct classify_result *ret);
size_t classify_nsignals(const struct classify *c);
/* Never the same for two classifiers made (0: none), as their addresses may be. */
uint64_t classify_serial(const struct classify *c);
/* Signal i's pattern, after and within as one number (0: no such signal): a reload that
 * keeps them keeps the signal's count. */
uint64_t classify_threshold_key(const struct classify *c, size_t i);
/* Signal i's threshold as configured: act on the after-th matching reply within
 * within_ms; after <= 1: at once. */
void classify_threshold(const struct classify *c, size_t i, unsigned *ret_after,
			int64_t *ret_within_ms);

/*
 * A retry hint in a reply text: "try again in 92 seconds", "retry after 5 minutes",
 * "wait 2 hours", "in 30s", "in 1 hour and 30 minutes", "try again later" (no number:
 * -1).  A number counts only within 32 bytes and 3 words after a cue word (in, after,
 * wait) and with a unit (s, sec, second, m, min, minute, h, hr, hour, d, day, week, and
 * plurals), so "quota exceeded 500" is no hint.  Returns milliseconds, capped at 7 days,
 * or -1 when there is none.  One pass over the text: O(n) on any input.
 */
int64_t classify_retry_hint(struct str text);

#endif
