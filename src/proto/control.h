/*
 * control -- the line protocol between the sluice command and sluiced: a pure codec.
 *
 * Request:  one line of at most CONTROL_LINE_MAX bytes, "COMMAND [ARG...]\n", words
 *           separated by spaces or tabs, at most CONTROL_MAX_ARGS words.
 * Reply:    "ok LEN\n" or "error LEN\n", then exactly LEN bytes of body (text or JSON),
 *           LEN <= CONTROL_BODY_MAX.  Several requests may be sent on one connection.
 */
#ifndef SLUICE_PROTO_CONTROL_H
#define SLUICE_PROTO_CONTROL_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "str.h"

#define CONTROL_LINE_MAX 16384
#define CONTROL_MAX_ARGS 64
#define CONTROL_BODY_MAX (16u * 1024 * 1024)

struct control_request {
	size_t argc;
	struct str argv[CONTROL_MAX_ARGS]; /* slices into the input */
};

/*
 * Parse the first request line in p[0..n).  Returns 1 with *ret and *ret_used (bytes
 * including the newline) when a line is complete, 0 when more bytes are needed, or
 * -EPROTO with *ret_why (line too long, NUL byte, too many words, empty line).
 */
int control_request_parse(const char *p, size_t n, struct control_request *ret,
			  size_t *ret_used, const char **ret_why);

struct control_reply {
	bool ok;
	struct str body; /* slice into the input */
};

/* Parse a reply; same return convention as control_request_parse(). */
int control_reply_parse(const char *p, size_t n, struct control_reply *ret, size_t *ret_used,
			const char **ret_why);

/* Append a reply with the given body. */
int control_put_reply(struct buf *out, bool ok, struct str body);

#endif
