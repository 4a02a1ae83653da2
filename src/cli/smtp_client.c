/*
 * smtp_client -- a small blocking SMTP client for the injectors (see smtp_client.h).
 *
 * The socket is non-blocking after the connection is made, and every read and write
 * waits in poll() for what is left of its deadline, so a server that stops answering
 * costs at most that deadline.  Writes use MSG_NOSIGNAL: a server that goes away is an
 * error to report, not a SIGPIPE.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "smtp_client.h"
#include "sockspec.h"
#include "util.h"

static void trace_line(struct smtp_client *c, const char *dir, const char *p, size_t n)
{
	if (c->trace)
		fprintf(c->trace, "%s%s %.*s\n", c->trace_prefix ? c->trace_prefix : "", dir,
			(int)n, p);
}

static int connect_fd(int family, const struct sockaddr *sa, socklen_t len, int timeout_ms)
{
	int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* a blocking connect bounded by SO_SNDTIMEO (Linux applies it to connect, for TCP
	 * and for a unix socket whose backlog is full) */
	struct timeval tv = timeval_from_ms((uint64_t)timeout_ms);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, sa, len) < 0) {
		int e = errno == EINPROGRESS || errno == EAGAIN ? ETIMEDOUT : errno;
		close(fd);
		return -e;
	}
	if (fd_set_nonblock(fd) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

int smtp_client_connect(struct smtp_client *c, const char *addr, int timeout_ms, char *err,
			size_t errlen)
{
	FILE *trace = c->trace;
	const char *prefix = c->trace_prefix;
	memset(c, 0, sizeof(*c));
	c->trace = trace;
	c->trace_prefix = prefix;
	c->fd = -1;
	buf_init(&c->reply, SMTP_REPLY_MAX);
	c->name = strdup(addr);
	if (!c->name) {
		snprintf(err, errlen, "%s: out of memory", addr);
		return -ENOMEM;
	}
	int fd;
	struct sockspec s;
	if (sockspec_parse(addr, &s, err, errlen) < 0)
		return -EINVAL;
	if (s.family == AF_UNIX || s.numeric) {
		struct sockaddr_storage ss;
		socklen_t sl;
		if (sockspec_resolve(&s, &ss, &sl, err, errlen) < 0)
			return -EINVAL;
		fd = connect_fd(ss.ss_family, (struct sockaddr *)&ss, sl, timeout_ms);
	} else {
		/* a name: every address it has, in the resolver's order (a name under inet:
		 * may answer with IPv6 too, as before) */
		char port[8];
		snprintf(port, sizeof(port), "%u", (unsigned)s.port);
		struct addrinfo hints = { .ai_family = s.family == AF_INET6 ? AF_INET6 : AF_UNSPEC,
					  .ai_socktype = SOCK_STREAM,
					  .ai_flags = AI_NUMERICSERV };
		struct addrinfo *res;
		int g = getaddrinfo(s.host, port, &hints, &res);
		if (g != 0) {
			snprintf(err, errlen, "%s: %s", addr, gai_strerror(g));
			return -EHOSTUNREACH;
		}
		fd = -EHOSTUNREACH;
		for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
			fd = connect_fd(ai->ai_family, ai->ai_addr, ai->ai_addrlen, timeout_ms);
		freeaddrinfo(res);
	}
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", addr, strerror(-fd));
		return fd;
	}
	c->fd = fd;
	return 0;
}

void smtp_client_close(struct smtp_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	free(c->name);
	c->name = NULL;
	buf_done(&c->reply);
}

/* Milliseconds left until deadline (a now_ms() value), at least 0. */
static int left(uint64_t deadline)
{
	uint64_t now = now_ms();
	return now >= deadline ? 0 : (int)(deadline - now);
}

static int wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int n = poll(&p, 1, left(deadline));
		if (n > 0)
			return 0;
		if (n == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

static int write_all(struct smtp_client *c, const void *p, size_t n, uint64_t deadline)
{
	const char *s = p;
	while (n > 0) {
		ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
		if (w > 0) {
			s += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int r = wait_fd(c->fd, POLLOUT, deadline);
			if (r < 0)
				return r;
			continue;
		}
		c->lost = true;
		return -ECONNRESET;
	}
	return 0;
}

int smtp_client_write(struct smtp_client *c, const void *p, size_t n, int timeout_ms)
{
	return write_all(c, p, n, now_ms() + (uint64_t)timeout_ms);
}

/* The next byte from the server: 0..255, or a negative errno. */
/* More bytes into in[] after what waits there (moved to the front): 0, or a negative
 * errno. */
static int fill(struct smtp_client *c, uint64_t deadline)
{
	memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
	c->in_len -= c->in_off;
	c->in_off = 0;
	for (;;) {
		ssize_t n = read(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len);
		if (n > 0) {
			c->in_len += (size_t)n;
			return 0;
		}
		if (n == 0) {
			c->lost = true;
			return -ECONNRESET;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			c->lost = true;
			return -ECONNRESET;
		}
		int r = wait_fd(c->fd, POLLIN, deadline);
		if (r < 0)
			return r;
	}
}

/* The whole lines p[0..n) of a reply into c->reply, CR removed (a reply longer than
 * the buffer keeps its first lines), and to the trace. */
static void keep_lines(struct smtp_client *c, const char *p, size_t n)
{
	while (n > 0) {
		const char *lf = memchr(p, '\n', n);
		size_t len = lf ? (size_t)(lf - p) : n;
		size_t tl = len > 0 && p[len - 1] == '\r' ? len - 1 : len;
		trace_line(c, "<<<", p, tl);
		if (buf_append(&c->reply, p, tl) == 0)
			buf_append_byte(&c->reply, '\n');
		n -= lf ? len + 1 : len;
		p += lf ? len + 1 : len;
	}
}

/* Read with proto's reply reader, the relay's: the same checks and limits. */
int smtp_client_read_reply(struct smtp_client *c, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	buf_reset(&c->reply);
	c->code = 0;
	struct smtp_reply_reader rd;
	smtp_reply_reader_init(&rd);
	struct smtp_reply rep;
	for (;;) {
		size_t used = 0;
		const char *why;
		int r = c->in_off < c->in_len
			? smtp_reply_read(&rd, c->in + c->in_off, c->in_len - c->in_off, &rep, &used,
					  &why)
			: 0;
		if (r < 0)
			return -EPROTO;
		keep_lines(c, c->in + c->in_off, used);
		c->in_off += used;
		if (r == 1) {
			c->code = rep.code;
			return rep.code;
		}
		if ((r = fill(c, deadline)) < 0)
			return r;
	}
}

/* A reply the server may have sent before closing (a 421 after our write failed). */
static int reply_after_loss(struct smtp_client *c, int r)
{
	if (r != -ECONNRESET)
		return r;
	int code = smtp_client_read_reply(c, 2000);
	return code > 0 ? code : r;
}

int smtp_client_command(struct smtp_client *c, int timeout_ms, const char *fmt, ...)
{
	char line[2048];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line) - 2, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(line) - 2)
		return -E2BIG;
	trace_line(c, ">>>", line, (size_t)n);
	memcpy(line + n, "\r\n", 2);
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	int r = write_all(c, line, (size_t)n + 2, deadline);
	if (r < 0)
		return reply_after_loss(c, r);
	return smtp_client_read_reply(c, timeout_ms);
}

/* The EHLO reply's keywords (every line after the first), read by proto's reader. */
static void parse_ehlo(struct smtp_client *c)
{
	struct str r = buf_str(&c->reply);
	const char *p = r.ptr, *end = r.ptr + r.len;
	const char *nl = memchr(p, '\n', (size_t)(end - p));
	p = nl ? nl + 1 : end;
	memset(&c->ehlo, 0, sizeof(c->ehlo));
	while (p < end) {
		nl = memchr(p, '\n', (size_t)(end - p));
		const char *e = nl ? nl : end;
		if (e - p > 4)
			smtp_ehlo_line(&c->ehlo, str_make(p + 4, (size_t)(e - p - 4)));
		p = e + 1;
	}
}

int smtp_client_hello(struct smtp_client *c, const char *name, int timeout_ms)
{
	int code = smtp_client_command(c, timeout_ms, "EHLO %s", name);
	if (code >= 200 && code < 300) {
		parse_ehlo(c);
		return code;
	}
	if (code >= 500 && code != 554) /* 554: no service for us; HELO would not help */
		code = smtp_client_command(c, timeout_ms, "HELO %s", name);
	return code;
}

int smtp_client_data(struct smtp_client *c, struct str msg, int timeout_ms, bool *ret_sent)
{
	*ret_sent = false;
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	char out[65536];
	size_t n = 0;
	const char *p = msg.ptr, *end = msg.ptr + msg.len;
	int r = 0;
	while (p < end && r == 0) {
		/* one line: up to LF, or to a bare CR, which the intake (like any server that
		 * normalises line ends) takes as the end of a line, so a dot after it must be
		 * stuffed too */
		const char *e = p;
		while (e < end && *e != '\n' && !(*e == '\r' && (e + 1 == end || e[1] != '\n')))
			e++;
		if (e < end)
			e++;
		bool dot = *p == '.';
		while ((size_t)(e - p) + dot > sizeof(out) - n) {
			if (n == 0) { /* a line longer than the buffer: in pieces */
				if (dot) {
					out[n++] = '.';
					dot = false;
				}
				size_t k = sizeof(out) - n;
				memcpy(out + n, p, k);
				n += k;
				p += k;
			}
			r = write_all(c, out, n, deadline);
			n = 0;
			if (r < 0)
				break;
		}
		if (r < 0)
			break;
		if (dot)
			out[n++] = '.';
		memcpy(out + n, p, (size_t)(e - p));
		n += (size_t)(e - p);
		p = e;
	}
	if (r == 0 && n + 3 > sizeof(out)) {
		r = write_all(c, out, n, deadline);
		n = 0;
	}
	if (r == 0) {
		memcpy(out + n, ".\r\n", 3);
		r = write_all(c, out, n + 3, deadline);
	}
	if (r < 0)
		return reply_after_loss(c, r);
	trace_line(c, ">>>", ".", 1);
	*ret_sent = true;
	return smtp_client_read_reply(c, timeout_ms);
}

void smtp_client_quit(struct smtp_client *c)
{
	if (c->fd >= 0 && !c->lost)
		smtp_client_command(c, 5000, "QUIT");
}
