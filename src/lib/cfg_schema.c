/*
 * cfg_schema -- the walker over tables of keys (see cfg_schema.h).
 *
 * Invariants: a field is written only by its type's parse (or by a default, which goes
 * through the same parse), so a value in a struct always passed its key's checks; a
 * failed parse leaves the field as it was.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "cfg_schema.h"
#include "util.h"

#define FIELD(base, k) ((char *)(base) + (k)->offset)
#define CFIELD(base, k) ((const char *)(base) + (k)->offset)

/* ---- the common types ---------------------------------------------------------- */

static int string_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			char *err, size_t el)
{
	(void)k;
	const char *s;
	int r = cfg_string(n, &s, err, el);
	if (r < 0)
		return r;
	if (!*s) {
		cfg_error(n, err, el, "must not be empty");
		return -EINVAL;
	}
	char *c = strdup(s);
	if (!c)
		return -ENOMEM;
	char **p = field;
	free(*p);
	*p = c;
	return 0;
}

const char *cfg_quote(const char *s, char *buf, size_t size)
{
	size_t o = 0;
	if (size < 3) {
		if (size)
			buf[0] = '\0';
		return buf;
	}
	buf[o++] = '"';
	for (; *s && o + 8 < size; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			buf[o++] = '\\';
			buf[o++] = (char)c;
		} else if (c < 0x20 || c == 0x7f) {
			o += (size_t)snprintf(buf + o, size - o, "\\u%04x", c);
		} else {
			buf[o++] = (char)c;
		}
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

static bool string_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const char *s = *(char *const *)field;
	if (!s)
		return false;
	cfg_quote(s, buf, size);
	return true;
}

static void string_clear(void *field)
{
	char **p = field;
	free(*p);
	*p = NULL;
}

const struct cfg_type cfg_type_string = { "string", string_parse, string_format, string_clear };

static int bool_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	(void)k;
	return cfg_bool(n, field, err, el);
}

static bool bool_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	snprintf(buf, size, "%s", *(const bool *)field ? "true" : "false");
	return true;
}

const struct cfg_type cfg_type_bool = { "bool", bool_parse, bool_format, NULL };

static int uint_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	int64_t v;
	int r = cfg_int64(n, k->min, k->max, &v, err, el);
	if (r == 0)
		*(unsigned *)field = (unsigned)v;
	return r;
}

static bool uint_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	snprintf(buf, size, "%u", *(const unsigned *)field);
	return true;
}

const struct cfg_type cfg_type_uint = { "integer", uint_parse, uint_format, NULL };

static int uint64_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			char *err, size_t el)
{
	int64_t v;
	int r = cfg_int64(n, k->min, k->max, &v, err, el);
	if (r == 0)
		*(uint64_t *)field = (uint64_t)v;
	return r;
}

static bool uint64_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	snprintf(buf, size, "%" PRIu64, *(const uint64_t *)field);
	return true;
}

const struct cfg_type cfg_type_uint64 = { "integer", uint64_parse, uint64_format, NULL };

static int duration_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			  char *err, size_t el)
{
	return cfg_duration_ms(n, k->min, k->max, field, err, el);
}

static bool duration_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	int64_t ms = *(const int64_t *)field;
	if (ms == 0)
		snprintf(buf, size, "0");
	else if (ms < 0) /* no table allows it; written so that it reads back */
		snprintf(buf, size, "%" PRId64 "ms", ms);
	else
		fmt_duration(buf, size, (uint64_t)ms, DURATION_EXACT);
	return true;
}

const struct cfg_type cfg_type_duration = { "duration", duration_parse, duration_format, NULL };

static int size_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	return cfg_size(n, (uint64_t)k->min, (uint64_t)k->max, field, err, el);
}

static bool size_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	/* exact, in the largest binary unit that divides it: what the parser reads back */
	static const char *const units[] = { "", "KiB", "MiB", "GiB" };
	uint64_t v = *(const uint64_t *)field;
	size_t u = 0;
	while (u + 1 < ARRAY_SIZE(units) && v && v % 1024 == 0) {
		v /= 1024;
		u++;
	}
	snprintf(buf, size, "%" PRIu64 "%s", v, units[u]);
	return true;
}

const struct cfg_type cfg_type_size = { "size", size_parse, size_format, NULL };

static int enum_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	const char *s;
	int r = cfg_string(n, &s, err, el);
	if (r < 0)
		return r;
	for (const struct cfg_enum *e = k->names; e->name; e++)
		if (strcmp(s, e->name) == 0) {
			*(int *)field = e->value;
			return 0;
		}
	/* "expected a, b or c" */
	char list[300] = "";
	size_t o = 0;
	for (const struct cfg_enum *e = k->names; e->name && o < sizeof(list); e++)
		o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s",
				      e == k->names ? "" : e[1].name ? ", " : " or ", e->name);
	if (k->flags & CFG_QUOTE)
		cfg_error(n, err, el, "\"%.50s\": expected %s", s, list);
	else
		cfg_error(n, err, el, "expected %s", list);
	return -EINVAL;
}

static bool enum_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	for (const struct cfg_enum *e = k->names; e->name; e++)
		if (*(const int *)field == e->value) {
			cfg_quote(e->name, buf, size);
			return true;
		}
	return false;
}

const struct cfg_type cfg_type_enum = { "enum", enum_parse, enum_format, NULL };

static int mode_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	(void)k;
	const char *s;
	int r = cfg_string(n, &s, err, el);
	if (r < 0)
		return r;
	char *end;
	unsigned long v = strtoul(s, &end, 8);
	if (!*s || *end || v > 0777) {
		cfg_error(n, err, el, "expected an octal mode such as \"0660\"");
		return -EINVAL;
	}
	*(unsigned *)field = (unsigned)v;
	return 0;
}

static bool mode_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	snprintf(buf, size, "\"%04o\"", *(const unsigned *)field);
	return true;
}

const struct cfg_type cfg_type_mode = { "octal mode", mode_parse, mode_format, NULL };

/* A name or a number: the number when no entry has that name. */
static bool numeric_id(const char *s, unsigned long *ret)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);
	if (s[0] < '0' || s[0] > '9' || *end || v >= UINT32_MAX)
		return false;
	*ret = v;
	return true;
}

int cfg_user(const struct cfg_node *n, uid_t *ret_uid, gid_t *ret_gid, char *err, size_t el)
{
	const char *name;
	int r = cfg_string(n, &name, err, el);
	if (r == 0 && !*name) {
		cfg_error(n, err, el, "must not be empty");
		r = -EINVAL;
	}
	if (r < 0)
		return r;
	struct passwd pw, *res = NULL;
	char tmp[4096];
	int e = getpwnam_r(name, &pw, tmp, sizeof(tmp), &res);
	unsigned long v;
	if (res) {
		*ret_uid = pw.pw_uid;
		if (ret_gid)
			*ret_gid = pw.pw_gid;
	} else if (numeric_id(name, &v)) {
		*ret_uid = (uid_t)v;
		if (ret_gid)
			*ret_gid = (gid_t)v;
	} else {
		cfg_error(n, err, el, "unknown user \"%.64s\"%s%s (create it, e.g. "
			  "adduser --system --group %.64s)", name, e ? ": " : "", e ? strerror(e) : "",
			  name);
		return -EINVAL;
	}
	return 0;
}

static int user_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	(void)k;
	return cfg_user(n, field, NULL, err, el);
}

static bool id_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	unsigned v = *(const unsigned *)field;
	if (v == (unsigned)-1)
		return false;
	snprintf(buf, size, "\"%u\"", v);
	return true;
}

const struct cfg_type cfg_type_user = { "user", user_parse, id_format, NULL };

int cfg_group(const struct cfg_node *n, gid_t *ret, char *err, size_t el)
{
	const char *name;
	int r = cfg_string(n, &name, err, el);
	if (r == 0 && !*name) {
		cfg_error(n, err, el, "must not be empty");
		r = -EINVAL;
	}
	if (r < 0)
		return r;
	struct group gr, *res = NULL;
	char tmp[16384];
	int e = getgrnam_r(name, &gr, tmp, sizeof(tmp), &res);
	unsigned long v;
	if (res) {
		*ret = gr.gr_gid;
	} else if (numeric_id(name, &v)) {
		*ret = (gid_t)v;
	} else {
		cfg_error(n, err, el, "unknown group \"%.64s\"%s%s", name, e ? ": " : "",
			  e ? strerror(e) : "");
		return -EINVAL;
	}
	return 0;
}

static int group_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
		       char *err, size_t el)
{
	(void)k;
	return cfg_group(n, field, err, el);
}

const struct cfg_type cfg_type_group = { "group", group_parse, id_format, NULL };

/* key = "a"; key = ["a", "b"]; or the key repeated: the items in order. */
int cfg_list_each(const struct cfg_node *n,
		  int (*fn)(void *arg, const struct cfg_node *item, const char *s, char *err,
			    size_t errlen),
		  void *arg, char *err, size_t el)
{
	size_t count = 0;
	for (const struct cfg_node *m = n; m; m = cfg_next_same((struct cfg_node *)m))
		if (m->kind != CFG_LIST)
			count++;
		else
			for (const struct cfg_node *it = m->child; it; it = it->next)
				count++;
	if (count > CFG_LIST_MAX) {
		cfg_error(n, err, el, "more than %d entries", CFG_LIST_MAX);
		return -EINVAL;
	}
	int r = 0;
	for (const struct cfg_node *m = n; r == 0 && m; m = cfg_next_same((struct cfg_node *)m))
		r = cfg_items_each(m, fn, arg, err, el);
	return r;
}

int cfg_items_each(const struct cfg_node *m,
		   int (*fn)(void *arg, const struct cfg_node *item, const char *s, char *err,
			     size_t errlen),
		   void *arg, char *err, size_t el)
{
	int r = 0;
	for (const struct cfg_node *it = m->kind == CFG_LIST ? m->child : m; r == 0 && it;
	     it = m->kind == CFG_LIST ? it->next : NULL) {
		const char *s;
		r = cfg_string(it, &s, err, el);
		if (r == 0 && fn)
			r = fn(arg, it, s, err, el);
	}
	return r;
}

struct list_build {
	char **v;
	size_t n;
	size_t cap;
};

static int list_add(void *arg, const struct cfg_node *item, const char *s, char *err, size_t el)
{
	(void)item;
	(void)err;
	(void)el;
	struct list_build *b = arg;
	if (b->n + 1 >= b->cap) {
		size_t cap = b->cap ? 2 * b->cap : 8;
		char **v = realloc(b->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		b->v = v;
		b->cap = cap;
	}
	if (!(b->v[b->n] = strdup(s)))
		return -ENOMEM;
	b->v[++b->n] = NULL;
	return 0;
}

static int list_parse(const struct cfg_node *n, const struct cfg_key *k, void *field, char *err,
		      size_t el)
{
	(void)k;
	struct list_build b = { .v = calloc(1, sizeof(char *)), .cap = 1 };
	if (!b.v)
		return -ENOMEM;
	int r = cfg_list_each(n, list_add, &b, err, el);
	if (r < 0) {
		for (size_t j = 0; j < b.n; j++)
			free(b.v[j]);
		free(b.v);
		return r;
	}
	char ***p = field;
	if (*p)
		for (char **q = *p; *q; q++)
			free(*q);
	free(*p);
	*p = b.v;
	return 0;
}

struct list_check {
	bool (*ok)(const char *s, const char **why);
};

static int list_check_one(void *arg, const struct cfg_node *item, const char *s, char *err,
			  size_t el)
{
	const struct list_check *c = arg;
	const char *why = NULL;
	if (c->ok(s, &why))
		return 0;
	cfg_error(item, err, el, "\"%.100s\": %s", s, why);
	return -EINVAL;
}

int cfg_list_check(const struct cfg_node *n, bool (*ok)(const char *s, const char **why),
		   char *err, size_t el)
{
	struct list_check c = { ok };
	return cfg_list_each(n, list_check_one, &c, err, el);
}

static bool list_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	char *const *list = *(char **const *)field;
	if (!list)
		return false;
	size_t o = (size_t)snprintf(buf, size, "[");
	for (size_t i = 0; list[i] && o < size; i++) {
		char q[1024];
		o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? ", " : "",
				      cfg_quote(list[i], q, sizeof(q)));
	}
	if (o < size)
		snprintf(buf + o, size - o, "]");
	return true;
}

static void list_clear(void *field)
{
	char ***p = field;
	if (*p)
		for (char **q = *p; *q; q++)
			free(*q);
	free(*p);
	*p = NULL;
}

const struct cfg_type cfg_type_list = { "list", list_parse, list_format, list_clear };

/* A sub-block (relay { retry { min; max; } }): its keys have the parent's base. */
static int block_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
		       char *err, size_t el)
{
	if (n->kind != CFG_OBJECT) {
		char keys[200] = "";
		size_t o = 0;
		for (const struct cfg_key *s = k->sub; s->name && o < sizeof(keys); s++)
			o += (size_t)snprintf(keys + o, sizeof(keys) - o, "%s = ...; ", s->name);
		cfg_error(n, err, el, "expected %s { %s}", k->name, keys);
		return -EINVAL;
	}
	return cfg_schema_load((struct cfg_node *)n, k->sub, field, err, el);
}

const struct cfg_type cfg_type_block = { "block", block_parse, NULL, NULL };

/* ---- the walker -------------------------------------------------------------------- */

int cfg_schema_defaults(const struct cfg_key *keys, void *base)
{
	for (const struct cfg_key *k = keys; k->name; k++) {
		if (k->type == &cfg_type_block) {
			int r = cfg_schema_defaults(k->sub, base);
			if (r < 0)
				return r;
			continue;
		}
		if (!k->def)
			continue;
		struct cfg_node n = { .kind = CFG_SCALAR, .key = (char *)k->name,
				      .value = (char *)k->def, .value_len = strlen(k->def),
				      .file = "(default)" };
		char err[256];
		int r = k->type->parse(&n, k, FIELD(base, k), err, sizeof(err));
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			fprintf(stderr, "BUG: default of %s: %s\n", k->name, err);
			abort();
		}
	}
	return 0;
}

int cfg_schema_load(struct cfg_node *obj, const struct cfg_key *keys, void *base, char *err,
		    size_t errlen)
{
	for (const struct cfg_key *k = keys; k->name; k++) {
		struct cfg_node *n = cfg_get(obj, k->name);
		if (!n) {
			if (k->flags & CFG_REQUIRED) {
				cfg_error(obj, err, errlen, "%s is required", k->name);
				return -EINVAL;
			}
			continue;
		}
		if (!(k->flags & CFG_REPEAT) && cfg_next_same(n)) {
			cfg_error(cfg_next_same(n), err, errlen, "given twice");
			return -EINVAL;
		}
		int r = k->type->parse(n, k, FIELD(base, k), err, errlen);
		if (r == 0 && k->check)
			r = k->check(n, FIELD(base, k), err, errlen);
		if (r < 0)
			return r;
	}
	return 0;
}

void cfg_schema_clear(const struct cfg_key *keys, void *base)
{
	for (const struct cfg_key *k = keys; k->name; k++)
		if (k->type->clear)
			k->type->clear(FIELD(base, k));
}

unsigned cfg_schema_restarts(const struct cfg_key *keys, const void *a, const void *b)
{
	unsigned groups = 0;
	for (const struct cfg_key *k = keys; k->name; k++) {
		if (k->type == &cfg_type_block) {
			groups |= cfg_schema_restarts(k->sub, a, b);
			continue;
		}
		if (!k->restart || (k->active && !k->active(a) && !k->active(b)))
			continue;
		/* XXX values compare by their first 8 KiB: lists longer than that may hide a change */
		char va[8192], vb[8192];
		bool ha = k->type->format(k, CFIELD(a, k), va, sizeof(va));
		bool hb = k->type->format(k, CFIELD(b, k), vb, sizeof(vb));
		if (ha != hb || (ha && strcmp(va, vb) != 0))
			groups |= 1u << k->restart;
	}
	return groups;
}

size_t cfg_schema_count(const struct cfg_key *keys)
{
	size_t n = 0;
	while (keys[n].name)
		n++;
	return n;
}

size_t cfg_schema_print(FILE *f, const struct cfg_key *keys, const void *base,
			const void *defaults, unsigned depth)
{
	size_t lines = 0;
	for (const struct cfg_key *k = keys; k->name; k++) {
		if (k->type == &cfg_type_block) {
			char *text = NULL;
			size_t len = 0;
			FILE *m = open_memstream(&text, &len);
			if (!m)
				continue;
			size_t sub = cfg_schema_print(m, k->sub, base, defaults, depth + 1);
			fclose(m);
			if (sub) {
				fprintf(f, "%*s%s {\n%s%*s}\n", (int)depth * 2, "", k->name, text,
					(int)depth * 2, "");
				lines += sub;
			}
			free(text);
			continue;
		}
		char v[8192], d[8192];
		if ((k->flags & CFG_SECRET) || !k->type->format(k, CFIELD(base, k), v, sizeof(v)))
			continue;
		/* a required key has no default to equal: always written */
		if (defaults && !(k->flags & CFG_REQUIRED) &&
		    k->type->format(k, CFIELD(defaults, k), d, sizeof(d)) && strcmp(v, d) == 0)
			continue;
		bool active = !k->active || k->active(base);
		/* every value: with its line of help, as a comment */
		fprintf(f, "%*s%s%s = %s;%s%s\n", (int)depth * 2, "", active ? "" : "# ", k->name, v,
			!defaults && k->help ? "  # " : "", !defaults && k->help ? k->help : "");
		lines++;
	}
	return lines;
}
