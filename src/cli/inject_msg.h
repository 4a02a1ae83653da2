/*
 * inject_msg -- the message an injector hands to the intake: line endings, the end of
 * the input, header fields (RFC 5322) and addresses, with no I/O.
 *
 * An injector feeds its standard input to an inject_text in chunks as it reads them:
 * lines come out with CRLF endings (a bare LF gets a CR, an existing CRLF is kept), a
 * last line without a newline is completed, and -- for sendmail without -i -- a line
 * holding a single "." ends the input.  Then, for sendmail, inject_msg_headers() looks
 * at the header section: the recipients of To:/Cc:/Bcc: for -t, whether From:, Date:
 * and Message-ID: are there, and it rebuilds the message with Bcc: removed and the
 * missing fields added.  Addresses are made into their SMTP form (RFC 5321 4.1.2:
 * a local part that is not a dot-string is quoted) by inject_addr_smtp().
 *
 * Everything a caller's input sizes is bounded: the message by its buf's max, an
 * address by INJECT_MAX_ADDR, the recipients by the list's max.
 */
#ifndef SLUICE_INJECT_MSG_H
#define SLUICE_INJECT_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "buf.h"
#include "str.h"

#define INJECT_MAX_ADDR 1024 /* bytes of one address, as the queue keeps them */

/* ---- the input, as it is read ---- */
struct inject_text {
	struct buf *out;     /* the message so far: CRLF lines, not dot-stuffed */
	size_t line_start;   /* offset in out of the line being read */
	bool dot_ends;       /* a line "." ends the input (sendmail without -i) */
	bool ended;          /* that line was seen: read no more */
	bool eightbit;       /* a byte >= 0x80 was seen */
};

void inject_text_init(struct inject_text *t, struct buf *out, bool dot_ends);
/* Take n more bytes of input.  0, or -ENOBUFS when out would pass its max (the message
 * is too large; out is left as it was before the call's last line).  Bytes after the
 * line that ends the input are ignored. */
int inject_text_feed(struct inject_text *t, const void *p, size_t n);
/* End of input: completes a last line without a newline.  0 or -ENOBUFS. */
int inject_text_finish(struct inject_text *t);

/*
 * SMTP's line limit (RFC 5321 4.5.3.1.6: 998 octets and CRLF), which sluice's intake
 * enforces: a longer line is broken by inserting CRLF and a space, as Postfix's SMTP
 * client does (smtp_line_length_limit), so that a long header line becomes a folded
 * field and MIME structure is least harmed.  A break never splits a UTF-8 sequence.
 */
#define INJECT_LINE_MAX 998

/* The number of lines of text (CRLF lines) longer than limit. */
size_t inject_long_lines(struct str text, size_t limit);
/* text with its long lines broken, appended to out.  0 or -ENOBUFS. */
int inject_msg_fold(struct str text, size_t limit, struct buf *out);

/* ---- addresses ---- */
/*
 * Call fn(arg, addr) for each address of an RFC 5322 address list (the value of a To:,
 * Cc: or Bcc: field, unfolded or not; or a recipient argument): mailboxes with or
 * without a display name, comments, quoted strings, groups ("name: a, b;"), obsolete
 * routes ("<@a,@b:x@y>").  addr is the addr-spec with comments and folding white space
 * removed, NUL-terminated, valid during the call only; empty ones ("<>", an empty group)
 * are skipped.  Returns 0, fn's negative result, or -ENAMETOOLONG (an address longer
 * than INJECT_MAX_ADDR).
 */
int inject_addrlist_parse(struct str value, int (*fn)(void *arg, const char *addr), void *arg);

/*
 * The SMTP form of an address (what goes between < and > in MAIL and RCPT): angle
 * brackets around it removed, "@domain" appended when it has no domain and domain is
 * not NULL, the local part quoted when it is not a dot-string.  "" and "<>" give ""
 * (the null sender; the caller decides whether that is allowed).  Appends to out: 0,
 * -EINVAL (a control character, or unbalanced quotes or brackets) or -ENOBUFS.
 */
int inject_addr_smtp(const char *in, const char *domain, struct buf *out);

/* A list of addresses in their SMTP form, in the order added, without duplicates
 * (compared exactly; a hash set of indexes finds them in O(1)). */
struct inject_rcpts {
	char **addr;
	size_t n, cap, max;
	size_t *slot;        /* open addressing: index + 1, 0 = free */
	size_t nslot;        /* a power of two, at least twice n */
};
void inject_rcpts_init(struct inject_rcpts *r, size_t max);
void inject_rcpts_clear(struct inject_rcpts *r);
/* 0 (added, or already there), -E2BIG (max reached) or -ENOMEM. */
int inject_rcpts_add(struct inject_rcpts *r, const char *addr);

/* ---- the header section (sendmail) ---- */
struct inject_header_opts {
	bool extract;            /* -t: collect the recipients of the header */
	struct inject_rcpts *rcpts;  /* where -t puts them (with domain appended) */
	const char *domain;      /* for unqualified addresses and the Message-ID */
	const char *from_addr;   /* for an added From: (SMTP form, not empty) */
	const char *full_name;   /* for an added From:, or NULL */
	time_t now;              /* for an added Date: ... */
	long utc_offset;         /* ... seconds east of UTC */
	const char *msgid_left;  /* left part of an added Message-ID (unique, dot-atom) */
};

struct inject_header_result {
	bool added_from, added_date, added_msgid;
	size_t removed_bcc;      /* Bcc: and Resent-Bcc: fields removed */
	const char *bad_field;   /* on -ENAMETOOLONG / -E2BIG: the field's name (static) */
};

/*
 * Rebuild a message read by inject_text into out: a leading mbox "From " line dropped,
 * Bcc: and Resent-Bcc: fields removed, From:, Date: and Message-ID: added at the end of
 * the header section when missing, and an empty line put between the header and a body
 * that did not start with one.  With opts->extract, the recipients of the header are
 * added to opts->rcpts: those of Resent-To:, Resent-Cc: and Resent-Bcc: if there is any
 * of them (a message being re-sent), else those of To:, Cc: and Bcc:.
 * Returns 0, -ENOBUFS (out is full), -ENOMEM, -E2BIG (too many recipients) or
 * -ENAMETOOLONG (an address too long); *ret says what was done.
 */
int inject_msg_headers(struct str text, const struct inject_header_opts *opts,
		       struct buf *out, struct inject_header_result *ret);

/* A display name as an RFC 5322 phrase: as it is when it is atoms and spaces, else a
 * quoted string.  Appends to out; 0 or -ENOBUFS. */
int inject_phrase(const char *name, struct buf *out);

#endif
