/*
 * loadgen.c -- the plumbing milter_load and policy_load share; see loadgen.h.
 *
 * Nothing here knows a mail protocol: the programs speak theirs through struct
 * loadgen_ops and their own connection states.  Messages are the programs' own
 * wording, prefixed with loadgen_prog, so that both tools print what they printed
 * before this code was shared.
 */
#include "loadgen.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

const char *loadgen_prog = "loadgen";

static volatile sig_atomic_t interrupted;
static char rbuf[65536];

_Noreturn void loadgen_check_failed(const char *expr, const char *file, int line)
{
	fprintf(stderr, "%s: internal error: %s failed at %s:%d\n", loadgen_prog, expr, file,
	    line);
	abort();
}

_Noreturn void loadgen_fatal(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", loadgen_prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

_Noreturn void loadgen_vstop(const char *head, const char *fmt, va_list ap)
{
	char why[256];

	/* A message: truncation is harmless here, as in every snprintf into "why". */
	vsnprintf(why, sizeof why, fmt, ap);
	loadgen_fatal("%s: %s; stopping", head, why);
}

uint64_t loadgen_clock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * LOADGEN_NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* ---- options --------------------------------------------------------------------- */

unsigned long long loadgen_parse_num(const char *s, unsigned long long min,
    unsigned long long max, const char *what)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v < min || v > max)
		loadgen_fatal("bad %s: %s (%llu..%llu)", what, s, min, max);
	return v;
}

double loadgen_parse_secs(const char *s, const char *what)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !(v >= 0) || v > 86400)
		loadgen_fatal("bad %s: %s (seconds)", what, s);
	return v;
}

/* getopt_long() values of the common long options, and where a program's own begin. */
enum {
	OPT_JSON = 256,
	OPT_LABEL,
	OPT_PID,
	OPT_OWN,
};

#define COMMON_SHORT_OPTS "c:hn:p:t:T:w:"

static const struct option common_longs[] = {
	{ "json", no_argument, NULL, OPT_JSON },
	{ "label", required_argument, NULL, OPT_LABEL },
	{ "pid", required_argument, NULL, OPT_PID },
	{ "help", no_argument, NULL, 'h' },
};

/* Applies option ch (getopt_long's return) with argument arg, one the program does not
 * take itself: a common one, or -h, or an unknown one. */
static void common_opt(struct loadgen_opts *o, int ch, const char *arg, const char *count_what,
    void (*usage)(FILE *f))
{
	switch (ch) {
	case 'c': o->concurrency = (unsigned)loadgen_parse_num(arg, 1, 1000000, "concurrency"); break;
	case 'n': o->count = loadgen_parse_num(arg, 1, UINT64_MAX / 2, count_what); break;
	case 'p': o->target = arg; break;
	case 't': o->duration = loadgen_parse_secs(arg, "duration"); break;
	case 'T': o->timeout = loadgen_parse_secs(arg, "timeout"); break;
	case 'w': o->warmup = loadgen_parse_secs(arg, "warm-up"); break;
	case OPT_JSON: o->json = true; break;
	case OPT_LABEL: o->label = arg; break;
	case OPT_PID: o->pid = (long)loadgen_parse_num(arg, 1, 1u << 30, "pid"); break;
	case 'h': usage(stdout); exit(0);
	default: usage(stderr); exit(2);
	}
}

/* Stores the value of a program's own option a (its argument arg). */
static void own_opt(const struct loadgen_arg *a, const char *arg)
{
	switch (a->kind) {
	case LOADGEN_ARG_UNSIGNED:
		*(unsigned *)a->dst = (unsigned)loadgen_parse_num(arg, a->min, a->max, a->what);
		break;
	case LOADGEN_ARG_SIZE:
		*(size_t *)a->dst = (size_t)loadgen_parse_num(arg, a->min, a->max, a->what);
		break;
	case LOADGEN_ARG_FLAG:
		*(bool *)a->dst = true;
		break;
	}
}

void loadgen_parse_args(struct loadgen_opts *o, int argc, char **argv,
    const struct loadgen_arg *args, size_t n, const char *count_what,
    void (*usage)(FILE *f))
{
	size_t ncommon = sizeof common_longs / sizeof common_longs[0];
	struct option longs[LOADGEN_ARGS_MAX + sizeof common_longs / sizeof common_longs[0] + 1];
	char shorts[2 * LOADGEN_ARGS_MAX + sizeof COMMON_SHORT_OPTS];
	size_t nl = 0, ns = 0;
	int ch;

	LOADGEN_CHECK(n <= LOADGEN_ARGS_MAX);
	for (size_t i = 0; i < n; i++) {
		bool has_arg = args[i].kind != LOADGEN_ARG_FLAG;
		int val = args[i].short_name ? args[i].short_name : OPT_OWN + (int)i;

		if (args[i].short_name) {
			shorts[ns++] = (char)args[i].short_name;
			if (has_arg)
				shorts[ns++] = ':';
		}
		if (args[i].long_name)
			longs[nl++] = (struct option){ args[i].long_name,
				has_arg ? required_argument : no_argument, NULL, val };
	}
	memcpy(shorts + ns, COMMON_SHORT_OPTS, sizeof COMMON_SHORT_OPTS);
	memcpy(longs + nl, common_longs, sizeof common_longs);
	longs[nl + ncommon] = (struct option){ NULL, 0, NULL, 0 };

	while ((ch = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
		const struct loadgen_arg *a = NULL;

		for (size_t i = 0; i < n && a == NULL; i++)
			if (ch == (args[i].short_name ? args[i].short_name : OPT_OWN + (int)i))
				a = &args[i];
		if (a != NULL)
			own_opt(a, optarg);
		else
			common_opt(o, ch, optarg, count_what, usage);
	}

	if (optind < argc && o->target == NULL)
		o->target = argv[optind++];
	if (optind != argc || o->target == NULL) {
		usage(stderr);
		exit(2);
	}
	if (o->count == 0 && o->duration == 0)
		o->duration = 5;
	if (o->timeout <= 0)
		loadgen_fatal("the timeout must be above 0");
}

/* ---- latency --------------------------------------------------------------------- */

static unsigned hist_index(uint64_t v)
{
	unsigned msb, shift, top, idx;

	if (v < 2 * LOADGEN_HIST_SUB)
		return (unsigned)v;
	msb = 63u - (unsigned)__builtin_clzll(v);
	shift = msb - 7u;
	top = (unsigned)(v >> shift);
	idx = 2 * LOADGEN_HIST_SUB + (shift - 1) * LOADGEN_HIST_SUB + (top - LOADGEN_HIST_SUB);
	return idx < LOADGEN_HIST_BUCKETS ? idx : LOADGEN_HIST_BUCKETS - 1;
}

/* Middle of bucket idx, in the unit of the recorded values. */
static double hist_mid(unsigned idx)
{
	unsigned k, shift, top;

	if (idx < 2 * LOADGEN_HIST_SUB)
		return idx;
	k = idx - 2 * LOADGEN_HIST_SUB;
	shift = k / LOADGEN_HIST_SUB + 1;
	top = k % LOADGEN_HIST_SUB + LOADGEN_HIST_SUB;
	return (double)((uint64_t)top << shift) + (double)((1ull << shift) - 1) / 2.0;
}

void loadgen_hist_add(struct loadgen_hist *h, uint64_t v)
{
	h->count++;
	h->sum += (double)v;
	if (v > h->max)
		h->max = v;
	h->bucket[hist_index(v)]++;
}

double loadgen_hist_quantile(const struct loadgen_hist *h, double q)
{
	uint64_t want, seen = 0;
	double v;

	if (h->count == 0)
		return 0;
	want = (uint64_t)ceil(q * (double)h->count);
	if (want < 1)
		want = 1;
	for (unsigned i = 0; i < LOADGEN_HIST_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen >= want) {
			v = hist_mid(i);
			return v > (double)h->max ? (double)h->max : v;
		}
	}
	return (double)h->max;
}

/* ---- the server process (--pid), from /proc ---------------------------------------- */

double loadgen_proc_cpu(long pid)
{
	char path[64], buf[1024];
	unsigned long long ut, st;
	const char *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof path, "/proc/%ld/stat", pid);
	f = fopen(path, "r");
	if (f == NULL)
		return -1;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* comm may hold spaces and parentheses: the fields start after the last ')'. */
	p = strrchr(buf, ')');
	if (p == NULL)
		return -1;
	/* state is field 3; utime and stime are fields 14 and 15. */
	if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

int loadgen_proc_status(long pid, long *ret_threads, long *ret_rss_kb)
{
	char path[64], line[256];
	long threads = -1, rss = -1;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%ld/status", pid);
	f = fopen(path, "r");
	if (f == NULL)
		return -errno;
	while (fgets(line, sizeof line, f) != NULL) {
		if (strncmp(line, "Threads:", 8) == 0)
			threads = strtol(line + 8, NULL, 10);
		else if (strncmp(line, "VmRSS:", 6) == 0)
			rss = strtol(line + 6, NULL, 10);
	}
	fclose(f);
	if (threads < 0 || rss < 0)
		return -ENODATA;
	*ret_threads = threads;
	*ret_rss_kb = rss;
	return 0;
}

void loadgen_proc_sample(struct loadgen_proc *p)
{
	long threads, rss;

	if (p->pid <= 0 || loadgen_proc_status(p->pid, &threads, &rss) < 0)
		return;
	if (threads > p->threads_max)
		p->threads_max = threads;
	if (rss > p->rss_kb_max)
		p->rss_kb_max = rss;
}

/* The load phase starts: CPU time, threads and RSS at its start. */
static void proc_load_start(struct loadgen_proc *p)
{
	long threads;

	if (p->pid <= 0)
		return;
	p->cpu_start = loadgen_proc_cpu(p->pid);
	if (p->cpu_start >= 0 && loadgen_proc_status(p->pid, &threads, &p->rss_kb_load) == 0) {
		p->ok = true;
		p->threads_max = threads;
		p->rss_kb_max = p->rss_kb_load;
	}
}

static void proc_load_end(struct loadgen_proc *p)
{
	if (!p->ok)
		return;
	loadgen_proc_sample(p);
	p->cpu_end = loadgen_proc_cpu(p->pid);
	if (p->cpu_end < 0)
		p->ok = false;
}

/* ---- setup --------------------------------------------------------------------------- */

/* unix:/path, local:/path, /path, inet:host:port, inet:port@host, inet6:[addr]:port. */
static void parse_target(struct loadgen *lg, const char *t)
{
	struct addrinfo hints, *res;
	char host[256], port[32];
	const char *rest, *at, *colon;
	int r;

	if (strncmp(t, "unix:", 5) == 0 || strncmp(t, "local:", 6) == 0 || t[0] == '/') {
		struct sockaddr_un *sun = (struct sockaddr_un *)&lg->addr;
		const char *path = t[0] == '/' ? t : strchr(t, ':') + 1;

		if (strlen(path) >= sizeof sun->sun_path)
			loadgen_fatal("socket path too long: %s", path);
		memset(sun, 0, sizeof *sun);
		sun->sun_family = AF_UNIX;
		memcpy(sun->sun_path, path, strlen(path) + 1);
		lg->family = AF_UNIX;
		lg->addrlen = sizeof *sun;
		return;
	}
	if (strncmp(t, "inet:", 5) == 0)
		rest = t + 5;
	else if (strncmp(t, "inet6:", 6) == 0)
		rest = t + 6;
	else
		loadgen_fatal("bad socket %s (unix:/path, inet:host:port or inet:port@host)", t);
	at = strchr(rest, '@');
	if (at != NULL) {               /* libmilter's inet:port@host */
		r = snprintf(port, sizeof port, "%.*s", (int)(at - rest), rest);
		if (r < 0 || (size_t)r >= sizeof port)
			loadgen_fatal("bad socket %s", t);
		r = snprintf(host, sizeof host, "%s", at + 1);
	} else {                        /* inet:host:port, inet6:[addr]:port */
		colon = strrchr(rest, ':');
		if (colon == NULL)
			loadgen_fatal("bad socket %s (no port)", t);
		if (rest[0] == '[' && colon > rest && colon[-1] == ']')
			r = snprintf(host, sizeof host, "%.*s", (int)(colon - rest - 2), rest + 1);
		else
			r = snprintf(host, sizeof host, "%.*s", (int)(colon - rest), rest);
		if (r >= 0 && (size_t)r < sizeof host)
			r = snprintf(port, sizeof port, "%s", colon + 1);
	}
	if (r < 0 || (size_t)r >= sizeof host)
		loadgen_fatal("bad socket %s", t);
	memset(&hints, 0, sizeof hints);
	hints.ai_socktype = SOCK_STREAM;
	r = getaddrinfo(host, port, &hints, &res);
	if (r != 0)
		loadgen_fatal("cannot resolve %s: %s", t, gai_strerror(r));
	memcpy(&lg->addr, res->ai_addr, res->ai_addrlen);
	lg->addrlen = res->ai_addrlen;
	lg->family = res->ai_family;
	freeaddrinfo(res);
}

/* Raises the soft open files limit to the hard one; exits if conns connections (and a
 * few spare descriptors) do not fit. */
static void raise_nofile(unsigned long long conns)
{
	rlim_t need = (rlim_t)conns + 16;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		loadgen_fatal("getrlimit: %s", strerror(errno));
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			loadgen_fatal("setrlimit: %s", strerror(errno));
	}
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
		loadgen_fatal("%llu connections need %llu descriptors; the hard limit is %llu "
		    "(ulimit -Hn)", conns, (unsigned long long)need,
		    (unsigned long long)rl.rlim_cur);
}

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

bool loadgen_interrupted(void)
{
	return interrupted != 0;
}

void loadgen_init(struct loadgen *lg, const struct loadgen_ops *ops, unsigned long long conns)
{
	struct sigaction sa;
	long threads;

	lg->ops = ops;
	parse_target(lg, lg->opt.target);
	raise_nofile(conns);

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	lg->proc.pid = lg->opt.pid;
	if (lg->opt.pid > 0 &&
	    loadgen_proc_status(lg->opt.pid, &threads, &lg->proc.rss_kb_before) < 0)
		loadgen_fatal("--pid %ld: cannot read /proc/%ld/status", lg->opt.pid, lg->opt.pid);
	lg->ep = epoll_create1(EPOLL_CLOEXEC);
	if (lg->ep < 0)
		loadgen_fatal("epoll_create1: %s", strerror(errno));
	lg->timeout_ns = (uint64_t)(lg->opt.timeout * LOADGEN_NS_PER_S);
	lg->phase = LOADGEN_SETUP;
	lg->now = loadgen_clock_ns();
}

void loadgen_fini(struct loadgen *lg)
{
	close(lg->ep);
	lg->ep = -1;
}

/* ---- run control ----------------------------------------------------------------- */

bool loadgen_launch_allowed(const struct loadgen *lg)
{
	if (interrupted)
		return false;
	if (lg->phase == LOADGEN_WARMUP)
		return true;
	if (lg->phase != LOADGEN_MEASURE)
		return false;
	if (lg->opt.count > 0 && lg->launched >= lg->opt.count)
		return false;
	if (lg->opt.duration > 0 && lg->now >= lg->t_stop)
		return false;
	return true;
}

bool loadgen_begin(struct loadgen *lg)
{
	if (lg->phase != LOADGEN_MEASURE)
		return false;
	lg->launched++;
	return true;
}

void loadgen_done(struct loadgen *lg, uint64_t t_start, uint64_t t_last)
{
	lg->completed++;
	loadgen_hist_add(&lg->hist, t_last - t_start);
	if (t_last > lg->t_end)
		lg->t_end = t_last;
}

void loadgen_failed(struct loadgen *lg)
{
	lg->failed++;
	if (lg->now > lg->t_end)
		lg->t_end = lg->now;
}

void loadgen_retry_push(struct loadgen *lg, struct loadgen_conn *c, uint64_t delay_ns)
{
	c->retry_at = lg->now + delay_ns;
	c->retry_next = lg->retry_head;
	lg->retry_head = c;
}

static void retry_run(struct loadgen *lg)
{
	struct loadgen_conn *list = lg->retry_head, *c;

	lg->retry_head = NULL;
	while (list != NULL) {
		c = list;
		list = c->retry_next;
		if (lg->now < c->retry_at) {
			c->retry_next = lg->retry_head;
			lg->retry_head = c;
			continue;
		}
		lg->ops->retry(c);
	}
}

/* The load phase starts (after the setup phase, if any): warm-up, then measurement. */
static void load_start(struct loadgen *lg)
{
	proc_load_start(&lg->proc);
	lg->phase = lg->opt.warmup > 0 ? LOADGEN_WARMUP : LOADGEN_MEASURE;
	lg->t_warm_end = lg->now + (uint64_t)(lg->opt.warmup * LOADGEN_NS_PER_S);
	lg->t0 = lg->now;
	lg->t_stop = lg->t0 + (uint64_t)(lg->opt.duration * LOADGEN_NS_PER_S);
	lg->active = lg->opt.concurrency;
	for (unsigned i = 0; i < lg->opt.concurrency; i++)
		lg->ops->start(i);
}

static void phase_run(struct loadgen *lg)
{
	switch (lg->phase) {
	case LOADGEN_SETUP:
		if (lg->ops->setup())
			load_start(lg);
		return;
	case LOADGEN_WARMUP:
		if (lg->now < lg->t_warm_end && !interrupted)
			return;
		lg->phase = LOADGEN_MEASURE;
		lg->t0 = lg->now;
		lg->t_stop = lg->t0 + (uint64_t)(lg->opt.duration * LOADGEN_NS_PER_S);
		return;
	case LOADGEN_MEASURE:
		if (loadgen_launch_allowed(lg))
			return;
		lg->phase = LOADGEN_DRAIN;
		/* fall through */
	case LOADGEN_DRAIN:
		if (lg->active > 0)
			return;
		lg->phase = LOADGEN_DONE;
		return;
	default:
		return;
	}
}

void loadgen_run(struct loadgen *lg)
{
	struct epoll_event evs[256];
	int n, wait_ms;

	if (lg->ops->setup == NULL) {
		lg->now = loadgen_clock_ns();
		load_start(lg);
	}
	lg->next_tick = loadgen_clock_ns();
	while (lg->phase != LOADGEN_DONE) {
		lg->now = loadgen_clock_ns();
		if (lg->retry_head != NULL)
			wait_ms = 1;
		else
			wait_ms = lg->now >= lg->next_tick ? 0 :
			    (int)((lg->next_tick - lg->now) / 1000000u) + 1;
		n = epoll_wait(lg->ep, evs, (int)(sizeof evs / sizeof evs[0]), wait_ms);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			loadgen_fatal("epoll_wait: %s", strerror(errno));
		}
		for (int i = 0; i < n; i++) {
			lg->now = loadgen_clock_ns();
			lg->ops->event(evs[i].data.ptr, evs[i].events);
		}
		lg->now = loadgen_clock_ns();
		if (lg->retry_head != NULL)
			retry_run(lg);
		if (lg->now >= lg->next_tick) {
			lg->next_tick = lg->now + 100000000u;
			lg->ops->tick();
			/* The peaks are those of the load phase. */
			if (lg->phase != LOADGEN_SETUP)
				loadgen_proc_sample(&lg->proc);
		}
		phase_run(lg);
	}
	proc_load_end(&lg->proc);
}

/* ---- connections ----------------------------------------------------------------- */

int loadgen_connect(struct loadgen *lg, struct loadgen_conn *c)
{
	struct epoll_event ev;
	int fd, one = 1, err;

	fd = socket(lg->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		loadgen_fatal("socket: %s%s", strerror(errno),
		    errno == EMFILE ? " (raise the open files limit: ulimit -n)" : "");
	if (lg->family != AF_UNIX)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
	ev.data.ptr = c;
	if (epoll_ctl(lg->ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		loadgen_fatal("epoll_ctl: %s", strerror(errno));
	c->fd = fd;
	if (connect(fd, (struct sockaddr *)&lg->addr, lg->addrlen) == 0) {
		lg->ever_connected = true;
		return 0;
	}
	err = errno;
	if (err == EINPROGRESS) {
		c->since = lg->now;
		return -EINPROGRESS;
	}
	close(fd);
	c->fd = -1;
	if (err == EAGAIN) {
		/* A unix socket's listen backlog is full: the server is not accepting fast
		 * enough.  The caller tries again shortly; the wait is part of the latency. */
		lg->connect_retries++;
		return -EAGAIN;
	}
	if (!lg->ever_connected)
		loadgen_fatal("cannot connect to %s: %s", lg->opt.target, strerror(err));
	lg->ops->fail(c, LOADGEN_ERR_CONNECT, strerror(err));
	return -err;
}

int loadgen_connect_result(struct loadgen *lg, struct loadgen_conn *c, uint32_t events)
{
	int err = 0;
	socklen_t len = sizeof err;

	if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
		return -EINPROGRESS;
	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err != 0) {
		if (!lg->ever_connected)
			loadgen_fatal("cannot connect to %s: %s", lg->opt.target, strerror(err));
		lg->ops->fail(c, LOADGEN_ERR_CONNECT, strerror(err));
		return -err;
	}
	lg->ever_connected = true;
	return 0;
}

/* A read or write on c failed with errno. */
static void io_failed(struct loadgen *lg, struct loadgen_conn *c)
{
	int err = errno;

	lg->ops->fail(c, err == EPIPE || err == ECONNRESET ? LOADGEN_ERR_CLOSED : LOADGEN_ERR_IO,
	    strerror(err));
}

int loadgen_write(struct loadgen *lg, struct loadgen_conn *c, const void *buf, size_t *off,
    size_t *len)
{
	ssize_t n;
	size_t want;

	while (*off < *len) {
		want = *len - *off;
		n = send(c->fd, (const char *)buf + *off, want, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return -EAGAIN;
			io_failed(lg, c);
			return -EPIPE;
		}
		*off += (size_t)n;
		c->since = lg->now;
		/* A short write filled the socket: edge-triggered epoll says when there is
		 * room again. */
		if ((size_t)n < want)
			return -EAGAIN;
	}
	*off = 0;
	*len = 0;
	return 0;
}

int loadgen_read(struct loadgen *lg, struct loadgen_conn *c, bool hup)
{
	ssize_t n;

	for (;;) {
		n = read(c->fd, rbuf, sizeof rbuf);
		if (n > 0) {
			c->since = lg->now;
			if (lg->ops->feed(c, rbuf, (size_t)n) < 0)
				return 0;
			/* A short read emptied the socket; edge-triggered epoll reports new
			 * data (and a later EOF) with a new event. */
			if ((size_t)n < sizeof rbuf && !hup)
				return 0;
			continue;
		}
		if (n == 0)
			return LOADGEN_EOF;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN)
			return 0;
		io_failed(lg, c);
		return -EPIPE;
	}
}

bool loadgen_timed_out(const struct loadgen *lg, const struct loadgen_conn *c)
{
	return lg->now - c->since >= lg->timeout_ns;
}

/* ---- report -------------------------------------------------------------------------- */

void loadgen_summarize(const struct loadgen *lg, struct loadgen_summary *ret)
{
	const struct loadgen_hist *h = &lg->hist;
	struct loadgen_summary s;

	s.elapsed = lg->t_end > lg->t0 ? (double)(lg->t_end - lg->t0) / LOADGEN_NS_PER_S : 0;
	s.rate = s.elapsed > 0 ? (double)lg->completed / s.elapsed : 0;
	s.p50 = loadgen_hist_quantile(h, 0.50) / 1e6;
	s.p90 = loadgen_hist_quantile(h, 0.90) / 1e6;
	s.p99 = loadgen_hist_quantile(h, 0.99) / 1e6;
	s.max = (double)h->max / 1e6;
	s.mean = h->count ? h->sum / (double)h->count / 1e6 : 0;
	s.cpu = lg->proc.ok ? lg->proc.cpu_end - lg->proc.cpu_start : 0;
	s.cpu_per = lg->completed_all ? s.cpu * 1e6 / (double)lg->completed_all : 0;
	*ret = s;
}

uint64_t loadgen_total(const uint64_t *counts, size_t n)
{
	uint64_t t = 0;

	for (size_t i = 0; i < n; i++)
		t += counts[i];
	return t;
}

void loadgen_json_string(const char *s)
{
	putchar('"');
	for (; *s != '\0'; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

void loadgen_json_begin(const struct loadgen *lg)
{
	printf("{\"label\":");
	loadgen_json_string(lg->opt.label != NULL ? lg->opt.label : "");
	printf(",\"target\":");
	loadgen_json_string(lg->opt.target);
}

void loadgen_json_latency(const struct loadgen_summary *s)
{
	printf("\"latency_ms\":{\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f,"
	    "\"mean\":%.3f}", s->p50, s->p90, s->p99, s->max, s->mean);
}

void loadgen_json_counts(const char *key, const char *const *names, const uint64_t *counts,
    size_t n)
{
	printf("\"%s\":{", key);
	for (size_t i = 0; i < n; i++)
		printf("%s\"%s\":%" PRIu64, i ? "," : "", names[i], counts[i]);
	printf("}");
}

void loadgen_json_errors(const char *const *names, const uint64_t *counts)
{
	printf("\"errors\":{\"total\":%" PRIu64, loadgen_total(counts, LOADGEN_ERR__MAX));
	for (size_t i = 0; i < LOADGEN_ERR__MAX; i++)
		printf(",\"%s\":%" PRIu64, names[i], counts[i]);
	printf("}");
}

void loadgen_json_end(void)
{
	printf("}\n");
	fflush(stdout);
}

void loadgen_print_latency(const struct loadgen_summary *s)
{
	printf("%-12s p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f\n", "latency ms",
	    s->p50, s->p90, s->p99, s->max, s->mean);
}

void loadgen_print_errors(const char *const *names, const uint64_t *counts)
{
	uint64_t total = loadgen_total(counts, LOADGEN_ERR__MAX);

	printf("%-12s %" PRIu64, "errors", total);
	if (total > 0) {
		printf(" (");
		for (size_t i = 0; i < LOADGEN_ERR__MAX; i++)
			printf("%s %s %" PRIu64, i ? "," : "", names[i], counts[i]);
		printf(" )");
	}
	printf("\n");
}
