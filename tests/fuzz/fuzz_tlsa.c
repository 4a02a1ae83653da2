/*
 * fuzz_tlsa -- the DNS response reader (src/proto/dns_answer.c) on hostile answers, as
 * the relay reads TLSA and MX answers from its resolver: every record kept must lie
 * inside the message, the counts within their bounds, and a TLSA record's data inside its
 * record; usable records have the lengths their matching type gives.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dns_answer.h"

static void check(const uint8_t *data, size_t size, uint16_t type)
{
	struct dns_answer a;
	if (dns_answer_parse(data, size, type, &a) < 0)
		return;
	if (a.n > DNS_ANSWER_RR_MAX || a.rcode > 15 || (a.dropped && a.n != DNS_ANSWER_RR_MAX))
		abort();
	for (size_t i = 0; i < a.n; i++) {
		const struct dns_rr *rr = &a.rr[i];
		if (rr->type != type || rr->ttl > INT32_MAX || rr->data < data ||
		    rr->data + rr->len > data + size)
			abort();
		if (rr->ttl < a.ttl)
			abort();
		struct dns_tlsa t;
		if (dns_tlsa_parse(rr, &t) < 0) {
			if (rr->len >= 4)
				abort();
			continue;
		}
		if (t.data != rr->data + 3 || t.len != rr->len - 3)
			abort();
		if (dns_tlsa_usable(&t) &&
		    ((t.usage != 2 && t.usage != 3) || t.selector > 1 ||
		     (t.mtype == 1 && t.len != 32) || (t.mtype == 2 && t.len != 64) ||
		     t.mtype > 2 || t.len > DNS_TLSA_FULL_MAX))
			abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* an exact copy, so that a read past the end is caught by ASan */
	uint8_t *copy = malloc(size ? size : 1);
	if (!copy)
		return 0;
	memcpy(copy, data, size);
	check(copy, size, DNS_TYPE_TLSA);
	check(copy, size, DNS_TYPE_MX);
	free(copy);
	return 0;
}
