/*
 * config_core -- loading sluice.conf up to the rules: the blocks of the tables
 * (config_schema.c), the checks across their keys, and the secret files.
 *
 * This is all the sluice command reads (config_load_client), so it links nothing of the
 * policy engine, the milter or the relay; daemon_config_load() in src/daemon goes on
 * with the rules, the milter's fixed answers, the relay and the routes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cfg.h"
#include "cfg_schema.h"
#include "config.h"
#include "config_core.h"
#include "config_schema.h"
#include "listen.h"
#include "sockspec.h"
#include "util.h"

#define ERR(...) cfg_error(__VA_ARGS__)

static int load_policy(struct cfg_node *m, struct sluice_config *c, char *err, size_t el)
{
	return cfg_schema_load(m, config_policy_keys, c, err, el);
}

static int load_intake(struct cfg_node *m, struct sluice_config *c, char *err, size_t el)
{
	c->intake.enabled = true;
	return cfg_schema_load(m, config_intake_keys, c, err, el);
}

/*
 * An address of a service without authentication (metrics, control) that other hosts
 * can reach is refused at node n, the error saying what such a peer gets and the fix
 * (fix: "listen on ..."), unless allow_remote.  A host name is looked up only where
 * listen_parse() does (sluiced -t and the start, config_resolve_listen_hosts): a reload
 * binds nothing.  0 or -EINVAL.
 */
static int check_local_only(struct cfg_node *n, const char *text, bool allow_remote,
			    const char *gets, const char *fix, char *err, size_t el)
{
	struct listen_addr a;
	struct sockspec spec;
	char why[400];
	if (allow_remote)
		return 0;
	if (sockspec_parse(text, &spec, why, sizeof(why)) == 0 && !spec.numeric &&
	    !config_resolving_listen_hosts())
		return 0;
	if (listen_addr_parse(text, &a, why, sizeof(why)) < 0) {
		ERR(n, err, el, "%s", why);
		return -EINVAL;
	}
	if (!listen_addr_is_local(&a)) {
		ERR(n, err, el, "\"%.100s\" can be reached from other hosts, and %s: %s, or set "
		    "allow_remote = true", text, gets, fix);
		return -EINVAL;
	}
	return 0;
}

/* metrics { listen; allow_remote; max_connections; } -- the endpoint answers without
 * authentication, so an address other hosts can reach must be asked for. */
static int load_metrics(struct cfg_node *m, struct sluice_config *c, char *err, size_t el)
{
	c->metrics.enabled = true;
	int r = cfg_schema_load(m, config_metrics_keys, c, err, el);
	if (r < 0)
		return r;
	struct cfg_node *n = cfg_get(m, "listen");
	return check_local_only(n ? n : m, c->metrics.listen, c->metrics.allow_remote,
				"the metrics have no authentication", "listen on 127.0.0.1 or ::1",
				err, el);
}

static int load_queue(struct cfg_node *m, struct sluice_config *c, char *err, size_t el)
{
	return cfg_schema_load(m, config_queue_keys, c, err, el);
}

/* The identity sluiced runs as: the configured user, or whoever started it. */
static uid_t daemon_uid(const struct sluice_config *c)
{
	return c->user && geteuid() == 0 ? c->uid : geteuid();
}

/*
 * A file holding a secret (a password_file, or sluice.conf with an inline password): no
 * access at all for others, and owned by root or by the daemon's user -- anyone else
 * could replace it.  0, or -EACCES with err naming the file, its mode and the fix.
 */
static int check_secret_file(struct cfg_node *n, const char *file, const struct sluice_config *c,
			     const char *why, char *err, size_t el)
{
	struct stat st;
	if (stat(file, &st) < 0) {
		int e = errno;
		ERR(n, err, el, "%s: %s", file, strerror(e));
		return -e;
	}
	unsigned mode = (unsigned)st.st_mode & 07777;
	if (mode & 007) {
		ERR(n, err, el, "%s%s has mode %04o: others may %s it; fix: chmod 0640 %s", file, why,
		    mode, mode & 002 ? "change" : "read", file);
		return -EACCES;
	}
	if (st.st_uid != 0 && st.st_uid != daemon_uid(c) && st.st_uid != geteuid()) {
		ERR(n, err, el, "%s%s is owned by uid %lu, neither root nor the daemon's user; "
		    "fix: chown root %s", file, why, (unsigned long)st.st_uid, file);
		return -EACCES;
	}
	return 0;
}

int config_secret_line(const char *file, char **ret)
{
	char *text = NULL;
	size_t len;
	int r = file_read_all(file, 4096, &text, &len);
	if (r < 0)
		return r;
	size_t line = strcspn(text, "\r\n");
	explicit_bzero(text + line, len - line); /* a second line is no business of ours */
	if (line == 0) {
		free(text);
		return -ENODATA;
	}
	*ret = text;
	return 0;
}

/* The first line of a secret file, checked by check_secret_file().  *ret is owned. */
int config_read_secret(struct cfg_node *n, const char *file, const struct sluice_config *c,
		       char **ret, char *err, size_t el)
{
	if (c->client)
		return 0; /* the sluice command needs no secret, and may not read one */
	int r = check_secret_file(n, file, c, "", err, el);
	if (r < 0)
		return -EINVAL;
	r = config_secret_line(file, ret);
	if (r == -ENODATA)
		ERR(n, err, el, "%s is empty", file);
	else if (r < 0)
		ERR(n, err, el, "%s: %s", file, strerror(-r));
	return r < 0 ? -EINVAL : 0;
}

/*
 * control { listen; allow_remote; password_file; read_password_file; } -- a unix socket
 * checks its peers' credentials; an inet one has none to check, so it takes a password
 * (control_service.c): an inet listen address without password_file is refused, and one
 * other hosts can reach must be asked for, the password crossing the network in clear.
 */
static int load_control(struct cfg_node *m, struct sluice_config *c, char *err, size_t el)
{
	int r = cfg_schema_load(m, config_control_keys, c, err, el);
	if (r < 0)
		return r;
	size_t i = 0;
	for (struct cfg_node *n = cfg_get(m, "listen"); n; n = cfg_next_same(n)) {
		struct cfg_node *items = n->kind == CFG_LIST ? n->child : n;
		for (struct cfg_node *it = items; it && i < c->control.n;
		     it = n->kind == CFG_LIST ? it->next : NULL) {
			const char *text = c->control.addr[i++];
			struct sockspec spec;
			char why[400];
			if (sockspec_parse(text, &spec, why, sizeof(why)) == 0 &&
			    spec.family != AF_UNIX && !c->control_password_file) {
				ERR(it, err, el, "\"%.100s\" is an inet address, whose clients carry no "
				    "credentials: give password_file = \"/etc/sluice/control.secret\"; "
				    "(a file only root and sluiced's user may read), or use a unix socket",
				    text);
				return -EINVAL;
			}
			r = check_local_only(it, text, c->control_allow_remote,
					     "the control password crosses the network in clear",
					     "use a unix socket or 127.0.0.1/::1", err, el);
			if (r < 0)
				return r;
		}
	}
	const char *file = c->control_password_file;
	const char *read_file = c->control_read_password_file;
	if (read_file && !file) {
		ERR(cfg_get(m, "read_password_file"), err, el, "read_password_file needs "
		    "password_file (the password that runs every command)");
		return -EINVAL;
	}
	if (file)
		r = config_read_secret(cfg_get(m, "password_file"), file, c, &c->control_password,
				       err, el);
	if (r == 0 && read_file)
		r = config_read_secret(cfg_get(m, "read_password_file"), read_file, c,
				       &c->control_read_password, err, el);
	/* one password may not open both doors: which one a client gave must be clear */
	if (r == 0 && c->control_password && c->control_read_password &&
	    strcmp(c->control_password, c->control_read_password) == 0) {
		ERR(cfg_get(m, "read_password_file"), err, el, "%s holds the same password as %s: "
		    "the read-only password must be another", read_file, file);
		return -EINVAL;
	}
	return r;
}

/* The Redis password: inline, or the first line of password_file. */
static int load_password(struct cfg_node *m, struct sluice_config *c, char *err, size_t el)
{
	const char *file = c->store.password_file;
	if (file && c->store.password) {
		ERR(cfg_get(m, "password_file"), err, el, "give password or password_file, not both");
		return -EINVAL;
	}
	if (file)
		return config_read_secret(cfg_get(m, "password_file"), file, c, &c->store.password, err, el);
	return 0;
}

static int load_store(struct cfg_node *m, struct sluice_config *c, char *err, size_t el)
{
	int r = cfg_schema_load(m, config_store_keys, c, err, el);
	c->store.redis = r == 0 && c->store.type == 1;
	if (r == 0 && !c->store.redis) {
		struct cfg_node *n;
		for (const struct cfg_key *k = config_redis_keys; k->name; k++)
			if ((n = cfg_get(m, k->name))) {
				ERR(n, err, el, "only with type = \"redis\"");
				return -EINVAL;
			}
		return 0;
	}
	if (r == 0)
		r = cfg_schema_load(m, config_redis_keys, c, err, el);
	if (r == 0)
		r = load_password(m, c, err, el);
	if (r == 0 && c->store.user && !c->store.password && !c->store.password_file) {
		ERR(cfg_get(m, "user"), err, el, "a user needs a password (or password_file)");
		r = -EINVAL;
	}
	if (r == 0 && c->store.cluster) {
		while (c->store.cluster[c->store.ncluster])
			c->store.ncluster++;
		if (c->store.ncluster == 0) {
			ERR(cfg_get(m, "cluster"), err, el, "a cluster needs at least one seed node");
			r = -EINVAL;
		} else if (c->store.server || c->store.sentinels) {
			ERR(cfg_get(m, c->store.server ? "server" : "sentinels"), err, el,
			    "give cluster or %s, not both (the cluster says where its nodes are)",
			    c->store.server ? "server" : "sentinels");
			r = -EINVAL;
		} else if (c->store.db) {
			ERR(cfg_get(m, "db"), err, el, "a cluster has only database 0");
			r = -EINVAL;
		} else if (c->store.prefix && strpbrk(c->store.prefix, "{}")) {
			ERR(cfg_get(m, "prefix"), err, el, "a cluster's prefix cannot hold '{' or '}' "
			    "(a hash tag there would put every key in one slot)");
			r = -EINVAL;
		}
	}
	if (r == 0 && c->store.sentinels) {
		while (c->store.sentinels[c->store.nsentinels])
			c->store.nsentinels++;
		if (!c->store.master_name) {
			ERR(cfg_get(m, "sentinels"), err, el, "sentinels need master_name");
			r = -EINVAL;
		} else if (c->store.server) {
			ERR(cfg_get(m, "server"), err, el, "give server or sentinels, not both "
			    "(sentinels say where the master is)");
			r = -EINVAL;
		}
	} else if (r == 0 && c->store.master_name) {
		ERR(cfg_get(m, "master_name"), err, el, "master_name needs sentinels");
		r = -EINVAL;
	}
	return r;
}

static int load_core(struct cfg_node *root, struct sluice_config *c, char *err, size_t el)
{
	int r = cfg_schema_load(root, config_root_keys, c, err, el);
	/* first: the secret files' owner is checked against the user */
	if (r == 0 && c->user)
		r = cfg_user(cfg_get(root, "user"), &c->uid, &c->gid, err, el);
	if (r == 0 && c->group && !c->user) {
		ERR(cfg_get(root, "group"), err, el, "group needs user");
		r = -EINVAL;
	}
	if (r == 0 && c->group)
		r = cfg_group(cfg_get(root, "group"), &c->gid, err, el);
	struct cfg_node *n;
	if (r == 0 && (n = cfg_get(root, "log")))
		r = cfg_schema_load(n, config_log_keys, c, err, el);
	if (r == 0 && (n = cfg_get(root, "control")))
		r = load_control(n, c, err, el);
	if (r == 0 && (n = cfg_get(root, "metrics")))
		r = load_metrics(n, c, err, el);
	struct cfg_node *milter = cfg_get(root, "milter");
	struct cfg_node *policy = cfg_get(root, "policy");
	struct cfg_node *intake = cfg_get(root, "intake");
	if (r == 0 && !milter && !policy && !intake) {
		cfg_error(root, err, el, "nothing to serve: give a milter { listen = ...; }, a "
			  "policy { listen = ...; } or an intake { listen = ...; } block");
		r = -EINVAL;
	}
	if (r == 0 && milter) {
		r = cfg_schema_load(milter, config_milter_keys, c, err, el);
	}
	if (r == 0 && policy)
		r = load_policy(policy, c, err, el);
	if (r == 0 && intake)
		r = load_intake(intake, c, err, el);
	if (r == 0 && (n = cfg_get(root, "queue")))
		r = load_queue(n, c, err, el);
	if (r == 0 && (n = cfg_get(root, "store")))
		r = load_store(n, c, err, el);
	/* an inline password makes this file a secret too */
	if (r == 0 && n && cfg_get(n, "password") && !c->client &&
	    check_secret_file(cfg_get(n, "password"), c->path, c, " (it holds a password)", err,
			      el) < 0)
		r = -EINVAL;
	return r;
}

int config_core_load(const char *path, bool client, struct cfg_node **ret_root,
		     struct sluice_config *c, char *err, size_t errlen)
{
	struct cfg_node *root = NULL;
	err[0] = '\0';
	int r = cfg_parse_file(path, &root, err, errlen);
	if (r < 0)
		return r;
	c->client = client;
	c->path = strdup(path);
	r = config_init(c);
	if (r == 0 && !c->path)
		r = -ENOMEM;
	if (r == 0)
		r = load_core(root, c, err, errlen);
	if (r < 0) {
		cfg_free(root);
		if (!err[0])
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
		config_clear(c);
		return r;
	}
	*ret_root = root;
	return 0;
}

static void listen_conf_clear(struct listen_conf *lc)
{
	for (size_t i = 0; i < lc->n; i++)
		free(lc->addr[i]);
	lc->n = 0;
}

struct sluice_config *config_free(struct sluice_config *c)
{
	if (!c)
		return NULL;
	config_clear(c);
	free(c);
	return NULL;
}

void config_clear(struct sluice_config *c)
{
	free(c->path);
	free(c->pid_file);
	free(c->user);
	free(c->group);
	free(c->metrics.listen);
	listen_conf_clear(&c->control);
	listen_conf_clear(&c->milter.listen);
	listen_conf_clear(&c->policy.listen);
	listen_conf_clear(&c->intake.listen);
	free(c->intake.allow);
	free(c->intake.hostname);
	free(c->queue.dir);
	free(c->state_dir);
	free(c->store.server);
	free(c->store.user);
	free(c->control_password_file);
	free(c->control_read_password_file);
	if (c->control_password)
		explicit_bzero(c->control_password, strlen(c->control_password));
	if (c->control_read_password)
		explicit_bzero(c->control_read_password, strlen(c->control_read_password));
	free(c->control_password);
	free(c->control_read_password);
	free(c->store.password_file);
	if (c->store.password)
		explicit_bzero(c->store.password, strlen(c->store.password));
	free(c->store.password);
	free(c->store.prefix);
	if (c->store.sentinels)
		for (char **p = c->store.sentinels; *p; p++)
			free(*p);
	free(c->store.sentinels);
	if (c->store.cluster)
		for (char **p = c->store.cluster; *p; p++)
			free(*p);
	free(c->store.cluster);
	free(c->store.master_name);
	free(c->store.node);
	memset(c, 0, sizeof(*c));
}

int config_load_client(const char *path, struct sluice_config **ret, char *err, size_t errlen)
{
	struct cfg_node *root = NULL;
	struct sluice_config *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	int r = config_core_load(path, true, &root, c, err, errlen);
	cfg_free(root);
	if (r < 0) {
		free(c);
		return r;
	}
	*ret = c;
	return 0;
}
