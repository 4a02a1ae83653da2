/*
 * forgetdisk -- a test disk that forgets what was not flushed (a FUSE file system)
 *
 * The power-cut tests (tests/func/test_powercut.py) put sluiced's queue and state
 * directory on it.  It holds everything in its own memory and keeps, for every file,
 * the content a flush made durable apart from the content written since, and for every
 * directory the names a flush made durable apart from the creates, renames, links and
 * unlinks made since:
 *
 *   fsync, fdatasync of a file     its data becomes durable (not its names)
 *   fsync of a directory           its names become durable (not the files' data)
 *   syncfs                         everything becomes durable; the kernel does not pass
 *                                  syncfs(2) to a FUSE daemon, so syncfs_bridge.so (an
 *                                  LD_PRELOAD of the test) tells the disk with a setxattr
 *                                  of "user.forget.syncfs" on the same descriptor
 *
 * A rename is two changes, the name leaving one directory and arriving in another, each
 * made durable by a flush of its own directory: the weakest model POSIX allows, and the
 * one a program that flushes the right directories survives.
 *
 * "Losing power" (a setxattr on the root, below) kills the process under test with
 * SIGKILL on the spot, before the request that triggered it is answered, and turns the
 * disk off: every later request fails with EIO, so nothing that happens after the cut
 * changes what is on the disk.  "Restoring power" then throws away every change that
 * was not flushed -- or, as a real disk may write back some pages and names it was never
 * asked to, keeps each of them with a probability, page by page and name by name, in an
 * order drawn from a seed (the model of ALICE, OSDI 2014) -- and turns the disk on; the
 * test then unmounts it, which drops the kernel's caches, and the disk mounts itself
 * again at the same place.
 *
 * Commands, as extended attributes of the mount's root (setfattr, os.setxattr):
 *
 *   user.forget.victim = "PID"       the process the cut kills (sluiced)
 *   user.forget.cut = "now"          lose power now
 *   user.forget.cut = "flush N"      lose power at the N-th flush from now (fsync,
 *                                    fdatasync, directory fsync, syncfs), before it is done;
 *   user.forget.cut = "flush N after"  ... or just after it is done; "off" cancels
 *   user.forget.restore = "SEED P"   power back: keep each unflushed change with
 *                                    probability P (0 forgets them all), drawn from SEED
 *   user.forget.fail = "OP ERRNO COUNT [SKIP]"  the next COUNT OP requests after SKIP
 *                                    more fail with ERRNO (a number or EIO, ENOSPC, EDQUOT,
 *                                    EROFS): OP is write, fsync, fsyncdir, syncfs, rename,
 *                                    create, link, unlink; "off" ends every failure
 *   user.forget.stats (getxattr)     "state=on|off flushes=N writes=N cuts=N failed=N"
 *
 * Inode numbers are never reused; every attribute and name times out at once, so the
 * kernel asks again after a cut.  Single-threaded: the requests of all of sluiced's
 * threads are served one at a time, in the order they arrive.
 */

#define FUSE_USE_VERSION 35
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "forgetdisk: out of memory\n");
		abort();
	}
	return p;
}

static void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p) {
		fprintf(stderr, "forgetdisk: out of memory\n");
		abort();
	}
	return p;
}

static char *xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	return memcpy(xmalloc(n), s, n);
}

/* ---- bytes ---- */

struct bytes {
	char *p;
	size_t len, cap;
};

static void bytes_reserve(struct bytes *b, size_t n)
{
	if (n <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < n)
		cap *= 2;
	b->p = xrealloc(b->p, cap);
	b->cap = cap;
}

static void bytes_write(struct bytes *b, const char *data, size_t len, size_t off)
{
	bytes_reserve(b, off + len);
	if (off > b->len)
		memset(b->p + b->len, 0, off - b->len);
	memcpy(b->p + off, data, len);
	if (off + len > b->len)
		b->len = off + len;
}

static void bytes_truncate(struct bytes *b, size_t len)
{
	bytes_reserve(b, len);
	if (len > b->len)
		memset(b->p + b->len, 0, len - b->len);
	b->len = len;
}

static void bytes_copy(struct bytes *dst, const struct bytes *src)
{
	bytes_reserve(dst, src->len);
	if (src->len)
		memcpy(dst->p, src->p, src->len);
	dst->len = src->len;
}

/* ---- inodes, names ---- */

struct inode;

struct entry {
	struct entry *next;
	char *name;
	struct inode *ino;
};

/* a directory's names: a chained hash table */
struct names {
	struct entry **bucket;
	size_t nbucket, count;
};

/* A change not yet flushed, in the list of the inode it changes: a piece of a write (at
 * most one page) or a truncation of a file; a name that arrived in (ino != NULL) or left
 * (ino == NULL) a directory; or a rename, one change shared by the lists of the two
 * directories it touches.  seq orders all changes of the disk. */
enum change_kind { CH_DATA = 0, CH_TRUNC, CH_NAME, CH_RENAME };

struct rename {
	struct inode *from_dir, *to_dir, *ino;
	char *from_name, *to_name;
	unsigned lists;  /* lists still holding it: 1 or 2 */
	bool done;       /* applied, or dropped by a restore */
};

struct change {
	struct change *next;
	uint64_t seq;
	enum change_kind kind;
	size_t off, len; /* CH_DATA: where; CH_TRUNC: the new size in len */
	char *data;
	char *name;       /* CH_NAME */
	struct inode *ino;
	struct rename *rn; /* CH_RENAME */
	struct inode *owner; /* whose list holds it */
};

struct inode {
	struct inode *prev, *next; /* every inode */
	uint64_t number;
	mode_t mode;
	struct timespec mtime;
	unsigned nlink;  /* names in current directories (for stat) */
	unsigned refs;   /* names in current or durable directories, and name changes */
	unsigned nopen;  /* open handles */
	struct inode *dead_next;
	bool dead;
	struct bytes cur, dur;
	struct names names, dur_names; /* a directory */
	struct change *pend, **pend_tail;
	size_t npend;
	bool mark;
};

static struct inode *all_inodes;
static struct inode *root;
static uint64_t next_number = 1;

static uint64_t hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* an inode goes when nothing names it -- now, durably, or in a change not yet
 * flushed -- and nothing holds it open; freed at the end of the request (reap), never
 * in the middle of a walk */
static struct inode *dead_list;

static void inode_maybe_dead(struct inode *i)
{
	if (i != root && !i->refs && !i->nopen && !i->dead) {
		i->dead = true;
		i->dead_next = dead_list;
		dead_list = i;
	}
}

static void inode_ref(struct inode *i)
{
	i->refs++;
}

static void inode_unref(struct inode *i)
{
	i->refs--;
	inode_maybe_dead(i);
}

static struct entry **names_slot(struct names *n, const char *name)
{
	if (!n->nbucket)
		return NULL;
	struct entry **e = &n->bucket[hash_name(name) % n->nbucket];
	while (*e && strcmp((*e)->name, name) != 0)
		e = &(*e)->next;
	return e;
}

static struct inode *names_get(struct names *n, const char *name)
{
	struct entry **e = names_slot(n, name);
	return e && *e ? (*e)->ino : NULL;
}

static void names_grow(struct names *n)
{
	size_t nb = n->nbucket ? n->nbucket * 4 : 16;
	struct entry **b = calloc(nb, sizeof(*b));
	if (!b)
		abort();
	for (size_t i = 0; i < n->nbucket; i++) {
		for (struct entry *e = n->bucket[i], *next; e; e = next) {
			next = e->next;
			size_t h = hash_name(e->name) % nb;
			e->next = b[h];
			b[h] = e;
		}
	}
	free(n->bucket);
	n->bucket = b;
	n->nbucket = nb;
}

/* sets name to ino (replacing), or removes it when ino is NULL */
static void names_put(struct names *n, const char *name, struct inode *ino)
{
	if (ino && n->count >= n->nbucket * 2)
		names_grow(n);
	struct entry **e = names_slot(n, name);
	if (e && *e) {
		struct inode *old = (*e)->ino;
		if (ino) {
			inode_ref(ino);
			(*e)->ino = ino;
		} else {
			struct entry *dead = *e;
			*e = dead->next;
			free(dead->name);
			free(dead);
			n->count--;
		}
		inode_unref(old);
		return;
	}
	if (!ino)
		return;
	inode_ref(ino);
	struct entry *ne = xmalloc(sizeof(*ne));
	ne->name = xstrdup(name);
	ne->ino = ino;
	ne->next = NULL;
	*e = ne;
	n->count++;
}

static void names_clear(struct names *n)
{
	for (size_t i = 0; i < n->nbucket; i++) {
		for (struct entry *e = n->bucket[i], *next; e; e = next) {
			next = e->next;
			inode_unref(e->ino);
			free(e->name);
			free(e);
		}
	}
	free(n->bucket);
	n->bucket = NULL;
	n->nbucket = n->count = 0;
}

static void names_copy(struct names *dst, const struct names *src)
{
	for (size_t i = 0; i < src->nbucket; i++) /* held while dst lets go of them */
		for (struct entry *e = src->bucket[i]; e; e = e->next)
			inode_ref(e->ino);
	names_clear(dst);
	for (size_t i = 0; i < src->nbucket; i++)
		for (struct entry *e = src->bucket[i]; e; e = e->next)
			names_put(dst, e->name, e->ino);
	for (size_t i = 0; i < src->nbucket; i++)
		for (struct entry *e = src->bucket[i]; e; e = e->next)
			inode_unref(e->ino);
}

static struct inode *inode_new(mode_t mode)
{
	struct inode *i = calloc(1, sizeof(*i));
	if (!i)
		abort();
	i->number = next_number++;
	i->mode = mode;
	clock_gettime(CLOCK_REALTIME, &i->mtime);
	i->pend_tail = &i->pend;
	i->next = all_inodes;
	if (all_inodes)
		all_inodes->prev = i;
	all_inodes = i;
	return i;
}

static uint64_t next_seq = 1;

static void rename_put(struct rename *rn)
{
	if (--rn->lists)
		return;
	inode_unref(rn->from_dir);
	inode_unref(rn->to_dir);
	inode_unref(rn->ino);
	free(rn->from_name);
	free(rn->to_name);
	free(rn);
}

static void change_free(struct change *c)
{
	if (c->kind == CH_NAME && c->ino)
		inode_unref(c->ino);
	if (c->kind == CH_RENAME)
		rename_put(c->rn);
	free(c->data);
	free(c->name);
	free(c);
}

static void pend_clear(struct inode *i)
{
	struct change *c = i->pend;
	i->pend = NULL; /* freeing may free inodes: the list is detached first */
	i->pend_tail = &i->pend;
	i->npend = 0;
	while (c) {
		struct change *next = c->next;
		change_free(c);
		c = next;
	}
}

static struct change *change_new(enum change_kind kind)
{
	struct change *c = calloc(1, sizeof(*c));
	if (!c)
		abort();
	c->kind = kind;
	c->seq = next_seq++;
	return c;
}

static void pend_add(struct inode *i, struct change *c)
{
	c->owner = i;
	c->next = NULL;
	*i->pend_tail = c;
	i->pend_tail = &c->next;
	i->npend++;
}

static void inode_free(struct inode *i)
{
	if (i->prev)
		i->prev->next = i->next;
	else
		all_inodes = i->next;
	if (i->next)
		i->next->prev = i->prev;
	free(i->cur.p);
	free(i->dur.p);
	names_clear(&i->names);
	names_clear(&i->dur_names);
	pend_clear(i);
	free(i);
}

static void reap(void)
{
	while (dead_list) {
		struct inode *i = dead_list;
		dead_list = i->dead_next;
		i->dead = false;
		if (!i->refs && !i->nopen)
			inode_free(i); /* may put the names it held on the list */
	}
}

/* the changes a file's data goes through, page by page, until its next flush */
static void pend_write(struct inode *i, const char *data, size_t len, size_t off)
{
	while (len) {
		size_t piece = PAGE - off % PAGE;
		if (piece > len)
			piece = len;
		struct change *c = change_new(CH_DATA);
		c->off = off;
		c->len = piece;
		c->data = memcpy(xmalloc(piece), data, piece);
		pend_add(i, c);
		data += piece;
		off += piece;
		len -= piece;
	}
}

static void pend_truncate(struct inode *i, size_t len)
{
	struct change *c = change_new(CH_TRUNC);
	c->len = len;
	pend_add(i, c);
}

static void rename_apply(struct rename *rn)
{
	rn->done = true;
	names_put(&rn->from_dir->dur_names, rn->from_name, NULL);
	names_put(&rn->to_dir->dur_names, rn->to_name, rn->ino);
}

static void inode_flush_upto(struct inode *i, uint64_t seq);

/* makes one change durable; a rename takes with it the changes made before it in the
 * other directory it touches, so that it is whole: old name or new, never neither */
static void change_apply(struct inode *i, const struct change *c)
{
	switch (c->kind) {
	case CH_DATA:
		bytes_write(&i->dur, c->data, c->len, c->off);
		break;
	case CH_TRUNC:
		bytes_truncate(&i->dur, c->len);
		break;
	case CH_NAME:
		names_put(&i->dur_names, c->name, c->ino);
		break;
	case CH_RENAME:
		if (!c->rn->done) {
			struct inode *other = c->rn->from_dir == i ? c->rn->to_dir : c->rn->from_dir;
			c->rn->done = true; /* its node in the other list is passed over */
			inode_flush_upto(other, c->seq);
			rename_apply(c->rn);
		}
		break;
	}
}

/* the changes of one inode made up to seq become durable, in order */
static void inode_flush_upto(struct inode *i, uint64_t seq)
{
	while (i->pend && i->pend->seq <= seq) {
		struct change *c = i->pend;
		i->pend = c->next;
		if (!i->pend)
			i->pend_tail = &i->pend;
		i->npend--;
		change_apply(i, c);
		change_free(c);
	}
}

/* a flush of one inode: every change so far becomes durable */
static void inode_flush(struct inode *i)
{
	inode_flush_upto(i, UINT64_MAX);
}

/* a name in a directory, now; the change is kept until the directory is flushed */
static void dir_set(struct inode *dir, const char *name, struct inode *ino)
{
	struct inode *old = names_get(&dir->names, name);
	if (old == ino)
		return;
	if (ino)
		ino->nlink++;
	if (old)
		old->nlink--;
	names_put(&dir->names, name, ino);
	struct change *c = change_new(CH_NAME);
	c->name = xstrdup(name);
	c->ino = ino;
	if (ino)
		inode_ref(ino);
	pend_add(dir, c);
	clock_gettime(CLOCK_REALTIME, &dir->mtime);
}

/* a rename, now; one change in both directories' lists */
static void dir_rename(struct inode *from_dir, const char *from_name, struct inode *to_dir,
		       const char *to_name, struct inode *ino)
{
	struct inode *old = names_get(&to_dir->names, to_name);
	ino->nlink++;
	names_put(&to_dir->names, to_name, ino);
	if (old)
		old->nlink--;
	ino->nlink--;
	names_put(&from_dir->names, from_name, NULL);
	struct rename *rn = calloc(1, sizeof(*rn));
	if (!rn)
		abort();
	rn->from_dir = from_dir;
	rn->to_dir = to_dir;
	rn->ino = ino;
	rn->from_name = xstrdup(from_name);
	rn->to_name = xstrdup(to_name);
	inode_ref(from_dir);
	inode_ref(to_dir);
	inode_ref(ino);
	struct change *c = change_new(CH_RENAME);
	c->rn = rn;
	rn->lists = 1;
	pend_add(from_dir, c);
	if (to_dir != from_dir) {
		struct change *c2 = change_new(CH_RENAME);
		c2->seq = c->seq;
		next_seq--;
		c2->rn = rn;
		rn->lists = 2;
		pend_add(to_dir, c2);
	}
	clock_gettime(CLOCK_REALTIME, &from_dir->mtime);
	to_dir->mtime = from_dir->mtime;
}

/* ---- the disk's state and its commands ---- */

enum op { OP_WRITE, OP_FSYNC, OP_FSYNCDIR, OP_SYNCFS, OP_RENAME, OP_CREATE, OP_LINK,
	  OP_UNLINK, OP_COUNT };
static const char *const op_names[OP_COUNT] = { "write", "fsync", "fsyncdir", "syncfs",
						"rename", "create", "link", "unlink" };

static struct {
	bool off;           /* power lost, not yet restored */
	pid_t victim;
	long cut_at;        /* lose power at this flush (counted in flushes), 0: never */
	bool cut_after;     /* ... after doing it */
	uint64_t flushes, writes, cuts, failed;
	struct {
		int err;
		long count, skip;
	} fail[OP_COUNT];
	bool remount;       /* mount again once unmounted */
} disk;

static void lose_power(void)
{
	if (disk.victim > 0)
		kill(disk.victim, SIGKILL);
	disk.off = true;
	disk.cut_at = 0;
	disk.cuts++;
}

/* 0, or the injected error of this request */
static int injected(enum op op)
{
	if (!disk.fail[op].count)
		return 0;
	if (disk.fail[op].skip > 0) {
		disk.fail[op].skip--;
		return 0;
	}
	disk.fail[op].count--;
	disk.failed++;
	return -disk.fail[op].err;
}

/* a flush request: counted, maybe the one the power goes at; returns true when it may
 * go on (false: the disk went off before it was done) */
static bool flush_begins(void)
{
	disk.flushes++;
	if (disk.cut_at && (long)disk.flushes >= disk.cut_at && !disk.cut_after) {
		lose_power();
		return false;
	}
	return true;
}

static void flush_done(void)
{
	if (disk.cut_at && (long)disk.flushes >= disk.cut_at)
		lose_power();
}

/* xorshift64*, for the seeded order of a restore */
static uint64_t rng_state;

static double rng_unit(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static void mark_reachable(struct inode *dir)
{
	if (dir->mark)
		return;
	dir->mark = true;
	for (size_t b = 0; b < dir->names.nbucket; b++) {
		for (struct entry *e = dir->names.bucket[b]; e; e = e->next) {
			e->ino->nlink++;
			if (S_ISDIR(e->ino->mode))
				mark_reachable(e->ino);
			else
				e->ino->mark = true;
		}
	}
}

static int change_by_seq(const void *a, const void *b)
{
	const struct change *x = *(struct change *const *)a, *y = *(struct change *const *)b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* power back: each unflushed change is kept with probability p, whole (a page, a name, a
 * rename), in the order it was made; the rest are lost, and what is durable becomes
 * what is there */
static void restore_power(uint64_t seed, double p)
{
	rng_state = seed ? seed : 0x9e3779b97f4a7c15ull;
	size_t n = 0, k = 0;
	for (struct inode *i = all_inodes; i; i = i->next)
		n += i->npend;
	struct change **order = xmalloc(n * sizeof(*order));
	for (struct inode *i = all_inodes; i; i = i->next)
		for (struct change *c = i->pend; c; c = c->next)
			order[k++] = c;
	qsort(order, n, sizeof(*order), change_by_seq);
	for (size_t j = 0; j < n; j++) {
		struct change *c = order[j];
		bool keep = p > 0 && rng_unit() < p;
		if (c->kind == CH_RENAME) {
			if (keep && !c->rn->done)
				rename_apply(c->rn);
			c->rn->done = true;
		} else if (keep) {
			change_apply(c->owner, c);
		}
	}
	free(order);
	for (struct inode *i = all_inodes; i; i = i->next)
		i->nopen++; /* none goes while the lists are cleared */
	for (struct inode *i = all_inodes; i; i = i->next) {
		pend_clear(i);
		if (S_ISDIR(i->mode))
			names_copy(&i->names, &i->dur_names);
		else
			bytes_copy(&i->cur, &i->dur);
	}
	for (struct inode *i = all_inodes; i; i = i->next) {
		i->nopen--;
		i->nlink = 0;
		i->mark = false;
		inode_maybe_dead(i);
	}
	mark_reachable(root);
	reap();
	disk.off = false;
	disk.remount = true;
	for (int op = 0; op < OP_COUNT; op++)
		disk.fail[op].count = 0;
}

static int parse_errno(const char *s)
{
	static const struct {
		const char *name;
		int err;
	} known[] = { { "EIO", EIO }, { "ENOSPC", ENOSPC }, { "EDQUOT", EDQUOT },
		      { "EROFS", EROFS }, { "EPERM", EPERM }, { "EACCES", EACCES } };
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (strcmp(s, known[i].name) == 0)
			return known[i].err;
	int n = atoi(s);
	return n > 0 ? n : -1;
}

static int command(const char *name, const char *value)
{
	char op[32], err[32], after[16];
	long n, skip;
	if (strcmp(name, "user.forget.victim") == 0) {
		disk.victim = (pid_t)atol(value);
		return 0;
	}
	if (strcmp(name, "user.forget.cut") == 0) {
		if (strcmp(value, "now") == 0) {
			lose_power();
			return 0;
		}
		if (strcmp(value, "off") == 0) {
			disk.cut_at = 0;
			return 0;
		}
		int k = sscanf(value, "flush %ld %15s", &n, after);
		if (k < 1 || n < 1)
			return -EINVAL;
		disk.cut_at = (long)disk.flushes + n;
		disk.cut_after = k == 2 && strcmp(after, "after") == 0;
		return 0;
	}
	if (strcmp(name, "user.forget.restore") == 0) {
		unsigned long long seed;
		double p;
		if (sscanf(value, "%llu %lf", &seed, &p) != 2 || p < 0 || p > 1)
			return -EINVAL;
		restore_power(seed, p);
		return 0;
	}
	if (strcmp(name, "user.forget.fail") == 0) {
		if (strcmp(value, "off") == 0) {
			for (int o = 0; o < OP_COUNT; o++)
				disk.fail[o].count = 0;
			return 0;
		}
		skip = 0;
		if (sscanf(value, "%31s %31s %ld %ld", op, err, &n, &skip) < 3 || n < 0 || skip < 0)
			return -EINVAL;
		for (int o = 0; o < OP_COUNT; o++) {
			if (strcmp(op, op_names[o]) == 0) {
				int e = parse_errno(err);
				if (e < 0)
					return -EINVAL;
				disk.fail[o].err = e;
				disk.fail[o].count = n;
				disk.fail[o].skip = skip;
				return 0;
			}
		}
		return -EINVAL;
	}
	return -ENOTSUP;
}

/* ---- paths ---- */

/* the inode of path, or NULL; with ret_parent and ret_name, its directory and last name
 * (the directory must exist, the name need not) */
static struct inode *lookup(const char *path, struct inode **ret_parent, const char **ret_name)
{
	struct inode *dir = root, *cur = root;
	const char *last = "";
	char part[256];
	const char *p = path;
	while (*p == '/')
		p++;
	while (*p) {
		const char *end = strchr(p, '/');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len >= sizeof(part) || !cur || !S_ISDIR(cur->mode))
			return NULL;
		memcpy(part, p, len);
		part[len] = '\0';
		dir = cur;
		last = p;
		cur = names_get(&cur->names, part);
		p += len;
		while (*p == '/')
			p++;
	}
	if (ret_parent) {
		if (!*last || !dir || !S_ISDIR(dir->mode))
			return NULL;
		*ret_parent = dir;
		*ret_name = last;
	}
	return cur;
}

/* the parent directory and last name of a path to create; -errno */
static int parent_of(const char *path, struct inode **ret_dir, char *name, size_t namelen)
{
	const char *slash = strrchr(path, '/');
	if (!slash || !slash[1] || strlen(slash + 1) >= namelen)
		return -EINVAL;
	char parent[4096];
	size_t plen = (size_t)(slash - path);
	if (plen >= sizeof(parent))
		return -ENAMETOOLONG;
	memcpy(parent, path, plen);
	parent[plen] = '\0';
	struct inode *dir = plen ? lookup(parent, NULL, NULL) : root;
	if (!dir)
		return -ENOENT;
	if (!S_ISDIR(dir->mode))
		return -ENOTDIR;
	strcpy(name, slash + 1);
	*ret_dir = dir;
	return 0;
}

static struct inode *handle(const char *path, struct fuse_file_info *fi)
{
	if (fi && fi->fh)
		return (struct inode *)(uintptr_t)fi->fh;
	return path ? lookup(path, NULL, NULL) : NULL;
}

/* ---- the file system ---- */

static void *fd_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	(void)conn;
	cfg->entry_timeout = 0;
	cfg->attr_timeout = 0;
	cfg->negative_timeout = 0;
	cfg->use_ino = 1;
	cfg->hard_remove = 1;
	cfg->nullpath_ok = 1;
	cfg->kernel_cache = 0;
	return NULL;
}

static int fd_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	struct inode *i = handle(path, fi);
	if (!i)
		return -ENOENT;
	memset(st, 0, sizeof(*st));
	st->st_ino = i->number;
	st->st_mode = i->mode;
	st->st_nlink = S_ISDIR(i->mode) ? 2 : (i->nlink ? i->nlink : 1);
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_size = S_ISDIR(i->mode) ? (off_t)i->names.count : (off_t)i->cur.len;
	st->st_blksize = PAGE;
	st->st_blocks = (blkcnt_t)((i->cur.len + 511) / 512);
	st->st_mtim = st->st_ctim = st->st_atim = i->mtime;
	return 0;
}

static int fd_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off;
	(void)flags;
	if (disk.off)
		return -EIO;
	struct inode *d = handle(path, fi);
	if (!d)
		return -ENOENT;
	if (!S_ISDIR(d->mode))
		return -ENOTDIR;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	for (size_t b = 0; b < d->names.nbucket; b++) {
		for (struct entry *e = d->names.bucket[b]; e; e = e->next) {
			struct stat st = { .st_ino = e->ino->number, .st_mode = e->ino->mode };
			if (fill(buf, e->name, &st, 0, 0))
				return -ENOMEM;
		}
	}
	return 0;
}

static int fd_opendir(const char *path, struct fuse_file_info *fi)
{
	struct inode *d = lookup(path, NULL, NULL);
	if (!d)
		return -ENOENT;
	if (!S_ISDIR(d->mode))
		return -ENOTDIR;
	d->nopen++;
	fi->fh = (uintptr_t)d;
	return 0;
}

/* Where a new name goes: its directory and last component, the name still free, and the
 * request not failed by an injected error; -errno otherwise. */
static int name_to_make(const char *path, enum op op, struct inode **ret_dir, char *name,
			size_t namelen)
{
	if (disk.off)
		return -EIO;
	int rc = parent_of(path, ret_dir, name, namelen);
	if (rc < 0)
		return rc;
	if (names_get(&(*ret_dir)->names, name))
		return -EEXIST;
	return injected(op);
}

static int fd_mkdir(const char *path, mode_t mode)
{
	struct inode *dir;
	char name[256];
	int rc = name_to_make(path, OP_CREATE, &dir, name, sizeof(name));
	if (rc < 0)
		return rc;
	struct inode *d = inode_new(S_IFDIR | (mode & 07777));
	dir_set(dir, name, d);
	return 0;
}

static int remove_name(const char *path, bool want_dir)
{
	if (disk.off)
		return -EIO;
	struct inode *dir;
	const char *name;
	struct inode *i = lookup(path, &dir, &name);
	if (!i)
		return -ENOENT;
	if (want_dir != !!S_ISDIR(i->mode))
		return want_dir ? -ENOTDIR : -EISDIR;
	if (want_dir && i->names.count)
		return -ENOTEMPTY;
	int rc = injected(OP_UNLINK);
	if (rc < 0)
		return rc;
	dir_set(dir, name, NULL);
	reap();
	return 0;
}

static int fd_unlink(const char *path)
{
	return remove_name(path, false);
}

static int fd_rmdir(const char *path)
{
	return remove_name(path, true);
}

static int fd_rename(const char *from, const char *to, unsigned int flags)
{
	if (disk.off)
		return -EIO;
	if (flags & ~RENAME_NOREPLACE)
		return -EINVAL;
	struct inode *fdir, *tdir;
	const char *fname;
	char tname[256];
	struct inode *i = lookup(from, &fdir, &fname);
	if (!i)
		return -ENOENT;
	int rc = parent_of(to, &tdir, tname, sizeof(tname));
	if (rc < 0)
		return rc;
	struct inode *old = names_get(&tdir->names, tname);
	if (old && (flags & RENAME_NOREPLACE))
		return -EEXIST;
	if (old == i)
		return 0;
	if (old && S_ISDIR(old->mode) && (!S_ISDIR(i->mode) || old->names.count))
		return S_ISDIR(i->mode) ? -ENOTEMPTY : -EISDIR;
	if (old && !S_ISDIR(old->mode) && S_ISDIR(i->mode))
		return -ENOTDIR;
	if ((rc = injected(OP_RENAME)) < 0)
		return rc;
	dir_rename(fdir, fname, tdir, tname, i);
	reap();
	return 0;
}

static int fd_link(const char *from, const char *to)
{
	struct inode *i = disk.off ? NULL : lookup(from, NULL, NULL);
	if (!i)
		return disk.off ? -EIO : -ENOENT;
	if (S_ISDIR(i->mode))
		return -EPERM;
	struct inode *dir;
	char name[256];
	int rc = name_to_make(to, OP_LINK, &dir, name, sizeof(name));
	if (rc < 0)
		return rc;
	dir_set(dir, name, i);
	return 0;
}

static int fd_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	if (disk.off)
		return -EIO;
	struct inode *dir;
	char name[256];
	int rc = parent_of(path, &dir, name, sizeof(name));
	if (rc < 0)
		return rc;
	struct inode *i = names_get(&dir->names, name);
	if (i && (fi->flags & O_EXCL))
		return -EEXIST;
	if (!i) {
		if ((rc = injected(OP_CREATE)) < 0)
			return rc;
		i = inode_new(S_IFREG | (mode & 07777));
		dir_set(dir, name, i);
	} else if (fi->flags & O_TRUNC) {
		bytes_truncate(&i->cur, 0);
		pend_truncate(i, 0);
	}
	i->nopen++;
	fi->fh = (uintptr_t)i;
	return 0;
}

static int fd_mknod(const char *path, mode_t mode, dev_t dev)
{
	(void)dev;
	if (!S_ISREG(mode))
		return -EPERM;
	struct fuse_file_info fi = { .flags = O_EXCL };
	int rc = fd_create(path, mode, &fi);
	if (rc == 0) {
		struct inode *i = (struct inode *)(uintptr_t)fi.fh;
		i->nopen--;
	}
	return rc;
}

static int fd_open(const char *path, struct fuse_file_info *fi)
{
	if (disk.off)
		return -EIO;
	struct inode *i = lookup(path, NULL, NULL);
	if (!i)
		return -ENOENT;
	if (S_ISDIR(i->mode))
		return -EISDIR;
	if (fi->flags & O_TRUNC) {
		bytes_truncate(&i->cur, 0);
		pend_truncate(i, 0);
	}
	i->nopen++;
	fi->fh = (uintptr_t)i;
	return 0;
}

static int fd_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	struct inode *i = handle(NULL, fi);
	if (i) {
		i->nopen--;
		inode_maybe_dead(i);
		reap();
	}
	return 0;
}

static int fd_read(const char *path, char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	if (disk.off)
		return -EIO;
	struct inode *i = handle(path, fi);
	if (!i)
		return -ENOENT;
	if ((size_t)off >= i->cur.len)
		return 0;
	if (size > i->cur.len - (size_t)off)
		size = i->cur.len - (size_t)off;
	memcpy(buf, i->cur.p + off, size);
	return (int)size;
}

/* The inode a write, truncation or flush changes, when the disk is on and no error is
 * injected into this request; -errno otherwise. */
static int changed_inode(const char *path, struct fuse_file_info *fi, enum op op,
			 struct inode **ret)
{
	if (disk.off)
		return -EIO;
	struct inode *i = handle(path, fi);
	if (!i)
		return -ENOENT;
	int rc = injected(op);
	if (rc < 0)
		return rc;
	*ret = i;
	return 0;
}

static int fd_write(const char *path, const char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct inode *i;
	int rc = changed_inode(path, fi, OP_WRITE, &i);
	if (rc < 0)
		return rc;
	if (fi && (fi->flags & O_APPEND))
		off = (off_t)i->cur.len;
	bytes_write(&i->cur, buf, size, (size_t)off);
	pend_write(i, buf, size, (size_t)off);
	clock_gettime(CLOCK_REALTIME, &i->mtime);
	disk.writes++;
	return (int)size;
}

static int fd_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	struct inode *i;
	int rc = changed_inode(path, fi, OP_WRITE, &i);
	if (rc < 0)
		return rc;
	if (S_ISDIR(i->mode))
		return -EISDIR;
	bytes_truncate(&i->cur, (size_t)size);
	pend_truncate(i, (size_t)size);
	return 0;
}

/* fsync, fdatasync of a file, fsync of a directory: what it changed becomes durable */
static int flush_one(const char *path, struct fuse_file_info *fi, enum op op)
{
	struct inode *i;
	int rc = changed_inode(path, fi, op, &i);
	if (rc < 0)
		return rc;
	if (!flush_begins())
		return -EIO;
	inode_flush(i);
	flush_done();
	return 0;
}

static int fd_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	return flush_one(path, fi, OP_FSYNC);
}

static int fd_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	return flush_one(path, fi, OP_FSYNCDIR);
}

static int syncfs_all(void)
{
	if (disk.off)
		return -EIO;
	int rc = injected(OP_SYNCFS);
	if (rc < 0)
		return rc;
	if (!flush_begins())
		return -EIO;
	for (struct inode *i = all_inodes; i; i = i->next)
		inode_flush(i);
	flush_done();
	return 0;
}

static int fd_setxattr(const char *path, const char *name, const char *value, size_t size,
		       int flags)
{
	(void)flags;
	if (strcmp(name, "user.forget.syncfs") == 0)
		return syncfs_all();
	if (strncmp(name, "user.forget.", 12) != 0 || strcmp(path, "/") != 0)
		return -ENOTSUP;
	char v[256];
	if (size >= sizeof(v))
		return -EINVAL;
	memcpy(v, value, size);
	v[size] = '\0';
	return command(name, v);
}

static int fd_getxattr(const char *path, const char *name, char *value, size_t size)
{
	if (strcmp(name, "user.forget.stats") != 0 || strcmp(path, "/") != 0)
		return -ENODATA;
	char s[256];
	int n = snprintf(s, sizeof(s),
			 "state=%s flushes=%" PRIu64 " writes=%" PRIu64 " cuts=%" PRIu64
			 " failed=%" PRIu64,
			 disk.off ? "off" : "on", disk.flushes, disk.writes, disk.cuts,
			 disk.failed);
	if (size == 0)
		return n;
	if ((size_t)n > size)
		return -ERANGE;
	memcpy(value, s, (size_t)n);
	return n;
}

static int fd_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	struct inode *i = handle(path, fi);
	if (!i)
		return -ENOENT;
	i->mode = (i->mode & S_IFMT) | (mode & 07777);
	return 0;
}

static int fd_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	(void)uid;
	(void)gid;
	return handle(path, fi) ? 0 : -ENOENT;
}

static int fd_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	struct inode *i = handle(path, fi);
	if (!i)
		return -ENOENT;
	if (tv[1].tv_nsec == UTIME_NOW)
		clock_gettime(CLOCK_REALTIME, &i->mtime);
	else if (tv[1].tv_nsec != UTIME_OMIT)
		i->mtime = tv[1];
	return 0;
}

static int fd_statfs(const char *path, struct statvfs *st)
{
	(void)path;
	memset(st, 0, sizeof(*st));
	st->f_bsize = st->f_frsize = PAGE;
	st->f_blocks = 1u << 22; /* 16 GiB */
	st->f_bfree = st->f_bavail = 1u << 21;
	st->f_files = st->f_ffree = st->f_favail = 1u << 20;
	st->f_namemax = 255;
	return 0;
}

static const struct fuse_operations ops = {
	.init = fd_init,
	.getattr = fd_getattr,
	.readdir = fd_readdir,
	.opendir = fd_opendir,
	.releasedir = fd_release, /* a file's or a directory's handle alike */
	.mkdir = fd_mkdir,
	.rmdir = fd_rmdir,
	.unlink = fd_unlink,
	.rename = fd_rename,
	.link = fd_link,
	.create = fd_create,
	.mknod = fd_mknod,
	.open = fd_open,
	.release = fd_release,
	.read = fd_read,
	.write = fd_write,
	.truncate = fd_truncate,
	.fsync = fd_fsync,
	.fsyncdir = fd_fsyncdir,
	.setxattr = fd_setxattr,
	.getxattr = fd_getxattr,
	.chmod = fd_chmod,
	.chown = fd_chown,
	.utimens = fd_utimens,
	.statfs = fd_statfs,
};

int main(int argc, char **argv)
{
	if (argc != 2 || argv[1][0] != '/') {
		fprintf(stderr, "usage: forgetdisk /absolute/mountpoint\n"
				"  (runs in the foreground; mounts again after each restore)\n");
		return 2;
	}
	const char *mnt = argv[1];
	root = inode_new(S_IFDIR | 0755);
	root->nlink = 1;
	signal(SIGPIPE, SIG_IGN);
	do {
		disk.remount = false;
		char *av[] = { argv[0], "-o", "fsname=forgetdisk,subtype=forgetdisk", NULL };
		struct fuse_args args = FUSE_ARGS_INIT(3, av);
		struct fuse *f = fuse_new(&args, &ops, sizeof(ops), NULL);
		if (!f) {
			fprintf(stderr, "forgetdisk: fuse_new failed\n");
			return 1;
		}
		if (fuse_mount(f, mnt) != 0) {
			fprintf(stderr, "forgetdisk: cannot mount on %s\n", mnt);
			fuse_destroy(f);
			return 1;
		}
		/* the test reads this line to know the disk is (again) in place */
		printf("mounted %s\n", mnt);
		fflush(stdout);
		struct fuse_session *se = fuse_get_session(f);
		fuse_set_signal_handlers(se); /* SIGTERM, SIGINT: unmount and end */
		int rc = fuse_loop(f);
		fuse_remove_signal_handlers(se);
		fuse_unmount(f);
		fuse_destroy(f);
		fuse_opt_free_args(&args);
		if (rc != 0 && !disk.remount)
			return 1;
	} while (disk.remount);
	return 0;
}
