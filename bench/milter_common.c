/*
 * milter_common.c -- the libmilter plumbing null_milter and counter_milter share; see
 * milter_common.h.  Messages keep each program's wording, prefixed with
 * milter_common_prog.
 */
#include "milter_common.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

struct stage_info {
	const char *name;
	unsigned long skip;     /* SMFIP_NO*, 0 when the stage cannot be skipped */
	unsigned long noreply;  /* SMFIP_NR_*, 0 when the stage must be answered */
};

static const struct stage_info stages[MILTER_COMMON__MAX] = {
	[MILTER_COMMON_CONNECT] = { "connect", SMFIP_NOCONNECT, SMFIP_NR_CONN },
	[MILTER_COMMON_HELO]    = { "helo", SMFIP_NOHELO, SMFIP_NR_HELO },
	[MILTER_COMMON_MAIL]    = { "mail", SMFIP_NOMAIL, SMFIP_NR_MAIL },
	[MILTER_COMMON_RCPT]    = { "rcpt", SMFIP_NORCPT, SMFIP_NR_RCPT },
	[MILTER_COMMON_DATA]    = { "data", SMFIP_NODATA, SMFIP_NR_DATA },
	[MILTER_COMMON_HEADER]  = { "header", SMFIP_NOHDRS, SMFIP_NR_HDR },
	[MILTER_COMMON_EOH]     = { "eoh", SMFIP_NOEOH, SMFIP_NR_EOH },
	[MILTER_COMMON_BODY]    = { "body", SMFIP_NOBODY, SMFIP_NR_BODY },
	[MILTER_COMMON_UNKNOWN] = { "unknown", SMFIP_NOUNKNOWN, SMFIP_NR_UNKN },
	[MILTER_COMMON_EOM]     = { "eom", 0, 0 },
};

const char *milter_common_prog = "milter";
bool milter_common_registered[MILTER_COMMON__MAX];
bool milter_common_noreply[MILTER_COMMON__MAX];

const char *milter_common_stage_name(enum milter_common_stage s)
{
	return stages[s].name;
}

/* Parses a comma-separated list of allowed stages into set[]; returns 0 or -EINVAL. */
static int parse_stages(const char *list, unsigned allowed, bool set[MILTER_COMMON__MAX])
{
	const char *p = list, *end;
	size_t len;
	int s;

	memset(set, 0, MILTER_COMMON__MAX * sizeof set[0]);
	if (*p == '\0')
		return 0;
	for (;;) {
		end = strchr(p, ',');
		len = end != NULL ? (size_t)(end - p) : strlen(p);
		for (s = 0; s < MILTER_COMMON__MAX; s++)
			if ((allowed & MILTER_COMMON_BIT(s)) && strlen(stages[s].name) == len &&
			    strncmp(stages[s].name, p, len) == 0)
				break;
		if (s == MILTER_COMMON__MAX) {
			fprintf(stderr, "%s: unknown stage \"%.*s\"\n", milter_common_prog, (int)len, p);
			return -EINVAL;
		}
		set[s] = true;
		if (end == NULL)
			return 0;
		p = end + 1;
	}
}

int milter_common_stages(const char *reg, const char *nr, unsigned allowed, unsigned always)
{
	if (parse_stages(reg, allowed, milter_common_registered) < 0 ||
	    parse_stages(nr, allowed, milter_common_noreply) < 0)
		return -EINVAL;
	for (int s = 0; s < MILTER_COMMON__MAX; s++)
		if (always & MILTER_COMMON_BIT(s))
			milter_common_registered[s] = true;
	return 0;
}

sfsistat milter_common_answer(enum milter_common_stage s)
{
	return milter_common_noreply[s] ? SMFIS_NOREPLY : SMFIS_CONTINUE;
}

/* ---- the continue-only callbacks ---------------------------------------------------- */

static sfsistat common_connect(SMFICTX *ctx, char *host, _SOCK_ADDR *addr)
{
	(void)ctx; (void)host; (void)addr;
	return milter_common_answer(MILTER_COMMON_CONNECT);
}

static sfsistat common_helo(SMFICTX *ctx, char *helo)
{
	(void)ctx; (void)helo;
	return milter_common_answer(MILTER_COMMON_HELO);
}

static sfsistat common_envfrom(SMFICTX *ctx, char **argv)
{
	(void)ctx; (void)argv;
	return milter_common_answer(MILTER_COMMON_MAIL);
}

static sfsistat common_envrcpt(SMFICTX *ctx, char **argv)
{
	(void)ctx; (void)argv;
	return milter_common_answer(MILTER_COMMON_RCPT);
}

static sfsistat common_data(SMFICTX *ctx)
{
	(void)ctx;
	return milter_common_answer(MILTER_COMMON_DATA);
}

static sfsistat common_header(SMFICTX *ctx, char *name, char *value)
{
	(void)ctx; (void)name; (void)value;
	return milter_common_answer(MILTER_COMMON_HEADER);
}

static sfsistat common_eoh(SMFICTX *ctx)
{
	(void)ctx;
	return milter_common_answer(MILTER_COMMON_EOH);
}

static sfsistat common_body(SMFICTX *ctx, unsigned char *chunk, size_t len)
{
	(void)ctx; (void)chunk; (void)len;
	return milter_common_answer(MILTER_COMMON_BODY);
}

static sfsistat common_unknown(SMFICTX *ctx, const char *cmd)
{
	(void)ctx; (void)cmd;
	return milter_common_answer(MILTER_COMMON_UNKNOWN);
}

/*
 * Asks for no actions, and for exactly the protocol steps selected: skip the stages
 * not registered, no reply for the -R stages.  Bits the MTA did not offer are left
 * out; libmilter then answers a no-reply stage with CONTINUE on our behalf.
 */
static sfsistat common_negotiate(SMFICTX *ctx, unsigned long f0, unsigned long f1,
    unsigned long f2, unsigned long f3, unsigned long *pf0, unsigned long *pf1,
    unsigned long *pf2, unsigned long *pf3)
{
	unsigned long want = 0;

	(void)ctx; (void)f0; (void)f2; (void)f3;
	for (int s = 0; s < MILTER_COMMON__MAX; s++) {
		if (!milter_common_registered[s])
			want |= stages[s].skip;
		else if (milter_common_noreply[s])
			want |= stages[s].noreply;
	}
	*pf0 = 0;
	*pf1 = want & f1;
	*pf2 = 0;
	*pf3 = 0;
	return SMFIS_CONTINUE;
}

void milter_common_desc(struct smfiDesc *desc, const char *name)
{
	const bool *reg = milter_common_registered;

	memset(desc, 0, sizeof *desc);
	desc->xxfi_name = (char *)name;
	desc->xxfi_version = SMFI_VERSION;
	desc->xxfi_flags = 0;
	desc->xxfi_connect = reg[MILTER_COMMON_CONNECT] ? common_connect : NULL;
	desc->xxfi_helo = reg[MILTER_COMMON_HELO] ? common_helo : NULL;
	desc->xxfi_envfrom = reg[MILTER_COMMON_MAIL] ? common_envfrom : NULL;
	desc->xxfi_envrcpt = reg[MILTER_COMMON_RCPT] ? common_envrcpt : NULL;
	desc->xxfi_data = reg[MILTER_COMMON_DATA] ? common_data : NULL;
	desc->xxfi_header = reg[MILTER_COMMON_HEADER] ? common_header : NULL;
	desc->xxfi_eoh = reg[MILTER_COMMON_EOH] ? common_eoh : NULL;
	desc->xxfi_body = reg[MILTER_COMMON_BODY] ? common_body : NULL;
	desc->xxfi_unknown = reg[MILTER_COMMON_UNKNOWN] ? common_unknown : NULL;
	desc->xxfi_negotiate = common_negotiate;
}

int milter_common_listen(const char *sock, int backlog, int timeout,
    const struct smfiDesc *desc)
{
	if (smfi_setconn((char *)sock) != MI_SUCCESS) {
		fprintf(stderr, "%s: bad socket %s\n", milter_common_prog, sock);
		return -EINVAL;
	}
	if (smfi_setbacklog(backlog) != MI_SUCCESS || smfi_settimeout(timeout) != MI_SUCCESS) {
		fprintf(stderr, "%s: bad backlog or timeout\n", milter_common_prog);
		return -EINVAL;
	}
	if (smfi_register(*desc) != MI_SUCCESS) {
		fprintf(stderr, "%s: smfi_register failed\n", milter_common_prog);
		return -EINVAL;
	}
	/* Remove a stale unix socket left by an earlier run. */
	if (smfi_opensocket(true) != MI_SUCCESS) {
		fprintf(stderr, "%s: cannot open %s\n", milter_common_prog, sock);
		return -EINVAL;
	}
	return 0;
}
