/*
 * inject -- the mail injectors of the `sluice` command: `sluice sendmail` and
 * `sluice qmail-remote`, blocking SMTP clients of sluiced's intake service.
 *
 * Both read a message on standard input and hand it to the intake, which answers 250 to
 * the final dot only once the message is committed to the queue: an injector that
 * reports success (exit 0, or qmail-remote's K) has a queued message behind it.
 *
 * The intake is found, in this order: an address given directly (sendmail's --intake,
 * or $SLUICE_INTAKE), else the configuration's intake { listen = ...; } addresses,
 * unix: ones first.  The configuration file is -C FILE (sendmail), else sluice's
 * -c FILE, else $SLUICE_CONFIG, else CONFIG_DEFAULT_PATH; with an address given
 * directly it is read only when it was named (for intake.hostname and
 * max_message_size).
 */
#ifndef SLUICE_INJECT_H
#define SLUICE_INJECT_H

/*
 * sendmail(1)-compatible submission.  argv[0] is the command's name, options and
 * recipients follow.  config: sluice's -c FILE, or NULL.  prog: the name for messages
 * ("sendmail" or "sluice sendmail").  Returns an exit status from <sysexits.h>.
 */
int inject_sendmail(int argc, char **argv, const char *config, const char *prog);

/*
 * qmail-remote(8) in qmail's place: `qmail-remote host sender recip...`.  Prints
 * qmail-remote's reports on standard output and returns 0, always (qmail-rspawn reads
 * a non-zero exit as a failure of its own).  config: sluice's -c FILE, or NULL.
 */
int inject_qmail_remote(int argc, char **argv, const char *config);

#endif
