/*
 * nosync -- flushes that do nothing (an LD_PRELOAD of the power-cut tests)
 *
 * fsync, fdatasync, syncfs, sync_file_range and sync return success without flushing
 * anything.  Preloaded into sluiced, it shows that the power-cut test sees a program
 * that does not flush: the test must fail with it.
 */

#include <fcntl.h>
#include <unistd.h>

int fsync(int fd)
{
	(void)fd;
	return 0;
}

int fdatasync(int fd)
{
	(void)fd;
	return 0;
}

int syncfs(int fd)
{
	(void)fd;
	return 0;
}

int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags)
{
	(void)fd;
	(void)off;
	(void)n;
	(void)flags;
	return 0;
}

void sync(void)
{
}
