/*
 * str -- byte slices passed by value, for zero-copy parsing.
 *
 * A struct str never owns its bytes; it points into a buffer whose owner keeps it alive.
 * The bytes are not NUL-terminated and may contain NUL.
 */
#ifndef SLUICE_STR_H
#define SLUICE_STR_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct str {
	const char *ptr;
	size_t len;
};

#define STR_NULL ((struct str){ NULL, 0 })

static inline struct str str_make(const char *p, size_t n)
{
	return (struct str){ p, n };
}

static inline struct str str_cstr(const char *s)
{
	return (struct str){ s, s ? strlen(s) : 0 };
}

static inline bool str_eq(struct str a, struct str b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

static inline bool str_eq_cstr(struct str a, const char *b)
{
	return str_eq(a, str_cstr(b));
}

#endif
