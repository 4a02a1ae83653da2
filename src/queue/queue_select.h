/*
 * queue_select -- which messages a `sluice queue` command applies to, and the counts of
 * `sluice queue summary`: pure functions of an index entry and the clock, no locks, no
 * I/O (queue.c walks the index and calls them under its lock).
 *
 * A selection is a conjunction; every member left empty matches everything:
 *
 *   ids      the message's ID is in a sorted set of IDs
 *   sender   "a@example.com": the sender, without regard to case; "@example.com": any
 *            sender at that domain; "<>" (or ""): the null sender
 *   older    the message arrived at least this long ago
 *   held     the message's hold byte is 'H' (state "held")
 *   domain   "example.com": a recipient at example.com; ".example.com": a recipient at
 *            any subdomain of it (not example.com itself); without regard to case
 *   state    "deferred": a pending recipient whose next attempt is in the future;
 *            "todo": a pending recipient that is due now; "uncertain": a recipient U
 *
 * domain and state are asked of the same recipient, and only of pending ones (T or U):
 * "--domain example.com --state deferred" is a message with a deferred recipient at
 * example.com.  A finished recipient (D or F) matches neither.
 *
 * The summary counts pending recipients by a key (the recipient's domain, or the
 * sender's) and by the age of their message, in qshape's buckets: under 5 minutes, under
 * 10, 20, 40, ... 1280 minutes, and older.
 */
#ifndef SLUICE_QUEUE_SELECT_H
#define SLUICE_QUEUE_SELECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "queue_file.h"

struct qentry;

enum queue_select_state {
	QUEUE_SEL_ANY = 0,
	QUEUE_SEL_DEFERRED,
	QUEUE_SEL_TODO,
	QUEUE_SEL_HELD,
	QUEUE_SEL_UNCERTAIN,
};

struct queue_select {
	const char (*ids)[QUEUE_ID_LEN + 1]; /* sorted, without duplicates; NULL: any */
	size_t nids;
	const char *sender;                  /* NULL: any */
	const char *domain;                  /* NULL: any */
	uint64_t older_us;                   /* 0: any */
	enum queue_select_state state;
};

/* "deferred", "todo", "held", "uncertain" (or "any"): 0 and *ret, or -EINVAL. */
int queue_select_state_parse(const char *s, enum queue_select_state *ret);
const char *queue_select_state_name(enum queue_select_state s);
/* Does the selection restrict anything? */
bool queue_select_any(const struct queue_select *s);
/* Is id in the sorted set (O(log n))? */
bool queue_select_has_id(const struct queue_select *s, const char *id);
/* The domain of an address: after its last '@', or "" when it has none. */
const char *queue_addr_domain(const char *addr);
/* Does an address's domain match a pattern ("example.com" or ".example.com")? */
bool queue_select_domain_match(const char *pattern, const char *addr);
/* Does a sender match a pattern ("a@b", "@b", "<>" or "")? */
bool queue_select_sender_match(const char *pattern, const char *sender);
/* Is message e selected, at now_us (µs since the epoch)? */
bool queue_select_match(const struct queue_select *s, const struct qentry *e,
			uint64_t now_us);
/* Does recipient i of e satisfy the recipient members (domain, state)?  Only pending
 * recipients do. */
bool queue_select_rcpt_match(const struct queue_select *s, const struct qentry *e,
			     size_t i, uint64_t now_us);

/* ---- the summary ---- */

#define QUEUE_SUMMARY_BUCKETS 10 /* 5m 10m 20m 40m 80m 160m 320m 640m 1280m 1280m+ */

/* The bucket of an age: 0 under 5 minutes, k under 5 * 2^k minutes, 9 at 1280 or more. */
unsigned queue_summary_bucket(uint64_t age_us);
/* The bucket's column title ("5m" ... "1280m+"). */
const char *queue_summary_bucket_name(unsigned b);

struct queue_summary_row {
	char *key;                               /* a domain, lower case */
	uint64_t total;
	uint64_t count[QUEUE_SUMMARY_BUCKETS];
};

/* Counts by key, in a hash table (open addressing, grows by doubling). */
struct queue_summary {
	struct queue_summary_row *rows;          /* cap slots, key NULL when free */
	size_t cap, n;
	struct queue_summary_row total;          /* every recipient counted */
};

void queue_summary_init(struct queue_summary *s);
void queue_summary_clear(struct queue_summary *s);
/* Count one recipient under key (compared without regard to case) at age_us.  0 or
 * -ENOMEM (then it is counted in the total only). */
int queue_summary_add(struct queue_summary *s, const char *key, uint64_t age_us);
/* Pointers to the rows, the most counted first (then by key), at most max; *ret is
 * malloc'ed.  0 or -ENOMEM. */
int queue_summary_top(const struct queue_summary *s, size_t max,
		      const struct queue_summary_row ***ret, size_t *ret_n);

#endif
