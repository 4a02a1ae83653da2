/*
 * fuzz_cfg -- libFuzzer target for the configuration parser (src/lib/cfg.c).
 *
 * The input is a configuration file.  Besides "no crash, no leak, no UB" it checks what
 * cfg.h promises, aborting when a promise is broken:
 *   - a failed parse leaves *ret_root alone and writes "fuzz:LINE: message";
 *   - every node of a parsed tree is well formed (kinds, keys, labels, NUL-terminated
 *     values, parent links, the shared file name) and lines never go backwards;
 *   - every converter, cfg_path() and cfg_error() run on every node, into roomy and tiny
 *     buffers, and leave their out-parameter alone on failure;
 *   - cfg_check_unused() reports a fresh tree and is satisfied once every key has been
 *     looked up with cfg_get()/cfg_next_same();
 *   - the tree written back out in cfg syntax parses to the same tree (round trip).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                      \
	do {                                                                           \
		if (!(x)) {                                                            \
			fprintf(stderr, "fuzz_cfg: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #x);                                         \
			abort();                                                       \
		}                                                                      \
	} while (0)

/* A growable output buffer for the round trip. */
struct out {
	char *buf;
	size_t len, cap;
};

static void out_add(struct out *o, const char *s, size_t n)
{
	if (o->len + n + 1 > o->cap) {
		size_t cap = o->cap ? o->cap : 256;
		while (cap < o->len + n + 1)
			cap *= 2;
		char *b = realloc(o->buf, cap);
		CHECK(b);
		o->buf = b;
		o->cap = cap;
	}
	memcpy(o->buf + o->len, s, n);
	o->len += n;
	o->buf[o->len] = '\0';
}

static void out_str(struct out *o, const char *s)
{
	out_add(o, s, strlen(s));
}

/* Writes s as a double-quoted string that lex_quoted() decodes back to s. */
static void out_quoted(struct out *o, const char *s, size_t n)
{
	out_add(o, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		switch (s[i]) {
		case '"':
			out_str(o, "\\\"");
			break;
		case '\\':
			out_str(o, "\\\\");
			break;
		case '\n':
			out_str(o, "\\n");
			break;
		case '\0':
			out_str(o, "\\u0000");
			break;
		default:
			out_add(o, s + i, 1);
		}
	}
	out_add(o, "\"", 1);
}

static void write_value(struct out *o, const struct cfg_node *n);

static void write_body(struct out *o, const struct cfg_node *obj)
{
	for (const struct cfg_node *c = obj->child; c; c = c->next) {
		out_quoted(o, c->key, strlen(c->key));
		if (c->label) {
			out_str(o, " ");
			out_quoted(o, c->label, strlen(c->label));
			out_str(o, " ");
		} else {
			out_str(o, " = ");
		}
		write_value(o, c);
		out_str(o, ";\n");
	}
}

static void write_value(struct out *o, const struct cfg_node *n)
{
	switch (n->kind) {
	case CFG_SCALAR:
		if (n->quoted)
			out_quoted(o, n->value, n->value_len);
		else
			out_add(o, n->value, n->value_len);
		break;
	case CFG_OBJECT:
		out_str(o, "{\n");
		write_body(o, n);
		out_str(o, "}");
		break;
	case CFG_LIST:
		out_str(o, "[");
		for (const struct cfg_node *c = n->child; c; c = c->next) {
			write_value(o, c);
			out_str(o, ",\n");
		}
		out_str(o, "]");
		break;
	}
}

static void same_tree(const struct cfg_node *a, const struct cfg_node *b)
{
	CHECK(a->kind == b->kind);
	CHECK((a->key == NULL) == (b->key == NULL));
	CHECK(!a->key || strcmp(a->key, b->key) == 0);
	CHECK((a->label == NULL) == (b->label == NULL));
	CHECK(!a->label || strcmp(a->label, b->label) == 0);
	if (a->kind == CFG_SCALAR) {
		CHECK(a->quoted == b->quoted);
		CHECK(a->value_len == b->value_len);
		CHECK(memcmp(a->value, b->value, a->value_len) == 0);
	}
	const struct cfg_node *x = a->child, *y = b->child;
	for (; x && y; x = x->next, y = y->next)
		same_tree(x, y);
	CHECK(!x && !y);
}

struct walk {
	const struct cfg_node *root;
	unsigned last_line;
	unsigned max_line;
	unsigned depth;
};

/* Checks one node's shape and runs every reader of the API on it. */
static void visit(struct walk *w, struct cfg_node *n)
{
	char err[256], tiny[7], path[512];

	CHECK(n->file == w->root->file);
	CHECK(n->line >= w->last_line && n->line <= w->max_line);
	w->last_line = n->line;
	CHECK(n->parent && (n->parent->kind == CFG_OBJECT || n->parent->kind == CFG_LIST));
	if (n->parent->kind == CFG_OBJECT) {
		CHECK(n->key && n->key[0] != '\0');
	} else {
		CHECK(!n->key && !n->label);
	}
	CHECK(!n->label || n->label[0] != '\0');
	CHECK(!n->label || n->kind == CFG_OBJECT);

	cfg_path(n, path, sizeof(path));
	CHECK(strlen(path) < sizeof(path));
	cfg_path(n, tiny, sizeof(tiny));
	CHECK(strlen(tiny) < sizeof(tiny));
	cfg_error(n, err, sizeof(err), "message %d", 1);
	CHECK(strncmp(err, "fuzz:", 5) == 0);
	cfg_error(n, tiny, sizeof(tiny), "m");

	const char *s = "untouched";
	bool b = true;
	int64_t i = 42;
	uint64_t u = 42;
	if (cfg_string(n, &s, err, sizeof(err)) < 0) {
		CHECK(strcmp(s, "untouched") == 0);
	} else {
		CHECK(n->kind == CFG_SCALAR && strlen(s) == n->value_len);
	}
	if (cfg_bool(n, &b, err, sizeof(err)) < 0)
		CHECK(b);
	if (cfg_int64(n, INT64_MIN, INT64_MAX, &i, err, sizeof(err)) == 0) {
		int64_t j = 0;
		CHECK(cfg_int64(n, i, i, &j, tiny, sizeof(tiny)) == 0 && j == i);
	} else {
		CHECK(i == 42);
	}
	i = 42;
	if (cfg_int64(n, 0, 10, &i, err, sizeof(err)) == 0)
		CHECK(i >= 0 && i <= 10);
	else
		CHECK(i == 42);
	i = 42;
	if (cfg_duration_ms(n, INT64_MIN, INT64_MAX, &i, err, sizeof(err)) == 0)
		CHECK(i >= 0);
	else
		CHECK(i == 42);
	i = 42;
	if (cfg_duration_ms(n, 1000, 3600000, &i, tiny, sizeof(tiny)) == 0)
		CHECK(i >= 1000 && i <= 3600000);
	else
		CHECK(i == 42);
	if (cfg_size(n, 0, UINT64_MAX, &u, err, sizeof(err)) < 0)
		CHECK(u == 42);
	u = 42;
	if (cfg_size(n, 1, 1024, &u, err, sizeof(err)) == 0)
		CHECK(u >= 1 && u <= 1024);
	else
		CHECK(u == 42);

	if (n->kind == CFG_SCALAR) {
		CHECK(n->value && n->value[n->value_len] == '\0');
		CHECK(!n->child);
	} else {
		CHECK(!n->value);
		CHECK(++w->depth <= CFG_MAX_DEPTH);
		for (struct cfg_node *c = n->child; c; c = c->next) {
			CHECK(c->parent == n);
			visit(w, c);
		}
		w->depth--;
	}
}

/* Looks up every key of every object, so that nothing is left unused. */
static void use_all(struct cfg_node *n)
{
	for (struct cfg_node *c = n->child; c; c = c->next) {
		if (n->kind == CFG_OBJECT) {
			struct cfg_node *first = cfg_get(n, c->key);
			CHECK(first && strcmp(first->key, c->key) == 0);
			for (struct cfg_node *s = cfg_next_same(first); s; s = cfg_next_same(s))
				CHECK(strcmp(s->key, c->key) == 0);
		}
		if (c->kind != CFG_SCALAR)
			use_all(c);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct cfg_node *root = (struct cfg_node *)&root, *sentinel = root;
	char err[256];
	unsigned lines = 1;

	for (size_t k = 0; k < size; k++)
		lines += data[k] == '\n';
	memset(err, 'x', sizeof(err));
	int r = cfg_parse("fuzz", (const char *)data, size, &root, err, sizeof(err));
	if (r < 0) {
		CHECK(r == -EINVAL);
		CHECK(root == sentinel);
		CHECK(memchr(err, '\0', sizeof(err)));
		unsigned line = 0;
		CHECK(sscanf(err, "fuzz:%u: ", &line) == 1 && line >= 1 && line <= lines);
		/* a tiny error buffer is still terminated */
		char tiny[3] = { 'x', 'x', 'x' };
		CHECK(cfg_parse("fuzz", (const char *)data, size, &root, tiny, sizeof(tiny)) == r);
		CHECK(tiny[2] == '\0');
		return 0;
	}
	CHECK(root && root != sentinel && root->kind == CFG_OBJECT && !root->parent);

	struct walk w = { .root = root, .last_line = 1, .max_line = lines, .depth = 0 };
	for (struct cfg_node *c = root->child; c; c = c->next) {
		CHECK(c->parent == root);
		visit(&w, c);
	}
	r = cfg_check_unused(root, err, sizeof(err));
	CHECK(root->child ? r == -EINVAL : r == 0);
	use_all(root);
	r = cfg_check_unused(root, err, sizeof(err));
	CHECK(r == 0);

	struct out o = { NULL, 0, 0 };
	write_body(&o, root);
	struct cfg_node *again = NULL;
	r = cfg_parse("fuzz", o.buf ? o.buf : "", o.len, &again, err, sizeof(err));
	if (r != 0) {
		fprintf(stderr, "fuzz_cfg: round trip failed: %s\n--- written:\n%s\n", err,
			o.buf ? o.buf : "");
		abort();
	}
	same_tree(root, again);
	cfg_free(again);
	free(o.buf);
	cfg_free(root);
	return 0;
}
