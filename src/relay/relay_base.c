/*
 * relay_base -- the floor of the relay: its log lines, a server's reply made text for a
 * log or a notice, and posting to the relay's mailbox (from any thread).  Every other
 * room of the relay calls these; they call none of them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "relay_int.h"
#include "util.h"

/* ---- logging ---- */

void base_logf(struct relay *r, enum log_level level, const char *fmt, ...)
{
	if (!r->log || (level == LOG_LEVEL_DEBUG && !log_enabled(LOG_LEVEL_DEBUG)))
		return;
	char line[1536];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	r->log(r->log_arg, level, line);
}

void base_reply_text(const struct smtp_out_result *res, const struct smtp_reply *rep,
		     char *out, size_t len)
{
	char t[SMTP_REPLY_TEXT_MAX + 1];
	if (rep && rep->code) {
		text_sanitize(t, sizeof(t), str_cstr(rep->text), SIZE_MAX, TEXT_NO_QUOTES);
		if (rep->enh_class)
			snprintf(out, len, "%d %d.%d.%d %s", rep->code, rep->enh_class,
				 rep->enh_subject, rep->enh_detail, t);
		else
			snprintf(out, len, "%d %s", rep->code, t);
		/* the text may already start with the enhanced code: keep it as the server
		 * sent it instead */
		if (rep->enh_class) {
			char enh[32];
			snprintf(enh, sizeof(enh), "%d.%d.%d", rep->enh_class, rep->enh_subject,
				 rep->enh_detail);
			if (strncmp(t, enh, strlen(enh)) == 0)
				snprintf(out, len, "%d %s", rep->code, t);
		}
	} else if (res) {
		snprintf(out, len, "%s: %s%s%s", smtp_out_stage_name(res->stage),
			 strerror(-res->error), res->why && *res->why ? ": " : "",
			 res->why ? res->why : "");
	} else {
		snprintf(out, len, "no reply");
	}
}

/* ---- the mailbox: from any thread ---- */

int base_post(struct relay *r, struct mb_item *it)
{
	int e = mailbox_post(&r->mb, &it);
	/* a failed wake-up (an eventfd counter cannot overflow here) still posted it */
	return e == -ESHUTDOWN || e == -ENOMEM ? e : 0;
}

/* Run fn on the relay's loop and wait for its result (control commands).  The relay
 * never waits on a peer, so the wait is short. */
int base_call_sync(struct relay *r, int (*fn)(struct relay *r, void *arg), void *arg)
{
	if (!r->started)
		return fn(r, arg);
	struct mb_item it = { .kind = MB_CALL, .fn = fn, .arg = arg };
	int rc = base_post(r, &it);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&r->call_lock);
	while (!it.done)
		pthread_cond_wait(&r->call_cond, &r->call_lock);
	pthread_mutex_unlock(&r->call_lock);
	return it.rc;
}
