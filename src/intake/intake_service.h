/*
 * intake_service -- the SMTP intake: an RFC 5321 server on the engine that puts mail into
 * the queue (doc/QUEUE.md), for the local MTA (a Postfix relayhost, a Sendmail
 * SMART_HOST), programs, and sluice's own injectors.
 *
 * It is not an open relay: only clients whose address is in allow (and every client of a
 * unix socket, which file modes guard) may talk to it; others get 554 5.7.1 at connect.
 * The final dot is answered 250 only after the message's commit point (the committer
 * thread's batch flushed it and renamed it into msg/); a failed commit answers 451 4.3.0
 * (452 4.3.1 when the disk is full) and leaves nothing behind.
 *
 * Invariants: one transaction at a time per session; the queue file of a transaction is
 * created at DATA and either handed to the committer or removed, never left in tmp/ by a
 * live daemon; a session that goes away while its commit is in flight is detached from
 * it, and the message is committed all the same (the client was not answered, and may
 * send it again: a duplicate, never a loss).
 */
#ifndef SLUICE_INTAKE_SERVICE_H
#define SLUICE_INTAKE_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "ipaddr.h"
#include "queue.h"

struct intake_conf {
	const struct ip_prefix *allow;   /* copied */
	size_t nallow;
	uint64_t max_message_size;
	uint64_t min_free;               /* MAIL: 452 4.3.1 under this (+ SIZE) free bytes */
	unsigned max_recipients;
	unsigned max_errors;
	size_t max_line;                 /* octets of a message line, CRLF excluded */
	/* DATA with a bare LF or CR line end: refused at its end (550 5.5.2) instead of
	 * stored with CRLF.  Commands with one are refused either way. */
	bool reject_bare_newline;
	const char *hostname;            /* copied; NULL: gethostname() */
	struct request_bound data;       /* the deadline of a message's data */
	struct request_bound line;       /* of a command line discarded as too long */
};

/* The service, writing into q (not owned).  NULL on failure. */
struct service *intake_service_new(struct engine *e, struct queue *q,
				   const struct intake_conf *conf);
/* New settings (reload), for sessions that start from now on.  0 or -ENOMEM. */
int intake_service_set_conf(struct service *svc, const struct intake_conf *conf);

struct intake_stats {
	uint64_t messages;     /* answered 250 */
	uint64_t recipients;   /* of those messages */
	uint64_t bytes;
	uint64_t refused;      /* connections refused by allow */
	uint64_t rejected;     /* transactions refused: size, lines, commit failures */
	uint64_t bare_eol;     /* messages with a bare CR or LF line end */
	uint64_t bare_command; /* command lines refused for a bare CR or LF */
};
void intake_service_stats(struct service *svc, struct intake_stats *ret);

#endif
