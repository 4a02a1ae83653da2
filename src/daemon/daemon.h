/*
 * daemon -- sluiced: configuration, services, signals, statistics, control commands.
 */
#ifndef SLUICE_DAEMON_H
#define SLUICE_DAEMON_H

#include "buf.h"
#include "str.h"

struct daemon;

/* The whole program; main() only calls this. */
int daemon_main(int argc, char **argv);

/* Control commands (run on a worker thread): status, stats [--json], reload. */
int daemon_control(struct daemon *d, size_t argc, const struct str *argv, struct buf *out,
		   bool *ret_ok);

#endif
