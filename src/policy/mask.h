/*
 * mask -- lists of host and address masks, for host classes and `except` lists.
 *
 * Mask syntax (what an operator writes):
 *   "*"                  anything
 *   "192.0.2.0/24", "2001:db8::/32", "192.0.2.7", "::1"   an address or CIDR prefix
 *   "*.example.com"      example.com itself and every name below it
 *   "mx.example.com"     exactly that name (case-insensitive, a trailing dot ignored)
 *   "user@example.com"   (address lists) exactly that address: local part as written,
 *                        domain case-insensitive
 *   "@example.com"       (address lists) any address at exactly that domain
 *   anything else        (string lists: SASL users, header values, macros) that exact text
 *
 * A list is compiled once at load and is read-only afterwards (shared by all workers).
 * Matching costs O(entries); the lists an operator writes are short.  Limits: a mask is at
 * most 1024 bytes, a list holds at most 65536 masks.
 */
#ifndef SLUICE_MASK_H
#define SLUICE_MASK_H

#include <stdbool.h>
#include <stddef.h>

#include "ipaddr.h"
#include "str.h"

enum mask_type {
	MASK_HOSTS = 0, /* classes: names, *.domain, *, addresses and CIDR */
	MASK_IP,        /* client_ip: addresses and CIDR, * */
	MASK_NAME,      /* client_name, helo, sender_domain, rcpt_domain: names, *.domain, * */
	MASK_ADDRESS,   /* sender, rcpt: addresses, @domain, *.domain (the address's domain), *,
			   and "<>" for the null sender */
	MASK_STRING,    /* sasl_user, header:, macro: exact text, * */
};

struct mask_list;

struct mask_list *mask_list_new(enum mask_type type);
struct mask_list *mask_list_free(struct mask_list *l);
/* Add one mask; 0, -EINVAL with a message in err (no file/line: the caller adds them), or
 * -ENOMEM. */
int mask_list_add(struct mask_list *l, struct str mask, char *err, size_t errlen);
size_t mask_list_count(const struct mask_list *l);
/* Does any mask match?  Each matcher uses the entries that make sense for it:
 *   ip:      "*", addresses and CIDR prefixes (a NULL address matches only "*");
 *   name:    "*", exact names and *.domain (case-insensitive; a trailing dot ignored);
 *   host:    for classes: the address against CIDR entries, or the name (when it is not
 *            empty) against names and *.domain, or "*";
 *   address: "*", "<>", exact addresses, @domain and *.domain on the part after the last @;
 *            one pair of angle brackets around addr is dropped first, and "<>" (or "")
 *            is the null sender;
 *   string:  "*" or exact text. */
bool mask_list_match_ip(const struct mask_list *l, const struct ipaddr *a);
bool mask_list_match_name(const struct mask_list *l, struct str name);
bool mask_list_match_host(const struct mask_list *l, const struct ipaddr *a, struct str name);
bool mask_list_match_address(const struct mask_list *l, struct str addr);
bool mask_list_match_string(const struct mask_list *l, struct str s);
/* Does the list hold "*"? */
bool mask_list_has_any(const struct mask_list *l);

#endif
