/*
 * queue_control -- the control commands over the queue and the intake: `queue` (list),
 * `queue show ID`, `queue summary`, `queue hold|release|delete|flush|bounce
 * ID...|--all|SELECTION`, and the queue and intake part of `stats`.
 *
 * A selection is words of the request: domain=D sender=S older=DURATION state=STATE
 * ids=ID,ID,... (queue_select.h says what each selects; they combine with "and").  A
 * listing, a summary and an action on a selection (or --all) walk the index in batches
 * (queue.h, "Walks") and answer in parts (control.h's "more"): a listing of a million
 * messages never sits whole in memory nor holds the index's lock for long, and an action
 * on a million messages ships no IDs back and forth.  The last part of a text listing is
 * "-- N messages, R recipients, B bytes", of an action "N messages held" (or its JSON
 * object), so that the CLI can add up the batches of IDs it reads from its input.
 */
#ifndef SLUICE_QUEUE_CONTROL_H
#define SLUICE_QUEUE_CONTROL_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "control_service.h"
#include "engine.h"
#include "queue.h"
#include "str.h"

/* q may be NULL (no queue configured: the command says so).  Returns as
 * its run(): 0 (answered in out), 2 (a streamed reply that w->step goes on
 * with), or <0. */
int queue_control(struct queue *q, size_t argc, const struct str *argv, struct buf *out,
		  bool *ret_ok, struct control_wait *w);
/* json: members ("queue":{...},"intake_mail":{...}: "intake" holds the service's session
 * statistics) to put inside the stats object, with a leading comma.  intake may be NULL. */
void queue_control_stats(struct queue *q, struct service *intake, bool json, struct buf *out);
/* The queue's part of `status`: a line ("queue: loading 412,000 of 1,000,000 messages"
 * while the index loads, its size after), or with json a member ,"queue":{...}.  q may
 * be NULL (nothing is added). */
void queue_control_status(struct queue *q, bool json, struct buf *out);

#endif
