/*
 * inject -- `sluice sendmail` and `sluice qmail-remote` (see inject.h and sluice(1),
 * INJECTORS).
 *
 * Both read the whole message before they connect: the intake's session never waits on
 * a slow writer, -t needs the header before the first RCPT, and BODY=8BITMIME needs to
 * have seen every byte.  The message is held in memory, bounded by the intake's
 * max_message_size when the configuration is known (INJECT_HARD_MAX otherwise).
 *
 * sendmail is all or nothing: if any recipient is refused, the transaction is abandoned
 * and nothing is queued, so that a program that retries on EX_TEMPFAIL never sends
 * twice.  The one exception is a 452 "too many recipients" after some were accepted
 * (RFC 5321 4.5.3.1.10): the message is sent to those, and the rest go in another
 * transaction; if a later one fails, the error says how many recipients the message
 * was already queued for.
 *
 * qmail-remote prints nothing on standard error: qmail-rspawn gives it one descriptor
 * for both, and reads everything as reports.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "inject.h"
#include "inject_msg.h"
#include "smtp.h"
#include "smtp_client.h"
#include "sockspec.h"
#include "util.h"

#define INJECT_HARD_MAX (UINT64_C(1) << 30) /* bytes of a message, with no configuration */
#define INJECT_MAX_RCPTS 100000             /* recipients of one message */
#define CONNECT_TIMEOUT_MS 30000
#define COMMAND_TIMEOUT_MS 300000                /* RFC 5321 4.5.3.2: 5 minutes ... */
#define DATA_END_TIMEOUT_MS 600000               /* ... and 10 after the final dot */

/* ---- the intake and the configuration ---- */

struct target {
	struct sluice_config *cfg;            /* NULL when none was read */
	const char *addr[CONFIG_MAX_LISTEN];  /* to try, in order */
	size_t naddr;
	const char *domain;                   /* to qualify addresses; EHLO name */
	uint64_t max_size;
	char host[256];
};

/*
 * Find the intake.  direct: an address given on the command line or in the
 * environment, or NULL; config: a file named on the command line, or NULL.  0, or -1
 * with err filled (a configuration problem).
 */
static int target_find(struct target *t, const char *direct, const char *config, char *err,
		       size_t errlen)
{
	memset(t, 0, sizeof(*t));
	if (!direct || !*direct)
		direct = getenv("SLUICE_INTAKE");
	if (direct && !*direct)
		direct = NULL;
	if (!config || !*config)
		config = getenv("SLUICE_CONFIG");
	if (config && !*config)
		config = NULL;
	if (!direct && !config)
		config = CONFIG_DEFAULT_PATH;
	if (config) {
		char e[1024];
		if (config_load_client(config, &t->cfg, e, sizeof(e)) < 0) {
			snprintf(err, errlen, "%s", e);
			return -1;
		}
	}
	if (direct) {
		t->addr[t->naddr++] = direct;
	} else {
		const struct listen_conf *l = &t->cfg->intake.listen;
		if (!t->cfg->intake.enabled || l->n == 0) {
			snprintf(err, errlen, "%s has no intake { listen = ...; } block", config);
			return -1;
		}
		/* unix: first: no TCP, no allow list, and the file mode says who may */
		for (int pass = 0; pass < 2; pass++)
			for (size_t i = 0; i < l->n; i++)
				if (sockspec_is_unix(l->addr[i]) ==
				    (pass == 0))
					t->addr[t->naddr++] = l->addr[i];
	}
	if (t->cfg && t->cfg->intake.hostname) {
		t->domain = t->cfg->intake.hostname;
	} else {
		if (gethostname(t->host, sizeof(t->host) - 1) < 0 || !t->host[0])
			snprintf(t->host, sizeof(t->host), "localhost");
		t->domain = t->host;
	}
	t->max_size = t->cfg && t->cfg->intake.max_message_size ? t->cfg->intake.max_message_size
								 : INJECT_HARD_MAX;
	return 0;
}

static void target_free(struct target *t)
{
	t->cfg = config_free(t->cfg);
}

/* Connect to the first intake address that answers.  0, or -1 with err (the last
 * failure). */
static int target_connect(struct target *t, struct smtp_client *c, char *err, size_t errlen)
{
	for (size_t i = 0; i < t->naddr; i++)
		if (smtp_client_connect(c, t->addr[i], CONNECT_TIMEOUT_MS, err, errlen) == 0)
			return 0;
		else
			smtp_client_close(c);
	return -1;
}

/* ---- descriptors ---- */

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/*
 * Standard output and error open, on /dev/null if they were closed: otherwise the
 * socket to the intake could become descriptor 1 or 2, and a message meant for the
 * caller would go into the SMTP session.  A closed standard input is the caller's
 * error, reported by each command (it is then put on /dev/null here too, for the same
 * reason).
 */
static void fds_sane(void)
{
	for (int fd = 0; fd <= 2; fd++)
		if (!fd_open(fd)) {
			int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
			if (n >= 0 && n != fd) { /* a lower one was closed too: done in order */
				dup2(n, fd);
				close(n);
			}
		}
}

/* ---- reading the message ---- */

/* All of fd into t.  0, -ENOBUFS (larger than max) or -errno of a read. */
static int read_message(int fd, struct inject_text *t)
{
	char chunk[65536];
	while (!t->ended) {
		ssize_t n = read(fd, chunk, sizeof(chunk));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return inject_text_finish(t);
		int r = inject_text_feed(t, chunk, (size_t)n);
		if (r < 0)
			return r;
	}
	return 0;
}

static bool has_8bit(struct str s)
{
	for (size_t i = 0; i < s.len; i++)
		if ((unsigned char)s.ptr[i] >= 0x80)
			return true;
	return false;
}

/* xtext (RFC 3461 4): for ENVID. */
static int put_xtext(struct buf *b, const char *s)
{
	char x[3 * SMTP_DSN_ENVID_MAX];
	size_t n;
	int r = smtp_xtext_encode(str_cstr(s), x, sizeof(x), &n);
	return r < 0 ? r : buf_append(b, x, n);
}

/* Break the lines of msg longer than SMTP allows (inject_msg_fold); it is replaced when
 * there are any.  0 or -ENOBUFS. */
static int fold_long_lines(struct buf *msg, size_t *ret_folded)
{
	*ret_folded = inject_long_lines(buf_str(msg), INJECT_LINE_MAX);
	if (*ret_folded == 0)
		return 0;
	struct buf out;
	/* at most 3 bytes more per INJECT_LINE_MAX - 1 */
	buf_init(&out, msg->len + msg->len / (INJECT_LINE_MAX / 3) + 64);
	int r = inject_msg_fold(buf_str(msg), INJECT_LINE_MAX, &out);
	if (r < 0) {
		buf_done(&out);
		return r;
	}
	buf_done(msg);
	*msg = out;
	return 0;
}

/* A reply on one line, for a message on standard error. */
static const char *one_line(struct smtp_client *c)
{
	static char s[SMTP_REPLY_MAX + 1];
	struct str r = buf_str(&c->reply);
	size_t n = r.len < SMTP_REPLY_MAX ? r.len : SMTP_REPLY_MAX;
	memcpy(s, r.ptr, n);
	while (n > 0 && s[n - 1] == '\n')
		n--;
	s[n] = '\0';
	for (size_t i = 0; i < n; i++)
		if (s[i] == '\n')
			s[i] = ' ';
	return s;
}

/* ============================== sendmail ============================== */

struct sendmail {
	const char *prog;
	const char *sender_arg;   /* -f / -r, or NULL */
	const char *full_name;    /* -F */
	const char *config;       /* -C, or sluice's -c */
	const char *intake;       /* --intake */
	bool extract;             /* -t */
	bool dots_end;            /* no -i / -oi */
	bool smtp_mode;           /* -bs */
	bool body8;               /* -B 8BITMIME */
	int verbose;              /* -v */
	char notify[64];          /* -N, as NOTIFY= takes it */
	const char *ret;          /* -R: FULL or HDRS */
	const char *envid;        /* -V */

	struct target t;
	struct buf sender;        /* SMTP form; empty: the null sender */
	struct inject_rcpts rcpts;
	struct buf msg;
};

static void sendmail_usage(FILE *f, const char *prog)
{
	fprintf(f,
		"usage: %s [-t] [-i] [-f SENDER] [-F FULL_NAME] [-C FILE] [-v] [-B 8BITMIME|7BIT]\n"
		"       [-N NOTIFY] [-R FULL|HDRS] [-V ENVID] [--intake ADDRESS] [-bm|-bs]\n"
		"       [--] [RECIPIENT...] < MESSAGE\n"
		"the message goes to sluiced's intake (intake { listen = ...; } in the\n"
		"configuration, default %s, or $SLUICE_INTAKE)\n",
		prog, CONFIG_DEFAULT_PATH);
}

static bool valid_notify(const char *v, char *out, size_t len)
{
	if (strcasecmp(v, "never") == 0) {
		snprintf(out, len, "NEVER");
		return true;
	}
	char copy[64];
	if (snprintf(copy, sizeof(copy), "%s", v) >= (int)sizeof(copy))
		return false;
	out[0] = '\0';
	char *save = NULL;
	for (char *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		const char *u = strcasecmp(w, "success") == 0	? "SUCCESS"
				: strcasecmp(w, "failure") == 0 ? "FAILURE"
				: strcasecmp(w, "delay") == 0	? "DELAY"
								: NULL;
		if (!u || strstr(out, u))
			return false; /* the intake refuses a keyword given twice */
		size_t l = strlen(out);
		snprintf(out + l, len - l, "%s%s", l ? "," : "", u);
	}
	return out[0] != '\0';
}

#define SENDMAIL_DONE (-1) /* --help: nothing more to do */

/* Options.  0 to go on, SENDMAIL_DONE, or an exit status. */
static int sendmail_options(struct sendmail *s, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "intake", required_argument, NULL, 1 },
		{ "help", no_argument, NULL, 2 },
		{ NULL, 0, NULL, 0 },
	};
	/* sendmail's letters, as Postfix's sendmail(1) takes them; the options are
	 * permuted like GNU getopt does, as programs are used to with Postfix on Linux */
	const char *optstring = ":A:B:C:F:GIL:N:O:R:UV:X:b:ce:f:h:imno:p:q::r:tvx";
	optind = 0; /* glibc: a full reset (sluice's own parse used "+") */
	opterr = 0;
	int opt;
	while ((opt = getopt_long(argc, argv, optstring, longopts, NULL)) != -1) {
		switch (opt) {
		case 1: s->intake = optarg; break;
		case 2: sendmail_usage(stdout, s->prog); return SENDMAIL_DONE;
		case 'f':
		case 'r': s->sender_arg = optarg; break;
		case 'F': s->full_name = optarg; break;
		case 'C': s->config = optarg; break;
		case 't': s->extract = true; break;
		case 'i': s->dots_end = false; break;
		case 'v': s->verbose++; break;
		case 'o':
			/* -oi (sendmail's IgnoreDots); every other -oX is ignored: -oem/-oep/
			 * -oeq/-oew (error reporting), -odb/-odi/-odq (delivery mode: the
			 * intake always commits before it answers), -oQ (queue directory),
			 * -oA (aliases), -om (me too), -ob, -ol, -or ... */
			if (optarg[0] == 'i')
				s->dots_end = strchr("fFnN0", optarg[1] ? optarg[1] : 'x') != NULL;
			break;
		case 'b':
			if (strcmp(optarg, "m") == 0) {
				s->smtp_mode = false;
			} else if (strcmp(optarg, "s") == 0) {
				s->smtp_mode = true;
			} else {
				fprintf(stderr, "%s: -b%s is not supported: sluice only submits mail "
						"(-bm, -bs)\n", s->prog, optarg);
				return EX_USAGE;
			}
			break;
		case 'B':
			if (strcasecmp(optarg, "8BITMIME") == 0)
				s->body8 = true;
			else if (strcasecmp(optarg, "7BIT") != 0) {
				fprintf(stderr, "%s: -B %s: expected 8BITMIME or 7BIT\n", s->prog, optarg);
				return EX_USAGE;
			}
			break;
		case 'N':
			if (!valid_notify(optarg, s->notify, sizeof(s->notify))) {
				fprintf(stderr, "%s: -N %s: expected never, or a list of success, "
						"failure, delay\n", s->prog, optarg);
				return EX_USAGE;
			}
			break;
		case 'R':
			if (strcasecmp(optarg, "full") == 0)
				s->ret = "FULL";
			else if (strcasecmp(optarg, "hdrs") == 0)
				s->ret = "HDRS";
			else {
				fprintf(stderr, "%s: -R %s: expected full or hdrs\n", s->prog, optarg);
				return EX_USAGE;
			}
			break;
		case 'V': {
			/* what the intake takes (RFC 3461 4.4): printable ASCII, at most 100
			 * characters once xtext-encoded */
			char x[3 * SMTP_DSN_ENVID_MAX];
			size_t xn = 0;
			bool printable = true;
			for (const char *p = optarg; *p; p++)
				printable &= *p >= 0x20 && *p <= 0x7e;
			if (!*optarg || !printable ||
			    smtp_xtext_encode(str_cstr(optarg), x, sizeof(x), &xn) < 0 ||
			    xn > SMTP_DSN_ENVID_MAX) {
				fprintf(stderr, "%s: -V: an envelope ID is printable ASCII, at most 100 "
						"characters once xtext-encoded (a \"+\", \"=\" or space "
						"counts 3)\n", s->prog);
				return EX_USAGE;
			}
			s->envid = optarg;
			break;
		}
		case 'I':
		case 'q':
			fprintf(stderr, "%s: -%c is not supported: sluice only submits mail\n",
				s->prog, opt);
			return EX_USAGE;
		case 'A': case 'G': case 'L': case 'U': case 'X': case 'c': case 'e':
		case 'h': case 'm': case 'n': case 'p': case 'x': case 'O':
			/* accepted and ignored, as Postfix does */
			break;
		case ':':
			fprintf(stderr, "%s: option -%c needs a value\n", s->prog, optopt);
			sendmail_usage(stderr, s->prog);
			return EX_USAGE;
		default:
			if (optopt)
				fprintf(stderr, "%s: unknown option -%c\n", s->prog, optopt);
			else
				fprintf(stderr, "%s: unknown option %s\n", s->prog, argv[optind - 1]);
			sendmail_usage(stderr, s->prog);
			return EX_USAGE;
		}
	}
	return 0;
}

struct addr_ctx {
	struct sendmail *s;
	struct buf tmp;
	int err;
};

static int add_arg_rcpt(void *arg, const char *addr)
{
	struct addr_ctx *x = arg;
	buf_reset(&x->tmp);
	int r = inject_addr_smtp(addr, x->s->t.domain, &x->tmp);
	if (r < 0 || x->tmp.len == 0)
		return r < 0 ? r : -EINVAL;
	return inject_rcpts_add(&x->s->rcpts, x->tmp.ptr);
}

static int count_addr(void *arg, const char *addr)
{
	struct addr_ctx *x = arg;
	if (x->err++ == 0) {
		buf_reset(&x->tmp);
		return inject_addr_smtp(addr, x->s->t.domain, &x->tmp);
	}
	return 0;
}

/* The envelope sender from -f, or the caller's login name @ the domain.  0 or an exit
 * status. */
static int sendmail_sender(struct sendmail *s, const struct passwd *pw)
{
	if (s->sender_arg) {
		struct addr_ctx x = { .s = s };
		buf_init(&x.tmp, INJECT_MAX_ADDR + 1);
		int r = inject_addrlist_parse(str_cstr(s->sender_arg), count_addr, &x);
		if (r == 0 && x.err > 1)
			r = -E2BIG;
		if (r == 0 && x.err == 1 && buf_append_str(&s->sender, buf_str(&x.tmp)) < 0)
			r = -ENAMETOOLONG;
		buf_done(&x.tmp);
		if (r < 0) {
			fprintf(stderr, "%s: -f %s: %s\n", s->prog, s->sender_arg,
				r == -E2BIG ? "one address only" : "not a usable address");
			return EX_USAGE;
		}
		return 0; /* no address at all ("", "<>"): the null sender */
	}
	if (!pw) {
		fprintf(stderr, "%s: no login name for user ID %lu (give the sender with -f)\n",
			s->prog, (unsigned long)getuid());
		return EX_NOUSER;
	}
	if (inject_addr_smtp(pw->pw_name, s->t.domain, &s->sender) < 0 || s->sender.len == 0) {
		fprintf(stderr, "%s: login name \"%s\" is not usable as an address\n", s->prog,
			pw->pw_name);
		return EX_NOUSER;
	}
	return 0;
}

/* The full name for an added From: -F, else $NAME, else -- when the sender is the
 * caller's own address, not one given with -f -- the first field of the GECOS (with
 * '&' standing for the capitalised login name).  Postfix takes the GECOS even with -f,
 * which labels a script's "-f noreply@..." with "root". */
static const char *sendmail_full_name(struct sendmail *s, const struct passwd *pw, char *buf,
				      size_t len)
{
	if (s->full_name)
		return s->full_name;
	const char *env = getenv("NAME");
	if (env && *env)
		return env;
	if (s->sender_arg || !pw || !pw->pw_gecos || !*pw->pw_gecos)
		return NULL;
	size_t n = 0;
	for (const char *g = pw->pw_gecos; *g && *g != ',' && n + 1 < len; g++) {
		if (*g != '&') {
			buf[n++] = *g;
			continue;
		}
		for (const char *l = pw->pw_name; *l && n + 1 < len; l++)
			buf[n++] = l == pw->pw_name && *l >= 'a' && *l <= 'z' ? (char)(*l - 32) : *l;
	}
	buf[n] = '\0';
	return n ? buf : NULL;
}

static void msgid_left(char *out, size_t len, time_t now)
{
	uint64_t rnd = 0;
	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
		rnd = realtime_ns() ^ ((uint64_t)getpid() << 32);
	struct tm tm;
	gmtime_r(&now, &tm);
	snprintf(out, len, "%04d%02d%02d%02d%02d%02d.%ld.%016llx", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)getpid(),
		 (unsigned long long)rnd);
}

/* Read the message and make it ready: headers, recipients.  0 or an exit status. */
static int sendmail_message(struct sendmail *s, const struct passwd *pw)
{
	struct buf raw;
	buf_init(&raw, s->t.max_size);
	struct inject_text text;
	inject_text_init(&text, &raw, s->dots_end);
	int r = read_message(0, &text);
	if (r < 0) {
		buf_done(&raw);
		if (r == -ENOBUFS) {
			fprintf(stderr, "%s: the message is larger than the intake takes (%llu "
					"bytes)\n", s->prog, (unsigned long long)s->t.max_size);
			return EX_DATAERR;
		}
		fprintf(stderr, "%s: cannot read the message on standard input: %s\n", s->prog,
			strerror(-r));
		return r == -EBADF ? EX_NOINPUT : EX_IOERR;
	}

	char namebuf[256], left[96];
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm);
	msgid_left(left, sizeof(left), now);
	struct inject_header_opts o = {
		.extract = s->extract,
		.rcpts = &s->rcpts,
		.domain = s->t.domain,
		.full_name = sendmail_full_name(s, pw, namebuf, sizeof(namebuf)),
		.now = now,
		.utc_offset = tm.tm_gmtoff,
		.msgid_left = left,
	};
	/* the From: of a null-sender message is the caller (nothing else to name) */
	char from[INJECT_MAX_ADDR + 1];
	struct buf fb;
	buf_init_fixed(&fb, from, sizeof(from));
	if (s->sender.len)
		buf_append_str(&fb, buf_str(&s->sender));
	else if (pw)
		inject_addr_smtp(pw->pw_name, s->t.domain, &fb);
	o.from_addr = fb.len ? from : "MAILER-DAEMON";
	struct inject_header_result res;
	/* room for the fields added */
	buf_init(&s->msg, s->t.max_size + 2048);
	r = inject_msg_headers(buf_str(&raw), &o, &s->msg, &res);
	buf_done(&raw);
	switch (r) {
	case 0:
		break;
	case -ENOBUFS:
		fprintf(stderr, "%s: the message is larger than the intake takes (%llu bytes)\n",
			s->prog, (unsigned long long)s->t.max_size);
		return EX_DATAERR;
	case -E2BIG:
		fprintf(stderr, "%s: more than %d recipients\n", s->prog, INJECT_MAX_RCPTS);
		return EX_DATAERR;
	case -ENOMEM:
		fprintf(stderr, "%s: out of memory\n", s->prog);
		return EX_OSERR;
	default:
		fprintf(stderr, "%s: a bad address in the %s: field\n", s->prog,
			res.bad_field ? res.bad_field : "recipient");
		return EX_DATAERR;
	}
	size_t folded;
	if (fold_long_lines(&s->msg, &folded) < 0) {
		fprintf(stderr, "%s: out of memory\n", s->prog);
		return EX_OSERR;
	}
	if (s->verbose)
		fprintf(stderr, "%s: %zu bytes%s%s%s%s, %zu lines over %d bytes broken\n", s->prog,
			s->msg.len, res.added_from ? ", From: added" : "",
			res.added_date ? ", Date: added" : "",
			res.added_msgid ? ", Message-ID: added" : "",
			res.removed_bcc ? ", Bcc: removed" : "", folded, INJECT_LINE_MAX);
	if (s->rcpts.n == 0) {
		fprintf(stderr, "%s: no recipients: none in the message's To:, Cc: or Bcc: "
				"fields (-t), none on the command line\n", s->prog);
		return EX_DATAERR;
	}
	return 0;
}

/* The exit status for a reply (or a negative errno) at a stage. */
static int sendmail_fail(struct sendmail *s, struct smtp_client *c, int code, const char *what,
			 int perm_status)
{
	if (code < 0) {
		fprintf(stderr, "%s: %s: %s\n", s->prog, what,
			code == -ETIMEDOUT   ? "the intake did not answer in time"
			: code == -EPROTO    ? "the intake's reply is not SMTP"
			: code == -E2BIG     ? "a command too long"
					     : "the connection to the intake was lost");
		return EX_TEMPFAIL;
	}
	fprintf(stderr, "%s: %s: %s\n", s->prog, what, one_line(c));
	/* a reply out of place (a 250 to DATA): not queued, nothing known to be wrong
	 * with the message; programs retry */
	return code >= 500 ? perm_status : EX_TEMPFAIL;
}

/* One transaction for the recipients from *next on.  0 (queued, *next moved past the
 * recipients it took) or an exit status. */
static int sendmail_transaction(struct sendmail *s, struct smtp_client *c, size_t *next,
				size_t queued)
{
	struct buf cmd;
	buf_init(&cmd, 2048);
	bool utf8 = has_8bit(buf_str(&s->sender));
	for (size_t i = 0; i < s->rcpts.n; i++)
		utf8 |= has_8bit(str_cstr(s->rcpts.addr[i]));
	bool eight = s->body8 || has_8bit(buf_str(&s->msg));
	int r = buf_printf(&cmd, "MAIL FROM:<%s>", s->sender.len ? s->sender.ptr : "");
	if (r == 0 && c->ehlo.ext & SMTP_EHLO_SIZE)
		r = buf_printf(&cmd, " SIZE=%zu", s->msg.len);
	if (r == 0 && eight && c->ehlo.ext & SMTP_EHLO_8BITMIME)
		r = buf_append_cstr(&cmd, " BODY=8BITMIME");
	if (r == 0 && utf8 && c->ehlo.ext & SMTP_EHLO_SMTPUTF8)
		r = buf_append_cstr(&cmd, " SMTPUTF8");
	if (r == 0 && s->ret && c->ehlo.ext & SMTP_EHLO_DSN)
		r = buf_printf(&cmd, " RET=%s", s->ret);
	if (r == 0 && s->envid && c->ehlo.ext & SMTP_EHLO_DSN) {
		r = buf_append_cstr(&cmd, " ENVID=");
		if (r == 0)
			r = put_xtext(&cmd, s->envid);
	}
	int code = r < 0 ? -E2BIG : smtp_client_command(c, COMMAND_TIMEOUT_MS, "%s", cmd.ptr);
	buf_done(&cmd);
	if (code < 200 || code >= 300)
		return sendmail_fail(s, c, code, "the intake refused the sender", EX_DATAERR);

	size_t accepted = 0, i;
	int status = 0;
	for (i = *next; i < s->rcpts.n; i++) {
		const char *rcpt = s->rcpts.addr[i];
		code = s->notify[0] && c->ehlo.ext & SMTP_EHLO_DSN
			       ? smtp_client_command(c, COMMAND_TIMEOUT_MS, "RCPT TO:<%s> NOTIFY=%s",
						     rcpt, s->notify)
			       : smtp_client_command(c, COMMAND_TIMEOUT_MS, "RCPT TO:<%s>", rcpt);
		if (code >= 200 && code < 300) {
			accepted++;
			continue;
		}
		if (code == 452 && accepted > 0 && status == 0)
			break; /* too many for one transaction: these first, the rest next */
		char what[INJECT_MAX_ADDR + 64];
		snprintf(what, sizeof(what), "the intake refused recipient <%s>", rcpt);
		int st = sendmail_fail(s, c, code, what, EX_NOUSER);
		if (code < 0 || code == 421) /* the intake is closing the connection */
			return st;
		/* a permanent refusal decides: retrying would not help */
		if (status != EX_NOUSER)
			status = st;
	}
	if (status) {
		if (queued)
			fprintf(stderr, "%s: the message was queued for its first %zu recipients "
					"only\n", s->prog, queued);
		return status;
	}
	code = smtp_client_command(c, COMMAND_TIMEOUT_MS, "DATA");
	if (code != 354)
		return sendmail_fail(s, c, code, "the intake refused the message at DATA",
				     EX_DATAERR);
	bool sent;
	code = smtp_client_data(c, buf_str(&s->msg), DATA_END_TIMEOUT_MS, &sent);
	if (code < 0 && sent) {
		fprintf(stderr, "%s: the connection to the intake was lost after the message was "
				"sent: it may have been queued\n", s->prog);
		return EX_TEMPFAIL;
	}
	if (code < 200 || code >= 300)
		return sendmail_fail(s, c, code, "the intake refused the message", EX_DATAERR);
	if (s->verbose)
		fprintf(stderr, "%s: queued for %zu recipients: %s\n", s->prog, accepted,
			one_line(c));
	*next = i;
	return 0;
}

static int sendmail_deliver(struct sendmail *s)
{
	struct smtp_client c = { .trace = s->verbose ? stderr : NULL, .trace_prefix = "" };
	char err[512];
	if (target_connect(&s->t, &c, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s: cannot connect to the intake at %s (is sluiced running?)\n",
			s->prog, err);
		return EX_TEMPFAIL;
	}
	int status = 0;
	int code = smtp_client_read_reply(&c, COMMAND_TIMEOUT_MS);
	if (code < 200 || code >= 300)
		status = sendmail_fail(s, &c, code, "the intake's greeting", EX_UNAVAILABLE);
	if (!status) {
		code = smtp_client_hello(&c, s->t.domain, COMMAND_TIMEOUT_MS);
		if (code < 200 || code >= 300)
			status = sendmail_fail(s, &c, code, "the intake refused EHLO",
					       EX_UNAVAILABLE);
	}
	if (!status && c.ehlo.ext & SMTP_EHLO_SIZE && c.ehlo.size_max &&
	    s->msg.len > c.ehlo.size_max) {
		fprintf(stderr, "%s: the message (%zu bytes) is larger than the intake takes "
				"(%llu bytes)\n", s->prog, s->msg.len,
			(unsigned long long)c.ehlo.size_max);
		status = EX_DATAERR;
	}
	size_t next = 0;
	while (!status && next < s->rcpts.n)
		status = sendmail_transaction(s, &c, &next, next);
	smtp_client_quit(&c);
	smtp_client_close(&c);
	return status;
}

/* -bs: the caller speaks SMTP on standard input and output; relay it to the intake. */
static int sendmail_relay(struct sendmail *s)
{
	struct smtp_client c = { 0 };
	char err[512];
	if (target_connect(&s->t, &c, err, sizeof(err)) < 0) {
		printf("421 4.3.0 sluice intake unavailable\r\n");
		fflush(stdout);
		fprintf(stderr, "%s: cannot connect to the intake at %s (is sluiced running?)\n",
			s->prog, err);
		return EX_TEMPFAIL;
	}
	struct pollfd p[2] = { { .fd = 0, .events = POLLIN }, { .fd = c.fd, .events = POLLIN } };
	char b[16384];
	int status = 0;
	for (;;) {
		/* until the input ends, the intake's idle timeout bounds the wait */
		int n = poll(p, 2, p[0].fd < 0 ? DATA_END_TIMEOUT_MS : -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			status = n < 0 ? EX_OSERR : EX_TEMPFAIL;
			break;
		}
		if (p[0].revents) {
			ssize_t k = read(0, b, sizeof(b));
			if (k > 0) {
				if (smtp_client_write(&c, b, (size_t)k, COMMAND_TIMEOUT_MS) < 0)
					break;
			} else if (k == 0 || errno != EINTR) {
				/* The input ended: a QUIT of our own (after the caller's, it
				 * finds the connection closed; after a final dot without one,
				 * it ends the session once the message is answered), then the
				 * intake's last replies.  Not shutdown(SHUT_WR): a server takes
				 * a half-closed connection for a lost one, and drops the
				 * transaction whose reply is still to come. */
				smtp_client_write(&c, "QUIT\r\n", 6, COMMAND_TIMEOUT_MS);
				p[0].fd = -1;
			}
		}
		if (p[1].revents) {
			ssize_t k = read(c.fd, b, sizeof(b));
			if (k < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			if (k <= 0)
				break;
			for (ssize_t off = 0; off < k;) {
				ssize_t w = write(1, b + off, (size_t)(k - off));
				if (w < 0 && errno == EINTR)
					continue;
				if (w <= 0) {
					status = EX_IOERR;
					goto out;
				}
				off += w;
			}
		}
	}
out:
	smtp_client_close(&c);
	return status;
}

int inject_sendmail(int argc, char **argv, const char *config, const char *prog)
{
	struct sendmail s = { .prog = prog, .dots_end = true, .config = config };
	if (!fd_open(0)) {
		fprintf(stderr, "%s: standard input is closed\n", prog);
		return EX_NOINPUT;
	}
	fds_sane();
	int status = sendmail_options(&s, argc, argv);
	if (status)
		return status == SENDMAIL_DONE ? EX_OK : status;
	char err[1024];
	if (target_find(&s.t, s.intake, s.config, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s: %s\n", prog, err);
		target_free(&s.t);
		return EX_CONFIG;
	}
	if (s.smtp_mode) {
		status = sendmail_relay(&s);
		target_free(&s.t);
		return status;
	}
	buf_init(&s.sender, INJECT_MAX_ADDR);
	inject_rcpts_init(&s.rcpts, INJECT_MAX_RCPTS);
	const struct passwd *pw = getpwuid(getuid());
	status = sendmail_sender(&s, pw);
	struct addr_ctx x = { .s = &s };
	buf_init(&x.tmp, INJECT_MAX_ADDR + 1);
	for (int i = optind; !status && i < argc; i++) {
		int r = inject_addrlist_parse(str_cstr(argv[i]), add_arg_rcpt, &x);
		if (r == -E2BIG) {
			fprintf(stderr, "%s: more than %d recipients\n", prog, INJECT_MAX_RCPTS);
			status = EX_USAGE;
		} else if (r < 0) {
			fprintf(stderr, "%s: %s: not a usable recipient address\n", prog, argv[i]);
			status = EX_USAGE;
		}
	}
	buf_done(&x.tmp);
	if (!status && !s.extract && s.rcpts.n == 0) {
		fprintf(stderr, "%s: no recipients: give them as arguments, or use -t\n", prog);
		sendmail_usage(stderr, prog);
		status = EX_USAGE;
	}
	if (!status)
		status = sendmail_message(&s, pw);
	if (!status)
		status = sendmail_deliver(&s);
	buf_done(&s.msg);
	buf_done(&s.sender);
	inject_rcpts_clear(&s.rcpts);
	target_free(&s.t);
	return status;
}

/* ============================== qmail-remote ============================== */

/*
 * The reports (qmail-remote(8), RESULTS): per recipient, in argument order, 'r'
 * (accepted), 'h' (refused for good) or 's' (refused for now); then one message report,
 * 'K' (the intake took the message: it is queued), 'Z' (temporary failure) or 'D'
 * (permanent failure).  Each is a letter, human-readable text, and a NUL byte.  The
 * texts follow qmail-remote's own ("HOST does not like recipient.\nRemote host said:
 * REPLY\n"), with the intake's address in place of the host, so that qmail's log and
 * the tools that read it see what they are used to.
 */
struct qmail {
	struct buf out;           /* the report being made (written out when it ends) */
	struct smtp_client c;
	const char *host;         /* the intake's address, for the texts */
};

struct qmail_rcpt {
	char *addr;               /* SMTP form, or the argument if it has none */
	bool usable;
};

static void q_write(const char *p, size_t n);

static void q_put(struct qmail *q, const char *s)
{
	buf_append_cstr(&q->out, s);
}

/* "Remote host said: REPLY" (every line, as qmail-remote prints it). */
static void q_said(struct qmail *q)
{
	if (q->c.reply.len) {
		q_put(q, "Remote host said: ");
		buf_append_str(&q->out, buf_str(&q->c.reply));
	}
}

/* End a report: write it and its NUL out (reports go out as they are made, like
 * qmail-remote's, so the buffer holds one; a text too long for it is cut, its NUL
 * never).  0: the session helpers return it, so that "return q_end(q);" ends the
 * session with a report. */
static int q_end(struct qmail *q)
{
	q_write(q->out.ptr, q->out.len);
	q_write("", 1);
	buf_reset(&q->out);
	return 0;
}

/* A message report "<letter><pre><host><post>.\n" and the last reply: qmail's quit(). */
static int q_quit(struct qmail *q, char letter, const char *pre, const char *post)
{
	buf_printf(&q->out, "%c%s%s%s.\n", letter, pre, q->host, post);
	q_said(q);
	return q_end(q);
}

/* The connection died (or stopped answering) at a stage. */
static int q_dropped(struct qmail *q, bool critical)
{
	buf_printf(&q->out, "ZConnected to %s but connection died. %s(#4.4.2)\n", q->host,
		   critical ? "Possible duplicate! " : "");
	return q_end(q);
}

static void q_write(const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(1, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return; /* nobody to tell */
		p += w;
		n -= (size_t)w;
	}
}

/* The session with the intake; the reports go to q->out.  Returns 0. */
static int qmail_session(struct qmail *q, struct target *t, const char *sender,
			 const struct qmail_rcpt *rcpt, size_t nrcpt, struct str msg, bool eightbit)
{
	struct smtp_client *c = &q->c;
	int code = smtp_client_read_reply(c, COMMAND_TIMEOUT_MS);
	if (code < 0)
		return q_dropped(q, false);
	if (code < 200 || code >= 300)
		return q_quit(q, 'Z', "Connected to ", " but greeting failed");
	code = smtp_client_hello(c, t->domain, COMMAND_TIMEOUT_MS);
	if (code < 0)
		return q_dropped(q, false);
	if (code < 200 || code >= 300)
		return q_quit(q, 'Z', "Connected to ", " but my name was rejected");
	if (c->ehlo.ext & SMTP_EHLO_SIZE && c->ehlo.size_max && msg.len > c->ehlo.size_max) {
		buf_printf(&q->out, "DConnected to %s but the message (%zu bytes) is larger than "
				    "it takes (%llu bytes). (#5.3.4)\n", q->host, msg.len,
			   (unsigned long long)c->ehlo.size_max);
		return q_end(q);
	}
	bool utf8 = has_8bit(str_cstr(sender));
	for (size_t i = 0; i < nrcpt; i++)
		utf8 |= has_8bit(str_cstr(rcpt[i].addr));
	char size[32] = "";
	if (c->ehlo.ext & SMTP_EHLO_SIZE)
		snprintf(size, sizeof(size), " SIZE=%zu", msg.len);
	code = smtp_client_command(c, COMMAND_TIMEOUT_MS, "MAIL FROM:<%s>%s%s%s", sender, size,
				   eightbit && c->ehlo.ext & SMTP_EHLO_8BITMIME ? " BODY=8BITMIME" : "",
				   utf8 && c->ehlo.ext & SMTP_EHLO_SMTPUTF8 ? " SMTPUTF8" : "");
	if (code < 0)
		return q_dropped(q, false);
	if (code >= 500)
		return q_quit(q, 'D', "Connected to ", " but sender was rejected");
	if (code < 200 || code >= 300)
		return q_quit(q, 'Z', "Connected to ", " but sender was rejected");

	size_t accepted = 0, temporary = 0;
	for (size_t i = 0; i < nrcpt; i++) {
		if (!rcpt[i].usable) {
			buf_printf(&q->out, "hsluice cannot use the address <%s>. (#5.1.3)\n",
				   rcpt[i].addr);
			q_end(q);
			continue;
		}
		code = smtp_client_command(c, COMMAND_TIMEOUT_MS, "RCPT TO:<%s>", rcpt[i].addr);
		if (code < 0)
			return q_dropped(q, false);
		if (code >= 200 && code < 300) {
			q_put(q, "r");
			q_end(q);
			accepted++;
			continue;
		}
		temporary += code < 500;
		buf_printf(&q->out, "%c%s does not like recipient.\n", code >= 500 ? 'h' : 's',
			   q->host);
		q_said(q);
		q_end(q);
		if (code == 421) /* the intake is closing the connection */
			return q_dropped(q, false);
	}
	if (accepted == 0) {
		/* qmail-remote says D here; Z when some refusal was temporary, since the
		 * message as a whole may still go (qmail-rspawn decides from the recipient
		 * report of its one recipient either way) */
		buf_printf(&q->out, "%cGiving up on %s.\n", temporary ? 'Z' : 'D', q->host);
		return q_end(q);
	}
	code = smtp_client_command(c, COMMAND_TIMEOUT_MS, "DATA");
	if (code < 0)
		return q_dropped(q, false);
	if (code >= 500)
		return q_quit(q, 'D', "", " failed on DATA command");
	if (code != 354)
		return q_quit(q, 'Z', "", " failed on DATA command");
	bool sent;
	code = smtp_client_data(c, msg, DATA_END_TIMEOUT_MS, &sent);
	if (code < 0)
		return q_dropped(q, sent);
	if (code >= 500)
		return q_quit(q, 'D', "", " failed after I sent the message");
	if (code < 200 || code >= 300)
		return q_quit(q, 'Z', "", " failed after I sent the message");
	return q_quit(q, 'K', "", " accepted message");
}

int inject_qmail_remote(int argc, char **argv, const char *config)
{
	bool input = fd_open(0);
	fds_sane();
	struct qmail q = { .c = { .fd = -1 } };
	buf_init(&q.out, SMTP_REPLY_MAX + INJECT_MAX_ADDR + 1024);
	struct target t = { 0 };
	struct qmail_rcpt *rcpt = NULL;
	size_t nrcpt = 0;
	struct buf msg = { 0 };
	char err[1024];

	if (argc < 4) {
		q_put(&q, "DI (qmail-remote) was invoked improperly. (#5.3.5)\n");
		q_end(&q);
		goto out;
	}
	/* argv[1], the host, is not used: sluice routes by the recipient's domain */
	if (target_find(&t, NULL, config, err, sizeof(err)) < 0) {
		buf_printf(&q.out, "ZUnable to read the sluice configuration: %s (#4.3.0)\n", err);
		q_end(&q);
		goto out;
	}
	/* qmail's sender: "" for a bounce, "#@[]" for a double bounce; both are <> */
	const char *sender_arg = strcmp(argv[2], "#@[]") == 0 ? "" : argv[2];
	char sender[INJECT_MAX_ADDR + 1];
	struct buf sb;
	buf_init_fixed(&sb, sender, sizeof(sender));
	if (inject_addr_smtp(sender_arg, NULL, &sb) < 0) {
		q_put(&q, "Dsluice cannot use the sender address. (#5.1.7)\n");
		q_end(&q);
		goto out;
	}
	if ((size_t)argc - 3 > INJECT_MAX_RCPTS) {
		q_put(&q, "DToo many recipients. (#5.5.3)\n");
		q_end(&q);
		goto out;
	}
	/* one report per argument, in order: duplicates are kept */
	rcpt = calloc((size_t)argc - 3, sizeof(*rcpt));
	struct buf a;
	buf_init(&a, INJECT_MAX_ADDR + 1);
	for (int i = 3; rcpt && i < argc; i++, nrcpt++) {
		buf_reset(&a);
		rcpt[nrcpt].usable = inject_addr_smtp(argv[i], NULL, &a) == 0 && a.len > 0;
		rcpt[nrcpt].addr = strdup(rcpt[nrcpt].usable ? a.ptr : argv[i]);
		if (!rcpt[nrcpt].addr)
			break;
	}
	buf_done(&a);
	if (!rcpt || nrcpt < (size_t)argc - 3) {
		q_put(&q, "ZOut of memory. (#4.3.0)\n");
		q_end(&q);
		goto out;
	}
	buf_init(&msg, t.max_size);
	struct inject_text text;
	inject_text_init(&text, &msg, false);
	int r = input ? read_message(0, &text) : -EBADF;
	if (r == -ENOBUFS) {
		buf_printf(&q.out, "DThe message is larger than the sluice intake takes (%llu "
				   "bytes). (#5.3.4)\n", (unsigned long long)t.max_size);
		q_end(&q);
		goto out;
	}
	size_t folded;
	if (r == 0 && fold_long_lines(&msg, &folded) < 0)
		r = -ENOMEM;
	if (r == -ENOMEM) {
		q_put(&q, "ZOut of memory. (#4.3.0)\n");
		q_end(&q);
		goto out;
	}
	if (r < 0) {
		q_put(&q, "ZUnable to read message. (#4.3.0)\n");
		q_end(&q);
		goto out;
	}
	if (target_connect(&t, &q.c, err, sizeof(err)) < 0) {
		buf_printf(&q.out, "ZSorry, I wasn't able to establish an SMTP connection to the "
				   "sluice intake (%s). (#4.4.1)\n", err);
		q_end(&q);
		goto out;
	}
	q.host = q.c.name;
	qmail_session(&q, &t, sender, rcpt, nrcpt, buf_str(&msg), text.eightbit);
	smtp_client_quit(&q.c);
	smtp_client_close(&q.c);
out:
	buf_done(&q.out);
	buf_done(&msg);
	for (size_t i = 0; rcpt && i < nrcpt; i++)
		free(rcpt[i].addr);
	free(rcpt);
	target_free(&t);
	return 0;
}
