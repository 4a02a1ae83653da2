/*
 * queue_index_bench -- what the queue's index costs at a million messages
 * (src/queue/queue_table.c), and how fast the loader fills it from msg/ at start.
 *
 *   queue_index_bench [N]            N entries (default 1,000,000) of one recipient
 *                                    each: bytes per entry (the heap's growth over
 *                                    N), and the time of inserts in order, look-ups,
 *                                    inserts out of order and removes
 *   queue_index_bench --load DIR [N] write N one-recipient queue files (default
 *                                    100,000) into an empty DIR, then open the queue
 *                                    and time its load: messages per second
 *
 * Not a test: it prints figures (bench/README.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "queue.h"
#include "queue_table.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t heap_used(void)
{
	struct mallinfo2 mi = mallinfo2();
	return mi.uordblks + mi.hblkhd;
}

/* A sender and one recipient, as the intake would give them (about 20 bytes each). */
static size_t names(char *out, size_t len, size_t i)
{
	int a = snprintf(out, len, "sender%zu@example.net", i % 1000);
	int b = snprintf(out + a + 1, len - (size_t)a - 1, "user%zu@example.org", i);
	return (size_t)a + 1 + (size_t)b + 1;
}

static int bench_index(size_t n)
{
	char (*ids)[QUEUE_ID_LEN + 1] = malloc(n * sizeof(*ids));
	if (!ids)
		return 1;
	uint64_t t0 = 1795621433044806u;
	for (size_t i = 0; i < n; i++)
		queue_id_make(ids[i], t0 + i * 37, (uint32_t)i);
	struct queue_table t;
	queue_table_init(&t);
	size_t before = heap_used(), payload = 0;
	double s = now_s();
	for (size_t i = 0; i < n; i++) {
		char nm[128];
		size_t len = names(nm, sizeof(nm), i);
		struct qentry *e = qentry_new(ids[i], t0 + i * 37, 1000, nm, len, 1);
		if (!e || queue_table_insert(&t, e) < 0)
			return 1;
		payload += qentry_bytes(e);
	}
	double ins = now_s() - s;
	size_t after = heap_used();
	s = now_s();
	size_t found = 0;
	for (size_t i = 0; i < n; i++)
		found += queue_table_get(&t, ids[(i * 7919) % n]) != NULL;
	double get = now_s() - s;
	s = now_s();
	for (size_t i = 0; i < n; i += 2)
		qentry_free(queue_table_remove(&t, ids[i]));
	double rem = now_s() - s;
	/* the removed half again, out of order (the loader's old IDs among new ones) */
	s = now_s();
	for (size_t i = 0; i < n; i += 2) {
		char nm[128];
		size_t len = names(nm, sizeof(nm), i);
		struct qentry *e = qentry_new(ids[i], t0 + i * 37, 1000, nm, len, 1);
		if (!e || queue_table_insert(&t, e) < 0)
			return 1;
	}
	double mid = now_s() - s;
	printf("index: %zu entries of one recipient\n", n);
	printf("  memory: %.0f bytes per entry (heap growth), %.0f of them the entry itself\n",
	       (double)(after - before) / (double)n, (double)payload / (double)n);
	printf("  insert in order %.0f ns, look-up %.0f ns (%zu found), remove %.0f ns, insert "
	       "between others %.0f ns\n", ins / (double)n * 1e9, get / (double)n * 1e9, found,
	       rem / (double)(n / 2) * 1e9, mid / (double)(n / 2) * 1e9);
	queue_table_clear(&t);
	free(ids);
	return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *b = p;
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int bench_load(const char *dir, size_t n)
{
	/* the layout, by opening the queue once */
	struct queue_conf qc = { .dir = dir };
	struct queue *q;
	char err[512];
	if (queue_open(&qc, NULL, NULL, &q, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	queue_free(q);
	double s = now_s();
	uint64_t t0 = (uint64_t)time(NULL) * 1000000u - n * 50;
	struct buf out;
	buf_init(&out, 1 << 20);
	for (size_t i = 0; i < n; i++) {
		struct queue_envelope env = { .arrival_us = t0 + i * 50,
					      .sender = str_cstr("sender@example.net"),
					      .client = str_cstr("[127.0.0.1]"),
					      .helo = str_cstr("bench.test") };
		queue_id_make(env.id, env.arrival_us, (uint32_t)i);
		char rcpt[64];
		snprintf(rcpt, sizeof(rcpt), "user%zu@example.org", i);
		buf_reset(&out);
		struct queue_writer *w = queue_writer_new(&out);
		if (!w || queue_write_head(w, &env) < 0 || queue_write_rcpt(w, str_cstr(rcpt)) < 0 ||
		    queue_write_body(w, str_cstr("Subject: bench\r\n\r\nbody\r\n")) < 0 ||
		    queue_write_end(w) < 0)
			return 1;
		queue_writer_free(w);
		char path[512];
		snprintf(path, sizeof(path), "%s/msg/%c/%s", dir, env.id[QUEUE_ID_BUCKET], env.id);
		int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
		if (fd < 0 || write_all(fd, out.ptr, out.len) < 0) {
			perror(path);
			return 1;
		}
		close(fd);
	}
	buf_done(&out);
	printf("load: %zu files written in %.1f s\n", n, now_s() - s);
	sync();
	s = now_s();
	if (queue_open(&qc, NULL, NULL, &q, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	double open_s = now_s() - s;
	if (queue_start(q) < 0 || queue_wait_loaded(q) < 0)
		return 1;
	double load_s = now_s() - s;
	struct queue_stats st;
	queue_stats(q, &st);
	printf("  queue_open %.3f s; %" PRIu64 " messages loaded in %.1f s: %.0f messages/s "
	       "(page cache warm)\n", open_s, st.messages, load_s, (double)st.messages / load_s);
	queue_free(q);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && strcmp(argv[1], "--load") == 0)
		return bench_load(argv[2], argc > 3 ? strtoul(argv[3], NULL, 10) : 100000);
	return bench_index(argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000);
}
