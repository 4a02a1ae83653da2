/*
 * store_memory_int -- the rooms of the memory store, and what they share.
 *
 *   store_memory.c       the tables: records, shards, decisions, eviction, hot keys,
 *                        expiry (any thread, under the shards' locks)
 *   store_memory_snap.c  the snapshot file: writing it (the main thread's timer, and at
 *                        shutdown) and reading it back at start or from a buffer (fuzzer)
 */
#ifndef SLUICE_STORE_MEMORY_INT_H
#define SLUICE_STORE_MEMORY_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

#define SHARD_BITS 6
#define SHARDS (1u << SHARD_BITS)
#define SHARD_SHIFT (64 - SHARD_BITS)
#define SHARD_HASH_MASK ((uint64_t)(SHARDS - 1) << SHARD_SHIFT)
#define INITIAL_SLOTS 16
#define HOT_MAX 64          /* = bits in hot_table.in_use */
#define HOT_SAMPLE 8        /* entries compared to choose the one a new hot key replaces */
#define SAMPLE_RECORDS 16   /* records compared to choose a victim */
#define SAMPLE_SLOTS 64     /* slots scanned at most for them */
#define EXPIRE_SLOTS 65536  /* slots visited by one expire() call, at least */
#define EXPIRE_SWEEP 1      /* and at least 1/EXPIRE_SWEEP of all slots */
#define MAX_KEYS_DEFAULT 1000000u

#define SNAP_MAGIC "SLUICESNAP1\n"
#define SNAP_MAGIC_LEN 12
#define SNAP_VERSION 2
#define SNAP_OV_MIN 32      /* an entry without windows, 1-byte rule and key */
#define SNAP_HEADER 32
#define SNAP_RECORD 16

struct rec {
	uint64_t hash; /* 0: empty slot */
	uint64_t tat;
};

struct hot {
	struct rate_limits limits;
	uint64_t tat[RATE_MAX_WINDOWS];   /* at the last recording, to estimate the fill now */
	double inv_span[RATE_MAX_WINDOWS]; /* 1 / (B * T) */
	char rule[STORE_TOP_RULE];
	char key[STORE_TOP_KEY];
};

/* A shard's hot keys: the identities apart, so that finding one reads 512 bytes. */
struct hot_table {
	uint64_t in_use;                  /* bit i: entry i */
	uint64_t key_hash[HOT_MAX];
	struct hot e[HOT_MAX];
};

struct shard {
	pthread_mutex_t lock;
	struct rec *slots;
	size_t mask;            /* slots - 1 */
	size_t count;
	uint64_t rng;           /* sample positions */
	uint64_t decisions;
	struct hot_table *hot;  /* allocated at the first use */
} __attribute__((aligned(64)));

struct store_memory {
	struct shard shards[SHARDS];
	struct store *store;    /* for the seed */
	char *snapshot;
	_Atomic uint64_t total;
	_Atomic uint64_t max_keys;
	_Atomic uint64_t evicted;
	_Atomic uint64_t expired;
	_Atomic uint64_t errors;
	_Atomic uint64_t decisions; /* those that locked no shard */
	_Atomic unsigned victim_cursor;
	atomic_bool evicting;
	_Atomic uint64_t episode_evicted; /* evicted when the episode began */
	pthread_mutex_t expire_lock;
	unsigned expire_shard;
	size_t expire_slot;
	pthread_mutex_t save_lock;
};


static inline void shard_lock(struct shard *sh)
{
	pthread_mutex_lock(&sh->lock);
}

static inline bool shard_trylock(struct shard *sh)
{
	return pthread_mutex_trylock(&sh->lock) == 0;
}

static inline void shard_unlock(struct shard *sh)
{
	pthread_mutex_unlock(&sh->lock);
}

static inline unsigned shard_of(uint64_t hash)
{
	return (unsigned)(hash >> SHARD_SHIFT);
}

/* store_memory.c: one shard's table (the caller holds its lock). */
long shard_find(const struct shard *sh, uint64_t h);
void shard_insert(struct shard *sh, uint64_t h, uint64_t tat);
int shard_reserve(struct shard *sh, size_t records);

/* store_memory_snap.c: ops->save, and the snapshot read at start (see there). */
int store_memory_snap_save(void *ctx, char *err, size_t errlen);
void store_memory_snap_load_file(struct store *s, const char *path, uint64_t now, char *warn,
				 size_t warnlen);

#endif
