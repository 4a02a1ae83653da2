/*
 * test_privs -- the directories made for the daemon's user, the check of a tree with
 * the user's identity (as root: uid 65534 stands for the user), and the sd_notify
 * datagram on a path and on an abstract socket.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "notify.h"
#include "privs.h"

static char base[64];

static int setup(void **state)
{
	(void)state;
	snprintf(base, sizeof(base), "/tmp/test_privs.XXXXXX");
	return mkdtemp(base) && chmod(base, 0755) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	return system(cmd) == 0 ? 0 : -1;
}

static void path_of(char *out, size_t len, const char *rel)
{
	snprintf(out, len, "%s/%s", base, rel);
}

static void test_mkdirs_modes_and_owner(void **state)
{
	(void)state;
	char dir[256], mid[256], err[256];
	path_of(dir, sizeof(dir), "a/b/c/");
	path_of(mid, sizeof(mid), "a/b");
	uid_t uid = geteuid() == 0 ? 65534 : (uid_t)-1;
	assert_int_equal(privs_mkdirs(dir, 0750, uid, 65534, err, sizeof(err)), 0);
	struct stat st;
	assert_int_equal(stat(dir, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0750);
	assert_int_equal(stat(mid, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0755);
	if (uid != (uid_t)-1)
		assert_int_equal(st.st_uid, uid);
	/* again: everything exists, nothing changes */
	chmod(dir, 0700);
	assert_int_equal(privs_mkdirs(dir, 0750, uid, 65534, err, sizeof(err)), 0);
	assert_int_equal(stat(dir, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
	/* a file in the way */
	char file[256], below[256];
	path_of(file, sizeof(file), "f");
	path_of(below, sizeof(below), "f/g");
	FILE *f = fopen(file, "w");
	assert_non_null(f);
	fclose(f);
	assert_int_equal(privs_mkdirs(below, 0750, uid, 65534, err, sizeof(err)), -ENOTDIR);
	assert_non_null(strstr(err, "is not a directory"));
}

static void test_adopt_only_empty_root_dirs(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	char empty[256], full[256], inside[256];
	path_of(empty, sizeof(empty), "empty");
	path_of(full, sizeof(full), "full");
	path_of(inside, sizeof(inside), "full/x");
	assert_int_equal(mkdir(empty, 0755), 0);
	assert_int_equal(mkdir(full, 0755), 0);
	assert_int_equal(mkdir(inside, 0755), 0);
	assert_int_equal(privs_adopt_empty(empty, 0750, 65534, 65534), 0);
	assert_int_equal(privs_adopt_empty(full, 0750, 65534, 65534), 0);
	struct stat st;
	assert_int_equal(stat(empty, &st), 0);
	assert_int_equal(st.st_uid, 65534);
	assert_int_equal(st.st_mode & 07777, 0750);
	assert_int_equal(stat(full, &st), 0);
	assert_int_equal(st.st_uid, 0);
}

static void test_check_tree_as_the_user(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	char dir[256], sub[256], file[256], err[512];
	path_of(dir, sizeof(dir), "q");
	path_of(sub, sizeof(sub), "q/msg");
	path_of(file, sizeof(file), "q/msg/m1");
	assert_int_equal(mkdir(dir, 0750), 0);
	assert_int_equal(mkdir(sub, 0700), 0);
	FILE *f = fopen(file, "w");
	assert_non_null(f);
	fclose(f);
	chmod(file, 0600);
	/* all root's: the user cannot even enter */
	assert_int_equal(privs_check_tree(dir, 65534, 65534, err, sizeof(err)), -EACCES);
	assert_non_null(strstr(err, dir));
	assert_non_null(strstr(err, "uid 65534"));
	assert_int_equal(geteuid(), 0); /* root came back */
	assert_int_equal(chown(dir, 65534, 65534), 0);
	assert_int_equal(chown(sub, 65534, 65534), 0);
	/* one file left root's */
	assert_int_equal(privs_check_tree(dir, 65534, 65534, err, sizeof(err)), -EACCES);
	assert_non_null(strstr(err, file));
	assert_non_null(strstr(err, "owner 0, mode 0600"));
	assert_int_equal(chown(file, 65534, 65534), 0);
	assert_int_equal(privs_check_tree(dir, 65534, 65534, err, sizeof(err)), 0);
	/* root itself may use anything; a missing tree is fine */
	assert_int_equal(privs_check_tree(dir, (uid_t)-1, (gid_t)-1, err, sizeof(err)), 0);
	path_of(dir, sizeof(dir), "missing");
	assert_int_equal(privs_check_tree(dir, 65534, 65534, err, sizeof(err)), 0);
}

static void expect_datagram(const char *env, const struct sockaddr_un *sun, socklen_t sl)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (const struct sockaddr *)sun, sl), 0);
	setenv("NOTIFY_SOCKET", env, 1);
	assert_int_equal(notify_send("READY=1\nSTATUS=running"), 0);
	char buf[128];
	ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_string_equal(buf, "READY=1\nSTATUS=running");
	close(fd);
}

static void test_notify(void **state)
{
	(void)state;
	unsetenv("NOTIFY_SOCKET");
	assert_int_equal(notify_send("READY=1"), 0); /* not under systemd: nothing */
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	path_of(sun.sun_path, sizeof(sun.sun_path), "notify");
	expect_datagram(sun.sun_path, &sun, sizeof(sun));

	char name[64];
	snprintf(name, sizeof(name), "@test_privs.%ld", (long)getpid());
	struct sockaddr_un abs = { .sun_family = AF_UNIX };
	memcpy(abs.sun_path + 1, name + 1, strlen(name) - 1);
	expect_datagram(name, &abs,
			(socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name)));

	setenv("NOTIFY_SOCKET", "relative/path", 1);
	assert_int_equal(notify_send("READY=1"), -EINVAL);
	path_of(sun.sun_path, sizeof(sun.sun_path), "nobody-listens");
	setenv("NOTIFY_SOCKET", sun.sun_path, 1);
	assert_int_equal(notify_send("READY=1"), -ENOENT);
	unsetenv("NOTIFY_SOCKET");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_mkdirs_modes_and_owner, setup, teardown),
		cmocka_unit_test_setup_teardown(test_adopt_only_empty_root_dirs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_check_tree_as_the_user, setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
