/*
 * fuzz_redis_ov -- libFuzzer target for what a node reads of the run-time limits in
 * Redis: ov_read.lua's reply ({VERSION, {FIELD, VALUE, ...}}) as hiredis's reader decodes
 * it from the wire, and store_redis_ov_parse() turns it into entries
 * (src/store/store_redis_ov.c).
 *
 * The input is fed to hiredis's reply reader, one reply after another.  A reply is
 * refused (-EPROTO) or gives entries; every entry given must be one the table accepts
 * (store_ov_entry_valid), its texts inside the reply, and the entries with the skipped
 * pairs must account for every pair; the entries then go into a table, which must hold
 * at most as many as were given.
 *
 * XXX as fuzz_redis_reply.c: inputs that declare more than 4096 elements are skipped
 * (hiredis 0.14 allocates a declared count before reading it; resp_bound.h).
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
			fprintf(stderr, "fuzz_redis_ov: %s:%d: check failed: %s\n", __FILE__,  \
				__LINE__, #x);                                             \
			abort();                                                           \
		}                                                                          \
	} while (0)

static void check_reply(void *reply, void *arg)
{
	(void)arg;
	uint64_t version;
	struct store_ov_entry *e = NULL;
	size_t n = 0, skipped = 0;
	int rc = store_redis_ov_parse(reply, &version, &e, &n, &skipped);
	CHECK(rc == 0 || rc == -EPROTO);
	if (rc != 0)
		return;
	const redisReply *r = reply;
	CHECK(n + skipped == r->element[1]->elements / 2);
	for (size_t i = 0; i < n; i++)
		CHECK(store_ov_entry_valid(&e[i]));
	struct store_ov *ov = store_ov_new();
	CHECK(ov);
	CHECK(store_ov_replace(ov, e, n, 1) == 0);
	CHECK(store_ov_count(ov, 1) <= n);
	for (size_t i = 0; i < n; i++) {
		struct rate_limits l;
		if (e[i].until_ns == 0 || e[i].until_ns > 1)
			CHECK(store_ov_find(ov, e[i].key_hash, 1, &l, NULL) == 1);
	}
	store_ov_free(ov);
	free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	resp_each_reply(data, size, check_reply, NULL);
	return 0;
}
