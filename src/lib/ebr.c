/*
 * ebr -- epoch-based reclamation (see ebr.h).
 *
 * State.  A global epoch, starting at 1 and bumped by every retire (64 bits: it never
 * wraps).  EBR_SLOTS reader slots, each on cache lines of its own: 0 while its thread is
 * outside any section, else the global epoch its thread read on entering its outermost
 * section.  An overflow counter of the readers inside a section that have no slot.  The
 * limbo list of retired objects, newest first, each tagged with the epoch its retire
 * produced; it and `pending` are under `lock`.
 *
 * Why it is safe.  The writer unlinks p, then retire takes tag = ++epoch (seq_cst).
 * collect() frees p when, after a seq_cst fence, every slot reads 0 or a value >= tag
 * (and the overflow counter reads 0).  Take a reader section R that loaded p:
 *   - if its slot was read as a value >= tag: R's acquire load of the epoch read the
 *     increment that made tag or a later one (every store to the epoch is a read-modify-
 *     write, so all of them continue the release sequence of that increment): the unlink
 *     happens before R's load of the shared pointer, which cannot return p.  Contradiction;
 *   - if the collector's slot load did not see R's announcement: R stored its slot, then
 *     a seq_cst fence Fr, then loaded the pointer; the collector unlinked (or was ordered
 *     after the unlink through `lock`), then a seq_cst fence Fc, then read the slot.  Not
 *     seeing R's store means Fc precedes Fr in the single order of seq_cst fences (C11
 *     7.17.3: else the load would see the store), so R's pointer load sees the unlink and
 *     cannot return p.  Contradiction;
 *   - if the slot was read as 0 written by R's ebr_exit() (release; the collector's load
 *     is acquire): R's reads of p happen before the free.  That is the case we want.
 * A slot value < tag keeps p (R may hold it): conservative, never wrong.  The store-load
 * ordering on both sides is what needs the seq_cst fences: acquire/release alone would let
 * the reader's slot store and the collector's slot load both miss each other's writes.
 *
 * Slots are claimed with a compare-and-swap on `used` and given back by a thread-specific
 * key's destructor when the thread ends, so short-lived threads (tests, helpers) do not
 * exhaust them.  A thread that found no slot stays on the overflow counter for its life
 * (XXX: while any overflow reader is inside, nothing is freed; with EBR_SLOTS above the
 * daemon's thread count this is a safety net, not a path expected to run).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "ebr.h"
#include "log.h"

/* 128 bytes: the slot's line and its pair (adjacent-line prefetch) are the thread's own */
struct ebr_slot {
	_Alignas(128) _Atomic uint64_t epoch; /* 0 = outside; else the epoch announced */
	_Atomic bool used;                    /* claimed by a live thread */
};

struct ebr_node {
	struct ebr_node *next;
	void *p;
	ebr_free_fn *free_fn;
	uint64_t tag;
};

static struct ebr_slot slots[EBR_SLOTS];
static _Alignas(128) _Atomic uint64_t global_epoch = 1;
static _Alignas(128) _Atomic unsigned long overflow_readers;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct ebr_node *limbo; /* newest first: tags decrease along the list */
static size_t pending;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t slot_key;
static bool key_ok;

static _Thread_local struct ebr_slot *t_slot;
static _Thread_local bool t_no_slot;    /* tried once, none free: overflow for life */
static _Thread_local unsigned t_depth;
static _Thread_local bool t_overflow;   /* the outermost section counted in overflow */

/* Thread exit: give the slot back.  The thread is outside any section by then (a thread
 * that ended inside one holds nothing any more either), so 0 is the truth.  t_slot is
 * forgotten too: another thread may claim the slot at once, and a later key destructor
 * of this thread that reads (enters) must claim afresh, not share it. */
static void slot_release(void *arg)
{
	struct ebr_slot *s = arg;
	t_slot = NULL;
	t_no_slot = false;
	atomic_store_explicit(&s->epoch, 0, memory_order_release);
	atomic_store_explicit(&s->used, false, memory_order_release);
}

static void key_init(void)
{
	key_ok = pthread_key_create(&slot_key, slot_release) == 0;
}

/* A free slot for the calling thread, or NULL (then the thread uses the overflow counter;
 * also when the key could not be made: a slot never given back would leak one per
 * thread). */
static struct ebr_slot *slot_claim(void)
{
	pthread_once(&key_once, key_init);
	if (!key_ok)
		return NULL;
	for (size_t i = 0; i < EBR_SLOTS; i++) {
		bool expect = false;
		if (atomic_load_explicit(&slots[i].used, memory_order_relaxed))
			continue;
		/* acquire: the previous owner's last stores (epoch 0) are seen */
		if (atomic_compare_exchange_strong_explicit(&slots[i].used, &expect, true,
							    memory_order_acquire,
							    memory_order_relaxed)) {
			if (pthread_setspecific(slot_key, &slots[i]) != 0) {
				atomic_store_explicit(&slots[i].used, false,
						      memory_order_release);
				return NULL;
			}
			return &slots[i];
		}
	}
	return NULL;
}

void ebr_enter(void)
{
	if (t_depth++ > 0)
		return; /* nested: the outermost announcement covers it */
	if (!t_slot && !t_no_slot) {
		t_slot = slot_claim();
		t_no_slot = !t_slot;
	}
	if (t_slot) {
		/* acquire: pairs with retire's increment (case 1 of the proof above) */
		uint64_t e = atomic_load_explicit(&global_epoch, memory_order_acquire);
		atomic_store_explicit(&t_slot->epoch, e, memory_order_relaxed);
		t_overflow = false;
	} else {
		atomic_fetch_add_explicit(&overflow_readers, 1, memory_order_relaxed);
		t_overflow = true;
	}
	/* Fr: the announcement is ordered before every load of the section (store-load) */
	atomic_thread_fence(memory_order_seq_cst);
}

void ebr_exit(void)
{
	ASSERT(t_depth > 0);
	if (--t_depth > 0)
		return;
	/* release: the section's reads of retired objects happen before their free */
	if (t_overflow)
		atomic_fetch_sub_explicit(&overflow_readers, 1, memory_order_release);
	else
		atomic_store_explicit(&t_slot->epoch, 0, memory_order_release);
}

/*
 * The oldest epoch a reader inside a section may have announced: UINT64_MAX when none is
 * inside, 0 when an overflow reader is (its epoch is unknown).  Objects tagged <= the
 * result are free to go.  Starts with the fence Fc of the proof.
 */
static uint64_t oldest_reader(void)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&overflow_readers, memory_order_acquire) > 0)
		return 0;
	uint64_t oldest = UINT64_MAX;
	for (size_t i = 0; i < EBR_SLOTS; i++) {
		uint64_t e = atomic_load_explicit(&slots[i].epoch, memory_order_acquire);
		if (e && e < oldest)
			oldest = e;
	}
	return oldest;
}

void ebr_retire(void *p, ebr_free_fn *free_fn)
{
	if (!p)
		return;
	/* the fallback below waits for readers: from inside a section it would wait for
	 * itself */
	ASSERT(t_depth == 0);
	struct ebr_node *n = malloc(sizeof(*n));
	/* Fw: the caller's unlink is ordered before the increment and, through `lock`,
	 * before any collector's Fc */
	atomic_thread_fence(memory_order_seq_cst);
	uint64_t tag = atomic_fetch_add_explicit(&global_epoch, 1, memory_order_seq_cst) + 1;
	if (!n) {
		/* out of memory: wait here for the readers instead (their sections are
		 * microseconds long; the overflow counter may take longer but does end) */
		struct timespec ts = { 0, 100000 };
		while (oldest_reader() < tag)
			nanosleep(&ts, NULL);
		free_fn(p);
		return;
	}
	*n = (struct ebr_node){ .p = p, .free_fn = free_fn, .tag = tag };
	pthread_mutex_lock(&lock);
	n->next = limbo;
	limbo = n;
	pending++;
	pthread_mutex_unlock(&lock);
}

/* Free a detached list (outside the lock: a free function may retire in turn). */
static size_t free_list(struct ebr_node *n)
{
	size_t freed = 0;
	while (n) {
		struct ebr_node *next = n->next;
		n->free_fn(n->p);
		free(n);
		n = next;
		freed++;
	}
	return freed;
}

size_t ebr_collect(void)
{
	pthread_mutex_lock(&lock);
	if (!limbo) {
		pthread_mutex_unlock(&lock);
		return 0;
	}
	uint64_t oldest = oldest_reader();
	/* every node is looked at: two threads that retire at once may join the list out
	 * of their tags' order (a tag is taken before the lock) */
	struct ebr_node **pp = &limbo, *dead = NULL;
	size_t n = 0;
	while (*pp) {
		struct ebr_node *d = *pp;
		if (d->tag > oldest) {
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		d->next = dead;
		dead = d;
		n++;
	}
	pending -= n;
	pthread_mutex_unlock(&lock);
	return free_list(dead);
}

size_t ebr_shutdown(void)
{
	pthread_mutex_lock(&lock);
	struct ebr_node *dead = limbo;
	limbo = NULL;
	pending = 0;
	pthread_mutex_unlock(&lock);
	return free_list(dead);
}

size_t ebr_pending(void)
{
	pthread_mutex_lock(&lock);
	size_t n = pending;
	pthread_mutex_unlock(&lock);
	return n;
}

unsigned ebr_slots_used(void)
{
	unsigned n = 0;
	for (size_t i = 0; i < EBR_SLOTS; i++)
		n += atomic_load_explicit(&slots[i].used, memory_order_relaxed);
	return n;
}
