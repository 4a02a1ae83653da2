/*
 * notify -- readiness and status for systemd (Type=notify), by hand.
 *
 * The sd_notify protocol is one datagram of "KEY=VALUE\n" lines sent to the unix socket
 * named by $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace).  systemd
 * documents it as a stable interface for independent implementations (sd_notify(3),
 * "Notes"); linking libsystemd into a mail daemon for one datagram is not worth a
 * dependency.  Without NOTIFY_SOCKET every call does nothing.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "notify.h"

int notify_send(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !path[0])
		return 0;
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	size_t len = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sun.sun_path))
		return -EINVAL;
	memcpy(sun.sun_path, path, len);
	if (path[0] == '@')
		sun.sun_path[0] = '\0'; /* abstract: the name is not NUL-terminated */
	socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/'));
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sun, sl);
	int e = errno;
	close(fd);
	return n < 0 ? -e : 0;
}
