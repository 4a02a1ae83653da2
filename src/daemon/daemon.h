/*
 * daemon -- sluiced: the program (daemon.c, its rooms behind daemon_int.h).
 */
#ifndef SLUICE_DAEMON_H
#define SLUICE_DAEMON_H

struct daemon;

/* The whole program; main() only calls this. */
int daemon_main(int argc, char **argv);

#endif
