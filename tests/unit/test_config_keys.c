/*
 * test_config_keys -- every key the configuration schema reads is documented in
 * sluice.conf(5) with its default, and every key the page documents is read.
 *
 * The schema's keys are collected with cfg_set_lookup_hook() while daemon_config_load()
 * reads kitchen-sink configurations that hold every kind of block (a fixed-reply milter,
 * and rules with a Redis store, sentinels, relay, routes...): each key appears as its
 * dotted path without labels ("route.auth.user", "" blocks give "workers").
 *
 * The page's keys are its definition lines, under the section of their block:
 *
 *   # TOP-LEVEL KEYS            keys of the root
 *   # milter { }                keys of milter (and the key "milter" itself)
 *   # limit NAME { }            keys of limit
 *   ## route.auth { }           keys of route.auth
 *   # SELECTORS (no braces)     not a block: its definition lines are not keys
 *
 * A definition line starts at column 0 with one or more *key* separated by ", ", then
 * " = " (or " =" at the end of the line), or " { ... }" whose *inner* = keys are keys of
 * that sub-block (*retry* { *min* = _d_; *max* = _d_; }).  Its description is the
 * tab-indented lines that follow; it must say "Default" or "Required".
 *
 * Usage: test_config_keys PATH/sluice.conf.5.scd
 */
#include <ctype.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cmocka.h>

#include "cfg.h"
#include "class.h"
#include "config.h"
#include "config_schema.h"
#include "daemon_config.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static const char *man_path;

/* ---- a small set of strings ------------------------------------------------------ */

struct strset {
	char **v;
	size_t n;
	size_t cap;
};

static bool strset_has(const struct strset *s, const char *k)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], k) == 0)
			return true;
	return false;
}

static void strset_add(struct strset *s, const char *k)
{
	if (strset_has(s, k))
		return;
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 64;
		s->v = realloc(s->v, s->cap * sizeof(*s->v));
		assert_non_null(s->v);
	}
	s->v[s->n] = strdup(k);
	assert_non_null(s->v[s->n]);
	s->n++;
}

static void strset_clear(struct strset *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	memset(s, 0, sizeof(*s));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void join_key(char *buf, size_t len, const char *block, const char *key)
{
	int w = block[0] ? snprintf(buf, len, "%s.%s", block, key) : snprintf(buf, len, "%s", key);
	assert_true(w > 0 && (size_t)w < len);
}

/* ---- the keys the schema reads ---------------------------------------------------- */

static void on_lookup(void *arg, const char *block, const char *key)
{
	char k[600];
	join_key(k, sizeof(k), block, key);
	strset_add(arg, k);
}

static char dir[] = "/tmp/sluice-config-keys-XXXXXX";

static void write_file(const char *name, const char *text)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(chmod(path, 0600), 0); /* the secret files must be private */
}

/* A fixed-reply milter (it cannot be combined with rules), every other service, the
 * memory store. */
static const char conf_reply[] =
	"workers = 1; stats_interval = 5m; shutdown_timeout = 30s; pid_file = \"p.pid\";\n"
	"state_dir = \"state\";\n"
	"log { target = \"stderr\"; facility = \"mail\"; level = \"info\"; }\n"
	"control { listen = [\"unix:c.sock\", \"inet:127.0.0.1:9188\"]; mode = \"0660\";\n"
	"  password_file = \"control.secret\"; read_password_file = \"control-read.secret\"; }\n"
	"metrics { listen = \"inet:127.0.0.1:9187\"; allow_remote = false; max_connections = 4; }\n"
	"milter { listen = \"unix:m.sock\"; mode = \"0660\"; max_sessions = 10; idle_timeout = 1h;\n"
	"  command_timeout = 1m; max_packet = 1MiB;\n"
	"  reply { connect = continue; helo = continue; mail = continue; rcpt = continue;\n"
	"    data = continue; header = continue; eoh = continue; body = continue;\n"
	"    eom = accept; unknown = continue; }\n"
	"  modify { add_header = [\"X-A: 1\"]; insert_header = [\"1 X-B: 2\"];\n"
	"    change_header = [\"1 Subject: x\"]; add_rcpt = [\"<a@example.com>\"];\n"
	"    add_rcpt_par = [\"<b@example.com> NOTIFY=NEVER\"]; del_rcpt = [\"<c@example.com>\"];\n"
	"    change_from = \"<d@example.com>\"; replace_body = \"x\"; quarantine = \"q\"; }\n"
	"}\n"
	"policy { listen = \"inet:127.0.0.1:10031\"; mode = \"0666\"; max_sessions = 10;\n"
	"  idle_timeout = 1h; command_timeout = 1m; max_request = 64KiB; }\n"
	"intake { listen = \"inet:127.0.0.1:10025\"; allow = [\"127.0.0.0/8\"]; mode = \"0666\";\n"
	"  max_sessions = 10; max_message_size = 10MiB; max_recipients = 100;\n"
	"  max_line_length = 998; max_errors = 20; idle_timeout = 5m; command_timeout = 5m;\n"
	"  hostname = \"mx.example.org\"; }\n"
	"queue { dir = \"queue\"; commit_batch = 16; lifetime = 5d; }\n"
	"store { type = \"memory\"; max_keys = 1000; snapshot_interval = 5m; overrides_check = 5s; }\n";

/* Rules, classes, a Redis store, the relay and both kinds of route. */
static const char conf_rules[] =
	"milter { listen = \"unix:m.sock\"; }\n"
	"intake { listen = \"inet:127.0.0.1:10025\"; }\n"
	"queue { dir = \"queue\"; }\n"
	"store { type = \"redis\"; server = \"127.0.0.1:6379\"; user = \"u\";\n"
	"  password_file = \"redis.secret\"; db = 1; prefix = \"s:\"; timeout = 50ms;\n"
	"  on_failure = \"local\"; nodes = 2; node = \"n1\"; lease = 15s; max_keys = 1000;\n"
	"  snapshot_interval = 5m; overrides_check = 5s; }\n"
	"class \"campus\" { hosts = [\"*.example.edu\", \"192.0.2.0/24\"]; sessions = 8; inbound = 4; }\n"
	"class \"default\" { hosts = \"*\"; sessions = 3; inbound = 3; }\n"
	"limit \"per-domain\" { stage = \"rcpt\"; key = \"rcpt_domain\"; count = \"messages\";\n"
	"  rate = [\"10/1m\", \"500/1d\"]; burst = 20; action = \"tempfail\";\n"
	"  reply = \"451 4.7.1 Too much mail for %{key}\"; count_rejected = false;\n"
	"  except { client_ip = [\"127.0.0.0/8\"]; } overrides = \"domains.limits\"; }\n"
	"relay { hostname = \"relay.example.org\"; retry { min = 5m; max = 4h; }\n"
	"  suspend { min = 1m; max = 1h; } uncertain = \"hold\"; postmaster = \"pm@example.org\";\n"
	"  dns_servers = \"127.0.0.1:53\"; idle_timeout = 10s; delay_warning = 4h; }\n"
	"route \"isp\" { domains = [\"*.example.com\"]; smarthost = \"[127.0.0.1]:2525\";\n"
	"  helo = \"me.example.org\"; tls = \"verify\"; ca_file = \"ca.pem\"; sni = \"smtp.example.net\";\n"
	"  source = \"127.0.0.1\";\n"
	"  auth { user = \"me\"; password_file = \"isp.secret\"; mechanisms = \"PLAIN\"; plaintext = false; }\n"
	"  rate = [\"8/1m\"]; count = \"messages\"; connections = 1; messages_per_connection = 10;\n"
	"  recipients_per_message = 10; guard = 100ms; shared = true; connect_timeout = 30s;\n"
	"  command_timeout = 5m; data_timeout = 10m;\n"
	"  signal { match = \"^550 .*quota\"; action = \"suspend\"; for = 1h; } }\n"
	"route \"mx\" { domains = \"*\"; mx = true; lanes = \"provider\";\n"
	"  signal { match = \"^451 \"; after = 5; within = 10m; } }\n"
	"provider \"big\" { mx = [\"*.mx.example.net\"]; rate = [\"600/1m\"]; connections = 10; }\n";

/* The other way to find Redis. */
static const char conf_sentinels[] =
	"policy { listen = \"inet:127.0.0.1:10031\"; }\n"
	"store { type = \"redis\"; sentinels = [\"127.0.0.1:26379\"]; master_name = \"m\";\n"
	"  password = \"x\"; }\n"
	"limit \"l\" { stage = \"connect\"; key = \"client_ip\"; rate = \"10/1m\"; }\n";

/* And a Redis Cluster. */
static const char conf_cluster[] =
	"policy { listen = \"inet:127.0.0.1:10031\"; }\n"
	"store { type = \"redis\"; cluster = [\"127.0.0.1:7000\", \"127.0.0.1:7001\"]; }\n"
	"limit \"l\" { stage = \"connect\"; key = \"client_ip\"; rate = \"10/1m\"; }\n";

/* Owners and groups of every socket (root exists everywhere). */
static const char conf_ids[] =
	"user = \"root\"; group = \"root\";\n"
	"control { listen = \"unix:c.sock\"; owner = \"root\"; group = \"root\"; admin = \"root\"; }\n"
	"milter { listen = \"unix:m.sock\"; owner = \"root\"; group = \"root\"; }\n"
	"policy { listen = \"unix:p.sock\"; owner = \"root\"; group = \"root\"; }\n"
	"intake { listen = \"unix:i.sock\"; owner = \"root\"; group = \"root\"; }\n";

/* The keys `sluiced -D` writes for the configurations loaded ("block.key"). */
static struct strset printed;

/* Adds the keys of config_print()'s text (blocks nest by "name {" ... "}"). */
static void collect_printed(const char *text)
{
	char stack[4][200] = { "" };
	size_t depth = 0;
	for (const char *line = text; *line;) {
		const char *eol = strchr(line, '\n');
		size_t len = eol ? (size_t)(eol - line) : strlen(line);
		char l[9000];
		snprintf(l, sizeof(l), "%.*s", (int)len, line);
		char *p = l + strspn(l, " ");
		if (strncmp(p, "# ", 2) == 0)
			p += 2;
		char name[64];
		if (strcmp(p, "}") == 0) {
			assert_true(depth > 0);
			depth--;
		} else if (sscanf(p, "%63[a-z_] {", name) == 1 && strstr(p, " {")) {
			assert_true(depth < 3);
			char up[200];
			memcpy(up, stack[depth], sizeof(up));
			join_key(stack[depth + 1], sizeof(stack[0]), up, name);
			depth++;
		} else if (sscanf(p, "%63[a-z_] = ", name) == 1) {
			char k[200];
			join_key(k, sizeof(k), stack[depth], name);
			strset_add(&printed, k);
		} else {
			fail_msg("sluiced -D wrote a line of no key: %s", l);
		}
		line += len + (eol ? 1 : 0);
	}
	assert_int_equal(depth, 0);
}

static void load_ok(const char *name, const char *text)
{
	char path[256], err[1024];
	struct sluice_config *c = NULL;

	write_file(name, text);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int r = daemon_config_load(path, &c, err, sizeof(err));
	if (r < 0)
		fail_msg("%s does not load: %s", name, err);
	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);
	assert_non_null(f);
	daemon_config_print(f, c, true);
	assert_int_equal(fclose(f), 0);
	collect_printed(out);
	daemon_config_free(c);
	/* what -D writes loads again, and is written the same */
	char again[64];
	snprintf(again, sizeof(again), "again-%s", name);
	write_file(again, out);
	snprintf(path, sizeof(path), "%s/%s", dir, again);
	c = NULL;
	if (daemon_config_load(path, &c, err, sizeof(err)) < 0)
		fail_msg("sluiced -D of %s does not load: %s\n%s", name, err, out);
	char *out2 = NULL;
	f = open_memstream(&out2, &len);
	assert_non_null(f);
	daemon_config_print(f, c, true);
	assert_int_equal(fclose(f), 0);
	if (strcmp(out, out2) != 0)
		fail_msg("sluiced -D of %s reads back otherwise:\n%s\n---\n%s", name, out, out2);
	free(out2);
	free(out);
	daemon_config_free(c);
	snprintf(path, sizeof(path), "%s/%s", dir, again);
	unlink(path);
}

static void collect_schema_keys(struct strset *read)
{
	memcpy(dir + sizeof(dir) - 7, "XXXXXX", 6);
	assert_non_null(mkdtemp(dir));
	write_file("redis.secret", "secret\n");
	write_file("isp.secret", "secret\n");
	write_file("control.secret", "admin secret\n");
	write_file("control-read.secret", "read secret\n");
	write_file("ca.pem", "");
	write_file("domains.limits", "example.com 100/1m\n");
	char cwd[4096];
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(dir), 0); /* relative sockets and state_dir */

	cfg_set_lookup_hook(on_lookup, read);
	load_ok("reply.conf", conf_reply);
	load_ok("rules.conf", conf_rules);
	load_ok("sentinels.conf", conf_sentinels);
	load_ok("cluster.conf", conf_cluster);
	load_ok("ids.conf", conf_ids);
	cfg_set_lookup_hook(NULL, NULL);

	assert_int_equal(chdir(cwd), 0);
	const char *names[] = { "redis.secret", "isp.secret", "control.secret",
				"control-read.secret", "ca.pem", "domains.limits", "reply.conf",
				"rules.conf", "sentinels.conf", "cluster.conf", "ids.conf" };
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		char p[256];
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
}

/* ---- the keys the man page documents ---------------------------------------------- */

struct entry {
	char keys[16][128];
	size_t n;
	bool has_default;
	unsigned line;
	char text[4096]; /* the description, its lines joined by spaces */
};

/* "key" -> the X of the first "Default *X*" in its description. */
static struct strset doc_defaults;

/* Reads "*name*" at *p (a key: letters, digits, '_', '\_'); advances past it. */
static bool read_key(const char **p, char *out, size_t len)
{
	const char *s = *p;
	size_t o = 0;
	if (*s++ != '*')
		return false;
	while (*s && *s != '*') {
		if (*s == '\\') {
			s++;
			continue;
		}
		if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '_') ||
		    o + 1 >= len)
			return false;
		out[o++] = *s++;
	}
	if (*s != '*' || o == 0)
		return false;
	out[o] = '\0';
	*p = s + 1;
	return true;
}

/* Parses a definition line into e (keys with their block); false when it is prose. */
static bool parse_definition(const char *line, const char *block, struct entry *e, unsigned lineno)
{
	const char *p = line;
	char names[16][64];
	size_t n = 0;

	memset(e, 0, sizeof(*e));
	e->line = lineno;
	for (;;) {
		if (n == ARRAY_SIZE(names) || !read_key(&p, names[n], sizeof(names[n])))
			return false;
		n++;
		if (strncmp(p, ", ", 2) != 0)
			break;
		p += 2;
	}
	bool assign = strcmp(p, " =") == 0 || strncmp(p, " = ", 3) == 0;
	if (!assign && (strncmp(p, " { ", 3) != 0 || n != 1))
		return false; /* prose that starts with a word in bold */
	for (size_t i = 0; i < n; i++)
		join_key(e->keys[e->n++], sizeof(e->keys[0]), block, names[i]);
	if (assign)
		return true;
	/* *name* { *inner* = ...; ... }: the inner keys belong to block.name */
	char sub[128];
	join_key(sub, sizeof(sub), block, names[0]);
	for (p += 3; *p && *p != '}'; p++) {
		char inner[64];
		const char *q = p;
		if (*p == '*' && read_key(&q, inner, sizeof(inner)) && strncmp(q, " =", 2) == 0) {
			assert_true(e->n < ARRAY_SIZE(e->keys));
			join_key(e->keys[e->n++], sizeof(e->keys[0]), sub, inner);
			p = q;
		}
	}
	return true;
}

/* The block a section title opens: "" for TOP-LEVEL KEYS, the first word of a title
 * ending in "{ }", else NULL (not a block). */
static bool section_block(const char *title, char *out, size_t len)
{
	if (strcmp(title, "TOP-LEVEL KEYS") == 0) {
		out[0] = '\0';
		return true;
	}
	size_t tl = strlen(title);
	if (tl < 4 || strcmp(title + tl - 3, "{ }") != 0)
		return false;
	size_t w = strcspn(title, " ");
	assert_true(w < len);
	memcpy(out, title, w);
	out[w] = '\0';
	return true;
}

static void close_entry(struct entry *e, struct strset *doc, struct strset *no_default)
{
	const char *d = strstr(e->text, "Default *");
	char def[300] = "";
	if (d) {
		d += strlen("Default *");
		size_t n = strcspn(d, "*");
		if (d[n] == '*' && n < 200)
			snprintf(def, sizeof(def), "%.*s", (int)n, d);
	}
	for (size_t i = 0; i < e->n; i++) {
		strset_add(doc, e->keys[i]);
		if (def[0]) {
			char kv[600];
			snprintf(kv, sizeof(kv), "%s=%s", e->keys[i], def);
			strset_add(&doc_defaults, kv);
		}
		if (!e->has_default) {
			char msg[200];
			snprintf(msg, sizeof(msg), "%s (line %u)", e->keys[i], e->line);
			strset_add(no_default, msg);
		}
	}
	e->n = 0;
	e->text[0] = '\0';
}

static void collect_documented_keys(struct strset *doc, struct strset *no_default)
{
	FILE *f = fopen(man_path, "r");
	if (!f)
		fail_msg("%s: %s", man_path, strerror(errno));
	char line[4096], block[128];
	bool in_block = false, in_fence = false;
	struct entry e = { .n = 0 };
	unsigned lineno = 0;

	while (fgets(line, sizeof(line), f)) {
		lineno++;
		line[strcspn(line, "\n")] = '\0';
		if (strncmp(line, "```", 3) == 0) {
			in_fence = !in_fence;
			continue;
		}
		if (in_fence)
			continue;
		if (line[0] == '#') {
			close_entry(&e, doc, no_default);
			const char *t = line + strspn(line, "#");
			t += strspn(t, " ");
			in_block = section_block(t, block, sizeof(block));
			if (in_block && block[0])
				strset_add(doc, block); /* the block's own key */
			continue;
		}
		if (line[0] == '\t' && e.n > 0) {
			if (strcasestr(line, "default") || strcasestr(line, "required"))
				e.has_default = true;
			size_t tl = strlen(e.text);
			snprintf(e.text + tl, sizeof(e.text) - tl, "%s ", line + 1);
			continue;
		}
		close_entry(&e, doc, no_default);
		if (in_block && line[0] == '*' && parse_definition(line, block, &e, lineno))
			e.has_default = strcasestr(line, "default") || strcasestr(line, "required");
	}
	close_entry(&e, doc, no_default);
	fclose(f);
}

/* ---- the comparison --------------------------------------------------------------- */

static size_t report(const char *what, struct strset *s)
{
	if (s->n == 0)
		return 0;
	qsort(s->v, s->n, sizeof(*s->v), cmp_str);
	print_message("%s (%zu):\n", what, s->n);
	for (size_t i = 0; i < s->n; i++)
		print_message("  %s\n", s->v[i]);
	return s->n;
}

static void test_keys_documented(void **state)
{
	(void)state;
	struct strset read = { 0 }, doc = { 0 }, no_default = { 0 };
	struct strset undocumented = { 0 }, unread = { 0 };

	collect_schema_keys(&read);
	collect_documented_keys(&doc, &no_default);
	assert_true(read.n > 100); /* the hook saw the schema at work */
	assert_true(doc.n > 100);  /* the page parsed */
	for (size_t i = 0; i < read.n; i++)
		if (!strset_has(&doc, read.v[i]))
			strset_add(&undocumented, read.v[i]);
	for (size_t i = 0; i < doc.n; i++)
		if (!strset_has(&read, doc.v[i]))
			strset_add(&unread, doc.v[i]);

	size_t bad = report("keys the parser reads that sluice.conf(5) does not document "
			    "(add a definition line '*key* = ...' with its default under the "
			    "block's section)", &undocumented);
	bad += report("keys sluice.conf(5) documents that the parser does not read (or whose "
		      "block the configurations of tests/unit/test_config_keys.c lack: add it "
		      "there)", &unread);
	bad += report("keys sluice.conf(5) documents without a default (say \"Default\" or "
		      "\"Required\" in the description)", &no_default);
	strset_clear(&read);
	strset_clear(&doc);
	strset_clear(&no_default);
	strset_clear(&undocumented);
	strset_clear(&unread);
	if (bad)
		fail_msg("%s and the configuration schema disagree on %zu keys (listed above)",
			 man_path, bad);
}

/* Every key of the tables, as "block.key" ("relay.retry.min"); secrets apart. */
static void table_keys(const struct cfg_key *keys, const char *block, struct strset *all,
		       struct strset *secret)
{
	for (const struct cfg_key *k = keys; k->name; k++) {
		char path[200];
		join_key(path, sizeof(path), block, k->name);
		if (k->type == &cfg_type_block) {
			table_keys(k->sub, path, all, secret);
			continue;
		}
		strset_add(all, path);
		if (secret && (k->flags & CFG_SECRET))
			strset_add(secret, path);
	}
}

/* The value of text for key k, in the form k's type writes it; false if it does not parse. */
static bool normal_value(const struct cfg_key *k, const char *text, char *out, size_t len)
{
	char v[256];
	size_t n = strlen(text);
	if (n >= 2 && text[0] == '"' && text[n - 1] == '"')
		snprintf(v, sizeof(v), "%.*s", (int)n - 2, text + 1);
	else
		snprintf(v, sizeof(v), "%s", text);
	_Alignas(max_align_t) char field[256] = { 0 };
	struct cfg_node node = { .kind = CFG_SCALAR, .key = (char *)k->name, .value = v,
				 .value_len = strlen(v), .file = "doc" };
	char err[300];
	if (k->type->parse(&node, k, field, err, sizeof(err)) < 0)
		return false;
	bool ok = k->type->format(k, field, out, len);
	if (k->type->clear)
		k->type->clear(field);
	return ok;
}

static size_t defaults_compared;

/* The defaults sluice.conf(5) states ("Default *X*") are the tables' (keys of lists and
 * of no default in a table are left out); returns the number that differ. */
static size_t compare_defaults(const struct cfg_key *keys, const char *block)
{
	size_t bad = 0;
	for (const struct cfg_key *k = keys; k->name; k++) {
		char path[200];
		join_key(path, sizeof(path), block, k->name);
		if (k->type == &cfg_type_block) {
			bad += compare_defaults(k->sub, path);
			continue;
		}
		if (!k->def || (k->flags & CFG_REPEAT))
			continue;
		const char *doc = NULL;
		size_t pl = strlen(path);
		for (size_t i = 0; i < doc_defaults.n && !doc; i++)
			if (strncmp(doc_defaults.v[i], path, pl) == 0 && doc_defaults.v[i][pl] == '=')
				doc = doc_defaults.v[i] + pl + 1;
		if (!doc)
			continue;
		char a[512], b[512];
		assert_true(normal_value(k, k->def, a, sizeof(a)));
		defaults_compared++;
		if (!normal_value(k, doc, b, sizeof(b)) || strcmp(a, b) != 0) {
			print_message("default of %s: %s in its table, *%s* in sluice.conf(5)\n",
				      path, k->def, doc);
			bad++;
		}
	}
	return bad;
}

/*
 * sluice.conf(5) and the tables agree: every key of a table is documented, every key the
 * page documents in a block the tables hold is in them, and sluiced -D writes every key
 * of the tables but the secrets.
 */
static void test_tables(void **state)
{
	(void)state;
	struct strset read = { 0 }, doc = { 0 }, no_default = { 0 }, all = { 0 }, secret = { 0 };
	struct strset blocks = { 0 };
	size_t bad = 0;

	collect_schema_keys(&read);
	collect_documented_keys(&doc, &no_default);
	for (const struct config_block *b = config_blocks; b->name; b++) {
		table_keys(b->keys, b->name, &all, &secret);
		strset_add(&blocks, b->name);
	}
	table_keys(relay_conf_keys, "relay", &all, &secret);
	strset_add(&blocks, "relay");
	strset_add(&blocks, "relay.retry");
	strset_add(&blocks, "relay.suspend");
	/* the tables of the blocks that repeat or hang on other modules: documented too */
	struct strset route = { 0 };
	table_keys(route_conf_keys, "route", &route, NULL);
	table_keys(route_auth_keys, "route.auth", &route, NULL);
	table_keys(route_signal_keys, "route.signal", &route, NULL);
	table_keys(provider_conf_keys, "provider", &route, NULL);
	table_keys(policy_limit_keys, "limit", &route, NULL);
	table_keys(policy_class_keys, "class", &route, NULL);
	table_keys(milter_static_reply_keys, "milter.reply", &route, NULL);
	table_keys(milter_static_modify_keys, "milter.modify", &route, NULL);
	for (size_t i = 0; i < route.n; i++)
		if (!strset_has(&doc, route.v[i])) {
			print_message("in a table, not in sluice.conf(5): %s\n", route.v[i]);
			bad++;
		}
	strset_clear(&route);
	for (const struct config_block *b = config_blocks; b->name; b++)
		bad += compare_defaults(b->keys, b->name);
	bad += compare_defaults(relay_conf_keys, "relay");
	bad += compare_defaults(route_conf_keys, "route");
	bad += compare_defaults(route_signal_keys, "route.signal");
	bad += compare_defaults(route_auth_keys, "route.auth");
	bad += compare_defaults(policy_limit_keys, "limit");
	bad += compare_defaults(policy_class_keys, "class");
	bad += compare_defaults(milter_static_modify_keys, "milter.modify");
	bad += compare_defaults(provider_conf_keys, "provider");
	assert_true(doc_defaults.n > 50);
	assert_true(defaults_compared > 40); /* the page's "Default *X*" were found */
	assert_true(all.n > 60);
	for (size_t i = 0; i < all.n; i++) {
		if (!strset_has(&doc, all.v[i])) {
			print_message("in a table, not in sluice.conf(5): %s\n", all.v[i]);
			bad++;
		}
		if (!strset_has(&printed, all.v[i]) && !strset_has(&secret, all.v[i])) {
			print_message("in a table, not written by sluiced -D: %s\n", all.v[i]);
			bad++;
		}
	}
	for (size_t i = 0; i < doc.n; i++) {
		char block[200];
		const char *dot = strrchr(doc.v[i], '.');
		snprintf(block, sizeof(block), "%.*s", dot ? (int)(dot - doc.v[i]) : 0, doc.v[i]);
		if (!strset_has(&blocks, block) || strset_has(&all, doc.v[i]))
			continue;
		/* a block's own name, or a sub-block whose content is code (milter.reply) */
		char prefix[200];
		snprintf(prefix, sizeof(prefix), "%s.", doc.v[i]);
		bool is_block = false;
		for (size_t j = 0; j < doc.n && !is_block; j++)
			is_block = strncmp(doc.v[j], prefix, strlen(prefix)) == 0;
		if (is_block || (!dot && (strcmp(doc.v[i], "limit") == 0 ||
					  strcmp(doc.v[i], "class") == 0 ||
					  strcmp(doc.v[i], "route") == 0)))
			continue;
		print_message("in sluice.conf(5), not in a table: %s\n", doc.v[i]);
		bad++;
	}
	strset_clear(&read);
	strset_clear(&doc);
	strset_clear(&no_default);
	strset_clear(&all);
	strset_clear(&secret);
	strset_clear(&blocks);
	strset_clear(&printed);
	strset_clear(&doc_defaults);
	if (bad)
		fail_msg("the tables of src/conf/config_schema.c, %s and sluiced -D disagree on "
			 "%zu keys (listed above)", man_path, bad);
}

/* The hook itself: the block path has no labels, lookups of absent keys count. */
static void on_lookup_line(void *arg, const char *block, const char *key)
{
	char k[600];
	join_key(k, sizeof(k), block, key);
	strncat(arg, k, 1000);
	strncat(arg, " ", 1000);
}

static void test_hook_paths(void **state)
{
	(void)state;
	static const char text[] = "route \"a\" { auth { user = x; } }\n";
	struct cfg_node *root = NULL;
	char err[256], seen[1024] = "";

	assert_int_equal(cfg_parse("t.conf", text, sizeof(text) - 1, &root, err, sizeof(err)), 0);
	cfg_set_lookup_hook(on_lookup_line, seen);
	struct cfg_node *route = cfg_get(root, "route");
	struct cfg_node *auth = cfg_get(route, "auth");
	assert_non_null(cfg_get(auth, "user"));
	assert_null(cfg_get(auth, "mechanisms"));
	cfg_set_lookup_hook(NULL, NULL);
	assert_null(cfg_get(auth, "after")); /* no hook: not recorded */
	assert_string_equal(seen, "route route.auth route.auth.user route.auth.mechanisms ");
	cfg_free(root);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s PATH/sluice.conf.5.scd\n", argv[0]);
		return 2;
	}
	man_path = argv[1];
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hook_paths),
		cmocka_unit_test(test_keys_documented),
		cmocka_unit_test(test_tables),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
