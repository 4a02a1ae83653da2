/*
 * inject_msg -- the message an injector hands to the intake (see inject_msg.h).
 *
 * The text is kept as it will go on the wire, less the dot-stuffing: CRLF line endings
 * and nothing else changed.  The header section is scanned field by field (a field is
 * its first line and the continuation lines that follow it), twice: once to learn what
 * is there, once to copy it out.  Nothing is stored per field, so a header of any size
 * costs no memory beyond the output.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "inject_msg.h"
#include "util.h"

/* ---- the input ---- */

void inject_text_init(struct inject_text *t, struct buf *out, bool dot_ends)
{
	*t = (struct inject_text){ .out = out, .line_start = out->len, .dot_ends = dot_ends };
}

static void note_8bit(struct inject_text *t, const unsigned char *p, size_t n)
{
	if (t->eightbit)
		return;
	for (size_t i = 0; i < n; i++)
		if (p[i] >= 0x80) {
			t->eightbit = true;
			return;
		}
}

/* The line from line_start to the end of out is complete: end it with CRLF, or end the
 * input if it is the lone dot. */
static int end_line(struct inject_text *t)
{
	struct buf *b = t->out;
	size_t len = b->len - t->line_start;
	const char *line = b->ptr ? b->ptr + t->line_start : "";
	bool cr = len > 0 && line[len - 1] == '\r';
	if (t->dot_ends && len - cr == 1 && line[0] == '.') {
		buf_truncate(b, t->line_start);
		t->ended = true;
		return 0;
	}
	if ((cr ? buf_append_byte(b, '\n') : buf_append(b, "\r\n", 2)) < 0)
		return -ENOBUFS;
	t->line_start = b->len;
	return 0;
}

int inject_text_feed(struct inject_text *t, const void *p, size_t n)
{
	const unsigned char *s = p;
	while (n > 0 && !t->ended) {
		const unsigned char *nl = memchr(s, '\n', n);
		size_t seg = nl ? (size_t)(nl - s) : n;
		note_8bit(t, s, seg);
		if (seg && buf_append(t->out, s, seg) < 0)
			return -ENOBUFS;
		s += seg;
		n -= seg;
		if (!nl)
			break;
		if (end_line(t) < 0)
			return -ENOBUFS;
		s++;
		n--;
	}
	return 0;
}

int inject_text_finish(struct inject_text *t)
{
	if (t->ended || t->out->len == t->line_start)
		return 0;
	/* a last line without a newline: SMTP cannot carry it as such (qmail-remote
	 * refuses the message, Postfix completes the line; so do we) */
	return end_line(t);
}

/* ---- long lines ---- */

/* The content of the line starting at p (up to end): its length without the CRLF or LF
 * that ends it, and *next, where the next line starts. */
static size_t line_content(const char *p, const char *end, const char **next)
{
	const char *nl = memchr(p, '\n', (size_t)(end - p));
	*next = nl ? nl + 1 : end;
	const char *e = nl ? nl : end;
	if (nl && e > p && e[-1] == '\r')
		e--;
	return (size_t)(e - p);
}

size_t inject_long_lines(struct str text, size_t limit)
{
	size_t n = 0;
	const char *p = text.ptr, *end = text.ptr + text.len, *next;
	for (; p < end; p = next)
		n += line_content(p, end, &next) > limit;
	return n;
}

int inject_msg_fold(struct str text, size_t limit, struct buf *out)
{
	if (limit < 2)
		limit = 2; /* a continuation line holds its space and at least one byte */
	const char *p = text.ptr, *end = text.ptr + text.len, *next;
	for (; p < end; p = next) {
		size_t len = line_content(p, end, &next);
		size_t room = limit;
		while (len > room) {
			size_t cut = room;
			/* not inside a UTF-8 sequence: back to its first byte (at most 3) */
			for (int k = 0; k < 3 && cut > 1 && ((unsigned char)p[cut] & 0xc0) == 0x80;
			     k++)
				cut--;
			if (buf_append(out, p, cut) < 0 || buf_append(out, "\r\n ", 3) < 0)
				return -ENOBUFS;
			p += cut;
			len -= cut;
			room = limit - 1; /* after the space */
		}
		if (buf_append(out, p, (size_t)(next - p)) < 0)
			return -ENOBUFS;
	}
	return 0;
}

/* ---- addresses ---- */

struct scratch {
	char s[INJECT_MAX_ADDR + 1];
	size_t len;
	bool overflow;
};

static void put(struct scratch *b, char c)
{
	if (b->len == INJECT_MAX_ADDR) {
		b->overflow = true;
		return;
	}
	b->s[b->len++] = c;
}

/* Skip a comment starting at v[i] == '(' (nested, with quoted pairs): the index after. */
static size_t skip_comment(struct str v, size_t i)
{
	int depth = 0;
	for (; i < v.len; i++) {
		char c = v.ptr[i];
		if (c == '\\') {
			i++;
			continue;
		}
		if (c == '(')
			depth++;
		else if (c == ')' && --depth == 0)
			return i + 1;
	}
	return i;
}

/* Copy a quoted string or domain literal starting at v[i] (the opening '"' or '[') into
 * b, folding removed: the index after its end. */
static size_t copy_delimited(struct str v, size_t i, char close, struct scratch *b)
{
	put(b, v.ptr[i++]);
	for (; i < v.len; i++) {
		char c = v.ptr[i];
		if (c == '\r' || c == '\n')
			continue;
		put(b, c);
		if (c == '\\' && i + 1 < v.len) {
			put(b, v.ptr[++i]);
			continue;
		}
		if (c == close)
			return i + 1;
	}
	return i;
}

/* The content of <...> starting at v[i] == '<' into b: the index after the '>'. */
static size_t copy_angle(struct str v, size_t i, struct scratch *b)
{
	b->len = 0;
	for (i++; i < v.len;) {
		char c = v.ptr[i];
		if (c == '>')
			return i + 1;
		if (c == '"')
			i = copy_delimited(v, i, '"', b);
		else if (c == '[')
			i = copy_delimited(v, i, ']', b);
		else if (c == '(')
			i = skip_comment(v, i);
		else {
			if (c != ' ' && c != '\t' && c != '\r' && c != '\n')
				put(b, c);
			i++;
		}
	}
	return i;
}

static int emit(struct scratch *text, struct scratch *angle, bool have_angle,
		int (*fn)(void *, const char *), void *arg)
{
	struct scratch *a = have_angle ? angle : text;
	if (a->overflow)
		return -ENAMETOOLONG;
	a->s[a->len] = '\0';
	const char *p = a->s;
	if (p[0] == '@') { /* an obsolete route: "@a,@b:" before the mailbox */
		const char *colon = strchr(p, ':');
		p = colon ? colon + 1 : p + a->len;
	}
	return *p ? fn(arg, p) : 0;
}

int inject_addrlist_parse(struct str v, int (*fn)(void *arg, const char *addr), void *arg)
{
	struct scratch text = { .len = 0 }, angle = { .len = 0 };
	bool have_angle = false;
	size_t i = 0;
	for (;;) {
		char c = i < v.len ? v.ptr[i] : ',';
		if (c == ',' || c == ';') {
			int r = emit(&text, &angle, have_angle, fn, arg);
			if (r < 0)
				return r;
			if (i >= v.len)
				return 0;
			text.len = angle.len = 0;
			text.overflow = angle.overflow = false;
			have_angle = false;
			i++;
			continue;
		}
		switch (c) {
		case '(':
			i = skip_comment(v, i);
			break;
		case '"':
			i = copy_delimited(v, i, '"', &text);
			break;
		case '[':
			i = copy_delimited(v, i, ']', &text);
			break;
		case '<':
			i = copy_angle(v, i, &angle);
			have_angle = true;
			break;
		case ':':
			/* a group's display name: what came before is not an address */
			text.len = 0;
			text.overflow = false;
			i++;
			break;
		case ' ':
		case '\t':
		case '\r':
		case '\n':
			i++;
			break;
		default:
			put(&text, c);
			i++;
		}
	}
}

static bool is_atext(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c >= 0x80 || strchr("!#$%&'*+-/=?^_`{|}~", c) != NULL;
}

/* RFC 5321 Dot-string: atoms joined by single dots (8-bit bytes allowed, for SMTPUTF8). */
static bool is_dot_string(const char *p, size_t n)
{
	if (n == 0 || p[0] == '.' || p[n - 1] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		if (p[i] == '.') {
			if (p[i + 1] == '.')
				return false;
		} else if (!is_atext((unsigned char)p[i])) {
			return false;
		}
	}
	return true;
}

int inject_addr_smtp(const char *in, const char *domain, struct buf *out)
{
	const char *p = in, *e = in + strlen(in);
	while (p < e && (*p == ' ' || *p == '\t'))
		p++;
	while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
		e--;
	if (e - p >= 2 && *p == '<' && e[-1] == '>') {
		p++;
		e--;
	}
	if (p < e && *p == '@') { /* a route */
		const char *colon = memchr(p, ':', (size_t)(e - p));
		if (!colon)
			return -EINVAL;
		p = colon + 1;
	}
	if (p == e)
		return 0;
	for (const char *q = p; q < e; q++)
		if ((unsigned char)*q < 0x20 || *q == 0x7f)
			return -EINVAL;
	/* the local part: a quoted string, or up to the last '@' */
	const char *at;
	if (*p == '"') {
		const char *q = p + 1;
		while (q < e && *q != '"')
			q += *q == '\\' ? 2 : 1;
		if (q >= e)
			return -EINVAL;
		at = q + 1;
		if (at < e && *at != '@')
			return -EINVAL;
	} else {
		at = e;
		for (const char *q = e; q > p; q--)
			if (q[-1] == '@') {
				at = q - 1;
				break;
			}
	}
	size_t mark = out->len;
	size_t llen = (size_t)(at - p);
	int r = 0;
	if (*p == '"' || is_dot_string(p, llen)) {
		r = buf_append(out, p, llen);
	} else {
		if (llen == 0)
			return -EINVAL;
		r = buf_append_byte(out, '"');
		for (size_t i = 0; r == 0 && i < llen; i++) {
			if (p[i] == '"' || p[i] == '\\')
				r = buf_append_byte(out, '\\');
			if (r == 0)
				r = buf_append_byte(out, (unsigned char)p[i]);
		}
		if (r == 0)
			r = buf_append_byte(out, '"');
	}
	if (r == 0 && at < e) {
		const char *d = at + 1;
		if (d == e || memchr(d, '@', (size_t)(e - d)) || strpbrk(d, " <>()") != NULL) {
			buf_truncate(out, mark);
			return -EINVAL;
		}
		r = buf_append(out, at, (size_t)(e - at));
	} else if (r == 0 && domain && *domain) {
		r = buf_printf(out, "@%s", domain);
	}
	if (r == 0 && out->len - mark > INJECT_MAX_ADDR)
		r = -ENAMETOOLONG;
	if (r < 0)
		buf_truncate(out, mark);
	return r;
}

void inject_rcpts_init(struct inject_rcpts *r, size_t max)
{
	*r = (struct inject_rcpts){ .max = max };
}

void inject_rcpts_clear(struct inject_rcpts *r)
{
	for (size_t i = 0; i < r->n; i++)
		free(r->addr[i]);
	free(r->addr);
	free(r->slot);
	inject_rcpts_init(r, r->max);
}

static size_t hash_addr(const char *s)
{
	return (size_t)fnv1a64_str(FNV1A64_INIT, s);
}

/* The slot of addr: the one holding it, or the free one where it would go. */
static size_t *find_slot(const struct inject_rcpts *r, const char *addr)
{
	size_t mask = r->nslot - 1;
	for (size_t i = hash_addr(addr) & mask;; i = (i + 1) & mask)
		if (!r->slot[i] || strcmp(r->addr[r->slot[i] - 1], addr) == 0)
			return &r->slot[i];
}

static int rehash(struct inject_rcpts *r)
{
	size_t n = r->nslot ? r->nslot * 2 : 64;
	size_t *slot = calloc(n, sizeof(*slot));
	if (!slot)
		return -ENOMEM;
	free(r->slot);
	r->slot = slot;
	r->nslot = n;
	for (size_t i = 0; i < r->n; i++)
		*find_slot(r, r->addr[i]) = i + 1;
	return 0;
}

int inject_rcpts_add(struct inject_rcpts *r, const char *addr)
{
	if ((r->n + 1) * 2 > r->nslot && rehash(r) < 0)
		return -ENOMEM;
	size_t *slot = find_slot(r, addr);
	if (*slot)
		return 0;
	if (r->n == r->max)
		return -E2BIG;
	if (r->n == r->cap) {
		size_t nc = r->cap ? r->cap * 2 : 16;
		char **a = realloc(r->addr, nc * sizeof(*a));
		if (!a)
			return -ENOMEM;
		r->addr = a;
		r->cap = nc;
	}
	char *copy = strdup(addr);
	if (!copy)
		return -ENOMEM;
	r->addr[r->n] = copy;
	*slot = ++r->n;
	return 0;
}

/* ---- the header section ---- */

struct field {
	size_t start, end;   /* the field's bytes, continuation lines and final CRLF included */
	struct str name;     /* trailing white space removed */
	struct str value;    /* after the colon, to end */
};

/* The end of the line starting at pos: the index after its '\n' (or the text's end). */
static size_t line_end(struct str t, size_t pos)
{
	const char *nl = memchr(t.ptr + pos, '\n', t.len - pos);
	return nl ? (size_t)(nl - t.ptr) + 1 : t.len;
}

/* If the line at pos starts a header field ("Name:" -- the obsolete syntax's white space
 * before the colon allowed), the length of Name, else 0. */
static size_t field_name(struct str t, size_t pos)
{
	size_t i = pos;
	while (i < t.len && (unsigned char)t.ptr[i] > ' ' && (unsigned char)t.ptr[i] < 0x7f &&
	       t.ptr[i] != ':')
		i++;
	size_t n = i - pos;
	while (i < t.len && (t.ptr[i] == ' ' || t.ptr[i] == '\t'))
		i++;
	return n > 0 && i < t.len && t.ptr[i] == ':' ? n : 0;
}

/*
 * The field at *pos, if the header section goes on there: 1 with *f and *pos moved past
 * it, or 0 at the end of the header section (*pos then is where the body starts: at the
 * empty line, or at the first line that is not a field).
 */
static int next_field(struct str t, size_t *pos, struct field *f)
{
	size_t p = *pos;
	if (p >= t.len)
		return 0;
	size_t n = field_name(t, p);
	if (n == 0)
		return 0;
	f->start = p;
	f->name = str_make(t.ptr + p, n);
	size_t colon = p + n;
	while (t.ptr[colon] != ':')
		colon++;
	p = line_end(t, p);
	while (p < t.len && (t.ptr[p] == ' ' || t.ptr[p] == '\t'))
		p = line_end(t, p);
	f->end = p;
	f->value = str_make(t.ptr + colon + 1, p - colon - 1);
	*pos = p;
	return 1;
}

static bool name_is(struct str name, const char *want)
{
	return name.len == strlen(want) && strncasecmp(name.ptr, want, name.len) == 0;
}

struct extract {
	const struct inject_header_opts *o;
	struct buf addr;
};

static int extract_one(void *arg, const char *addr)
{
	struct extract *x = arg;
	buf_reset(&x->addr);
	int r = inject_addr_smtp(addr, x->o->domain, &x->addr);
	if (r == -ENOBUFS)
		r = -ENAMETOOLONG;
	if (r < 0)
		return r;
	if (x->addr.len == 0)
		return 0;
	return inject_rcpts_add(x->o->rcpts, x->addr.ptr);
}

static const char *const rcpt_fields[] = { "To", "Cc", "Bcc" };
static const char *const resent_fields[] = { "Resent-To", "Resent-Cc", "Resent-Bcc" };

static const char *field_in(struct str name, const char *const set[3])
{
	for (int i = 0; i < 3; i++)
		if (name_is(name, set[i]))
			return set[i];
	return NULL;
}

static int add_fields(const struct inject_header_opts *o, bool from, bool date, bool msgid,
		      struct buf *out)
{
	int r = 0;
	if (from) {
		r = buf_append_cstr(out, "From: ");
		if (r == 0 && o->full_name && *o->full_name) {
			r = inject_phrase(o->full_name, out);
			if (r == 0)
				r = buf_printf(out, " <%s>\r\n", o->from_addr);
		} else if (r == 0) {
			r = buf_printf(out, "%s\r\n", o->from_addr);
		}
	}
	if (r == 0 && date) {
		char d[64];
		fmt_rfc5322_date(d, sizeof(d), o->now, o->utc_offset);
		r = buf_printf(out, "Date: %s\r\n", d);
	}
	if (r == 0 && msgid)
		r = buf_printf(out, "Message-ID: <%s@%s>\r\n", o->msgid_left, o->domain);
	return r;
}

int inject_msg_headers(struct str text, const struct inject_header_opts *o, struct buf *out,
		       struct inject_header_result *ret)
{
	*ret = (struct inject_header_result){ 0 };
	size_t first = 0;
	if (text.len >= 5 && memcmp(text.ptr, "From ", 5) == 0)
		first = line_end(text, 0); /* an mbox separator, not a field */

	/* pass 1: what is there */
	bool from = false, date = false, msgid = false, resent = false;
	size_t pos = first;
	struct field f;
	while (next_field(text, &pos, &f)) {
		from |= name_is(f.name, "From");
		date |= name_is(f.name, "Date");
		msgid |= name_is(f.name, "Message-ID");
		resent |= field_in(f.name, resent_fields) != NULL;
	}
	size_t body = pos;
	bool blank = body < text.len && (text.ptr[body] == '\n' ||
					 (text.ptr[body] == '\r' && body + 1 < text.len &&
					  text.ptr[body + 1] == '\n'));

	/* pass 2: copy, extract */
	struct extract x = { .o = o };
	buf_init(&x.addr, INJECT_MAX_ADDR + 64);
	int r = 0;
	pos = first;
	while (r == 0 && next_field(text, &pos, &f)) {
		const char *rcpt = field_in(f.name, resent ? resent_fields : rcpt_fields);
		if (o->extract && rcpt) {
			r = inject_addrlist_parse(f.value, extract_one, &x);
			if (r < 0) {
				ret->bad_field = rcpt;
				break;
			}
		}
		if (name_is(f.name, "Bcc") || name_is(f.name, "Resent-Bcc")) {
			ret->removed_bcc++;
			continue;
		}
		r = buf_append(out, text.ptr + f.start, f.end - f.start);
	}
	buf_done(&x.addr);
	if (r == 0)
		r = add_fields(o, !from, !date, !msgid, out);
	if (r == 0 && body < text.len && !blank)
		r = buf_append(out, "\r\n", 2);
	if (r == 0 && body < text.len)
		r = buf_append(out, text.ptr + body, text.len - body);
	if (r == 0) {
		ret->added_from = !from;
		ret->added_date = !date;
		ret->added_msgid = !msgid;
	}
	return r;
}

int inject_phrase(const char *name, struct buf *out)
{
	bool plain = *name != '\0' && *name != ' ';
	for (const char *p = name; plain && *p; p++)
		plain = is_atext((unsigned char)*p) || (*p == ' ' && p[1] != ' ' && p[1]);
	if (plain)
		return buf_append_cstr(out, name);
	int r = buf_append_byte(out, '"');
	for (const char *p = name; r == 0 && *p; p++) {
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			continue; /* no control characters in a header */
		if (*p == '"' || *p == '\\')
			r = buf_append_byte(out, '\\');
		if (r == 0)
			r = buf_append_byte(out, (unsigned char)*p);
	}
	return r == 0 ? buf_append_byte(out, '"') : r;
}
