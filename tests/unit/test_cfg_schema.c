/*
 * test_cfg_schema -- unit tests of the walker over tables of keys (src/lib/cfg_schema.c).
 *
 * One demonstration table holds a key of each common type and a sub-block; table-driven
 * cases give a block's text and the values it yields or the exact error, and the writer
 * is checked in both modes (every value; only those that differ from the defaults).
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

#include "cfg.h"
#include "cfg_schema.h"
#include "util.h"

struct demo {
	char *name;
	bool on;
	unsigned n;
	uint64_t big;
	int64_t ms;
	uint64_t bytes;
	int color;
	unsigned mode;
	char **list;
	int64_t lo, hi;
};

static const struct cfg_enum colors[] = {
	{ "red", 0 }, { "green", 1 }, { "blue", 2 }, { NULL, 0 },
};

#define D(f) offsetof(struct demo, f)

static const struct cfg_key box_keys[] = {
	{ "lo", &cfg_type_duration, D(lo), "1s", 0, 60000, .help = "low" },
	{ "hi", &cfg_type_duration, D(hi), "1m", 0, 3600000, .help = "high" },
	{ .name = NULL },
};

static const struct cfg_key demo_keys[] = {
	{ "name", &cfg_type_string, D(name), "x", .help = "a string" },
	{ "on", &cfg_type_bool, D(on), "false", .help = "a bool" },
	{ "n", &cfg_type_uint, D(n), "5", 1, 10, .help = "an integer" },
	{ "big", &cfg_type_uint64, D(big), "1000000", 0, INT64_C(1) << 40, .help = "a big one" },
	{ "ms", &cfg_type_duration, D(ms), "30s", 1000, 3600000, .help = "a duration" },
	{ "bytes", &cfg_type_size, D(bytes), "64KiB", 1024, 1 << 30, .help = "a size" },
	{ "color", &cfg_type_enum, D(color), "red", .names = colors, .help = "an enum" },
	{ "mode", &cfg_type_mode, D(mode), "0640", .help = "a mode" },
	{ "list", &cfg_type_list, D(list), NULL, .flags = CFG_REPEAT, .help = "a list" },
	{ "box", &cfg_type_block, 0, .sub = box_keys, .help = "a sub-block" },
	{ .name = NULL },
};

static const struct cfg_key required_keys[] = {
	{ "need", &cfg_type_string, D(name), NULL, .flags = CFG_REQUIRED, .help = "needed" },
	{ "color", &cfg_type_enum, D(color), NULL, .names = colors, .flags = CFG_QUOTE,
	  .help = "an enum whose error quotes the value" },
	{ .name = NULL },
};

static void demo_clear(struct demo *d)
{
	cfg_schema_clear(demo_keys, d);
	memset(d, 0, sizeof(*d));
}

/* Loads "blk { TEXT }" against keys into d (defaults first): 0 or the error in err. */
static int load(const struct cfg_key *keys, const char *text, struct demo *d, char *err,
		size_t el)
{
	char doc[1024];
	snprintf(doc, sizeof(doc), "blk {\n%s\n}\n", text);
	struct cfg_node *root = NULL;
	assert_int_equal(cfg_parse("t.conf", doc, strlen(doc), &root, err, el), 0);
	memset(d, 0, sizeof(*d));
	assert_int_equal(cfg_schema_defaults(keys, d), 0);
	err[0] = '\0';
	int r = cfg_schema_load(cfg_get(root, "blk"), keys, d, err, el);
	cfg_free(root);
	return r;
}

static void test_defaults(void **state)
{
	(void)state;
	struct demo d;
	char err[256];
	assert_int_equal(load(demo_keys, "", &d, err, sizeof(err)), 0);
	assert_string_equal(d.name, "x");
	assert_false(d.on);
	assert_int_equal(d.n, 5);
	assert_int_equal(d.big, 1000000);
	assert_int_equal(d.ms, 30000);
	assert_int_equal(d.bytes, 65536);
	assert_int_equal(d.color, 0);
	assert_int_equal(d.mode, 0640);
	assert_null(d.list);
	assert_int_equal(d.lo, 1000);
	assert_int_equal(d.hi, 60000);
	demo_clear(&d);
}

static void test_values(void **state)
{
	(void)state;
	struct demo d;
	char err[256];
	assert_int_equal(load(demo_keys, "name = \"y\"; on = yes; n = 10; big = 2k; ms = 1m30s;\n"
			      "bytes = 1MiB; color = blue; mode = \"0600\"; list = a;\n"
			      "list = [b, c]; box { lo = 250ms; }", &d, err, sizeof(err)), 0);
	assert_string_equal(d.name, "y");
	assert_true(d.on);
	assert_int_equal(d.n, 10);
	assert_int_equal(d.big, 2000);
	assert_int_equal(d.ms, 90000);
	assert_int_equal(d.bytes, 1 << 20);
	assert_int_equal(d.color, 2);
	assert_int_equal(d.mode, 0600);
	assert_non_null(d.list);
	assert_string_equal(d.list[0], "a");
	assert_string_equal(d.list[1], "b");
	assert_string_equal(d.list[2], "c");
	assert_null(d.list[3]);
	assert_int_equal(d.lo, 250);
	assert_int_equal(d.hi, 60000);
	demo_clear(&d);
}

/* A size is printed exactly, in the largest binary unit that divides it, and what is
 * printed reads back to the same value (sluiced -D, sluice config). */
static void test_size_printed(void **state)
{
	(void)state;
	static const struct {
		uint64_t v;
		const char *printed;
	} cases[] = {
		{ 0, "0" }, { 512, "512" }, { 1000, "1000" }, { 1024, "1KiB" }, { 1536, "1536" },
		{ 65536, "64KiB" }, { 1000000, "1000000" }, { 1052672, "1028KiB" },
		{ 52428800, "50MiB" }, { 10000000, "10000000" }, { 3ull << 30, "3GiB" },
		{ 1ull << 40, "1024GiB" }, { UINT64_MAX, "18446744073709551615" },
	};
	const struct cfg_key k = { .name = "bytes", .type = &cfg_type_size, .max = INT64_MAX };
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char out[64];
		assert_true(cfg_type_size.format(&k, &cases[i].v, out, sizeof(out)));
		assert_string_equal(out, cases[i].printed);
		uint64_t back = 0;
		struct cfg_node node = { .kind = CFG_SCALAR, .key = (char *)"bytes", .value = out,
					 .value_len = strlen(out), .file = "t" };
		char err[256];
		assert_int_equal(cfg_size(&node, 0, UINT64_MAX, &back, err, sizeof(err)), 0);
		assert_true(back == cases[i].v);
	}
}

static const struct {
	const char *text;
	const char *err;
} bad[] = {
	{ "n = 0;", "t.conf:2: blk.n: \"0\" is out of range [1, 10]" },
	{ "n = 1;\nn = 2;", "t.conf:3: blk.n: given twice" },
	{ "name = \"\";", "t.conf:2: blk.name: must not be empty" },
	{ "on = maybe;", "t.conf:2: blk.on: expected yes/no, true/false, on/off or 1/0, got \"maybe\"" },
	{ "ms = 2h;", "t.conf:2: blk.ms: \"2h\" is out of range [1s, 1h]" },
	{ "bytes = 1;", "t.conf:2: blk.bytes: \"1\" is out of range [1024, 1073741824] bytes" },
	{ "color = purple;", "t.conf:2: blk.color: expected red, green or blue" },
	{ "mode = 999;", "t.conf:2: blk.mode: expected an octal mode such as \"0660\"" },
	{ "box = 1;", "t.conf:2: blk.box: expected box { lo = ...; hi = ...; }" },
	{ "box { hi = 2h; }", "t.conf:2: blk.box.hi: \"2h\" is out of range [0ms, 1h]" },
	{ "n = [1, 2];", "t.conf:2: blk.n: expected an integer, not a list" },
};

static void test_errors(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		struct demo d;
		char err[256];
		int r = load(demo_keys, bad[i].text, &d, err, sizeof(err));
		if (r != -EINVAL || strcmp(err, bad[i].err) != 0)
			fail_msg("%s: got %d \"%s\", want \"%s\"", bad[i].text, r, err, bad[i].err);
		demo_clear(&d);
	}
}

static void test_required_and_quote(void **state)
{
	(void)state;
	struct demo d;
	char err[256];
	assert_int_equal(load(required_keys, "color = red;", &d, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.conf:1: blk: need is required");
	demo_clear(&d);
	assert_int_equal(load(required_keys, "need = z; color = pink;", &d, err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "t.conf:2: blk.color: \"pink\": expected red, green or blue");
	demo_clear(&d);
}

/* What cfg_schema_print() writes, as a string. */
static char *print(const struct demo *d, const struct demo *defaults)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	assert_non_null(f);
	cfg_schema_print(f, demo_keys, d, defaults, 0);
	assert_int_equal(fclose(f), 0);
	return text;
}

static void test_print(void **state)
{
	(void)state;
	struct demo d, def;
	char err[256];
	assert_int_equal(load(demo_keys, "", &def, err, sizeof(err)), 0);
	assert_int_equal(load(demo_keys, "n = 7; color = blue; list = [a, \"b\\\"c\"];\n"
			      "box { hi = 2m; } ms = 30s;", &d, err, sizeof(err)), 0);
	char *changed = print(&d, &def);
	assert_string_equal(changed, "n = 7;\n"
				     "color = \"blue\";\n"
				     "list = [\"a\", \"b\\\"c\"];\n"
				     "box {\n"
				     "  hi = 2m;\n"
				     "}\n");
	char *all = print(&d, NULL);
	assert_string_equal(all, "name = \"x\";  # a string\n"
				 "on = false;  # a bool\n"
				 "n = 7;  # an integer\n"
				 "big = 1000000;  # a big one\n"
				 "ms = 30s;  # a duration\n"
				 "bytes = 64KiB;  # a size\n"
				 "color = \"blue\";  # an enum\n"
				 "mode = \"0640\";  # a mode\n"
				 "list = [\"a\", \"b\\\"c\"];  # a list\n"
				 "box {\n"
				 "  lo = 1s;  # low\n"
				 "  hi = 2m;  # high\n"
				 "}\n");
	/* what it writes reads back to the same values */
	struct demo again;
	assert_int_equal(load(demo_keys, all, &again, err, sizeof(err)), 0);
	char *all2 = print(&again, NULL);
	assert_string_equal(all, all2);
	free(changed);
	free(all);
	free(all2);
	demo_clear(&d);
	demo_clear(&def);
	demo_clear(&again);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_size_printed),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_required_and_quote),
		cmocka_unit_test(test_print),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
