/*
 * dns_answer -- what the relay needs from a DNS response (RFC 1035 4.1) that c-ares 1.18
 * does not give: the AD bit a validating resolver sets (RFC 4035 3.2.3, RFC 6840 5.8),
 * the rcode, the TTLs of the answer (and of a denial: RFC 2308 5), and TLSA records
 * (RFC 6698 2.1).  A pure codec: no I/O, no allocation.
 *
 * The input is a peer's (a resolver's answer): every length and count is checked against
 * the message, names are skipped label by label (compression pointers are 2 bytes and not
 * followed), at most DNS_ANSWER_RR_MAX records of the asked type are kept, and the
 * records point into the caller's buffer (valid while it is).
 */
#ifndef SLUICE_DNS_ANSWER_H
#define SLUICE_DNS_ANSWER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DNS_TYPE_CNAME 5
#define DNS_TYPE_SOA 6
#define DNS_TYPE_MX 15
#define DNS_TYPE_TLSA 52
#define DNS_CLASS_IN 1
#define DNS_RCODE_NOERROR 0
#define DNS_RCODE_SERVFAIL 2
#define DNS_RCODE_NXDOMAIN 3
#define DNS_ANSWER_RR_MAX 32     /* records of the asked type kept */
#define DNS_TTL_NONE UINT32_MAX  /* no TTL in the message */

struct dns_rr {
	uint16_t type;
	uint32_t ttl;
	uint16_t len;
	const uint8_t *data;         /* RDATA, len bytes, in the caller's buffer */
};

struct dns_answer {
	unsigned rcode;              /* RFC 1035 4.1.1 (the header's 4 bits) */
	bool ad;                     /* Authentic Data: the resolver validated it */
	bool tc;                     /* truncated */
	uint32_t ttl;                /* the least TTL of the answer's records of the asked
					type and CNAMEs; DNS_TTL_NONE without any */
	uint32_t neg_ttl;            /* a denial's: min(SOA TTL, SOA MINIMUM) of the
					authority section; DNS_TTL_NONE without a SOA */
	size_t n;                    /* records of the asked type (class IN) kept */
	size_t dropped;              /* more of them, past DNS_ANSWER_RR_MAX */
	struct dns_rr rr[DNS_ANSWER_RR_MAX];
};

/*
 * Read a response of len bytes: header, question(s) skipped, the answer section's
 * records of type (class IN) kept, the authority section's SOA for neg_ttl.  0 and *ret,
 * or -EBADMSG (short, not a response, a bad name or record length); *ret is then
 * unspecified.
 */
int dns_answer_parse(const uint8_t *buf, size_t len, uint16_t type, struct dns_answer *ret);

/* A TLSA record (RFC 6698 2.1): certificate usage, selector, matching type, data. */
struct dns_tlsa {
	uint8_t usage, selector, mtype;
	uint16_t len;
	const uint8_t *data;
};

/* The TLSA RDATA of rr: 0, or -EBADMSG (shorter than 4 bytes). */
int dns_tlsa_parse(const struct dns_rr *rr, struct dns_tlsa *ret);

/*
 * Is t usable for SMTP (RFC 7672 3.1)?  Usages 2 (DANE-TA) and 3 (DANE-EE) only (0 and 1,
 * PKIX-TA and PKIX-EE, are not: a client cannot know the CAs a server relies on),
 * selector 0 or 1, matching type 0 (the whole thing, at most DNS_TLSA_FULL_MAX bytes),
 * 1 (SHA2-256, 32 bytes) or 2 (SHA2-512, 64 bytes).
 */
#define DNS_TLSA_FULL_MAX 4096
bool dns_tlsa_usable(const struct dns_tlsa *t);

#endif
