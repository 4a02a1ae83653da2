/*
 * ebr -- epoch-based reclamation: freeing an object that other threads may still be
 * reading without a lock, once none of them can hold it any more.
 *
 * A reader brackets every use of a shared pointer with ebr_enter() ... ebr_exit() and
 * keeps nothing it loaded past ebr_exit().  A writer unlinks the object (swaps the shared
 * pointer so that no new reader can load it), then ebr_retire()s it with its free
 * function; ebr_collect() frees, later, the retired objects that no reader section can
 * still see.  ebr_shutdown() frees the rest when no reader is left.
 *
 * Invariant: an object retired at epoch e is freed only when every reader section was
 * either out of its section, or entered after the global epoch reached e (that is, after
 * the object was unlinked) -- so no section that could have loaded it is still running.
 *
 * Readers cost one thread-local test, one load of the global epoch, one store to the
 * thread's own slot (a cache line of its own) and one full fence; no shared counter is
 * bumped.  Threads get a slot on their first ebr_enter() (EBR_SLOTS of them, given back
 * when the thread ends); a thread that finds none counts itself in a shared overflow
 * counter instead, which is safe but stalls reclamation while any such reader is inside.
 * Sections nest (only the outermost one announces itself); they must be short and must
 * not block, since everything retired meanwhile waits for them.
 */
#ifndef SLUICE_EBR_H
#define SLUICE_EBR_H

#include <stddef.h>

#define EBR_SLOTS 320 /* workers (up to 256) and the helper threads that read */

/* Enter / leave a read section (any thread; nestable).  Every ebr_exit() matches one
 * ebr_enter() on the same thread. */
void ebr_enter(void);
void ebr_exit(void);

/*
 * Hand p, already unlinked from every shared pointer, to free_fn(p) once no reader can
 * hold it.  Any thread, but never from inside a read section (a retire may have to wait
 * for readers: see ebr.c).  p NULL does nothing.
 */
typedef void ebr_free_fn(void *p);
void ebr_retire(void *p, ebr_free_fn *free_fn);

/* Free the retired objects no reader can see any more (any thread, outside a section; the
 * free functions run outside the module's lock).  Returns how many were freed. */
size_t ebr_collect(void);

/* Free every retired object, seen or not: only when no reader section can run any more
 * (at exit, after the threads are joined).  Returns how many were freed. */
size_t ebr_shutdown(void);

/* Objects retired and not yet freed; slots held by live threads (tests, metrics). */
size_t ebr_pending(void);
unsigned ebr_slots_used(void);

#endif
