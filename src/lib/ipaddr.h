/*
 * ipaddr -- IPv4 and IPv6 addresses and prefixes, in binary form.
 *
 * Generic: knows nothing of mail.  IPv4-mapped IPv6 addresses (::ffff:192.0.2.1) are
 * treated as the IPv4 address they carry, so one host has one identity whichever socket
 * family the MTA accepted it on.
 */
#ifndef SLUICE_IPADDR_H
#define SLUICE_IPADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "str.h"

#define IPADDR_TEXT_MAX 64 /* "ffff:...:ffff/128" and a NUL fit */

struct ipaddr {
	uint8_t family; /* 4 or 6 */
	uint8_t b[16];  /* network order; IPv4 uses b[0..3], the rest is zero */
};

/* A network, e.g. in an access list: addr/bits. */
struct ip_prefix {
	struct ipaddr addr;
	unsigned bits;
};

/*
 * Parse an address as MTAs write it: "192.0.2.1", "2001:db8::1", "IPv6:2001:db8::1"
 * (Sendmail, case-insensitive prefix), "[192.0.2.1]" or "[IPv6:2001:db8::1]" (brackets),
 * and an IPv4-mapped IPv6 address (becomes IPv4).  0 and *ret, or -EINVAL.
 */
int ipaddr_parse(struct str text, struct ipaddr *ret);
/* Parse "ADDR/BITS" or "ADDR" (a full-length prefix), ADDR in any form ipaddr_parse()
 * takes.  0, or -EINVAL (bad address, BITS not 1-3 digits or out of range); host bits set
 * are allowed and cleared.  An IPv4-mapped prefix of at least 96 bits becomes the IPv4
 * prefix (::ffff:192.0.2.0/120 is 192.0.2.0/24); a shorter one stays IPv6, and so never
 * matches an IPv4 address. */
int ipaddr_parse_prefix(struct str text, struct ipaddr *ret_addr, unsigned *ret_bits);
/* Clear all but the first bits (bits >= the family's length leaves it unchanged). */
void ipaddr_mask(struct ipaddr *a, unsigned bits);
/* Is a inside prefix/bits?  Families must match (an IPv4 address never matches an IPv6
 * prefix). */
bool ipaddr_in_prefix(const struct ipaddr *a, const struct ipaddr *prefix, unsigned bits);
/* "192.0.2.1", or "192.0.2.0/24" when bits is shorter than the family's length; IPv6 in
 * RFC 5952 form (inet_ntop).  Returns the length written (< len), or -ENOSPC. */
int ipaddr_format(const struct ipaddr *a, unsigned bits, char *buf, size_t len);

#endif
