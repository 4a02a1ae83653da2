/*
 * fuzz_dsn -- the DSN formatter (dsn_format() in src/queue/dsn.c) on hostile peer text.
 *
 * Input: byte 0 holds flags (below), byte 1 the size of the body chunks (0: one chunk),
 * byte 2 picks a status (bits 0-4) and holds more flags (bits 5-7, X_ below); the rest is split at 0xFF bytes into the diagnostic, the remote
 * MTA, a recipient address and the original message body (which may hold 0xFF itself).
 *
 * Every report formatted must be: CRLF lines only, no bare CR or LF, no NUL, no line over
 * 998 octets; a top header of fields and folded lines that ends at the first empty line
 * and names the boundary; that boundary beginning exactly four lines -- three delimiters
 * and the closing one, which is the last line; parts 1 and 2 in US-ASCII, with exactly
 * one Final-Recipient and one Action line per recipient in part 2.  The same report must
 * come out whatever the chunking of the body, and again when asked twice.  With the
 * "plant" flag, the boundary of a first report is written into the original headers: the
 * second report must choose another.  A refused address must be -EINVAL, a small buffer
 * -ENOBUFS with the buffer untouched.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                          \
	do {                                                                               \
		if (!(x)) {                                                                \
			fprintf(stderr, "fuzz_dsn: %s:%d: check failed: %s\n", __FILE__,   \
				__LINE__, #x);                                             \
			abort();                                                           \
		}                                                                          \
	} while (0)

enum {
	F_NRCPT = 3,          /* bits 0-1: 1 to 4 recipients */
	F_DELAYED = 1 << 2,   /* odd recipients are delayed, or all when F_NRCPT is 0 */
	F_REASON = 1 << 3,    /* the diagnostic is also the reason */
	F_SMALL = 1 << 4,     /* an output buffer of a few hundred bytes */
	F_PLANT = 1 << 5,     /* plant the first report's boundary in the headers */
	F_TIMES = 1 << 6,     /* arrival and last attempt dates */
	F_SENDER = 1 << 7,    /* the address field is also the sender (empty: the null one) */
};

enum {
	X_FULL = 1 << 5,      /* RET=FULL: the whole message may be returned */
	X_DSN_FIELDS = 1 << 6, /* the remote MTA is also the ENVID, the diagnostic each ORCPT */
	X_RELAYED = 1 << 7,   /* recipients that are not delayed are relayed after the first */
};

#define OUT_MAX (4 * 1024 * 1024)

static const char *const statuses[] = { "", "5.1.1", "4.4.7", "2.0.0", "9.9.9", "5.1",
					"5.1.1.1", "4.7.1 extra", "5.999.999", "5.1234.1" };

#define NSTATUS (sizeof(statuses) / sizeof(statuses[0]))

struct input {
	struct dsn_info info;
	struct dsn_rcpt rcpt[4];
	size_t n;
	struct str body;
	size_t step;
};

static bool addr_ok(struct str a)
{
	if (a.len == 0 || a.len > QUEUE_MAX_ADDR)
		return false;
	for (size_t i = 0; i < a.len; i++)
		if ((unsigned char)a.ptr[i] < 0x20 || (unsigned char)a.ptr[i] == 0x7f)
			return false;
	return true;
}

/* Format with the body cut into chunks of step bytes (0: one chunk). */
static int format(const struct input *in, struct str body, size_t step, struct buf *out)
{
	size_t n = step && body.len ? (body.len + step - 1) / step : 1;
	struct str *chunks = malloc(n * sizeof(*chunks));
	CHECK(chunks);
	if (step && body.len) {
		for (size_t i = 0; i < n; i++) {
			size_t off = i * step;
			size_t len = body.len - off < step ? body.len - off : step;
			chunks[i] = str_make(body.ptr + off, len);
		}
	} else {
		chunks[0] = body;
	}
	int r = dsn_format(&in->info, in->rcpt, in->n, chunks, n, out);
	free(chunks);
	return r;
}

static size_t line_end(const char *p, size_t n, size_t i)
{
	const char *e = memchr(p + i, '\n', n - i);
	CHECK(e); /* every line ends in CRLF */
	return (size_t)(e - p) + 1;
}

static bool starts(const char *p, size_t n, const char *prefix)
{
	size_t l = strlen(prefix);
	return n >= l && memcmp(p, prefix, l) == 0;
}

/* The checks of the file's comment; returns the boundary into b (<= 70 bytes). */
static void check_report(struct str s, size_t nrcpt, char b[71])
{
	/* lines */
	size_t col = 0;
	for (size_t i = 0; i < s.len; i++) {
		CHECK(s.ptr[i] != '\0');
		if (s.ptr[i] == '\r') {
			CHECK(i + 1 < s.len && s.ptr[i + 1] == '\n');
			CHECK(col <= 998);
			col = 0;
			i++;
		} else {
			CHECK(s.ptr[i] != '\n');
			col++;
		}
	}
	CHECK(col == 0);
	CHECK(starts(s.ptr, s.len, "Date: "));

	/* the top header: fields and folded lines up to the empty line; the boundary */
	size_t i = 0, blen = 0;
	bool in_ct = false, in_to = false;
	for (;;) {
		CHECK(i < s.len);
		size_t end = line_end(s.ptr, s.len, i);
		const char *l = s.ptr + i;
		size_t len = end - i - 2;
		i = end;
		if (len == 0)
			break;
		if (l[0] == ' ' || l[0] == '\t') {
			bool text = false; /* a folded line is not white space only */
			for (size_t k = 1; k < len; k++)
				text |= l[k] != ' ' && l[k] != '\t';
			CHECK(text);
		} else {
			const char *colon = memchr(l, ':', len);
			CHECK(colon && colon > l);
			for (const char *k = l; k < colon; k++)
				CHECK(*k > ' ' && *k < 0x7f);
			in_ct = starts(l, len, "Content-Type:");
			in_to = starts(l, len, "To:");
		}
		/* US-ASCII, but for the sender in To: (kept in UTF-8, RFC 6532) */
		for (size_t k = 0; k < len && !in_to; k++)
			CHECK((unsigned char)l[k] < 0x80);
		const char *bp = NULL;
		for (size_t k = 0; in_ct && k + 10 <= len; k++)
			if (memcmp(l + k, "boundary=\"", 10) == 0)
				bp = l + k + 10;
		if (bp) {
			const char *q = memchr(bp, '"', len - (size_t)(bp - l));
			CHECK(q && q > bp && q - bp <= 70);
			blen = (size_t)(q - bp);
			memcpy(b, bp, blen);
			b[blen] = '\0';
		}
	}
	CHECK(blen > 0);

	/* the boundary begins exactly the four delimiter lines, the close last */
	char delim[80];
	snprintf(delim, sizeof(delim), "--%s", b);
	size_t dl = blen + 2, seen = 0, ds_start = 0, ds_end = 0;
	for (size_t k = i; k < s.len;) {
		size_t end = line_end(s.ptr, s.len, k);
		const char *l = s.ptr + k;
		size_t len = end - k - 2;
		if (starts(l, len, delim)) {
			seen++;
			if (seen < 4) {
				CHECK(len == dl);
			} else {
				CHECK(len == dl + 2 && l[dl] == '-' && l[dl + 1] == '-');
				CHECK(end == s.len);
			}
			if (seen == 2)
				ds_start = end;
			if (seen == 3)
				ds_end = k;
		}
		/* parts 1 and 2 are US-ASCII */
		if (seen >= 1 && seen <= 2)
			for (size_t j = 0; j < len; j++)
				CHECK((unsigned char)l[j] < 0x80);
		k = end;
	}
	CHECK(seen == 4);

	/* one Final-Recipient and one Action per recipient in the delivery-status part */
	size_t fr = 0, act = 0;
	for (size_t k = ds_start; k < ds_end;) {
		size_t end = line_end(s.ptr, s.len, k);
		if (starts(s.ptr + k, end - k, "Final-Recipient:"))
			fr++;
		if (starts(s.ptr + k, end - k, "Action:"))
			act++;
		k = end;
	}
	CHECK(fr == nrcpt && act == nrcpt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 3)
		return 0;
	unsigned flags = data[0];
	struct input in = {
		.info = {
			.reporting_mta = str_cstr("relay.example.com"),
			.sender = str_cstr("list@example.org"),
			.queue_id = str_cstr("0QG7S2Q8K2A00007"),
			.now_us = 1795309607134392ULL,
			.boundary_seed = str_cstr("0QG7S2Q8K2A00007"),
		},
		.n = (flags & F_NRCPT) + 1,
		.step = data[1],
	};
	const char *p = (const char *)data + 3;
	size_t rest = size - 3;
	struct str field[3];
	for (int k = 0; k < 3; k++) {
		const char *e = memchr(p, 0xff, rest);
		size_t len = e ? (size_t)(e - p) : rest;
		field[k] = str_make(p, len);
		p += e ? len + 1 : len;
		rest -= e ? len + 1 : len;
	}
	struct str body = str_make(p, rest);
	struct str addr = field[2].len ? field[2] : str_cstr("user@example.net");
	if (flags & F_REASON)
		in.info.reason = field[0];
	if (flags & F_TIMES)
		in.info.arrival_us = in.info.now_us - 86400000000ULL;
	if (flags & F_SENDER)
		in.info.sender = field[2];
	unsigned xflags = data[2];
	in.info.full = (xflags & X_FULL) != 0;
	if (xflags & X_DSN_FIELDS)
		in.info.envid = field[1];
	for (size_t k = 0; k < in.n; k++) {
		enum dsn_action a = (flags & F_DELAYED) && (k % 2 == 1 || in.n == 1) ? DSN_DELAYED
										   : DSN_FAILED;
		if (a == DSN_FAILED && k > 0 && (xflags & X_RELAYED))
			a = DSN_RELAYED;
		in.rcpt[k] = (struct dsn_rcpt){
			.addr = k == 0 ? addr : str_cstr("other@example.net"),
			.action = a,
			.orcpt = xflags & X_DSN_FIELDS ? field[0] : STR_NULL,
			.status = str_cstr(statuses[((xflags & 31) + k) % NSTATUS]),
			.remote_mta = field[1],
			.diagnostic = field[0],
			.last_attempt_us = flags & F_TIMES ? in.info.now_us - k : 0,
		};
	}
	struct str snd = in.info.sender;
	bool valid = addr_ok(addr) && (snd.len == 0 || (addr_ok(snd) && snd.len <= 992));

	struct buf out;
	buf_init(&out, flags & F_SMALL ? 64 + data[1] * 4u : OUT_MAX);
	int r = buf_append(&out, "pre", 3);
	CHECK(r == 0);
	r = format(&in, body, 0, &out);
	if (!valid) {
		CHECK(r == -EINVAL);
		CHECK(out.len == 3 && memcmp(out.ptr, "pre", 3) == 0);
		buf_done(&out);
		return 0;
	}
	if (flags & F_SMALL) {
		CHECK(r == 0 || r == -ENOBUFS);
		if (r < 0) {
			CHECK(out.len == 3 && memcmp(out.ptr, "pre", 3) == 0);
			buf_done(&out);
			return 0;
		}
	}
	CHECK(r == 0);
	struct str s = str_make(out.ptr + 3, out.len - 3);
	char b[71];
	check_report(s, in.n, b);

	/* the same report whatever the chunking, and again */
	struct buf again;
	buf_init(&again, OUT_MAX);
	CHECK(format(&in, body, in.step, &again) == 0);
	CHECK(str_eq(s, buf_str(&again)));
	buf_done(&again);

	if (flags & F_PLANT) {
		/* the boundary as the first line of the original headers */
		size_t len = 2 + strlen(b) + 2 + body.len;
		char *planted = malloc(len);
		CHECK(planted);
		memcpy(planted, "--", 2);
		memcpy(planted + 2, b, strlen(b));
		memcpy(planted + 2 + strlen(b), "\r\n", 2);
		if (body.len)
			memcpy(planted + 4 + strlen(b), body.ptr, body.len);
		buf_init(&again, OUT_MAX);
		CHECK(format(&in, str_make(planted, len), in.step, &again) == 0);
		char b2[71];
		check_report(buf_str(&again), in.n, b2);
		CHECK(strcmp(b, b2) != 0);
		buf_done(&again);
		free(planted);
	}
	buf_done(&out);
	return 0;
}
