/*
 * config_print -- sluiced -n and -D: a loaded configuration written back in sluice.conf
 * syntax from the tables (config_schema.c), all of it or what differs from the defaults;
 * config_print_block() writes the daemon's blocks from their modules' tables too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg_schema.h"
#include "config.h"
#include "config_schema.h"

void config_print(FILE *f, const struct sluice_config *c, bool all,
		  config_print_inside_fn *inside, const void *arg)
{
	struct sluice_config *d = calloc(1, sizeof(*d));
	if (!d || config_init(d) < 0) {
		fprintf(stderr, "sluiced: out of memory\n");
		config_free(d);
		return;
	}
	const struct sluice_config *defaults = all ? NULL : d;
	for (const struct config_block *b = config_blocks; b->name; b++) {
		if (!*b->name) {
			cfg_schema_print(f, b->keys, c, defaults, 0);
			continue;
		}
		if (b->present && !b->present(c))
			continue;
		/* the store's two tables make one block */
		if (b > config_blocks && strcmp(b[-1].name, b->name) == 0)
			continue;
		char *text = NULL;
		size_t len = 0;
		FILE *m = open_memstream(&text, &len);
		if (!m)
			continue;
		size_t lines = cfg_schema_print(m, b->keys, c, defaults, 1);
		if (b[1].name && strcmp(b[1].name, b->name) == 0)
			lines += cfg_schema_print(m, b[1].keys, c, defaults, 1);
		if (inside)
			lines += inside(m, b->name, all, arg);
		fclose(m);
		if (lines || b->present)
			fprintf(f, "%s {\n%s}\n", b->name, text);
		free(text);
	}
	config_free(d);
}

size_t config_print_block(FILE *f, const char *name, const char *label,
			  const struct cfg_key *keys, const void *base, const void *defaults,
			  bool always)
{
	char *text = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	if (!m)
		return 0;
	size_t lines = cfg_schema_print(m, keys, base, defaults, 1);
	fclose(m);
	if (lines || always) {
		char q[1024];
		if (label)
			fprintf(f, "%s %s {\n%s}\n", name, cfg_quote(label, q, sizeof(q)), text);
		else
			fprintf(f, "%s {\n%s}\n", name, text);
	}
	free(text);
	return lines;
}
