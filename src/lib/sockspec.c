/*
 * sockspec -- parse socket strings (see sockspec.h for the forms accepted).
 *
 * Every error quotes the text (truncated to 100 bytes) and says what is wrong with it;
 * the caller adds where the text came from (FILE:LINE: KEY, or the command line).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include "sockspec.h"
#include "util.h"

_Static_assert(SOCKSPEC_PATH_MAX + 1 == sizeof(((struct sockaddr_un *)0)->sun_path),
	       "SOCKSPEC_PATH_MAX follows sun_path");

#define FORMS "unix:/path, local:/path, inet:host:port, inet:port@host, inet6:[addr]:port " \
	      "or inet6:port@[addr]"

/* err = "\"TEXT\": WHY", TEXT cut at 100 bytes and both made printable (a control
 * character or 8-bit byte is shown as '?', never written raw to a terminal or a log). */
static void say(const char *text, char *err, size_t errlen, const char *why)
{
	char shown[110], whys[240];
	size_t tlen = strlen(text);
	text_sanitize(shown, sizeof(shown), (struct str){ text, tlen > 100 ? 100 : tlen }, 100,
		      TEXT_NO_QUOTES);
	text_sanitize(whys, sizeof(whys), (struct str){ why, strlen(why) }, sizeof(whys) - 1, 0);
	snprintf(err, errlen, "\"%s%s\": %s", shown, tlen > 100 ? "..." : "", whys);
}

__attribute__((format(printf, 4, 5))) static int fail(const char *text, char *err,
						      size_t errlen, const char *fmt, ...)
{
	char why[240];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	say(text, err, errlen, why);
	return -EINVAL;
}

/* "1".."65535" exactly (no sign, space, leading zero or service name): 0, -ENOENT
 * (empty), -EINVAL (not a number), -EDOM (a leading zero) or -ERANGE. */
static int parse_port(const char *s, size_t len, uint16_t *ret)
{
	if (len == 0)
		return -ENOENT;
	unsigned long v = 0;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		if (i == 5)
			return -ERANGE;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	if (len > 1 && s[0] == '0')
		return -EDOM;
	if (v == 0 || v > 65535)
		return -ERANGE;
	*ret = (uint16_t)v;
	return 0;
}

/* A host name by RFC 1123's syntax: labels of letters, digits and '-' (not at either
 * end), 1..63 bytes, joined by single dots; at most 253 bytes; a trailing dot allowed. */
static bool valid_hostname(const char *h, size_t len)
{
	if (len == 0 || len > 254 || (len == 254 && h[253] != '.'))
		return false;
	size_t label = 0;
	for (size_t i = 0; i < len; i++) {
		char c = h[i];
		if (c == '.') {
			if (label == 0 || h[i - 1] == '-')
				return false;
			label = 0;
			continue;
		}
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			     (c >= '0' && c <= '9');
		if (!alnum && (c != '-' || label == 0))
			return false;
		if (++label > 63)
			return false;
	}
	return h[len - 1] != '-';
}

/* A name getaddrinfo() would read as an address though it is not a dotted quad ("127.1",
 * "1234", "0x7f000001"): its last label is all digits, or inet_aton() takes it (RFC 1123
 * 2.1: a name's highest-level label is not all numeric). */
static bool looks_numeric(const char *h, size_t len)
{
	if (len && h[len - 1] == '.')
		len--;
	size_t i = len;
	while (i > 0 && h[i - 1] >= '0' && h[i - 1] <= '9')
		i--;
	if (i < len && (i == 0 || h[i - 1] == '.'))
		return true;
	struct in_addr a;
	return inet_aton(h, &a) != 0;
}

/* ADDR%ZONE: a link-local IPv6 address and an interface name (letters, digits, '.', '_',
 * '-', shorter than IF_NAMESIZE); resolved by getaddrinfo(AI_NUMERICHOST). */
static bool valid_zoned(const char *h)
{
	const char *pct = strchr(h, '%');
	char addr[INET6_ADDRSTRLEN];
	size_t alen = (size_t)(pct - h), zlen = strlen(pct + 1);
	if (alen >= sizeof(addr) || zlen == 0 || zlen >= IF_NAMESIZE)
		return false;
	for (const char *z = pct + 1; *z; z++)
		if (!((*z >= 'a' && *z <= 'z') || (*z >= 'A' && *z <= 'Z') ||
		      (*z >= '0' && *z <= '9') || *z == '.' || *z == '_' || *z == '-'))
			return false;
	memcpy(addr, h, alen);
	addr[alen] = '\0';
	struct in6_addr a;
	return inet_pton(AF_INET6, addr, &a) == 1 &&
	       (IN6_IS_ADDR_LINKLOCAL(&a) || IN6_IS_ADDR_MC_LINKLOCAL(&a));
}

static bool is_v4(const char *h)
{
	struct in_addr a;
	return inet_pton(AF_INET, h, &a) == 1;
}

bool sockspec_is_unix(const char *text)
{
	return text[0] == '/' || strncasecmp(text, "unix:", 5) == 0 ||
	       strncasecmp(text, "local:", 6) == 0;
}

/* Host text (brackets already removed when bracketed) into s; family may move to v6. */
static int set_host(const char *text, const char *h, size_t len, bool bracketed, bool inet6,
		    struct sockspec *s, char *err, size_t errlen)
{
	if (len == 0)
		return fail(text, err, errlen, "empty host");
	if (len >= sizeof(s->host))
		return fail(text, err, errlen, "host longer than %zu bytes", sizeof(s->host) - 1);
	memcpy(s->host, h, len);
	s->host[len] = '\0';
	if (strcmp(s->host, "*") == 0) {
		s->host[0] = '\0';
		s->numeric = true;
		return 0;
	}
	struct in6_addr a6;
	if (inet_pton(AF_INET6, s->host, &a6) == 1) {
		if (IN6_IS_ADDR_V4MAPPED(&a6)) {
			char v4[INET_ADDRSTRLEN];
			inet_ntop(AF_INET, &a6.s6_addr[12], v4, sizeof(v4));
			return fail(text, err, errlen, "[%s] is an IPv4-mapped address, which "
				    "sluice does not bind or connect to; write inet:%s:%u", s->host,
				    v4, (unsigned)s->port);
		}
		s->family = AF_INET6; /* "inet:[::1]:25" was always IPv6 */
		s->numeric = true;
		return 0;
	}
	if (strchr(s->host, '%')) {
		if (!valid_zoned(s->host))
			return fail(text, err, errlen, "%s: a zone (%%interface) follows only a "
				    "link-local IPv6 address (fe80::/10), e.g. [fe80::1%%eth0]",
				    s->host);
		s->family = AF_INET6;
		s->numeric = false; /* the interface is looked up by sockspec_resolve() */
		return 0;
	}
	if (is_v4(s->host)) {
		if (inet6)
			return fail(text, err, errlen, "%s is an IPv4 address; write inet:",
				    s->host);
		s->numeric = true;
		return 0;
	}
	if (bracketed)
		return fail(text, err, errlen, "[%s] is not a numeric address", s->host);
	if (!valid_hostname(h, len))
		return fail(text, err, errlen, "\"%.100s\" is neither an address nor a host name",
			    s->host);
	if (looks_numeric(h, len))
		return fail(text, err, errlen, "\"%.100s\" is neither a dotted-quad address "
			    "(a.b.c.d) nor a host name (a name's last label is not all digits: "
			    "RFC 1123 2.1)", s->host);
	s->numeric = false;
	return 0;
}

int sockspec_parse(const char *text, struct sockspec *ret, char *err, size_t errlen)
{
	struct sockspec s;
	memset(&s, 0, sizeof(s));
	size_t tlen = strlen(text);
	if (tlen <= SOCKSPEC_TEXT_MAX)
		memcpy(s.text, text, tlen + 1);
	if (tlen == 0)
		return fail(text, err, errlen, "empty; expected %s", FORMS);
	if (tlen > SOCKSPEC_TEXT_MAX)
		return fail(text, err, errlen, "longer than %d bytes", SOCKSPEC_TEXT_MAX);

	if (sockspec_is_unix(text)) {
		const char *path = text[0] == '/' ? text : strchr(text, ':') + 1;
		size_t plen = strlen(path);
		if (plen == 0)
			return fail(text, err, errlen, "empty unix socket path");
		if (plen > SOCKSPEC_PATH_MAX)
			return fail(text, err, errlen, "unix socket path longer than %d bytes",
				    SOCKSPEC_PATH_MAX);
		s.family = AF_UNIX;
		memcpy(s.path, path, plen + 1);
		*ret = s;
		return 0;
	}

	bool inet6;
	const char *rest;
	if (strncasecmp(text, "inet6:", 6) == 0) {
		inet6 = true;
		rest = text + 6;
	} else if (strncasecmp(text, "inet:", 5) == 0) {
		inet6 = false;
		rest = text + 5;
	} else {
		const char *colon = strchr(text, ':');
		if (colon)
			return fail(text, err, errlen, "unknown socket type \"%.*s\"; expected %s",
				    (int)(colon - text > 20 ? 20 : colon - text), text, FORMS);
		return fail(text, err, errlen, "expected %s", FORMS);
	}
	s.family = inet6 ? AF_INET6 : AF_INET;
	size_t rlen = strlen(rest);
	const char *host, *port;
	size_t hlen, portlen;
	bool bracketed = false, libmilter = true;
	const char *at = strchr(rest, '@');
	if (at) { /* libmilter: PORT@HOST or PORT@[ADDR] */
		port = rest;
		portlen = (size_t)(at - rest);
		host = at + 1;
		hlen = rlen - portlen - 1;
		if (hlen && host[0] == '[') {
			if (host[hlen - 1] != ']')
				return fail(text, err, errlen, "expected port@[address]");
			host++;
			hlen -= 2;
			bracketed = true;
		}
	} else if (rest[0] == '[') { /* [ADDR]:PORT */
		const char *close = strchr(rest, ']');
		if (!close)
			return fail(text, err, errlen, "missing \"]\"");
		if (close[1] != ':')
			return fail(text, err, errlen, "expected [address]:port");
		host = rest + 1;
		hlen = (size_t)(close - host);
		port = close + 2;
		portlen = strlen(port);
		bracketed = true;
		libmilter = false;
	} else {
		const char *colon = strrchr(rest, ':');
		if (!colon) { /* PORT alone: every address, as libmilter */
			host = "*";
			hlen = 1;
			port = rest;
			portlen = rlen;
		} else { /* HOST:PORT */
			host = rest;
			hlen = (size_t)(colon - rest);
			port = colon + 1;
			portlen = strlen(port);
			libmilter = false;
			if (memchr(host, ':', hlen))
				return fail(text, err, errlen, "an IPv6 address followed by a port "
					    "is written in brackets: inet6:[%.*s]:%.*s",
					    (int)(hlen > 60 ? 60 : hlen), host,
					    (int)(portlen > 10 ? 10 : portlen), port);
		}
	}
	int r = parse_port(port, portlen, &s.port);
	if (r == -ENOENT)
		return fail(text, err, errlen, "missing port");
	if (r == -EDOM)
		return fail(text, err, errlen, "port %.*s: leading zeros are not allowed",
			    (int)(portlen > 20 ? 20 : portlen), port);
	if (r == -ERANGE)
		return fail(text, err, errlen, "port %.*s is out of range 1-65535",
			    (int)(portlen > 20 ? 20 : portlen), port);
	if (r < 0)
		return fail(text, err, errlen, "port \"%.*s\" is not a number",
			    (int)(portlen > 40 ? 40 : portlen), port);
	r = set_host(text, host, hlen, bracketed, inet6, &s, err, errlen);
	if (r < 0)
		return r;
	/* libmilter leaves IPV6_V6ONLY alone: its inet6 wildcard takes IPv4 clients too */
	s.dual_stack = inet6 && libmilter && (!s.host[0] || strcmp(s.host, "::") == 0);
	*ret = s;
	return 0;
}

int sockspec_resolve(const struct sockspec *s, struct sockaddr_storage *ret_ss,
		     socklen_t *ret_len, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	socklen_t len;
	if (s->family == AF_UNIX) {
		struct sockaddr_un *sun = (struct sockaddr_un *)&ss;
		sun->sun_family = AF_UNIX;
		memcpy(sun->sun_path, s->path, strlen(s->path) + 1);
		len = sizeof(*sun);
	} else if (s->family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(s->port);
		if (!s->host[0])
			sin->sin_addr.s_addr = htonl(INADDR_ANY);
		else if (strcasecmp(s->host, "localhost") == 0)
			sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		else if (inet_pton(AF_INET, s->host, &sin->sin_addr) != 1)
			goto lookup;
		len = sizeof(*sin);
	} else {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(s->port);
		if (!s->host[0])
			sin6->sin6_addr = in6addr_any;
		else if (strcasecmp(s->host, "localhost") == 0)
			sin6->sin6_addr = in6addr_loopback;
		else if (inet_pton(AF_INET6, s->host, &sin6->sin6_addr) != 1)
			goto lookup;
		len = sizeof(*sin6);
	}
	*ret_ss = ss;
	*ret_len = len;
	return 0;
lookup:;
	struct addrinfo *res = NULL;
	int r = sockspec_lookup(s, &res, err, errlen);
	if (r < 0)
		return r;
	if (res->ai_addrlen > sizeof(ss)) {
		freeaddrinfo(res);
		return fail(s->text, err, errlen, "%s: address too long", s->host);
	}
	memcpy(&ss, res->ai_addr, res->ai_addrlen);
	len = res->ai_addrlen;
	freeaddrinfo(res);
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_port = htons(s->port);
	else
		((struct sockaddr_in6 *)&ss)->sin6_port = htons(s->port);
	*ret_ss = ss;
	*ret_len = len;
	return 0;
}

int sockspec_lookup(const struct sockspec *s, struct addrinfo **ret, char *err, size_t errlen)
{
	char port[8];
	snprintf(port, sizeof(port), "%u", (unsigned)s->port);
	struct addrinfo hints = { .ai_family = s->family, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICSERV };
	if (strchr(s->host, '%'))
		hints.ai_flags |= AI_NUMERICHOST; /* fe80::1%eth0: the interface, no DNS */
	struct addrinfo *res = NULL;
	int g = getaddrinfo(s->host[0] ? s->host : NULL, port, &hints, &res);
	if (g != 0 || !res) {
		if (res)
			freeaddrinfo(res);
		fail(s->text, err, errlen, "%s: %s", s->host[0] ? s->host : "*",
		     g == EAI_SYSTEM ? strerror(errno) : g ? gai_strerror(g) : "no address");
		return -EHOSTUNREACH;
	}
	*ret = res;
	return 0;
}
