/*
 * listen -- parse listening addresses and open sockets (see listen.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "listen.h"

static int parse_port(const char *s, unsigned *ret)
{
	char *end;
	if (!*s)
		return -EINVAL;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || *end || v == 0 || v > 65535)
		return -EINVAL;
	*ret = (unsigned)v;
	return 0;
}

int listen_addr_parse(const char *spec, struct listen_addr *ret, char *err, size_t errlen)
{
	struct listen_addr a;
	memset(&a, 0, sizeof(a));
	if (strlen(spec) >= sizeof(a.text)) {
		snprintf(err, errlen, "address too long");
		return -EINVAL;
	}
	strcpy(a.text, spec); /* length checked above */
	if (strncmp(spec, "unix:", 5) == 0) {
		const char *path = spec + 5;
		struct sockaddr_un *sun = (struct sockaddr_un *)&a.ss;
		if (!*path || strlen(path) >= sizeof(sun->sun_path) || strlen(path) >= sizeof(a.path)) {
			snprintf(err, errlen, "%s: unix socket path empty or longer than %zu bytes",
				 spec, sizeof(sun->sun_path) - 1);
			return -EINVAL;
		}
		sun->sun_family = AF_UNIX;
		memcpy(sun->sun_path, path, strlen(path) + 1);
		memcpy(a.path, path, strlen(path) + 1);
		a.sslen = sizeof(*sun);
		*ret = a;
		return 0;
	}
	bool v6 = strncmp(spec, "inet6:", 6) == 0;
	if (!v6 && strncmp(spec, "inet:", 5) != 0) {
		snprintf(err, errlen, "%s: expected unix:/path, inet:host:port or inet6:[addr]:port",
			 spec);
		return -EINVAL;
	}
	char host[256];
	const char *rest = spec + (v6 ? 6 : 5);
	const char *colon;
	if (rest[0] == '[') {
		const char *close = strchr(rest, ']');
		if (!close || close[1] != ':') {
			snprintf(err, errlen, "%s: expected [addr]:port", spec);
			return -EINVAL;
		}
		memcpy(host, rest + 1, (size_t)(close - rest - 1));
		host[close - rest - 1] = '\0';
		colon = close + 1;
		v6 = true;
	} else {
		colon = strrchr(rest, ':');
		if (!colon || colon == rest) {
			snprintf(err, errlen, "%s: expected host:port", spec);
			return -EINVAL;
		}
		memcpy(host, rest, (size_t)(colon - rest));
		host[colon - rest] = '\0';
	}
	unsigned port;
	if (parse_port(colon + 1, &port) < 0) {
		snprintf(err, errlen, "%s: bad port", spec);
		return -EINVAL;
	}
	if (!v6) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&a.ss;
		sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t)port);
		if (strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0)
			sin->sin_addr.s_addr = htonl(INADDR_ANY);
		else if (strcmp(host, "localhost") == 0)
			sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		else if (inet_pton(AF_INET, host, &sin->sin_addr) != 1) {
			snprintf(err, errlen, "%s: '%s' is not an IPv4 address", spec, host);
			return -EINVAL;
		}
		a.sslen = sizeof(*sin);
	} else {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&a.ss;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons((uint16_t)port);
		if (strcmp(host, "*") == 0 || strcmp(host, "::") == 0)
			sin6->sin6_addr = in6addr_any;
		else if (strcmp(host, "localhost") == 0)
			sin6->sin6_addr = in6addr_loopback;
		else if (inet_pton(AF_INET6, host, &sin6->sin6_addr) != 1) {
			snprintf(err, errlen, "%s: '%s' is not an IPv6 address", spec, host);
			return -EINVAL;
		}
		a.sslen = sizeof(*sin6);
	}
	*ret = a;
	return 0;
}

/* A unix socket path exists: remove it only if it is a socket nobody accepts on. */
static int unix_remove_stale(const struct listen_addr *a, char *err, size_t errlen)
{
	struct stat st;
	if (lstat(a->path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen, "%s: exists and is not a socket; not removing it", a->text);
		return -EEXIST;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int r = connect(fd, (const struct sockaddr *)&a->ss, a->sslen);
	int e = errno;
	close(fd);
	if (r == 0) {
		snprintf(err, errlen, "%s: another process is accepting on this socket", a->text);
		return -EADDRINUSE;
	}
	if (e != ECONNREFUSED) {
		snprintf(err, errlen, "%s: cannot probe existing socket: %s", a->text, strerror(e));
		return -e;
	}
	if (unlink(a->path) < 0 && errno != ENOENT) {
		snprintf(err, errlen, "%s: cannot remove stale socket: %s", a->text, strerror(errno));
		return -errno;
	}
	return 0;
}

int listen_open(const struct listen_addr *a, unsigned mode, uid_t owner, gid_t group, int *ret_fd,
		char *err, size_t errlen)
{
	int fd;
	int r = listen_bind(a, mode, owner, group, &fd, err, errlen);
	if (r == 0)
		r = listen_start(a, fd, err, errlen);
	if (r == 0)
		*ret_fd = fd;
	return r;
}

int listen_start(const struct listen_addr *a, int fd, char *err, size_t errlen)
{
	if (listen(fd, 1024) < 0) {
		int e = errno;
		snprintf(err, errlen, "%s: listen: %s", a->text, strerror(e));
		listen_close(a, fd);
		return -e;
	}
	return 0;
}

int listen_bind(const struct listen_addr *a, unsigned mode, uid_t owner, gid_t group, int *ret_fd,
		char *err, size_t errlen)
{
	int family = a->ss.ss_family;
	if (family == AF_UNIX) {
		int r = unix_remove_stale(a, err, errlen);
		if (r < 0) {
			if (!err[0])
				snprintf(err, errlen, "%s: %s", a->text, strerror(-r));
			return r;
		}
	}
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "%s: socket: %s", a->text, strerror(errno));
		return -errno;
	}
	int one = 1;
	if (family != AF_UNIX)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	mode_t old = 0;
	if (family == AF_UNIX)
		old = umask(0177); /* no window in which the socket is more open than asked */
	int r = bind(fd, (const struct sockaddr *)&a->ss, a->sslen);
	int e = errno;
	if (family == AF_UNIX)
		umask(old);
	if (r < 0) {
		snprintf(err, errlen, "%s: bind: %s", a->text, strerror(e));
		close(fd);
		return -e;
	}
	if (family == AF_UNIX && mode && chmod(a->path, (mode_t)mode) < 0) {
		e = errno;
		snprintf(err, errlen, "%s: chmod %o: %s", a->text, mode, strerror(e));
		close(fd);
		unlink(a->path);
		return -e;
	}
	/* mode first: root may chmod only its own file without CAP_FOWNER; until chown the
	 * file is root's, so no other user gains a window */
	if (family == AF_UNIX && (owner != (uid_t)-1 || group != (gid_t)-1) &&
	    chown(a->path, owner, group) < 0) {
		e = errno;
		snprintf(err, errlen, "%s: chown %ld:%ld: %s", a->text,
			 owner == (uid_t)-1 ? -1L : (long)owner,
			 group == (gid_t)-1 ? -1L : (long)group, strerror(e));
		close(fd);
		unlink(a->path);
		return -e;
	}
	*ret_fd = fd;
	return 0;
}

void listen_close(const struct listen_addr *a, int fd)
{
	close(fd);
	if (a->ss.ss_family == AF_UNIX)
		unlink(a->path);
}
