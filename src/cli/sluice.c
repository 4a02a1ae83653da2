/*
 * sluice -- the operator's command: talks to sluiced over the control socket.
 *
 *   sluice [-c FILE | -s SOCKET] status|stats [--reset]|decisions|reload|help [--json]
 *   sluice ... top [-n SECONDS] [-b ITERATIONS]
 *   sluice ... limits top [RULE] | limits show KEY [RULE] | limits reset KEY [RULE]
 *   sluice ... queue [list|show ID] | queue hold|release|delete|flush ID...|--all
 *   sluice ... test [--client-ip IP] [--client-name NAME] [--helo NAME] [--sasl-user U]
 *                   [--from ADDR] [--rcpt ADDR]... [--header "Name: value"]...
 *                   [--size BYTES] [--message FILE]
 *
 * The socket is taken from -s, or from control.listen in the configuration file (the same
 * file the daemon reads, default /etc/sluice/sluice.conf).  Exit status: 0 success, 1 the
 * daemon answered with an error, 2 usage, 69 the daemon cannot be reached.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sysexits.h>
#include <unistd.h>

#include "buf.h"
#include "config.h"
#include "control.h"
#include "control_call.h"
#include "inject.h"
#include "top.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sluice [-c FILE | -s SOCKET] COMMAND [--json]\n"
		"commands:\n"
		"  status    daemon version, uptime, workers, sessions\n"
		"  stats     per service: connections, session duration and work time\n"
		"            (min / mean / max / std-dev), current and peak sessions, errors\n"
		"  stats --reset  end the statistics interval now (and log it)\n"
		"  decisions what each rule decided: checks within and over its limit\n"
		"  top [-n SECONDS] [-b|--batch ITERATIONS]\n"
		"            live view: sessions, queue, relay, decisions per second per rule,\n"
		"            keys nearest their limits, lanes (q or Ctrl-C quits)\n"
		"  reload    check the configuration file and reload it\n"
		"  help      commands the daemon understands\n"
		"  limits top [RULE]         the keys nearest their limits\n"
		"  limits show KEY [RULE]    a key's state in every rule (or in RULE)\n"
		"  limits reset KEY [RULE]   forget a key's counts\n"
		"  test [--client-ip IP] [--client-name NAME] [--helo NAME] [--sasl-user USER]\n"
		"       [--from ADDR] [--rcpt ADDR]... [--header 'Name: value']... [--size BYTES]\n"
		"       [--message FILE]\n"
		"            explain what the rules would do with such a transaction now,\n"
		"            without counting anything (--message: headers and size from a file)\n"
		"  queue [list] [ID]          the intake's queue: messages, recipients, status\n"
		"  queue show ID              one message: envelope, status bytes, history\n"
		"  queue hold|release|delete|flush ID...|--all\n"
		"  lanes                      the relay's lanes: budget used, next send, state\n"
		"  lanes suspend NAME [FOR]   stop a lane (until resumed, or for a duration)\n"
		"  lanes resume NAME          lift a lane's suspension\n"
		"  sendmail [OPTIONS] [RECIPIENT...] < MESSAGE\n"
		"            queue a message through sluiced's intake, like sendmail(1)\n"
		"            (-t -i -f -F -C -v -B -N -R -V -bm -bs; see sluice(1), INJECTORS)\n"
		"  qmail-remote HOST SENDER RECIPIENT... < MESSAGE\n"
		"            qmail's qmail-remote(8): queue it, print qmail's reports\n"
		"options:\n"
		"  -c FILE   configuration file to find the control socket in (default %s)\n"
		"  -s SOCK   control socket: unix:/path, /path, inet:host:port\n"
		"  --json    machine-readable output (status, stats, decisions, limits, queue,\n"
		"            lanes)\n",
		CONFIG_DEFAULT_PATH);
}

static int connect_to(const char *spec)
{
	if (spec[0] == '/' || strncmp(spec, "unix:", 5) == 0) {
		const char *path = spec[0] == '/' ? spec : spec + 5;
		struct sockaddr_un sun = { .sun_family = AF_UNIX };
		if (strlen(path) >= sizeof(sun.sun_path)) {
			fprintf(stderr, "sluice: %s: path too long\n", path);
			return -1;
		}
		memcpy(sun.sun_path, path, strlen(path) + 1);
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
			fprintf(stderr, "sluice: cannot connect to %s: %s (is sluiced running?)\n",
				path, strerror(errno));
			if (fd >= 0)
				close(fd);
			return -1;
		}
		return fd;
	}
	if (strncmp(spec, "inet:", 5) == 0 || strncmp(spec, "inet6:", 6) == 0) {
		bool v6 = spec[4] == '6';
		char host[256];
		const char *rest = spec + (v6 ? 6 : 5);
		const char *colon = strrchr(rest, ':');
		if (!colon || (size_t)(colon - rest) >= sizeof(host)) {
			fprintf(stderr, "sluice: %s: expected inet:host:port\n", spec);
			return -1;
		}
		memcpy(host, rest, (size_t)(colon - rest));
		host[colon - rest] = '\0';
		char *h = host;
		if (h[0] == '[') {
			h++;
			char *e = strchr(h, ']');
			if (e)
				*e = '\0';
			v6 = true;
		}
		struct sockaddr_storage ss = { 0 };
		socklen_t sl;
		int port = atoi(colon + 1);
		if (v6) {
			struct sockaddr_in6 *s6 = (void *)&ss;
			s6->sin6_family = AF_INET6;
			s6->sin6_port = htons((uint16_t)port);
			if (inet_pton(AF_INET6, h, &s6->sin6_addr) != 1)
				goto bad;
			sl = sizeof(*s6);
		} else {
			struct sockaddr_in *s4 = (void *)&ss;
			s4->sin_family = AF_INET;
			s4->sin_port = htons((uint16_t)port);
			if (strcmp(h, "localhost") == 0)
				h = "127.0.0.1";
			if (inet_pton(AF_INET, h, &s4->sin_addr) != 1)
				goto bad;
			sl = sizeof(*s4);
		}
		int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&ss, sl) < 0) {
			fprintf(stderr, "sluice: cannot connect to %s: %s (is sluiced running?)\n",
				spec, strerror(errno));
			if (fd >= 0)
				close(fd);
			return -1;
		}
		return fd;
	}
bad:
	fprintf(stderr, "sluice: %s: not a control socket address\n", spec);
	return -1;
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

	const char *config = CONFIG_DEFAULT_PATH, *sock = NULL;
	bool json = false;
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int opt;
	while ((opt = getopt_long(argc, argv, "+c:s:jh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'c': config = optarg; break;
		case 's': sock = optarg; break;
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
			return EX_CONFIG;
		}
		if (cfg->control.n == 0) {
			fprintf(stderr, "sluice: %s has no control { listen = ...; } block\n", config);
			config_free(cfg);
			return EX_CONFIG;
		}
		sock = cfg->control.addr[0];
	}
	int fd = connect_to(sock);
	config_free(cfg);
	if (fd < 0)
		return EX_UNAVAILABLE;
	if (top) {
		buf_clear(&req);
		int rc = top_run(fd, top_interval, top_batch);
		close(fd);
		return rc;
	}
	struct buf body;
	buf_init(&body, CONTROL_BODY_MAX + 1);
	bool ok = false;
	const char *why = "";
	int r = control_call(fd, req.ptr, req.len, &body, &ok, &why, NULL);
	close(fd);
	buf_clear(&req);
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
	buf_clear(&body);
	return rc;
}
