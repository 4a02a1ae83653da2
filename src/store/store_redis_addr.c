/*
 * store_redis_addr -- what the Redis store reads from its configuration and from a
 * cluster's replies, and the cluster's start-up probe (store_redis_int.h).
 *
 * An address is "unix:/path", "/path", "host:port", "[v6]:port" or "host"; a host name is
 * resolved once, when the configuration is read, so that hiredis never resolves one
 * (blocking) at a reconnection.  A key's cluster slot is CRC16/XMODEM of its hash tag.
 * CLUSTER SLOTS replies and MOVED/ASK errors come from the network: they are parsed
 * here with every bound checked, with no I/O and no state (fuzz_redis_cluster), and
 * leave their output untouched when they fail.  redis_cluster_probe() asks the seeds for
 * a slot map, blocking, once at start, so that a cluster that cannot be used is said
 * before sluiced runs.
 *
 * Calls no other room of the store.  Any thread: redis_addr_parse() and the probe run
 * on the thread that makes the store, the parsers on the loops'.
 */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "store_redis_int.h"
#include "util.h"

void redis_addr_format(const struct addr *a, char *buf, size_t len)
{
	if (a->port == 0)
		fmt_fixed(buf, len, "unix:%s", a->host);
	else if (strchr(a->host, ':'))
		fmt_fixed(buf, len, "[%s]:%d", a->host, a->port);
	else
		fmt_fixed(buf, len, "%s:%d", a->host, a->port);
}

/*
 * "unix:/path", "/path", "host:port", "[v6]:port", "host" (port 6379).  A host name is
 * resolved here, once (hiredis would resolve it, blocking, at every reconnection).
 */
int redis_addr_parse(const char *text, struct addr *ret, char *err, size_t errlen)
{
	memset(ret, 0, sizeof(*ret));
	if (strncmp(text, "unix:", 5) == 0 || text[0] == '/') {
		const char *path = text[0] == '/' ? text : text + 5;
		if (!*path || fmt_fixed(ret->host, sizeof(ret->host), "%s", path) < 0) {
			fmt_fixed(err, errlen, "bad socket path '%s'", text);
			return -EINVAL;
		}
		return 0;
	}
	char host[256];
	const char *port = NULL;
	if (text[0] == '[') {
		const char *end = strchr(text, ']');
		if (!end || (size_t)(end - text - 1) >= sizeof(host) || (end[1] && end[1] != ':')) {
			fmt_fixed(err, errlen, "bad address '%s' (expected [v6]:port)", text);
			return -EINVAL;
		}
		memcpy(host, text + 1, (size_t)(end - text - 1));
		host[end - text - 1] = '\0';
		port = end[1] ? end + 2 : NULL;
	} else {
		const char *colon = strrchr(text, ':');
		size_t n = colon ? (size_t)(colon - text) : strlen(text);
		if (n == 0 || n >= sizeof(host) || (colon && strchr(text, ':') != colon)) {
			fmt_fixed(err, errlen, "bad address '%s' (expected host:port)", text);
			return -EINVAL;
		}
		memcpy(host, text, n);
		host[n] = '\0';
		port = colon ? colon + 1 : NULL;
	}
	long p = 6379;
	if (port) {
		char *end;
		p = strtol(port, &end, 10);
		if (!*port || *end || p < 1 || p > 65535) {
			fmt_fixed(err, errlen, "bad port in '%s'", text);
			return -EINVAL;
		}
	}
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	int r = getaddrinfo(host, NULL, &hints, &ai);
	if (r != 0 || !ai) {
		fmt_fixed(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(r));
		return -EINVAL;
	}
	char num[NI_MAXHOST];
	r = getnameinfo(ai->ai_addr, ai->ai_addrlen, num, sizeof(num), NULL, 0, NI_NUMERICHOST);
	freeaddrinfo(ai);
	if (r != 0) {
		fmt_fixed(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(r));
		return -EINVAL;
	}
	fmt_fixed(ret->host, sizeof(ret->host), "%s", num);
	ret->port = (int)p;
	return 0;
}

/* CRC16/XMODEM (polynomial 0x1021, initial 0), as Redis Cluster hashes keys. */
uint16_t redis_key_slot(const char *tag, size_t len)
{
	uint16_t crc = 0;
	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)((unsigned char)tag[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc & (REDIS_SLOTS - 1);
}

/* A master's address from a CLUSTER SLOTS node entry [host, port, ...]; an empty host
 * (or "?") is the host of the node asked. */
static int slots_node_addr(const redisReply *n, const struct addr *asked, struct addr *ret)
{
	if (n->type != REDIS_REPLY_ARRAY || n->elements < 2 ||
	    n->element[0]->type != REDIS_REPLY_STRING || n->element[1]->type != REDIS_REPLY_INTEGER ||
	    n->element[1]->integer < 1 || n->element[1]->integer > 65535 ||
	    n->element[0]->len >= sizeof(ret->host) || memchr(n->element[0]->str, '\0',
							      n->element[0]->len))
		return -EPROTO;
	memset(ret, 0, sizeof(*ret));
	if (n->element[0]->len == 0 || strcmp(n->element[0]->str, "?") == 0)
		fmt_fixed(ret->host, sizeof(ret->host), "%s", asked->host);
	else
		memcpy(ret->host, n->element[0]->str, n->element[0]->len);
	ret->port = (int)n->element[1]->integer;
	return 0;
}

int redis_slots_parse(const redisReply *rep, const struct addr *asked,
		      struct redis_slot_range *ret, size_t max)
{
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements > max)
		return -EPROTO;
	for (size_t i = 0; i < rep->elements; i++) {
		const redisReply *e = rep->element[i];
		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
		    e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER || e->element[0]->integer < 0 ||
		    e->element[1]->integer >= REDIS_SLOTS ||
		    e->element[0]->integer > e->element[1]->integer ||
		    slots_node_addr(e->element[2], asked, &ret[i].master) < 0)
			return -EPROTO;
		ret[i].first = (uint16_t)e->element[0]->integer;
		ret[i].last = (uint16_t)e->element[1]->integer;
	}
	return (int)rep->elements;
}

int redis_redirect_parse(const char *text, unsigned *ret_slot, struct addr *ret)
{
	const char *sp = strchr(text, ' ');
	if (!sp)
		return -EPROTO;
	char *end;
	unsigned long slot = strtoul(sp + 1, &end, 10);
	if (end == sp + 1 || *end != ' ' || slot >= REDIS_SLOTS)
		return -EPROTO;
	const char *where = end + 1;
	const char *colon = strrchr(where, ':');
	if (!colon || colon == where || (size_t)(colon - where) >= sizeof(ret->host))
		return -EPROTO;
	long port = strtol(colon + 1, &end, 10);
	if (*end || port < 1 || port > 65535)
		return -EPROTO;
	memset(ret, 0, sizeof(*ret));
	const char *h = where;
	size_t hl = (size_t)(colon - where);
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	memcpy(ret->host, h, hl);
	ret->port = (int)port;
	*ret_slot = (unsigned)slot;
	return 0;
}

int redis_cluster_probe(struct rstore *st, char *err, size_t errlen)
{
	char why[1024] = "";
	size_t wl = 0;
	bool found = false;
	for (size_t i = 0; i < st->nseeds; i++) {
		const struct addr *a = &st->seeds[i];
		char where[300], one[256];
		redis_addr_format(a, where, sizeof(where));
		struct timeval tv = timeval_from_ms(REDIS_CONNECT_TIMEOUT_MS);
		redisContext *c = a->port ? redisConnectWithTimeout(a->host, a->port, tv)
					  : redisConnectUnixWithTimeout(a->host, tv);
		redisReply *rep = NULL;
		if (c && !c->err) {
			redisSetTimeout(c, tv);
			if (st->password) {
				rep = st->user ? redisCommand(c, "AUTH %s %s", st->user, st->password)
					       : redisCommand(c, "AUTH %s", st->password);
				if (rep && rep->type == REDIS_REPLY_ERROR)
					fmt_fixed(one, sizeof(one), "%.100s", rep->str);
				else
					one[0] = '\0';
				freeReplyObject(rep);
				rep = NULL;
			} else {
				one[0] = '\0';
			}
			if (!one[0])
				rep = redisCommand(c, "CLUSTER SLOTS");
			if (one[0]) {
				/* AUTH refused: said below */
			} else if (!rep) {
				fmt_fixed(one, sizeof(one), "%s", c->errstr[0] ? c->errstr : "no reply");
			} else if (rep->type == REDIS_REPLY_ERROR) {
				fmt_fixed(one, sizeof(one), "not a cluster node (%.100s)", rep->str);
				freeReplyObject(rep);
				redisFree(c);
				fmt_fixed(err, errlen, "cluster seed %s is %s", where, one);
				return -1;
			} else if (rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) {
				fmt_fixed(one, sizeof(one), "its cluster has no slots assigned yet");
			} else {
				found = true;
				one[0] = '\0';
			}
		} else {
			fmt_fixed(one, sizeof(one), "%s", c ? c->errstr : "out of memory");
		}
		if (rep)
			freeReplyObject(rep);
		if (c)
			redisFree(c);
		if (one[0] && wl < sizeof(why)) {
			int w = snprintf(why + wl, sizeof(why) - wl, "%s%s: %s", wl ? "; " : "",
					 where, one);
			if (w > 0)
				wl += (size_t)w;
		}
	}
	if (found)
		return 0;
	fmt_fixed(err, errlen, "no cluster seed answered with a slot map: %s", why);
	return -1;
}
