/*
 * milter -- codec for the milter wire protocol (see milter.h and doc/MILTER.md).
 *
 * Strings on the wire are NUL-terminated byte sequences; an empty string is a lone NUL.
 * The decoder never trims trailing NULs and refuses a string whose NUL is missing.
 */
#include <errno.h>
#include <string.h>

#include "milter.h"

static const char *const step_names[MILTER_STEP_COUNT] = {
	[MILTER_STEP_CONNECT] = "connect", [MILTER_STEP_HELO] = "helo",
	[MILTER_STEP_MAIL] = "mail",	   [MILTER_STEP_RCPT] = "rcpt",
	[MILTER_STEP_DATA] = "data",	   [MILTER_STEP_HEADER] = "header",
	[MILTER_STEP_EOH] = "eoh",	   [MILTER_STEP_BODY] = "body",
	[MILTER_STEP_EOM] = "eom",	   [MILTER_STEP_UNKNOWN] = "unknown",
};

/* Skip and no-reply flags per step; 0 where the protocol has none (EOM is always sent
 * and always answered). */
static const uint32_t step_skip[MILTER_STEP_COUNT] = {
	[MILTER_STEP_CONNECT] = MILTER_P_NOCONNECT, [MILTER_STEP_HELO] = MILTER_P_NOHELO,
	[MILTER_STEP_MAIL] = MILTER_P_NOMAIL,	    [MILTER_STEP_RCPT] = MILTER_P_NORCPT,
	[MILTER_STEP_DATA] = MILTER_P_NODATA,	    [MILTER_STEP_HEADER] = MILTER_P_NOHDRS,
	[MILTER_STEP_EOH] = MILTER_P_NOEOH,	    [MILTER_STEP_BODY] = MILTER_P_NOBODY,
	[MILTER_STEP_EOM] = 0,			    [MILTER_STEP_UNKNOWN] = MILTER_P_NOUNKNOWN,
};

static const uint32_t step_noreply[MILTER_STEP_COUNT] = {
	[MILTER_STEP_CONNECT] = MILTER_P_NR_CONN, [MILTER_STEP_HELO] = MILTER_P_NR_HELO,
	[MILTER_STEP_MAIL] = MILTER_P_NR_MAIL,	  [MILTER_STEP_RCPT] = MILTER_P_NR_RCPT,
	[MILTER_STEP_DATA] = MILTER_P_NR_DATA,	  [MILTER_STEP_HEADER] = MILTER_P_NR_HDR,
	[MILTER_STEP_EOH] = MILTER_P_NR_EOH,	  [MILTER_STEP_BODY] = MILTER_P_NR_BODY,
	[MILTER_STEP_EOM] = 0,			  [MILTER_STEP_UNKNOWN] = MILTER_P_NR_UNKN,
};

const char *milter_step_name(enum milter_step step)
{
	if ((unsigned)step < MILTER_STEP_COUNT)
		return step_names[step];
	return "?";
}

int milter_step_from_name(const char *name, enum milter_step *ret)
{
	for (int i = 0; i < MILTER_STEP_COUNT; i++)
		if (strcmp(name, step_names[i]) == 0) {
			*ret = (enum milter_step)i;
			return 0;
		}
	return -EINVAL;
}

static uint32_t get_u32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int milter_frame_size(const void *p, size_t n, size_t cap, size_t *ret_size,
		      const char **ret_why)
{
	if (n < 4)
		return 0;
	uint32_t len = get_u32(p);
	if (len == 0) {
		*ret_why = "packet length 0";
		return -EPROTO;
	}
	if (len > cap) {
		*ret_why = "packet length above limit";
		return -EPROTO;
	}
	*ret_size = (size_t)len + 4;
	return 1;
}

int milter_frame_parse(const void *p, size_t n, size_t cap, struct milter_frame *ret,
		       const char **ret_why)
{
	const unsigned char *b = p;
	size_t size;
	int r = milter_frame_size(p, n, cap, &size, ret_why);
	if (r <= 0 || n < size)
		return r < 0 ? r : 0;
	ret->code = b[4];
	ret->data = str_make((const char *)b + 5, size - 5);
	ret->size = size;
	return 1;
}

/* Split off one NUL-terminated string from *rest. */
static int take_str(struct str *rest, struct str *ret)
{
	const char *nul = rest->len ? memchr(rest->ptr, '\0', rest->len) : NULL;
	if (!nul)
		return -EPROTO;
	size_t l = (size_t)(nul - rest->ptr);
	*ret = str_make(rest->ptr, l);
	rest->ptr += l + 1;
	rest->len -= l + 1;
	return 0;
}

static int decode_envelope(struct str d, struct milter_cmd *c, const char **why)
{
	if (take_str(&d, &c->envelope.addr) < 0) {
		*why = "address without NUL";
		return -EPROTO;
	}
	c->envelope.nargs = 0;
	while (d.len) {
		if (c->envelope.nargs == MILTER_MAX_ESMTP_ARGS) {
			*why = "too many ESMTP parameters";
			return -EPROTO;
		}
		if (take_str(&d, &c->envelope.args[c->envelope.nargs]) < 0) {
			*why = "ESMTP parameter without NUL";
			return -EPROTO;
		}
		c->envelope.nargs++;
	}
	return 0;
}

int milter_cmd_decode(const struct milter_frame *f, struct milter_cmd *ret, const char **ret_why)
{
	struct milter_cmd c;
	struct str d = f->data;
	const char *why = NULL;
	c.code = f->code;
	switch (f->code) {
	case MILTER_CMD_OPTNEG:
		if (d.len < 12) {
			why = "OPTNEG shorter than 12 bytes";
			break;
		}
		c.optneg.version = get_u32((const unsigned char *)d.ptr);
		c.optneg.actions = get_u32((const unsigned char *)d.ptr + 4);
		c.optneg.protocol = get_u32((const unsigned char *)d.ptr + 8);
		break;
	case MILTER_CMD_MACRO:
		if (d.len < 1) {
			why = "MACRO without stage";
			break;
		}
		c.macro.stage = (uint8_t)d.ptr[0];
		d.ptr++;
		d.len--;
		c.macro.npairs = 0;
		while (d.len && !why) {
			struct milter_macro_pair *mp = &c.macro.pairs[c.macro.npairs];
			if (c.macro.npairs == MILTER_MAX_MACRO_PAIRS)
				why = "too many macros";
			else if (take_str(&d, &mp->name) < 0)
				why = "macro name without NUL";
			else if (d.len == 0)
				break; /* a trailing name without value: ignored, as libmilter does */
			else if (take_str(&d, &mp->value) < 0)
				why = "macro value without NUL";
			else
				c.macro.npairs++;
		}
		break;
	case MILTER_CMD_CONNECT:
		if (take_str(&d, &c.connect.host) < 0) {
			why = "CONNECT host without NUL";
			break;
		}
		if (d.len < 1) {
			why = "CONNECT without family";
			break;
		}
		c.connect.family = (uint8_t)d.ptr[0];
		d.ptr++;
		d.len--;
		c.connect.port = 0;
		c.connect.address = str_make("", 0);
		if (c.connect.family == 'U')
			break;
		if (c.connect.family != '4' && c.connect.family != '6' && c.connect.family != 'L') {
			why = "CONNECT with unknown family";
			break;
		}
		if (d.len < 2) {
			why = "CONNECT without port";
			break;
		}
		c.connect.port = (uint16_t)((unsigned char)d.ptr[0] << 8 | (unsigned char)d.ptr[1]);
		d.ptr += 2;
		d.len -= 2;
		if (take_str(&d, &c.connect.address) < 0)
			why = "CONNECT address without NUL";
		else if (d.len)
			why = "CONNECT with trailing bytes";
		break;
	case MILTER_CMD_HELO:
		if (take_str(&d, &c.helo.name) < 0)
			why = "HELO without NUL";
		break;
	case MILTER_CMD_MAIL:
	case MILTER_CMD_RCPT:
		if (decode_envelope(d, &c, &why) < 0)
			break;
		break;
	case MILTER_CMD_HEADER:
		if (take_str(&d, &c.header.name) < 0)
			why = "HEADER name without NUL";
		else if (take_str(&d, &c.header.value) < 0)
			why = "HEADER value without NUL";
		else if (d.len)
			why = "HEADER with trailing bytes";
		break;
	case MILTER_CMD_BODY:
	case MILTER_CMD_BODYEOB:
		c.body.chunk = d;
		break;
	case MILTER_CMD_UNKNOWN:
		if (take_str(&d, &c.unknown.line) < 0)
			why = "UNKNOWN without NUL";
		break;
	case MILTER_CMD_DATA:
	case MILTER_CMD_EOH:
	case MILTER_CMD_ABORT:
	case MILTER_CMD_QUIT:
	case MILTER_CMD_QUIT_NC:
		/* No payload is defined; libmilter ignores any, and so do we. */
		break;
	default:
		why = "unknown command";
		break;
	}
	if (why) {
		*ret_why = why;
		return -EPROTO;
	}
	memcpy(ret, &c, sizeof(c));
	return 0;
}

int milter_negotiate(uint32_t mta_version, uint32_t mta_actions, uint32_t mta_protocol,
		     const struct milter_want *want, struct milter_neg *ret, const char **ret_why)
{
	struct milter_neg n = { 0 };
	if (mta_version < 2) {
		*ret_why = "MTA protocol version below 2";
		return -EPROTO;
	}
	/* A very old MTA sends zeros for "the version 1 defaults". */
	if (mta_actions == 0)
		mta_actions = 0x0f;
	if (mta_protocol == 0)
		mta_protocol = 0x3f;
	n.version = mta_version < 6 ? mta_version : 6;
	n.mta_protocol = mta_protocol;

	/* Steps this version of the protocol has at all. */
	uint32_t exists = (1u << MILTER_STEP_COUNT) - 1;
	if (n.version < 3)
		exists &= ~MILTER_STEP_BIT(MILTER_STEP_UNKNOWN);
	if (n.version < 4)
		exists &= ~MILTER_STEP_BIT(MILTER_STEP_DATA);

	uint32_t proto = 0;
	n.send_steps = 0;
	n.reply_steps = 0;
	for (int s = 0; s < MILTER_STEP_COUNT; s++) {
		uint32_t bit = MILTER_STEP_BIT(s);
		if (!(exists & bit))
			continue;
		bool wanted = (want->steps & bit) || s == MILTER_STEP_EOM;
		if (!wanted && step_skip[s] && (mta_protocol & step_skip[s])) {
			proto |= step_skip[s];
			continue;
		}
		n.send_steps |= bit;
		bool needs_reply = wanted && ((want->replies & bit) || s == MILTER_STEP_EOM);
		if (!needs_reply && step_noreply[s] && (mta_protocol & step_noreply[s]))
			proto |= step_noreply[s];
		else
			n.reply_steps |= bit;
	}
	if (want->header_leadspc && (mta_protocol & MILTER_P_HDR_LEADSPC))
		proto |= MILTER_P_HDR_LEADSPC;
	if (want->rcpt_rejected && (mta_protocol & MILTER_P_RCPT_REJ))
		proto |= MILTER_P_RCPT_REJ;
	if (want->skip && (mta_protocol & MILTER_P_SKIP))
		proto |= MILTER_P_SKIP;
	/* Agree to the largest data size offered: fewer, larger BODY packets. */
	n.body_max = MILTER_DATA_64K;
	if (mta_protocol & MILTER_P_MDS_1M) {
		proto |= MILTER_P_MDS_1M;
		n.body_max = MILTER_DATA_1M;
	} else if (mta_protocol & MILTER_P_MDS_256K) {
		proto |= MILTER_P_MDS_256K;
		n.body_max = MILTER_DATA_256K;
	}
	n.protocol = proto;

	n.actions = want->actions & mta_actions & MILTER_ACT_ALL & ~MILTER_ACT_SETSYMLIST;
	bool any_macros = false;
	for (int i = 0; i < MILTER_MACROS_COUNT; i++)
		if (want->macros[i] && want->macros[i][0])
			any_macros = true;
	if (any_macros && (mta_actions & MILTER_ACT_SETSYMLIST)) {
		n.symlist = true;
		n.actions |= MILTER_ACT_SETSYMLIST;
	}
	*ret = n;
	return 0;
}

static int put_header(struct buf *out, uint32_t len, uint8_t code)
{
	int r = buf_reserve(out, 5); /* all or nothing */
	if (r == 0)
		r = buf_append_u32be(out, len);
	if (r == 0)
		r = buf_append_byte(out, code);
	return r;
}

int milter_put_optneg(struct buf *out, const struct milter_neg *neg,
		      const char *const macros[MILTER_MACROS_COUNT])
{
	size_t len = 1 + 12;
	if (neg->symlist)
		for (int i = 0; i < MILTER_MACROS_COUNT; i++)
			if (macros[i] && macros[i][0])
				len += 4 + strlen(macros[i]) + 1;
	if (len > MILTER_DATA_64K)
		return -EINVAL;
	size_t start = out->len;
	int r = buf_reserve(out, len + 4);
	if (r < 0)
		return r;
	r = put_header(out, (uint32_t)len, MILTER_CMD_OPTNEG);
	if (r == 0)
		r = buf_append_u32be(out, neg->version);
	if (r == 0)
		r = buf_append_u32be(out, neg->actions);
	if (r == 0)
		r = buf_append_u32be(out, neg->protocol);
	if (neg->symlist)
		for (int i = 0; i < MILTER_MACROS_COUNT && r == 0; i++)
			if (macros[i] && macros[i][0]) {
				r = buf_append_u32be(out, (uint32_t)i);
				if (r == 0)
					r = buf_append(out, macros[i], strlen(macros[i]) + 1);
			}
	if (r < 0)
		buf_truncate(out, start);
	return r;
}

int milter_put_simple(struct buf *out, uint8_t code)
{
	return put_header(out, 1, code);
}

/* Split text into lines at "\n" (a preceding "\r" is dropped). */
static size_t next_line(struct str text, size_t off, struct str *line)
{
	const char *p = text.ptr + off;
	size_t rem = text.len - off;
	const char *nl = rem ? memchr(p, '\n', rem) : NULL;
	size_t l = nl ? (size_t)(nl - p) : rem;
	*line = str_make(p, l);
	if (line->len && line->ptr[line->len - 1] == '\r')
		line->len--;
	return off + l + (nl ? 1 : 0);
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* Length of an enhanced status code "c.sss.ddd" at the start of s, or 0. */
static size_t enhanced_len(struct str s)
{
	size_t i = 0;
	if (s.len < 5 || !is_digit(s.ptr[0]) || s.ptr[1] != '.')
		return 0;
	i = 2;
	for (int part = 0; part < 2; part++) {
		size_t start = i;
		while (i < s.len && is_digit(s.ptr[i]) && i - start < 3)
			i++;
		if (i == start)
			return 0;
		if (part == 0) {
			if (i >= s.len || s.ptr[i] != '.')
				return 0;
			i++;
		}
	}
	if (i < s.len && s.ptr[i] != ' ')
		return 0;
	return i;
}

int milter_reply_check(struct str text, const char **ret_why)
{
	const char *why = NULL;
	size_t off = 0, lines = 0;
	char code[3] = { 0 };
	if (text.len == 0 || memchr(text.ptr, '\0', text.len)) {
		*ret_why = text.len ? "NUL in reply" : "empty reply";
		return -EINVAL;
	}
	while (off < text.len && !why) {
		struct str line;
		off = next_line(text, off, &line);
		if (++lines > MILTER_REPLY_MAX_LINES) {
			why = "more than 32 lines";
			break;
		}
		if (line.len < 5 || !is_digit(line.ptr[0]) || !is_digit(line.ptr[1]) ||
		    !is_digit(line.ptr[2]) || (line.ptr[3] != ' ' && line.ptr[3] != '-')) {
			why = "a line does not start with a 3-digit code and a separator";
			break;
		}
		if (line.ptr[0] != '4' && line.ptr[0] != '5') {
			why = "code is not 4xx or 5xx";
			break;
		}
		if (lines == 1)
			memcpy(code, line.ptr, 3);
		else if (memcmp(code, line.ptr, 3) != 0) {
			why = "lines carry different codes";
			break;
		}
		struct str rest = str_make(line.ptr + 4, line.len - 4);
		if (rest.len > MILTER_REPLY_MAX_TEXT) {
			why = "a line is longer than 980 bytes";
			break;
		}
		size_t el = enhanced_len(rest);
		if (el && rest.ptr[0] != code[0])
			why = "enhanced status code class differs from the reply code";
		for (size_t i = 0; i < line.len && !why; i++)
			if ((unsigned char)line.ptr[i] < 0x20 && line.ptr[i] != '\t')
				why = "control character in reply";
	}
	if (why) {
		*ret_why = why;
		return -EINVAL;
	}
	return 0;
}

int milter_put_replycode(struct buf *out, struct str text)
{
	const char *why;
	if (milter_reply_check(text, &why) < 0)
		return -EINVAL;
	size_t start = out->len;
	int r = put_header(out, 0, MILTER_REPLY_REPLYCODE);
	size_t off = 0;
	while (r == 0 && off < text.len) {
		struct str line;
		off = next_line(text, off, &line);
		bool last = off >= text.len;
		r = buf_append(out, line.ptr, 3);
		if (r == 0)
			r = buf_append_byte(out, last ? ' ' : '-');
		for (size_t i = 4; i < line.len && r == 0; i++) {
			r = buf_append_byte(out, (unsigned char)line.ptr[i]);
			if (r == 0 && line.ptr[i] == '%')
				r = buf_append_byte(out, '%');
		}
		if (r == 0 && !last)
			r = buf_append(out, "\r\n", 2);
	}
	if (r == 0)
		r = buf_append_byte(out, 0);
	if (r < 0) {
		buf_truncate(out, start);
		return r;
	}
	size_t len = out->len - start - 4;
	if (len > MILTER_DATA_64K) {
		buf_truncate(out, start);
		return -EINVAL;
	}
	unsigned char *h = (unsigned char *)out->ptr + start;
	h[0] = (unsigned char)(len >> 24);
	h[1] = (unsigned char)(len >> 16);
	h[2] = (unsigned char)(len >> 8);
	h[3] = (unsigned char)len;
	return 0;
}

int milter_put_header(struct buf *out, uint8_t code, uint32_t index, struct str name,
		      struct str value)
{
	if (name.len == 0 || memchr(name.ptr, 0, name.len) || (value.len && memchr(value.ptr, 0, value.len)))
		return -EINVAL;
	bool indexed = code != MILTER_REPLY_ADDHEADER;
	size_t len = 1 + (indexed ? 4 : 0) + name.len + 1 + value.len + 1;
	if (len > MILTER_DATA_1M)
		return -EINVAL;
	size_t start = out->len;
	int r = put_header(out, (uint32_t)len, code);
	if (r == 0 && indexed)
		r = buf_append_u32be(out, index);
	if (r == 0)
		r = buf_append_str(out, name);
	if (r == 0)
		r = buf_append_byte(out, 0);
	if (r == 0)
		r = buf_append_str(out, value);
	if (r == 0)
		r = buf_append_byte(out, 0);
	if (r < 0)
		buf_truncate(out, start);
	return r;
}

int milter_put_addr(struct buf *out, uint8_t code, struct str addr, struct str args)
{
	bool with_args = (code == MILTER_REPLY_ADDRCPT_PAR || code == MILTER_REPLY_CHGFROM) &&
			 args.len > 0;
	if (addr.len == 0 || memchr(addr.ptr, '\0', addr.len) ||
	    (with_args && memchr(args.ptr, '\0', args.len)))
		return -EINVAL;
	size_t len = 1 + addr.len + 1 + (with_args ? args.len + 1 : 0);
	if (len > MILTER_DATA_64K)
		return -EINVAL;
	size_t start = out->len;
	int r = put_header(out, (uint32_t)len, code);
	if (r == 0)
		r = buf_append_str(out, addr);
	if (r == 0)
		r = buf_append_byte(out, 0);
	if (r == 0 && with_args) {
		r = buf_append_str(out, args);
		if (r == 0)
			r = buf_append_byte(out, 0);
	}
	if (r < 0)
		buf_truncate(out, start);
	return r;
}

int milter_put_quarantine(struct buf *out, struct str reason)
{
	if (reason.len == 0 || memchr(reason.ptr, '\0', reason.len) || reason.len > MILTER_DATA_64K - 2)
		return -EINVAL;
	size_t start = out->len;
	int r = put_header(out, (uint32_t)(reason.len + 2), MILTER_REPLY_QUARANTINE);
	if (r == 0)
		r = buf_append_str(out, reason);
	if (r == 0)
		r = buf_append_byte(out, 0);
	if (r < 0)
		buf_truncate(out, start);
	return r;
}

int milter_put_replbody(struct buf *out, struct str body)
{
	size_t start = out->len;
	int r = 0;
	size_t off = 0;
	do {
		size_t n = body.len - off;
		if (n > MILTER_DATA_64K)
			n = MILTER_DATA_64K;
		r = put_header(out, (uint32_t)(n + 1), MILTER_REPLY_REPLBODY);
		if (r == 0)
			r = buf_append(out, body.ptr + off, n);
		off += n;
	} while (r == 0 && off < body.len);
	if (r < 0)
		buf_truncate(out, start);
	return r;
}
