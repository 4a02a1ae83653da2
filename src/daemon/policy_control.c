/*
 * policy_control -- limits and test commands (see policy_control.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "log.h"
#include "policy_control.h"
#include "util.h"

#define TEST_MAX_RCPTS 32
#define TEST_MAX_HEADERS 32

/* "2026-11-27T10:00:00Z", or "unset" for 0. */
static const char *fmt_until(uint64_t until_ns, char *buf, size_t len)
{
	if (until_ns == 0) {
		fmt_fixed(buf, len, "unset");
		return buf;
	}
	time_t t = (time_t)(until_ns / 1000000000ULL);
	struct tm tm;
	if (!gmtime_r(&t, &tm) || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		fmt_fixed(buf, len, "%llu", (unsigned long long)(until_ns / 1000000000ULL));
	return buf;
}

static void format_windows(const struct rate_limits *l, const uint64_t *used, struct buf *out)
{
	for (unsigned i = 0; i < l->n; i++) {
		char w[48];
		rate_window_format(&l->w[i], w, sizeof(w));
		buf_printf(out, "%s%s used %llu/%llu", i ? ", " : "", w,
			   (unsigned long long)used[i], (unsigned long long)l->w[i].burst);
	}
}

void policy_control_stats(struct policy *p, struct store *s, bool json, struct buf *out)
{
	struct class_stats cs[64];
	size_t n = policy_class_stats(p, cs, ARRAY_SIZE(cs));
	struct store_stats ss;
	s->ops->stats(s->ctx, &ss);
	if (json) {
		buf_append_cstr(out, "\"classes\":[");
		for (size_t i = 0; i < n; i++) {
			buf_append_cstr(out, i ? ",{\"name\":" : "{\"name\":");
			buf_append_json_string(out, cs[i].name);
			buf_printf(out, ",\"used\":%u,\"peak\":%u,\"inbound\":%u,\"sessions\":%u,"
				   "\"entered\":%llu,\"refused\":%llu}", cs[i].used, cs[i].peak,
				   cs[i].inbound, cs[i].sessions, (unsigned long long)cs[i].entered,
				   (unsigned long long)cs[i].refused);
		}
		buf_printf(out, "],\"store\":{\"type\":\"%s\",\"keys\":%llu,\"max_keys\":%llu,"
			   "\"bytes\":%llu,\"evicted\":%llu,\"expired\":%llu,\"decisions\":%llu,"
			   "\"errors\":%llu", s->type, (unsigned long long)ss.keys,
			   (unsigned long long)ss.max_keys, (unsigned long long)ss.bytes,
			   (unsigned long long)ss.evicted, (unsigned long long)ss.expired,
			   (unsigned long long)ss.decisions, (unsigned long long)ss.errors);
		if (ss.shared) {
			buf_printf(out, ",\"shared\":{\"up\":%s,\"state\":", ss.up ? "true" : "false");
			buf_append_json_string(out, ss.state);
			buf_printf(out, ",\"fallbacks\":%llu,\"timeouts\":%llu,\"reconnects\":%llu,"
				   "\"redirects\":%llu,\"calls\":%llu}",
				   (unsigned long long)ss.fallbacks, (unsigned long long)ss.timeouts,
				   (unsigned long long)ss.reconnects, (unsigned long long)ss.redirects,
				   (unsigned long long)ss.calls);
		}
		buf_append_byte(out, '}');
		return;
	}
	for (size_t i = 0; i < n; i++)
		buf_printf(out, "class %s: %u sessions (peak %u), inbound limit %u, sessions limit "
			   "%u, entered %llu, refused %llu\n", cs[i].name, cs[i].used, cs[i].peak,
			   cs[i].inbound, cs[i].sessions, (unsigned long long)cs[i].entered,
			   (unsigned long long)cs[i].refused);
	if (ss.shared) {
		buf_printf(out, "store %s: %s; %llu decisions in %llu script calls, %llu answered "
			   "by on_failure, %llu timeouts, %llu reconnections, %llu redirections, "
			   "%llu errors; local share: %llu keys\n",
			   s->type, ss.state, (unsigned long long)ss.decisions,
			   (unsigned long long)ss.calls, (unsigned long long)ss.fallbacks,
			   (unsigned long long)ss.timeouts, (unsigned long long)ss.reconnects,
			   (unsigned long long)ss.redirects, (unsigned long long)ss.errors,
			   (unsigned long long)ss.keys);
		return;
	}
	buf_printf(out, "store %s: %llu keys of %llu, %.1f MiB, %llu decisions,\n  %llu evicted, "
		   "%llu expired, %llu errors\n", s->type, (unsigned long long)ss.keys,
		   (unsigned long long)ss.max_keys, (double)ss.bytes / 1048576.0,
		   (unsigned long long)ss.decisions, (unsigned long long)ss.evicted,
		   (unsigned long long)ss.expired, (unsigned long long)ss.errors);
}

/* ---- decisions ---- */

void policy_control_decisions(struct policy *p, bool json, struct buf *out)
{
	size_t max = policy_rule_count(p);
	struct policy_rule_counters *rc = calloc(max ? max : 1, sizeof(*rc));
	if (!rc) {
		buf_append_cstr(out, "out of memory\n");
		return;
	}
	size_t n = policy_counters(p, rc, max);
	if (json) {
		buf_append_cstr(out, "{\"rules\":[");
		for (size_t i = 0; i < n; i++) {
			buf_append_cstr(out, i ? ",{\"rule\":" : "{\"rule\":");
			buf_append_json_string(out, rc[i].name);
			buf_printf(out, ",\"stage\":\"%s\",\"action\":\"%s\",\"passed\":%llu,"
				   "\"over\":%llu}", policy_stage_name(rc[i].stage),
				   policy_action_name(rc[i].action), (unsigned long long)rc[i].passed,
				   (unsigned long long)rc[i].over);
		}
		buf_append_cstr(out, "]}\n");
		free(rc);
		return;
	}
	if (n == 0)
		buf_append_cstr(out, "no limit rules\n");
	else
		buf_printf(out, "%-24s %-8s %-10s %12s %12s\n", "rule", "stage", "action",
			   "passed", "over");
	for (size_t i = 0; i < n; i++)
		buf_printf(out, "%-24s %-8s %-10s %12llu %12llu\n", rc[i].name,
			   policy_stage_name(rc[i].stage), policy_action_name(rc[i].action),
			   (unsigned long long)rc[i].passed, (unsigned long long)rc[i].over);
	free(rc);
}

static void top_key_line(struct buf *out, const struct store_top_entry *e)
{
	char key[sizeof(e->key)];
	size_t i = 0;
	for (; e->key[i] && i + 1 < sizeof(key); i++)
		key[i] = (unsigned char)e->key[i] < ' ' || e->key[i] == 0x7f ? '?' : e->key[i];
	key[i] = '\0';
	buf_printf(out, "key %5.1f%%  %-16.16s %-28.28s ", e->fill_ppm / 1e4, e->rule, key);
	for (unsigned w = 0; w < e->limits.n; w++) {
		char t[48];
		rate_window_format(&e->limits.w[w], t, sizeof(t));
		buf_printf(out, "%s%llu/%s", w ? " " : "", (unsigned long long)e->used[w], t);
	}
	buf_append_byte(out, '\n');
}

void policy_control_top(struct policy *p, size_t max_keys, struct buf *out)
{
	size_t max = policy_rule_count(p);
	struct policy_rule_counters *rc = calloc(max ? max : 1, sizeof(*rc));
	if (!rc)
		return;
	size_t n = policy_counters(p, rc, max);
	/* names and words without spaces: the rule names are checked at load */
	for (size_t i = 0; i < n; i++)
		buf_printf(out, "rule %s %s %s %llu %llu\n", rc[i].name,
			   policy_stage_name(rc[i].stage), policy_action_name(rc[i].action),
			   (unsigned long long)rc[i].passed, (unsigned long long)rc[i].over);
	free(rc);
	struct store *s = policy_store(p);
	if (store_is_shared(s)) {
		buf_append_cstr(out, "keys-shared\n");
		return;
	}
	struct store_top_entry *e = calloc(max_keys ? max_keys : 1, sizeof(*e));
	if (!e)
		return;
	size_t k = s->ops->top(s->ctx, e, max_keys, realtime_ns());
	for (size_t i = 0; i < k; i++)
		top_key_line(out, &e[i]);
	free(e);
}

/* ---- limits ---- */

static int limits_top(struct policy *p, const char *rule, bool json, struct buf *out)
{
	struct store *s = policy_store(p);
	size_t max = 4096;
	struct store_top_entry *e = calloc(max, sizeof(*e));
	if (!e)
		return -ENOMEM;
	size_t n = s->ops->top(s->ctx, e, max, realtime_ns());
	size_t shown = 0;
	if (json)
		buf_append_byte(out, '[');
	for (size_t i = 0; i < n && shown < 50; i++) {
		if (rule && strcmp(rule, e[i].rule) != 0)
			continue;
		if (json) {
			buf_append_cstr(out, shown ? ",{\"rule\":" : "{\"rule\":");
			buf_append_json_string(out, e[i].rule);
			buf_append_cstr(out, ",\"key\":");
			buf_append_json_string(out, e[i].key);
			buf_printf(out, ",\"fill\":%.4f,\"windows\":[", e[i].fill_ppm / 1e6);
			for (unsigned w = 0; w < e[i].limits.n; w++) {
				char t[48];
				rate_window_format(&e[i].limits.w[w], t, sizeof(t));
				buf_printf(out, "%s{\"window\":\"%s\",\"used\":%llu,\"burst\":%llu}",
					   w ? "," : "", t, (unsigned long long)e[i].used[w],
					   (unsigned long long)e[i].limits.w[w].burst);
			}
			buf_append_cstr(out, "]}");
		} else {
			buf_printf(out, "%5.1f%%  %-20s  %s  (", e[i].fill_ppm / 1e4, e[i].rule,
				   e[i].key);
			format_windows(&e[i].limits, e[i].used, out);
			buf_append_cstr(out, ")\n");
		}
		shown++;
	}
	if (json)
		buf_append_cstr(out, "]\n");
	else if (shown == 0)
		buf_append_cstr(out, "no key is above half of its limit\n");
	free(e);
	return 0;
}

/* One rule's part of `limits show|reset`, answered by the store now or later. */
struct show_slot {
	struct show_job *job;
	const struct policy_rule *rule;
	char key[RATE_MAX_OVERRIDE_KEY + 1];
	struct str k;
	bool overridden, unlimited, skip;
	bool runtime;           /* a run-time limit (sluice limits set) gave lim */
	uint64_t until;
	bool sessions;          /* a sessions rule: held is the count, nothing is asked */
	unsigned held;
	struct rate_limits lim;
	struct store_item it;
	struct store_call call;
	int rc;
	bool pending;
};

struct show_job {
	struct policy *p;
	bool reset;
	size_t n, waiting;
	struct control_wait *w;
	struct show_slot slots[];
};

static void show_format(struct show_job *job, struct buf *out)
{
	for (size_t i = 0; i < job->n; i++) {
		struct show_slot *sl = &job->slots[i];
		const char *name = policy_rule_name(sl->rule);
		if (sl->skip)
			continue;
		char rt[80] = "";
		if (sl->runtime) {
			char until[40];
			fmt_fixed(rt, sizeof(rt), " (run-time limit, until %s)",
				  fmt_until(sl->until, until, sizeof(until)));
		}
		if (sl->unlimited) {
			buf_printf(out, "%s %.*s: unlimited %s\n", name, (int)sl->k.len, sl->k.ptr,
				   sl->runtime ? rt + 1 : "(overrides file)");
			continue;
		}
		if (sl->sessions) {
			buf_printf(out, "%s %.*s: %u of %u sessions at once (this node's milter "
				   "sessions)%s\n", name, (int)sl->k.len, sl->k.ptr, sl->held,
				   policy_rule_max_sessions(sl->rule),
				   job->reset ? "; live sessions are not reset" : "");
			continue;
		}
		if (sl->rc < 0) {
			buf_printf(out, "%s: store error (%s)\n", name, strerror(-sl->rc));
			continue;
		}
		if (job->reset) {
			buf_printf(out, "%s %.*s: %s\n", name, (int)sl->k.len, sl->k.ptr,
				   sl->rc > 0 ? "reset" : "nothing to reset");
			continue;
		}
		buf_printf(out, "%s %.*s%s: ", name, (int)sl->k.len, sl->k.ptr,
			   sl->runtime ? rt : sl->overridden ? " (override)" : "");
		format_windows(&sl->lim, sl->it.used, out);
		unsigned long long retry_s = sl->it.retry_ns / 1000000000ULL +
					     (sl->it.retry_ns % 1000000000ULL != 0);
		if (sl->it.blocked)
			buf_printf(out, "; BLOCKED (block = %llus), ends in %llus",
				   (unsigned long long)(policy_rule_block_ns(sl->rule) / 1000000000ULL),
				   retry_s);
		else if (!sl->it.ok)
			buf_printf(out, "; full, room again in %llus", retry_s);
		buf_append_byte(out, '\n');
	}
}

static void show_job_free(struct show_job *job)
{
	policy_unref(job->p);
	free(job);
}

static void show_done(struct store_call *c, int rc)
{
	struct show_slot *sl = c->arg;
	struct show_job *job = sl->job;
	sl->rc = rc;
	sl->pending = false;
	if (--job->waiting)
		return;
	struct control_wait *w = job->w;
	show_format(job, w->out);
	*w->ok = true;
	w->cancel = NULL;
	show_job_free(job);
	w->done(w);
}

static void show_cancel(struct control_wait *w)
{
	struct show_job *job = w->cmd;
	struct store *s = policy_store(job->p);
	for (size_t i = 0; i < job->n; i++)
		if (job->slots[i].pending)
			store_call_cancel(s, &job->slots[i].call);
	show_job_free(job);
}

static int limits_show_reset(struct policy *p, struct str key, const char *rule, bool reset,
			     struct buf *out, bool *ret_ok, struct control_wait *w)
{
	struct store *s = policy_store(p);
	size_t nrules = 0;
	while (policy_rule_at(p, nrules))
		nrules++;
	struct show_job *job = calloc(1, sizeof(*job) + (nrules + 1) * sizeof(job->slots[0]));
	if (!job)
		return -ENOMEM;
	job->p = policy_ref(p);
	job->reset = reset;
	job->w = w;
	size_t found = 0;
	uint64_t now = realtime_ns();
	for (size_t i = 0; i < nrules; i++) {
		const struct policy_rule *r = policy_rule_at(p, i);
		if (rule && strcmp(rule, policy_rule_name(r)) != 0)
			continue;
		found++;
		struct show_slot *sl = &job->slots[job->n];
		sl->job = job;
		sl->rule = r;
		int len = policy_rule_normalize_key(r, key, sl->key);
		if (len < 0) {
			if (rule)
				buf_printf(out, "%s: not a key of this rule (%s)\n",
					   policy_rule_name(r), policy_rule_key_spec(r));
			continue;
		}
		job->n++;
		sl->k = str_make(sl->key, (size_t)len);
		if (policy_rule_count_kind(r) == POLICY_COUNT_SESSIONS) {
			sl->sessions = true;
			sl->held = policy_rule_sessions_held(p, r, sl->k);
			continue;
		}
		/* the same precedence as a decision: run-time, overrides file, the rule */
		if (store_ov_find(s->ov, policy_rule_key_hash(p, r, sl->k), now, &sl->lim,
				  &sl->until) == 1) {
			sl->runtime = true;
			sl->unlimited = sl->lim.n == 0;
		} else if (!policy_rule_limits(r, sl->k, &sl->lim, &sl->overridden)) {
			sl->unlimited = true;
		}
		if (sl->unlimited)
			continue;
		sl->it = (struct store_item){ .key_hash = policy_rule_key_hash(p, r, sl->k),
					      .rule = str_cstr(policy_rule_name(r)), .key = sl->k,
					      .limits = &sl->lim, .cost = 0,
					      .block_ns = policy_rule_block_ns(r) };
		sl->call = (struct store_call){ .items = &sl->it, .n = 1,
						.mode = reset ? STORE_RESET : STORE_PEEK,
						.now = now, .done = show_done, .arg = sl };
		sl->rc = store_decide_start(s, &sl->call);
		if (sl->rc == STORE_PENDING) {
			sl->pending = true;
			job->waiting++;
		}
	}
	if (rule && !found) {
		buf_printf(out, "no rule named \"%s\"\n", rule);
		*ret_ok = false;
		show_job_free(job);
		return 0;
	}
	if (!found)
		buf_append_cstr(out, "no limit rules are configured\n");
	if (job->waiting) {
		w->cmd = job;
		w->cancel = show_cancel;
		return 1;
	}
	show_format(job, out);
	*ret_ok = true;
	show_job_free(job);
	return 0;
}

/* ---- run-time limits: limits set|unset|overrides ---- */

static void format_limits(const struct rate_limits *l, struct buf *out)
{
	if (l->n == 0) {
		buf_append_cstr(out, "unlimited");
		return;
	}
	for (unsigned i = 0; i < l->n; i++) {
		char t[64];
		buf_printf(out, "%s%s", i ? ", " : "", rate_window_format(&l->w[i], t, sizeof(t)));
	}
}

/* "RULE KEY: 100/1m, 5000/1d until 2026-11-27T10:00:00Z (run-time)" */
static void runtime_line(struct buf *out, struct str rule, struct str key,
			 const struct rate_limits *l, uint64_t until_ns)
{
	char until[40];
	buf_printf(out, "%.*s %.*s: ", (int)rule.len, rule.ptr, (int)key.len, key.ptr);
	format_limits(l, out);
	if (until_ns)
		buf_printf(out, " until %s (run-time)\n", fmt_until(until_ns, until, sizeof(until)));
	else
		buf_append_cstr(out, " (run-time, until unset)\n");
}

/* One set or unset, answered now (memory store) or by the store's sync thread (Redis). */
struct ov_job {
	struct store_ov_call call;
	struct policy *p;
	struct control_wait *w;  /* read on the worker only (the session may be gone) */
	struct worker *worker;   /* the session's, where ov_back() runs */
	int rc;
	bool cancelled;          /* the session went away: the answer is dropped */
	bool no_rule;            /* unset of a rule not configured (any more) */
	char rule[STORE_OV_RULE + 1];
	char key[RATE_MAX_OVERRIDE_KEY + 1];
};

static void ov_job_free(struct ov_job *job)
{
	policy_unref(job->p);
	free(job);
}

static void ov_format(struct ov_job *job, struct buf *out, bool *ret_ok)
{
	struct store_ov_call *c = &job->call;
	*ret_ok = job->rc >= 0;
	if (job->rc == -E2BIG) {
		buf_printf(out, "limits set: the table of run-time limits is full (%u entries): "
			   "unset some first\n", STORE_OV_MAX);
		return;
	}
	if (job->rc < 0) {
		buf_printf(out, "limits %s %s %s: %s%s%s\n", c->unset ? "unset" : "set", job->rule,
			   job->key, c->err[0] ? c->err : strerror(-job->rc),
			   job->rc == -EAGAIN && !c->err[0] ? " (Redis unreachable)" : "",
			   job->rc == -ETIMEDOUT ? "" : "; nothing changed");
		return;
	}
	if (c->unset && job->no_rule && job->rc == 0) {
		buf_printf(out, "no rule named \"%s\" (and no run-time limit left of one)\n",
			   job->rule);
		*ret_ok = false;
		return;
	}
	if (c->unset) {
		buf_printf(out, "%s %s: %s\n", job->rule, job->key,
			   job->rc > 0 ? "run-time limit removed" : "had no run-time limit");
		return;
	}
	runtime_line(out, c->e.rule, c->e.key, &c->e.limits, c->e.until_ns);
}

/* On the session's worker, after the sync thread answered. */
static void ov_back(void *arg)
{
	struct ov_job *job = arg;
	if (job->cancelled) {
		ov_job_free(job);
		return;
	}
	struct control_wait *w = job->w;
	ov_format(job, w->out, w->ok);
	w->cancel = NULL;
	ov_job_free(job);
	w->done(w);
}

/* On the store's sync thread. */
static void ov_done(struct store_ov_call *c, int rc)
{
	struct ov_job *job = c->arg;
	job->rc = rc;
	/* XXX: if this allocation fails (or the workers are already stopped) the session
	 * waits for its timeout and the job leaks; the change itself is settled either way */
	if (worker_call(job->worker, ov_back, job) < 0)
		return;
}

static void ov_cancel(struct control_wait *w)
{
	/* the sync thread still holds the job: ov_back() frees it */
	struct ov_job *job = w->cmd;
	job->cancelled = true;
}

/* RATE words into *ret: "10/1m" "5/30s:10" (or "10/1m,500/1d"), or "0" alone. */
static int parse_rates(size_t argc, const struct str *argv, struct rate_limits *ret,
		       struct buf *out)
{
	struct rate_limits l = { 0 };
	bool zero = false;
	size_t ntok = 0;
	for (size_t i = 0; i < argc; i++) {
		struct str a = argv[i];
		size_t pos = 0;
		while (pos <= a.len) {
			size_t end = pos;
			while (end < a.len && a.ptr[end] != ',')
				end++;
			struct str tok = str_make(a.ptr + pos, end - pos);
			pos = end + 1;
			if (tok.len == 0)
				continue;
			ntok++;
			if (str_eq_cstr(tok, "0")) {
				zero = true;
				continue;
			}
			if (l.n == RATE_MAX_WINDOWS) {
				buf_printf(out, "limits set: at most %d windows\n", RATE_MAX_WINDOWS);
				return -EINVAL;
			}
			char err[200];
			if (rate_window_parse(tok, &l.w[l.n], err, sizeof(err)) < 0) {
				buf_printf(out, "limits set: bad rate \"%.*s\": %s\n", (int)tok.len,
					   tok.ptr, err);
				return -EINVAL;
			}
			for (unsigned k = 0; k < l.n; k++)
				if (l.w[k].period_ns == l.w[l.n].period_ns) {
					buf_printf(out, "limits set: two windows of the same period "
						   "(\"%.*s\")\n", (int)tok.len, tok.ptr);
					return -EINVAL;
				}
			l.n++;
		}
	}
	if (ntok == 0) {
		buf_append_cstr(out, "limits set: no rate given (e.g. 100/1m, or 0 for unlimited)\n");
		return -EINVAL;
	}
	if (zero && ntok > 1) {
		buf_append_cstr(out, "limits set: 0 (unlimited) stands alone\n");
		return -EINVAL;
	}
	*ret = l;
	return 0;
}

static void str_copy(char *dst, size_t len, struct str s)
{
	size_t n = s.len < len - 1 ? s.len : len - 1;
	memcpy(dst, s.ptr, n);
	dst[n] = '\0';
}

/* limits set RULE KEY RATE... [--for D] | limits unset RULE KEY */
static int limits_set_unset(struct policy *p, bool unset, size_t argc, const struct str *argv,
			    struct buf *out, bool *ret_ok, struct control_wait *w)
{
	*ret_ok = false;
	const char *verb = unset ? "unset" : "set";
	int64_t for_ms = 0;
	size_t nargs = 0;
	struct str args[16];
	for (size_t i = 0; i < argc; i++) {
		if (str_eq_cstr(argv[i], "--json"))
			continue; /* the client adds it to any request; the answer is one line */
		if (str_eq_cstr(argv[i], "--for")) {
			if (unset || i + 1 >= argc) {
				buf_printf(out, "limits %s: --for %s\n", verb,
					   unset ? "is for set only" : "needs a duration (e.g. 1h)");
				return 0;
			}
			char text[64], err[200];
			str_copy(text, sizeof(text), argv[++i]);
			struct cfg_node node = { .kind = CFG_SCALAR, .value = text,
						 .value_len = strlen(text), .file = "argument",
						 .key = "for" };
			if (cfg_duration_ms(&node, 1000, INT64_C(366) * 86400 * 1000, &for_ms, err,
					    sizeof(err)) < 0) {
				buf_printf(out, "limits set: --for \"%s\": expected a duration from 1s "
					   "to 366d, such as 30m\n", text);
				return 0;
			}
			continue;
		}
		if (nargs == ARRAY_SIZE(args)) {
			buf_printf(out, "limits %s: too many arguments\n", verb);
			return 0;
		}
		args[nargs++] = argv[i];
	}
	if (unset ? nargs != 2 : nargs < 3) {
		buf_printf(out, "usage: limits %s\n", unset ? "unset RULE KEY" :
			   "set RULE KEY RATE... [--for DURATION]");
		return 0;
	}
	char rule[STORE_OV_RULE + 1];
	if (args[0].len > STORE_OV_RULE) {
		buf_printf(out, "no rule named \"%.*s\"\n", (int)(args[0].len > 100 ? 100 : args[0].len),
			   args[0].ptr);
		return 0;
	}
	str_copy(rule, sizeof(rule), args[0]);
	const struct policy_rule *r = policy_rule_find(p, rule);
	/* unset of a rule no longer configured (renamed or removed at a reload): its
	 * run-time limits stay listed until unset, with the key as it was written */
	if (!r && !(unset && args[1].len && args[1].len <= RATE_MAX_OVERRIDE_KEY)) {
		buf_printf(out, "no rule named \"%s\"\n", rule);
		return 0;
	}
	if (!unset && policy_rule_count_kind(r) == POLICY_COUNT_SESSIONS) {
		buf_printf(out, "limits set: %s is a sessions rule (count = \"sessions\"): it counts "
			   "sessions at once, not rates, so it has no run-time limits\n", rule);
		return 0;
	}
	struct ov_job *job = calloc(1, sizeof(*job));
	if (!job)
		return -ENOMEM;
	int len = r ? policy_rule_normalize_key(r, args[1], job->key) : (int)args[1].len;
	if (!r)
		memcpy(job->key, args[1].ptr, args[1].len);
	if (len <= 0) {
		buf_printf(out, "%s: not a key of this rule (%s)\n", rule, policy_rule_key_spec(r));
		free(job);
		return 0;
	}
	struct store_ov_call *c = &job->call;
	if (!unset && parse_rates(nargs - 2, args + 2, &c->e.limits, out) < 0) {
		free(job);
		return 0;
	}
	memcpy(job->rule, rule, strlen(rule) + 1);
	job->p = policy_ref(p);
	job->w = w;
	job->worker = w ? w->worker : NULL;
	job->no_rule = !r;
	c->unset = unset;
	c->e.rule = str_cstr(job->rule);
	c->e.key = str_make(job->key, (size_t)len);
	c->e.key_hash = store_key_hash(policy_store(p), c->e.rule, c->e.key);
	c->e.until_ns = for_ms ? realtime_ns() + (uint64_t)for_ms * 1000000ULL : 0;
	c->done = ov_done;
	c->arg = job;
	struct store *s = policy_store(p);
	if (s->ops->ov_change && !job->worker) {
		buf_printf(out, "limits %s: cannot wait for the store here\n", verb);
		ov_job_free(job);
		return 0;
	}
	/* not into job->rc: once queued, the sync thread may answer (ov_done) before this
	 * returns; ov_back() runs on this thread, after */
	int rc = store_ov_change(s, c);
	if (rc == STORE_PENDING) {
		w->cmd = job;
		w->cancel = ov_cancel;
		return 1;
	}
	job->rc = rc;
	ov_format(job, out, ret_ok);
	ov_job_free(job);
	return 0;
}

static int ov_entry_cmp(const void *a, const void *b)
{
	const struct store_ov_entry *x = a, *y = b;
	size_t n = x->rule.len < y->rule.len ? x->rule.len : y->rule.len;
	int c = memcmp(x->rule.ptr, y->rule.ptr, n);
	if (c || x->rule.len != y->rule.len)
		return c ? c : (x->rule.len < y->rule.len ? -1 : 1);
	n = x->key.len < y->key.len ? x->key.len : y->key.len;
	c = memcmp(x->key.ptr, y->key.ptr, n);
	return c ? c : (x->key.len < y->key.len ? -1 : x->key.len > y->key.len);
}

/* limits overrides [RULE] [--json] */
static int limits_overrides(struct policy *p, const char *rule, bool json, struct buf *out,
			    bool *ret_ok)
{
	*ret_ok = false;
	if (rule && !policy_rule_find(p, rule)) {
		buf_printf(out, "no rule named \"%s\"\n", rule);
		return 0;
	}
	struct store *s = policy_store(p);
	struct store_ov_entry *e = NULL;
	size_t n = 0;
	uint64_t now = realtime_ns();
	if (s->ov && store_ov_list(s->ov, now, &e, &n) < 0)
		return -ENOMEM;
	if (n)
		qsort(e, n, sizeof(*e), ov_entry_cmp);
	size_t shown = 0;
	for (size_t i = 0; i < n; i++) {
		if (rule && !str_eq_cstr(e[i].rule, rule))
			continue;
		if (json) {
			char until[40], rn[STORE_OV_RULE + 1], key[RATE_MAX_OVERRIDE_KEY + 1];
			str_copy(rn, sizeof(rn), e[i].rule);
			str_copy(key, sizeof(key), e[i].key);
			buf_append_cstr(out, "{\"rule\":");
			buf_append_json_string(out, rn);
			buf_append_cstr(out, ",\"key\":");
			buf_append_json_string(out, key);
			buf_append_cstr(out, ",\"windows\":[");
			for (unsigned k = 0; k < e[i].limits.n; k++) {
				char t[64];
				buf_printf(out, "%s\"%s\"", k ? "," : "",
					   rate_window_format(&e[i].limits.w[k], t, sizeof(t)));
			}
			buf_printf(out, "],\"unlimited\":%s,\"until\":", e[i].limits.n ? "false" : "true");
			if (e[i].until_ns)
				buf_printf(out, "\"%s\"", fmt_until(e[i].until_ns, until, sizeof(until)));
			else
				buf_append_cstr(out, "null");
			buf_append_cstr(out, ",\"source\":\"run-time\"}\n");
		} else {
			runtime_line(out, e[i].rule, e[i].key, &e[i].limits, e[i].until_ns);
		}
		shown++;
	}
	free(e);
	if (!json && shown == 0)
		buf_append_cstr(out, "no run-time limits\n");
	for (size_t i = 0; policy_rule_at(p, i); i++) {
		const struct policy_rule *r = policy_rule_at(p, i);
		if (rule && strcmp(rule, policy_rule_name(r)) != 0)
			continue;
		const char *path;
		size_t count = policy_rule_overrides_count(r, &path);
		if (!path)
			continue;
		if (json) {
			buf_append_cstr(out, "{\"rule\":");
			buf_append_json_string(out, policy_rule_name(r));
			buf_append_cstr(out, ",\"file\":");
			buf_append_json_string(out, path);
			buf_printf(out, ",\"keys\":%zu,\"source\":\"overrides file\"}\n", count);
		} else {
			buf_printf(out, "%s: %zu key%s in its overrides file %s (below the "
				   "run-time limits)\n", policy_rule_name(r), count,
				   count == 1 ? "" : "s", path);
		}
	}
	*ret_ok = true;
	return 0;
}

int policy_control_limits(struct policy *p, size_t argc, const struct str *argv,
			  struct buf *out, bool *ret_ok, struct control_wait *w)
{
	bool json = false;
	size_t n = 0;
	char args[4][256];
	if (argc >= 2 && (str_eq_cstr(argv[1], "set") || str_eq_cstr(argv[1], "unset")))
		return limits_set_unset(p, str_eq_cstr(argv[1], "unset"), argc - 2, argv + 2, out,
					ret_ok, w);
	for (size_t i = 1; i < argc; i++) {
		if (str_eq_cstr(argv[i], "--json")) {
			json = true;
			continue;
		}
		if (n < ARRAY_SIZE(args))
			fmt_fixed(args[n++], sizeof(args[0]), "%.*s", (int)argv[i].len, argv[i].ptr);
	}
	*ret_ok = false;
	if (n >= 1 && strcmp(args[0], "top") == 0 && n <= 2) {
		if (n == 2 && !policy_rule_find(p, args[1])) {
			buf_printf(out, "no rule named \"%s\"\n", args[1]);
			return 0;
		}
		*ret_ok = true;
		if (store_is_shared(policy_store(p))) {
			buf_append_cstr(out, "limits top needs the memory store: with the redis "
					"store the keys live in Redis (redis-cli --scan --pattern "
					"'PREFIX*')\n");
			return 0;
		}
		return limits_top(p, n == 2 ? args[1] : NULL, json, out);
	}
	if (n >= 1 && n <= 2 && strcmp(args[0], "overrides") == 0)
		return limits_overrides(p, n == 2 ? args[1] : NULL, json, out, ret_ok);
	if (n >= 2 && n <= 3 && (strcmp(args[0], "show") == 0 || strcmp(args[0], "reset") == 0))
		return limits_show_reset(p, str_cstr(args[1]), n == 3 ? args[2] : NULL,
					 strcmp(args[0], "reset") == 0, out, ret_ok, w);
	buf_append_cstr(out, "usage: limits top [RULE] [--json] | limits show KEY [RULE] | "
			"limits reset KEY [RULE] | limits set RULE KEY RATE... [--for DURATION] | "
			"limits unset RULE KEY | limits overrides [RULE] [--json]\n");
	return 0;
}

/* ---- test ---- */

/* %XX-decode in place into dst (at most len-1 bytes); returns the length or -1. */
static int decode(struct str s, char *dst, size_t len)
{
	size_t n = 0;
	for (size_t i = 0; i < s.len; i++) {
		if (n + 1 >= len)
			return -1;
		if (s.ptr[i] == '%') {
			if (i + 2 >= s.len + 0 || hex_value(s.ptr[i + 1]) < 0 || hex_value(s.ptr[i + 2]) < 0)
				return -1;
			dst[n++] = (char)(hex_value(s.ptr[i + 1]) * 16 + hex_value(s.ptr[i + 2]));
			i += 2;
		} else {
			dst[n++] = s.ptr[i];
		}
	}
	dst[n] = '\0';
	return (int)n;
}

struct test_txn {
	char client_ip[128], client_name[256], helo[256], sasl_user[256], from[512];
	char rcpt[TEST_MAX_RCPTS][512];
	size_t nrcpt;
	char header[TEST_MAX_HEADERS][1024];
	size_t nheader;
	char size[32];
};

static bool test_header(void *arg, const char *name, struct str *ret)
{
	const struct test_txn *t = arg;
	size_t nl = strlen(name);
	for (size_t i = 0; i < t->nheader; i++) {
		const char *h = t->header[i];
		const char *colon = strchr(h, ':');
		if (colon && (size_t)(colon - h) == nl && strncasecmp(h, name, nl) == 0) {
			*ret = str_cstr(colon + 1);
			return true;
		}
	}
	return false;
}

static const char *rule_state_text(enum policy_rule_state s)
{
	switch (s) {
	case POLICY_RULE_PASS: return "within its limits";
	case POLICY_RULE_OVER: return "OVER its limits";
	case POLICY_RULE_NO_VALUE: return "does not apply";
	case POLICY_RULE_EXCEPT: return "does not apply";
	case POLICY_RULE_UNLIMITED: return "unlimited for this key (overrides file)";
	case POLICY_RULE_COUNTED: return "message already counted";
	case POLICY_RULE_OUT_OF_SCOPE: return "does not apply";
	case POLICY_RULE_NOT_HERE: return "not counted here";
	case POLICY_RULE_HELD: return "this session holds a slot already";
	}
	return "?";
}

/* One stage of `test`: its decision with a result per rule, answered now or later. */
struct explain_slot {
	struct test_job *job;
	enum policy_stage st;
	char what[600];
	struct policy_decision d;
	struct policy_rule_result *res;
	struct policy_pending *pp;
	bool pending;
};

struct test_job {
	struct policy *p;
	struct test_txn *tt;
	size_t n, waiting;
	struct control_wait *w;
	struct explain_slot slots[TEST_MAX_RCPTS + 5];
};

static void explain_format(const struct explain_slot *sl, struct buf *out,
			   enum policy_action *worst)
{
	const struct policy_decision *d = &sl->d;
	buf_printf(out, "stage %s%s%s:\n", policy_stage_name(sl->st), sl->what[0] ? " " : "",
		   sl->what);
	for (size_t i = 0; i < d->nresults; i++) {
		const struct policy_rule_result *r = &sl->res[i];
		buf_printf(out, "  limit %s (key %s, count %s, action %s): ",
			   policy_rule_name(r->rule), policy_rule_key_spec(r->rule),
			   policy_count_name(policy_rule_count_kind(r->rule)),
			   policy_action_name(policy_rule_action(r->rule)));
		if (r->state == POLICY_RULE_NO_VALUE || r->state == POLICY_RULE_EXCEPT ||
		    r->state == POLICY_RULE_OUT_OF_SCOPE) {
			buf_printf(out, "%s (%s)\n", rule_state_text(r->state), r->why);
			continue;
		}
		if (r->state == POLICY_RULE_NOT_HERE) {
			buf_printf(out, "%s (sessions are counted through the milter only: the "
				   "policy service never learns when a session ends)\n",
				   rule_state_text(r->state));
			continue;
		}
		char key[256];
		log_quote(key, sizeof(key), str_cstr(r->key), 200);
		buf_printf(out, "key %s", key);
		if (r->via[0])
			buf_printf(out, " (from %s, the first of the chain with a value)", r->via);
		buf_append_cstr(out, ": ");
		char rt[80] = "";
		if (r->runtime) {
			char until[40];
			fmt_fixed(rt, sizeof(rt), " (run-time limit, until %s)",
				  fmt_until(r->runtime_until, until, sizeof(until)));
		}
		if (r->state == POLICY_RULE_UNLIMITED && r->runtime) {
			buf_printf(out, "unlimited for this key%s\n", rt);
			continue;
		}
		if (r->state == POLICY_RULE_UNLIMITED || r->state == POLICY_RULE_COUNTED) {
			buf_printf(out, "%s\n", rule_state_text(r->state));
			continue;
		}
		if (policy_rule_count_kind(r->rule) == POLICY_COUNT_SESSIONS) {
			buf_printf(out, "%s; %u of %u sessions at once held now on this node%s%s\n",
				   rule_state_text(r->state), r->sessions,
				   policy_rule_max_sessions(r->rule),
				   r->state == POLICY_RULE_HELD ? "" :
				   "; counted through the milter only", r->why[0] ? "; " : "");
			if (r->why[0])
				buf_printf(out, "    %s\n", r->why);
			continue;
		}
		buf_printf(out, "%s%s; ", rule_state_text(r->state),
			   r->runtime ? rt : r->overridden ? " (override)" : "");
		format_windows(&r->limits, r->used, out);
		if (policy_rule_count_kind(r->rule) == POLICY_COUNT_DISTINCT)
			buf_printf(out, "; this value %s", r->known ?
				   "was counted in every window already: it passes and counts 0" :
				   "is new in a window: it counts 1");
		else
			buf_printf(out, "; this event counts %llu", (unsigned long long)r->cost);
		unsigned long long retry_s =
			r->retry_ns / 1000000000ULL + (r->retry_ns % 1000000000ULL != 0);
		if (r->state == POLICY_RULE_OVER && r->blocked)
			buf_printf(out, "; BLOCKED (block = %llus after a refusal): it ends in %llus",
				   (unsigned long long)(policy_rule_block_ns(r->rule) / 1000000000ULL),
				   retry_s);
		else if (r->state == POLICY_RULE_OVER)
			buf_printf(out, "; room again in %llus", retry_s);
		if (r->state == POLICY_RULE_OVER && policy_rule_block_ns(r->rule) && !r->blocked)
			buf_printf(out, "; a refusal now blocks the key for %llus",
				   (unsigned long long)(policy_rule_block_ns(r->rule) / 1000000000ULL));
		buf_append_byte(out, '\n');
	}
	if (d->store_error)
		buf_printf(out, "  store error: %s\n", strerror(-d->store_error));
	buf_printf(out, "  verdict: %s%s%s\n", policy_action_name(d->action),
		   d->reply[0] ? " " : "", d->reply);
	if (d->delay_ms)
		buf_printf(out, "  delay: the answer waits %llums\n", (unsigned long long)d->delay_ms);
	if (d->action > *worst)
		*worst = d->action;
}

static void test_job_free(struct test_job *job)
{
	for (size_t i = 0; i < job->n; i++)
		free(job->slots[i].res);
	free(job->tt);
	policy_unref(job->p);
	free(job);
}

static void test_format(struct test_job *job, struct buf *out)
{
	enum policy_action worst = POLICY_ACCEPT;
	for (size_t i = 0; i < job->n; i++)
		explain_format(&job->slots[i], out, &worst);
	buf_printf(out, "result: %s\n", policy_action_name(worst));
}

static void explain_done(void *arg, struct policy_decision *dd)
{
	struct explain_slot *sl = arg;
	struct test_job *job = sl->job;
	sl->d = *dd; /* its results are sl->res, filled in place */
	sl->pending = false;
	if (--job->waiting)
		return;
	struct control_wait *w = job->w;
	test_format(job, w->out);
	*w->ok = true;
	w->cancel = NULL;
	test_job_free(job);
	w->done(w);
}

static void test_cancel(struct control_wait *w)
{
	struct test_job *job = w->cmd;
	for (size_t i = 0; i < job->n; i++)
		if (job->slots[i].pending)
			policy_pending_cancel(job->slots[i].pp);
	test_job_free(job);
}

/* Start one stage's decision (nothing is charged: STORE_PEEK). */
static int explain_start(struct test_job *job, const struct policy_txn *t, enum policy_stage st,
			 const char *what)
{
	struct policy *p = job->p;
	if (!policy_has_stage(p, st))
		return 0;
	struct explain_slot *sl = &job->slots[job->n];
	size_t nrules = 0;
	while (policy_rule_at(p, nrules))
		nrules++;
	sl->res = calloc(nrules ? nrules : 1, sizeof(*sl->res));
	if (!sl->res)
		return -ENOMEM;
	job->n++;
	sl->job = job;
	sl->st = st;
	fmt_fixed(sl->what, sizeof(sl->what), "%s", what ? what : "");
	sl->d.results = sl->res;
	sl->d.max_results = nrules;
	if (policy_check_start(p, t, st, NULL, STORE_PEEK, realtime_ns(), &sl->d, explain_done, sl,
			       &sl->pp) == 1) {
		sl->pending = true;
		job->waiting++;
	}
	return 0;
}

int policy_control_test(struct policy *p, size_t argc, const struct str *argv,
			struct buf *out, bool *ret_ok, struct control_wait *w)
{
	struct test_job *job = calloc(1, sizeof(*job));
	struct test_txn *tt = calloc(1, sizeof(*tt));
	if (!tt || !job) {
		free(tt);
		free(job);
		return -ENOMEM;
	}
	job->p = policy_ref(p);
	job->tt = tt;
	job->w = w;
	int rc = 0;
	*ret_ok = false;
	for (size_t i = 1; i < argc; i++) {
		const char *eq = memchr(argv[i].ptr, '=', argv[i].len);
		if (!eq) {
			buf_printf(out, "expected NAME=VALUE, not \"%.*s\"\n", (int)argv[i].len,
				   argv[i].ptr);
			goto done;
		}
		struct str name = str_make(argv[i].ptr, (size_t)(eq - argv[i].ptr));
		struct str val = str_make(eq + 1, argv[i].len - name.len - 1);
		char *dst = NULL;
		size_t len = 0;
		if (str_eq_cstr(name, "client_ip"))
			dst = tt->client_ip, len = sizeof(tt->client_ip);
		else if (str_eq_cstr(name, "client_name"))
			dst = tt->client_name, len = sizeof(tt->client_name);
		else if (str_eq_cstr(name, "helo"))
			dst = tt->helo, len = sizeof(tt->helo);
		else if (str_eq_cstr(name, "sasl_user"))
			dst = tt->sasl_user, len = sizeof(tt->sasl_user);
		else if (str_eq_cstr(name, "from"))
			dst = tt->from, len = sizeof(tt->from);
		else if (str_eq_cstr(name, "size"))
			dst = tt->size, len = sizeof(tt->size);
		else if (str_eq_cstr(name, "rcpt") && tt->nrcpt < TEST_MAX_RCPTS)
			dst = tt->rcpt[tt->nrcpt++], len = sizeof(tt->rcpt[0]);
		else if (str_eq_cstr(name, "header") && tt->nheader < TEST_MAX_HEADERS)
			dst = tt->header[tt->nheader++], len = sizeof(tt->header[0]);
		if (!dst) {
			buf_printf(out, "unknown or repeated too often: \"%.*s\"\n", (int)name.len,
				   name.ptr);
			goto done;
		}
		if (decode(val, dst, len) < 0) {
			buf_printf(out, "%.*s: bad encoding or too long\n", (int)name.len, name.ptr);
			goto done;
		}
	}
	struct policy_txn t = { 0 };
	t.client_addr = str_cstr(tt->client_ip);
	t.client_name = str_cstr(tt->client_name);
	t.helo = str_cstr(tt->helo);
	t.sasl_user = str_cstr(tt->sasl_user);
	t.header = test_header;
	t.arg = tt;
	if (tt->size[0]) {
		t.size = strtoull(tt->size, NULL, 10);
		t.have_size = true;
	}
	buf_append_cstr(out, "nothing is counted: this shows what would happen now\n");
	struct ipaddr ip;
	bool have_ip = ipaddr_parse(t.client_addr, &ip) == 0;
	if (policy_has_classes(p)) {
		struct class_stats cs[64];
		size_t n = policy_class_stats(p, cs, ARRAY_SIZE(cs));
		const char *cls = policy_class_match(p, have_ip ? &ip : NULL, t.client_name);
		for (size_t i = 0; i < n; i++)
			if (cls && strcmp(cls, cs[i].name) == 0)
				buf_printf(out, "class %s: %u sessions now, inbound limit %u: %s\n",
					   cs[i].name, cs[i].used, cs[i].inbound,
					   cs[i].used >= cs[i].inbound ? "a new session would be refused "
					   "(421)" : "a new session would be served");
	}
	/* a job of its own for every stage, started together: a peek charges nothing, so
	 * the stages do not depend on each other, and with a shared store they wait once */
	explain_start(job, &t, POLICY_CONNECT, NULL);
	explain_start(job, &t, POLICY_HELO, NULL);
	t.have_sender = true;
	t.sender = str_cstr(tt->from);
	explain_start(job, &t, POLICY_MAIL, NULL);
	for (size_t i = 0; i < tt->nrcpt; i++) {
		t.rcpt = str_cstr(tt->rcpt[i]);
		char what[600];
		fmt_fixed(what, sizeof(what), "(recipient %s)", tt->rcpt[i]);
		explain_start(job, &t, POLICY_RCPT, what);
	}
	t.rcpt = STR_NULL;
	t.rcpt_count = (unsigned)tt->nrcpt;
	explain_start(job, &t, POLICY_DATA, NULL);
	explain_start(job, &t, POLICY_EOM, NULL);
	if (job->waiting) {
		w->cmd = job;
		w->cancel = test_cancel;
		return 1;
	}
	test_format(job, out);
	*ret_ok = true;
done:
	test_job_free(job);
	return rc;
}
