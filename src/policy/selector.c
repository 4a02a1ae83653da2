/*
 * selector -- key specs and their values (see selector.h).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "rate.h"
#include "selector.h"
#include "util.h"

static const struct {
	const char *name;
	enum selector_kind kind;
} kinds[] = {
	{ "client_ip", SEL_CLIENT_IP },	    { "client_name", SEL_CLIENT_NAME },
	{ "helo", SEL_HELO },		    { "sasl_user", SEL_SASL_USER },
	{ "sender", SEL_SENDER },	    { "sender_domain", SEL_SENDER_DOMAIN },
	{ "rcpt", SEL_RCPT },		    { "rcpt_domain", SEL_RCPT_DOMAIN },
	{ "header", SEL_HEADER },	    { "macro", SEL_MACRO },
};

static bool name_ok(struct str n)
{
	if (n.len == 0 || n.len > SELECTOR_MAX_NAME)
		return false;
	for (size_t i = 0; i < n.len; i++) {
		unsigned char c = (unsigned char)n.ptr[i];
		/* header field names (RFC 5322 ftext) and macro names like "{auth_authen}" */
		if (c <= ' ' || c >= 0x7f || c == ':' || c == '+')
			return false;
	}
	return true;
}

static int parse_bits(const char *p, const char *end, unsigned max, unsigned *ret)
{
	unsigned v = 0;
	if (p == end)
		return -EINVAL;
	for (; p < end; p++) {
		if (*p < '0' || *p > '9')
			return -EINVAL;
		v = v * 10 + (unsigned)(*p - '0');
		if (v > max)
			return -EINVAL;
	}
	*ret = v;
	return 0;
}

int selector_parse(struct str text, struct selector *ret, char *err, size_t errlen)
{
	struct selector s;
	memset(&s, 0, sizeof(s));
	s.v4_bits = 32;
	s.v6_bits = 128;
	const char *p = text.ptr, *end = text.ptr + text.len;
	const char *colon = memchr(p, ':', text.len);
	const char *slash = memchr(p, '/', text.len);
	const char *word_end = colon ? colon : slash ? slash : end;
	struct str word = str_make(p, (size_t)(word_end - p));
	bool found = false;
	for (size_t i = 0; i < ARRAY_SIZE(kinds); i++)
		if (str_eq_cstr(word, kinds[i].name)) {
			s.kind = kinds[i].kind;
			found = true;
		}
	if (!found) {
		fmt_fixed(err, errlen, "unknown selector '%.*s' (known: client_ip, client_name, "
			  "helo, sasl_user, sender, sender_domain, rcpt, rcpt_domain, "
			  "header:NAME, macro:NAME)", (int)(text.len > 100 ? 100 : text.len),
			  text.ptr);
		return -EINVAL;
	}
	if (s.kind == SEL_HEADER || s.kind == SEL_MACRO) {
		struct str name = colon ? str_make(colon + 1, (size_t)(end - colon - 1)) : STR_NULL;
		if (!colon || !name_ok(name)) {
			fmt_fixed(err, errlen, "'%.*s': expected %s:NAME with a name of 1-%d "
				  "printable characters", (int)(text.len > 100 ? 100 : text.len),
				  text.ptr, s.kind == SEL_HEADER ? "header" : "macro",
				  SELECTOR_MAX_NAME);
			return -EINVAL;
		}
		memcpy(s.name, name.ptr, name.len);
		s.name[name.len] = '\0';
	} else if (colon) {
		fmt_fixed(err, errlen, "'%.*s': only header: and macro: take a name",
			  (int)(text.len > 100 ? 100 : text.len), text.ptr);
		return -EINVAL;
	} else if (slash) {
		if (s.kind != SEL_CLIENT_IP) {
			fmt_fixed(err, errlen, "'%.*s': only client_ip takes a /prefix",
				  (int)(text.len > 100 ? 100 : text.len), text.ptr);
			return -EINVAL;
		}
		const char *slash2 = memchr(slash + 1, '/', (size_t)(end - slash - 1));
		if (parse_bits(slash + 1, slash2 ? slash2 : end, 32, &s.v4_bits) < 0 ||
		    (slash2 && parse_bits(slash2 + 1, end, 128, &s.v6_bits) < 0)) {
			fmt_fixed(err, errlen, "'%.*s': expected client_ip/V4 or client_ip/V4/V6 "
				  "with V4 in 0-32 and V6 in 0-128",
				  (int)(text.len > 100 ? 100 : text.len), text.ptr);
			return -EINVAL;
		}
		/* a network for IPv4 means a network for IPv6 too: /64 is one site's LAN */
		if (!slash2)
			s.v6_bits = s.v4_bits < 32 ? 64 : 128;
	}
	*ret = s;
	return 0;
}

/* One alternative, "a+b+c", into sels[*n..]. */
static int parse_alt(const char *spec, const char *p, size_t len, struct selector *sels,
		     size_t max, size_t *n, char *err, size_t errlen)
{
	size_t first = *n;
	const char *end = p + len;
	for (;;) {
		const char *plus = memchr(p, '+', (size_t)(end - p));
		size_t l = plus ? (size_t)(plus - p) : (size_t)(end - p);
		if (l == 0) {
			fmt_fixed(err, errlen, "empty selector in '%.100s'", spec);
			return -EINVAL;
		}
		if (*n == max) {
			fmt_fixed(err, errlen, "more than %zu selectors in '%.100s'", max, spec);
			return -EINVAL;
		}
		if (selector_parse(str_make(p, l), &sels[*n], err, errlen) < 0)
			return -EINVAL;
		for (size_t i = first; i < *n; i++)
			if (memcmp(&sels[i], &sels[*n], sizeof(sels[*n])) == 0) {
				fmt_fixed(err, errlen, "selector '%.*s' given twice", (int)l, p);
				return -EINVAL;
			}
		(*n)++;
		if (!plus)
			return 0;
		p = plus + 1;
	}
}

int selector_parse_key(const char *spec, struct selector *sels, size_t max, size_t *ret_n,
		       size_t *alt, size_t *ret_nalt, char *err, size_t errlen)
{
	size_t n = 0, nalt = 0;
	const char *p = spec;
	if (!alt && strchr(spec, '|')) {
		fmt_fixed(err, errlen, "no '|' here: one selector, or several joined with '+'");
		return -EINVAL;
	}
	for (;;) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		if (len == 0) {
			fmt_fixed(err, errlen, "empty alternative in '%.100s'", spec);
			return -EINVAL;
		}
		if (alt)
			alt[nalt] = n;
		if (parse_alt(spec, p, len, sels, max, &n, err, errlen) < 0)
			return -EINVAL;
		for (size_t a = 0; alt && a < nalt; a++)
			if (alt[a + 1] - alt[a] == n - alt[nalt] &&
			    memcmp(&sels[alt[a]], &sels[alt[nalt]],
				   (n - alt[nalt]) * sizeof(*sels)) == 0) {
				fmt_fixed(err, errlen, "alternative '%.*s' given twice", (int)len, p);
				return -EINVAL;
			}
		nalt++;
		if (!bar)
			break;
		p = bar + 1;
	}
	if (alt)
		alt[nalt] = n;
	*ret_n = n;
	if (ret_nalt)
		*ret_nalt = nalt;
	return 0;
}

const char *selector_alt_name(const struct selector_set *set, size_t i, char *buf, size_t len)
{
	size_t from = 0, to = set->n;
	if (set->alt && set->nalt > 1) {
		from = set->alt[i];
		to = set->alt[i + 1];
	}
	struct buf b;
	buf_init_fixed(&b, buf, len);
	for (size_t k = from; k < to; k++) {
		char name[100];
		if (k > from)
			buf_append_byte(&b, '+');
		buf_append_cstr(&b, selector_name(&set->sel[k], name, sizeof(name)));
	}
	return buf;
}

const char *selector_name(const struct selector *s, char *buf, size_t len)
{
	const char *base = "?";
	for (size_t i = 0; i < ARRAY_SIZE(kinds); i++)
		if (kinds[i].kind == s->kind)
			base = kinds[i].name;
	if (s->kind == SEL_HEADER || s->kind == SEL_MACRO)
		fmt_fixed(buf, len, "%s:%s", base, s->name);
	else if (s->kind == SEL_CLIENT_IP && (s->v4_bits != 32 || s->v6_bits != 128))
		fmt_fixed(buf, len, "%s/%u/%u", base, s->v4_bits, s->v6_bits);
	else
		fmt_fixed(buf, len, "%s", base);
	return buf;
}

enum mask_type selector_mask_type(const struct selector *s)
{
	switch (s->kind) {
	case SEL_CLIENT_IP:
		return MASK_IP;
	case SEL_CLIENT_NAME:
	case SEL_HELO:
	case SEL_SENDER_DOMAIN:
	case SEL_RCPT_DOMAIN:
		return MASK_NAME;
	case SEL_SENDER:
	case SEL_RCPT:
		return MASK_ADDRESS;
	case SEL_SASL_USER:
	case SEL_HEADER:
	case SEL_MACRO:
		break;
	}
	return MASK_STRING;
}

/* ---- normalization ---- */

static struct str trim(struct str s)
{
	while (s.len && (s.ptr[0] == ' ' || s.ptr[0] == '\t'))
		s.ptr++, s.len--;
	while (s.len && (s.ptr[s.len - 1] == ' ' || s.ptr[s.len - 1] == '\t' ||
			 s.ptr[s.len - 1] == '\r' || s.ptr[s.len - 1] == '\n'))
		s.len--;
	return s;
}

static struct str cut(struct str s)
{
	if (s.len > SELECTOR_MAX_VALUE)
		s.len = SELECTOR_MAX_VALUE;
	return s;
}

static int append_lower(struct buf *out, struct str s)
{
	s = cut(s);
	int r = buf_reserve(out, s.len);
	if (r < 0)
		return r;
	for (size_t i = 0; i < s.len; i++)
		out->ptr[out->len + i] = (char)tolower((unsigned char)s.ptr[i]);
	buf_truncate(out, out->len + s.len);
	return 0;
}

/* A host or domain name: lowercase, without one trailing dot.  Empty = none. */
static int append_name(struct buf *out, struct str s)
{
	s = trim(s);
	if (s.len && s.ptr[s.len - 1] == '.')
		s.len--;
	if (s.len == 0)
		return 0;
	int r = append_lower(out, s);
	return r < 0 ? r : 1;
}

/* Strip blanks and angle brackets; "" and "<>" are the null sender. */
static struct str bare_address(struct str a)
{
	a = trim(a);
	if (a.len >= 2 && a.ptr[0] == '<' && a.ptr[a.len - 1] == '>')
		a = str_make(a.ptr + 1, a.len - 2);
	return trim(a);
}

static const char *last_at(struct str a)
{
	for (size_t i = a.len; i > 0; i--)
		if (a.ptr[i - 1] == '@')
			return a.ptr + i - 1;
	return NULL;
}

/* An address: local part as written, domain lowercased; the null address is "<>". */
static int append_address(struct buf *out, struct str a)
{
	a = cut(bare_address(a));
	if (a.len == 0)
		return buf_append_cstr(out, "<>") < 0 ? -ENOBUFS : 1;
	const char *at = last_at(a);
	size_t local = at ? (size_t)(at - a.ptr) + 1 : a.len;
	int r = buf_append(out, a.ptr, local);
	if (r == 0 && at) {
		/* one final dot dropped, as for the domain selectors and the address masks:
		 * "a@example.org." is the same mailbox, not a second budget */
		struct str domain = str_make(at + 1, a.len - local);
		if (domain.len && domain.ptr[domain.len - 1] == '.')
			domain.len--;
		r = append_lower(out, domain);
	}
	return r < 0 ? r : 1;
}

static int append_address_domain(struct buf *out, struct str a, bool null_is_value)
{
	a = bare_address(a);
	if (a.len == 0)
		return null_is_value ? (buf_append_cstr(out, "<>") < 0 ? -ENOBUFS : 1) : 0;
	const char *at = last_at(a);
	if (!at)
		return 0;
	return append_name(out, str_make(at + 1, (size_t)(a.ptr + a.len - at - 1)));
}

static int append_ip(struct buf *out, const struct selector *s, struct str text)
{
	struct ipaddr ip;
	if (ipaddr_parse(trim(text), &ip) < 0)
		return 0;
	unsigned bits = ip.family == 4 ? s->v4_bits : s->v6_bits;
	ipaddr_mask(&ip, bits);
	char tmp[IPADDR_TEXT_MAX];
	if (ipaddr_format(&ip, bits, tmp, sizeof(tmp)) < 0)
		return 0;
	return buf_append_cstr(out, tmp) < 0 ? -ENOBUFS : 1;
}

static bool client_name_known(struct str n)
{
	n = trim(n);
	return n.len && n.ptr[0] != '[' && !(n.len == 7 && strncasecmp(n.ptr, "unknown", 7) == 0);
}

int selector_value(const struct selector *s, const struct policy_txn *t, struct buf *out)
{
	struct str v;
	int r;
	switch (s->kind) {
	case SEL_CLIENT_IP:
		return append_ip(out, s, t->client_addr);
	case SEL_CLIENT_NAME:
		return client_name_known(t->client_name) ? append_name(out, t->client_name) : 0;
	case SEL_HELO:
		return append_name(out, t->helo);
	case SEL_SASL_USER:
		v = trim(t->sasl_user);
		if (v.len == 0)
			return 0;
		return buf_append_str(out, cut(v)) < 0 ? -ENOBUFS : 1;
	case SEL_SENDER:
		return t->have_sender ? append_address(out, t->sender) : 0;
	case SEL_SENDER_DOMAIN:
		return t->have_sender ? append_address_domain(out, t->sender, true) : 0;
	case SEL_RCPT:
		return bare_address(t->rcpt).len ? append_address(out, t->rcpt) : 0;
	case SEL_RCPT_DOMAIN:
		return append_address_domain(out, t->rcpt, false);
	case SEL_HEADER:
		if (!t->header || !t->header(t->arg, s->name, &v))
			return 0;
		r = buf_append_str(out, cut(trim(v)));
		return r < 0 ? r : 1;
	case SEL_MACRO:
		/* an empty macro ({auth_authen} without AUTH) is no value */
		if (!t->macro || !t->macro(t->arg, s->name, &v) || v.len == 0)
			return 0;
		r = buf_append_str(out, cut(v));
		return r < 0 ? r : 1;
	}
	return 0;
}

/* Append v to out with '%' and '+' escaped (a part of a compound key), cut where the
 * escaped text would pass SELECTOR_MAX_VALUE bytes (never inside an escape): a value
 * counts as much in a key as it does alone. */
static int append_escaped(struct buf *out, struct str v)
{
	size_t used = 0;
	for (size_t i = 0; i < v.len; i++) {
		int r;
		bool esc = v.ptr[i] == '%' || v.ptr[i] == '+';
		if (used + (esc ? 3 : 1) > SELECTOR_MAX_VALUE)
			break;
		used += esc ? 3 : 1;
		if (v.ptr[i] == '%')
			r = buf_append_cstr(out, "%25");
		else if (v.ptr[i] == '+')
			r = buf_append_cstr(out, "%2B");
		else
			r = buf_append_byte(out, (unsigned char)v.ptr[i]);
		if (r < 0)
			return -ENOBUFS;
	}
	return 0;
}

/* The key of sels[0..n) appended to out: as selector_key() without the reset. */
static int selector_key_append(const struct selector *sels, size_t n, const struct policy_txn *t,
			       struct buf *out, const struct selector **ret_missing)
{
	char space[SELECTOR_MAX_VALUE + 8];
	for (size_t i = 0; i < n; i++) {
		struct buf v;
		int r;
		if (n == 1) {
			r = selector_value(&sels[i], t, out);
		} else {
			buf_init_fixed(&v, space, sizeof(space));
			if (i && buf_append_byte(out, '+') < 0)
				return -ENOBUFS;
			r = selector_value(&sels[i], t, &v);
			if (r == 1 && append_escaped(out, buf_str(&v)) < 0)
				return -ENOBUFS;
		}
		if (r < 0)
			return r;
		if (r == 0) {
			if (ret_missing)
				*ret_missing = &sels[i];
			return 0;
		}
	}
	return 1;
}

int selector_key(const struct selector *sels, size_t n, const struct policy_txn *t,
		 struct buf *out, const struct selector **ret_missing)
{
	buf_reset(out);
	return selector_key_append(sels, n, t, out, ret_missing);
}

/* Does alternative a read the sender (whose null sender is a value of its own)? */
static bool alt_reads_sender(const struct selector_set *set, size_t a)
{
	for (size_t k = set->alt[a]; k < set->alt[a + 1]; k++)
		if (set->sel[k].kind == SEL_SENDER || set->sel[k].kind == SEL_SENDER_DOMAIN)
			return true;
	return false;
}

int selector_chain_key(const struct selector_set *set, const struct policy_txn *t,
		       struct buf *out, size_t *ret_alt, const struct selector **ret_missing)
{
	if (!set->alt || set->nalt <= 1) {
		if (ret_alt)
			*ret_alt = 0;
		return selector_key(set->sel, set->n, t, out, ret_missing);
	}
	bool null_sender = t->have_sender && bare_address(t->sender).len == 0;
	for (size_t a = 0; a < set->nalt; a++) {
		char name[SELECTOR_MAX * 80];
		/* a bounce's null sender is no one to count by: the chain goes on (but for its
		 * last alternative, which counts bounces together rather than not at all) */
		if (null_sender && a + 1 < set->nalt && alt_reads_sender(set, a))
			continue;
		buf_reset(out);
		selector_alt_name(set, a, name, sizeof(name));
		if (buf_append_cstr(out, name) < 0 || buf_append_byte(out, ':') < 0)
			return -ENOBUFS;
		int r = selector_key_append(&set->sel[set->alt[a]], set->alt[a + 1] - set->alt[a],
					    t, out, ret_missing);
		if (r != 0) {
			if (r == 1 && ret_alt)
				*ret_alt = a;
			return r;
		}
	}
	buf_reset(out);
	return 0;
}

bool selector_match(const struct selector *s, const struct policy_txn *t,
		    const struct mask_list *l)
{
	char space[SELECTOR_MAX_VALUE + 8];
	struct buf b;
	buf_init_fixed(&b, space, sizeof(space));
	struct ipaddr ip;
	switch (s->kind) {
	case SEL_CLIENT_IP:
		if (ipaddr_parse(trim(t->client_addr), &ip) < 0)
			return false;
		return mask_list_match_ip(l, &ip);
	/* the address as the key sees it (blanks and brackets stripped), so that an except
	 * entry matches whatever key the same address gives */
	case SEL_SENDER: {
		struct str a = bare_address(t->sender);
		return t->have_sender && mask_list_match_address(l, a.len ? a : str_cstr("<>"));
	}
	case SEL_RCPT: {
		struct str a = bare_address(t->rcpt);
		return a.len && mask_list_match_address(l, a);
	}
	default:
		break;
	}
	if (selector_value(s, t, &b) != 1)
		return false;
	if (selector_mask_type(s) == MASK_NAME)
		return mask_list_match_name(l, buf_str(&b));
	return mask_list_match_string(l, buf_str(&b));
}

/* Normalize one override component the way selector_value() would have built it. */
static int normalize_one(const struct selector *s, struct str v, struct buf *out)
{
	struct ipaddr ip;
	unsigned bits;
	char tmp[IPADDR_TEXT_MAX];
	switch (s->kind) {
	case SEL_CLIENT_IP:
		if (ipaddr_parse_prefix(v, &ip, &bits) < 0)
			return -1;
		bits = ip.family == 4 ? s->v4_bits : s->v6_bits;
		ipaddr_mask(&ip, bits);
		if (ipaddr_format(&ip, bits, tmp, sizeof(tmp)) < 0)
			return -1;
		return buf_append_cstr(out, tmp) < 0 ? -1 : 0;
	case SEL_CLIENT_NAME:
	case SEL_HELO:
	case SEL_RCPT_DOMAIN:
		return append_name(out, v) == 1 ? 0 : -1;
	case SEL_SENDER_DOMAIN:
		if (str_eq_cstr(v, "<>"))
			return buf_append_cstr(out, "<>") < 0 ? -1 : 0;
		return append_name(out, v) == 1 ? 0 : -1;
	case SEL_SENDER:
	case SEL_RCPT:
		return append_address(out, v) == 1 ? 0 : -1;
	default:
		return buf_append_str(out, v) < 0 ? -1 : 0;
	}
}

/* Undo append_escaped(): "%2B" (or "%2b") is '+', "%25" is '%'; any other '%' stays. */
static int append_unescaped(struct buf *out, struct str v)
{
	for (size_t i = 0; i < v.len; i++) {
		char c = v.ptr[i];
		if (c == '%' && i + 2 < v.len && v.ptr[i + 1] == '2' &&
		    (v.ptr[i + 2] == 'B' || v.ptr[i + 2] == 'b' || v.ptr[i + 2] == '5')) {
			c = v.ptr[i + 2] == '5' ? '%' : '+';
			i += 2;
		}
		if (buf_append_byte(out, (unsigned char)c) < 0)
			return -1;
	}
	return 0;
}

/* One alternative's key text (its parts joined with '+') normalized into b. */
static int normalize_alt(const struct selector *sel, size_t n, struct str key, struct buf *b)
{
	if (n == 1)
		return normalize_one(&sel[0], key, b);
	size_t plus = 0;
	for (size_t i = 0; i < key.len; i++)
		plus += key.ptr[i] == '+';
	if (plus != n - 1)
		return -1; /* a '+' inside a value is written %2B */
	const char *p = key.ptr, *end = key.ptr + key.len;
	for (size_t i = 0; i < n; i++) {
		const char *q = memchr(p, '+', (size_t)(end - p));
		if (!q)
			q = end;
		char raw[RATE_MAX_OVERRIDE_KEY + 1], norm[RATE_MAX_OVERRIDE_KEY + 1];
		struct buf rb, nb;
		buf_init_fixed(&rb, raw, sizeof(raw));
		buf_init_fixed(&nb, norm, sizeof(norm));
		if ((i && buf_append_byte(b, '+') < 0) ||
		    append_unescaped(&rb, str_make(p, (size_t)(q - p))) < 0 ||
		    normalize_one(&sel[i], buf_str(&rb), &nb) < 0 ||
		    append_escaped(b, buf_str(&nb)) < 0)
			return -1;
		p = q + 1;
	}
	return 0;
}

int selector_normalize_key(struct str key, char *out, void *arg)
{
	const struct selector_set *set = arg;
	/* a buf over out would put its NUL at out[RATE_MAX_OVERRIDE_KEY], one byte past what
	 * the rate_key_normalize_fn contract gives (rate.c's buffer is exactly that long) */
	char space[RATE_MAX_OVERRIDE_KEY + 1];
	struct buf b;
	buf_init_fixed(&b, space, sizeof(space));
	if (!set->alt || set->nalt <= 1) {
		if (normalize_alt(set->sel, set->n, key, &b) < 0)
			return -1;
	} else {
		/* "ALTERNATIVE:key": the alternative as written in the rule */
		size_t a;
		char name[SELECTOR_MAX * 80];
		for (a = 0; a < set->nalt; a++) {
			size_t l = strlen(selector_alt_name(set, a, name, sizeof(name)));
			if (key.len > l && key.ptr[l] == ':' && strncasecmp(key.ptr, name, l) == 0)
				break;
		}
		if (a == set->nalt)
			return -1;
		size_t l = strlen(name);
		if (buf_append_cstr(&b, name) < 0 || buf_append_byte(&b, ':') < 0 ||
		    normalize_alt(&set->sel[set->alt[a]], set->alt[a + 1] - set->alt[a],
				  str_make(key.ptr + l + 1, key.len - l - 1), &b) < 0)
			return -1;
	}
	memcpy(out, b.ptr, b.len);
	return (int)b.len;
}
