/*
 * test_log -- unit tests of the log's journal prefixes (src/lib/log.c).
 *
 * fd 2 is replaced by a pipe the test made, JOURNAL_STREAM set to that pipe's (or another
 * file's) device and inode, and the lines read back: with a match each line starts with
 * its sd-daemon(3) priority, "<7>" debug to "<2>" crit; with any mismatch (another file,
 * a malformed value, no variable, target syslog) the lines are as they always were.  The
 * decision is taken by log_setup(), not per line.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

struct capture {
	int saved;      /* the real fd 2 */
	int rd;         /* the pipe's read end; its write end is fd 2 */
	char env[64];   /* "DEV:INO" of the pipe */
};

static void capture_start(struct capture *c)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	assert_int_equal(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
	struct stat st;
	assert_int_equal(fstat(p[1], &st), 0);
	snprintf(c->env, sizeof(c->env), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	c->saved = dup(STDERR_FILENO);
	assert_true(c->saved >= 0);
	assert_int_equal(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
	close(p[1]);
	c->rd = p[0];
}

/* capture_start(), with JOURNAL_STREAM naming the capture. */
static void capture_journal(struct capture *c)
{
	capture_start(c);
	setenv("JOURNAL_STREAM", c->env, 1);
}

/* Restores fd 2 and returns what was written to it (NUL-terminated, in out). */
static void capture_end(struct capture *c, char *out, size_t outlen)
{
	assert_int_equal(dup2(c->saved, STDERR_FILENO), STDERR_FILENO);
	close(c->saved);
	ssize_t n = read(c->rd, out, outlen - 1);
	out[n > 0 ? n : 0] = '\0';
	close(c->rd);
}

static const struct {
	enum log_level level;
	const char *prefix;
} levels[] = {
	{ LOG_LEVEL_DEBUG, "<7>" },   { LOG_LEVEL_INFO, "<6>" },  { LOG_LEVEL_NOTICE, "<5>" },
	{ LOG_LEVEL_WARNING, "<4>" }, { LOG_LEVEL_ERROR, "<3>" }, { LOG_LEVEL_CRIT, "<2>" },
};

/* Logs one line per level and checks that each starts with its priority (prefixed) or
 * with its date (not). env: JOURNAL_STREAM's value, "SELF" for the pipe's, NULL unset. */
static void check_lines(const char *env, bool prefixed)
{
	struct capture c;
	char got[8192];
	capture_start(&c);
	if (env)
		setenv("JOURNAL_STREAM", strcmp(env, "SELF") == 0 ? c.env : env, 1);
	else
		unsetenv("JOURNAL_STREAM");
	log_setup(LOG_TARGET_STDERR, LOG_MAIL, LOG_LEVEL_DEBUG);
	for (size_t i = 0; i < ARRAY_SIZE(levels); i++)
		log_msg(levels[i].level, "line %zu", i);
	capture_end(&c, got, sizeof(got));
	char *save, *line = strtok_r(got, "\n", &save);
	for (size_t i = 0; i < ARRAY_SIZE(levels); i++, line = strtok_r(NULL, "\n", &save)) {
		assert_non_null(line);
		char tail[64];
		snprintf(tail, sizeof(tail), "%s: line %zu", log_level_name(levels[i].level), i);
		if (prefixed) {
			/* "<6>info: line 1": the journal adds the time and the identifier */
			assert_memory_equal(line, levels[i].prefix, 3);
			assert_string_equal(line + 3, tail);
			continue;
		}
		size_t ll = strlen(line), tl = strlen(tail);
		assert_true(ll > tl + 2);
		assert_string_equal(line + ll - tl, tail);
		assert_memory_equal(line + ll - tl - 2, ": ", 2);
		/* "2026-11-27T15:04:05.123 sluiced[PID]: info: line 1" */
		assert_true(line[0] >= '0' && line[0] <= '9');
		assert_int_equal(line[4], '-');
		assert_non_null(strstr(line, " sluiced["));
	}
	assert_null(line);
}

static void test_journal_prefixes(void **state)
{
	(void)state;
	check_lines("SELF", true);
	assert_false(log_stderr_is_journal());   /* fd 2 is back to the test's */
}

static void test_not_the_journal(void **state)
{
	(void)state;
	/* another file's device and inode: stderr was redirected away from the journal */
	struct stat st;
	assert_int_equal(stat("/", &st), 0);
	char other[64];
	snprintf(other, sizeof(other), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	check_lines(other, false);
	static const char *const malformed[] = {
		"", ":", "1", "1:", ":1", "x:y", "1:2:3", "1 :2", "99999999999999999999999:1",
	};
	for (size_t i = 0; i < ARRAY_SIZE(malformed); i++)
		check_lines(malformed[i], false);
	check_lines(NULL, false);
}

/* A malformed value that starts like the right one is refused too; log_stderr_prefix()
 * decides on the spot. */
static void test_trailing_junk(void **state)
{
	(void)state;
	struct capture c;
	char got[4096], env[80];
	capture_start(&c);
	snprintf(env, sizeof(env), "%sx", c.env);
	setenv("JOURNAL_STREAM", env, 1);
	assert_false(log_stderr_is_journal());
	assert_string_equal(log_stderr_prefix(LOG_LEVEL_ERROR), "");
	setenv("JOURNAL_STREAM", c.env, 1);
	assert_true(log_stderr_is_journal());
	/* the lines a program writes itself before log_setup() */
	assert_string_equal(log_stderr_prefix(LOG_LEVEL_ERROR), "<3>");
	assert_string_equal(log_stderr_prefix(LOG_LEVEL_WARNING), "<4>");
	assert_string_equal(log_stderr_prefix(LOG_LEVEL_DEBUG), "<7>");
	capture_end(&c, got, sizeof(got));
}

/* Decided at log_setup(), not per line: a later change to the environment or to fd 2
 * counts only from the next log_setup() (a reload). */
static void test_decided_at_setup(void **state)
{
	(void)state;
	struct capture c;
	char got[4096];
	capture_journal(&c);
	log_setup(LOG_TARGET_STDERR, LOG_MAIL, LOG_LEVEL_INFO);
	unsetenv("JOURNAL_STREAM");
	log_msg(LOG_LEVEL_ERROR, "one");
	log_setup(LOG_TARGET_STDERR, LOG_MAIL, LOG_LEVEL_INFO);
	log_msg(LOG_LEVEL_ERROR, "two");
	capture_end(&c, got, sizeof(got));
	char *nl = strchr(got, '\n');
	assert_non_null(nl);
	assert_memory_equal(got, "<3>", 3);
	assert_true(nl[1] >= '0' && nl[1] <= '9');
	assert_non_null(strstr(nl, ": error: two\n"));
}

/* target syslog never prefixes stderr (nothing goes there). */
static void test_syslog_target(void **state)
{
	(void)state;
	struct capture c;
	char got[4096];
	capture_journal(&c);
	log_setup(LOG_TARGET_SYSLOG, LOG_MAIL, LOG_LEVEL_INFO);
	log_msg(LOG_LEVEL_WARNING, "to syslog");
	log_setup(LOG_TARGET_STDERR, LOG_MAIL, LOG_LEVEL_INFO);
	log_msg(LOG_LEVEL_WARNING, "back");
	capture_end(&c, got, sizeof(got));
	assert_null(strstr(got, "to syslog"));
	assert_memory_equal(got, "<4>", 3);
	assert_string_equal(got, "<4>warning: back\n");
	closelog();
}

/* In the journal a message's CR, LF or other control character becomes a space: an LF
 * would start a second entry at the stream's default level, or one whose "<N>" the
 * message chose.  Elsewhere the line is left as it was. */
static void test_journal_control_chars(void **state)
{
	(void)state;
	struct capture c;
	char got[4096];
	capture_journal(&c);
	log_setup(LOG_TARGET_STDERR, LOG_MAIL, LOG_LEVEL_INFO);
	log_msg(LOG_LEVEL_INFO, "a\n<2>forged\r\tb\x01\x7f%s", "\nc");
	log_msg(LOG_LEVEL_ERROR, "next");
	capture_end(&c, got, sizeof(got));
	assert_string_equal(got, "<6>info: a <2>forged  b   c\n<3>error: next\n");

	capture_start(&c);
	unsetenv("JOURNAL_STREAM");
	log_setup(LOG_TARGET_STDERR, LOG_MAIL, LOG_LEVEL_INFO);
	log_msg(LOG_LEVEL_INFO, "x\ny");
	capture_end(&c, got, sizeof(got));
	assert_non_null(strstr(got, ": info: x\ny\n"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_journal_prefixes),
		cmocka_unit_test(test_not_the_journal),
		cmocka_unit_test(test_journal_control_chars),
		cmocka_unit_test(test_trailing_junk),
		cmocka_unit_test(test_decided_at_setup),
		cmocka_unit_test(test_syslog_target),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	unsetenv("JOURNAL_STREAM");
	return r;
}
