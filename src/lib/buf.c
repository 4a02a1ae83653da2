/*
 * buf -- growable buffer with a hard maximum (see buf.h).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

void buf_init(struct buf *b, size_t max)
{
	*b = (struct buf){ .max = max };
}

void buf_done(struct buf *b)
{
	free(b->ptr);
	b->ptr = NULL;
	b->len = b->cap = 0;
}

int buf_reserve(struct buf *b, size_t n)
{
	if (n > b->max || b->len > b->max - n)
		return -ENOBUFS;
	size_t need = b->len + n + 1; /* + NUL */
	if (need <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 64;
	while (cap < need)
		cap = cap > SIZE_MAX / 2 ? need : cap * 2;
	if (cap > b->max + 1)
		cap = b->max + 1;
	if (cap < need)
		cap = need;
	char *p = realloc(b->ptr, cap);
	if (!p)
		return -ENOMEM;
	b->ptr = p;
	b->cap = cap;
	return 0;
}

int buf_append(struct buf *b, const void *p, size_t n)
{
	int r = buf_reserve(b, n);
	if (r < 0)
		return r;
	if (n)
		memcpy(b->ptr + b->len, p, n);
	b->len += n;
	b->ptr[b->len] = '\0';
	return 0;
}

int buf_append_str(struct buf *b, struct str s)
{
	return buf_append(b, s.ptr, s.len);
}

int buf_append_cstr(struct buf *b, const char *s)
{
	return buf_append(b, s, strlen(s));
}

int buf_append_byte(struct buf *b, unsigned char c)
{
	return buf_append(b, &c, 1);
}

int buf_append_u32be(struct buf *b, unsigned long v)
{
	unsigned char x[4] = { (unsigned char)(v >> 24), (unsigned char)(v >> 16),
			       (unsigned char)(v >> 8), (unsigned char)v };
	return buf_append(b, x, 4);
}

int buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
	va_list aq;
	va_copy(aq, ap);
	int n = vsnprintf(NULL, 0, fmt, aq);
	va_end(aq);
	if (n < 0)
		return -EINVAL;
	int r = buf_reserve(b, (size_t)n);
	if (r < 0)
		return r;
	vsnprintf(b->ptr + b->len, (size_t)n + 1, fmt, ap);
	b->len += (size_t)n;
	return 0;
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = buf_vprintf(b, fmt, ap);
	va_end(ap);
	return r;
}

/*
 * The length of the well-formed UTF-8 sequence (RFC 3629: no overlong form, no surrogate,
 * nothing above U+10FFFF) at p (n > 0 bytes readable, p[0] >= 0x80), or 0 when the lead
 * byte does not start one.  The ranges are those of the Unicode Standard's table 3-7.
 */
static size_t utf8_valid_len(const unsigned char *p, size_t n)
{
	unsigned char c = p[0];
	unsigned char lo = 0x80, hi = 0xbf; /* the allowed range of the second byte */
	size_t len;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		if (c == 0xe0)
			lo = 0xa0; /* below: overlong */
		else if (c == 0xed)
			hi = 0x9f; /* above: U+D800..U+DFFF, surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		if (c == 0xf0)
			lo = 0x90; /* below: overlong */
		else if (c == 0xf4)
			hi = 0x8f; /* above: beyond U+10FFFF */
	} else
		return 0; /* 0x80..0xc1 (continuation, overlong 2-byte lead), 0xf5..0xff */
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	return len;
}

int buf_append_json_string(struct buf *b, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)s;
	size_t n = strlen(s);
	int r = buf_append_byte(b, '"');
	size_t i = 0, run = 0; /* bytes p[run..i) are copied as they are */
	while (i < n && r == 0) {
		unsigned char c = p[i];
		if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
			i++;
			continue;
		}
		size_t len = c >= 0x80 ? utf8_valid_len(p + i, n - i) : 0;
		/* U+2028 and U+2029 are valid JSON but end a JavaScript string literal before
		 * ES2019: escaped, for whoever pastes the output into a script. */
		bool js_break = len == 3 && c == 0xe2 && p[i + 1] == 0x80 &&
				(p[i + 2] == 0xa8 || p[i + 2] == 0xa9);
		if (len && !js_break) {
			i += len;
			continue;
		}
		r = buf_append(b, p + run, i - run);
		if (r < 0)
			break;
		char esc[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };
		if (c == '"' || c == '\\') {
			r = buf_append(b, (char[]){ '\\', (char)c }, 2);
		} else if (js_break) {
			r = buf_append(b, p[i + 2] == 0xa8 ? "\\u2028" : "\\u2029", 6);
			i += 2;
		} else if (c >= 0x80) {
			/* a byte that is not part of a well-formed sequence: one U+FFFD each, as
			 * an escape, so that it stays told apart from a U+FFFD the text held */
			r = buf_append(b, "\\ufffd", 6);
		} else {
			r = buf_append(b, esc, sizeof(esc)); /* controls and DEL */
		}
		run = ++i;
	}
	if (r == 0)
		r = buf_append(b, p + run, i - run);
	return r ? r : buf_append_byte(b, '"');
}
