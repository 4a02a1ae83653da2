/*
 * queue_control -- the control commands over the queue and the intake: `queue` (list),
 * `queue show ID`, `queue hold|release|delete|flush ID...|--all`, and the queue and
 * intake part of `stats`.
 */
#ifndef SLUICE_QUEUE_CONTROL_H
#define SLUICE_QUEUE_CONTROL_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "engine.h"
#include "queue.h"
#include "str.h"

/* q may be NULL (no queue configured: the command says so). */
void queue_control(struct queue *q, size_t argc, const struct str *argv, struct buf *out,
		   bool *ret_ok);
/* json: members ("queue":{...},"intake_mail":{...}: "intake" holds the service's session
 * statistics) to put inside the stats object, with a leading comma.  intake may be NULL. */
void queue_control_stats(struct queue *q, struct service *intake, bool json, struct buf *out);
/* The queue's part of `status`: a line ("queue: loading 412,000 of 1,000,000 messages"
 * while the index loads, its size after), or with json a member ,"queue":{...}.  q may
 * be NULL (nothing is added). */
void queue_control_status(struct queue *q, bool json, struct buf *out);

#endif
