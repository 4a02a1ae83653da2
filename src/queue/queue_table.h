/*
 * queue_table -- the in-memory index of the queue (queue.h): one entry per committed
 * message, in order of its ID (= of arrival), with the counts `sluice status` and the
 * metrics show kept up to date as entries change, so that reading them costs nothing.
 *
 * A skip list (p = 1/4, at most QUEUE_TABLE_LEVELS levels): insert, look-up and remove
 * are O(log n) wherever the ID falls -- the loader inserts old IDs in order while the
 * committer inserts new ones -- and walking in order is following one pointer.  An
 * entry's level comes from a hash of its ID, so no random state is shared.
 *
 * An entry is one allocation: the struct, its forward pointers, its recipients' retry
 * state, their status bytes, then the sender and the addresses (NUL-terminated).  A
 * one-recipient message with two 20-byte addresses costs about 150 bytes.
 *
 * No locks: the caller (queue.c) holds its ix_lock around every call.
 */
#ifndef SLUICE_QUEUE_TABLE_H
#define SLUICE_QUEUE_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "queue_file.h"

#define QUEUE_TABLE_LEVELS 16

struct qrcpt {
	uint64_t next_us;        /* the next attempt, µs since the epoch; 0: at once */
	uint32_t attempts;
	uint32_t addr_off;       /* of its address, from the sender's first byte */
};

struct qentry {
	char id[QUEUE_ID_LEN + 1];
	char control[QUEUE_CONTROL_LEN];
	uint8_t level;           /* forward pointers */
	uint32_t nrcpt;
	uint64_t arrival_us;
	uint64_t size;           /* bytes of the message */
	struct qentry *fwd[];    /* then: qrcpt[nrcpt], status[nrcpt], sender, addresses */
};

static inline struct qrcpt *qentry_rcpt(const struct qentry *e)
{
	return (struct qrcpt *)(void *)((char *)(void *)e + sizeof(*e) +
					e->level * sizeof(e->fwd[0]));
}
static inline char *qentry_status(const struct qentry *e)
{
	return (char *)(qentry_rcpt(e) + e->nrcpt);
}
static inline const char *qentry_sender(const struct qentry *e)
{
	return qentry_status(e) + e->nrcpt;
}
static inline const char *qentry_addr(const struct qentry *e, size_t i)
{
	return qentry_sender(e) + qentry_rcpt(e)[i].addr_off;
}

/*
 * An entry from a sender and its recipients given as NUL-terminated names in one block
 * (names_len bytes, nrcpt + 1 names): every status T, control bytes '-', no retry state.
 * NULL without memory or when the block does not hold nrcpt + 1 names.
 */
struct qentry *qentry_new(const char *id, uint64_t arrival_us, uint64_t size,
			  const char *names, size_t names_len, size_t nrcpt);
/* The bytes an entry takes (for the benchmark), its allocator's overhead aside. */
size_t qentry_bytes(const struct qentry *e);
struct qentry *qentry_free(struct qentry *e);

struct queue_table {
	struct qentry *head[QUEUE_TABLE_LEVELS];
	unsigned levels;          /* levels in use */
	size_t n;                 /* entries */
	/* counts over every entry */
	uint64_t rcpt_todo, rcpt_uncertain, rcpt_delivered, rcpt_failed;
	uint64_t held;            /* control[0] 'H' */
	uint64_t bytes;           /* sizes */
	uint64_t retry_live;      /* recipients whose retry state is not (0, 0) */
};

void queue_table_init(struct queue_table *t);
/* Free every entry. */
void queue_table_clear(struct queue_table *t);
/* Add e (the table owns it from here on): 0, or -EEXIST (e is not taken). */
int queue_table_insert(struct queue_table *t, struct qentry *e);
/* The entry of a NUL-terminated id, or NULL. */
struct qentry *queue_table_get(const struct queue_table *t, const char *id);
/* Take the entry of id out of the table and return it (the caller frees it), or NULL. */
struct qentry *queue_table_remove(struct queue_table *t, const char *id);
/* The first entry (the oldest), the one after e, the first whose ID is above id. */
struct qentry *queue_table_first(const struct queue_table *t);
static inline struct qentry *queue_table_next(const struct qentry *e)
{
	return e->fwd[0];
}
struct qentry *queue_table_after(const struct queue_table *t, const char *id);

/* Changes that keep the counts right.  i < e->nrcpt, which < QUEUE_CONTROL_LEN. */
void queue_table_set_status(struct queue_table *t, struct qentry *e, size_t i, char status);
void queue_table_set_control(struct queue_table *t, struct qentry *e, unsigned which,
			     char byte);
void queue_table_set_retry(struct queue_table *t, struct qentry *e, size_t i,
			   uint64_t next_us, uint32_t attempts);

#endif
