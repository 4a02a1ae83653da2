/*
 * policy_control -- limits and test commands (see policy_control.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "policy_control.h"
#include "util.h"

#define TEST_MAX_RCPTS 32
#define TEST_MAX_HEADERS 32

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
		if (sl->unlimited) {
			buf_printf(out, "%s %.*s: unlimited (overrides file)\n", name,
				   (int)sl->k.len, sl->k.ptr);
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
			   sl->overridden ? " (override)" : "");
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
		if (!policy_rule_limits(r, sl->k, &sl->lim, &sl->overridden)) {
			sl->unlimited = true;
			continue;
		}
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

int policy_control_limits(struct policy *p, size_t argc, const struct str *argv,
			  struct buf *out, bool *ret_ok, struct control_wait *w)
{
	bool json = false;
	size_t n = 0;
	char args[4][256];
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
	if (n >= 2 && n <= 3 && (strcmp(args[0], "show") == 0 || strcmp(args[0], "reset") == 0))
		return limits_show_reset(p, str_cstr(args[1]), n == 3 ? args[2] : NULL,
					 strcmp(args[0], "reset") == 0, out, ret_ok, w);
	buf_append_cstr(out, "usage: limits top [RULE] [--json] | limits show KEY [RULE] | "
			"limits reset KEY [RULE]\n");
	return 0;
}

/* ---- test ---- */

static int unhex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* %XX-decode in place into dst (at most len-1 bytes); returns the length or -1. */
static int decode(struct str s, char *dst, size_t len)
{
	size_t n = 0;
	for (size_t i = 0; i < s.len; i++) {
		if (n + 1 >= len)
			return -1;
		if (s.ptr[i] == '%') {
			if (i + 2 >= s.len + 0 || unhex(s.ptr[i + 1]) < 0 || unhex(s.ptr[i + 2]) < 0)
				return -1;
			dst[n++] = (char)(unhex(s.ptr[i + 1]) * 16 + unhex(s.ptr[i + 2]));
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
		buf_printf(out, "%s%s; ", rule_state_text(r->state), r->overridden ? " (override)" : "");
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
