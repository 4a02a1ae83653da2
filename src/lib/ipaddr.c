/*
 * ipaddr -- IPv4 and IPv6 addresses and prefixes (see ipaddr.h).
 *
 * The text is copied into a small NUL-terminated buffer (bounded: anything longer than
 * the longest address an MTA can write is rejected before the copy) and handed to
 * inet_pton(), which does the real syntax check; this file only strips the decorations
 * MTAs add around an address ("[...]", "IPv6:") and folds IPv4-mapped addresses.
 *
 * Invariants of a struct ipaddr produced here: family is 4 or 6; an IPv4 address has
 * b[4..15] zero; an IPv6 address is never IPv4-mapped; a prefix has its host bits clear.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "ipaddr.h"

/* "[IPv6:" + the longest inet_pton() text (45) + "]", with room to spare. */
#define IPADDR_INPUT_MAX 64

static const uint8_t v4mapped_prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

static unsigned family_bits(const struct ipaddr *a)
{
	return a->family == 4 ? 32u : 128u;
}

/* If a is an IPv4-mapped IPv6 address, make it the IPv4 address it carries. */
static bool unmap(struct ipaddr *a)
{
	if (a->family != 6 || memcmp(a->b, v4mapped_prefix, sizeof(v4mapped_prefix)) != 0)
		return false;
	uint8_t v4[4];
	memcpy(v4, a->b + 12, 4);
	memset(a->b, 0, sizeof(a->b));
	memcpy(a->b, v4, 4);
	a->family = 4;
	return true;
}

/*
 * Parses an address with its decorations, without folding IPv4-mapped addresses (the
 * prefix parser must see the IPv6 form to know how to shift the bits).
 */
static int parse_raw(struct str text, struct ipaddr *ret_addr)
{
	const char *p = text.ptr;
	size_t n = text.len;
	char buf[IPADDR_INPUT_MAX];
	bool v6only = false;

	if (!p || n == 0 || n >= sizeof(buf) || memchr(p, '\0', n))
		return -EINVAL;
	if (p[0] == '[' || p[n - 1] == ']') {
		if (n < 2 || p[0] != '[' || p[n - 1] != ']')
			return -EINVAL;
		p++;
		n -= 2;
	}
	if (n >= 5 && strncasecmp(p, "IPv6:", 5) == 0) {
		p += 5;
		n -= 5;
		v6only = true;
	}
	if (n == 0)
		return -EINVAL;
	memcpy(buf, p, n);
	buf[n] = '\0';

	struct ipaddr a = { 0 };
	if (!v6only && inet_pton(AF_INET, buf, a.b) == 1) {
		a.family = 4;
	} else if (inet_pton(AF_INET6, buf, a.b) == 1) {
		a.family = 6;
	} else {
		return -EINVAL;
	}
	*ret_addr = a;
	return 0;
}

int ipaddr_parse(struct str text, struct ipaddr *ret)
{
	struct ipaddr a;
	int r = parse_raw(text, &a);
	if (r < 0)
		return r;
	unmap(&a);
	*ret = a;
	return 0;
}

/* Reads 1 to 3 decimal digits (no sign, no blanks) into *ret. */
static int parse_bits(const char *s, size_t n, unsigned *ret_bits)
{
	unsigned v = 0;

	if (n == 0 || n > 3)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	*ret_bits = v;
	return 0;
}

/*
 * An IPv4-mapped prefix of at least 96 bits (::ffff:192.0.2.0/120) becomes the IPv4
 * prefix it describes (192.0.2.0/24).  A shorter IPv6 prefix stays IPv6 even when it
 * covers the mapped range (::/0): addresses are folded to IPv4 before matching, and an
 * IPv4 address never matches an IPv6 prefix.
 */
int ipaddr_parse_prefix(struct str text, struct ipaddr *ret_addr, unsigned *ret_bits)
{
	if (!text.ptr)
		return -EINVAL;
	const char *slash = memchr(text.ptr, '/', text.len);
	struct str addr = text;
	struct ipaddr a;
	unsigned bits;
	int r;

	if (slash)
		addr.len = (size_t)(slash - text.ptr);
	r = parse_raw(addr, &a);
	if (r < 0)
		return r;
	if (slash) {
		size_t off = addr.len + 1;
		r = parse_bits(text.ptr + off, text.len - off, &bits);
		if (r < 0 || bits > family_bits(&a))
			return -EINVAL;
	} else {
		bits = family_bits(&a);
	}
	ipaddr_mask(&a, bits);
	if (a.family == 6 && bits >= 96) {
		if (unmap(&a))
			bits -= 96;
	}
	*ret_addr = a;
	*ret_bits = bits;
	return 0;
}

void ipaddr_mask(struct ipaddr *a, unsigned bits)
{
	unsigned total = family_bits(a);

	if (bits >= total)
		return;
	size_t full = bits / 8;
	unsigned rest = bits % 8;
	if (rest) {
		a->b[full] &= (uint8_t)(0xffu << (8 - rest));
		full++;
	}
	memset(a->b + full, 0, sizeof(a->b) - full);
}

bool ipaddr_in_prefix(const struct ipaddr *a, const struct ipaddr *prefix, unsigned bits)
{
	struct ipaddr x = *a;

	unmap(&x); /* callers may build a struct ipaddr themselves */
	if (x.family != prefix->family)
		return false;
	if (bits > family_bits(&x))
		bits = family_bits(&x);
	size_t full = bits / 8;
	unsigned rest = bits % 8;
	if (memcmp(x.b, prefix->b, full) != 0)
		return false;
	if (rest) {
		uint8_t m = (uint8_t)(0xffu << (8 - rest));
		if ((x.b[full] & m) != (prefix->b[full] & m))
			return false;
	}
	return true;
}

/* Decimal digits of v (< 1000) at p; returns the count. */
static size_t put_dec(char *p, unsigned v)
{
	size_t n = 0;
	if (v >= 100)
		p[n++] = (char)('0' + v / 100);
	if (v >= 10)
		p[n++] = (char)('0' + v / 10 % 10);
	p[n++] = (char)('0' + v % 10);
	return n;
}

/*
 * Keys built from client addresses format one for every decision, so IPv4 and the prefix
 * are written by hand (glibc's inet_ntop and snprintf go through vfprintf); IPv6 keeps
 * inet_ntop for RFC 5952's compression rules.
 */
int ipaddr_format(const struct ipaddr *a, unsigned bits, char *buf, size_t len)
{
	char text[INET6_ADDRSTRLEN + 4];
	size_t w = 0;

	if (len > 0)
		buf[0] = '\0';
	if (a->family == 4) {
		for (int i = 0; i < 4; i++) {
			if (i)
				text[w++] = '.';
			w += put_dec(text + w, a->b[i]);
		}
	} else if (a->family == 6) {
		if (!inet_ntop(AF_INET6, a->b, text, INET6_ADDRSTRLEN))
			return -EINVAL;
		w = strlen(text);
	} else {
		return -EINVAL;
	}
	if (bits < family_bits(a)) {
		text[w++] = '/';
		w += put_dec(text + w, bits);
	}
	if (w >= len)
		return -ENOSPC;
	memcpy(buf, text, w);
	buf[w] = '\0';
	return (int)w;
}
