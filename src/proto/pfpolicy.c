/*
 * pfpolicy -- codec for the Postfix SMTPD access policy delegation protocol (see
 * pfpolicy.h and MILTER-PROTOCOL.md Part B).
 *
 * Grammar accepted, byte-exact:
 *
 *   request = 1*attribute eol
 *   attribute = name "=" value eol
 *   name    = 1*64( ALPHA / DIGIT / "_" / "-" )
 *   value   = *( any byte but NUL and LF )
 *   eol     = [CR] LF
 *
 * Postfix never sends a CR.  One CR right before an LF is taken as part of the line end
 * (so a request typed by hand through telnet or nc reads the same), both after a value
 * and as the final empty line ("\r\n"); any other CR is data in a value and an error in a
 * name.  A value keeps every other byte as sent, 8-bit bytes included; it is not trimmed.
 * A NUL anywhere, a line without '=', an empty or bad name, and an empty line with no
 * attribute before it are protocol errors; Postfix would never send them, so the session
 * should close rather than guess.
 *
 * A repeated attribute replaces the earlier value but keeps the place of its first
 * appearance; PFPOLICY_MAX_ATTRS counts distinct names.  Repeats are bounded only by max
 * bytes, and cost O(PFPOLICY_MAX_ATTRS) word compares each (names are compared by length
 * and hash before any memcmp).
 *
 * Invariants: each byte of the buffer is examined once, in order, by one state machine
 * (st->scanned is the first byte not examined yet, and every call that returns 0 leaves
 * it at n); the only looks back are the byte before an LF (for the CR) and, at each '=',
 * compares of the new name with the names already seen, which are at most
 * PFPOLICY_MAX_ATTRS x PFPOLICY_MAX_NAME bytes whatever the request's size.  The parser
 * keeps offsets from the request start, never pointers, so the caller may reallocate the
 * buffer between calls.  An error leaves st->scanned at the offending byte (at the CR that
 * opened a bad line, at the start of an empty request), so a repeated call, with or
 * without more bytes, fails the same way.
 *
 * No I/O and no logging; the one ASSERT is for a caller that breaks the resumption
 * contract (a buffer shorter than what was already scanned).
 */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "log.h"
#include "pfpolicy.h"

enum {
	ST_LINE_START = 0, /* at the first byte of a line */
	ST_LINE_CR,        /* a line began with CR: only LF may follow (end of request) */
	ST_NAME,           /* inside a name */
	ST_VALUE,          /* after the '=' */
};

static inline int is_name_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-';
}

/* FNV-1a, only to avoid most name compares when looking for a repeated attribute. */
#define NAME_HASH_INIT 2166136261u
static inline uint32_t name_hash(uint32_t h, unsigned char c)
{
	return (h ^ c) * 16777619u;
}

static int fail(const char **ret_why, const char *why, int err)
{
	if (ret_why)
		*ret_why = why;
	return err;
}

/*
 * The name of the line at st->line (st->name_len bytes) was just ended by '='; find its
 * slot or make one, and point it at this line.  Returns the slot, or -1 when
 * PFPOLICY_MAX_ATTRS distinct names are already taken.
 */
static int name_slot(struct pfpolicy_parser *st, const char *p)
{
	const char *name = p + st->line;
	size_t i;
	for (i = 0; i < st->n; i++)
		if (st->attr[i].hash == st->hash && st->attr[i].name_len == st->name_len &&
		    memcmp(p + st->attr[i].line, name, st->name_len) == 0)
			break;
	if (i == st->n) {
		if (st->n == PFPOLICY_MAX_ATTRS)
			return -1;
		st->n++;
		st->attr[i].hash = st->hash;
		st->attr[i].name_len = st->name_len;
	}
	st->attr[i].line = st->line;
	return (int)i;
}

/* The empty line at offset i ends the request: fill *ret, reset st, return the length. */
static int end_request(struct pfpolicy_parser *st, const char *p, size_t i,
		       struct pfpolicy_request *ret, const char **ret_why)
{
	if (st->n == 0) {
		/* keep st where a new call finds the same error */
		st->scanned = st->line;
		st->state = ST_LINE_START;
		return fail(ret_why, "empty request", -EPROTO);
	}
	ret->n = st->n;
	for (size_t k = 0; k < st->n; k++) {
		size_t off = st->attr[k].line;
		size_t nlen = st->attr[k].name_len;
		ret->attr[k].name = str_make(p + off, nlen);
		ret->attr[k].value = str_make(p + off + nlen + 1, st->attr[k].value_len);
	}
	pfpolicy_parser_reset(st);
	return (int)(i + 1);
}

int pfpolicy_parse(struct pfpolicy_parser *st, const char *p, size_t n, size_t max,
		   struct pfpolicy_request *ret, const char **ret_why)
{
	/* the caller gives the same, grown buffer each time */
	ASSERT(st->scanned <= n);
	size_t lim = max < (size_t)INT_MAX ? max : (size_t)INT_MAX;
	if (n < lim)
		lim = n;
	const unsigned char *u = (const unsigned char *)p;
	size_t i = st->scanned;

	while (i < lim) {
		unsigned char c = u[i];
		if (c == '\0') {
			st->scanned = i;
			return fail(ret_why, "NUL byte in request", -EPROTO);
		}
		switch (st->state) {
		case ST_VALUE: {
			/* the common case: run to the end of the value in one go */
			const unsigned char *q = u + i, *end = u + lim;
			while (q < end && *q != '\n' && *q != '\0')
				q++;
			i = (size_t)(q - u);
			if (q == end || *q == '\0')
				continue; /* out of bytes, or the NUL check above */
			size_t len = i - (st->line + st->name_len + 1);
			if (len && u[i - 1] == '\r')
				len--;
			st->attr[st->cur].value_len = len;
			st->state = ST_LINE_START;
			st->line = ++i;
			continue;
		}
		case ST_NAME:
			if (c == '=') {
				int slot = name_slot(st, p);
				if (slot < 0) {
					st->scanned = i;
					return fail(ret_why, "too many attributes", -EPROTO);
				}
				st->cur = (size_t)slot;
				st->state = ST_VALUE;
			} else if (c == '\n') {
				st->scanned = i;
				return fail(ret_why, "line without '='", -EPROTO);
			} else if (!is_name_char(c)) {
				st->scanned = i;
				return fail(ret_why, "bad character in attribute name", -EPROTO);
			} else if (st->name_len == PFPOLICY_MAX_NAME) {
				st->scanned = i;
				return fail(ret_why, "attribute name too long", -EPROTO);
			} else {
				st->name_len++;
				st->hash = name_hash(st->hash, c);
			}
			i++;
			continue;
		case ST_LINE_START:
			if (c == '\n')
				return end_request(st, p, i, ret, ret_why);
			if (c == '\r') {
				st->state = ST_LINE_CR;
			} else if (c == '=') {
				st->scanned = i;
				return fail(ret_why, "empty attribute name", -EPROTO);
			} else if (!is_name_char(c)) {
				st->scanned = i;
				return fail(ret_why, "bad character in attribute name", -EPROTO);
			} else {
				st->state = ST_NAME;
				st->name_len = 1;
				st->hash = name_hash(NAME_HASH_INIT, c);
			}
			i++;
			continue;
		case ST_LINE_CR:
			if (c == '\n')
				return end_request(st, p, i, ret, ret_why);
			/* the CR began a name: report it there, the same on every call */
			st->scanned = st->line;
			st->state = ST_LINE_START;
			return fail(ret_why, "bad character in attribute name", -EPROTO);
		default:
			ASSERT(!"pfpolicy: bad parser state");
		}
	}
	st->scanned = i;
	/* lim is INT_MAX only when max and n are both at least that */
	if (n >= max || lim == (size_t)INT_MAX)
		return fail(ret_why, "request too long", -EMSGSIZE);
	return 0;
}

struct str pfpolicy_get(const struct pfpolicy_request *r, const char *name)
{
	if (!name)
		return STR_NULL;
	struct str want = str_cstr(name);
	for (size_t i = 0; i < r->n; i++)
		if (str_eq(r->attr[i].name, want))
			return r->attr[i].value;
	return STR_NULL;
}

int pfpolicy_put_action(struct buf *out, struct str text)
{
	static const char head[] = "action=";
	if (text.len == 0 || text.len > PFPOLICY_MAX_ACTION || !text.ptr)
		return -EINVAL;
	for (size_t i = 0; i < text.len; i++) {
		char c = text.ptr[i];
		if (c == '\0' || c == '\r' || c == '\n')
			return -EINVAL;
	}
	/* reserve first: a failed append must not leave half a reply in out */
	int r = buf_reserve(out, sizeof(head) - 1 + text.len + 2);
	if (r < 0)
		return r;
	(void)buf_append(out, head, sizeof(head) - 1);
	(void)buf_append_str(out, text);
	(void)buf_append(out, "\n\n", 2);
	return 0;
}
