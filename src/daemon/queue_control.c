/*
 * queue_control -- `sluice queue ...` and the queue's statistics (queue_control.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "control.h"
#include "intake_service.h"
#include "log.h"
#include "queue_control.h"
#include "util.h"

/* A copy of an argument as a C string (IDs are short; longer is no ID). */
static const char *arg_id(struct str a, char *tmp, size_t len)
{
	if (a.len >= len)
		a.len = len - 1;
	memcpy(tmp, a.ptr, a.len);
	tmp[a.len] = '\0';
	return tmp;
}

/* n with a comma every three digits ("1,000,000"). */
static const char *thousands(uint64_t n, char out[32])
{
	char digits[24];
	int len = snprintf(digits, sizeof(digits), "%" PRIu64, n);
	size_t o = 0;
	for (int i = 0; i < len; i++) {
		if (i && (len - i) % 3 == 0)
			out[o++] = ',';
		out[o++] = digits[i];
	}
	out[o] = '\0';
	return out;
}

/* What a command that found no message adds while the queue still loads. */
static const char *not_found(struct queue *q)
{
	struct queue_stats st;
	queue_stats(q, &st);
	return st.loading ? "no such message (the queue is still loading: try again)"
			  : "no such message";
}

static int act(struct queue *q, const char *verb, const char *id)
{
	if (strcmp(verb, "hold") == 0)
		return queue_hold(q, id, true);
	if (strcmp(verb, "release") == 0)
		return queue_hold(q, id, false);
	if (strcmp(verb, "delete") == 0)
		return queue_delete(q, id);
	if (strcmp(verb, "bounce") == 0)
		return queue_bounce(q, id);
	return queue_flush(q, id);
}

static const char *done_text(const char *verb)
{
	if (strcmp(verb, "hold") == 0)
		return "held";
	if (strcmp(verb, "release") == 0)
		return "released";
	if (strcmp(verb, "delete") == 0)
		return "deleted";
	if (strcmp(verb, "bounce") == 0)
		return "returned to the sender";
	return "eligible for delivery now";
}

/* ---- selections: a walk of the index in batches, one part of the reply at a time ---- */

#define PART_BYTES (64 * 1024) /* a listing's part is cut once it holds this much */
#define PART_WALKS 16          /* index batches (QUEUE_WALK_SCAN each) per part at most */
#define LIST_BATCH 64          /* messages copied per batch of a listing */
#define ACT_BATCH 32           /* messages acted on per part */
#define SUMMARY_TOP 25         /* rows of `queue summary` unless top= says */

enum qc_kind {
	QC_LIST = 0,
	QC_ACT,
	QC_SUMMARY,
};

/* A command over a selection, between the parts of its reply. */
struct qc_stream {
	enum qc_kind kind;
	struct queue *q;
	struct queue_select sel;
	char (*ids)[QUEUE_ID_LEN + 1];
	size_t nids;
	bool have_ids;      /* a set of IDs selects (it may be empty) */
	bool explicit_ids;  /* IDs as words: each missing one is named */
	char *sender, *domain;
	char verb[16];
	bool json, nohead, headed, by_sender;
	size_t top;
	struct queue_cursor c;
	struct queue_list_totals tot;
	uint64_t selected, done, failed;
	int first_error;
	struct queue_summary sum;
};

static void qc_free(struct qc_stream *st)
{
	if (!st)
		return;
	free(st->ids);
	free(st->sender);
	free(st->domain);
	queue_summary_clear(&st->sum);
	free(st);
}

static void qc_cancel(struct control_wait *w)
{
	qc_free(w->cmd);
	w->cmd = NULL;
}

static int id_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* Add the IDs of a comma-separated list (or one ID); a word that is no ID is kept too,
 * and is then simply not found. */
static int add_ids(struct qc_stream *st, struct str list)
{
	size_t i = 0;
	while (i <= list.len) {
		size_t j = i;
		while (j < list.len && list.ptr[j] != ',')
			j++;
		if (j > i) {
			char(*v)[QUEUE_ID_LEN + 1] = realloc(st->ids, (st->nids + 1) * sizeof(*v));
			if (!v)
				return -ENOMEM;
			st->ids = v;
			size_t len = j - i < QUEUE_ID_LEN ? j - i : QUEUE_ID_LEN;
			memcpy(v[st->nids], list.ptr + i, len);
			v[st->nids][len] = '\0';
			st->nids++;
		}
		i = j + 1;
	}
	return 0;
}

static bool word_value(struct str w, const char *key, struct str *ret)
{
	size_t kl = strlen(key);
	if (w.len <= kl || memcmp(w.ptr, key, kl) != 0 || w.ptr[kl] != '=')
		return false;
	*ret = str_make(w.ptr + kl + 1, w.len - kl - 1);
	return true;
}

/*
 * The selection words of a request: domain=D sender=S older=DURATION state=STATE
 * ids=ID,ID,... and, for `summary`, by=sender top=N; nohead (the CLI's later batches of
 * IDs read from its input: no header line).  Other words are IDs.  0, or -EINVAL with
 * the reason in out.
 */
static int parse_selection(struct qc_stream *st, size_t nargs, const struct str *args,
			   struct buf *out)
{
	for (size_t i = 0; i < nargs; i++) {
		struct str v;
		char text[256];
		if (word_value(args[i], "domain", &v) || word_value(args[i], "sender", &v)) {
			bool dom = args[i].ptr[0] == 'd';
			char *copy = strndup(v.ptr, v.len);
			if (!copy)
				return -ENOMEM;
			free(dom ? st->domain : st->sender);
			*(dom ? &st->domain : &st->sender) = copy;
			if (dom && !copy[0]) {
				buf_append_cstr(out, "--domain: expected a domain, or .domain for its "
						     "subdomains\n");
				return -EINVAL;
			}
		} else if (word_value(args[i], "older", &v)) {
			char err[200];
			arg_id(v, text, sizeof(text));
			struct cfg_node node = { .kind = CFG_SCALAR, .value = text,
						 .value_len = strlen(text), .file = "argument",
						 .key = "older-than" };
			int64_t ms;
			if (cfg_duration_ms(&node, 1, INT64_C(3650) * 86400 * 1000, &ms, err,
					    sizeof(err)) < 0) {
				buf_printf(out, "--older-than: \"%s\": expected a duration such as 30m, "
					   "2h or 5d\n", text);
				return -EINVAL;
			}
			st->sel.older_us = (uint64_t)ms * 1000;
		} else if (word_value(args[i], "state", &v)) {
			arg_id(v, text, sizeof(text));
			if (queue_select_state_parse(text, &st->sel.state) < 0) {
				buf_printf(out, "--state: \"%s\": expected deferred, todo, held or "
					   "uncertain\n", text);
				return -EINVAL;
			}
		} else if (word_value(args[i], "ids", &v)) {
			if (add_ids(st, v) < 0)
				return -ENOMEM;
			st->have_ids = true; /* an empty list selects nothing */
		} else if (word_value(args[i], "by", &v)) {
			if (!str_eq_cstr(v, "sender") && !str_eq_cstr(v, "recipient")) {
				buf_append_cstr(out, "--by: expected sender or recipient\n");
				return -EINVAL;
			}
			st->by_sender = str_eq_cstr(v, "sender");
		} else if (word_value(args[i], "top", &v)) {
			arg_id(v, text, sizeof(text));
			char *end;
			unsigned long n = strtoul(text, &end, 10);
			if (!text[0] || *end || n == 0 || n > 100000) {
				buf_append_cstr(out, "--top: expected a number of rows\n");
				return -EINVAL;
			}
			st->top = n;
		} else if (str_eq_cstr(args[i], "nohead")) {
			st->nohead = true;
		} else if (memchr(args[i].ptr, '=', args[i].len)) {
			char q[64];
			buf_printf(out, "unknown selection \"%s\": domain=, sender=, older=, state=, "
				   "ids=\n", log_quote(q, sizeof(q), args[i], 40));
			return -EINVAL;
		} else {
			if (add_ids(st, args[i]) < 0)
				return -ENOMEM;
			st->have_ids = true;
			st->explicit_ids = true;
		}
	}
	if (st->have_ids) {
		static const char none[1][QUEUE_ID_LEN + 1];
		qsort(st->ids, st->nids, sizeof(st->ids[0]), id_cmp);
		size_t n = 0;
		for (size_t i = 0; i < st->nids; i++)
			if (n == 0 || strcmp(st->ids[n - 1], st->ids[i]) != 0)
				memmove(st->ids[n++], st->ids[i], sizeof(st->ids[0]));
		st->nids = n;
		st->sel.ids = st->ids ? (const char(*)[QUEUE_ID_LEN + 1])st->ids : none;
		st->sel.nids = n;
	}
	st->sel.sender = st->sender;
	st->sel.domain = st->domain;
	return 0;
}

static uint64_t now_us(void)
{
	return realtime_ns() / 1000;
}

/* The line a listing or a summary starts with while the index is still loading. */
static void loading_line(struct queue *q, struct buf *out)
{
	uint64_t done, total;
	if (queue_loading(q, &done, &total))
		buf_printf(out, "the queue is still loading: %" PRIu64 " of %" PRIu64
			   " messages read, the list is not complete\n", done, total);
}

/* Name each explicit ID that was not found (the reply is then an error). */
static void missing_ids(struct qc_stream *st, struct buf *out)
{
	for (size_t i = 0; i < st->nids; i++)
		if (queue_get_retry(st->q, st->ids[i], 0, NULL, NULL) == -ENOENT)
			buf_printf(out, "%s: %s\n", st->ids[i], not_found(st->q));
}

static int list_step(struct qc_stream *st, struct control_wait *w)
{
	struct buf chunk;
	buf_init(&chunk, CONTROL_BODY_MAX);
	int r = 0;
	for (int k = 0; k < PART_WALKS && !st->c.done && w->out->len < PART_BYTES; k++) {
		uint64_t before = st->tot.messages;
		buf_reset(&chunk);
		r = queue_list_step(st->q, &st->sel, now_us(), st->json, LIST_BATCH, &st->c,
				    &st->tot, &chunk);
		if (r < 0)
			break;
		if (!st->json && !st->headed && !st->nohead && st->tot.messages > before) {
			buf_printf(w->out, "%-17s %10s  %-20s  %s\n", "queue id (! held)", "size",
				   "arrival (UTC)", "sender / recipients: status, next attempt");
			st->headed = true;
		}
		r = buf_append_str(w->out, buf_str(&chunk));
		if (r < 0)
			break;
	}
	buf_done(&chunk);
	if (r < 0) {
		buf_reset(w->out);
		buf_printf(w->out, "cannot list the queue: %s\n", strerror(-r));
		*w->ok = false;
		return 0;
	}
	if (!st->c.done || w->out->len)
		return 1;
	/* the last frame holds only what was listed, in a line the CLI can add up over
	 * batches of IDs */
	*w->ok = true;
	if (st->explicit_ids && st->c.missing) {
		missing_ids(st, w->out);
		*w->ok = false;
	} else if (st->json) {
		/* JSON lines hold messages only: IDs not found make the reply an error */
		if (st->c.missing) {
			buf_printf(w->out, "%" PRIu64 " IDs not in the queue\n", st->c.missing);
			*w->ok = false;
		}
	} else if (!queue_select_any(&st->sel) && st->tot.messages == 0) {
		uint64_t done, total;
		buf_append_cstr(w->out, queue_loading(st->q, &done, &total) ? "none loaded yet\n"
									: "the queue is empty\n");
	} else {
		buf_printf(w->out, "-- %" PRIu64 " messages, %" PRIu64 " recipients, %" PRIu64
			   " bytes", st->tot.messages, st->tot.recipients, st->tot.bytes);
		if (st->c.missing)
			buf_printf(w->out, " (%" PRIu64 " IDs not in the queue)", st->c.missing);
		buf_append_byte(w->out, '\n');
	}
	return 0;
}

static int act_step(struct qc_stream *st, struct control_wait *w)
{
	char ids[ACT_BATCH][QUEUE_ID_LEN + 1];
	size_t n = 0;
	for (int k = 0; k < PART_WALKS && n == 0 && !st->c.done; k++)
		queue_select_ids(st->q, &st->sel, now_us(), ACT_BATCH, &st->c, ids, &n);
	for (size_t i = 0; i < n; i++) {
		int r = act(st->q, st->verb, ids[i]);
		st->selected++;
		if (r == 0) {
			st->done++;
		} else if (r == -ENOENT) {
			st->c.missing++; /* gone since the walk: delivered, say */
		} else {
			st->failed++;
			if (!st->first_error)
				st->first_error = r;
		}
	}
	if (!st->c.done)
		return 1;
	if (st->done)
		log_notice("queue %s: %" PRIu64 " message%s by the operator", st->verb, st->done,
			   st->done == 1 ? "" : "s");
	*w->ok = st->failed == 0 && st->c.missing == 0;
	if (st->json) {
		buf_printf(w->out, "{\"selected\":%" PRIu64 ",\"done\":%" PRIu64 ",\"failed\":%"
			   PRIu64 ",\"missing\":%" PRIu64 "}\n", st->selected, st->done, st->failed,
			   st->c.missing);
		return 0;
	}
	if (!queue_select_any(&st->sel) && st->selected == 0) {
		buf_append_cstr(w->out, "the queue is empty\n");
		return 0;
	}
	buf_printf(w->out, "%" PRIu64 " message%s %s", st->done, st->done == 1 ? "" : "s",
		   done_text(st->verb));
	if (st->failed)
		buf_printf(w->out, "; %" PRIu64 " failed (%s)", st->failed,
			   strerror(-st->first_error));
	if (st->c.missing)
		buf_printf(w->out, "; %" PRIu64 " IDs not in the queue", st->c.missing);
	buf_append_byte(w->out, '\n');
	return 0;
}

static void summary_table(struct qc_stream *st, struct buf *out)
{
	const struct queue_summary_row **rows = NULL;
	size_t n = 0;
	if (queue_summary_top(&st->sum, st->top, &rows, &n) < 0) {
		buf_append_cstr(out, "out of memory\n");
		return;
	}
	const struct queue_summary_row *total = &st->sum.total;
	if (st->json) {
		buf_printf(out, "{\"by\":\"%s\",\"buckets\":[", st->by_sender ? "sender" : "recipient");
		for (unsigned b = 0; b < QUEUE_SUMMARY_BUCKETS; b++)
			buf_printf(out, "%s\"%s\"", b ? "," : "", queue_summary_bucket_name(b));
		buf_append_cstr(out, "],\"domains\":[");
		for (size_t i = 0; i <= n; i++) {
			const struct queue_summary_row *r = i < n ? rows[i] : total;
			if (i == n)
				buf_append_cstr(out, "],\"total\":{");
			else
				buf_printf(out, "%s{\"domain\":", i ? "," : "");
			if (i < n) {
				buf_append_json_string(out, r->key);
				buf_append_byte(out, ',');
			}
			buf_printf(out, "\"total\":%" PRIu64 ",\"counts\":[", r->total);
			for (unsigned b = 0; b < QUEUE_SUMMARY_BUCKETS; b++)
				buf_printf(out, "%s%" PRIu64, b ? "," : "", r->count[b]);
			buf_append_cstr(out, "]}");
		}
		buf_printf(out, ",\"domains_total\":%zu}\n", st->sum.n);
		free(rows);
		return;
	}
	int width = 5;
	for (size_t i = 0; i < n; i++) {
		int len = (int)strlen(rows[i]->key);
		width = len > width ? (len < 40 ? len : 40) : width;
	}
	buf_printf(out, "%*s %7s", width, "", "T");
	for (unsigned b = 0; b < QUEUE_SUMMARY_BUCKETS; b++)
		buf_printf(out, " %6s", queue_summary_bucket_name(b));
	buf_append_byte(out, '\n');
	for (size_t i = 0; i <= n; i++) {
		const struct queue_summary_row *r = i < n ? rows[i] : total;
		char q[64];
		const char *key = i < n ? log_quote(q, sizeof(q), str_cstr(r->key), 40) : "TOTAL";
		buf_printf(out, "%*s %7" PRIu64, width, key, r->total);
		for (unsigned b = 0; b < QUEUE_SUMMARY_BUCKETS; b++)
			buf_printf(out, " %6" PRIu64, r->count[b]);
		buf_append_byte(out, '\n');
	}
	if (st->sum.n > n)
		buf_printf(out, "(%zu more %s domains; --top N shows more)\n", st->sum.n - n,
			   st->by_sender ? "sender" : "recipient");
	free(rows);
}

static int summary_step(struct qc_stream *st, struct control_wait *w)
{
	uint64_t t = now_us();
	for (int k = 0; k < PART_WALKS && !st->c.done; k++)
		queue_summary_step(st->q, &st->sel, t, st->by_sender, &st->c, &st->sum);
	if (!st->c.done)
		return 1;
	if (!st->json)
		loading_line(st->q, w->out);
	summary_table(st, w->out);
	*w->ok = true;
	return 0;
}

static int qc_step(struct control_wait *w)
{
	struct qc_stream *st = w->cmd;
	int r = st->kind == QC_LIST ? list_step(st, w)
		: st->kind == QC_ACT ? act_step(st, w)
				     : summary_step(st, w);
	if (r <= 0) {
		qc_free(st);
		w->cmd = NULL;
	}
	return r;
}

/* Hold, release, ... each of a few IDs given as words, a line of result for each. */
static void act_on_ids(struct queue *q, const char *verb, size_t nargs, const struct str *args,
		       bool json, struct buf *out, bool *ret_ok)
{
	char idbuf[64];
	size_t done = 0, failed = 0;
	if (json)
		buf_append_cstr(out, "{\"results\":[");
	for (size_t i = 0; i < nargs; i++) {
		const char *id = arg_id(args[i], idbuf, sizeof(idbuf));
		int r = act(q, verb, id);
		if (r == 0)
			done++;
		else
			failed++;
		char quoted[80];
		const char *what = r == 0 ? done_text(verb) : r == -ENOENT ? not_found(q)
							       : strerror(-r);
		if (json) {
			buf_printf(out, "%s{\"id\":", i ? "," : "");
			buf_append_json_string(out, id);
			buf_printf(out, ",\"ok\":%s,\"result\":", r == 0 ? "true" : "false");
			buf_append_json_string(out, what);
			buf_append_byte(out, '}');
		} else {
			buf_printf(out, "%s: %s\n", log_quote(quoted, sizeof(quoted), str_cstr(id), 40), what);
		}
	}
	if (json)
		buf_printf(out, "],\"done\":%zu,\"failed\":%zu}\n", done, failed);
	*ret_ok = failed == 0;
	if (done)
		log_notice("queue %s: %zu message%s by the operator", verb, done,
			   done == 1 ? "" : "s");
}

static bool is_selection_word(struct str a)
{
	return memchr(a.ptr, '=', a.len) != NULL || str_eq_cstr(a, "nohead");
}

int queue_control(struct queue *q, size_t argc, const struct str *argv, struct buf *out,
		  bool *ret_ok, struct control_wait *w)
{
	bool json = false;
	size_t nargs = 0;
	struct str args[64];
	for (size_t i = 1; i < argc; i++) {
		if (str_eq_cstr(argv[i], "--json") || str_eq_cstr(argv[i], "json"))
			json = true;
		else if (nargs < 64)
			args[nargs++] = argv[i];
		else
			nargs = 65;
	}
	*ret_ok = false;
	if (nargs > 64) {
		buf_append_cstr(out, "too many arguments: at most 63 IDs at a time (or a "
				     "selection, or IDs on the input with -)\n");
		return 0;
	}
	if (!q) {
		buf_append_cstr(out, "no queue: this sluiced has no intake { } configured\n");
		return 0;
	}
	char idbuf[64];
	char verb[16] = "list";
	size_t first = 0;
	if (nargs && !is_selection_word(args[0]) && !queue_id_valid(args[0])) {
		arg_id(args[0], verb, sizeof(verb));
		first = 1;
	}
	if (strcmp(verb, "show") == 0) {
		if (nargs != 2) {
			buf_append_cstr(out, "usage: queue show ID [--json]\n");
			return 0;
		}
		const char *id = arg_id(args[1], idbuf, sizeof(idbuf));
		int r = queue_show(q, id, json, out);
		if (r == -ENOENT)
			buf_printf(out, "%s: no such message\n", id);
		else if (r == -EINVAL)
			buf_printf(out, "%s: the queue file is damaged (it goes to corrupt/ at the "
				   "next start)\n", id);
		else if (r < 0)
			buf_printf(out, "%s: %s\n", id, strerror(-r));
		*ret_ok = r == 0;
		return 0;
	}
	enum qc_kind kind = QC_ACT;
	if (strcmp(verb, "list") == 0)
		kind = QC_LIST;
	else if (strcmp(verb, "summary") == 0)
		kind = QC_SUMMARY;
	else if (strcmp(verb, "hold") != 0 && strcmp(verb, "release") != 0 &&
		 strcmp(verb, "delete") != 0 && strcmp(verb, "flush") != 0 &&
		 strcmp(verb, "bounce") != 0) {
		buf_printf(out, "unknown queue command \"%s\": list, show, summary, hold, release, "
			   "delete, flush, bounce\n", verb);
		return 0;
	}
	bool all = false, words = false, selectors = false;
	for (size_t i = first; i < nargs; i++) {
		if (str_eq_cstr(args[i], "--all") || str_eq_cstr(args[i], "all"))
			all = true;
		else if (is_selection_word(args[i]))
			selectors = true;
		else
			words = true;
	}
	if (kind == QC_ACT && !all && !words && !selectors) {
		buf_printf(out, "usage: queue %s ID...|--all|SELECTION\n", verb);
		return 0;
	}
	if (all && (words || selectors)) {
		buf_printf(out, "usage: queue %s ID...|--all|SELECTION (--all alone)\n", verb);
		return 0;
	}
	if (kind == QC_ACT && words && !selectors) {
		act_on_ids(q, verb, nargs - first, args + first, json, out, ret_ok);
		return 0;
	}
	if (kind == QC_SUMMARY && words) {
		buf_append_cstr(out, "usage: queue summary [SELECTION] [by=sender] [top=N]\n");
		return 0;
	}
	struct qc_stream *st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->kind = kind;
	st->q = q;
	st->json = json;
	st->top = SUMMARY_TOP;
	queue_summary_init(&st->sum);
	snprintf(st->verb, sizeof(st->verb), "%s", verb);
	int r = all ? 0 : parse_selection(st, nargs - first, args + first, out);
	if (r < 0) {
		qc_free(st);
		return r == -EINVAL ? 0 : r;
	}
	if (kind == QC_LIST && !json && !st->nohead)
		loading_line(q, out);
	w->cmd = st;
	w->step = qc_step;
	w->cancel = qc_cancel;
	return 2;
}

void queue_control_status(struct queue *q, bool json, struct buf *out)
{
	if (!q)
		return;
	struct queue_stats st;
	queue_stats(q, &st);
	if (json) {
		buf_printf(out, ",\"queue\":{\"messages\":%" PRIu64 ",\"recipients\":%" PRIu64
			   ",\"held\":%" PRIu64 ",\"loading\":%s,\"load_total\":%" PRIu64
			   ",\"load_done\":%" PRIu64 ",\"load_ms\":%" PRIu64 "}",
			   st.messages, st.recipients, st.held, st.loading ? "true" : "false",
			   st.load_total, st.load_done, st.load_ms);
		return;
	}
	char a[32], b[32], c[32];
	if (st.loading && !st.load_total)
		buf_printf(out, "queue: loading, listing the messages (%.1f s)\n",
			   (double)st.load_ms / 1000.0);
	else if (st.loading)
		buf_printf(out, "queue: loading %s of %s messages (%.1f s)\n",
			   thousands(st.load_done, a), thousands(st.load_total, b),
			   (double)st.load_ms / 1000.0);
	else
		buf_printf(out, "queue: %s messages, %s held, %s recipients to do (loaded in "
			   "%.1f s)\n", thousands(st.messages, a), thousands(st.held, b),
			   thousands(st.recipients, c), (double)st.load_ms / 1000.0);
}

void queue_control_stats(struct queue *q, struct service *intake, bool json, struct buf *out)
{
	if (!q)
		return;
	struct queue_stats st;
	queue_stats(q, &st);
	double per = st.commits ? (double)(st.syncs + st.dir_syncs) / (double)st.commits : 0;
	double age = st.oldest_us ? (double)(realtime_ns() / 1000 - st.oldest_us) / 1e6 : 0;
	struct intake_stats is = { 0 };
	if (intake)
		intake_service_stats(intake, &is);
	if (json) {
		buf_printf(out, ",\"queue\":{\"messages\":%" PRIu64 ",\"recipients\":%" PRIu64
			   ",\"held\":%" PRIu64 ",\"oldest_age\":%.0f,\"commits\":%" PRIu64
			   ",\"batches\":%" PRIu64 ",\"syncs\":%" PRIu64 ",\"dir_syncs\":%" PRIu64
			   ",\"flushes_per_message\":%.3f,\"commit_errors\":%" PRIu64 "}",
			   st.messages, st.recipients, st.held, age, st.commits, st.batches, st.syncs,
			   st.dir_syncs, per, st.commit_errors);
		if (intake)
			buf_printf(out, ",\"intake_mail\":{\"messages\":%" PRIu64 ",\"recipients\":%" PRIu64
				   ",\"bytes\":%" PRIu64 ",\"refused\":%" PRIu64 ",\"rejected\":%"
				   PRIu64 ",\"bare_eol\":%" PRIu64 ",\"bare_command\":%" PRIu64 "}",
				   is.messages, is.recipients, is.bytes, is.refused, is.rejected,
				   is.bare_eol, is.bare_command);
		return;
	}
	buf_printf(out, "queue: %" PRIu64 " messages (%" PRIu64 " held), %" PRIu64
		   " recipients to do, oldest %.0f s\n"
		   "  commits %" PRIu64 " in %" PRIu64 " batches, failed %" PRIu64 "; flushes %"
		   PRIu64 " syncfs + %" PRIu64 " directory\n  = %.3f per message\n",
		   st.messages, st.held, st.recipients, age, st.commits, st.batches,
		   st.commit_errors, st.syncs, st.dir_syncs, per);
	if (st.loading)
		buf_printf(out, "  loading: %" PRIu64 " of %" PRIu64 " messages read\n",
			   st.load_done, st.load_total);
	if (intake)
		buf_printf(out, "intake: %" PRIu64 " messages, %" PRIu64 " recipients, %" PRIu64
			   " bytes;\n  refused %" PRIu64 " clients, rejected %" PRIu64
			   " transactions; %" PRIu64 " messages with bare CR/LF\n"
			   "  %" PRIu64 " commands refused for a bare CR/LF\n",
			   is.messages, is.recipients, is.bytes, is.refused, is.rejected, is.bare_eol,
			   is.bare_command);
}
