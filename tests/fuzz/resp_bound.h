/*
 * resp_bound.h -- how the Redis fuzz targets read their input: as replies decoded by
 * hiredis's reader from the wire (resp_each_reply), and what they skip: hiredis 0.14
 * allocates an array reply's declared element count before reading the elements
 * ("*999999999" is 8 GB) and has no bound to set, so inputs that declare more than 4096
 * elements are not fed to it (the store relies on its peer being a Redis server for that).
 */
#ifndef SLUICE_FUZZ_RESP_BOUND_H
#define SLUICE_FUZZ_RESP_BOUND_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <hiredis/hiredis.h>

/* Does the input declare an aggregate of more than 4096 elements anywhere? */
static inline int resp_huge_aggregate(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (p[i] != '*')
			continue;
		unsigned long v = 0;
		for (size_t k = i + 1; k < n && p[k] >= '0' && p[k] <= '9'; k++)
			if ((v = v * 10 + (unsigned long)(p[k] - '0')) > 4096)
				return 1;
	}
	return 0;
}

/* Feed p[0..n) to a hiredis reader and call fn(reply, arg) on each reply it decodes, in
 * order, freeing each after the call; nothing when the input declares a huge aggregate
 * or is not a reply at all. */
static inline void resp_each_reply(const uint8_t *p, size_t n, void (*fn)(void *, void *),
				   void *arg)
{
	if (resp_huge_aggregate(p, n))
		return;
	redisReader *rd = redisReaderCreate();
	if (!rd) {
		fprintf(stderr, "resp_each_reply: redisReaderCreate failed\n");
		abort();
	}
	if (redisReaderFeed(rd, (const char *)p, n) == REDIS_OK) {
		for (;;) {
			void *reply = NULL;
			if (redisReaderGetReply(rd, &reply) != REDIS_OK || !reply)
				break;
			fn(reply, arg);
			freeReplyObject(reply);
		}
	}
	redisReaderFree(rd);
}

#endif
