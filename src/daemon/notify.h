/*
 * notify -- the sd_notify datagram ("READY=1", "RELOADING=1", "STOPPING=1", "STATUS=...").
 */
#ifndef SLUICE_NOTIFY_H
#define SLUICE_NOTIFY_H

/* Send state (one or more "KEY=VALUE" lines) to $NOTIFY_SOCKET; 0 when it is unset.
 * 0 or -errno. */
int notify_send(const char *state);

#endif
