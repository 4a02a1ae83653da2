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
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libmilter/mfapi.h>

enum stage {
	ST_CONNECT = 0,
	ST_HELO,
	ST_MAIL,
	ST_RCPT,
	ST_DATA,
	ST_HEADER,
	ST_EOH,
	ST_BODY,
	ST_UNKNOWN,
	ST_EOM,
	ST__MAX,
};

struct stage_info {
	const char *name;
	unsigned long skip;     /* SMFIP_NO* */
	unsigned long noreply;  /* SMFIP_NR_*, 0 when the stage must be answered */
};

static const struct stage_info stages[ST__MAX] = {
	[ST_CONNECT] = { "connect", SMFIP_NOCONNECT, SMFIP_NR_CONN },
	[ST_HELO]    = { "helo", SMFIP_NOHELO, SMFIP_NR_HELO },
	[ST_MAIL]    = { "mail", SMFIP_NOMAIL, SMFIP_NR_MAIL },
	[ST_RCPT]    = { "rcpt", SMFIP_NORCPT, SMFIP_NR_RCPT },
	[ST_DATA]    = { "data", SMFIP_NODATA, SMFIP_NR_DATA },
	[ST_HEADER]  = { "header", SMFIP_NOHDRS, SMFIP_NR_HDR },
	[ST_EOH]     = { "eoh", SMFIP_NOEOH, SMFIP_NR_EOH },
	[ST_BODY]    = { "body", SMFIP_NOBODY, SMFIP_NR_BODY },
	[ST_UNKNOWN] = { "unknown", SMFIP_NOUNKNOWN, SMFIP_NR_UNKN },
	[ST_EOM]     = { "eom", 0, 0 },
};

/* Set once in main() before smfi_main(); read-only in the callbacks. */
static bool registered[ST__MAX];
static bool noreply[ST__MAX];
static sfsistat eom_reply = SMFIS_ACCEPT;

static sfsistat answer(enum stage s)
{
	return noreply[s] ? SMFIS_NOREPLY : SMFIS_CONTINUE;
}

static sfsistat null_connect(SMFICTX *ctx, char *host, _SOCK_ADDR *addr)
{
	(void)ctx; (void)host; (void)addr;
	return answer(ST_CONNECT);
}

static sfsistat null_helo(SMFICTX *ctx, char *helo)
{
	(void)ctx; (void)helo;
	return answer(ST_HELO);
}

static sfsistat null_envfrom(SMFICTX *ctx, char **argv)
{
	(void)ctx; (void)argv;
	return answer(ST_MAIL);
}

static sfsistat null_envrcpt(SMFICTX *ctx, char **argv)
{
	(void)ctx; (void)argv;
	return answer(ST_RCPT);
}

static sfsistat null_data(SMFICTX *ctx)
{
	(void)ctx;
	return answer(ST_DATA);
}

static sfsistat null_header(SMFICTX *ctx, char *name, char *value)
{
	(void)ctx; (void)name; (void)value;
	return answer(ST_HEADER);
}

static sfsistat null_eoh(SMFICTX *ctx)
{
	(void)ctx;
	return answer(ST_EOH);
}

static sfsistat null_body(SMFICTX *ctx, unsigned char *chunk, size_t len)
{
	(void)ctx; (void)chunk; (void)len;
	return answer(ST_BODY);
}

static sfsistat null_unknown(SMFICTX *ctx, const char *cmd)
{
	(void)ctx; (void)cmd;
	return answer(ST_UNKNOWN);
}

static sfsistat null_eom(SMFICTX *ctx)
{
	(void)ctx;
	return eom_reply;
}

/*
 * Asks for no actions, and for exactly the protocol steps selected: skip the stages
 * not registered, no reply for the -R stages.  Bits the MTA did not offer are left
 * out; libmilter then answers a no-reply stage with CONTINUE on our behalf.
 */
static sfsistat null_negotiate(SMFICTX *ctx, unsigned long f0, unsigned long f1,
    unsigned long f2, unsigned long f3, unsigned long *pf0, unsigned long *pf1,
    unsigned long *pf2, unsigned long *pf3)
{
	unsigned long want = 0;

	(void)ctx; (void)f0; (void)f2; (void)f3;
	for (int s = 0; s < ST__MAX; s++) {
		if (!registered[s])
			want |= stages[s].skip;
		else if (noreply[s])
			want |= stages[s].noreply;
	}
	*pf0 = 0;
	*pf1 = want & f1;
	*pf2 = 0;
	*pf3 = 0;
	return SMFIS_CONTINUE;
}

/* Parses a comma-separated stage list into set[]; returns 0 or -EINVAL. */
static int parse_stages(const char *list, bool set[ST__MAX])
{
	const char *p = list, *end;
	size_t len;
	int s;

	memset(set, 0, ST__MAX * sizeof set[0]);
	if (*p == '\0')
		return 0;
	for (;;) {
		end = strchr(p, ',');
		len = end != NULL ? (size_t)(end - p) : strlen(p);
		for (s = 0; s < ST__MAX; s++)
			if (strlen(stages[s].name) == len && strncmp(stages[s].name, p, len) == 0)
				break;
		if (s == ST__MAX) {
			fprintf(stderr, "null_milter: unknown stage \"%.*s\"\n", (int)len, p);
			return -EINVAL;
		}
		set[s] = true;
		if (end == NULL)
			return 0;
		p = end + 1;
	}
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
	if (parse_stages(reg, registered) < 0 || parse_stages(nr, noreply) < 0)
		return 2;
	registered[ST_EOM] = true;      /* the final verdict: always answered */
	if (noreply[ST_EOM]) {
		fprintf(stderr, "null_milter: eom always has a reply\n");
		return 2;
	}
	for (int s = 0; s < ST__MAX; s++) {
		if (noreply[s] && !registered[s]) {
			fprintf(stderr, "null_milter: -R %s: stage not registered with -s\n",
			    stages[s].name);
			return 2;
		}
	}

	memset(&desc, 0, sizeof desc);
	desc.xxfi_name = (char *)"null_milter";
	desc.xxfi_version = SMFI_VERSION;
	desc.xxfi_flags = 0;
	desc.xxfi_connect = registered[ST_CONNECT] ? null_connect : NULL;
	desc.xxfi_helo = registered[ST_HELO] ? null_helo : NULL;
	desc.xxfi_envfrom = registered[ST_MAIL] ? null_envfrom : NULL;
	desc.xxfi_envrcpt = registered[ST_RCPT] ? null_envrcpt : NULL;
	desc.xxfi_data = registered[ST_DATA] ? null_data : NULL;
	desc.xxfi_header = registered[ST_HEADER] ? null_header : NULL;
	desc.xxfi_eoh = registered[ST_EOH] ? null_eoh : NULL;
	desc.xxfi_body = registered[ST_BODY] ? null_body : NULL;
	desc.xxfi_unknown = registered[ST_UNKNOWN] ? null_unknown : NULL;
	desc.xxfi_eom = null_eom;
	desc.xxfi_negotiate = null_negotiate;

	if (smfi_setconn((char *)sock) != MI_SUCCESS) {
		fprintf(stderr, "null_milter: bad socket %s\n", sock);
		return 1;
	}
	if (smfi_setbacklog(backlog) != MI_SUCCESS || smfi_settimeout(timeout) != MI_SUCCESS) {
		fprintf(stderr, "null_milter: bad backlog or timeout\n");
		return 1;
	}
	if (smfi_register(desc) != MI_SUCCESS) {
		fprintf(stderr, "null_milter: smfi_register failed\n");
		return 1;
	}
	/* Remove a stale unix socket left by an earlier run. */
	if (smfi_opensocket(true) != MI_SUCCESS) {
		fprintf(stderr, "null_milter: cannot open %s\n", sock);
		return 1;
	}
	return smfi_main() == MI_SUCCESS ? 0 : 1;
}
