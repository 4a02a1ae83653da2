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

/* What the first byte of an input chose: how many items, windows, which mode. */
struct shape {
	size_t n;
	enum store_mode mode;
	unsigned flags;
	uint64_t block_ns;
	struct rate_limits lim;
};

static void check_decide(void *reply, void *arg)
{
	struct shape *sh = arg;
	struct store_item items[4];
	memset(items, 0, sizeof(items));
	for (size_t i = 0; i < sh->n; i++) {
		items[i].limits = &sh->lim;
		items[i].flags = sh->flags;
		items[i].value_hash = sh->flags ? 7 : 0;
		items[i].block_ns = sh->block_ns;
	}
	int rc = store_redis_parse_decide(reply, items, sh->n, sh->mode);
	CHECK(rc == 0 || rc == 1 || rc == -EPROTO);
	if (rc >= 0 && sh->mode != STORE_RESET)
		for (size_t i = 0; i < sh->n; i++)
			CHECK(!items[i].charged || items[i].ok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	unsigned nw = ((data[0] >> 2) & 3) + 1;
	struct shape sh = {
		.n = (size_t)(data[0] & 3) + 1,
		.mode = (enum store_mode)(((data[0] >> 4) & 3) % 3),
		/* the replies of distinct items (one more element: known) and of items
		 * with a block (one more: blocked) */
		.flags = data[0] & 0x40 ? STORE_DISTINCT : 0,
		.block_ns = data[0] & 0x80 ? 60000000000ULL : 0,
		.lim = { .n = nw },
	};
	for (unsigned j = 0; j < nw; j++)
		sh.lim.w[j] = (struct rate_window){ .count = 10, .period_ns = 60000000000ULL,
						    .burst = 10 };
	resp_each_reply(data + 1, size - 1, check_decide, &sh);
	return 0;
}
