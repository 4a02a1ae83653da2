/*
 * test_dsn -- delivery status notifications (src/queue/dsn.c): the report is parsed back
 * with a small MIME walk (top header, boundary, three parts and their types), the
 * delivery-status fields are read per recipient, and the hostile cases are tried: the
 * original headers cut at their limit or spread over chunks, no body, a 3000-byte
 * diagnostic, CR/LF injection, a boundary planted in the original headers, small buffers.
 * When /usr/bin/python3 is there, its stdlib email parser reads the report too.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dsn.h"
#include "util.h"

#define NOW_US 1795309607134392ULL /* Sun, 22 Nov 2026 01:06:47 +0000 */
#define OUT_MAX (1024 * 1024)

static const char original[] =
	"Received: from mx.example.org ([192.0.2.1])\r\n"
	"\tby relay.example.com; Mon, 20 Nov 2026 10:00:00 +0000\r\n"
	"From: List <list@example.org>\r\n"
	"To: many@example.net\r\n"
	"Subject: the monthly post\r\n"
	"Message-ID: <abc@example.org>\r\n"
	"\r\n"
	"Body text, which must not be attached.\r\n"
	"From: not a header\r\n";

static struct dsn_info info_default(void)
{
	return (struct dsn_info){
		.reporting_mta = str_cstr("relay.example.com"),
		.sender = str_cstr("list@example.org"),
		.queue_id = str_cstr("0QG7S2Q8K2A00007"),
		.arrival_us = NOW_US - 3600ULL * 1000000u,
		.now_us = NOW_US,
		.boundary_seed = str_cstr("0QG7S2Q8K2A00007"),
	};
}

/* ---- a small MIME walk -------------------------------------------------------------- */

struct part {
	struct str head;
	struct str body;
};

struct doc {
	struct str head;
	char boundary[128];
	struct part part[8];
	size_t nparts;
};

/* Every line ends in CRLF, no other CR or LF, no NUL, no line over 998 octets. */
static void check_lines(struct str s)
{
	size_t col = 0;
	for (size_t i = 0; i < s.len; i++) {
		char c = s.ptr[i];
		assert_true(c != '\0');
		if (c == '\r') {
			assert_true(i + 1 < s.len && s.ptr[i + 1] == '\n');
			assert_true(col <= 998);
			col = 0;
			i++;
			continue;
		}
		assert_true(c != '\n');
		col++;
	}
	assert_int_equal(col, 0); /* ends with CRLF */
}

static struct str find(struct str s, const char *needle)
{
	size_t n = strlen(needle);
	for (size_t i = 0; n <= s.len && i <= s.len - n; i++)
		if (memcmp(s.ptr + i, needle, n) == 0)
			return str_make(s.ptr + i, s.len - i);
	return STR_NULL;
}

/*
 * The value of field name in a header section (or a delivery-status block), unfolded
 * (CRLF removed) into out, the idx-th occurrence; false if absent.
 */
static bool field(struct str head, const char *name, size_t idx, char *out, size_t max)
{
	size_t nl = strlen(name);
	for (size_t i = 0; i < head.len;) {
		const char *e = memchr(head.ptr + i, '\n', head.len - i);
		size_t end = e ? (size_t)(e - head.ptr) + 1 : head.len;
		if (end - i > nl && head.ptr[i + nl] == ':' &&
		    strncasecmp(head.ptr + i, name, nl) == 0 && idx-- == 0) {
			size_t o = 0, j = i + nl + 1;
			while (j < head.len && head.ptr[j] == ' ')
				j++;
			for (;;) {
				for (; j < head.len && head.ptr[j] != '\r'; j++) {
					assert_true(o + 1 < max);
					out[o++] = head.ptr[j];
				}
				j += 2; /* CRLF */
				if (j >= head.len || (head.ptr[j] != ' ' && head.ptr[j] != '\t'))
					break;
			}
			out[o] = '\0';
			return true;
		}
		i = end;
	}
	return false;
}

static size_t count_lines_starting(struct str s, const char *prefix)
{
	size_t n = 0, pl = strlen(prefix);
	for (size_t i = 0; i < s.len;) {
		const char *e = memchr(s.ptr + i, '\n', s.len - i);
		size_t end = e ? (size_t)(e - s.ptr) + 1 : s.len;
		if (end - i >= pl && memcmp(s.ptr + i, prefix, pl) == 0)
			n++;
		i = end;
	}
	return n;
}

/* Split a whole DSN into its top header and parts, checking the MIME structure. */
static void walk(struct str s, struct doc *d)
{
	memset(d, 0, sizeof(*d));
	check_lines(s);
	assert_true(s.len > 6 && memcmp(s.ptr, "Date: ", 6) == 0);
	struct str sep = find(s, "\r\n\r\n");
	assert_non_null(sep.ptr);
	d->head = str_make(s.ptr, (size_t)(sep.ptr - s.ptr) + 2);
	char ct[512];
	assert_true(field(d->head, "Content-Type", 0, ct, sizeof(ct)));
	assert_non_null(strstr(ct, "multipart/report;"));
	assert_non_null(strstr(ct, "report-type=delivery-status;"));
	const char *b = strstr(ct, "boundary=\"");
	assert_non_null(b);
	b += strlen("boundary=\"");
	const char *q = strchr(b, '"');
	assert_non_null(q);
	assert_true(q > b && (size_t)(q - b) <= 70); /* RFC 2046 */
	memcpy(d->boundary, b, (size_t)(q - b));

	char delim[140], close[140];
	snprintf(delim, sizeof(delim), "--%s\r\n", d->boundary);
	snprintf(close, sizeof(close), "--%s--\r\n", d->boundary);
	struct str body = str_make(sep.ptr + 4, s.len - (size_t)(sep.ptr + 4 - s.ptr));
	char prefix[140];
	snprintf(prefix, sizeof(prefix), "--%s", d->boundary);
	assert_int_equal(count_lines_starting(s, prefix), 4);
	/* the parts: between "--B" lines, each without the CRLF before the next delimiter */
	size_t i = 0;
	const char *part_start = NULL;
	bool closed = false;
	while (i < body.len) {
		const char *e = memchr(body.ptr + i, '\n', body.len - i);
		assert_non_null(e);
		size_t end = (size_t)(e - body.ptr) + 1;
		struct str line = str_make(body.ptr + i, end - i);
		bool is_delim = str_eq_cstr(line, delim), is_close = str_eq_cstr(line, close);
		if (is_delim || is_close) {
			if (part_start) {
				assert_true(d->nparts < 8);
				size_t plen = (size_t)(line.ptr - part_start) - 2;
				struct str p = str_make(part_start, plen);
				struct str hs = find(p, "\r\n\r\n");
				assert_non_null(hs.ptr);
				size_t hlen = (size_t)(hs.ptr - p.ptr) + 2;
				d->part[d->nparts].head = str_make(p.ptr, hlen);
				d->part[d->nparts].body =
					str_make(p.ptr + hlen + 2, plen - hlen - 2);
				d->nparts++;
			}
			part_start = body.ptr + end;
			if (is_close) {
				assert_int_equal(end, body.len); /* nothing after the close */
				closed = true;
			}
		}
		i = end;
	}
	assert_true(closed);
	assert_int_equal(d->nparts, 3);
	char v[256];
	assert_true(field(d->part[0].head, "Content-Type", 0, v, sizeof(v)));
	assert_string_equal(v, "text/plain; charset=us-ascii");
	assert_true(field(d->part[1].head, "Content-Type", 0, v, sizeof(v)));
	assert_string_equal(v, "message/delivery-status");
	assert_true(field(d->part[2].head, "Content-Type", 0, v, sizeof(v)));
	assert_true(strcmp(v, "text/rfc822-headers") == 0 || strcmp(v, "message/rfc822") == 0);
	/* parts 1 and 2 are US-ASCII */
	for (int k = 0; k < 2; k++)
		for (size_t j = 0; j < d->part[k].body.len; j++)
			assert_true((unsigned char)d->part[k].body.ptr[j] < 0x80);
}

/* The delivery-status blocks: [0] per message, [1..] per recipient. */
static size_t ds_blocks(struct str ds, struct str *blk, size_t max)
{
	size_t n = 0, i = 0;
	while (i < ds.len && n < max) {
		struct str rest = str_make(ds.ptr + i, ds.len - i);
		struct str e = find(rest, "\r\n\r\n");
		size_t len = e.ptr ? (size_t)(e.ptr - rest.ptr) + 2 : rest.len;
		blk[n++] = str_make(rest.ptr, len);
		i += e.ptr ? len + 2 : len;
	}
	return n;
}

static int format(const struct dsn_info *info, const struct dsn_rcpt *r, size_t n,
		  const char *body, struct buf *out)
{
	struct str chunk = str_cstr(body);
	return dsn_format(info, r, n, &chunk, body ? 1 : 0, out);
}

/* Field name of s is want (its idx-th occurrence); want NULL: there is none. */
static void expect_field(struct str s, const char *name, const char *want)
{
	char v[512];
	bool found = field(s, name, 0, v, sizeof(v));
	if (!want) {
		assert_false(found);
		return;
	}
	assert_true(found);
	assert_string_equal(v, want);
}

/*
 * A field expected in a report: where it is (the top header, the header of part 3, or a
 * delivery-status block: 0 the per-message one, 1.. one per recipient), its name, which
 * occurrence, and its unfolded value; want NULL: that occurrence is absent.
 */
enum { AT_HEAD = -1, AT_PART3 = -2 };

struct fcase {
	int at;
	const char *name;
	const char *want;
	size_t idx;
};

/* The delivery-status part of d has nblk blocks, and each field of f is as expected. */
static void expect_fields(const struct doc *d, size_t nblk, const struct fcase *f, size_t n)
{
	struct str blk[8];
	assert_int_equal(ds_blocks(d->part[1].body, blk, 8), nblk);
	for (size_t i = 0; i < n; i++) {
		assert_true(f[i].at >= AT_PART3 && f[i].at < (int)nblk);
		struct str s = f[i].at == AT_HEAD ? d->head
			       : f[i].at == AT_PART3 ? d->part[2].head : blk[f[i].at];
		char v[1024];
		bool found = field(s, f[i].name, f[i].idx, v, sizeof(v));
		if (found != (f[i].want != NULL) || (found && strcmp(v, f[i].want) != 0))
			fail_msg("field %zu, %s #%zu at %d: got \"%s\", want \"%s\"", i, f[i].name,
				 f[i].idx, f[i].at, found ? v : "(none)",
				 f[i].want ? f[i].want : "(none)");
	}
}

/* The human-readable part 1 of d holds each of the n texts. */
static void expect_texts(const struct doc *d, const char *const *texts, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!find(d->part[0].body, texts[i]).ptr)
			fail_msg("part 1 lacks \"%s\"", texts[i]);
}

/* ---- cases -------------------------------------------------------------------------- */

static void test_structure(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	struct dsn_rcpt r[2] = {
		{ .addr = str_cstr("user1@example.net"), .action = DSN_FAILED,
		  .status = str_cstr("5.1.1"), .remote_mta = str_cstr("mx.example.net"),
		  .diagnostic = str_cstr("550 5.1.1 <user1@example.net>: No such user"),
		  .last_attempt_us = NOW_US - 60000000ULL },
		{ .addr = str_cstr("user2@example.net"), .action = DSN_FAILED,
		  .status = str_cstr("9.9") },
	};
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, r, 2, original, &out), 0);
	struct doc d;
	walk(buf_str(&out), &d);

	char date[40], arrival[40], last_attempt[40];
	fmt_rfc5322_date(date, sizeof(date), (time_t)(NOW_US / 1000000u), 0);
	fmt_rfc5322_date(arrival, sizeof(arrival), (time_t)(info.arrival_us / 1000000u), 0);
	fmt_rfc5322_date(last_attempt, sizeof(last_attempt),
			 (time_t)(r[0].last_attempt_us / 1000000u), 0);
	const struct fcase fields[] = {
		{ AT_HEAD, "From", "\"Mail Delivery System\" <MAILER-DAEMON@relay.example.com>",
		  0 },
		{ AT_HEAD, "To", "<list@example.org>", 0 },
		{ AT_HEAD, "Subject", "Undelivered Mail Returned to Sender", 0 },
		{ AT_HEAD, "Auto-Submitted", "auto-replied", 0 },
		{ AT_HEAD, "MIME-Version", "1.0", 0 },
		{ AT_HEAD, "Message-ID",
		  "<0QG7S2Q8K2A00007.1795309607134392.dsn@relay.example.com>", 0 },
		{ AT_HEAD, "Date", date, 0 },
		{ AT_HEAD, "Content-Transfer-Encoding", NULL, 0 },
		{ 0, "Reporting-MTA", "dns; relay.example.com", 0 },
		{ 0, "Arrival-Date", arrival, 0 },
		{ 1, "Final-Recipient", "rfc822; user1@example.net", 0 },
		{ 1, "Action", "failed", 0 },
		{ 1, "Status", "5.1.1", 0 },
		{ 1, "Remote-MTA", "dns; mx.example.net", 0 },
		{ 1, "Diagnostic-Code", "smtp; 550 5.1.1 <user1@example.net>: No such user", 0 },
		{ 1, "Last-Attempt-Date", last_attempt, 0 },
		{ 2, "Final-Recipient", "rfc822; user2@example.net", 0 },
		{ 2, "Status", "5.0.0", 0 }, /* "9.9" is no status */
		{ 2, "Remote-MTA", NULL, 0 },
		{ 2, "Diagnostic-Code", NULL, 0 },
		{ 2, "Last-Attempt-Date", NULL, 0 },
	};
	expect_fields(&d, 3, fields, ARRAY_SIZE(fields));
	/* part 1 names every recipient and the reply */
	static const char *const texts[] = {
		"<user1@example.net>: failed (5.1.1)",
		"<user2@example.net>: failed (5.0.0)",
		"Remote host mx.example.net said: 550 5.1.1",
		"ID 0QG7S2Q8K2A00007)",
	};
	expect_texts(&d, texts, ARRAY_SIZE(texts));

	/* part 3 is the header section, exactly, and nothing of the body */
	size_t hlen = (size_t)(strstr(original, "\r\n\r\n") - original) + 2;
	assert_true(str_eq(d.part[2].body, str_make(original, hlen)));

	/* the same input gives the same output */
	struct buf again;
	buf_init(&again, OUT_MAX);
	assert_int_equal(format(&info, r, 2, original, &again), 0);
	assert_true(str_eq(buf_str(&out), buf_str(&again)));
	buf_done(&again);
	buf_done(&out);
}

static void test_delayed(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	info.reason = str_cstr("the message has been in the queue for 4 hours");
	info.arrival_us = 0;
	struct dsn_rcpt r = {
		.addr = str_cstr("slow@example.net"),
		.action = DSN_DELAYED,
		.diagnostic = str_cstr("connect to mx.example.net: Connection refused"),
	};
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &out), 0);
	struct doc d;
	walk(buf_str(&out), &d);
	static const struct fcase fields[] = {
		{ AT_HEAD, "Subject", "Delayed Mail (still being retried)", 0 },
		{ 0, "Arrival-Date", NULL, 0 }, /* 0: none */
		{ 1, "Action", "delayed", 0 },
		{ 1, "Status", "4.0.0", 0 },
		/* not an SMTP reply: our own diagnostic type */
		{ 1, "Diagnostic-Code", "X-Sluice; connect to mx.example.net: Connection refused",
		  0 },
	};
	expect_fields(&d, 2, fields, ARRAY_SIZE(fields));
	static const char *const texts[] = {
		"Reason: the message has been in the queue for 4 hours.",
		"<slow@example.net>: delayed (4.0.0)",
	};
	expect_texts(&d, texts, ARRAY_SIZE(texts));
	buf_done(&out);

	/* mixed: a failure makes it a bounce */
	struct dsn_rcpt two[2] = { r, { .addr = str_cstr("gone@example.net"),
					.action = DSN_FAILED } };
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, two, 2, original, &out), 0);
	walk(buf_str(&out), &d);
	expect_field(d.head, "Subject", "Undelivered Mail Returned to Sender");
	buf_done(&out);
}

/* RFC 3461: the ENVID and each ORCPT given come back (Original-Envelope-Id,
 * Original-Recipient), and a NOTIFY=SUCCESS recipient's "relayed" notice. */
/* The ENVID and ORCPT come back exactly as given, spaces and all (the sender's software
 * matches by them): a double space, a trailing one, and a long ORCPT folded at single
 * spaces that unfolds to what was given. */
static void test_envid_orcpt_as_given(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	info.envid = str_cstr("QQ  314159 x ");
	char orcpt[QUEUE_MAX_ORCPT + 1];
	int n = snprintf(orcpt, sizeof(orcpt), "rfc822;\"a  b\"@example.net");
	while (n + 12 < QUEUE_MAX_ORCPT)
		n += snprintf(orcpt + n, sizeof(orcpt) - (size_t)n, " word%04d", n);
	struct dsn_rcpt r[1] = {
		{ .addr = str_cstr("new@example.net"), .action = DSN_FAILED, .orcpt = str_cstr(orcpt) },
	};
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, r, 1, original, &out), 0);
	check_lines(buf_str(&out));
	struct doc d;
	walk(buf_str(&out), &d);
	struct str blk[4];
	assert_int_equal(ds_blocks(d.part[1].body, blk, 4), 2);
	expect_field(blk[0], "Original-Envelope-Id", "QQ  314159 x ");
	char v[QUEUE_MAX_ORCPT + 64];
	assert_true(field(blk[1], "Original-Recipient", 0, v, sizeof(v)));
	assert_string_equal(v, orcpt);
	assert_true(count_lines_starting(blk[1], " word") > 0); /* it was folded */
	buf_done(&out);
}

static void test_envid_orcpt_relayed(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	info.envid = str_cstr("QQ+314159 x");
	struct dsn_rcpt r[2] = {
		{ .addr = str_cstr("new@example.net"), .action = DSN_RELAYED,
		  .orcpt = str_cstr("rfc822;old@example.net"), .remote_mta = str_cstr("mx.example.net") },
		{ .addr = str_cstr("plain@example.net"), .action = DSN_RELAYED },
	};
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, r, 2, original, &out), 0);
	check_lines(buf_str(&out));
	struct doc d;
	walk(buf_str(&out), &d);
	static const struct fcase relayed[] = {
		{ AT_HEAD, "Subject", "Relayed Mail Report", 0 },
		{ 0, "Original-Envelope-Id", "QQ+314159 x", 0 },
		{ 1, "Original-Recipient", "rfc822;old@example.net", 0 },
		{ 1, "Action", "relayed", 0 },
		{ 1, "Status", "2.0.0", 0 },
		{ 2, "Original-Recipient", NULL, 0 },
	};
	expect_fields(&d, 3, relayed, ARRAY_SIZE(relayed));
	static const char *const texts[] = { "<new@example.net>: relayed (2.0.0)" };
	expect_texts(&d, texts, ARRAY_SIZE(texts));
	buf_done(&out);

	/* a failure with its ORCPT: a bounce; no ENVID, no Original-Envelope-Id; a CR LF in
	 * a value (the queue file is not trusted to hold printable text) starts no field */
	info.envid = STR_NULL;
	r[0].action = DSN_FAILED;
	r[0].orcpt = str_cstr("rfc822;old@example.net\r\nAction: delivered");
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, r, 1, original, &out), 0);
	check_lines(buf_str(&out));
	walk(buf_str(&out), &d);
	static const struct fcase failed[] = {
		{ AT_HEAD, "Subject", "Undelivered Mail Returned to Sender", 0 },
		{ 0, "Original-Envelope-Id", NULL, 0 },
		{ 1, "Action", "failed", 0 },
		{ 1, "Action", NULL, 1 },
	};
	expect_fields(&d, 2, failed, ARRAY_SIZE(failed));
	buf_done(&out);
}

/* RET=FULL: a bounce returns the whole message (message/rfc822) when it fits, its
 * headers otherwise; a delay notice always the headers. */
static void test_ret_full(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	info.full = true;
	struct dsn_rcpt r = { .addr = str_cstr("gone@example.net"), .action = DSN_FAILED };
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &out), 0);
	check_lines(buf_str(&out));
	struct doc d;
	walk(buf_str(&out), &d);
	expect_field(d.part[2].head, "Content-Type", "message/rfc822");
	assert_non_null(find(d.part[2].body, "Subject: ").ptr);
	assert_non_null(find(d.part[2].body, "Body text, which must not be attached.").ptr);
	size_t with_body = d.part[2].body.len;
	buf_done(&out);

	/* a delay notice: headers only */
	r.action = DSN_DELAYED;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &out), 0);
	walk(buf_str(&out), &d);
	expect_field(d.part[2].head, "Content-Type", "text/rfc822-headers");
	assert_true(d.part[2].body.len < with_body);
	buf_done(&out);

	/* too large to return: headers only */
	r.action = DSN_FAILED;
	static char big[DSN_MAX_RETURNED + 100];
	memcpy(big, "Subject: big\r\n\r\n", 16);
	for (size_t i = 16; i + 2 <= sizeof(big); i += 2)
		memcpy(big + i, "x\n", 2);
	struct str chunk = str_make(big, sizeof(big));
	buf_init(&out, OUT_MAX);
	assert_int_equal(dsn_format(&info, &r, 1, &chunk, 1, &out), 0);
	check_lines(buf_str(&out));
	walk(buf_str(&out), &d);
	expect_field(d.part[2].head, "Content-Type", "text/rfc822-headers");
	assert_true(d.part[2].body.len < 100);
	buf_done(&out);
}

static void test_status(void **state)
{
	(void)state;
	static const struct {
		const char *in;
		enum dsn_action action;
		const char *want;
	} cases[] = {
		{ "5.1.1", DSN_FAILED, "5.1.1" },     { "4.4.7", DSN_FAILED, "4.4.7" },
		{ "2.0.0", DSN_FAILED, "2.0.0" },     { "5.123.999", DSN_FAILED, "5.123.999" },
		{ "4.7.1", DSN_DELAYED, "4.7.1" },    { "", DSN_FAILED, "5.0.0" },
		{ "", DSN_DELAYED, "4.0.0" },         { "3.0.0", DSN_FAILED, "5.0.0" },
		{ "5.1", DSN_FAILED, "5.0.0" },       { "5.1.1.1", DSN_FAILED, "5.0.0" },
		{ "5.1234.1", DSN_FAILED, "5.0.0" },  { "5..1", DSN_FAILED, "5.0.0" },
		{ "5.1.1 ", DSN_FAILED, "5.0.0" },    { "x.1.1", DSN_DELAYED, "4.0.0" },
		{ "5.1.", DSN_FAILED, "5.0.0" },      { "55.1.1", DSN_FAILED, "5.0.0" },
		{ "5.1.1\r\nX: y", DSN_FAILED, "5.0.0" },
	};
	struct dsn_info info = info_default();
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct dsn_rcpt r = { .addr = str_cstr("a@example.net"), .action = cases[i].action,
				      .status = str_cstr(cases[i].in) };
		struct buf out;
		buf_init(&out, OUT_MAX);
		assert_int_equal(format(&info, &r, 1, original, &out), 0);
		struct doc d;
		walk(buf_str(&out), &d);
		struct str blk[4];
		assert_int_equal(ds_blocks(d.part[1].body, blk, 4), 2);
		char v[64];
		assert_true(field(blk[1], "Status", 0, v, sizeof(v)));
		if (strcmp(v, cases[i].want) != 0)
			fail_msg("status \"%s\": got %s, want %s", cases[i].in, v, cases[i].want);
		buf_done(&out);
	}
}

/* A header section larger than DSN_MAX_HEADERS is cut at a line boundary. */
static void test_headers_limit(void **state)
{
	(void)state;
	struct buf msg;
	buf_init(&msg, 4 * DSN_MAX_HEADERS);
	for (int i = 0; msg.len < 2 * DSN_MAX_HEADERS; i++)
		assert_int_equal(buf_printf(&msg, "X-Filler-%05d: %s\r\n", i,
					    "0123456789012345678901234567890123456789"), 0);
	assert_int_equal(buf_append_cstr(&msg, "\r\nbody\r\n"), 0);
	struct dsn_info info = info_default();
	struct dsn_rcpt r = { .addr = str_cstr("a@example.net") };
	struct buf out;
	buf_init(&out, OUT_MAX);
	struct str chunk = buf_str(&msg);
	assert_int_equal(dsn_format(&info, &r, 1, &chunk, 1, &out), 0);
	struct doc d;
	walk(buf_str(&out), &d);
	struct str h = d.part[2].body;
	assert_true(h.len <= DSN_MAX_HEADERS);
	assert_true(h.len > DSN_MAX_HEADERS - 100);
	assert_true(h.len >= 2 && memcmp(h.ptr + h.len - 2, "\r\n", 2) == 0);
	/* whole lines of the original, from its start */
	assert_true(memcmp(h.ptr, msg.ptr, h.len) == 0);
	assert_true(msg.ptr[h.len] == 'X'); /* the next line of the original begins there */
	buf_done(&out);
	buf_done(&msg);
}

/* The header section read across chunks of every small size gives the same part 3. */
static void test_headers_chunks(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	struct dsn_rcpt r = { .addr = str_cstr("a@example.net") };
	struct buf whole;
	buf_init(&whole, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &whole), 0);
	size_t len = strlen(original);
	for (size_t step = 1; step <= 13; step++) {
		struct str chunks[512];
		size_t n = 0;
		for (size_t i = 0; i < len; i += step)
			chunks[n++] = str_make(original + i, i + step <= len ? step : len - i);
		struct buf out;
		buf_init(&out, OUT_MAX);
		assert_int_equal(dsn_format(&info, &r, 1, chunks, n, &out), 0);
		assert_true(str_eq(buf_str(&out), buf_str(&whole)));
		buf_done(&out);
	}
	/* empty chunks (and a NULL one) are nothing */
	struct str odd[] = { STR_NULL, str_make(original, 10), str_make(original, 0),
			     str_cstr(original + 10) };
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(dsn_format(&info, &r, 1, odd, ARRAY_SIZE(odd), &out), 0);
	assert_true(str_eq(buf_str(&out), buf_str(&whole)));
	buf_done(&out);

	/* bare LF lines, a stray CR, NULs, the CR of CRLF ending one chunk and its LF
	 * beginning the next; the empty line split the same way */
	struct str messy[] = { str_cstr("A: 1\nB: 2\r"), str_cstr("\nC: x\ry\n"),
			       str_make("D: n\0ul\r\n", 9), str_cstr("\r"),
			       str_cstr("\nE: body\r\n") };
	buf_init(&out, OUT_MAX);
	assert_int_equal(dsn_format(&info, &r, 1, messy, ARRAY_SIZE(messy), &out), 0);
	struct doc d;
	walk(buf_str(&out), &d);
	assert_true(str_eq_cstr(d.part[2].body, "A: 1\r\nB: 2\r\nC: x y\r\nD: nul\r\n"));
	buf_done(&out);
	buf_done(&whole);
}

static void test_no_body(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	struct dsn_rcpt r = { .addr = str_cstr("a@example.net") };
	struct buf out;
	struct doc d;

	buf_init(&out, OUT_MAX);
	assert_int_equal(dsn_format(&info, &r, 1, NULL, 0, &out), 0);
	walk(buf_str(&out), &d);
	assert_int_equal(d.part[2].body.len, 0);
	buf_done(&out);

	/* no empty line: all of it is the header section, the last line without CRLF too */
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, "Subject: x\r\nFrom: y", &out), 0);
	walk(buf_str(&out), &d);
	assert_true(str_eq_cstr(d.part[2].body, "Subject: x\r\nFrom: y\r\n"));
	buf_done(&out);

	/* a body that starts with the empty line: no header section */
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, "\r\nSubject: not a header\r\n", &out), 0);
	walk(buf_str(&out), &d);
	assert_int_equal(d.part[2].body.len, 0);
	buf_done(&out);

	/* a header line over 998 octets is cut */
	static char big[5000];
	memcpy(big, "X-Long: ", 8);
	memset(big + 8, 'z', 3000);
	static const char after[] = "\r\nSubject: after\r\n\r\n";
	memcpy(big + 3008, after, sizeof(after));
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, big, &out), 0);
	walk(buf_str(&out), &d);
	assert_int_equal(d.part[2].body.len, 998 + 2 + strlen("Subject: after\r\n"));
	assert_non_null(find(d.part[2].body, "\r\nSubject: after\r\n").ptr);
	buf_done(&out);
}

/* A 3000-byte diagnostic is folded: unfolded (each CRLF dropped, the space after it
 * kept, RFC 5322 2.2.3) it is the diagnostic again, or with a space added where a run
 * without spaces had to be broken. */
static void test_fold(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	char *diag = malloc(3001);
	assert_non_null(diag);
	/* words: the fold keeps every byte; and one run without a space */
	for (int with_spaces = 1; with_spaces >= 0; with_spaces--) {
		memcpy(diag, "550 ", 4);
		for (size_t i = 4; i < 3000; i++)
			diag[i] = with_spaces && i % 11 == 0 ? ' ' : (char)('a' + i % 26);
		diag[3000] = '\0';
		struct dsn_rcpt r = { .addr = str_cstr("a@example.net"),
				      .diagnostic = str_cstr(diag),
				      .remote_mta = str_cstr(diag + 4) };
		struct buf out;
		buf_init(&out, OUT_MAX);
		assert_int_equal(format(&info, &r, 1, original, &out), 0);
		struct doc d;
		walk(buf_str(&out), &d); /* no line over 998 */
		struct str blk[4];
		assert_int_equal(ds_blocks(d.part[1].body, blk, 4), 2);
		char *v = malloc(8000);
		assert_non_null(v);
		assert_true(field(blk[1], "Diagnostic-Code", 0, v, 8000));
		assert_true(strncmp(v, "smtp; ", 6) == 0);
		if (with_spaces) {
			assert_string_equal(v + 6, diag);
			/* folded at spaces: lines short */
			assert_true(count_lines_starting(blk[1], " ") >= 3000 / 78);
		} else {
			/* no space to fold at: a space is inserted every 998 octets or so */
			size_t n = 0;
			for (const char *p = v + 6; *p; p++)
				if (*p != ' ')
					v[6 + n++] = *p;
			v[6 + n] = '\0';
			memmove(diag + 3, diag + 4, 2997); /* "550" then the run */
			assert_string_equal(v + 6, diag);
		}
		/* the human-readable part is wrapped too */
		size_t col = 0;
		for (size_t i = 0; i < d.part[0].body.len; i++) {
			if (d.part[0].body.ptr[i] == '\r')
				col = 0, i++;
			else
				assert_true(++col <= 76);
		}
		free(v);
		buf_done(&out);
	}
	free(diag);

	/* a very long recipient and a long sender still fit */
	char addr[QUEUE_MAX_ADDR + 1];
	memset(addr, 'l', QUEUE_MAX_ADDR);
	memcpy(addr + QUEUE_MAX_ADDR - 12, "@example.net", 12);
	addr[QUEUE_MAX_ADDR] = '\0';
	struct dsn_rcpt r = { .addr = str_cstr(addr) };
	info.sender = str_make(addr + QUEUE_MAX_ADDR - 900, 900);
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &out), 0);
	struct doc d;
	walk(buf_str(&out), &d);
	buf_done(&out);
}

/* CR and LF in peer values cannot start a header field or a delivery-status field. */
static void test_injection(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	info.reason = str_cstr("bad\r\nX-Reason-Injected: yes");
	static const char diag[] = "550 no\r\nX-Injected: yes\r\n\r\nFinal-Recipient: rfc822; "
				   "evil@example.org\nAction: delivered\r\0\x01\xff";
	struct dsn_rcpt r = {
		.addr = str_cstr("a@example.net"),
		.diagnostic = str_make(diag, sizeof(diag) - 1),
		.remote_mta = str_cstr("mx.example.net\r\nX-Remote-Injected: yes"),
	};
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &out), 0);
	struct doc d;
	walk(buf_str(&out), &d);
	struct str s = buf_str(&out);
	assert_int_equal(count_lines_starting(s, "X-Injected"), 0);
	assert_int_equal(count_lines_starting(s, "X-Remote-Injected"), 0);
	assert_int_equal(count_lines_starting(s, "X-Reason-Injected"), 0);
	assert_int_equal(count_lines_starting(d.part[1].body, "Final-Recipient:"), 1);
	assert_int_equal(count_lines_starting(d.part[1].body, "Action:"), 1);
	static const struct fcase fields[] = {
		{ 1, "Diagnostic-Code", "smtp; 550 no X-Injected: yes Final-Recipient: rfc822; "
					"evil@example.org Action: delivered ??", 0 },
		{ 1, "Remote-MTA", "dns; mx.example.net X-Remote-Injected: yes", 0 },
	};
	expect_fields(&d, 2, fields, ARRAY_SIZE(fields)); /* no new block either */
	buf_done(&out);
}

static void test_utf8_address(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	struct dsn_rcpt r[4] = {
		{ .addr = str_cstr("j\xc3\xb6rg+a=b\\c@b\xc3\xbc" "cher.example") },
		{ .addr = str_cstr("plain+tag=x@example.net") },
		{ .addr = str_cstr("bad\xff\xf0\x9f\x98\x80@example.net") },
		{ .addr = str_cstr("\"a  b\"@example.net") }, /* spaces: xtext too */
	};
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, r, 4, original, &out), 0);
	struct doc d;
	walk(buf_str(&out), &d); /* parts 1 and 2 stay ASCII */
	static const struct fcase rcpts[] = {
		{ 1, "Final-Recipient",
		  "utf-8; j\\x{F6}rg\\x{2B}a\\x{3D}b\\x{5C}c@b\\x{FC}cher.example", 0 },
		{ 2, "Final-Recipient", "rfc822; plain+tag=x@example.net", 0 },
		{ 3, "Final-Recipient", "utf-8; bad\\x{FFFD}\\x{1F600}@example.net", 0 },
		{ 4, "Final-Recipient", "utf-8; \"a\\x{20}\\x{20}b\"@example.net", 0 },
	};
	expect_fields(&d, 5, rcpts, ARRAY_SIZE(rcpts));
	static const char *const texts[] = { "<j??rg+a=b\\c@b??cher.example>" };
	expect_texts(&d, texts, ARRAY_SIZE(texts));
	buf_done(&out);

	/* 8-bit original headers: the part, and the message, say 8bit */
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, r, 1, "Subject: gr\xc3\xbc\xc3\x9f" "e\r\n\r\nx", &out), 0);
	walk(buf_str(&out), &d);
	static const struct fcase eightbit[] = {
		{ AT_HEAD, "Content-Transfer-Encoding", "8bit", 0 },
		{ AT_PART3, "Content-Transfer-Encoding", "8bit", 0 },
	};
	expect_fields(&d, 2, eightbit, ARRAY_SIZE(eightbit));
	assert_true(str_eq_cstr(d.part[2].body, "Subject: gr\xc3\xbc\xc3\x9f" "e\r\n"));
	buf_done(&out);
}

/* The boundary planted in the original headers: another one is chosen. */
static void test_boundary_collision(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	struct dsn_rcpt r = { .addr = str_cstr("a@example.net") };
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &out), 0);
	struct doc d;
	walk(buf_str(&out), &d);
	char planted[4096];
	size_t len = 0;
	char first[128];
	snprintf(first, sizeof(first), "%s", d.boundary);
	/* the first two variants, as the lines of a hostile header section */
	for (int k = 0; k < 2; k++) {
		len += (size_t)snprintf(planted + len, sizeof(planted) - len, "--%s\r\n--%s--\r\n",
					d.boundary, d.boundary);
		buf_reset(&out);
		planted[len] = '\0';
		char body[4200];
		snprintf(body, sizeof(body), "%s\r\nbody\r\n", planted);
		assert_int_equal(format(&info, &r, 1, body, &out), 0);
		walk(buf_str(&out), &d); /* exactly four boundary lines */
		assert_string_not_equal(d.boundary, first);
		assert_true(str_eq_cstr(d.part[2].body, planted));
	}
	buf_done(&out);
}

/* The null sender: the caller sends the report to a postmaster; To: names nobody.  An
 * address literal as our host name. */
static void test_null_sender(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	info.sender = STR_NULL;
	info.reporting_mta = str_cstr("[IPv6:2001:db8::1]");
	struct dsn_rcpt r = { .addr = str_cstr("a@example.net") };
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &out), 0);
	struct doc d;
	walk(buf_str(&out), &d);
	static const struct fcase fields[] = {
		{ AT_HEAD, "To", "undisclosed-recipients:;", 0 },
		{ AT_HEAD, "From", "\"Mail Delivery System\" <MAILER-DAEMON@[IPv6:2001:db8::1]>",
		  0 },
		{ 0, "Reporting-MTA", "dns; [IPv6:2001:db8::1]", 0 },
	};
	expect_fields(&d, 2, fields, ARRAY_SIZE(fields));
	buf_done(&out);
}

static void test_errors(void **state)
{
	(void)state;
	struct dsn_info info = info_default();
	struct dsn_rcpt r = { .addr = str_cstr("a@example.net") };
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(buf_append_cstr(&out, "kept"), 0);

	assert_int_equal(format(&info, &r, 0, original, &out), -EINVAL);
	static const char *const bad_addr[] = { "", "a\r@example.net", "a\n@example.net",
						"a\tb@example.net", "a\x7f@example.net" };
	for (size_t i = 0; i < ARRAY_SIZE(bad_addr); i++) {
		struct dsn_rcpt b[2] = { r, { .addr = str_cstr(bad_addr[i]) } };
		assert_int_equal(format(&info, b, 2, original, &out), -EINVAL);
		struct dsn_info bi = info;
		bi.sender = str_cstr(bad_addr[i]);
		assert_int_equal(format(&bi, &r, 1, original, &out), i == 0 ? 0 : -EINVAL);
		buf_truncate(&out, 4);
	}
	struct dsn_rcpt nul = { .addr = str_make("a\0b@example.net", 15) };
	assert_int_equal(format(&info, &nul, 1, original, &out), -EINVAL);
	static const char *const bad_host[] = { "", "relay example.com", "relay\r\n.example",
						"<x>", "h\xc3\xa9.example", "[]", "[192.0.2.1",
						"[a_b]", "a:b", "[1]]" };
	for (size_t i = 0; i < ARRAY_SIZE(bad_host); i++) {
		struct dsn_info bi = info;
		bi.reporting_mta = str_cstr(bad_host[i]);
		assert_int_equal(format(&bi, &r, 1, original, &out), -EINVAL);
	}
	char longaddr[QUEUE_MAX_ADDR + 2];
	memset(longaddr, 'x', sizeof(longaddr) - 1);
	longaddr[sizeof(longaddr) - 1] = '\0';
	struct dsn_rcpt lr = { .addr = str_cstr(longaddr) };
	assert_int_equal(format(&info, &lr, 1, original, &out), -EINVAL);
	struct dsn_info li = info;
	li.sender = str_make(longaddr, 993); /* "To: <" 993 ">" would pass 998 */
	assert_int_equal(format(&li, &r, 1, original, &out), -EINVAL);
	li.sender = str_make(longaddr, 992);
	assert_int_equal(format(&li, &r, 1, original, &out), 0);
	buf_truncate(&out, 4);
	assert_true(str_eq_cstr(buf_str(&out), "kept")); /* failures appended nothing */
	buf_done(&out);

	/* -ENOBUFS at every size short of the whole: out is left as it was */
	struct buf whole;
	buf_init(&whole, OUT_MAX);
	assert_int_equal(format(&info, &r, 1, original, &whole), 0);
	for (size_t max = 4; max < whole.len + 4; max += max < 300 ? 1 : 97) {
		buf_init(&out, max);
		assert_int_equal(buf_append_cstr(&out, "kept"), 0);
		assert_int_equal(format(&info, &r, 1, original, &out), -ENOBUFS);
		assert_true(str_eq_cstr(buf_str(&out), "kept"));
		buf_done(&out);
	}
	/* exactly enough */
	buf_init(&out, whole.len + 4);
	assert_int_equal(buf_append_cstr(&out, "kept"), 0);
	assert_int_equal(format(&info, &r, 1, original, &out), 0);
	assert_true(str_eq(str_make(out.ptr + 4, out.len - 4), buf_str(&whole)));
	buf_done(&out);
	/* a fixed buffer over caller memory */
	char small[100];
	buf_init_fixed(&out, small, sizeof(small));
	assert_int_equal(format(&info, &r, 1, original, &out), -ENOBUFS);
	assert_int_equal(out.len, 0);
	buf_done(&whole);
}

/* ---- cross-check with Python's email package ------------------------------------------ */

static const char py_check[] =
	"import sys, email\n"
	"from email import policy\n"
	"with open(sys.argv[1], 'rb') as f:\n"
	"    m = email.message_from_binary_file(f, policy=policy.default)\n"
	"assert m.get_content_type() == 'multipart/report', m.get_content_type()\n"
	"assert m.get_param('report-type') == 'delivery-status'\n"
	"assert not m.defects, m.defects\n"
	"parts = m.get_payload()\n"
	"assert len(parts) == 3, len(parts)\n"
	"types = [p.get_content_type() for p in parts]\n"
	"assert types == ['text/plain', 'message/delivery-status', 'text/rfc822-headers'], types\n"
	"for p in parts:\n"
	"    assert not p.defects, p.defects\n"
	"blocks = parts[1].get_payload()\n"
	"rmta = blocks[0]['Reporting-MTA']\n"
	"assert rmta == 'dns; relay.example.com', rmta\n"
	"got = [str(b['Final-Recipient']) for b in blocks[1:] if b['Final-Recipient']]\n"
	"assert got == sys.argv[2:], got\n"
	"h = email.message_from_string(parts[2].get_payload())\n"
	"assert h['Subject'] == 'the monthly post', h['Subject']\n"
	"assert 'list@example.org' in str(m['To']), m['To']\n";

static void test_python(void **state)
{
	(void)state;
	if (access("/usr/bin/python3", X_OK) != 0) {
		print_message("/usr/bin/python3 missing: cross-check skipped\n");
		return;
	}
	struct dsn_info info = info_default();
	char diag[2500];
	memcpy(diag, "550 5.1.1 ", 10);
	for (size_t i = 10; i < sizeof(diag) - 1; i++)
		diag[i] = i % 9 == 0 ? ' ' : 'q';
	diag[sizeof(diag) - 1] = '\0';
	struct dsn_rcpt r[3] = {
		{ .addr = str_cstr("user1@example.net"), .status = str_cstr("5.1.1"),
		  .remote_mta = str_cstr("mx.example.net"), .diagnostic = str_cstr(diag),
		  .last_attempt_us = NOW_US },
		{ .addr = str_cstr("user2@example.net"), .action = DSN_DELAYED,
		  .diagnostic = str_cstr("451 4.7.1 try\r\nlater") },
		{ .addr = str_cstr("j\xc3\xb6rg@example.de") },
	};
	struct buf out;
	buf_init(&out, OUT_MAX);
	assert_int_equal(format(&info, r, 3, original, &out), 0);
	char path[] = "/tmp/test_dsn.XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, out.ptr, out.len), (ssize_t)out.len);
	close(fd);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char *argv[] = { "python3", "-c", (char *)py_check, path,
				 "rfc822; user1@example.net", "rfc822; user2@example.net",
				 "utf-8; j\\x{F6}rg@example.de", NULL };
		execv("/usr/bin/python3", argv);
		_exit(127);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	unlink(path);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail_msg("python3's email parser refused the DSN (status %d):\n%.*s", st,
			 (int)out.len, out.ptr);
	buf_done(&out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_structure),
		cmocka_unit_test(test_delayed),
		cmocka_unit_test(test_envid_orcpt_relayed),
		cmocka_unit_test(test_envid_orcpt_as_given),
		cmocka_unit_test(test_ret_full),
		cmocka_unit_test(test_status),
		cmocka_unit_test(test_headers_limit),
		cmocka_unit_test(test_headers_chunks),
		cmocka_unit_test(test_no_body),
		cmocka_unit_test(test_fold),
		cmocka_unit_test(test_injection),
		cmocka_unit_test(test_utf8_address),
		cmocka_unit_test(test_boundary_collision),
		cmocka_unit_test(test_null_sender),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_python),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
