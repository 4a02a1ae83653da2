/*
 * test_htab -- lib/htab against a naive model: random adds, removes, finds and sweeps
 * over a small key space (so chains collide and buckets double many times), with the
 * table checked after each step to hold exactly the model's entries, each once, in the
 * bucket its hash names; then the edge cases (removing what is not in, a table never
 * used, a forced collision chain).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "htab.h"

#define KEYS 3000

struct ent {
	int key;
	bool in;
	struct htab_node node;
};

static struct ent ents[KEYS];

static uint64_t hash_of(struct htab *t, int key)
{
	return htab_hash(t, &key, sizeof(key));
}

static struct ent *find(struct htab *t, int key)
{
	uint64_t h = hash_of(t, key);
	for (struct htab_node *n = htab_chain(t, h); n; n = n->next) {
		struct ent *e = HTAB_ENTRY(n, struct ent, node);
		if (n->hash == h && e->key == key)
			return e;
	}
	return NULL;
}

/* The table holds exactly the entries marked in, each once, each in its bucket. */
static void check(struct htab *t)
{
	size_t seen = 0, in = 0;
	for (int k = 0; k < KEYS; k++)
		in += ents[k].in;
	assert_int_equal(t->n, in);
	assert_true(t->n <= t->size || t->size == 0);
	for (size_t i = 0; i < t->size; i++)
		for (struct htab_node *n = t->b[i]; n; n = n->next) {
			struct ent *e = HTAB_ENTRY(n, struct ent, node);
			assert_true(e->in);
			assert_int_equal(n->hash & (t->size - 1), i);
			seen++;
		}
	assert_int_equal(seen, in);
}

static bool drop_odd(struct htab_node *n, void *arg)
{
	struct ent *e = HTAB_ENTRY(n, struct ent, node);
	(*(size_t *)arg)++;
	if (e->key % 2 == 0)
		return false;
	e->in = false;
	return true;
}

static void test_against_model(void **state)
{
	(void)state;
	struct htab t = { 0 };
	uint64_t x = 88172645463325252u;
	for (int k = 0; k < KEYS; k++)
		ents[k] = (struct ent){ .key = k };
	for (int step = 0; step < 60000; step++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		int k = (int)(x % KEYS);
		struct ent *e = &ents[k];
		switch ((x >> 32) % 3) {
		case 0:
			if (!e->in) {
				assert_int_equal(htab_add(&t, &e->node, hash_of(&t, k)), 0);
				e->in = true;
			}
			break;
		case 1:
			htab_remove(&t, &e->node); /* whether it is in or not */
			e->in = false;
			break;
		default:
			assert_ptr_equal(find(&t, k), e->in ? e : NULL);
			break;
		}
		if (step % 997 == 0)
			check(&t);
	}
	check(&t);
	size_t before = t.n, visited = 0;
	htab_drop_if(&t, drop_odd, &visited);
	assert_int_equal(visited, before);
	check(&t);
	for (int k = 0; k < KEYS; k++)
		assert_ptr_equal(find(&t, k), ents[k].in ? &ents[k] : NULL);
	htab_clear(&t);
	assert_int_equal(t.size, 0);
	assert_null(htab_chain(&t, 42));
}

static void test_edges(void **state)
{
	(void)state;
	struct htab t = { .min_size = 4 };
	struct ent a = { .key = 1 }, b = { .key = 2 }, c = { .key = 3 };
	htab_remove(&t, &a.node); /* a table never used */
	assert_null(htab_chain(&t, 0));
	/* one hash for all three: a chain of three, removed from its middle and end */
	assert_int_equal(htab_add(&t, &a.node, 7), 0);
	assert_int_equal(t.size, 4);
	assert_int_equal(htab_add(&t, &b.node, 7), 0);
	assert_int_equal(htab_add(&t, &c.node, 7), 0);
	htab_remove(&t, &b.node);
	assert_int_equal(t.n, 2);
	htab_remove(&t, &b.node); /* twice: nothing */
	assert_int_equal(t.n, 2);
	int n = 0;
	for (struct htab_node *p = htab_chain(&t, 7); p; p = p->next)
		n++;
	assert_int_equal(n, 2);
	htab_remove(&t, &a.node);
	htab_remove(&t, &c.node);
	assert_int_equal(t.n, 0);
	assert_null(htab_chain(&t, 7));
	/* the secret is drawn once, and keys hash the same under it */
	uint64_t h1 = htab_hash(&t, "x", 1), h2 = htab_hash(&t, "x", 1);
	assert_true(t.seed != 0);
	assert_true(h1 == h2);
	struct htab u = { 0 };
	assert_true(htab_hash(&u, "x", 1) != h1 || u.seed == t.seed);
	htab_clear(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_against_model),
		cmocka_unit_test(test_edges),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
