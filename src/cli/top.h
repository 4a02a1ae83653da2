/*
 * top -- `sluice top`, the live view (see top.c).
 */
#ifndef SLUICE_TOP_H
#define SLUICE_TOP_H

/*
 * Refresh every interval_s seconds over the control connection fd (kept open) until q,
 * Ctrl-C or SIGTERM; batch > 0 prints that many plain frames and returns.  Returns the
 * exit status: 0, or 1 when the daemon could not be asked.
 */
int top_run(int fd, unsigned interval_s, long batch);

#endif
