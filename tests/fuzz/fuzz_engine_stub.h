/*
 * fuzz_engine_stub -- the harness's side of the fake engine session API that
 * fuzz_milter runs the real milter session code on (see fuzz_engine_stub.c).
 */
#ifndef SLUICE_FUZZ_ENGINE_STUB_H
#define SLUICE_FUZZ_ENGINE_STUB_H

#include <stdbool.h>
#include <stddef.h>

#include "engine.h"

void fuzz_service_free(struct service *svc);
struct session *fuzz_session_open(struct service *svc);
void fuzz_session_feed(struct session *s, const void *p, size_t n);
void fuzz_session_eof(struct session *s);
bool fuzz_session_ended(const struct session *s);
bool fuzz_session_protocol_error(const struct session *s);
bool fuzz_session_paused(const struct session *s);
struct evbuffer *fuzz_session_input(struct session *s);
struct evbuffer *fuzz_session_output(struct session *s);
void fuzz_session_free(struct session *s);

#endif
