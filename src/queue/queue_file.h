/*
 * queue_file -- the message file of the queue (doc/QUEUE.md): queue IDs, the records, and
 * the loader that indexes a file.
 *
 * A codec: no I/O.  The writer appends records to a caller's buffer (the queue writes
 * them out as they come, so a large body never sits whole in memory); the loader takes a
 * whole file image and either refuses it or returns an index of where every recipient's
 * status byte and the control bytes are, so that a state change is one byte written at
 * a known offset.
 *
 * Invariants: a file the loader accepts starts with a start record, ends with an end
 * record whose XXH64 covers every byte before it (status and control bytes counted as
 * zero: they change in place), has exactly one envelope and one
 * control record before the first recipient, at least one recipient, and body records
 * only after the recipients.  Nothing past the end record.
 */
#ifndef SLUICE_QUEUE_FILE_H
#define SLUICE_QUEUE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "str.h"

#define QUEUE_ID_LEN 16
/*
 * The character of a QID that names its msg/H and log/H directory: bits 12-16 of the
 * arrival time in microseconds, so H changes every 4.1 ms and comes round every 131 ms.
 * Messages that arrive together share a directory (a commit batch flushes one or two
 * directories, not one per message), and a queue filled over longer than 131 ms spreads
 * evenly over the 32 directories.
 */
#define QUEUE_ID_BUCKET 7
#define QUEUE_MAX_ADDR 1024          /* bytes of a sender or recipient address */
#define QUEUE_MAX_RECIPIENTS 1000000
#define QUEUE_BODY_CHUNK 65536       /* the largest body record */
#define QUEUE_MAX_CLIENT 512         /* client address and HELO, together */
#define QUEUE_MAX_ENVID 100          /* bytes of a decoded ENVID (RFC 3461 4.4) */
#define QUEUE_MAX_ORCPT 500          /* bytes of a decoded ORCPT, "type;address" (4.2) */

enum queue_rcpt_status {
	QUEUE_TODO = 'T',
	QUEUE_UNCERTAIN = 'U',
	QUEUE_DELIVERED = 'D',
	QUEUE_FAILED = 'F',
	/* delivered, and a "relayed" notice (RFC 3461 6.2.2) is owed to the sender: treated
	 * as D everywhere but by the bounce, which reports it; version 2 files only */
	QUEUE_RELAYED = 'N',
};

/* The control bytes (one record of QUEUE_CONTROL_LEN bytes, each changed in place). */
enum queue_control {
	QUEUE_CTL_HOLD = 0,      /* '-' or 'H' */
	QUEUE_CTL_BOUNCE,        /* '-' none due, 'P' pending, 'S' sent */
	QUEUE_CTL_WARNED,        /* '-', or 'W': the delay notice was sent */
	QUEUE_CONTROL_LEN = 8,
};

enum queue_esmtp_flags {
	QUEUE_8BITMIME = 1u << 0,
	QUEUE_SMTPUTF8 = 1u << 1,
};

/* RET= (RFC 3461 4.3), kept in the envelope (version 2). */
enum queue_ret {
	QUEUE_RET_NONE = 0,
	QUEUE_RET_FULL,
	QUEUE_RET_HDRS,
};

/* NOTIFY= (RFC 3461 4.1) of a recipient (version 2): 0 when not given. */
enum queue_notify {
	QUEUE_NOTIFY_NEVER = 1u << 0,
	QUEUE_NOTIFY_SUCCESS = 1u << 1,
	QUEUE_NOTIFY_FAILURE = 1u << 2,
	QUEUE_NOTIFY_DELAY = 1u << 3,
};

/*
 * A queue ID: 16 characters of Crockford base32 -- 52 bits of the arrival time in
 * microseconds, then 28 bits of seq -- so that IDs sort by arrival as strings.  out gets
 * 17 bytes (NUL-terminated).
 */
void queue_id_make(char out[QUEUE_ID_LEN + 1], uint64_t now_us, uint32_t seq);
bool queue_id_valid(struct str s);
/* The arrival time an ID carries (microseconds since the epoch). */
uint64_t queue_id_time_us(const char id[QUEUE_ID_LEN]);

struct queue_envelope {
	char id[QUEUE_ID_LEN + 1];
	uint64_t arrival_us;
	struct str sender;       /* empty: the null sender <> */
	struct str client;       /* "[addr]" or "name [addr]", for Received: and logs */
	struct str helo;
	uint32_t flags;          /* enum queue_esmtp_flags */
	uint64_t size;           /* declared with MAIL SIZE=, 0 if none */
	uint8_t ret;             /* enum queue_ret */
	struct str envid;        /* ENVID=, xtext-decoded (printable ASCII 0x20-0x7e, checked
				    by the writer and the loader); empty: none */
	bool rcpt_dsn;           /* writing: some recipient will have NOTIFY or ORCPT */
};

/* ---- writing ---- */
/*
 * A file being written: records are appended to out (the caller writes out's bytes to
 * the file and resets it as it goes, so a large body never sits whole in memory), and a
 * running checksum is kept over them -- with every status byte and the control bytes
 * counted as zero, since those change in place after the commit.
 */
struct queue_writer;
struct queue_writer *queue_writer_new(struct buf *out);
struct queue_writer *queue_writer_free(struct queue_writer *w);
/* Start, envelope, control bytes ('-' each).  The file is written in version 2 only when
 * it carries a DSN parameter (RET, ENVID, or e->rcpt_dsn), in version 1 otherwise, so that
 * a downgrade to a build before version 2 still reads the mail that has none
 * (doc/QUEUE.md).  0, -EINVAL (a field over its limit) or -ENOBUFS (out is full; nothing
 * of the records was appended). */
int queue_write_head(struct queue_writer *w, const struct queue_envelope *e);
int queue_write_rcpt(struct queue_writer *w, struct str addr);
/* A recipient with its DSN parameters (-EINVAL in a version 1 file: see
 * queue_write_head): notify (enum queue_notify bits, 0 if none; NEVER
 * only alone) and orcpt, ORCPT= xtext-decoded as "type;address" (empty if none, at most
 * QUEUE_MAX_ORCPT bytes: an atom, ';', and at least one printable ASCII character). The
 * loader refuses a file whose fields break these rules, so -EINVAL here. */
int queue_write_rcpt_dsn(struct queue_writer *w, struct str addr, unsigned notify,
			 struct str orcpt);
/* A body chunk of 1 to QUEUE_BODY_CHUNK bytes (longer data: several calls). */
int queue_write_body(struct queue_writer *w, struct str chunk);
/* The end record. */
int queue_write_end(struct queue_writer *w);

/* ---- loading ---- */
struct queue_rcpt {
	uint64_t status_off;     /* the status byte's offset in the file */
	char status;             /* enum queue_rcpt_status (N only in version 2) */
	uint8_t notify;          /* enum queue_notify bits; 0 (none) in version 1 files */
	struct str addr;         /* a slice of the image */
	struct str orcpt;        /* "type;address", a slice of the image; empty: none */
};

struct queue_index {
	uint32_t version;                 /* of the file: 1 or 2 (doc/QUEUE.md) */
	struct queue_envelope env;
	uint64_t control_off;             /* offset of control byte 0 */
	char control[QUEUE_CONTROL_LEN];
	struct queue_rcpt *rcpt;          /* owned: queue_index_clear() */
	size_t nrcpt;
	uint64_t body_len;                /* bytes of body over all body records */
	uint64_t body_first;              /* offset of the first body record, 0 if none */
	size_t nbody;                     /* body records */
};

/*
 * Index a whole file image.  0 with *ret filled (slices point into p, which must outlive
 * the index), -EINVAL with *why (a static string naming the fault), or -ENOMEM.  Checks
 * everything listed in the invariants above; status and control bytes must be known
 * values.  Costs O(size) time and O(recipients) memory.
 */
int queue_file_load(const void *p, size_t n, struct queue_index *ret, const char **why);
void queue_index_clear(struct queue_index *ix);
/* The body records of an image, in order: calls fn for each chunk; for readers that
 * stream the message out (fn returns <0 to stop, and that is returned). */
int queue_file_body(const void *p, size_t n, const struct queue_index *ix,
		    int (*fn)(void *arg, struct str chunk), void *arg);

#endif
