/*
 * class -- host classes (Sendmail's XLA): concurrency per class of hosts.
 *
 * A class's counter lives apart from the rule set that names it, in a registry keyed by
 * the class name, so a reload that keeps a class keeps its count, and a session that took
 * a slot under an old rule set gives it back to the same counter.  Counters are atomics:
 * workers take and release slots without a lock.
 */
#ifndef SLUICE_CLASS_H
#define SLUICE_CLASS_H

#include <stdbool.h>
#include <stddef.h>

#include "cfg.h"
#include "mask.h"
#include "policy.h"

struct class_counter;

struct policy_class {
	char *name;
	struct mask_list *hosts;
	char **host_texts;  /* hosts as written, NULL-terminated (to write them back) */
	unsigned sessions;  /* incoming + outgoing */
	unsigned inbound;   /* incoming sessions are refused at this count */
	struct class_counter *ctr;
};

/* The keys of class "name" { } (cfg_schema.h), over a struct policy_class. */
extern const struct cfg_key policy_class_keys[];
/* Load `class "name" { hosts; sessions; inbound; }`.  0 or -EINVAL with err. */
int class_load(struct cfg_node *n, struct policy_class *ret, char *err, size_t errlen);
void class_clear(struct policy_class *c);
/* Attach the class to its live counter (by name), once the rule set is complete. */
int class_attach(struct policy_class *c);
/* Take an incoming slot: 1 (*ret set), or 0 when the class is at inbound. */
int class_enter_inbound(struct policy_class *c, struct class_slot **ret);
/* Take an outgoing slot: 1 (*ret set), or 0 when the class is at sessions (incoming and
 * outgoing together), on this node (a shared store: policy_class_enter_outbound_start()). */
int class_enter_outbound(struct policy_class *c, struct class_slot **ret);
/* Take a slot whatever the count (the shared store decides); returns the count with it. */
unsigned class_reserve(struct policy_class *c, struct class_slot **ret);
/* A reserved slot the shared store granted (counted as entered, peak updated). */
void class_slot_granted(struct class_slot *s);
/* A reserved slot the shared store refused: given back, counted as refused. */
void class_slot_refused(struct class_slot *s);
void class_stats_get(const struct policy_class *c, struct class_stats *ret);

#endif
