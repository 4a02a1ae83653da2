/*
 * mailbox -- hand work to a thread that runs a libevent loop (the engine's workers, the
 * relay).
 *
 * Any thread posts fixed-size items (copied in, so an item can be a small struct or a
 * pointer); the owner's loop wakes up on an eventfd and takes every item posted so far
 * at once: one lock and one wake-up per batch, not per item.  Items are handed over in
 * the order they were posted.  Once shut, posting fails (-ESHUTDOWN) and what was posted
 * before stays until taken.
 *
 * Invariants: only the owner's loop (or, once that loop is over, the thread that frees
 * the mailbox) takes items; a batch handed to the callback is the callback's to use until
 * it returns and is freed after.
 */
#ifndef SLUICE_MAILBOX_H
#define SLUICE_MAILBOX_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

struct event;
struct event_base;

/* Called on the owner's loop with the n (>= 1) items taken, in order of posting. */
typedef void mailbox_fn(void *items, size_t n, void *arg);

struct mailbox {
	pthread_mutex_t lock;
	char *items;            /* len items of size bytes each, in a buffer of cap */
	size_t len, cap, size;
	bool shut;
	int fd;                 /* eventfd; -1 until attached */
	struct event *ev;
	mailbox_fn *fn;
	void *arg;
};

/* An empty mailbox of items of item_size bytes; posts are kept until attached. */
void mailbox_init(struct mailbox *mb, size_t item_size);
/* Deliver the items to fn(items, n, arg) on base's loop.  0, -errno (eventfd) or
 * -ENOMEM. */
int mailbox_attach(struct mailbox *mb, struct event_base *base, mailbox_fn *fn, void *arg);
/* Copy item in and wake the loop: 0, -ESHUTDOWN, -ENOMEM (nothing posted), or the
 * -errno of the wake-up's write (the item is posted). */
int mailbox_post(struct mailbox *mb, const void *item);
/* Refuse posts from now on. */
void mailbox_shut(struct mailbox *mb);
/* Take every item posted and not yet delivered: a malloc'ed array that the caller frees
 * (NULL when *ret_n is 0). */
void *mailbox_take(struct mailbox *mb, size_t *ret_n);
/* Free the event, the eventfd and the items still in it (take them first to see them). */
void mailbox_done(struct mailbox *mb);

#endif
