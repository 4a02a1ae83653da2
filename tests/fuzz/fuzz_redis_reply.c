/*
 * fuzz_redis_reply -- libFuzzer target for what the Redis store reads from Redis: the
 * decision script's reply, as hiredis's reader decodes it from the wire and
 * store_redis_parse_decide() turns it into items (src/store/store_redis.c).
 *
 * The first input byte shapes the call: bits 0-1 the number of items - 1 (1..4), bits
 * 2-3 the windows per item - 1 (1..4), bits 4-5 the mode (check, peek, reset), bit 6
 * distinct items, bit 7 items with a block.  The rest
 * is fed to hiredis's reply reader, one reply after another.  A reply is either refused
 * (-EPROTO) or gives a verdict, and then no item may be charged without being ok: the
 * store would otherwise record a charge that was never made.
 *
 * XXX hiredis 0.14 allocates an array reply's declared element count before reading the
 * elements ("*999999999" is 8 GB) and has no bound to set: inputs that declare more than
 * 4096 elements are skipped here (resp_bound.h).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "resp_bound.h"

#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                          \
	do {                                                                               \
		if (!(x)) {                                                                \
			fprintf(stderr, "fuzz_redis_reply: %s:%d: check failed: %s\n",     \
				__FILE__, __LINE__, #x);                                   \
			abort();                                                           \
		}                                                                          \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || resp_huge_aggregate(data + 1, size - 1))
		return 0;
	size_t n = (size_t)(data[0] & 3) + 1;
	unsigned nw = ((data[0] >> 2) & 3) + 1;
	enum store_mode mode = (enum store_mode)(((data[0] >> 4) & 3) % 3);
	/* the replies of distinct items (one more element: known) and of items with a
	 * block (one more: blocked) */
	unsigned flags = data[0] & 0x40 ? STORE_DISTINCT : 0;
	uint64_t block_ns = data[0] & 0x80 ? 60000000000ULL : 0;
	struct rate_limits lim = { .n = nw };
	for (unsigned j = 0; j < nw; j++)
		lim.w[j] = (struct rate_window){ .count = 10, .period_ns = 60000000000ULL,
						 .burst = 10 };
	redisReader *rd = redisReaderCreate();
	CHECK(rd);
	if (redisReaderFeed(rd, (const char *)data + 1, size - 1) != REDIS_OK) {
		redisReaderFree(rd);
		return 0;
	}
	for (;;) {
		void *reply = NULL;
		if (redisReaderGetReply(rd, &reply) != REDIS_OK || !reply)
			break;
		struct store_item items[4];
		memset(items, 0, sizeof(items));
		for (size_t i = 0; i < n; i++) {
			items[i].limits = &lim;
			items[i].flags = flags;
			items[i].value_hash = flags ? 7 : 0;
			items[i].block_ns = block_ns;
		}
		int rc = store_redis_parse_decide(reply, items, n, mode);
		CHECK(rc == 0 || rc == 1 || rc == -EPROTO);
		if (rc >= 0 && mode != STORE_RESET)
			for (size_t i = 0; i < n; i++)
				CHECK(!items[i].charged || items[i].ok);
		freeReplyObject(reply);
	}
	redisReaderFree(rd);
	return 0;
}
