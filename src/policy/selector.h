/*
 * selector -- what a rate-limit key is made of, and the transaction it is read from.
 *
 * A key spec is one or more alternatives joined with '|' (the first whose selectors all
 * have a value gives the key: "sasl_user|sender|client_ip"), each one selector or
 * several joined with '+' (a compound key):
 *   client_ip[/V4[/V6]]  client_name  helo  sasl_user  sender  sender_domain
 *   rcpt  rcpt_domain  header:NAME  macro:NAME
 * The key text is the selectors' values joined with '+', normalized so that equal things
 * give equal keys: domains and host names are lowercased (and lose a trailing dot),
 * addresses lose their angle brackets and get a lowercased domain (the local part is kept
 * as written, RFC 5321 §2.4), the null sender is "<>" (for sender and sender_domain),
 * client_ip with a prefix gives the network ("192.0.2.0/24").  Each value is cut to
 * SELECTOR_MAX_VALUE bytes.  In a compound key, '%' and '+' inside a value are written
 * "%25" and "%2B", so that two different pairs of values never give one key
 * ("a+b@x" + "c" is "a%2Bb@x+c", "a" + "b@x+c" is "a+b@x%2Bc").  In a chain of
 * alternatives, the key starts with the alternative that gave it and a ':'
 * ("sasl_user:bob", "client_ip:192.0.2.7"), so that two alternatives never share a key;
 * there, an alternative that reads the sender is passed over for a null sender (a bounce
 * is counted by what follows), unless it is the last.  A selector without a value (no SASL user, no such header, a
 * client without a verified name) makes the key -- and so the rule -- not apply.
 *
 * struct policy_txn is the protocol-neutral view of an SMTP transaction that the milter
 * sessions and the Postfix policy service fill in.
 */
#ifndef SLUICE_SELECTOR_H
#define SLUICE_SELECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "ipaddr.h"
#include "mask.h"
#include "str.h"

#define SELECTOR_MAX 8          /* selectors in one key */
#define SELECTOR_MAX_VALUE 256  /* bytes of one value in a key */
/* the values and their '+', and a chain's prefix: its alternative's selectors' names */
#define SELECTOR_MAX_KEY (SELECTOR_MAX * (SELECTOR_MAX_VALUE + 1) + SELECTOR_MAX * 80)
#define SELECTOR_MAX_NAME 64    /* header and macro names */

enum selector_kind {
	SEL_CLIENT_IP = 0,
	SEL_CLIENT_NAME,
	SEL_HELO,
	SEL_SASL_USER,
	SEL_SENDER,
	SEL_SENDER_DOMAIN,
	SEL_RCPT,
	SEL_RCPT_DOMAIN,
	SEL_HEADER,
	SEL_MACRO,
};

struct selector {
	enum selector_kind kind;
	unsigned v4_bits, v6_bits;         /* client_ip: 32/128 unless a prefix was given */
	char name[SELECTOR_MAX_NAME + 1];  /* header: and macro: */
};

/* The transaction.  Strings are as the MTA gave them; empty = absent. */
struct policy_txn {
	struct str client_addr;   /* printable address */
	struct str client_name;   /* verified name; "", "unknown" or "[addr]" = none */
	struct str helo;
	struct str sasl_user;
	struct str sender;        /* "<a@b>", "a@b"; "<>" or "" after MAIL = null sender */
	bool have_sender;         /* MAIL was given */
	struct str rcpt;          /* the recipient of this RCPT (or the only one) */
	uint64_t size;            /* SIZE= at MAIL, the real size at EOM */
	bool have_size;
	unsigned rcpt_count;      /* accepted recipients so far */
	/* header:NAME (first occurrence) and macro:NAME lookups; may be NULL. */
	bool (*header)(void *arg, const char *name, struct str *ret);
	bool (*macro)(void *arg, const char *name, struct str *ret);
	void *arg;
};

/*
 * Parse "sasl_user|sender_domain+rcpt_domain" into sels[0..*ret_n): alternative i is
 * sels[alt[i] .. alt[i + 1]), for i < *ret_nalt (alt holds max + 1 entries).  With alt
 * NULL, one alternative only ('|' is refused).  0 or -EINVAL with err.
 */
int selector_parse_key(const char *spec, struct selector *sels, size_t max, size_t *ret_n,
		       size_t *alt, size_t *ret_nalt, char *err, size_t errlen);
/* Parse one selector name (for except lists); prefixes are allowed on client_ip. */
int selector_parse(struct str text, struct selector *ret, char *err, size_t errlen);
/* "client_ip/24", "header:Subject" */
const char *selector_name(const struct selector *s, char *buf, size_t len);
/* The kind of mask list that matches this selector's values (except lists). */
enum mask_type selector_mask_type(const struct selector *s);

/*
 * The normalized value of one selector, appended to out.  Returns 1 when it has a value,
 * 0 when it has none (out unchanged), -ENOBUFS if out is full.
 */
int selector_value(const struct selector *s, const struct policy_txn *t, struct buf *out);
/*
 * The key of sels[0..n) into out (reset first).  Returns 1 when every selector has a
 * value, 0 when one has none (*ret_missing, if not NULL, points at it), <0 on error.
 */
int selector_key(const struct selector *sels, size_t n, const struct policy_txn *t,
		 struct buf *out, const struct selector **ret_missing);
/* The selectors of a rule's key (what selector_parse_key() gave). */
struct selector_set {
	const struct selector *sel;
	size_t n;
	const size_t *alt;  /* NULL (or nalt <= 1): one alternative, sel[0..n) */
	size_t nalt;
};
/*
 * The key of a chain into out: the first alternative whose selectors all have a value,
 * prefixed with its name and ':' when there are several.  Returns 1 with *ret_alt (if not
 * NULL) its index, 0 when no alternative has a value (*ret_missing: the first missing
 * selector of the last alternative), <0 on error.
 */
int selector_chain_key(const struct selector_set *set, const struct policy_txn *t,
		       struct buf *out, size_t *ret_alt, const struct selector **ret_missing);
/* "sasl_user", "sender+rcpt_domain": alternative i of the set, as written. */
const char *selector_alt_name(const struct selector_set *set, size_t i, char *buf, size_t len);
/* Does the selector's value match the list (false when it has no value)? */
bool selector_match(const struct selector *s, const struct policy_txn *t,
		    const struct mask_list *l);
/* Normalize an override file key for a rule with these selectors (the rate_key_normalize_fn
 * contract: arg is a struct selector_set).  A compound key's parts are split at '+' and
 * each is unescaped, normalized and escaped again; a chain's key names its alternative
 * ("sasl_user:bob"). */
int selector_normalize_key(struct str key, char *out, void *arg);

#endif
