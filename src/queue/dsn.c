/*
 * dsn -- delivery status notifications: RFC 3464 reports in an RFC 6522 multipart/report
 * (see dsn.h for the interface).
 *
 * The message formatted:
 *
 *   top header     Date, From: MAILER-DAEMON@reporting_mta, To: <sender> (for the null
 *                  sender, the empty group "undisclosed-recipients:;"), Subject,
 *                  Message-ID, Auto-Submitted: auto-replied (RFC 3834), MIME-Version,
 *                  Content-Type: multipart/report; report-type=delivery-status; boundary
 *   part 1         text/plain; charset=us-ascii: what happened, for a person
 *   part 2         message/delivery-status: Original-Envelope-Id, Reporting-MTA,
 *                  Arrival-Date, then per recipient Original-Recipient, Final-Recipient,
 *                  Action, Status, Remote-MTA, Diagnostic-Code, Last-Attempt-Date
 *   part 3         text/rfc822-headers: the original header section, at most
 *                  DSN_MAX_HEADERS bytes, cut at a line boundary; or, for a bounce of
 *                  a message sent with RET=FULL (info->full), message/rfc822: the
 *                  whole message, its lines treated as the headers' are, when it fits
 *                  in DSN_MAX_RETURNED bytes
 *
 * Invariants of what is appended (the fuzzer checks each):
 *   - every line ends in CRLF, there is no other CR or LF, no NUL, and no line is longer
 *     than 998 octets (RFC 5322 section 2.1.1);
 *   - the top header and parts 1 and 2 are US-ASCII (the sender in To: excepted, which is
 *     written as queued: an SMTPUTF8 sender is kept in UTF-8, RFC 6532);
 *   - a value taken from a peer (addresses, diagnostics, host names) never begins a line
 *     of the top header or of part 2: it follows the field name on its first line and is
 *     folded onto lines that begin with a space, so no CR, LF or anything else in it can
 *     start a header field or a delivery-status group.  In part 1 peer text follows '<'
 *     or an indent;
 *   - the boundary begins exactly four lines: the three delimiters and the closing one.
 *     It is a hash of boundary_seed and now, so that original headers holding it is
 *     practically impossible -- but they are a peer's bytes and the hash is not secret
 *     (the queue ID and the time are guessable), so the output is checked, and formatted
 *     again with the next variant if some content line begins with "--" boundary.  The
 *     variant's number is part of the boundary, so variants are distinct strings of one
 *     length, each content line can block at most one of them, and the retries end (at
 *     worst after as many formattings as the attached headers have lines, ~1500 for
 *     64 KiB -- for a sender who guessed the microsecond of the bounce).
 *   - on failure out is left as it was.
 *
 * Times are written in UTC (+0000): the codec has no clock and no time zone.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* for XXH64_state_t on the stack: the library is a system package of one version */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "dsn.h"
#include "log.h"
#include "util.h"

#define LINE_MAX_OCTETS 998    /* RFC 5322 section 2.1.1, without the CRLF */
#define FOLD_WIDTH 78          /* header fields are folded before this when they can be */
#define TEXT_WIDTH 76          /* the human-readable part is wrapped to this */
#define VALUE_MAX 4096         /* bytes kept of a diagnostic, a host name or the reason */
#define SCRATCH_MAX (3 * VALUE_MAX + 16 * QUEUE_MAX_ADDR)
#define TO_ADDR_MAX (LINE_MAX_OCTETS - 6) /* "To: <" addr ">" on one line */
#define BOUNDARY_LEN 42        /* "=_sluice_" 24 hex "_" 8 hex */

/* The output under construction: the first error sticks and later appends do nothing. */
struct out {
	struct buf *b;
	int err;
};

static void put(struct out *o, const char *p, size_t n)
{
	if (o->err == 0 && n)
		o->err = buf_append(o->b, p, n);
}

static void put_cstr(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

static void put_spaces(struct out *o, size_t n)
{
	static const char spaces[] = "        ";
	while (n) {
		size_t k = n < sizeof(spaces) - 1 ? n : sizeof(spaces) - 1;
		put(o, spaces, k);
		n -= k;
	}
}

/* ---- checks and sanitising ---------------------------------------------------------- */

/* An address the queue can hold: 1..QUEUE_MAX_ADDR bytes and no control byte (an SMTP
 * path never has one; CR or LF would let it start a header field). */
static bool addr_valid(struct str a)
{
	if (a.len == 0 || a.len > QUEUE_MAX_ADDR)
		return false;
	for (size_t i = 0; i < a.len; i++) {
		unsigned char c = (unsigned char)a.ptr[i];
		if (c < 0x20 || c == 0x7f)
			return false;
	}
	return true;
}

/* Our host name, written as it is in From:, Message-ID and Reporting-MTA: 1..255 bytes
 * of letters, digits, '-', '.', '_', or an address literal: '[' letters, digits, '.',
 * ':' ']' ("[192.0.2.1]", "[IPv6:2001:db8::1]"). */
static bool host_valid(struct str h)
{
	if (h.len == 0 || h.len > 255)
		return false;
	bool literal = h.ptr[0] == '[';
	if (literal && (h.len < 3 || h.ptr[h.len - 1] != ']'))
		return false;
	for (size_t i = literal; i < h.len - literal; i++) {
		unsigned char c = (unsigned char)h.ptr[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '.' ||
			  (literal ? c == ':' : c == '-' || c == '_');
		if (!ok)
			return false;
	}
	return true;
}

/* Append s to b as one line of printable ASCII (text_sanitize's TEXT_FOLD_SPACE), at
 * most max (<= VALUE_MAX) bytes: 0, or buf_append()'s error. */
static int append_sanitized(struct buf *b, struct str s, size_t max)
{
	char t[VALUE_MAX + 1];
	size_t n = text_sanitize(t, sizeof(t), s, max, TEXT_FOLD_SPACE);
	return buf_append(b, t, n);
}

static bool is_ascii(struct str s)
{
	for (size_t i = 0; i < s.len; i++)
		if ((unsigned char)s.ptr[i] >= 0x80)
			return false;
	return true;
}

/*
 * One code point of UTF-8 at p[0..n) (n >= 1): its value, *len set to the bytes it
 * takes; -1 (and *len 1) for a byte that begins no well-formed sequence (overlong forms,
 * surrogates and values past U+10FFFF are not well-formed).
 */
static long utf8_next(const unsigned char *p, size_t n, size_t *len)
{
	*len = 1;
	unsigned char c = p[0];
	if (c < 0x80)
		return c;
	size_t k;
	long v, min;
	if (c >= 0xc2 && c <= 0xdf) {
		k = 2, v = c & 0x1f, min = 0x80;
	} else if (c >= 0xe0 && c <= 0xef) {
		k = 3, v = c & 0x0f, min = 0x800;
	} else if (c >= 0xf0 && c <= 0xf4) {
		k = 4, v = c & 0x07, min = 0x10000;
	} else {
		return -1;
	}
	if (n < k)
		return -1;
	for (size_t i = 1; i < k; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return -1;
		v = v << 6 | (p[i] & 0x3f);
	}
	if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
		return -1;
	*len = k;
	return v;
}

/*
 * An address with 8-bit bytes as utf-8-addr-xtext (RFC 6533 section 3), the form of the
 * "utf-8" address type that message/delivery-status (7-bit) must use: QCHAR as it is,
 * every other character as \x{HEX} (upper case, no leading zero); a byte that is not
 * UTF-8 as \x{FFFD}.  At most 8 bytes per input byte.
 */
static int append_utf8_xtext(struct buf *b, struct str a)
{
	const unsigned char *p = (const unsigned char *)a.ptr;
	int r = 0;
	for (size_t i = 0; i < a.len && r == 0;) {
		size_t len;
		long cp = utf8_next(p + i, a.len - i, &len);
		i += len;
		if (cp > 0x20 && cp < 0x7f && cp != '+' && cp != '=' && cp != '\\')
			r = buf_append_byte(b, (unsigned char)cp);
		else
			r = buf_printf(b, "\\x{%lX}", cp < 0 ? 0xfffdL : cp);
	}
	return r;
}

/* A status code "class.subject.detail" (RFC 3463): class 2, 4 or 5, then 1-3 digits
 * twice. */
static bool status_valid(struct str s)
{
	if (s.len < 5 || (s.ptr[0] != '2' && s.ptr[0] != '4' && s.ptr[0] != '5') ||
	    s.ptr[1] != '.')
		return false;
	size_t i = 2;
	for (int part = 0; part < 2; part++) {
		size_t digits = 0;
		while (i < s.len && s.ptr[i] >= '0' && s.ptr[i] <= '9' && digits < 4)
			i++, digits++;
		if (digits < 1 || digits > 3)
			return false;
		if (part == 0) {
			if (i >= s.len || s.ptr[i] != '.')
				return false;
			i++;
		}
	}
	return i == s.len;
}

static struct str rcpt_status(const struct dsn_rcpt *r)
{
	if (status_valid(r->status))
		return r->status;
	return str_cstr(r->action == DSN_DELAYED ? "4.0.0" :
			r->action == DSN_RELAYED ? "2.0.0" : "5.0.0");
}

static const char *action_name(enum dsn_action a)
{
	return a == DSN_DELAYED ? "delayed" : a == DSN_RELAYED ? "relayed" : "failed";
}

/* A diagnostic that begins with an SMTP reply code is of type "smtp" (RFC 3464 section
 * 2.3.6); anything else (a local error, "connection refused") is our own X- type. */
static bool diagnostic_is_smtp(struct str d)
{
	return d.len >= 3 && d.ptr[0] >= '2' && d.ptr[0] <= '5' && d.ptr[1] >= '0' &&
	       d.ptr[1] <= '9' && d.ptr[2] >= '0' && d.ptr[2] <= '9' &&
	       (d.len == 3 || d.ptr[3] == ' ' || d.ptr[3] == '-');
}

/* The letters and digits of a queue ID (at most 64 of them) into out: for the
 * Message-ID's left side and the text.  Returns how many. */
static size_t queue_id_chars(char out[65], struct str id)
{
	size_t n = 0;
	for (size_t i = 0; i < id.len && n < 64; i++) {
		char c = id.ptr[i];
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
			out[n++] = c;
	}
	out[n] = '\0';
	return n;
}

static void fmt_date_us(char out[40], uint64_t us)
{
	fmt_rfc5322_date(out, 40, (time_t)(us / 1000000u), 0);
}

/* ---- lines -------------------------------------------------------------------------- */

/*
 * A header field: prefix (the name, ": ", and any fixed start such as "smtp; "), then v,
 * folded (RFC 5322 section 2.2.3) so that no line passes 998 octets: before a space
 * within FOLD_WIDTH when there is one, else before the first space that fits, else (998
 * octets without a space) by inserting CRLF SP, which adds a space where the field is
 * unfolded.  v must hold no CR, LF or NUL; it is folded only at a single space (so no
 * line is white space only), and a v of up to 998 octets less the prefix without one is
 * never cut: a run of spaces in it stays as it is.  Ends the field with CRLF.
 */
static void put_field(struct out *o, const char *prefix, struct str v)
{
	put_cstr(o, prefix);
	size_t col = strlen(prefix);
	size_t i = 0;
	while (i < v.len) {
		size_t rest = v.len - i;
		size_t soft = col < FOLD_WIDTH ? FOLD_WIDTH - col : 0;
		size_t hard = LINE_MAX_OCTETS - col;
		if (rest <= soft) {
			put(o, v.ptr + i, rest);
			break;
		}
		/* a fold before v[j], at a single space: neither line is white space only */
		size_t cut = 0;
		for (size_t j = i + 1; j + 1 < v.len && j - i <= soft; j++)
			if (v.ptr[j] == ' ' && v.ptr[j - 1] != ' ' && v.ptr[j + 1] != ' ')
				cut = j;
		if (!cut && rest <= hard) {
			put(o, v.ptr + i, rest);
			break;
		}
		for (size_t j = i + soft + 1; !cut && j + 1 < v.len && j - i <= hard; j++)
			if (v.ptr[j] == ' ' && v.ptr[j - 1] != ' ' && v.ptr[j + 1] != ' ')
				cut = j;
		if (cut) {
			put(o, v.ptr + i, cut - i);
			put(o, "\r\n", 2);
			col = 0; /* the next line begins with the space at v[cut] */
			i = cut;
		} else {
			put(o, v.ptr + i, hard);
			put(o, "\r\n ", 3);
			col = 1;
			i += hard;
		}
	}
	put(o, "\r\n", 2);
}

/*
 * A value the sender's software matches by (ENVID, ORCPT): as it was given, spaces and
 * all (RFC 3464 2.2.1: the envelope-id keeps its case and spelling), when it is
 * printable ASCII -- the queue's loader lets nothing else through; otherwise sanitized.
 */
static void put_given(struct out *o, struct buf *sc, const char *prefix, struct str v)
{
	size_t i = 0;
	while (i < v.len && v.ptr[i] >= 0x20 && v.ptr[i] <= 0x7e)
		i++;
	if (i == v.len) {
		if (v.len)
			put_field(o, prefix, v);
		return;
	}
	buf_reset(sc);
	if (o->err == 0)
		o->err = append_sanitized(sc, v, VALUE_MAX);
	if (sc->len)
		put_field(o, prefix, buf_str(sc));
}

/*
 * Text for a person: v (as append_sanitized() leaves it: printable ASCII, single spaces,
 * none at either end) wrapped at TEXT_WIDTH, at a space when there is one; the first
 * line indented by first spaces, the others by rest.  Ends with CRLF.
 */
static void put_text(struct out *o, size_t first, size_t rest_indent, struct str v)
{
	size_t indent = first;
	size_t i = 0;
	do {
		put_spaces(o, indent);
		size_t room = TEXT_WIDTH > indent ? TEXT_WIDTH - indent : 1;
		size_t rest = v.len - i;
		if (rest <= room) {
			put(o, v.ptr + i, rest);
			put(o, "\r\n", 2);
			break;
		}
		size_t cut = 0;
		for (size_t j = i + 1; j <= i + room; j++)
			if (v.ptr[j] == ' ')
				cut = j;
		if (cut) {
			put(o, v.ptr + i, cut - i);
			i = cut + 1;
		} else {
			put(o, v.ptr + i, room);
			i += room;
		}
		put(o, "\r\n", 2);
		indent = rest_indent;
	} while (i < v.len);
}

/* ---- the original header section ---------------------------------------------------- */

struct hdr_reader {
	struct buf *out;
	char line[LINE_MAX_OCTETS];
	size_t len;          /* bytes of line kept (a longer line is cut at 998) */
	bool seen;           /* the line has bytes besides its final CR (NUL included) */
	bool cr;             /* a CR was read and not yet placed: it ends the line if LF
				follows, else it is a space */
	bool done;           /* the empty line, or the limit */
	bool whole;          /* the whole message: an empty line is kept, not the end */
	bool cut;            /* the limit was reached: lines were left out */
};

static void hdr_byte(struct hdr_reader *h, unsigned char c)
{
	if (c == '\0') {
		h->seen = true;
		return;
	}
	if (h->len < sizeof(h->line))
		h->line[h->len++] = (char)c;
	h->seen = true;
}

/* The line read so far ends.  0, or -ENOMEM. */
static int hdr_end_line(struct hdr_reader *h)
{
	if (!h->seen && !h->whole) {
		h->done = true; /* the empty line that ends the header section */
		return 0;
	}
	if (h->len || !h->seen) { /* a line of NULs only is dropped rather than ending the
				     section; an empty line of the whole message is kept */
		size_t before = h->out->len;
		int r = buf_append(h->out, h->line, h->len);
		if (r == 0)
			r = buf_append(h->out, "\r\n", 2);
		if (r == -ENOBUFS) {
			buf_truncate(h->out, before); /* cut at the last whole line */
			h->done = h->cut = true;
			r = 0;
		}
		if (r < 0)
			return r;
	}
	h->len = 0;
	h->seen = h->cr = false;
	return 0;
}

/*
 * The header section of the body chunks -- up to the first empty line, or all of it --
 * as CRLF lines into out (max DSN_MAX_HEADERS: the lines past it are left out): a line
 * ends at LF, with or without CR before it; any other CR is a space; NUL bytes are
 * dropped; a line over 998 octets is cut.  0 or -ENOMEM.
 */
static int collect_lines(const struct str *body, size_t nbody, struct buf *out, bool whole,
			 bool *ret_cut)
{
	struct hdr_reader *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->out = out;
	h->whole = whole;
	int r = 0;
	for (size_t k = 0; k < nbody && !h->done && r == 0; k++) {
		const unsigned char *p = (const unsigned char *)body[k].ptr;
		for (size_t i = 0; i < body[k].len && !h->done && r == 0; i++) {
			unsigned char c = p[i];
			if (c == '\n') {
				h->cr = false;
				r = hdr_end_line(h);
				continue;
			}
			if (h->cr) {
				hdr_byte(h, ' ');
				h->cr = false;
			}
			if (c == '\r')
				h->cr = true;
			else
				hdr_byte(h, c);
		}
	}
	if (r == 0 && !h->done && (h->seen || h->len))
		r = hdr_end_line(h); /* the last line had no LF (a final CR is its end) */
	*ret_cut = h->cut;
	free(h);
	return r;
}

static int collect_headers(const struct str *body, size_t nbody, struct buf *out)
{
	bool cut;
	return collect_lines(body, nbody, out, false, &cut);
}

/* The whole message into out (max DSN_MAX_RETURNED): 0 and *ret_fits, or -ENOMEM. */
static int collect_whole(const struct str *body, size_t nbody, struct buf *out,
			 bool *ret_fits)
{
	bool cut = false;
	int r = collect_lines(body, nbody, out, true, &cut);
	*ret_fits = r == 0 && !cut;
	return r;
}

/* ---- the message -------------------------------------------------------------------- */

static void make_boundary(char out[BOUNDARY_LEN + 1], const struct dsn_info *info,
			  uint32_t variant)
{
	unsigned char tail[12];
	for (int i = 0; i < 8; i++)
		tail[i] = (unsigned char)(info->now_us >> (8 * i));
	for (int i = 0; i < 4; i++)
		tail[8 + i] = (unsigned char)(variant >> (8 * i));
	XXH64_state_t st;
	XXH64_reset(&st, 0x736c75696365ULL);
	if (info->boundary_seed.len)
		XXH64_update(&st, info->boundary_seed.ptr, info->boundary_seed.len);
	XXH64_update(&st, tail, sizeof(tail));
	uint64_t a = XXH64_digest(&st);
	XXH64_reset(&st, a);
	XXH64_update(&st, tail, sizeof(tail));
	uint64_t b = XXH64_digest(&st);
	/* "=_" cannot occur in quoted-printable or base64 text (RFC 2045 section 6.7's
	 * hint), which helps when the report is forwarded as a part of another message */
	int w = fmt_fixed(out, BOUNDARY_LEN + 1, "=_sluice_%016llx%08llx_%08lx",
			  (unsigned long long)a, (unsigned long long)(b >> 32),
			  (unsigned long)variant);
	ASSERT(w == 0); /* the format has a fixed length */
}

/* How many lines of p[0..n) begin with "--" boundary. */
static size_t boundary_lines(const char *p, size_t n, const char *boundary)
{
	size_t count = 0;
	for (size_t i = 0; i < n;) {
		const char *nl = memchr(p + i, '\n', n - i);
		size_t end = nl ? (size_t)(nl - p) + 1 : n;
		if (end - i >= 2 + BOUNDARY_LEN && p[i] == '-' && p[i + 1] == '-' &&
		    memcmp(p + i + 2, boundary, BOUNDARY_LEN) == 0)
			count++;
		i = end;
	}
	return count;
}

static void put_top(struct out *o, const struct dsn_info *info, bool any_failed,
		    bool any_delayed, bool eightbit, const char *boundary)
{
	char date[40];
	fmt_date_us(date, info->now_us);
	put_cstr(o, "Date: ");
	put_cstr(o, date);
	put_cstr(o, "\r\nFrom: \"Mail Delivery System\" <MAILER-DAEMON@");
	put(o, info->reporting_mta.ptr, info->reporting_mta.len);
	/* the null sender: the caller sends the report elsewhere (a postmaster), and an
	 * empty group is the valid way to name no recipient (RFC 5322 section 3.4) */
	if (info->sender.len) {
		put_cstr(o, ">\r\nTo: <");
		put(o, info->sender.ptr, info->sender.len);
		put_cstr(o, ">\r\nSubject: ");
	} else {
		put_cstr(o, ">\r\nTo: undisclosed-recipients:;\r\nSubject: ");
	}
	put_cstr(o, any_failed ? "Undelivered Mail Returned to Sender"
			       : any_delayed ? "Delayed Mail (still being retried)"
					     : "Relayed Mail Report");
	/* unique: one queue ID is reported at most once per microsecond */
	put_cstr(o, "\r\nMessage-ID: <");
	char qid[65];
	put(o, qid, queue_id_chars(qid, info->queue_id));
	if (o->err == 0)
		o->err = buf_printf(o->b, ".%llu.dsn@", (unsigned long long)info->now_us);
	put(o, info->reporting_mta.ptr, info->reporting_mta.len);
	put_cstr(o, ">\r\nAuto-Submitted: auto-replied\r\n"
		    "MIME-Version: 1.0\r\n"
		    "Content-Type: multipart/report; report-type=delivery-status;\r\n"
		    " boundary=\"");
	put(o, boundary, BOUNDARY_LEN);
	put_cstr(o, "\"\r\n");
	if (eightbit)
		put_cstr(o, "Content-Transfer-Encoding: 8bit\r\n");
	put_cstr(o, "\r\nThis is a MIME-encapsulated message.\r\n\r\n");
}

static void put_delimiter(struct out *o, const char *boundary, bool last)
{
	put(o, "--", 2);
	put(o, boundary, BOUNDARY_LEN);
	put_cstr(o, last ? "--\r\n" : "\r\n");
}

/* Part 1.  Every line begins with our own words, '<', or spaces. */
static void put_human(struct out *o, struct buf *sc, const struct dsn_info *info,
		      const struct dsn_rcpt *rcpt, size_t n, bool any_failed, bool any_delayed)
{
	put_cstr(o, "Content-Type: text/plain; charset=us-ascii\r\n"
		    "Content-Description: Notification\r\n\r\n");

	buf_reset(sc);
	int r = buf_append_cstr(sc, "This is the mail delivery system at ");
	if (r == 0)
		r = buf_append_str(sc, info->reporting_mta);
	if (r == 0)
		r = buf_append_cstr(sc, ". Your message");
	char qid[65];
	size_t qlen = queue_id_chars(qid, info->queue_id);
	if (r == 0 && qlen) {
		r = buf_append_cstr(sc, " (queue ID ");
		if (r == 0)
			r = buf_append(sc, qid, qlen);
		if (r == 0)
			r = buf_append_cstr(sc, ")");
	}
	if (r == 0)
		r = buf_append_cstr(sc, any_failed ? " could not be delivered to one or more of "
						     "its recipients."
					: any_delayed ? " has not yet been delivered to one or more "
							"of its recipients."
						      : " was relayed to a mail server that does not "
							"send delivery notifications: this is the "
							"last notice you will get for the "
							"recipients below.");
	if (o->err == 0)
		o->err = r;
	put_text(o, 0, 0, buf_str(sc));

	buf_reset(sc);
	r = buf_append_cstr(sc, "Reason: ");
	size_t prefix = sc->len;
	if (r == 0)
		r = append_sanitized(sc, info->reason, VALUE_MAX);
	if (r == 0 && sc->len > prefix) {
		char last = sc->ptr[sc->len - 1];
		if (last != '.' && last != '!' && last != '?')
			r = buf_append_byte(sc, '.');
		put(o, "\r\n", 2);
		put_text(o, 0, 4, buf_str(sc));
	}
	if (o->err == 0)
		o->err = r;

	put(o, "\r\n", 2);
	if (any_failed && any_delayed)
		put_cstr(o, "Delivery to the recipients marked \"delayed\" is still being\r\n"
			    "retried; you do not need to send the message to them again.\r\n\r\n");
	else if (any_delayed)
		put_cstr(o, "Delivery will be retried; you do not need to send the message\r\n"
			    "again.  You will be told if it finally fails.\r\n\r\n");
	put_cstr(o, "The recipients and the replies of their mail servers follow; the\r\n"
		    "delivery report and the header of your message are attached.\r\n\r\n");

	for (size_t i = 0; i < n && o->err == 0; i++) {
		const struct dsn_rcpt *rc = &rcpt[i];
		buf_reset(sc);
		r = buf_append_byte(sc, '<');
		if (r == 0)
			r = append_sanitized(sc, rc->addr, QUEUE_MAX_ADDR);
		if (r == 0)
			r = buf_append_cstr(sc, ">: ");
		if (r == 0)
			r = buf_append_cstr(sc, action_name(rc->action));
		if (r == 0)
			r = buf_append_cstr(sc, " (");
		if (r == 0)
			r = buf_append_str(sc, rcpt_status(rc));
		if (r == 0)
			r = buf_append_byte(sc, ')');
		if (r < 0) {
			o->err = r;
			break;
		}
		put_text(o, 0, 4, buf_str(sc));

		buf_reset(sc);
		r = 0;
		bool remote = false, diag = false;
		if (rc->remote_mta.len) {
			r = buf_append_cstr(sc, "Remote host ");
			size_t before = sc->len;
			if (r == 0)
				r = append_sanitized(sc, rc->remote_mta, VALUE_MAX);
			remote = sc->len > before;
			if (!remote)
				buf_truncate(sc, 0);
		}
		if (r == 0 && rc->diagnostic.len) {
			size_t before = sc->len;
			r = buf_append_cstr(sc, remote ? " said: " : "Reply: ");
			size_t text = sc->len;
			if (r == 0)
				r = append_sanitized(sc, rc->diagnostic, VALUE_MAX);
			diag = sc->len > text;
			if (!diag)
				buf_truncate(sc, before);
		}
		if (r == 0 && remote && !diag)
			r = buf_append_cstr(sc, " was tried last.");
		if (r < 0) {
			o->err = r;
			break;
		}
		if (sc->len)
			put_text(o, 4, 6, buf_str(sc));
		put(o, "\r\n", 2);
	}
}

/* Part 2.  Every line begins with a field name or (folded) a space. */
static void put_status(struct out *o, struct buf *sc, const struct dsn_info *info,
		       const struct dsn_rcpt *rcpt, size_t n)
{
	char date[40];
	put_cstr(o, "Content-Type: message/delivery-status\r\n"
		    "Content-Description: Delivery report\r\n\r\n");
	put_given(o, sc, "Original-Envelope-Id: ", info->envid);
	put_cstr(o, "Reporting-MTA: dns; ");
	put(o, info->reporting_mta.ptr, info->reporting_mta.len);
	put(o, "\r\n", 2);
	if (info->arrival_us) {
		fmt_date_us(date, info->arrival_us);
		put_cstr(o, "Arrival-Date: ");
		put_cstr(o, date);
		put(o, "\r\n", 2);
	}
	for (size_t i = 0; i < n && o->err == 0; i++) {
		const struct dsn_rcpt *rc = &rcpt[i];
		put(o, "\r\n", 2);
		put_given(o, sc, "Original-Recipient: ", rc->orcpt);
		buf_reset(sc);
		/* addr_valid() let no control byte through: an ASCII address goes as it is,
		 * unless it has a space (a quoted local part): a run of them could not be
		 * folded without a line of white space only, and xtext writes them \x{20} */
		if (is_ascii(rc->addr) && !memchr(rc->addr.ptr, ' ', rc->addr.len)) {
			put_field(o, "Final-Recipient: rfc822; ", rc->addr);
		} else {
			int r = append_utf8_xtext(sc, rc->addr);
			if (r < 0) {
				o->err = r;
				break;
			}
			put_field(o, "Final-Recipient: utf-8; ", buf_str(sc));
		}
		put_cstr(o, "Action: ");
		put_cstr(o, action_name(rc->action));
		put(o, "\r\n", 2);
		put_cstr(o, "Status: ");
		struct str st = rcpt_status(rc);
		put(o, st.ptr, st.len);
		put(o, "\r\n", 2);

		buf_reset(sc);
		if (o->err == 0)
			o->err = append_sanitized(sc, rc->remote_mta, VALUE_MAX);
		if (sc->len)
			put_field(o, "Remote-MTA: dns; ", buf_str(sc));
		buf_reset(sc);
		if (o->err == 0)
			o->err = append_sanitized(sc, rc->diagnostic, VALUE_MAX);
		if (sc->len) {
			bool smtp = diagnostic_is_smtp(buf_str(sc));
			put_field(o, smtp ? "Diagnostic-Code: smtp; "
					  : "Diagnostic-Code: X-Sluice; ", buf_str(sc));
		}
		if (rc->last_attempt_us) {
			fmt_date_us(date, rc->last_attempt_us);
			put_cstr(o, "Last-Attempt-Date: ");
			put_cstr(o, date);
			put(o, "\r\n", 2);
		}
	}
	put(o, "\r\n", 2);
}

int dsn_format(const struct dsn_info *info, const struct dsn_rcpt *rcpt, size_t n,
	       const struct str *body, size_t nbody, struct buf *out)
{
	if (!info || !rcpt || n == 0 || (nbody && !body))
		return -EINVAL;
	if (!host_valid(info->reporting_mta) ||
	    (info->sender.len && (!addr_valid(info->sender) || info->sender.len > TO_ADDR_MAX)))
		return -EINVAL;
	bool any_failed = false, any_delayed = false;
	for (size_t i = 0; i < n; i++) {
		if (!addr_valid(rcpt[i].addr))
			return -EINVAL;
		if (rcpt[i].action == DSN_DELAYED)
			any_delayed = true;
		else if (rcpt[i].action == DSN_FAILED)
			any_failed = true;
	}

	struct buf hdr, sc;
	buf_init(&sc, SCRATCH_MAX);
	bool whole = false;
	int r = 0;
	if (info->full && any_failed) {
		buf_init(&hdr, DSN_MAX_RETURNED);
		r = collect_whole(body, nbody, &hdr, &whole);
		if (!whole)
			buf_done(&hdr);
	}
	if (!whole) {
		buf_init(&hdr, DSN_MAX_HEADERS);
		if (r == 0)
			r = collect_headers(body, nbody, &hdr);
	}
	bool eightbit = !is_ascii(buf_str(&hdr));
	size_t start = out->len;
	for (uint32_t variant = 0; r == 0; variant++) {
		char boundary[BOUNDARY_LEN + 1];
		make_boundary(boundary, info, variant);
		struct out o = { out, 0 };
		put_top(&o, info, any_failed, any_delayed, eightbit, boundary);
		put_delimiter(&o, boundary, false);
		put_human(&o, &sc, info, rcpt, n, any_failed, any_delayed);
		put_delimiter(&o, boundary, false);
		put_status(&o, &sc, info, rcpt, n);
		put_delimiter(&o, boundary, false);
		if (whole)
			put_cstr(&o, "Content-Type: message/rfc822\r\n"
				     "Content-Description: Undelivered Message\r\n");
		else
			put_cstr(&o, "Content-Type: text/rfc822-headers\r\n");
		if (!whole)
			put_cstr(&o, any_failed ? "Content-Description: Undelivered Message Headers\r\n"
				     : any_delayed ? "Content-Description: Delayed Message Headers\r\n"
						   : "Content-Description: Relayed Message Headers\r\n");
		if (eightbit)
			put_cstr(&o, "Content-Transfer-Encoding: 8bit\r\n");
		put(&o, "\r\n", 2);
		put(&o, hdr.ptr, hdr.len);
		put(&o, "\r\n", 2);
		put_delimiter(&o, boundary, true);
		r = o.err;
		if (r < 0)
			break;
		if (boundary_lines(out->ptr + start, out->len - start, boundary) == 4)
			break;
		buf_truncate(out, start); /* a content line begins with the boundary */
	}
	if (r < 0)
		buf_truncate(out, start);
	buf_done(&hdr);
	buf_done(&sc);
	return r;
}
