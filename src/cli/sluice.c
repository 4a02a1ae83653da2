/*
 * sluice -- the operator's command: talks to sluiced over the control socket.
 *
 *   sluice [-c FILE | -s SOCKET] status|stats [--reset]|decisions|reload|help [--json]
 *   sluice ... top [-n SECONDS] [-b ITERATIONS]
 *   sluice ... limits top [RULE] | limits show KEY [RULE] | limits reset KEY [RULE]
 *   sluice ... queue [list] [ID...|-] [SELECTION] | queue show ID | queue summary [SELECTION]
 *   sluice ... queue hold|release|delete|flush|bounce ID...|-|--all|SELECTION
 *              SELECTION: [--domain D] [--sender S] [--older-than DURATION] [--state S]
 *   sluice ... test [--client-ip IP] [--client-name NAME] [--helo NAME] [--sasl-user U]
 *                   [--from ADDR] [--rcpt ADDR]... [--header "Name: value"]...
 *                   [--size BYTES] [--message FILE]
 *
 * The socket is taken from -s, or from control.listen in the configuration file (the same
 * file the daemon reads, default /etc/sluice/sluice.conf).  An inet control socket takes
 * a password (control.h's "auth"), from --password-file, else $SLUICE_CONTROL_PASSWORD,
 * else, for a socket found in the configuration file, control.password_file or
 * read_password_file when this user may read one.  Exit status: 0 success, 1 the daemon
 * answered with an error, 2 usage, 69 the daemon cannot be reached.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sysexits.h>
#include <unistd.h>

#include "buf.h"
#include "config.h"
#include "control.h"
#include "control_call.h"
#include "control_cmds.h"
#include "inject.h"
#include "sockspec.h"
#include "top.h"

static void usage(FILE *f)
{
	/* the commands from the table the daemon dispatches on (control_cmds.h) */
	struct buf cmds;
	buf_init(&cmds, 64 * 1024);
	if (control_cmds_help(&cmds, true) < 0)
		buf_reset(&cmds);
	fprintf(f,
		"usage: sluice [-c FILE | -s SOCKET] COMMAND [--json]\n"
		"commands:\n%.*s"
		"options:\n"
		"  -c FILE   configuration file to find the control socket in (default %s)\n"
		"  -s SOCK   control socket: unix:/path, /path, inet:host:port, inet:port@host\n"
		"  --password-file FILE\n"
		"            an inet control socket's password: the file's first line (else\n"
		"            $SLUICE_CONTROL_PASSWORD, else control.password_file or\n"
		"            read_password_file of the configuration file, if readable)\n"
		"  --json    machine-readable output (status, stats, decisions, limits, queue,\n"
		"            lanes)\n",
		(int)cmds.len, cmds.ptr ? cmds.ptr : "", CONFIG_DEFAULT_PATH);
	buf_done(&cmds);
}

/* One blocking connect; the socket, or -1 with errno. */
static int connect_one(const struct sockaddr *sa, socklen_t len)
{
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, sa, len) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		fd = -1;
	}
	return fd;
}

/* The control socket: a host name's every address in the resolver's order, as the
 * intake's client does. */
static int connect_to(const char *spec)
{
	struct sockspec s;
	struct sockaddr_storage ss;
	socklen_t sl;
	char err[400];
	int fd = -1;
	if (sockspec_parse(spec, &s, err, sizeof(err)) < 0)
		goto bad;
	if (s.family == AF_UNIX || s.numeric) {
		if (sockspec_resolve(&s, &ss, &sl, err, sizeof(err)) < 0)
			goto bad;
		fd = connect_one((struct sockaddr *)&ss, sl);
	} else {
		struct addrinfo *res;
		if (sockspec_lookup(&s, &res, err, sizeof(err)) < 0)
			goto bad;
		errno = EHOSTUNREACH;
		for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
			fd = connect_one(ai->ai_addr, ai->ai_addrlen);
		freeaddrinfo(res);
	}
	if (fd < 0)
		fprintf(stderr, "sluice: cannot connect to %s: %s (is sluiced running?)\n",
			s.family == AF_UNIX ? s.path : spec, strerror(errno));
	return fd;
bad:
	fprintf(stderr, "sluice: control socket %s\n", err);
	return -1;
}

/* Is spec an inet control socket (which takes a password)?  A bad one is said later. */
static bool is_inet(const char *spec)
{
	struct sockspec s;
	char err[400];
	return sockspec_parse(spec, &s, err, sizeof(err)) == 0 && s.family != AF_UNIX;
}

/*
 * The password for an inet control socket: --password-file's first line, else
 * $SLUICE_CONTROL_PASSWORD, else the configuration's password_file or read_password_file
 * when this user may read it (cfg: the file the socket was found in, or NULL).  0 with
 * *ret (NULL when there is none: sluiced then says what it wants), or -1 after saying
 * why.
 */
static int find_password(const char *file, const struct sluice_config *cfg, char **ret)
{
	*ret = NULL;
	if (file) {
		int r = config_secret_line(file, ret);
		if (r < 0) {
			fprintf(stderr, "sluice: --password-file %s: %s\n", file,
				r == -ENODATA ? "its first line is empty" : strerror(-r));
			return -1;
		}
		return 0;
	}
	const char *env = getenv("SLUICE_CONTROL_PASSWORD");
	if (env && *env) {
		if (strlen(env) > CONTROL_SECRET_MAX) {
			fprintf(stderr, "sluice: SLUICE_CONTROL_PASSWORD is longer than %d bytes\n",
				CONTROL_SECRET_MAX);
			return -1;
		}
		*ret = strdup(env);
		if (!*ret) {
			fprintf(stderr, "sluice: out of memory\n");
			return -1;
		}
		return 0;
	}
	/* the first of the configuration's files this user may read; one who may read
	 * neither goes on without a password: sluiced refuses, and says what it wants */
	const char *files[] = { cfg ? cfg->control_password_file : NULL,
				cfg ? cfg->control_read_password_file : NULL };
	for (size_t i = 0; i < ARRAY_SIZE(files) && !*ret; i++)
		if (files[i] && config_secret_line(files[i], ret) < 0)
			*ret = NULL;
	return 0;
}

/* Send the password first on an inet control socket.  0, or the exit status. */
static int authenticate(int fd, const char *secret)
{
	struct buf req, body;
	buf_init(&req, CONTROL_LINE_MAX - 1);
	buf_init(&body, CONTROL_BODY_MAX + 1);
	bool ok = false;
	const char *why = "";
	int r = control_put_auth(&req, str_cstr(secret));
	if (r == 0)
		r = control_call(fd, req.ptr, req.len, &body, &ok, &why, NULL);
	if (req.ptr)
		explicit_bzero(req.ptr, req.len);
	int rc = 0;
	if (r == -EINVAL) {
		fprintf(stderr, "sluice: the password is longer than %d bytes\n", CONTROL_SECRET_MAX);
		rc = 2;
	} else if (r == -EPROTO) {
		fprintf(stderr, "sluice: bad reply from sluiced: %s\n", why);
		rc = EX_PROTOCOL;
	} else if (r < 0) {
		fprintf(stderr, "sluice: %s\n", r == -EPIPE ? "connection closed before the reply "
			"was complete" : strerror(-r));
		rc = EX_UNAVAILABLE;
	} else if (!ok) {
		fwrite(body.ptr, 1, body.len, stderr);
		rc = 1;
	}
	buf_done(&req);
	buf_done(&body);
	return rc;
}

/* Append " name=VALUE" with VALUE %XX-encoded (spaces, controls, '%', 8-bit). */
static int put_arg(struct buf *req, const char *name, const char *v, size_t len)
{
	if (buf_printf(req, " %s=", name) < 0)
		return -1;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)v[i];
		int r = (c <= ' ' || c >= 0x7f || c == '%') ? buf_printf(req, "%%%02X", c)
							    : buf_append_byte(req, c);
		if (r < 0)
			return -1;
	}
	return 0;
}

/* Headers (unfolded) and size of a message file, as test arguments. */
static int put_message(struct buf *req, const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "sluice: %s: %s\n", path, strerror(errno));
		return -1;
	}
	char line[4096];
	char hdr[4096];
	size_t hlen = 0;
	int headers = 0;
	bool in_headers = true;
	long size = 0;
	while (fgets(line, sizeof(line), f)) {
		size += (long)strlen(line);
		if (!in_headers)
			continue;
		size_t n = strcspn(line, "\r\n");
		if ((line[0] == ' ' || line[0] == '\t') && hlen) {
			if (hlen + n < sizeof(hdr)) {
				memcpy(hdr + hlen, line, n);
				hlen += n;
			}
			continue;
		}
		if (hlen && headers < 32 && put_arg(req, "header", hdr, hlen) < 0)
			goto toolong;
		headers += hlen != 0;
		hlen = 0;
		if (n == 0) {
			in_headers = false;
			continue;
		}
		memcpy(hdr, line, n);
		hlen = n;
	}
	if (hlen && headers < 32 && put_arg(req, "header", hdr, hlen) < 0)
		goto toolong;
	fclose(f);
	char num[32];
	snprintf(num, sizeof(num), "%ld", size);
	return put_arg(req, "size", num, strlen(num));
toolong:
	fclose(f);
	fprintf(stderr, "sluice: %s: headers too long for one request\n", path);
	return -1;
}

static int build_test(struct buf *req, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "client-ip", required_argument, NULL, 'i' },
		{ "client-name", required_argument, NULL, 'n' },
		{ "helo", required_argument, NULL, 'e' },
		{ "sasl-user", required_argument, NULL, 'u' },
		{ "from", required_argument, NULL, 'f' },
		{ "rcpt", required_argument, NULL, 'r' },
		{ "header", required_argument, NULL, 'H' },
		{ "size", required_argument, NULL, 'z' },
		{ "message", required_argument, NULL, 'm' },
		{ NULL, 0, NULL, 0 },
	};
	static const struct {
		int opt;
		const char *name;
	} names[] = { { 'i', "client_ip" }, { 'n', "client_name" }, { 'e', "helo" },
		      { 'u', "sasl_user" }, { 'f', "from" },	    { 'r', "rcpt" },
		      { 'H', "header" },    { 'z', "size" } };
	if (buf_append_cstr(req, "test") < 0)
		return -1;
	optind = 1;
	int opt;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (opt == 'm') {
			if (put_message(req, optarg) < 0)
				return -1;
			continue;
		}
		const char *name = NULL;
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (names[i].opt == opt)
				name = names[i].name;
		if (!name) {
			usage(stderr);
			return -1;
		}
		if (put_arg(req, name, optarg, strlen(optarg)) < 0) {
			fprintf(stderr, "sluice: test: arguments too long\n");
			return -1;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "sluice: test: unexpected \"%s\"\n", argv[optind]);
		return -1;
	}
	return 0;
}

/* ---- queue ---- */

/* What `sluice queue ...` sends: the request without IDs read from the input. */
struct queue_req {
	const char *verb;
	bool stdin_ids;
};

/*
 * queue [VERB] [ID...|-|--all] [--domain D] [--sender S] [--older-than D] [--state S]
 * [--by sender|recipient] [--top N] [--json]: the request's words (selections become
 * NAME=VALUE words).  -1 on a usage error (said).
 */
static int build_queue(struct buf *req, int argc, char **argv, struct queue_req *ret)
{
	static const struct {
		const char *opt, *word;
	} opts[] = {
		{ "--domain", "domain" }, { "--sender", "sender" }, { "--older-than", "older" },
		{ "--state", "state" },	  { "--by", "by" },	    { "--top", "top" },
	};
	static const char *const verbs[] = { "list", "show", "summary", "hold", "release",
					     "delete", "flush", "bounce" };
	ret->verb = "list";
	ret->stdin_ids = false;
	if (buf_append_cstr(req, "queue") < 0)
		return -1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool known = false;
		for (size_t k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
			size_t ol = strlen(opts[k].opt);
			if (strncmp(a, opts[k].opt, ol) != 0 || (a[ol] && a[ol] != '='))
				continue;
			const char *v = a[ol] == '=' ? a + ol + 1 : i + 1 < argc ? argv[++i] : NULL;
			if (!v) {
				fprintf(stderr, "sluice queue: %s needs a value\n", opts[k].opt);
				return -1;
			}
			if (strcmp(opts[k].word, "sender") == 0 && !v[0])
				v = "<>";
			if (!v[0] || strpbrk(v, " \t\n,") ||
			    buf_printf(req, " %s=%s", opts[k].word, v) < 0) {
				fprintf(stderr, "sluice queue: %s: bad value \"%s\"\n", opts[k].opt, v);
				return -1;
			}
			known = true;
		}
		if (known)
			continue;
		if (strcmp(a, "-") == 0) {
			ret->stdin_ids = true;
			continue;
		}
		if (i == 1)
			for (size_t k = 0; k < sizeof(verbs) / sizeof(verbs[0]); k++)
				if (strcmp(a, verbs[k]) == 0)
					ret->verb = verbs[k];
		if (strcmp(a, "--json") == 0)
			continue; /* added by main */
		if (a[0] == '-' && strcmp(a, "--all") != 0) {
			fprintf(stderr, "sluice queue: unknown option \"%s\"\n", a);
			return -1;
		}
		if (!a[0] || strpbrk(a, " \t\n=") || buf_printf(req, " %s", a) < 0) {
			fprintf(stderr, "sluice: bad argument \"%s\"\n", a);
			return -1;
		}
	}
	if (ret->stdin_ids && (strcmp(ret->verb, "show") == 0 ||
			       strcmp(ret->verb, "summary") == 0)) {
		fprintf(stderr, "sluice queue %s: no IDs from the input (-)\n", ret->verb);
		return -1;
	}
	return 0;
}

/* As sluiced says what was done to the messages of a selection. */
static const char *done_word(const char *verb)
{
	static const char *const words[][2] = {
		{ "hold", "held" },	  { "release", "released" },
		{ "delete", "deleted" }, { "flush", "eligible for delivery now" },
		{ "bounce", "returned to the sender" },
	};
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		if (strcmp(verb, words[i][0]) == 0)
			return words[i][1];
	return verb;
}

static void print_part(void *arg, const char *p, size_t n)
{
	(void)arg;
	fwrite(p, 1, n, stdout);
}

/* The number written just before word in text ("12 messages"), 0 if none. */
static uint64_t num_before(const char *text, const char *word)
{
	const char *w = strstr(text, word);
	if (!w)
		return 0;
	const char *d = w;
	while (d > text && d[-1] >= '0' && d[-1] <= '9')
		d--;
	return strtoull(d, NULL, 10);
}

static uint64_t json_num(const char *text, const char *key)
{
	char k[32];
	snprintf(k, sizeof(k), "\"%s\":", key);
	const char *p = strstr(text, k);
	return p ? strtoull(p + strlen(k), NULL, 10) : 0;
}

/*
 * `sluice queue VERB - ...`: the IDs read from the input, sent in batches of as many as
 * a request line holds (each request is "REQUEST ids=ID,ID,..."), the parts printed as
 * they come, and the batches' last lines added up into one.
 */
static int queue_from_input(int fd, const struct buf *base, const struct queue_req *qr,
			    bool json)
{
	bool list = strcmp(qr->verb, "list") == 0;
	uint64_t n[4] = { 0 }; /* list: messages, recipients, bytes; action: done, failed;
				* both: IDs not found [3] */
	bool all_ok = true, any = false;
	struct buf req, body;
	buf_init(&req, CONTROL_LINE_MAX - 1);
	buf_init(&body, CONTROL_BODY_MAX + 1);
	char line[256];
	bool eof = false;
	int rc = 0;
	while (!eof) {
		buf_reset(&req);
		/* base ends with its newline */
		buf_append(&req, base->ptr, base->len - 1);
		if (any && list && !json)
			buf_append_cstr(&req, " nohead");
		buf_append_cstr(&req, " ids=");
		size_t ids = 0;
		while (req.len + 64 < CONTROL_LINE_MAX - 16) {
			if (!fgets(line, sizeof(line), stdin)) {
				eof = true;
				break;
			}
			size_t l = strcspn(line, " \t\r\n");
			if (l == 0)
				continue;
			line[l] = '\0';
			if (l > 32 || strchr(line, ',')) {
				fprintf(stderr, "sluice queue: \"%.40s\" is no queue ID\n", line);
				all_ok = false;
				continue;
			}
			buf_printf(&req, "%s%s", ids ? "," : "", line);
			ids++;
		}
		if (ids == 0 && any)
			break;
		buf_append_byte(&req, '\n');
		bool ok = false;
		const char *why = "";
		int r = control_call_parts(fd, req.ptr, req.len, print_part, NULL, &body, &ok, &why,
					   NULL);
		if (r < 0) {
			fprintf(stderr, "sluice: %s\n", r == -EPROTO ? why : strerror(-r));
			rc = r == -EPROTO ? EX_PROTOCOL : EX_UNAVAILABLE;
			break;
		}
		any = true;
		const char *t = body.ptr ? body.ptr : "";
		if (!ok) {
			all_ok = false;
			/* an error says why, unless it is only IDs that are gone */
			if (!strstr(t, "IDs not in the queue") && !strstr(t, "\"missing\""))
				fputs(t, stderr);
		}
		if (json && list) {
			n[3] += num_before(t, " IDs not in the queue");
		} else if (json) {
			n[0] += json_num(t, "done");
			n[1] += json_num(t, "failed");
			n[3] += json_num(t, "missing");
		} else if (list) {
			n[0] += num_before(t, " message");
			n[1] += num_before(t, " recipient");
			n[2] += num_before(t, " bytes");
			n[3] += num_before(t, " IDs not in the queue");
		} else {
			n[0] += num_before(t, " message");
			n[1] += num_before(t, " failed");
			n[3] += num_before(t, " IDs not in the queue");
		}
	}
	if (rc == 0) {
		if (json && list && n[3])
			fprintf(stderr, "sluice: %" PRIu64 " IDs not in the queue\n", n[3]);
		if (json && !list)
			printf("{\"selected\":%" PRIu64 ",\"done\":%" PRIu64 ",\"failed\":%" PRIu64
			       ",\"missing\":%" PRIu64 "}\n", n[0] + n[1], n[0], n[1], n[3]);
		else if (list && !json)
			printf("-- %" PRIu64 " messages, %" PRIu64 " recipients, %" PRIu64 " bytes",
			       n[0], n[1], n[2]);
		else if (!json)
			printf("%" PRIu64 " message%s %s", n[0], n[0] == 1 ? "" : "s",
			       done_word(qr->verb));
		if (!json) {
			if (!list && n[1])
				printf("; %" PRIu64 " failed", n[1]);
			if (n[3])
				printf("%s%" PRIu64 " IDs not in the queue%s", list ? " (" : "; ", n[3],
				       list ? ")" : "");
			printf("\n");
		}
		rc = all_ok && !n[3] ? 0 : 1;
	}
	buf_done(&req);
	buf_done(&body);
	return rc;
}

/* top [-n SECONDS] [-b|--batch ITERATIONS] */
static int parse_top(int argc, char **argv, unsigned *ret_interval, long *ret_batch)
{
	static const struct option opts[] = {
		{ "batch", required_argument, NULL, 'b' },
		{ "interval", required_argument, NULL, 'n' },
		{ NULL, 0, NULL, 0 },
	};
	unsigned interval = 2;
	long batch = 0;
	optind = 1;
	int opt;
	while ((opt = getopt_long(argc, argv, "n:b:", opts, NULL)) != -1) {
		char *end;
		long v;
		switch (opt) {
		case 'n':
			v = strtol(optarg, &end, 10);
			if (*end || v < 1 || v > 3600) {
				fprintf(stderr, "sluice top: -n: expected seconds from 1 to 3600\n");
				return -1;
			}
			interval = (unsigned)v;
			break;
		case 'b':
			v = strtol(optarg, &end, 10);
			if (*end || v < 1 || v > 1000000) {
				fprintf(stderr, "sluice top: -b: expected a number of frames\n");
				return -1;
			}
			batch = v;
			break;
		default:
			usage(stderr);
			return -1;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "sluice top: unexpected \"%s\"\n", argv[optind]);
		return -1;
	}
	*ret_interval = interval;
	*ret_batch = batch;
	return 0;
}

int main(int argc, char **argv)
{
	/* installed as sendmail or qmail-remote (a link to sluice): act as that command */
	const char *base = argc > 0 && argv[0] ? argv[0] : "sluice";
	base = strrchr(base, '/') ? strrchr(base, '/') + 1 : base;
	if (strcmp(base, "sendmail") == 0)
		return inject_sendmail(argc, argv, NULL, "sendmail");
	if (strcmp(base, "qmail-remote") == 0)
		return inject_qmail_remote(argc, argv, NULL);

	const char *config = CONFIG_DEFAULT_PATH, *sock = NULL, *password_file = NULL;
	bool json = false;
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ "password-file", required_argument, NULL, 'P' },
		{ NULL, 0, NULL, 0 },
	};
	int opt;
	while ((opt = getopt_long(argc, argv, "+c:s:jh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'c': config = optarg; break;
		case 's': sock = optarg; break;
		case 'P': password_file = optarg; break;
		case 'j': json = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	/* the injectors speak SMTP to the intake, not the control protocol; -c is passed
	 * on only when it was given */
	const char *given = strcmp(config, CONFIG_DEFAULT_PATH) != 0 ? config : NULL;
	if (strcmp(argv[optind], "sendmail") == 0)
		return inject_sendmail(argc - optind, argv + optind, given, "sluice sendmail");
	if (strcmp(argv[optind], "qmail-remote") == 0)
		return inject_qmail_remote(argc - optind, argv + optind, given);
	unsigned top_interval = 2;
	long top_batch = 0;
	bool top = strcmp(argv[optind], "top") == 0;
	if (top) {
		if (parse_top(argc - optind, argv + optind, &top_interval, &top_batch) < 0)
			return 2;
		optind = argc;
	}
	struct buf req;
	buf_init(&req, CONTROL_LINE_MAX - 1);
	if (!top && strcmp(argv[optind], "test") == 0) {
		if (build_test(&req, argc - optind, argv + optind) < 0)
			return 2;
		optind = argc;
	}
	struct queue_req qr = { 0 };
	if (!top && optind < argc && strcmp(argv[optind], "queue") == 0) {
		for (int i = optind; i < argc; i++)
			json |= strcmp(argv[i], "--json") == 0;
		if (build_queue(&req, argc - optind, argv + optind, &qr) < 0)
			return 2;
		optind = argc;
	}
	for (int i = optind; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			json = true;
			continue;
		}
		if (strpbrk(argv[i], " \t\n") || !argv[i][0] ||
		    buf_printf(&req, "%s%s", req.len ? " " : "", argv[i]) < 0) {
			fprintf(stderr, "sluice: bad argument \"%s\"\n", argv[i]);
			return 2;
		}
	}
	if (json && buf_append_cstr(&req, " --json") < 0)
		return 2;
	if (buf_append_byte(&req, '\n') < 0)
		return 2;

	struct sluice_config *cfg = NULL;
	if (!sock) {
		char err[1024];
		if (config_load_client(config, &cfg, err, sizeof(err)) < 0) {
			fprintf(stderr, "sluice: %s\n", err);
			buf_done(&req);
			return EX_CONFIG;
		}
		if (cfg->control.n == 0) {
			fprintf(stderr, "sluice: %s has no control { listen = ...; } block\n", config);
			config_free(cfg);
			buf_done(&req);
			return EX_CONFIG;
		}
		sock = cfg->control.addr[0];
	}
	char *secret = NULL;
	if (is_inet(sock) && find_password(password_file, cfg, &secret) < 0) {
		config_free(cfg);
		buf_done(&req);
		return EX_NOINPUT;
	}
	int fd = connect_to(sock);
	config_free(cfg);
	int arc = fd >= 0 && secret ? authenticate(fd, secret) : 0;
	if (secret) {
		explicit_bzero(secret, strlen(secret));
		free(secret);
	}
	if (fd < 0 || arc != 0) {
		if (fd >= 0)
			close(fd);
		buf_done(&req);
		return fd < 0 ? EX_UNAVAILABLE : arc;
	}
	if (top) {
		buf_done(&req);
		int rc = top_run(fd, top_interval, top_batch);
		close(fd);
		return rc;
	}
	if (qr.stdin_ids) {
		int rc = queue_from_input(fd, &req, &qr, json);
		close(fd);
		buf_done(&req);
		return rc;
	}
	struct buf body;
	buf_init(&body, CONTROL_BODY_MAX + 1);
	bool ok = false;
	const char *why = "";
	/* a reply in parts (a queue listing) is printed as it comes */
	int r = control_call_parts(fd, req.ptr, req.len, print_part, NULL, &body, &ok, &why,
				   NULL);
	close(fd);
	buf_done(&req);
	int rc = 0;
	if (r == 0) {
		fwrite(body.ptr, 1, body.len, ok ? stdout : stderr);
		rc = ok ? 0 : 1;
	} else if (r == -EPIPE) {
		fprintf(stderr, "sluice: connection closed before the reply was complete\n");
		rc = EX_UNAVAILABLE;
	} else if (r == -EPROTO || r == -EMSGSIZE) {
		fprintf(stderr, "sluice: %s%s\n", r == -EPROTO ? "bad reply from sluiced: " : "",
			r == -EPROTO ? why : "reply too large");
		rc = EX_PROTOCOL;
	} else {
		fprintf(stderr, "sluice: %s\n", strerror(-r));
		rc = EX_UNAVAILABLE;
	}
	buf_done(&body);
	return rc;
}
