/*
 * class -- host classes and their slot counters (see class.h).
 */
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cfg_schema.h"
#include "class.h"
#include "log.h"
#include "util.h"

struct class_counter {
	char name[64];
	_Atomic unsigned used;
	_Atomic unsigned peak;
	_Atomic uint64_t entered;
	_Atomic uint64_t refused;
	unsigned refs;                /* under registry_lock */
	struct class_counter *next;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct class_counter *registry;

static struct class_counter *counter_get(const char *name)
{
	pthread_mutex_lock(&registry_lock);
	struct class_counter *c;
	for (c = registry; c; c = c->next)
		if (strcmp(c->name, name) == 0)
			break;
	if (!c) {
		c = calloc(1, sizeof(*c));
		if (c) {
			fmt_fixed(c->name, sizeof(c->name), "%s", name);
			c->next = registry;
			registry = c;
		}
	}
	if (c)
		c->refs++;
	pthread_mutex_unlock(&registry_lock);
	return c;
}

static void counter_put(struct class_counter *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&registry_lock);
	if (--c->refs == 0) {
		ASSERT(atomic_load(&c->used) == 0);
		for (struct class_counter **pp = &registry; *pp; pp = &(*pp)->next)
			if (*pp == c) {
				*pp = c->next;
				break;
			}
		free(c);
	}
	pthread_mutex_unlock(&registry_lock);
}

/* hosts: masks, kept as written too (to write them back) */
static int host_add(void *arg, const struct cfg_node *h, const char *text, char *err,
		    size_t el)
{
	struct policy_class *c = arg;
	char why[200];
	int r = mask_list_add(c->hosts, str_cstr(text), why, sizeof(why));
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		cfg_error(h, err, el, "%s", why);
		return r;
	}
	size_t n = 0;
	while (c->host_texts && c->host_texts[n])
		n++;
	char **t = realloc(c->host_texts, (n + 2) * sizeof(*t));
	if (!t)
		return -ENOMEM;
	c->host_texts = t;
	if (!(t[n] = strdup(text)))
		return -ENOMEM;
	t[n + 1] = NULL;
	return 0;
}

static int hosts_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
		       char *err, size_t el)
{
	(void)k;
	struct policy_class *c = (struct policy_class *)(void *)((char *)field -
								 offsetof(struct policy_class, hosts));
	if (!c->hosts && !(c->hosts = mask_list_new(MASK_HOSTS)))
		return -ENOMEM;
	int r = cfg_items_each(n, host_add, c, err, el);
	if (r == 0 && mask_list_count(c->hosts) == 0) {
		cfg_error(n, err, el, "an empty hosts list matches nothing");
		r = -EINVAL;
	}
	return r;
}

static bool hosts_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	const struct policy_class *c = (const struct policy_class *)(const void *)(
		(const char *)field - offsetof(struct policy_class, hosts));
	return cfg_type_list.format(k, &c->host_texts, buf, size);
}

static const struct cfg_type type_hosts = { "list", hosts_parse, hosts_format, NULL };

#define CLASS(field) offsetof(struct policy_class, field)

/* In the order they were always checked: sessions, inbound, then each host.  Required:
 * class_load() names a missing one first, in its own words. */
const struct cfg_key policy_class_keys[] = {
	{ "sessions", &cfg_type_uint, CLASS(sessions), NULL, 0, 1000000, .flags = CFG_REQUIRED,
	  .help = "sessions at once, incoming and outgoing" },
	{ "inbound", &cfg_type_uint, CLASS(inbound), NULL, 0, 1000000, .flags = CFG_REQUIRED,
	  .help = "incoming sessions are refused at this count" },
	{ "hosts", &type_hosts, CLASS(hosts), NULL, .flags = CFG_REQUIRED,
	  .help = "the class's hosts: names, *.domain, addresses, CIDR, or *" },
	{ .name = NULL },
};

int class_load(struct cfg_node *n, struct policy_class *ret, char *err, size_t errlen)
{
	struct policy_class c;
	memset(&c, 0, sizeof(c));
	if (!n->label || !*n->label || strlen(n->label) >= 64 || n->kind != CFG_OBJECT) {
		cfg_error(n, err, errlen, "expected class \"NAME\" { ... } with a name of 1-63 "
			  "bytes");
		return -EINVAL;
	}
	for (const char *p = n->label; *p; p++)
		if ((unsigned char)*p <= ' ' || *p == 0x7f) {
			cfg_error(n, err, errlen, "a class name has no spaces or control characters");
			return -EINVAL;
		}
	static const char *const required[] = { "hosts", "sessions", "inbound" };
	for (size_t i = 0; i < ARRAY_SIZE(required); i++)
		if (!cfg_get(n, required[i])) {
			cfg_error(n, err, errlen, "missing '%s'", required[i]);
			return -EINVAL;
		}
	int r = (c.name = strdup(n->label)) ? 0 : -ENOMEM;
	if (r == 0)
		r = cfg_schema_load(n, policy_class_keys, &c, err, errlen);
	if (r == -ENOMEM)
		fmt_fixed(err, errlen, "out of memory");
	if (r < 0) {
		class_clear(&c);
		return -EINVAL;
	}
	*ret = c;
	return 0;
}

void class_clear(struct policy_class *c)
{
	free(c->name);
	mask_list_free(c->hosts);
	cfg_type_list.clear(&c->host_texts);
	counter_put(c->ctr);
	memset(c, 0, sizeof(*c));
}

/* Not at parse time: a configuration that fails to load never touches live counters. */
int class_attach(struct policy_class *c)
{
	c->ctr = counter_get(c->name);
	return c->ctr ? 0 : -ENOMEM;
}

static void note_entered(struct class_counter *k, unsigned used)
{
	atomic_fetch_add(&k->entered, 1);
	unsigned peak = atomic_load(&k->peak);
	while (used > peak && !atomic_compare_exchange_weak(&k->peak, &peak, used))
		;
}

static int enter_below(struct policy_class *c, unsigned cap, bool count_refusal,
		       struct class_slot **ret)
{
	struct class_counter *k = c->ctr;
	unsigned used = atomic_load(&k->used);
	do {
		if (used >= cap) {
			if (count_refusal)
				atomic_fetch_add(&k->refused, 1);
			return 0;
		}
	} while (!atomic_compare_exchange_weak(&k->used, &used, used + 1));
	note_entered(k, used + 1);
	pthread_mutex_lock(&registry_lock);
	k->refs++; /* the slot keeps the counter alive across reloads */
	pthread_mutex_unlock(&registry_lock);
	*ret = (struct class_slot *)k;
	return 1;
}

int class_enter_inbound(struct policy_class *c, struct class_slot **ret)
{
	return enter_below(c, c->inbound, true, ret);
}

int class_enter_outbound(struct policy_class *c, struct class_slot **ret)
{
	/* the relay asks again until a slot is free: a wait, not a refusal of a client */
	return enter_below(c, c->sessions, false, ret);
}

unsigned class_reserve(struct policy_class *c, struct class_slot **ret)
{
	struct class_counter *k = c->ctr;
	unsigned used = atomic_fetch_add(&k->used, 1) + 1;
	pthread_mutex_lock(&registry_lock);
	k->refs++;
	pthread_mutex_unlock(&registry_lock);
	*ret = (struct class_slot *)k;
	return used;
}

void class_slot_granted(struct class_slot *s)
{
	struct class_counter *k = (struct class_counter *)s;
	note_entered(k, atomic_load(&k->used));
}

void class_slot_refused(struct class_slot *s)
{
	struct class_counter *k = (struct class_counter *)s;
	atomic_fetch_add(&k->refused, 1);
	class_slot_release(s);
}

size_t class_registry_counts(char (*names)[64], unsigned *counts, size_t max)
{
	size_t n = 0;
	pthread_mutex_lock(&registry_lock);
	for (struct class_counter *c = registry; c && n < max; c = c->next, n++) {
		memcpy(names[n], c->name, sizeof(c->name));
		counts[n] = atomic_load(&c->used);
	}
	pthread_mutex_unlock(&registry_lock);
	return n;
}

void class_slot_release(struct class_slot *s)
{
	if (!s)
		return;
	struct class_counter *k = (struct class_counter *)s;
	unsigned prev = atomic_fetch_sub(&k->used, 1);
	ASSERT(prev > 0);
	counter_put(k);
}

const char *class_slot_name(const struct class_slot *s)
{
	return s ? ((const struct class_counter *)s)->name : "";
}

void class_stats_get(const struct policy_class *c, struct class_stats *ret)
{
	memset(ret, 0, sizeof(*ret));
	fmt_fixed(ret->name, sizeof(ret->name), "%s", c->name);
	ret->sessions = c->sessions;
	ret->inbound = c->inbound;
	if (c->ctr) {
		ret->used = atomic_load(&c->ctr->used);
		ret->peak = atomic_load(&c->ctr->peak);
		ret->entered = atomic_load(&c->ctr->entered);
		ret->refused = atomic_load(&c->ctr->refused);
	}
}
