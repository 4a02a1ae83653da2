/*
 * store_memory -- the embedded limiter store: sharded hash tables of GCRA timestamps,
 * bounded, snapshotted to a file.
 *
 * Records.  One record per (key, window): { hash, tat }, 16 bytes.  The hash is derived
 * from the item's key_hash and the window's (index, count, period, burst), so a rule whose
 * windows change starts those windows afresh while unchanged ones keep their state.  Its
 * top SHARD_BITS bits are those of key_hash: every window of one (rule, key) lives in the
 * shard that key_hash names, and a record read back from a snapshot finds its shard from
 * its own hash.  The low bits pick the home slot.  Hash 0 marks an empty slot (a record
 * hash of 0 becomes 1).
 *
 * Shards.  SHARDS tables, each behind its own mutex: open addressing, linear probing,
 * deletion by backward shift (no tombstones, so probes stay short however keys come and
 * go), doubled at load 3/4; the load is then between 3/8 and 3/4, at most 43 bytes per
 * record.  Tables never shrink (XXX: after a flood the memory stays with the process
 * until restart; the bound is max_keys, so that is what an operator plans for anyway).
 *
 * A decision locks the distinct shards of its items in ascending order (so two decisions
 * cannot deadlock), reads every window, decides, charges, and unlocks: nothing sees the
 * state between check and charge (law 4, doc/ARCHITECTURE.md).  Everything a decision
 * may need to allocate (new records, table growth) is done before the first charge, so a
 * failure leaves the state untouched.  A single item whose records exist takes a shorter
 * path (decide_one()) with the same result.  On a large table the cost of a decision is
 * the cache miss on its record's line; the line is prefetched before the lock is taken.
 *
 * Bound.  A global count of records is kept against max_keys.  A new record over the
 * bound evicts one: a record whose TAT has passed if the sample finds one, otherwise the
 * lowest TAT among a sample of the new record's shard and of one other shard (taken with
 * trylock, never waited for) -- an approximation of "stalest first" at a constant cost.
 * Records of the decision in progress are never chosen.  The first eviction of an episode
 * is logged; expire() logs the end of the episode when the count is back under the bound.
 *
 * Hot keys.  Each shard keeps HOT_MAX (rule, key) entries that reached half their burst or
 * were refused, for `sluice limits top`; the entry with the lowest estimated fill in a
 * sample makes room.  top() re-reads the live records.
 *
 * The snapshot file is store_memory_snap.c's (see store_memory_int.h).
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "log.h"
#include "store_memory_int.h"
#include "util.h"

static const struct store_ops memory_ops;

/* ---- hashing ---------------------------------------------------------------------- */


static inline uint64_t mum(uint64_t a, uint64_t b)
{
	__extension__ unsigned __int128 r = (unsigned __int128)a * b;
	return (uint64_t)r ^ (uint64_t)(r >> 64);
}

/*
 * The record of window `index` of a (rule, key).  Multiply-fold mixing (wyhash's mum):
 * key_hash is already a keyed hash, the window's fields are configuration, and this is on
 * every decision's path, where XXH3 cost three times as many instructions.  The fields
 * are below 2^56 and the constants are not, so no factor is 0.
 */
static uint64_t rec_hash(uint64_t key_hash, unsigned index, const struct rate_window *w)
{
	uint64_t sig = mum(w->count ^ 0xa0761d6478bd642full, w->period_ns ^ 0xe7037ed1a0b428dbull) ^
		       mum(w->burst ^ 0x8ebc6af09c88c6e3ull, index ^ 0x589965cc75374cc3ull);
	uint64_t h = mum(key_hash ^ 0x1d8e4e27c47d124full, sig ^ 0xeb44accab455d165ull);
	h = (h & ~SHARD_HASH_MASK) | (key_hash & SHARD_HASH_MASK);
	return h ? h : 1;
}

/* The record that remembers value_hash in window `index` of a distinct (rule, key): as
 * rec_hash(), in the key's shard, mixed with the value (and a constant of its own, so it
 * never names a window's TAT). */
static uint64_t seen_hash(uint64_t key_hash, uint64_t value_hash, unsigned index,
			  const struct rate_window *w)
{
	uint64_t h = mum(rec_hash(key_hash, index, w) ^ 0x2d358dccaa6c78a5ull,
			 value_hash ^ 0x8bb84b93962eacc9ull);
	h = (h & ~SHARD_HASH_MASK) | (key_hash & SHARD_HASH_MASK);
	return h ? h : 1;
}

/* The record of a (rule, key)'s block: its TAT is when the block ends. */
static uint64_t block_hash(uint64_t key_hash, const struct rate_limits *l)
{
	/* of the key under these windows, as its TATs are (Redis keeps it in their key):
	 * limits changed for the key (an overrides line, a run-time limit) start afresh */
	uint64_t h = key_hash ^ 0x3c6ef372fe94f82bull;
	for (unsigned j = 0; j < l->n && j < RATE_MAX_WINDOWS; j++)
		h = mum(h ^ rec_hash(key_hash, j, &l->w[j]), 0xa54ff53a5f1d36f1ull);
	h = mum(h, 0x510e527fade682d1ull);
	h = (h & ~SHARD_HASH_MASK) | (key_hash & SHARD_HASH_MASK);
	return h ? h : 1;
}

/* Records an item reads: one per window, for a distinct item one more per window (the
 * value's), and for an item with a block its block's, last. */
static inline unsigned item_recs(const struct store_item *it)
{
	return it->limits->n * ((it->flags & STORE_DISTINCT) ? 2u : 1u) + (it->block_ns ? 1u : 0u);
}

static inline uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* ---- one shard's table (caller holds the lock) -------------------------------------- */

long shard_find(const struct shard *sh, uint64_t h)
{
	size_t i = h & sh->mask;
	for (;;) {
		uint64_t x = sh->slots[i].hash;
		if (x == h)
			return (long)i;
		if (x == 0)
			return -1;
		i = (i + 1) & sh->mask;
	}
}

/* h is not in the table and there is room (shard_reserve). */
void shard_insert(struct shard *sh, uint64_t h, uint64_t tat)
{
	size_t i = h & sh->mask;
	while (sh->slots[i].hash)
		i = (i + 1) & sh->mask;
	sh->slots[i] = (struct rec){ h, tat };
	sh->count++;
}

/* Backward-shift deletion: pull later members of the probe run into the hole. */
static void shard_delete(struct shard *sh, size_t i)
{
	size_t j = i;
	for (;;) {
		j = (j + 1) & sh->mask;
		uint64_t x = sh->slots[j].hash;
		if (x == 0)
			break;
		size_t home = x & sh->mask;
		/* x may move to i iff its home is not cyclically in (i, j] */
		bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
		if (stays)
			continue;
		sh->slots[i] = sh->slots[j];
		i = j;
	}
	sh->slots[i].hash = 0;
	sh->slots[i].tat = 0;
	sh->count--;
}

/* Make room for `records` records in total at load <= 3/4.  0 or -ENOMEM. */
int shard_reserve(struct shard *sh, size_t records)
{
	size_t cap = sh->mask + 1;
	if (records <= cap / 4 * 3)
		return 0;
	size_t ncap = cap;
	while (records > ncap / 4 * 3) {
		if (ncap > SIZE_MAX / 2 / sizeof(struct rec))
			return -ENOMEM;
		ncap *= 2;
	}
	struct rec *ns = calloc(ncap, sizeof(*ns));
	if (!ns)
		return -ENOMEM;
	struct rec *old = sh->slots;
	/* atomic stores: shard_prefetch() reads these two without the lock */
	__atomic_store_n(&sh->slots, ns, __ATOMIC_RELAXED);
	__atomic_store_n(&sh->mask, ncap - 1, __ATOMIC_RELAXED);
	sh->count = 0;
	for (size_t i = 0; i < cap; i++)
		if (old[i].hash)
			shard_insert(sh, old[i].hash, old[i].tat);
	free(old);
	return 0;
}

/*
 * The shard lock.  A decision holds a shard for well under a microsecond, and a spinlock
 * (tried: an exchange to take it, a store to give it back) was no faster here than the
 * mutex, which does not burn a CPU when a holder is preempted or busy for longer (a table
 * doubling; save() or expire() on a shard).
 */



/*
 * Start loading the line of h's home slot before the lock is taken, so that the cache miss
 * (the cost of a decision on a large table) overlaps the locking.  Reads the table without
 * the lock: a stale pointer or mask only makes a useless prefetch, which never faults.
 */
static inline void shard_prefetch(const struct shard *sh, uint64_t h)
{
	const struct rec *slots = __atomic_load_n(&sh->slots, __ATOMIC_RELAXED);
	size_t mask = __atomic_load_n(&sh->mask, __ATOMIC_RELAXED);
	__builtin_prefetch(&slots[h & mask], 1);
}

static void lock_shards(struct store_memory *m, uint64_t set)
{
	for (uint64_t s = set; s; s &= s - 1)
		shard_lock(&m->shards[__builtin_ctzll(s)]);
}

static void unlock_shards(struct store_memory *m, uint64_t set)
{
	for (uint64_t s = set; s; s &= s - 1)
		shard_unlock(&m->shards[__builtin_ctzll(s)]);
}

static bool limits_valid(const struct rate_limits *l)
{
	return l && l->n <= RATE_MAX_WINDOWS;
}

/* ---- eviction ----------------------------------------------------------------------- */

/* Is h a record of one of the items (the decision in progress)? */
static bool rec_protected(uint64_t h, const struct store_item *items, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct store_item *it = &items[i];
		if (shard_of(it->key_hash) != shard_of(h))
			continue;
		for (unsigned j = 0; j < it->limits->n; j++)
			if (rec_hash(it->key_hash, j, &it->limits->w[j]) == h ||
			    ((it->flags & STORE_DISTINCT) &&
			     seen_hash(it->key_hash, it->value_hash, j, &it->limits->w[j]) == h))
				return true;
		if (it->block_ns && block_hash(it->key_hash, it->limits) == h)
			return true;
	}
	return false;
}

enum sample_result {
	SAMPLE_NONE = 0,
	SAMPLE_STALEST,
	SAMPLE_EXPIRED,
};

/*
 * Look at up to SAMPLE_RECORDS records of sh from a pseudo-random slot, in at most
 * SAMPLE_SLOTS slots unless none of them could go (a sparse table after max_keys was
 * lowered, or only the decision's own records): then on until one is found or the whole
 * table was seen.  An expired one (TAT <= now) is returned at once; otherwise the one with
 * the lowest TAT.
 */
static enum sample_result shard_sample(struct shard *sh, const struct store_item *items,
				       size_t n, uint64_t now, size_t *ret_slot,
				       uint64_t *ret_tat)
{
	if (sh->count == 0)
		return SAMPLE_NONE;
	size_t cap = sh->mask + 1;
	size_t i = xorshift(&sh->rng) & sh->mask;
	unsigned seen = 0;
	enum sample_result r = SAMPLE_NONE;
	for (size_t k = 0; k < cap && seen < SAMPLE_RECORDS && (k < SAMPLE_SLOTS || r == SAMPLE_NONE);
	     k++, i = (i + 1) & sh->mask) {
		const struct rec *x = &sh->slots[i];
		if (x->hash == 0)
			continue;
		seen++;
		if (items && rec_protected(x->hash, items, n))
			continue;
		if (x->tat <= now) {
			*ret_slot = i;
			*ret_tat = x->tat;
			return SAMPLE_EXPIRED;
		}
		if (r == SAMPLE_NONE || x->tat < *ret_tat) {
			*ret_slot = i;
			*ret_tat = x->tat;
			r = SAMPLE_STALEST;
		}
	}
	return r;
}

static void note_eviction(struct store_memory *m)
{
	uint64_t ev = atomic_fetch_add(&m->evicted, 1);
	if (!atomic_exchange(&m->evicting, true)) {
		atomic_store(&m->episode_evicted, ev);
		log_msg(LOG_LEVEL_WARNING, "memory store full (max_keys=%llu): evicting the stalest keys",
			(unsigned long long)atomic_load(&m->max_keys));
	}
}

static void drop(struct store_memory *m, struct shard *sh, size_t slot,
		 enum sample_result why)
{
	shard_delete(sh, slot);
	atomic_fetch_sub(&m->total, 1);
	if (why == SAMPLE_EXPIRED)
		atomic_fetch_add(&m->expired, 1);
	else
		note_eviction(m);
}

/*
 * Drop one record to make room for a new one in shard `home`.  The caller holds the
 * shards in `held` (items' records there are protected); another shard is only tried with
 * trylock.  Returns false when nothing could be dropped: every record is the decision's
 * own, or the home shard has none to give and the others were all busy.  The store then
 * holds more than max_keys, by at most the new records of the decisions in progress, until
 * later insertions evict again (XXX: the alternative, failing a decision on a store that
 * has memory, would refuse mail for bookkeeping).
 */
static bool evict_one(struct store_memory *m, unsigned home, uint64_t held,
		      const struct store_item *items, size_t n, uint64_t now)
{
	struct shard *hs = &m->shards[home];
	size_t hslot = 0;
	uint64_t htat = 0;
	enum sample_result hr = shard_sample(hs, items, n, now, &hslot, &htat);
	if (hr == SAMPLE_EXPIRED) {
		drop(m, hs, hslot, hr);
		return true;
	}
	/* A second opinion from another shard keeps "stalest" near global; when the home
	 * shard has nothing to give, go on until some shard does. */
	unsigned start = atomic_fetch_add_explicit(&m->victim_cursor, 1, memory_order_relaxed);
	for (unsigned tries = 0; tries < SHARDS - 1; tries++) {
		/* every other shard once, from a different one each time */
		unsigned o = (home + 1 + (start + tries) % (SHARDS - 1)) % SHARDS;
		struct shard *os = &m->shards[o];
		bool own = held & (1ull << o);
		if (!own && !shard_trylock(os)) {
			if (hr != SAMPLE_NONE)
				break;
			continue;
		}
		size_t oslot = 0;
		uint64_t otat = 0;
		enum sample_result orr = shard_sample(os, own ? items : NULL, n, now, &oslot,
						      &otat);
		bool take = orr == SAMPLE_EXPIRED ||
			    (orr == SAMPLE_STALEST && (hr == SAMPLE_NONE || otat < htat));
		if (take)
			drop(m, os, oslot, orr);
		if (!own)
			shard_unlock(os);
		if (take)
			return true;
		if (hr != SAMPLE_NONE)
			break;
	}
	if (hr == SAMPLE_NONE)
		return false;
	drop(m, hs, hslot, hr);
	return true;
}

/* ---- hot keys ------------------------------------------------------------------------ */

static unsigned fill_ppm(uint64_t used, uint64_t burst)
{
	if (burst == 0)
		return used ? UINT32_MAX : 0;
	__extension__ unsigned __int128 f = (unsigned __int128)used * 1000000u / burst;
	return f > UINT32_MAX ? UINT32_MAX : (unsigned)f;
}

/* The fill at now estimated from the TATs an entry last saw, in [0, 1+]. */
static double hot_estimate(const struct hot *e, uint64_t now)
{
	double best = 0;
	for (unsigned j = 0; j < e->limits.n; j++) {
		double f = e->tat[j] > now ? (double)(e->tat[j] - now) * e->inv_span[j] : 0;
		if (f > best)
			best = f;
	}
	return best;
}

static void copy_text(char *dst, size_t len, struct str s)
{
	size_t n = s.len < len - 1 ? s.len : len - 1;
	if (n)
		memcpy(dst, s.ptr, n);
	dst[n] = '\0';
}

static long hot_find(const struct hot_table *t, uint64_t key_hash)
{
	for (uint64_t u = t->in_use; u; u &= u - 1) {
		unsigned i = (unsigned)__builtin_ctzll(u);
		if (t->key_hash[i] == key_hash)
			return i;
	}
	return -1;
}

/*
 * Remember an item that came near its limit.  A key already there is updated in place
 * (the common case under a flood: the same sender refused again and again); a new one
 * takes a free entry, or the one with the lowest estimated fill among HOT_SAMPLE.
 */
static void hot_record(struct shard *sh, const struct store_item *it, const uint64_t *tat,
		       uint64_t now)
{
	struct hot_table *t = sh->hot;
	if (!t) {
		t = sh->hot = calloc(1, sizeof(*t));
		if (!t)
			return; /* top() is best effort */
	}
	long i = hot_find(t, it->key_hash);
	bool fresh = i < 0;
	if (fresh && ~t->in_use) {
		i = __builtin_ctzll(~t->in_use);
	} else if (fresh) {
		/* the lowest of a sample: with many keys over their limits at once (a spam
		 * run from many senders) every refusal comes here */
		double lowest = 0;
		unsigned start = (unsigned)xorshift(&sh->rng);
		for (unsigned k = 0; k < HOT_SAMPLE; k++) {
			unsigned x = (start + k) % HOT_MAX;
			double f = hot_estimate(&t->e[x], now);
			if (i < 0 || f < lowest) {
				i = x;
				lowest = f;
			}
		}
	}
	struct hot *e = &t->e[i];
	if (fresh) {
		t->in_use |= 1ull << i;
		t->key_hash[i] = it->key_hash;
		copy_text(e->rule, sizeof(e->rule), it->rule);
		copy_text(e->key, sizeof(e->key), it->key);
	}
	if (fresh || memcmp(&e->limits, it->limits, sizeof(e->limits)) != 0) {
		e->limits = *it->limits;
		for (unsigned j = 0; j < e->limits.n; j++) {
			double span = (double)e->limits.w[j].burst *
				      (double)gcra_interval(&e->limits.w[j]);
			e->inv_span[j] = span > 0 ? 1 / span : 1e300;
		}
	}
	memcpy(e->tat, tat, sizeof(e->tat));
}

/* ---- decide ------------------------------------------------------------------------- */

static inline bool item_charges(const struct store_item *it, bool pass)
{
	return it->ok && (pass || (it->flags & STORE_COUNT_REJECTED));
}

/*
 * What phase 1 of a decision learnt about one record of an item (a window's TAT, or a
 * distinct value's record in a window); up to SCRATCH_STACK of them live on the stack.
 */
enum rec_write {
	WRITE_NONE = 0,
	WRITE_CHARGE,   /* a window's TAT: charge cost */
	WRITE_RAISE,    /* set to at least new_tat: a block, a value's record */
};

struct scratch {
	uint64_t hash;
	uint64_t tat;       /* as read; 0 when the record did not exist */
	uint64_t new_tat;   /* what the write leaves (gcra_check's if charged) */
	uint64_t used;      /* gcra_check's: after charging if ok, else now */
	uint64_t cost;      /* a window's cost in this decision (0: the value is known) */
	long slot;          /* where phase 1 found it, or -1 */
	bool ok;
	uint8_t write;      /* enum rec_write, planned once the event's fate is known */
};

#define SCRATCH_STACK 16

/*
 * What each record of a decided batch gets written (mode STORE_CHECK): the charges the
 * rules of store.h select, the blocks of the items over their limits, the values' records
 * of the distinct items that went through.
 */
static void plan_writes(struct store_item *items, size_t n, bool pass, uint64_t now,
			struct scratch *sc)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		struct store_item *it = &items[i];
		unsigned wn = it->limits->n;
		bool charges = item_charges(it, pass);
		bool distinct = it->flags & STORE_DISTINCT;
		if (it->block_ns) {
			/* a block starts at a refusal, unless one runs (it is not extended) */
			struct scratch *b = &sc[k + item_recs(it) - 1];
			b->write = !it->ok && !it->blocked ? WRITE_RAISE : WRITE_NONE;
			b->new_tat = now + it->block_ns < now ? UINT64_MAX : now + it->block_ns;
			/* the refusal that starts a block says how long it lasts */
			if (b->write && it->block_ns > it->retry_ns)
				it->retry_ns = it->block_ns;
		}
		for (unsigned j = 0; j < wn; j++) {
			struct scratch *x = &sc[k + j];
			x->write = WRITE_NONE;
			if (charges && x->cost)
				x->write = WRITE_CHARGE;
			if (distinct) {
				/* the value's record: refreshed whenever the item goes through */
				const struct rate_window *w = &it->limits->w[j];
				struct scratch *v = &sc[k + wn + j];
				v->write = charges || (it->ok && pass && it->known) ? WRITE_RAISE
										     : WRITE_NONE;
				v->new_tat = now + w->period_ns < now ? UINT64_MAX : now + w->period_ns;
			}
		}
		k += item_recs(it);
	}
}

/*
 * Write what plan_writes() planned.  First every record that does not exist yet is paid
 * for (the count against max_keys, eviction, table growth), then the records change: a
 * failure can only happen before the first write.  A record still as phase 1 read it
 * takes phase 1's result; one that changed since (the same record twice in a batch) is
 * charged on top of what it holds now.
 */
static int charge(struct store_memory *m, struct store_item *items, size_t n, bool pass,
		  uint64_t now, uint64_t held, const struct scratch *sc)
{
	size_t missing = 0;
	unsigned home = 0;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const struct store_item *it = &items[i];
		unsigned rn = item_recs(it);
		for (unsigned j = 0; j < rn; j++)
			if (sc[k + j].write && sc[k + j].slot < 0) {
				if (!missing)
					home = shard_of(it->key_hash);
				missing++;
			}
		k += rn;
	}
	if (missing) {
		uint64_t old = atomic_fetch_add(&m->total, missing);
		uint64_t max = atomic_load(&m->max_keys);
		if (old + missing > max) {
			/* up to two per new record: after max_keys was lowered the store
			 * converges to the new bound as keys come */
			uint64_t over = old + missing - max;
			if (over > 2 * missing)
				over = 2 * missing;
			while (over-- && evict_one(m, home, held, items, n, now))
				;
		}
		/* the room in each shard, counted after eviction made some */
		for (uint64_t s = held; s; s &= s - 1) {
			unsigned si = (unsigned)__builtin_ctzll(s);
			size_t need = 0;
			k = 0;
			for (size_t i = 0; i < n; i++) {
				const struct store_item *it = &items[i];
				unsigned rn = item_recs(it);
				if (shard_of(it->key_hash) == si)
					for (unsigned j = 0; j < rn; j++)
						need += sc[k + j].write && sc[k + j].slot < 0;
				k += rn;
			}
			if (need && shard_reserve(&m->shards[si], m->shards[si].count + need) < 0) {
				atomic_fetch_sub(&m->total, missing);
				return -ENOMEM;
			}
		}
	}
	size_t inserted = 0;
	k = 0;
	for (size_t i = 0; i < n; i++) {
		struct store_item *it = &items[i];
		unsigned wn = it->limits->n, rn = item_recs(it);
		it->charged = item_charges(it, pass);
		struct shard *sh = &m->shards[shard_of(it->key_hash)];
		for (unsigned j = 0; j < rn; j++, k++) {
			const struct scratch *x = &sc[k];
			if (!x->write)
				continue;
			/* where phase 1 found it, unless eviction or growth moved things since */
			long slot = x->slot;
			if (slot < 0 || (size_t)slot > sh->mask || sh->slots[slot].hash != x->hash)
				slot = shard_find(sh, x->hash);
			uint64_t cur = slot >= 0 ? sh->slots[slot].tat : 0;
			uint64_t new_tat = x->new_tat, used = x->used;
			if (x->write == WRITE_RAISE) {
				if (cur > new_tat)
					new_tat = cur;
			} else if (slot >= 0 ? x->slot < 0 || cur != x->tat : x->slot >= 0) {
				const struct rate_window *w = &it->limits->w[j];
				struct gcra_result r;
				gcra_check(w, cur, now, x->cost, &r);
				new_tat = r.new_tat;
				used = gcra_used(w, new_tat, now);
			}
			if (slot >= 0) {
				sh->slots[slot].tat = new_tat;
			} else {
				shard_insert(sh, x->hash, new_tat);
				inserted++;
			}
			if (j < wn && x->write == WRITE_CHARGE)
				it->used[j] = used;
		}
	}
	/* a record given twice in one batch was counted twice */
	if (missing > inserted)
		atomic_fetch_sub(&m->total, missing - inserted);
	return 0;
}

/* Remember the items that came near their limits, for top(). */
static void note_hot(struct store_memory *m, const struct store_item *items, size_t n,
		     uint64_t now, const struct scratch *sc)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const struct store_item *it = &items[i];
		unsigned wn = it->limits->n;
		size_t k0 = k;
		k += item_recs(it);
		bool hot = !it->ok;
		for (unsigned j = 0; j < wn && !hot; j++) {
			uint64_t b = it->limits->w[j].burst;
			hot = it->used[j] >= b - b / 2;
		}
		if (!hot || wn == 0)
			continue;
		uint64_t tat[RATE_MAX_WINDOWS] = { 0 };
		struct shard *sh = &m->shards[shard_of(it->key_hash)];
		for (unsigned j = 0; j < wn; j++) {
			long slot = shard_find(sh, sc[k0 + j].hash);
			tat[j] = slot >= 0 ? sh->slots[slot].tat : 0;
		}
		hot_record(sh, it, tat, now);
	}
}

/*
 * The general decision: any number of items, charging rules, new records, eviction.
 */
static int decide_batch(struct store_memory *m, struct store_item *items, size_t n,
			enum store_mode mode, uint64_t now)
{
	uint64_t held = 0;
	size_t windows = 0;
	for (size_t i = 0; i < n; i++) {
		if (!limits_valid(items[i].limits)) {
			atomic_fetch_add(&m->errors, 1);
			return -EINVAL;
		}
		if (items[i].limits->n) {
			held |= 1ull << shard_of(items[i].key_hash);
			windows += item_recs(&items[i]);
		}
	}
	struct scratch sc_stack[SCRATCH_STACK];
	struct scratch *sc = sc_stack;
	if (windows > SCRATCH_STACK) {
		sc = malloc(windows * sizeof(*sc));
		if (!sc) {
			atomic_fetch_add(&m->errors, 1);
			return -ENOMEM;
		}
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const struct store_item *it = &items[i];
		const struct shard *sh = &m->shards[shard_of(it->key_hash)];
		unsigned wn = it->limits->n;
		for (unsigned j = 0; j < wn; j++, k++) {
			sc[k].hash = rec_hash(it->key_hash, j, &it->limits->w[j]);
			shard_prefetch(sh, sc[k].hash);
		}
		if (it->flags & STORE_DISTINCT)
			for (unsigned j = 0; j < wn; j++, k++) {
				sc[k].hash = seen_hash(it->key_hash, it->value_hash, j,
						       &it->limits->w[j]);
				shard_prefetch(sh, sc[k].hash);
			}
		if (it->block_ns) {
			sc[k].hash = block_hash(it->key_hash, it->limits);
			shard_prefetch(sh, sc[k++].hash);
		}
	}

	lock_shards(m, held);
	/* phase 1: read and check every window */
	bool pass = true;
	k = 0;
	for (size_t i = 0; i < n; i++) {
		struct store_item *it = &items[i];
		struct shard *sh = &m->shards[shard_of(it->key_hash)];
		unsigned wn = it->limits->n;
		bool distinct = it->flags & STORE_DISTINCT;
		it->ok = true;
		it->charged = false;
		it->blocked = false;
		it->known = distinct && wn;
		it->retry_ns = 0;
		memset(it->used, 0, sizeof(it->used));
		for (unsigned j = 0; j < wn; j++) {
			struct scratch *x = &sc[k + j];
			x->slot = shard_find(sh, x->hash);
			x->tat = x->slot >= 0 ? sh->slots[x->slot].tat : 0;
			x->cost = it->cost;
			if (distinct) {
				struct scratch *v = &sc[k + wn + j];
				v->slot = shard_find(sh, v->hash);
				v->tat = v->slot >= 0 ? sh->slots[v->slot].tat : 0;
				v->ok = true;
				v->cost = 0;
				if (v->tat > now)
					x->cost = 0; /* the value is counted in this window */
				else
					it->known = false;
			}
			struct gcra_result r;
			if (distinct && x->cost == 0) {
				r = (struct gcra_result){ .ok = true, .new_tat = x->tat,
							  .used = gcra_used(&it->limits->w[j], x->tat, now) };
			} else {
				gcra_check(&it->limits->w[j], x->tat, now, x->cost, &r);
			}
			x->new_tat = r.new_tat;
			x->used = r.used;
			x->ok = r.ok;
			if (!r.ok) {
				it->ok = false;
				if (r.retry_ns > it->retry_ns)
					it->retry_ns = r.retry_ns;
			}
		}
		if (it->block_ns) {
			/* a running block refuses, however much room the windows have */
			struct scratch *b = &sc[k + item_recs(it) - 1];
			b->slot = shard_find(sh, b->hash);
			b->tat = b->slot >= 0 ? sh->slots[b->slot].tat : 0;
			b->ok = true;
			b->cost = 0;
			if (b->tat > now) {
				it->blocked = true;
				it->ok = false;
				if (b->tat - now > it->retry_ns)
					it->retry_ns = b->tat - now;
			}
		}
		k += item_recs(it);
		if (!it->ok && (it->flags & STORE_BLOCKING))
			pass = false;
	}
	int rc = 0;
	if (mode == STORE_CHECK) {
		plan_writes(items, n, pass, now, sc);
		rc = charge(m, items, n, pass, now, held, sc);
	}
	/* used[] of what was not charged: the state as it is */
	bool any_hot = false;
	k = 0;
	for (size_t i = 0; i < n; i++) {
		struct store_item *it = &items[i];
		unsigned wn = it->limits->n;
		any_hot |= !it->ok;
		for (unsigned j = 0; j < wn; j++) {
			const struct scratch *x = &sc[k + j];
			const struct rate_window *w = &it->limits->w[j];
			if (x->write != WRITE_CHARGE || mode != STORE_CHECK || rc < 0)
				it->used[j] = x->ok ? gcra_used(w, x->tat, now) : x->used;
			any_hot |= it->used[j] >= w->burst - w->burst / 2;
		}
		k += item_recs(it);
	}
	if (mode == STORE_CHECK) {
		if (rc < 0)
			atomic_fetch_add(&m->errors, 1);
		else if (any_hot)
			note_hot(m, items, n, now, sc);
	}
	if (held)
		m->shards[__builtin_ctzll(held)].decisions++;
	else
		atomic_fetch_add_explicit(&m->decisions, 1, memory_order_relaxed);
	unlock_shards(m, held);
	if (sc != sc_stack)
		free(sc);
	return rc < 0 ? rc : pass;
}

/*
 * One item whose records all exist (or that charges nothing): the common case, in one
 * pass over its windows and without the scratch bookkeeping, which is most of the work
 * once the record's cache line has arrived.  The result is the general path's (a single
 * item passes unless it is blocking and over; it is charged iff it is ok; see
 * test_store_fast_path_same); anything else goes to decide_batch().
 */
static int decide_one(struct store_memory *m, struct store_item *it, enum store_mode mode,
		      uint64_t now)
{
	const struct rate_limits *l = it->limits;
	unsigned wn = l->n;
	struct shard *sh = &m->shards[shard_of(it->key_hash)];
	uint64_t hash[RATE_MAX_WINDOWS], tat[RATE_MAX_WINDOWS];
	long slot[RATE_MAX_WINDOWS];
	struct gcra_result r[RATE_MAX_WINDOWS];
	for (unsigned j = 0; j < wn; j++) {
		hash[j] = rec_hash(it->key_hash, j, &l->w[j]);
		shard_prefetch(sh, hash[j]);
	}
	shard_lock(sh);
	bool ok = true, missing = false;
	uint64_t retry = 0;
	for (unsigned j = 0; j < wn; j++) {
		slot[j] = shard_find(sh, hash[j]);
		missing |= slot[j] < 0;
		tat[j] = slot[j] >= 0 ? sh->slots[slot[j]].tat : 0;
		gcra_check(&l->w[j], tat[j], now, it->cost, &r[j]);
		if (!r[j].ok) {
			ok = false;
			if (r[j].retry_ns > retry)
				retry = r[j].retry_ns;
		}
	}
	bool charge = mode == STORE_CHECK && ok;
	if (charge && it->cost && missing) {
		shard_unlock(sh);
		return decide_batch(m, it, 1, mode, now);
	}
	it->ok = ok;
	it->charged = charge;
	it->retry_ns = retry;
	memset(it->used, 0, sizeof(it->used));
	bool hot = !ok;
	for (unsigned j = 0; j < wn; j++) {
		if (charge && it->cost) {
			sh->slots[slot[j]].tat = tat[j] = r[j].new_tat;
			it->used[j] = r[j].used;
		} else {
			it->used[j] = r[j].ok ? gcra_used(&l->w[j], tat[j], now) : r[j].used;
		}
		hot |= it->used[j] >= l->w[j].burst - l->w[j].burst / 2;
	}
	if (hot && mode == STORE_CHECK)
		hot_record(sh, it, tat, now);
	sh->decisions++;
	shard_unlock(sh);
	return ok || !(it->flags & STORE_BLOCKING);
}

static int memory_decide(void *ctx, struct store_item *items, size_t n, enum store_mode mode,
			 uint64_t now)
{
	struct store_memory *m = ctx;
	if (n == 1 && items[0].limits && items[0].limits->n &&
	    items[0].limits->n <= RATE_MAX_WINDOWS && !items[0].block_ns &&
	    !(items[0].flags & STORE_DISTINCT))
		return decide_one(m, items, mode, now);
	return decide_batch(m, items, n, mode, now);
}

/* ---- refund, reset ------------------------------------------------------------------ */

static void memory_refund(void *ctx, const struct store_item *items, size_t n, uint64_t now)
{
	struct store_memory *m = ctx;
	uint64_t held = 0;
	for (size_t i = 0; i < n; i++)
		if (items[i].charged && items[i].cost && limits_valid(items[i].limits) &&
		    !(items[i].flags & STORE_DISTINCT))
			held |= 1ull << shard_of(items[i].key_hash);
	lock_shards(m, held);
	for (size_t i = 0; i < n; i++) {
		const struct store_item *it = &items[i];
		/* a distinct value stays counted (store.h) */
		if (!it->charged || !it->cost || !limits_valid(it->limits) ||
		    (it->flags & STORE_DISTINCT))
			continue;
		struct shard *sh = &m->shards[shard_of(it->key_hash)];
		for (unsigned j = 0; j < it->limits->n; j++) {
			const struct rate_window *w = &it->limits->w[j];
			long slot = shard_find(sh, rec_hash(it->key_hash, j, w));
			if (slot < 0)
				continue;
			uint64_t tat = gcra_refund(w, sh->slots[slot].tat, now, it->cost);
			if (tat <= now) {
				/* nothing owed any more: the record says nothing */
				shard_delete(sh, (size_t)slot);
				atomic_fetch_sub(&m->total, 1);
			} else {
				sh->slots[slot].tat = tat;
			}
		}
	}
	unlock_shards(m, held);
}

static int memory_reset(void *ctx, uint64_t key_hash, const struct rate_limits *limits)
{
	struct store_memory *m = ctx;
	if (!limits_valid(limits))
		return 0;
	struct shard *sh = &m->shards[shard_of(key_hash)];
	int existed = 0;
	shard_lock(sh);
	for (unsigned j = 0; j <= limits->n; j++) {
		/* every window, then the block */
		uint64_t h = j < limits->n ? rec_hash(key_hash, j, &limits->w[j]) : block_hash(key_hash, limits);
		long slot = shard_find(sh, h);
		if (slot < 0)
			continue;
		shard_delete(sh, (size_t)slot);
		atomic_fetch_sub(&m->total, 1);
		existed = 1;
	}
	long h = sh->hot ? hot_find(sh->hot, key_hash) : -1;
	if (h >= 0)
		sh->hot->in_use &= ~(1ull << h);
	shard_unlock(sh);
	return existed;
}

/* ---- top ----------------------------------------------------------------------------- */

static int top_cmp(const void *a, const void *b)
{
	const struct store_top_entry *x = a, *y = b;
	if (x->fill_ppm != y->fill_ppm)
		return x->fill_ppm > y->fill_ppm ? -1 : 1;
	if (x->key_hash != y->key_hash)
		return x->key_hash < y->key_hash ? -1 : 1;
	return 0;
}

static size_t memory_top(void *ctx, struct store_top_entry *ret, size_t max, uint64_t now)
{
	struct store_memory *m = ctx;
	if (max == 0)
		return 0;
	/* room for the entries there are now, and some that may come while we look (XXX:
	 * past those, late arrivals are left out of this answer) */
	size_t cap = 16;
	for (unsigned s = 0; s < SHARDS; s++) {
		struct shard *sh = &m->shards[s];
		shard_lock(sh);
		if (sh->hot)
			cap += (size_t)__builtin_popcountll(sh->hot->in_use);
		shard_unlock(sh);
	}
	struct store_top_entry *all = malloc(cap * sizeof(*all));
	if (!all)
		return 0;
	size_t got = 0;
	for (unsigned s = 0; s < SHARDS; s++) {
		struct shard *sh = &m->shards[s];
		shard_lock(sh);
		for (uint64_t u = sh->hot ? sh->hot->in_use : 0; u && got < cap; u &= u - 1) {
			unsigned i = (unsigned)__builtin_ctzll(u);
			struct hot *e = &sh->hot->e[i];
			uint64_t key_hash = sh->hot->key_hash[i];
			struct store_top_entry *t = &all[got];
			memset(t, 0, sizeof(*t));
			unsigned fill = 0;
			for (unsigned j = 0; j < e->limits.n; j++) {
				const struct rate_window *w = &e->limits.w[j];
				long slot = shard_find(sh, rec_hash(key_hash, j, w));
				t->used[j] = slot >= 0 ? gcra_used(w, sh->slots[slot].tat, now) : 0;
				unsigned f = fill_ppm(t->used[j], w->burst);
				if (f > fill)
					fill = f;
			}
			if (fill == 0) {
				sh->hot->in_use &= ~(1ull << i); /* cooled down, or evicted */
				continue;
			}
			t->fill_ppm = fill;
			memcpy(t->rule, e->rule, sizeof(t->rule));
			memcpy(t->key, e->key, sizeof(t->key));
			t->key_hash = key_hash;
			t->limits = e->limits;
			got++;
		}
		shard_unlock(sh);
	}
	qsort(all, got, sizeof(*all), top_cmp);
	if (got > max)
		got = max;
	memcpy(ret, all, got * sizeof(*all));
	free(all);
	return got;
}

/* ---- expire, stats -------------------------------------------------------------------- */

static size_t memory_expire(void *ctx, uint64_t now)
{
	struct store_memory *m = ctx;
	size_t dropped = 0, budget = 0;
	/* A fixed budget would sweep a large table ever more slowly: past about 65536 x 3/8
	 * new keys a second (one-off senders, client addresses), the records that expire
	 * between two visits outnumber the slots the sweep frees, and the table grows to
	 * max_keys although nearly all of it is dead.  A budget in proportion to the table
	 * visits every slot every EXPIRE_SWEEP calls, so the dead records are at most
	 * EXPIRE_SWEEP seconds of new keys.  (Masks read without the locks: a stale one only
	 * changes the budget.)  XXX the cost follows the table: at a million live records
	 * a call takes 15 ms of the calling thread (bench/store_bench, "expiry sweep"), once
	 * a second, each shard locked for 1/64 of it (about 0.25 ms). */
	for (unsigned s = 0; s < SHARDS; s++)
		budget += __atomic_load_n(&m->shards[s].mask, __ATOMIC_RELAXED) + 1;
	budget /= EXPIRE_SWEEP;
	if (budget < EXPIRE_SLOTS)
		budget = EXPIRE_SLOTS;
	pthread_mutex_lock(&m->expire_lock);
	for (unsigned visited = 0; visited < SHARDS && budget; visited++) {
		struct shard *sh = &m->shards[m->expire_shard];
		shard_lock(sh);
		size_t cap = sh->mask + 1, i = m->expire_slot < cap ? m->expire_slot : 0;
		while (i < cap && budget) {
			budget--;
			if (sh->slots[i].hash && sh->slots[i].tat <= now) {
				/* a later record may shift into i: look at i again */
				shard_delete(sh, i);
				dropped++;
				continue;
			}
			i++;
		}
		shard_unlock(sh);
		if (i < cap) {
			m->expire_slot = i;
			break;
		}
		m->expire_shard = (m->expire_shard + 1) % SHARDS;
		m->expire_slot = 0;
	}
	pthread_mutex_unlock(&m->expire_lock);
	if (dropped) {
		atomic_fetch_sub(&m->total, dropped);
		atomic_fetch_add(&m->expired, dropped);
	}
	if (atomic_load(&m->evicting)) {
		uint64_t max = atomic_load(&m->max_keys), total = atomic_load(&m->total);
		if (total + max / 64 < max && atomic_exchange(&m->evicting, false))
			log_msg(LOG_LEVEL_NOTICE,
				"memory store no longer full (max_keys=%llu, keys=%llu): %llu records evicted",
				(unsigned long long)max, (unsigned long long)total,
				(unsigned long long)(atomic_load(&m->evicted) -
						     atomic_load(&m->episode_evicted)));
	}
	return dropped;
}

static void memory_stats(void *ctx, struct store_stats *ret)
{
	struct store_memory *m = ctx;
	uint64_t bytes = sizeof(*m), decisions = atomic_load(&m->decisions);
	for (unsigned s = 0; s < SHARDS; s++) {
		struct shard *sh = &m->shards[s];
		shard_lock(sh);
		bytes += (uint64_t)(sh->mask + 1) * sizeof(struct rec);
		if (sh->hot)
			bytes += sizeof(struct hot_table);
		decisions += sh->decisions;
		shard_unlock(sh);
	}
	*ret = (struct store_stats){
		.keys = atomic_load(&m->total),
		.max_keys = atomic_load(&m->max_keys),
		.bytes = bytes,
		.evicted = atomic_load(&m->evicted),
		.expired = atomic_load(&m->expired),
		.decisions = decisions,
		.errors = atomic_load(&m->errors),
	};
}

/* ---- life ------------------------------------------------------------------------------ */

static void memory_destroy(void *ctx)
{
	struct store_memory *m = ctx;
	if (!m)
		return;
	for (unsigned s = 0; s < SHARDS; s++) {
		pthread_mutex_destroy(&m->shards[s].lock);
		free(m->shards[s].slots);
		free(m->shards[s].hot);
	}
	pthread_mutex_destroy(&m->expire_lock);
	pthread_mutex_destroy(&m->save_lock);
	free(m->snapshot);
	free(m);
}

static uint64_t random_seed(void)
{
	uint64_t seed;
	if (getrandom(&seed, sizeof(seed), 0) == (ssize_t)sizeof(seed))
		return seed;
	/* XXX: no entropy yet (early boot); the seed only spreads keys, it is no secret
	 * that guards anything but hash flooding, so the clock will do. */
	seed = realtime_ns() ^ now_ns() ^ (uint64_t)getpid() << 32;
	return XXH64(&seed, sizeof(seed), 0);
}

struct store *store_memory_new(const struct store_memory_conf *conf, uint64_t now,
			       char *warn, size_t warnlen)
{
	if (warnlen)
		warn[0] = '\0';
	struct store *s = calloc(1, sizeof(*s));
	struct store_memory *m = aligned_alloc(64, (sizeof(*m) + 63) / 64 * 64);
	if (!s || !m) {
		free(s);
		free(m);
		return NULL;
	}
	memset(m, 0, sizeof(*m));
	m->store = s;
	for (unsigned i = 0; i < SHARDS; i++) {
		struct shard *sh = &m->shards[i];
		pthread_mutex_init(&sh->lock, NULL);
		sh->mask = INITIAL_SLOTS - 1;
		sh->rng = 0x9e3779b97f4a7c15ull * (i + 1);
	}
	pthread_mutex_init(&m->expire_lock, NULL);
	pthread_mutex_init(&m->save_lock, NULL);
	for (unsigned i = 0; i < SHARDS; i++) {
		m->shards[i].slots = calloc(INITIAL_SLOTS, sizeof(struct rec));
		if (!m->shards[i].slots)
			goto fail;
	}
	atomic_store(&m->max_keys, conf && conf->max_keys ? conf->max_keys : MAX_KEYS_DEFAULT);
	if (conf && conf->snapshot && !(m->snapshot = strdup(conf->snapshot)))
		goto fail;
	s->type = "memory";
	s->ops = &memory_ops;
	s->ctx = m;
	if (!(s->ov = store_ov_new()))
		goto fail;
	s->seed = random_seed();
	if (m->snapshot)
		store_memory_snap_load_file(s, m->snapshot, now, warn, warnlen);
	return s;
fail:
	memory_destroy(m);
	free(s);
	return NULL;
}

void store_memory_set_max_keys(struct store *s, uint64_t max_keys)
{
	struct store_memory *m = s->ctx;
	atomic_store(&m->max_keys, max_keys ? max_keys : MAX_KEYS_DEFAULT);
}

static const struct store_ops memory_ops = {
	.decide = memory_decide,
	.refund = memory_refund,
	.reset = memory_reset,
	.top = memory_top,
	.expire = memory_expire,
	.stats = memory_stats,
	.save = store_memory_snap_save,
	.destroy = memory_destroy,
};
