/*
 * test_queue_file -- the queue's message file (src/queue/queue_file.c): queue IDs, a
 * file written and indexed back, the offsets a status change writes to, and every way a
 * file is refused (incomplete, damaged, out of order).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "queue_file.h"
#include "util.h"

static void test_ids(void **state)
{
	(void)state;
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1], c[QUEUE_ID_LEN + 1];
	uint64_t t = 1795309607134392ULL;
	queue_id_make(a, t, 1);
	queue_id_make(b, t, 2);
	queue_id_make(c, t + 1, 0);
	assert_int_equal(strlen(a), QUEUE_ID_LEN);
	assert_true(strcmp(a, b) < 0 && strcmp(b, c) < 0); /* sorted by arrival, then seq */
	assert_true(queue_id_valid(str_cstr(a)));
	assert_true(queue_id_time_us(a) == t && queue_id_time_us(c) == t + 1);
	/* the sequence wraps at 28 bits and never reaches into the time */
	queue_id_make(b, t, 0xFFFFFFFFu);
	assert_true(queue_id_time_us(b) == t);
	assert_true(strcmp(a, b) < 0 && strcmp(b, c) < 0);
	for (const char *p = a; *p; p++)
		assert_non_null(strchr("0123456789ABCDEFGHJKMNPQRSTVWXYZ", *p));
	static const char *const bad[] = { "", "0123456789ABCDE", "0123456789ABCDEFG",
					   "0123456789ABCDEI", "0123456789abcdef",
					   "0123456789ABCD/F" };
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		assert_false(queue_id_valid(str_cstr(bad[i])));
}

/* Without a DSN parameter a file is written in version 1, which a build before version 2
 * reads (a downgrade strands nothing); RET, ENVID or a recipient's NOTIFY/ORCPT make it
 * version 2, and a version 1 writer refuses a recipient's DSN parameters. */
static void test_version_written(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 1 << 16);
	struct queue_envelope e = { .arrival_us = 1795309607134392ULL, .sender = str_cstr("a@b.example"),
				    .client = str_cstr("[192.0.2.1]"), .helo = str_cstr("h") };
	queue_id_make(e.id, e.arrival_us, 1);
	static const struct { uint8_t ret; const char *envid; bool rcpt_dsn; uint32_t v; } cases[] = {
		{ QUEUE_RET_NONE, "", false, 1 }, { QUEUE_RET_FULL, "", false, 2 },
		{ QUEUE_RET_NONE, "x", false, 2 }, { QUEUE_RET_NONE, "", true, 2 },
	};
	for (size_t k = 0; k < ARRAY_SIZE(cases); k++) {
		buf_reset(&b);
		e.ret = cases[k].ret;
		e.envid = str_cstr(cases[k].envid);
		e.rcpt_dsn = cases[k].rcpt_dsn;
		struct queue_writer *w = queue_writer_new(&b);
		assert_int_equal(queue_write_head(w, &e), 0);
		assert_int_equal(queue_write_rcpt_dsn(w, str_cstr("x@c.example"), QUEUE_NOTIFY_NEVER,
						      STR_NULL), cases[k].v == 1 ? -EINVAL : 0);
		assert_int_equal(queue_write_rcpt_dsn(w, str_cstr("y@c.example"), 0,
						      str_cstr("rfc822;o@c.example")),
				 cases[k].v == 1 ? -EINVAL : 0);
		assert_int_equal(queue_write_rcpt(w, str_cstr("z@c.example")), 0);
		assert_int_equal(queue_write_end(w), 0);
		queue_writer_free(w);
		struct queue_index ix;
		const char *why;
		assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
		assert_int_equal(ix.version, cases[k].v);
		assert_int_equal(ix.env.ret, cases[k].ret);
		assert_true(str_eq_cstr(ix.env.envid, cases[k].envid));
		assert_int_equal(ix.nrcpt, cases[k].v == 1 ? 1 : 3);
		assert_true(str_eq_cstr(ix.rcpt[ix.nrcpt - 1].addr, "z@c.example"));
		/* a version 1 file is byte for byte the old layout: S says 1, R is status+address */
		if (cases[k].v == 1)
			assert_int_equal(b.ptr[ix.rcpt[0].status_off + 1], 'z');
		queue_index_clear(&ix);
	}
	buf_done(&b);
}

/* A whole file: head, n recipients, body split into chunks, end. */
static void build(struct buf *b, size_t nrcpt, const char *body)
{
	struct queue_envelope e = { .arrival_us = 1795309607134392ULL,
				    .sender = str_cstr("list@example.org"),
				    .client = str_cstr("mx [192.0.2.1]"), .helo = str_cstr("mx.example"),
				    .flags = QUEUE_8BITMIME, .size = 4096 };
	queue_id_make(e.id, e.arrival_us, 7);
	buf_reset(b);
	struct queue_writer *w = queue_writer_new(b);
	assert_non_null(w);
	assert_int_equal(queue_write_head(w, &e), 0);
	for (size_t i = 0; i < nrcpt; i++) {
		char r[64];
		snprintf(r, sizeof(r), "user%zu@example.net", i);
		assert_int_equal(queue_write_rcpt(w, str_cstr(r)), 0);
	}
	size_t len = strlen(body);
	for (size_t off = 0; off < len; off += 5)
		assert_int_equal(queue_write_body(w, str_make(body + off, len - off < 5 ? len - off : 5)), 0);
	assert_int_equal(queue_write_end(w), 0);
	queue_writer_free(w);
}

static int collect(void *arg, struct str chunk)
{
	struct buf *out = arg;
	return buf_append_str(out, chunk);
}

static void test_round_trip(void **state)
{
	(void)state;
	struct buf b, body;
	buf_init(&b, 1 << 24);
	buf_init(&body, 1 << 20);
	const char *text = "Subject: hello\r\n\r\nThe list post.\r\n";
	build(&b, 3, text);
	struct queue_index ix;
	const char *why;
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
	assert_int_equal(ix.nrcpt, 3);
	assert_true(str_eq_cstr(ix.env.sender, "list@example.org"));
	assert_true(str_eq_cstr(ix.env.helo, "mx.example"));
	assert_true(ix.env.flags == QUEUE_8BITMIME && ix.env.size == 4096);
	assert_true(ix.env.arrival_us == queue_id_time_us(ix.env.id));
	assert_true(str_eq_cstr(ix.rcpt[2].addr, "user2@example.net"));
	assert_int_equal(ix.body_len, strlen(text));
	assert_int_equal(queue_file_body(b.ptr, b.len, &ix, collect, &body), 0);
	assert_int_equal(body.len, strlen(text));
	assert_memory_equal(body.ptr, text, body.len);
	/* the indexed offsets are where the status bytes are (test_refusals changes them
	 * in place and loads the file again) */
	for (size_t i = 0; i < ix.nrcpt; i++) {
		assert_int_equal(b.ptr[ix.rcpt[i].status_off], 'T');
		assert_int_equal(ix.rcpt[i].status, 'T');
	}
	assert_int_equal(b.ptr[ix.control_off + QUEUE_CTL_HOLD], '-');
	queue_index_clear(&ix);
	buf_done(&b);
	buf_done(&body);
}

static void test_many_recipients(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 1 << 26);
	build(&b, 10000, "x\r\n");
	struct queue_index ix;
	const char *why;
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
	assert_int_equal(ix.nrcpt, 10000);
	assert_true(str_eq_cstr(ix.rcpt[9999].addr, "user9999@example.net"));
	queue_index_clear(&ix);
	buf_done(&b);
}

static void expect_refused(const void *p, size_t n, const char *needle)
{
	struct queue_index ix;
	const char *why = NULL;
	int r = queue_file_load(p, n, &ix, &why);
	if (r != -EINVAL || !why || !strstr(why, needle))
		fail_msg("expected a refusal with \"%s\", got %d (%s)", needle, r, why ? why : "");
}

static void test_refusals(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 1 << 20);
	build(&b, 2, "body\r\n");
	/* every cut short of the whole file is refused */
	for (size_t n = 0; n < b.len; n++) {
		struct queue_index ix;
		const char *why;
		assert_int_equal(queue_file_load(b.ptr, n, &ix, &why), -EINVAL);
	}
	expect_refused(b.ptr, b.len - 1, "running past");
	/* a byte changed in the envelope: the checksum */
	b.ptr[30] ^= 1;
	expect_refused(b.ptr, b.len, "");
	b.ptr[30] ^= 1;
	/* an unknown status byte */
	struct queue_index ix;
	const char *why;
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
	uint64_t so = ix.rcpt[0].status_off;
	uint64_t co = ix.control_off;
	queue_index_clear(&ix);
	b.ptr[so] = 'X';
	expect_refused(b.ptr, b.len, "recipient");
	b.ptr[so] = 'D';
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
	assert_int_equal(ix.rcpt[0].status, 'D');
	queue_index_clear(&ix);
	b.ptr[co] = '?';
	expect_refused(b.ptr, b.len, "control");
	b.ptr[co] = 'H';
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
	assert_int_equal(ix.control[QUEUE_CTL_HOLD], 'H');
	queue_index_clear(&ix);
	/* bytes after the end */
	buf_append(&b, "x", 1);
	expect_refused(b.ptr, b.len, "after the end");
	/* not a queue file */
	expect_refused("SMTP", 4, "cut short");
	expect_refused("S\x0c\0\0\0SLUICEQ9\1\0\0\0", 17, "version");
	buf_done(&b);
}

static void test_writer_limits(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 1 << 20);
	struct queue_writer *w = queue_writer_new(&b);
	char big[QUEUE_MAX_ADDR + 2];
	memset(big, 'a', sizeof(big));
	assert_int_equal(queue_write_rcpt(w, str_make(big, QUEUE_MAX_ADDR + 1)), -EINVAL);
	assert_int_equal(queue_write_rcpt(w, str_make(big, 0)), -EINVAL);
	assert_int_equal(queue_write_body(w, str_make(big, 0)), -EINVAL);
	assert_int_equal(b.len, 0);
	queue_writer_free(w);
	/* a full buffer leaves no half record */
	struct buf small;
	char mem[8];
	buf_init_fixed(&small, mem, sizeof(mem));
	w = queue_writer_new(&small);
	assert_int_equal(queue_write_rcpt(w, str_cstr("a@b")), -ENOBUFS);
	assert_int_equal(small.len, 0);
	queue_writer_free(w);
	buf_done(&b);
}


/* Version 2 keeps the DSN parameters: RET and ENVID in the envelope, NOTIFY and ORCPT per
 * recipient; their limits are refused when writing. */
static void test_dsn_fields(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 1 << 20);
	struct queue_envelope e = { .arrival_us = 1795309607134392ULL, .sender = str_cstr("a@b.example"),
				    .client = str_cstr("[192.0.2.1]"), .helo = str_cstr("h"),
				    .ret = QUEUE_RET_HDRS, .envid = str_cstr("QQ+314159") };
	queue_id_make(e.id, e.arrival_us, 1);
	struct queue_writer *w = queue_writer_new(&b);
	assert_int_equal(queue_write_head(w, &e), 0);
	assert_int_equal(queue_write_rcpt_dsn(w, str_cstr("x@c.example"), QUEUE_NOTIFY_NEVER,
					      str_cstr("rfc822;old@c.example")), 0);
	assert_int_equal(queue_write_rcpt(w, str_cstr("y@c.example")), 0);
	assert_int_equal(queue_write_rcpt_dsn(w, str_cstr("z@c.example"),
					      QUEUE_NOTIFY_SUCCESS | QUEUE_NOTIFY_DELAY, STR_NULL), 0);
	char big[QUEUE_MAX_ORCPT + 2];
	memset(big, 'o', sizeof(big));
	assert_int_equal(queue_write_rcpt_dsn(w, str_cstr("q@c.example"), 0,
					      str_make(big, QUEUE_MAX_ORCPT + 1)), -EINVAL);
	assert_int_equal(queue_write_body(w, str_cstr("Subject: x\r\n\r\nbody\r\n")), 0);
	assert_int_equal(queue_write_end(w), 0);
	queue_writer_free(w);
	struct queue_index ix;
	const char *why;
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
	assert_int_equal(ix.version, 2);
	assert_int_equal(ix.env.ret, QUEUE_RET_HDRS);
	assert_true(str_eq_cstr(ix.env.envid, "QQ+314159"));
	assert_int_equal(ix.nrcpt, 3);
	assert_int_equal(ix.rcpt[0].notify, QUEUE_NOTIFY_NEVER);
	assert_true(str_eq_cstr(ix.rcpt[0].orcpt, "rfc822;old@c.example"));
	assert_true(str_eq_cstr(ix.rcpt[0].addr, "x@c.example"));
	assert_int_equal(ix.rcpt[1].notify, 0);
	assert_int_equal(ix.rcpt[1].orcpt.len, 0);
	assert_int_equal(ix.rcpt[2].notify, QUEUE_NOTIFY_SUCCESS | QUEUE_NOTIFY_DELAY);
	for (size_t i = 0; i < ix.nrcpt; i++)
		assert_int_equal(b.ptr[ix.rcpt[i].status_off], 'T');
	/* an ORCPT length running past its record is refused by the record's check, before
	 * the checksum is looked at */
	b.ptr[ix.rcpt[1].status_off + 2] = 0x7f;
	queue_index_clear(&ix);
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), -EINVAL);
	assert_string_equal(why, "a bad or misplaced recipient record");
	/* an ENVID over its limit is not written */
	buf_reset(&b);
	w = queue_writer_new(&b);
	e.envid = str_make(big, QUEUE_MAX_ENVID + 1);
	assert_int_equal(queue_write_head(w, &e), -EINVAL);
	queue_writer_free(w);
	buf_done(&b);
}

static void put_rec(struct buf *b, XXH64_state_t *st, char type, const void *p, size_t len,
		    size_t zero)
{
	unsigned char h[5] = { (unsigned char)type, (unsigned char)len, (unsigned char)(len >> 8),
			       (unsigned char)(len >> 16), (unsigned char)(len >> 24) };
	assert_int_equal(buf_append(b, h, 5), 0);
	assert_int_equal(buf_append(b, p, len), 0);
	static const unsigned char z[8];
	XXH64_update(st, h, 5);
	XXH64_update(st, z, zero);
	XXH64_update(st, (const unsigned char *)p + zero, len - zero);
}

/* Start, envelope and control records of a file of version v, written by hand; tail
 * ends the envelope (version 2: RET and ENVID). */
static void put_head(struct buf *b, XXH64_state_t *st, unsigned v, uint32_t seq,
		     const void *tail, size_t ntail)
{
	XXH64_reset(st, 0);
	unsigned char s[12] = "SLUICEQ1";
	s[8] = (unsigned char)v;
	put_rec(b, st, 'S', s, 12, 0);
	unsigned char env[QUEUE_ID_LEN + 20 + 6 + 64 + 3 + QUEUE_MAX_ENVID] = { 0 };
	char id[QUEUE_ID_LEN + 1];
	queue_id_make(id, 1795309607134392ULL, seq);
	memcpy(env, id, QUEUE_ID_LEN);
	size_t n = QUEUE_ID_LEN + 20;
	const char *f[3] = { "old@b.example", "[192.0.2.1]", "h" };
	for (int i = 0; i < 3; i++) {
		env[n] = (unsigned char)strlen(f[i]);
		memcpy(env + n + 2, f[i], strlen(f[i]));
		n += 2 + strlen(f[i]);
	}
	if (ntail)
		memcpy(env + n, tail, ntail);
	put_rec(b, st, 'E', env, n + ntail, 0);
	put_rec(b, st, 'C', "--------", 8, 8);
}

/* A body record and the end record with the checksum of everything before it. */
static void put_end(struct buf *b, XXH64_state_t *st)
{
	put_rec(b, st, 'B', "Subject: x\r\n\r\n", 14, 0);
	uint64_t d = XXH64_digest(st);
	unsigned char z[13] = { 'Z', 8, 0, 0, 0 };
	for (int i = 0; i < 8; i++)
		z[5 + i] = (unsigned char)(d >> (8 * i));
	assert_int_equal(buf_append(b, z, 13), 0);
}

/* A file of version 1, written as sluice wrote it before version 2, still loads: no DSN
 * parameters, its recipients' status bytes where they are. */
static void test_version_1(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 1 << 20);
	XXH64_state_t st;
	put_head(&b, &st, 1, 3, "", 0);
	put_rec(&b, &st, 'R', "Tr1@c.example", 13, 1);
	put_rec(&b, &st, 'R', "Fr2@c.example", 13, 1);
	put_end(&b, &st);
	struct queue_index ix;
	const char *why = NULL;
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
	assert_int_equal(ix.version, 1);
	assert_true(str_eq_cstr(ix.env.sender, "old@b.example"));
	assert_int_equal(ix.env.ret, QUEUE_RET_NONE);
	assert_int_equal(ix.env.envid.len, 0);
	assert_int_equal(ix.nrcpt, 2);
	assert_true(str_eq_cstr(ix.rcpt[1].addr, "r2@c.example"));
	assert_int_equal(ix.rcpt[1].status, 'F');
	assert_int_equal(ix.rcpt[1].notify, 0);
	assert_int_equal(ix.rcpt[1].orcpt.len, 0);
	assert_int_equal(b.ptr[ix.rcpt[0].status_off], 'T');
	uint64_t off0 = ix.rcpt[0].status_off;
	queue_index_clear(&ix);
	/* a status N (delivered, relayed notice owed) is refused in version 1: the byte is
	 * outside the checksum, so the refusal is the status check's */
	b.ptr[off0] = 'N';
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), -EINVAL);
	assert_string_equal(why, "a bad or misplaced recipient record");
	b.ptr[off0] = 'T';
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), 0);
	queue_index_clear(&ix);
	/* version 3 is not read: refused by the start record's check, not the checksum */
	b.ptr[5 + 8] = 3;
	assert_int_equal(queue_file_load(b.ptr, b.len, &ix, &why), -EINVAL);
	assert_string_equal(why, "not a sluice queue file of a version this build reads");
	buf_done(&b);
}

/* A version 2 file with one recipient of the given status, NOTIFY and ORCPT, and the given
 * ENVID, written record by record (not by the writer, which refuses bad values) with a
 * right checksum: what the loader says of it. */
static int load_v2(char status, unsigned notify, struct str orcpt, struct str envid,
		   const char **why)
{
	struct buf b;
	buf_init(&b, 1 << 20);
	XXH64_state_t st;
	unsigned char tail[3 + QUEUE_MAX_ENVID] = { QUEUE_RET_HDRS, (unsigned char)envid.len, 0 };
	if (envid.len)
		memcpy(tail + 3, envid.ptr, envid.len);
	put_head(&b, &st, 2, 4, tail, 3 + envid.len);
	unsigned char r[4 + QUEUE_MAX_ORCPT + 16] = { (unsigned char)status, (unsigned char)notify,
						      (unsigned char)orcpt.len, 0 };
	if (orcpt.len)
		memcpy(r + 4, orcpt.ptr, orcpt.len);
	memcpy(r + 4 + orcpt.len, "r@c.example", 11);
	put_rec(&b, &st, 'R', r, 4 + orcpt.len + 11, 1);
	put_end(&b, &st);
	struct queue_index ix;
	*why = NULL;
	int rc = queue_file_load(b.ptr, b.len, &ix, why);
	if (rc == 0) {
		assert_int_equal(ix.rcpt[0].status, status);
		queue_index_clear(&ix);
	}
	buf_done(&b);
	return rc;
}

/* What the DSN fields and the status byte may hold, checked by the loader on a file whose
 * checksum is right (a crafted or damaged file: an ORCPT's addr-type goes raw into RCPT
 * to the next hop), and by the writer, which never writes what the loader refuses. */
static void test_dsn_field_contents(void **state)
{
	(void)state;
	const char *why;
	const struct str rfc = str_cstr("rfc822;old@c.example"), none = STR_NULL;
	/* good: N, the NOTIFY sets, an ORCPT with a space, an ENVID with spaces */
	assert_int_equal(load_v2('N', QUEUE_NOTIFY_SUCCESS, rfc, str_cstr("a  b "), &why), 0);
	assert_int_equal(load_v2('D', QUEUE_NOTIFY_NEVER, none, none, &why), 0);
	assert_int_equal(load_v2('T', 0, str_cstr("x-t;a b"), none, &why), 0);
	assert_int_equal(load_v2('F', QUEUE_NOTIFY_SUCCESS | QUEUE_NOTIFY_FAILURE |
				      QUEUE_NOTIFY_DELAY, rfc, str_cstr("~"), &why), 0);
	/* bad recipients */
	static const struct { char status; unsigned notify; const char *orcpt; } bad_rcpt[] = {
		{ 'X', 0, "" },
		{ 'T', QUEUE_NOTIFY_NEVER | QUEUE_NOTIFY_SUCCESS, "" },
		{ 'T', 0x10, "" },
		{ 'T', 0x80 | QUEUE_NOTIFY_FAILURE, "" },
		{ 'T', 0, "rfc822" },              /* no ';' */
		{ 'T', 0, ";a@b" },                /* no addr-type */
		{ 'T', 0, "rfc822;" },             /* no address */
		{ 'T', 0, "rfc 822;a@b" },         /* a space in the addr-type */
		{ 'T', 0, "rfc822\r\nDATA;a@b" },  /* command injection */
		{ 'T', 0, "rfc822;a@b\r\nQUIT" },
		{ 'T', 0, "rfc822;a\x80@b" },
		{ 'T', 0, "rfc<822>;a@b" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad_rcpt); i++) {
		assert_int_equal(load_v2(bad_rcpt[i].status, bad_rcpt[i].notify,
					 str_cstr(bad_rcpt[i].orcpt), none, &why), -EINVAL);
		assert_string_equal(why, "a bad or misplaced recipient record");
	}
	static const char *const bad_envid[] = { "a\r\nb", "\t", "x\x7f", "\xc3\xa9" };
	for (size_t i = 0; i < ARRAY_SIZE(bad_envid); i++) {
		assert_int_equal(load_v2('T', 0, none, str_cstr(bad_envid[i]), &why), -EINVAL);
		assert_string_equal(why, "a bad or misplaced envelope record");
	}
	/* the writer refuses the same */
	struct buf b;
	buf_init(&b, 1 << 16);
	struct queue_envelope e = { .arrival_us = 1795309607134392ULL, .sender = str_cstr("a@b.example"),
				    .envid = str_cstr("a\r\nb") };
	queue_id_make(e.id, e.arrival_us, 1);
	struct queue_writer *w = queue_writer_new(&b);
	assert_int_equal(queue_write_head(w, &e), -EINVAL);
	e.envid = str_cstr("a  b");
	assert_int_equal(queue_write_head(w, &e), 0);
	for (size_t i = 0; i < ARRAY_SIZE(bad_rcpt); i++)
		if (bad_rcpt[i].status == 'T')
			assert_int_equal(queue_write_rcpt_dsn(w, str_cstr("r@c.example"),
							      bad_rcpt[i].notify,
							      str_cstr(bad_rcpt[i].orcpt)), -EINVAL);
	assert_int_equal(queue_write_rcpt_dsn(w, str_cstr("r@c.example"), QUEUE_NOTIFY_DELAY, rfc), 0);
	queue_writer_free(w);
	buf_done(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ids),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_dsn_fields),
		cmocka_unit_test(test_version_1),
		cmocka_unit_test(test_version_written),
		cmocka_unit_test(test_dsn_field_contents),
		cmocka_unit_test(test_many_recipients),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_writer_limits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
