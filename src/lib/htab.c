/*
 * htab -- an intrusive chained hash table (see htab.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <xxhash.h>

#include "htab.h"

uint64_t htab_hash(struct htab *t, const void *key, size_t len)
{
	if (!t->seed)
		while (!t->seed)
			arc4random_buf(&t->seed, sizeof(t->seed));
	return XXH64(key, len, t->seed);
}

static int grow(struct htab *t)
{
	size_t ns = t->size ? t->size * 2 : (t->min_size ? t->min_size : 64);
	struct htab_node **nb = calloc(ns, sizeof(*nb));
	if (!nb)
		return -ENOMEM;
	for (size_t i = 0; i < t->size; i++)
		for (struct htab_node *e = t->b[i], *next; e; e = next) {
			next = e->next;
			size_t k = e->hash & (ns - 1);
			e->next = nb[k];
			nb[k] = e;
		}
	free(t->b);
	t->b = nb;
	t->size = ns;
	return 0;
}

int htab_add(struct htab *t, struct htab_node *node, uint64_t hash)
{
	if (t->n + 1 > t->size) {
		int rc = grow(t);
		if (rc < 0)
			return rc;
	}
	size_t k = hash & (t->size - 1);
	node->hash = hash;
	node->next = t->b[k];
	t->b[k] = node;
	t->n++;
	return 0;
}

void htab_remove(struct htab *t, struct htab_node *node)
{
	if (!t->size)
		return;
	for (struct htab_node **pp = &t->b[node->hash & (t->size - 1)]; *pp; pp = &(*pp)->next)
		if (*pp == node) {
			*pp = node->next;
			node->next = NULL;
			t->n--;
			return;
		}
}

void htab_drop_if(struct htab *t, bool (*drop)(struct htab_node *node, void *arg), void *arg)
{
	for (size_t i = 0; i < t->size; i++)
		for (struct htab_node **pp = &t->b[i]; *pp;) {
			struct htab_node *e = *pp, *next = e->next;
			if (drop(e, arg)) {
				*pp = next; /* the slot is in the bucket array or a kept node */
				t->n--;
			} else {
				pp = &e->next;
			}
		}
}

void htab_clear(struct htab *t)
{
	free(t->b);
	t->b = NULL;
	t->size = t->n = 0;
}
