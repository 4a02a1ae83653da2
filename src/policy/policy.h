/*
 * policy -- the rule set: rate limits keyed by any SMTP attribute, and host classes.
 *
 * One compiled, immutable rule set (struct policy) answers both the milter sessions and
 * the Postfix policy service.  A reload builds a new one; sessions keep the one they
 * started with (reference counted), so rules never change under a running transaction.
 *
 * A decision (policy_check) runs every rule of one stage against a transaction:
 *   - a rule applies unless an `except` entry matches or a selector of its key has no
 *     value;
 *   - its limits are the key's run-time limit (sluice limits set, kept in the store), or
 *     else its line in the overrides file, or else the rule's windows;
 *   - all applying rules are decided in one atomic store batch: the strictest failing
 *     action wins (reject > tempfail > discard > quarantine > tag > warn), and a refused
 *     event is charged by no rule (unless a rule says count_rejected);
 *   - what was charged is written to the transaction's ledger (struct policy_msg), so a
 *     message refused later or aborted by the client gives its charges back.
 * Nothing here does I/O or logs; the callers log one line per refusing, tagging or warning
 * decision.
 */
#ifndef SLUICE_POLICY_H
#define SLUICE_POLICY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "buf.h"
#include "cfg_schema.h"
#include "cfg.h"
#include "ipaddr.h"
#include "log.h"
#include "rate.h"
#include "selector.h"
#include "store.h"
#include "str.h"

enum policy_stage {
	POLICY_CONNECT = 0,
	POLICY_HELO,
	POLICY_MAIL,
	POLICY_RCPT,
	POLICY_DATA, /* milter: end of headers; Postfix: DATA */
	POLICY_EOM,
	POLICY_STAGE_COUNT,
};

/* In increasing strictness: the largest failing one wins (a delay is also kept apart:
 * the event waits the longest delay of the rules over their limits unless refused). */
enum policy_action {
	POLICY_ACCEPT = 0,
	POLICY_WARN,
	POLICY_DELAY,     /* the answer waits the rule's delay, then the event passes */
	POLICY_TAG,
	POLICY_QUARANTINE,
	POLICY_DISCARD,
	POLICY_TEMPFAIL,
	POLICY_REJECT,
	POLICY_ACTION_COUNT,
};

enum policy_count {
	POLICY_COUNT_CONNECTIONS = 0,
	POLICY_COUNT_MESSAGES,
	POLICY_COUNT_RECIPIENTS,
	POLICY_COUNT_BYTES,
	POLICY_COUNT_SESSIONS,  /* SMTP sessions at once per key (the milter only) */
	POLICY_COUNT_DISTINCT,  /* distinct values of a selector per key in a window */
};

const char *policy_stage_name(enum policy_stage s);
const char *policy_action_name(enum policy_action a);
const char *policy_count_name(enum policy_count c);

#define POLICY_REPLY_MAX 512
#define POLICY_MAX_TAGS 8
#define POLICY_TAG_MAX 192   /* "rule=NAME; key=KEY" with the key cut to 100 bytes */
#define POLICY_LEDGER_MAX 1024 /* charges remembered per message for refunds */

struct policy;
struct policy_rule;

/*
 * Load every `limit` and `class` block of a parsed configuration (marking the nodes
 * used).  0 and *ret, or -EINVAL/-ENOMEM with err "FILE:LINE: KEY: message".  An empty
 * rule set (no limit, no class) is valid.
 */
int policy_load(struct cfg_node *root, struct policy **ret, char *err, size_t errlen);
/* The keys of limit "NAME" { } (cfg_schema.h; policy_conf.c), over the rule set's private
 * struct policy_rule: for the manual's tests; read them with policy_load(). */
extern const struct cfg_key policy_limit_keys[];
/* Write p's class and limit blocks in sluice.conf syntax (sluiced -n and -D): every key
 * (all), or what differs from the defaults.  What is written loads into the same rules. */
void policy_print(FILE *f, const struct policy *p, bool all);
struct policy *policy_ref(struct policy *p);
void policy_unref(struct policy *p);
/* The store decisions go to (set by the daemon before the policy is used). */
void policy_set_store(struct policy *p, struct store *s);
struct store *policy_store(const struct policy *p);
/* Does any rule run at this stage?  Is there any class?  (Milter negotiation.) */
bool policy_has_stage(const struct policy *p, enum policy_stage s);
bool policy_has_classes(const struct policy *p);
size_t policy_rule_count(const struct policy *p);

#define POLICY_MAX_NAMES 256

/* Names read by header: or macro: selectors, each once (the strings live in the policy). */
struct policy_names {
	const char *v[POLICY_MAX_NAMES];
	size_t n;
};

/* What the rules read and do, computed at load: what the milter asks the MTA for. */
struct policy_needs {
	bool client;          /* a key or except list reads client_ip or client_name */
	bool helo;            /* ... the HELO name */
	bool sender;          /* ... the sender or the SASL user (MAIL and its macros) */
	bool mail_size;       /* a bytes rule before eom reads MAIL's SIZE= */
	bool eom_bytes;       /* an eom rule counts bytes: headers and body are measured */
	bool message_actions; /* tag or quarantine rules */
	struct policy_names headers; /* header: names (case-insensitive) */
	struct policy_names macros;  /* macro: names, as written ("{auth_authen}" style) */
};

const struct policy_needs *policy_needs(const struct policy *p);
/*
 * Reload overrides files that changed on disk (checked by mtime, size and inode).
 * Returns how many were reloaded; a file that fails to parse keeps its old table and its
 * error is written to err (one line per file).
 */
int policy_reload_overrides(struct policy *p, struct buf *err);

/* One charge kept for refunds. */
struct policy_charge {
	uint64_t key_hash;
	uint64_t cost;
	const struct policy_rule *rule;
	struct rate_limits limits;
	uint8_t scope;  /* enum policy_stage of the event that charged it */
};

#define POLICY_MAX_HELD 32 /* slots of sessions rules one SMTP session holds at most */

/* The slots of sessions rules an SMTP session holds (see policy_msg_track_sessions()). */
struct policy_sessions {
	size_t n;
	uint64_t key_hash[POLICY_MAX_HELD];
	bool provisional[POLICY_MAX_HELD]; /* taken by the decision in progress */
	bool shared[POLICY_MAX_HELD];      /* granted by the shared store too */
	struct store *store;               /* where shared slots were granted */
};

/* Per-transaction state, owned by the session (zero it to start; policy_msg_clear()). */
struct policy_msg {
	struct policy_charge *charges;
	size_t n, cap;
	bool overflow;  /* more than POLICY_LEDGER_MAX: later charges are not refundable */
	/* tags and quarantine to apply at the end of the message; their texts are
	 * allocated when the first is set, as few messages have any (1.7 KiB a session) */
	size_t ntags;
	bool quarantine;
	struct policy_marks *marks;
	/* NULL unless the caller tracks sessions (the milter): only then do sessions rules
	 * apply, as only then is the end of a session known */
	struct policy_sessions *sessions;
};

struct policy_marks {
	char tags[POLICY_MAX_TAGS][POLICY_TAG_MAX];
	char quarantine_reason[POLICY_TAG_MAX];
};

/* Frees the ledger and gives back the session's slots (policy_sessions_end()). */
void policy_msg_clear(struct policy_msg *m);
/* The caller will tell when the SMTP session ends (policy_sessions_end(), or
 * policy_msg_clear()): sessions rules apply to it.  0 or -ENOMEM. */
int policy_msg_track_sessions(struct policy_msg *m);
/* The SMTP session ended, or a new one begins on the same connection: every slot of a
 * sessions rule it holds goes back.  Any message state is left as it is. */
void policy_sessions_end(struct policy_msg *m);

/* One rule's part in a decision, for logs and `sluice test`. */
enum policy_rule_state {
	POLICY_RULE_PASS = 0,      /* applied, within its limits */
	POLICY_RULE_OVER,          /* applied, over its limits: its action is taken */
	POLICY_RULE_NO_VALUE,      /* a selector had no value */
	POLICY_RULE_EXCEPT,        /* an except entry matched */
	POLICY_RULE_UNLIMITED,     /* the key's run-time limit or override is 0 */
	POLICY_RULE_COUNTED,       /* messages: this message was already counted */
	POLICY_RULE_OUT_OF_SCOPE,  /* an only entry did not match */
	POLICY_RULE_NOT_HERE,      /* sessions: the policy service cannot count them */
	POLICY_RULE_HELD,          /* sessions: this session holds the key's slot already */
};

struct policy_rule_result {
	const struct policy_rule *rule;
	enum policy_rule_state state;
	char key[SELECTOR_MAX_KEY + 1];
	char why[128];            /* NO_VALUE / EXCEPT / OUT_OF_SCOPE: which selector or entry */
	char via[80];             /* a chain of keys: the alternative that gave the key */
	bool known;               /* distinct: the value was counted in every window already */
	bool blocked;             /* over because a block is running (retry_ns: its end) */
	unsigned sessions;        /* sessions: held after the decision (this node's count) */
	struct rate_limits limits;
	bool overridden;
	bool runtime;             /* the limits (or unlimited) are a run-time limit's */
	uint64_t runtime_until;   /* its end (CLOCK_REALTIME ns), 0: until unset */
	uint64_t cost;
	uint64_t used[RATE_MAX_WINDOWS]; /* after the decision */
	uint64_t retry_ns;
	bool charged;
};

#define POLICY_MAX_OVER 8
#define POLICY_LOG_KEY 200

/* A rule over its limits in this decision (whatever its action), for the log line. */
struct policy_over {
	const struct policy_rule *rule;
	char key[POLICY_LOG_KEY + 1];  /* cut for logs */
	char limit[32];                /* the window that bound, "10/1m" */
	uint64_t count;                /* its count after the decision */
	uint64_t retry_s;
};

struct policy_decision {
	enum policy_action action;         /* the strictest failing action, or ACCEPT */
	size_t nover;
	struct policy_over over[POLICY_MAX_OVER];
	const struct policy_rule *rule;    /* the rule that set it */
	char key[SELECTOR_MAX_KEY + 1];
	uint64_t retry_s;                  /* exact, rounded up to the second */
	uint64_t delay_ms;                 /* the longest delay of the delay rules over their
					    * limits (0: none); kept when another rule refuses */
	char reply[POLICY_REPLY_MAX];      /* tempfail/reject: "451 4.7.1 ..." (expanded) */
	/* every rule that ran, when the caller asks for them (explain, logs) */
	struct policy_rule_result *results;
	size_t nresults, max_results;
	int store_error;                   /* <0 when the store failed (the event passes) */
};

/*
 * Decide one event at stage st.  msg may be NULL (no refunds, no per-message counting).
 * mode STORE_PEEK changes nothing anywhere (explain).  d->results, if set by the caller
 * with max_results, receives one entry per rule of the stage.  Returns 0.
 */
int policy_check(struct policy *p, const struct policy_txn *t, enum policy_stage st,
		 struct policy_msg *msg, enum store_mode mode, uint64_t now,
		 struct policy_decision *d);
/*
 * As policy_check(), when the store may answer later (Redis).  Returns 0 when d is
 * complete now; or 1 when the answer is pending: *ret is set, and done(arg, dd) runs later
 * on this thread's event loop, with dd a decision owned by the call (valid during the
 * callback only) that carries d's results and max_results.  msg, and d->results, must
 * stay valid until then; policy_pending_cancel(*ret) withdraws the call instead.
 */
struct policy_pending;
typedef void policy_done_fn(void *arg, struct policy_decision *dd);
int policy_check_start(struct policy *p, const struct policy_txn *t, enum policy_stage st,
		       struct policy_msg *msg, enum store_mode mode, uint64_t now,
		       struct policy_decision *d, policy_done_fn *done, void *arg,
		       struct policy_pending **ret);
/* Withdraw a pending decision or class entry: its callback will not run.  NULL is fine. */
void policy_pending_cancel(struct policy_pending *pp);

/* What a decision's log line says of the transaction; empty slices are left out. */
struct policy_log_ctx {
	struct str client, helo, from, rcpt, qid;
};
#define POLICY_LOG_FIELD 100 /* peer bytes kept per field */
/*
 * The log line of d->over[i]:
 *   decision rule=R action=A key="K" count=N limit=N/W stage=S retry=Ns client=IP
 *            helo="H" from=<F> rcpt=<T> qid=Q
 * ("over ..." instead of "decision" for a refusing rule that a stricter one overruled), with
 * the peer's strings quoted and cut (log_quote).  Returns the level to log it at: warning
 * for warn rules, notice otherwise.
 */
enum log_level policy_decision_line(const struct policy_decision *d, size_t i,
				    enum policy_stage st, const struct policy_log_ctx *ctx,
				    char *buf, size_t len);
/* Every line of policy_decision_line() for d, handed to emit() with its level: the
 * milter and the policy service log them on their session. */
void policy_decision_log(const struct policy_decision *d, enum policy_stage st,
			 const struct policy_log_ctx *ctx,
			 void (*emit)(void *arg, enum log_level level, const char *line), void *arg);
/*
 * The message ended.  delivered = false (aborted, refused at DATA or EOM): every
 * refundable charge of the message goes back to the store.  The ledger is cleared either
 * way, tags and quarantine included.
 */
void policy_msg_end(struct policy *p, struct policy_msg *m, bool delivered, uint64_t now);

const char *policy_rule_name(const struct policy_rule *r);
enum policy_action policy_rule_action(const struct policy_rule *r);
enum policy_stage policy_rule_stage(const struct policy_rule *r);
enum policy_count policy_rule_count_kind(const struct policy_rule *r);
const char *policy_rule_key_spec(const struct policy_rule *r);
unsigned policy_rule_max_sessions(const struct policy_rule *r);   /* sessions rules */
uint64_t policy_rule_block_ns(const struct policy_rule *r);       /* 0: no block */
uint64_t policy_rule_delay_ms(const struct policy_rule *r);       /* action delay's; else 0 */
/* A sessions rule's slots held now for a key (this node's). */
unsigned policy_rule_sessions_held(const struct policy *p, const struct policy_rule *r,
				   struct str key);
const struct policy_rule *policy_rule_at(const struct policy *p, size_t i);
/*
 * The rule's decisions since its rule set was loaded (a reload starts from zero): how
 * many times it was within its limits ([POLICY_ACCEPT]) or over them ([its action]), and
 * of the former how many left a window above 80% of its burst.  Charging decisions only
 * (not `sluice test`); any thread.
 */
void policy_rule_counters(const struct policy_rule *r, uint64_t ret_verdicts[POLICY_ACTION_COUNT],
			  uint64_t *ret_near);
const struct policy_rule *policy_rule_find(const struct policy *p, const char *name);
/* The limits that apply to a key (its override or the rule's), copied: 1 and *ret, or 0
 * when the key's override is 0 (unlimited; *ret untouched).  *ret_overridden (if not
 * NULL) says whether the overrides file names the key.  Any thread. */
int policy_rule_limits(const struct policy_rule *r, struct str key, struct rate_limits *ret,
		       bool *ret_overridden);
uint64_t policy_rule_key_hash(const struct policy *p, const struct policy_rule *r,
			      struct str key);
/* The keys of the rule's overrides file (0 without one), and its path (NULL without one). */
size_t policy_rule_overrides_count(const struct policy_rule *r, const char **ret_path);
/* Normalize a key written by an operator (`sluice limits show`) for this rule. */
int policy_rule_normalize_key(const struct policy_rule *r, struct str key, char *out);

/* ---- host classes (XLA) ---- */
struct class_slot;

/*
 * An incoming session from ip (NULL if unknown) and verified name (empty if none): find
 * its class (first match) and take a slot.  Returns 1 with *ret (NULL when there are no
 * classes), 0 when the class is at `inbound` (*ret_class names it; refuse with 421).
 * A slot must be released exactly once with class_slot_release().
 */
int policy_class_enter(struct policy *p, const struct ipaddr *ip, struct str name,
		       struct class_slot **ret, const char **ret_class);
void class_slot_release(struct class_slot *s);
/*
 * An outgoing session (the relay) to the host name/ip: take a slot in its class if the
 * class has fewer than `sessions` (incoming plus outgoing).  1 with *ret (NULL without
 * classes), or 0 when the class is full (*ret_class names it): the mail waits.
 */
int policy_class_enter_outbound(struct policy *p, const struct ipaddr *ip, struct str name,
				struct class_slot **ret, const char **ret_class);
/*
 * As policy_class_enter(), asking the shared store when there is one (the class's
 * inbound limit then counts every node's sessions).  Returns 1 or 0 as policy_class_enter
 * does, or 2 when pending: *ret is set and done(arg, rc) runs later with rc 1 (*ret_slot
 * set) or 0 (full).  ret_slot must stay valid until then.
 */
typedef void policy_slot_done_fn(void *arg, int rc);
int policy_class_enter_start(struct policy *p, const struct ipaddr *ip, struct str name,
			     struct class_slot **ret_slot, const char **ret_class,
			     policy_slot_done_fn *done, void *arg, struct policy_pending **ret);
/*
 * An outgoing session's slot (as policy_class_enter_outbound()), asking the shared store
 * when there is one: the class's `sessions` then counts the incoming and outgoing
 * sessions of every node.  Returns as policy_class_enter_start().
 */
int policy_class_enter_outbound_start(struct policy *p, const struct ipaddr *ip, struct str name,
				      struct class_slot **ret_slot, const char **ret_class,
				      policy_slot_done_fn *done, void *arg,
				      struct policy_pending **ret);
/* Give a slot back, to the shared store too. */
void policy_class_release(struct policy *p, struct class_slot *s);
/* Every class this process knows, with the slots it holds (lease renewals). */
size_t class_registry_counts(char (*names)[64], unsigned *counts, size_t max);
/* The shared store's name for the slots of a sessions rule's (rule, key), whose hash
 * (store_key_hash()) is key_hash: "s:" and the hash, the name the policy takes and gives
 * back, and that the lease renewals renew.  ret_name holds POLICY_SESSIONS_KEY bytes. */
#define POLICY_SESSIONS_KEY 24
void policy_sessions_key(uint64_t key_hash, char *ret_name);
/* The class a host falls in (first match), without taking a slot; NULL without classes. */
const char *policy_class_match(const struct policy *p, const struct ipaddr *ip, struct str name);
const char *class_slot_name(const struct class_slot *s);

struct class_stats {
	char name[64];
	unsigned used, peak, sessions, inbound;
	uint64_t entered, refused;
};
/*
 * What each rule of this rule set decided since it was loaded (a reload starts at zero):
 * checks within the limit, and checks over it (the rule's action, unless a stricter rule
 * decided).  Peeks (`sluice test`) do not count.  Names live as long as p.
 */
struct policy_rule_counters {
	const char *name;
	enum policy_stage stage;
	enum policy_action action;
	uint64_t passed, over;
};
size_t policy_counters(const struct policy *p, struct policy_rule_counters *ret, size_t max);

/* The classes of this rule set with their live counters. */
size_t policy_class_stats(const struct policy *p, struct class_stats *ret, size_t max);

#endif
