/*
 * listen -- parse listening addresses and open sockets (see listen.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "listen.h"
#include "sockspec.h"

int listen_addr_parse(const char *spec, struct listen_addr *ret, char *err, size_t errlen)
{
	struct listen_addr a;
	memset(&a, 0, sizeof(a));
	struct sockspec s;
	int r = sockspec_parse(spec, &s, err, errlen);
	if (r == 0)
		r = sockspec_resolve(&s, &a.ss, &a.sslen, err, errlen);
	if (r < 0)
		return r;
	_Static_assert(sizeof(a.text) > SOCKSPEC_TEXT_MAX, "listen_addr.text holds a spec");
	_Static_assert(sizeof(a.path) == sizeof(s.path), "listen_addr.path holds a path");
	memcpy(a.text, spec, strlen(spec) + 1);
	memcpy(a.path, s.path, sizeof(a.path));
	a.dual_stack = s.dual_stack;
	*ret = a;
	return 0;
}

bool listen_addr_is_local(const struct listen_addr *a)
{
	if (a->ss.ss_family == AF_UNIX)
		return true;
	if (a->ss.ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)&a->ss;
		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (a->ss.ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->ss;
		if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
			return true;
		return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
	}
	return false;
}

const char *listen_addr_show(const struct listen_addr *a, char *buf, size_t size)
{
	char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 1] = "?";
	if (a->ss.ss_family == AF_UNIX) {
		snprintf(buf, size, "%s", a->path);
	} else if (a->ss.ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)&a->ss;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		snprintf(buf, size, "%s:%u", host, (unsigned)ntohs(in->sin_port));
	} else {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->ss;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		char zone[IF_NAMESIZE + 1] = "";
		if (in6->sin6_scope_id && if_indextoname(in6->sin6_scope_id, zone + 1))
			zone[0] = '%';
		snprintf(buf, size, "[%s%s]:%u%s", host, zone, (unsigned)ntohs(in6->sin6_port),
			 a->dual_stack ? " (and IPv4)" : "");
	}
	return buf;
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
	int v6only = !a->dual_stack;
	if (family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
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
