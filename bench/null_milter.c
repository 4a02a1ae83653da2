/*
 * null_milter.c -- the reference point for the milter benchmark: a filter built on
 * Sendmail's libmilter that accepts everything and does no work.
 *
 * It registers callbacks only for the stages it is told to (-s), and asks the MTA in
 * xxfi_negotiate to skip every other stage (SMFIP_NO*) and not to wait for a reply to
 * the stages listed in -R (SMFIP_NR_*).  So it can negotiate exactly the protocol
 * steps another filter (sluiced with a `reply` block) negotiates, and the benchmark
 * compares the two on identical traffic.  Every callback answers CONTINUE (or
 * NOREPLY for an -R stage); end-of-message answers ACCEPT (or CONTINUE with -e).
 *
 * XXX libmilter cannot reuse a connection (QUIT_NC) after it answered ACCEPT: the
 * engine then falls back to its HELO state, from which QUIT_NC and the CONNECT that
 * follows are not reachable, so it drops both silently and the MTA waits for a reply
 * that never comes.  Use -e continue (CONTINUE at end-of-message also accepts the
 * message) with milter_load --reuse.
 *
 * libmilter runs one thread per MTA connection; that is what is being measured.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "milter_common.h"

/* Set once in main() before smfi_main(); read-only in the callbacks. */
static sfsistat eom_reply = SMFIS_ACCEPT;

static sfsistat null_eom(SMFICTX *ctx)
{
	(void)ctx;
	return eom_reply;
}

static void usage(FILE *f)
{
	fputs("usage: null_milter -p SOCKET [-s STAGES] [-R STAGES] [-e REPLY] [-b BACKLOG] [-T SECS]\n"
	    "A libmilter filter that accepts everything, for benchmarks.\n"
	    "  -p SOCKET   unix:/path or inet:port@host (libmilter syntax)\n"
	    "  -s STAGES   stages to register, comma-separated, from connect helo mail rcpt data\n"
	    "              header eoh body unknown eom; others are skipped with SMFIP_NO*\n"
	    "              (default connect,helo,mail,rcpt,eom: what sluiced negotiates\n"
	    "              with a reply for those five stages)\n"
	    "  -R STAGES   registered stages negotiated without reply (SMFIP_NR_*)\n"
	    "  -e REPLY    end-of-message reply: accept (default) or continue; use continue\n"
	    "              with milter_load --reuse (libmilter drops QUIT_NC after ACCEPT)\n"
	    "  -b BACKLOG  listen backlog (default 4096)\n"
	    "  -T SECONDS  libmilter I/O timeout (default 7210)\n", f);
}

int main(int argc, char **argv)
{
	struct smfiDesc desc;
	const char *sock = NULL, *reg = "connect,helo,mail,rcpt,eom", *nr = "";
	int ch, backlog = 4096, timeout = 7210;

	milter_common_prog = "null_milter";
	while ((ch = getopt(argc, argv, "b:e:hp:R:s:T:")) != -1) {
		switch (ch) {
		case 'b': backlog = atoi(optarg); break;
		case 'e':
			if (strcmp(optarg, "accept") == 0) {
				eom_reply = SMFIS_ACCEPT;
			} else if (strcmp(optarg, "continue") == 0) {
				eom_reply = SMFIS_CONTINUE;
			} else {
				usage(stderr);
				return 2;
			}
			break;
		case 'p': sock = optarg; break;
		case 'R': nr = optarg; break;
		case 's': reg = optarg; break;
		case 'T': timeout = atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (sock == NULL || optind != argc || backlog <= 0 || timeout <= 0) {
		usage(stderr);
		return 2;
	}
	if (milter_common_stages(reg, nr, ~0u, MILTER_COMMON_BIT(MILTER_COMMON_EOM)) < 0)
		return 2;
	/* The final verdict: always answered. */
	if (milter_common_noreply[MILTER_COMMON_EOM]) {
		fprintf(stderr, "null_milter: eom always has a reply\n");
		return 2;
	}
	for (int s = 0; s < MILTER_COMMON__MAX; s++) {
		if (milter_common_noreply[s] && !milter_common_registered[s]) {
			fprintf(stderr, "null_milter: -R %s: stage not registered with -s\n",
			    milter_common_stage_name(s));
			return 2;
		}
	}

	milter_common_desc(&desc, "null_milter");
	desc.xxfi_eom = null_eom;
	if (milter_common_listen(sock, backlog, timeout, &desc) < 0)
		return 1;
	return smfi_main() == MI_SUCCESS ? 0 : 1;
}
