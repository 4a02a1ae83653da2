/*
 * pfpolicy -- Postfix SMTPD access policy delegation: a pure codec.
 *
 * Request: "name=value\n" lines ended by an empty line ("\n").  Names are 1..64 bytes of
 * [A-Za-z0-9_-]; values hold no NUL and no LF (8-bit bytes are kept).  A request holds at
 * most PFPOLICY_MAX_ATTRS distinct attributes and at most the caller's max bytes (including
 * the final empty line); a repeated attribute keeps its last value (as Postfix's own
 * servers).  Postfix ends lines with a bare LF; a CR right before an LF is tolerated (see
 * pfpolicy.c).
 * Reply: "action=TEXT\n\n".
 *
 * The parser is resumable: the caller keeps a struct pfpolicy_parser per connection and
 * calls pfpolicy_parse() each time more bytes arrive, with the same (grown) buffer: p
 * points at the start of the request each time (it may move if the buffer is reallocated,
 * the parser keeps offsets, not pointers), and the n bytes given earlier are unchanged.
 * Bytes already scanned are not scanned again, so a request delivered one byte at a time
 * costs O(length).
 */
#ifndef SLUICE_PROTO_PFPOLICY_H
#define SLUICE_PROTO_PFPOLICY_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "str.h"

#define PFPOLICY_MAX_ATTRS 64
#define PFPOLICY_MAX_NAME 64
#define PFPOLICY_MAX_ACTION 4000 /* bytes of action text in a reply */

struct pfpolicy_attr {
	struct str name;
	struct str value;
};

struct pfpolicy_request {
	size_t n;
	struct pfpolicy_attr attr[PFPOLICY_MAX_ATTRS]; /* slices into the caller's buffer */
};

struct pfpolicy_parser {
	size_t scanned; /* bytes of the buffer already examined: they hold no complete request */
	/* private to pfpolicy.c: where the scan stands, as offsets from the request start */
	unsigned char state;
	unsigned char name_len; /* of the line being read */
	uint32_t hash;          /* of that line's name so far */
	size_t line;            /* offset of the line being read */
	size_t cur;             /* its slot in attr[] once its '=' was read */
	size_t n;               /* distinct attributes so far */
	struct {
		size_t line;      /* offset of the (last) line giving this attribute */
		size_t value_len; /* without the optional CR */
		uint32_t hash;
		unsigned char name_len;
	} attr[PFPOLICY_MAX_ATTRS];
};

static inline void pfpolicy_parser_reset(struct pfpolicy_parser *p)
{
	/* attr[] is only read below n */
	p->scanned = 0;
	p->state = 0;
	p->name_len = 0;
	p->hash = 0;
	p->line = 0;
	p->cur = 0;
	p->n = 0;
}

/*
 * Look for one complete request at the start of p[0..n); only the first max bytes are
 * looked at (max is capped at INT_MAX so that a length fits the return value).
 * Returns > 0: the request's length in bytes (through its empty line), *ret filled, and
 *              the parser reset for the next request;
 *         0:   incomplete, and n < max: read more;
 *         -EMSGSIZE: no end of request within max bytes;
 *         -EPROTO: a bad line (no '=', bad name, NUL byte, too many attributes, a lone
 *              empty request).
 * On either error *ret_why (if ret_why is not NULL) says which, and calling again gives
 * the same error.  *ret is written only when a request is returned.
 */
int pfpolicy_parse(struct pfpolicy_parser *st, const char *p, size_t n, size_t max,
		   struct pfpolicy_request *ret, const char **ret_why);

/*
 * The value of an attribute, or STR_NULL when absent.  A present attribute with an empty
 * value ("name=") gives a non-NULL ptr and len 0.
 */
struct str pfpolicy_get(const struct pfpolicy_request *r, const char *name);

/*
 * Append "action=TEXT\n\n".  TEXT must be 1..PFPOLICY_MAX_ACTION bytes without NUL, CR or
 * LF; returns 0, -EINVAL (bad text) or -ENOBUFS/-ENOMEM from the buffer.  On error out is
 * unchanged.
 */
int pfpolicy_put_action(struct buf *out, struct str text);

#endif
