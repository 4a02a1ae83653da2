/*
 * fuzz_snapshot -- libFuzzer target for the memory store's snapshot loader
 * (store_memory_load_buffer() in src/store/store_memory.c).
 *
 * The first input byte chooses how much of the image the harness repairs, so that the
 * fuzzer gets past the checks a random input cannot pass (a checksum above all):
 *   bit 0  write the end marker and the right checksum
 *   bit 1  write the magic and version: with an odd byte 12 in the input, version 1
 *          (cut the size to whole records and set the count); with an even one,
 *          version 2 (the count taken modulo the records that fit, the rest up to the
 *          end being the section of run-time limits)
 *   bits 2-7  max_keys - 1 (1..64), so that the bound is hit
 * The rest is the image.  The loader's verdict must match a plain reference reading of
 * the format written here; a loaded store must hold exactly the distinct records still
 * ahead of now (at most max_keys) and the distinct run-time limits not expired, carry
 * the image's seed, keep working (decisions, top, refunds), and drop everything when
 * expired at the end of time.  A rejected image must leave the store untouched.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "log.h"
#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define CHECK(x)                                                                          \
	do {                                                                               \
		if (!(x)) {                                                                \
			fprintf(stderr, "fuzz_snapshot: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #x);                                             \
			abort();                                                           \
		}                                                                          \
	} while (0)

#define HEADER 32
#define RECORD 16
#define NOW 1700000000000000000ull

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++, v >>= 8)
		p[i] = (uint8_t)v;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The run-time limits section p[0..n) of a version 2 image, read independently: valid?
 * and the distinct key hashes of the entries not expired at NOW. */
static bool reference_ov(const uint8_t *p, size_t n, uint64_t seed, uint64_t *ret_live)
{
	if (n < 8)
		return false;
	uint64_t count = le64(p);
	if (count > 100000)
		return false;
	size_t off = 8;
	uint64_t *live = malloc((count ? count : 1) * sizeof(*live));
	CHECK(live);
	size_t nlive = 0;
	bool ok = true;
	for (uint64_t i = 0; i < count && ok; i++) {
		if (n - off < 20) {
			ok = false;
			break;
		}
		uint64_t hash = le64(p + off), until = le64(p + off + 8);
		uint32_t nwin = le32(p + off + 16);
		off += 20;
		if (nwin > 4 || (n - off) / 24 < nwin) {
			ok = false;
			break;
		}
		for (uint32_t w = 0; w < nwin; w++, off += 24)
			if (!le64(p + off) || !le64(p + off + 8) || !le64(p + off + 16))
				ok = false;
		struct str text[2];
		for (int part = 0; part < 2 && ok; part++) {
			if (n - off < 4) {
				ok = false;
				break;
			}
			uint32_t len = le32(p + off);
			off += 4;
			if (len == 0 || len > (part ? 512u : 63u) || n - off < len) {
				ok = false;
				break;
			}
			text[part] = str_make((const char *)p + off, len);
			off += len;
		}
		if (!ok)
			break;
		if (memchr(text[0].ptr, ' ', text[0].len) || memchr(text[0].ptr, 0, text[0].len) ||
		    store_key_hash_seed(seed, text[0], text[1]) != hash) {
			ok = false;
			break;
		}
		if (until == 0 || until > NOW)
			live[nlive++] = hash;
	}
	if (ok && off != n)
		ok = false;
	uint64_t distinct = 0;
	qsort(live, nlive, sizeof(*live), cmp_u64);
	for (size_t i = 0; i < nlive; i++)
		distinct += i == 0 || live[i] != live[i - 1];
	free(live);
	*ret_live = distinct;
	return ok;
}

/* The format of store_memory.c's header comment, read independently: valid? and the
 * records, and the live run-time limits. */
static bool reference_valid(const uint8_t *p, size_t n, uint64_t *ret_records,
			    uint64_t *ret_ov)
{
	*ret_ov = 0;
	if (n < HEADER + RECORD || memcmp(p, "SLUICESNAP1\n", 12) != 0)
		return false;
	if ((p[12] != 1 && p[12] != 2) || p[13] || p[14] || p[15])
		return false;
	uint64_t records;
	if (p[12] == 1) {
		if ((n - HEADER) % RECORD)
			return false;
		records = (n - HEADER) / RECORD - 1;
		if (le64(p + 24) != records)
			return false;
	} else {
		records = le64(p + 24);
		if (records > (n - HEADER - RECORD) / RECORD)
			return false;
	}
	if (le64(p + n - RECORD) != 0 || le64(p + n - 8) != XXH64(p, n - RECORD, 0))
		return false;
	for (uint64_t i = 0; i < records; i++)
		if (le64(p + HEADER + i * RECORD) == 0)
			return false;
	size_t end = HEADER + (size_t)records * RECORD;
	if (p[12] == 2 && !reference_ov(p + end, n - RECORD - end, le64(p + 16), ret_ov))
		return false;
	*ret_records = records;
	return true;
}

/* Distinct hashes among the records whose TAT is ahead of now, in the order loaded,
 * counting only the first max of them. */
static uint64_t reference_keys(const uint8_t *p, uint64_t records, uint64_t max)
{
	uint64_t distinct = 0;
	uint64_t *seen = malloc((records ? records : 1) * sizeof(*seen));
	CHECK(seen);
	size_t live = 0;
	for (uint64_t i = 0; i < records; i++)
		if (le64(p + HEADER + i * RECORD + 8) > NOW)
			seen[live++] = le64(p + HEADER + i * RECORD);
	qsort(seen, live, sizeof(*seen), cmp_u64);
	for (size_t i = 0; i < live; i++)
		distinct += i == 0 || seen[i] != seen[i - 1];
	free(seen);
	return distinct < max ? distinct : max;
}

static void log_discard(enum log_level level, const char *line)
{
	(void)level;
	(void)line;
}

/* The "store full" lines are expected here by the thousand. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	log_set_sink(log_discard);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned mode = size ? data[0] : 0;
	size_t n = size ? size - 1 : 0;
	uint8_t *img = malloc(n ? n : 1);
	CHECK(img);
	if (n)
		memcpy(img, data + 1, n);
	if ((mode & 2) && n >= HEADER + RECORD) {
		bool v1 = img[12] & 1;
		memcpy(img, "SLUICESNAP1\n", 12);
		memcpy(img + 12, v1 ? "\1\0\0\0" : "\2\0\0\0", 4);
		if (v1) {
			n -= (n - HEADER) % RECORD;
			put_le64(img + 24, (n - HEADER) / RECORD - 1);
		} else {
			put_le64(img + 24, le64(img + 24) % ((n - HEADER - RECORD) / RECORD + 1));
		}
	}
	if ((mode & 1) && n >= HEADER + RECORD) {
		put_le64(img + n - RECORD, 0);
		put_le64(img + n - 8, XXH64(img, n - RECORD, 0));
	}
	uint64_t max = 1 + (mode >> 2);

	struct store_memory_conf conf = { .max_keys = max, .snapshot = NULL };
	char warn[128];
	struct store *s = store_memory_new(&conf, NOW, warn, sizeof(warn));
	CHECK(s);
	CHECK(warn[0] == '\0');
	uint64_t seed = s->seed;
	int rc = store_memory_load_buffer(s, img, n, NOW);
	CHECK(rc == 0 || rc == -EINVAL);
	uint64_t records = 0, ov = 0;
	bool valid = reference_valid(img, n, &records, &ov);
	CHECK(valid == (rc == 0));
	struct store_stats st;
	s->ops->stats(s->ctx, &st);
	if (rc < 0) {
		CHECK(st.keys == 0);
		CHECK(s->seed == seed);
		CHECK(store_ov_count(s->ov, NOW) == 0);
	} else {
		CHECK(s->seed == le64(img + 16));
		CHECK(st.keys == reference_keys(img, records, max));
		CHECK(store_ov_count(s->ov, NOW) == ov);
	}

	/* the store works on whatever it loaded */
	const struct rate_limits limits = { 2, { { 10, 60000000000ull, 10 },
						 { 100, 3600000000000ull, 100 } } };
	struct store_item items[2] = {
		{ .key_hash = store_key_hash(s, str_cstr("r"), str_cstr("a")),
		  .rule = str_cstr("r"), .key = str_cstr("a"), .limits = &limits, .cost = 3,
		  .flags = STORE_BLOCKING },
		{ .key_hash = n >= 8 ? le64(img) : 1, .rule = str_cstr("r"),
		  .key = str_cstr("b"), .limits = &limits, .cost = 9, .flags = 0 },
	};
	for (int i = 0; i < 3; i++) {
		int d = store_decide(s, items, 2, STORE_CHECK, NOW);
		CHECK(d == 0 || d == 1);
		s->ops->stats(s->ctx, &st);
		/* over the bound only by the batch's own records (evict_one()) */
		CHECK(st.keys <= (max >= 4 ? max : 4));
	}
	store_refund(s, items, 2, NOW);
	struct store_top_entry top[4];
	CHECK(s->ops->top(s->ctx, top, 4, NOW) <= 4);
	for (int i = 0; i < 64 && st.keys; i++) {
		s->ops->expire(s->ctx, UINT64_MAX);
		s->ops->stats(s->ctx, &st);
	}
	CHECK(st.keys == 0);
	store_free(s);
	free(img);
	return 0;
}
