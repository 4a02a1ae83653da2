/*
 * syncfs_bridge -- tells the test disk of a syncfs(2) (an LD_PRELOAD of the power-cut tests)
 *
 * The kernel does not pass syncfs(2) to a FUSE file system's daemon (only virtiofs gets
 * it), so the test disk (forgetdisk.c) would never learn that a program asked for every
 * file to be flushed.  This library, preloaded into sluiced by the test, does the real
 * syncfs and then, for a descriptor on a FUSE file system, sets the extended attribute
 * "user.forget.syncfs" on it: the disk makes everything durable there and then, or fails
 * the request with the error a test told it to inject, which syncfs then returns.
 */

#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#define FUSE_SUPER_MAGIC 0x65735546

int syncfs(int fd)
{
	static int (*real)(int);
	if (!real) {
		void *sym = dlsym(RTLD_NEXT, "syncfs");
		memcpy(&real, &sym, sizeof(real)); /* ISO C has no object-to-function cast */
	}
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	if (real(fd) < 0)
		return -1;
	struct statfs sf;
	if (fstatfs(fd, &sf) == 0 && sf.f_type == FUSE_SUPER_MAGIC &&
	    fsetxattr(fd, "user.forget.syncfs", "", 0, 0) < 0)
		return -1;
	return 0;
}
