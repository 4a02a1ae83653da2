/*
 * mailbox -- hand work to a thread that runs a libevent loop (see mailbox.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "mailbox.h"

void mailbox_init(struct mailbox *mb, size_t item_size)
{
	*mb = (struct mailbox){ .size = item_size, .fd = -1 };
	pthread_mutex_init(&mb->lock, NULL);
}

void *mailbox_take(struct mailbox *mb, size_t *ret_n)
{
	pthread_mutex_lock(&mb->lock);
	void *items = mb->items;
	*ret_n = mb->len;
	mb->items = NULL;
	mb->len = mb->cap = 0;
	pthread_mutex_unlock(&mb->lock);
	return items;
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	struct mailbox *mb = arg;
	(void)what;
	uint64_t v;
	ssize_t r = read(fd, &v, sizeof(v));
	(void)r; /* EAGAIN: a wake-up whose items an earlier batch took */
	size_t n;
	void *items = mailbox_take(mb, &n);
	if (n)
		mb->fn(items, n, mb->arg);
	free(items);
}

int mailbox_attach(struct mailbox *mb, struct event_base *base, mailbox_fn *fn, void *arg)
{
	mb->fn = fn;
	mb->arg = arg;
	mb->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (mb->fd < 0)
		return -errno;
	mb->ev = event_new(base, mb->fd, EV_READ | EV_PERSIST, on_wake, mb);
	if (!mb->ev || event_add(mb->ev, NULL) < 0)
		return -ENOMEM;
	/* posted before: delivered on the first turn of the loop */
	pthread_mutex_lock(&mb->lock);
	bool waiting = mb->len > 0;
	pthread_mutex_unlock(&mb->lock);
	if (waiting)
		event_active(mb->ev, EV_READ, 0);
	return 0;
}

int mailbox_post(struct mailbox *mb, const void *item)
{
	pthread_mutex_lock(&mb->lock);
	if (mb->shut) {
		pthread_mutex_unlock(&mb->lock);
		return -ESHUTDOWN;
	}
	if (mb->len == mb->cap) {
		size_t cap = mb->cap ? mb->cap * 2 : 64;
		char *p = realloc(mb->items, cap * mb->size);
		if (!p) {
			pthread_mutex_unlock(&mb->lock);
			return -ENOMEM;
		}
		mb->items = p;
		mb->cap = cap;
	}
	memcpy(mb->items + mb->len * mb->size, item, mb->size);
	mb->len++;
	int fd = mb->fd;
	pthread_mutex_unlock(&mb->lock);
	uint64_t one = 1;
	/* an eventfd counter does not overflow at this rate; EAGAIN would mean it is
	 * already readable */
	if (fd >= 0 && write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		return -errno;
	return 0;
}

void mailbox_shut(struct mailbox *mb)
{
	pthread_mutex_lock(&mb->lock);
	mb->shut = true;
	pthread_mutex_unlock(&mb->lock);
}

void mailbox_done(struct mailbox *mb)
{
	if (mb->ev)
		event_free(mb->ev);
	if (mb->fd >= 0)
		close(mb->fd);
	free(mb->items);
	pthread_mutex_destroy(&mb->lock);
	*mb = (struct mailbox){ .fd = -1 };
}
