/*
 * classify -- what a relay's reply means for the mail and for the lane (classify.h):
 * law 5 of doc/ARCHITECTURE.md, "throttling is not failure".
 *
 * Order of decision for a 4xx/5xx reply or a connection error (first match wins):
 *   1. the operator's signals, in configuration order;
 *   2. the built-in patterns below, in table order (replies only, not errors);
 *   3. the rules: "error" (a connection error), "421" (any stage), "stage" (4xx/5xx at
 *      connect, greeting, EHLO, STARTTLS, AUTH, MAIL, RSET, QUIT), "code" (4xx RETRY,
 *      5xx FAIL at RCPT, DATA, DOT).
 * A 2xx reply is OK whatever its text says, and no pattern is tried on it: a signal that
 * turned a delivered message into SUSPEND would leave its recipients to do, and they would
 * be delivered twice.  A 3xx is OK at DATA (354) and AUTH (334), SUSPEND elsewhere.
 *
 * Invariants
 *   - SUSPEND changes no recipient state, so it is the verdict for everything this module
 *     does not understand (an impossible code or stage, a missing reply, an unknown error).
 *   - No built-in pattern matches an ordinary recipient bounce ("550 5.1.1 User unknown",
 *     "552 5.2.2 Mailbox full", "552 5.3.4 Message too big", "550 5.7.1 spam"): they stay
 *     FAIL.  A full mailbox is the recipient's quota, not ours: the generic quota and
 *     rate patterns (daily-limit, sending-quota, rate-4xx, rate-5xx) are skipped when the
 *     reply speaks of a mailbox (X.2.2, "mailbox", "inbox", "storage", "disk", "over
 *     quota"); the vendor patterns before them name codes that are never a mailbox's.
 *   - A built-in SLOW never applies to a 421: the server is closing the connection, so the
 *     lane is suspended (an operator's signal may still say otherwise).
 *   - Bounded work: a pattern sees at most CLASSIFY_MATCH_MAX bytes; the retry hint is one
 *     left-to-right pass that never goes back more than one token.
 *
 * Built-in patterns (POSIX ERE, case-insensitive, against "CODE[ ENH] text"; sources are
 * the providers' own documentation, the enhanced codes are RFC 3463's):
 *
 *   name                   verdict  what it matches (source)
 *   exo-submission         SUSPEND  "STOREDRV.Submission", or X.2.0 with "submission" or
 *                                   "quota": Exchange Online SMTP AUTH submission refused
 *                                   for the sending mailbox (554 5.2.0 submission quota;
 *                                   554 5.2.2 when *our* Sent Items fill the mailbox).
 *                                   Microsoft Learn, "SMTP Authenticated Submission"
 *                                   throttling.  Before the mailbox exclusion on purpose.
 *   exo-sender-throttled   SUSPEND  5xx 5.2.250-5.2.259: "Sender throttled due to
 *                                   continuous ... errors" (251 mailbox full, 252 send as
 *                                   denied, 253 license, 254 too many recipients, 255
 *                                   invalid recipients; 250 and 256-259 undocumented, kept
 *                                   as the same family).  Microsoft Learn, "Continuous
 *                                   error throttling for SMTP AUTH submissions".
 *   exo-blocked            SUSPEND  5xx 5.7.606-649 (banned sending IP), 5.7.705 (tenant
 *                                   exceeded threshold), 5.7.708 (traffic not accepted
 *                                   from this IP), 5.7.750 (unregistered domains).
 *                                   Microsoft Learn, NDR 5.7.700-5.7.750.
 *   exo-outbound-sender    SUSPEND  5xx 5.1.8 "... bad outbound sender": the sending
 *                                   account is blocked for spam.  Microsoft Learn, NDRs
 *                                   in Exchange Online.
 *   exo-thread-limit       SLOW     432 4.3.2 "... thread limit": one recipient mailbox
 *                                   receives too fast (STOREDRV.Deliver).  Microsoft Learn.
 *   exo-concurrency        SUSPEND  432 4.3.2 otherwise: "Concurrent connections limit
 *                                   exceeded" (3 per mailbox on SMTP AUTH).  Microsoft Learn.
 *   exo-ip-throttling      SLOW     4xx 4.7.500-4.7.699 ("(ASxxx) Please try again later"):
 *                                   EOP throttles an IP whose volume changed.  Microsoft
 *                                   Learn, NDR 451 4.7.500-699.
 *   gmail-unsolicited-rate SUSPEND  4xx/5xx X.7.28: "unusual rate of unsolicited mail ...
 *                                   rate limited".  Google Workspace Admin Help, Gmail SMTP
 *                                   errors and codes.
 *   yahoo-ts               SUSPEND  "[TSnn]"/"[TSSnn]": Yahoo's deferrals and blocks of a
 *                                   sending IP (421 4.7.0 [TSS04] unexpected volume or
 *                                   complaints; 553 5.7.2 [TSS09] permanently deferred).
 *                                   Yahoo Sender Hub "SMTP error codes".
 *   gmail-421-4.7.0        SUSPEND  421 4.7.0 (Gmail "try again later, closing
 *                                   connection"; Yahoo [TSS04] deferrals).  Google, Yahoo
 *                                   Sender Hub "SMTP error codes".
 *   gmail-receiving-rate   SLOW     4xx 4.2.1 with "rate", "too quickly/fast" or "limit":
 *                                   "The user ... is receiving mail too quickly", "Peak
 *                                   SMTP relay limit exceeded".  Google Admin Help.
 *   receiving-rate         SLOW     "receiving mail|email|messages at a rate|too quickly",
 *                                   any code: Gmail also sends it as 550 5.2.1
 *                                   (?p=ReceivingRatePerm); a rate is never a bounce.
 *   sending-limit-5.4.5    SUSPEND  5xx 5.4.5: "Daily user sending limit/quota exceeded",
 *                                   "Daily SMTP relay limit exceeded" (Gmail, Workspace
 *                                   SMTP relay).  Google Admin Help; X.4.5 is "mail system
 *                                   congestion" (RFC 3463), never one recipient's state.
 *   congestion-4.4.5       SLOW     4xx 4.4.5: mail system congestion, e.g. "452 4.4.5
 *                                   Messages per second limit exceeded".  RFC 3463.
 *   ses-daily-quota        SUSPEND  454 "Throttling failure: Daily message quota exceeded".
 *                                   Amazon SES Developer Guide, sending quota errors.
 *   ses-throttling         SLOW     454 "Throttling failure: Maximum sending rate exceeded".
 *                                   Amazon SES Developer Guide and AWS Messaging blog
 *                                   ("retriable"; reduce the rate).
 *   too-many-rcpts-552     RETRY    552 5.5.3 or 552 "... too many recipients": RFC 5321
 *                                   4.5.3.1.10 says to treat it as 452 (send the rest in
 *                                   another transaction), not as a bounce.
 *   daily-limit            SUSPEND  "daily|hourly|per day|per hour|24 hours" then "limit" or
 *                                   "quota" within 40 bytes of one sentence: Exchange
 *                                   Online 5.1.90 ("daily limit for message recipients"),
 *                                   5.7.232/5.7.233 (tenant external recipient rate limit),
 *                                   Gmail 5.4.5.  Not for a mailbox.
 *   sending-quota          SUSPEND  "sending|send|outbound|submission|relay|message(s)"
 *                                   followed by "quota" or "limit" ("Sending quota
 *                                   exceeded", "Outbound quota exceeded").  Not for a
 *                                   mailbox.
 *   concurrency            SUSPEND  "too many (concurrent|simultaneous|smtp|open)
 *                                   connections|sessions", "concurrent connections",
 *                                   "connection limit" (Exim, Postfix
 *                                   smtpd_client_connection_count_limit, Exchange).
 *   rate-4xx               SLOW     a 4xx (not 421) with a rate word: "rate limit",
 *                                   "sending|message|mail|connection|submission|delivery
 *                                   rate", "unusual rate", "rate of mail", "rate
 *                                   exceeded", "throttl", "too many messages|mails|emails",
 *                                   "too fast|quickly|frequently", "slow down", "sending
 *                                   too" (Postfix policy daemons, Zimbra "Deferring: Too many
 *                                   messages from sender", SES, Gmail).  Not for a mailbox.
 *   rate-5xx               SUSPEND  the same words in a 5xx: an ISP smarthost that answers a
 *                                   burst with a permanent error (doc/RELAY.md, the ISP).
 *   suspended              SUSPEND  "suspended" ("550 5.7.1 Account suspended"), unless the
 *                                   reply is about a recipient (X.1.x, X.2.x, "mailbox",
 *                                   "recipient").
 *   banned                 SUSPEND  "banned", "blocked using" (Postfix reject_rbl_client),
 *                                   "blacklisted|blocklisted|denylisted", unless the reply
 *                                   speaks of content ("url", "uri", "link", "content",
 *                                   "body", "attachment"): a listed sending IP or domain.
 *   relay-denied           SUSPEND  "relay access denied", "relaying denied|not permitted",
 *                                   "not authenticated", "authentication required",
 *                                   "invalid credentials": the smarthost does not take our
 *                                   mail at all (lost credentials), every message would
 *                                   bounce.
 *
 * Deliberately not built in: "limit" or "limit exceeded" alone (message size limits,
 * mailbox storage limits and recipient-count limits say it too), "quota" alone (mailbox
 * quotas: "552 Mail quota exceeded"), "try again later" (greylisting says it: "451 4.7.1
 * Greylisted, try again later" is an ordinary RETRY of one recipient), all of X.7.x
 * (content rejections are per message: suspending the lane for them would stop it behind
 * one message).  An operator adds any of these as a signal.
 */
#include <errno.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "classify.h"
#include "util.h"

/* A pattern sees "CODE ENH text": 3 digits (or whatever a hostile caller put in code),
 * an enhanced code of at most 11 bytes, the kept text of a reply. */
#define CLASSIFY_MATCH_MAX (32 + SMTP_REPLY_TEXT_MAX)

#define HINT_CAP_MS ((int64_t)7 * 24 * 3600 * 1000)
#define HINT_GAP_BYTES 32 /* from the end of a cue word to the number */
#define HINT_GAP_WORDS 3  /* "in about 5 minutes", "wait at least 2 hours" */
#define HINT_PARTS 4      /* "1 hour and 30 minutes", "1h30m" */

/* Words that mean "a full mailbox", for the exclusions. */
#define MAILBOX_WORDS "(^[0-9]+ [45]\\.2\\.2( |$)|mailbox|inbox|storage|disk|over quota)"

/* Words that mean "you send too fast" (a leading non-alphanumeric keeps "rate" out of
 * "accurate", "separate"). */
#define RATE_WORDS                                                                        \
	"(^|[^[:alnum:]])(rate[ -]?limit|ratelimit|(sending|send|message|messages|mail|"     \
	"connection|submission|delivery) rate|unusual rate|rate of (mail|messages|e-?mail)|" \
	"rate exceeded|throttl|too (many|much) (messages|mails?|e-?mails)|"                  \
	"too (fast|quickly|frequently)|slow down|sending too)"

struct builtin {
	const char *name;
	const char *match;
	const char *unless; /* NULL: none */
	enum classify_verdict verdict;
};

/* The table of the file comment, in the order tried. */
static const struct builtin builtins[] = {
	{ "exo-submission",
	  "^[45][0-9][0-9] ([45]\\.2\\.0 .*(submission|quota)|.*STOREDRV\\.Submission)", NULL,
	  CLASSIFY_SUSPEND },
	{ "exo-sender-throttled", "^5[0-9][0-9] 5\\.2\\.25[0-9]( |$)", NULL, CLASSIFY_SUSPEND },
	{ "exo-blocked", "^5[0-9][0-9] 5\\.7\\.(6[0-4][0-9]|70[5-8]|750)( |$)", NULL,
	  CLASSIFY_SUSPEND },
	{ "exo-outbound-sender", "^5[0-9][0-9] 5\\.1\\.8 .*outbound sender", NULL,
	  CLASSIFY_SUSPEND },
	{ "exo-thread-limit", "^432 4\\.3\\.2 .*thread limit", NULL, CLASSIFY_SLOW },
	{ "exo-concurrency", "^432 4\\.3\\.2( |$)", NULL, CLASSIFY_SUSPEND },
	{ "exo-ip-throttling", "^4[0-9][0-9] 4\\.7\\.[56][0-9][0-9]( |$)", NULL, CLASSIFY_SLOW },
	{ "gmail-unsolicited-rate", "^[45][0-9][0-9] [45]\\.7\\.28( |$)", NULL, CLASSIFY_SUSPEND },
	{ "yahoo-ts", "\\[TSS?[0-9]+\\]", NULL, CLASSIFY_SUSPEND },
	{ "gmail-421-4.7.0", "^421 4\\.7\\.0( |$)", NULL, CLASSIFY_SUSPEND },
	{ "gmail-receiving-rate", "^4[0-9][0-9] 4\\.2\\.1 .*(rate|too (quickly|fast)|limit)",
	  NULL, CLASSIFY_SLOW },
	{ "receiving-rate", "receiving (e-?mail|mail|messages) (at a rate|too (quickly|fast))",
	  NULL, CLASSIFY_SLOW },
	{ "sending-limit-5.4.5", "^5[0-9][0-9] 5\\.4\\.5( |$)", NULL, CLASSIFY_SUSPEND },
	{ "congestion-4.4.5", "^4[0-9][0-9] 4\\.4\\.5( |$)", NULL, CLASSIFY_SLOW },
	{ "ses-daily-quota", "^454 .*throttling failure.*(daily|quota)", NULL, CLASSIFY_SUSPEND },
	{ "ses-throttling", "^454 .*throttling failure", NULL, CLASSIFY_SLOW },
	{ "too-many-rcpts-552", "^552 (5\\.5\\.3( |$)|.*too many recipients)", NULL,
	  CLASSIFY_RETRY },
	{ "daily-limit",
	  "(daily|hourly|per[ -]day|per[ -]hour|24[ -]?hours?)[^.;]{0,40}(limit|quota)",
	  MAILBOX_WORDS, CLASSIFY_SUSPEND },
	{ "sending-quota",
	  "(^|[^[:alnum:]])(sending|send|outbound|submission|relay|messages?)[ -](quota|limit)",
	  MAILBOX_WORDS, CLASSIFY_SUSPEND },
	{ "concurrency",
	  "too many (concurrent |simultaneous |smtp |open )?(connections|sessions)|"
	  "concurrent connections|connection limit",
	  NULL, CLASSIFY_SUSPEND },
	{ "rate-4xx", "^4[0-9][0-9].*" RATE_WORDS, MAILBOX_WORDS, CLASSIFY_SLOW },
	{ "rate-5xx", "^5[0-9][0-9].*" RATE_WORDS, MAILBOX_WORDS, CLASSIFY_SUSPEND },
	{ "suspended", "suspended",
	  "(^[0-9]+ [45]\\.[12]\\.[0-9]+( |$)|mailbox|recipient)", CLASSIFY_SUSPEND },
	{ "banned", "banned|blocked using|(black|block|deny)[ -]?listed",
	  "(^|[^[:alnum:]])(url|uri|link|content|body|attachment)", CLASSIFY_SUSPEND },
	{ "relay-denied",
	  "relay(ing)? (access )?(denied|not (permitted|allowed)|prohibited)|"
	  "not authenticated|authentication (is )?required|invalid credentials",
	  NULL, CLASSIFY_SUSPEND },
};

#define NBUILTINS (sizeof(builtins) / sizeof(builtins[0]))

struct classify_sig {
	regex_t rx;
	char *match;                 /* owned copy: the result's signal points here */
	enum classify_verdict action;
	int64_t for_ms;
	unsigned after;              /* <= 1: at once */
	int64_t within_ms;
};

struct classify_bi {
	regex_t rx;
	regex_t unless;
	bool has_unless;
};

struct classify {
	uint64_t serial;             /* told apart from every other classifier made */
	struct classify_sig *sig;
	size_t nsig;                 /* compiled, freed by classify_free */
	struct classify_bi bi[NBUILTINS];
	size_t nbi;                  /* compiled */
};

const char *classify_verdict_name(enum classify_verdict v)
{
	switch (v) {
	case CLASSIFY_OK:
		return "ok";
	case CLASSIFY_RETRY:
		return "retry";
	case CLASSIFY_FAIL:
		return "fail";
	case CLASSIFY_SUSPEND:
		return "suspend";
	case CLASSIFY_SLOW:
		return "slow";
	}
	return "?";
}

struct classify *classify_free(struct classify *c)
{
	if (!c)
		return NULL;
	for (size_t i = 0; i < c->nsig; i++) {
		regfree(&c->sig[i].rx);
		free(c->sig[i].match);
	}
	free(c->sig);
	for (size_t i = 0; i < c->nbi; i++) {
		regfree(&c->bi[i].rx);
		if (c->bi[i].has_unless)
			regfree(&c->bi[i].unless);
	}
	free(c);
	return NULL;
}

static void set_err(char *err, size_t errlen, const char *what, size_t i, const char *pattern,
		    int rc, const regex_t *rx)
{
	if (!err || errlen == 0)
		return;
	char msg[160];
	regerror(rc, rx, msg, sizeof(msg));
	/* truncation of a long pattern is fine: the message names it */
	snprintf(err, errlen, "%s %zu: bad pattern \"%.80s\": %s", what, i + 1, pattern, msg);
}

static int compile(regex_t *rx, const char *pattern)
{
	return regcomp(rx, pattern, REG_EXTENDED | REG_ICASE | REG_NOSUB);
}

struct classify *classify_new(const struct classify_signal_conf *sig, size_t n, char *err,
			      size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	struct classify *c = calloc(1, sizeof(*c));
	if (!c)
		goto nomem;
	static uint64_t serials;
	c->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
	if (n) {
		c->sig = calloc(n, sizeof(*c->sig));
		if (!c->sig)
			goto nomem;
	}
	for (size_t i = 0; i < n; i++) {
		struct classify_sig *s = &c->sig[i];
		if (!sig[i].match) {
			if (err && errlen)
				snprintf(err, errlen, "signal %zu: no match pattern", i + 1);
			goto inval;
		}
		/* OK would mark undelivered recipients done: a signal may not say it */
		if (sig[i].action != CLASSIFY_RETRY && sig[i].action != CLASSIFY_FAIL &&
		    sig[i].action != CLASSIFY_SUSPEND && sig[i].action != CLASSIFY_SLOW) {
			if (err && errlen)
				snprintf(err, errlen, "signal %zu: action must be suspend, slow, retry "
					 "or bounce", i + 1);
			goto inval;
		}
		s->match = strdup(sig[i].match);
		if (!s->match)
			goto nomem;
		int rc = compile(&s->rx, s->match);
		if (rc != 0) {
			set_err(err, errlen, "signal", i, s->match, rc, &s->rx);
			free(s->match);
			s->match = NULL;
			goto inval;
		}
		s->action = sig[i].action;
		s->for_ms = sig[i].for_ms > 0 ? sig[i].for_ms : 0;
		s->after = sig[i].after;
		s->within_ms = sig[i].within_ms;
		c->nsig++;
	}
	for (size_t i = 0; i < NBUILTINS; i++) {
		struct classify_bi *b = &c->bi[i];
		int rc = compile(&b->rx, builtins[i].match);
		if (rc != 0) {
			set_err(err, errlen, "built-in pattern", i, builtins[i].match, rc, &b->rx);
			goto inval;
		}
		if (builtins[i].unless) {
			rc = compile(&b->unless, builtins[i].unless);
			if (rc != 0) {
				set_err(err, errlen, "built-in pattern", i, builtins[i].unless, rc,
					&b->unless);
				regfree(&b->rx);
				goto inval;
			}
			b->has_unless = true;
		}
		c->nbi++;
	}
	return c;

nomem:
	if (err && errlen)
		snprintf(err, errlen, "out of memory");
	classify_free(c);
	errno = ENOMEM;
	return NULL;
inval:
	classify_free(c);
	errno = EINVAL;
	return NULL;
}

/* ---- what the patterns see ---- */

static size_t put(char *buf, size_t len, size_t at, const char *s, size_t n)
{
	if (at >= len)
		return at;
	size_t room = len - 1 - at;
	if (n > room)
		n = room;
	memcpy(buf + at, s, n);
	buf[at + n] = '\0';
	return at + n;
}

static bool starts_with(const char *p, size_t n, const char *prefix)
{
	size_t k = strlen(prefix);
	return n >= k && memcmp(p, prefix, k) == 0;
}

/* "CODE ENH text" (the reader keeps the enhanced code in the text; a reply built by hand
 * may not), NUL bytes made spaces so that the regex sees all of it, bounded. */
static void reply_match_text(const struct smtp_reply *r, char *buf, size_t len)
{
	char head[48];
	int w = snprintf(head, sizeof(head), "%d ", r->code);
	size_t at = put(buf, len, 0, head, w > 0 ? (size_t)w : 0);
	size_t tl = r->text_len < SMTP_REPLY_TEXT_MAX ? r->text_len : SMTP_REPLY_TEXT_MAX;
	if (r->enh_class) {
		char enh[40];
		w = snprintf(enh, sizeof(enh), "%d.%d.%d", r->enh_class, r->enh_subject,
			     r->enh_detail);
		if (w > 0 && (size_t)w < sizeof(enh) &&
		    !(starts_with(r->text, tl, enh) && (tl == (size_t)w || r->text[w] == ' '))) {
			at = put(buf, len, at, enh, (size_t)w);
			if (tl)
				at = put(buf, len, at, " ", 1);
		}
	}
	size_t start = at;
	at = put(buf, len, at, r->text, tl);
	for (size_t i = start; i < at; i++)
		if (buf[i] == '\0')
			buf[i] = ' ';
}

static void error_match_text(int error, char *buf, size_t len)
{
	const char *desc = strerrordesc_np(-error);
	if (desc)
		snprintf(buf, len, "connect: %s", desc);
	else
		snprintf(buf, len, "connect: error %d", -error);
}

static bool rx_match(const regex_t *rx, const char *s)
{
	return regexec(rx, s, 0, NULL, 0) == 0;
}

/* The first operator signal matching s, or NULL. */
static const struct classify_sig *match_signal(const struct classify *c, const bool *skip,
					       const char *s)
{
	for (size_t i = 0; i < c->nsig; i++)
		if (!(skip && skip[i]) && rx_match(&c->sig[i].rx, s))
			return &c->sig[i];
	return NULL;
}

size_t classify_nsignals(const struct classify *c)
{
	return c ? c->nsig : 0;
}

void classify_threshold(const struct classify *c, size_t i, unsigned *ret_after,
			int64_t *ret_within_ms)
{
	*ret_after = c && i < c->nsig ? c->sig[i].after : 0;
	*ret_within_ms = c && i < c->nsig ? c->sig[i].within_ms : 0;
}

uint64_t classify_serial(const struct classify *c)
{
	return c ? c->serial : 0;
}

uint64_t classify_threshold_key(const struct classify *c, size_t i)
{
	if (!c || i >= c->nsig)
		return 0;
	const struct classify_sig *g = &c->sig[i];
	uint64_t h = fnv1a64_str(FNV1A64_INIT, g->match);
	h = fnv1a64_u64(h, g->after);
	h = fnv1a64_u64(h, (uint64_t)g->within_ms);
	return h ? h : 1;
}

/* The first built-in matching s for a reply with this code, or -1. */
static long match_builtin(const struct classify *c, int code, const char *s)
{
	for (size_t i = 0; i < c->nbi; i++) {
		if (builtins[i].verdict == CLASSIFY_SLOW && code == 421)
			continue;
		if (!rx_match(&c->bi[i].rx, s))
			continue;
		if (c->bi[i].has_unless && rx_match(&c->bi[i].unless, s))
			continue;
		return (long)i;
	}
	return -1;
}

static bool stage_is_transaction(enum smtp_out_stage stage)
{
	return stage == SMTP_STAGE_RCPT || stage == SMTP_STAGE_DATA || stage == SMTP_STAGE_DOT;
}

/* The rules, once no pattern matched a 4xx/5xx reply. */
static void rule_reply(enum smtp_out_stage stage, int code, struct classify_result *ret)
{
	if (code == 421) {
		ret->verdict = CLASSIFY_SUSPEND;
		ret->signal = "421";
	} else if (!stage_is_transaction(stage)) {
		ret->verdict = CLASSIFY_SUSPEND;
		ret->signal = "stage";
	} else {
		ret->verdict = code / 100 == 4 ? CLASSIFY_RETRY : CLASSIFY_FAIL;
		ret->signal = "code";
	}
}

void classify_reply(const struct classify *c, enum smtp_out_stage stage, int error,
		    const struct smtp_reply *r, struct classify_result *ret)
{
	classify_reply_skip(c, NULL, stage, error, r, ret);
}

void classify_reply_skip(const struct classify *c, const bool *skip, enum smtp_out_stage stage,
			 int error, const struct smtp_reply *r, struct classify_result *ret)
{
	char buf[CLASSIFY_MATCH_MAX];
	struct classify_result res = { CLASSIFY_SUSPEND, -1, "error", -1 };
	const struct classify_sig *sig = NULL;

	if (error != 0) {
		/* a positive error is a caller's mistake; read it as the errno it names */
		if (error > 0)
			error = -error;
		error_match_text(error, buf, sizeof(buf));
		sig = c ? match_signal(c, skip, buf) : NULL;
		if (sig) {
			res.verdict = sig->action;
			res.signal = sig->match;
			res.index = sig - c->sig;
			res.for_ms = sig->for_ms > 0 && sig->action != CLASSIFY_FAIL ? sig->for_ms : -1;
		} else if (error == -EMSGSIZE || error == -EPROTONOSUPPORT) {
			/* larger than the server's SIZE; SMTPUTF8 needed and not offered: this
			   message cannot go to this server, however long the lane waits */
			res.verdict = CLASSIFY_FAIL;
		}
		/* everything else (refused, timed out, reset, malformed reply, TLS or AUTH
		   policy, out of memory, the uncertain window after the dot): SUSPEND */
		*ret = res;
		return;
	}

	if (!r || r->code < 200 || r->code > 599) {
		res.signal = "code";
		*ret = res;
		return;
	}
	int cls = r->code / 100;
	if (cls == 2 || (cls == 3 && (stage == SMTP_STAGE_DATA || stage == SMTP_STAGE_AUTH))) {
		res.verdict = CLASSIFY_OK;
		res.signal = "code";
		*ret = res;
		return;
	}
	if (cls == 3) {
		res.signal = "code"; /* a server out of step with the dialogue */
		*ret = res;
		return;
	}

	reply_match_text(r, buf, sizeof(buf));
	long bi = -1;
	sig = c ? match_signal(c, skip, buf) : NULL;
	if (sig) {
		res.verdict = sig->action;
		res.signal = sig->match;
		res.index = sig - c->sig;
	} else if (c && (bi = match_builtin(c, r->code, buf)) >= 0) {
		res.verdict = builtins[bi].verdict;
		res.signal = builtins[bi].name;
	} else {
		rule_reply(stage, r->code, &res);
	}

	if (sig && sig->for_ms > 0 && res.verdict != CLASSIFY_FAIL)
		res.for_ms = sig->for_ms;
	else if (res.verdict == CLASSIFY_SUSPEND || res.verdict == CLASSIFY_SLOW)
		res.for_ms = classify_retry_hint(str_make(
			r->text, r->text_len < SMTP_REPLY_TEXT_MAX ? r->text_len : SMTP_REPLY_TEXT_MAX));
	*ret = res;
}

/* ---- retry hints ---- */

static bool is_alpha(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
}

static bool is_digit(unsigned char ch)
{
	return ch >= '0' && ch <= '9';
}

/* p[0..n) equals the lowercase word w, ASCII case-insensitively. */
static bool word_is(const char *p, size_t n, const char *w)
{
	size_t k = strlen(w);
	if (n != k)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)p[i];
		if (ch >= 'A' && ch <= 'Z')
			ch = (unsigned char)(ch - 'A' + 'a');
		if (ch != (unsigned char)w[i])
			return false;
	}
	return true;
}

static bool is_cue(const char *p, size_t n)
{
	return word_is(p, n, "in") || word_is(p, n, "after") || word_is(p, n, "wait");
}

/* Milliseconds in one unit named p[0..n), or 0 when it is not a unit. */
static int64_t unit_ms(const char *p, size_t n)
{
	static const struct {
		const char *w;
		int64_t ms;
	} units[] = {
		{ "s", 1000 }, { "sec", 1000 }, { "secs", 1000 }, { "second", 1000 },
		{ "seconds", 1000 },
		{ "m", 60000 }, { "min", 60000 }, { "mins", 60000 }, { "minute", 60000 },
		{ "minutes", 60000 },
		{ "h", 3600000 }, { "hr", 3600000 }, { "hrs", 3600000 }, { "hour", 3600000 },
		{ "hours", 3600000 },
		{ "d", 86400000 }, { "day", 86400000 }, { "days", 86400000 },
		{ "week", 604800000 }, { "weeks", 604800000 },
	};
	if (n == 0 || n > 7)
		return 0;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (word_is(p, n, units[i].w))
			return units[i].ms;
	return 0;
}

/*
 * "N[.F][ -]UNIT" starting at p[i] (a digit): milliseconds, capped at HINT_CAP_MS, and
 * *ret_end just after the unit; -1 when no unit follows the number.  Digits past what
 * can matter are read and ignored, so no size of number overflows.
 */
static int64_t duration_at(const char *p, size_t n, size_t i, size_t *ret_end)
{
	const uint64_t sat = 1000000000u; /* > 7 days in seconds; * 604800000 fits */
	uint64_t v = 0, frac = 0, scale = 1;
	size_t j = i;
	while (j < n && is_digit((unsigned char)p[j])) {
		if (v < sat)
			v = v * 10 + (uint64_t)(p[j] - '0');
		j++;
	}
	if (j + 1 < n && p[j] == '.' && is_digit((unsigned char)p[j + 1])) {
		j++;
		while (j < n && is_digit((unsigned char)p[j])) {
			if (scale < 1000) {
				frac = frac * 10 + (uint64_t)(p[j] - '0');
				scale *= 10;
			}
			j++;
		}
	}
	size_t k = j;
	for (int seps = 0; k < n && seps < 2 && (p[k] == ' ' || p[k] == '-'); seps++)
		k++;
	size_t u = k;
	while (u < n && is_alpha((unsigned char)p[u]))
		u++;
	/* "5 m\xc3\xadnutes" is not "5 m": a unit ends before ASCII, not inside a word */
	if (u < n && (unsigned char)p[u] >= 0x80)
		return -1;
	int64_t ms = unit_ms(p + k, u - k);
	if (ms == 0)
		return -1;
	uint64_t total = v * (uint64_t)ms + frac * (uint64_t)ms / scale;
	*ret_end = u;
	return total > (uint64_t)HINT_CAP_MS ? HINT_CAP_MS : (int64_t)total;
}

/* After a first duration ending at p[i]: "and 30 minutes", ", 30s", "30m" add to it. */
static int64_t more_parts(const char *p, size_t n, size_t i, int64_t total)
{
	for (int parts = 1; parts < HINT_PARTS && total < HINT_CAP_MS; parts++) {
		size_t q = i;
		while (q < n && (p[q] == ' ' || p[q] == ','))
			q++;
		if (q + 3 <= n && word_is(p + q, 3, "and") &&
		    (q + 3 == n || !is_alpha((unsigned char)p[q + 3]))) {
			q += 3;
			while (q < n && p[q] == ' ')
				q++;
		}
		if (q >= n || !is_digit((unsigned char)p[q]))
			break;
		size_t end;
		int64_t ms = duration_at(p, n, q, &end);
		if (ms < 0)
			break;
		total = total + ms > HINT_CAP_MS ? HINT_CAP_MS : total + ms;
		i = end;
	}
	return total;
}

int64_t classify_retry_hint(struct str text)
{
	const char *p = text.ptr;
	size_t n = p ? text.len : 0;
	bool armed = false;   /* a cue word was seen, close enough */
	size_t armed_at = 0;  /* where the cue word ended */
	int words = 0;        /* words since the cue */
	size_t i = 0;
	while (i < n) {
		unsigned char ch = (unsigned char)p[i];
		if (is_alpha(ch)) {
			size_t s = i;
			while (i < n && is_alpha((unsigned char)p[i]))
				i++;
			if (is_cue(p + s, i - s)) {
				armed = true;
				armed_at = i;
				words = 0;
			} else if (armed && ++words > HINT_GAP_WORDS) {
				armed = false;
			}
			continue;
		}
		if (is_digit(ch)) {
			size_t s = i;
			/* a number glued to letters before it ("abc123") is not a quantity */
			if (armed && s - armed_at <= HINT_GAP_BYTES &&
			    (s == 0 || !is_alpha((unsigned char)p[s - 1]))) {
				size_t end;
				int64_t ms = duration_at(p, n, s, &end);
				if (ms >= 0)
					return more_parts(p, n, end, ms);
			}
			armed = false;
			while (i < n && is_digit((unsigned char)p[i]))
				i++;
			continue;
		}
		i++;
	}
	return -1;
}
