/*
 * sockspec -- socket strings: the one parser of the addresses sluice listens on and
 * connects to, in its own forms and in those of libmilter, Sendmail and Postfix.
 *
 *   unix:/path  local:/path  /path                 a unix socket (path < sizeof sun_path)
 *   inet:HOST:PORT   inet:[ADDR]:PORT              sluice's and Postfix's forms
 *   inet6:[ADDR]:PORT   inet6:ADDR:PORT
 *   inet:PORT@HOST   inet:PORT@[ADDR]   inet:PORT  libmilter's (smfi_setconn) and Sendmail's
 *   inet6:PORT@HOST  inet6:PORT@[ADDR]  inet6:PORT   forms; no @HOST: every address
 *
 * The type is case-insensitive (as libmilter's); PORT is 1..65535 in decimal (service
 * names are refused); HOST is "*", a numeric address, or a host name (syntax checked
 * here, resolved by sockspec_resolve()).  Under "inet:" a numeric IPv6 address selects
 * IPv6, as sluice always did.  Configuration and argv input only: nothing a peer sends
 * reaches this parser.  No I/O except sockspec_resolve()'s look-up of a host name.
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
	int family;     /* AF_UNIX, AF_INET or AF_INET6 */
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
 * loopback address, any other name through getaddrinfo() (first answer of the spec's
 * family; blocking: startup, configuration check, the command line).  0, or -EINVAL /
 * -EHOSTUNREACH with err.
 */
int sockspec_resolve(const struct sockspec *s, struct sockaddr_storage *ret_ss,
		     socklen_t *ret_len, char *err, size_t errlen);

#endif
