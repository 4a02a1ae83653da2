/*
 * test_sockspec -- unit tests of socket strings (src/lib/sockspec.c).
 *
 * Table-driven: every form sluice, libmilter, Sendmail and Postfix write, with the family,
 * host, port or path it means and the socket address it resolves to; text that must be
 * refused, with a word of the error it must give; the bounds (port 1 and 65535, a unix
 * path of exactly sizeof sun_path - 1 bytes and one more).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include <cmocka.h>

#include "sockspec.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static const struct {
	const char *text;
	int family;
	const char *host;    /* as parsed ("" = every address); NULL for unix */
	unsigned port;
	const char *path;    /* unix */
	const char *address; /* numeric address it resolves to (NULL: not resolved here) */
} good[] = {
	/* sluice's own forms */
	{ "unix:/run/sluice/milter.sock", AF_UNIX, NULL, 0, "/run/sluice/milter.sock", NULL },
	{ "/run/sluice/control.sock", AF_UNIX, NULL, 0, "/run/sluice/control.sock", NULL },
	{ "inet:127.0.0.1:10025", AF_INET, "127.0.0.1", 10025, NULL, "127.0.0.1" },
	{ "inet:*:25", AF_INET, "", 25, NULL, "0.0.0.0" },
	{ "inet:0.0.0.0:25", AF_INET, "0.0.0.0", 25, NULL, "0.0.0.0" },
	{ "inet:localhost:9187", AF_INET, "localhost", 9187, NULL, "127.0.0.1" },
	{ "inet:[::1]:10025", AF_INET6, "::1", 10025, NULL, "::1" },
	{ "inet6:[::1]:10025", AF_INET6, "::1", 10025, NULL, "::1" },
	{ "inet6:[2001:db8::5]:1", AF_INET6, "2001:db8::5", 1, NULL, "2001:db8::5" },
	{ "inet6:*:25", AF_INET6, "", 25, NULL, "::" },
	{ "inet6:localhost:25", AF_INET6, "localhost", 25, NULL, "::1" },
	{ "inet:mx.example.org:25", AF_INET, "mx.example.org", 25, NULL, NULL },
	/* libmilter's (smfi_setconn), Sendmail's INPUT_MAIL_FILTER S= */
	{ "local:/var/run/milter.sock", AF_UNIX, NULL, 0, "/var/run/milter.sock", NULL },
	{ "LOCAL:/x", AF_UNIX, NULL, 0, "/x", NULL },
	{ "UNIX:/x", AF_UNIX, NULL, 0, "/x", NULL },
	{ "unix:relative.sock", AF_UNIX, NULL, 0, "relative.sock", NULL },
	{ "inet:8891@127.0.0.1", AF_INET, "127.0.0.1", 8891, NULL, "127.0.0.1" },
	{ "inet:8891@[127.0.0.1]", AF_INET, "127.0.0.1", 8891, NULL, "127.0.0.1" },
	{ "INET:8891@localhost", AF_INET, "localhost", 8891, NULL, "127.0.0.1" },
	{ "inet:8891@milter.example.org", AF_INET, "milter.example.org", 8891, NULL, NULL },
	{ "inet:8891@milter.example.org.", AF_INET, "milter.example.org.", 8891, NULL, NULL },
	{ "inet:8891", AF_INET, "", 8891, NULL, "0.0.0.0" },
	{ "inet:65535", AF_INET, "", 65535, NULL, "0.0.0.0" },
	{ "inet6:8891", AF_INET6, "", 8891, NULL, "::" },
	{ "inet6:8891@::1", AF_INET6, "::1", 8891, NULL, "::1" },
	{ "inet6:8891@[::1]", AF_INET6, "::1", 8891, NULL, "::1" },
	{ "Inet6:8891@[2001:DB8::1]", AF_INET6, "2001:DB8::1", 8891, NULL, "2001:db8::1" },
	{ "inet6:8891@localhost", AF_INET6, "localhost", 8891, NULL, "::1" },
	{ "inet:8891@[::1]", AF_INET6, "::1", 8891, NULL, "::1" },
	/* a link-local address with its zone (the loopback interface always exists) */
	{ "inet6:[fe80::1%lo]:25", AF_INET6, "fe80::1%lo", 25, NULL, "fe80::1" },
	{ "inet6:25@fe80::1%lo", AF_INET6, "fe80::1%lo", 25, NULL, "fe80::1" },
	/* names that merely contain digits */
	{ "inet:25@mx1.example", AF_INET, "mx1.example", 25, NULL, NULL },
	{ "inet:25@123.example", AF_INET, "123.example", 25, NULL, NULL },
	{ "inet:25@3com.com", AF_INET, "3com.com", 25, NULL, NULL },
};

static void test_good(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(good); i++) {
		struct sockspec s;
		char err[300] = "";
		int r = sockspec_parse(good[i].text, &s, err, sizeof(err));
		if (r != 0)
			fail_msg("%s: refused: %s", good[i].text, err);
		assert_int_equal(s.family, good[i].family);
		if (good[i].family == AF_UNIX) {
			assert_string_equal(s.path, good[i].path);
			assert_true(sockspec_is_unix(good[i].text));
			continue;
		}
		assert_false(sockspec_is_unix(good[i].text));
		if (strcmp(s.host, good[i].host) != 0)
			fail_msg("%s: host \"%s\", want \"%s\"", good[i].text, s.host, good[i].host);
		assert_int_equal(s.port, good[i].port);
		if (!good[i].address)
			continue;
		struct sockaddr_storage ss;
		socklen_t len;
		r = sockspec_resolve(&s, &ss, &len, err, sizeof(err));
		if (r != 0)
			fail_msg("%s: not resolved: %s", good[i].text, err);
		char shown[INET6_ADDRSTRLEN];
		const void *a = ss.ss_family == AF_INET
					? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
					: (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
		inet_ntop(ss.ss_family, a, shown, sizeof(shown));
		if (strcmp(shown, good[i].address) != 0)
			fail_msg("%s: resolved to %s, want %s", good[i].text, shown, good[i].address);
		unsigned port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
							     : ((struct sockaddr_in6 *)&ss)->sin6_port);
		assert_int_equal(port, good[i].port);
		assert_int_equal(len, ss.ss_family == AF_INET ? sizeof(struct sockaddr_in)
							      : sizeof(struct sockaddr_in6));
	}
}

static const struct {
	const char *text;
	const char *why; /* a part of the error */
} bad[] = {
	{ "", "empty" },
	{ "127.0.0.1:25", "expected unix:/path" },
	{ "tcp:127.0.0.1:25", "unknown socket type \"tcp\"" },
	{ "unix:", "empty unix socket path" },
	{ "local:", "empty unix socket path" },
	{ "inet:", "missing port" },
	{ "inet6:", "missing port" },
	{ "inet:127.0.0.1:", "missing port" },
	{ "inet:@127.0.0.1", "missing port" },
	{ "inet:0@127.0.0.1", "port 0 is out of range" },
	{ "inet:65536@127.0.0.1", "port 65536 is out of range" },
	{ "inet:99999999999999999999", "out of range" },
	{ "inet:127.0.0.1:0", "port 0 is out of range" },
	{ "inet:0", "port 0 is out of range" },
	{ "inet:025@127.0.0.1", "port 025: leading zeros are not allowed" },
	{ "inet:127.0.0.1:08891", "port 08891: leading zeros are not allowed" },
	/* an IPv6 address followed by a port is bracketed */
	{ "inet6:::1:10025", "is written in brackets: inet6:[::1]:10025" },
	{ "inet6:2001:db8::1:8891", "is written in brackets: inet6:[2001:db8::1]:8891" },
	{ "inet:2001:db8::1:8891", "is written in brackets" },
	/* names getaddrinfo() would read as odd addresses (RFC 1123 2.1) */
	{ "inet:25@127.1", "neither a dotted-quad address (a.b.c.d) nor a host name" },
	{ "inet:25@1234", "neither a dotted-quad address" },
	{ "inet:25@0x7f000001", "neither a dotted-quad address" },
	{ "inet:25@0x7f.1", "neither a dotted-quad address" },
	{ "inet:mail.example.123:25", "last label is not all digits" },
	{ "inet:25@10.0.0.1.", "neither a dotted-quad address" },
	/* IPv4-mapped IPv6: written as the IPv4 address */
	{ "inet6:[::ffff:127.0.0.1]:8891", "IPv4-mapped address, which sluice does not bind or "
	  "connect to; write inet:127.0.0.1:8891" },
	{ "inet6:8891@[::ffff:10.1.2.3]", "write inet:10.1.2.3:8891" },
	{ "inet:[::ffff:7f00:1]:25", "write inet:127.0.0.1:25" },
	/* a zone follows a link-local address only, and names an interface */
	{ "inet6:[2001:db8::1%eth0]:25", "a zone (%interface) follows only a link-local" },
	{ "inet6:[fe80::1%]:25", "a zone (%interface) follows only a link-local" },
	{ "inet6:[fe80::1%eth 0]:25", "a zone" },
	{ "inet6:[fe80::1%abcdefghijklmnop]:25", "a zone" },
	{ "inet:25@host%eth0", "a zone" },
	/* control characters are not echoed raw */
	{ "inet:25@a\x1b[2Jb", "\"inet:25@a?[2Jb\": \"a?[2Jb\" is neither" },
	{ "inet:smtp@127.0.0.1", "port \"smtp\" is not a number" },
	{ "inet:+25@127.0.0.1", "is not a number" },
	{ "inet:25 @127.0.0.1", "is not a number" },
	{ "inet:127.0.0.1:25x", "is not a number" },
	{ "inet:25@", "empty host" },
	{ "inet::25", "empty host" },
	{ "inet:25@[]", "empty host" },
	{ "inet:25@[127.0.0.1", "expected port@[address]" },
	{ "inet:25@[mx.example.org]", "is not a numeric address" },
	{ "inet:[::1]25", "expected [address]:port" },
	{ "inet:[::1:25", "missing \"]\"" },
	{ "inet:25@bad_host", "neither an address nor a host name" },
	{ "inet:25@-bad.example", "neither an address nor a host name" },
	{ "inet:25@a..b", "neither an address nor a host name" },
	{ "inet:25@127.0.0.1@x", "neither an address nor a host name" },
	{ "inet:host name:25", "neither an address nor a host name" },
	{ "inet6:25@127.0.0.1", "is an IPv4 address" },
	{ "inet6:[127.0.0.1]:25", "is an IPv4 address" },
};

static void test_bad(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		struct sockspec s;
		memset(&s, 0x5a, sizeof(s));
		char err[300] = "";
		int r = sockspec_parse(bad[i].text, &s, err, sizeof(err));
		if (r != -EINVAL)
			fail_msg("\"%s\": accepted", bad[i].text);
		if (!strstr(err, bad[i].why))
			fail_msg("\"%s\": error \"%s\" lacks \"%s\"", bad[i].text, err, bad[i].why);
		/* the text itself is quoted first (printable text: as written) */
		if (strchr(bad[i].text, '\x1b'))
			continue;
		char quoted[300];
		snprintf(quoted, sizeof(quoted), "\"%s\": ", bad[i].text);
		if (strncmp(err, quoted, strlen(quoted)) != 0)
			fail_msg("\"%s\": error \"%s\" does not quote it", bad[i].text, err);
		assert_int_equal(s.port, 0x5a5a); /* untouched on failure */
	}
}

/* Which form takes IPv4 clients on an inet6 wildcard: libmilter's (it leaves IPV6_V6ONLY
 * alone), not sluice's own. */
static void test_dual_stack(void **state)
{
	(void)state;
	static const struct {
		const char *text;
		bool dual;
	} cases[] = {
		{ "inet6:8891", true },       { "inet6:8891@[::]", true },
		{ "inet6:8891@::", true },    { "inet6:8891@*", true },
		{ "inet6:[::]:8891", false }, { "inet6:*:8891", false },
		{ "inet6:8891@::1", false },  { "inet:8891", false },
		{ "inet:[::]:8891", false },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct sockspec s;
		char err[300];
		assert_int_equal(sockspec_parse(cases[i].text, &s, err, sizeof(err)), 0);
		if (s.dual_stack != cases[i].dual)
			fail_msg("%s: dual_stack %d", cases[i].text, s.dual_stack);
	}
}

/* A look-up's error quotes the whole string; a zone names an interface that exists. */
static void test_resolve_errors(void **state)
{
	(void)state;
	struct sockspec s;
	struct sockaddr_storage ss;
	socklen_t len;
	char err[400];
	assert_int_equal(sockspec_parse("inet:18891@nonexistent.invalid", &s, err, sizeof(err)), 0);
	assert_false(s.numeric);
	assert_int_equal(sockspec_resolve(&s, &ss, &len, err, sizeof(err)), -EHOSTUNREACH);
	static const char want[] = "\"inet:18891@nonexistent.invalid\": nonexistent.invalid: ";
	if (strncmp(err, want, strlen(want)) != 0)
		fail_msg("error \"%s\"", err);
	assert_int_equal(sockspec_parse("inet6:[fe80::1%nosuchif0]:25", &s, err, sizeof(err)), 0);
	assert_int_equal(sockspec_resolve(&s, &ss, &len, err, sizeof(err)), -EHOSTUNREACH);
	assert_non_null(strstr(err, "\"inet6:[fe80::1%nosuchif0]:25\": fe80::1%nosuchif0: "));
	assert_int_equal(sockspec_parse("inet6:[fe80::1%lo]:25", &s, err, sizeof(err)), 0);
	assert_int_equal(sockspec_resolve(&s, &ss, &len, err, sizeof(err)), 0);
	assert_int_equal(((struct sockaddr_in6 *)&ss)->sin6_scope_id, if_nametoindex("lo"));
}

static void test_bounds(void **state)
{
	(void)state;
	struct sockspec s;
	char err[300], text[400];
	/* a path of exactly sizeof sun_path - 1 bytes fits, one more does not */
	assert_int_equal(SOCKSPEC_PATH_MAX, sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
	char path[SOCKSPEC_PATH_MAX + 2];
	memset(path, 'p', sizeof(path));
	path[0] = '/';
	path[SOCKSPEC_PATH_MAX] = '\0';
	snprintf(text, sizeof(text), "unix:%s", path);
	assert_int_equal(sockspec_parse(text, &s, err, sizeof(err)), 0);
	assert_int_equal(strlen(s.path), SOCKSPEC_PATH_MAX);
	struct sockaddr_storage ss;
	socklen_t len;
	assert_int_equal(sockspec_resolve(&s, &ss, &len, err, sizeof(err)), 0);
	assert_string_equal(((struct sockaddr_un *)&ss)->sun_path, path);
	assert_int_equal(sockspec_parse(path, &s, err, sizeof(err)), 0);
	path[SOCKSPEC_PATH_MAX] = 'p';
	path[SOCKSPEC_PATH_MAX + 1] = '\0';
	snprintf(text, sizeof(text), "local:%s", path);
	assert_int_equal(sockspec_parse(text, &s, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "longer than 107 bytes"));
	/* the whole string is bounded; its quote in the error is cut at 100 bytes */
	char longtext[SOCKSPEC_TEXT_MAX + 2];
	memset(longtext, 'a', sizeof(longtext));
	memcpy(longtext, "inet:25@", 8);
	longtext[SOCKSPEC_TEXT_MAX + 1] = '\0';
	assert_int_equal(sockspec_parse(longtext, &s, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "...\": longer than 255 bytes"));
	/* ports at both ends */
	assert_int_equal(sockspec_parse("inet:1@127.0.0.1", &s, err, sizeof(err)), 0);
	assert_int_equal(s.port, 1);
	assert_int_equal(sockspec_parse("inet:127.0.0.1:65535", &s, err, sizeof(err)), 0);
	assert_int_equal(s.port, 65535);
	/* a label of 63 bytes is a host name, 64 is not */
	char host[100];
	memset(host, 'h', 63);
	host[63] = '\0';
	snprintf(text, sizeof(text), "inet:25@%s.example", host);
	assert_int_equal(sockspec_parse(text, &s, err, sizeof(err)), 0);
	snprintf(text, sizeof(text), "inet:25@h%s.example", host);
	assert_int_equal(sockspec_parse(text, &s, err, sizeof(err)), -EINVAL);
	/* a short error buffer is cut, not overrun */
	char tiny[8];
	assert_int_equal(sockspec_parse("inet:0", &s, tiny, sizeof(tiny)), -EINVAL);
	assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good),
		cmocka_unit_test(test_bad),
		cmocka_unit_test(test_bounds),
		cmocka_unit_test(test_dual_stack),
		cmocka_unit_test(test_resolve_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
