/*
 * smtp_reply -- the replies of an SMTP server, read by a client (the relay): a pure codec.
 *
 * A reply is one or more lines "CODE-text" ending with a line "CODE text" (or "CODE"
 * alone), CODE three digits, the same on every line (RFC 5321 4.2).  The parser is
 * resumable: it is given what has arrived, says how much of it made a whole reply, and
 * keeps no pointer into the input.  An enhanced status code (RFC 3463, "4.7.1") at the
 * start of the first line's text is recognised.
 *
 * Limits (a server's reply is hostile input): a line is at most SMTP_REPLY_LINE_MAX
 * octets with its CRLF (RFC 5321 4.5.3.1.5 says 512; real servers send longer lines, so
 * the limit is generous), a reply at most SMTP_REPLY_LINES lines; the text kept for logs
 * and bounces is at most SMTP_REPLY_TEXT_MAX bytes (the rest is dropped, not refused).
 * A bare LF ends a line as CRLF does (servers that send it exist; the reply is not data).
 */
#ifndef SLUICE_PROTO_SMTP_REPLY_H
#define SLUICE_PROTO_SMTP_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "str.h"

#define SMTP_REPLY_LINE_MAX 2048
#define SMTP_REPLY_LINES 100
#define SMTP_REPLY_TEXT_MAX 1024

struct smtp_reply {
	int code;                  /* 200..599 */
	int enh_class, enh_subject, enh_detail; /* 0 when there is no enhanced code */
	size_t lines;
	size_t text_len;
	char text[SMTP_REPLY_TEXT_MAX + 1]; /* the lines' texts (enhanced code of the first
					       kept), joined by a space, NUL-terminated */
};

/* The parser's state between calls (zeroed: smtp_reply_reader_init). */
struct smtp_reply_reader {
	size_t scanned;            /* private: bytes of the pending line already searched */
	struct smtp_reply r;       /* the reply being assembled */
};

void smtp_reply_reader_init(struct smtp_reply_reader *rd);

/*
 * Read from p[0..n) (the bytes received and not yet consumed).  Returns 1 when a whole
 * reply was read: *ret holds it and *ret_used the bytes it took (drop them; the reader is
 * ready for the next reply); 0 when more bytes are needed (*ret_used bytes of complete
 * lines were taken into the reader and must be dropped); -EPROTO with *ret_why when the
 * reply is malformed (no three-digit code in 2xx..5xx, a code that changes between
 * lines, a separator other than '-' or ' ', a line longer than SMTP_REPLY_LINE_MAX, more
 * than SMTP_REPLY_LINES lines, a NUL byte): the connection cannot be trusted further.
 */
int smtp_reply_read(struct smtp_reply_reader *rd, const char *p, size_t n,
		    struct smtp_reply *ret, size_t *ret_used, const char **ret_why);

/*
 * What a server's EHLO reply offers (RFC 5321 4.1.1.1), read from its keyword lines (every
 * line after the first).  Both SMTP clients (the relay's and the injectors') use it.
 */
enum smtp_ehlo_ext {
	SMTP_EHLO_PIPELINING = 1u << 0,
	SMTP_EHLO_SIZE = 1u << 1,
	SMTP_EHLO_8BITMIME = 1u << 2,
	SMTP_EHLO_SMTPUTF8 = 1u << 3,
	SMTP_EHLO_STARTTLS = 1u << 4,
	SMTP_EHLO_AUTH = 1u << 5,
	SMTP_EHLO_DSN = 1u << 6,
};
#define SMTP_EHLO_AUTH_MAX 256 /* bytes of AUTH mechanisms kept (more are dropped) */
#define SMTP_EHLO_MECH_MAX 20  /* a SASL mechanism's name (RFC 4422 3.1); longer: dropped */

struct smtp_ehlo {
	unsigned ext;               /* enum smtp_ehlo_ext */
	uint64_t size_max;          /* SIZE's value; 0 when none or not a number */
	char auth[SMTP_EHLO_AUTH_MAX]; /* mechanisms, upper case, space-separated */
};

/* One keyword line: its text after "250-" or "250 ".  Adds what it offers to e (zero e
 * before the first line).  Keywords compare without case; unknown ones are ignored. */
void smtp_ehlo_line(struct smtp_ehlo *e, struct str text);

/* The next space- or tab-separated word of *s (advanced past it); empty at the end. */
struct str smtp_next_word(struct str *s);

#endif
