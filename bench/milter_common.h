/*
 * milter_common.h -- what the benchmark's libmilter reference filters (null_milter,
 * counter_milter) share: the stages a filter registers (-s) and answers without a reply
 * (-R), the callbacks that only continue, the xxfi_negotiate that asks the MTA for
 * exactly those steps, and the libmilter setup around smfi_main().
 *
 * Invariants:
 *  - The stage sets are written once, by milter_common_stages() and the program's own
 *    checks, before smfi_main(); the callbacks (one thread per MTA connection) only
 *    read them, so they need no lock.
 *  - A stage not registered is skipped with its SMFIP_NO* bit; a registered -R stage is
 *    negotiated with its SMFIP_NR_* bit.  Only bits the MTA offered are requested, and
 *    no actions.
 */
#ifndef SLUICE_BENCH_MILTER_COMMON_H
#define SLUICE_BENCH_MILTER_COMMON_H

#include <stdbool.h>

#include <libmilter/mfapi.h>

enum milter_common_stage {
	MILTER_COMMON_CONNECT = 0,
	MILTER_COMMON_HELO,
	MILTER_COMMON_MAIL,
	MILTER_COMMON_RCPT,
	MILTER_COMMON_DATA,
	MILTER_COMMON_HEADER,
	MILTER_COMMON_EOH,
	MILTER_COMMON_BODY,
	MILTER_COMMON_UNKNOWN,
	MILTER_COMMON_EOM,
	MILTER_COMMON__MAX,
};

#define MILTER_COMMON_BIT(s) (1u << (s))

/* The program's name, for messages; main() sets it before anything else. */
extern const char *milter_common_prog;
/* The stages registered (-s), and those of them negotiated without a reply (-R). */
extern bool milter_common_registered[MILTER_COMMON__MAX];
extern bool milter_common_noreply[MILTER_COMMON__MAX];

/* A stage's name as -s and -R spell it. */
const char *milter_common_stage_name(enum milter_common_stage s);

/*
 * Parses the comma-separated stage lists reg (-s) and nr (-R), each a stage among those
 * in the allowed mask (MILTER_COMMON_BIT), into milter_common_registered and
 * milter_common_noreply, then registers the stages in the always mask as well.
 * Returns 0, or -EINVAL after a message on stderr.
 */
int milter_common_stages(const char *reg, const char *nr, unsigned allowed, unsigned always);

/*
 * Fills desc for a filter called name: no flags, the continue-only callbacks below for
 * every registered stage from connect to unknown, and milter_common_negotiate.  The
 * program then sets the callbacks it implements itself (at least xxfi_eom).
 */
void milter_common_desc(struct smfiDesc *desc, const char *name);

/*
 * Registers desc and listens on sock (libmilter syntax) with backlog and timeout
 * (seconds), replacing a stale unix socket; smfi_main() comes next.  Returns 0, or
 * -EINVAL after a message on stderr.
 */
int milter_common_listen(const char *sock, int backlog, int timeout,
    const struct smfiDesc *desc);

/* CONTINUE, or NOREPLY for a stage negotiated without a reply. */
sfsistat milter_common_answer(enum milter_common_stage s);

#endif
