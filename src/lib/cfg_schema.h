/*
 * cfg_schema -- configuration keys declared as data, and the one walker that reads them.
 *
 * A block's keys are a table of struct cfg_key (name, type, default, bounds, offset into
 * the block's struct, one line of help), as nginx's ngx_command_t or Redis's configs[].
 * cfg_schema_defaults() stores every default; cfg_schema_load() reads a block of the cfg
 * tree against its table: it checks types and bounds, refuses a key given twice, and its
 * errors are cfg's "FILE:LINE: KEY: message".  Keys it does not know stay unused in the
 * tree for cfg_check_unused().  cfg_schema_print() writes a block back in sluice.conf
 * syntax, so that `sluiced -n` and `-D` and the manual read the same tables.
 *
 * Generic: knows nothing of mail.  A type is a struct cfg_type (parse, format, clear);
 * the common ones are below, and a module may declare its own (listen addresses, ...).
 */
#ifndef SLUICE_CFG_SCHEMA_H
#define SLUICE_CFG_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "cfg.h"

struct cfg_key;

struct cfg_type {
	const char *name; /* in help: "string", "duration", ... */
	/* n: the key's first node; field: base + offset.  0 or -EINVAL with err set. */
	int (*parse)(const struct cfg_node *n, const struct cfg_key *k, void *field,
		     char *err, size_t errlen);
	/* The value in sluice.conf syntax; false when unset (nothing to write). */
	bool (*format)(const struct cfg_key *k, const void *field, char *buf, size_t size);
	void (*clear)(void *field); /* frees what parse allocated; NULL: nothing */
};

struct cfg_enum {
	const char *name;
	int value;
};

enum {
	CFG_REQUIRED = 1 << 0, /* "KEY is required" when the block lacks it; always printed */
	CFG_REPEAT = 1 << 1,   /* may be given several times (lists): parse sees them all */
	CFG_QUOTE = 1 << 2,    /* enum: the error quotes the value given */
	CFG_SECRET = 1 << 3,   /* never written by cfg_schema_print() */
};

struct cfg_key {
	const char *name;
	const struct cfg_type *type;
	size_t offset;                 /* of the field in the block's struct */
	const char *def;               /* default in sluice.conf syntax; NULL: left as is */
	int64_t min, max;              /* bounds of numbers (size: bytes, duration: ms) */
	const struct cfg_enum *names;  /* enum: { NULL } ends it */
	const struct cfg_key *sub;     /* block: its keys, same base; { NULL } ends it */
	unsigned flags;
	/* Further checks of this key's value once stored: 0 or -EINVAL with err set. */
	int (*check)(const struct cfg_node *n, const void *field, char *err, size_t errlen);
	/* Whether the key applies given the block's other values (e.g. Redis keys with
	 * type = "redis"); cfg_schema_print() comments out the others.  NULL: always. */
	bool (*active)(const void *base);
	const char *help;
	/* 0: a change applies at reload.  Else a new value waits for a restart, and this is
	 * the group of such keys the caller's warning names (cfg_schema_restarts()). */
	unsigned restart;
};

extern const struct cfg_type cfg_type_string;   /* char *, owned, not empty */
extern const struct cfg_type cfg_type_bool;     /* bool */
extern const struct cfg_type cfg_type_uint;     /* unsigned, [min, max] */
extern const struct cfg_type cfg_type_uint64;   /* uint64_t, an integer in [min, max] */
extern const struct cfg_type cfg_type_duration; /* int64_t milliseconds, [min, max] */
extern const struct cfg_type cfg_type_size;     /* uint64_t bytes, [min, max] */
extern const struct cfg_type cfg_type_enum;     /* int, one of names */
extern const struct cfg_type cfg_type_mode;     /* unsigned, an octal mode <= 0777 */
extern const struct cfg_type cfg_type_user;     /* uid_t, a user name or number */
extern const struct cfg_type cfg_type_group;    /* gid_t, a group name or number */
extern const struct cfg_type cfg_type_list;     /* char **, NULL-terminated, <= 1000 */
extern const struct cfg_type cfg_type_block;    /* a sub-block: its keys in sub */

/* Store every default of keys (and of their sub-blocks) into base.  0 or -ENOMEM;
 * a default that does not parse is a broken table and aborts. */
int cfg_schema_defaults(const struct cfg_key *keys, void *base);

/* Read obj against keys into base.  0, or -EINVAL/-ENOMEM with err set. */
int cfg_schema_load(struct cfg_node *obj, const struct cfg_key *keys, void *base, char *err,
		    size_t errlen);

/* Free what the string and list fields of base own. */
void cfg_schema_clear(const struct cfg_key *keys, void *base);

/*
 * Write keys' values from base as "key = value;" lines indented by depth tabs.  With
 * defaults non-NULL (the same struct holding only defaults) only values that differ are
 * written; without, every value is followed by its help as a comment.  Unset values are
 * skipped; inactive ones are written as comments.  Returns the number of lines written.
 */
size_t cfg_schema_print(FILE *f, const struct cfg_key *keys, const void *base,
			const void *defaults, unsigned depth);

#define CFG_LIST_MAX 1000 /* items of a list key */

/*
 * The one reader of string lists: key = "a"; key = ["a", "b"]; or the key repeated (n:
 * its first node).  fn (may be NULL) gets each item's node and string, in order, and
 * returns 0 or -errno with err set.  More than CFG_LIST_MAX items is an error at n.
 */
int cfg_list_each(const struct cfg_node *n,
		  int (*fn)(void *arg, const struct cfg_node *item, const char *s, char *err,
			    size_t errlen),
		  void *arg, char *err, size_t errlen);
/* The items of node m alone (m, or m's elements when it is a list), as cfg_list_each()
 * walks each of a repeated key's nodes. */
int cfg_items_each(const struct cfg_node *m,
		   int (*fn)(void *arg, const struct cfg_node *item, const char *s, char *err,
			     size_t errlen),
		   void *arg, char *err, size_t errlen);
/* Each item of the list at n passes ok(), or the error is "\"ITEM\": WHY" at its node
 * (a cfg_key's check for cfg_type_list keys). */
int cfg_list_check(const struct cfg_node *n, bool (*ok)(const char *s, const char **why),
		   char *err, size_t errlen);

/*
 * Which keys needing a restart differ between a and b (two structs of the table):
 * the union of 1u << k->restart over them (restart < 32).  A key inactive in both is not
 * compared; values compare as they are written (type->format).
 */
unsigned cfg_schema_restarts(const struct cfg_key *keys, const void *a, const void *b);

/* The number of keys in the table (sub-blocks' keys not counted). */
size_t cfg_schema_count(const struct cfg_key *keys);

/* A user name (or a number when no user has that name) to its uid and, with ret_gid, its
 * primary group; a group name (or number) to its gid.  0, or -EINVAL naming the node. */
int cfg_user(const struct cfg_node *n, uid_t *ret_uid, gid_t *ret_gid, char *err, size_t el);
int cfg_group(const struct cfg_node *n, gid_t *ret, char *err, size_t el);

/* A value as a quoted sluice.conf string (escaping " \ and control characters). */
const char *cfg_quote(const char *s, char *buf, size_t size);

#endif
