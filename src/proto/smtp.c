/*
 * smtp -- codec for the server side of SMTP (see smtp.h for the contracts and the replies
 * each result maps to).
 *
 * Command lines.  The reader searches each byte for an LF once (r->scanned) and never
 * asks the caller to hold more than max bytes of a line: past max without an LF it
 * switches to discarding, and from then on takes every byte it is given until the LF,
 * which it reports as one SMTP_LINE_TOO_LONG.
 *
 * Addresses.  One cursor walks the argument from left to right, so the path's end is
 * found by the grammar (a quoted local part may hold ">" or blanks), never by searching
 * for a delimiter first.  8-bit bytes are checked as UTF-8 where they appear, whatever the
 * SMTPUTF8 status, and only remembered (has8): whether they were allowed is known only
 * once the parameters are read.
 *
 * DATA.  A state machine over the input with one byte of look-ahead held in the state:
 * a pending CR (is it CRLF or a bare CR?) and a pending "." at the start of a line (is it
 * a stuffed dot, a "." line, or the end?).  The states remember whether the line start
 * followed a real CRLF, which is the only place the end may be recognised.  Each step
 * either consumes one byte, or emits what a pending state decided without consuming (the
 * next step then reads the same byte in a state with nothing pending); no step writes
 * more than SMTP_DATA_MIN_OUT bytes, and a step runs only when its output fits, so the
 * output cannot depend on outcap or on how the input was cut.  Plain text runs are copied
 * in bulk.
 *
 * DSN parameters (RFC 3461).  The codec checks them and returns them as sent; a value
 * must decode (xtext) to printable ASCII, so that whoever decodes it later (the intake,
 * for the queue) can put it in a header or a command line as it is.
 *
 * No I/O and no logging; the one ASSERT is for a caller that breaks the line reader's
 * resumption contract (fewer bytes than were already scanned).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "log.h"
#include "smtp.h"

static int fail(const char **ret_why, const char *why, int err)
{
	if (ret_why)
		*ret_why = why;
	return err;
}

static inline bool is_blank(unsigned char c)
{
	return c == ' ' || c == '\t';
}

static inline bool is_alpha(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static inline bool is_digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

static inline unsigned char ascii_lower(unsigned char c)
{
	return c >= 'A' && c <= 'Z' ? (unsigned char)(c + ('a' - 'A')) : c;
}

/* s[0..n) equals the lower-case ASCII word w, in any case (locale-independent). */
static bool ascii_case_eq(const char *s, size_t n, const char *w)
{
	size_t wl = strlen(w);
	if (n != wl)
		return false;
	for (size_t i = 0; i < n; i++)
		if (ascii_lower((unsigned char)s[i]) != (unsigned char)w[i])
			return false;
	return true;
}

/* s[0..n) begins with the lower-case ASCII word w, in any case. */
static bool ascii_case_prefix(const char *s, size_t n, const char *w)
{
	size_t wl = strlen(w);
	return n >= wl && ascii_case_eq(s, wl, w);
}

/*
 * The length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF) at s[0..n) whose first byte is >= 0x80, or 0.
 */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t len;
	unsigned char lo = 0x80, hi = 0xbf; /* range of the second byte */
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;
	} else
		return 0;
	if (n < len || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t k = 2; k < len; k++)
		if (s[k] < 0x80 || s[k] > 0xbf)
			return 0;
	return len;
}

/* ---- command lines ---------------------------------------------------------------------- */

enum smtp_line_status smtp_line_next(struct smtp_line_reader *r, const char *p, size_t n,
				     size_t max, struct str *ret_line, size_t *ret_used)
{
	const char *lf;
	if (r->discarding) {
		lf = n ? memchr(p, '\n', n) : NULL;
		if (!lf) {
			*ret_used = n;
			return SMTP_LINE_MORE;
		}
		r->discarding = false;
		*ret_used = (size_t)(lf - p) + 1;
		return SMTP_LINE_TOO_LONG;
	}
	/* the caller gives back what it did not consume, maybe with more after it */
	ASSERT(r->scanned <= n);
	size_t lim = n < max ? n : max;
	size_t s = r->scanned; /* < max: a call that scanned max bytes does not return MORE
				  without discarding */
	lf = s < lim ? memchr(p + s, '\n', lim - s) : NULL;
	if (lf) {
		size_t len = (size_t)(lf - p);
		r->scanned = 0;
		r->bare_lf = !(len && p[len - 1] == '\r');
		*ret_line = str_make(p, r->bare_lf ? len : len - 1);
		*ret_used = len + 1;
		return SMTP_LINE_OK;
	}
	if (n < max) {
		r->scanned = n;
		*ret_used = 0;
		return SMTP_LINE_MORE;
	}
	/* max bytes without an LF: the line is too long whatever follows */
	r->scanned = 0;
	lf = lim < n ? memchr(p + lim, '\n', n - lim) : NULL;
	if (lf) {
		*ret_used = (size_t)(lf - p) + 1;
		return SMTP_LINE_TOO_LONG;
	}
	r->discarding = true;
	*ret_used = n;
	return SMTP_LINE_MORE;
}

/* ---- commands ---------------------------------------------------------------------------- */

static const char *const verb_names[] = {
	[SMTP_VERB_UNKNOWN] = "UNKNOWN", [SMTP_VERB_HELO] = "HELO", [SMTP_VERB_EHLO] = "EHLO",
	[SMTP_VERB_MAIL] = "MAIL",       [SMTP_VERB_RCPT] = "RCPT", [SMTP_VERB_DATA] = "DATA",
	[SMTP_VERB_RSET] = "RSET",       [SMTP_VERB_NOOP] = "NOOP", [SMTP_VERB_QUIT] = "QUIT",
	[SMTP_VERB_VRFY] = "VRFY",       [SMTP_VERB_EXPN] = "EXPN", [SMTP_VERB_HELP] = "HELP",
	[SMTP_VERB_STARTTLS] = "STARTTLS", [SMTP_VERB_AUTH] = "AUTH",
	[SMTP_VERB_BDAT] = "BDAT",       [SMTP_VERB_ETRN] = "ETRN",
};

const char *smtp_verb_name(enum smtp_verb v)
{
	if ((size_t)v >= sizeof(verb_names) / sizeof(verb_names[0]))
		return verb_names[SMTP_VERB_UNKNOWN];
	return verb_names[v];
}

static enum smtp_verb verb_lookup(struct str w)
{
	/* lower-case copies of verb_names[] */
	static const char *const lower[] = {
		[SMTP_VERB_HELO] = "helo", [SMTP_VERB_EHLO] = "ehlo", [SMTP_VERB_MAIL] = "mail",
		[SMTP_VERB_RCPT] = "rcpt", [SMTP_VERB_DATA] = "data", [SMTP_VERB_RSET] = "rset",
		[SMTP_VERB_NOOP] = "noop", [SMTP_VERB_QUIT] = "quit", [SMTP_VERB_VRFY] = "vrfy",
		[SMTP_VERB_EXPN] = "expn", [SMTP_VERB_HELP] = "help",
		[SMTP_VERB_STARTTLS] = "starttls", [SMTP_VERB_AUTH] = "auth",
		[SMTP_VERB_BDAT] = "bdat", [SMTP_VERB_ETRN] = "etrn",
	};
	for (size_t v = 1; v < sizeof(lower) / sizeof(lower[0]); v++)
		if (ascii_case_eq(w.ptr, w.len, lower[v]))
			return (enum smtp_verb)v;
	return SMTP_VERB_UNKNOWN;
}

int smtp_command_parse(struct str line, struct smtp_command *ret, const char **ret_why)
{
	const unsigned char *s = (const unsigned char *)line.ptr;
	size_t e = line.len;
	/* a CR first, whatever else the line holds: the reply names what broke the framing
	 * (RFC 5321 §2.3.8: CR and LF only as CRLF) */
	if (e && memchr(s, '\r', e))
		return fail(ret_why, "Bare <CR> in command", -EBADMSG);
	for (size_t k = 0; k < e; k++) {
		if (s[k] == '\0')
			return fail(ret_why, "NUL byte in command", -EINVAL);
		if ((s[k] < 0x20 && s[k] != '\t') || s[k] == 0x7f)
			return fail(ret_why, "Control character in command", -EINVAL);
	}
	size_t i = 0;
	while (i < e && is_blank(s[i]))
		i++;
	while (e > i && is_blank(s[e - 1]))
		e--;
	if (i == e)
		return fail(ret_why, "Empty command", -EINVAL);

	struct smtp_command c = { 0 };
	size_t ws = i;
	while (i < e && !is_blank(s[i]))
		i++;
	c.name = str_make(line.ptr + ws, i - ws);
	c.verb = verb_lookup(c.name);
	while (i < e && is_blank(s[i]))
		i++;
	c.arg = str_make(line.ptr + i, e - i);

	const char *prefix = c.verb == SMTP_VERB_MAIL ? "from:" :
			     c.verb == SMTP_VERB_RCPT ? "to:" : NULL;
	if (prefix) {
		if (ascii_case_prefix(c.arg.ptr, c.arg.len, prefix)) {
			i += strlen(prefix);
			while (i < e && is_blank(s[i]))
				i++;
			c.arg = str_make(line.ptr + i, e - i);
		} else {
			c.bad_form = true;
		}
	}
	*ret = c;
	return 0;
}

/* ---- addresses --------------------------------------------------------------------------- */

/* atext of RFC 5322 §3.2.3, ASCII part */
static bool is_atext(unsigned char c)
{
	return is_alpha(c) || is_digit(c) || (c && strchr("!#$%&'*+-/=?^_`{|}~", c));
}

/* [IPv4] or [IPv6:...], the brackets included in d. */
static int check_literal(struct str d, const char **ret_why)
{
	if (d.len < 3 || d.ptr[0] != '[' || d.ptr[d.len - 1] != ']')
		return fail(ret_why, "Bad address literal", -EINVAL);
	const char *t = d.ptr + 1;
	size_t tl = d.len - 2;
	int af = AF_INET;
	if (ascii_case_prefix(t, tl, "ipv6:")) {
		af = AF_INET6;
		t += 5;
		tl -= 5;
	}
	char text[64];
	if (tl == 0 || tl >= sizeof(text))
		return fail(ret_why, "Bad address literal", -EINVAL);
	for (size_t k = 0; k < tl; k++) {
		unsigned char c = (unsigned char)t[k];
		/* a tag other than IPv6 (General-address-literal) has a ':' after it */
		if (af == AF_INET && c == ':')
			return fail(ret_why, "Unsupported address literal", -EINVAL);
		if (!is_digit(c) && c != '.' && c != ':' &&
		    !(af == AF_INET6 && ascii_lower(c) >= 'a' && ascii_lower(c) <= 'f'))
			return fail(ret_why, "Bad address literal", -EINVAL);
	}
	memcpy(text, t, tl);
	text[tl] = '\0';
	unsigned char addr[16];
	if (inet_pton(af, text, addr) != 1)
		return fail(ret_why, "Bad address literal", -EINVAL);
	return 0;
}

/*
 * A domain (sub-domains, 8-bit labels as UTF-8) or an address literal.  Sets *has8 when
 * the domain holds bytes >= 0x80 (whether those are allowed is the caller's question).
 */
static int check_domain(struct str d, bool *has8, const char **ret_why)
{
	if (d.len == 0)
		return fail(ret_why, "Empty domain", -EINVAL);
	if (d.ptr[0] == '[')
		return check_literal(d, ret_why);
	if (d.len > SMTP_MAX_DOMAIN)
		return fail(ret_why, "Domain too long", -EINVAL);
	const unsigned char *s = (const unsigned char *)d.ptr;
	size_t label = 0; /* bytes of the current label */
	bool label8 = false;
	for (size_t i = 0; i <= d.len;) {
		if (i == d.len || s[i] == '.') {
			if (label == 0)
				return fail(ret_why, "Empty domain label", -EINVAL);
			if (s[i - 1] == '-')
				return fail(ret_why, "Domain label ends with a hyphen", -EINVAL);
			/* XXX a U-label is not held to 63 bytes: only its A-label form is, and
			 * converting is not worth it for a check the next hop repeats */
			if (label > 63 && !label8)
				return fail(ret_why, "Domain label too long", -EINVAL);
			label = 0;
			label8 = false;
			i++;
			continue;
		}
		unsigned char c = s[i];
		if (c >= 0x80) {
			size_t k = utf8_seq(s + i, d.len - i);
			if (!k)
				return fail(ret_why, "Invalid UTF-8 in domain", -EINVAL);
			*has8 = label8 = true;
			label += k;
			i += k;
			continue;
		}
		if (c == '-' && label == 0)
			return fail(ret_why, "Domain label begins with a hyphen", -EINVAL);
		if (!is_alpha(c) && !is_digit(c) && c != '-')
			return fail(ret_why, "Bad character in domain", -EINVAL);
		label++;
		i++;
	}
	return 0;
}

/* A local part (dot-string or quoted-string) from s[*pi], not past e. */
static int parse_local(const unsigned char *s, size_t e, size_t *pi, bool *has8,
		       const char **ret_why)
{
	size_t i = *pi;
	if (i < e && s[i] == '"') {
		for (i++;;) {
			if (i >= e)
				return fail(ret_why, "Unterminated quoted string", -EINVAL);
			unsigned char c = s[i];
			if (c == '"') {
				i++;
				break;
			}
			if (c == '\\') {
				if (i + 1 >= e || s[i + 1] < 32 || s[i + 1] > 126)
					return fail(ret_why, "Bad quoted pair", -EINVAL);
				i += 2;
			} else if (c >= 0x80) {
				size_t k = utf8_seq(s + i, e - i);
				if (!k)
					return fail(ret_why, "Invalid UTF-8 in local part", -EINVAL);
				*has8 = true;
				i += k;
			} else if (c < 32 || c == 127) {
				return fail(ret_why, "Bad character in quoted string", -EINVAL);
			} else {
				i++;
			}
		}
	} else {
		size_t atom = 0; /* bytes of the current atom */
		for (;;) {
			if (i < e && is_atext(s[i])) {
				i++;
				atom++;
			} else if (i < e && s[i] >= 0x80) {
				size_t k = utf8_seq(s + i, e - i);
				if (!k)
					return fail(ret_why, "Invalid UTF-8 in local part", -EINVAL);
				*has8 = true;
				i += k;
				atom += k;
			} else if (i < e && s[i] == '.') {
				if (atom == 0)
					return fail(ret_why, "Empty atom in local part", -EINVAL);
				i++;
				atom = 0;
			} else {
				break;
			}
		}
		if (i == *pi)
			return fail(ret_why, "Empty local part", -EINVAL);
		if (atom == 0)
			return fail(ret_why, "Local part ends with a dot", -EINVAL);
	}
	*pi = i;
	return 0;
}

struct path {
	struct str addr;
	bool postmaster;
	bool has8;
	size_t end; /* offset in the argument just past the path */
};

/* The path at the start of arg (after optional blanks); see smtp_parse_mail(). */
static int parse_path(struct str arg, bool allow_null, bool allow_postmaster, struct path *ret,
		      const char **ret_why)
{
	const unsigned char *s = (const unsigned char *)arg.ptr;
	size_t e = arg.len, i = 0;
	struct path pa = { 0 };
	int r;
	while (i < e && is_blank(s[i]))
		i++;
	bool br = i < e && s[i] == '<';
	if (br) {
		i++;
		if (i < e && s[i] == '>') {
			if (!allow_null)
				return fail(ret_why, "Empty address", -EINVAL);
			pa.addr = str_make(arg.ptr + i, 0);
			i++;
			goto tail;
		}
		/* a source route: checked, then dropped (RFC 5321 §4.1.2, §C) */
		while (i < e && s[i] == '@') {
			size_t ds = ++i;
			while (i < e && s[i] != ',' && s[i] != ':' && s[i] != '>' && !is_blank(s[i]))
				i++;
			if (check_domain(str_make(arg.ptr + ds, i - ds), &pa.has8, NULL) < 0)
				return fail(ret_why, "Bad source route", -EINVAL);
			if (i < e && s[i] == ',' && i + 1 < e && s[i + 1] == '@') {
				i++;
				continue;
			}
			if (i < e && s[i] == ':') {
				i++;
				break;
			}
			return fail(ret_why, "Bad source route", -EINVAL);
		}
	} else if (i == e) {
		return fail(ret_why, "Missing address", -EINVAL);
	}

	size_t ms = i;
	bool quoted = s[i] == '"';
	r = parse_local(s, e, &i, &pa.has8, ret_why);
	if (r < 0)
		return r;
	if (i < e && s[i] == '@') {
		size_t ds = ++i;
		if (br) {
			while (i < e && s[i] != '>')
				i++;
			if (i == e)
				return fail(ret_why, "Missing >", -EINVAL);
		} else {
			while (i < e && !is_blank(s[i]))
				i++;
		}
		r = check_domain(str_make(arg.ptr + ds, i - ds), &pa.has8, ret_why);
		if (r < 0)
			return r;
	} else if (i == e || (br ? s[i] == '>' : is_blank(s[i]))) {
		if (!allow_postmaster || quoted || !ascii_case_eq(arg.ptr + ms, i - ms, "postmaster"))
			return fail(ret_why, "Domain missing", -EINVAL);
		pa.postmaster = true;
	} else {
		return fail(ret_why, "Bad character in local part", -EINVAL);
	}
	pa.addr = str_make(arg.ptr + ms, i - ms);
	if (br) {
		/* "<postmaster" may have run out before its '>' */
		if (i == e || s[i] != '>')
			return fail(ret_why, "Missing >", -EINVAL);
		i++;
	}
tail:
	if (i < e && !is_blank(s[i]))
		return fail(ret_why, "Garbage after address", -EINVAL);
	if (pa.addr.len > SMTP_MAX_ADDR)
		return fail(ret_why, "Address too long", -EINVAL);
	pa.end = i;
	*ret = pa;
	return 0;
}

/* esmtp-keyword = (ALPHA / DIGIT) *(ALPHA / DIGIT / "-") */
static bool keyword_ok(struct str k)
{
	const unsigned char *s = (const unsigned char *)k.ptr;
	if (k.len == 0 || !(is_alpha(s[0]) || is_digit(s[0])))
		return false;
	for (size_t i = 1; i < k.len; i++)
		if (!is_alpha(s[i]) && !is_digit(s[i]) && s[i] != '-')
			return false;
	return true;
}

/* The next "keyword[=value]" of arg from *pi; false at the end. */
static bool next_param(struct str arg, size_t *pi, struct str *key, struct str *value,
		       bool *has_value)
{
	const unsigned char *s = (const unsigned char *)arg.ptr;
	size_t e = arg.len, i = *pi;
	while (i < e && is_blank(s[i]))
		i++;
	if (i == e)
		return false;
	size_t ks = i;
	while (i < e && !is_blank(s[i]) && s[i] != '=')
		i++;
	*key = str_make(arg.ptr + ks, i - ks);
	*has_value = i < e && s[i] == '=';
	size_t vs = *has_value ? ++i : i;
	while (i < e && !is_blank(s[i]))
		i++;
	*value = str_make(arg.ptr + vs, i - vs);
	*pi = i;
	return true;
}

/* SIZE=1*20DIGIT (RFC 1870), saturating at UINT64_MAX. */
static bool size_value(struct str v, uint64_t *ret)
{
	if (v.len == 0 || v.len > 20)
		return false;
	uint64_t n = 0;
	for (size_t i = 0; i < v.len; i++) {
		unsigned char c = (unsigned char)v.ptr[i];
		if (!is_digit(c))
			return false;
		unsigned d = c - '0';
		n = n > (UINT64_MAX - d) / 10 ? UINT64_MAX : n * 10 + d;
	}
	*ret = n;
	return true;
}

/* ---- DSN parameters (RFC 3461) ----------------------------------------------------------- */

static int hex_value(unsigned char c)
{
	if (is_digit(c))
		return c - '0';
	c = ascii_lower(c);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int smtp_xtext_decode(struct str x, char *out, size_t cap, size_t *ret_len)
{
	const unsigned char *s = (const unsigned char *)x.ptr;
	size_t o = 0;
	for (size_t i = 0; i < x.len; i++) {
		unsigned char c = s[i];
		if (c == '+') {
			if (x.len - i < 3)
				return -EINVAL;
			int hi = hex_value(s[i + 1]);
			int lo = hex_value(s[i + 2]);
			if (hi < 0 || lo < 0)
				return -EINVAL;
			c = (unsigned char)(hi << 4 | lo);
			i += 2;
		} else if (c < 0x21 || c > 0x7e || c == '=') {
			return -EINVAL; /* xchar: "!".."~" but "+" and "=" */
		}
		if (c < 0x20 || c > 0x7e)
			return -EINVAL;
		if (o == cap)
			return -ENOBUFS;
		out[o++] = (char)c;
	}
	*ret_len = o;
	return 0;
}

int smtp_xtext_encode(struct str s, char *out, size_t cap, size_t *ret_len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;
	for (size_t i = 0; i < s.len; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		if (c >= 0x21 && c <= 0x7e && c != '+' && c != '=') {
			if (o == cap)
				return -ENOBUFS;
			out[o++] = (char)c;
			continue;
		}
		if (cap - o < 3)
			return -ENOBUFS;
		out[o++] = '+';
		out[o++] = hex[c >> 4];
		out[o++] = hex[c & 15];
	}
	*ret_len = o;
	return 0;
}

/* xtext that decodes to printable ASCII, 1..max characters as sent. */
static bool xtext_ok(struct str x, size_t max)
{
	char tmp[SMTP_DSN_ORCPT_MAX];
	size_t n;
	return x.len > 0 && x.len <= max && x.len <= sizeof(tmp) &&
	       smtp_xtext_decode(x, tmp, sizeof(tmp), &n) == 0;
}

/* NOTIFY=NEVER / 1#(SUCCESS / FAILURE / DELAY), any case, none twice. */
static bool notify_value(struct str v, unsigned *ret)
{
	static const struct { const char *w; unsigned bit; } words[] = {
		{ "never", SMTP_NOTIFY_NEVER }, { "success", SMTP_NOTIFY_SUCCESS },
		{ "failure", SMTP_NOTIFY_FAILURE }, { "delay", SMTP_NOTIFY_DELAY },
	};
	unsigned bits = 0;
	size_t i = 0;
	if (v.len == 0)
		return false;
	while (i <= v.len) {
		size_t s = i;
		while (i < v.len && v.ptr[i] != ',')
			i++;
		unsigned bit = 0;
		for (size_t k = 0; k < sizeof(words) / sizeof(words[0]); k++)
			if (ascii_case_eq(v.ptr + s, i - s, words[k].w))
				bit = words[k].bit;
		if (!bit || (bits & bit))
			return false;
		bits |= bit;
		i++; /* past the ',' (or the end) */
	}
	if ((bits & SMTP_NOTIFY_NEVER) && bits != SMTP_NOTIFY_NEVER)
		return false;
	*ret = bits;
	return true;
}

/* ORCPT=addr-type ";" xtext, addr-type = atom (RFC 3461 4.2). */
static bool orcpt_value(struct str v, struct str *ret_type, struct str *ret_addr)
{
	if (v.len > SMTP_DSN_ORCPT_MAX)
		return false;
	const char *semi = memchr(v.ptr, ';', v.len);
	if (!semi || semi == v.ptr)
		return false;
	size_t tl = (size_t)(semi - v.ptr);
	for (size_t i = 0; i < tl; i++)
		if (!is_atext((unsigned char)v.ptr[i]))
			return false;
	struct str addr = str_make(semi + 1, v.len - tl - 1);
	if (!xtext_ok(addr, SMTP_DSN_ORCPT_MAX))
		return false;
	*ret_type = str_make(v.ptr, tl);
	*ret_addr = addr;
	return true;
}

int smtp_parse_mail(struct str arg, bool utf8_allowed, struct smtp_mail *ret,
		    const char **ret_why)
{
	struct path pa;
	int r = parse_path(arg, true, false, &pa, ret_why);
	if (r < 0)
		return r;
	struct smtp_mail m = { .addr = pa.addr };
	bool seen_body = false;
	size_t i = pa.end;
	struct str key, value;
	bool has_value;
	while (next_param(arg, &i, &key, &value, &has_value)) {
		if (!keyword_ok(key))
			return fail(ret_why, "Bad parameter keyword", -EPROTO);
		if (ascii_case_eq(key.ptr, key.len, "size")) {
			if (m.has_size)
				return fail(ret_why, "Repeated SIZE parameter", -EPROTO);
			if (!has_value || !size_value(value, &m.size))
				return fail(ret_why, "Bad SIZE value", -EPROTO);
			m.has_size = true;
		} else if (ascii_case_eq(key.ptr, key.len, "body")) {
			if (seen_body)
				return fail(ret_why, "Repeated BODY parameter", -EPROTO);
			seen_body = true;
			if (!has_value || value.len == 0)
				return fail(ret_why, "Bad BODY value", -EPROTO);
			if (ascii_case_eq(value.ptr, value.len, "7bit"))
				m.body = SMTP_BODY_7BIT;
			else if (ascii_case_eq(value.ptr, value.len, "8bitmime"))
				m.body = SMTP_BODY_8BITMIME;
			else
				return fail(ret_why, "Unsupported BODY type", -ENOTSUP);
		} else if (ascii_case_eq(key.ptr, key.len, "smtputf8")) {
			if (m.smtputf8)
				return fail(ret_why, "Repeated SMTPUTF8 parameter", -EPROTO);
			if (has_value)
				return fail(ret_why, "SMTPUTF8 takes no value", -EPROTO);
			if (!utf8_allowed)
				return fail(ret_why, "SMTPUTF8 not supported", -ENOTSUP);
			m.smtputf8 = true;
		} else if (ascii_case_eq(key.ptr, key.len, "ret")) {
			if (m.ret != SMTP_RET_NONE)
				return fail(ret_why, "Repeated RET parameter", -EPROTO);
			if (has_value && ascii_case_eq(value.ptr, value.len, "full"))
				m.ret = SMTP_RET_FULL;
			else if (has_value && ascii_case_eq(value.ptr, value.len, "hdrs"))
				m.ret = SMTP_RET_HDRS;
			else
				return fail(ret_why, "Bad RET value", -EPROTO);
		} else if (ascii_case_eq(key.ptr, key.len, "envid")) {
			if (m.envid.len)
				return fail(ret_why, "Repeated ENVID parameter", -EPROTO);
			if (!has_value || !xtext_ok(value, SMTP_DSN_ENVID_MAX))
				return fail(ret_why, "Bad ENVID value", -EPROTO);
			m.envid = value;
		} else {
			return fail(ret_why, "Unsupported parameter", -ENOTSUP);
		}
	}
	if (pa.has8 && !m.smtputf8)
		return fail(ret_why, "8-bit address without SMTPUTF8", -EILSEQ);
	*ret = m;
	return 0;
}

int smtp_parse_rcpt(struct str arg, bool utf8, struct smtp_rcpt *ret, const char **ret_why)
{
	struct path pa;
	int r = parse_path(arg, false, true, &pa, ret_why);
	if (r < 0)
		return r;
	struct smtp_rcpt rc = { .addr = pa.addr, .postmaster = pa.postmaster };
	size_t i = pa.end;
	struct str key, value;
	bool has_value;
	while (next_param(arg, &i, &key, &value, &has_value)) {
		if (!keyword_ok(key))
			return fail(ret_why, "Bad parameter keyword", -EPROTO);
		if (ascii_case_eq(key.ptr, key.len, "notify")) {
			if (rc.notify)
				return fail(ret_why, "Repeated NOTIFY parameter", -EPROTO);
			if (!has_value || !notify_value(value, &rc.notify))
				return fail(ret_why, "Bad NOTIFY value", -EPROTO);
		} else if (ascii_case_eq(key.ptr, key.len, "orcpt")) {
			if (rc.orcpt_type.len)
				return fail(ret_why, "Repeated ORCPT parameter", -EPROTO);
			if (!has_value || !orcpt_value(value, &rc.orcpt_type, &rc.orcpt))
				return fail(ret_why, "Bad ORCPT value", -EPROTO);
		} else {
			return fail(ret_why, "Unsupported parameter", -ENOTSUP);
		}
	}
	if (pa.has8 && !utf8)
		return fail(ret_why, "8-bit address without SMTPUTF8", -EILSEQ);
	*ret = rc;
	return 0;
}

int smtp_check_helo(struct str arg, bool *ret_is_domain)
{
	if (arg.len == 0 || arg.len > SMTP_MAX_DOMAIN)
		return -EINVAL;
	for (size_t i = 0; i < arg.len; i++) {
		unsigned char c = (unsigned char)arg.ptr[i];
		if (c < 0x21 || c > 0x7e)
			return -EINVAL;
	}
	if (ret_is_domain) {
		bool has8 = false;
		*ret_is_domain = check_domain(arg, &has8, NULL) == 0;
	}
	return 0;
}

/* ---- DATA -------------------------------------------------------------------------------- */

enum {
	DS_BOL = 0,      /* at a line start that follows a CRLF (or the start of the data) */
	DS_BOL_BARE,     /* at a line start that follows a bare LF or bare CR */
	DS_TEXT,         /* inside a line */
	DS_CR,           /* a CR was read inside a line (or as its first byte) */
	DS_DOT,          /* a "." was read at a DS_BOL line start */
	DS_DOT_BARE,     /* a "." was read at a DS_BOL_BARE line start */
	DS_DOT_CR,       /* "." CR at a DS_BOL line start: LF now is the end */
	DS_DOT_CR_BARE,  /* "." CR at a DS_BOL_BARE line start: LF now ends a "." line */
};

void smtp_data_init(struct smtp_data *d)
{
	*d = (struct smtp_data){ .state = DS_BOL };
}

static inline void grow_line(struct smtp_data *d, size_t k)
{
	d->line_len += k;
	if (d->line_len > d->max_line)
		d->max_line = d->line_len;
}

/* Write the line end; the line is complete.  The caller checked the room. */
static inline size_t end_line(struct smtp_data *d, char *out, bool bare)
{
	out[0] = '\r';
	out[1] = '\n';
	d->line_len = 0;
	d->lines++;
	if (bare)
		d->bare_eol++;
	return 2;
}

/* Write a "." line that is content, not the end. */
static inline size_t dot_line(struct smtp_data *d, char *out, bool bare)
{
	out[0] = '.';
	grow_line(d, 1);
	return 1 + end_line(d, out + 1, bare);
}

const char *smtp_data_bare_why(const struct smtp_data *d)
{
	if (!d->bare_eol)
		return NULL;
	/* a bare LF first: it is the smuggling form, and the one Postfix names */
	return d->bare_eol > d->bare_cr ? "bare <LF> received" : "bare <CR> received";
}

int smtp_data_decode(struct smtp_data *d, const char *p, size_t n, char *out, size_t outcap,
		     size_t *ret_consumed, size_t *ret_produced)
{
	size_t i = 0, o = 0;
	bool done = d->done;
	while (!done && i < n) {
		unsigned char c = (unsigned char)p[i];
		size_t room = outcap - o;
		switch (d->state) {
		case DS_BOL:
		case DS_BOL_BARE:
			if (c == '.') {
				d->state = d->state == DS_BOL ? DS_DOT : DS_DOT_BARE;
				i++;
			} else {
				d->state = DS_TEXT;
			}
			continue;
		case DS_DOT:
		case DS_DOT_BARE:
			if (c == '\r') {
				d->state = d->state == DS_DOT ? DS_DOT_CR : DS_DOT_CR_BARE;
				i++;
			} else if (c == '\n') {
				/* "." then a bare LF: a content line "." */
				if (room < 3)
					goto full;
				o += dot_line(d, out + o, true);
				d->state = DS_BOL_BARE;
				i++;
			} else {
				/* a stuffed dot: drop it, the byte after it begins the text */
				d->state = DS_TEXT;
			}
			continue;
		case DS_DOT_CR:
		case DS_DOT_CR_BARE:
			if (c == '\n' && d->state == DS_DOT_CR) {
				/* CRLF "." CRLF: the end */
				i++;
				done = d->done = true;
				continue;
			}
			if (room < 3)
				goto full;
			if (c == '\n') {
				/* a "." line after a bare line end, itself ended by CRLF */
				o += dot_line(d, out + o, false);
				d->state = DS_BOL;
				i++;
			} else {
				/* "." then a bare CR: a content line "." */
				o += dot_line(d, out + o, true);
				d->bare_cr++;
				d->state = DS_BOL_BARE; /* c is read again there */
			}
			continue;
		case DS_CR:
			if (room < 2)
				goto full;
			if (c == '\n') {
				o += end_line(d, out + o, false);
				d->state = DS_BOL;
				i++;
			} else {
				o += end_line(d, out + o, true);
				d->bare_cr++;
				d->state = DS_BOL_BARE; /* c is read again there */
			}
			continue;
		case DS_TEXT:
			if (c == '\r') {
				d->state = DS_CR;
				i++;
			} else if (c == '\n') {
				if (room < 2)
					goto full;
				o += end_line(d, out + o, true);
				d->state = DS_BOL_BARE;
				i++;
			} else {
				/* a run of text, as far as input and room allow */
				size_t k = 0, lim = n - i < room ? n - i : room;
				if (lim == 0)
					goto full;
				while (k < lim && p[i + k] != '\r' && p[i + k] != '\n')
					k++;
				memcpy(out + o, p + i, k);
				grow_line(d, k);
				o += k;
				i += k;
			}
			continue;
		default:
			ASSERT(!"smtp: bad DATA decoder state");
		}
	}
full:
	d->size += o;
	*ret_consumed = i;
	*ret_produced = o;
	return done;
}
