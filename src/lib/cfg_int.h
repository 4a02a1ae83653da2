/*
 * cfg_int -- what the parser (cfg.c) shares with the converters (cfg_convert.c).
 */
#ifndef SLUICE_CFG_INT_H
#define SLUICE_CFG_INT_H

#include <stddef.h>

/* s[0..n) quoted, escaped and cut after 64 bytes, for an error message; returns buf. */
const char *cfg_show_text(const char *s, size_t n, char *buf, size_t size);

#endif
