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

/* Whether the effective identity may use path (st: its lstat); 1 with err set if not. */
static int check_one(const char *path, const struct stat *st, bool dir, char *err,
		     size_t errlen)
{
	int need = dir ? R_OK | W_OK | X_OK : R_OK | W_OK;
	if (faccessat(AT_FDCWD, path, need, AT_EACCESS) == 0)
		return 0;
	snprintf(err, errlen, "%s is not %s by uid %lu (owner %lu, mode %04o)", path,
		 dir ? "usable" : "readable and writable", (unsigned long)geteuid(),
		 (unsigned long)st->st_uid, (unsigned)st->st_mode & 07777);
	return 1;
}

/*
 * Every directory under path, and the first PRIVS_TREE_FILES of the files in each: a
 * tree left to root is so as a whole (a sluiced run once as root), and a queue of a
 * million messages must not cost a walk of a million files before the daemon serves.
 * A file the sample misses is reported by the queue's load, one message at a time.
 * 1 (err set), 0, or -errno when a directory cannot be read at all.
 */
static int walk(char *path, size_t len, size_t cap, int depth, char *err, size_t errlen)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return S_ISREG(st.st_mode) ? check_one(path, &st, false, err, errlen) : 0;
	int r = check_one(path, &st, true, err, errlen);
	if (r || depth > 16)
		return r;
	DIR *dp = opendir(path);
	if (!dp)
		return -errno;
	unsigned files = 0, entries = 0;
	/* directories of the trees come first in the names' order or among few files (the
	 * queue's msg/ and log/ hold only its 32 subdirectories): after PRIVS_TREE_ENTRIES
	 * names a directory of files is left */
	for (struct dirent *de; r == 0 && entries++ < PRIVS_TREE_ENTRIES && (de = readdir(dp));) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		bool is_dir = de->d_type == DT_DIR || de->d_type == DT_UNKNOWN;
		if (!is_dir && files >= PRIVS_TREE_FILES)
			continue;
		size_t n = strlen(de->d_name);
		if (len + 1 + n + 1 > cap)
			continue;
		path[len] = '/';
		memcpy(path + len + 1, de->d_name, n + 1);
		if (!is_dir)
			files++;
		r = walk(path, len + 1 + n, cap, depth + 1, err, errlen);
		if (r == -ENOENT)
			r = 0; /* gone meanwhile */
		path[len] = '\0';
	}
	closedir(dp);
	return r;
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
	char path[4096];
	int r = -ENAMETOOLONG;
	if (strlen(dir) < sizeof(path)) {
		snprintf(path, sizeof(path), "%s", dir);
		r = walk(path, strlen(path), sizeof(path), 0, err, errlen);
	}
	int e = r < 0 ? -r : 0;
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
