/*
 * queue_retry -- the retry journal's record (queue_retry.h).
 */
#include <errno.h>
#include <string.h>

#include <xxhash.h>

#include "queue_retry.h"

static const unsigned char magic[4] = { 'S', 'Q', 'R', 'J' };

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const unsigned char *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

int queue_retry_encode(const struct queue_retry_rec *r, unsigned char out[QUEUE_RETRY_RECORD])
{
	unsigned char b[QUEUE_RETRY_RECORD] = { 0 };
	memcpy(b, magic, sizeof(magic));
	switch (r->kind) {
	case QUEUE_RETRY_STATE:
		if (!queue_id_valid(str_make(r->id, strnlen(r->id, QUEUE_ID_LEN + 1))) ||
		    r->rcpt >= QUEUE_MAX_RECIPIENTS)
			return -EINVAL;
		b[4] = 'R';
		memcpy(b + 8, r->id, QUEUE_ID_LEN);
		put32(b + 24, r->rcpt);
		put32(b + 28, r->attempts);
		break;
	case QUEUE_RETRY_SNAPSHOT:
		b[4] = 'S';
		break;
	default:
		return -EINVAL;
	}
	put64(b + 32, r->next_us);
	put64(b + 40, XXH64(b, 40, 0));
	memcpy(out, b, sizeof(b));
	return 0;
}

int queue_retry_decode(const unsigned char *p, size_t n, struct queue_retry_rec *ret)
{
	static const unsigned char zeros[QUEUE_ID_LEN];
	if (n < QUEUE_RETRY_RECORD || memcmp(p, magic, sizeof(magic)) != 0 || p[5] || p[6] ||
	    p[7] || get64(p + 40) != XXH64(p, 40, 0))
		return -EINVAL;
	struct queue_retry_rec r = { .next_us = get64(p + 32) };
	if (p[4] == 'R') {
		r.kind = QUEUE_RETRY_STATE;
		memcpy(r.id, p + 8, QUEUE_ID_LEN);
		r.id[QUEUE_ID_LEN] = '\0';
		r.rcpt = get32(p + 24);
		r.attempts = get32(p + 28);
		if (!queue_id_valid(str_make(r.id, QUEUE_ID_LEN)) || r.rcpt >= QUEUE_MAX_RECIPIENTS)
			return -EINVAL;
	} else if (p[4] == 'S') {
		r.kind = QUEUE_RETRY_SNAPSHOT;
		if (memcmp(p + 8, zeros, sizeof(zeros)) != 0 || get32(p + 24) || get32(p + 28))
			return -EINVAL;
	} else {
		return -EINVAL;
	}
	*ret = r;
	return 0;
}

int queue_retry_scan(const unsigned char *p, size_t n,
		     int (*fn)(void *arg, const struct queue_retry_rec *r, size_t off),
		     void *arg, struct queue_retry_scan_stats *st)
{
	struct queue_retry_scan_stats s = { 0, 0 };
	size_t off = 0;
	int rc = 0;
	while (off < n) {
		struct queue_retry_rec r;
		if (queue_retry_decode(p + off, n - off, &r) == 0) {
			s.records++;
			rc = fn(arg, &r, off);
			if (rc < 0)
				break;
			off += QUEUE_RETRY_RECORD;
			continue;
		}
		/* resynchronise on the next magic after this byte */
		const unsigned char *next = memmem(p + off + 1, n - off - 1, magic, sizeof(magic));
		size_t to = next ? (size_t)(next - p) : n;
		s.skipped_bytes += to - off;
		off = to;
	}
	if (st)
		*st = s;
	return rc < 0 ? rc : 0;
}
