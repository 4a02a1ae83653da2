/*
 * smtp_out_tls -- STARTTLS and SASL for the SMTP client (smtp_out.h): the handshake over
 * the connection's bufferevent, the certificate check the route asks for, the SASL
 * exchange through GNU SASL (never AUTH in the clear unless the route allows it), and the
 * process-wide TLS contexts (one per CA file) and SASL library, under one lock.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <gsasl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "smtp_out_int.h"
#include "util.h"

/* the EHLO reader keeps every mechanism name gsasl can take */
_Static_assert(SMTP_EHLO_MECH_MAX <= GSASL_MAX_MECHANISM_SIZE, "mechanism names");

/* ---- process-wide state: TLS contexts per CA file, the SASL library ---- */

struct tls_ctx_entry {
	struct tls_ctx_entry *next;
	char *ca_file;               /* NULL: OpenSSL's default paths */
	SSL_CTX *ctx;
};

static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tls_ctx_entry *tls_ctxs;
static Gsasl *sasl_ctx;

/* The client context for ca_file, made on first use; a reference the caller frees with
 * SSL_CTX_free (SSL_new takes its own).  0, -ENOMEM, or -EPERM (the CA file unreadable). */
static int tls_ctx_get(const char *ca_file, SSL_CTX **ret)
{
	int r = 0;
	pthread_mutex_lock(&global_lock);
	struct tls_ctx_entry *e;
	for (e = tls_ctxs; e; e = e->next)
		if ((!e->ca_file && !ca_file) || (e->ca_file && ca_file && !strcmp(e->ca_file, ca_file)))
			break;
	if (!e) {
		SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
		e = calloc(1, sizeof(*e));
		char *dup = ca_file ? strdup(ca_file) : NULL;
		if (!ctx || !e || (ca_file && !dup)) {
			r = -ENOMEM;
			goto smtp_out_fail;
		}
		/* XXX protocol versions and ciphers are OpenSSL's (system) defaults: under
		 * SMTP_TLS_MAY a server that only speaks TLS 1.0 fails the handshake and gets
		 * no mail on that connection rather than mail in clear; no session resumption */
		/* a server that closes without close_notify is an EOF, not a TLS error */
		SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
		SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
				      SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
		/* DANE is enabled per connection (SSL_dane_enable), when it has TLSA records */
		if (SSL_CTX_dane_enable(ctx) <= 0) {
			r = -ENOMEM;
			goto smtp_out_fail;
		}
		if ((ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
			     : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
			ERR_clear_error();
			r = -EPERM;
			goto smtp_out_fail;
		}
		e->ctx = ctx;
		e->ca_file = dup;
		e->next = tls_ctxs;
		tls_ctxs = e;
		goto found;
	smtp_out_fail:
		SSL_CTX_free(ctx);
		free(e);
		free(dup);
		pthread_mutex_unlock(&global_lock);
		return r;
	}
found:
	SSL_CTX_up_ref(e->ctx);
	*ret = e->ctx;
	pthread_mutex_unlock(&global_lock);
	return 0;
}

/* XXX the Gsasl context is shared by every thread once made: gsasl_client_start() only
 * reads it, and no callback is installed (properties are set per session). */
static Gsasl *sasl_get(void)
{
	pthread_mutex_lock(&global_lock);
	if (!sasl_ctx && gsasl_init(&sasl_ctx) != GSASL_OK)
		sasl_ctx = NULL;
	Gsasl *g = sasl_ctx;
	pthread_mutex_unlock(&global_lock);
	return g;
}

void smtp_out_tls_cleanup(void)
{
	pthread_mutex_lock(&global_lock);
	while (tls_ctxs) {
		struct tls_ctx_entry *e = tls_ctxs;
		tls_ctxs = e->next;
		SSL_CTX_free(e->ctx);
		free(e->ca_file);
		free(e);
	}
	if (sasl_ctx) {
		gsasl_done(sasl_ctx);
		sasl_ctx = NULL;
	}
	pthread_mutex_unlock(&global_lock);
}

/*
 * DANE on ssl (RFC 7672 3): the TLSA base domain as the reference name, no name checks for
 * DANE-EE (3.1.1: the key is the identity), and the records; the handshake then fails
 * unless the chain matches one (SSL_get_verify_result() says why).  0, -EPERM (no record
 * OpenSSL can use), -ENOMEM.
 */
static int smtp_out_dane_setup(SSL *ssl, const struct smtp_out_dane *d)
{
	int usable = 0;

	if (!d->base || SSL_dane_enable(ssl, d->base) <= 0) {
		ERR_clear_error();
		return -ENOMEM;
	}
	SSL_dane_set_flags(ssl, DANE_FLAG_NO_DANE_EE_NAMECHECKS);
	/* RFC 7672 3.2.3: a wildcard only as the whole left-most label */
	SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
	for (size_t i = 0; i < d->n; i++) {
		const struct smtp_out_tlsa *t = &d->recs[i];
		int r = SSL_dane_tlsa_add(ssl, t->usage, t->selector, t->mtype, t->data, t->len);
		if (r > 0)
			usable++;
		else if (r < 0)
			ERR_clear_error(); /* malformed (a full certificate that does not parse) */
	}
	if (!usable)
		return -EPERM;
	SSL_set_verify(ssl, SSL_VERIFY_PEER, NULL);
	return 0;
}

static const char *dane_usage_name(uint8_t usage)
{
	switch (usage) {
	case 0: return "PKIX-TA";
	case 1: return "PKIX-EE";
	case 2: return "DANE-TA";
	case 3: return "DANE-EE";
	default: return "TLSA";
	}
}

void smtp_out_tls_done(struct smtp_out *c)
{
	uint8_t usage, selector, mtype;
	const unsigned char *data;
	size_t len;

	if (c->conf->dane && c->ssl && SSL_get_verify_result(c->ssl) == X509_V_OK &&
	    SSL_get0_dane_tlsa(c->ssl, &usage, &selector, &mtype, &data, &len) >= 0)
		(void)fmt_fixed(c->tls_auth, sizeof(c->tls_auth), "%s %u %u %u",
				dane_usage_name(usage), usage, selector, mtype);
	else if (c->conf->tls == SMTP_TLS_VERIFY)
		(void)fmt_fixed(c->tls_auth, sizeof(c->tls_auth), "verified");
	else
		(void)fmt_fixed(c->tls_auth, sizeof(c->tls_auth), "not verified");
}

const char *smtp_out_tls_auth(const struct smtp_out *c)
{
	return c->tls_auth;
}

enum smtp_out_dane_fail smtp_out_dane_failure(const struct smtp_out *c)
{
	if (!c->conf->dane)
		return SMTP_DANE_FAIL_OTHER;
	switch (c->tls_verify) {
	case X509_V_ERR_DANE_NO_MATCH:
		return SMTP_DANE_FAIL_NO_MATCH;
	case X509_V_ERR_HOSTNAME_MISMATCH:
		return SMTP_DANE_FAIL_NAME;
	default:
		return SMTP_DANE_FAIL_OTHER;
	}
}

static bool is_ip_literal(const char *s)
{
	unsigned char b[sizeof(struct in6_addr)];
	return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

/* The server said 220 to STARTTLS: the handshake, over the socket's bufferevent. */
void smtp_out_start_tls(struct smtp_out *c)
{
	const struct smtp_out_conf *cf = c->conf;
	bool verify = cf->tls == SMTP_TLS_VERIFY;
	if (verify && !cf->server_name) {
		smtp_out_fail(c, SMTP_STAGE_STARTTLS, -EPERM, "tls verify without a server name to check",
		     NULL, true);
		return;
	}
	SSL_CTX *ctx;
	int r = tls_ctx_get(verify ? cf->ca_file : NULL, &ctx);
	if (r < 0) {
		smtp_out_fail(c, SMTP_STAGE_STARTTLS, r,
		     r == -EPERM ? "the CA file could not be loaded" : "out of memory", NULL, true);
		return;
	}
	SSL *ssl = SSL_new(ctx);
	SSL_CTX_free(ctx);
	if (!ssl) {
		smtp_out_fail_nomem(c);
		return;
	}
	bool ip = cf->server_name && is_ip_literal(cf->server_name);
	if (cf->server_name && !ip) /* RFC 6066: no IP literal in SNI */
		SSL_set_tlsext_host_name(ssl, cf->server_name);
	if (verify) {
		SSL_set_verify(ssl, SSL_VERIFY_PEER, NULL);
		SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), cf->server_name)
			    : SSL_set1_host(ssl, cf->server_name);
		if (ok != 1) {
			SSL_free(ssl);
			smtp_out_fail(c, SMTP_STAGE_STARTTLS, -EPERM, "the server name cannot be checked", NULL,
			     true);
			return;
		}
	} else if (cf->dane) {
		int e = smtp_out_dane_setup(ssl, cf->dane);
		if (e < 0) {
			SSL_free(ssl);
			smtp_out_fail(c, SMTP_STAGE_STARTTLS, e, e == -ENOMEM ? "out of memory"
				      : "no usable TLSA record", NULL, true);
			return;
		}
	} else {
		SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL);
	}
	/* the filter encrypts into the socket's output only up to TLS_UNDER_HIGH, so the
	 * body's bound holds over TLS too */
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, TLS_UNDER_HIGH);
	/* the filter takes the socket's callbacks: those of the session (smtp_out.c) */
	bufferevent_data_cb on_read, on_write;
	bufferevent_event_cb on_event;
	bufferevent_getcb(c->bev, &on_read, &on_write, &on_event, NULL);
	struct bufferevent *f = bufferevent_openssl_filter_new(
		c->base, c->bev, ssl, BUFFEREVENT_SSL_CONNECTING,
		BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
	if (!f) {
		/* XXX libevent frees the socket's bufferevent and the SSL on some of its failure
		 * paths and not on others (allocation): forget both rather than free twice */
		c->bev = NULL;
		smtp_out_fail(c, SMTP_STAGE_STARTTLS, -ENOMEM, "the TLS layer could not be set up", NULL, true);
		return;
	}
	c->bev = f;
	c->ssl = ssl;
	bufferevent_openssl_set_allow_dirty_shutdown(f, 1);
	bufferevent_setcb(f, on_read, on_write, on_event, c);
	bufferevent_setwatermark(f, EV_READ, 0, INPUT_MAX);
	bufferevent_enable(f, EV_READ | EV_WRITE);
	c->phase = PH_HANDSHAKE;
	smtp_out_arm(c);
}

/* Is mech (a word) among the server's offered mechanisms? */
bool smtp_out_offered(const char *list, struct str mech)
{
	struct str s = str_cstr(list);
	for (struct str w = smtp_next_word(&s); w.len; w = smtp_next_word(&s))
		if (w.len == mech.len && strncasecmp(w.ptr, mech.ptr, w.len) == 0)
			return true;
	return false;
}

/* XOAUTH2 (not in GNU SASL 2.2): one initial response, base64 of
 * "user=U^Aauth=Bearer TOKEN^A^A", the password being the token. */
static int xoauth2_initial(const char *user, const char *token, char **ret)
{
	size_t ul = strlen(user), tl = strlen(token);
	size_t n = 5 + ul + 1 + 12 + tl + 2;
	char *raw = malloc(n);
	if (!raw)
		return -ENOMEM;
	char *p = raw;
	memcpy(p, "user=", 5), p += 5;
	memcpy(p, user, ul), p += ul;
	*p++ = '\x01';
	memcpy(p, "auth=Bearer ", 12), p += 12;
	memcpy(p, token, tl), p += tl;
	*p++ = '\x01';
	*p++ = '\x01';
	char *out = NULL;
	size_t outlen;
	int r = gsasl_base64_to(raw, n, &out, &outlen);
	OPENSSL_cleanse(raw, n);
	free(raw);
	if (r != GSASL_OK)
		return -ENOMEM;
	*ret = out;
	return 0;
}

void smtp_out_start_auth(struct smtp_out *c)
{
	const struct smtp_out_conf *cf = c->conf;
	if (!c->tls && !cf->auth_plaintext) {
		smtp_out_fail(c, SMTP_STAGE_AUTH, -EPERM, "AUTH without TLS is not allowed", NULL, false);
		return;
	}
	if (!(c->ehlo.ext & SMTP_EHLO_AUTH)) {
		smtp_out_fail(c, SMTP_STAGE_AUTH, -EPERM, "the server does not offer AUTH", NULL, false);
		return;
	}
	Gsasl *g = sasl_get();
	if (!g) {
		smtp_out_fail_nomem(c);
		return;
	}
	struct str prefs = str_cstr(cf->auth_mechanisms ? cf->auth_mechanisms
							: "SCRAM-SHA-256 SCRAM-SHA-1 PLAIN LOGIN");
	struct str mech = STR_NULL;
	for (struct str w = smtp_next_word(&prefs); w.len; w = smtp_next_word(&prefs)) {
		if (w.len > GSASL_MAX_MECHANISM_SIZE || !smtp_out_offered(c->ehlo.auth, w))
			continue;
		char name[GSASL_MAX_MECHANISM_SIZE + 1];
		for (size_t i = 0; i < w.len; i++)
			name[i] = w.ptr[i] >= 'a' && w.ptr[i] <= 'z' ? (char)(w.ptr[i] - 'a' + 'A')
								    : w.ptr[i];
		name[w.len] = '\0';
		if (strcmp(name, "XOAUTH2") == 0 || gsasl_client_support_p(g, name)) {
			memcpy(c->auth_mech, name, w.len + 1);
			mech = w;
			break;
		}
	}
	if (!mech.len) {
		smtp_out_fail(c, SMTP_STAGE_AUTH, -EPERM, "no AUTH mechanism in common with the server", NULL,
		     false);
		return;
	}
	const char *password = cf->auth_password ? cf->auth_password : "";
	char *ir = NULL;
	bool send_ir = true;
	c->sasl_finished = false;
	c->sasl_aborted = false;
	c->xoauth2 = strcmp(c->auth_mech, "XOAUTH2") == 0;
	if (c->xoauth2) {
		if (xoauth2_initial(cf->auth_user, password, &ir) < 0) {
			smtp_out_fail_nomem(c);
			return;
		}
		c->sasl_finished = true;
	} else {
		if (gsasl_client_start(g, c->auth_mech, &c->sasl) != GSASL_OK) {
			c->sasl = NULL;
			smtp_out_fail_nomem(c);
			return;
		}
		if (gsasl_property_set(c->sasl, GSASL_AUTHID, cf->auth_user) != GSASL_OK ||
		    gsasl_property_set(c->sasl, GSASL_PASSWORD, password) != GSASL_OK) {
			smtp_out_fail_nomem(c);
			return;
		}
		if (strcmp(c->auth_mech, "LOGIN") == 0) {
			send_ir = false; /* servers prompt for the user name; many refuse it early */
		} else {
			int r = gsasl_step64(c->sasl, "", &ir);
			if (r == GSASL_OK)
				c->sasl_finished = true;
			else if (r != GSASL_NEEDS_MORE) {
				smtp_out_fail(c, SMTP_STAGE_AUTH, -EPROTO, "the SASL mechanism could not start",
				     NULL, false);
				return;
			}
			/* a mechanism that waits for the server's first challenge */
			if (r == GSASL_NEEDS_MORE && ir && !ir[0])
				send_ir = false;
		}
	}
	struct evbuffer *o = smtp_out_out_buf(c);
	int r;
	if (send_ir)
		r = evbuffer_add_printf(o, "AUTH %s %s\r\n", c->auth_mech, ir && ir[0] ? ir : "=");
	else
		r = evbuffer_add_printf(o, "AUTH %s\r\n", c->auth_mech);
	if (ir) {
		OPENSSL_cleanse(ir, strlen(ir));
		gsasl_free(ir);
	}
	if (r < 0) {
		smtp_out_fail_nomem(c);
		return;
	}
	c->phase = PH_AUTH;
	smtp_out_arm(c);
}

/* A reply in PH_AUTH: true when it ends AUTH with success (the session goes on, the
 * caller's part); otherwise the challenge is answered or the failure reported here. */
bool smtp_out_on_auth_reply(struct smtp_out *c, const struct smtp_reply *r)
{
	if (r->code == 235 && !c->sasl_aborted) {
		/* XXX a 235 before a SCRAM server's final message is taken as success: the server
		 * is not authenticated to us then, only we to it */
		c->authenticated = true;
		if (c->sasl) {
			gsasl_finish(c->sasl);
			c->sasl = NULL;
		}
		return true;
	}
	if (r->code == 334 && !c->sasl_aborted) {
		const char *answer = "";
		char *out = NULL;
		if (c->sasl && !c->sasl_finished) {
			int s = gsasl_step64(c->sasl, r->text, &out);
			if (s == GSASL_OK)
				c->sasl_finished = true;
			if (s == GSASL_OK || s == GSASL_NEEDS_MORE) {
				answer = out ? out : "";
			} else {
				answer = "*"; /* cancel (RFC 4954 4): the server answers 501 */
				c->sasl_aborted = true;
			}
		} else if (!c->xoauth2) {
			answer = "*"; /* a challenge after the mechanism's end */
			c->sasl_aborted = true;
		}
		/* XOAUTH2: the 334 carries the error; an empty line gets the final 5xx */
		int e = smtp_out_send_cmd(c, answer);
		if (out) {
			OPENSSL_cleanse(out, strlen(out));
			gsasl_free(out);
		}
		if (e < 0) {
			smtp_out_fail_nomem(c);
			return false;
		}
		smtp_out_arm(c);
		return false;
	}
	if (c->sasl_aborted) {
		smtp_out_fail(c, SMTP_STAGE_AUTH, -EPROTO,
		     "the SASL exchange failed (a challenge not understood or a wrong server proof)",
		     NULL, false);
		return false;
	}
	if (smtp_out_is_refusal(r)) {
		smtp_out_fail(c, SMTP_STAGE_AUTH, 0, "", r, false);
		return false;
	}
	smtp_out_fail_proto(c, "an unexpected reply to AUTH");
	return false;
}
