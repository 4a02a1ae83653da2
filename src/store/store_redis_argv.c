/*
 * store_redis_argv -- a command's arguments for the Redis store (store_redis_int.h).
 *
 * A command is built into one struct argv_buf: one allocation holding the argument
 * pointers, their lengths and their text back to back (argv_add_bytes() points at bytes
 * that outlive the command instead: constants, the scripts), sized by its builder before
 * it starts, and freed by argv_clear() (an inline of store_redis_int.h, so that the link
 * frees a request's command without calling up).  Every argv_add*() checks the room left
 * and fails with -ENOBUFS instead of growing.  argv_script_head() starts a script's call
 * by its SHA1 (EVALSHA), or by its text (EVAL).
 *
 * The keys of a lane and of a class are named here too (argv_add_named_key()), with the
 * hash tag that puts one script's keys in one slot of a cluster; a decision's keys are
 * named by store_redis_decide.c.
 *
 * Calls nothing of the store but the scripts' table of the link (store_redis_link.c) and
 * redis_key_slot() (store_redis_addr.c).  Runs on any thread, on the buffer it is given.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_redis_int.h"
#include "util.h"

/* One allocation for the pointers, the lengths and the text: a command makes one. */
int argv_init(struct argv_buf *a, size_t cap, size_t text)
{
	size_t ptrs = cap * (sizeof(*a->argv) + sizeof(*a->len));
	void *block = malloc(ptrs + text);
	if (!block)
		return -ENOMEM;
	a->argv = block;
	a->len = (size_t *)(a->argv + cap);
	a->text = (char *)block + ptrs;
	a->n = a->used = 0;
	a->cap = cap;
	a->size = text;
	return 0;
}

/* Room for n more bytes of text and one more argument, or NULL. */
char *argv_room(struct argv_buf *a, size_t n)
{
	if (a->n == a->cap || a->size - a->used < n + 1)
		return NULL;
	return a->text + a->used;
}

int argv_commit(struct argv_buf *a, size_t n)
{
	a->argv[a->n] = a->text + a->used;
	a->len[a->n] = n;
	a->text[a->used + n] = '\0';
	a->n++;
	a->used += n + 1;
	return 0;
}

int argv_add_cstr(struct argv_buf *a, const char *v)
{
	size_t n = strlen(v);
	char *p = argv_room(a, n);
	if (!p)
		return -ENOBUFS;
	memcpy(p, v, n);
	return argv_commit(a, n);
}

/* A decimal number (every script argument but a few is one): no printf on this path. */
int argv_add_u64(struct argv_buf *a, uint64_t v)
{
	char tmp[20];
	size_t n = 0;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	char *p = argv_room(a, n);
	if (!p)
		return -ENOBUFS;
	for (size_t i = 0; i < n; i++)
		p[i] = tmp[n - 1 - i];
	return argv_commit(a, n);
}

int argv_add(struct argv_buf *a, const char *fmt, ...)
{
	if (a->n == a->cap)
		return -ENOBUFS;
	va_list ap;
	va_start(ap, fmt);
	int w = vsnprintf(a->text + a->used, a->size - a->used, fmt, ap);
	va_end(ap);
	if (w < 0 || (size_t)w >= a->size - a->used)
		return -ENOBUFS;
	a->argv[a->n] = a->text + a->used;
	a->len[a->n] = (size_t)w;
	a->n++;
	a->used += (size_t)w + 1;
	return 0;
}

int argv_add_bytes(struct argv_buf *a, const char *p, size_t n)
{
	if (a->n == a->cap)
		return -ENOBUFS;
	a->argv[a->n] = p;
	a->len[a->n] = n;
	a->n++;
	return 0;
}

int argv_script_head(struct argv_buf *a, enum script_id sc, bool eval, uint64_t nkeys)
{
	if (!eval) {
		argv_add_bytes(a, "EVALSHA", 7);
		argv_add_bytes(a, redis_scripts[sc].sha1, 40);
	} else {
		argv_add_bytes(a, "EVAL", 4);
		argv_add_bytes(a, redis_scripts[sc].text, redis_scripts[sc].len);
	}
	return argv_add_u64(a, nkeys);
}

/* A lane's or a class's key: PREFIX KIND NAME, or PREFIX KIND "{" NAME "}" on a cluster
 * (its slot comes from the name alone).  The slot in *ret_slot. */
int argv_add_named_key(struct argv_buf *a, const struct rstore *st, const char *kind,
		       const char *name, const char *suffix, uint16_t *ret_slot)
{
	*ret_slot = st->cluster ? redis_key_slot(name, strlen(name)) : 0;
	if (st->cluster)
		return argv_add(a, "%s%s{%s}%s", st->prefix, kind, name, suffix);
	return argv_add(a, "%s%s%s%s", st->prefix, kind, name, suffix);
}
