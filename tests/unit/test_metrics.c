/*
 * test_metrics -- unit tests of the exposition format and the endpoint
 * (src/daemon/metrics.c).
 *
 * The format is compared exactly: label values with a backslash, a quote and a newline
 * escaped as the format requires, integers printed exactly up to 2^64-1, special floats
 * as +Inf/-Inf/NaN, and a histogram's buckets cumulative with +Inf equal to _count.  The
 * endpoint is started on an ephemeral loopback port and asked over a real socket: the
 * page, 404, 405, and a render error as 500.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "metrics.h"
#include "util.h"

static void test_samples(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 1 << 20);
	struct metrics_label l[2] = { { "rule", "a\\b\"c\nd" }, { "verdict", NULL } };
	assert_int_equal(metrics_family(&b, "x_total", "counter", "Things."), 0);
	assert_int_equal(metrics_sample_u64(&b, "x_total", l, 2, UINT64_MAX), 0);
	assert_int_equal(metrics_sample_u64(&b, "x_total", NULL, 0, 0), 0);
	assert_int_equal(metrics_sample(&b, "y", l + 1, 1, INFINITY), 0);
	assert_int_equal(metrics_sample(&b, "y", NULL, 0, -INFINITY), 0);
	assert_int_equal(metrics_sample(&b, "y", NULL, 0, NAN), 0);
	assert_int_equal(metrics_sample(&b, "y", NULL, 0, 0.25), 0);
	assert_int_equal(buf_append_byte(&b, '\0'), 0);
	assert_string_equal(b.ptr,
			    "# HELP x_total Things.\n"
			    "# TYPE x_total counter\n"
			    "x_total{rule=\"a\\\\b\\\"c\\nd\",verdict=\"\"} 18446744073709551615\n"
			    "x_total 0\n"
			    "y{verdict=\"\"} +Inf\n"
			    "y -Inf\n"
			    "y NaN\n"
			    "y 0.25\n");
	buf_done(&b);
}

static void test_histogram(void **state)
{
	(void)state;
	struct stat_hist h = { 0 };
	stat_hist_add(&h, 0.0005);
	stat_hist_add(&h, 0.002);
	stat_hist_add(&h, 0.002);
	stat_hist_add(&h, 1000.0);
	struct buf b;
	buf_init(&b, 1 << 20);
	struct metrics_label l = { "service", "milter" };
	assert_int_equal(metrics_histogram(&b, "d_seconds", &l, 1, &h), 0);
	assert_int_equal(buf_append_byte(&b, '\0'), 0);
	const char *want[] = {
		"d_seconds_bucket{service=\"milter\",le=\"0.001\"} 1\n",
		"d_seconds_bucket{service=\"milter\",le=\"0.0025\"} 3\n",
		"d_seconds_bucket{service=\"milter\",le=\"60\"} 3\n",
		"d_seconds_bucket{service=\"milter\",le=\"+Inf\"} 4\n",
		"d_seconds_sum{service=\"milter\"} 1000.0045",
		"d_seconds_count{service=\"milter\"} 4\n",
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		if (!strstr(b.ptr, want[i]))
			fail_msg("missing %s in:\n%s", want[i], b.ptr);
	/* 15 edges and +Inf, then _sum and _count */
	size_t lines = 0;
	for (const char *p = b.ptr; *p; p++)
		lines += *p == '\n';
	assert_int_equal(lines, STAT_HIST_BUCKETS + 2);
	buf_done(&b);
}

static int fail_render;

static int render(void *arg, struct buf *out)
{
	(void)arg;
	if (fail_render)
		return -ENOBUFS;
	metrics_family(out, "up", "gauge", "Always 1.");
	return metrics_sample_u64(out, "up", NULL, 0, 1);
}

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* One request, the whole answer (HTTP/1.0: the server closes). */
static void ask(int port, const char *request, char *out, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(write(fd, request, strlen(request)), (ssize_t)strlen(request));
	size_t n = 0;
	ssize_t r;
	while (n + 1 < len && (r = read(fd, out + n, len - 1 - n)) > 0)
		n += (size_t)r;
	out[n] = '\0';
	close(fd);
}

static void test_endpoint(void **state)
{
	(void)state;
	char addr[64], err[256], out[4096];
	int port = free_port();
	snprintf(addr, sizeof(addr), "inet:127.0.0.1:%d", port);
	struct metrics *m = NULL;
	assert_int_equal(metrics_new(addr, 2, render, NULL, &m, err, sizeof(err)), 0);
	assert_int_equal(metrics_start(m), 0);

	ask(port, "GET /metrics HTTP/1.0\r\n\r\n", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.0 200"));
	assert_non_null(strstr(out, "Content-Type: text/plain; version=0.0.4"));
	assert_non_null(strstr(out, "\r\n\r\n# HELP up Always 1.\n# TYPE up gauge\nup 1\n"));
	ask(port, "GET /other HTTP/1.0\r\n\r\n", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.0 404"));
	ask(port, "DELETE /metrics HTTP/1.0\r\n\r\n", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.0 405"));
	assert_non_null(strstr(out, "Allow: GET, HEAD"));
	ask(port, "NONSENSE\r\n\r\n", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.1 400"));
	fail_render = 1;
	ask(port, "GET /metrics HTTP/1.0\r\n\r\n", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.0 500"));
	fail_render = 0;
	m = metrics_free(m);
	assert_null(m);

	/* the address is taken: a precise error */
	struct metrics *m1 = NULL, *m2 = NULL;
	assert_int_equal(metrics_new(addr, 2, render, NULL, &m1, err, sizeof(err)), 0);
	assert_true(metrics_new(addr, 2, render, NULL, &m2, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, "127.0.0.1"));
	assert_true(metrics_new("tcp:1", 2, render, NULL, &m2, err, sizeof(err)) < 0);
	metrics_free(m1); /* never started */
}

/* /proc/PID/stat: a command name holding ") (" and digits, starttime after btime, and
 * lines cut short or malformed refused (the samples are then left out, not 0). */
static void test_proc_stat(void **state)
{
	(void)state;
	/* fields 1..24: pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
	 * majflt cmajflt utime stime cutime cstime priority nice threads itrealvalue
	 * starttime vsize rss */
	static const char line[] = "42 (a) 1 2 (x) S 1 42 42 0 -1 4194560 10 0 0 0 "
				   "250 150 0 0 20 -5 7 0 123456 104857600 2560 18446744073709551615 "
				   "1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";
	struct metrics_proc_stat ps;
	assert_int_equal(metrics_proc_stat_parse(line, 100, 4096, 1700000000, &ps), 0);
	assert_true(ps.cpu_seconds == 4.0);
	assert_true(ps.start_time == 1700000000.0 + 1234.56);
	assert_int_equal(ps.threads, 7);
	assert_int_equal(ps.vsize, 104857600);
	assert_int_equal(ps.rss, 2560 * 4096);
	static const char *const bad[] = {
		"", "42 (a", "42 (a)", "42 (a) ", "42 (a) S", "42 (a) S 1 42 42 0 -1 4194560 10",
		"42 (a) S 1 42 42 0 -1 4194560 10 0 0 0 250 150 0 0 20 -5 7 0 123456 104857600",
		"42 (a) S 1 42 42 0 -1 4194560 10 0 0 0 250 150 0 0 20 -5 7 0 x 104857600 2560",
		"42 (a)S 1 42 42 0 -1 4194560 10 0 0 0 250 150 0 0 20 -5 7 0 123456 1 2560",
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		struct metrics_proc_stat untouched = { .cpu_seconds = -1 };
		assert_int_equal(metrics_proc_stat_parse(bad[i], 100, 4096, 1, &untouched), -EINVAL);
		assert_true(untouched.cpu_seconds == -1);
	}

	assert_int_equal(metrics_boot_time_parse("cpu  1 2 3\nintr 5 6\nbtime 1700000000\n"
						 "processes 9\n"), 1700000000);
	assert_int_equal(metrics_boot_time_parse("btime 17\n"), 17);
	assert_int_equal(metrics_boot_time_parse("cpu 1\nxbtime 17\nbtime\n"), 0);
	assert_int_equal(metrics_boot_time_parse(""), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_samples),
		cmocka_unit_test(test_proc_stat),
		cmocka_unit_test(test_histogram),
		cmocka_unit_test(test_endpoint),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
