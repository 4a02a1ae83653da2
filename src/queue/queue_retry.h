/*
 * queue_retry -- the record of the retry journal (doc/QUEUE.md, "Retry times"): one
 * recipient's next attempt time and attempt count, or the mark that starts a snapshot.
 *
 * A codec: no I/O.  A record is QUEUE_RETRY_RECORD bytes, the same for every kind, and
 * carries its own XXH64, so that a reader can take a journal image as it finds it --
 * torn at its end, or with damaged bytes anywhere -- and keep every intact record:
 * queue_retry_scan() skips what does not decode and finds the next record by its magic.
 *
 *   off len
 *    0   4  magic "SQRJ"
 *    4   1  kind: 'R' a recipient's state, 'S' the start of a snapshot
 *    5   3  zero
 *    8  16  'R': the QID; 'S': zero bytes
 *   24   4  'R': the recipient's index in the file (u32, little-endian); 'S': 0
 *   28   4  'R': attempts made (u32); 'S': 0
 *   32   8  'R': next attempt, microseconds since the epoch, 0 = at once (u64);
 *           'S': the time the snapshot was taken
 *   40   8  XXH64 (seed 0) of bytes 0-39 (u64, little-endian)
 */
#ifndef SLUICE_QUEUE_RETRY_H
#define SLUICE_QUEUE_RETRY_H

#include <stddef.h>
#include <stdint.h>

#include "queue_file.h"

#define QUEUE_RETRY_RECORD 48

enum queue_retry_kind {
	QUEUE_RETRY_STATE = 0,     /* 'R' */
	QUEUE_RETRY_SNAPSHOT,      /* 'S' */
};

struct queue_retry_rec {
	enum queue_retry_kind kind;
	char id[QUEUE_ID_LEN + 1]; /* STATE: a QID; SNAPSHOT: "" */
	uint32_t rcpt;             /* < QUEUE_MAX_RECIPIENTS */
	uint32_t attempts;
	uint64_t next_us;          /* SNAPSHOT: when it was taken */
};

/* Encode r into out.  0, or -EINVAL (a STATE without a valid QID, a recipient index
 * over QUEUE_MAX_RECIPIENTS, an unknown kind): out is then untouched. */
int queue_retry_encode(const struct queue_retry_rec *r, unsigned char out[QUEUE_RETRY_RECORD]);
/* Decode the record at p (n bytes available).  0 with *ret, or -EINVAL (short, a wrong
 * magic, kind or padding, a bad checksum, an invalid QID or recipient index). */
int queue_retry_decode(const unsigned char *p, size_t n, struct queue_retry_rec *ret);

struct queue_retry_scan_stats {
	size_t records;            /* decoded and passed to fn */
	size_t skipped_bytes;      /* bytes that belonged to no intact record */
};
/*
 * Walk a journal image: fn(arg, rec, off) for each intact record in order of position.
 * Where a record does not decode, the scan moves on to the next "SQRJ" after its first
 * byte, so a torn record or garbage anywhere costs only the records it hit.  fn returns
 * < 0 to stop, and that is returned; else 0.  st may be NULL.
 */
int queue_retry_scan(const unsigned char *p, size_t n,
		     int (*fn)(void *arg, const struct queue_retry_rec *r, size_t off),
		     void *arg, struct queue_retry_scan_stats *st);

#endif
