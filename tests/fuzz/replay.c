/*
 * replay -- runs a libFuzzer target over every file of the corpus directories (or files)
 * given as arguments, so that the corpus is a regression test when no fuzzing engine is
 * built in.  Fails if a directory is empty: a missing corpus must not pass silently.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	size_t cap = 4096, len = 0;
	uint8_t *buf = malloc(cap);
	if (!buf)
		abort();
	size_t n;
	while ((n = fread(buf + len, 1, cap - len, f)) > 0) {
		len += n;
		if (len == cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			if (!buf)
				abort();
		}
	}
	fclose(f);
	/* Copy to an exact-size allocation so ASan catches reads past the end. */
	uint8_t *exact = malloc(len ? len : 1);
	if (!exact)
		abort();
	memcpy(exact, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(exact, len);
	free(exact);
	return 0;
}

int main(int argc, char **argv)
{
	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	int files = 0;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (replay_file(argv[i]) < 0)
				return 1;
			files++;
			continue;
		}
		DIR *d = opendir(argv[i]);
		if (!d)
			return 1;
		struct dirent *de;
		while ((de = readdir(d))) {
			if (de->d_name[0] == '.')
				continue;
			char path[4096];
			int w = snprintf(path, sizeof(path), "%s/%s", argv[i], de->d_name);
			if (w < 0 || (size_t)w >= sizeof(path))
				return 1;
			if (replay_file(path) < 0)
				return 1;
			files++;
		}
		closedir(d);
	}
	if (files == 0) {
		fprintf(stderr, "replay: no corpus files\n");
		return 1;
	}
	printf("replayed %d inputs\n", files);
	return 0;
}
