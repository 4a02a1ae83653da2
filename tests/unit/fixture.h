/*
 * fixture -- what several unit tests set up alike: a private directory under /tmp, and
 * a waiter for callbacks that come from another thread (the queue's committer).
 */
#ifndef SLUICE_TESTS_FIXTURE_H
#define SLUICE_TESTS_FIXTURE_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* A new empty directory /tmp/NAME.XXXXXX into dir: 0, or -1. */
static inline int fixture_dir_make(char *dir, size_t len, const char *name)
{
	snprintf(dir, len, "/tmp/%s.XXXXXX", name);
	return mkdtemp(dir) ? 0 : -1;
}

/* The directory and everything in it gone: 0, or -1. */
static inline int fixture_dir_remove(const char *dir)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* Counts callbacks (done) and keeps the last result; waiter_wait() blocks for n. */
struct waiter {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int done;
	int result;
};
#define WAITER_INIT { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 }

static inline void waiter_done(struct waiter *w, int r)
{
	pthread_mutex_lock(&w->lock);
	w->done++;
	w->result = r;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

static inline void waiter_wait(struct waiter *w, int n)
{
	pthread_mutex_lock(&w->lock);
	while (w->done < n)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
}

#endif
