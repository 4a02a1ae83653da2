/*
 * htab -- an intrusive chained hash table: the entries hold a struct htab_node, the table
 * holds none of their memory.
 *
 * The caller hashes its key with htab_hash() (XXH64 keyed with a secret of the table,
 * drawn at its first hash, so that keys a peer chooses, such as its domains, cannot be
 * aimed at one bucket) and compares keys itself.  A node keeps its hash, so growing needs
 * no key: the buckets are a power of two that doubles with the entries (load <= 1), and
 * finding, adding and removing an entry cost O(1) on average (law 8).
 */
#ifndef SLUICE_HTAB_H
#define SLUICE_HTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct htab_node {
	struct htab_node *next;
	uint64_t hash;
};

struct htab {
	struct htab_node **b;
	size_t size, n;     /* buckets (0 before the first insert), entries */
	size_t min_size;    /* the first allocation's buckets, a power of two (0: 64) */
	uint64_t seed;
};

/* The entry that holds node as its member. */
#define HTAB_ENTRY(node, type, member) ((type *)(void *)((char *)(node) - offsetof(type, member)))

/* The hash of len bytes of key in t (drawing t's secret if it has none yet). */
uint64_t htab_hash(struct htab *t, const void *key, size_t len);

/* The first node of the chain where hash lives (NULL if none); follow ->next and compare
 * ->hash before the key:
 *   for (struct htab_node *n = htab_chain(t, h); n; n = n->next)
 *           if (n->hash == h && same(HTAB_ENTRY(n, struct x, node), key)) ...  */
static inline struct htab_node *htab_chain(const struct htab *t, uint64_t hash)
{
	return t->size ? t->b[hash & (t->size - 1)] : NULL;
}

/* Adds node under hash (the table grows first if it must).  0, or -ENOMEM with the table
 * and node unchanged. */
int htab_add(struct htab *t, struct htab_node *node, uint64_t hash);

/* Takes node out of t; a node not in t is left alone. */
void htab_remove(struct htab *t, struct htab_node *node);

/* Takes out every node for which drop(node, arg) returns true, walking the whole table;
 * drop may free the node, and must not otherwise touch the table.  For sweeps and teardown, never per
 * event. */
void htab_drop_if(struct htab *t, bool (*drop)(struct htab_node *node, void *arg), void *arg);

/* Frees the buckets (not the entries: empty the table first, or own them elsewhere). */
void htab_clear(struct htab *t);

#endif
