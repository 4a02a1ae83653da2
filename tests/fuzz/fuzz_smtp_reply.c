/*
 * fuzz_smtp_reply -- the SMTP reply reader (src/proto/smtp_reply.c) on hostile input.
 *
 * The input is read as a stream of replies twice: whole, and one byte at a time; both
 * readings must give the same replies and the same verdict, every reply must respect
 * the codec's limits, and a malformed stream must stop both at the same reply.  Each
 * line also goes through the EHLO keyword reader, whose mechanism list must stay
 * terminated and within its bounds.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "smtp_reply.h"

#define MAX_REPLIES 64

struct reading {
	struct smtp_reply r[MAX_REPLIES];
	size_t n;
	int verdict; /* 0 more needed at the end, -EPROTO */
};

static void check(const struct smtp_reply *r)
{
	if (r->code < 200 || r->code > 599 || r->lines < 1 || r->lines > SMTP_REPLY_LINES ||
	    r->text_len > SMTP_REPLY_TEXT_MAX || r->text[r->text_len] != '\0')
		abort();
	if (r->enh_class && r->enh_class != r->code / 100)
		abort();
}

/* Feed data in pieces of at most step bytes (0: all at once). */
static void read_all(const uint8_t *data, size_t size, size_t step, struct reading *out)
{
	struct smtp_reply_reader rd;
	smtp_reply_reader_init(&rd);
	char *buf = malloc(size + 1);
	if (!buf)
		abort();
	size_t have = 0, fed = 0;
	out->n = 0;
	out->verdict = 0;
	while (fed < size || have) {
		size_t k = step && size - fed > step ? step : size - fed;
		memcpy(buf + have, data + fed, k);
		have += k;
		fed += k;
		struct smtp_reply rep;
		size_t used = 0;
		int r = smtp_reply_read(&rd, buf, have, &rep, &used, NULL);
		if (r < 0) {
			out->verdict = r;
			break;
		}
		if (used > have)
			abort();
		memmove(buf, buf + used, have - used);
		have -= used;
		if (r == 1) {
			check(&rep);
			if (out->n < MAX_REPLIES)
				out->r[out->n] = rep;
			out->n++;
			continue;
		}
		if (fed == size)
			break;
	}
	free(buf);
}

static void ehlo_lines(const uint8_t *data, size_t size)
{
	struct smtp_ehlo e;
	memset(&e, 0, sizeof(e));
	const char *p = (const char *)data, *end = p + size;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *le = nl ? nl : end;
		smtp_ehlo_line(&e, str_make(p, (size_t)(le - p)));
		if (memchr(e.auth, '\0', sizeof(e.auth)) == NULL)
			abort();
		if (e.auth[0] && !(e.ext & SMTP_EHLO_AUTH))
			abort();
		p = le + 1;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 65536)
		return 0;
	static struct reading a, b;
	ehlo_lines(data, size);
	read_all(data, size, 0, &a);
	read_all(data, size, 1, &b);
	if (a.n != b.n || a.verdict != b.verdict)
		abort();
	for (size_t i = 0; i < a.n && i < MAX_REPLIES; i++)
		if (a.r[i].code != b.r[i].code || a.r[i].lines != b.r[i].lines ||
		    a.r[i].text_len != b.r[i].text_len ||
		    memcmp(a.r[i].text, b.r[i].text, a.r[i].text_len) != 0 ||
		    a.r[i].enh_class != b.r[i].enh_class || a.r[i].enh_subject != b.r[i].enh_subject ||
		    a.r[i].enh_detail != b.r[i].enh_detail)
			abort();
	return 0;
}
