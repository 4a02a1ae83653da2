/*
 * control -- the line protocol between the sluice command and sluiced: a pure codec.
 *
 * Request:  one line of at most CONTROL_LINE_MAX bytes, "COMMAND [ARG...]\n", words
 *           separated by spaces or tabs, at most CONTROL_MAX_ARGS words.
 * Reply:    "ok LEN\n" or "error LEN\n", then exactly LEN bytes of body (text or JSON),
 *           LEN <= CONTROL_BODY_MAX.  Several requests may be sent on one connection.
 *
 * A reply of unbounded size (`queue` over a deep queue) streams: any number of parts,
 * each "more LEN\n" and LEN bytes, then the "ok LEN" or "error LEN" frame that ends it
 * (its body the last part, often a summary line).  The reply is the parts' bodies in
 * order, then the last one's; each part is at most CONTROL_BODY_MAX, the whole has no
 * limit.  The parts of one reply are never interleaved with another reply, and an error
 * found after parts went out ends the reply with "error".  A command answers in parts
 * only when its reply can grow with the queue; the others keep the single frame, so a
 * client that does not know "more" works for every other command.
 *
 * Authentication (an inet control socket; a unix socket checks the peer's credentials
 * instead): the first request is "auth SECRET", SECRET the password with every byte
 * that is a space, a control character, 8-bit, or '%' written %XX (two hex digits), so
 * that any password is one word; at most CONTROL_SECRET_MAX bytes decoded.  The reply
 * is "ok" (the body says what the password may do) or "error" (and the connection is
 * closed).  Nothing else is sent with a request: once a connection is authenticated,
 * its requests are the ordinary ones.
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
/* A password: the first line of a file of at most 4096 bytes (config_read_secret()). */
#define CONTROL_SECRET_MAX 4096
_Static_assert(sizeof("auth \n") + 3 * CONTROL_SECRET_MAX < CONTROL_LINE_MAX,
	       "an encoded password fits a request line");

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
	bool more;       /* a part: more frames follow (ok is then true) */
	struct str body; /* slice into the input */
};

/* Parse a reply's frame; same return convention as control_request_parse(). */
int control_reply_parse(const char *p, size_t n, struct control_reply *ret, size_t *ret_used,
			const char **ret_why);

/*
 * Append the request "auth SECRET\n" (see above).  0, or -EINVAL for an empty secret or
 * one longer than CONTROL_SECRET_MAX (nothing appended), or buf's error.
 */
int control_put_auth(struct buf *out, struct str secret);

/*
 * Is req an "auth" request?  0 when it is not; 1 with the decoded secret in
 * ret[0..*ret_len) (ret has room for CONTROL_SECRET_MAX bytes; the caller wipes it);
 * -EPROTO with *ret_why when it is one but malformed (not one word after "auth", a bad
 * %XX, longer than CONTROL_SECRET_MAX decoded).  ret may hold part of the secret on failure too.
 */
int control_auth_parse(const struct control_request *req, char *ret, size_t *ret_len,
		       const char **ret_why);

/* Append a reply with the given body. */
int control_put_reply(struct buf *out, bool ok, struct str body);
/* Append a part of a streamed reply ("more LEN"). */
int control_put_part(struct buf *out, struct str body);

#endif
