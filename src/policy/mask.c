/*
 * mask -- lists of host and address masks (see mask.h).
 *
 * mask_list_add() decides once, from the list's type, what a mask is and stores it in a
 * normalized form, so that matching is plain comparisons:
 *
 *   kind        written as                    stored                      valid in
 *   ANY         *                             (a flag)                    every list
 *   CIDR        192.0.2.0/24, ::1, [IPv6:..]  address (host bits clear)   HOSTS, IP
 *   NAME        mx.example.com[.]             lowercase, no final dot     HOSTS, NAME
 *   DOMAIN      *.example.com[.]              "example.com"               HOSTS, NAME, ADDRESS
 *   ADDRESS     user@Example.com, <u@x>       "user@example.com"          ADDRESS
 *   AT_DOMAIN   @example.com                  "example.com"               ADDRESS
 *   NULL_SENDER <>                            (nothing)                   ADDRESS
 *   TEXT        anything                      as written                  STRING
 *
 * Case folding is ASCII only (DNS names are compared that way; an IDN reaches an MTA in
 * its ASCII form).  Local parts are compared exactly, as RFC 5321 says they must be.
 *
 * Validation rules that are choices, not RFCs:
 *   - in HOST lists a mask made only of digits and dots, or holding ':', must be an IP
 *     address (a DNS name is never all-numeric, so "192.0.2.256" is a typo, not a name);
 *     host names there are letters, digits, '-', '_' and '.';
 *   - in NAME lists (helo, client_name, domains) any printable byte but '@', '/' and '*'
 *     is accepted, so that odd HELO strings such as "[192.0.2.1]" can be listed;
 *   - a '*' is only "*" alone or a leading "*."; "*@domain" is refused with a hint.
 *
 * Limits: a mask is at most MASK_MAX_LEN bytes and a list holds at most MASK_MAX_ENTRIES.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mask.h"

#define MASK_MAX_LEN 1024
#define MASK_MAX_ENTRIES 65536
#define SHOW_MAX 100 /* bytes of a mask quoted in a message */

enum entry_kind {
	ENTRY_CIDR = 0,
	ENTRY_NAME,
	ENTRY_DOMAIN,
	ENTRY_ADDRESS,
	ENTRY_AT_DOMAIN,
	ENTRY_NULL_SENDER,
	ENTRY_TEXT,
};

struct mask_entry {
	enum entry_kind kind;
	struct ipaddr addr; /* CIDR */
	unsigned bits;      /* CIDR */
	char *text;         /* normalized, NUL-terminated; NULL for CIDR and NULL_SENDER */
	size_t len;
	size_t local_len;   /* ADDRESS: the local part is text[0 .. local_len) */
};

struct mask_list {
	enum mask_type type;
	bool any;
	size_t count;       /* masks added, "*" included */
	struct mask_entry *e;
	size_t n, cap;
};

static const char *const type_names[] = {
	[MASK_HOSTS] = "host",
	[MASK_IP] = "IP",
	[MASK_NAME] = "name",
	[MASK_ADDRESS] = "address",
	[MASK_STRING] = "string",
};

/* ---- text helpers ---------------------------------------------------------------- */

static unsigned char ascii_lower(unsigned char c)
{
	return c >= 'A' && c <= 'Z' ? (unsigned char)(c + ('a' - 'A')) : c;
}

/* Case-insensitive (ASCII) equality of n bytes; NUL bytes are ordinary bytes. */
static bool casefold_eq(const char *a, const char *b, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (ascii_lower((unsigned char)a[i]) != ascii_lower((unsigned char)b[i]))
			return false;
	}
	return true;
}

static struct str drop_final_dot(struct str s)
{
	if (s.len > 0 && s.ptr[s.len - 1] == '.')
		s.len--;
	return s;
}

static bool has_byte(struct str s, char c)
{
	return s.len > 0 && memchr(s.ptr, c, s.len) != NULL;
}

/* "<x>" -> "x" ("<>" -> ""); anything else unchanged. */
static struct str strip_angle(struct str s)
{
	if (s.len >= 2 && s.ptr[0] == '<' && s.ptr[s.len - 1] == '>')
		return str_make(s.ptr + 1, s.len - 2);
	return s;
}

/* The last '@' of s, or NULL. */
static const char *last_at(struct str s)
{
	for (size_t i = s.len; i > 0; i--) {
		if (s.ptr[i - 1] == '@')
			return s.ptr + i - 1;
	}
	return NULL;
}

/* Is name (final dot already dropped) domain itself or a name below it? */
static bool in_domain(struct str name, const struct mask_entry *d)
{
	if (name.len == d->len)
		return casefold_eq(name.ptr, d->text, d->len);
	if (name.len > d->len) {
		size_t off = name.len - d->len;
		return name.ptr[off - 1] == '.' && casefold_eq(name.ptr + off, d->text, d->len);
	}
	return false;
}

static bool name_eq(struct str name, const struct mask_entry *e)
{
	return name.len == e->len && casefold_eq(name.ptr, e->text, e->len);
}

/* ---- errors ---------------------------------------------------------------------- */

/* Writes s into buf quoted, control bytes as \xNN, cut after SHOW_MAX bytes. */
static const char *show(struct str s, char *buf, size_t size)
{
	static const char hex[] = "0123456789abcdef";
	size_t pos = 0, n = s.len > SHOW_MAX ? SHOW_MAX : s.len;
	char tmp[SHOW_MAX * 4 + 8];

	tmp[pos++] = '\'';
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		if (c == '\\') {
			tmp[pos++] = '\\';
			tmp[pos++] = '\\';
		} else if (c < 0x20 || c == 0x7f) {
			tmp[pos++] = '\\';
			tmp[pos++] = 'x';
			tmp[pos++] = hex[c >> 4];
			tmp[pos++] = hex[c & 0xf];
		} else {
			tmp[pos++] = (char)c;
		}
	}
	tmp[pos++] = '\'';
	if (s.len > n) {
		memcpy(tmp + pos, "...", 3);
		pos += 3;
	}
	tmp[pos] = '\0';
	snprintf(buf, size, "%s", tmp);
	return buf;
}

#define SHOW_SIZE (SHOW_MAX * 4 + 8)

/* "'MASK': message"; returns -EINVAL. */
static int mask_error(char *err, size_t errlen, struct str mask, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int mask_error(char *err, size_t errlen, struct str mask, const char *fmt, ...)
{
	char shown[SHOW_SIZE];
	va_list ap;

	if (!err || errlen == 0)
		return -EINVAL;
	int w = snprintf(err, errlen, "%s: ", show(mask, shown, sizeof(shown)));
	if (w >= 0 && (size_t)w < errlen) {
		va_start(ap, fmt);
		vsnprintf(err + w, errlen - (size_t)w, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* "bad CIDR prefix 'MASK'" and the like; returns -EINVAL. */
static int bad_value(char *err, size_t errlen, const char *what, struct str mask)
{
	char shown[SHOW_SIZE];

	if (err && errlen > 0)
		snprintf(err, errlen, "bad %s %s", what, show(mask, shown, sizeof(shown)));
	return -EINVAL;
}

/* Describes byte c for "invalid character ..." messages. */
static const char *show_char(unsigned char c, char *buf, size_t size)
{
	if (c > 0x20 && c < 0x7f)
		snprintf(buf, size, "'%c'", c);
	else
		snprintf(buf, size, "byte 0x%02x", c);
	return buf;
}

/* ---- validation ------------------------------------------------------------------ */

/*
 * Checks a name or domain (its final dot dropped; what = "name" or "domain" for the
 * messages).  Strict: host name characters only.  Returns 0 or -EINVAL with the message.
 */
static int check_name(struct str mask, struct str name, bool strict, const char *what,
		      char *err, size_t errlen)
{
	char ch[16];

	if (name.len == 0)
		return mask_error(err, errlen, mask, "empty %s", what);
	for (size_t i = 0; i < name.len; i++) {
		unsigned char c = (unsigned char)name.ptr[i];
		if (c == '*')
			return mask_error(err, errlen, mask, "'*' is only allowed alone or as "
					 "'*.' before a domain");
		if (c == '.' && (i == 0 || i + 1 == name.len || name.ptr[i - 1] == '.'))
			return mask_error(err, errlen, mask, "empty label in %s", what);
		bool ok;
		if (strict)
			ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			     (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
		else
			ok = c > 0x20 && c != 0x7f && c != '@' && c != '/';
		if (!ok)
			return mask_error(err, errlen, mask, "invalid character %s in %s",
					 show_char(c, ch, sizeof(ch)), what);
	}
	return 0;
}

/* Digits and dots, a digit first: meant as an IPv4 address (DNS has no all-numeric top
 * level). */
static bool looks_numeric(struct str s)
{
	if (s.len == 0 || s.ptr[0] < '0' || s.ptr[0] > '9')
		return false;
	for (size_t i = 0; i < s.len; i++) {
		if (s.ptr[i] != '.' && (s.ptr[i] < '0' || s.ptr[i] > '9'))
			return false;
	}
	return true;
}

/* ---- list ------------------------------------------------------------------------ */

struct mask_list *mask_list_new(enum mask_type type)
{
	if ((unsigned)type > MASK_STRING)
		return NULL;
	struct mask_list *l = calloc(1, sizeof(*l));
	if (l)
		l->type = type;
	return l;
}

struct mask_list *mask_list_free(struct mask_list *l)
{
	if (!l)
		return NULL;
	for (size_t i = 0; i < l->n; i++)
		free(l->e[i].text);
	free(l->e);
	free(l);
	return NULL;
}

size_t mask_list_count(const struct mask_list *l)
{
	return l ? l->count : 0;
}

bool mask_list_has_any(const struct mask_list *l)
{
	return l && l->any;
}

/* Appends an entry; text (len bytes, may be NULL) is copied.  0 or -ENOMEM. */
static int push(struct mask_list *l, struct mask_entry e, const char *text, size_t len,
		bool lower)
{
	if (l->n == l->cap) {
		size_t ncap = l->cap ? l->cap * 2 : 8;
		struct mask_entry *a = realloc(l->e, ncap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		l->e = a;
		l->cap = ncap;
	}
	if (text) {
		e.text = malloc(len + 1);
		if (!e.text)
			return -ENOMEM;
		memcpy(e.text, text, len);
		e.text[len] = '\0';
		e.len = len;
		if (lower) {
			/* an ADDRESS keeps its local part as written */
			for (size_t i = e.local_len; i < len; i++)
				e.text[i] = (char)ascii_lower((unsigned char)e.text[i]);
		}
	}
	l->e[l->n++] = e;
	return 0;
}

static int add_ip(struct mask_list *l, struct str mask, char *err, size_t errlen)
{
	struct mask_entry e = { .kind = ENTRY_CIDR };

	if (has_byte(mask, '/')) {
		if (ipaddr_parse_prefix(mask, &e.addr, &e.bits) < 0)
			return bad_value(err, errlen, "CIDR prefix", mask);
	} else {
		if (ipaddr_parse(mask, &e.addr) < 0)
			return bad_value(err, errlen, "IP address", mask);
		e.bits = e.addr.family == 4 ? 32 : 128;
	}
	return push(l, e, NULL, 0, false);
}

/* "*.domain" (already known to start with "*.") or an exact name. */
static int add_name(struct mask_list *l, struct str mask, bool strict, char *err, size_t errlen)
{
	struct mask_entry e = { .kind = ENTRY_NAME };
	struct str name = mask;
	const char *what = "name";

	if (mask.len >= 2 && mask.ptr[0] == '*' && mask.ptr[1] == '.') {
		e.kind = ENTRY_DOMAIN;
		name = str_make(mask.ptr + 2, mask.len - 2);
		what = "domain";
	} else if (mask.len > 1 && mask.ptr[0] == '.' && mask.ptr[1] != '.') {
		/* ".example.com": most likely meant as *.example.com; say so if it would do */
		struct str rest = drop_final_dot(str_make(mask.ptr + 1, mask.len - 1));
		int r = check_name(mask, rest, strict, "name", err, errlen);
		if (r < 0)
			return r;
		return mask_error(err, errlen, mask, "a name cannot start with '.' (write "
				  "*%.*s for the domain and the names below it)",
				  (int)(mask.len > SHOW_MAX ? SHOW_MAX : mask.len), mask.ptr);
	}
	name = drop_final_dot(name);
	int r = check_name(mask, name, strict, what, err, errlen);
	if (r < 0)
		return r;
	return push(l, e, name.ptr, name.len, true);
}

static int add_address(struct mask_list *l, struct str mask, char *err, size_t errlen)
{
	struct str m = mask.len > 2 ? strip_angle(mask) : mask;
	struct mask_entry e = { .kind = ENTRY_ADDRESS };
	char ch[16];

	if (str_eq_cstr(mask, "<>")) {
		e.kind = ENTRY_NULL_SENDER;
		return push(l, e, NULL, 0, false);
	}
	if (m.len >= 2 && m.ptr[0] == '*' && m.ptr[1] == '.')
		return add_name(l, m, false, err, errlen);
	const char *at = last_at(m);
	if (!at)
		return mask_error(err, errlen, mask, "not an address mask (user@domain, "
				 "@domain, *.domain, <> or *)");
	struct str local = str_make(m.ptr, (size_t)(at - m.ptr));
	struct str domain = drop_final_dot(str_make(at + 1, m.len - local.len - 1));
	if (str_eq_cstr(local, "*"))
		return mask_error(err, errlen, mask, "write @domain for any address at a "
				 "domain");
	for (size_t i = 0; i < local.len; i++) {
		unsigned char c = (unsigned char)local.ptr[i];
		if (c <= 0x20 || c == 0x7f)
			return mask_error(err, errlen, mask, "invalid character %s in the "
					 "local part", show_char(c, ch, sizeof(ch)));
	}
	int r = check_name(mask, domain, false, "domain", err, errlen);
	if (r < 0)
		return r;
	if (local.len == 0) {
		e.kind = ENTRY_AT_DOMAIN;
		return push(l, e, domain.ptr, domain.len, true);
	}
	/* local@domain, with the final dot of the domain dropped: contiguous in m */
	e.local_len = local.len;
	return push(l, e, m.ptr, local.len + 1 + domain.len, true);
}

int mask_list_add(struct mask_list *l, struct str mask, char *err, size_t errlen)
{
	if (err && errlen > 0)
		err[0] = '\0';
	if (!l || (!mask.ptr && mask.len > 0))
		return -EINVAL;
	if (mask.len == 0) {
		if (err)
			snprintf(err, errlen, "empty mask");
		return -EINVAL;
	}
	if (mask.len > MASK_MAX_LEN)
		return mask_error(err, errlen, mask, "longer than %u bytes",
				 (unsigned)MASK_MAX_LEN);
	if (l->count >= MASK_MAX_ENTRIES)
		return mask_error(err, errlen, mask, "more than %u masks in one list",
				 (unsigned)MASK_MAX_ENTRIES);
	if (has_byte(mask, '\0'))
		return mask_error(err, errlen, mask, "NUL byte in mask");

	int r;
	const char *type = type_names[l->type];
	bool address_like = has_byte(mask, '@') || str_eq_cstr(mask, "<>");

	if (str_eq_cstr(mask, "*")) {
		l->any = true;
		r = 0;
	} else {
		switch (l->type) {
		case MASK_IP:
			r = add_ip(l, mask, err, errlen);
			break;
		case MASK_HOSTS:
			if (address_like) {
				r = mask_error(err, errlen, mask, "an address mask in a %s list",
					      type);
			} else if (has_byte(mask, '/') || has_byte(mask, ':') ||
				   looks_numeric(mask) || mask.ptr[0] == '[') {
				r = add_ip(l, mask, err, errlen);
			} else {
				r = add_name(l, mask, true, err, errlen);
			}
			break;
		case MASK_NAME:
			if (address_like) {
				r = mask_error(err, errlen, mask, "an address mask in a %s list",
					      type);
			} else if (has_byte(mask, '/')) {
				struct ipaddr a;
				unsigned bits;
				if (ipaddr_parse_prefix(mask, &a, &bits) == 0)
					r = mask_error(err, errlen, mask, "a CIDR prefix in a "
						      "%s list", type);
				else
					r = mask_error(err, errlen, mask, "invalid character "
						      "'/' in name");
			} else {
				r = add_name(l, mask, false, err, errlen);
			}
			break;
		case MASK_ADDRESS:
			r = add_address(l, mask, err, errlen);
			break;
		case MASK_STRING:
		default:
			r = push(l, (struct mask_entry){ .kind = ENTRY_TEXT }, mask.ptr, mask.len,
				 false);
			break;
		}
	}
	if (r == -ENOMEM && err && errlen > 0)
		snprintf(err, errlen, "out of memory");
	if (r == 0)
		l->count++;
	return r;
}

/* ---- matching -------------------------------------------------------------------- */

bool mask_list_match_ip(const struct mask_list *l, const struct ipaddr *a)
{
	if (!l)
		return false;
	if (l->any)
		return true;
	if (!a)
		return false;
	for (size_t i = 0; i < l->n; i++) {
		const struct mask_entry *e = &l->e[i];
		if (e->kind == ENTRY_CIDR && ipaddr_in_prefix(a, &e->addr, e->bits))
			return true;
	}
	return false;
}

/* Names and *.domain entries against name (any final dot already dropped). */
static bool match_names(const struct mask_list *l, struct str name)
{
	for (size_t i = 0; i < l->n; i++) {
		const struct mask_entry *e = &l->e[i];
		if (e->kind == ENTRY_NAME && name_eq(name, e))
			return true;
		if (e->kind == ENTRY_DOMAIN && in_domain(name, e))
			return true;
	}
	return false;
}

bool mask_list_match_name(const struct mask_list *l, struct str name)
{
	if (!l)
		return false;
	if (l->any)
		return true;
	name = drop_final_dot(name);
	return name.len > 0 && match_names(l, name);
}

bool mask_list_match_host(const struct mask_list *l, const struct ipaddr *a, struct str name)
{
	if (!l)
		return false;
	if (l->any || (a && mask_list_match_ip(l, a)))
		return true;
	name = drop_final_dot(name);
	return name.len > 0 && match_names(l, name);
}

bool mask_list_match_address(const struct mask_list *l, struct str addr)
{
	if (!l)
		return false;
	if (l->any)
		return true;
	addr = strip_angle(addr);
	if (addr.len == 0) {
		for (size_t i = 0; i < l->n; i++) {
			if (l->e[i].kind == ENTRY_NULL_SENDER)
				return true;
		}
		return false;
	}
	const char *at = last_at(addr);
	if (!at)
		return false;
	struct str local = str_make(addr.ptr, (size_t)(at - addr.ptr));
	struct str domain = drop_final_dot(str_make(at + 1, addr.len - local.len - 1));
	for (size_t i = 0; i < l->n; i++) {
		const struct mask_entry *e = &l->e[i];
		switch (e->kind) {
		case ENTRY_ADDRESS:
			if (e->local_len == local.len &&
			    memcmp(e->text, local.ptr, local.len) == 0 &&
			    e->len - e->local_len - 1 == domain.len &&
			    casefold_eq(e->text + e->local_len + 1, domain.ptr, domain.len))
				return true;
			break;
		case ENTRY_AT_DOMAIN:
			if (name_eq(domain, e))
				return true;
			break;
		case ENTRY_DOMAIN:
			if (in_domain(domain, e))
				return true;
			break;
		default:
			break;
		}
	}
	return false;
}

bool mask_list_match_string(const struct mask_list *l, struct str s)
{
	if (!l)
		return false;
	if (l->any)
		return true;
	for (size_t i = 0; i < l->n; i++) {
		const struct mask_entry *e = &l->e[i];
		if (e->kind == ENTRY_TEXT && e->len == s.len &&
		    (s.len == 0 || memcmp(e->text, s.ptr, s.len) == 0))
			return true;
	}
	return false;
}
