/*
 * buf -- a growable, binary-safe byte buffer with a hard maximum.
 *
 * Everything whose size a peer controls is held in a buf whose max is set by the owner;
 * an append that would pass max fails with -ENOBUFS and leaves the buffer unchanged, so
 * a hostile peer can never make sluice allocate more than the limits it was configured
 * with.  The contents are always followed by a NUL byte (not counted in len), so text can
 * be handed to C string functions when it holds no NUL itself.
 */
#ifndef SLUICE_BUF_H
#define SLUICE_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "str.h"

struct buf {
	char *ptr;  /* NULL until the first append */
	size_t len;
	size_t cap;
	size_t max; /* hard limit on len */
};

void buf_init(struct buf *b, size_t max);
/* A buffer over caller memory (size >= 1) that never reallocates: max = size - 1.  Do not
 * buf_done() it. */
static inline void buf_init_fixed(struct buf *b, char *space, size_t size)
{
	b->ptr = space;
	b->len = 0;
	b->cap = size;
	b->max = size - 1;
	space[0] = '\0';
}
/* Free the memory (as slide_done does; buf_reset keeps it); the buffer can be used
 * again, with the same max. */
void buf_done(struct buf *b);
/* Forget the contents, keep the memory. */
static inline void buf_reset(struct buf *b)
{
	b->len = 0;
	if (b->ptr)
		b->ptr[0] = '\0';
}
/* Cut the contents back to len bytes (len <= b->len), keeping the trailing NUL. */
static inline void buf_truncate(struct buf *b, size_t len)
{
	b->len = len;
	if (b->ptr)
		b->ptr[len] = '\0';
}
/* Make room for n more bytes: 0, -ENOBUFS (past max) or -ENOMEM. */
int buf_reserve(struct buf *b, size_t n);
int buf_append(struct buf *b, const void *p, size_t n);
int buf_append_str(struct buf *b, struct str s);
int buf_append_cstr(struct buf *b, const char *s);
int buf_append_byte(struct buf *b, unsigned char c);
int buf_append_u32be(struct buf *b, unsigned long v);
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int buf_vprintf(struct buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/*
 * s as a JSON string (RFC 8259), quotes included, valid UTF-8 whatever s holds: well-formed
 * UTF-8 passes through; '"' and '\\' are escaped, controls and DEL as \u00XX, U+2028 and
 * U+2029 as \u2028 and \u2029 (JavaScript); each byte that is not part of a well-formed
 * sequence (overlong, surrogate, beyond U+10FFFF, truncated, stray) becomes \ufffd.
 * 0 or the first append's error (the buffer may then hold part of the string).
 */
int buf_append_json_string(struct buf *b, const char *s);
static inline struct str buf_str(const struct buf *b)
{
	return (struct str){ b->ptr ? b->ptr : "", b->len };
}

#endif
