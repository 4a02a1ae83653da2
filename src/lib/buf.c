/*
 * buf -- growable buffer with a hard maximum (see buf.h).
 */
#include <errno.h>
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

int buf_append_json_string(struct buf *b, const char *s)
{
	int r = buf_append_byte(b, '"');
	for (; *s && r == 0; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			r = buf_printf(b, "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			r = buf_printf(b, "\\u%04x", c);
		else
			r = buf_append_byte(b, c);
	}
	return r ? r : buf_append_byte(b, '"');
}
