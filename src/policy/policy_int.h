/*
 * policy_int -- the rooms of the policy module and what they share.
 *
 *   policy_conf.c  a limit block's keys as a table, read by the schema walker, the
 *                  writer of limit and class blocks (sluiced -n and -D), and the names
 *                  of stages, actions and counts (policy_rule.c calls it, never the
 *                  other way)
 *   policy_rule.c  a rule set assembled from its limit and class blocks, its accessors
 *   policy_overrides.c  the overrides files' tables (read by workers inside an ebr
 *                  section, swapped and retired by the main thread, see there)
 *   sessions.c     the counters of sessions rules (one registry, across rule sets)
 *   policy.c       decisions: a stage's rules into one store batch, the verdict, the
 *                  message's ledger and refunds, the log lines
 *   policy_class.c host classes: the class a host falls in, its slots taken (in this
 *                  node's counters, or under the shared store's lease) and given back
 *
 * A struct policy is immutable once loaded (but for the overrides tables, swapped
 * atomically, and the counters): any thread may read it while it holds a reference.
 */
#ifndef SLUICE_POLICY_INT_H
#define SLUICE_POLICY_INT_H

#include <stdatomic.h>
#include <sys/stat.h>

#include "cfg_schema.h"
#include "class.h"
#include "policy.h"

#define POLICY_MAX_RULES 256
#define POLICY_MAX_EXCEPT 32
#define POLICY_MAX_SESSIONS_RULES 4 /* at one stage: one store round trip asks them all */
#define REPLY_TEMPLATE_MAX 400

struct policy_except {
	struct selector sel;
	struct mask_list *masks;
	char **values;           /* the masks as written, NULL-terminated (to write them back) */
};

struct policy_rule {
	char *name;
	struct str name_str;
	enum policy_stage stage;
	char *key_spec;
	struct selector sel[SELECTOR_MAX];
	size_t nsel;
	size_t alt[SELECTOR_MAX + 1];  /* a chain of keys: alternative i is sel[alt[i]..alt[i+1]) */
	size_t nalt;
	enum policy_count count;
	struct selector of;      /* distinct: the values counted */
	unsigned max_sessions;   /* sessions: at once per key */
	uint64_t block_ns;       /* a refused key stays refused this long (0: no block) */
	uint64_t delay_ms;       /* action delay: how long the answer waits */
	struct rate_limits limits;
	uint64_t burst;          /* while loading: burst = N, for the windows without one */
	enum policy_action action;
	char *reply;             /* template; NULL for actions without a reply */
	bool count_rejected;
	struct policy_except ex[POLICY_MAX_EXCEPT];
	size_t nex;
	struct policy_except only[POLICY_MAX_EXCEPT]; /* the rule applies where all match */
	size_t nonly;
	/* overrides: the table in use, swapped by policy_reload_overrides(), read inside an
	 * ebr section only (see policy_overrides.c) */
	char *ov_path;
	_Atomic(struct rate_overrides *) ov;
	struct stat ov_st;
	struct rule_shard *shards;   /* THREAD_SHARDS of them: the metrics' counters */
};

/* A rule's decisions (STORE_CHECK only), counted by one thread (mostly), read by the
 * metrics: [POLICY_ACCEPT] within its limits, else [its action] when over them.  64
 * bytes used of 128, so that shards never share a cache line however calloc aligns. */
struct rule_shard {
	_Atomic uint64_t verdicts[POLICY_ACTION_COUNT];
	_Atomic uint64_t near_limit; /* within, but a window above 80% of its burst */
	char pad[128 - (POLICY_ACTION_COUNT + 1) * sizeof(uint64_t)];
};

struct policy {
	_Atomic unsigned refs;
	struct policy_rule *rules;
	size_t nrules;
	size_t *stage_rules[POLICY_STAGE_COUNT];
	size_t stage_n[POLICY_STAGE_COUNT];
	struct policy_class *classes;
	size_t nclasses;
	struct store *store;
	struct policy_needs needs;
};

/* policy_conf.c: reading one limit block into r (zeroed; rule_clear() frees it either
 * way) with policy_limit_keys.  0 or -errno with err. */
int policy_conf_rule_load(struct cfg_node *n, struct policy_rule *r, char *err, size_t errlen);
void policy_except_clear(struct policy_except *e);

/* The selectors of a rule's key, with its alternatives. */
static inline struct selector_set rule_selectors(const struct policy_rule *r)
{
	return (struct selector_set){ r->sel, r->nsel, r->alt, r->nalt };
}

/* policy_overrides.c: read r->ov_path into r->ov at load (0 or -errno with err), and
 * free the rule's tables. */
int policy_overrides_load(struct policy_rule *r, char *err, size_t errlen);
void policy_overrides_clear(struct policy_rule *r);

/*
 * A sessions rule's slot asked of the shared store (Redis): this node's registry holds
 * it already (so the node never holds more than it tells), and the decision waits for
 * the store's answer before its rates are decided.  Named "s:" and the (rule, key) hash
 * in hex: a class of the store's leases of its own.
 */
#define POLICY_MAX_ASKS POLICY_MAX_SESSIONS_RULES
struct sess_ask {
	struct store_slot_call call;
	struct policy_pending *pp;
	const struct policy_rule *r;
	struct policy_rule_result *res;
	uint64_t key_hash;
	char cls[POLICY_SESSIONS_KEY];
	char key[POLICY_LOG_KEY + 1];
};

/* The arrays of one decision (a thread's scratch, or a pending decision's own). */
struct work {
	struct store_item *items;
	const struct policy_rule **rules;
	struct policy_rule_result **res;
	char (*keys)[SELECTOR_MAX_KEY + 1];
	struct rate_limits *limits;
	struct sess_ask *asks;   /* NULL: sessions are decided by this node alone */
	size_t *nasks;
};

/* A decision or a class slot that waits for the store's answer (policy.c decides, and
 * policy_class.c takes slots; policy_pending_cancel() ends either). */
enum pending_kind { PENDING_CHECK = 0, PENDING_SLOT };

struct policy_pending {
	enum pending_kind kind;
	struct policy *p;
	void *arg;
	/* PENDING_CHECK */
	struct store_call call;
	enum policy_stage st;
	struct policy_msg *msg;
	enum store_mode mode;
	policy_done_fn *done;
	struct policy_decision d;
	struct work w;
	size_t n;
	bool sess_refused;   /* a sessions rule refused the event already */
	struct sess_ask asks[POLICY_MAX_ASKS];
	size_t nasks, asks_waiting;
	bool in_start;       /* policy_check_start() is still asking */
	/* PENDING_SLOT */
	struct store_slot_call slot_call;
	struct class_slot *slot;
	struct class_slot **ret_slot;
	policy_slot_done_fn *slot_done;
};

#endif
