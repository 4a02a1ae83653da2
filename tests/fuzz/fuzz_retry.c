/*
 * fuzz_retry -- libFuzzer target for the retry journal's record (src/queue/queue_retry.c).
 *
 * The input is a journal image as a reader may find it.  Every record the scan accepts
 * must encode back to the very bytes it was found in, lie inside the image and, for a
 * recipient's state, carry a valid QID and index.  The scan must account for every byte:
 * records times their size plus the bytes it skipped is the image's length.  The first
 * bytes are also read as fields, encoded and decoded back unchanged.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue_retry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                          \
	do {                                                                               \
		if (!(x)) {                                                                \
			fprintf(stderr, "fuzz_retry: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #x);                                             \
			abort();                                                           \
		}                                                                          \
	} while (0)

struct image {
	const uint8_t *p;
	size_t n;
};

static int one(void *arg, const struct queue_retry_rec *r, size_t off)
{
	const struct image *im = arg;
	CHECK(off + QUEUE_RETRY_RECORD <= im->n);
	unsigned char b[QUEUE_RETRY_RECORD];
	CHECK(queue_retry_encode(r, b) == 0);
	CHECK(memcmp(b, im->p + off, sizeof(b)) == 0);
	if (r->kind == QUEUE_RETRY_STATE) {
		CHECK(queue_id_valid(str_make(r->id, QUEUE_ID_LEN)));
		CHECK(r->rcpt < QUEUE_MAX_RECIPIENTS);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct image im = { data, size };
	struct queue_retry_scan_stats st;
	CHECK(queue_retry_scan(data, size, one, &im, &st) == 0);
	CHECK(st.records * QUEUE_RETRY_RECORD + st.skipped_bytes == size);

	/* fields from the input: 16 ID bytes, then rcpt, attempts, next */
	if (size >= 32) {
		struct queue_retry_rec r = { .kind = data[0] & 1 ? QUEUE_RETRY_SNAPSHOT
							   : QUEUE_RETRY_STATE };
		if (r.kind == QUEUE_RETRY_STATE)
			memcpy(r.id, data + 16, QUEUE_ID_LEN);
		memcpy(&r.rcpt, data + 1, 4);
		memcpy(&r.attempts, data + 5, 4);
		memcpy(&r.next_us, data + 9, 7);
		if (r.kind == QUEUE_RETRY_SNAPSHOT)
			r.rcpt = r.attempts = 0;
		unsigned char b[QUEUE_RETRY_RECORD];
		if (queue_retry_encode(&r, b) == 0) {
			struct queue_retry_rec d;
			CHECK(queue_retry_decode(b, sizeof(b), &d) == 0);
			CHECK(d.kind == r.kind && strcmp(d.id, r.id) == 0 && d.rcpt == r.rcpt &&
			      d.attempts == r.attempts && d.next_us == r.next_us);
		} else {
			CHECK(r.kind == QUEUE_RETRY_STATE);
		}
	}
	return 0;
}
