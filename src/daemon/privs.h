/*
 * privs -- sluiced's identity: the directories it needs, made before privileges are
 * dropped, the drop itself, and the check that the user can use what it was given.
 */
#ifndef SLUICE_PRIVS_H
#define SLUICE_PRIVS_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Create dir and its missing parents; each directory created gets mode (parents 0755)
 * and, when uid is not (uid_t)-1, the owner uid:gid.  Existing directories are left as
 * they are.  0, or -errno with err naming the directory.
 */
int privs_mkdirs(const char *dir, mode_t mode, uid_t uid, gid_t gid, char *err, size_t errlen);

/*
 * An existing directory that is empty and owned by root (as an init system or a package
 * makes it) is given to uid:gid with mode; any other is left alone.  0 or -errno.
 */
int privs_adopt_empty(const char *dir, mode_t mode, uid_t uid, gid_t gid);

/*
 * Become uid:gid for good: supplementary groups {gid}, then gid, then uid, each checked,
 * and then check that root cannot be regained (setuid(0) must fail).  0, or -errno with
 * err.  Call before any thread starts.
 */
int privs_drop(uid_t uid, gid_t gid, char *err, size_t errlen);

/*
 * Can uid:gid use the tree under dir (enter and write every directory among the first
 * PRIVS_TREE_ENTRIES names of each, read and write the first PRIVS_TREE_FILES files)?  As root, the walk runs with uid:gid as effective identity (and root is
 * taken back after); uid (uid_t)-1: the process as it is.  A missing dir is fine.  0, or
 * -EACCES with err naming the first entry it cannot use.  Files are sampled, not all
 * looked at: a tree left to root is so as a whole, and a walk of every file of a queue of
 * a million messages took seconds before the daemon could serve (100,000 messages: 0.6 s
 * with a warm cache); now the cost is one readdir per directory, whatever the queue holds.
 */
#define PRIVS_TREE_FILES 8
#define PRIVS_TREE_ENTRIES 512
int privs_check_tree(const char *dir, uid_t uid, gid_t gid, char *err, size_t errlen);

#endif
