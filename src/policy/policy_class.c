/*
 * policy_class -- the host classes of a rule set: which class a host falls in, and its
 * slots taken and given back, in this node's counters or, for a class shared through the
 * store, under its lease (see policy.h and policy_int.h).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "policy_int.h"

/* The class a host falls in: the first that matches, or NULL. */
static struct policy_class *class_find(const struct policy *p, const struct ipaddr *ip,
				       struct str name)
{
	for (size_t i = 0; i < p->nclasses; i++)
		if (mask_list_match_host(p->classes[i].hosts, ip, name))
			return &p->classes[i];
	return NULL;
}

int policy_class_enter(struct policy *p, const struct ipaddr *ip, struct str name,
		       struct class_slot **ret, const char **ret_class)
{
	struct policy_class *c = class_find(p, ip, name);
	if (!c) {
		*ret = NULL;
		return 1;
	}
	*ret_class = c->name;
	return class_enter_inbound(c, ret);
}

int policy_class_enter_outbound(struct policy *p, const struct ipaddr *ip, struct str name,
				struct class_slot **ret, const char **ret_class)
{
	struct policy_class *c = class_find(p, ip, name);
	if (!c) {
		*ret = NULL;
		return 1;
	}
	*ret_class = c->name;
	return class_enter_outbound(c, ret);
}

static void slot_done(struct store_slot_call *sc, int rc)
{
	struct policy_pending *pp = sc->arg;
	if (rc == 1) {
		class_slot_granted(pp->slot);
		*pp->ret_slot = pp->slot;
	} else {
		class_slot_refused(pp->slot);
		rc = 0;
	}
	pp->slot_done(pp->arg, rc);
	free(pp);
}

/* Ask the shared store for a slot of c under cap (reserved here first: this node never
 * holds more than it tells the others).  As policy_class_enter_start() returns. */
static int class_enter_shared(struct policy *p, struct policy_class *c, unsigned cap,
			      struct class_slot **ret_slot, policy_slot_done_fn *done, void *arg,
			      struct policy_pending **ret)
{
	struct policy_pending *pp = calloc(1, sizeof(*pp));
	if (!pp)
		return -ENOMEM;
	pp->kind = PENDING_SLOT;
	pp->p = p;
	pp->arg = arg;
	pp->ret_slot = ret_slot;
	pp->slot_done = done;
	pp->slot_call.local_used = class_reserve(c, &pp->slot);
	pp->slot_call.cls = c->name;
	pp->slot_call.cap = cap;
	pp->slot_call.done = slot_done;
	pp->slot_call.arg = pp;
	int rc = store_slot_enter(p->store, &pp->slot_call);
	if (rc == STORE_PENDING) {
		*ret = pp;
		return 2;
	}
	if (rc == 1) {
		class_slot_granted(pp->slot);
		*ret_slot = pp->slot;
	} else {
		class_slot_refused(pp->slot);
	}
	free(pp);
	return rc == 1;
}

/* A slot through the shared store when there is one: inbound (cap `inbound`) or
 * outbound (cap `sessions`); without it, this node's counters decide. */
static int class_enter_any(struct policy *p, const struct ipaddr *ip, struct str name,
			   bool outbound, struct class_slot **ret_slot, const char **ret_class,
			   policy_slot_done_fn *done, void *arg, struct policy_pending **ret)
{
	int (*local)(struct policy *, const struct ipaddr *, struct str, struct class_slot **,
		     const char **) = outbound ? policy_class_enter_outbound : policy_class_enter;
	*ret = NULL;
	if (!store_is_shared(p->store))
		return local(p, ip, name, ret_slot, ret_class);
	struct policy_class *c = class_find(p, ip, name);
	*ret_slot = NULL;
	if (!c)
		return 1;
	*ret_class = c->name;
	int rc = class_enter_shared(p, c, outbound ? c->sessions : c->inbound, ret_slot, done,
				    arg, ret);
	return rc == -ENOMEM ? local(p, ip, name, ret_slot, ret_class) : rc;
}

int policy_class_enter_start(struct policy *p, const struct ipaddr *ip, struct str name,
			     struct class_slot **ret_slot, const char **ret_class,
			     policy_slot_done_fn *done, void *arg, struct policy_pending **ret)
{
	return class_enter_any(p, ip, name, false, ret_slot, ret_class, done, arg, ret);
}

int policy_class_enter_outbound_start(struct policy *p, const struct ipaddr *ip, struct str name,
				      struct class_slot **ret_slot, const char **ret_class,
				      policy_slot_done_fn *done, void *arg,
				      struct policy_pending **ret)
{
	return class_enter_any(p, ip, name, true, ret_slot, ret_class, done, arg, ret);
}

void policy_class_release(struct policy *p, struct class_slot *s)
{
	if (!s)
		return;
	if (store_is_shared(p->store))
		store_slot_release(p->store, class_slot_name(s));
	class_slot_release(s);
}

const char *policy_class_match(const struct policy *p, const struct ipaddr *ip, struct str name)
{
	const struct policy_class *c = class_find(p, ip, name);
	return c ? c->name : NULL;
}

size_t policy_class_stats(const struct policy *p, struct class_stats *ret, size_t max)
{
	size_t n = p->nclasses < max ? p->nclasses : max;
	for (size_t i = 0; i < n; i++)
		class_stats_get(&p->classes[i], &ret[i]);
	return n;
}
