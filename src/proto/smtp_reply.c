/*
 * smtp_reply -- SMTP server replies, read by a client (smtp_reply.h).
 */
#include <errno.h>
#include <string.h>
#include <strings.h>

#include "smtp_reply.h"

void smtp_reply_reader_init(struct smtp_reply_reader *rd)
{
	memset(rd, 0, sizeof(*rd));
}

static bool digit(char c)
{
	return c >= '0' && c <= '9';
}

/* "C.SSS.DDD" (RFC 3463: class 2, 4 or 5, subject and detail of 1-3 digits) at the start
 * of t, followed by a space or the end; 0 and the numbers, or -1. */
static int enhanced(struct str t, int *cls, int *subj, int *det)
{
	size_t i = 0;
	int v[3] = { 0, 0, 0 };
	for (int part = 0; part < 3; part++) {
		size_t start = i;
		while (i < t.len && digit(t.ptr[i]) && i - start < 3)
			v[part] = v[part] * 10 + (t.ptr[i++] - '0');
		if (i == start || (part == 0 && i - start != 1))
			return -1;
		if (part < 2) {
			if (i >= t.len || t.ptr[i] != '.')
				return -1;
			i++;
		}
	}
	if (i < t.len && t.ptr[i] != ' ')
		return -1;
	if (v[0] != 2 && v[0] != 4 && v[0] != 5)
		return -1;
	*cls = v[0];
	*subj = v[1];
	*det = v[2];
	return 0;
}

static void add_text(struct smtp_reply *r, struct str t)
{
	if (r->lines > 0 && t.len && r->text_len < SMTP_REPLY_TEXT_MAX)
		r->text[r->text_len++] = ' ';
	size_t room = SMTP_REPLY_TEXT_MAX - r->text_len;
	size_t k = t.len < room ? t.len : room;
	if (k) /* t may be STR_NULL: no memcpy from NULL, even of 0 bytes */
		memcpy(r->text + r->text_len, t.ptr, k);
	r->text_len += k;
	r->text[r->text_len] = '\0';
}

/* One complete line (no CR or LF).  1: it was the last of the reply; 0: more follow. */
static int take_line(struct smtp_reply *r, struct str line, const char **why)
{
	if (memchr(line.ptr, '\0', line.len)) {
		*why = "NUL byte in a reply";
		return -EPROTO;
	}
	if (line.len < 3 || !digit(line.ptr[0]) || !digit(line.ptr[1]) || !digit(line.ptr[2]) ||
	    line.ptr[0] < '2' || line.ptr[0] > '5') {
		*why = "a reply line does not start with a code from 200 to 599";
		return -EPROTO;
	}
	int code = (line.ptr[0] - '0') * 100 + (line.ptr[1] - '0') * 10 + (line.ptr[2] - '0');
	if (r->lines > 0 && code != r->code) {
		*why = "the code changes within a multi-line reply";
		return -EPROTO;
	}
	bool last = line.len == 3 || line.ptr[3] == ' ';
	if (line.len > 3 && line.ptr[3] != ' ' && line.ptr[3] != '-') {
		*why = "no space or hyphen after a reply code";
		return -EPROTO;
	}
	if (r->lines == SMTP_REPLY_LINES) {
		*why = "too many lines in a reply";
		return -EPROTO;
	}
	struct str text = line.len > 4 ? str_make(line.ptr + 4, line.len - 4) : STR_NULL;
	if (r->lines == 0) {
		r->code = code;
		if (enhanced(text, &r->enh_class, &r->enh_subject, &r->enh_detail) < 0 ||
		    r->enh_class != code / 100)
			r->enh_class = r->enh_subject = r->enh_detail = 0;
	}
	add_text(r, text);
	r->lines++;
	return last ? 1 : 0;
}

int smtp_reply_read(struct smtp_reply_reader *rd, const char *p, size_t n,
		    struct smtp_reply *ret, size_t *ret_used, const char **ret_why)
{
	size_t used = 0;
	const char *why = NULL;
	for (;;) {
		size_t avail = n - used;
		size_t from = rd->scanned < avail ? rd->scanned : avail;
		size_t look = avail < SMTP_REPLY_LINE_MAX ? avail : SMTP_REPLY_LINE_MAX;
		const char *lf = look > from ? memchr(p + used + from, '\n', look - from) : NULL;
		if (!lf) {
			if (avail >= SMTP_REPLY_LINE_MAX) {
				why = "a reply line is too long";
				goto bad;
			}
			rd->scanned = avail;
			*ret_used = used;
			return 0;
		}
		size_t len = (size_t)(lf - (p + used));
		struct str line = str_make(p + used, len > 0 && lf[-1] == '\r' ? len - 1 : len);
		int r = take_line(&rd->r, line, &why);
		if (r < 0)
			goto bad;
		used += len + 1;
		rd->scanned = 0;
		if (r == 1) {
			*ret = rd->r;
			memset(&rd->r, 0, sizeof(rd->r));
			*ret_used = used;
			return 1;
		}
	}
bad:
	if (ret_why)
		*ret_why = why;
	return -EPROTO;
}

/* ---- EHLO keywords ---- */

static bool word_eq(struct str w, const char *s)
{
	return w.len == strlen(s) && strncasecmp(w.ptr, s, w.len) == 0;
}

/* Next space-separated word of *s (advanced), or an empty str at the end. */
struct str smtp_next_word(struct str *s)
{
	size_t i = 0;
	while (i < s->len && (s->ptr[i] == ' ' || s->ptr[i] == '\t'))
		i++;
	size_t j = i;
	while (j < s->len && s->ptr[j] != ' ' && s->ptr[j] != '\t')
		j++;
	struct str w = str_make(s->ptr + i, j - i);
	*s = str_make(s->ptr + j, s->len - j);
	return w;
}

static void add_auth_mechs(struct smtp_ehlo *e, struct str rest)
{
	for (struct str w = smtp_next_word(&rest); w.len; w = smtp_next_word(&rest)) {
		size_t have = strlen(e->auth);
		if (w.len > SMTP_EHLO_MECH_MAX || have + w.len + 2 > sizeof(e->auth))
			continue; /* not a mechanism we could name, or no room: dropped */
		if (have)
			e->auth[have++] = ' ';
		for (size_t i = 0; i < w.len; i++) {
			char ch = w.ptr[i];
			e->auth[have++] = ch >= 'a' && ch <= 'z' ? (char)(ch - 'a' + 'A') : ch;
		}
		e->auth[have] = '\0';
	}
	e->ext |= SMTP_EHLO_AUTH;
}

void smtp_ehlo_line(struct smtp_ehlo *e, struct str text)
{
	struct str rest = text;
	struct str kw = smtp_next_word(&rest);
	if (kw.len > 5 && strncasecmp(kw.ptr, "AUTH=", 5) == 0) { /* legacy "AUTH=LOGIN PLAIN" */
		struct str first = str_make(kw.ptr + 5, kw.len - 5);
		add_auth_mechs(e, first);
		add_auth_mechs(e, rest);
	} else if (word_eq(kw, "AUTH")) {
		add_auth_mechs(e, rest);
	} else if (word_eq(kw, "PIPELINING")) {
		e->ext |= SMTP_EHLO_PIPELINING;
	} else if (word_eq(kw, "8BITMIME")) {
		e->ext |= SMTP_EHLO_8BITMIME;
	} else if (word_eq(kw, "SMTPUTF8")) {
		e->ext |= SMTP_EHLO_SMTPUTF8;
	} else if (word_eq(kw, "DSN")) {
		e->ext |= SMTP_EHLO_DSN;
	} else if (word_eq(kw, "STARTTLS")) {
		e->ext |= SMTP_EHLO_STARTTLS;
	} else if (word_eq(kw, "SIZE")) {
		e->ext |= SMTP_EHLO_SIZE;
		struct str n = smtp_next_word(&rest);
		uint64_t v = 0;
		for (size_t i = 0; i < n.len; i++) {
			if (n.ptr[i] < '0' || n.ptr[i] > '9' || v > (UINT64_MAX - 9) / 10) {
				v = 0; /* not a number: no limit known */
				break;
			}
			v = v * 10 + (uint64_t)(n.ptr[i] - '0');
		}
		e->size_max = v;
	}
}
