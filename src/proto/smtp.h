/*
 * smtp -- the server side of SMTP (RFC 5321) as a pure codec, for the intake service.
 *
 * Four pieces, each usable alone, none doing I/O or logging:
 *
 *   smtp_line_next()      cuts command lines out of what the client sent, never asking
 *                         the caller to hold more than one line's limit of bytes;
 *   smtp_command_parse()  names the command of a line and slices its argument;
 *   smtp_parse_mail(),    read the reverse-path / forward-path and the ESMTP parameters
 *   smtp_parse_rcpt()     of MAIL FROM: and RCPT TO:, the DSN ones (RFC 3461) included;
 *   smtp_xtext_decode(),  the xtext of ENVID= and ORCPT= (RFC 3461 4), both ways;
 *   smtp_xtext_encode()
 *   smtp_data_decode()    turns what follows DATA into the message as it is stored,
 *                         finding its end the one safe way (see "DATA" below).
 *
 * Everything returned as a struct str is a slice of the caller's input; the codec keeps no
 * pointer into the input between calls.  Reply texts (*ret_why) are static strings.
 *
 * What the service answers (the mapping this codec is designed for):
 *
 *   smtp_line_next() SMTP_LINE_TOO_LONG   500 5.5.2 Line too long (once per long line)
 *   smtp_line_next() SMTP_LINE_OK with    500 5.5.2 Error: bare <LF> received, and the
 *     r->bare_lf                          session is closed: where the client meant the
 *                                         line to end is unknown (RFC 5321 §2.3.8), so
 *                                         nothing after it can be read as a command
 *   smtp_command_parse() -EBADMSG         500 5.5.2 Error: bare <CR> received (the line
 *                                         ended in CRLF: it is refused whole, the session
 *                                         goes on)
 *   smtp_command_parse() -EINVAL          500 5.5.2 Error: bad syntax (empty line, NUL or
 *                                         other control byte)
 *   verb SMTP_VERB_UNKNOWN                500 5.5.2 Error: command not recognized
 *   cmd.bad_form (MAIL/RCPT only)         501 5.5.4 Syntax: MAIL FROM:<address> (RCPT TO:)
 *   smtp_parse_mail/rcpt() -EINVAL        501 5.1.7 Bad sender address syntax (MAIL),
 *                                         501 5.1.3 Bad recipient address syntax (RCPT)
 *                         -EILSEQ         553 5.6.7 8-bit address without SMTPUTF8
 *                                         (RFC 6531 §3.7.4.1)
 *                         -EPROTO         501 5.5.4 a malformed parameter (bad keyword,
 *                                         missing or malformed value, repeated parameter)
 *                         -ENOTSUP        555 5.5.4 an unknown parameter, or a value this
 *                                         codec does not implement (RFC 5321 §4.1.1.11)
 *   mail.size over the service's limit   552 5.3.4 Message size exceeds fixed limit
 *
 * with *ret_why as the text after the status codes when one is wanted.  Checking which
 * commands are allowed in which state (503), HELO/EHLO arguments the service dislikes,
 * and limits on recipients are the service's business, not this codec's.
 */
#ifndef SLUICE_PROTO_SMTP_H
#define SLUICE_PROTO_SMTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "str.h"

/* A command line, CRLF included (RFC 5321 §4.5.3.1.4): the max for smtp_line_next(). */
#define SMTP_LINE_MAX 512
/* Bytes of an address as returned (no brackets, no source route); the queue's own limit
 * (QUEUE_MAX_ADDR in queue_file.h) is the same, so every address accepted here fits. */
#define SMTP_MAX_ADDR 1024
/* A domain, and a HELO/EHLO argument (RFC 5321 §4.5.3.1.2). */
#define SMTP_MAX_DOMAIN 255
/* A text line of the message without its CRLF (RFC 5322 §2.1.1, RFC 5321 §4.5.3.1.6): the
 * decoder measures lines (smtp_data.max_line); refusing longer ones is the service's call. */
#define SMTP_DATA_LINE_MAX 998
/* smtp_data_decode() makes progress whenever outcap is at least this. */
#define SMTP_DATA_MIN_OUT 3
/* An outcap that always lets smtp_data_decode() take all n bytes given to it (every input
 * byte gives at most 2 output bytes, plus the 3 of a pending ".\r" from the last call). */
#define SMTP_DATA_OUT_BOUND(n) (2 * (n) + 3)

/* ---- command lines --------------------------------------------------------------------- */

/*
 * A command-line reader, kept per connection.  The caller holds the bytes received and not
 * consumed yet in one buffer, and after each call drops the first *ret_used bytes of it
 * (whatever the result) before calling again with what is left plus what arrived since.
 *
 * Invariants: scanned <= the bytes the caller holds, and those bytes hold no LF; once
 * a line passes max bytes without an LF the reader is discarding: it takes all it is
 * given until the LF, so the caller's buffer never grows past max bytes of one line.
 *
 * After STARTTLS the caller must drop what it holds (it was sent in clear text, before the
 * handshake: CVE-2011-0411) and reset the reader.  Switching to smtp_data_decode() after
 * DATA is safe after any SMTP_LINE_OK: the reader took nothing past that line's LF.
 */
struct smtp_line_reader {
	size_t scanned;  /* private: leading bytes already searched for an LF */
	bool discarding; /* private: inside a line longer than max */
	bool bare_lf;    /* after SMTP_LINE_OK: the line ended in a LF without CR before it */
};

enum smtp_line_status {
	SMTP_LINE_MORE = 0, /* no complete line: read more (*ret_used may be > 0: discarded) */
	SMTP_LINE_OK,       /* *ret_line is a line */
	SMTP_LINE_TOO_LONG, /* a line longer than max ended; all of it is consumed */
};

static inline void smtp_line_reader_init(struct smtp_line_reader *r)
{
	r->scanned = 0;
	r->discarding = false;
	r->bare_lf = false;
}

/*
 * Take the next line from p[0..n), the caller's unconsumed bytes.  A line is the bytes
 * before an LF, that LF included, and fits when it is at most max bytes long (so with
 * SMTP_LINE_MAX, 510 bytes of text and CRLF).
 * Returns SMTP_LINE_OK: *ret_line is the line without its LF, and without one CR right
 *                 before the LF (any other CR stays in the line, where
 *                 smtp_command_parse() refuses it); r->bare_lf says whether that CR was
 *                 missing; *ret_used counts the LF;
 *         SMTP_LINE_MORE: no LF yet; *ret_used is 0, or n when the line is already too
 *                 long (its bytes are dropped as they come);
 *         SMTP_LINE_TOO_LONG: a line longer than max ended; *ret_used takes the bytes up
 *                 to and including its LF.  Answer once and go on with the next line.
 * *ret_line is written only with SMTP_LINE_OK.  Each byte is searched once, however the
 * input is cut.
 */
enum smtp_line_status smtp_line_next(struct smtp_line_reader *r, const char *p, size_t n,
				     size_t max, struct str *ret_line, size_t *ret_used);

/* ---- commands -------------------------------------------------------------------------- */

enum smtp_verb {
	SMTP_VERB_UNKNOWN = 0,
	SMTP_VERB_HELO,
	SMTP_VERB_EHLO,
	SMTP_VERB_MAIL,
	SMTP_VERB_RCPT,
	SMTP_VERB_DATA,
	SMTP_VERB_RSET,
	SMTP_VERB_NOOP,
	SMTP_VERB_QUIT,
	SMTP_VERB_VRFY,
	SMTP_VERB_EXPN,
	SMTP_VERB_HELP,
	SMTP_VERB_STARTTLS,
	SMTP_VERB_AUTH,
	SMTP_VERB_BDAT,
	SMTP_VERB_ETRN,
};

struct smtp_command {
	enum smtp_verb verb;
	struct str name; /* the verb as sent (the first word), for logs */
	/* What follows the verb, blanks (SP, HTAB) trimmed at both ends; for MAIL and RCPT what
	 * follows "FROM:" / "TO:", ready for smtp_parse_mail() / smtp_parse_rcpt(). */
	struct str arg;
	/* MAIL without "FROM:", RCPT without "TO:": arg is then all that follows the verb. */
	bool bad_form;
};

/*
 * Read a command line (as smtp_line_next() returns it).  Leading blanks are skipped; the
 * verb is the first word, compared without regard to case; words are separated by SP or
 * HTAB.  MAIL and RCPT take "FROM:" / "TO:" (any case) after one or more blanks, then
 * optionally blanks before the path, as Postfix tolerates ("MAIL FROM: <a@b>").  Bytes
 * >= 0x80 are left for the address parsers to judge.
 * Returns 0 with *ret filled (verb SMTP_VERB_UNKNOWN for a word that is no command),
 * -EBADMSG with *ret_why (if ret_why is not NULL) for a line holding a CR (a bare CR: the
 * line reader took the CR of its CRLF), whatever else it holds, or -EINVAL with *ret_why
 * for an empty or blank line, a NUL byte or any other control byte but HTAB.  *ret is
 * written only on success.
 */
int smtp_command_parse(struct str line, struct smtp_command *ret, const char **ret_why);

/* The verb in capitals ("MAIL"), "UNKNOWN" for SMTP_VERB_UNKNOWN or a bad value. */
const char *smtp_verb_name(enum smtp_verb v);

/* ---- MAIL and RCPT ---------------------------------------------------------------------- */

enum smtp_body {
	SMTP_BODY_NONE = 0, /* no BODY= given */
	SMTP_BODY_7BIT,
	SMTP_BODY_8BITMIME,
};

/* RFC 3461 (DSN) limits, on the values as sent (xtext, before decoding): ENVID at most
 * 100 characters (4.4), ORCPT's whole value, addr-type ";" xtext, at most 500 (4.2). */
#define SMTP_DSN_ENVID_MAX 100
#define SMTP_DSN_ORCPT_MAX 500
/* A command line with the DSN parameters (RFC 3461 5: MAIL may be 100 characters longer,
 * RCPT 500): the limit a service that advertises DSN gives smtp_line_next(); one allowance
 * of 600 for both, since NOTIFY beside a 500-character ORCPT passes 500. */
#define SMTP_DSN_LINE_MAX (SMTP_LINE_MAX + 600)
/* MAIL's own: RFC 3461 5 gives it 100 characters more (RET and ENVID), not 600. */
#define SMTP_DSN_MAIL_LINE_MAX (SMTP_LINE_MAX + 100)

enum smtp_ret {
	SMTP_RET_NONE = 0, /* no RET= given */
	SMTP_RET_FULL,
	SMTP_RET_HDRS,
};

/* NOTIFY= (RFC 3461 4.1): NEVER alone, or a set of the other three; 0: not given. */
enum smtp_notify {
	SMTP_NOTIFY_NEVER = 1u << 0,
	SMTP_NOTIFY_SUCCESS = 1u << 1,
	SMTP_NOTIFY_FAILURE = 1u << 2,
	SMTP_NOTIFY_DELAY = 1u << 3,
};

struct smtp_mail {
	struct str addr;     /* the sender without "<>" or source route; len 0: the null
				sender "<>" */
	bool has_size;       /* SIZE= given */
	uint64_t size;       /* its value; UINT64_MAX for a number too big for 64 bits */
	enum smtp_body body;
	bool smtputf8;       /* SMTPUTF8 given: 8-bit addresses are allowed in this
				transaction, pass it to smtp_parse_rcpt() */
	enum smtp_ret ret;   /* RET= */
	struct str envid;    /* ENVID= as sent: checked xtext of 1..SMTP_DSN_ENVID_MAX
				characters that decodes to printable ASCII; len 0: none */
};

struct smtp_rcpt {
	struct str addr;     /* the recipient without "<>" or source route */
	bool postmaster;     /* the bare "<postmaster>" (any case), which has no domain */
	unsigned notify;     /* enum smtp_notify bits; 0: no NOTIFY= */
	struct str orcpt_type; /* ORCPT='s addr-type (an atom, "rfc822"); len 0: no ORCPT= */
	struct str orcpt;    /* ORCPT='s address as sent: checked xtext (see ENVID) */
};

/*
 * The argument of MAIL FROM: (smtp_command.arg).  Grammar (RFC 5321 §4.1.2, §4.1.1.2):
 *
 *   arg     = path *( 1*blank param ) *blank
 *   path    = "<>" / "<" [route ":"] mailbox ">" / mailbox      (the last: no blank in it)
 *   route   = "@" domain *( "," "@" domain )                    (checked, then dropped)
 *   mailbox = local-part "@" ( domain / address-literal )
 *   local-part = dot-string / quoted-string
 *   param   = keyword [ "=" value ]
 *
 * Domains: labels of letters, digits and hyphens (not first or last), each at most 63
 * bytes, the whole at most SMTP_MAX_DOMAIN; no trailing dot.  Address literals: [IPv4]
 * and [IPv6:...] as inet_pton() reads them; other tags are refused.  A domain is required:
 * this is stricter than Postfix, which accepts "<user>" and qualifies it later, since the
 * relay could not deliver it.  The local part's length (64 in the RFC) is not limited, as
 * in Postfix: real addresses exceed it.  Dot-strings are checked as the RFC says (no empty
 * atom: "a..b", ".a", "a." are refused).  The whole address is at most SMTP_MAX_ADDR bytes.
 *
 * Bytes >= 0x80 (in the local part and the domain) are allowed only when the SMTPUTF8
 * parameter is given, which needs utf8_allowed (the service advertises SMTPUTF8); they
 * must be well-formed UTF-8, and a domain label holding them is not held to 63 bytes (its
 * A-label form may be shorter).
 *
 * Parameters, keywords in any case, each at most once: SIZE=digits (1..20 digits, RFC
 * 1870), BODY=7BIT / 8BITMIME (values in any case; 8BITMIME is taken as advertised, as
 * Postfix does), SMTPUTF8 (no value), RET=FULL / HDRS (any case) and ENVID=xtext (RFC
 * 3461 4.3, 4.4: 1..SMTP_DSN_ENVID_MAX characters of xtext that decode to printable
 * ASCII, 0x20..0x7e, as 4.4 requires).  A malformed, overlong or repeated DSN parameter
 * is -EPROTO (501 5.5.4).  Anything else, AUTH= included, is -ENOTSUP.
 *
 * Returns 0 with *ret filled, or (with *ret_why if ret_why is not NULL):
 *   -EINVAL   the path is not valid (also: 8-bit bytes that are not UTF-8, too long);
 *   -EPROTO   a parameter is malformed or repeated;
 *   -ENOTSUP  a parameter is unknown or its value unsupported, or SMTPUTF8 is given but
 *             not utf8_allowed;
 *   -EILSEQ   the path holds 8-bit bytes but SMTPUTF8 was not given.
 * The path is judged before the parameters, then the need for SMTPUTF8.  *ret is written
 * only on success.
 */
int smtp_parse_mail(struct str arg, bool utf8_allowed, struct smtp_mail *ret,
		    const char **ret_why);

/*
 * The argument of RCPT TO:.  Same path grammar as smtp_parse_mail(), except that the null
 * path is refused and the bare "<postmaster>" (any case) is accepted without a domain
 * (RFC 5321 §4.1.1.3).  utf8 is the transaction's smtp_mail.smtputf8.  The parameters
 * are RFC 3461's, each at most once: NOTIFY=NEVER or a comma-separated set of SUCCESS,
 * FAILURE and DELAY (any case, none twice), and ORCPT=addr-type;xtext (addr-type an atom,
 * the xtext as ENVID's; the whole value at most SMTP_DSN_ORCPT_MAX characters).  Returns
 * 0, -EINVAL, -EPROTO (a malformed, overlong or repeated parameter), -ENOTSUP (another
 * parameter) or -EILSEQ as smtp_parse_mail() does.
 */
int smtp_parse_rcpt(struct str arg, bool utf8, struct smtp_rcpt *ret, const char **ret_why);

/*
 * xtext (RFC 3461 4): printable ASCII but "+" and "=" stand for themselves, and "+XX"
 * (two hex digits; lower case is taken too, as Postfix does) for any byte.
 * smtp_xtext_decode() decodes x into out[0..cap) (decoding never lengthens: cap = x.len
 * is enough): 0 and *ret_len, or -EINVAL (not xtext, or a decoded byte outside printable
 * ASCII 0x20..0x7e, which is all that RFC 3461 lets ENVID and ORCPT carry), -ENOBUFS.
 * smtp_xtext_encode() encodes s (at most 3 bytes out per byte in): 0 and *ret_len, or
 * -ENOBUFS.  Neither writes a NUL.
 */
int smtp_xtext_decode(struct str x, char *out, size_t cap, size_t *ret_len);
int smtp_xtext_encode(struct str s, char *out, size_t cap, size_t *ret_len);

/*
 * A HELO/EHLO argument, judged as leniently as Postfix: any 1..SMTP_MAX_DOMAIN bytes of
 * printable ASCII without blanks (0x21..0x7e) are accepted.  Returns 0, setting
 * *ret_is_domain (if not NULL) to whether it is also a domain or address literal by the
 * rules of smtp_parse_mail(), or -EINVAL (answer 501 5.5.4 Syntax: EHLO hostname).
 */
int smtp_check_helo(struct str arg, bool *ret_is_domain);

/* ---- DATA ------------------------------------------------------------------------------- */

/*
 * The decoder of what the client sends after "354", kept per transaction.
 *
 * The end of the data is the exact byte sequence CRLF "." CRLF, where the start of the
 * data counts as following a CRLF (so ".\r\n" at once is an empty message); precisely,
 * the first place "\r\n.\r\n" occurs in "\r\n" followed by the input.  Nothing else ends
 * it: not LF "." LF, not CRLF "." LF, not LF "." CRLF, not CR "." CR.  Servers and
 * relays that disagree on that end are what SMTP smuggling exploits, and the relay
 * downstream re-stuffs dots on output, so a content line "." stored here can never become
 * an end there.
 *
 * Lines: CRLF, a bare LF, and a bare CR (one not followed by LF, also across calls) each
 * end a line, and every line is stored ending in CRLF; each bare one is counted in
 * bare_eol (the bare CRs also in bare_cr) for the service to log or refuse: the output
 * is the same whichever it does, so refusing costs nothing here.  A line that begins with "." loses that dot
 * (dot-unstuffing, RFC 5321 §4.5.2), whatever ended the line before it, except a line
 * that is only "." and is not the end: it is stored as ".".  The output is the message as
 * stored: the CRLF of its last line is part of it, the ".\r\n" that ends it is not.
 *
 * Whatever way the input is cut into calls, and whatever outcap (at least
 * SMTP_DATA_MIN_OUT), the concatenated output and the place of the end are the same.
 * Bytes are kept as they are otherwise (NUL and 8-bit included).
 */
struct smtp_data {
	unsigned char state; /* private */
	bool done;           /* the end was consumed */
	uint64_t size;       /* bytes produced so far: the stored message's size */
	uint64_t bare_eol;   /* line ends that were a bare LF or a bare CR */
	uint64_t bare_cr;    /* of those, the bare CRs (a reply can say which it was) */
	uint64_t lines;      /* lines completed */
	size_t line_len;     /* bytes of the current output line so far */
	size_t max_line;     /* longest output line so far, CRLF excluded (the current line
				counts as it grows, so a service can stop a long line early) */
};

void smtp_data_init(struct smtp_data *d);

/*
 * Decode p[0..n) into out[0..outcap).  *ret_consumed is the number of bytes of p taken
 * (the caller drops them), *ret_produced the bytes written to out.  Stops at the end of
 * the data (the terminating ".\r\n" is consumed, nothing after it is), at the end of p,
 * or when the next output would not fit in outcap; a byte is consumed only when what it
 * produces could be written, so the caller just calls again with the rest.
 * With outcap >= SMTP_DATA_MIN_OUT and n > 0 every call consumes or produces something;
 * outcap >= SMTP_DATA_OUT_BOUND(n) always consumes all n bytes (or up to the end).
 * Returns 1 when the end was consumed (now or by an earlier call: then 0 bytes are taken),
 * 0 otherwise.
 */
int smtp_data_decode(struct smtp_data *d, const char *p, size_t n, char *out, size_t outcap,
		     size_t *ret_consumed, size_t *ret_produced);

/*
 * For a service that refuses data with bare line ends (550 5.5.2, as Postfix's
 * smtpd_forbid_bare_newline = reject): NULL when every line so far ended in CRLF, else the
 * reply text after the codes, "bare <LF> received" when any line ended in a bare LF, else
 * "bare <CR> received".  A static string.
 */
const char *smtp_data_bare_why(const struct smtp_data *d);

#endif
