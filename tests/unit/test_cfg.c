/*
 * test_cfg -- unit tests of the configuration parser (src/lib/cfg.c, cfg_convert.c).
 *
 * Table-driven: documents that parse, compared with a compact dump of the tree (which
 * shows every key's line); documents that do not, compared with the exact error; and
 * each converter's good and bad values.  The limits (depth, scalar length, input size,
 * NUL bytes) are tested at and just past the boundary.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cfg.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* A string literal and its length, so that tables can hold NUL bytes. */
#define LIT(s) s, sizeof(s) - 1

struct dump {
	char buf[8192];
	size_t pos;
};

static void dump_putc(struct dump *d, char c)
{
	assert_true(d->pos + 1 < sizeof(d->buf));
	d->buf[d->pos++] = c;
	d->buf[d->pos] = '\0';
}

static void dump_printf(struct dump *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void dump_printf(struct dump *d, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int w = vsnprintf(d->buf + d->pos, sizeof(d->buf) - d->pos, fmt, ap);
	va_end(ap);
	assert_true(w >= 0 && (size_t)w < sizeof(d->buf) - d->pos);
	d->pos += (size_t)w;
}

static void dump_text(struct dump *d, const char *s, size_t n, bool quote)
{
	if (quote)
		dump_putc(d, '"');
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			dump_printf(d, "\\x%02x", c);
		else if (quote && (c == '"' || c == '\\'))
			dump_printf(d, "\\%c", c);
		else
			dump_putc(d, (char)c);
	}
	if (quote)
		dump_putc(d, '"');
}

/*
 * Dump format: an object's children separated by spaces, each KEY[ "LABEL"]@LINE=VALUE;
 * objects in {}, lists in [] with elements separated by ','; quoted scalars in "" (with
 * \" \\ \xNN), bare scalars as they are.  The root has no braces.
 */
static void dump_node(struct dump *d, const struct cfg_node *n)
{
	const struct cfg_node *c;

	switch (n->kind) {
	case CFG_SCALAR:
		assert_non_null(n->value);
		assert_int_equal(n->value[n->value_len], '\0');
		dump_text(d, n->value, n->value_len, n->quoted);
		break;
	case CFG_OBJECT:
		if (n->parent)
			dump_putc(d, '{');
		for (c = n->child; c; c = c->next) {
			assert_ptr_equal(c->parent, n);
			assert_non_null(c->key);
			dump_text(d, c->key, strlen(c->key), false);
			if (c->label) {
				dump_putc(d, ' ');
				dump_text(d, c->label, strlen(c->label), true);
			}
			dump_printf(d, "@%u=", c->line);
			dump_node(d, c);
			if (c->next)
				dump_putc(d, ' ');
		}
		if (n->parent)
			dump_putc(d, '}');
		break;
	case CFG_LIST:
		dump_putc(d, '[');
		for (c = n->child; c; c = c->next) {
			assert_ptr_equal(c->parent, n);
			assert_null(c->key);
			dump_node(d, c);
			if (c->next)
				dump_putc(d, ',');
		}
		dump_putc(d, ']');
		break;
	}
}

static struct cfg_node *parse_ok(const char *text, size_t len)
{
	struct cfg_node *root = NULL;
	char err[512] = "";
	int r = cfg_parse("t.conf", text, len, &root, err, sizeof(err));
	if (r != 0)
		fail_msg("parse failed (%d): %s\n--- input:\n%.*s", r, err, (int)len, text);
	assert_non_null(root);
	assert_int_equal(root->kind, CFG_OBJECT);
	assert_string_equal(root->file, "t.conf");
	return root;
}

/* ---- valid documents ------------------------------------------------------------- */

static const struct {
	const char *text;
	size_t len;
	const char *tree;
} valid[] = {
	{ LIT(""), "" },
	{ LIT("# only a comment\n"), "" },
	{ LIT("  \n\t\r\n"), "" },
	{ LIT("a = 1;"), "a@1=1" },
	{ LIT("a 1"), "a@1=1" },
	{ LIT("a: 1\nb:2\nc=3,d=4"), "a@1=1 b@2=2 c@3=3 d@3=4" },
	{ LIT("a = 1;\r\nb = 2\r\n"), "a@1=1 b@2=2" },
	{ LIT("listen = inet:127.0.0.1:10031;"), "listen@1=inet:127.0.0.1:10031" },
	{ LIT("a:inet:1:2"), "a@1=inet:1:2" },
	{ LIT("t = 5m; m = 0660; h = *.example.edu; n = 192.0.2.0/24"),
	  "t@1=5m m@1=0660 h@1=*.example.edu n@1=192.0.2.0/24" },
	{ LIT("u = unix://x; p = /var/lib/x; w = a-b_c.d@e+f!g%h~i$j?k"),
	  "u@1=unix://x p@1=/var/lib/x w@1=a-b_c.d@e+f!g%h~i$j?k" },
	{ LIT("x = inet6:[::1]:25"), "x@1=inet6:[::1]:25" },
	{ LIT("x = a[b"), "x@1=a[b" },
	{ LIT("n = caf\xc3\xa9"), "n@1=caf\xc3\xa9" },
	{ LIT("s = \"[smtp.example.net]:587\";"), "s@1=\"[smtp.example.net]:587\"" },
	{ LIT("hosts = [\"*.example.edu\", \"192.0.2.0/24\"];"),
	  "hosts@1=[\"*.example.edu\",\"192.0.2.0/24\"]" },
	{ LIT("l = [a, b, inet6:[::1]:25, c]"), "l@1=[a,b,inet6:[::1]:25,c]" },
	{ LIT("l = [a,]"), "l@1=[a]" },
	{ LIT("l = []; m = [ ]"), "l@1=[] m@1=[]" },
	{ LIT("l = [\n  a\n  b,\n  c\n]\nm = 1"), "l@1=[a,b,c] m@6=1" },
	{ LIT("l = [[a], [], [[b]]]"), "l@1=[[a],[],[[b]]]" },
	{ LIT("r = [{a=1}, { b = 2; c = 3 }]"), "r@1=[{a@1=1},{b@1=2 c@1=3}]" },
	{ LIT("l = [a]\nb = 1"), "l@1=[a] b@2=1" },
	{ LIT("log { level = info }"), "log@1={level@1=info}" },
	{ LIT("log = { }; log2: {}"), "log@1={} log2@1={}" },
	{ LIT("log\n{\n  a = 1\n}\n"), "log@1={a@3=1}" },
	{ LIT("a {} b {}; c { d { e = f } }"), "a@1={} b@1={} c@1={d@1={e@1=f}}" },
	{ LIT("class \"campus\" { sessions = 8; }"), "class \"campus\"@1={sessions@1=8}" },
	{ LIT("class 'x y'\n{\n}"), "class \"x y\"@1={}" },
	{ LIT("k \"v\";"), "k@1=\"v\"" },
	{ LIT("k \"v\"\nother 1"), "k@1=\"v\" other@2=1" },
	{ LIT("s = \"\""), "s@1=\"\"" },
	{ LIT("\"my key\" = 1; 'k2': 2"), "my key@1=1 k2@1=2" },
	{ LIT("s = \"a\\\"b\\\\c\\n\\t\\r\\u00e9\\ud83d\\ude00\""),
	  "s@1=\"a\\\"b\\\\c\\x0a\\x09\\x0d\xc3\xa9\xf0\x9f\x98\x80\"" },
	{ LIT("s = \"\\u0041\\u07ff\\uffff\""), "s@1=\"A\xdf\xbf\xef\xbf\xbf\"" },
	{ LIT("s = 'a\\'b\\\\c\\nd\"'"), "s@1=\"a'b\\\\c\\\\nd\\\"\"" },
	{ LIT("s = \"a\\u0000b\""), "s@1=\"a\\x00b\"" },
	{ LIT("a = 1 # c\nb = 2 // c\nc /* x */ = 3; /* multi\nline */ d = 4"),
	  "a@1=1 b@2=2 c@3=3 d@4=4" },
	{ LIT("a = 1 /* a\ncomment */ b = 2"), "a@1=1 b@2=2" },
	{ LIT("a = x#c\n"), "a@1=x" },
	{ LIT("a = x//c\n"), "a@1=x//c" },
	{ LIT("o { a = 1 }"), "o@1={a@1=1}" },
	{ LIT("o { a = [1] }"), "o@1={a@1=[1]}" },
	{ LIT("a = 1; a = 2"), "a@1=1 a@1=2" },
	{ LIT("key =\n  value"), "key@1=value" },
	{ LIT("a=b"), "a@1=b" },
	{ LIT("a = :b"), "a@1=:b" },
	{ LIT("a :b"), "a@1=b" },
	{ LIT("a = 1,\nb = 2,"), "a@1=1 b@2=2" },
};

static void test_valid(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(valid); i++) {
		struct cfg_node *root = parse_ok(valid[i].text, valid[i].len);
		struct dump d = { .pos = 0 };
		d.buf[0] = '\0';
		dump_node(&d, root);
		if (strcmp(d.buf, valid[i].tree) != 0)
			fail_msg("case %zu: %s\n  got      %s\n  expected %s", i, valid[i].text,
				 d.buf, valid[i].tree);
		assert_null(cfg_free(root));
	}
}

/* A label on the key's line, its '{' on the next. */
static void test_label_brace_next_line(void **state)
{
	(void)state;
	struct cfg_node *root = parse_ok(LIT("k \"v\" # c\n{ a = 1 }"));
	struct cfg_node *k = cfg_get(root, "k");
	assert_non_null(k);
	assert_int_equal(k->kind, CFG_OBJECT);
	assert_string_equal(k->label, "v");
	cfg_free(root);
}

/* A realistic sluice.conf, checked through the lookup API. */
static void test_design_example(void **state)
{
	static const char text[] =
		"workers = 2;                               # default: number of CPUs\n"
		"user = \"sluice\";\n"
		"log { target = \"syslog\"; facility = \"mail\"; level = \"info\"; }\n"
		"control { listen = \"unix:/run/sluice/control.sock\"; mode = \"0660\"; }\n"
		"class \"campus\"  { hosts = [\"*.example.edu\", \"192.0.2.0/24\"]; sessions = 8; }\n"
		"class \"default\" { hosts = [\"*\"]; sessions = 3; inbound = 3; }\n"
		"limit \"per-recipient-domain\" {\n"
		"  stage = \"rcpt\";  key = \"rcpt_domain\";  count = \"messages\";\n"
		"  rate = [\"10/1m\", \"500/1d\"];\n"
		"  reply = \"451 4.7.1 Too much mail for %{key}; try again in %{retry}\";\n"
		"  except { client_ip = [\"127.0.0.0/8\"]; }\n"
		"}\n"
		"queue  { dir = \"/var/spool/sluice\"; lifetime = 5d; }\n"
		"route \"isp\" {\n"
		"  domains = [\"*\"];  smarthost = \"[smtp.example.net]:587\";\n"
		"  auth { user = \"me\"; password_file = \"/etc/sluice/isp.secret\"; }\n"
		"  rate = [\"8/1m\"];  connections = 1;\n"
		"}\n";
	char err[256], path[128];
	const char *s;
	int64_t v;
	(void)state;
	struct cfg_node *root = parse_ok(text, sizeof(text) - 1);

	assert_int_equal(cfg_int64(cfg_get(root, "workers"), 1, 1024, &v, err, sizeof(err)), 0);
	assert_int_equal(v, 2);
	struct cfg_node *cls = cfg_get(root, "class");
	assert_non_null(cls);
	assert_string_equal(cls->label, "campus");
	assert_int_equal(cls->line, 5);
	struct cfg_node *hosts = cfg_get(cls, "hosts");
	assert_int_equal(hosts->kind, CFG_LIST);
	assert_int_equal(cfg_string(hosts->child->next, &s, err, sizeof(err)), 0);
	assert_string_equal(s, "192.0.2.0/24");
	assert_string_equal(cfg_path(hosts->child->next, path, sizeof(path)),
			    "class \"campus\".hosts[1]");
	struct cfg_node *def = cfg_next_same(cls);
	assert_string_equal(def->label, "default");
	assert_null(cfg_next_same(def));
	struct cfg_node *q = cfg_get(root, "queue");
	assert_int_equal(cfg_duration_ms(cfg_get(q, "lifetime"), 0, INT64_MAX, &v, err,
					 sizeof(err)), 0);
	assert_int_equal(v, 5 * 86400 * 1000LL);
	struct cfg_node *route = cfg_get(root, "route");
	assert_int_equal(cfg_string(cfg_get(route, "smarthost"), &s, err, sizeof(err)), 0);
	assert_string_equal(s, "[smtp.example.net]:587");
	struct cfg_node *auth = cfg_get(route, "auth");
	assert_int_equal(auth->line, 16);
	struct cfg_node *reply = cfg_get(cfg_get(root, "limit"), "reply");
	assert_int_equal(cfg_string(reply, &s, err, sizeof(err)), 0);
	assert_string_equal(s, "451 4.7.1 Too much mail for %{key}; try again in %{retry}");
	cfg_free(root);
}

/* ---- invalid documents ----------------------------------------------------------- */

static const struct {
	const char *text;
	size_t len;
	const char *err;
} invalid[] = {
	{ LIT("a = 1 b = 2"), "t.conf:1: expected ';', ',' or a newline after the value, got 'b'" },
	{ LIT("a = \"x\" \"y\""), "t.conf:1: expected ';', ',' or a newline after the value, got '\"'" },
	{ LIT("a = x]"), "t.conf:1: expected ';', ',' or a newline after the value, got ']'" },
	{ LIT("a = [x] [y]"), "t.conf:1: expected ';', ',' or a newline after the value, got '['" },
	{ LIT("a = 1\nb {\n c = 2\n d = 3 4\n}"),
	  "t.conf:4: expected ';', ',' or a newline after the value, got '4'" },
	{ LIT("a = b\x01"), "t.conf:1: expected ';', ',' or a newline after the value, got byte 0x01" },
	{ LIT("a = \"x"), "t.conf:1: unterminated string" },
	{ LIT("\na = 'x\ny'"), "t.conf:2: unterminated string" },
	{ LIT("a = \"x\\\"\n"), "t.conf:1: unterminated string" },
	{ LIT("a = 'x\\'"), "t.conf:1: unterminated string" },
	{ LIT("a = \"x\\"), "t.conf:1: unterminated string" },
	{ LIT("\n\n/* x\n"), "t.conf:3: unterminated comment" },
	{ LIT("a = 1 /*/"), "t.conf:1: unterminated comment" },
	{ LIT("a {\n b = 1\n"), "t.conf:2: unexpected end of file; the '{' on line 1 is not closed" },
	{ LIT("a {\n b {\n c = 1\n}"),
	  "t.conf:4: unexpected end of file; the '{' on line 1 is not closed" },
	{ LIT("a = [1,\n2\n"), "t.conf:2: unexpected end of file; the '[' on line 1 is not closed" },
	{ LIT("a = ["), "t.conf:1: unexpected end of file; the '[' on line 1 is not closed" },
	{ LIT("}"), "t.conf:1: unexpected '}'" },
	{ LIT("a = 1 }"), "t.conf:1: unexpected '}'" },
	{ LIT("a\n"), "t.conf:1: missing value for key \"a\"" },
	{ LIT("a"), "t.conf:1: missing value for key \"a\"" },
	{ LIT("foo\nbar = 1"), "t.conf:1: missing value for key \"foo\"" },
	{ LIT("a # c\n"), "t.conf:1: missing value for key \"a\"" },
	{ LIT("a ="), "t.conf:1: unexpected end of file, expected a value" },
	{ LIT("a =\n\n"), "t.conf:2: unexpected end of file, expected a value" },
	{ LIT("a = ;"), "t.conf:1: expected a value, got ';'" },
	{ LIT("o { a = }"), "t.conf:1: expected a value, got '}'" },
	{ LIT("a = &"), "t.conf:1: expected a value, got '&'" },
	{ LIT("a = ]"), "t.conf:1: expected a value, got ']'" },
	{ LIT("a = \x7f"), "t.conf:1: expected a value, got byte 0x7f" },
	{ LIT("= 1"), "t.conf:1: expected a key, got '='" },
	{ LIT("[a] = 1"), "t.conf:1: expected a key, got '['" },
	{ LIT(":a = 1"), "t.conf:1: expected a key, got ':'" },
	{ LIT("{ a = 1 }"), "t.conf:1: expected a key, got '{'" },
	{ LIT("a = 1;;"), "t.conf:1: expected a key, got ';'" },
	{ LIT("\"\" = 1"), "t.conf:1: empty key" },
	{ LIT("\"a\\u0000\" = 1"), "t.conf:1: key contains a NUL character" },
	{ LIT("c \"\" { }"), "t.conf:1: empty label" },
	{ LIT("c\t\"\\u0000\" { }"), "t.conf:1: label contains a NUL character" },
	{ LIT("class campus { }"),
	  "t.conf:1: unexpected '{' after a value; a named object is written key \"label\" { ... }" },
	{ LIT("class = \"campus\" { }"),
	  "t.conf:1: unexpected '{' after a value; a named object is written key \"label\" { ... }" },
	{ LIT("s = [smtp.example.net]:587;"),
	  "t.conf:1: unexpected ':' after a list; a value that starts with '[' must be quoted, "
	  "e.g. \"[host]:port\"" },
	{ LIT("s = \"\\q\""), "t.conf:1: invalid escape '\\q' in string" },
	{ LIT("s = \"\\'\""), "t.conf:1: invalid escape '\\'' in string" },
	{ LIT("s = \"\\\t\""), "t.conf:1: invalid escape byte 0x09 in string" },
	{ LIT("s = \"\\ud800\""), "t.conf:1: invalid \\u escape (4 hex digits, surrogates in pairs)" },
	{ LIT("s = \"\\ud800\\u0041\""),
	  "t.conf:1: invalid \\u escape (4 hex digits, surrogates in pairs)" },
	{ LIT("s = \"\\udc00\""), "t.conf:1: invalid \\u escape (4 hex digits, surrogates in pairs)" },
	{ LIT("s = \"\\u12\""), "t.conf:1: invalid \\u escape (4 hex digits, surrogates in pairs)" },
	{ LIT("s = \"\\u12g4\""), "t.conf:1: invalid \\u escape (4 hex digits, surrogates in pairs)" },
	{ LIT("l = [a; b]"), "t.conf:1: expected ',' or ']' in list, got ';'" },
	{ LIT("l = [a b]"), "t.conf:1: expected ',' or ']' in list, got 'b'" },
	{ LIT("l = [{a = 1} b]"), "t.conf:1: expected ',' or ']' in list, got 'b'" },
	{ LIT("l = [,]"), "t.conf:1: expected a value, got ','" },
	{ LIT("l = [a,,b]"), "t.conf:1: expected a value, got ','" },
	{ LIT("l = [\"x\" { }]"), "t.conf:1: expected ',' or ']' in list, got '{'" },
	{ LIT("a = 1\nb = \0"), "t.conf:2: NUL byte in input" },
	{ LIT("# \0 in a comment"), "t.conf:1: NUL byte in input" },
	{ LIT("a = \"x\0y\""), "t.conf:1: NUL byte in input" },
	{ LIT("\0"), "t.conf:1: NUL byte in input" },
};

static void test_invalid(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(invalid); i++) {
		struct cfg_node *root = (struct cfg_node *)&root; /* must stay untouched */
		struct cfg_node *sentinel = root;
		char err[512] = "";
		int r = cfg_parse("t.conf", invalid[i].text, invalid[i].len, &root, err,
				  sizeof(err));
		if (r != -EINVAL || strcmp(err, invalid[i].err) != 0)
			fail_msg("case %zu: %s\n  got      %d %s\n  expected %s", i, invalid[i].text,
				 r, err, invalid[i].err);
		assert_ptr_equal(root, sentinel);
	}
}

/* Errors are truncated safely to any buffer size, including none at all. */
static void test_error_truncation(void **state)
{
	(void)state;
	struct cfg_node *root = NULL;
	char err[8];
	memset(err, 'x', sizeof(err));
	assert_int_equal(cfg_parse("t.conf", LIT("a = ;"), &root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:");
	assert_int_equal(cfg_parse("t.conf", LIT("a = ;"), &root, err, 1), -EINVAL);
	assert_string_equal(err, "");
	assert_int_equal(cfg_parse("t.conf", LIT("a = ;"), &root, NULL, 0), -EINVAL);
	assert_null(root);
	/* a NULL text is an empty document, or an error if it claims a length */
	char big[64];
	assert_int_equal(cfg_parse("t.conf", NULL, 1, &root, big, sizeof(big)), -EINVAL);
	assert_string_equal(big, "t.conf: no text");
	assert_null(root);
	assert_int_equal(cfg_parse(NULL, NULL, 0, &root, NULL, 0), 0);
	assert_string_equal(root->file, "(config)");
	assert_null(root->child);
	cfg_free(root);
	assert_null(cfg_free(NULL));
}

/* ---- limits ---------------------------------------------------------------------- */

/* depth objects "a {\n" nested, one per line, or lists "[" on one line. */
static char *nested(unsigned depth, bool list)
{
	size_t cap = 16 + (size_t)depth * 8;
	char *s = malloc(cap);
	size_t n = 0;
	assert_non_null(s);
	if (list)
		n += (size_t)snprintf(s, cap, "a = ");
	for (unsigned i = 0; i < depth; i++)
		n += (size_t)snprintf(s + n, cap - n, "%s", list ? "[" : "a {\n");
	for (unsigned i = 0; i < depth; i++)
		n += (size_t)snprintf(s + n, cap - n, "%s", list ? "]" : "}\n");
	return s;
}

static void test_depth(void **state)
{
	(void)state;
	char err[256];
	struct cfg_node *root = NULL;

	for (int list = 0; list <= 1; list++) {
		char *s = nested(CFG_MAX_DEPTH, list);
		root = parse_ok(s, strlen(s));
		unsigned depth = 0;
		const struct cfg_node *n = root;
		while (n->child) {
			n = n->child;
			depth++;
		}
		assert_int_equal(depth, list ? CFG_MAX_DEPTH : CFG_MAX_DEPTH);
		cfg_free(root);
		free(s);

		s = nested(CFG_MAX_DEPTH + 1, list);
		root = NULL;
		assert_int_equal(cfg_parse("t.conf", s, strlen(s), &root, err, sizeof(err)),
				 -EINVAL);
		assert_null(root);
		assert_string_equal(err, list ? "t.conf:1: nesting deeper than 32 levels"
					      : "t.conf:33: nesting deeper than 32 levels");
		free(s);
	}
	/* far deeper than the limit: no stack trouble, the same error */
	char *s = nested(100000, true);
	assert_int_equal(cfg_parse("t.conf", s, strlen(s), &root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:1: nesting deeper than 32 levels");
	free(s);
}

static void test_scalar_length(void **state)
{
	(void)state;
	char err[256];
	struct cfg_node *root = NULL;
	size_t cap = 2 * CFG_MAX_SCALAR + 64;
	char *s = malloc(cap);
	assert_non_null(s);

	/* a bare word of exactly the limit, then one byte more */
	memcpy(s, "\na = ", 5);
	memset(s + 5, 'x', CFG_MAX_SCALAR + 1);
	root = parse_ok(s, 5 + CFG_MAX_SCALAR);
	assert_int_equal(cfg_get(root, "a")->value_len, CFG_MAX_SCALAR);
	cfg_free(root);
	root = NULL;
	assert_int_equal(cfg_parse("t.conf", s, 5 + CFG_MAX_SCALAR + 1, &root, err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "t.conf:2: word longer than 65536 bytes");

	/* the limit applies to the unescaped text: 65536 "\n" is 131072 bytes of input */
	size_t n = 0;
	s[n++] = 'a';
	s[n++] = '"';
	for (size_t i = 0; i < CFG_MAX_SCALAR; i++) {
		s[n++] = '\\';
		s[n++] = 'n';
	}
	s[n++] = '"';
	root = parse_ok(s, n);
	assert_int_equal(cfg_get(root, "a")->value_len, CFG_MAX_SCALAR);
	cfg_free(root);
	root = NULL;
	memmove(s + 3, s + 2, n - 2);
	s[2] = 'x'; /* one more byte of text */
	n++;
	assert_int_equal(cfg_parse("t.conf", s, n, &root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:1: string longer than 65536 bytes");

	/* keys have the same limit */
	memset(s, 'k', CFG_MAX_SCALAR + 1);
	memcpy(s + CFG_MAX_SCALAR + 1, " = 1", 4);
	assert_int_equal(cfg_parse("t.conf", s, CFG_MAX_SCALAR + 5, &root, err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "t.conf:1: word longer than 65536 bytes");
	assert_null(root);
	free(s);
}

static void test_file_size(void **state)
{
	(void)state;
	char err[256];
	struct cfg_node *root = NULL;
	size_t len = CFG_MAX_FILE + 1;
	char *s = malloc(len);
	assert_non_null(s);
	memset(s, ' ', len);
	s[0] = '\n';
	s[len - 1] = '\n';
	root = parse_ok(s, CFG_MAX_FILE);
	cfg_free(root);
	root = NULL;
	assert_int_equal(cfg_parse("t.conf", s, len, &root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:2: input larger than 16777216 bytes");
	assert_null(root);
	free(s);
}

static void test_node_limit(void **state)
{
	(void)state;
	char err[256];
	struct cfg_node *root = NULL;
	size_t count = 1000000, len = 0;
	char *s = malloc(2 * count + 16);
	assert_non_null(s);
	len += (size_t)sprintf(s, "a = [\n");
	for (size_t i = 0; i < count; i++) {
		s[len++] = '1';
		s[len++] = ',';
	}
	s[len++] = ']';
	assert_int_equal(cfg_parse("t.conf", s, len, &root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:2: more than 1000000 keys and values");
	assert_null(root);
	/* one element fewer fits */
	s[len - 3] = ']';
	root = parse_ok(s, len - 2);
	cfg_free(root);
	free(s);
}

/* ---- converters ------------------------------------------------------------------ */

/* Parses "v = VALUE" (VALUE as written in the table) and returns node v. */
static struct cfg_node *value_node(struct cfg_node **ret_root, const char *value, size_t len)
{
	char text[256];
	assert_true(len + 4 < sizeof(text));
	memcpy(text, "v = ", 4);
	memcpy(text + 4, value, len);
	*ret_root = parse_ok(text, len + 4);
	struct cfg_node *v = cfg_get(*ret_root, "v");
	assert_non_null(v);
	return v;
}

#define IMAX INT64_MAX
#define IMIN INT64_MIN

static const struct {
	const char *value;
	size_t len;
	int64_t min, max, want; /* want is used when err is NULL */
	const char *err;
} int64_cases[] = {
	{ LIT("0"), IMIN, IMAX, 0, NULL },
	{ LIT("42"), IMIN, IMAX, 42, NULL },
	{ LIT("-42"), IMIN, IMAX, -42, NULL },
	{ LIT("+7"), IMIN, IMAX, 7, NULL },
	{ LIT("-0"), IMIN, IMAX, 0, NULL },
	{ LIT("\"42\""), IMIN, IMAX, 42, NULL },
	{ LIT("10k"), IMIN, IMAX, 10000, NULL },
	{ LIT("10K"), IMIN, IMAX, 10000, NULL },
	{ LIT("1M"), IMIN, IMAX, 1000000, NULL },
	{ LIT("1m"), IMIN, IMAX, 1000000, NULL },
	{ LIT("-2g"), IMIN, IMAX, -2000000000, NULL },
	{ LIT("2G"), IMIN, IMAX, 2000000000, NULL },
	/* binary units (sluice.conf(5) UNITS) */
	{ LIT("10Ki"), IMIN, IMAX, 10240, NULL },
	{ LIT("1Mi"), IMIN, IMAX, 1048576, NULL },
	{ LIT("2Gi"), IMIN, IMAX, 2147483648, NULL },
	{ LIT("4KiB"), IMIN, IMAX, 4096, NULL },
	{ LIT("1MiB"), IMIN, IMAX, 1048576, NULL },
	{ LIT("1GiB"), IMIN, IMAX, 1073741824, NULL },
	{ LIT("-1Ki"), IMIN, IMAX, -1024, NULL },
	{ LIT("9223372036854775807"), IMIN, IMAX, IMAX, NULL },
	{ LIT("-9223372036854775808"), IMIN, IMAX, IMIN, NULL },
	{ LIT("8589934591Gi"), IMIN, IMAX, 8589934591 * 1073741824, NULL },
	/* kb, mb, gb meant 2^10.. here: refused, naming both spellings */
	{ LIT("10kb"), IMIN, IMAX, 0,
	  "t.conf:1: v: \"10kb\" is ambiguous: write 10Ki (10240) or 10k (10000)" },
	{ LIT("1mb"), IMIN, IMAX, 0,
	  "t.conf:1: v: \"1mb\" is ambiguous: write 1Mi (1048576) or 1M (1000000)" },
	{ LIT("2GB"), IMIN, IMAX, 0,
	  "t.conf:1: v: \"2GB\" is ambiguous: write 2Gi (2147483648) or 2G (2000000000)" },
	{ LIT("-3kB"), IMIN, IMAX, 0,
	  "t.conf:1: v: \"-3kB\" is ambiguous: write -3Ki (-3072) or -3k (-3000)" },
	{ LIT("2kb"), 0, 2047, 0, "t.conf:1: v: \"2kb\" is ambiguous: write 2k (2000)" },
	{ LIT("3kb"), 0, 2047, 0,
	  "t.conf:1: v: \"3kb\" is ambiguous, and out of range [0, 2047] either way" },
	{ LIT("10"), 10, 20, 10, NULL },
	{ LIT("20"), 10, 20, 20, NULL },
	{ LIT("9"), 10, 20, 0,
	  "t.conf:1: v: \"9\" is out of range [10, 20]" },
	{ LIT("21"), 10, 20, 0,
	  "t.conf:1: v: \"21\" is out of range [10, 20]" },
	{ LIT("9223372036854775808"), IMIN, IMAX, 0,
	  "t.conf:1: v: \"9223372036854775808\" is out of range "
	  "[-9223372036854775808, 9223372036854775807]" },
	{ LIT("-9223372036854775809"), IMIN, IMAX, 0,
	  "t.conf:1: v: \"-9223372036854775809\" is out of range "
	  "[-9223372036854775808, 9223372036854775807]" },
	{ LIT("99999999999999999999999"), 0, 100, 0,
	  "t.conf:1: v: \"99999999999999999999999\" is out of range [0, 100]" },
	{ LIT("9223372036854775807k"), 0, 100, 0,
	  "t.conf:1: v: \"9223372036854775807k\" is out of range [0, 100]" },
	{ LIT("8589934592Gi"), 0, 100, 0,
	  "t.conf:1: v: \"8589934592Gi\" is out of range [0, 100]" },
	{ LIT("10ki"), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), got \"10ki\"" },
	{ LIT("0660"), 0, 100, 0,
	  "t.conf:1: v: \"0660\": leading zeros are not allowed (octal is not supported)" },
	{ LIT("1.5"), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), "
	  "got \"1.5\"" },
	{ LIT("\"\""), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), "
	  "got \"\"" },
	{ LIT("k"), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), "
	  "got \"k\"" },
	{ LIT("10kib"), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), "
	  "got \"10kib\"" },
	{ LIT("10kx"), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), "
	  "got \"10kx\"" },
	{ LIT("--1"), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), "
	  "got \"--1\"" },
	{ LIT("\" 1\""), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), "
	  "got \" 1\"" },
	{ LIT("\"1\\u0000\""), 0, 100, 0,
	  "t.conf:1: v: expected an integer (with an optional unit: k, M, G for 10^3, 10^6, "
	  "10^9; Ki, Mi, Gi for 2^10, 2^20, 2^30), "
	  "got \"1\\x00\"" },
	{ LIT("{ }"), 0, 100, 0, "t.conf:1: v: expected an integer, not an object" },
	{ LIT("[1]"), 0, 100, 0, "t.conf:1: v: expected an integer, not a list" },
};

static void test_int64(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(int64_cases); i++) {
		struct cfg_node *root;
		struct cfg_node *v = value_node(&root, int64_cases[i].value, int64_cases[i].len);
		char err[256] = "";
		int64_t got = 12345;
		int r = cfg_int64(v, int64_cases[i].min, int64_cases[i].max, &got, err, sizeof(err));
		if (int64_cases[i].err) {
			if (r != -EINVAL || strcmp(err, int64_cases[i].err) != 0)
				fail_msg("case %zu: %s: got %d %s", i, int64_cases[i].value, r, err);
			assert_int_equal(got, 12345);
		} else {
			if (r != 0)
				fail_msg("case %zu: %s: %s", i, int64_cases[i].value, err);
			assert_int_equal(got, int64_cases[i].want);
		}
		cfg_free(root);
	}
}

static const struct {
	const char *value;
	size_t len;
	int64_t min, max, want;
	const char *err;
} duration_cases[] = {
	{ LIT("250ms"), 0, IMAX, 250, NULL },
	{ LIT("30s"), 0, IMAX, 30000, NULL },
	{ LIT("5m"), 0, IMAX, 300000, NULL },
	{ LIT("2h"), 0, IMAX, 7200000, NULL },
	{ LIT("1d"), 0, IMAX, 86400000, NULL },
	{ LIT("1w"), 0, IMAX, 604800000, NULL },
	{ LIT("90"), 0, IMAX, 90000, NULL },
	{ LIT("0"), 0, IMAX, 0, NULL },
	{ LIT("\"1h30m\""), 0, IMAX, 5400000, NULL },
	{ LIT("1h30m"), 0, IMAX, 5400000, NULL },
	{ LIT("1m30s"), 0, IMAX, 90000, NULL },
	{ LIT("1s500ms"), 0, IMAX, 1500, NULL },
	{ LIT("1w2d3h4m5s6ms"), 0, IMAX, 604800000 + 2 * 86400000 + 3 * 3600000 + 4 * 60000 +
	  5000 + 6, NULL },
	{ LIT("007s"), 0, IMAX, 7000, NULL },
	{ LIT("9223372036854775807ms"), 0, IMAX, IMAX, NULL },
	{ LIT("15250284452w3d"), 0, IMAX, 9223372036828800000, NULL },
	{ LIT("15250284452w4d"), 0, IMAX, 0,
	  "t.conf:1: v: \"15250284452w4d\" is out of range [0ms, 9223372036854775807ms]" },
	{ LIT("9223372036854775808ms"), 0, IMAX, 0,
	  "t.conf:1: v: \"9223372036854775808ms\" is out of range [0ms, 9223372036854775807ms]" },
	{ LIT("9223372036854775807"), 0, IMAX, 0,
	  "t.conf:1: v: \"9223372036854775807\" is out of range [0ms, 9223372036854775807ms]" },
	{ LIT("106751991167w"), 0, IMAX, 0,
	  "t.conf:1: v: \"106751991167w\" is out of range [0ms, 9223372036854775807ms]" },
	{ LIT("999ms"), 1000, 3600000, 0, "t.conf:1: v: \"999ms\" is out of range [1s, 1h]" },
	{ LIT("61m"), 1000, 3600000, 0, "t.conf:1: v: \"61m\" is out of range [1s, 1h]" },
	{ LIT("1ms"), 1500, 90000, 0, "t.conf:1: v: \"1ms\" is out of range [1500ms, 90s]" },
	{ LIT("30m1h"), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"30m1h\"" },
	{ LIT("1h1h"), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"1h1h\"" },
	{ LIT("1h30"), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"1h30\"" },
	{ LIT("5M"), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"5M\"" },
	{ LIT("1.5h"), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"1.5h\"" },
	{ LIT("-5s"), IMIN, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"-5s\"" },
	{ LIT("\"\""), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"\"" },
	{ LIT("s"), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"s\"" },
	{ LIT("5x"), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"5x\"" },
	{ LIT("\"1h 30m\""), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"1h 30m\"" },
	{ LIT("99999999999999999999999x"), 0, IMAX, 0,
	  "t.conf:1: v: expected a duration such as 250ms, 30s, 5m, 2h, 1d, 1w or 1h30m, "
	  "got \"99999999999999999999999x\"" },
	{ LIT("[5m]"), 0, IMAX, 0, "t.conf:1: v: expected a duration, not a list" },
};

static void test_duration(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(duration_cases); i++) {
		struct cfg_node *root;
		struct cfg_node *v = value_node(&root, duration_cases[i].value,
						duration_cases[i].len);
		char err[256] = "";
		int64_t got = 12345;
		int r = cfg_duration_ms(v, duration_cases[i].min, duration_cases[i].max, &got, err,
					sizeof(err));
		if (duration_cases[i].err) {
			if (r != -EINVAL || strcmp(err, duration_cases[i].err) != 0)
				fail_msg("case %zu: %s: got %d %s", i, duration_cases[i].value, r, err);
			assert_int_equal(got, 12345);
		} else {
			if (r != 0)
				fail_msg("case %zu: %s: %s", i, duration_cases[i].value, err);
			assert_int_equal(got, duration_cases[i].want);
		}
		cfg_free(root);
	}
}

#define UMAX UINT64_MAX

static const struct {
	const char *value;
	size_t len;
	uint64_t min, max, want;
	const char *err;
} size_cases[] = {
	{ LIT("512"), 0, UMAX, 512, NULL },
	{ LIT("0"), 0, UMAX, 0, NULL },
	{ LIT("512b"), 0, UMAX, 512, NULL },
	{ LIT("512B"), 0, UMAX, 512, NULL },
	/* binary: KiB, MiB, GiB and Ki, Mi, Gi */
	{ LIT("10KiB"), 0, UMAX, 10240, NULL },
	{ LIT("10Ki"), 0, UMAX, 10240, NULL },
	{ LIT("\"10KiB\""), 0, UMAX, 10240, NULL },
	{ LIT("1MiB"), 0, UMAX, 1048576, NULL },
	{ LIT("1Mi"), 0, UMAX, 1048576, NULL },
	{ LIT("1GiB"), 0, UMAX, 1073741824, NULL },
	{ LIT("1Gi"), 0, UMAX, 1073741824, NULL },
	{ LIT("17179869183GiB"), 0, UMAX, 17179869183ull << 30, NULL },
	{ LIT("18446744073709551615"), 0, UMAX, UMAX, NULL },
	{ LIT("18446744073709551616"), 0, UMAX, 0,
	  "t.conf:1: v: \"18446744073709551616\" is out of range [0, 18446744073709551615] bytes" },
	{ LIT("17179869184GiB"), 0, UMAX, 0,
	  "t.conf:1: v: \"17179869184GiB\" is out of range [0, 18446744073709551615] bytes" },
	{ LIT("2KiB"), 1, 1024, 0, "t.conf:1: v: \"2KiB\" is out of range [1, 1024] bytes" },
	{ LIT("0"), 1, 1024, 0, "t.conf:1: v: \"0\" is out of range [1, 1024] bytes" },
	/* k, M, G, kB, MB, GB in any case (2^10.. in a size before): ambiguous, both values */
	{ LIT("10M"), 0, UMAX, 0,
	  "t.conf:1: v: \"10M\" is ambiguous: write 10MiB (10485760 bytes) or 10000000" },
	{ LIT("64k"), 0, UMAX, 0,
	  "t.conf:1: v: \"64k\" is ambiguous: write 64KiB (65536 bytes) or 64000" },
	{ LIT("10K"), 0, UMAX, 0,
	  "t.conf:1: v: \"10K\" is ambiguous: write 10KiB (10240 bytes) or 10000" },
	{ LIT("25m"), 0, UMAX, 0,
	  "t.conf:1: v: \"25m\" is ambiguous: write 25MiB (26214400 bytes) or 25000000" },
	{ LIT("1g"), 0, UMAX, 0,
	  "t.conf:1: v: \"1g\" is ambiguous: write 1GiB (1073741824 bytes) or 1000000000" },
	{ LIT("10MB"), 0, UMAX, 0,
	  "t.conf:1: v: \"10MB\" is ambiguous: write 10MiB (10485760 bytes) or 10000000" },
	{ LIT("10kB"), 0, UMAX, 0,
	  "t.conf:1: v: \"10kB\" is ambiguous: write 10KiB (10240 bytes) or 10000" },
	{ LIT("1GB"), 0, UMAX, 0,
	  "t.conf:1: v: \"1GB\" is ambiguous: write 1GiB (1073741824 bytes) or 1000000000" },
	{ LIT("10kb"), 0, UMAX, 0,
	  "t.conf:1: v: \"10kb\" is ambiguous: write 10KiB (10240 bytes) or 10000" },
	{ LIT("10KB"), 0, UMAX, 0,
	  "t.conf:1: v: \"10KB\" is ambiguous: write 10KiB (10240 bytes) or 10000" },
	{ LIT("1mb"), 0, UMAX, 0,
	  "t.conf:1: v: \"1mb\" is ambiguous: write 1MiB (1048576 bytes) or 1000000" },
	{ LIT("1Mb"), 0, UMAX, 0,
	  "t.conf:1: v: \"1Mb\" is ambiguous: write 1MiB (1048576 bytes) or 1000000" },
	{ LIT("2gb"), 0, UMAX, 0,
	  "t.conf:1: v: \"2gb\" is ambiguous: write 2GiB (2147483648 bytes) or 2000000000" },
	{ LIT("99999999999999999999G"), 0, UMAX, 0,
	  "t.conf:1: v: \"99999999999999999999G\" is ambiguous, and out of range "
	  "[0, 18446744073709551615] bytes either way" },
	/* a reading out of the key's range is not suggested */
	{ LIT("1000G"), 0, 1ull << 40, 0,
	  "t.conf:1: v: \"1000G\" is ambiguous: write 1000GiB (1073741824000 bytes) or "
	  "1000000000000" },
	{ LIT("1050G"), 0, 1ull << 40, 0,
	  "t.conf:1: v: \"1050G\" is ambiguous: write 1050000000000" },
	{ LIT("2000G"), 0, 1ull << 40, 0,
	  "t.conf:1: v: \"2000G\" is ambiguous, and out of range [0, 1099511627776] bytes "
	  "either way" },
	{ LIT("1k"), 1000, 1020, 0, "t.conf:1: v: \"1k\" is ambiguous: write 1000" },
	{ LIT("1k"), 1024, 2000, 0,
	  "t.conf:1: v: \"1k\" is ambiguous: write 1KiB (1024 bytes)" },
	{ LIT("10x"), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"10x\"" },
	{ LIT("k"), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"k\"" },
	{ LIT("10kk"), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"10kk\"" },
	{ LIT("10bb"), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"10bb\"" },
	{ LIT("-1"), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"-1\"" },
	{ LIT("10kib"), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"10kib\"" },
	{ LIT("10KIB"), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"10KIB\"" },
	{ LIT("10Kib"), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"10Kib\"" },
	{ LIT("\"10 KiB\""), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"10 KiB\"" },
	{ LIT("\"\""), 0, UMAX, 0,
	  "t.conf:1: v: expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB (KiB, MiB, "
	  "GiB: 2^10, 2^20, 2^30 bytes), got \"\"" },
	{ LIT("{a=1}"), 0, UMAX, 0, "t.conf:1: v: expected a size, not an object" },
};

static void test_size(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(size_cases); i++) {
		struct cfg_node *root;
		struct cfg_node *v = value_node(&root, size_cases[i].value, size_cases[i].len);
		char err[256] = "";
		uint64_t got = 12345;
		int r = cfg_size(v, size_cases[i].min, size_cases[i].max, &got, err, sizeof(err));
		if (size_cases[i].err) {
			if (r != -EINVAL || strcmp(err, size_cases[i].err) != 0)
				fail_msg("case %zu: %s: got %d %s", i, size_cases[i].value, r, err);
			assert_int_equal(got, 12345);
		} else {
			if (r != 0)
				fail_msg("case %zu: %s: %s", i, size_cases[i].value, err);
			assert_true(got == size_cases[i].want);
		}
		cfg_free(root);
	}
}

static const struct {
	const char *value;
	size_t len;
	int want; /* 0, 1, or -1 for an error */
	const char *err;
} bool_cases[] = {
	{ LIT("yes"), 1, NULL },
	{ LIT("Yes"), 1, NULL },
	{ LIT("TRUE"), 1, NULL },
	{ LIT("on"), 1, NULL },
	{ LIT("\"1\""), 1, NULL },
	{ LIT("no"), 0, NULL },
	{ LIT("false"), 0, NULL },
	{ LIT("OFF"), 0, NULL },
	{ LIT("0"), 0, NULL },
	{ LIT("maybe"), -1,
	  "t.conf:1: v: expected yes/no, true/false, on/off or 1/0, got \"maybe\"" },
	{ LIT("ye"), -1, "t.conf:1: v: expected yes/no, true/false, on/off or 1/0, got \"ye\"" },
	{ LIT("yess"), -1, "t.conf:1: v: expected yes/no, true/false, on/off or 1/0, got \"yess\"" },
	{ LIT("\"\""), -1, "t.conf:1: v: expected yes/no, true/false, on/off or 1/0, got \"\"" },
	{ LIT("\"yes\\u0000\""), -1,
	  "t.conf:1: v: expected yes/no, true/false, on/off or 1/0, got \"yes\\x00\"" },
	{ LIT("\"a\\\"b\\n\""), -1,
	  "t.conf:1: v: expected yes/no, true/false, on/off or 1/0, got \"a\\\"b\\x0a\"" },
	{ LIT("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), -1,
	  "t.conf:1: v: expected yes/no, true/false, on/off or 1/0, got "
	  "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"..." },
	{ LIT("{ }"), -1, "t.conf:1: v: expected yes or no, not an object" },
};

static void test_bool(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(bool_cases); i++) {
		struct cfg_node *root;
		struct cfg_node *v = value_node(&root, bool_cases[i].value, bool_cases[i].len);
		char err[256] = "";
		bool got = false;
		int r = cfg_bool(v, &got, err, sizeof(err));
		if (bool_cases[i].want < 0) {
			if (r != -EINVAL || strcmp(err, bool_cases[i].err) != 0)
				fail_msg("case %zu: %s: got %d %s", i, bool_cases[i].value, r, err);
			/* untouched on failure */
			got = true;
			assert_int_equal(cfg_bool(v, &got, err, sizeof(err)), -EINVAL);
			assert_true(got);
		} else {
			if (r != 0)
				fail_msg("case %zu: %s: %s", i, bool_cases[i].value, err);
			assert_int_equal(got, bool_cases[i].want);
			got = !got;
			assert_int_equal(cfg_bool(v, &got, err, sizeof(err)), 0);
			assert_int_equal(got, bool_cases[i].want);
		}
		cfg_free(root);
	}
}

static void test_string(void **state)
{
	(void)state;
	static const struct {
		const char *value;
		size_t len;
		const char *want;
		const char *err;
	} cases[] = {
		{ LIT("plain"), "plain", NULL },
		{ LIT("\"quoted text\""), "quoted text", NULL },
		{ LIT("''"), "", NULL },
		{ LIT("\"a\\u0000b\""), NULL, "t.conf:1: v: contains a NUL character" },
		{ LIT("{ a = 1 }"), NULL, "t.conf:1: v: expected a string, not an object" },
		{ LIT("[a]"), NULL, "t.conf:1: v: expected a string, not a list" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct cfg_node *root;
		struct cfg_node *v = value_node(&root, cases[i].value, cases[i].len);
		char err[256] = "";
		const char *got = "untouched";
		int r = cfg_string(v, &got, err, sizeof(err));
		if (cases[i].err) {
			assert_int_equal(r, -EINVAL);
			assert_string_equal(err, cases[i].err);
			assert_string_equal(got, "untouched");
		} else {
			assert_int_equal(r, 0);
			assert_string_equal(got, cases[i].want);
			assert_ptr_equal(got, v->value);
		}
		cfg_free(root);
	}
	/* a missing node (cfg_get() returned NULL) is an error, not a crash */
	char err[64];
	const char *got = NULL;
	assert_int_equal(cfg_string(NULL, &got, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "missing a string");
	assert_null(got);
}

/* ---- paths, errors, lookups ------------------------------------------------------ */

static void test_path_and_error(void **state)
{
	(void)state;
	static const char text[] =
		"class \"campus\" {\n"
		"  sessions = 8\n"
		"  hosts = [\"a\", { x = 1 }, [b, c]]\n"
		"}\n"
		"odd \"q\\\"\\n\" { 'k\\x' = 1 }\n";
	char path[128], err[256];
	struct cfg_node *root = parse_ok(text, sizeof(text) - 1);
	struct cfg_node *cls = cfg_get(root, "class");
	struct cfg_node *sessions = cfg_get(cls, "sessions");
	struct cfg_node *hosts = cfg_get(cls, "hosts");

	assert_string_equal(cfg_path(root, path, sizeof(path)), "");
	assert_string_equal(cfg_path(cls, path, sizeof(path)), "class \"campus\"");
	assert_string_equal(cfg_path(sessions, path, sizeof(path)), "class \"campus\".sessions");
	assert_string_equal(cfg_path(hosts->child, path, sizeof(path)),
			    "class \"campus\".hosts[0]");
	struct cfg_node *x = cfg_get(hosts->child->next, "x");
	assert_string_equal(cfg_path(x, path, sizeof(path)), "class \"campus\".hosts[1].x");
	assert_int_equal(x->line, 3);
	struct cfg_node *c = hosts->child->next->next->child->next;
	assert_string_equal(cfg_path(c, path, sizeof(path)), "class \"campus\".hosts[2][1]");
	struct cfg_node *odd = cfg_get(root, "odd");
	assert_string_equal(cfg_path(odd->child, path, sizeof(path)),
			    "odd \"q\\\"\\x0a\".k\\x");

	/* truncation: always terminated, never past len */
	memset(path, 'z', sizeof(path));
	assert_string_equal(cfg_path(sessions, path, 5), "clas");
	assert_int_equal(path[5], 'z');
	memset(path, 'z', sizeof(path));
	cfg_path(sessions, path, 0);
	assert_int_equal(path[0], 'z');
	assert_string_equal(cfg_path(sessions, path, 1), "");

	cfg_error(sessions, err, sizeof(err), "must be at most %d", 4);
	assert_string_equal(err, "t.conf:2: class \"campus\".sessions: must be at most 4");
	cfg_error(root, err, sizeof(err), "no %s", "workers");
	assert_string_equal(err, "t.conf:1: no workers");
	cfg_error(sessions, err, 10, "x");
	assert_string_equal(err, "t.conf:2:");
	cfg_error(sessions, NULL, 0, "x");
	cfg_free(root);
}

static void test_check_unused(void **state)
{
	(void)state;
	static const char text[] =
		"a = 1\n"
		"b {\n"
		"  c = 2\n"
		"  d = 3\n"
		"}\n"
		"r = [{ x = 1 }, 5]\n"
		"e = 4\n"
		"f { never = looked_at }\n";
	char err[256];
	struct cfg_node *root = parse_ok(text, sizeof(text) - 1);

	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:1: a: unknown key");
	cfg_get(root, "a");
	struct cfg_node *b = cfg_get(root, "b");
	cfg_get(b, "c");
	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:4: b.d: unknown key");
	cfg_get(b, "d");
	assert_int_equal(cfg_check_unused(b, err, sizeof(err)), 0);
	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:6: r: unknown key");
	struct cfg_node *r = cfg_get(root, "r");
	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:6: r[0].x: unknown key");
	cfg_get(r->child, "x");
	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:7: e: unknown key");
	cfg_get(root, "e");
	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:8: f: unknown key");
	/* a used object is searched: its own unknown keys are reported */
	cfg_get(root, "f");
	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:8: f.never: unknown key");
	cfg_get(cfg_get(root, "f"), "never");
	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), 0);
	assert_int_equal(cfg_check_unused(NULL, err, sizeof(err)), 0);

	/* lookups do not cross kinds */
	assert_null(cfg_get(root, "zz"));
	assert_null(cfg_get(r, "x"));
	assert_null(cfg_get(NULL, "x"));
	assert_null(cfg_next_same(NULL));
	assert_null(cfg_next_same(r->child));
	cfg_free(root);
}

static void test_repeated_keys(void **state)
{
	(void)state;
	static const char text[] =
		"class \"a\" { n = 1 }\n"
		"other = 1\n"
		"class \"b\" { n = 2 }\n"
		"class = 3\n";
	static const char *const want[] = { "a", "b", NULL };
	char err[256];
	struct cfg_node *root = parse_ok(text, sizeof(text) - 1);
	cfg_get(root, "other");
	size_t i = 0;
	for (struct cfg_node *c = cfg_get(root, "class"); c; c = cfg_next_same(c), i++) {
		assert_true(i < ARRAY_SIZE(want));
		if (want[i]) {
			assert_int_equal(c->kind, CFG_OBJECT);
			assert_string_equal(c->label, want[i]);
			cfg_get(c, "n");
		} else {
			assert_int_equal(c->kind, CFG_SCALAR);
			assert_string_equal(c->value, "3");
			assert_int_equal(c->line, 4);
		}
	}
	assert_int_equal(i, 3);
	/* cfg_next_same() marks what it returns as used */
	assert_int_equal(cfg_check_unused(root, err, sizeof(err)), 0);
	cfg_free(root);
}

/* ---- files ----------------------------------------------------------------------- */

static void test_parse_file(void **state)
{
	(void)state;
	char path[] = "/tmp/test_cfg.XXXXXX";
	char err[512];
	struct cfg_node *root = NULL;
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	static const char text[] = "a = 1\nb = x y\n";
	assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
	close(fd);

	assert_int_equal(cfg_parse_file(path, &root, err, sizeof(err)), -EINVAL);
	assert_null(root);
	char want[600];
	snprintf(want, sizeof(want), "%s:2: expected ';', ',' or a newline after the value, "
		 "got 'y'", path);
	assert_string_equal(err, want);

	fd = open(path, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "a = 1\n", 6), 6);
	close(fd);
	assert_int_equal(cfg_parse_file(path, &root, err, sizeof(err)), 0);
	assert_string_equal(root->file, path);
	assert_string_equal(cfg_get(root, "a")->file, path);
	cfg_free(root);
	unlink(path);

	root = NULL;
	assert_int_equal(cfg_parse_file(path, &root, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "%s: No such file or directory", path);
	assert_string_equal(err, want);
	assert_int_equal(cfg_parse_file("/tmp", &root, err, sizeof(err)), -EISDIR);
	assert_string_equal(err, "/tmp: Is a directory");
	assert_null(root);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_label_brace_next_line),
		cmocka_unit_test(test_design_example),
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_error_truncation),
		cmocka_unit_test(test_depth),
		cmocka_unit_test(test_scalar_length),
		cmocka_unit_test(test_file_size),
		cmocka_unit_test(test_node_limit),
		cmocka_unit_test(test_int64),
		cmocka_unit_test(test_duration),
		cmocka_unit_test(test_size),
		cmocka_unit_test(test_bool),
		cmocka_unit_test(test_string),
		cmocka_unit_test(test_path_and_error),
		cmocka_unit_test(test_check_unused),
		cmocka_unit_test(test_repeated_keys),
		cmocka_unit_test(test_parse_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
