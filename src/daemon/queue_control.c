/*
 * queue_control -- `sluice queue ...` and the queue's statistics (queue_control.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	return "eligible for delivery now";
}

void queue_control(struct queue *q, size_t argc, const struct str *argv, struct buf *out,
		   bool *ret_ok)
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
		buf_append_cstr(out, "too many arguments: at most 63 IDs at a time (or --all)\n");
		return;
	}
	if (!q) {
		buf_append_cstr(out, "no queue: this sluiced has no intake { } configured\n");
		return;
	}
	char idbuf[64];
	if (nargs == 0 || str_eq_cstr(args[0], "list")) {
		const char *id = nargs > 1 ? arg_id(args[1], idbuf, sizeof(idbuf)) : NULL;
		int r = queue_list(q, id, json, out);
		if (r == -ENOENT)
			buf_printf(out, "%s: %s\n", id, not_found(q));
		else if (r < 0)
			buf_printf(out, "cannot list the queue: %s\n", strerror(-r));
		*ret_ok = r == 0;
		return;
	}
	char verb[16];
	arg_id(args[0], verb, sizeof(verb));
	if (strcmp(verb, "show") == 0) {
		if (nargs != 2) {
			buf_append_cstr(out, "usage: queue show ID [--json]\n");
			return;
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
		return;
	}
	if (strcmp(verb, "hold") != 0 && strcmp(verb, "release") != 0 &&
	    strcmp(verb, "delete") != 0 && strcmp(verb, "flush") != 0) {
		buf_printf(out, "unknown queue command \"%s\": list, show, hold, release, delete, "
			   "flush\n", verb);
		return;
	}
	if (nargs < 2) {
		buf_printf(out, "usage: queue %s ID...|--all\n", verb);
		return;
	}
	bool all = false;
	for (size_t i = 1; i < nargs; i++)
		if (str_eq_cstr(args[i], "--all") || str_eq_cstr(args[i], "all"))
			all = true;
	if (all && nargs != 2) {
		buf_printf(out, "usage: queue %s ID...|--all (not both)\n", verb);
		return;
	}
	char(*ids)[QUEUE_ID_LEN + 1] = NULL;
	size_t n = 0;
	if (all && queue_ids(q, &ids, &n) < 0) {
		buf_append_cstr(out, "out of memory\n");
		return;
	}
	size_t done = 0, failed = 0;
	if (json)
		buf_append_cstr(out, "{\"results\":[");
	size_t count = all ? n : nargs - 1;
	for (size_t i = 0; i < count; i++) {
		const char *id = all ? ids[i] : arg_id(args[i + 1], idbuf, sizeof(idbuf));
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
	else if (all && n == 0)
		buf_append_cstr(out, "the queue is empty\n");
	free(ids);
	*ret_ok = failed == 0;
	if (done)
		log_notice("queue %s: %zu message%s by the operator", verb, done,
			   done == 1 ? "" : "s");
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
				   PRIu64 ",\"bare_eol\":%" PRIu64 "}",
				   is.messages, is.recipients, is.bytes, is.refused, is.rejected,
				   is.bare_eol);
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
			   " transactions; %" PRIu64 " messages with bare CR/LF\n",
			   is.messages, is.recipients, is.bytes, is.refused, is.rejected, is.bare_eol);
}
