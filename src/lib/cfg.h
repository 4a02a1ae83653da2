/*
 * cfg -- parser for sluice's configuration syntax: the nginx-like subset of UCL.
 *
 * Generic: knows nothing of mail.  It turns text into a tree of nodes, each carrying the
 * file and line it came from, so that the schema (cfg_schema.c, the tables of src/conf)
 * can name file, line and key in every error.  No I/O except cfg_parse_file() reading one file.
 *
 * Syntax accepted (a subset of UCL, compatible with libucl for these forms):
 *
 *   # comment to end of line        // comment            slash-star comment star-slash
 *   key = value;                     key value;             key: value;   (';' or ',' or
 *                                                                          newline ends it)
 *   key { ... }                      key = { ... }          object
 *   key "label" { ... }              named object (e.g. class "campus" { ... })
 *   key = [ v1, v2, ... ];           list (elements: scalars or objects; trailing comma ok)
 *   scalars: "double quoted" with \" \\ \n \t \r \uXXXX escapes, 'single quoted' (no
 *            escapes except \' and \\), or bare words [A-Za-z0-9_./:*@+\-\[\]!%] etc.
 *
 * A key that appears twice in one object yields two sibling nodes (the schema layer
 * decides whether that is an error).  Scalars are kept as text; conversion to numbers,
 * durations, sizes and booleans is done by the cfg_get_* helpers below.
 *
 * Limits: nesting depth <= CFG_MAX_DEPTH, one scalar <= CFG_MAX_SCALAR bytes, input file
 * <= CFG_MAX_FILE bytes; exceeding one is a parse error with a line number.
 */
#ifndef SLUICE_CFG_H
#define SLUICE_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CFG_MAX_DEPTH 32
#define CFG_MAX_SCALAR 65536
#define CFG_MAX_FILE (16u * 1024 * 1024)

enum cfg_kind {
	CFG_SCALAR = 0,
	CFG_OBJECT,
	CFG_LIST,
};

struct cfg_node {
	enum cfg_kind kind;
	char *key;          /* NULL for list elements and the root */
	char *label;        /* `key "label" { }`, else NULL */
	char *value;        /* CFG_SCALAR: the unescaped text, NUL-terminated */
	size_t value_len;   /* > strlen(value) if the text held \u0000; cfg_string rejects that */
	bool quoted;        /* the scalar was written in quotes */
	const char *file;   /* shared with the root; valid as long as the tree */
	unsigned line;      /* 1-based line where the key (or list element) starts */
	struct cfg_node *parent;
	struct cfg_node *child; /* first child of an object or list */
	struct cfg_node *next;  /* next sibling */
	bool used;              /* set by cfg_get_*: lets the schema report unknown keys */
};

/*
 * Parse text (need not be NUL-terminated) into a tree whose root is a CFG_OBJECT.
 * file_name is copied and used in node->file.  On success returns 0 and sets *ret_root.
 * On error returns -EINVAL (syntax; err holds "FILE:LINE: message") or -ENOMEM, and
 * leaves *ret_root untouched.
 */
int cfg_parse(const char *file_name, const char *text, size_t len,
	      struct cfg_node **ret_root, char *err, size_t errlen);

/* Read a file (<= CFG_MAX_FILE) and parse it; errors as cfg_parse, plus -errno for I/O
 * with err holding "FILE: strerror". */
int cfg_parse_file(const char *path, struct cfg_node **ret_root, char *err, size_t errlen);

/* Free a whole tree (root only).  Accepts NULL, returns NULL. */
struct cfg_node *cfg_free(struct cfg_node *root);

/* First child of obj with that key (marks it used), or NULL.  obj must be an object. */
struct cfg_node *cfg_get(struct cfg_node *obj, const char *key);

/*
 * Lookup hook: when set, cfg_get() calls fn(arg, block, key) for every lookup, found or
 * not, with block the dotted path of the object looked in, made of keys only (no labels,
 * no list indexes: "route.auth", "" for the root).  It lets a test list every key the
 * schema reads (tests/unit/test_config_keys.c compares them with sluice.conf(5)).
 * XXX process-wide and not synchronised: set it only while no other thread parses.
 * fn NULL removes it.
 */
typedef void cfg_lookup_hook_fn(void *arg, const char *block, const char *key);
void cfg_set_lookup_hook(cfg_lookup_hook_fn *fn, void *arg);

/* Next sibling of n with the same key, or NULL (for repeated keys). */
struct cfg_node *cfg_next_same(struct cfg_node *n);

/*
 * Converters.  Each returns 0 and sets *ret, or -EINVAL with err holding
 * "FILE:LINE: KEY: message" (KEY = the dotted path of the node, e.g. milter.listen or
 * class "campus".sessions).  *ret is untouched on failure.
 *   string:   a scalar (quoted or bare); *ret points into the tree.
 *   bool:     yes/no, true/false, on/off, 1/0 (case-insensitive)
 *   int64:    decimal integer with optional k/m/g (x1000) or kb/mb/gb (x1024) suffix,
 *             range-checked against [min, max]
 *   duration: number with unit ms, s, m (minutes), h, d, w (no unit = seconds), may be
 *             combined "1h30m"; result in milliseconds; range-checked against [min, max]
 *   size:     bytes with optional k, m, g (x1024) and optional trailing b; [min, max]
 */
int cfg_string(const struct cfg_node *n, const char **ret, char *err, size_t errlen);
int cfg_bool(const struct cfg_node *n, bool *ret, char *err, size_t errlen);
int cfg_int64(const struct cfg_node *n, int64_t min, int64_t max, int64_t *ret,
	      char *err, size_t errlen);
int cfg_duration_ms(const struct cfg_node *n, int64_t min, int64_t max, int64_t *ret,
		    char *err, size_t errlen);
int cfg_size(const struct cfg_node *n, uint64_t min, uint64_t max, uint64_t *ret,
	     char *err, size_t errlen);

/* Write the dotted path of n into buf (truncating safely); returns buf. */
const char *cfg_path(const struct cfg_node *n, char *buf, size_t len);

/* Format "FILE:LINE: PATH: message" for node n into err.  printf-style. */
void cfg_error(const struct cfg_node *n, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/*
 * Walk obj's children and report the first one not marked used (an unknown key):
 * returns -EINVAL with err "FILE:LINE: PATH: unknown key", or 0.  Recurses into objects
 * that were used.
 */
int cfg_check_unused(const struct cfg_node *obj, char *err, size_t errlen);

#endif
