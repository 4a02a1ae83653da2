/*
 * privs -- directories made for the user, the privilege drop, and the check that the
 * user can use its trees (see privs.h and sluiced(8), PRIVILEGES).
 *
 * Order at start (daemon.c): as root, every directory is made; privs_check_tree() looks
 * at the queue and state directories with the user's effective identity, so that a tree
 * left owned by root is refused at start with the fix (rather than failing one message at
 * a time later) and before any socket exists; then every socket is bound and given its
 * owner, and privs_drop() gives root up.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "privs.h"

int privs_mkdirs(const char *dir, mode_t mode, uid_t uid, gid_t gid, char *err, size_t errlen)
{
	char path[4096];
	size_t len = strlen(dir);
	if (len == 0 || len >= sizeof(path)) {
		snprintf(err, errlen, "%s: path empty or too long", dir);
		return -ENAMETOOLONG;
	}
	memcpy(path, dir, len + 1);
	while (len > 1 && path[len - 1] == '/')
		path[--len] = '\0';
	/* each prefix ending before a '/', then the whole path */
	for (size_t i = 1; i <= len; i++) {
		if (i < len && path[i] != '/')
			continue;
		char saved = path[i];
		path[i] = '\0';
		bool last = i == len;
		if (mkdir(path, last ? mode : 0755) == 0) {
			/* mkdir's mode went through the umask: say it exactly */
			if (chmod(path, last ? mode : 0755) < 0 ||
			    (uid != (uid_t)-1 && chown(path, uid, gid) < 0)) {
				int e = errno;
				snprintf(err, errlen, "%s: %s", path, strerror(e));
				return -e;
			}
		} else if (errno != EEXIST) {
			int e = errno;
			snprintf(err, errlen, "cannot create %s: %s", path, strerror(e));
			return -e;
		} else {
			struct stat st;
			if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
				snprintf(err, errlen, "%s exists and is not a directory", path);
				return -ENOTDIR;
			}
		}
		path[i] = saved;
	}
	return 0;
}

int privs_adopt_empty(const char *dir, mode_t mode, uid_t uid, gid_t gid)
{
	struct stat st;
	if (stat(dir, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || uid == (uid_t)-1 || uid == 0)
		return 0;
	DIR *dp = opendir(dir);
	if (!dp)
		return -errno;
	bool empty = true;
	for (struct dirent *de; empty && (de = readdir(dp));)
		empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0;
	closedir(dp);
	if (!empty)
		return 0;
	if (chmod(dir, mode) < 0 || chown(dir, uid, gid) < 0)
		return -errno;
	return 0;
}

int privs_drop(uid_t uid, gid_t gid, char *err, size_t errlen)
{
	if (setgroups(1, &gid) < 0) {
		int e = errno;
		snprintf(err, errlen, "setgroups(%lu): %s", (unsigned long)gid, strerror(e));
		return -e;
	}
	if (setresgid(gid, gid, gid) < 0) {
		int e = errno;
		snprintf(err, errlen, "setgid(%lu): %s", (unsigned long)gid, strerror(e));
		return -e;
	}
	if (setresuid(uid, uid, uid) < 0) {
		int e = errno;
		snprintf(err, errlen, "setuid(%lu): %s", (unsigned long)uid, strerror(e));
		return -e;
	}
	uid_t ru, eu, su;
	gid_t rg, eg, sg;
	if (getresuid(&ru, &eu, &su) < 0 || getresgid(&rg, &eg, &sg) < 0 || ru != uid ||
	    eu != uid || su != uid || rg != gid || eg != gid || sg != gid) {
		snprintf(err, errlen, "the identity did not change to %lu:%lu",
			 (unsigned long)uid, (unsigned long)gid);
		return -EPERM;
	}
	if (uid != 0 && (setuid(0) == 0 || seteuid(0) == 0)) {
		snprintf(err, errlen, "root could be regained after dropping to uid %lu",
			 (unsigned long)uid);
		return -EPERM;
	}
	return 0;
}

/* nftw has no argument for its callback: the walk runs on the main thread at start. */
static char *walk_err;
static size_t walk_errlen;

static int walk_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)ftw;
	int need;
	if (type == FTW_D || type == FTW_DP)
		need = R_OK | W_OK | X_OK;
	else if (type == FTW_F)
		need = R_OK | W_OK;
	else if (type == FTW_SL)
		return 0;
	else
		need = -1; /* FTW_DNR, FTW_NS: could not even look */
	if (need >= 0 && faccessat(AT_FDCWD, path, need, AT_EACCESS) == 0)
		return 0;
	snprintf(walk_err, walk_errlen, "%s is not %s by uid %lu (owner %lu, mode %04o)", path,
		 type == FTW_F ? "readable and writable" : "usable", (unsigned long)geteuid(),
		 (unsigned long)st->st_uid, (unsigned)st->st_mode & 07777);
	return 1;
}

int privs_check_tree(const char *dir, uid_t uid, gid_t gid, char *err, size_t errlen)
{
	struct stat st;
	if (stat(dir, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	/* as root: look with the user's effective identity, then come back */
	gid_t saved[256];
	int nsaved = -1;
	bool as_user = uid != (uid_t)-1 && geteuid() == 0;
	if (as_user) {
		nsaved = getgroups(256, saved);
		if (nsaved < 0 || setgroups(1, &gid) < 0 || setegid(gid) < 0 || seteuid(uid) < 0) {
			int e = errno;
			snprintf(err, errlen, "cannot take uid %lu to check %s: %s",
				 (unsigned long)uid, dir, strerror(e));
			return -e;
		}
	}
	walk_err = err;
	walk_errlen = errlen;
	int r = nftw(dir, walk_one, 16, FTW_PHYS);
	int e = errno;
	uid_t who = geteuid();
	if (as_user && (seteuid(0) < 0 || setegid(0) < 0 || setgroups((size_t)nsaved, saved) < 0)) {
		e = errno;
		snprintf(err, errlen, "cannot return to root after checking %s: %s", dir,
			 strerror(e));
		return -e;
	}
	if (r == 1)
		return -EACCES;
	if (r < 0) {
		snprintf(err, errlen, "%s is not reachable by uid %lu: %s", dir, (unsigned long)who,
			 strerror(e));
		return -e;
	}
	return 0;
}
