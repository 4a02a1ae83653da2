/*
 * outcome -- the pure decision of what happens to one recipient (outcome.h); the
 * message room's msg_rcpt_settle() carries it out.
 */
#include <stdio.h>
#include <string.h>

#include "outcome.h"
#include "queue_file.h"

bool outcome_too_many_rcpts(const struct smtp_reply *rep)
{
	if (!rep)
		return false;
	bool five_five_three = rep->enh_class && rep->enh_subject == 5 && rep->enh_detail == 3;
	if (rep->code == 452)
		return !rep->enh_class || five_five_three;
	return rep->code == 552 && rep->enh_class == 5 && five_five_three;
}

/* The DSN code of rep, or def.0.0 when it has no enhanced code. */
static void dsn_of(const struct smtp_reply *rep, char def, char *out, size_t len)
{
	if (rep && rep->enh_class)
		snprintf(out, len, "%d.%d.%d", rep->enh_class, rep->enh_subject, rep->enh_detail);
	else
		snprintf(out, len, "%c.0.0", def);
}

static void decide_reply(const struct outcome_in *in, struct outcome *o)
{
	const struct classify_result *cr = in->cr;
	switch (cr->verdict) {
	case CLASSIFY_OK:
		o->status = in->relayed ? QUEUE_RELAYED : QUEUE_DELIVERED;
		o->attempt = in->relayed ? "relayed" : "sent";
		dsn_of(in->rep, '2', o->dsn, sizeof(o->dsn));
		o->word = "sent";
		o->count = OUTCOME_COUNT_DELIVERED;
		break;
	case CLASSIFY_FAIL:
		o->status = QUEUE_FAILED;
		dsn_of(in->rep, '5', o->dsn, sizeof(o->dsn));
		o->attempt = "failed";
		o->attempt_dsn = true;
		o->word = "bounced";
		o->level = LOG_LEVEL_NOTICE;
		o->count = OUTCOME_COUNT_FAILED;
		break;
	case CLASSIFY_RETRY:
		dsn_of(in->rep, '4', o->dsn, sizeof(o->dsn));
		o->attempt = o->word = "deferred";
		if (outcome_too_many_rcpts(in->rep)) {
			/* not the recipient's failure: it goes in the next transaction */
			o->next = OUTCOME_NEXT_NOW;
			o->attempts = -1;
			o->note = "(too many recipients: the next transaction)";
		} else {
			o->next = OUTCOME_NEXT_BACKOFF;
			o->hint_ms = cr->for_ms;
		}
		break;
	case CLASSIFY_SUSPEND:
	case CLASSIFY_SLOW:
		/* the lane's problem, not the recipient's: it stays as it was, due again as
		 * soon as the lane sends, and the attempt does not count for its backoff (law
		 * 5: throttling is not failure) */
		o->next = OUTCOME_NEXT_NOW;
		o->attempts = -1;
		dsn_of(in->rep, '4', o->dsn, sizeof(o->dsn));
		o->word = cr->verdict == CLASSIFY_SUSPEND ? "suspended" : "deferred";
		o->note = "(the lane's throttling: the recipient stays queued)";
		o->lane_signal = true;
		break;
	}
}

void outcome_decide(const struct outcome_in *in, struct outcome *ret)
{
	struct outcome o = { .level = LOG_LEVEL_INFO };
	switch (in->ev) {
	case OUTCOME_REPLY:
		decide_reply(in, &o);
		break;
	case OUTCOME_UNCERTAIN:
		o.status = QUEUE_UNCERTAIN;
		o.next = OUTCOME_NEXT_BACKOFF;
		o.hint_ms = -1;
		o.attempt = o.word = "uncertain";
		snprintf(o.dsn, sizeof(o.dsn), "4.4.2");
		o.level = LOG_LEVEL_WARNING;
		o.note = in->hold ? "(lost after the message was sent: held)"
				  : "(lost after the message was sent: sent again later, possibly twice)";
		o.count = OUTCOME_COUNT_UNCERTAIN;
		break;
	case OUTCOME_NOT_TRIED:
	case OUTCOME_DUE_NOW:
		o.next = OUTCOME_NEXT_NOW;
		break;
	case OUTCOME_DEFER:
		o.attempts = 1; /* no transaction counted it */
		o.next = OUTCOME_NEXT_BACKOFF;
		o.hint_ms = -1;
		snprintf(o.dsn, sizeof(o.dsn), "%s", in->dsn ? in->dsn : "4.0.0");
		o.attempt = o.word = "deferred";
		o.attempt_dsn = true;
		o.note = in->note;
		break;
	case OUTCOME_FAIL:
		o.status = QUEUE_FAILED;
		snprintf(o.dsn, sizeof(o.dsn), "%s", in->dsn ? in->dsn : "5.0.0");
		o.attempt = "failed";
		o.attempt_dsn = true;
		o.word = "bounced";
		o.level = LOG_LEVEL_NOTICE;
		o.count = OUTCOME_COUNT_FAILED;
		break;
	}
	*ret = o;
}
