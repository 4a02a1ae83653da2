/*
 * sockspec -- socket strings: the parser of every address sluiced listens on (milter,
 * policy, intake, control, metrics) and of the addresses sluice(1) connects to (-s, the
 * intake), in sluice's own forms and in those of libmilter, Sendmail and Postfix.  The
 * Redis server and the relay's smarthost keep their own grammars (host:port, [host]).
 *
 *   unix:/path  local:/path  /path                 a unix socket (path < sizeof sun_path)
 *   inet:HOST:PORT   inet:[ADDR]:PORT              sluice's and Postfix's forms
 *   inet6:[ADDR]:PORT                               (an IPv6 address before :PORT is
 *                                                    bracketed)
 *   inet:PORT@HOST   inet:PORT@[ADDR]   inet:PORT  libmilter's (smfi_setconn) and Sendmail's
 *   inet6:PORT@HOST  inet6:PORT@[ADDR]  inet6:PORT   forms; no @HOST: every address
 *
 * The type is case-insensitive (as libmilter's); PORT is 1..65535 in decimal (service
 * names and leading zeros are refused); HOST is "*", a numeric address (an IPv4 one
 * dotted-quad; not IPv4-mapped IPv6), a link-local IPv6 address with its zone
 * (fe80::1%eth0), or a host name by RFC 1123 (its last label not all digits; syntax
 * checked here, looked up by sockspec_resolve()).  Under "inet:" a numeric IPv6 address
 * selects IPv6, as sluice always did.  libmilter's inet6 wildcard (inet6:PORT,
 * inet6:PORT@[::]) is dual_stack: it takes IPv4 clients too, as libmilter's does;
 * sluice's inet6:[::]:PORT is IPv6 only.  Configuration and argv input only: nothing a
 * peer sends reaches this parser.  No I/O except the look-up of a host name.
 */
#ifndef SLUICE_SOCKSPEC_H
#define SLUICE_SOCKSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define SOCKSPEC_TEXT_MAX 255 /* the longest socket string accepted */
#define SOCKSPEC_PATH_MAX 107 /* sizeof(((struct sockaddr_un *)0)->sun_path) - 1 */

struct sockspec {
	char text[SOCKSPEC_TEXT_MAX + 1]; /* as written, for errors */
	int family;     /* AF_UNIX, AF_INET or AF_INET6 */
	bool dual_stack; /* inet6 wildcard in libmilter's form: IPV6_V6ONLY off */
	char host[256]; /* inet: without brackets; "" means every address */
	bool numeric;   /* host is "" or a numeric address: no look-up needed */
	uint16_t port;
	char path[SOCKSPEC_PATH_MAX + 1]; /* unix */
};

/*
 * Parse text into *ret.  Returns 0, or -EINVAL with a message in err that quotes the text
 * (e.g. "\"inet:0@127.0.0.1\": port 0 is out of range 1-65535"); *ret is untouched then.
 */
int sockspec_parse(const char *text, struct sockspec *ret, char *err, size_t errlen);

/* A unix socket string (unix:, local: or a bare path), by its syntax alone. */
bool sockspec_is_unix(const char *text);

/*
 * The socket address of a parsed spec: numeric hosts and "" directly, "localhost" as the
 * loopback address, any other name through getaddrinfo(): the first address it returns
 * of the spec's family (a listener binds that one only; sluiced logs it).  Blocking:
 * startup, configuration check, the command line.  0, or -EINVAL / -EHOSTUNREACH with
 * err quoting the whole string ("\"inet:25@x.invalid\": x.invalid: Name or service not
 * known").
 */
int sockspec_resolve(const struct sockspec *s, struct sockaddr_storage *ret_ss,
		     socklen_t *ret_len, char *err, size_t errlen);

/* Every address of s's host (getaddrinfo(), the spec's family, s->port set), for a
 * client that tries each in turn; freeaddrinfo() it.  0, or -EHOSTUNREACH with err. */
struct addrinfo;
int sockspec_lookup(const struct sockspec *s, struct addrinfo **ret, char *err, size_t errlen);

#endif
