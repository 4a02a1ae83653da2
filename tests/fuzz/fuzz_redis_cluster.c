/*
 * fuzz_redis_cluster -- libFuzzer target for what the Redis store reads from a cluster:
 * the slot map (a CLUSTER SLOTS reply, as hiredis's reader decodes it from the wire,
 * into ranges by redis_slots_parse()) and the redirections (the text of a MOVED or ASK
 * error, by redis_redirect_parse()); src/store/store_redis_addr.c.
 *
 * The input's first line (up to a '\n') is parsed as a redirection; all of it is fed to
 * hiredis's reply reader, one reply after another, and each is parsed as a slot map.
 * What is accepted must be what the store can use: slots below 16384, first <= last, a
 * port in 1..65535, a host that is a NUL-terminated string of the address's size.
 *
 * XXX hiredis 0.14 allocates an array reply's declared element count before reading the
 * elements (resp_bound.h): inputs that declare more than 4096 elements are
 * skipped here.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "resp_bound.h"

#include "store_redis_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                          \
	do {                                                                               \
		if (!(x)) {                                                                \
			fprintf(stderr, "fuzz_redis_cluster: %s:%d: check failed: %s\n",   \
				__FILE__, __LINE__, #x);                                   \
			abort();                                                           \
		}                                                                          \
	} while (0)

static void check_addr(const struct addr *a)
{
	CHECK(memchr(a->host, '\0', sizeof(a->host)) != NULL);
	CHECK(a->port >= 1 && a->port <= 65535);
}

static void check_slot_map(void *reply, void *arg)
{
	(void)arg;
	struct addr asked = { .host = "192.0.2.7", .port = 7000 };
	struct redis_slot_range r[64];
	int got = redis_slots_parse(reply, &asked, r, 64);
	CHECK(got == -EPROTO || (got >= 0 && got <= 64));
	for (int i = 0; i < got; i++) {
		CHECK(r[i].first <= r[i].last && r[i].last < REDIS_SLOTS);
		check_addr(&r[i].master);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (resp_huge_aggregate(data, size))
		return 0;
	char line[512];
	size_t n = 0;
	while (n < size && n < sizeof(line) - 1 && data[n] != '\n')
		n++;
	memcpy(line, data, n);
	line[n] = '\0';
	unsigned slot = 77777;
	struct addr a;
	memset(&a, 0x5a, sizeof(a));
	if (redis_redirect_parse(line, &slot, &a) == 0) {
		CHECK(slot < REDIS_SLOTS);
		check_addr(&a);
	} else {
		CHECK(slot == 77777);
	}
	resp_each_reply(data, size, check_slot_map, NULL);
	return 0;
}
