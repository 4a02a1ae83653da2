/*
 * control -- codec for the control line protocol (see control.h).
 */
#include <errno.h>
#include <string.h>

#include "control.h"
#include "util.h"

int control_request_parse(const char *p, size_t n, struct control_request *ret,
			  size_t *ret_used, const char **ret_why)
{
	size_t scan = n < CONTROL_LINE_MAX ? n : CONTROL_LINE_MAX;
	const char *nl = scan ? memchr(p, '\n', scan) : NULL;
	if (!nl) {
		if (n >= CONTROL_LINE_MAX) {
			*ret_why = "request line too long";
			return -EPROTO;
		}
		return 0;
	}
	size_t len = (size_t)(nl - p);
	if (memchr(p, '\0', len)) {
		*ret_why = "NUL byte in request";
		return -EPROTO;
	}
	if (len && p[len - 1] == '\r')
		len--;
	struct control_request r = { 0 };
	size_t i = 0;
	while (i < len) {
		while (i < len && (p[i] == ' ' || p[i] == '\t'))
			i++;
		if (i == len)
			break;
		size_t s = i;
		while (i < len && p[i] != ' ' && p[i] != '\t')
			i++;
		if (r.argc == CONTROL_MAX_ARGS) {
			*ret_why = "too many words in request";
			return -EPROTO;
		}
		r.argv[r.argc++] = str_make(p + s, i - s);
	}
	if (r.argc == 0) {
		*ret_why = "empty request";
		return -EPROTO;
	}
	*ret = r;
	*ret_used = (size_t)(nl - p) + 1;
	return 1;
}

int control_reply_parse(const char *p, size_t n, struct control_reply *ret, size_t *ret_used,
			const char **ret_why)
{
	size_t scan = n < 32 ? n : 32;
	const char *nl = scan ? memchr(p, '\n', scan) : NULL;
	if (!nl) {
		if (n >= 32) {
			*ret_why = "reply header too long";
			return -EPROTO;
		}
		return 0;
	}
	bool ok, more = false;
	size_t i;
	if (nl - p >= 3 && memcmp(p, "ok ", 3) == 0) {
		ok = true;
		i = 3;
	} else if (nl - p >= 5 && memcmp(p, "more ", 5) == 0) {
		ok = more = true;
		i = 5;
	} else if (nl - p >= 6 && memcmp(p, "error ", 6) == 0) {
		ok = false;
		i = 6;
	} else {
		*ret_why = "reply header is not 'ok LEN', 'more LEN' or 'error LEN'";
		return -EPROTO;
	}
	size_t len = 0;
	if (p + i == nl) {
		*ret_why = "reply without length";
		return -EPROTO;
	}
	for (; p + i < nl; i++) {
		if (p[i] < '0' || p[i] > '9') {
			*ret_why = "reply length is not a number";
			return -EPROTO;
		}
		len = len * 10 + (size_t)(p[i] - '0');
		if (len > CONTROL_BODY_MAX) {
			*ret_why = "reply body too large";
			return -EPROTO;
		}
	}
	size_t head = (size_t)(nl - p) + 1;
	if (n - head < len)
		return 0;
	ret->ok = ok;
	ret->more = more;
	ret->body = str_make(p + head, len);
	*ret_used = head + len;
	return 1;
}

int control_put_reply(struct buf *out, bool ok, struct str body)
{
	if (body.len > CONTROL_BODY_MAX)
		return -EINVAL;
	int r = buf_printf(out, "%s %zu\n", ok ? "ok" : "error", body.len);
	if (r == 0)
		r = buf_append_str(out, body);
	return r;
}

int control_put_part(struct buf *out, struct str body)
{
	if (body.len > CONTROL_BODY_MAX)
		return -EINVAL;
	int r = buf_printf(out, "more %zu\n", body.len);
	if (r == 0)
		r = buf_append_str(out, body);
	return r;
}

/* The bytes a password may hold as they are in the word; the others are %XX. */
static bool auth_plain(unsigned char c)
{
	return c > ' ' && c < 0x7f && c != '%';
}

int control_put_auth(struct buf *out, struct str secret)
{
	if (secret.len == 0 || secret.len > CONTROL_SECRET_MAX)
		return -EINVAL;
	int r = buf_append_cstr(out, "auth ");
	for (size_t i = 0; r == 0 && i < secret.len; i++) {
		unsigned char c = (unsigned char)secret.ptr[i];
		r = auth_plain(c) ? buf_append_byte(out, (char)c) : buf_printf(out, "%%%02X", c);
	}
	return r == 0 ? buf_append_byte(out, '\n') : r;
}

int control_auth_parse(const struct control_request *req, char *ret, size_t *ret_len,
		       const char **ret_why)
{
	if (req->argc == 0 || !str_eq_cstr(req->argv[0], "auth"))
		return 0;
	if (req->argc != 2) {
		*ret_why = "auth takes one word: the password, %XX-encoded";
		return -EPROTO;
	}
	struct str w = req->argv[1];
	size_t n = 0;
	for (size_t i = 0; i < w.len; i++) {
		if (n == CONTROL_SECRET_MAX) {
			*ret_why = "password too long";
			return -EPROTO;
		}
		if (w.ptr[i] != '%') {
			ret[n++] = w.ptr[i];
			continue;
		}
		int hi = i + 2 < w.len ? hex_value(w.ptr[i + 1]) : -1;
		int lo = i + 2 < w.len ? hex_value(w.ptr[i + 2]) : -1;
		if (hi < 0 || lo < 0) {
			*ret_why = "bad %XX in the password";
			return -EPROTO;
		}
		ret[n++] = (char)(hi << 4 | lo);
		i += 2;
	}
	*ret_len = n;
	return 1;
}
