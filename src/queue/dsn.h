/*
 * dsn -- delivery status notifications (RFC 3464, RFC 3461 section 6, RFC 6522): the
 * bounce sent to a message's envelope sender when some of its recipients failed for good,
 * or its lifetime in the queue ran out, or (optionally) it has been delayed long.
 *
 * A codec: it formats a whole message (RFC 5322 headers and a multipart/report body,
 * CRLF lines, not dot-stuffed -- as the queue stores bodies) into a caller's buffer.  The
 * original message's headers are attached as text/rfc822-headers (RFC 6522), cut at
 * DSN_MAX_HEADERS bytes.  No I/O, no clock (now is given).
 */
#ifndef SLUICE_DSN_H
#define SLUICE_DSN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "queue_file.h"
#include "str.h"

#define DSN_MAX_HEADERS (64 * 1024)

enum dsn_action {
	DSN_FAILED = 0,     /* Action: failed */
	DSN_DELAYED,        /* Action: delayed (a warning; the message is still queued) */
};

struct dsn_rcpt {
	struct str addr;           /* the recipient as queued (Final-Recipient: rfc822; addr) */
	enum dsn_action action;
	struct str status;         /* "5.1.1"; empty: 5.0.0 (failed) or 4.0.0 (delayed) */
	struct str remote_mta;     /* the host that answered (Remote-MTA: dns; host), or empty */
	struct str diagnostic;     /* the reply, "550 5.1.1 No such user" (Diagnostic-Code:
				      smtp; ...), or empty */
	uint64_t last_attempt_us;  /* Last-Attempt-Date, 0: none */
};

struct dsn_info {
	struct str reporting_mta;  /* our host name: Reporting-MTA, From: MAILER-DAEMON@ */
	struct str sender;         /* the original envelope sender: To: of the DSN */
	struct str queue_id;       /* X-Sluice-Queue-ID / Original-Envelope-Id is not used */
	uint64_t arrival_us;       /* Arrival-Date */
	uint64_t now_us;           /* Date: */
	struct str reason;         /* one sentence for the human-readable part, e.g. "the
				      message could not be delivered to some recipients" or
				      "the message stayed in the queue for 5 days"; empty: chosen
				      from the actions */
	struct str boundary_seed;  /* makes the MIME boundary unique: the queue id is fine */
};

/*
 * Format the DSN for rcpt[0..n) (n >= 1) of the message whose stored body is given as
 * chunks (the queue file's body records; only its header section is read, up to the
 * first empty line or DSN_MAX_HEADERS bytes).  Appends to out: 0, -EINVAL (n == 0, an
 * address with CR or LF), -ENOBUFS (out's limit).  Header values taken from peers
 * (addresses, diagnostics) are folded or cut so that no line exceeds 998 octets, and
 * CR/LF in them are replaced by spaces.
 */
int dsn_format(const struct dsn_info *info, const struct dsn_rcpt *rcpt, size_t n,
	       const struct str *body, size_t nbody, struct buf *out);

#endif
