/*
 * test_mx -- MX lookups (src/relay/mx.c) against a tiny DNS server inside the test: a UDP
 * and TCP responder on 127.0.0.1, on the same libevent loop as the resolver, answering
 * from a canned zone built by hand (MX, A, AAAA, NXDOMAIN, NODATA, SERVFAIL, a null MX, no
 * reply, a malformed answer, junk, 50 MX records that need TCP).  No other address is
 * ever queried.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "dns_answer.h"
#include "mx.h"
#include "util.h"

/* ---- the DNS server ---- */

enum { DNS_A = 1, DNS_CNAME = 5, DNS_MX = 15, DNS_AAAA = 28, DNS_TLSA = 52 };

struct rr {
	const char *owner;
	uint16_t type;
	uint16_t pref;    /* MX */
	const char *data; /* an address, or the MX exchange ("" is the root) */
};

static const struct rr zone[] = {
	{ "mx.test", DNS_MX, 20, "mx-b.mx.test" },
	{ "mx.test", DNS_MX, 10, "mx-a.mx.test" },
	{ "mx.test", DNS_MX, 20, "mx-c.mx.test" },
	{ "mx-a.mx.test", DNS_A, 0, "192.0.2.1" },
	{ "mx-a.mx.test", DNS_AAAA, 0, "2001:db8::1" },
	{ "mx-b.mx.test", DNS_A, 0, "192.0.2.2" },
	{ "mx-c.mx.test", DNS_A, 0, "192.0.2.3" },
	{ "nomx.test", DNS_A, 0, "198.51.100.7" },
	{ "nullmx.test", DNS_MX, 0, "" },
	{ "nullmx.test", DNS_A, 0, "198.51.100.8" },
	{ "allperm.test", DNS_MX, 10, "nxhost.test" },
	{ "allperm.test", DNS_MX, 20, "nodata.test" },
	{ "nodata.test", DNS_MX, 10, "elsewhere.test" }, /* exists, no A or AAAA */
	{ "sometemp.test", DNS_MX, 10, "nxhost.test" },
	{ "sometemp.test", DNS_MX, 20, "sfhost.test" },
	{ "partial.test", DNS_MX, 10, "sfhost.test" },
	{ "partial.test", DNS_MX, 20, "mx-b.mx.test" },
	{ "dup.test", DNS_MX, 10, "mx-b.mx.test" },
	{ "dup.test", DNS_MX, 20, "MX-B.mx.test" },
	{ "dup.test", DNS_MX, 30, "same-b.test" },
	{ "same-b.test", DNS_A, 0, "192.0.2.2" },
	{ "badmx.test", DNS_MX, 10, "192.0.2.77" },
	{ "badmx.test", DNS_MX, 20, "bad*host.test" },
	{ "badmix.test", DNS_MX, 10, "bad*host.test" },
	{ "badmix.test", DNS_MX, 20, "mx-c.mx.test" },
	{ "zero.test", DNS_A, 0, "0.0.0.0" },
	{ "zero.test", DNS_AAAA, 0, "::" },
	{ "multi.test", DNS_A, 0, "192.0.2.10" },
	{ "multi.test", DNS_A, 0, "192.0.2.11" },
	{ "multi.test", DNS_A, 0, "192.0.2.10" }, /* the same address twice */
	{ "multi.test", DNS_A, 0, "192.0.2.12" },
	{ "multi.test", DNS_AAAA, 0, "2001:db8::10" },
	{ "multi.test", DNS_AAAA, 0, "2001:db8::11" },
	{ "dup6.test", DNS_MX, 10, "mx-a.mx.test" },
	{ "dup6.test", DNS_MX, 20, "a6.test" },
	{ "a6.test", DNS_AAAA, 0, "2001:db8::1" },
	{ "a6.test", DNS_AAAA, 0, "2001:db8::6" },
	{ "cname.test", DNS_CNAME, 0, "nomx.test" }, /* any type: the CNAME, then nomx.test's */
	{ "relay.test", DNS_A, 0, "192.0.2.50" },
	{ "relay.test", DNS_AAAA, 0, "2001:db8::50" },
	/* "*.signed.test" answers carry the AD bit when the query did; owners starting with
	 * "short" have a TTL of 7 s (the others 300 s); TLSA data is 32 bytes of 0xab */
	{ "signed.test", DNS_MX, 10, "short.signed.test" },
	{ "short.signed.test", DNS_A, 0, "192.0.2.61" },
	{ "_25._tcp.short.signed.test", DNS_TLSA, 3, "" },
	{ "_25._tcp.short.signed.test", DNS_TLSA, 0, "" },
};

#define MANY 50 /* many.test: MANY MX records m<i>.many.test, preference (i * 37) % MANY */

enum special { SP_NONE = 0, SP_SERVFAIL, SP_DROP, SP_GARBAGE, SP_JUNK };

static const struct {
	const char *name;
	enum special sp;
} specials[] = {
	{ "servfail.test", SP_SERVFAIL },
	{ "sfhost.test", SP_SERVFAIL },
	{ "timeout.test", SP_DROP },
	{ "garbage.test", SP_GARBAGE }, /* an answer count with no answer */
	{ "junk.test", SP_JUNK },       /* five bytes: not even a header */
	{ "_25._tcp.bogus.signed.test", SP_SERVFAIL }, /* how a validator says "bogus" */
	{ "_25._tcp.timeout.signed.test", SP_DROP },
};

struct dns_conn {
	struct dns_conn *next;
	struct dns_server *srv;
	struct event *ev;
	int fd;
	size_t len;
	uint8_t buf[4096];
};

struct dns_server {
	struct event_base *base;
	int udp, tcp;
	uint16_t port;
	struct event *udp_ev, *tcp_ev;
	struct dns_conn *conns;
	unsigned queries, tcp_queries, mx_queries, many_addr_queries;
	unsigned mx_before_nomx_a; /* 1 + MX queries seen before nomx.test's first A query */
	bool hold;          /* keep UDP queries unanswered (in held[]) until released */
	size_t nheld;
	struct {
		struct sockaddr_storage from;
		socklen_t fromlen;
		size_t len;
		uint8_t q[512];
	} held[8];
};

static enum special special_of(const char *name)
{
	for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++)
		if (strcasecmp(name, specials[i].name) == 0)
			return specials[i].sp;
	return SP_NONE;
}

/* "m<i>.many.test": i, or -1 */
static int many_index(const char *name)
{
	int i, n = 0;

	if (sscanf(name, "m%d.many.test%n", &i, &n) == 1 && name[n] == '\0' && i >= 0 &&
	    i < MANY)
		return i;
	return -1;
}

static bool name_exists(const char *name)
{
	if (special_of(name) != SP_NONE || strcasecmp(name, "many.test") == 0 ||
	    many_index(name) >= 0)
		return true;
	for (size_t i = 0; i < sizeof(zone) / sizeof(zone[0]); i++)
		if (strcasecmp(zone[i].owner, name) == 0)
			return true;
	return false;
}

struct wbuf {
	uint8_t *p;
	size_t len, max;
	bool overflow;
};

static void put(struct wbuf *w, const void *d, size_t n)
{
	if (w->len + n > w->max) {
		w->overflow = true;
		return;
	}
	memcpy(w->p + w->len, d, n);
	w->len += n;
}

static void put16(struct wbuf *w, unsigned v)
{
	uint8_t b[2] = { (uint8_t)(v >> 8), (uint8_t)v };
	put(w, b, 2);
}

static void put32(struct wbuf *w, uint32_t v)
{
	put16(w, v >> 16);
	put16(w, v & 0xffff);
}

static void put_name(struct wbuf *w, const char *name)
{
	while (*name) {
		const char *dot = strchr(name, '.');
		size_t n = dot ? (size_t)(dot - name) : strlen(name);
		uint8_t l = (uint8_t)n;
		put(w, &l, 1);
		put(w, name, n);
		name += n;
		if (*name == '.')
			name++;
	}
	put(w, "", 1);
}

static const char *reply_name = ""; /* the question's name, while a reply is built */

/* One answer record owned by owner, or by the question's name (a pointer to offset 12). */
static void put_rr_owner(struct wbuf *w, const char *owner, uint16_t type, uint16_t pref,
			 const char *data)
{
	uint8_t rdata[300];
	struct wbuf rd = { rdata, 0, sizeof(rdata), false };

	if (type == DNS_A) {
		assert_int_equal(inet_pton(AF_INET, data, rdata), 1);
		rd.len = 4;
	} else if (type == DNS_AAAA) {
		assert_int_equal(inet_pton(AF_INET6, data, rdata), 1);
		rd.len = 16;
	} else if (type == DNS_CNAME) {
		put_name(&rd, data);
	} else if (type == DNS_TLSA) {
		uint8_t head[3] = { (uint8_t)pref, 1, 1 }; /* usage (pref), SPKI, SHA2-256 */
		put(&rd, head, 3);
		for (int i = 0; i < 32; i++)
			put(&rd, "\xab", 1);
	} else {
		put16(&rd, pref);
		put_name(&rd, data);
	}
	if (owner)
		put_name(w, owner);
	else
		put16(w, 0xc00c);
	put16(w, type);
	put16(w, 1);
	put32(w, strncasecmp(owner ? owner : reply_name, "short", 5) == 0 ? 7 : 300);
	put16(w, (unsigned)rd.len);
	put(w, rdata, rd.len);
}

static void put_rr(struct wbuf *w, uint16_t type, uint16_t pref, const char *data)
{
	put_rr_owner(w, NULL, type, pref, data);
}

/*
 * The reply to query q, in out: its length, or -1 for no reply.  A UDP reply longer than
 * 512 bytes is cut to its header and question with TC set, as servers do.
 */
static int build_reply(struct dns_server *srv, const uint8_t *q, size_t qlen, bool tcp,
		       uint8_t *out, size_t outmax)
{
	char name[256];
	size_t off = 12, nl = 0;
	unsigned qtype, ancount = 0, rcode = 0;
	struct wbuf w = { out, 0, outmax, false };
	enum special sp;

	if (qlen < 12 || q[4] != 0 || q[5] != 1)
		return -1;
	while (off < qlen && q[off] != 0) {
		size_t l = q[off];
		if (l > 63 || off + 1 + l >= qlen || nl + l + 1 >= sizeof(name))
			return -1;
		if (nl)
			name[nl++] = '.';
		memcpy(name + nl, q + off + 1, l);
		nl += l;
		off += 1 + l;
	}
	name[nl] = '\0';
	if (off + 5 > qlen)
		return -1;
	qtype = (unsigned)q[off + 1] << 8 | q[off + 2];
	off += 5; /* the root label, type, class */

	reply_name = name;
	srv->queries++;
	if (tcp)
		srv->tcp_queries++;
	if (qtype == DNS_MX)
		srv->mx_queries++;
	if (many_index(name) >= 0 && (qtype == DNS_A || qtype == DNS_AAAA))
		srv->many_addr_queries++;
	if (strcasecmp(name, "nomx.test") == 0 && qtype == DNS_A && !srv->mx_before_nomx_a)
		srv->mx_before_nomx_a = srv->mx_queries + 1; /* + 1: 0 is "not seen" */

	sp = special_of(name);
	if (sp == SP_DROP)
		return -1;
	if (sp == SP_JUNK) {
		memcpy(out, "\x01\x02\x03\x04\x05", 5);
		return 5;
	}
	put(&w, q, off); /* header and question, as asked */
	out[2] = (uint8_t)(0x80 | (q[2] & 0x79)); /* QR, the opcode, RD */
	if (sp == SP_GARBAGE) {
		out[3] = 0x80;
		out[6] = 0;
		out[7] = 1; /* one answer, which is not there */
		memset(out + 8, 0, 4);
		return (int)w.len;
	}
	if (sp == SP_SERVFAIL) {
		rcode = 2;
	} else if (strcasecmp(name, "many.test") == 0 && qtype == DNS_MX) {
		for (int i = 0; i < MANY; i++) {
			char ex[64];
			snprintf(ex, sizeof(ex), "m%d.many.test", i);
			put_rr(&w, DNS_MX, (uint16_t)((i * 37) % MANY), ex);
			ancount++;
		}
	} else if (many_index(name) >= 0 && qtype == DNS_A) {
		char a[32];
		snprintf(a, sizeof(a), "203.0.113.%d", many_index(name) + 1);
		put_rr(&w, DNS_A, 0, a);
		ancount++;
	} else {
		for (size_t i = 0; i < sizeof(zone) / sizeof(zone[0]); i++) {
			if (strcasecmp(zone[i].owner, name) != 0 || zone[i].type != DNS_CNAME)
				continue;
			put_rr(&w, DNS_CNAME, 0, zone[i].data);
			ancount++;
			for (size_t j = 0; j < sizeof(zone) / sizeof(zone[0]); j++)
				if (strcasecmp(zone[j].owner, zone[i].data) == 0 &&
				    zone[j].type == qtype) {
					put_rr_owner(&w, zone[j].owner, zone[j].type, zone[j].pref,
						     zone[j].data);
					ancount++;
				}
		}
		for (size_t i = 0; i < sizeof(zone) / sizeof(zone[0]); i++)
			if (strcasecmp(zone[i].owner, name) == 0 && zone[i].type == qtype) {
				put_rr(&w, zone[i].type, zone[i].pref, zone[i].data);
				ancount++;
			}
		if (ancount == 0 && !name_exists(name))
			rcode = 3; /* NXDOMAIN */
	}
	assert_false(w.overflow);
	out[3] = (uint8_t)(0x80 | rcode); /* RA */
	if ((q[3] & 0x20) && rcode != 2 && nl >= 11 &&
	    strcasecmp(name + nl - 11, "signed.test") == 0)
		out[3] |= 0x20; /* AD, asked for and "validated" */
	out[6] = (uint8_t)(ancount >> 8);
	out[7] = (uint8_t)ancount;
	memset(out + 8, 0, 4); /* no authority, no additional (a query's OPT is dropped) */
	if (!tcp && w.len > 512) {
		out[2] |= 0x02; /* TC */
		out[6] = out[7] = 0;
		return (int)off;
	}
	return (int)w.len;
}

static void dns_reply_udp(struct dns_server *srv, const uint8_t *q, size_t n,
			  const struct sockaddr_storage *from, socklen_t fromlen)
{
	uint8_t out[4096];
	int len = build_reply(srv, q, n, false, out, sizeof(out));

	if (len >= 0)
		(void)sendto(srv->udp, out, (size_t)len, 0, (const struct sockaddr *)from, fromlen);
}

static void dns_on_udp(evutil_socket_t fd, short what, void *arg)
{
	struct dns_server *srv = arg;
	uint8_t q[2048];
	struct sockaddr_storage from;
	socklen_t fromlen = sizeof(from);
	ssize_t n = recvfrom(fd, q, sizeof(q), 0, (struct sockaddr *)&from, &fromlen);

	if (n <= 0)
		return;
	if (srv->hold && srv->nheld < sizeof(srv->held) / sizeof(srv->held[0]) &&
	    (size_t)n <= sizeof(srv->held[0].q)) {
		srv->held[srv->nheld].from = from;
		srv->held[srv->nheld].fromlen = fromlen;
		srv->held[srv->nheld].len = (size_t)n;
		memcpy(srv->held[srv->nheld].q, q, (size_t)n);
		srv->nheld++;
		return;
	}
	dns_reply_udp(srv, q, (size_t)n, &from, fromlen);
}

/* Answer every held query at once, so that their replies arrive together. */
static void dns_release(struct dns_server *srv)
{
	srv->hold = false;
	for (size_t i = 0; i < srv->nheld; i++)
		dns_reply_udp(srv, srv->held[i].q, srv->held[i].len, &srv->held[i].from,
			      srv->held[i].fromlen);
	srv->nheld = 0;
}

static void dns_conn_close(struct dns_conn *c)
{
	struct dns_server *srv = c->srv;

	for (struct dns_conn **pp = &srv->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	event_free(c->ev);
	close(c->fd);
	free(c);
}

static void dns_on_conn(evutil_socket_t fd, short what, void *arg)
{
	struct dns_conn *c = arg;
	ssize_t n = read(fd, c->buf + c->len, sizeof(c->buf) - c->len);

	if (n <= 0) {
		dns_conn_close(c);
		return;
	}
	c->len += (size_t)n;
	while (c->len >= 2) {
		size_t ql = (size_t)c->buf[0] << 8 | c->buf[1];
		uint8_t out[8192];
		int len;

		if (c->len < 2 + ql)
			break;
		len = build_reply(c->srv, c->buf + 2, ql, true, out + 2, sizeof(out) - 2);
		if (len >= 0) {
			size_t total = (size_t)len + 2, sent = 0;
			out[0] = (uint8_t)(len >> 8);
			out[1] = (uint8_t)len;
			while (sent < total) {
				ssize_t w = send(fd, out + sent, total - sent, MSG_NOSIGNAL);
				if (w <= 0)
					break;
				sent += (size_t)w;
			}
		}
		memmove(c->buf, c->buf + 2 + ql, c->len - 2 - ql);
		c->len -= 2 + ql;
	}
}

static void dns_on_accept(evutil_socket_t fd, short what, void *arg)
{
	struct dns_server *srv = arg;
	int cfd = accept(fd, NULL, NULL);
	struct dns_conn *c;

	if (cfd < 0)
		return;
	c = calloc(1, sizeof(*c));
	assert_non_null(c);
	c->srv = srv;
	c->fd = cfd;
	c->ev = event_new(srv->base, cfd, EV_READ | EV_PERSIST, dns_on_conn, c);
	assert_non_null(c->ev);
	assert_int_equal(event_add(c->ev, NULL), 0);
	c->next = srv->conns;
	srv->conns = c;
}

/* UDP and TCP on one port of 127.0.0.1, as c-ares expects of one server. */
static void dns_start(struct dns_server *srv, struct event_base *base)
{
	memset(srv, 0, sizeof(*srv));
	srv->base = base;
	for (int attempt = 0; attempt < 50; attempt++) {
		struct sockaddr_in sin = { .sin_family = AF_INET };
		socklen_t sl = sizeof(sin);
		int one = 1;

		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		srv->udp = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		srv->tcp = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		assert_true(srv->udp >= 0 && srv->tcp >= 0);
		assert_int_equal(bind(srv->udp, (struct sockaddr *)&sin, sizeof(sin)), 0);
		assert_int_equal(getsockname(srv->udp, (struct sockaddr *)&sin, &sl), 0);
		(void)setsockopt(srv->tcp, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(srv->tcp, (struct sockaddr *)&sin, sizeof(sin)) == 0 &&
		    listen(srv->tcp, 16) == 0) {
			srv->port = ntohs(sin.sin_port);
			break;
		}
		close(srv->udp);
		close(srv->tcp);
		srv->udp = srv->tcp = -1;
	}
	assert_true(srv->port != 0);
	/* room for every query test_request_cap asks at once (the resolver sends them all
	 * before this loop reads one): the default buffer holds about 256 datagrams */
	int rcvbuf = 8 << 20;
	if (setsockopt(srv->udp, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)) < 0)
		(void)setsockopt(srv->udp, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	srv->udp_ev = event_new(base, srv->udp, EV_READ | EV_PERSIST, dns_on_udp, srv);
	srv->tcp_ev = event_new(base, srv->tcp, EV_READ | EV_PERSIST, dns_on_accept, srv);
	assert_non_null(srv->udp_ev);
	assert_non_null(srv->tcp_ev);
	assert_int_equal(event_add(srv->udp_ev, NULL), 0);
	assert_int_equal(event_add(srv->tcp_ev, NULL), 0);
}

static void dns_stop(struct dns_server *srv)
{
	while (srv->conns)
		dns_conn_close(srv->conns);
	event_free(srv->udp_ev);
	event_free(srv->tcp_ev);
	close(srv->udp);
	close(srv->tcp);
}

/* ---- the resolver under test ---- */

struct env {
	struct event_base *base;
	struct dns_server dns;
	struct mx_resolver *r;
};

static void env_open(struct env *e)
{
	char servers[64], err[256];

	e->base = event_base_new();
	assert_non_null(e->base);
	dns_start(&e->dns, e->base);
	snprintf(servers, sizeof(servers), "127.0.0.1:%u", (unsigned)e->dns.port);
	e->r = mx_resolver_new(e->base, servers, err, sizeof(err));
	assert_non_null(e->r);
	/* answers are immediate; no test waits on the 3 s default */
	assert_int_equal(mx_resolver_set_timeout(e->r, 300, 2), 0);
}

static void env_close(struct env *e)
{
	e->r = mx_resolver_free(e->r);
	dns_stop(&e->dns);
	event_base_free(e->base);
}

struct res {
	int calls;
	int error;
	size_t n;
	bool during_lookup; /* done() ran inside mx_lookup() */
	struct mx_target t[MX_MAX_TARGETS];
	/* actions from inside done() */
	struct mx_resolver **free_me;
	struct mx_query **cancel_me;
	struct mx_query *self;
	struct env *lookup_env;
	struct res *lookup_res;
};

static bool in_lookup;

static void on_done(void *arg, int error, const struct mx_target *t, size_t n)
{
	struct res *x = arg;

	x->calls++;
	x->error = error;
	x->n = n;
	x->during_lookup = in_lookup;
	assert_true(n <= MX_MAX_TARGETS);
	if (error == 0) {
		assert_true(n >= 1);
		memcpy(x->t, t, n * sizeof(*t));
	} else {
		assert_int_equal(n, 0);
	}
	if (x->self)
		mx_cancel(x->self); /* on itself, inside done(): a no-op */
	if (x->cancel_me) {
		mx_cancel(*x->cancel_me);
		*x->cancel_me = NULL;
	}
	if (x->free_me)
		*x->free_me = mx_resolver_free(*x->free_me);
	if (x->lookup_env)
		assert_int_equal(mx_lookup(x->lookup_env->r, "nomx.test", true, 25, on_done,
					   x->lookup_res, NULL), 0);
}

static int lookup(struct env *e, const char *name, bool use_mx, uint16_t port, struct res *x,
		  struct mx_query **ret)
{
	int rc;

	in_lookup = true;
	rc = mx_lookup(e->r, name, use_mx, port, on_done, x, ret);
	in_lookup = false;
	return rc;
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	*(bool *)arg = true;
}

/* Run the loop until *calls reaches want, or ms passed. */
static void run_until(struct env *e, const int *calls, int want, unsigned ms)
{
	bool expired = false;
	struct timeval tv = timeval_from_ms(ms);
	struct event *guard = evtimer_new(e->base, on_guard, &expired);

	assert_non_null(guard);
	evtimer_add(guard, &tv);
	while (!expired && (!calls || *calls < want))
		event_base_loop(e->base, EVLOOP_ONCE);
	event_free(guard);
}

static void run_for(struct env *e, unsigned ms)
{
	run_until(e, NULL, 0, ms);
}

static void resolve(struct env *e, const char *name, bool use_mx, struct res *x)
{
	struct mx_query *q = NULL;

	memset(x, 0, sizeof(*x));
	assert_int_equal(lookup(e, name, use_mx, 25, x, &q), 0);
	assert_non_null(q);
	assert_int_equal(x->calls, 0); /* never inside mx_lookup() for a name */
	run_until(e, &x->calls, 1, 5000);
	assert_int_equal(x->calls, 1);
	assert_false(x->during_lookup);
}

static const char *addr_text(const struct mx_target *t, char *buf, size_t len)
{
	const void *a;
	uint16_t port;

	if (t->addr.ss_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)&t->addr;
		assert_int_equal(t->addrlen, sizeof(*sin));
		a = &sin->sin_addr;
		port = ntohs(sin->sin_port);
	} else {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)&t->addr;
		assert_int_equal(t->addr.ss_family, AF_INET6);
		assert_int_equal(t->addrlen, sizeof(*sin6));
		a = &sin6->sin6_addr;
		port = ntohs(sin6->sin6_port);
	}
	assert_non_null(inet_ntop(t->addr.ss_family, a, buf, (socklen_t)len));
	(void)port;
	return buf;
}

static uint16_t target_port(const struct mx_target *t)
{
	if (t->addr.ss_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)&t->addr)->sin_port);
	return ntohs(((const struct sockaddr_in6 *)&t->addr)->sin6_port);
}

static void check_target(const struct mx_target *t, const char *host, unsigned pref,
			 const char *addr, uint16_t port)
{
	char buf[INET6_ADDRSTRLEN];

	assert_string_equal(t->host, host);
	assert_int_equal(t->preference, pref);
	assert_string_equal(addr_text(t, buf, sizeof(buf)), addr);
	assert_int_equal(target_port(t), port);
}

/* ---- tests ---- */

static void test_mx_order(void **state)
{
	struct env e;
	struct res x;

	env_open(&e);
	resolve(&e, "mx.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 4);
	/* preference 10 first, IPv4 then IPv6 */
	check_target(&x.t[0], "mx-a.mx.test", 10, "192.0.2.1", 25);
	check_target(&x.t[1], "mx-a.mx.test", 10, "2001:db8::1", 25);
	/* then the two preference-20 hosts, in either order */
	if (strcmp(x.t[2].host, "mx-b.mx.test") == 0) {
		check_target(&x.t[2], "mx-b.mx.test", 20, "192.0.2.2", 25);
		check_target(&x.t[3], "mx-c.mx.test", 20, "192.0.2.3", 25);
	} else {
		check_target(&x.t[2], "mx-c.mx.test", 20, "192.0.2.3", 25);
		check_target(&x.t[3], "mx-b.mx.test", 20, "192.0.2.2", 25);
	}
	/* a final dot is allowed, and the name is given back without it */
	resolve(&e, "nomx.test.", true, &x);
	assert_int_equal(x.error, 0);
	check_target(&x.t[0], "nomx.test", 0, "198.51.100.7", 25);
	env_close(&e);
}

/* Equal preferences are shuffled: over 24 lookups both orders of b and c show up. */
static void test_mx_shuffle(void **state)
{
	enum { N = 24 };
	struct env e;
	struct res x[N];
	int b_first = 0, c_first = 0, total = 0;

	env_open(&e);
	memset(x, 0, sizeof(x));
	for (int i = 0; i < N; i++)
		assert_int_equal(lookup(&e, "mx.test", true, 25, &x[i], NULL), 0);
	for (int i = 0; i < N; i++) {
		run_until(&e, &x[i].calls, 1, 5000);
		total += x[i].calls;
		assert_int_equal(x[i].error, 0);
		assert_int_equal(x[i].n, 4);
		assert_string_equal(x[i].t[0].host, "mx-a.mx.test");
		if (strcmp(x[i].t[2].host, "mx-b.mx.test") == 0)
			b_first++;
		else
			c_first++;
	}
	assert_int_equal(total, N);
	assert_true(b_first > 0 && c_first > 0); /* fails with probability 2^-23 */
	env_close(&e);
}

/* The MX answer's AD bit and the least TTL of the records the targets came from. */
static void test_secure_and_ttl(void **state)
{
	struct env e;
	struct res x;

	env_open(&e);
	resolve(&e, "signed.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 1);
	check_target(&x.t[0], "short.signed.test", 10, "192.0.2.61", 25);
	assert_true(x.t[0].secure);
	assert_int_equal(x.t[0].ttl, 7); /* the A record's, below the MX's 300 */
	resolve(&e, "mx.test", true, &x);
	assert_int_equal(x.error, 0);
	for (size_t i = 0; i < x.n; i++) {
		assert_false(x.t[i].secure);
		assert_int_equal(x.t[i].ttl, 300);
	}
	/* an IP literal has no TTL: the configured ceiling applies */
	memset(&x, 0, sizeof(x));
	assert_int_equal(lookup(&e, "192.0.2.9", true, 25, &x, NULL), 0);
	assert_int_equal(x.calls, 1);
	assert_int_equal(x.t[0].ttl, UINT32_MAX);
	assert_false(x.t[0].secure);
	env_close(&e);
}

struct tlsa_res {
	int calls, error;
	bool secure;
	uint32_t ttl;
	size_t n;
	uint8_t usage[4];
	size_t len[4];
};

static void on_tlsa(void *arg, int error, const struct mx_tlsa_answer *a)
{
	struct tlsa_res *x = arg;

	x->calls++;
	x->error = error;
	x->secure = a->secure;
	x->ttl = a->ttl;
	x->n = a->n;
	for (size_t i = 0; i < a->n && i < 4; i++) {
		x->usage[i] = a->recs[i].usage;
		x->len[i] = a->recs[i].len;
	}
}

static void tlsa(struct env *e, const char *host, struct tlsa_res *x)
{
	struct mx_query *q = NULL;

	memset(x, 0, sizeof(*x));
	assert_int_equal(mx_tlsa_lookup(e->r, host, 25, on_tlsa, x, &q), 0);
	assert_non_null(q);
	assert_int_equal(x->calls, 0);
	run_until(e, &x->calls, 1, 15000);
	assert_int_equal(x->calls, 1);
}

static void test_tlsa(void **state)
{
	struct env e;
	struct tlsa_res x;

	env_open(&e);
	tlsa(&e, "short.signed.test", &x);
	assert_int_equal(x.error, 0);
	assert_true(x.secure);
	assert_int_equal(x.n, 2);
	assert_int_equal(x.usage[0] + x.usage[1], 3); /* 3 and 0, in either order */
	assert_int_equal(x.len[0], 32);
	assert_int_equal(x.ttl, 300);
	/* no such name, no validation: -ENOENT, not secure */
	tlsa(&e, "mx-a.mx.test", &x);
	assert_int_equal(x.error, -ENOENT);
	assert_false(x.secure);
	/* SERVFAIL (bogus) and silence: -EAGAIN, never "no records" */
	tlsa(&e, "bogus.signed.test", &x);
	assert_int_equal(x.error, -EAGAIN);
	assert_int_equal(mx_resolver_set_timeout(e.r, 200, 1), 0);
	tlsa(&e, "timeout.signed.test", &x);
	assert_int_equal(x.error, -EAGAIN);
	/* a name DNS cannot hold */
	assert_int_equal(mx_tlsa_lookup(e.r, "bad*host.test", 25, on_tlsa, &x, NULL), -EINVAL);
	assert_int_equal(mx_tlsa_lookup(e.r, "a.test", 0, on_tlsa, &x, NULL), -EINVAL);
	env_close(&e);
}

static void test_no_mx_fallback(void **state)
{
	struct env e;
	struct res x;

	env_open(&e);
	resolve(&e, "nomx.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 1); /* AAAA is NODATA */
	check_target(&x.t[0], "nomx.test", 0, "198.51.100.7", 25);
	env_close(&e);
}

static void test_verdicts(void **state)
{
	static const struct {
		const char *name;
		bool use_mx;
		int error;
	} cases[] = {
		{ "nx.test", true, -ENOENT },        /* NXDOMAIN */
		{ "nx.test", false, -ENOENT },
		{ "nullmx.test", true, -ENODATA },   /* RFC 7505, even with an A record */
		{ "servfail.test", true, -EAGAIN },
		{ "garbage.test", true, -EAGAIN },   /* an answer that is not there */
		{ "allperm.test", true, -ENOENT },   /* hosts: NXDOMAIN, NODATA */
		{ "sometemp.test", true, -EAGAIN },  /* hosts: NXDOMAIN, SERVFAIL */
		{ "badmx.test", true, -ENOENT },     /* an address and a bad name as exchanges */
		{ "zero.test", false, -ENOENT },     /* 0.0.0.0 and :: are no address */
		{ "mx.test", false, -ENOENT },       /* MX records, but no address of its own */
		{ "nodata.test", false, -ENOENT },
	};
	struct env e;
	struct res x;

	env_open(&e);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		resolve(&e, cases[i].name, cases[i].use_mx, &x);
		if (x.error != cases[i].error)
			fail_msg("%s: %d, want %d", cases[i].name, x.error, cases[i].error);
	}
	env_close(&e);
}

static void test_partial_hosts(void **state)
{
	struct env e;
	struct res x;

	env_open(&e);
	/* the preference-10 host fails (SERVFAIL): the preference-20 one is what is left */
	resolve(&e, "partial.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 1);
	check_target(&x.t[0], "mx-b.mx.test", 20, "192.0.2.2", 25);
	/* the same host twice (names differ in case) and another name for its address: one
	 * target, under the lowest preference */
	resolve(&e, "dup.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 1);
	check_target(&x.t[0], "mx-b.mx.test", 10, "192.0.2.2", 25);
	/* a bad exchange is skipped, the good one used */
	resolve(&e, "badmix.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 1);
	check_target(&x.t[0], "mx-c.mx.test", 20, "192.0.2.3", 25);
	env_close(&e);
}

static void test_addresses(void **state)
{
	struct env e;
	struct res x;
	char buf[INET6_ADDRSTRLEN];
	bool seen_first[3] = { false, false, false };

	env_open(&e);
	/* several addresses: IPv4 first, each family shuffled, a repeated address once */
	for (int round = 0; round < 16; round++) {
		resolve(&e, "multi.test", false, &x);
		assert_int_equal(x.error, 0);
		assert_int_equal(x.n, 5);
		for (size_t i = 0; i < 5; i++) {
			const char *a = addr_text(&x.t[i], buf, sizeof(buf));
			if (i < 3)
				assert_true(strncmp(a, "192.0.2.1", 9) == 0 && strlen(a) == 10);
			else
				assert_true(strncmp(a, "2001:db8::1", 11) == 0 && strlen(a) == 12);
			for (size_t j = 0; j < i; j++)
				assert_false(x.t[j].addr.ss_family == x.t[i].addr.ss_family &&
					     memcmp(&x.t[j].addr, &x.t[i].addr, x.t[i].addrlen) == 0);
		}
		seen_first[addr_text(&x.t[0], buf, sizeof(buf))[9] - '0'] = true;
	}
	assert_true(seen_first[0] + seen_first[1] + seen_first[2] >= 2); /* p(fail) = 3^-15 */
	/* an IPv6 address of a second MX host already listed under the first: once */
	resolve(&e, "dup6.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 3);
	check_target(&x.t[0], "mx-a.mx.test", 10, "192.0.2.1", 25);
	check_target(&x.t[1], "mx-a.mx.test", 10, "2001:db8::1", 25);
	check_target(&x.t[2], "a6.test", 20, "2001:db8::6", 25);
	/* an MX answer with only a CNAME: no MX, so the name's own (CNAME'd) address */
	resolve(&e, "cname.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 1);
	check_target(&x.t[0], "cname.test", 0, "198.51.100.7", 25);
	env_close(&e);
}

static void test_timeout(void **state)
{
	struct env e;
	struct res x;
	uint64_t t0;

	env_open(&e);
	assert_int_equal(mx_resolver_set_timeout(e.r, 100, 2), 0);
	t0 = now_ms();
	resolve(&e, "timeout.test", true, &x); /* no reply at all */
	assert_int_equal(x.error, -EAGAIN);
	assert_true(now_ms() - t0 < 3000);
	resolve(&e, "junk.test", true, &x); /* replies c-ares cannot use: as no reply */
	assert_int_equal(x.error, -EAGAIN);
	env_close(&e);
}

static void test_smarthost(void **state)
{
	struct env e;
	struct res x;
	unsigned mx_before;

	env_open(&e);
	mx_before = e.dns.mx_queries;
	memset(&x, 0, sizeof(x));
	assert_int_equal(lookup(&e, "relay.test", false, 587, &x, NULL), 0);
	run_until(&e, &x.calls, 1, 5000);
	assert_int_equal(x.calls, 1);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 2);
	check_target(&x.t[0], "relay.test", 0, "192.0.2.50", 587);
	check_target(&x.t[1], "relay.test", 0, "2001:db8::50", 587);
	/* "[name]": no MX lookup even with use_mx */
	resolve(&e, "[relay.test]", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 2);
	check_target(&x.t[0], "relay.test", 0, "192.0.2.50", 25);
	assert_int_equal(e.dns.mx_queries, mx_before);
	/* "localhost" never reaches a DNS server (RFC 6761), but is still answered through
	 * the loop */
	unsigned before = e.dns.queries;
	resolve(&e, "localhost", false, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, 2);
	check_target(&x.t[0], "localhost", 0, "127.0.0.1", 25);
	check_target(&x.t[1], "localhost", 0, "::1", 25);
	assert_int_equal(e.dns.queries, before);
	env_close(&e);
}

static void test_literals(void **state)
{
	static const struct {
		const char *in;
		const char *addr;
	} cases[] = {
		{ "192.0.2.9", "192.0.2.9" },
		{ "[192.0.2.1]", "192.0.2.1" },
		{ "2001:db8::25", "2001:db8::25" },
		{ "[2001:db8::26]", "2001:db8::26" },
		{ "[IPv6:2001:db8::1]", "2001:db8::1" },
		{ "::1", "::1" },
		{ "::ffff:192.0.2.5", "192.0.2.5" },
	};
	struct env e;

	env_open(&e);
	unsigned before = e.dns.queries;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		for (int use_mx = 0; use_mx < 2; use_mx++) {
			struct res x;
			struct mx_query *q = (struct mx_query *)&x; /* must become NULL */
			memset(&x, 0, sizeof(x));
			assert_int_equal(lookup(&e, cases[i].in, use_mx, 2525, &x, &q), 0);
			assert_null(q);
			assert_int_equal(x.calls, 1);
			assert_true(x.during_lookup);
			assert_int_equal(x.error, 0);
			assert_int_equal(x.n, 1);
			check_target(&x.t[0], cases[i].addr, 0, cases[i].addr, 2525);
		}
	}
	assert_int_equal(e.dns.queries, before);
	env_close(&e);
}

static void test_invalid_names(void **state)
{
	char label64[80], long254[300], long253[300], huge[3000];
	const char *bad[] = { "", ".", "..", "a..b", ".a", "exa mple.test", "ex\\ample.test",
			      "ex*ample.test", "[]", "[192.0.2.1", "\xc3\xbcnicode.test",
			      "a.b\n", label64, long254, huge, "[a..b]" };
	struct env e;
	struct res x;
	struct mx_query *q;

	memset(label64, 'a', 64);
	memcpy(label64 + 64, ".test", sizeof(".test"));
	for (size_t i = 0; i < 254; i++)
		long254[i] = (i % 50 == 49) ? '.' : 'b';
	long254[254] = '\0';
	memcpy(long253, long254, 253);
	long253[253] = '\0';
	memset(huge, 'c', sizeof(huge) - 1);
	huge[sizeof(huge) - 1] = '\0';

	env_open(&e);
	memset(&x, 0, sizeof(x));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		q = (struct mx_query *)&x; /* untouched on failure */
		if (lookup(&e, bad[i], true, 25, &x, &q) != -EINVAL)
			fail_msg("accepted \"%s\"", bad[i]);
		assert_ptr_equal(q, (struct mx_query *)&x);
	}
	assert_int_equal(mx_lookup(e.r, NULL, true, 25, on_done, &x, NULL), -EINVAL);
	assert_int_equal(mx_lookup(e.r, "mx.test", true, 25, NULL, &x, NULL), -EINVAL);
	assert_int_equal(mx_lookup(NULL, "mx.test", true, 25, on_done, &x, NULL), -EINVAL);
	/* the longest label and name are fine (and do not exist) */
	resolve(&e, label64 + 1, true, &x); /* 63 times 'a', ".test" */
	assert_int_equal(x.error, -ENOENT);
	resolve(&e, long253, true, &x);
	assert_int_equal(x.error, -ENOENT);
	run_for(&e, 50);
	assert_int_equal(x.calls, 1);
	env_close(&e);
}

static void test_many(void **state)
{
	struct env e;
	struct res x;

	env_open(&e);
	resolve(&e, "many.test", true, &x);
	assert_int_equal(x.error, 0);
	assert_int_equal(x.n, MX_MAX_TARGETS);
	for (size_t j = 0; j < x.n; j++) {
		int i = many_index(x.t[j].host);
		char want[32], buf[INET6_ADDRSTRLEN];
		assert_true(i >= 0);
		assert_int_equal(x.t[j].preference, j); /* preferences 0..49, the lowest kept */
		assert_int_equal((i * 37) % MANY, (int)j);
		snprintf(want, sizeof(want), "203.0.113.%d", i + 1);
		assert_string_equal(addr_text(&x.t[j], buf, sizeof(buf)), want);
	}
	assert_true(e.dns.tcp_queries >= 1); /* the UDP answer was truncated */
	/* only the hosts that can make a target are resolved: A and AAAA of 32 */
	assert_int_equal(e.dns.many_addr_queries, 2 * MX_MAX_TARGETS);
	env_close(&e);
}

static void test_cancel(void **state)
{
	struct env e;
	struct res x, y, z;
	struct mx_query *q = NULL, *q2 = NULL;

	env_open(&e);
	assert_int_equal(mx_resolver_set_timeout(e.r, 100, 1), 0);
	memset(&x, 0, sizeof(x));
	memset(&y, 0, sizeof(y));
	/* a query waiting for DNS */
	assert_int_equal(lookup(&e, "timeout.test", true, 25, &x, &q), 0);
	assert_non_null(q);
	mx_cancel(q);
	/* one whose answers will come */
	assert_int_equal(lookup(&e, "mx.test", true, 25, &y, &q2), 0);
	mx_cancel(q2);
	/* one that is answered at once, without DNS: finished, not yet delivered */
	assert_int_equal(lookup(&e, "localhost", false, 25, &x, &q), 0);
	mx_cancel(q);
	mx_cancel(NULL);
	/* a query that cancels itself inside done(): a no-op */
	memset(&z, 0, sizeof(z));
	assert_int_equal(lookup(&e, "nomx.test", true, 25, &z, &z.self), 0);
	run_for(&e, 500);
	assert_int_equal(x.calls, 0);
	assert_int_equal(y.calls, 0);
	assert_int_equal(z.calls, 1);
	assert_int_equal(z.error, 0);
	/* set_timeout is refused while a lookup runs, fine once only cancelled ones remain */
	memset(&x, 0, sizeof(x));
	assert_int_equal(lookup(&e, "timeout.test", true, 25, &x, &q), 0);
	assert_int_equal(mx_resolver_set_timeout(e.r, 100, 1), -EBUSY);
	mx_cancel(q);
	assert_int_equal(mx_resolver_set_timeout(e.r, 200, 1), 0);
	run_for(&e, 300);
	assert_int_equal(x.calls, 0);
	env_close(&e);
}

/* Two answers arrive together: the first done() cancels the second, finished, query. */
static void test_cancel_ready(void **state)
{
	struct env e;
	struct res x, y;
	struct mx_query *qy = NULL;

	env_open(&e);
	memset(&x, 0, sizeof(x));
	memset(&y, 0, sizeof(y));
	e.dns.hold = true;
	assert_int_equal(lookup(&e, "relay.test", false, 25, &x, NULL), 0);
	assert_int_equal(lookup(&e, "nomx.test", false, 25, &y, &qy), 0);
	x.cancel_me = &qy;
	while (e.dns.nheld < 4)
		event_base_loop(e.base, EVLOOP_ONCE);
	dns_release(&e.dns);
	run_until(&e, &x.calls, 1, 5000);
	assert_int_equal(x.calls, 1);
	assert_int_equal(x.error, 0);
	assert_null(qy);
	run_for(&e, 100);
	assert_int_equal(y.calls, 0);
	env_close(&e);
}

static void test_free_pending(void **state)
{
	struct env e;
	struct res x[4];
	const char *names[] = { "timeout.test", "mx.test", "nomx.test", "localhost" };

	env_open(&e);
	memset(x, 0, sizeof(x));
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(lookup(&e, names[i], i < 3, 25, &x[i], NULL), 0);
	/* "localhost" is answered at once, without DNS: finished, not yet delivered */
	e.r = mx_resolver_free(e.r);
	assert_null(e.r);
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(x[i].calls, 1);
		assert_int_equal(x[i].error, -ECANCELED);
		assert_false(x[i].during_lookup);
	}
	run_for(&e, 400);
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(x[i].calls, 1);
	env_close(&e);
}

/* done() frees the resolver: the other pending lookup ends with -ECANCELED. */
static void test_free_in_done(void **state)
{
	struct env e;
	struct res x, y;

	env_open(&e);
	memset(&x, 0, sizeof(x));
	memset(&y, 0, sizeof(y));
	assert_int_equal(lookup(&e, "timeout.test", true, 25, &y, NULL), 0);
	assert_int_equal(lookup(&e, "mx.test", true, 25, &x, NULL), 0);
	x.free_me = &e.r;
	run_until(&e, &x.calls, 1, 5000);
	assert_int_equal(x.calls, 1);
	assert_int_equal(x.error, 0);
	assert_null(e.r);
	assert_int_equal(y.calls, 1);
	assert_int_equal(y.error, -ECANCELED);
	run_for(&e, 400);
	assert_int_equal(y.calls, 1);
	env_close(&e);
}

/* A done() that frees the resolver while it is cancelling (and one that looks up then). */
static void test_free_in_cancel(void **state)
{
	struct env e;
	struct res x, y;

	env_open(&e);
	memset(&x, 0, sizeof(x));
	memset(&y, 0, sizeof(y));
	assert_int_equal(lookup(&e, "timeout.test", true, 25, &x, NULL), 0);
	assert_int_equal(lookup(&e, "timeout.test", true, 25, &y, NULL), 0);
	x.free_me = &e.r; /* e.r is being freed: a no-op */
	struct mx_resolver *r = e.r;
	e.r = mx_resolver_free(r);
	assert_int_equal(x.calls, 1);
	assert_int_equal(y.calls, 1);
	assert_int_equal(x.error, -ECANCELED);
	env_close(&e);
}

static void test_lookup_in_done(void **state)
{
	struct env e;
	struct res x, y;

	env_open(&e);
	memset(&x, 0, sizeof(x));
	memset(&y, 0, sizeof(y));
	x.lookup_env = &e;
	x.lookup_res = &y;
	assert_int_equal(lookup(&e, "mx.test", true, 25, &x, NULL), 0);
	run_until(&e, &y.calls, 1, 5000);
	assert_int_equal(x.calls, 1);
	assert_int_equal(y.calls, 1);
	assert_int_equal(y.error, 0);
	check_target(&y.t[0], "nomx.test", 0, "198.51.100.7", 25);
	env_close(&e);
}

/* Past MX_MAX_REQUESTS requests the other lookups wait their turn, an address lookup
 * before the MX lookups that waited longer, and all are answered; a waiting one can be
 * cancelled, and freeing the resolver ends the waiting ones with -ECANCELED. */
static void test_request_cap(void **state)
{
	enum { N = MX_MAX_REQUESTS + 40 };
	static struct res x[N];
	struct mx_query *q[N];
	struct res y;
	struct env e;

	env_open(&e);
	/* the test server must hold every query at once (dns_start(): SO_RCVBUFFORCE needs
	 * root; the kernel doubles the value and counts about 1 KiB per small datagram) */
	int rcvbuf = 0;
	socklen_t rl = sizeof(rcvbuf);
	if (getsockopt(e.dns.udp, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &rl) < 0 || rcvbuf < N * 1280) {
		env_close(&e);
		skip();
	}
	/* long enough that no lookup times out while the N are being asked, even under a
	 * sanitizer on a loaded machine */
	assert_int_equal(mx_resolver_set_timeout(e.r, 1000, 1), 0);
	memset(x, 0, sizeof(x));
	memset(&y, 0, sizeof(y));
	for (size_t i = 0; i < N; i++)
		assert_int_equal(lookup(&e, "timeout.test", true, 25, &x[i], &q[i]), 0);
	assert_int_equal(lookup(&e, "nomx.test", false, 25, &y, NULL), 0);
	mx_cancel(q[N - 1]); /* waiting: never asked, never answered */
	run_for(&e, 100);
	assert_int_equal(e.dns.mx_queries, MX_MAX_REQUESTS);
	assert_int_equal(y.calls, 0); /* it waits too */
	int done = 0;
	for (int k = 0; k < 200 && (done < N - 1 || y.calls == 0); k++) {
		run_for(&e, 20);
		done = 0;
		for (size_t i = 0; i < N - 1; i++)
			done += x[i].calls;
	}
	assert_int_equal(done, N - 1);
	for (size_t i = 0; i < N - 1; i++) {
		assert_int_equal(x[i].calls, 1);
		assert_int_equal(x[i].error, -EAGAIN);
	}
	assert_int_equal(x[N - 1].calls, 0);
	assert_int_equal(e.dns.mx_queries, N - 1);
	/* the address lookup went out before any of the MX lookups that waited */
	assert_int_equal(y.calls, 1);
	assert_int_equal(y.error, 0);
	assert_int_equal(e.dns.mx_before_nomx_a, MX_MAX_REQUESTS + 1);

	/* the resolver freed with lookups waiting */
	memset(x, 0, sizeof(x));
	for (size_t i = 0; i < N; i++)
		assert_int_equal(lookup(&e, "timeout.test", true, 25, &x[i], NULL), 0);
	e.r = mx_resolver_free(e.r);
	for (size_t i = 0; i < N; i++) {
		assert_int_equal(x[i].calls, 1);
		assert_int_equal(x[i].error, -ECANCELED);
	}
	env_close(&e);
}

/* MX answers that come while MX_MAX_REQUESTS are out: their hosts' lookups wait, ahead of
 * the MX lookups that wait, and both queries are answered before the others time out
 * (a path the cap takes; the count it keeps is test_request_cap's). */
static void test_hosts_wait_their_turn(void **state)
{
	enum { N = MX_MAX_REQUESTS - 2 + 5 };
	static struct res t[N];
	struct res a, b;
	struct env e;

	env_open(&e);
	assert_int_equal(mx_resolver_set_timeout(e.r, 1000, 1), 0);
	memset(t, 0, sizeof(t));
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	e.dns.hold = true;
	assert_int_equal(lookup(&e, "mx.test", true, 25, &a, NULL), 0);
	assert_int_equal(lookup(&e, "dup.test", true, 25, &b, NULL), 0);
	for (size_t i = 0; i < N; i++)
		assert_int_equal(lookup(&e, "timeout.test", true, 25, &t[i], NULL), 0);
	while (e.dns.nheld < 2)
		event_base_loop(e.base, EVLOOP_ONCE);
	dns_release(&e.dns); /* both answers come with every request slot taken */
	run_until(&e, &b.calls, 1, 900);
	run_until(&e, &a.calls, 1, 900);
	assert_int_equal(a.calls, 1);
	assert_int_equal(a.error, 0);
	assert_int_equal(b.calls, 1);
	assert_int_equal(b.error, 0);
	check_target(&a.t[0], "mx-a.mx.test", 10, "192.0.2.1", 25);
	for (size_t i = 0; i < N; i++)
		assert_int_equal(t[i].calls, 0); /* still waiting, or timing out */
	e.r = mx_resolver_free(e.r);
	for (size_t i = 0; i < N; i++)
		assert_int_equal(t[i].error, -ECANCELED);
	env_close(&e);
}

static void test_resolver_new(void **state)
{
	struct event_base *base = event_base_new();
	char err[256];
	struct mx_resolver *r;

	assert_non_null(base);
	err[0] = '\0';
	assert_null(mx_resolver_new(base, "not an address", err, sizeof(err)));
	assert_true(err[0] != '\0');
	assert_null(mx_resolver_new(base, "", err, sizeof(err)));
	assert_null(mx_resolver_new(NULL, "127.0.0.1", err, sizeof(err)));
	/* /etc/resolv.conf: made and freed, nothing is asked */
	r = mx_resolver_new(base, NULL, err, sizeof(err));
	assert_non_null(r);
	assert_int_equal(mx_resolver_set_timeout(r, 0, 1), -EINVAL);
	assert_int_equal(mx_resolver_set_timeout(r, 100, 0), -EINVAL);
	assert_null(mx_resolver_free(r));
	assert_null(mx_resolver_free(NULL));
	r = mx_resolver_new(base, "127.0.0.1:5353,[::1]:53", err, sizeof(err));
	assert_non_null(r);
	mx_resolver_free(r);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mx_order),
		cmocka_unit_test(test_mx_shuffle),
		cmocka_unit_test(test_no_mx_fallback),
		cmocka_unit_test(test_secure_and_ttl),
		cmocka_unit_test(test_tlsa),
		cmocka_unit_test(test_verdicts),
		cmocka_unit_test(test_partial_hosts),
		cmocka_unit_test(test_addresses),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_smarthost),
		cmocka_unit_test(test_literals),
		cmocka_unit_test(test_invalid_names),
		cmocka_unit_test(test_many),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_cancel_ready),
		cmocka_unit_test(test_free_pending),
		cmocka_unit_test(test_free_in_done),
		cmocka_unit_test(test_free_in_cancel),
		cmocka_unit_test(test_lookup_in_done),
		cmocka_unit_test(test_request_cap),
		cmocka_unit_test(test_hosts_wait_their_turn),
		cmocka_unit_test(test_resolver_new),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
