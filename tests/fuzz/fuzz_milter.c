/*
 * fuzz_milter -- libFuzzer target for the milter codec (src/proto/milter.c) and the milter
 * session state machine (src/milter/milter_session.c, milter_static.c), the latter on a
 * fake of the engine's session API (fuzz_engine_stub.c).
 *
 * Input: byte 0 chooses the handler (which steps it wants, which replies, which steps it
 * defers with MILTER_PENDING, modifications, SKIP, macro lists, or the static handler);
 * byte 1 seeds the schedule (where the stream is cut into reads, when a deferred verdict
 * is resumed; 0: one read) and its bits 6 and 7 choose small macro and packet limits; the
 * rest is what the MTA sends.  Seeds in corpus/milter/
 * are named after what they hold; their first two bytes are this header.
 *
 * Besides "no crash, no leak, no UB" it aborts when a promise is broken:
 *   codec  - a packet is found only when complete, at every prefix length; decoded
 *            slices stay inside the packet; a refused command leaves *ret alone; the
 *            negotiation never sets a bit outside the offer and keeps EOM answered;
 *            every encoder's output parses back to what was encoded (header, address,
 *            quarantine, REPLYCODE with '%' doubled and continuation marks, REPLBODY
 *            packets of at most 65535 bytes);
 *   session - the handler is called only for steps it wants (and EOM), never while a
 *            verdict is pending; modifications are refused outside EOM and when not
 *            negotiated; the output is well-formed packets; every command the MTA waits
 *            on gets exactly one final reply, in order, modifications only before the
 *            EOM reply, SKIP only at BODY and only when negotiated.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "engine.h"
#include "fuzz_engine_stub.h"
#include "log.h"
#include "milter.h"
#include "milter_session.h"
#include "milter_static.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);


#define CHECK(x)                                                                        \
	do {                                                                             \
		if (!(x)) {                                                              \
			fprintf(stderr, "fuzz_milter: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #x);                                           \
			abort();                                                         \
		}                                                                        \
	} while (0)

#define ALL_STEPS ((1u << MILTER_STEP_COUNT) - 1)
#define BIT(s) MILTER_STEP_BIT(MILTER_STEP_##s)

/* Small streams only: a few hundred KB keep each run fast and still pass 64K limits. */
#define MAX_INPUT (512 * 1024)

static uint32_t rng_next(uint32_t *st)
{
	uint32_t x = *st;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	*st = x;
	return x;
}

static size_t touch(struct str s)
{
	/* read every byte, so that ASan checks the slice */
	size_t sum = 0;
	for (size_t i = 0; i < s.len; i++)
		sum += (unsigned char)s.ptr[i];
	return sum;
}

static int step_of(uint8_t code)
{
	switch (code) {
	case MILTER_CMD_CONNECT: return MILTER_STEP_CONNECT;
	case MILTER_CMD_HELO: return MILTER_STEP_HELO;
	case MILTER_CMD_MAIL: return MILTER_STEP_MAIL;
	case MILTER_CMD_RCPT: return MILTER_STEP_RCPT;
	case MILTER_CMD_DATA: return MILTER_STEP_DATA;
	case MILTER_CMD_HEADER: return MILTER_STEP_HEADER;
	case MILTER_CMD_EOH: return MILTER_STEP_EOH;
	case MILTER_CMD_BODY: return MILTER_STEP_BODY;
	case MILTER_CMD_BODYEOB: return MILTER_STEP_EOM;
	case MILTER_CMD_UNKNOWN: return MILTER_STEP_UNKNOWN;
	default: return -1;
	}
}

/* ---- codec ------------------------------------------------------------------------- */

static uint32_t get_u32(const void *p)
{
	const unsigned char *b = p;
	return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Takes one packet out of out[*off..]: its code and payload. */
static void take_packet(const struct buf *out, size_t *off, uint8_t *code, struct str *payload)
{
	struct milter_frame f;
	const char *why = NULL;
	CHECK(milter_frame_parse(out->ptr + *off, out->len - *off, MILTER_DATA_1M + 16, &f, &why) == 1);
	*code = f.code;
	*payload = f.data;
	*off += f.size;
}

static void check_negotiation(uint32_t v, uint32_t a, uint32_t p, const struct milter_want *w)
{
	struct milter_neg n;
	const char *why = NULL;
	int r = milter_negotiate(v, a, p, w, &n, &why);
	if (v < 2) {
		CHECK(r == -EPROTO && why);
		return;
	}
	CHECK(r == 0);
	uint32_t acts = a ? a : 0x0f, prot = p ? p : 0x3f;
	CHECK(n.version == (v < 6 ? v : 6));
	CHECK((n.actions & ~acts) == 0);
	CHECK((n.protocol & ~prot) == 0);
	CHECK((n.protocol & 0x40000000u) == 0);
	CHECK((n.reply_steps & ~n.send_steps) == 0);
	CHECK(n.reply_steps & BIT(EOM));
	CHECK(n.body_max == MILTER_DATA_64K || n.body_max == MILTER_DATA_256K ||
	      n.body_max == MILTER_DATA_1M);
	if (n.version < 4)
		CHECK(!(n.send_steps & BIT(DATA)));
	if (n.version < 3)
		CHECK(!(n.send_steps & BIT(UNKNOWN)));
	/* a step wanted with a reply is never silenced */
	for (int s = 0; s < MILTER_STEP_COUNT; s++)
		if ((w->steps & w->replies & MILTER_STEP_BIT(s)) && (n.send_steps & MILTER_STEP_BIT(s)))
			CHECK(n.reply_steps & MILTER_STEP_BIT(s));
	struct buf out;
	buf_init(&out, 1 << 20);
	if (milter_put_optneg(&out, &n, w->macros) == 0) {
		size_t off = 0;
		uint8_t code;
		struct str pl;
		take_packet(&out, &off, &code, &pl);
		CHECK(code == 'O' && pl.len >= 12 && off == out.len);
		CHECK(get_u32(pl.ptr) == n.version && get_u32(pl.ptr + 4) == n.actions &&
		      get_u32(pl.ptr + 8) == n.protocol);
		CHECK(n.symlist || pl.len == 12);
	}
	buf_done(&out);
}

static const struct milter_want codec_wants[] = {
	{ 0 },
	{ .steps = ALL_STEPS, .replies = ALL_STEPS, .actions = MILTER_ACT_ALL, .skip = true,
	  .header_leadspc = true, .rcpt_rejected = true },
	{ .steps = ALL_STEPS, .replies = 0, .macros = { "j {client_addr}", NULL, "i", NULL, NULL, "", "x" } },
	{ .steps = BIT(RCPT) | BIT(HEADER), .replies = BIT(RCPT), .actions = 0x41 },
};

/* REPLYCODE: the encoded text has the same lines, markers set, '%' doubled. */
static void check_replycode(struct str text)
{
	const char *why = NULL;
	struct buf out;
	buf_init(&out, 1 << 20);
	int chk = milter_reply_check(text, &why);
	int r = milter_put_replycode(&out, text);
	CHECK((chk == 0) == (r == 0));
	if (r < 0) {
		CHECK(why && out.len == 0);
		buf_done(&out);
		return;
	}
	size_t off = 0;
	uint8_t code;
	struct str pl;
	take_packet(&out, &off, &code, &pl);
	CHECK(code == 'y' && off == out.len && pl.len <= MILTER_DATA_64K);
	CHECK(pl.len > 0 && pl.ptr[pl.len - 1] == '\0' && !memchr(pl.ptr, 0, pl.len - 1));
	/* walk input lines and output lines together */
	size_t in = 0, o = 0, lines = 0;
	const char *code3 = NULL;
	while (in < text.len) {
		const char *nl = memchr(text.ptr + in, '\n', text.len - in);
		size_t l = nl ? (size_t)(nl - (text.ptr + in)) : text.len - in;
		size_t next = in + l + (nl ? 1 : 0);
		if (l && text.ptr[in + l - 1] == '\r')
			l--;
		bool last = next >= text.len;
		lines++;
		CHECK(l >= 5);
		if (!code3)
			code3 = text.ptr + in;
		CHECK(memcmp(pl.ptr + o, code3, 3) == 0);
		CHECK(pl.ptr[o + 3] == (last ? ' ' : '-'));
		o += 4;
		for (size_t i = 4; i < l; i++) {
			CHECK(pl.ptr[o] == text.ptr[in + i]);
			o++;
			if (text.ptr[in + i] == '%') {
				CHECK(pl.ptr[o] == '%');
				o++;
			}
		}
		if (!last) {
			CHECK(pl.ptr[o] == '\r' && pl.ptr[o + 1] == '\n');
			o += 2;
		}
		in = next;
	}
	CHECK(o == pl.len - 1);
	CHECK(lines >= 1 && lines <= MILTER_REPLY_MAX_LINES);
	buf_done(&out);
}

static void check_header_enc(uint8_t code, uint32_t index, struct str name, struct str value)
{
	struct buf out;
	buf_init(&out, 2 << 20);
	int r = milter_put_header(&out, code, index, name, value);
	if (r < 0) {
		CHECK(out.len == 0);
		CHECK(name.len == 0 || memchr(name.ptr, 0, name.len) ||
		      (value.len && memchr(value.ptr, 0, value.len)) ||
		      name.len + value.len + 7 > MILTER_DATA_1M);
		buf_done(&out);
		return;
	}
	size_t off = 0;
	uint8_t c;
	struct str pl;
	take_packet(&out, &off, &c, &pl);
	CHECK(c == code && off == out.len);
	size_t o = 0;
	if (code != MILTER_REPLY_ADDHEADER) {
		CHECK(get_u32(pl.ptr) == index);
		o = 4;
	}
	CHECK(pl.len == o + name.len + 1 + value.len + 1);
	CHECK(memcmp(pl.ptr + o, name.ptr, name.len) == 0 && pl.ptr[o + name.len] == 0);
	CHECK(value.len == 0 || memcmp(pl.ptr + o + name.len + 1, value.ptr, value.len) == 0);
	CHECK(pl.ptr[pl.len - 1] == 0);
	buf_done(&out);
}

static void check_addr_enc(uint8_t code, struct str addr, struct str args)
{
	struct buf out;
	buf_init(&out, 1 << 20);
	int r = milter_put_addr(&out, code, addr, args);
	if (r < 0) {
		CHECK(out.len == 0);
		buf_done(&out);
		return;
	}
	CHECK(addr.len > 0);
	size_t off = 0;
	uint8_t c;
	struct str pl;
	take_packet(&out, &off, &c, &pl);
	CHECK(c == code && off == out.len && pl.len <= MILTER_DATA_64K);
	CHECK(pl.len >= addr.len + 1 && memcmp(pl.ptr, addr.ptr, addr.len) == 0 && pl.ptr[addr.len] == 0);
	bool with_args = (code == '2' || code == 'e') && args.len;
	if (with_args)
		CHECK(pl.len == addr.len + args.len + 2 &&
		      memcmp(pl.ptr + addr.len + 1, args.ptr, args.len) == 0);
	else
		CHECK(pl.len == addr.len + 1);
	buf_done(&out);
}

static void check_replbody_enc(struct str body)
{
	struct buf out;
	buf_init(&out, 4 << 20);
	CHECK(milter_put_replbody(&out, body) == 0);
	size_t off = 0, got = 0;
	while (off < out.len) {
		uint8_t c;
		struct str pl;
		take_packet(&out, &off, &c, &pl);
		CHECK(c == 'b' && pl.len <= MILTER_DATA_64K);
		CHECK(got + pl.len <= body.len && memcmp(pl.ptr, body.ptr + got, pl.len) == 0);
		got += pl.len;
	}
	CHECK(got == body.len);
	buf_done(&out);
}

static void check_quarantine_enc(struct str reason)
{
	struct buf out;
	buf_init(&out, 1 << 20);
	if (milter_put_quarantine(&out, reason) == 0) {
		size_t off = 0;
		uint8_t c;
		struct str pl;
		take_packet(&out, &off, &c, &pl);
		CHECK(c == 'q' && pl.len == reason.len + 1 && memcmp(pl.ptr, reason.ptr, reason.len) == 0);
	} else {
		CHECK(out.len == 0);
	}
	buf_done(&out);
}

static void codec_one(const struct milter_frame *f)
{
	struct milter_cmd c;
	memset(&c, 0xa5, sizeof(c));
	const char *why = NULL;
	int r = milter_cmd_decode(f, &c, &why);
	if (r < 0) {
		CHECK(r == -EPROTO && why && why[0]);
		const unsigned char *p = (const unsigned char *)&c;
		for (size_t i = 0; i < sizeof(c); i++)
			CHECK(p[i] == 0xa5);
		return;
	}
	CHECK(r == 0 && c.code == f->code);
	const char *lo = f->data.ptr, *hi = f->data.ptr + f->data.len;
#define INSIDE(s) CHECK((s).len == 0 || ((s).ptr >= lo && (s).ptr + (s).len <= hi))
	switch (c.code) {
	case MILTER_CMD_OPTNEG:
		for (size_t i = 0; i < sizeof(codec_wants) / sizeof(codec_wants[0]); i++)
			check_negotiation(c.optneg.version, c.optneg.actions, c.optneg.protocol,
					  &codec_wants[i]);
		break;
	case MILTER_CMD_MACRO:
		CHECK(c.macro.npairs <= MILTER_MAX_MACRO_PAIRS);
		for (size_t i = 0; i < c.macro.npairs; i++) {
			INSIDE(c.macro.pairs[i].name);
			INSIDE(c.macro.pairs[i].value);
			CHECK(!memchr(c.macro.pairs[i].name.ptr, 0, c.macro.pairs[i].name.len));
			touch(c.macro.pairs[i].value);
		}
		break;
	case MILTER_CMD_CONNECT:
		INSIDE(c.connect.host);
		INSIDE(c.connect.address);
		CHECK(strchr("46LU", c.connect.family));
		if (c.connect.family == 'U')
			CHECK(c.connect.address.len == 0 && c.connect.port == 0);
		check_quarantine_enc(c.connect.host);
		check_header_enc('h', 0, c.connect.host, c.connect.address);
		break;
	case MILTER_CMD_HELO:
		INSIDE(c.helo.name);
		check_replycode(c.helo.name);
		check_quarantine_enc(c.helo.name);
		break;
	case MILTER_CMD_MAIL:
	case MILTER_CMD_RCPT:
		INSIDE(c.envelope.addr);
		CHECK(c.envelope.nargs <= MILTER_MAX_ESMTP_ARGS);
		for (size_t i = 0; i < c.envelope.nargs; i++)
			INSIDE(c.envelope.args[i]);
		{
			struct str a = c.envelope.nargs ? c.envelope.args[0] : STR_NULL;
			check_addr_enc('+', c.envelope.addr, a);
			check_addr_enc('-', c.envelope.addr, a);
			check_addr_enc('2', c.envelope.addr, a);
			check_addr_enc('e', c.envelope.addr, a);
		}
		break;
	case MILTER_CMD_HEADER:
		INSIDE(c.header.name);
		INSIDE(c.header.value);
		check_header_enc('h', 0, c.header.name, c.header.value);
		check_header_enc('i', (uint32_t)c.header.value.len, c.header.name, c.header.value);
		check_header_enc('m', 0xffffffffu, c.header.name, STR_NULL);
		check_replycode(c.header.value);
		break;
	case MILTER_CMD_BODY:
	case MILTER_CMD_BODYEOB:
		INSIDE(c.body.chunk);
		CHECK(c.body.chunk.len == f->data.len);
		check_replbody_enc(c.body.chunk);
		check_replycode(c.body.chunk);
		break;
	case MILTER_CMD_UNKNOWN:
		INSIDE(c.unknown.line);
		check_replycode(c.unknown.line);
		break;
	default:
		break;
	}
#undef INSIDE
}

static void codec_stream(const uint8_t *p, size_t n)
{
	size_t off = 0;
	while (off < n) {
		struct milter_frame f;
		const char *why = NULL;
		int r = milter_frame_parse(p + off, n - off, MILTER_LEN_CAP_DEFAULT, &f, &why);
		if (r < 0) {
			CHECK(r == -EPROTO && why);
			uint32_t len = n - off >= 4 ? get_u32(p + off) : 0;
			CHECK(len == 0 || len > MILTER_LEN_CAP_DEFAULT);
			return;
		}
		if (r == 0) {
			CHECK(n - off < 4 || n - off - 4 < get_u32(p + off));
			return;
		}
		CHECK(f.size >= 5 && f.size <= n - off && f.size == 4 + (size_t)get_u32(p + off));
		CHECK(f.data.ptr == (const char *)p + off + 5 && f.data.len == f.size - 5);
		/* every shorter prefix asks for more (small packets: cost) */
		if (f.size <= 64)
			for (size_t k = 0; k < f.size; k++) {
				struct milter_frame g;
				CHECK(milter_frame_parse(p + off, k, MILTER_LEN_CAP_DEFAULT, &g, &why) == 0);
			}
		codec_one(&f);
		off += f.size;
	}
}

/* ---- session ----------------------------------------------------------------------- */

struct fz {
	struct milter_want want;
	enum milter_verdict verdict[MILTER_STEP_COUNT];
	uint32_t pending_steps;
	bool mods;
	uint32_t rng;
	struct milter_session *pending;
	enum milter_step pending_step;
	unsigned calls;
	unsigned aborts, closes;
};

static const char *const reply_texts[] = {
	"550 5.7.1 Refused",
	"451 4.7.1 Try later, 100% sure",
	"550-5.7.1 first\n550 5.7.1 second",
	"250 2.0.0 not an error", /* refused by set_reply: the verdict becomes tempfail */
	"421 4.3.2 Closing",
	"550 4.7.1 class mismatch",
};

static void fz_mods(struct fz *fz, struct milter_session *ms, enum milter_step step)
{
	static const uint32_t acts[] = { MILTER_ACT_ADDHDRS, MILTER_ACT_ADDHDRS, MILTER_ACT_CHGHDRS,
					 MILTER_ACT_ADDRCPT, MILTER_ACT_ADDRCPT_PAR,
					 MILTER_ACT_DELRCPT, MILTER_ACT_CHGFROM,
					 MILTER_ACT_CHGBODY, MILTER_ACT_QUARANTINE };
	/* arguments from the session itself: peer data goes back out */
	struct str h = milter_session_helo(ms), snd = milter_session_sender(ms);
	struct str rc = milter_session_rcpt(ms);
	int r[9];
	/* r[4] always has arguments: it needs ADDRCPT_PAR */
	r[0] = milter_session_add_header(ms, str_cstr("X-Fuzz"), h);
	r[1] = milter_session_insert_header(ms, rng_next(&fz->rng) % 4, snd.len ? snd : str_cstr("X"), rc);
	r[2] = milter_session_change_header(ms, 1, str_cstr("Subject"), STR_NULL);
	r[3] = milter_session_add_rcpt(ms, rc.len ? rc : str_cstr("<a@b>"), STR_NULL);
	r[4] = milter_session_add_rcpt(ms, str_cstr("<p@b>"), h.len ? h : str_cstr("NOTIFY=NEVER"));
	r[5] = milter_session_del_rcpt(ms, rc);
	r[6] = milter_session_change_from(ms, snd.len ? snd : str_cstr("<>"), STR_NULL);
	r[7] = milter_session_replace_body(ms, milter_session_body_chunk(ms));
	r[8] = milter_session_quarantine(ms, h);
	const struct milter_neg *neg = milter_session_neg(ms);
	for (int i = 0; i < 9; i++) {
		CHECK(r[i] == 0 || r[i] == -EPERM || r[i] == -EINVAL);
		if (step != MILTER_STEP_EOM)
			CHECK(r[i] == -EPERM);
		else if (r[i] == -EPERM)
			CHECK(!(neg->actions & acts[i]));
		else
			CHECK(neg->actions & acts[i]);
	}
}

static enum milter_verdict fz_step(void *ctx, struct milter_session *ms)
{
	struct fz *fz = ctx;
	CHECK(!fz->pending); /* nothing is read while a verdict is pending */
	enum milter_step step = milter_session_step(ms);
	CHECK((unsigned)step < MILTER_STEP_COUNT);
	CHECK((fz->want.steps & MILTER_STEP_BIT(step)) || step == MILTER_STEP_EOM);
	fz->calls++;
	/* every accessor, every byte */
	size_t sum = touch(milter_session_client_host(ms)) + touch(milter_session_client_addr(ms)) +
		     touch(milter_session_helo(ms)) + touch(milter_session_sender(ms)) +
		     touch(milter_session_rcpt(ms)) + touch(milter_session_header_name(ms)) +
		     touch(milter_session_header_value(ms)) + touch(milter_session_body_chunk(ms)) +
		     touch(milter_session_unknown(ms));
	const struct str *args;
	size_t n = milter_session_esmtp_args(ms, &args);
	CHECK(n <= MILTER_MAX_ESMTP_ARGS);
	for (size_t i = 0; i < n; i++)
		sum += touch(args[i]);
	static const char *const names[] = { "i", "{i}", "j", "daemon_name", "{daemon_name}",
					     "{client_addr}", "{}", "{", "", "x" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		struct str v;
		if (milter_session_macro(ms, names[i], &v))
			sum += touch(v);
	}
	(void)sum;
	(void)milter_session_client_family(ms);
	(void)milter_session_client_port(ms);
	(void)milter_session_rcpt_count(ms);
	(void)milter_session_body_size(ms);
	milter_session_set_handler_data(ms, fz);
	CHECK(milter_session_handler_data(ms) == fz);
	CHECK(milter_session_session(ms) != NULL);
	if (fz->mods)
		fz_mods(fz, ms, step);
	/* a reply text from the peer's own bytes, or from the table */
	struct str hv = milter_session_header_value(ms);
	if (hv.len) {
		const char *why;
		int r = milter_session_set_reply(ms, hv);
		CHECK((r == 0) == (milter_reply_check(hv, &why) == 0));
	}
	enum milter_verdict v = fz->verdict[step];
	if (v == MILTER_REPLY) {
		size_t k = rng_next(&fz->rng) % (sizeof(reply_texts) / sizeof(reply_texts[0]));
		milter_session_set_reply(ms, str_cstr(reply_texts[k]));
	}
	if (step == MILTER_STEP_EOM && (rng_next(&fz->rng) & 3) == 0)
		CHECK(milter_session_progress(ms) == 0);
	if (fz->pending_steps & MILTER_STEP_BIT(step)) {
		fz->pending = ms;
		fz->pending_step = step;
		return MILTER_PENDING;
	}
	return v;
}

static void fz_abort(void *ctx, struct milter_session *ms)
{
	struct fz *fz = ctx;
	(void)ms;
	CHECK(!fz->pending);
	fz->aborts++;
}

static void fz_close(void *ctx, struct milter_session *ms)
{
	struct fz *fz = ctx;
	CHECK(!fz->pending || fz->pending == ms);
	fz->pending = NULL;
	fz->closes++;
}

static void fz_destroy(void *ctx)
{
	(void)ctx; /* the harness owns ctx */
}

static void fz_want(void *ctx, struct milter_want *ret)
{
	struct fz *fz = ctx;
	*ret = fz->want;
}

/* The handler chosen by byte 0 (bit 7 clear). */
static struct milter_handler *fz_handler(struct fz *fz, uint8_t cfg)
{
	static const uint32_t step_sets[4] = {
		0, ALL_STEPS, BIT(CONNECT) | BIT(HELO) | BIT(MAIL) | BIT(RCPT) | BIT(UNKNOWN),
		BIT(DATA) | BIT(HEADER) | BIT(EOH) | BIT(BODY),
	};
	static const char *const lists[MILTER_MACROS_COUNT] = { "{client_addr} j", "", "i {mail_addr}",
								NULL, "i", "{msg_id}", "i" };
	fz->want.steps = step_sets[cfg & 3];
	fz->want.replies = (cfg & 4) ? fz->want.steps : fz->want.steps & 0x155;
	if (cfg & 8)
		for (int s = 0; s < MILTER_STEP_COUNT; s++)
			if ((s + (cfg >> 4)) % 3 == 0)
				fz->pending_steps |= MILTER_STEP_BIT(s);
	if (cfg & 16) {
		fz->want.actions = MILTER_ACT_ALL;
		fz->mods = true;
	}
	if (cfg & 32) {
		fz->want.skip = fz->want.header_leadspc = fz->want.rcpt_rejected = true;
	}
	if (cfg & 64)
		memcpy(fz->want.macros, lists, sizeof(lists));
	for (int s = 0; s < MILTER_STEP_COUNT; s++) {
		unsigned k = ((unsigned)s * 3 + (cfg >> 3)) % 9;
		/* 0..6 the plain verdicts, 7 REPLY, 8 out of range */
		fz->verdict[s] = k == 7 ? MILTER_REPLY : k == 8 ? (enum milter_verdict)42 : (enum milter_verdict)k;
		if (fz->verdict[s] == MILTER_PENDING)
			fz->verdict[s] = MILTER_CONTINUE;
	}
	if (cfg & 32)
		fz->verdict[MILTER_STEP_BODY] = MILTER_SKIP;
	struct milter_handler *h = calloc(1, sizeof(*h));
	CHECK(h);
	h->name = "fuzz";
	h->want = fz_want;
	for (int s = 0; s < MILTER_STEP_COUNT; s++)
		h->on_step[s] = fz_step;
	h->on_abort = fz_abort;
	h->on_close = fz_close;
	h->destroy = fz_destroy;
	h->ctx = fz;
	atomic_init(&h->refs, 1);
	return h;
}

static char **list_of(const char *a, const char *b)
{
	char **l = calloc(3, sizeof(char *));
	CHECK(l);
	l[0] = strdup(a);
	l[1] = b ? strdup(b) : NULL;
	CHECK(l[0] && (!b || l[1]));
	return l;
}

/* The static handler (bit 7); *want is what it will ask for, for the reply model. */
static struct milter_handler *static_handler(uint8_t cfg, struct milter_want *want)
{
	static const char *const actions[] = { "continue", "accept",	"reject", "tempfail",
					       "discard",  "skip",	"451 4.7.1 Later %",
					       "550-5.7.1 a\n550 5.7.1 b" };
	struct milter_static_conf c;
	memset(&c, 0, sizeof(c));
	memset(want, 0, sizeof(*want));
	for (int s = 0; s < MILTER_STEP_COUNT; s++) {
		if (!((cfg >> (s % 7)) & 1))
			continue;
		const char *why;
		size_t k = ((size_t)s + cfg) % (sizeof(actions) / sizeof(actions[0]));
		if (milter_static_parse_action(actions[k], (enum milter_step)s, &c.verdict[s],
					       &c.reply[s], &why) < 0)
			continue;
		c.set[s] = true;
		want->steps |= MILTER_STEP_BIT(s);
		want->replies |= MILTER_STEP_BIT(s);
	}
	if (cfg & 32) {
		c.add_header = list_of("X-Static: yes", "X-Empty:");
		c.insert_header = list_of("0 X-Top: first", NULL);
		c.change_header = list_of("2 Subject:", NULL);
		c.add_rcpt = list_of("<bcc@example.org>", NULL);
		c.add_rcpt_par = list_of("<dsn@example.org> NOTIFY=NEVER", NULL);
		c.del_rcpt = list_of("<old@example.org>", NULL);
		c.change_from = strdup("<bounce@example.org> RET=HDRS");
		c.replace_body = strdup("replaced\r\n");
		c.quarantine = strdup("static");
		want->actions = MILTER_ACT_ADDHDRS | MILTER_ACT_CHGHDRS | MILTER_ACT_ADDRCPT |
				MILTER_ACT_ADDRCPT_PAR | MILTER_ACT_DELRCPT | MILTER_ACT_CHGFROM |
				MILTER_ACT_CHGBODY | MILTER_ACT_QUARANTINE;
	}
	want->skip = c.set[MILTER_STEP_BODY] && c.verdict[MILTER_STEP_BODY] == MILTER_SKIP;
	struct milter_handler *h = milter_static_new(&c);
	CHECK(h);
	return h;
}

static bool is_final(uint8_t c)
{
	return c == 'c' || c == 'a' || c == 'r' || c == 't' || c == 'y' || c == 'd' || c == 's';
}

static uint32_t mod_action(uint8_t c)
{
	switch (c) {
	case 'h': case 'i': return MILTER_ACT_ADDHDRS;
	case 'm': return MILTER_ACT_CHGHDRS;
	case '+': return MILTER_ACT_ADDRCPT;
	case '2': return MILTER_ACT_ADDRCPT_PAR;
	case '-': return MILTER_ACT_DELRCPT;
	case 'e': return MILTER_ACT_CHGFROM;
	case 'b': return MILTER_ACT_CHGBODY;
	case 'q': return MILTER_ACT_QUARANTINE;
	default: return 0;
	}
}

/*
 * The replies the session wrote, against the commands it consumed: consumed[0..n) holds
 * whole packets only.  exact: every consumed command has been answered (no verdict
 * pending, no protocol error).
 */
static void check_replies(const uint8_t *consumed, size_t n, const struct milter_want *want,
			  struct evbuffer *outbuf, bool exact)
{
	/* the expected final replies, in order: a step index, or -2 for OPTNEG */
	size_t cap = n / 5 + 1, nexp = 0;
	int *expect = malloc(cap * sizeof(int));
	CHECK(expect);
	struct milter_neg neg = { 0 };
	bool negotiated = false;
	size_t off = 0;
	while (off < n) {
		struct milter_frame f;
		const char *why;
		CHECK(milter_frame_parse(consumed + off, n - off, MILTER_LEN_CAP_DEFAULT, &f, &why) == 1);
		struct milter_cmd c;
		CHECK(milter_cmd_decode(&f, &c, &why) == 0);
		off += f.size;
		if (c.code == MILTER_CMD_OPTNEG) {
			CHECK(!negotiated);
			CHECK(milter_negotiate(c.optneg.version, c.optneg.actions, c.optneg.protocol,
					       want, &neg, &why) == 0);
			negotiated = true;
			expect[nexp++] = -2;
			continue;
		}
		CHECK(negotiated);
		int s = step_of(c.code);
		if (s >= 0 && (neg.reply_steps & MILTER_STEP_BIT(s)))
			expect[nexp++] = s;
		if (c.code == MILTER_CMD_QUIT)
			CHECK(off == n); /* nothing is read after QUIT */
	}
	size_t olen = evbuffer_get_length(outbuf);
	struct buf out;
	buf_init(&out, olen + 1);
	if (olen) {
		CHECK(buf_reserve(&out, olen) == 0);
		evbuffer_copyout(outbuf, out.ptr, olen);
		out.len = olen;
	}
	size_t o = 0, k = 0, mods = 0;
	while (o < out.len) {
		uint8_t code;
		struct str pl;
		take_packet(&out, &o, &code, &pl);
		if (code == 'O') {
			CHECK(k < nexp && expect[k] == -2);
			CHECK(get_u32(pl.ptr) == neg.version && get_u32(pl.ptr + 4) == neg.actions &&
			      get_u32(pl.ptr + 8) == neg.protocol);
			k++;
			continue;
		}
		if (code == 'p') {
			CHECK(pl.len == 0);
			continue;
		}
		uint32_t act = mod_action(code);
		if (act) {
			CHECK(neg.actions & act);
			if (code == 'b')
				CHECK(pl.len <= MILTER_DATA_64K);
			mods++;
			continue;
		}
		CHECK(is_final(code));
		CHECK(k < nexp);
		int s = expect[k++];
		CHECK(s >= 0);
		if (code == 'y') {
			CHECK(pl.len > 0 && pl.ptr[pl.len - 1] == 0 && !memchr(pl.ptr, 0, pl.len - 1));
		} else {
			CHECK(pl.len == 0);
		}
		if (code == 's')
			CHECK(s == MILTER_STEP_BODY && (neg.protocol & MILTER_P_SKIP));
		if (mods)
			CHECK(s == MILTER_STEP_EOM);
		mods = 0;
	}
	if (exact) {
		if (k != nexp) {
			fprintf(stderr, "fuzz_milter: %zu final replies for %zu commands waiting\n", k, nexp);
			abort();
		}
		CHECK(mods == 0);
	} else {
		CHECK(k <= nexp);
	}
	buf_done(&out);
	free(expect);
}

/*
 * on_abort and on_close, counted from the consumed commands: a message is open from MAIL
 * (or any later message command, when MAIL is skipped) until EOM answers it; an SMTP
 * session is under way from any command but OPTNEG, ABORT, QUIT and QUIT_NC.  ABORT, a
 * new MAIL, QUIT, QUIT_NC and EOF abort an open message; QUIT, QUIT_NC and EOF end the
 * SMTP session.  With a protocol error, the refused command may have opened either.
 */
static void check_callbacks(const uint8_t *consumed, size_t n, const struct fz *fz, bool exact)
{
	unsigned aborts = 0, closes = 0;
	bool active = false, in_msg = false, quit = false;
	size_t off = 0;
	while (off < n) {
		struct milter_frame f;
		const char *why;
		CHECK(milter_frame_parse(consumed + off, n - off, MILTER_LEN_CAP_DEFAULT, &f, &why) == 1);
		off += f.size;
		switch (f.code) {
		case MILTER_CMD_OPTNEG:
		case MILTER_CMD_MACRO: /* belongs to the command after it */
			break;
		case MILTER_CMD_CONNECT:
			/* a new SMTP session without QUIT_NC ends the previous one */
			aborts += in_msg;
			closes += active;
			in_msg = false;
			active = true;
			break;
		case MILTER_CMD_ABORT:
			aborts += in_msg;
			in_msg = false;
			break;
		case MILTER_CMD_QUIT:
		case MILTER_CMD_QUIT_NC:
			aborts += in_msg;
			closes += active;
			in_msg = active = false;
			quit = f.code == MILTER_CMD_QUIT;
			break;
		case MILTER_CMD_MAIL:
			aborts += in_msg;
			in_msg = active = true;
			break;
		case MILTER_CMD_RCPT:
		case MILTER_CMD_DATA:
		case MILTER_CMD_HEADER:
		case MILTER_CMD_EOH:
		case MILTER_CMD_BODY:
			in_msg = active = true;
			break;
		case MILTER_CMD_BODYEOB:
			in_msg = false; /* answered: the message is over */
			active = true;
			break;
		default:
			active = true;
			break;
		}
	}
	if (!quit) {
		/* EOF, or the protocol error */
		aborts += in_msg;
		closes += active;
	}
	if (exact) {
		if (fz->aborts != aborts || fz->closes != closes) {
			fprintf(stderr, "fuzz_milter: on_abort %u on_close %u, expected %u %u\n",
				fz->aborts, fz->closes, aborts, closes);
			abort();
		}
	} else {
		CHECK(fz->aborts == aborts || (!quit && fz->aborts == aborts + 1));
		CHECK(fz->closes == closes || (!quit && fz->closes == closes + 1));
	}
}

static void session_run(uint8_t cfg, uint8_t seed, const uint8_t *p, size_t n)
{
	struct fz fz;
	memset(&fz, 0, sizeof(fz));
	fz.rng = 0x9e3779b9u ^ ((uint32_t)seed * 0x01000193u) ^ cfg;
	struct milter_want want;
	struct milter_handler *h;
	if (cfg & 128) {
		h = static_handler(cfg, &want);
	} else {
		h = fz_handler(&fz, cfg);
		want = fz.want;
	}
	/* the daemon's limits, or small enough to be hit (the seeds' high bits) */
	struct milter_service_conf conf = { .max_packet = (seed & 0x80) ? 70000 : MILTER_LEN_CAP_DEFAULT,
					    .max_macros = (seed & 0x40) ? 300 : 256 * 1024 };
	struct service *svc = milter_service_new(NULL, h, &conf);
	CHECK(svc);
	struct session *s = fuzz_session_open(svc);
	size_t off = 0;
	while (off < n && !fuzz_session_ended(s)) {
		size_t chunk = n - off;
		if (seed) {
			static const size_t maxes[] = { 1, 3, 7, 64, 1024, 70000 };
			size_t m = maxes[rng_next(&fz.rng) % 6];
			chunk = 1 + rng_next(&fz.rng) % m;
			if (chunk > n - off)
				chunk = n - off;
		}
		fuzz_session_feed(s, p + off, chunk);
		off += chunk;
		/* resume a deferred verdict now, or after a later read */
		if (fz.pending && (rng_next(&fz.rng) % 3) != 0) {
			struct milter_session *ms = fz.pending;
			enum milter_verdict v = fz.verdict[fz.pending_step];
			if (rng_next(&fz.rng) % 4 == 0) {
				/* refused where the MTA waits for no answer */
				int pr = milter_session_progress(ms);
				CHECK(pr == 0 || pr == -EPERM);
			}
			if (rng_next(&fz.rng) % 5 == 0)
				milter_session_resume(ms, MILTER_PENDING); /* ignored */
			fz.pending = NULL;
			milter_session_resume(ms, v);
			/* a second resume is ignored (unless the session is gone, or the input that
			 * followed deferred a new verdict) */
			if (!fz.pending && !fuzz_session_ended(s))
				milter_session_resume(ms, MILTER_ACCEPT);
		}
	}
	/* all input is in: answer whatever is still deferred */
	while (fz.pending && !fuzz_session_ended(s)) {
		struct milter_session *ms = fz.pending;
		fz.pending = NULL;
		milter_session_resume(ms, fz.verdict[fz.pending_step]);
	}
	CHECK(!fuzz_session_paused(s) || fuzz_session_ended(s));
	bool proto_error = fuzz_session_protocol_error(s);
	size_t consumed = off - evbuffer_get_length(fuzz_session_input(s));
	struct evbuffer *out = fuzz_session_output(s);
	fuzz_session_eof(s);
	CHECK(!fz.pending);
	check_replies(p, consumed, &want, out, !proto_error);
	if (!(cfg & 128))
		check_callbacks(p, consumed, &fz, !proto_error);
	fuzz_session_free(s);
	fuzz_service_free(svc);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* the debug lines are formatted (by the stub) but not printed */
	log_set_level(LOG_LEVEL_DEBUG);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2 || size > MAX_INPUT)
		return 0;
	const uint8_t *p = data + 2;
	size_t n = size - 2;
	codec_stream(p, n);
	session_run(data[0], data[1], p, n);
	return 0;
}
