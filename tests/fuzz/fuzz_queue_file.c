/*
 * fuzz_queue_file -- libFuzzer target for the queue file loader (queue_file_load() in
 * src/queue/queue_file.c).
 *
 * Bit 0 of the first input byte asks the harness to repair the checksum: when the image
 * ends with an end record, its digest is recomputed as doc/QUEUE.md defines it (status
 * and control bytes counted as zero), so the fuzzer gets past the one check a random
 * input cannot pass.  The rest is the image.  An accepted image must index consistently:
 * at least one recipient, every offset inside the image and holding the byte the index
 * says, the body records adding up to body_len; in version 2 the DSN fields (ENVID,
 * each ORCPT) slices of the image within their limits, and none in version 1; and what
 * they hold as RFC 3461 allows (NOTIFY: NEVER alone or a set of the other three; ENVID
 * and ORCPT printable ASCII, ORCPT an atom, ';' and an address), so that no file with a
 * right checksum can put a CR, an LF or a bad NOTIFY into a command to the next hop; the
 * status byte N (delivered, relayed notice owed) only in version 2.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "queue_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                          \
	do {                                                                               \
		if (!(x)) {                                                                \
			fprintf(stderr, "fuzz_queue_file: %s:%d: check failed: %s\n",      \
				__FILE__, __LINE__, #x);                                   \
			abort();                                                           \
		}                                                                          \
	} while (0)

static uint32_t u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Recompute the end record's digest in place, if the records reach one. */
static void repair(uint8_t *p, size_t n)
{
	static const uint8_t zeros[8];
	XXH64_state_t st;
	XXH64_reset(&st, 0);
	size_t off = 0;
	while (n - off >= 5) {
		size_t len = u32(p + off + 1);
		if (n - off - 5 < len)
			return;
		if (p[off] == 'Z') {
			if (len == 8) {
				uint64_t d = XXH64_digest(&st);
				for (int i = 0; i < 8; i++)
					p[off + 5 + i] = (uint8_t)(d >> (8 * i));
			}
			return;
		}
		XXH64_update(&st, p + off, 5);
		if (p[off] == 'C' && len <= sizeof(zeros)) {
			XXH64_update(&st, zeros, len);
		} else if (p[off] == 'R' && len) {
			XXH64_update(&st, zeros, 1);
			XXH64_update(&st, p + off + 6, len - 1);
		} else {
			XXH64_update(&st, p + off + 5, len);
		}
		off += 5 + len;
	}
}

static bool printable(struct str s)
{
	for (size_t i = 0; i < s.len; i++)
		if (s.ptr[i] < 0x20 || s.ptr[i] > 0x7e)
			return false;
	return true;
}

static bool atom_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c && strchr("!#$%&'*+-/=?^_`{|}~", c));
}

/* "" or atom ";" 1*printable */
static bool orcpt_form(struct str o)
{
	if (o.len == 0)
		return true;
	if (!printable(o))
		return false;
	size_t k = 0;
	while (k < o.len && atom_char(o.ptr[k]))
		k++;
	return k > 0 && k + 1 < o.len && o.ptr[k] == ';';
}

struct sum {
	uint64_t bytes;
	size_t chunks;
};

static int add(void *arg, struct str chunk)
{
	struct sum *s = arg;
	s->bytes += chunk.len;
	s->chunks++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t n = size - 1;
	uint8_t *p = malloc(n ? n : 1);
	CHECK(p);
	if (n)
		memcpy(p, data + 1, n);
	if (data[0] & 1)
		repair(p, n);
	struct queue_index ix;
	const char *why = NULL;
	int r = queue_file_load(p, n, &ix, &why);
	CHECK(r == 0 || (r == -EINVAL && why) || r == -ENOMEM);
	if (r == 0) {
		CHECK(ix.nrcpt >= 1);
		CHECK(queue_id_valid(str_make(ix.env.id, QUEUE_ID_LEN)));
		CHECK(ix.control_off + QUEUE_CONTROL_LEN <= n);
		CHECK(memcmp(p + ix.control_off, ix.control, QUEUE_CONTROL_LEN) == 0);
		for (size_t i = 0; i < ix.nrcpt; i++) {
			CHECK(ix.rcpt[i].status_off < n);
			CHECK(p[ix.rcpt[i].status_off] == (uint8_t)ix.rcpt[i].status);
			CHECK(ix.rcpt[i].addr.len >= 1 && ix.rcpt[i].addr.len <= QUEUE_MAX_ADDR);
			CHECK((const uint8_t *)ix.rcpt[i].addr.ptr > p &&
			      (const uint8_t *)ix.rcpt[i].addr.ptr + ix.rcpt[i].addr.len <= p + n);
			CHECK(ix.rcpt[i].orcpt.len <= QUEUE_MAX_ORCPT);
			CHECK(ix.rcpt[i].orcpt.len == 0 ||
			      ((const uint8_t *)ix.rcpt[i].orcpt.ptr > p &&
			       (const uint8_t *)ix.rcpt[i].orcpt.ptr + ix.rcpt[i].orcpt.len <= p + n));
			CHECK(ix.version == 2 || (ix.rcpt[i].notify == 0 && ix.rcpt[i].orcpt.len == 0));
			uint8_t nt = ix.rcpt[i].notify;
			CHECK(nt == QUEUE_NOTIFY_NEVER ||
			      (nt & ~(QUEUE_NOTIFY_SUCCESS | QUEUE_NOTIFY_FAILURE | QUEUE_NOTIFY_DELAY)) == 0);
			CHECK(orcpt_form(ix.rcpt[i].orcpt));
			CHECK(ix.rcpt[i].status != 0);
			CHECK(strchr("TUDF", ix.rcpt[i].status) ||
			      (ix.rcpt[i].status == QUEUE_RELAYED && ix.version == 2));
		}
		CHECK(ix.version == 1 || ix.version == 2);
		CHECK(ix.env.envid.len <= QUEUE_MAX_ENVID && ix.env.ret <= QUEUE_RET_HDRS);
		CHECK(ix.version == 2 || (ix.env.envid.len == 0 && ix.env.ret == 0));
		CHECK(printable(ix.env.envid));
		struct sum s = { 0, 0 };
		CHECK(queue_file_body(p, n, &ix, add, &s) == 0);
		CHECK(s.bytes == ix.body_len && s.chunks == ix.nbody);
		queue_index_clear(&ix);
	}
	free(p);
	return 0;
}
