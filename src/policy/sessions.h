/*
 * sessions -- the counters of count = "sessions" rules: SMTP sessions at once per
 * (rule, key), kept apart from the rule sets (see sessions.c).  Any thread.
 */
#ifndef SLUICE_SESSIONS_H
#define SLUICE_SESSIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Take a slot of key_hash if fewer than max are held (or whatever the count, with force:
 * the shared store decided).  Returns 1 with *ret_count the count with it, 0 when full
 * (*ret_count the count), -ENOMEM when the registry is full (nothing taken).
 */
int sessions_take(uint64_t key_hash, unsigned max, bool force, unsigned *ret_count);
/* Give one back (exactly once per slot taken). */
void sessions_give(uint64_t key_hash);
/* The slots held now for key_hash. */
unsigned sessions_count(uint64_t key_hash);
/* Every key with slots held and its count, up to max (shared leases' renewal). */
size_t sessions_list(uint64_t *ret_hash, unsigned *ret_count, size_t max);
/* Keys held, and slots not counted because the registry was full. */
void sessions_stats(uint64_t *ret_keys, uint64_t *ret_overflows);

#endif
