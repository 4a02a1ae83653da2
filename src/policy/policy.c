/*
 * policy -- decisions and refunds, and their log lines (see policy.h and policy_int.h);
 * the host classes' slots are policy_class.c's.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "policy_int.h"
#include "sessions.h"
#include "util.h"


/* ---- decisions ---- */

void policy_msg_clear(struct policy_msg *m)
{
	policy_sessions_end(m);
	free(m->sessions);
	free(m->charges);
	free(m->marks);
	memset(m, 0, sizeof(*m));
}

int policy_msg_track_sessions(struct policy_msg *m)
{
	if (!m->sessions && !(m->sessions = calloc(1, sizeof(*m->sessions))))
		return -ENOMEM;
	return 0;
}

unsigned policy_rule_sessions_held(const struct policy *p, const struct policy_rule *r,
				   struct str key)
{
	return sessions_count(store_key_hash(p->store, r->name_str, key));
}

void policy_sessions_key(uint64_t key_hash, char *ret_name)
{
	fmt_fixed(ret_name, POLICY_SESSIONS_KEY, "s:%016llx", (unsigned long long)key_hash);
}

/* Give back slot i of ss: this node's, and the shared store's if it granted it. */
static void sessions_drop(struct policy_sessions *ss, size_t i)
{
	sessions_give(ss->key_hash[i]);
	if (ss->shared[i] && ss->store) {
		char cls[POLICY_SESSIONS_KEY];
		policy_sessions_key(ss->key_hash[i], cls);
		store_slot_release(ss->store, cls);
	}
}

void policy_sessions_end(struct policy_msg *m)
{
	struct policy_sessions *ss = m->sessions;
	if (!ss)
		return;
	for (size_t i = 0; i < ss->n; i++)
		sessions_drop(ss, i);
	ss->n = 0;
}

/* The decision in progress is over: its provisional slots are kept, or given back when
 * the event was refused. */
static void sessions_settle(struct policy_msg *m, bool refused)
{
	struct policy_sessions *ss = m ? m->sessions : NULL;
	if (!ss)
		return;
	size_t k = 0;
	for (size_t i = 0; i < ss->n; i++) {
		if (ss->provisional[i] && refused) {
			sessions_drop(ss, i);
			continue;
		}
		ss->key_hash[k] = ss->key_hash[i];
		ss->shared[k] = ss->shared[i];
		ss->provisional[k++] = false;
	}
	ss->n = k;
}

/* The shared store refused (or never answered) a provisional slot: only this node's
 * reservation goes back (a grant that crossed a cancel is set right by the next lease
 * renewal, which states this node's own counts). */
static void sessions_unreserve(struct policy_msg *m, uint64_t h)
{
	struct policy_sessions *ss = m ? m->sessions : NULL;
	for (size_t i = 0; ss && i < ss->n; i++)
		if (ss->key_hash[i] == h && ss->provisional[i]) {
			sessions_give(h);
			ss->n--;
			ss->key_hash[i] = ss->key_hash[ss->n];
			ss->shared[i] = ss->shared[ss->n];
			ss->provisional[i] = ss->provisional[ss->n];
			return;
		}
}

/* The shared store granted a provisional slot. */
static void sessions_granted(struct policy_msg *m, struct store *s, uint64_t h)
{
	struct policy_sessions *ss = m ? m->sessions : NULL;
	for (size_t i = 0; ss && i < ss->n; i++)
		if (ss->key_hash[i] == h && ss->provisional[i]) {
			ss->shared[i] = true;
			ss->store = s;
			return;
		}
}

static bool sessions_holds(const struct policy_sessions *ss, uint64_t h)
{
	for (size_t i = 0; i < ss->n; i++)
		if (ss->key_hash[i] == h)
			return true;
	return false;
}

static void ledger_add(struct policy_msg *m, const struct store_item *it,
		       const struct policy_rule *r, enum policy_stage st)
{
	if (m->n == m->cap) {
		if (m->cap >= POLICY_LEDGER_MAX) {
			m->overflow = true;
			return;
		}
		size_t cap = m->cap ? m->cap * 2 : 8;
		struct policy_charge *c = realloc(m->charges, cap * sizeof(*c));
		if (!c) {
			m->overflow = true;
			return;
		}
		m->charges = c;
		m->cap = cap;
	}
	struct policy_charge *c = &m->charges[m->n++];
	c->key_hash = it->key_hash;
	c->cost = it->cost;
	c->rule = r;
	c->limits = *it->limits;
	c->scope = (uint8_t)st;
}

static bool ledger_has(const struct policy_msg *m, const struct policy_rule *r, uint64_t h)
{
	for (size_t i = 0; i < m->n; i++)
		if (m->charges[i].rule == r && m->charges[i].key_hash == h)
			return true;
	return false;
}

void policy_msg_end(struct policy *p, struct policy_msg *m, bool delivered, uint64_t now)
{
	if (!delivered && m->n && p->store) {
		struct store_item items[64];
		size_t k = 0;
		for (size_t i = 0; i < m->n; i++) {
			if (m->charges[i].rule->count_rejected)
				continue;
			struct store_item *it = &items[k++];
			memset(it, 0, sizeof(*it));
			it->key_hash = m->charges[i].key_hash;
			it->rule = m->charges[i].rule->name_str;
			it->limits = &m->charges[i].limits;
			it->cost = m->charges[i].cost;
			it->charged = true;
			if (k == ARRAY_SIZE(items) || i + 1 == m->n) {
				store_refund(p->store, items, k, now);
				k = 0;
			}
		}
		if (k)
			store_refund(p->store, items, k, now);
	}
	m->n = 0;
	m->overflow = false;
	m->ntags = 0;
	m->quarantine = false;
	if (m->marks)
		m->marks->quarantine_reason[0] = '\0';
}

/* Nanoseconds to seconds, rounded up, without wrapping at the saturated "never". */
static uint64_t ns_to_s_up(uint64_t ns)
{
	return ns / 1000000000ULL + (ns % 1000000000ULL != 0);
}

static void expand_reply(const struct policy_rule *r, const char *key, const char *limit,
			 uint64_t retry_s, char *out, size_t outlen)
{
	struct buf b;
	buf_init_fixed(&b, out, outlen);
	/* jitter: up to a fifth more, so that refused clients do not all come back at once */
	uint64_t shown = jitter(retry_s, 0, 20);
	if (shown == 0)
		shown = 1;
	for (const char *p = r->reply; *p; p++) {
		if (p[0] == '%' && p[1] == '{') {
			const char *end = strchr(p, '}');
			size_t n = (size_t)(end - p - 2);
			char tmp[64];
			if (n == 4 && strncmp(p + 2, "rule", 4) == 0)
				buf_append_cstr(&b, r->name);
			else if (n == 3 && strncmp(p + 2, "key", 3) == 0)
				buf_append_cstr(&b, key);
			else if (n == 5 && strncmp(p + 2, "limit", 5) == 0)
				buf_append_cstr(&b, limit);
			else if (n == 5 && strncmp(p + 2, "retry", 5) == 0) {
				fmt_duration(tmp, sizeof(tmp), shown * 1000, DURATION_UP);
				buf_append_cstr(&b, tmp);
			}
			p = end;
			continue;
		}
		buf_append_byte(&b, (unsigned char)*p);
	}
}

struct scratch {
	struct sess_ask asks[POLICY_MAX_ASKS];
	size_t nasks;
	struct store_item items[POLICY_MAX_RULES];
	const struct policy_rule *rules[POLICY_MAX_RULES];
	struct policy_rule_result *res[POLICY_MAX_RULES];
	char keys[POLICY_MAX_RULES][SELECTOR_MAX_KEY + 1];
	struct rate_limits limits[POLICY_MAX_RULES]; /* copies: overrides tables are swapped */
};

/* One per thread, freed when the thread ends (worker threads end at shutdown and the
 * sanitizer runs count what they leave behind). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_ok;

static void scratch_key_make(void)
{
	scratch_key_ok = pthread_key_create(&scratch_key, free) == 0;
}

static struct scratch *scratch_get(void)
{
	static _Thread_local struct scratch *s;
	if (!s) {
		pthread_once(&scratch_once, scratch_key_make);
		s = malloc(sizeof(*s));
		if (s && scratch_key_ok)
			(void)pthread_setspecific(scratch_key, s); /* else kept for life */
	}
	return s;
}

static bool rule_excepted(const struct policy_rule *r, const struct policy_txn *t,
			  char *why, size_t whylen)
{
	for (size_t i = 0; i < r->nex; i++)
		if (selector_match(&r->ex[i].sel, t, r->ex[i].masks)) {
			char name[100];
			fmt_fixed(why, whylen, "except %s",
				  selector_name(&r->ex[i].sel, name, sizeof(name)));
			return true;
		}
	return false;
}

/* Does every only entry match (a rule without any applies everywhere)? */
static bool rule_in_scope(const struct policy_rule *r, const struct policy_txn *t, char *why,
			  size_t whylen)
{
	for (size_t i = 0; i < r->nonly; i++)
		if (!selector_match(&r->only[i].sel, t, r->only[i].masks)) {
			char name[100];
			fmt_fixed(why, whylen, "only %s: no match",
				  selector_name(&r->only[i].sel, name, sizeof(name)));
			return false;
		}
	return true;
}

static uint64_t rule_cost(const struct policy_rule *r, const struct policy_txn *t,
			  enum policy_stage st)
{
	switch (r->count) {
	case POLICY_COUNT_CONNECTIONS:
	case POLICY_COUNT_MESSAGES:
	case POLICY_COUNT_SESSIONS:
	case POLICY_COUNT_DISTINCT:
		return 1;
	case POLICY_COUNT_RECIPIENTS:
		return st == POLICY_RCPT ? 1 : t->rcpt_count;
	case POLICY_COUNT_BYTES:
		return t->have_size ? t->size : 0;
	}
	return 1;
}

/* The window that refused (the one needing the longest wait), as text. */
static unsigned binding_window(const struct store_item *it, char *buf, size_t len)
{
	uint64_t best = 0;
	unsigned wi = 0;
	for (unsigned i = 0; i < it->limits->n; i++) {
		const struct rate_window *w = &it->limits->w[i];
		uint64_t cost = it->cost ? it->cost : 1;
		if (it->used[i] + cost > w->burst) {
			/* saturating: counts up to 10^15 times intervals of days would wrap */
			uint64_t over = it->used[i] + cost - w->burst, t = gcra_interval(w);
			uint64_t wait = t && over > UINT64_MAX / t ? UINT64_MAX : over * t;
			if (wait >= best) {
				best = wait;
				wi = i;
			}
		}
	}
	rate_window_format(&it->limits->w[wi], buf, len);
	return wi;
}

/* Where a decision's working set lives: the thread's scratch, or a pending call. */
static void decision_reset(struct policy_decision *d)
{
	d->action = POLICY_ACCEPT;
	d->rule = NULL;
	d->key[0] = '\0';
	d->reply[0] = '\0';
	d->retry_s = 0;
	d->delay_ms = 0;
	d->nover = 0;
	d->nresults = 0;
	d->store_error = 0;
}

/* The decision's verdict becomes rule r's (over its limit, stricter than what it was). */
static void decide_by(struct policy_decision *d, const struct policy_rule *r, struct str key,
		      const char *limit, uint64_t retry_s)
{
	d->action = r->action;
	d->rule = r;
	text_sanitize(d->key, sizeof(d->key), key, 100, TEXT_MARK_CUT);
	d->retry_s = retry_s;
	if (r->reply)
		expand_reply(r, d->key, limit, d->retry_s, d->reply, sizeof(d->reply));
}

/* A sessions rule's decision in its counters (STORE_CHECK). */
static void count_sessions_verdict(const struct policy_rule *r, bool within)
{
	unsigned k = thread_shard();
	counter_add(&r->shards[k].verdicts[within ? POLICY_ACCEPT : r->action], k, 1);
}

/* A sessions rule over its max: into the decision. */
static void sessions_over(struct policy_decision *d, const struct policy_rule *r, struct str key,
			  unsigned count)
{
	char limit[32];
	fmt_fixed(limit, sizeof(limit), "%u sessions", r->max_sessions);
	if (d->nover < POLICY_MAX_OVER) {
		struct policy_over *o = &d->over[d->nover++];
		o->rule = r;
		text_sanitize(o->key, sizeof(o->key), key, POLICY_LOG_KEY - 3, TEXT_MARK_CUT);
		fmt_fixed(o->limit, sizeof(o->limit), "%u", r->max_sessions);
		o->count = count;
		o->retry_s = 0;
	}
	if (r->action == POLICY_DELAY && r->delay_ms > d->delay_ms)
		d->delay_ms = r->delay_ms;
	if (!d->rule || r->action > d->action)
		decide_by(d, r, key, limit, 0);
}

/*
 * A sessions rule with its key: this session takes a slot (provisional until the event's
 * fate is known, sessions_settle()) or the rule is over.  Returns 1 within (or not
 * counted), 0 over.  The registry counts this node's sessions; with a shared store
 * (w->asks) the slot is only reserved here, and the store's lease decides (struct
 * sess_ask, ask_answer()).
 */
static int sessions_rule(struct policy *p, const struct policy_rule *r, struct str key,
			 struct policy_msg *msg, enum store_mode mode, struct policy_decision *d,
			 struct policy_rule_result *res, const struct work *w)
{
	struct policy_sessions *ss = msg ? msg->sessions : NULL; /* NULL: a peek */
	uint64_t h = store_key_hash(p->store, r->name_str, key);
	unsigned count = 0;
	int rc;
	if (res) {
		res->cost = 1;
		res->limits.n = 0;
	}
	if (ss && sessions_holds(ss, h)) {
		if (res) {
			res->state = POLICY_RULE_HELD;
			res->sessions = sessions_count(h);
		}
		return 1;
	}
	bool ask = w->asks && *w->nasks < POLICY_MAX_ASKS;
	if (mode != STORE_CHECK || !ss) {
		count = sessions_count(h);
		rc = count < r->max_sessions;
		mode = STORE_PEEK;
	} else if (ss->n == POLICY_MAX_HELD) {
		rc = -ENOSPC; /* not counted: passes */
	} else {
		/* with a shared store this node reserves first, whatever its own count, and
		 * the store decides (sess_ask) */
		rc = sessions_take(h, r->max_sessions, ask, &count);
	}
	if (rc == 1 && mode == STORE_CHECK) {
		ss->key_hash[ss->n] = h;
		ss->shared[ss->n] = false;
		ss->provisional[ss->n++] = true;
		if (ask) {
			struct sess_ask *a = &w->asks[(*w->nasks)++];
			memset(a, 0, sizeof(*a));
			a->r = r;
			a->res = res;
			a->key_hash = h;
			policy_sessions_key(h, a->cls);
			text_sanitize(a->key, sizeof(a->key), key, POLICY_LOG_KEY - 3, TEXT_MARK_CUT);
			a->call.local_used = count;
			if (res) {
				res->state = POLICY_RULE_PASS;
				res->sessions = count;
				res->charged = true;
			}
			return 1; /* for now: sess_answer() has the last word */
		}
	}
	if (mode == STORE_CHECK)
		count_sessions_verdict(r, rc != 0);
	if (res) {
		res->state = rc == 0 ? POLICY_RULE_OVER : POLICY_RULE_PASS;
		res->sessions = count;
		res->charged = rc == 1 && mode == STORE_CHECK;
		if (rc < 0)
			fmt_fixed(res->why, sizeof(res->why), "not counted: %s",
				  rc == -ENOSPC ? "this session holds too many slots"
						: "too many keys held");
	}
	if (rc != 0)
		return 1;
	sessions_over(d, r, key, count);
	return 0;
}

/* The rules of stage st that apply to t, as store items in w.  Returns how many; a
 * sessions rule is decided here, and *ret_refused says if one refused the event. */
static size_t prepare(struct policy *p, const struct policy_txn *t, enum policy_stage st,
		      struct policy_msg *msg, enum store_mode mode, uint64_t now,
		      struct policy_decision *d, const struct work *w, bool *ret_refused)
{
	size_t n = 0;
	*ret_refused = false;
	for (size_t k = 0; k < p->stage_n[st]; k++) {
		const struct policy_rule *r = &p->rules[p->stage_rules[st][k]];
		struct policy_rule_result *res = NULL;
		if (d->results && d->nresults < d->max_results) {
			res = &d->results[d->nresults++];
			memset(res, 0, sizeof(*res));
			res->rule = r;
		}
		char why[128];
		if (rule_excepted(r, t, why, sizeof(why))) {
			if (res) {
				res->state = POLICY_RULE_EXCEPT;
				fmt_fixed(res->why, sizeof(res->why), "%s", why);
			}
			continue;
		}
		if (!rule_in_scope(r, t, why, sizeof(why))) {
			if (res) {
				res->state = POLICY_RULE_OUT_OF_SCOPE;
				fmt_fixed(res->why, sizeof(res->why), "%s", why);
			}
			continue;
		}
		if (r->count == POLICY_COUNT_SESSIONS && !(msg && msg->sessions) &&
		    mode == STORE_CHECK) {
			/* only those who see a session end can count sessions */
			if (res)
				res->state = POLICY_RULE_NOT_HERE;
			continue;
		}
		struct buf kb;
		buf_init_fixed(&kb, w->keys[n], sizeof(w->keys[n]));
		const struct selector *missing = NULL;
		struct selector_set set = rule_selectors(r);
		size_t alt = 0;
		if (selector_chain_key(&set, t, &kb, &alt, &missing) != 1) {
			if (res) {
				char name[100];
				res->state = POLICY_RULE_NO_VALUE;
				fmt_fixed(res->why, sizeof(res->why), "no %s",
					  missing ? selector_name(missing, name, sizeof(name)) : "key");
			}
			continue;
		}
		if (res) {
			fmt_fixed(res->key, sizeof(res->key), "%s", kb.ptr);
			if (r->nalt > 1)
				selector_alt_name(&set, alt, res->via, sizeof(res->via));
		}
		if (r->count == POLICY_COUNT_SESSIONS) {
			if (sessions_rule(p, r, buf_str(&kb), msg, mode, d, res, w) == 0 &&
			    r->action >= POLICY_DISCARD)
				*ret_refused = true;
			continue;
		}
		uint64_t value_hash = 0;
		if (r->count == POLICY_COUNT_DISTINCT) {
			char vspace[SELECTOR_MAX_VALUE + 8];
			struct buf vb;
			buf_init_fixed(&vb, vspace, sizeof(vspace));
			if (selector_value(&r->of, t, &vb) != 1) {
				if (res) {
					char name[100];
					res->state = POLICY_RULE_NO_VALUE;
					fmt_fixed(res->why, sizeof(res->why), "no %s (of)",
						  selector_name(&r->of, name, sizeof(name)));
				}
				continue;
			}
			value_hash = store_key_hash(p->store, str_make("\x01of", 3), buf_str(&vb));
			value_hash += value_hash == 0;
		}
		/* the limits: a run-time limit (the store's table), else the overrides file,
		 * else the rule's rates (doc/LIMITS.md, "Run-time limits") */
		uint64_t key_hash = store_key_hash(p->store, r->name_str, buf_str(&kb));
		bool overridden = false, runtime;
		struct rate_limits lim;
		uint64_t until = 0;
		int limited;
		runtime = store_ov_find(p->store->ov, key_hash, now, &lim, &until) == 1;
		if (runtime)
			limited = lim.n > 0;
		else
			limited = policy_rule_limits(r, buf_str(&kb), &lim, &overridden);
		if (res) {
			res->overridden = overridden;
			res->runtime = runtime;
			res->runtime_until = until;
		}
		if (!limited) {
			if (res)
				res->state = POLICY_RULE_UNLIMITED;
			continue;
		}
		struct store_item *it = &w->items[n];
		memset(it, 0, sizeof(*it));
		it->key_hash = key_hash;
		/* messages and bytes counted at RCPT: once per message and key */
		if ((r->count == POLICY_COUNT_MESSAGES || r->count == POLICY_COUNT_BYTES) &&
		    st == POLICY_RCPT && msg &&
		    ledger_has(msg, r, it->key_hash)) {
			if (res)
				res->state = POLICY_RULE_COUNTED;
			continue;
		}
		it->rule = r->name_str;
		it->key = buf_str(&kb);
		w->limits[n] = lim;
		it->limits = &w->limits[n];
		it->cost = rule_cost(r, t, st);
		if (r->action >= POLICY_DISCARD)
			it->flags |= STORE_BLOCKING;
		if (r->count_rejected)
			it->flags |= STORE_COUNT_REJECTED;
		if (value_hash) {
			it->flags |= STORE_DISTINCT;
			it->value_hash = value_hash;
		}
		it->block_ns = r->block_ns;
		w->rules[n] = r;
		w->res[n] = res;
		if (res) {
			res->limits = lim;
			res->cost = it->cost;
		}
		n++;
	}
	return n;
}

#define TEMPFAIL_REPLY "451 4.3.0 Rate limits are unavailable, try again later"

/* The rule's counters for one decision: one increment (two when near) in the calling
 * thread's shard. */
static void count_verdict(const struct policy_rule *r, const struct store_item *it)
{
	unsigned k = thread_shard();
	struct rule_shard *sh = &r->shards[k];
	enum policy_action v = it->ok ? POLICY_ACCEPT : r->action;
	counter_add(&sh->verdicts[v], k, 1);
	if (!it->ok || !it->limits)
		return;
	for (unsigned j = 0; j < it->limits->n && j < RATE_MAX_WINDOWS; j++) {
		/* used * 5 > burst * 4, i.e. above 80%; huge bursts compared by division */
		uint64_t b = it->limits->w[j].burst, u = it->used[j];
		if (b <= UINT64_MAX / 5 && u <= UINT64_MAX / 5 ? u * 5 > b * 4 : u / 4 > b / 5) {
			counter_add(&sh->near_limit, k, 1);
			return;
		}
	}
}

void policy_rule_counters(const struct policy_rule *r, uint64_t ret_verdicts[POLICY_ACTION_COUNT],
			  uint64_t *ret_near)
{
	uint64_t near = 0;
	for (unsigned i = 0; i < POLICY_ACTION_COUNT; i++)
		ret_verdicts[i] = 0;
	for (unsigned k = 0; k < THREAD_SHARDS; k++) {
		const struct rule_shard *sh = &r->shards[k];
		for (unsigned i = 0; i < POLICY_ACTION_COUNT; i++)
			ret_verdicts[i] += atomic_load_explicit(&sh->verdicts[i], memory_order_relaxed);
		near += atomic_load_explicit(&sh->near_limit, memory_order_relaxed);
	}
	*ret_near = near;
}

/* The store's answer rc for w's n items into d (and msg's ledger, tags, quarantine). */
static void finish(enum policy_stage st, struct policy_msg *msg, enum store_mode mode,
		   struct policy_decision *d, const struct work *w, size_t n, int rc)
{
	if (rc == STORE_TEMPFAIL) {
		/* the store is away and configured to refuse for the time being */
		d->action = POLICY_TEMPFAIL;
		d->store_error = rc;
		fmt_fixed(d->reply, sizeof(d->reply), "%s", TEMPFAIL_REPLY);
		return;
	}
	if (rc < 0) {
		/* fail open: a store that cannot answer must not stop the mail */
		d->store_error = rc;
		return;
	}
	size_t decider = SIZE_MAX;
	for (size_t i = 0; i < n; i++) {
		struct store_item *it = &w->items[i];
		const struct policy_rule *r = w->rules[i];
		struct policy_rule_result *res = w->res[i];
		if (mode == STORE_CHECK)
			count_verdict(r, it);
		if (res) {
			res->state = it->ok ? POLICY_RULE_PASS : POLICY_RULE_OVER;
			memcpy(res->used, it->used, sizeof(res->used));
			res->retry_ns = it->retry_ns;
			res->charged = it->charged;
			res->known = it->known;
			res->blocked = it->blocked;
		}
		/* a distinct value stays counted (store.h): no refund */
		if (it->charged && msg && st >= POLICY_MAIL && mode == STORE_CHECK &&
		    r->count != POLICY_COUNT_DISTINCT)
			ledger_add(msg, it, r, st);
		if (it->ok)
			continue;
		if (d->nover < POLICY_MAX_OVER) {
			struct policy_over *o = &d->over[d->nover++];
			o->rule = r;
			text_sanitize(o->key, sizeof(o->key), it->key, POLICY_LOG_KEY - 3, TEXT_MARK_CUT);
			unsigned wi = binding_window(it, o->limit, sizeof(o->limit));
			o->count = it->used[wi];
			o->retry_s = ns_to_s_up(it->retry_ns);
		}
		if (decider == SIZE_MAX || r->action > w->rules[decider]->action)
			decider = i;
		if (r->action == POLICY_DELAY && r->delay_ms > d->delay_ms)
			d->delay_ms = r->delay_ms;
		/* a refused event (a recipient refused at RCPT) is no part of the message: it
		 * must not tag or quarantine what the accepted recipients get */
		if (mode != STORE_CHECK || !msg || rc == 0)
			continue;
		if ((r->action == POLICY_TAG || r->action == POLICY_QUARANTINE) && !msg->marks)
			msg->marks = calloc(1, sizeof(*msg->marks));
		/* XXX without memory for the marks, the message goes untagged and is not
		 * quarantined; the rule's verdict stands. */
		if (r->action == POLICY_TAG && msg->marks && msg->ntags < POLICY_MAX_TAGS) {
			char key[120], tag[POLICY_TAG_MAX];
			text_sanitize(key, sizeof(key), it->key, 100, TEXT_MARK_CUT);
			fmt_fixed(tag, sizeof(tag), "rule=%s; key=%s", r->name, key);
			bool seen = false; /* one header per rule and key, not per recipient */
			for (size_t k = 0; k < msg->ntags; k++)
				seen |= strcmp(msg->marks->tags[k], tag) == 0;
			if (!seen)
				fmt_fixed(msg->marks->tags[msg->ntags++], POLICY_TAG_MAX, "%s", tag);
		}
		if (r->action == POLICY_QUARANTINE && msg->marks && !msg->quarantine) {
			char key[120];
			text_sanitize(key, sizeof(key), it->key, 100, TEXT_MARK_CUT);
			msg->quarantine = true;
			fmt_fixed(msg->marks->quarantine_reason, sizeof(msg->marks->quarantine_reason),
				  "sluice limit %s for %s", r->name, key);
		}
	}
	if (decider == SIZE_MAX)
		return;
	struct store_item *it = &w->items[decider];
	const struct policy_rule *r = w->rules[decider];
	if (d->rule && d->action >= r->action)
		return; /* a sessions rule decided already */
	char limit[32];
	binding_window(it, limit, sizeof(limit));
	decide_by(d, r, it->key, limit, ns_to_s_up(it->retry_ns));
}

static struct work scratch_work(struct scratch *s)
{
	s->nasks = 0;
	return (struct work){ s->items, s->rules, s->res, s->keys, s->limits, NULL, &s->nasks };
}

int policy_check(struct policy *p, const struct policy_txn *t, enum policy_stage st,
		 struct policy_msg *msg, enum store_mode mode, uint64_t now,
		 struct policy_decision *d)
{
	decision_reset(d);
	if (p->stage_n[st] == 0)
		return 0;
	struct scratch *s = scratch_get();
	if (!s) {
		d->store_error = -ENOMEM;
		return 0;
	}
	struct work w = scratch_work(s);
	bool sref;
	size_t n = prepare(p, t, st, msg, mode, now, d, &w, &sref);
	int rc = 1;
	if (n) {
		/* refused by a sessions rule: the rates are looked at, and charged nothing */
		enum store_mode m = sref ? STORE_PEEK : mode;
		rc = store_decide(p->store, s->items, n, m, now);
		finish(st, msg, m, d, &w, n, rc);
	}
	sessions_settle(msg, sref || rc == 0 || rc == STORE_TEMPFAIL);
	return 0;
}

/* ---- decisions that wait for the store ---- */

static void check_done(struct store_call *c, int rc)
{
	struct policy_pending *pp = c->arg;
	finish(pp->st, pp->msg, pp->mode, &pp->d, &pp->w, pp->n, rc);
	sessions_settle(pp->msg, pp->sess_refused || rc == 0 || rc == STORE_TEMPFAIL);
	pp->done(pp->arg, &pp->d);
	free(pp);
}

/* The shared store's answer to a sessions slot: kept, or the rule is over. */
static void ask_answer(struct sess_ask *a, int rc)
{
	struct policy_pending *pp = a->pp;
	a->call.req = NULL;
	if (rc == STORE_TEMPFAIL) {
		/* no answer, and on_failure = tempfail: the store's refusal, not the rule's */
		sessions_unreserve(pp->msg, a->key_hash);
		pp->d.store_error = STORE_TEMPFAIL;
		if (pp->d.action < POLICY_TEMPFAIL) {
			pp->d.action = POLICY_TEMPFAIL;
			pp->d.rule = NULL;
			fmt_fixed(pp->d.reply, sizeof(pp->d.reply), "%s", TEMPFAIL_REPLY);
		}
		pp->sess_refused = true;
		pp->mode = pp->call.mode = STORE_PEEK;
		pp->asks_waiting--;
		return;
	}
	count_sessions_verdict(a->r, rc == 1);
	if (rc == 1 && a->call.fallback) {
		/* on_failure let it in: this node counts it, Redis holds nothing to release */
	} else if (rc == 1) {
		sessions_granted(pp->msg, pp->p->store, a->key_hash);
	} else {
		sessions_unreserve(pp->msg, a->key_hash);
		if (a->res) {
			a->res->state = POLICY_RULE_OVER;
			a->res->charged = false;
		}
		sessions_over(&pp->d, a->r, str_cstr(a->key), a->r->max_sessions);
		if (a->r->action >= POLICY_DISCARD) {
			/* refused: the rates are looked at, and charged nothing */
			pp->sess_refused = true;
			pp->mode = pp->call.mode = STORE_PEEK;
		}
	}
	pp->asks_waiting--;
}

/* Every slot is answered: the rates, then the caller (from a callback of the store). */
static void rates_later(struct policy_pending *pp)
{
	int rc = 1;
	if (pp->n) {
		rc = store_decide_start(pp->p->store, &pp->call);
		if (rc == STORE_PENDING)
			return; /* check_done() goes on */
		finish(pp->st, pp->msg, pp->mode, &pp->d, &pp->w, pp->n, rc);
	}
	sessions_settle(pp->msg, pp->sess_refused || rc == 0 || rc == STORE_TEMPFAIL);
	pp->done(pp->arg, &pp->d);
	free(pp);
}

static void ask_done(struct store_slot_call *c, int rc)
{
	struct sess_ask *a = c->arg;
	struct policy_pending *pp = a->pp;
	ask_answer(a, rc);
	if (pp->asks_waiting == 0 && !pp->in_start)
		rates_later(pp);
}

int policy_check_start(struct policy *p, const struct policy_txn *t, enum policy_stage st,
		       struct policy_msg *msg, enum store_mode mode, uint64_t now,
		       struct policy_decision *d, policy_done_fn *done, void *arg,
		       struct policy_pending **ret)
{
	*ret = NULL;
	if (!p->store->ops->decide_start || p->stage_n[st] == 0)
		return policy_check(p, t, st, msg, mode, now, d);
	decision_reset(d);
	struct scratch *s = scratch_get();
	if (!s) {
		d->store_error = -ENOMEM;
		return 0;
	}
	struct work sw = scratch_work(s);
	if (store_is_shared(p->store) && mode == STORE_CHECK)
		sw.asks = s->asks;
	bool sref;
	size_t n = prepare(p, t, st, msg, mode, now, d, &sw, &sref);
	size_t nasks = s->nasks;
	if (n == 0 && nasks == 0) {
		sessions_settle(msg, sref);
		return 0;
	}
	/* one block: the call, then its items, rules, results, limits and keys */
	size_t keys = 0;
	for (size_t i = 0; i < n; i++)
		keys += s->items[i].key.len + 1;
	size_t size = sizeof(struct policy_pending) + n * (sizeof(struct store_item) +
		sizeof(struct policy_rule *) + sizeof(struct policy_rule_result *) +
		sizeof(struct rate_limits)) + keys;
	struct policy_pending *pp = malloc(size);
	if (!pp) {
		d->store_error = -ENOMEM;
		/* the slots this node reserved for the store to decide go back: a node never
		 * holds what the store did not grant */
		for (size_t i = 0; i < nasks; i++)
			sessions_unreserve(msg, s->asks[i].key_hash);
		sessions_settle(msg, sref);
		return 0;
	}
	/* the call's own decision starts empty but for the caller's results (a decision is
	 * kilobytes: neither cleared nor copied whole on this path) */
	memset(pp, 0, offsetof(struct policy_pending, d));
	decision_reset(&pp->d);
	pp->d.results = d->results;
	pp->d.max_results = d->max_results;
	pp->d.nresults = d->nresults;
	if (d->rule || d->nover) {
		/* what the sessions rules decided already */
		pp->d.action = d->action;
		pp->d.rule = d->rule;
		pp->d.retry_s = d->retry_s;
		pp->d.delay_ms = d->delay_ms;
		memcpy(pp->d.key, d->key, sizeof(d->key));
		memcpy(pp->d.reply, d->reply, sizeof(d->reply));
		pp->d.nover = d->nover;
		memcpy(pp->d.over, d->over, d->nover * sizeof(d->over[0]));
	}
	memset(&pp->w, 0, sizeof(*pp) - offsetof(struct policy_pending, w));
	unsigned char *q = (unsigned char *)(pp + 1);
	pp->w.items = (struct store_item *)q;
	q += n * sizeof(struct store_item);
	pp->w.limits = (struct rate_limits *)q;
	q += n * sizeof(struct rate_limits);
	pp->w.rules = (const struct policy_rule **)q;
	q += n * sizeof(struct policy_rule *);
	pp->w.res = (struct policy_rule_result **)q;
	q += n * sizeof(struct policy_rule_result *);
	char *kp = (char *)q;
	for (size_t i = 0; i < n; i++) {
		pp->w.items[i] = s->items[i];
		pp->w.limits[i] = s->limits[i];
		pp->w.items[i].limits = &pp->w.limits[i];
		memcpy(kp, s->items[i].key.ptr, s->items[i].key.len);
		kp[s->items[i].key.len] = '\0';
		pp->w.items[i].key = str_make(kp, s->items[i].key.len);
		kp += s->items[i].key.len + 1;
		pp->w.rules[i] = s->rules[i];
		pp->w.res[i] = s->res[i];
	}
	pp->kind = PENDING_CHECK;
	pp->p = p;
	pp->n = n;
	pp->st = st;
	pp->msg = msg;
	pp->mode = sref ? STORE_PEEK : mode;
	pp->sess_refused = sref;
	pp->done = done;
	pp->arg = arg;
	pp->call.items = pp->w.items;
	pp->call.n = n;
	pp->call.mode = pp->mode;
	pp->call.now = now;
	pp->call.done = check_done;
	pp->call.arg = pp;
	if (nasks) {
		/* the shared store's word on each sessions slot comes first */
		memcpy(pp->asks, s->asks, nasks * sizeof(pp->asks[0]));
		pp->nasks = pp->asks_waiting = nasks;
		pp->in_start = true;
		for (size_t i = 0; i < nasks; i++) {
			struct sess_ask *a = &pp->asks[i];
			a->pp = pp;
			a->call.cls = a->cls;
			a->call.cap = a->r->max_sessions;
			a->call.done = ask_done;
			a->call.arg = a;
			int rc = store_slot_enter(p->store, &a->call);
			if (rc != STORE_PENDING)
				ask_answer(a, rc == 1 || rc == STORE_TEMPFAIL ? rc : 0);
		}
		pp->in_start = false;
		if (pp->asks_waiting) {
			*ret = pp;
			return 1;
		}
	}
	int rc = 1;
	if (n) {
		rc = store_decide_start(p->store, &pp->call);
		if (rc == STORE_PENDING) {
			*ret = pp;
			return 1;
		}
		/* answered at once (on_failure) */
		finish(st, msg, pp->mode, &pp->d, &pp->w, n, rc);
	}
	sessions_settle(msg, pp->sess_refused || rc == 0 || rc == STORE_TEMPFAIL);
	*d = pp->d; /* results and all: d->results is pp->d.results */
	free(pp);
	return 0;
}

void policy_pending_cancel(struct policy_pending *pp)
{
	if (!pp)
		return;
	if (pp->kind == PENDING_CHECK) {
		for (size_t i = 0; i < pp->nasks; i++)
			if (pp->asks[i].call.req)
				store_slot_cancel(pp->p->store, &pp->asks[i].call);
		store_call_cancel(pp->p->store, &pp->call);
		sessions_settle(pp->msg, true);
	} else {
		store_slot_cancel(pp->p->store, &pp->slot_call);
		/* the reservation goes back here; if Redis granted it meanwhile, this node's
		 * next lease renewal sets its count right */
		class_slot_release(pp->slot);
	}
	free(pp);
}

/* " name=VALUE" (or name="VALUE", name=<VALUE>) with the peer's bytes quoted; nothing for
 * an empty value.  A value within <> loses the brackets it came with. */
struct line {
	char *buf;
	size_t len, used;
};

/* Appends; a line that does not fit is cut (the buffer always ends with a NUL). */
static void line_printf(struct line *l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void line_printf(struct line *l, const char *fmt, ...)
{
	if (l->used + 1 >= l->len)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(l->buf + l->used, l->len - l->used, fmt, ap);
	va_end(ap);
	if (n > 0)
		l->used = (size_t)n < l->len - l->used ? l->used + (size_t)n : l->len - 1;
}

static void put_field(struct line *m, const char *name, struct str v, char open, char close)
{
	if (!v.ptr || v.len == 0)
		return;
	if (open == '<' && v.len >= 2 && v.ptr[0] == '<' && v.ptr[v.len - 1] == '>')
		v = str_make(v.ptr + 1, v.len - 2); /* "<>", the null sender, stays from=<> */
	char q[POLICY_LOG_FIELD * 4 + 8];
	log_quote(q, sizeof(q), v, POLICY_LOG_FIELD);
	if (!open && strchr(q, ' '))
		open = close = '"'; /* a value with a space is quoted all the same */
	if (open)
		line_printf(m, " %s=%c%s%c", name, open, q, close);
	else
		line_printf(m, " %s=%s", name, q);
}

void policy_decision_log(const struct policy_decision *d, enum policy_stage st,
			 const struct policy_log_ctx *ctx,
			 void (*emit)(void *arg, enum log_level level, const char *line), void *arg)
{
	for (size_t i = 0; i < d->nover; i++) {
		char line[1024];
		enum log_level level = policy_decision_line(d, i, st, ctx, line, sizeof(line));
		emit(arg, level, line);
	}
}

enum log_level policy_decision_line(const struct policy_decision *d, size_t i,
				    enum policy_stage st, const struct policy_log_ctx *ctx,
				    char *buf, size_t len)
{
	const struct policy_over *o = &d->over[i];
	enum policy_action a = o->rule->action;
	/* a refusing rule that did not decide (a stricter one did) says so */
	bool aside = o->rule != d->rule && a != POLICY_WARN && a != POLICY_TAG;
	struct line m = { buf, len, 0 };
	if (len)
		buf[0] = '\0';
	line_printf(&m, "%s rule=%s action=%s key=\"%s\" count=%llu limit=%s stage=%s retry=%llus",
		   aside ? "over" : "decision", o->rule->name, policy_action_name(a), o->key,
		   (unsigned long long)o->count, o->limit, policy_stage_name(st),
		   (unsigned long long)o->retry_s);
	if (ctx) {
		put_field(&m, "client", ctx->client, 0, 0);
		put_field(&m, "helo", ctx->helo, '"', '"');
		put_field(&m, "from", ctx->from, '<', '>');
		put_field(&m, "rcpt", ctx->rcpt, '<', '>');
		put_field(&m, "qid", ctx->qid, 0, 0);
	}
	return a == POLICY_WARN ? LOG_LEVEL_WARNING : LOG_LEVEL_NOTICE;
}

size_t policy_counters(const struct policy *p, struct policy_rule_counters *ret, size_t max)
{
	size_t n = p->nrules < max ? p->nrules : max;
	for (size_t i = 0; i < n; i++) {
		const struct policy_rule *r = &p->rules[i];
		uint64_t v[POLICY_ACTION_COUNT], near, over = 0;
		policy_rule_counters(r, v, &near);
		for (unsigned a = 0; a < POLICY_ACTION_COUNT; a++)
			if (a != POLICY_ACCEPT)
				over += v[a];
		ret[i] = (struct policy_rule_counters){
			.name = r->name,
			.stage = r->stage,
			.action = r->action,
			.passed = v[POLICY_ACCEPT],
			.over = over,
		};
	}
	return n;
}
