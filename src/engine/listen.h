/*
 * listen -- listening sockets, at the addresses sockspec.h parses (unix:/path,
 * inet:host:port, inet:port@host, ...).
 */
#ifndef SLUICE_LISTEN_H
#define SLUICE_LISTEN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

struct listen_addr {
	char text[256]; /* as configured, for logs */
	struct sockaddr_storage ss;
	socklen_t sslen;
	char path[108]; /* unix sockets */
	bool dual_stack; /* an inet6 wildcard that takes IPv4 clients too (libmilter's) */
};

/* Is a reachable from this host only (a unix socket, 127.0.0.0/8, ::1)? */
bool listen_addr_is_local(const struct listen_addr *a);

/* The numeric address and port a is bound to, for a log line: "0.0.0.0:8891",
 * "[::1]:25", "[fe80::1%eth0]:25", or the unix path. */
const char *listen_addr_show(const struct listen_addr *a, char *buf, size_t size);

/* Parse a socket string (sockspec_parse()) and resolve a host name in it (blocking: at
 * startup and in configuration checks).  Returns 0, or -EINVAL / -EHOSTUNREACH with err. */
int listen_addr_parse(const char *spec, struct listen_addr *ret, char *err, size_t errlen);

/*
 * Create, bind and listen (backlog 1024, SO_REUSEADDR for inet, non-blocking,
 * close-on-exec).  A unix path: a stale socket is removed if nothing accepts on it; a live
 * socket or another kind of file is an error.  A unix socket file is given mode (when
 * non-zero), then made owner:group (each (uid_t)-1 / (gid_t)-1 to leave it).  Returns 0
 * and *ret_fd, or -errno with err.
 */
int listen_open(const struct listen_addr *a, unsigned mode, uid_t owner, gid_t group, int *ret_fd,
		char *err, size_t errlen);

/*
 * listen_open() in two steps: bind (what may need root: a port below 1024, the owner of
 * the socket file), and later listen (from then on connections are accepted into the
 * backlog; before it they are refused, so a client never waits on a daemon that is still
 * starting).  listen_start() closes the socket (and unlinks the path) on failure.
 */
int listen_bind(const struct listen_addr *a, unsigned mode, uid_t owner, gid_t group, int *ret_fd,
		char *err, size_t errlen);
int listen_start(const struct listen_addr *a, int fd, char *err, size_t errlen);

/* Close, and unlink the unix socket path. */
void listen_close(const struct listen_addr *a, int fd);

#endif
