/*
 * relay_signal -- the signals' thresholds (`signal { after = N; within = D; }`): what a
 * server's reply means in one lane, where a signal acts on its N-th matching reply
 * within its window (the count is threshold.c's, pure), and the counts for `sluice
 * lanes`.  Runs on the relay's thread.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay_int.h"
#include "util.h"

void signal_once_clear(struct signal_once *o)
{
	free(o->seen);
	o->seen = NULL;
	o->n = 0;
}

static struct threshold *lane_threshold(struct lane *l, const struct classify *cls, size_t i)
{
	uint64_t serial = classify_serial(cls);
	if (l->thr_serial != serial) {
		/* another classifier (a reload, or a connection made before one): a signal
		 * whose pattern, after and within are the same keeps its count, the others
		 * start over */
		size_t n = classify_nsignals(cls);
		struct threshold *nt = calloc(n ? n : 1, sizeof(*nt));
		uint64_t *nk = calloc(n ? n : 1, sizeof(*nk));
		if (!nt || !nk) {
			free(nt);
			free(nk);
			return NULL;
		}
		for (size_t k = 0; k < n; k++) {
			nk[k] = classify_threshold_key(cls, k);
			for (size_t j = 0; j < l->nthr; j++)
				if (l->thr_key[j] == nk[k]) {
					nt[k] = l->thr[j];
					l->thr[j] = (struct threshold){ 0 };
					l->thr_key[j] = 0;
					break;
				}
		}
		for (size_t k = 0; k < l->nthr; k++)
			threshold_clear(&l->thr[k]);
		free(l->thr);
		free(l->thr_key);
		l->thr = nt;
		l->thr_key = nk;
		l->nthr = n;
		l->thr_serial = serial;
	}
	return i < l->nthr ? &l->thr[i] : NULL;
}

void signal_classify(struct lane *l, const struct classify *cls, enum smtp_out_stage stage,
		     int error, const struct smtp_reply *rep, struct signal_once *once,
		     struct classify_result *ret)
{
	classify_reply(cls, stage, error, rep, ret);
	bool *skip = NULL;
	uint64_t now = relay_now(l->r);
	while (ret->index >= 0) {
		unsigned after;
		int64_t within_ms;
		size_t i = (size_t)ret->index;
		classify_threshold(cls, i, &after, &within_ms);
		if (after <= 1)
			break;
		/* one count per signal and transaction: the transaction's other replies that
		 * match it share the first one's outcome */
		unsigned char seen = once && i < once->n ? once->seen[i] : 0;
		bool reached;
		if (seen) {
			reached = seen == 2;
		} else {
			struct threshold *th = lane_threshold(l, cls, i);
			reached = !th || threshold_hit(th, after, (uint64_t)within_ms * 1000000u, now);
			if (once && !once->seen && (once->seen = calloc(classify_nsignals(cls), 1)))
				once->n = classify_nsignals(cls);
			if (once && i < once->n)
				once->seen[i] = reached ? 2 : 1;
			if (!reached)
				base_logf(l->r, LOG_LEVEL_INFO, "lane=%s signal \"%.100s\": %u of %u "
					  "matching replies", l->name, ret->signal,
					  threshold_count(th, (uint64_t)within_ms * 1000000u, now),
					  after);
		}
		if (reached)
			break; /* the after-th: the signal acts (without memory: at once) */
		if (ret->verdict != CLASSIFY_FAIL) {
			/* not yet, and the operator said the reply is not a bounce (law 5): the
			 * recipient waits for its next try, and the lane goes on */
			ret->verdict = CLASSIFY_RETRY;
			ret->index = -1;
			ret->for_ms = rep ? classify_retry_hint(str_make(
				rep->text, rep->text_len < SMTP_REPLY_TEXT_MAX ? rep->text_len
										 : SMTP_REPLY_TEXT_MAX))
					  : -1;
			break;
		}
		if (!skip && !(skip = calloc(classify_nsignals(cls), sizeof(*skip))))
			break;
		/* a fail signal not yet: the reply means what it would without this signal */
		skip[i] = true;
		classify_reply_skip(cls, skip, stage, error, rep, ret);
	}
	free(skip);
}

/* ---- `sluice lanes` ---- */

void signal_view(const struct lane *l, bool json, struct buf *b, uint64_t now)
{
	if (json)
		buf_append_cstr(b, ", \"thresholds\": [");
	bool first = true;
	/* the counts of the route's signals now (kept under their keys over a reload) */
	for (size_t i = 0; l->rt && i < classify_nsignals(l->rt->cls); i++) {
		unsigned after;
		int64_t within_ms;
		classify_threshold(l->rt->cls, i, &after, &within_ms);
		uint64_t key = classify_threshold_key(l->rt->cls, i);
		size_t j = i < l->nthr && l->thr_key[i] == key ? i : 0;
		while (j < l->nthr && l->thr_key[j] != key)
			j++;
		if (after <= 1 || j >= l->nthr || i >= l->rt->conf->nsignals)
			continue;
		unsigned n = threshold_count(&l->thr[j], (uint64_t)within_ms * 1000000u, now);
		if (!n)
			continue;
		const char *match = l->rt->conf->signals[i].match;
		if (json) {
			buf_append_cstr(b, first ? "{\"signal\": " : ", {\"signal\": ");
			buf_append_json_string(b, match);
			buf_printf(b, ", \"count\": %u, \"after\": %u, \"within_ms\": %" PRId64 "}", n,
				   after, within_ms);
		} else {
			char d[32];
			fmt_duration(d, sizeof(d), (uint64_t)within_ms, DURATION_BRIEF);
			buf_printf(b, "  threshold    %u of %u within %s: %.100s\n", n, after, d, match);
		}
		first = false;
	}
	if (json)
		buf_append_cstr(b, "]");
}
