/*
 * test_smtp -- unit tests of the SMTP server codec (src/proto/smtp.c).
 *
 * Command lines from a table, read by a simulated connection three ways that must agree:
 * all at once, one byte per read, and cut in two (and three) at every position, each call
 * on a fresh exact-size copy of what the caller holds, checking the caller never holds
 * max bytes after "read more".  Commands, MAIL and RCPT arguments (paths, source routes,
 * quoted local parts, domains, literals, parameters, UTF-8 with and without SMTPUTF8, the
 * length limits at and past the boundary) and HELO arguments from tables, each with the
 * error code the service maps to a reply.  The DATA decoder: a table of messages
 * (dot-unstuffing, the empty message, every smuggling variant, bare CR and LF, CR at the
 * end of a piece and LF at the start of the next, bytes after the end), each decoded
 * under every way of cutting it (all cut sets for short inputs, every pair of cuts for
 * longer ones, one byte at a time) and with small output buffers; and every string of up
 * to 8 bytes over { CR, LF, ".", "a" } against a plain line-by-line reference decoder.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "smtp.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define LIT(s) s, sizeof(s) - 1
#define NONE SIZE_MAX /* no end of data */
#define E(s) s, sizeof(s) - 1 /* expected bytes, with their length */

static struct str S(const char *s)
{
	return str_cstr(s);
}

static void assert_str(struct str got, const char *want, size_t want_len, const char *what,
		       size_t ci)
{
	if (got.len != want_len || (want_len && memcmp(got.ptr, want, want_len) != 0))
		fail_msg("case %zu: %s is \"%.*s\" (%zu bytes), expected \"%.*s\"", ci, what,
			 (int)got.len, got.ptr ? got.ptr : "", got.len, (int)want_len, want);
}

/* ---- command lines ------------------------------------------------------------------- */

/* What a connection read: events as text, "L[line]" ("B[line]" when it ended in a bare
 * LF) and "T" for a too-long line. */
struct lines_out {
	char ev[4096];
	size_t len;
};

static void ev_add(struct lines_out *o, const char *s, size_t n)
{
	assert_true(o->len + n < sizeof(o->ev));
	memcpy(o->ev + o->len, s, n);
	o->len += n;
	o->ev[o->len] = '\0';
}

/* A connection receiving text in the pieces cut at cuts[0..ncuts) (increasing). */
static void read_lines(const char *text, size_t len, size_t max, const size_t *cuts,
		       size_t ncuts, struct lines_out *o)
{
	struct smtp_line_reader r;
	smtp_line_reader_init(&r);
	char held[4096];
	size_t nheld = 0, from = 0;
	o->len = 0;
	o->ev[0] = '\0';
	for (size_t c = 0; c <= ncuts; c++) {
		size_t to = c < ncuts ? cuts[c] : len;
		assert_true(nheld + (to - from) <= sizeof(held));
		memcpy(held + nheld, text + from, to - from);
		nheld += to - from;
		from = to;
		for (;;) {
			char *win = malloc(nheld ? nheld : 1);
			assert_non_null(win);
			memcpy(win, held, nheld);
			struct str line = { (const char *)1, 12345 };
			size_t used = 99999;
			enum smtp_line_status st = smtp_line_next(&r, win, nheld, max, &line, &used);
			assert_true(used <= nheld);
			if (st == SMTP_LINE_OK) {
				assert_true(used >= 1 && used <= max && win[used - 1] == '\n');
				assert_ptr_equal(line.ptr, win);
				assert_true(line.len == used - 1 ||
					    (line.len == used - 2 && win[used - 2] == '\r'));
				assert_int_equal(r.bare_lf, line.len == used - 1);
				assert_null(memchr(line.ptr, '\n', line.len));
				ev_add(o, r.bare_lf ? "B[" : "L[", 2);
				ev_add(o, line.ptr, line.len);
				ev_add(o, "]", 1);
			} else if (st == SMTP_LINE_TOO_LONG) {
				assert_true(used >= 1 && win[used - 1] == '\n');
				assert_null(memchr(win, '\n', used - 1));
				ev_add(o, "T", 1);
			} else {
				assert_int_equal(st, SMTP_LINE_MORE);
				assert_true(used == 0 || used == nheld);
				/* "struct str" untouched */
				assert_int_equal(line.len, 12345);
			}
			free(win);
			memmove(held, held + used, nheld - used);
			nheld -= used;
			if (st == SMTP_LINE_MORE) {
				/* the caller never has to hold a whole max of one line */
				assert_true(nheld < max || (max == 0 && nheld == 0));
				break;
			}
		}
	}
}

static const struct {
	const char *in;
	size_t len;
	size_t max;
	const char *events;
	size_t events_len;
} line_cases[] = {
	{ LIT("QUIT\r\n"), 512, E("L[QUIT]") },
	{ LIT("QUIT\n"), 512, E("B[QUIT]") },
	{ LIT("QUIT"), 512, E("") },
	{ LIT("QUIT\r"), 512, E("") },
	{ LIT(""), 512, E("") },
	{ LIT("\r\n\n"), 512, E("L[]B[]") },
	{ LIT("EHLO a\r\nMAIL FROM:<>\r\nRCPT TO:<b@c>\nDATA\r\n"), 512,
	  E("L[EHLO a]L[MAIL FROM:<>]B[RCPT TO:<b@c>]L[DATA]") },
	/* only the CR right before the LF goes; other CRs stay for the command parser */
	{ LIT("a\r\r\n"), 512, E("L[a\r]") },
	{ LIT("a\rb\r\n"), 512, E("L[a\rb]") },
	{ LIT("\r\r\n"), 512, E("L[\r]") },
	/* max 8: 6 bytes and CRLF fit, 7 do not */
	{ LIT("HELO a\r\n"), 8, E("L[HELO a]") },
	{ LIT("HELO ab\r\n"), 8, E("T") },
	{ LIT("HELO ab\n"), 8, E("B[HELO ab]") },
	{ LIT("HELO abc\n"), 8, E("T") },
	{ LIT("HELO ab\r\nQUIT\r\n"), 8, E("TL[QUIT]") },
	{ LIT("abcdefgh"), 8, E("") },
	{ LIT("abcdefg"), 8, E("") },
	{ LIT("abcdefghijklmnopqrstuvwxyz\r\nQUIT\r\n"), 8, E("TL[QUIT]") },
	{ LIT("abcdefghijklmnopqrstuvwxyz\nabcdefghijklmnopqrstuvwxyz\nok\r\n"), 8, E("TTL[ok]") },
	{ LIT("abcdefghijklmnopqrstuvwxyz"), 8, E("") },
	{ LIT("abcdefghijklmnopqrstuvwxyz\n\n"), 8, E("TB[]") },
	{ LIT("a\nabcdefghij\nb\n"), 8, E("B[a]TB[b]") },
	/* a line of exactly max bytes with its LF, then one byte too many */
	{ LIT("1234567\n12345678\n"), 8, E("B[1234567]T") },
	{ LIT("123456\r\n1234567\r\n"), 8, E("L[123456]T") },
	/* NUL and 8-bit bytes are the command parser's business */
	{ LIT("a\0b\r\n"), 8, E("L[a\0b]") },
	{ LIT("\xc3\xa9\r\n"), 8, E("L[\xc3\xa9]") },
	/* the smallest limits */
	{ LIT("\n\r\n"), 1, E("B[]T") },
	{ LIT("\r\n\n"), 2, E("L[]B[]") },
	{ LIT("a\n"), 1, E("T") },
	/* the smuggled command: a bare LF inside what the client sent as one line is
	 * reported (B), and the service closes there (smtp.h); a bare CR stays inside the
	 * line its CRLF ends, which smtp_command_parse() refuses whole */
	{ LIT("MAIL FROM:<a@x>\nRCPT TO:<injected@y>\r\n"), 512,
	  E("B[MAIL FROM:<a@x>]L[RCPT TO:<injected@y>]") },
	{ LIT("MAIL FROM:<a@x>\rRCPT TO:<injected@y>\r\n"), 512,
	  E("L[MAIL FROM:<a@x>\rRCPT TO:<injected@y>]") },
	{ LIT("MAIL FROM:<a@x>\r\rRCPT TO:<injected@y>\n"), 512,
	  E("B[MAIL FROM:<a@x>\r\rRCPT TO:<injected@y>]") },
	{ LIT("RSET\r\r\n"), 512, E("L[RSET\r]") },
	{ LIT("\n\n"), 512, E("B[]B[]") },
};

static void test_lines(void **state)
{
	(void)state;
	struct lines_out whole, o;
	size_t cuts[2];
	for (size_t ci = 0; ci < ARRAY_SIZE(line_cases); ci++) {
		const char *in = line_cases[ci].in;
		size_t len = line_cases[ci].len, max = line_cases[ci].max;
		read_lines(in, len, max, NULL, 0, &whole);
		const char *want = line_cases[ci].events;
		size_t want_len = line_cases[ci].events_len;
		if (whole.len != want_len || memcmp(whole.ev, want, want_len) != 0)
			fail_msg("case %zu: read \"%.*s\"", ci, (int)whole.len, whole.ev);
		/* one byte per read */
		size_t *each = malloc((len ? len : 1) * sizeof(*each));
		assert_non_null(each);
		for (size_t k = 0; k < len; k++)
			each[k] = k;
		read_lines(in, len, max, each, len, &o);
		free(each);
		assert_int_equal(o.len, whole.len);
		assert_memory_equal(o.ev, whole.ev, whole.len);
		/* every one and two cuts */
		for (size_t a = 0; a <= len; a++)
			for (size_t b = a; b <= len; b++) {
				cuts[0] = a;
				cuts[1] = b;
				read_lines(in, len, max, cuts, 2, &o);
				if (o.len != whole.len || memcmp(o.ev, whole.ev, whole.len) != 0)
					fail_msg("case %zu cut %zu,%zu: \"%.*s\"", ci, a, b, (int)o.len,
						 o.ev);
			}
	}
}

/* A line over SMTP_LINE_MAX, fed in reads of 100 bytes: discarded as it comes. */
static void test_line_discard(void **state)
{
	(void)state;
	static char big[5000];
	memset(big, 'x', sizeof(big));
	struct smtp_line_reader r;
	smtp_line_reader_init(&r);
	struct str line;
	size_t used, held = 0; /* the caller holds big[off - held, off) */
	for (size_t off = 100; off <= sizeof(big); off += 100) {
		held += 100;
		enum smtp_line_status st =
			smtp_line_next(&r, big + off - held, held, SMTP_LINE_MAX, &line, &used);
		assert_int_equal(st, SMTP_LINE_MORE);
		held -= used;
		/* what the caller holds stays under the limit: here 0 once past it */
		assert_true(held < SMTP_LINE_MAX);
		assert_true(off < SMTP_LINE_MAX ? held == off : held == 0);
	}
	assert_int_equal(smtp_line_next(&r, LIT("yy\r\nQUIT\r\n"), SMTP_LINE_MAX, &line, &used),
			 SMTP_LINE_TOO_LONG);
	assert_int_equal(used, 4);
	assert_int_equal(smtp_line_next(&r, LIT("QUIT\r\n"), SMTP_LINE_MAX, &line, &used),
			 SMTP_LINE_OK);
	assert_true(str_eq_cstr(line, "QUIT") && used == 6 && !r.bare_lf);
	/* exactly 510 bytes and CRLF is a line, 511 is not */
	char l512[513];
	memset(l512, 'a', sizeof(l512));
	memcpy(l512 + 510, "\r\n", 2);
	smtp_line_reader_init(&r);
	assert_int_equal(smtp_line_next(&r, l512, 512, SMTP_LINE_MAX, &line, &used), SMTP_LINE_OK);
	assert_true(line.len == 510 && used == 512);
	memcpy(l512 + 510, "a\r\n", 3);
	assert_int_equal(smtp_line_next(&r, l512, 513, SMTP_LINE_MAX, &line, &used),
			 SMTP_LINE_TOO_LONG);
	assert_int_equal(used, 513);
}

/* ---- commands ------------------------------------------------------------------------ */

static const struct {
	const char *line;
	size_t len;
	int result;
	enum smtp_verb verb;
	const char *name;
	const char *arg;
	bool bad_form;
} command_cases[] = {
	{ LIT("HELO mail.example.com"), 0, SMTP_VERB_HELO, "HELO", "mail.example.com", false },
	{ LIT("ehlo  x  "), 0, SMTP_VERB_EHLO, "ehlo", "x", false },
	{ LIT("EhLo\tx\t"), 0, SMTP_VERB_EHLO, "EhLo", "x", false },
	{ LIT("  QUIT"), 0, SMTP_VERB_QUIT, "QUIT", "", false },
	{ LIT("QUIT\t"), 0, SMTP_VERB_QUIT, "QUIT", "", false },
	{ LIT("MAIL FROM:<a@b>"), 0, SMTP_VERB_MAIL, "MAIL", "<a@b>", false },
	{ LIT("mail from: <a@b> SIZE=1"), 0, SMTP_VERB_MAIL, "mail", "<a@b> SIZE=1", false },
	{ LIT("MAIL  From:\t<a@b>"), 0, SMTP_VERB_MAIL, "MAIL", "<a@b>", false },
	{ LIT("MAIL FROM:"), 0, SMTP_VERB_MAIL, "MAIL", "", false },
	{ LIT("MAIL FROM:<>  "), 0, SMTP_VERB_MAIL, "MAIL", "<>", false },
	{ LIT("MAIL TO:<a@b>"), 0, SMTP_VERB_MAIL, "MAIL", "TO:<a@b>", true },
	{ LIT("MAIL"), 0, SMTP_VERB_MAIL, "MAIL", "", true },
	{ LIT("MAIL FROM"), 0, SMTP_VERB_MAIL, "MAIL", "FROM", true },
	{ LIT("MAIL FROM :<a@b>"), 0, SMTP_VERB_MAIL, "MAIL", "FROM :<a@b>", true },
	{ LIT("RCPT TO:<a@b>"), 0, SMTP_VERB_RCPT, "RCPT", "<a@b>", false },
	{ LIT("rcpt to:"), 0, SMTP_VERB_RCPT, "rcpt", "", false },
	{ LIT("RCPT TO: <a@b> NOTIFY=NEVER"), 0, SMTP_VERB_RCPT, "RCPT", "<a@b> NOTIFY=NEVER",
	  false },
	{ LIT("RCPT FROM:<a@b>"), 0, SMTP_VERB_RCPT, "RCPT", "FROM:<a@b>", true },
	{ LIT("DATA"), 0, SMTP_VERB_DATA, "DATA", "", false },
	{ LIT("data x"), 0, SMTP_VERB_DATA, "data", "x", false },
	{ LIT("RSET"), 0, SMTP_VERB_RSET, "RSET", "", false },
	{ LIT("NOOP hello there"), 0, SMTP_VERB_NOOP, "NOOP", "hello there", false },
	{ LIT("VRFY postmaster"), 0, SMTP_VERB_VRFY, "VRFY", "postmaster", false },
	{ LIT("EXPN list"), 0, SMTP_VERB_EXPN, "EXPN", "list", false },
	{ LIT("HELP"), 0, SMTP_VERB_HELP, "HELP", "", false },
	{ LIT("StartTLS"), 0, SMTP_VERB_STARTTLS, "StartTLS", "", false },
	{ LIT("AUTH PLAIN AGFAYg=="), 0, SMTP_VERB_AUTH, "AUTH", "PLAIN AGFAYg==", false },
	{ LIT("BDAT 100 LAST"), 0, SMTP_VERB_BDAT, "BDAT", "100 LAST", false },
	{ LIT("ETRN example.com"), 0, SMTP_VERB_ETRN, "ETRN", "example.com", false },
	{ LIT("NOOP \xc3\xa9"), 0, SMTP_VERB_NOOP, "NOOP", "\xc3\xa9", false },
	/* not commands */
	{ LIT("HELOX a"), 0, SMTP_VERB_UNKNOWN, "HELOX", "a", false },
	{ LIT("MAILFROM:<a@b>"), 0, SMTP_VERB_UNKNOWN, "MAILFROM:<a@b>", "", false },
	{ LIT("GET / HTTP/1.1"), 0, SMTP_VERB_UNKNOWN, "GET", "/ HTTP/1.1", false },
	{ LIT("\xc3\xa9"), 0, SMTP_VERB_UNKNOWN, "\xc3\xa9", "", false },
	{ LIT("HEL"), 0, SMTP_VERB_UNKNOWN, "HEL", "", false },
	/* refused */
	{ LIT(""), -EINVAL, 0, NULL, NULL, false },
	{ LIT("   \t "), -EINVAL, 0, NULL, NULL, false },
	{ LIT("QUIT\0"), -EINVAL, 0, NULL, NULL, false },
	{ LIT("\0QUIT"), -EINVAL, 0, NULL, NULL, false },
	{ LIT("MAIL FROM:<a\0@b>"), -EINVAL, 0, NULL, NULL, false },
	{ LIT("NOOP \x01"), -EINVAL, 0, NULL, NULL, false },
	{ LIT("NOOP \x7f"), -EINVAL, 0, NULL, NULL, false },
	{ LIT("NOOP \x1b[0m"), -EINVAL, 0, NULL, NULL, false },
	{ LIT("QUIT\n"), -EINVAL, 0, NULL, NULL, false },
	/* a bare CR (the line reader took the CR of the CRLF): refused as such, whatever
	 * else the line holds, so the reply can say what was wrong */
	{ LIT("MAIL FROM:<a@b>\r"), -EBADMSG, 0, NULL, NULL, false },
	{ LIT("QUIT\rRSET"), -EBADMSG, 0, NULL, NULL, false },
	{ LIT("\r"), -EBADMSG, 0, NULL, NULL, false },
	{ LIT("\rQUIT"), -EBADMSG, 0, NULL, NULL, false },
	{ LIT("MAIL FROM:<a@x>\rRCPT TO:<injected@y>"), -EBADMSG, 0, NULL, NULL, false },
	{ LIT("NOOP \x01\r"), -EBADMSG, 0, NULL, NULL, false },
	{ LIT("QUIT\0\r"), -EBADMSG, 0, NULL, NULL, false },
};

static void test_commands(void **state)
{
	(void)state;
	for (size_t ci = 0; ci < ARRAY_SIZE(command_cases); ci++) {
		const char *in = command_cases[ci].line;
		struct smtp_command c;
		memset(&c, 0x5a, sizeof(c));
		const char *why = NULL;
		int r = smtp_command_parse(str_make(in, command_cases[ci].len), &c, &why);
		if (r != command_cases[ci].result)
			fail_msg("case %zu: returned %d (%s)", ci, r, why ? why : "");
		if (r < 0) {
			assert_non_null(why);
			assert_non_null(strstr(why, "command"));
			/* untouched */
			assert_int_equal(((unsigned char *)&c)[0], 0x5a);
			continue;
		}
		if (c.verb != command_cases[ci].verb)
			fail_msg("case %zu: verb %s", ci, smtp_verb_name(c.verb));
		assert_str(c.name, command_cases[ci].name, strlen(command_cases[ci].name), "name",
			   ci);
		assert_str(c.arg, command_cases[ci].arg, strlen(command_cases[ci].arg), "arg", ci);
		assert_int_equal(c.bad_form, command_cases[ci].bad_form);
		/* slices of the line */
		assert_true(c.name.ptr >= in && c.name.ptr + c.name.len <= in + command_cases[ci].len);
		assert_true(c.arg.ptr >= in && c.arg.ptr + c.arg.len <= in + command_cases[ci].len);
		/* why untouched on success */
		assert_null(why);
	}
	assert_string_equal(smtp_verb_name(SMTP_VERB_STARTTLS), "STARTTLS");
	assert_string_equal(smtp_verb_name(SMTP_VERB_ETRN), "ETRN");
	assert_string_equal(smtp_verb_name(SMTP_VERB_UNKNOWN), "UNKNOWN");
	assert_string_equal(smtp_verb_name((enum smtp_verb)999), "UNKNOWN");
	/* a NULL ret_why is fine */
	struct smtp_command c;
	assert_int_equal(smtp_command_parse(S(""), &c, NULL), -EINVAL);
}

/*
 * Line ends at the service: a stream read as the intake reads it (smtp.h's table), every
 * way of cutting it.  Events: the verb of each command taken, "CR" for a line refused for
 * a bare CR (the session goes on), "ERR" for another refused line, "LF!" for a bare LF
 * (the session is closed: nothing after it is read), "T" for a long line.
 */
static void serve_lines(const char *text, size_t len, const size_t *cuts, size_t ncuts,
			struct lines_out *o)
{
	struct smtp_line_reader r;
	smtp_line_reader_init(&r);
	char held[4096];
	size_t nheld = 0, from = 0;
	bool closed = false;
	o->len = 0;
	o->ev[0] = '\0';
	for (size_t c = 0; c <= ncuts && !closed; c++) {
		size_t to = c < ncuts ? cuts[c] : len;
		memcpy(held + nheld, text + from, to - from);
		nheld += to - from;
		from = to;
		while (!closed) {
			struct str line;
			size_t used;
			enum smtp_line_status st =
				smtp_line_next(&r, held, nheld, SMTP_LINE_MAX, &line, &used);
			if (st == SMTP_LINE_OK && r.bare_lf) {
				ev_add(o, "LF!;", 4);
				closed = true;
			} else if (st == SMTP_LINE_OK) {
				struct smtp_command cmd;
				const char *why = NULL;
				int rc = smtp_command_parse(line, &cmd, &why);
				if (rc == -EBADMSG) {
					assert_non_null(strstr(why, "<CR>"));
					ev_add(o, "CR;", 3);
				} else if (rc < 0) {
					ev_add(o, "ERR;", 4);
				} else {
					const char *v = smtp_verb_name(cmd.verb);
					ev_add(o, v, strlen(v));
					ev_add(o, ";", 1);
				}
			} else if (st == SMTP_LINE_TOO_LONG) {
				ev_add(o, "T;", 2);
			}
			memmove(held, held + used, nheld - used);
			nheld -= used;
			if (st == SMTP_LINE_MORE)
				break;
		}
	}
}

static const struct {
	const char *in;
	size_t len;
	const char *events;
} line_end_cases[] = {
	{ LIT("EHLO a\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@y>\r\n"), "EHLO;MAIL;RCPT;" },
	/* the smuggled recipient never becomes a command */
	{ LIT("EHLO a\r\nMAIL FROM:<a@x>\nRCPT TO:<injected@y>\r\nDATA\r\n"), "EHLO;LF!;" },
	{ LIT("MAIL FROM:<a@x>\rRCPT TO:<injected@y>\r\nRSET\r\n"), "CR;RSET;" },
	{ LIT("MAIL FROM:<a@x>\r\rRCPT TO:<injected@y>\r\nRSET\r\n"), "CR;RSET;" },
	{ LIT("RSET\r\r\nNOOP\r\n"), "CR;NOOP;" },
	{ LIT("QUIT\n"), "LF!;" },
	{ LIT("\n"), "LF!;" },
	{ LIT("NOOP\r\n\nQUIT\r\n"), "NOOP;LF!;" },
	{ LIT("NOOP\r\r\n\n"), "CR;LF!;" },
	/* a CR at the end of what arrived and its LF in the next read: a CRLF (every cut) */
	{ LIT("NOOP\r\nRSET\r\nQUIT\r\n"), "NOOP;RSET;QUIT;" },
	{ LIT("\r\nNOOP\r\n"), "ERR;NOOP;" },
};

static void test_line_ends(void **state)
{
	(void)state;
	struct lines_out whole, o;
	size_t cuts[2];
	for (size_t ci = 0; ci < ARRAY_SIZE(line_end_cases); ci++) {
		const char *in = line_end_cases[ci].in;
		size_t len = line_end_cases[ci].len;
		serve_lines(in, len, NULL, 0, &whole);
		if (strcmp(whole.ev, line_end_cases[ci].events) != 0)
			fail_msg("case %zu: \"%s\", expected \"%s\"", ci, whole.ev,
				 line_end_cases[ci].events);
		for (size_t a = 0; a <= len; a++)
			for (size_t b = a; b <= len; b++) {
				cuts[0] = a;
				cuts[1] = b;
				serve_lines(in, len, cuts, 2, &o);
				if (strcmp(o.ev, whole.ev) != 0)
					fail_msg("case %zu cut %zu,%zu: \"%s\"", ci, a, b, o.ev);
			}
	}
}

/* ---- MAIL ---------------------------------------------------------------------------- */

#define U64MAX UINT64_MAX
#define NOSIZE 0, false

static const struct {
	const char *arg;
	bool utf8_allowed;
	int result;
	const char *addr;
	uint64_t size;
	bool has_size;
	enum smtp_body body;
	bool smtputf8;
} mail_cases[] = {
	/* paths */
	{ "<>", false, 0, "", NOSIZE, SMTP_BODY_NONE, false },
	{ "<a@example.com>", false, 0, "a@example.com", NOSIZE, SMTP_BODY_NONE, false },
	{ "a@example.com", false, 0, "a@example.com", NOSIZE, SMTP_BODY_NONE, false },
	{ "  <a@example.com>  ", false, 0, "a@example.com", NOSIZE, SMTP_BODY_NONE, false },
	{ "a@example.com SIZE=10", false, 0, "a@example.com", 10, true, SMTP_BODY_NONE, false },
	{ "<first.last+tag@sub.example.co.uk>", false, 0, "first.last+tag@sub.example.co.uk",
	  NOSIZE, SMTP_BODY_NONE, false },
	{ "<!#$%&'*+-/=?^_`{|}~@x>", false, 0, "!#$%&'*+-/=?^_`{|}~@x", NOSIZE, SMTP_BODY_NONE,
	  false },
	{ "<A@EXAMPLE.COM>", false, 0, "A@EXAMPLE.COM", NOSIZE, SMTP_BODY_NONE, false },
	{ "<a@x-1.example>", false, 0, "a@x-1.example", NOSIZE, SMTP_BODY_NONE, false },
	{ "<a@localhost>", false, 0, "a@localhost", NOSIZE, SMTP_BODY_NONE, false },
	{ "<a@123.example>", false, 0, "a@123.example", NOSIZE, SMTP_BODY_NONE, false },
	/* quoted local parts, with blanks, '>' and '@' inside */
	{ "<\"a b\"@example.com>", false, 0, "\"a b\"@example.com", NOSIZE, SMTP_BODY_NONE,
	  false },
	{ "<\"a\\\"b\"@example.com>", false, 0, "\"a\\\"b\"@example.com", NOSIZE,
	  SMTP_BODY_NONE, false },
	{ "<\"\"@example.com>", false, 0, "\"\"@example.com", NOSIZE, SMTP_BODY_NONE, false },
	{ "<\"a>b@c\"@example.com> SIZE=1", false, 0, "\"a>b@c\"@example.com", 1, true,
	  SMTP_BODY_NONE, false },
	{ "<\"a\\\\\"@x>", false, 0, "\"a\\\\\"@x", NOSIZE, SMTP_BODY_NONE, false },
	/* source routes, dropped */
	{ "<@a.example,@b.example:u@c.example>", false, 0, "u@c.example", NOSIZE,
	  SMTP_BODY_NONE, false },
	{ "<@a.example:u@c.example>", false, 0, "u@c.example", NOSIZE, SMTP_BODY_NONE, false },
	{ "<@a.example:\"x y\"@c.example>", false, 0, "\"x y\"@c.example", NOSIZE,
	  SMTP_BODY_NONE, false },
	/* address literals */
	{ "<a@[192.0.2.1]>", false, 0, "a@[192.0.2.1]", NOSIZE, SMTP_BODY_NONE, false },
	{ "<a@[IPv6:2001:db8::1]>", false, 0, "a@[IPv6:2001:db8::1]", NOSIZE, SMTP_BODY_NONE,
	  false },
	{ "<a@[ipv6:::1]>", false, 0, "a@[ipv6:::1]", NOSIZE, SMTP_BODY_NONE, false },
	{ "<a@[IPv6:::ffff:192.0.2.1]>", false, 0, "a@[IPv6:::ffff:192.0.2.1]", NOSIZE,
	  SMTP_BODY_NONE, false },
	/* parameters */
	{ "<a@b> SIZE=1000 BODY=8BITMIME", false, 0, "a@b", 1000, true, SMTP_BODY_8BITMIME,
	  false },
	{ "<a@b> size=0 body=7bit", false, 0, "a@b", 0, true, SMTP_BODY_7BIT, false },
	{ "<a@b>\tBoDy=8bitMIME\t", false, 0, "a@b", NOSIZE, SMTP_BODY_8BITMIME, false },
	{ "<>  SIZE=5   BODY=7BIT  ", false, 0, "", 5, true, SMTP_BODY_7BIT, false },
	{ "<> SIZE=18446744073709551615", false, 0, "", U64MAX, true, SMTP_BODY_NONE, false },
	{ "<> SIZE=18446744073709551614", false, 0, "", U64MAX - 1, true, SMTP_BODY_NONE, false },
	{ "<> SIZE=18446744073709551616", false, 0, "", U64MAX, true, SMTP_BODY_NONE, false },
	{ "<> SIZE=99999999999999999999", false, 0, "", U64MAX, true, SMTP_BODY_NONE, false },
	{ "<> SIZE=00000000000000000001", false, 0, "", 1, true, SMTP_BODY_NONE, false },
	{ "<> SMTPUTF8", true, 0, "", NOSIZE, SMTP_BODY_NONE, true },
	{ "<> smtputf8 SIZE=1 BODY=8BITMIME", true, 0, "", 1, true, SMTP_BODY_8BITMIME, true },
	/* UTF-8 with SMTPUTF8 */
	{ "<j\xc3\xb6rg@example.com> SMTPUTF8", true, 0, "j\xc3\xb6rg@example.com", NOSIZE,
	  SMTP_BODY_NONE, true },
	{ "<j\xc3\xb6rg@b\xc3\xbc" "cher.example> SMTPUTF8", true, 0,
	  "j\xc3\xb6rg@b\xc3\xbc" "cher.example", NOSIZE, SMTP_BODY_NONE, true },
	{ "<\xe7\x94\xa8\xe6\x88\xb7@\xe4\xbe\x8b\xe5\xad\x90.\xe5\x85\xac\xe5\x8f\xb8> SMTPUTF8",
	  true, 0, "\xe7\x94\xa8\xe6\x88\xb7@\xe4\xbe\x8b\xe5\xad\x90.\xe5\x85\xac\xe5\x8f\xb8",
	  NOSIZE, SMTP_BODY_NONE, true },
	{ "<\"\xc3\xa9 x\"@example.com> SMTPUTF8", true, 0, "\"\xc3\xa9 x\"@example.com", NOSIZE,
	  SMTP_BODY_NONE, true },
	{ "<\xf0\x9f\x93\xa7@example.com> SMTPUTF8", true, 0, "\xf0\x9f\x93\xa7@example.com",
	  NOSIZE, SMTP_BODY_NONE, true },

	/* bad paths: -EINVAL (501 5.1.7) */
	{ "", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "   ", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@b", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@b SIZE=1", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@b>x", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@b>>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<>SIZE=5", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "< a@b>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@b >", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a @b>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<<a@b>>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "a b@c", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "a", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<postmaster>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@b@c>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a..b@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<.a@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a.@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a(b)@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a,b@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\"abc@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\"a\"b@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\"a\\\"@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\"a\tb\"@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\"a\\\tb\"@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\"a\\\xc3\xa9\"@example.com> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\"a\\", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@example..com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@.example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@-example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@example-.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@example.com.>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@ex_ample.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@ex ample.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[192.0.2.256]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[192.0.2]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[2001:db8::1]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[IPv6:2001:db8::g]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[IPv6:192.0.2.1]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[x-tag:foo]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[IPv6:]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[192.0.2.1>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@192.0.2.1]>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@[192.0.2.1]x>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<@a.example u@c.example>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<@:u@c.example>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<@a,b:u@c.example>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<@a,:u@c.example>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<@a:>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<@a.example>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<@-a:u@c>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "@a:u@c", false, -EINVAL, NULL, NOSIZE, 0, false },
	/* the path is judged before the parameters */
	{ "<a..b@x> FOO=1", false, -EINVAL, NULL, NOSIZE, 0, false },
	/* 8-bit that is not UTF-8: a bad path, SMTPUTF8 or not */
	{ "<j\xc3@example.com> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<j\xc3@example.com>", false, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\xc0\xaf@example.com> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\xed\xa0\x80@example.com> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\xf4\x90\x80\x80@example.com> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\xff@example.com> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@b\xc3.example> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<a@\xe0\x80\x80.example> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },
	{ "<\"\xc3\"@example.com> SMTPUTF8", true, -EINVAL, NULL, NOSIZE, 0, false },

	/* 8-bit without SMTPUTF8: -EILSEQ (553 5.6.7) */
	{ "<j\xc3\xb6rg@example.com>", true, -EILSEQ, NULL, NOSIZE, 0, false },
	{ "<j\xc3\xb6rg@example.com>", false, -EILSEQ, NULL, NOSIZE, 0, false },
	{ "<a@b\xc3\xbc" "cher.example> SIZE=1", true, -EILSEQ, NULL, NOSIZE, 0, false },
	{ "<@b\xc3\xbc" "cher.example:a@b>", true, -EILSEQ, NULL, NOSIZE, 0, false },
	{ "<\"\xc3\xa9\"@b>", true, -EILSEQ, NULL, NOSIZE, 0, false },

	/* malformed parameters: -EPROTO (501 5.5.4) */
	{ "<> SIZE=", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE=1a", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE=-1", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE=+1", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE=1=2", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE=123456789012345678901", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE=1 SIZE=1", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE=1 size=2", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> BODY=", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> BODY", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> BODY=7BIT BODY=7BIT", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> BODY=7BIT BODY=8BITMIME", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SMTPUTF8=yes", true, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SMTPUTF8=", true, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SMTPUTF8 SMTPUTF8", true, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> =x", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> -X=1", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> X_Y=1", false, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SI\xc3\xa9ZE=1", true, -EPROTO, NULL, NOSIZE, 0, false },
	{ "<> SIZE=1 <a@b>", false, -EPROTO, NULL, NOSIZE, 0, false },

	/* unknown or unsupported: -ENOTSUP (555 5.5.4) */
	{ "<> FOO=bar", false, -ENOTSUP, NULL, NOSIZE, 0, false },
	{ "<> FOO", false, -ENOTSUP, NULL, NOSIZE, 0, false },
	{ "<> AUTH=<>", false, -ENOTSUP, NULL, NOSIZE, 0, false },
	{ "<> BODY=BINARYMIME", false, -ENOTSUP, NULL, NOSIZE, 0, false },
	{ "<> BODY=8BIT", false, -ENOTSUP, NULL, NOSIZE, 0, false },
	{ "<> SIZE-X=1", false, -ENOTSUP, NULL, NOSIZE, 0, false },
	{ "<> SMTPUTF8", false, -ENOTSUP, NULL, NOSIZE, 0, false },
	/* SMTPUTF8 refused comes before the 8-bit address it would have allowed */
	{ "<j\xc3\xb6rg@example.com> SMTPUTF8", false, -ENOTSUP, NULL, NOSIZE, 0, false },
	{ "<> SIZE=1 FOO=1 SIZE=2", false, -ENOTSUP, NULL, NOSIZE, 0, false },
};

static void test_mail(void **state)
{
	(void)state;
	for (size_t ci = 0; ci < ARRAY_SIZE(mail_cases); ci++) {
		struct str arg = S(mail_cases[ci].arg);
		struct smtp_mail m;
		memset(&m, 0x5a, sizeof(m));
		const char *why = NULL;
		int r = smtp_parse_mail(arg, mail_cases[ci].utf8_allowed, &m, &why);
		if (r != mail_cases[ci].result)
			fail_msg("case %zu (%s): returned %d (%s), expected %d", ci, mail_cases[ci].arg,
				 r, why ? why : "", mail_cases[ci].result);
		if (r < 0) {
			assert_non_null(why);
			assert_true(strlen(why) > 0);
			assert_int_equal(((unsigned char *)&m)[0], 0x5a);
			continue;
		}
		assert_null(why);
		assert_str(m.addr, mail_cases[ci].addr, strlen(mail_cases[ci].addr), "addr", ci);
		assert_true(m.addr.ptr >= arg.ptr && m.addr.ptr + m.addr.len <= arg.ptr + arg.len);
		assert_int_equal(m.has_size, mail_cases[ci].has_size);
		if (m.has_size)
			assert_true(m.size == mail_cases[ci].size);
		assert_int_equal(m.body, mail_cases[ci].body);
		assert_int_equal(m.smtputf8, mail_cases[ci].smtputf8);
	}
	/* a NULL ret_why is fine */
	struct smtp_mail m;
	assert_int_equal(smtp_parse_mail(S("<"), false, &m, NULL), -EINVAL);
	assert_int_equal(smtp_parse_mail(S("<> X"), false, &m, NULL), -ENOTSUP);
}

/* ---- RCPT ---------------------------------------------------------------------------- */

static const struct {
	const char *arg;
	bool utf8;
	int result;
	const char *addr;
	bool postmaster;
} rcpt_cases[] = {
	{ "<b@example.org>", false, 0, "b@example.org", false },
	{ "b@example.org", false, 0, "b@example.org", false },
	{ "<b@example.org>  ", false, 0, "b@example.org", false },
	{ "<postmaster>", false, 0, "postmaster", true },
	{ "<PostMaster>", false, 0, "PostMaster", true },
	{ "postmaster", false, 0, "postmaster", true },
	{ "postmaster  ", false, 0, "postmaster", true },
	{ "<postmaster@example.org>", false, 0, "postmaster@example.org", false },
	{ "<@a.example:b@c.example>", false, 0, "b@c.example", false },
	{ "<@a.example:postmaster>", false, 0, "postmaster", true },
	{ "<b@[192.0.2.1]>", false, 0, "b@[192.0.2.1]", false },
	{ "<\"b c\"@example.org>", false, 0, "\"b c\"@example.org", false },
	{ "<j\xc3\xb6rg@example.org>", true, 0, "j\xc3\xb6rg@example.org", false },
	{ "<b@\xc3\xa9.example>", true, 0, "b@\xc3\xa9.example", false },
	{ "<>", false, -EINVAL, NULL, false },
	{ "", false, -EINVAL, NULL, false },
	{ "<b>", false, -EINVAL, NULL, false },
	{ "<postmasterx>", false, -EINVAL, NULL, false },
	{ "<postmaster", false, -EINVAL, NULL, false },
	{ "<PostMaster", false, -EINVAL, NULL, false },
	{ "<@a.example:postmaster", false, -EINVAL, NULL, false },
	{ "<postmaste>", false, -EINVAL, NULL, false },
	{ "<\"postmaster\">", false, -EINVAL, NULL, false },
	{ "<post.master>", false, -EINVAL, NULL, false },
	{ "<b@example.org", false, -EINVAL, NULL, false },
	{ "<b@example.org>x", false, -EINVAL, NULL, false },
	{ "<b@exa mple.org>", false, -EINVAL, NULL, false },
	{ "<j\xc3@example.org>", true, -EINVAL, NULL, false },
	{ "<j\xc3\xb6rg@example.org>", false, -EILSEQ, NULL, false },
	{ "<b@\xc3\xa9.example>", false, -EILSEQ, NULL, false },
	{ "<b@example.org> NOTIFY=NEVER", false, 0, "b@example.org", false },
	{ "<b@example.org> ORCPT=rfc822;b@example.org", false, 0, "b@example.org", false },
	{ "<b@example.org> RET=FULL", false, -ENOTSUP, NULL, false },
	{ "<b@example.org> SIZE=1", false, -ENOTSUP, NULL, false },
	{ "<postmaster> X", false, -ENOTSUP, NULL, false },
	{ "<b@example.org> =y", false, -EPROTO, NULL, false },
	{ "<b@example.org> _x", false, -EPROTO, NULL, false },
	/* parameters come before the 8-bit question */
	{ "<j\xc3\xb6rg@example.org> NOTIFY=NEVER", false, -EILSEQ, NULL, false },
	{ "<j\xc3\xb6rg@example.org> NOTIFY=NEVR", false, -EPROTO, NULL, false },
};

static void test_rcpt(void **state)
{
	(void)state;
	for (size_t ci = 0; ci < ARRAY_SIZE(rcpt_cases); ci++) {
		struct str arg = S(rcpt_cases[ci].arg);
		struct smtp_rcpt rc;
		memset(&rc, 0x5a, sizeof(rc));
		const char *why = NULL;
		int r = smtp_parse_rcpt(arg, rcpt_cases[ci].utf8, &rc, &why);
		if (r != rcpt_cases[ci].result)
			fail_msg("case %zu (%s): returned %d (%s), expected %d", ci, rcpt_cases[ci].arg,
				 r, why ? why : "", rcpt_cases[ci].result);
		if (r < 0) {
			assert_non_null(why);
			assert_int_equal(((unsigned char *)&rc)[0], 0x5a);
			continue;
		}
		assert_str(rc.addr, rcpt_cases[ci].addr, strlen(rcpt_cases[ci].addr), "addr", ci);
		assert_int_equal(rc.postmaster, rcpt_cases[ci].postmaster);
	}
}

/* RFC 3461 parameters of MAIL: RET and ENVID, checked, returned as sent. */
static const struct {
	const char *arg;
	int result;
	enum smtp_ret ret;
	const char *envid;
} dsn_mail_cases[] = {
	{ "<a@b.example> RET=FULL", 0, SMTP_RET_FULL, "" },
	{ "<a@b.example> ret=hdrs", 0, SMTP_RET_HDRS, "" },
	{ "<a@b.example> RET=HDRS ENVID=QQ314159", 0, SMTP_RET_HDRS, "QQ314159" },
	{ "<> ENVID=a+2Bb+3Dc", 0, SMTP_RET_NONE, "a+2Bb+3Dc" },
	{ "<> ENVID=a+2bb", 0, SMTP_RET_NONE, "a+2bb" },
	{ "<> ENVID=a+20b", 0, SMTP_RET_NONE, "a+20b" },
	{ "<> RET=", -EPROTO, 0, NULL },
	{ "<> RET", -EPROTO, 0, NULL },
	{ "<> RET=BODY", -EPROTO, 0, NULL },
	{ "<> RET=FULL RET=FULL", -EPROTO, 0, NULL },
	{ "<> RET=FULL ret=HDRS", -EPROTO, 0, NULL },
	{ "<> ENVID=", -EPROTO, 0, NULL },
	{ "<> ENVID", -EPROTO, 0, NULL },
	{ "<> ENVID=a ENVID=a", -EPROTO, 0, NULL },
	{ "<> ENVID=a=b", -EPROTO, 0, NULL },      /* "=" is not xchar */
	{ "<> ENVID=a+2", -EPROTO, 0, NULL },      /* "+" and one digit */
	{ "<> ENVID=a+", -EPROTO, 0, NULL },
	{ "<> ENVID=a+GG", -EPROTO, 0, NULL },
	{ "<> ENVID=a+0D+0Ab", -EPROTO, 0, NULL }, /* CR LF: not printable */
	{ "<> ENVID=a+00", -EPROTO, 0, NULL },
	{ "<> ENVID=a+7F", -EPROTO, 0, NULL },
	{ "<> ENVID=a+C3+B6", -EPROTO, 0, NULL },  /* 8-bit */
	{ "<> ENVID=\xc3\xb6", -EPROTO, 0, NULL },
};

/* RFC 3461 parameters of RCPT: NOTIFY and ORCPT. */
static const struct {
	const char *arg;
	int result;
	unsigned notify;
	const char *orcpt_type, *orcpt;
} dsn_rcpt_cases[] = {
	{ "<b@c.example> NOTIFY=NEVER", 0, SMTP_NOTIFY_NEVER, "", "" },
	{ "<b@c.example> notify=Success", 0, SMTP_NOTIFY_SUCCESS, "", "" },
	{ "<b@c.example> NOTIFY=SUCCESS,FAILURE,DELAY", 0,
	  SMTP_NOTIFY_SUCCESS | SMTP_NOTIFY_FAILURE | SMTP_NOTIFY_DELAY, "", "" },
	{ "<b@c.example> NOTIFY=DELAY,FAILURE ORCPT=rfc822;b+2Bx@c.example", 0,
	  SMTP_NOTIFY_DELAY | SMTP_NOTIFY_FAILURE, "rfc822", "b+2Bx@c.example" },
	{ "<b@c.example> ORCPT=RFC822;old@c.example NOTIFY=FAILURE", 0, SMTP_NOTIFY_FAILURE,
	  "RFC822", "old@c.example" },
	{ "<b@c.example> ORCPT=x-local;a;b", 0, 0, "x-local", "a;b" },
	{ "<b@c.example> NOTIFY=", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=NEVER,SUCCESS", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=FAILURE,NEVER", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=SUCCESS,SUCCESS", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=SUCCESS,", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=,SUCCESS", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=SUCCESS,,DELAY", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=ALWAYS", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=NEVER NOTIFY=NEVER", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> ORCPT=rfc822", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> ORCPT=rfc822;", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> ORCPT=;b@c.example", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> ORCPT=rf(c;b@c.example", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> ORCPT=rfc822;b+0A@c.example", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> ORCPT=rfc822;a ORCPT=rfc822;a", -EPROTO, 0, NULL, NULL },
	{ "<b@c.example> NOTIFY=NEVER FOO=1", -ENOTSUP, 0, NULL, NULL },
};

static void test_dsn_params(void **state)
{
	(void)state;
	for (size_t ci = 0; ci < ARRAY_SIZE(dsn_mail_cases); ci++) {
		struct smtp_mail m;
		const char *why = NULL;
		int r = smtp_parse_mail(S(dsn_mail_cases[ci].arg), false, &m, &why);
		if (r != dsn_mail_cases[ci].result)
			fail_msg("mail case %zu (%s): returned %d (%s)", ci, dsn_mail_cases[ci].arg, r,
				 why ? why : "");
		if (r < 0)
			continue;
		assert_int_equal(m.ret, dsn_mail_cases[ci].ret);
		assert_str(m.envid, dsn_mail_cases[ci].envid, strlen(dsn_mail_cases[ci].envid), "envid",
			   ci);
	}
	for (size_t ci = 0; ci < ARRAY_SIZE(dsn_rcpt_cases); ci++) {
		struct smtp_rcpt rc;
		const char *why = NULL;
		int r = smtp_parse_rcpt(S(dsn_rcpt_cases[ci].arg), false, &rc, &why);
		if (r != dsn_rcpt_cases[ci].result)
			fail_msg("rcpt case %zu (%s): returned %d (%s)", ci, dsn_rcpt_cases[ci].arg, r,
				 why ? why : "");
		if (r < 0)
			continue;
		assert_int_equal(rc.notify, dsn_rcpt_cases[ci].notify);
		assert_str(rc.orcpt_type, dsn_rcpt_cases[ci].orcpt_type,
			   strlen(dsn_rcpt_cases[ci].orcpt_type), "orcpt_type", ci);
		assert_str(rc.orcpt, dsn_rcpt_cases[ci].orcpt, strlen(dsn_rcpt_cases[ci].orcpt), "orcpt",
			   ci);
	}
	/* the lengths of RFC 3461: ENVID 100 characters, ORCPT's value 500 */
	char arg[700];
	snprintf(arg, sizeof(arg), "<> ENVID=%0100d", 0);
	struct smtp_mail m;
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, NULL), 0);
	assert_int_equal(m.envid.len, 100);
	snprintf(arg, sizeof(arg), "<> ENVID=%0101d", 0);
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, NULL), -EPROTO);
	struct smtp_rcpt rc;
	snprintf(arg, sizeof(arg), "<b@c.example> ORCPT=rfc822;%0493d", 0); /* 7 + 493 */
	assert_int_equal(smtp_parse_rcpt(S(arg), false, &rc, NULL), 0);
	assert_int_equal(rc.orcpt.len, 493);
	snprintf(arg, sizeof(arg), "<b@c.example> ORCPT=rfc822;%0494d", 0);
	assert_int_equal(smtp_parse_rcpt(S(arg), false, &rc, NULL), -EPROTO);
}

/* xtext both ways (RFC 3461 4). */
static void test_xtext(void **state)
{
	(void)state;
	char out[64];
	size_t n = 99;
	assert_int_equal(smtp_xtext_decode(S("a+2Bb+3dc+20"), out, sizeof(out), &n), 0);
	assert_int_equal(n, 6);
	assert_memory_equal(out, "a+b=c ", 6);
	assert_int_equal(smtp_xtext_decode(S(""), out, sizeof(out), &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(smtp_xtext_decode(S("abc"), out, 2, &n), -ENOBUFS);
	assert_int_equal(smtp_xtext_decode(S("a b"), out, sizeof(out), &n), -EINVAL);
	assert_int_equal(smtp_xtext_decode(S("+0D"), out, sizeof(out), &n), -EINVAL);
	assert_int_equal(smtp_xtext_decode(S("+4"), out, sizeof(out), &n), -EINVAL);
	assert_int_equal(smtp_xtext_encode(S("a+b=c d\x01\xff"), out, sizeof(out), &n), 0);
	assert_int_equal(n, 19);
	assert_memory_equal(out, "a+2Bb+3Dc+20d+01+FF", 19);
	assert_int_equal(smtp_xtext_encode(S("a+"), out, 3, &n), -ENOBUFS);
	assert_int_equal(smtp_xtext_encode(S("a+"), out, 4, &n), 0);
	assert_int_equal(n, 4);
}

/* The limits: labels of 63 and 64 bytes, domains of 255 and 256, addresses of
 * SMTP_MAX_ADDR and one more, a long local part (not limited to 64). */
static void test_address_limits(void **state)
{
	(void)state;
	static char arg[4096];
	struct smtp_mail m;
	struct smtp_rcpt rc;
	const char *why;

	/* label of 63 */
	char label[64];
	memset(label, 'l', 63);
	label[63] = '\0';
	snprintf(arg, sizeof(arg), "<a@%s.example>", label);
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, &why), 0);
	snprintf(arg, sizeof(arg), "<a@%sl.example>", label);
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, &why), -EINVAL);
	assert_string_equal(why, "Domain label too long");
	/* a UTF-8 label is not held to 63 bytes */
	{
		size_t o = (size_t)snprintf(arg, sizeof(arg), "<a@");
		for (int k = 0; k < 30; k++)
			o += (size_t)snprintf(arg + o, sizeof(arg) - o, "\xc3\xa9");
		snprintf(arg + o, sizeof(arg) - o, ".example> SMTPUTF8");
		assert_int_equal(smtp_parse_mail(S(arg), true, &m, &why), 0);
	}

	/* domain of exactly 255: 4 x (62 + dot) + 3 */
	char dom[300];
	size_t o = 0;
	for (int k = 0; k < 4; k++) {
		memset(dom + o, 'd', 62);
		o += 62;
		dom[o++] = '.';
	}
	memcpy(dom + o, "com", 3);
	o += 3;
	dom[o] = '\0';
	assert_int_equal(o, 255);
	snprintf(arg, sizeof(arg), "<a@%s>", dom);
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, &why), 0);
	assert_int_equal(m.addr.len, 257);
	bool is_domain = false;
	assert_int_equal(smtp_check_helo(str_make(dom, 255), &is_domain), 0);
	assert_true(is_domain);
	snprintf(arg, sizeof(arg), "<a@x%s>", dom);
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, &why), -EINVAL);
	assert_string_equal(why, "Domain too long");
	dom[255] = 'x';
	assert_int_equal(smtp_check_helo(str_make(dom, 256), &is_domain), -EINVAL);

	/* the whole address: SMTP_MAX_ADDR bytes pass, one more does not; the local part is
	 * far over 64 and that alone is fine */
	size_t local = SMTP_MAX_ADDR - strlen("@example.com");
	arg[0] = '<';
	memset(arg + 1, 'u', local);
	snprintf(arg + 1 + local, sizeof(arg) - 1 - local, "@example.com>");
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, &why), 0);
	assert_int_equal(m.addr.len, SMTP_MAX_ADDR);
	assert_int_equal(smtp_parse_rcpt(S(arg), false, &rc, &why), 0);
	assert_int_equal(rc.addr.len, SMTP_MAX_ADDR);
	memset(arg + 1, 'u', local + 1);
	snprintf(arg + 2 + local, sizeof(arg) - 2 - local, "@example.com>");
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, &why), -EINVAL);
	assert_string_equal(why, "Address too long");
	assert_int_equal(smtp_parse_rcpt(S(arg), false, &rc, &why), -EINVAL);
	/* a source route does not count */
	dom[255] = '\0';
	snprintf(arg, sizeof(arg), "<@%s:", dom);
	o = strlen(arg);
	memset(arg + o, 'u', local);
	snprintf(arg + o + local, sizeof(arg) - o - local, "@example.com> SIZE=1");
	assert_int_equal(smtp_parse_mail(S(arg), false, &m, &why), 0);
	assert_int_equal(m.addr.len, SMTP_MAX_ADDR);
}

/* ---- HELO ---------------------------------------------------------------------------- */

static const struct {
	const char *arg;
	int result;
	bool is_domain;
} helo_cases[] = {
	{ "mail.example.com", 0, true },
	{ "localhost", 0, true },
	{ "[192.0.2.1]", 0, true },
	{ "[IPv6:2001:db8::25]", 0, true },
	{ "my_host", 0, false },
	{ "example.com.", 0, false },
	{ "[1.2.3]", 0, false },
	{ "192.0.2.1", 0, true }, /* digits are valid labels */
	{ "-x-", 0, false },
	{ "!@#$", 0, false },
	{ "", -EINVAL, false },
	{ "a b", -EINVAL, false },
	{ "a\tb", -EINVAL, false },
	{ "\xc3\xa9.example", -EINVAL, false },
	{ "a\x7f", -EINVAL, false },
};

static void test_helo(void **state)
{
	(void)state;
	for (size_t ci = 0; ci < ARRAY_SIZE(helo_cases); ci++) {
		bool d = !helo_cases[ci].is_domain;
		int r = smtp_check_helo(S(helo_cases[ci].arg), &d);
		if (r != helo_cases[ci].result)
			fail_msg("case %zu (%s): returned %d", ci, helo_cases[ci].arg, r);
		if (r == 0)
			assert_int_equal(d, helo_cases[ci].is_domain);
		assert_int_equal(smtp_check_helo(S(helo_cases[ci].arg), NULL), r);
	}
	assert_int_equal(smtp_check_helo(str_make("a\0b", 3), NULL), -EINVAL);
}

/* ---- DATA ---------------------------------------------------------------------------- */

#define DMAX 8192

struct dres {
	char out[DMAX];
	size_t len;
	size_t end; /* input offset just past the terminator, or NONE */
	uint64_t bare, bare_cr, lines, size;
	size_t max_line;
};

static void dres_check_same(const struct dres *a, const struct dres *b, const char *what,
			    size_t ci)
{
	if (a->len != b->len || memcmp(a->out, b->out, a->len) != 0 || a->end != b->end ||
	    a->bare != b->bare || a->bare_cr != b->bare_cr || a->lines != b->lines ||
	    a->max_line != b->max_line)
		fail_msg("case %zu: %s: output \"%.*s\" end %zu bare %llu (CR %llu) lines %llu "
			 "max %zu, expected \"%.*s\" end %zu bare %llu (CR %llu) lines %llu max %zu",
			 ci, what, (int)b->len, b->out, b->end, (unsigned long long)b->bare,
			 (unsigned long long)b->bare_cr, (unsigned long long)b->lines, b->max_line,
			 (int)a->len, a->out, a->end, (unsigned long long)a->bare,
			 (unsigned long long)a->bare_cr, (unsigned long long)a->lines, a->max_line);
}

/*
 * Decode in[0..n) arriving in the pieces cut at cuts[0..ncuts), with an output buffer of
 * outcap bytes per call; each call on exact-size copies so ASan sees any overrun.
 */
static void decode_pieces(const char *in, size_t n, const size_t *cuts, size_t ncuts,
			  size_t outcap, struct dres *res)
{
	struct smtp_data d;
	smtp_data_init(&d);
	res->len = 0;
	res->end = NONE;
	size_t from = 0;
	for (size_t c = 0; c <= ncuts && res->end == NONE; c++) {
		size_t to = c < ncuts ? cuts[c] : n;
		while (from < to) {
			size_t k = to - from;
			char *win = malloc(k);
			char *out = malloc(outcap);
			assert_true(win && out);
			memcpy(win, in + from, k);
			size_t used = 999999, made = 999999;
			int r = smtp_data_decode(&d, win, k, out, outcap, &used, &made);
			assert_true(used <= k && made <= outcap);
			/* progress, whenever outcap >= SMTP_DATA_MIN_OUT */
			assert_true(used > 0 || made > 0);
			/* enough room always takes everything */
			if (outcap >= SMTP_DATA_OUT_BOUND(k) && !r)
				assert_int_equal(used, k);
			assert_true(res->len + made <= DMAX);
			memcpy(res->out + res->len, out, made);
			res->len += made;
			free(win);
			free(out);
			from += used;
			if (r) {
				res->end = from;
				break;
			}
		}
	}
	res->bare = d.bare_eol;
	res->bare_cr = d.bare_cr;
	assert_true(d.bare_cr <= d.bare_eol);
	res->lines = d.lines;
	res->size = d.size;
	res->max_line = d.max_line;
	assert_true(d.size == res->len);
	assert_int_equal(d.done, res->end != NONE);
	if (res->end != NONE) {
		/* after the end nothing more is taken */
		size_t used = 1, made = 1;
		char out[8];
		assert_int_equal(smtp_data_decode(&d, LIT("x\r\n.\r\n"), out, sizeof(out), &used,
						  &made), 1);
		assert_true(used == 0 && made == 0);
	}
	/* a call with nothing to read does nothing */
	{
		size_t used = 1, made = 1;
		char out[8];
		struct smtp_data d2 = d;
		assert_int_equal(smtp_data_decode(&d2, "", 0, out, sizeof(out), &used, &made),
				 res->end != NONE);
		assert_true(used == 0 && made == 0);
	}
}

/*
 * The reference: the input cut into lines the plain way, with the whole input in view.
 * A line is the bytes up to CRLF, LF, a CR not followed by LF, or the end of the input
 * (then unfinished: what is still undecided is not produced).
 */
static void ref_decode(const char *in, size_t n, struct dres *r)
{
	r->len = 0;
	r->end = NONE;
	r->bare = r->bare_cr = r->lines = 0;
	r->max_line = 0;
	bool after_crlf = true;
	size_t i = 0;
	while (i < n) {
		size_t s = i;
		while (i < n && in[i] != '\r' && in[i] != '\n')
			i++;
		size_t tl = i - s;
		enum { E_NONE, E_CRLF, E_LF, E_CR, E_CR_AT_END } eol;
		if (i == n)
			eol = E_NONE;
		else if (in[i] == '\n')
			eol = E_LF, i++;
		else if (i + 1 == n)
			eol = E_CR_AT_END, i++;
		else if (in[i + 1] == '\n')
			eol = E_CRLF, i += 2;
		else
			eol = E_CR, i++;
		bool unfinished = eol == E_NONE || eol == E_CR_AT_END;
		if (tl == 1 && in[s] == '.') {
			if (after_crlf && eol == E_CRLF) {
				r->end = i;
				break;
			}
			if (unfinished)
				break;
			r->out[r->len++] = '.';
			if (r->max_line < 1)
				r->max_line = 1;
		} else {
			size_t skip = tl && in[s] == '.';
			memcpy(r->out + r->len, in + s + skip, tl - skip);
			r->len += tl - skip;
			if (r->max_line < tl - skip)
				r->max_line = tl - skip;
		}
		if (unfinished)
			break;
		r->out[r->len++] = '\r';
		r->out[r->len++] = '\n';
		r->lines++;
		if (eol != E_CRLF)
			r->bare++;
		if (eol == E_CR)
			r->bare_cr++;
		after_crlf = eol == E_CRLF;
	}
	/* the end, defined once more: the first "\r\n.\r\n" in "\r\n" + input */
	char *buf = malloc(n + 2);
	assert_non_null(buf);
	memcpy(buf, "\r\n", 2);
	memcpy(buf + 2, in, n);
	const char *at = memmem(buf, n + 2, "\r\n.\r\n", 5);
	size_t end = at ? (size_t)(at - buf) + 3 : NONE;
	free(buf);
	assert_int_equal(end, r->end);
}

static const struct {
	const char *in;
	size_t len;
	const char *out;
	size_t out_len;
	size_t end;
	uint64_t bare;
	size_t max_line;
} data_cases[] = {
	/* the empty message, and simple ones */
	{ LIT(".\r\n"), E(""), 3, 0, 0 },
	{ LIT("a\r\n.\r\n"), E("a\r\n"), 6, 0, 1 },
	{ LIT("\r\n.\r\n"), E("\r\n"), 5, 0, 0 },
	{ LIT("\r\n\r\n.\r\n"), E("\r\n\r\n"), 7, 0, 0 },
	{ LIT("Subject: x\r\n\r\nbody\r\n.\r\n"), E("Subject: x\r\n\r\nbody\r\n"), 23, 0, 10 },
	/* dot-unstuffing */
	{ LIT("..\r\n.\r\n"), E(".\r\n"), 7, 0, 1 },
	{ LIT("...\r\n.\r\n"), E("..\r\n"), 8, 0, 2 },
	{ LIT(".a\r\n.\r\n"), E("a\r\n"), 7, 0, 1 },
	{ LIT("a\r\n..\r\n.\r\n"), E("a\r\n.\r\n"), 10, 0, 1 },
	{ LIT(". \r\n.\r\n"), E(" \r\n"), 7, 0, 1 },
	{ LIT("x.\r\n.\r\n"), E("x.\r\n"), 7, 0, 2 },
	{ LIT("a.b\r\n.x\r\n.\r\n"), E("a.b\r\nx\r\n"), 12, 0, 3 },
	/* a "." followed by more is content, unstuffed */
	{ LIT(".\r\nX"), E(""), 3, 0, 0 },
	{ LIT(".x\r\n.\r\n"), E("x\r\n"), 7, 0, 1 },
	{ LIT("a\r\n.\r\nMAIL FROM:<>\r\n"), E("a\r\n"), 6, 0, 1 },
	/* smuggling: none of these ends the data; each stores a content line "." */
	{ LIT("a\n.\nb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 10, 2, 1 },
	{ LIT("a\r\n.\nb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 11, 1, 1 },
	{ LIT("a\n.\r\nb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 11, 1, 1 },
	{ LIT("a\r.\rb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 10, 2, 1 },
	{ LIT("a\r.\r\nb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 11, 1, 1 },
	{ LIT("a\r\n.\rb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 11, 1, 1 },
	{ LIT("\n.\n"), E("\r\n.\r\n"), NONE, 2, 1 },
	{ LIT("\r\n.\n"), E("\r\n.\r\n"), NONE, 1, 1 },
	{ LIT("\n.\r\n"), E("\r\n.\r\n"), NONE, 1, 1 },
	{ LIT("\r.\r"), E("\r\n"), NONE, 1, 0 },
	{ LIT("\r.\rx"), E("\r\n.\r\nx"), NONE, 2, 1 },
	{ LIT(".\n"), E(".\r\n"), NONE, 1, 1 },
	{ LIT(".\r"), E(""), NONE, 0, 0 },
	{ LIT(".\rx"), E(".\r\nx"), NONE, 1, 1 },
	{ LIT("a\r\n.\n\r\nMAIL FROM:<x@y>\r\n.\r\n"), E("a\r\n.\r\n\r\nMAIL FROM:<x@y>\r\n"),
	  27, 1, 15 },
	{ LIT("a\n.\nMAIL FROM:<x@y>\nRCPT TO:<z@w>\nDATA\n\n.\n"),
	  E("a\r\n.\r\nMAIL FROM:<x@y>\r\nRCPT TO:<z@w>\r\nDATA\r\n\r\n.\r\n"), NONE, 7, 15 },
	/* after a bare line end, "." CRLF is content, but the CRLF it ends with counts */
	{ LIT("a\n.\r\n.\r\n"), E("a\r\n.\r\n"), 8, 1, 1 },
	{ LIT("\n.\r\n.\r\n"), E("\r\n.\r\n"), 7, 1, 1 },
	/* a stuffed dot after a bare line end is still dropped; a "." line is kept */
	{ LIT("a\n..\n.\r\n"), E("a\r\n.\r\n.\r\n"), NONE, 2, 1 },
	{ LIT("a\n.x\r\n.\r\n"), E("a\r\nx\r\n"), 9, 1, 1 },
	/* bare CR and LF inside the text */
	{ LIT("a\rb\r\n.\r\n"), E("a\r\nb\r\n"), 8, 1, 1 },
	{ LIT("a\nb\r\n.\r\n"), E("a\r\nb\r\n"), 8, 1, 1 },
	{ LIT("a\r\r\n.\r\n"), E("a\r\n\r\n"), 7, 1, 1 },
	{ LIT("a\n\r\n.\r\n"), E("a\r\n\r\n"), 7, 1, 1 },
	{ LIT("a\r\rb\r\n.\r\n"), E("a\r\n\r\nb\r\n"), 9, 2, 1 },
	{ LIT("a\n\n\n.\r\n"), E("a\r\n\r\n\r\n.\r\n"), NONE, 3, 1 },
	{ LIT("a\r\n.\r\r\n.\r\n"), E("a\r\n.\r\n\r\n"), 10, 1, 1 },
	{ LIT("a\r\n.\r.\r\n.\r\n"), E("a\r\n.\r\n.\r\n"), 11, 1, 1 },
	/* unfinished input: what is still undecided is held back */
	{ LIT("a"), E("a"), NONE, 0, 1 },
	{ LIT("a\r"), E("a"), NONE, 0, 1 },
	{ LIT("a\r\n"), E("a\r\n"), NONE, 0, 1 },
	{ LIT("a\r\n."), E("a\r\n"), NONE, 0, 1 },
	{ LIT("a\r\n.\r"), E("a\r\n"), NONE, 0, 1 },
	{ LIT("a\r\n.."), E("a\r\n."), NONE, 0, 1 },
	{ LIT(""), E(""), NONE, 0, 0 },
	/* bytes kept as they are */
	{ LIT("\0\x80\xff\t\x1b\r\n.\r\n"), E("\0\x80\xff\t\x1b\r\n"), 10, 0, 5 },
	{ LIT(".\0\r\n.\r\n"), E("\0\r\n"), 7, 0, 1 },
};

/* Decode case ci every way there is; all must equal the whole-input decoding. */
static void decode_every_way(const char *in, size_t n, const struct dres *want, size_t ci)
{
	static struct dres got;
	size_t cuts[DMAX];
	/* one byte at a time, with several output sizes */
	for (size_t k = 0; k < n; k++)
		cuts[k] = k + 1;
	const size_t caps[] = { SMTP_DATA_MIN_OUT, 4, 5, 7, 64, DMAX };
	for (size_t c = 0; c < ARRAY_SIZE(caps); c++) {
		decode_pieces(in, n, cuts, n ? n - 1 : 0, caps[c], &got);
		dres_check_same(want, &got, "byte by byte", ci);
		decode_pieces(in, n, NULL, 0, caps[c], &got);
		dres_check_same(want, &got, "whole, small output", ci);
	}
	if (n <= 14) {
		/* every set of cuts */
		for (unsigned long mask = 0; mask < (1ul << (n ? n - 1 : 0)); mask++) {
			size_t nc = 0;
			for (size_t k = 1; k < n; k++)
				if (mask & (1ul << (k - 1)))
					cuts[nc++] = k;
			decode_pieces(in, n, cuts, nc, DMAX, &got);
			dres_check_same(want, &got, "cut set", ci);
			decode_pieces(in, n, cuts, nc, SMTP_DATA_MIN_OUT, &got);
			dres_check_same(want, &got, "cut set, small output", ci);
		}
	} else {
		/* every one and two cuts */
		for (size_t a = 0; a <= n; a++)
			for (size_t b = a; b <= n; b++) {
				cuts[0] = a;
				cuts[1] = b;
				decode_pieces(in, n, cuts, 2, DMAX, &got);
				dres_check_same(want, &got, "two cuts", ci);
			}
	}
}

static void test_data_table(void **state)
{
	(void)state;
	static struct dres whole, ref;
	for (size_t ci = 0; ci < ARRAY_SIZE(data_cases); ci++) {
		const char *in = data_cases[ci].in;
		size_t n = data_cases[ci].len;
		decode_pieces(in, n, NULL, 0, DMAX, &whole);
		if (whole.len != data_cases[ci].out_len ||
		    memcmp(whole.out, data_cases[ci].out, whole.len) != 0)
			fail_msg("case %zu: output \"%.*s\"", ci, (int)whole.len, whole.out);
		if (whole.end != data_cases[ci].end)
			fail_msg("case %zu: end %zu, expected %zu", ci, whole.end, data_cases[ci].end);
		if (whole.bare != data_cases[ci].bare)
			fail_msg("case %zu: bare_eol %llu", ci, (unsigned long long)whole.bare);
		if (whole.max_line != data_cases[ci].max_line)
			fail_msg("case %zu: max_line %zu", ci, whole.max_line);
		ref_decode(in, n, &ref);
		dres_check_same(&ref, &whole, "against the reference", ci);
		decode_every_way(in, n, &whole, ci);
	}
}

/*
 * Bare line ends in DATA, under both settings of intake.bare_newline: "normalize" stores
 * the output (every line end CRLF), "reject" refuses the message at its end with the
 * reply smtp_data_bare_why() gives (NULL: the message is stored, as under normalize).
 * Neither changes where the data ends: only at CRLF "." CRLF.  Each case is also decoded
 * every way of cutting it (a CR ending one read and its LF starting the next is a CRLF).
 */
static const struct {
	const char *in;
	size_t len;
	const char *out; /* stored under normalize */
	size_t out_len;
	size_t end;
	uint64_t bare_lf, bare_cr;
	const char *reject_why; /* the 550 5.5.2 text under reject; NULL: stored */
} data_bare_cases[] = {
	{ LIT("a\r\nb\r\n.\r\n"), E("a\r\nb\r\n"), 9, 0, 0, NULL },
	{ LIT("a\nb\r\n.\r\n"), E("a\r\nb\r\n"), 8, 1, 0, "bare <LF> received" },
	{ LIT("a\rb\r\n.\r\n"), E("a\r\nb\r\n"), 8, 0, 1, "bare <CR> received" },
	{ LIT("a\rb\nc\r\n.\r\n"), E("a\r\nb\r\nc\r\n"), 10, 1, 1, "bare <LF> received" },
	{ LIT("a\r\r\n.\r\n"), E("a\r\n\r\n"), 7, 0, 1, "bare <CR> received" },
	/* the smuggling forms: content, never the end, under both settings */
	{ LIT("a\n.\nMAIL FROM:<x@y>\r\n.\r\n"), E("a\r\n.\r\nMAIL FROM:<x@y>\r\n"), 24, 2,
	  0, "bare <LF> received" },
	{ LIT("a\r.\rMAIL FROM:<x@y>\r\n.\r\n"), E("a\r\n.\r\nMAIL FROM:<x@y>\r\n"), 24, 0,
	  2, "bare <CR> received" },
	{ LIT("a\r\n.\nb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 11, 1, 0, "bare <LF> received" },
	{ LIT("a\n.\r\nb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 11, 1, 0, "bare <LF> received" },
	{ LIT("a\r.\r\nb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 11, 0, 1, "bare <CR> received" },
	{ LIT("a\r\n.\rb\r\n.\r\n"), E("a\r\n.\r\nb\r\n"), 11, 0, 1, "bare <CR> received" },
	{ LIT("a\n.\n"), E("a\r\n.\r\n"), NONE, 2, 0, "bare <LF> received" },
	{ LIT("a\r.\r"), E("a\r\n"), NONE, 0, 1, "bare <CR> received" },
	{ LIT("a\r\n.\n"), E("a\r\n.\r\n"), NONE, 1, 0, "bare <LF> received" },
	{ LIT("a\n.\r\n"), E("a\r\n.\r\n"), NONE, 1, 0, "bare <LF> received" },
	/* CRLF only, in pieces: nothing bare */
	{ LIT("Subject: x\r\n\r\nline\r\n..dot\r\n.\r\n"), E("Subject: x\r\n\r\nline\r\n.dot\r\n"),
	  30, 0, 0, NULL },
};

static void test_data_bare(void **state)
{
	(void)state;
	static struct dres whole, ref;
	for (size_t ci = 0; ci < ARRAY_SIZE(data_bare_cases); ci++) {
		const char *in = data_bare_cases[ci].in;
		size_t n = data_bare_cases[ci].len;
		struct smtp_data d;
		smtp_data_init(&d);
		assert_null(smtp_data_bare_why(&d));
		static char out[DMAX];
		size_t used, made;
		int done = smtp_data_decode(&d, in, n, out, sizeof(out), &used, &made);
		/* normalize: the stored bytes, and the end */
		if (made != data_bare_cases[ci].out_len ||
		    memcmp(out, data_bare_cases[ci].out, made) != 0)
			fail_msg("case %zu: stored \"%.*s\"", ci, (int)made, out);
		assert_int_equal(done, data_bare_cases[ci].end != NONE);
		if (done)
			assert_int_equal(used, data_bare_cases[ci].end);
		if (d.bare_eol - d.bare_cr != data_bare_cases[ci].bare_lf ||
		    d.bare_cr != data_bare_cases[ci].bare_cr)
			fail_msg("case %zu: %llu bare LF, %llu bare CR", ci,
				 (unsigned long long)(d.bare_eol - d.bare_cr),
				 (unsigned long long)d.bare_cr);
		/* reject: the reply */
		const char *why = smtp_data_bare_why(&d);
		if (data_bare_cases[ci].reject_why)
			assert_string_equal(why, data_bare_cases[ci].reject_why);
		else
			assert_null(why);
		/* every way of cutting it gives the same, and the reference agrees */
		decode_pieces(in, n, NULL, 0, DMAX, &whole);
		ref_decode(in, n, &ref);
		dres_check_same(&ref, &whole, "against the reference", ci);
		decode_every_way(in, n, &whole, ci);
	}
}

/* Every string of up to 8 bytes over { CR, LF, ".", "a" }: whole, byte by byte, and
 * against the reference. */
static void test_data_exhaustive(void **state)
{
	(void)state;
	static const char alphabet[] = { '\r', '\n', '.', 'a' };
	static struct dres whole, bytewise, ref;
	char in[8];
	size_t cuts[8];
	for (size_t n = 0; n <= 8; n++) {
		size_t total = (size_t)1 << (2 * n);
		for (size_t k = 0; k < n; k++)
			cuts[k] = k + 1;
		for (size_t x = 0; x < total; x++) {
			for (size_t k = 0; k < n; k++)
				in[k] = alphabet[(x >> (2 * k)) & 3];
			decode_pieces(in, n, NULL, 0, DMAX, &whole);
			ref_decode(in, n, &ref);
			dres_check_same(&ref, &whole, "exhaustive, against the reference", x);
			decode_pieces(in, n, cuts, n ? n - 1 : 0, SMTP_DATA_MIN_OUT, &bytewise);
			dres_check_same(&whole, &bytewise, "exhaustive, byte by byte", x);
		}
	}
}

/* Long lines are measured (after unstuffing), as they grow; the counters add up. */
static void test_data_counters(void **state)
{
	(void)state;
	static char in[3000];
	size_t n = 0;
	memset(in, 'x', 1000);
	n = 1000;
	memcpy(in + n, "\r\n.", 3);
	n += 3;
	memset(in + n, 'y', 998);
	n += 998;
	memcpy(in + n, "\r\nz\n.\r\n", 7);
	n += 7;

	struct smtp_data d;
	smtp_data_init(&d);
	static char out[4000];
	size_t used, made;
	/* 500 bytes in: the current line counts already */
	assert_int_equal(smtp_data_decode(&d, in, 500, out, sizeof(out), &used, &made), 0);
	assert_true(used == 500 && made == 500 && d.max_line == 500 && d.line_len == 500);
	assert_int_equal(smtp_data_decode(&d, in + 500, n - 500, out + 500, sizeof(out) - 500,
					  &used, &made),
			 0);
	/* "\n.\r\n" after a bare LF is content */
	assert_int_equal(used, n - 500);
	assert_true(d.max_line == 1000 && d.lines == 4 && d.bare_eol == 1);
	assert_true(d.size == 1000 + 2 + 998 + 2 + 1 + 2 + 1 + 2);
	assert_int_equal(smtp_data_decode(&d, LIT(".\r\n"), out, sizeof(out), &used, &made), 1);
	assert_true(used == 3 && made == 0 && d.done);

	/* one output byte short of a step: nothing is consumed for it */
	smtp_data_init(&d);
	assert_int_equal(smtp_data_decode(&d, LIT("ab\r\n"), out, 3, &used, &made), 0);
	assert_true(used == 3 && made == 2); /* "ab" and the CR pending */
	assert_int_equal(smtp_data_decode(&d, LIT("\n"), out, 1, &used, &made), 0);
	assert_true(used == 0 && made == 0);
	assert_int_equal(smtp_data_decode(&d, LIT("\n"), out, 2, &used, &made), 0);
	assert_true(used == 1 && made == 2 && memcmp(out, "\r\n", 2) == 0);
	/* outcap 0 does nothing */
	assert_int_equal(smtp_data_decode(&d, LIT("x"), out, 0, &used, &made), 0);
	assert_true(used == 0 && made == 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lines),
		cmocka_unit_test(test_line_discard),
		cmocka_unit_test(test_commands),
		cmocka_unit_test(test_line_ends),
		cmocka_unit_test(test_mail),
		cmocka_unit_test(test_rcpt),
		cmocka_unit_test(test_dsn_params),
		cmocka_unit_test(test_xtext),
		cmocka_unit_test(test_address_limits),
		cmocka_unit_test(test_helo),
		cmocka_unit_test(test_data_table),
		cmocka_unit_test(test_data_bare),
		cmocka_unit_test(test_data_exhaustive),
		cmocka_unit_test(test_data_counters),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
