/*
 * cfg -- parser for sluice's configuration syntax (the nginx-like UCL subset of cfg.h),
 * and the converters that turn its scalars into numbers, durations, sizes and booleans.
 *
 * A hand-written scanner and a recursive-descent parser over one buffer held in memory.
 * The parser asks for the kind of token the grammar expects next (a key, a value), which
 * is what lets ':' both separate a key from its value and appear inside a value
 * (inet:127.0.0.1:10031).
 *
 * Grammar (ws = blanks, CR and comments; NL = a newline, also one inside a comment):
 *
 *   document = { entry } EOF
 *   entry    = key [ws|NL] '{' body '}' [';' | ',']             object
 *            | key quoted [ws|NL] '{' body '}' [';' | ',']      named object (label)
 *            | key ( '=' | ':' ) [ws|NL] value end
 *            | key ws value end                                 the value on the key's line
 *   body     = { entry }
 *   value    = quoted | word | '{' body '}' | list
 *   list     = '[' [ value { (',' | NL) value } [','] ] ']'     elements: scalars, objects
 *                                                               or lists
 *   end      = ';' | ',' | NL | (followed by '}' or EOF)
 *
 * Lexical rules:
 *   - Comments: '#' or '//' to the end of the line, slash-star to star-slash (not nested).
 *     They start only where a token may start, so "unix://x" and "/a/b" are words.
 *   - Words (bare scalars and keys): ASCII letters and digits, the characters
 *     _ . / : * @ + - [ ] ! % ~ $ ? and every byte >= 0x80.  In key position ':' ends
 *     the word (key:value).  A word never starts with '[' or ']', and a ']' that does not
 *     close a '[' of the same word ends it, so inet6:[::1]:25 is one word even inside a
 *     list, and [a, b] is a list of a and b.
 *   - Lists vs words: in value position a '[' always opens a list.  A value that starts
 *     with '[' (a Postfix-style "[host]:port") must be quoted; unquoted, it is reported
 *     with a hint rather than silently read as a list.
 *   - Quoted strings stay on one line.  "..." knows the escapes \" \\ \n \t \r \uXXXX
 *     (surrogate pairs are joined, a lone surrogate is an error; \u0000 is kept, which
 *     is why value_len exists); '...' knows only \' and \\, other backslashes are kept.
 *   - A label is only a quoted string between a key and '{'.
 *   - A syntax error names the line where the offending token starts; an unterminated
 *     string or comment names the line where it starts; running out of input inside
 *     '{' or '[' names the last line and the line that opened it.
 *
 * Limits (every one a parse error with a line number): input <= CFG_MAX_FILE bytes and
 * free of NUL bytes, one key, label or scalar <= CFG_MAX_SCALAR bytes (after unescaping),
 * nesting of objects and lists <= CFG_MAX_DEPTH (the recursion is bounded by it), and at
 * most CFG_MAX_NODES nodes so that a 16 MB "[1,1,1,..." cannot take gigabytes.
 *
 * Invariants of a tree returned by cfg_parse(): the root is an object without key; every
 * child of an object has a non-empty key free of NUL bytes; list elements have no key;
 * labels are non-empty and free of NUL bytes; every scalar value is NUL-terminated at
 * value[value_len]; node->file of every node points into the root's own allocation.
 */
#include "cfg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cfg_int.h"
#include "util.h"

#define CFG_MAX_NODES 1000000u

struct parser {
	const char *file;       /* the root's copy of the file name */
	const char *text;
	size_t len;
	size_t pos;
	unsigned line;          /* line of text[pos] */
	unsigned depth;         /* objects and lists currently open */
	size_t nodes;
	char *err;
	size_t errlen;
};

/* A small append-only string writer that never overruns and always NUL-terminates. */
struct sbuf {
	char *buf;
	size_t size;
	size_t pos;
};

static void sb_init(struct sbuf *b, char *buf, size_t size)
{
	b->buf = buf;
	b->size = size;
	b->pos = 0;
	if (size > 0)
		buf[0] = '\0';
}

static void sb_putc(struct sbuf *b, char c)
{
	if (b->pos + 1 < b->size) {
		b->buf[b->pos++] = c;
		b->buf[b->pos] = '\0';
	} else if (b->size > 0) {
		b->pos = b->size; /* full: later output is dropped too */
	}
}

static void sb_puts(struct sbuf *b, const char *s)
{
	while (*s)
		sb_putc(b, *s++);
}

/* Copies n bytes, writing control bytes, DEL and (when quote) '"' and '\' as escapes. */
static void sb_put_escaped(struct sbuf *b, const char *s, size_t n, bool quote)
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f) {
			sb_putc(b, '\\');
			sb_putc(b, 'x');
			sb_putc(b, hex[c >> 4]);
			sb_putc(b, hex[c & 0xf]);
		} else if (quote && (c == '"' || c == '\\')) {
			sb_putc(b, '\\');
			sb_putc(b, (char)c);
		} else {
			sb_putc(b, (char)c);
		}
	}
}

/* ---- parse errors ---------------------------------------------------------------- */

static int parse_error(struct parser *p, unsigned line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int parse_error(struct parser *p, unsigned line, const char *fmt, ...)
{
	if (!p->err || p->errlen == 0)
		return -EINVAL;
	int w = snprintf(p->err, p->errlen, "%s:%u: ", p->file, line);
	if (w >= 0 && (size_t)w < p->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(p->err + w, p->errlen - (size_t)w, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static int parse_nomem(struct parser *p)
{
	parse_error(p, p->line, "out of memory");
	return -ENOMEM;
}

static bool at_eof(const struct parser *p)
{
	return p->pos >= p->len;
}

static unsigned char cur(const struct parser *p)
{
	return (unsigned char)p->text[p->pos];
}

/* The last line of the input, for "unexpected end of file". */
static unsigned eof_line(const struct parser *p)
{
	if (p->line > 1 && p->len > 0 && p->text[p->len - 1] == '\n')
		return p->line - 1;
	return p->line;
}

/* Names the byte at p->pos (or the end of input) for an error message. */
static const char *describe(const struct parser *p, char *buf, size_t size)
{
	if (at_eof(p))
		return "end of file";
	unsigned char c = cur(p);
	if (c == '\n')
		return "newline";
	if (c > 0x20 && c < 0x7f)
		snprintf(buf, size, "'%c'", c);
	else
		snprintf(buf, size, "byte 0x%02x", c);
	return buf;
}

/* Quotes a key for an error message, escaping and truncating it. */
const char *cfg_show_text(const char *s, size_t n, char *buf, size_t size)
{
	struct sbuf b;
	bool cut = n > 64;

	sb_init(&b, buf, size);
	sb_putc(&b, '"');
	sb_put_escaped(&b, s, cut ? 64 : n, true);
	sb_puts(&b, cut ? "\"..." : "\"");
	return buf;
}

static unsigned line_at(const char *text, size_t off)
{
	unsigned line = 1;
	const char *p = text, *end = text + off;
	while (p < end && (p = memchr(p, '\n', (size_t)(end - p)))) {
		line++;
		p++;
	}
	return line;
}

/* ---- scanner --------------------------------------------------------------------- */

static bool is_word_char(unsigned char c)
{
	if (c >= 0x80)
		return true;
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
		return true;
	switch (c) {
	case '_': case '.': case '/': case ':': case '*': case '@': case '+': case '-':
	case '[': case ']': case '!': case '%': case '~': case '$': case '?':
		return true;
	default:
		return false;
	}
}

static bool is_word_start(unsigned char c, bool key)
{
	return is_word_char(c) && c != '[' && c != ']' && !(key && c == ':');
}

/*
 * Skips blanks, newlines and comments.  Sets *ret_nl (if not NULL) when a newline was
 * crossed.  Returns 0, or -EINVAL for an unterminated slash-star comment.
 */
static int skip_space(struct parser *p, bool *ret_nl)
{
	bool nl = false;

	while (!at_eof(p)) {
		unsigned char c = cur(p);
		bool slash2 = c == '/' && p->pos + 1 < p->len;
		if (c == '\n') {
			nl = true;
			p->line++;
			p->pos++;
		} else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
			p->pos++;
		} else if (c == '#' || (slash2 && p->text[p->pos + 1] == '/')) {
			const char *e = memchr(p->text + p->pos, '\n', p->len - p->pos);
			p->pos = e ? (size_t)(e - p->text) : p->len;
		} else if (slash2 && p->text[p->pos + 1] == '*') {
			unsigned start = p->line, line = p->line;
			size_t i = p->pos + 2;
			bool closed = false, crossed = false;
			for (; i + 1 < p->len; i++) {
				if (p->text[i] == '*' && p->text[i + 1] == '/') {
					closed = true;
					break;
				}
				if (p->text[i] == '\n') {
					line++;
					crossed = true;
				}
			}
			if (!closed)
				return parse_error(p, start, "unterminated comment");
			p->pos = i + 2;
			p->line = line;
			nl = nl || crossed;
		} else {
			break;
		}
	}
	if (ret_nl)
		*ret_nl = nl;
	return 0;
}

/* Lexes a word at p->pos (which is_word_start()); *ret is a new NUL-terminated copy. */
static int lex_word(struct parser *p, bool key, char **ret, size_t *ret_len)
{
	size_t start = p->pos, i = p->pos, open = 0;

	while (i < p->len) {
		unsigned char c = (unsigned char)p->text[i];
		if (!is_word_char(c) || (key && c == ':'))
			break;
		if (c == '[') {
			open++;
		} else if (c == ']') {
			if (open == 0)
				break;
			open--;
		}
		i++;
	}
	size_t n = i - start;
	if (n > CFG_MAX_SCALAR)
		return parse_error(p, p->line, "word longer than %u bytes", (unsigned)CFG_MAX_SCALAR);
	char *s = malloc(n + 1);
	if (!s)
		return parse_nomem(p);
	memcpy(s, p->text + start, n);
	s[n] = '\0';
	p->pos = i;
	*ret = s;
	*ret_len = n;
	return 0;
}

static int hex4(const char *s, unsigned *ret)
{
	unsigned v = 0;
	for (int i = 0; i < 4; i++) {
		unsigned char c = (unsigned char)s[i];
		unsigned d;
		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10u;
		else if (c >= 'A' && c <= 'F')
			d = c - 'A' + 10u;
		else
			return -EINVAL;
		v = v << 4 | d;
	}
	*ret = v;
	return 0;
}

static size_t put_utf8(char *out, unsigned cp)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | cp >> 12);
		out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | cp >> 18);
	out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/*
 * Decodes a \uXXXX escape (and the low half of a surrogate pair) at s[j] == '\\' of a
 * string whose closing quote is at s[end].  Writes UTF-8 to out, which has room (the
 * output is shorter than the escape).  Returns the bytes of input used, or -EINVAL.
 */
static int decode_u(const char *s, size_t j, size_t end, char *out, size_t *ret_n)
{
	unsigned cp, lo;

	if (end - j < 6 || hex4(s + j + 2, &cp) < 0)
		return -EINVAL;
	if (cp >= 0xdc00 && cp <= 0xdfff)
		return -EINVAL;
	if (cp >= 0xd800 && cp <= 0xdbff) {
		if (end - j < 12 || s[j + 6] != '\\' || s[j + 7] != 'u' ||
		    hex4(s + j + 8, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff)
			return -EINVAL;
		*ret_n = put_utf8(out, 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00));
		return 12;
	}
	*ret_n = put_utf8(out, cp);
	return 6;
}

/* Lexes a quoted string at p->pos; *ret is the new, unescaped, NUL-terminated text. */
static int lex_quoted(struct parser *p, char **ret, size_t *ret_len)
{
	const char *s = p->text;
	char q = s[p->pos];
	size_t start = p->pos + 1, i = start;

	/* Find the closing quote; a backslash protects the next byte unless it is a newline. */
	for (;;) {
		if (i >= p->len || s[i] == '\n')
			return parse_error(p, p->line, "unterminated string");
		if (s[i] == q)
			break;
		if (s[i] == '\\' && i + 1 < p->len && s[i + 1] != '\n')
			i += 2;
		else
			i++;
	}
	size_t end = i;
	char *out = malloc(end - start + 1);
	if (!out)
		return parse_nomem(p);
	size_t n = 0;
	for (size_t j = start; j < end;) {
		/* Every backslash in [start, end) has its escaped byte before end. */
		char c = s[j];
		if (c != '\\') {
			out[n++] = c;
			j++;
			continue;
		}
		char e = s[j + 1];
		if (q == '\'') {
			if (e == '\'' || e == '\\') {
				out[n++] = e;
				j += 2;
			} else {
				out[n++] = c;
				j++;
			}
			continue;
		}
		switch (e) {
		case '"': case '\\':
			out[n++] = e;
			break;
		case 'n':
			out[n++] = '\n';
			break;
		case 't':
			out[n++] = '\t';
			break;
		case 'r':
			out[n++] = '\r';
			break;
		case 'u': {
			size_t w = 0;
			int used = decode_u(s, j, end, out + n, &w);
			if (used < 0) {
				free(out);
				return parse_error(p, p->line,
						   "invalid \\u escape (4 hex digits, surrogates in pairs)");
			}
			n += w;
			j += (size_t)used;
			continue;
		}
		default: {
			char what[16];
			unsigned char ue = (unsigned char)e;
			if (ue > 0x20 && ue < 0x7f)
				snprintf(what, sizeof(what), "'\\%c'", e);
			else
				snprintf(what, sizeof(what), "byte 0x%02x", ue);
			free(out);
			return parse_error(p, p->line, "invalid escape %s in string", what);
		}
		}
		j += 2;
	}
	out[n] = '\0';
	if (n > CFG_MAX_SCALAR) {
		free(out);
		return parse_error(p, p->line, "string longer than %u bytes",
				   (unsigned)CFG_MAX_SCALAR);
	}
	p->pos = end + 1;
	*ret = out;
	*ret_len = n;
	return 0;
}

/* ---- parser ---------------------------------------------------------------------- */

static int parse_body(struct parser *p, struct cfg_node *obj, unsigned open_line, bool braced);
static int parse_value(struct parser *p, struct cfg_node *n);

/* Appends a new node to parent (whose last child link is **tail). */
static int node_add(struct parser *p, struct cfg_node *parent, struct cfg_node ***tail,
		    unsigned line, struct cfg_node **ret)
{
	if (p->nodes >= CFG_MAX_NODES)
		return parse_error(p, line, "more than %u keys and values", CFG_MAX_NODES);
	struct cfg_node *n = calloc(1, sizeof(*n));
	if (!n)
		return parse_nomem(p);
	p->nodes++;
	n->kind = CFG_SCALAR;
	n->file = p->file;
	n->line = line;
	n->parent = parent;
	**tail = n;
	*tail = &n->next;
	*ret = n;
	return 0;
}

static int open_container(struct parser *p)
{
	if (p->depth >= CFG_MAX_DEPTH)
		return parse_error(p, p->line, "nesting deeper than %d levels", CFG_MAX_DEPTH);
	p->depth++;
	return 0;
}

/* At '{': parses an object into n. */
static int parse_object(struct parser *p, struct cfg_node *n)
{
	int r = open_container(p);
	if (r < 0)
		return r;
	n->kind = CFG_OBJECT;
	unsigned open_line = p->line;
	p->pos++;
	r = parse_body(p, n, open_line, true);
	p->depth--;
	return r;
}

/* At '[': parses a list into n. */
static int parse_list(struct parser *p, struct cfg_node *n)
{
	struct cfg_node **tail = &n->child;
	char what[16];
	int r = open_container(p);
	if (r < 0)
		return r;
	n->kind = CFG_LIST;
	unsigned open_line = p->line;
	p->pos++;
	for (;;) {
		r = skip_space(p, NULL);
		if (r < 0)
			return r;
		if (at_eof(p))
			break;
		if (cur(p) == ']') {
			p->pos++;
			p->depth--;
			return 0;
		}
		struct cfg_node *e = NULL;
		r = node_add(p, n, &tail, p->line, &e);
		if (r < 0)
			return r;
		r = parse_value(p, e);
		if (r < 0)
			return r;
		bool nl;
		r = skip_space(p, &nl);
		if (r < 0)
			return r;
		if (at_eof(p))
			break;
		if (cur(p) == ',') {
			p->pos++;
		} else if (cur(p) != ']' && !nl) {
			return parse_error(p, p->line, "expected ',' or ']' in list, got %s",
					   describe(p, what, sizeof(what)));
		}
	}
	return parse_error(p, eof_line(p),
			   "unexpected end of file; the '[' on line %u is not closed", open_line);
}

/* Parses a value (scalar, object or list) at p->pos into n. */
static int parse_value(struct parser *p, struct cfg_node *n)
{
	char what[16];

	if (at_eof(p))
		return parse_error(p, eof_line(p), "unexpected end of file, expected a value");
	unsigned char c = cur(p);
	if (c == '{')
		return parse_object(p, n);
	if (c == '[')
		return parse_list(p, n);
	int r;
	if (c == '"' || c == '\'')
		r = lex_quoted(p, &n->value, &n->value_len);
	else if (is_word_start(c, false))
		r = lex_word(p, false, &n->value, &n->value_len);
	else
		return parse_error(p, p->line, "expected a value, got %s",
				   describe(p, what, sizeof(what)));
	if (r < 0)
		return r;
	n->kind = CFG_SCALAR;
	n->quoted = c == '"' || c == '\'';
	return 0;
}

/* After a scalar or list value of an entry: requires ';', ',', a newline, '}' or EOF. */
static int end_value(struct parser *p, const struct cfg_node *n)
{
	size_t end = p->pos;
	char what[16];
	bool nl;
	int r = skip_space(p, &nl);
	if (r < 0)
		return r;
	if (at_eof(p))
		return 0;
	unsigned char c = cur(p);
	if (c == ';' || c == ',') {
		p->pos++;
		return 0;
	}
	if (c == '}' || nl)
		return 0;
	if (n->kind == CFG_LIST && p->pos == end && is_word_char(c))
		return parse_error(p, p->line, "unexpected %s after a list; a value that starts "
				   "with '[' must be quoted, e.g. \"[host]:port\"",
				   describe(p, what, sizeof(what)));
	if (c == '{')
		return parse_error(p, p->line, "unexpected '{' after a value; a named object is "
				   "written key \"label\" { ... }");
	return parse_error(p, p->line, "expected ';', ',' or a newline after the value, got %s",
			   describe(p, what, sizeof(what)));
}

/* After an object: an optional ';' or ','. */
static int end_object(struct parser *p)
{
	int r = skip_space(p, NULL);
	if (r < 0)
		return r;
	if (!at_eof(p) && (cur(p) == ';' || cur(p) == ','))
		p->pos++;
	return 0;
}

static int check_name(struct parser *p, unsigned line, const char *what, const char *s,
		      size_t n)
{
	if (n == 0)
		return parse_error(p, line, "empty %s", what);
	if (memchr(s, '\0', n))
		return parse_error(p, line, "%s contains a NUL character", what);
	return 0;
}

/* Parses one "key ..." entry at p->pos into a new child of obj. */
static int parse_entry(struct parser *p, struct cfg_node *obj, struct cfg_node ***tail)
{
	unsigned line = p->line;
	unsigned char c = cur(p);
	char what[16], shown[80];
	struct cfg_node *n = NULL;
	char *key;
	size_t key_len;
	int r;

	if (c == '"' || c == '\'')
		r = lex_quoted(p, &key, &key_len);
	else if (is_word_start(c, true))
		r = lex_word(p, true, &key, &key_len);
	else
		return parse_error(p, line, "expected a key, got %s",
				   describe(p, what, sizeof(what)));
	if (r < 0)
		return r;
	r = node_add(p, obj, tail, line, &n);
	if (r < 0) {
		free(key);
		return r;
	}
	n->key = key;
	r = check_name(p, line, "key", key, key_len);
	if (r < 0)
		return r;

	bool nl;
	r = skip_space(p, &nl);
	if (r < 0)
		return r;
	c = at_eof(p) ? '\0' : cur(p);
	if (!at_eof(p) && (c == '=' || c == ':')) {
		p->pos++;
		r = skip_space(p, NULL);
		if (r < 0)
			return r;
	} else if (!at_eof(p) && c == '{') {
		/* key { ... }, the brace possibly on the next line */
	} else if (at_eof(p) || nl) {
		return parse_error(p, line, "missing value for key %s",
				   cfg_show_text(key, key_len, shown, sizeof(shown)));
	} else if (c == '"' || c == '\'') {
		/* key "label" { ... } or key "value" */
		unsigned sline = p->line;
		char *s;
		size_t slen;
		r = lex_quoted(p, &s, &slen);
		if (r < 0)
			return r;
		size_t after = p->pos;
		r = skip_space(p, NULL);
		if (r < 0) {
			free(s);
			return r;
		}
		if (!at_eof(p) && cur(p) == '{') {
			n->label = s;
			r = check_name(p, sline, "label", s, slen);
			if (r < 0)
				return r;
			r = parse_object(p, n);
			return r < 0 ? r : end_object(p);
		}
		/* A plain value: back up so that end_value() sees what followed it. */
		p->pos = after;
		p->line = sline;
		n->kind = CFG_SCALAR;
		n->value = s;
		n->value_len = slen;
		n->quoted = true;
		return end_value(p, n);
	}
	r = parse_value(p, n);
	if (r < 0)
		return r;
	return n->kind == CFG_OBJECT ? end_object(p) : end_value(p, n);
}

/* Parses entries into obj until '}' (braced) or the end of input (the document). */
static int parse_body(struct parser *p, struct cfg_node *obj, unsigned open_line, bool braced)
{
	struct cfg_node **tail = &obj->child;

	for (;;) {
		int r = skip_space(p, NULL);
		if (r < 0)
			return r;
		if (at_eof(p)) {
			if (braced)
				return parse_error(p, eof_line(p), "unexpected end of file; the '{' "
						   "on line %u is not closed", open_line);
			return 0;
		}
		if (cur(p) == '}') {
			if (!braced)
				return parse_error(p, p->line, "unexpected '}'");
			p->pos++;
			return 0;
		}
		r = parse_entry(p, obj, &tail);
		if (r < 0)
			return r;
	}
}

static void free_children(struct cfg_node *n)
{
	struct cfg_node *c = n->child;
	while (c) {
		struct cfg_node *next = c->next;
		free_children(c); /* depth <= CFG_MAX_DEPTH */
		free(c->key);
		free(c->label);
		free(c->value);
		free(c);
		c = next;
	}
}

struct cfg_node *cfg_free(struct cfg_node *root)
{
	if (!root)
		return NULL;
	free_children(root);
	free(root->key);
	free(root->label);
	free(root->value);
	free(root); /* also frees the file name, allocated with it */
	return NULL;
}

int cfg_parse(const char *file_name, const char *text, size_t len,
	      struct cfg_node **ret_root, char *err, size_t errlen)
{
	if (!file_name)
		file_name = "(config)";
	if (!text) {
		if (len > 0) {
			if (err && errlen > 0)
				snprintf(err, errlen, "%s: no text", file_name);
			return -EINVAL;
		}
		text = "";
	}
	size_t flen = strlen(file_name);
	struct cfg_node *root = calloc(1, sizeof(*root) + flen + 1);
	if (!root) {
		if (err && errlen > 0)
			snprintf(err, errlen, "%s: out of memory", file_name);
		return -ENOMEM;
	}
	char *fcopy = (char *)(root + 1);
	memcpy(fcopy, file_name, flen + 1);
	root->kind = CFG_OBJECT;
	root->file = fcopy;
	root->line = 1;

	struct parser p = {
		.file = fcopy, .text = text, .len = len, .line = 1, .err = err, .errlen = errlen,
	};
	const char *nul = len > 0 ? memchr(text, '\0', len) : NULL;
	int r;
	if (len > CFG_MAX_FILE)
		r = parse_error(&p, line_at(text, CFG_MAX_FILE), "input larger than %u bytes",
				CFG_MAX_FILE);
	else if (nul)
		r = parse_error(&p, line_at(text, (size_t)(nul - text)), "NUL byte in input");
	else
		r = parse_body(&p, root, 1, false);
	if (r < 0) {
		cfg_free(root);
		return r;
	}
	*ret_root = root;
	return 0;
}

int cfg_parse_file(const char *path, struct cfg_node **ret_root, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		int r = -errno;
		if (err && errlen > 0)
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
		return r;
	}
	/* Read at most one byte more than allowed, so that cfg_parse() reports the excess. */
	size_t max = (size_t)CFG_MAX_FILE + 1, cap = 65536, len = 0;
	struct stat st;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0 &&
	    (uintmax_t)st.st_size < max)
		cap = (size_t)st.st_size + 1;
	char *buf = malloc(cap);
	int r = buf ? 0 : -ENOMEM;
	while (r == 0 && len < max) {
		if (len == cap) {
			size_t ncap = cap * 2 < max ? cap * 2 : max;
			char *nbuf = realloc(buf, ncap);
			if (!nbuf) {
				r = -ENOMEM;
				break;
			}
			buf = nbuf;
			cap = ncap;
		}
		ssize_t n = read(fd, buf + len, cap - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (r < 0) {
		if (err && errlen > 0)
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
		free(buf);
		return r;
	}
	r = cfg_parse(path, buf, len, ret_root, err, errlen);
	free(buf);
	return r;
}

/* ---- lookup ---------------------------------------------------------------------- */

static cfg_lookup_hook_fn *lookup_hook;
static void *lookup_hook_arg;

void cfg_set_lookup_hook(cfg_lookup_hook_fn *fn, void *arg)
{
	lookup_hook = fn;
	lookup_hook_arg = arg;
}

/* The keys of obj's enclosing objects, outermost first, joined with '.'. */
static void block_path(const struct cfg_node *obj, char *buf, size_t len)
{
	const char *keys[CFG_MAX_DEPTH + 2];
	size_t k = 0;
	struct sbuf b;

	for (const struct cfg_node *a = obj; a && a->parent && k < ARRAY_SIZE(keys); a = a->parent)
		if (a->key)
			keys[k++] = a->key;
	sb_init(&b, buf, len);
	while (k > 0) {
		sb_puts(&b, keys[--k]);
		if (k > 0)
			sb_putc(&b, '.');
	}
}

struct cfg_node *cfg_get(struct cfg_node *obj, const char *key)
{
	if (!obj || obj->kind != CFG_OBJECT || !key)
		return NULL;
	if (lookup_hook) {
		char block[512];
		block_path(obj, block, sizeof(block));
		lookup_hook(lookup_hook_arg, block, key);
	}
	for (struct cfg_node *c = obj->child; c; c = c->next) {
		if (c->key && strcmp(c->key, key) == 0) {
			c->used = true;
			return c;
		}
	}
	return NULL;
}

/* Marks the node it returns used too: the schema walks repeated keys with it. */
struct cfg_node *cfg_next_same(struct cfg_node *n)
{
	if (!n || !n->key)
		return NULL;
	for (struct cfg_node *s = n->next; s; s = s->next) {
		if (s->key && strcmp(s->key, n->key) == 0) {
			s->used = true;
			return s;
		}
	}
	return NULL;
}

/* ---- paths and errors ------------------------------------------------------------ */

const char *cfg_path(const struct cfg_node *n, char *buf, size_t len)
{
	const struct cfg_node *chain[CFG_MAX_DEPTH + 2];
	size_t k = 0;
	bool cut = false;
	struct sbuf b;

	sb_init(&b, buf, len);
	for (const struct cfg_node *a = n; a && a->parent; a = a->parent) {
		if (k == ARRAY_SIZE(chain)) {
			cut = true; /* not from cfg_parse(); show the innermost part */
			break;
		}
		chain[k++] = a;
	}
	if (cut)
		sb_puts(&b, "...");
	bool first = !cut;
	while (k > 0) {
		const struct cfg_node *a = chain[--k];
		if (a->key) {
			if (!first)
				sb_putc(&b, '.');
			sb_put_escaped(&b, a->key, strlen(a->key), false);
			if (a->label) {
				sb_puts(&b, " \"");
				sb_put_escaped(&b, a->label, strlen(a->label), true);
				sb_putc(&b, '"');
			}
		} else {
			size_t i = 0;
			char idx[32];
			for (const struct cfg_node *s = a->parent->child; s && s != a; s = s->next)
				i++;
			snprintf(idx, sizeof(idx), "[%zu]", i);
			sb_puts(&b, idx);
		}
		first = false;
	}
	return buf;
}

void cfg_error(const struct cfg_node *n, char *err, size_t errlen, const char *fmt, ...)
{
	char path[512];
	int w;

	if (!err || errlen == 0)
		return;
	if (!n) {
		w = 0;
	} else {
		const char *file = n->file ? n->file : "(config)";
		cfg_path(n, path, sizeof(path));
		if (path[0])
			w = snprintf(err, errlen, "%s:%u: %s: ", file, n->line, path);
		else
			w = snprintf(err, errlen, "%s:%u: ", file, n->line);
	}
	if (w < 0 || (size_t)w >= errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err + w, errlen - (size_t)w, fmt, ap);
	va_end(ap);
}

static int check_unused(const struct cfg_node *obj, char *err, size_t errlen)
{
	for (const struct cfg_node *c = obj->child; c; c = c->next) {
		/* List elements are reached by walking the list, never by key. */
		if (obj->kind == CFG_OBJECT && !c->used) {
			cfg_error(c, err, errlen, "unknown key");
			return -EINVAL;
		}
		if (c->kind != CFG_SCALAR) {
			int r = check_unused(c, err, errlen); /* depth <= CFG_MAX_DEPTH */
			if (r < 0)
				return r;
		}
	}
	return 0;
}

int cfg_check_unused(const struct cfg_node *obj, char *err, size_t errlen)
{
	if (!obj || obj->kind == CFG_SCALAR)
		return 0;
	return check_unused(obj, err, errlen);
}
