/*
 * dsn -- delivery status notifications (RFC 3464, RFC 3461 section 6, RFC 6522): the
 * bounce sent to a message's envelope sender when some of its recipients failed for good,
 * or its lifetime in the queue ran out, or (optionally) it has been delayed long, and
 * the "relayed" notice a NOTIFY=SUCCESS recipient gets when the next hop cannot carry
 * the request on.
 *
 * A codec: it formats a whole message (RFC 5322 headers and a multipart/report body,
 * CRLF lines, not dot-stuffed -- as the queue stores bodies) into a caller's buffer.  The
 * original message's headers are attached as text/rfc822-headers (RFC 6522), cut at
 * DSN_MAX_HEADERS bytes (or, with RET=FULL in a bounce, the whole message as
 * message/rfc822).  No I/O, no clock (now is given).
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
/* RET=FULL: the whole message is returned when it is at most this; a larger one gets its
 * headers only (Postfix's bounce_size_limit works the same way, with 50,000 bytes by
 * default). */
#define DSN_MAX_RETURNED (64 * 1024)

enum dsn_action {
	DSN_FAILED = 0,     /* Action: failed */
	DSN_DELAYED,        /* Action: delayed (a warning; the message is still queued) */
	DSN_RELAYED,        /* Action: relayed (RFC 3461 NOTIFY=SUCCESS, and the next hop
			       does not offer DSN: delivered, and no further notice comes) */
};

struct dsn_rcpt {
	struct str addr;           /* the recipient as queued (Final-Recipient: rfc822; addr;
				      with 8-bit bytes or a space: utf-8; addr as RFC 6533's
				      7-bit utf-8-addr-xtext, "j\x{F6}rg@example.de") */
	enum dsn_action action;
	struct str status;         /* "5.1.1"; empty or not class.subject.detail with class 2,
				      4 or 5 (RFC 3463): 5.0.0 (failed), 4.0.0 (delayed) or
				      2.0.0 (relayed) */
	struct str orcpt;          /* the ORCPT given for it (RFC 3461), "type;address" with
				      the xtext decoded: Original-Recipient; empty: none */
	struct str remote_mta;     /* the host that answered (Remote-MTA: dns; host), or empty */
	struct str diagnostic;     /* the reply, "550 5.1.1 No such user" (Diagnostic-Code:
				      smtp; ...), or empty; text that does not begin with a
				      reply code ("connect to ...: Connection refused") is
				      written as "Diagnostic-Code: X-Sluice; ..." */
	uint64_t last_attempt_us;  /* Last-Attempt-Date, 0: none */
};

struct dsn_info {
	struct str reporting_mta;  /* our host name: Reporting-MTA, From: MAILER-DAEMON@,
				      Message-ID; letters, digits, '-', '.', '_', or an address
				      literal "[192.0.2.1]" */
	struct str sender;         /* the original envelope sender: To: of the DSN; empty (the
				      null sender, when the caller sends the report to a
				      postmaster): "To: undisclosed-recipients:;" */
	struct str queue_id;       /* the message's queue ID: named in the text, and with
				      now_us makes the Message-ID */
	struct str envid;          /* the ENVID given with the message (RFC 3461), decoded:
				      Original-Envelope-Id; empty: none */
	uint64_t arrival_us;       /* Arrival-Date, 0: none */
	uint64_t now_us;           /* Date: (times are written in UTC) */
	struct str reason;         /* one sentence for the human-readable part, e.g. "the
				      message could not be delivered to some recipients" or
				      "the message stayed in the queue for 5 days"; empty: chosen
				      from the actions */
	struct str boundary_seed;  /* makes the MIME boundary unique: the queue id is fine */
	bool full;                 /* RET=FULL (RFC 3461 4.3): a report with a failed
				      recipient returns the whole message (message/rfc822),
				      when it is at most DSN_MAX_RETURNED bytes once its lines
				      are cut as the headers' are */
};

/*
 * Format the DSN for rcpt[0..n) (n >= 1) of the message whose stored body is given as
 * chunks (the queue file's body records, any sizes; only its header section is read, up
 * to the first empty line or DSN_MAX_HEADERS bytes, cut at a line boundary; LF or CRLF
 * lines, written as CRLF; a line over 998 octets is cut).  Appends to out: 0, or out is
 * left as it was and -EINVAL (n == 0; a recipient address empty, over QUEUE_MAX_ADDR
 * bytes or holding a control byte -- CR, LF, NUL, ...; a sender likewise, or too long
 * for a To: line, 992 bytes; a reporting_mta outside the rule above), -ENOBUFS (out's
 * limit) or -ENOMEM.
 *
 * Header values taken from peers (addresses, diagnostics, host names) are folded or cut
 * so that no line exceeds 998 octets; CR, LF and other white space in them become
 * spaces, NUL is dropped, other control and 8-bit bytes become '?' (diagnostics and host
 * names are kept up to 4096 bytes).  Parts 1 and 2 are US-ASCII.  Original headers with
 * 8-bit bytes are attached as they are, with "Content-Transfer-Encoding: 8bit" on the
 * part and the message: the relay must then send the report with BODY=8BITMIME, and
 * with SMTPUTF8 when the sender itself has 8-bit bytes (it is written in To: as is).
 */
int dsn_format(const struct dsn_info *info, const struct dsn_rcpt *rcpt, size_t n,
	       const struct str *body, size_t nbody, struct buf *out);

#endif
