/*
 * test_classify -- reply classification (src/relay/classify.c): the rules by stage and
 * code, every built-in pattern on replies as relays send them, ordinary bounces that must
 * stay bounces, operator signals before the built-ins, bad patterns, and retry hints,
 * hostile ones included.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "classify.h"

#define SEC 1000
#define MIN (60 * SEC)
#define HOUR (60 * MIN)
#define DAY (24 * (int64_t)HOUR)
#define CAP (7 * DAY)

struct ccase {
	enum smtp_out_stage stage;
	int error;           /* < 0: a connection error, wire unused */
	const char *wire;    /* the reply as sent, lines ended by CRLF (the last one added) */
	enum classify_verdict verdict;
	int64_t for_ms;
	const char *signal;  /* built-in or rule name expected */
};

/* Without operator signals. */
static const struct ccase cases[] = {
	/* ---- the rules by stage and code ---- */
	{ SMTP_STAGE_RCPT, 0, "250 2.1.5 Ok", CLASSIFY_OK, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "250 2.0.0 Ok: queued as 4XyZ1", CLASSIFY_OK, -1, "code" },
	{ SMTP_STAGE_DATA, 0, "354 End data with <CR><LF>.<CR><LF>", CLASSIFY_OK, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "250 2.0.0 Ok, but you are near your rate limit, quota 90% used",
	  CLASSIFY_OK, -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "354 out of step", CLASSIFY_SUSPEND, -1, "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.1.1 <bob@example.org>: Recipient address rejected: User unknown in virtual "
	  "mailbox table", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "450 4.1.1 <bob@example.org>: Recipient address rejected: unverified address",
	  CLASSIFY_RETRY, -1, "code" },
	{ SMTP_STAGE_DATA, 0, "554 5.5.1 Error: no valid recipients", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_DATA, 0, "451 4.3.0 Error: queue file write error", CLASSIFY_RETRY, -1,
	  "code" },
	{ SMTP_STAGE_DOT, 0, "552 5.3.4 Message size exceeds fixed limit", CLASSIFY_FAIL, -1,
	  "code" },
	{ SMTP_STAGE_DOT, 0, "451 4.3.0 Temporary lookup failure, try again in 5 minutes",
	  CLASSIFY_RETRY, -1, "code" },
	{ SMTP_STAGE_GREETING, 0, "554 5.7.1 mx.example.org ESMTP not accepting messages",
	  CLASSIFY_SUSPEND, -1, "stage" },
	{ SMTP_STAGE_EHLO, 0, "501 5.5.2 <bad host>: Helo command rejected: Invalid name",
	  CLASSIFY_SUSPEND, -1, "stage" },
	{ SMTP_STAGE_STARTTLS, 0, "454 4.7.0 TLS not available due to local problem",
	  CLASSIFY_SUSPEND, -1, "stage" },
	{ SMTP_STAGE_AUTH, 0, "535 5.7.8 Error: authentication failed: authentication failure",
	  CLASSIFY_SUSPEND, -1, "stage" },
	{ SMTP_STAGE_MAIL, 0,
	  "553 5.1.8 <a@example.net>: Sender address rejected: Domain not found",
	  CLASSIFY_SUSPEND, -1, "stage" },
	{ SMTP_STAGE_MAIL, 0, "451 4.3.0 <a@example.net>: Temporary lookup failure; wait 10 min",
	  CLASSIFY_SUSPEND, 10 * MIN, "stage" },
	{ SMTP_STAGE_RSET, 0, "450 4.3.0 not now", CLASSIFY_SUSPEND, -1, "stage" },
	{ SMTP_STAGE_QUIT, 0, "500 5.5.1 what", CLASSIFY_SUSPEND, -1, "stage" },
	{ SMTP_STAGE_RCPT, 0, "421 4.4.2 mx.example.org Error: timeout exceeded",
	  CLASSIFY_SUSPEND, -1, "421" },
	{ SMTP_STAGE_DOT, 0, "421 Service not available, closing transmission channel",
	  CLASSIFY_SUSPEND, -1, "421" },
	{ SMTP_STAGE_DOT, 0, "421 4.3.2 System not accepting network messages, retry after 2 hours",
	  CLASSIFY_SUSPEND, 2 * HOUR, "421" },
	/* a 421 is never merely SLOW, even when it speaks of a rate */
	{ SMTP_STAGE_MAIL, 0,
	  "421 4.4.2 Message submission rate for this client has exceeded the configured limit",
	  CLASSIFY_SUSPEND, -1, "421" },

	/* ---- connection errors ---- */
	{ SMTP_STAGE_CONNECT, -ECONNREFUSED, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_CONNECT, -ETIMEDOUT, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_CONNECT, -EHOSTUNREACH, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_CONNECT, -ENETUNREACH, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_GREETING, -ETIMEDOUT, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_MAIL, -ECONNRESET, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_RCPT, -EPROTO, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_STARTTLS, -EPERM, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_DATA, -ENOMEM, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_DOT, -ETIMEDOUT, NULL, CLASSIFY_SUSPEND, -1, "error" },
	{ SMTP_STAGE_MAIL, -EMSGSIZE, NULL, CLASSIFY_FAIL, -1, "error" },
	{ SMTP_STAGE_MAIL, -EPROTONOSUPPORT, NULL, CLASSIFY_FAIL, -1, "error" },
	{ SMTP_STAGE_CONNECT, -4242, NULL, CLASSIFY_SUSPEND, -1, "error" },

	/* ---- every built-in, on what the provider sends ---- */
	{ SMTP_STAGE_DOT, 0,
	  "554 5.2.0 STOREDRV.Submission.Exception:SubmissionQuotaExceededException; Failed to "
	  "process message due to a permanent exception with message Cannot submit message.",
	  CLASSIFY_SUSPEND, -1, "exo-submission" },
	/* our own (SMTP AUTH) mailbox is full: that is the sender's problem, not a bounce */
	{ SMTP_STAGE_DOT, 0,
	  "554 5.2.2 mailbox full; "
	  "STOREDRV.Submission.Exception:QuotaExceededException.MapiExceptionShutoffQuotaExceeded",
	  CLASSIFY_SUSPEND, -1, "exo-submission" },
	{ SMTP_STAGE_DOT, 0, "554 5.2.0 Submission quota exceeded", CLASSIFY_SUSPEND, -1,
	  "exo-submission" },
	{ SMTP_STAGE_DOT, 0, "550 5.2.252 Sender throttled due to continuous send as denied errors.",
	  CLASSIFY_SUSPEND, -1, "exo-sender-throttled" },
	{ SMTP_STAGE_RCPT, 0, "550 5.2.251 Sender throttled due to continuous mailbox full errors.",
	  CLASSIFY_SUSPEND, -1, "exo-sender-throttled" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.2.254 Sender throttled due to continuous too many recipients errors.",
	  CLASSIFY_SUSPEND, -1, "exo-sender-throttled" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.7.708 Service unavailable. Access denied, traffic not accepted from this IP. "
	  "For more information please go to http://go.microsoft.com/fwlink/?LinkId=526653",
	  CLASSIFY_SUSPEND, -1, "exo-blocked" },
	{ SMTP_STAGE_RCPT, 0, "550 5.7.606 Access denied, banned sending IP [192.0.2.1]",
	  CLASSIFY_SUSPEND, -1, "exo-blocked" },
	{ SMTP_STAGE_RCPT, 0, "550 5.7.705 Access denied, tenant has exceeded threshold",
	  CLASSIFY_SUSPEND, -1, "exo-blocked" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.7.750 Service unavailable. Client blocked from sending from unregistered domains",
	  CLASSIFY_SUSPEND, -1, "exo-blocked" },
	{ SMTP_STAGE_RCPT, 0, "550 5.1.8 Access denied, bad outbound sender", CLASSIFY_SUSPEND,
	  -1, "exo-outbound-sender" },
	{ SMTP_STAGE_RCPT, 0, "432 4.3.2 STOREDRV.Deliver; recipient thread limit exceeded",
	  CLASSIFY_SLOW, -1, "exo-thread-limit" },
	{ SMTP_STAGE_MAIL, 0,
	  "432 4.3.2 Concurrent connections limit exceeded. Visit "
	  "https://aka.ms/concurrent_sending for more information.",
	  CLASSIFY_SUSPEND, -1, "exo-concurrency" },
	{ SMTP_STAGE_RCPT, 0,
	  "451 4.7.500 Server busy. Please try again later from [192.0.2.1]. (AS761)",
	  CLASSIFY_SLOW, -1, "exo-ip-throttling" },
	{ SMTP_STAGE_RCPT, 0,
	  "421-4.7.28 [192.0.2.1] Our system has detected an unusual rate of\r\n"
	  "421-4.7.28 unsolicited mail originating from your IP address. To protect our\r\n"
	  "421-4.7.28 users from spam, mail sent from your IP address has been temporarily\r\n"
	  "421-4.7.28 rate limited. Please visit\r\n"
	  "421-4.7.28  https://support.google.com/mail/?p=UnsolicitedRateLimitError to\r\n"
	  "421 4.7.28 review our Bulk Email Senders Guidelines. a1si123 - gsmtp",
	  CLASSIFY_SUSPEND, -1, "gmail-unsolicited-rate" },
	{ SMTP_STAGE_RCPT, 0,
	  "550-5.7.28 Our system has detected an unusual rate of unsolicited mail originating\r\n"
	  "550 5.7.28 from your IP address. b2si456 - gsmtp",
	  CLASSIFY_SUSPEND, -1, "gmail-unsolicited-rate" },
	{ SMTP_STAGE_EHLO, 0, "421 4.7.0 Try again later, closing connection. (EHLO) c3si7 - gsmtp",
	  CLASSIFY_SUSPEND, -1, "gmail-421-4.7.0" },
	{ SMTP_STAGE_RCPT, 0, "421 4.7.0 Temporary System Problem.  Try again in 5 minutes.",
	  CLASSIFY_SUSPEND, 5 * MIN, "gmail-421-4.7.0" },
	{ SMTP_STAGE_RCPT, 0,
	  "450-4.2.1 The user you are trying to contact is receiving mail too quickly. Please\r\n"
	  "450-4.2.1 resend your message at a later time. If the user is able to receive\r\n"
	  "450-4.2.1 mail at that time, your message will be delivered. For more\r\n"
	  "450 4.2.1 information, go to https://support.google.com/mail/?p=ReceivingRate - gsmtp",
	  CLASSIFY_SLOW, -1, "gmail-receiving-rate" },
	{ SMTP_STAGE_MAIL, 0,
	  "450 4.2.1 Peak SMTP relay limit exceeded for customer. This is a temporary error.",
	  CLASSIFY_SLOW, -1, "gmail-receiving-rate" },
	/* Gmail's permanent variant: a rate is never a bounce */
	{ SMTP_STAGE_RCPT, 0,
	  "550-5.2.1 The user you are trying to contact is receiving mail at a rate that\r\n"
	  "550-5.2.1 prevents additional messages from being delivered. For more\r\n"
	  "550 5.2.1 information, go to https://support.google.com/mail/?p=ReceivingRatePerm",
	  CLASSIFY_SLOW, -1, "receiving-rate" },
	{ SMTP_STAGE_DOT, 0,
	  "550-5.4.5 Daily user sending limit exceeded. For more information on Gmail\r\n"
	  "550-5.4.5 sending limits go to\r\n"
	  "550 5.4.5  https://support.google.com/a/answer/166852 d4si8 - gsmtp",
	  CLASSIFY_SUSPEND, -1, "sending-limit-5.4.5" },
	{ SMTP_STAGE_DOT, 0, "550 5.4.5 Daily user sending quota exceeded 500", CLASSIFY_SUSPEND,
	  -1, "sending-limit-5.4.5" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.4.5 <carol@example.com>: Recipient address rejected: Domain Sending Quota Exceeded",
	  CLASSIFY_SUSPEND, -1, "sending-limit-5.4.5" },
	{ SMTP_STAGE_MAIL, 0, "452 4.4.5 Messages per second limit exceeded", CLASSIFY_SLOW, -1,
	  "congestion-4.4.5" },
	{ SMTP_STAGE_DATA, 0, "454 Throttling failure: Daily message quota exceeded.",
	  CLASSIFY_SUSPEND, -1, "ses-daily-quota" },
	{ SMTP_STAGE_DATA, 0, "454 Throttling failure: Maximum sending rate exceeded.",
	  CLASSIFY_SLOW, -1, "ses-throttling" },
	{ SMTP_STAGE_MAIL, 0,
	  "421 4.7.0 [TSS04] Messages from 192.0.2.1 temporarily deferred due to unexpected "
	  "volume or user complaints - 4.16.55.1; see https://postmaster.yahooinc.com/error-codes",
	  CLASSIFY_SUSPEND, -1, "yahoo-ts" },
	{ SMTP_STAGE_RCPT, 0,
	  "553 5.7.2 [TSS09] All messages from 192.0.2.1 will be permanently deferred; Retrying "
	  "will NOT succeed. See https://postmaster.yahooinc.com/error-codes",
	  CLASSIFY_SUSPEND, -1, "yahoo-ts" },
	{ SMTP_STAGE_RCPT, 0, "552 5.5.3 Error: too many recipients", CLASSIFY_RETRY, -1,
	  "too-many-rcpts-552" },
	{ SMTP_STAGE_RCPT, 0, "552 Too many recipients", CLASSIFY_RETRY, -1, "too-many-rcpts-552" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.1.90 Your message can't be sent because you've reached your daily limit for "
	  "message recipients", CLASSIFY_SUSPEND, -1, "daily-limit" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.7.233 Your message can't be sent because your tenant exceeded its daily limit "
	  "for sending email to external recipients (tenant external recipient rate limit)",
	  CLASSIFY_SUSPEND, -1, "daily-limit" },
	{ SMTP_STAGE_RCPT, 0,
	  "554 5.7.1 <alice@example.net>: Sender address rejected: Sending quota exceeded",
	  CLASSIFY_SUSPEND, -1, "sending-quota" },
	{ SMTP_STAGE_RCPT, 0, "451 4.7.1 Outbound quota exceeded, try again in 2 hours",
	  CLASSIFY_SUSPEND, 2 * HOUR, "sending-quota" },
	{ SMTP_STAGE_RCPT, 0, "452 4.3.2 Too many concurrent connections, try again in 30 seconds",
	  CLASSIFY_SUSPEND, 30 * SEC, "concurrency" },
	{ SMTP_STAGE_GREETING, 0, "554 5.7.1 Connection limit reached for your network",
	  CLASSIFY_SUSPEND, -1, "concurrency" },
	{ SMTP_STAGE_RCPT, 0,
	  "450 4.7.1 <bob@example.org>: Recipient address rejected: Deferring: Too many messages "
	  "from sender in last 60", CLASSIFY_SLOW, -1, "rate-4xx" },
	{ SMTP_STAGE_RCPT, 0, "451 4.7.1 Rate limit exceeded, try again in 92 seconds",
	  CLASSIFY_SLOW, 92 * SEC, "rate-4xx" },
	{ SMTP_STAGE_MAIL, 0, "450 4.7.1 Error: too much mail from 192.0.2.1", CLASSIFY_SLOW, -1,
	  "rate-4xx" },
	{ SMTP_STAGE_RCPT, 0, "451 You are being throttled; please wait 15 minutes", CLASSIFY_SLOW,
	  15 * MIN, "rate-4xx" },
	{ SMTP_STAGE_DOT, 0, "550 5.7.1 Message rejected: rate limit exceeded, you send too fast",
	  CLASSIFY_SUSPEND, -1, "rate-5xx" },
	{ SMTP_STAGE_RCPT, 0, "554 Too many messages in this period, retry after 1h",
	  CLASSIFY_SUSPEND, HOUR, "rate-5xx" },
	{ SMTP_STAGE_RCPT, 0, "550 5.7.1 Account suspended", CLASSIFY_SUSPEND, -1, "suspended" },
	{ SMTP_STAGE_DOT, 0,
	  "554 5.7.1 Your account has been suspended for sending spam, contact support",
	  CLASSIFY_SUSPEND, -1, "suspended" },
	{ SMTP_STAGE_RCPT, 0,
	  "554 5.7.1 Service unavailable; Client host [192.0.2.1] blocked using zen.spamhaus.org; "
	  "https://www.spamhaus.org/query/ip/192.0.2.1", CLASSIFY_SUSPEND, -1, "banned" },
	{ SMTP_STAGE_RCPT, 0, "550 5.7.1 Your IP address 192.0.2.1 is blacklisted", CLASSIFY_SUSPEND,
	  -1, "banned" },
	{ SMTP_STAGE_RCPT, 0, "554 5.7.1 <bob@example.org>: Relay access denied", CLASSIFY_SUSPEND,
	  -1, "relay-denied" },
	{ SMTP_STAGE_RCPT, 0,
	  "550-5.7.1 Invalid credentials for relay [192.0.2.1]. The IP address you've\r\n"
	  "550 5.7.1 registered in your Workspace SMTP Relay service doesn't match - gsmtp",
	  CLASSIFY_SUSPEND, -1, "relay-denied" },

	/* ---- ordinary bounces and deferrals stay what the code says ---- */
	{ SMTP_STAGE_RCPT, 0,
	  "550-5.1.1 The email account that you tried to reach does not exist. Please try\r\n"
	  "550-5.1.1 double-checking the recipient's email address for typos or\r\n"
	  "550-5.1.1 unnecessary spaces. For more information, go to\r\n"
	  "550 5.1.1  https://support.google.com/mail/?p=NoSuchUser e5si9 - gsmtp",
	  CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "550 5.1.1 User unknown", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient not found by SMTP address lookup",
	  CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "552 5.2.2 Mailbox full, quota exceeded", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "452 4.2.2 Mailbox full, quota exceeded", CLASSIFY_RETRY, -1, "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "452-4.2.2 The recipient's inbox is out of storage space. Please direct the\r\n"
	  "452 4.2.2 recipient to https://support.google.com/mail/?p=OverQuotaTemp - gsmtp",
	  CLASSIFY_RETRY, -1, "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "552-5.2.2 The email account that you tried to reach is over quota and inactive.\r\n"
	  "552 5.2.2 https://support.google.com/mail/?p=OverQuotaPerm - gsmtp",
	  CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "552 5.2.2 <bob@example.org>: Recipient address rejected: Quota exceeded (mailbox for "
	  "user is full)", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "552 Mail quota exceeded", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "552 5.2.2 Over quota", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "552 5.2.2 user quota exceeded, daily delivery limit for this mailbox",
	  CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "552 5.2.2 Mailbox full; too many messages in mailbox", CLASSIFY_FAIL,
	  -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "550 5.2.1 The email account that you tried to reach is disabled.",
	  CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "550 5.2.1 <bob@example.org>: mailbox suspended", CLASSIFY_FAIL, -1,
	  "code" },
	{ SMTP_STAGE_RCPT, 0, "550 5.7.1 Recipient account suspended", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "550 5.7.1 Message rejected as spam by Content Filtering.",
	  CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_DOT, 0,
	  "550-5.7.26 This mail has been blocked because the sender is unauthenticated.\r\n"
	  "550 5.7.26 Gmail requires all senders to authenticate with either SPF or DKIM.",
	  CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "550 5.7.1 URL in message body is blocklisted", CLASSIFY_FAIL, -1,
	  "code" },
	{ SMTP_STAGE_DOT, 0,
	  "554 5.7.9 Message not accepted for policy reasons. See "
	  "https://postmaster.yahooinc.com/error-codes", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "450 4.2.0 <bob@example.org>: Recipient address rejected: Greylisted, please try again "
	  "later", CLASSIFY_RETRY, -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "451 4.7.1 Greylisted, see http://postgrey.schweikert.ch/help/",
	  CLASSIFY_RETRY, -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "452 4.5.3 Error: too many recipients", CLASSIFY_RETRY, -1, "code" },
	{ SMTP_STAGE_DOT, 0, "554 5.4.6 Hop count exceeded - possible mail loop", CLASSIFY_FAIL, -1,
	  "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "553 5.1.3 <bob>: Recipient address rejected: need fully-qualified address",
	  CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_RCPT, 0,
	  "550 5.4.1 Recipient address rejected: Access denied. AS(201806281)", CLASSIFY_FAIL, -1,
	  "code" },
	{ SMTP_STAGE_DOT, 0, "550 5.7.1 an accurate, separate and moderate text", CLASSIFY_FAIL, -1,
	  "code" },
	{ SMTP_STAGE_DOT, 0, "552 5.3.4 Message size limit exceeded", CLASSIFY_FAIL, -1, "code" },
};

/* The names of the built-ins: each must be reached by some case above. */
static const char *const builtin_names[] = {
	"exo-submission", "exo-sender-throttled", "exo-blocked", "exo-outbound-sender",
	"exo-thread-limit", "exo-concurrency", "exo-ip-throttling", "gmail-unsolicited-rate",
	"yahoo-ts", "gmail-421-4.7.0", "gmail-receiving-rate", "receiving-rate",
	"sending-limit-5.4.5", "congestion-4.4.5", "ses-daily-quota", "ses-throttling",
	"too-many-rcpts-552", "daily-limit", "sending-quota", "concurrency", "rate-4xx",
	"rate-5xx", "suspended", "banned", "relay-denied",
};

/* Parse a wire reply the way the SMTP client does. */
static void read_reply(const char *wire, struct smtp_reply *r)
{
	char buf[8192];
	int w = snprintf(buf, sizeof(buf), "%s\r\n", wire);
	assert_true(w > 0 && (size_t)w < sizeof(buf));
	struct smtp_reply_reader rd;
	smtp_reply_reader_init(&rd);
	size_t used = 0;
	assert_int_equal(smtp_reply_read(&rd, buf, (size_t)w, r, &used, NULL), 1);
	assert_int_equal(used, (size_t)w);
}

static void run_case(const struct classify *c, const struct ccase *k, size_t i)
{
	static struct smtp_reply r;
	struct classify_result res;
	memset(&res, 0x5a, sizeof(res));
	if (k->error)
		classify_reply(c, k->stage, k->error, NULL, &res);
	else {
		read_reply(k->wire, &r);
		classify_reply(c, k->stage, 0, &r, &res);
	}
	if (res.verdict != k->verdict || res.for_ms != k->for_ms ||
	    strcmp(res.signal, k->signal) != 0)
		fail_msg("case %zu (%s): got %s for %lld signal \"%s\", want %s for %lld signal \"%s\"",
			 i, k->wire ? k->wire : "error", classify_verdict_name(res.verdict),
			 (long long)res.for_ms, res.signal, classify_verdict_name(k->verdict),
			 (long long)k->for_ms, k->signal);
}

static void test_cases(void **state)
{
	(void)state;
	char err[256];
	struct classify *c = classify_new(NULL, 0, err, sizeof(err));
	assert_non_null(c);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(c, &cases[i], i);
	/* every built-in was reached */
	for (size_t b = 0; b < sizeof(builtin_names) / sizeof(builtin_names[0]); b++) {
		bool seen = false;
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			seen = seen || strcmp(cases[i].signal, builtin_names[b]) == 0;
		if (!seen)
			fail_msg("built-in %s has no case", builtin_names[b]);
	}
	classify_free(c);
}

/* Without a classifier, only the rules apply. */
static const struct ccase rules_only_cases[] = {
	{ SMTP_STAGE_RCPT, 0, "550 5.7.1 Account suspended", CLASSIFY_FAIL, -1, "code" },
	{ SMTP_STAGE_CONNECT, -ECONNREFUSED, NULL, CLASSIFY_SUSPEND, -1, "error" },
};

static void test_rules_only(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(rules_only_cases) / sizeof(rules_only_cases[0]); i++)
		run_case(NULL, &rules_only_cases[i], i);
}

/* Replies built by hand (not by the reader), impossible ones included. */
static void test_hand_built(void **state)
{
	(void)state;
	struct classify *c = classify_new(NULL, 0, NULL, 0);
	assert_non_null(c);
	static struct smtp_reply r;
	struct classify_result res;

	/* the enhanced code given apart from the text is seen by the patterns */
	memset(&r, 0, sizeof(r));
	r.code = 550;
	r.enh_class = 5, r.enh_subject = 7, r.enh_detail = 1;
	r.text_len = strlen("Account suspended");
	memcpy(r.text, "Account suspended", r.text_len + 1);
	classify_reply(c, SMTP_STAGE_RCPT, 0, &r, &res);
	assert_int_equal(res.verdict, CLASSIFY_SUSPEND);
	assert_string_equal(res.signal, "suspended");
	/* and its X.2.x form is about a recipient */
	r.enh_subject = 2;
	classify_reply(c, SMTP_STAGE_RCPT, 0, &r, &res);
	assert_int_equal(res.verdict, CLASSIFY_FAIL);

	/* a NUL inside the text does not hide what follows it */
	memset(&r, 0, sizeof(r));
	r.code = 451;
	memcpy(r.text, "x\0rate limit exceeded", 21);
	r.text_len = 21;
	classify_reply(c, SMTP_STAGE_RCPT, 0, &r, &res);
	assert_int_equal(res.verdict, CLASSIFY_SLOW);

	/* a text_len past the buffer is clamped */
	memset(&r, 'a', sizeof(r));
	r.code = 450;
	r.enh_class = 0;
	r.text_len = (size_t)-1;
	classify_reply(c, SMTP_STAGE_RCPT, 0, &r, &res);
	assert_int_equal(res.verdict, CLASSIFY_RETRY);

	/* impossible codes, no reply, an unknown stage */
	int codes[] = { 0, 199, 600, -250, 100000 };
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		memset(&r, 0, sizeof(r));
		r.code = codes[i];
		classify_reply(c, SMTP_STAGE_RCPT, 0, &r, &res);
		assert_int_equal(res.verdict, CLASSIFY_SUSPEND);
		assert_string_equal(res.signal, "code");
	}
	classify_reply(c, SMTP_STAGE_RCPT, 0, NULL, &res);
	assert_int_equal(res.verdict, CLASSIFY_SUSPEND);
	memset(&r, 0, sizeof(r));
	r.code = 550;
	classify_reply(c, (enum smtp_out_stage)99, 0, &r, &res);
	assert_int_equal(res.verdict, CLASSIFY_SUSPEND);
	assert_string_equal(res.signal, "stage");
	/* a positive error is read as the errno it names */
	classify_reply(c, SMTP_STAGE_MAIL, EMSGSIZE, NULL, &res);
	assert_int_equal(res.verdict, CLASSIFY_FAIL);
	c = classify_free(c);
	assert_null(c);
	assert_null(classify_free(NULL));
}

static const struct classify_signal_conf signals[] = {
	{ "^550 5\\.1\\.1 .*disabled by provider", CLASSIFY_SUSPEND, 3600000, 0, 0 },
	{ "[45]\\.7\\.28", CLASSIFY_FAIL, 5000, 0, 0 },
	{ "^connect: Connection refused$", CLASSIFY_SLOW, 60000, 0, 0 },
	{ "^452 4\\.5\\.3", CLASSIFY_SUSPEND, 0, 0, 0 },
	{ "greylist", CLASSIFY_RETRY, 300000, 0, 0 },
	{ "quota", CLASSIFY_SLOW, -7, 0, 0 },
	{ "^250", CLASSIFY_SUSPEND, 0, 0, 0 },
	{ "relay access denied", CLASSIFY_FAIL, 0, 0, 0 },
};

static const struct ccase signal_cases[] = {
	/* before the rules */
	{ SMTP_STAGE_RCPT, 0, "550 5.1.1 Account disabled by provider", CLASSIFY_SUSPEND, HOUR,
	  "^550 5\\.1\\.1 .*disabled by provider" },
	/* before the built-ins and the 421 rule; for is not given to a bounce */
	{ SMTP_STAGE_RCPT, 0, "421 4.7.28 unusual rate of unsolicited mail", CLASSIFY_FAIL, -1,
	  "[45]\\.7\\.28" },
	{ SMTP_STAGE_CONNECT, -ECONNREFUSED, NULL, CLASSIFY_SLOW, MIN,
	  "^connect: Connection refused$" },
	{ SMTP_STAGE_CONNECT, -ETIMEDOUT, NULL, CLASSIFY_SUSPEND, -1, "error" },
	/* for = 0: the hint in the text */
	{ SMTP_STAGE_RCPT, 0, "452 4.5.3 Too many recipients, try again in 10 minutes",
	  CLASSIFY_SUSPEND, 10 * MIN, "^452 4\\.5\\.3" },
	{ SMTP_STAGE_RCPT, 0, "450 4.2.0 Greylisted, please try again in 60 seconds",
	  CLASSIFY_RETRY, 5 * MIN, "greylist" },
	/* operators win over the built-ins too (sending-limit-5.4.5 would SUSPEND) */
	{ SMTP_STAGE_DOT, 0, "550 5.4.5 Daily user sending quota exceeded.", CLASSIFY_SLOW, -1,
	  "quota" },
	{ SMTP_STAGE_DOT, 0, "554 5.2.2 Mailbox quota exceeded, wait 3 hours", CLASSIFY_SLOW,
	  3 * HOUR, "quota" },
	/* a 2xx is never a signal */
	{ SMTP_STAGE_DOT, 0, "250 2.0.0 Ok: queued, quota 90% used", CLASSIFY_OK, -1, "code" },
	{ SMTP_STAGE_RCPT, 0, "554 5.7.1 <bob@example.org>: Relay access denied", CLASSIFY_FAIL,
	  -1, "relay access denied" },
	/* no signal matches: the built-ins, then the rules */
	{ SMTP_STAGE_DATA, 0, "454 Throttling failure: Maximum sending rate exceeded.",
	  CLASSIFY_SLOW, -1, "ses-throttling" },
	{ SMTP_STAGE_RCPT, 0, "550 5.1.1 User unknown", CLASSIFY_FAIL, -1, "code" },
};

static void test_signals(void **state)
{
	(void)state;
	char err[256] = "x";
	struct classify *c =
		classify_new(signals, sizeof(signals) / sizeof(signals[0]), err, sizeof(err));
	assert_non_null(c);
	assert_string_equal(err, "");
	for (size_t i = 0; i < sizeof(signal_cases) / sizeof(signal_cases[0]); i++)
		run_case(c, &signal_cases[i], i);
	classify_free(c);
}

/* The patterns are copied: the configuration may go away. */
static void test_signals_copied(void **state)
{
	(void)state;
	char *m = strdup("throttl");
	assert_non_null(m);
	struct classify_signal_conf s = { m, CLASSIFY_SUSPEND, 1000, 0, 0 };
	struct classify *c = classify_new(&s, 1, NULL, 0);
	assert_non_null(c);
	memset(m, 'x', strlen(m));
	free(m);
	static struct smtp_reply r;
	struct classify_result res;
	read_reply("454 Throttling failure: Maximum sending rate exceeded.", &r);
	classify_reply(c, SMTP_STAGE_DOT, 0, &r, &res);
	assert_int_equal(res.verdict, CLASSIFY_SUSPEND);
	assert_int_equal(res.for_ms, 1000);
	assert_string_equal(res.signal, "throttl");
	classify_free(c);
}

/* A signal passed over (its threshold not reached): the next signal, the built-in
 * patterns, then the rules decide; the result names the operator's signal by index. */
static void test_skip(void **state)
{
	(void)state;
	struct classify_signal_conf s[3] = {
		{ "^451 .*local problem", CLASSIFY_SUSPEND, 3600000, 3, 60000 },
		{ "problem", CLASSIFY_SLOW, 0, 0, 0 },
		{ "^550 .*rate limit", CLASSIFY_RETRY, 0, 2, 1000 },
	};
	struct classify *c = classify_new(s, 3, NULL, 0);
	assert_non_null(c);
	assert_int_equal(classify_nsignals(c), 3);
	unsigned after;
	int64_t within;
	classify_threshold(c, 0, &after, &within);
	assert_int_equal(after, 3);
	assert_int_equal(within, 60000);
	classify_threshold(c, 7, &after, &within);
	assert_int_equal(after, 0);
	/* skipping: classify_reply_skip() with skip, else classify_reply(); signal NULL: not
	 * looked at */
	static const struct {
		const char *wire;
		bool skipping;
		bool skip[3];
		enum classify_verdict verdict;
		int index;
		const char *signal;
	} skips[] = {
		{ "451 4.3.0 Temporary local problem", false, { 0 }, CLASSIFY_SUSPEND, 0, NULL },
		{ "451 4.3.0 Temporary local problem", true, { true, false, false }, CLASSIFY_SLOW,
		  1, NULL },
		/* the rule: 4xx at RCPT */
		{ "451 4.3.0 Temporary local problem", true, { true, true, false }, CLASSIFY_RETRY,
		  -1, NULL },
		{ "550 5.7.1 rate limit exceeded", false, { 0 }, CLASSIFY_RETRY, 2, NULL },
		/* skipped, a built-in pattern decides */
		{ "550 5.7.1 rate limit exceeded", true, { false, false, true }, CLASSIFY_SUSPEND,
		  -1, "rate-5xx" },
	};
	for (size_t i = 0; i < sizeof(skips) / sizeof(skips[0]); i++) {
		static struct smtp_reply r;
		struct classify_result res;
		read_reply(skips[i].wire, &r);
		if (skips[i].skipping)
			classify_reply_skip(c, skips[i].skip, SMTP_STAGE_RCPT, 0, &r, &res);
		else
			classify_reply(c, SMTP_STAGE_RCPT, 0, &r, &res);
		if (res.verdict != skips[i].verdict || res.index != skips[i].index ||
		    (skips[i].signal && strcmp(res.signal, skips[i].signal) != 0))
			fail_msg("skip case %zu (%s): got %s index %d signal \"%s\", "
				 "want %s index %d", i, skips[i].wire,
				 classify_verdict_name(res.verdict), res.index, res.signal,
				 classify_verdict_name(skips[i].verdict), skips[i].index);
	}
	classify_free(c);
}

static void test_bad_signals(void **state)
{
	(void)state;
	char err[256];
	struct classify_signal_conf s[2] = {
		{ "ok", CLASSIFY_SUSPEND, 0, 0, 0 },
		{ "rate (limit", CLASSIFY_SLOW, 0, 0, 0 },
	};
	errno = 0;
	assert_null(classify_new(s, 2, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
	/* names the signal, its pattern and what regcomp says */
	assert_non_null(strstr(err, "signal 2"));
	assert_non_null(strstr(err, "\"rate (limit\""));
	assert_true(strlen(err) > strlen("signal 2: bad pattern \"rate (limit\": "));

	/* a small or absent error buffer is fine */
	char tiny[8];
	assert_null(classify_new(s, 2, tiny, sizeof(tiny)));
	assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
	assert_null(classify_new(s, 2, NULL, 0));

	/* other bad regexes */
	const char *bad[] = { "[a-", "a{2,1}", "*", "(", "a\\" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct classify_signal_conf b = { bad[i], CLASSIFY_SUSPEND, 0, 0, 0 };
		struct classify *c = classify_new(&b, 1, err, sizeof(err));
		if (c) { /* glibc accepts a few of these as literals: then they must work */
			classify_free(c);
			continue;
		}
		assert_non_null(strstr(err, "signal 1: bad pattern"));
	}

	/* no pattern; action ok (it would mark undelivered recipients done); out of range */
	struct classify_signal_conf none = { NULL, CLASSIFY_SUSPEND, 0, 0, 0 };
	assert_null(classify_new(&none, 1, err, sizeof(err)));
	assert_non_null(strstr(err, "signal 1"));
	struct classify_signal_conf okay = { "x", CLASSIFY_OK, 0, 0, 0 };
	assert_null(classify_new(&okay, 1, err, sizeof(err)));
	assert_non_null(strstr(err, "action"));
	struct classify_signal_conf wild = { "x", (enum classify_verdict)77, 0, 0, 0 };
	assert_null(classify_new(&wild, 1, err, sizeof(err)));
}

static void test_verdict_names(void **state)
{
	(void)state;
	static const struct {
		enum classify_verdict verdict;
		const char *name;
	} names[] = {
		{ CLASSIFY_OK, "ok" },
		{ CLASSIFY_RETRY, "retry" },
		{ CLASSIFY_FAIL, "fail" },
		{ CLASSIFY_SUSPEND, "suspend" },
		{ CLASSIFY_SLOW, "slow" },
		{ (enum classify_verdict)42, "?" },
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		assert_string_equal(classify_verdict_name(names[i].verdict), names[i].name);
}

struct hcase {
	const char *text;
	size_t len; /* 0: strlen */
	int64_t ms;
};

static const struct hcase hints[] = {
	{ "try again in 92 seconds", 0, 92 * SEC },
	{ "Try again in 5 minutes", 0, 5 * MIN },
	{ "retry in 1 hour", 0, HOUR },
	{ "retry after 30s", 0, 30 * SEC },
	{ "please wait 2 hours", 0, 2 * HOUR },
	{ "in 10 min", 0, 10 * MIN },
	{ "IN 2 HOURS", 0, 2 * HOUR },
	{ "wait 3 days", 0, 3 * DAY },
	{ "retry in 1 week", 0, 7 * DAY },
	{ "in 45 secs.", 0, 45 * SEC },
	{ "in 2 hrs", 0, 2 * HOUR },
	{ "in 1 d", 0, DAY },
	{ "in 5-minute intervals", 0, 5 * MIN },
	{ "in 0 seconds", 0, 0 },
	{ "try again in 1 hour and 30 minutes", 0, 90 * MIN },
	{ "retry in 1h30m", 0, 90 * MIN },
	{ "retry in 1h 30m 15s", 0, 90 * MIN + 15 * SEC },
	{ "in 1 hour, 1 hour, 1 hour, 1 hour, 1 hour", 0, 4 * HOUR }, /* at most 4 parts */
	{ "in 1.5 hours", 0, 90 * MIN },
	{ "in 0.25 min", 0, 15 * SEC },
	{ "in 2.123456789 s", 0, 2123 },
	{ "in about 5 minutes", 0, 5 * MIN },
	{ "wait at least 2 hours", 0, 2 * HOUR },
	{ "try again in 2 hours, or in 5 minutes", 0, 2 * HOUR },
	{ "in 5 minutes 2023", 0, 5 * MIN },
	{ "421 4.7.0 Temporary System Problem.  Try again in 5 minutes.", 0, 5 * MIN },
	{ "451 4.7.1 Rate limit exceeded, try again in 92 seconds", 0, 92 * SEC },
	{ "wait 30 days", 0, CAP },
	{ "wait 7 days", 0, CAP },
	{ "in 6 days and 1 day and 1 day", 0, CAP },
	{ "in 99999999999999999999999999999999999999999999999999 seconds", 0, CAP },
	{ "in 18446744073709551617 weeks", 0, CAP },
	{ "in 4294967297 s", 0, CAP },
	{ "in 604800 s", 0, CAP },
	{ "in 604799 s", 0, CAP - SEC },
	/* no hint */
	{ "try again later", 0, -1 },
	{ "550 5.4.5 Daily user sending quota exceeded 500", 0, -1 },
	{ "450 4.7.1 Too many messages from sender in last 60", 0, -1 },
	{ "try again in 30", 0, -1 },          /* no unit */
	{ "try again in 30 parsecs", 0, -1 },  /* not a unit */
	{ "in 5 mailboxes", 0, -1 },
	{ "in 30ms", 0, -1 },
	{ "try again in seconds", 0, -1 },     /* unit without number */
	{ "try again in a few minutes", 0, -1 },
	{ "in the next fifteen minutes", 0, -1 },
	{ "in one two three four 5 minutes", 0, -1 }, /* too many words between */
	{ "in                                         5 minutes", 0, -1 }, /* too far */
	{ "within 5 minutes", 0, -1 },
	{ "login 5 minutes", 0, -1 },
	{ "in abc123 minutes", 0, -1 },
	{ "in 5.4.5 s", 0, -1 },
	{ "retry in", 0, -1 },
	{ "in 5", 0, -1 },
	{ "5 minutes", 0, -1 },
	{ "", 0, -1 },
	/* bytes outside ASCII separate words and are never letters or digits */
	{ "in\xc2\xa0" "5 minutes", 0, 5 * MIN },              /* no-break space */
	{ "in \xef\xbc\x95 minutes", 0, -1 },                 /* fullwidth digit five */
	{ "\xff\xfe in 7 s \x80", 0, 7 * SEC },
	{ "in 5 m\xc3\xadnutes", 0, -1 },
	{ "in\0 5 minutes", 14, 5 * MIN },                     /* NUL is a separator */
	{ "in 5\0minutes", 12, -1 },
};

static void test_retry_hint(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(hints) / sizeof(hints[0]); i++) {
		const struct hcase *h = &hints[i];
		size_t n = h->len ? h->len : strlen(h->text);
		int64_t ms = classify_retry_hint(str_make(h->text, n));
		if (ms != h->ms)
			fail_msg("hint %zu \"%s\": got %lld, want %lld", i, h->text, (long long)ms,
				 (long long)h->ms);
	}
	assert_int_equal(classify_retry_hint(STR_NULL), -1);
	assert_int_equal(classify_retry_hint(str_make(NULL, 10)), -1);
	/* not NUL-terminated: only len bytes are read */
	char exact[] = { 'i', 'n', ' ', '5', ' ', 'm' };
	assert_int_equal(classify_retry_hint(str_make(exact, sizeof(exact))), 5 * MIN);
	assert_int_equal(classify_retry_hint(str_make(exact, 5)), -1);
}

/* Big hostile inputs finish quickly (a quadratic scan would take minutes here). */
static void test_retry_hint_hostile(void **state)
{
	(void)state;
	const size_t n = 4u << 20;
	char *p = malloc(n);
	assert_non_null(p);
	const char *fills[] = { "in ", "in 1", "in 1.", "in 1 ", "in 1-", "in 1 and ", "9",
				"in 9999999999", "a1 ", "in 1h1", ".1", "in 5 x" };
	for (size_t f = 0; f < sizeof(fills) / sizeof(fills[0]); f++) {
		size_t k = strlen(fills[f]);
		for (size_t i = 0; i < n; i++)
			p[i] = fills[f][i % k];
		int64_t ms = classify_retry_hint(str_make(p, n));
		assert_true(ms == -1 || (ms >= 0 && ms <= CAP));
	}
	/* one long number after a cue */
	memcpy(p, "in ", 3);
	memset(p + 3, '9', n - 3 - 2);
	memcpy(p + n - 2, " s", 2);
	assert_int_equal(classify_retry_hint(str_make(p, n)), CAP);
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cases),
		cmocka_unit_test(test_rules_only),
		cmocka_unit_test(test_hand_built),
		cmocka_unit_test(test_signals),
		cmocka_unit_test(test_signals_copied),
		cmocka_unit_test(test_bad_signals),
		cmocka_unit_test(test_skip),
		cmocka_unit_test(test_verdict_names),
		cmocka_unit_test(test_retry_hint),
		cmocka_unit_test(test_retry_hint_hostile),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
