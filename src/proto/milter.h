/*
 * milter -- the Sendmail/Postfix milter wire protocol, versions 2 to 6: a pure codec.
 *
 * No I/O and no session state: milter_frame_parse() finds one packet in buffered bytes,
 * milter_cmd_decode() checks and splits a command's payload into slices pointing into the
 * packet, milter_negotiate() computes the OPTNEG answer from the MTA's offer and what the
 * handlers need, and the milter_put_*() functions append encoded replies to a buf.
 * Invariants: every length read from the peer is checked against the bytes present and
 * against a cap before use; decoded slices never extend past the packet; a malformed
 * packet yields -EPROTO with a static reason string for the log.
 */
#ifndef SLUICE_PROTO_MILTER_H
#define SLUICE_PROTO_MILTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "str.h"

/* Commands, MTA to filter. */
enum {
	MILTER_CMD_ABORT = 'A',
	MILTER_CMD_BODY = 'B',
	MILTER_CMD_CONNECT = 'C',
	MILTER_CMD_MACRO = 'D',
	MILTER_CMD_BODYEOB = 'E',
	MILTER_CMD_HELO = 'H',
	MILTER_CMD_QUIT_NC = 'K',
	MILTER_CMD_HEADER = 'L',
	MILTER_CMD_MAIL = 'M',
	MILTER_CMD_EOH = 'N',
	MILTER_CMD_OPTNEG = 'O',
	MILTER_CMD_QUIT = 'Q',
	MILTER_CMD_RCPT = 'R',
	MILTER_CMD_DATA = 'T',
	MILTER_CMD_UNKNOWN = 'U',
};

/* Replies, filter to MTA. */
enum {
	MILTER_REPLY_ADDRCPT = '+',
	MILTER_REPLY_DELRCPT = '-',
	MILTER_REPLY_ADDRCPT_PAR = '2',
	MILTER_REPLY_SHUTDOWN = '4',
	MILTER_REPLY_ACCEPT = 'a',
	MILTER_REPLY_REPLBODY = 'b',
	MILTER_REPLY_CONTINUE = 'c',
	MILTER_REPLY_DISCARD = 'd',
	MILTER_REPLY_CHGFROM = 'e',
	MILTER_REPLY_CONN_FAIL = 'f',
	MILTER_REPLY_ADDHEADER = 'h',
	MILTER_REPLY_INSHEADER = 'i',
	MILTER_REPLY_SETSYMLIST = 'l',
	MILTER_REPLY_CHGHEADER = 'm',
	MILTER_REPLY_PROGRESS = 'p',
	MILTER_REPLY_QUARANTINE = 'q',
	MILTER_REPLY_REJECT = 'r',
	MILTER_REPLY_SKIP = 's',
	MILTER_REPLY_TEMPFAIL = 't',
	MILTER_REPLY_REPLYCODE = 'y',
};

/* Action flags (SMFIF_*). */
#define MILTER_ACT_ADDHDRS 0x001u
#define MILTER_ACT_CHGBODY 0x002u
#define MILTER_ACT_ADDRCPT 0x004u
#define MILTER_ACT_DELRCPT 0x008u
#define MILTER_ACT_CHGHDRS 0x010u
#define MILTER_ACT_QUARANTINE 0x020u
#define MILTER_ACT_CHGFROM 0x040u
#define MILTER_ACT_ADDRCPT_PAR 0x080u
#define MILTER_ACT_SETSYMLIST 0x100u
#define MILTER_ACT_ALL 0x1ffu

/* Protocol flags (SMFIP_*). */
#define MILTER_P_NOCONNECT 0x00000001u
#define MILTER_P_NOHELO 0x00000002u
#define MILTER_P_NOMAIL 0x00000004u
#define MILTER_P_NORCPT 0x00000008u
#define MILTER_P_NOBODY 0x00000010u
#define MILTER_P_NOHDRS 0x00000020u
#define MILTER_P_NOEOH 0x00000040u
#define MILTER_P_NR_HDR 0x00000080u
#define MILTER_P_NOUNKNOWN 0x00000100u
#define MILTER_P_NODATA 0x00000200u
#define MILTER_P_SKIP 0x00000400u
#define MILTER_P_RCPT_REJ 0x00000800u
#define MILTER_P_NR_CONN 0x00001000u
#define MILTER_P_NR_HELO 0x00002000u
#define MILTER_P_NR_MAIL 0x00004000u
#define MILTER_P_NR_RCPT 0x00008000u
#define MILTER_P_NR_DATA 0x00010000u
#define MILTER_P_NR_UNKN 0x00020000u
#define MILTER_P_NR_EOH 0x00040000u
#define MILTER_P_NR_BODY 0x00080000u
#define MILTER_P_HDR_LEADSPC 0x00100000u
#define MILTER_P_MDS_256K 0x10000000u
#define MILTER_P_MDS_1M 0x20000000u
#define MILTER_P_ALL 0x001fffffu

#define MILTER_DATA_64K 65535u
#define MILTER_DATA_256K 262143u
#define MILTER_DATA_1M 1048575u
/* Default cap on a packet's length word: above every MDS size and Postfix's default
 * header_size_limit (102400), with margin. */
#define MILTER_LEN_CAP_DEFAULT (MILTER_DATA_1M + 1 + 4096)
#define MILTER_MAX_MACRO_PAIRS 64
#define MILTER_MAX_ESMTP_ARGS 32
#define MILTER_REPLY_MAX_LINES 32
#define MILTER_REPLY_MAX_TEXT 980

/*
 * The protocol steps a handler may want, in MTA order.  Used for negotiation (which steps
 * to ask for and which need a reply) and to index per-step tables.
 */
enum milter_step {
	MILTER_STEP_CONNECT = 0,
	MILTER_STEP_HELO,
	MILTER_STEP_MAIL,
	MILTER_STEP_RCPT,
	MILTER_STEP_DATA,
	MILTER_STEP_HEADER,
	MILTER_STEP_EOH,
	MILTER_STEP_BODY,
	MILTER_STEP_EOM,
	MILTER_STEP_UNKNOWN,
	MILTER_STEP_COUNT,
};

#define MILTER_STEP_BIT(s) (1u << (s))

const char *milter_step_name(enum milter_step step);
int milter_step_from_name(const char *name, enum milter_step *ret);

/* Macro stage indexes in the OPTNEG reply (SMFIM_*); note EOM (5) before EOH (6). */
enum milter_macro_stage {
	MILTER_MACROS_CONNECT = 0,
	MILTER_MACROS_HELO,
	MILTER_MACROS_MAIL,
	MILTER_MACROS_RCPT,
	MILTER_MACROS_DATA,
	MILTER_MACROS_EOM,
	MILTER_MACROS_EOH,
	MILTER_MACROS_COUNT,
};

/* One packet located in a byte stream. */
struct milter_frame {
	uint8_t code;
	struct str data; /* payload after the code byte */
	size_t size;     /* bytes consumed: 4 + len */
};

/*
 * Read the length word at p[0..n): returns 1 and *ret_size (4 + length: the bytes the whole
 * packet takes) when n >= 4, 0 when fewer bytes are there, or -EPROTO with *ret_why when
 * the length word is 0 or above cap.
 */
int milter_frame_size(const void *p, size_t n, size_t cap, size_t *ret_size,
		      const char **ret_why);

/*
 * Locate the first packet in p[0..n).  Returns 1 and fills *ret when a whole packet is
 * present, 0 when more bytes are needed (a partial packet, nothing consumed), or -EPROTO
 * with *ret_why set when the length word is 0 or above cap.
 */
int milter_frame_parse(const void *p, size_t n, size_t cap, struct milter_frame *ret,
		       const char **ret_why);

struct milter_macro_pair {
	struct str name; /* as sent, braces included */
	struct str value;
};

struct milter_cmd {
	uint8_t code;
	union {
		struct {
			uint32_t version, actions, protocol;
		} optneg;
		struct {
			uint8_t stage;
			size_t npairs;
			struct milter_macro_pair pairs[MILTER_MAX_MACRO_PAIRS];
		} macro;
		struct {
			struct str host;
			uint8_t family; /* '4' '6' 'L' 'U' */
			uint16_t port;
			struct str address; /* empty for 'U' */
		} connect;
		struct {
			struct str name;
		} helo;
		struct {
			struct str addr;
			size_t nargs;
			struct str args[MILTER_MAX_ESMTP_ARGS];
		} envelope; /* MAIL, RCPT */
		struct {
			struct str name, value;
		} header;
		struct {
			struct str chunk;
		} body; /* BODY, BODYEOB */
		struct {
			struct str line;
		} unknown;
	};
};

/*
 * Check and split the payload of a command.  Returns 0 and fills *ret (slices point into
 * frame->data), or -EPROTO with *ret_why for an unknown code or a malformed payload.
 */
int milter_cmd_decode(const struct milter_frame *frame, struct milter_cmd *ret,
		      const char **ret_why);

/* What the handlers need, as input to the negotiation. */
struct milter_want {
	uint32_t steps;   /* MILTER_STEP_BIT()s the handlers want to see */
	uint32_t replies; /* of those, the steps whose reply matters; others get NR_* */
	uint32_t actions; /* modifications the handlers may send at EOM */
	bool header_leadspc;
	bool rcpt_rejected;
	bool skip;
	const char *macros[MILTER_MACROS_COUNT]; /* space-separated lists, or NULL */
};

/* The outcome of a negotiation, kept for the whole connection. */
struct milter_neg {
	uint32_t version;
	uint32_t actions;
	uint32_t protocol; /* what we answered */
	uint32_t mta_protocol;
	uint32_t reply_steps; /* MILTER_STEP_BIT()s for which the MTA waits for a reply */
	uint32_t send_steps;  /* steps the MTA will send (not skipped) */
	size_t body_max;      /* largest BODY chunk allowed by the agreed MDS */
	bool symlist;         /* macro lists are appended to the reply */
};

/*
 * Compute the answer to an MTA's OPTNEG.  Returns 0 and fills *ret, or -EPROTO when the
 * MTA's version is below 2.  Never sets a bit the MTA did not offer.
 */
int milter_negotiate(uint32_t mta_version, uint32_t mta_actions, uint32_t mta_protocol,
		     const struct milter_want *want, struct milter_neg *ret, const char **ret_why);

/* Append the OPTNEG reply packet (with the macro lists when neg->symlist). */
int milter_put_optneg(struct buf *out, const struct milter_neg *neg,
		      const char *const macros[MILTER_MACROS_COUNT]);

/* Append a packet with no payload ('c', 'a', 'r', 't', 'd', 's', 'p', '4'). */
int milter_put_simple(struct buf *out, uint8_t code);

/*
 * Check an SMTP reply for REPLYCODE: lines separated by "\n" or "\r\n", each "NNN text"
 * or "NNN-text"/"NNN text" with the same 4xx or 5xx code on every line, an optional
 * enhanced code whose class matches, at most MILTER_REPLY_MAX_LINES lines of at most
 * MILTER_REPLY_MAX_TEXT bytes, no NUL.  Returns 0 or -EINVAL with *ret_why.
 */
int milter_reply_check(struct str text, const char **ret_why);

/*
 * Append a REPLYCODE packet for text (checked as above): continuation markers are set
 * ("NNN-" on all but the last line), lines are joined by CRLF, '%' is doubled.
 */
int milter_put_replycode(struct buf *out, struct str text);

/* Modifications (only legal at EOM; the session checks that). */
int milter_put_header(struct buf *out, uint8_t code, uint32_t index, struct str name,
		      struct str value); /* 'h' (index ignored), 'i', 'm' */
int milter_put_addr(struct buf *out, uint8_t code, struct str addr, struct str args);
/* '+', '-' (args ignored), '2', 'e' (args may be empty) */
int milter_put_quarantine(struct buf *out, struct str reason);
/* Appends as many 'b' packets as needed, each at most 65535 bytes. */
int milter_put_replbody(struct buf *out, struct str body);

#endif
