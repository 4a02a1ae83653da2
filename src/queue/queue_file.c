/*
 * queue_file -- the message file's records, written and indexed (see queue_file.h and
 * doc/QUEUE.md).
 *
 * Record: type (1 byte) | length (u32 little-endian) | payload.
 *   S  "SLUICEQ1" + version (u32): 2 is written when there are DSN parameters, else 1;
 *      both are read
 *   E  id (16) | arrival_us (u64) | flags (u32) | size (u64) | then three strings, each
 *      length (u16) + bytes: sender, client, helo; version 2 adds ret (u8) and the
 *      string envid
 *   C  QUEUE_CONTROL_LEN control bytes
 *   R  status (1) | address; version 2: status (1) | notify (u8) | orcpt length (u16) |
 *      orcpt | address
 *   B  body bytes (<= QUEUE_BODY_CHUNK)
 *   Z  XXH64 (u64) of every byte before this record, with each R record's status byte
 *      and the C record's payload counted as zero bytes (they change in place)
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* for XXH64_state_t in a struct: the library is a system package of one version */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "queue_file.h"

#define MAGIC "SLUICEQ1"
#define VERSION 2u          /* written with DSN parameters, else VERSION_1; both read */
#define VERSION_1 1u
#define HDR 5 /* type + length */

static const char b32[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"; /* Crockford */

void queue_id_make(char out[QUEUE_ID_LEN + 1], uint64_t now_us, uint32_t seq)
{
	/* 52 bits of time, 28 of sequence: 80 bits, 16 characters of 5 bits */
	uint64_t hi = now_us & ((1ULL << 52) - 1);
	uint32_t lo = seq & ((1u << 28) - 1);
	/* the 80-bit number hi:lo, most significant character first */
	for (int i = QUEUE_ID_LEN - 1; i >= 0; i--) {
		out[i] = b32[lo & 31];
		lo = (lo >> 5) | (uint32_t)((hi & 31) << 23);
		hi >>= 5;
	}
	out[QUEUE_ID_LEN] = '\0';
}

static int b32_value(char c)
{
	const char *p = c ? strchr(b32, c) : NULL;
	return p ? (int)(p - b32) : -1;
}

bool queue_id_valid(struct str s)
{
	if (s.len != QUEUE_ID_LEN)
		return false;
	for (size_t i = 0; i < s.len; i++)
		if (b32_value(s.ptr[i]) < 0)
			return false;
	return true;
}

uint64_t queue_id_time_us(const char id[QUEUE_ID_LEN])
{
	/* the first 52 of the 80 bits: characters 0..9 hold 50 bits, then 2 of the 11th */
	uint64_t v = 0;
	for (int i = 0; i < 10; i++)
		v = v << 5 | (uint64_t)b32_value(id[i]);
	return v << 2 | (uint64_t)b32_value(id[10]) >> 3;
}

/* ---- what the DSN fields may hold (the writer and the loader both check) ---- */

/* ENVID and ORCPT, xtext-decoded: printable ASCII, as RFC 3461 lets them carry and as
 * the intake accepts; never a CR or LF that would reach a command to the next hop. */
static bool printable(struct str s)
{
	for (size_t i = 0; i < s.len; i++)
		if ((unsigned char)s.ptr[i] < 0x20 || (unsigned char)s.ptr[i] > 0x7e)
			return false;
	return true;
}

/* NOTIFY: none (0), NEVER alone, or a set of SUCCESS, FAILURE and DELAY (RFC 3461 4.1). */
static bool notify_ok(unsigned n)
{
	return n == QUEUE_NOTIFY_NEVER ||
	       (n & ~(unsigned)(QUEUE_NOTIFY_SUCCESS | QUEUE_NOTIFY_FAILURE | QUEUE_NOTIFY_DELAY)) == 0;
}

/* ORCPT: empty (none), or addr-type ";" address: an atom (RFC 5322 atext), then at least
 * one printable character (RFC 3461 4.2). */
static bool orcpt_ok(struct str o)
{
	static const char specials[] = "!#$%&'*+-/=?^_`{|}~";
	if (o.len == 0)
		return true;
	const char *semi = memchr(o.ptr, ';', o.len);
	if (!semi || semi == o.ptr || semi == o.ptr + o.len - 1 || !printable(o))
		return false;
	for (const char *p = o.ptr; p < semi; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || strchr(specials, *p)))
			return false;
	return true;
}

/* ---- writing ---- */

static void put_u16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get_u16(const unsigned char *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get_u32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

struct queue_writer {
	struct buf *out;
	XXH64_state_t st;
	uint32_t version;       /* of the file, set by queue_write_head() */
};

struct queue_writer *queue_writer_new(struct buf *out)
{
	struct queue_writer *w = malloc(sizeof(*w));
	if (w) {
		w->out = out;
		XXH64_reset(&w->st, 0);
		w->version = 0; /* queue_write_head() sets it */
	}
	return w;
}

struct queue_writer *queue_writer_free(struct queue_writer *w)
{
	free(w);
	return NULL;
}

static const unsigned char zeros[QUEUE_CONTROL_LEN];

/* Hash a record as the loader will: the bytes that change in place count as zeros. */
static void hash_record(XXH64_state_t *st, const unsigned char *rec, size_t len)
{
	XXH64_update(st, rec, HDR);
	const unsigned char *q = rec + HDR;
	if (rec[0] == 'C') {
		XXH64_update(st, zeros, len);
		return;
	}
	if (rec[0] == 'R' && len) {
		XXH64_update(st, zeros, 1);
		XXH64_update(st, q + 1, len - 1);
		return;
	}
	XXH64_update(st, q, len);
}

static int record(struct queue_writer *w, char type, const void *payload, size_t len)
{
	struct buf *b = w->out;
	unsigned char h[HDR];
	h[0] = (unsigned char)type;
	put_u32(h + 1, (uint32_t)len);
	size_t mark = b->len;
	if (buf_append(b, h, HDR) < 0 || (len && buf_append(b, payload, len) < 0)) {
		buf_truncate(b, mark);
		return -ENOBUFS;
	}
	if (type != 'Z')
		hash_record(&w->st, (const unsigned char *)b->ptr + mark, len);
	return 0;
}

int queue_write_head(struct queue_writer *w, const struct queue_envelope *e)
{
	if (e->sender.len > QUEUE_MAX_ADDR || e->client.len + e->helo.len > QUEUE_MAX_CLIENT ||
	    e->envid.len > QUEUE_MAX_ENVID || !printable(e->envid) || e->ret > QUEUE_RET_HDRS ||
	    !queue_id_valid(str_make(e->id, strnlen(e->id, QUEUE_ID_LEN + 1))))
		return -EINVAL; /* never write what the loader refuses (an ID out of the alphabet,
				 * an ENVID with a control byte) */
	uint32_t v = e->ret || e->envid.len || e->rcpt_dsn ? VERSION : VERSION_1;
	unsigned char s[12];
	memcpy(s, MAGIC, 8);
	put_u32(s + 8, v);
	unsigned char env[QUEUE_ID_LEN + 20 + 6 + QUEUE_MAX_ADDR + QUEUE_MAX_CLIENT + 3 +
			  QUEUE_MAX_ENVID];
	size_t n = 0;
	memcpy(env, e->id, QUEUE_ID_LEN);
	n += QUEUE_ID_LEN;
	put_u64(env + n, e->arrival_us);
	put_u32(env + n + 8, e->flags);
	put_u64(env + n + 12, e->size);
	n += 20;
	const struct str *f[3] = { &e->sender, &e->client, &e->helo };
	for (int i = 0; i < 3; i++) {
		put_u16(env + n, (uint16_t)f[i]->len);
		if (f[i]->len)
			memcpy(env + n + 2, f[i]->ptr, f[i]->len);
		n += 2 + f[i]->len;
	}
	if (v >= 2) {
		env[n++] = e->ret;
		put_u16(env + n, (uint16_t)e->envid.len);
		if (e->envid.len)
			memcpy(env + n + 2, e->envid.ptr, e->envid.len);
		n += 2 + e->envid.len;
	}
	char ctl[QUEUE_CONTROL_LEN];
	memset(ctl, '-', sizeof(ctl));
	/* all three or none: the checksum state is kept to roll back with the buffer */
	size_t mark = w->out->len;
	XXH64_state_t saved = w->st;
	if (record(w, 'S', s, sizeof(s)) < 0 || record(w, 'E', env, n) < 0 ||
	    record(w, 'C', ctl, sizeof(ctl)) < 0) {
		buf_truncate(w->out, mark);
		w->st = saved;
		return -ENOBUFS;
	}
	w->version = v;
	return 0;
}

int queue_write_rcpt_dsn(struct queue_writer *w, struct str addr, unsigned notify,
			 struct str orcpt)
{
	if (addr.len == 0 || addr.len > QUEUE_MAX_ADDR || orcpt.len > QUEUE_MAX_ORCPT ||
	    !notify_ok(notify) || !orcpt_ok(orcpt) ||
	    (w->version < 2 && (notify || orcpt.len)))
		return -EINVAL;
	unsigned char r[4 + QUEUE_MAX_ORCPT + QUEUE_MAX_ADDR];
	r[0] = QUEUE_TODO;
	if (w->version < 2) {
		memcpy(r + 1, addr.ptr, addr.len);
		return record(w, 'R', r, 1 + addr.len);
	}
	r[1] = (unsigned char)notify;
	put_u16(r + 2, (uint16_t)orcpt.len);
	if (orcpt.len)
		memcpy(r + 4, orcpt.ptr, orcpt.len);
	memcpy(r + 4 + orcpt.len, addr.ptr, addr.len);
	return record(w, 'R', r, 4 + orcpt.len + addr.len);
}

int queue_write_rcpt(struct queue_writer *w, struct str addr)
{
	return queue_write_rcpt_dsn(w, addr, 0, STR_NULL);
}

int queue_write_body(struct queue_writer *w, struct str chunk)
{
	if (chunk.len == 0 || chunk.len > QUEUE_BODY_CHUNK)
		return -EINVAL;
	return record(w, 'B', chunk.ptr, chunk.len);
}

int queue_write_end(struct queue_writer *w)
{
	unsigned char d[8];
	put_u64(d, XXH64_digest(&w->st));
	return record(w, 'Z', d, sizeof(d));
}

/* ---- loading ---- */

void queue_index_clear(struct queue_index *ix)
{
	free(ix->rcpt);
	memset(ix, 0, sizeof(*ix));
}

static bool control_ok(const unsigned char *c)
{
	return (c[QUEUE_CTL_HOLD] == '-' || c[QUEUE_CTL_HOLD] == 'H') &&
	       (c[QUEUE_CTL_BOUNCE] == '-' || c[QUEUE_CTL_BOUNCE] == 'P' ||
		c[QUEUE_CTL_BOUNCE] == 'S') &&
	       (c[QUEUE_CTL_WARNED] == '-' || c[QUEUE_CTL_WARNED] == 'W');
}

static bool status_ok(unsigned char s, uint32_t v)
{
	return s == QUEUE_TODO || s == QUEUE_UNCERTAIN || s == QUEUE_DELIVERED || s == QUEUE_FAILED ||
	       (s == QUEUE_RELAYED && v >= 2);
}

/* The envelope record's payload into e (slices into p), of a file of version v. */
static int load_envelope(const unsigned char *p, size_t len, uint32_t v,
			 struct queue_envelope *e)
{
	if (len < QUEUE_ID_LEN + 20 + 6)
		return -EINVAL;
	memcpy(e->id, p, QUEUE_ID_LEN);
	e->id[QUEUE_ID_LEN] = '\0';
	if (!queue_id_valid(str_make(e->id, QUEUE_ID_LEN)))
		return -EINVAL;
	e->arrival_us = get_u64(p + QUEUE_ID_LEN);
	e->flags = get_u32(p + QUEUE_ID_LEN + 8);
	e->size = get_u64(p + QUEUE_ID_LEN + 12);
	size_t off = QUEUE_ID_LEN + 20;
	struct str *f[3] = { &e->sender, &e->client, &e->helo };
	for (int i = 0; i < 3; i++) {
		if (len - off < 2)
			return -EINVAL;
		size_t l = get_u16(p + off);
		if (len - off - 2 < l)
			return -EINVAL;
		*f[i] = str_make((const char *)p + off + 2, l);
		off += 2 + l;
	}
	e->ret = QUEUE_RET_NONE;
	e->envid = STR_NULL;
	if (v >= 2) {
		if (len - off < 3 || p[off] > QUEUE_RET_HDRS)
			return -EINVAL;
		e->ret = p[off];
		size_t l = get_u16(p + off + 1);
		if (len - off - 3 < l || l > QUEUE_MAX_ENVID)
			return -EINVAL;
		e->envid = str_make((const char *)p + off + 3, l);
		if (!printable(e->envid))
			return -EINVAL;
		off += 3 + l;
	}
	if (off != len || e->sender.len > QUEUE_MAX_ADDR ||
	    e->client.len + e->helo.len > QUEUE_MAX_CLIENT)
		return -EINVAL;
	return 0;
}

/* A recipient record's payload (len >= 1, q[0] its status) past the status byte. */
static bool load_rcpt(const unsigned char *q, size_t len, uint32_t v, struct queue_rcpt *rc)
{
	size_t off = 1;
	rc->notify = 0;
	rc->orcpt = STR_NULL;
	if (v >= 2) {
		if (len < 4)
			return false;
		size_t l = get_u16(q + 2);
		if (l > QUEUE_MAX_ORCPT || len - 4 < l || !notify_ok(q[1]))
			return false;
		rc->notify = q[1];
		rc->orcpt = str_make((const char *)q + 4, l);
		if (!orcpt_ok(rc->orcpt))
			return false; /* its addr-type goes raw into RCPT to the next hop */
		off = 4 + l;
	}
	if (len - off < 1 || len - off > QUEUE_MAX_ADDR)
		return false;
	rc->addr = str_make((const char *)q + off, len - off);
	return true;
}

int queue_file_load(const void *image, size_t n, struct queue_index *ret, const char **why)
{
	const unsigned char *p = image;
	struct queue_index ix;
	memset(&ix, 0, sizeof(ix));
	size_t cap = 0, off = 0;
	int state = 0; /* 0 start, 1 envelope, 2 control, 3 recipients, 4 body, 5 end */
	XXH64_state_t st;
	XXH64_reset(&st, 0);
	*why = NULL;
	while (off < n) {
		if (state == 5) {
			*why = "bytes after the end record";
			goto bad;
		}
		if (n - off < HDR) {
			*why = "a record header cut short";
			goto bad;
		}
		char type = (char)p[off];
		size_t len = get_u32(p + off + 1);
		if (n - off - HDR < len) {
			*why = "a record running past the end of the file";
			goto bad;
		}
		const unsigned char *q = p + off + HDR;
		switch (type) {
		case 'S':
			if (state != 0 || len != 12 || memcmp(q, MAGIC, 8) != 0 ||
			    (get_u32(q + 8) != VERSION && get_u32(q + 8) != VERSION_1)) {
				*why = "not a sluice queue file of a version this build reads";
				goto bad;
			}
			ix.version = get_u32(q + 8);
			state = 1;
			break;
		case 'E':
			if (state != 1 || load_envelope(q, len, ix.version, &ix.env) < 0) {
				*why = "a bad or misplaced envelope record";
				goto bad;
			}
			state = 2;
			break;
		case 'C':
			if (state != 2 || len != QUEUE_CONTROL_LEN || !control_ok(q)) {
				*why = "a bad or misplaced control record";
				goto bad;
			}
			ix.control_off = off + HDR;
			memcpy(ix.control, q, QUEUE_CONTROL_LEN);
			state = 3;
			break;
		case 'R': {
			struct queue_rcpt rc;
			if (state != 3 || len < 2 || !status_ok(q[0], ix.version) ||
			    !load_rcpt(q, len, ix.version, &rc)) {
				*why = "a bad or misplaced recipient record";
				goto bad;
			}
			if (ix.nrcpt == QUEUE_MAX_RECIPIENTS) {
				*why = "more recipients than a message may have";
				goto bad;
			}
			if (ix.nrcpt == cap) {
				/* doubling: 10,000 recipients cost 14 reallocations, not 10,000 */
				size_t nc = cap ? cap * 2 : 16;
				struct queue_rcpt *r = realloc(ix.rcpt, nc * sizeof(*r));
				if (!r) {
					queue_index_clear(&ix);
					return -ENOMEM;
				}
				ix.rcpt = r;
				cap = nc;
			}
			rc.status_off = off + HDR;
			rc.status = (char)q[0];
			ix.rcpt[ix.nrcpt++] = rc;
			break;
		}
		case 'B':
			if ((state != 3 && state != 4) || ix.nrcpt == 0 || len == 0 ||
			    len > QUEUE_BODY_CHUNK) {
				*why = "a bad or misplaced body record";
				goto bad;
			}
			if (state == 3)
				ix.body_first = off;
			state = 4;
			ix.body_len += len;
			ix.nbody++;
			break;
		case 'Z':
			if (state < 3 || ix.nrcpt == 0 || len != 8) {
				*why = "a bad or misplaced end record";
				goto bad;
			}
			if (get_u64(q) != XXH64_digest(&st)) {
				*why = "the checksum does not match";
				goto bad;
			}
			state = 5;
			break;
		default:
			*why = "an unknown record type";
			goto bad;
		}
		if (type != 'Z')
			hash_record(&st, p + off, len);
		off += HDR + len;
	}
	if (state != 5) {
		*why = "no end record: the file is incomplete";
		goto bad;
	}
	*ret = ix;
	return 0;
bad:
	queue_index_clear(&ix);
	return -EINVAL;
}

int queue_file_body(const void *image, size_t n, const struct queue_index *ix,
		    int (*fn)(void *arg, struct str chunk), void *arg)
{
	const unsigned char *p = image;
	if (!ix->body_first)
		return 0;
	size_t off = ix->body_first;
	while (off + HDR <= n && p[off] == 'B') {
		size_t len = get_u32(p + off + 1);
		int r = fn(arg, str_make((const char *)p + off + HDR, len));
		if (r < 0)
			return r;
		off += HDR + len;
	}
	return 0;
}
