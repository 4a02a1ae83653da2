/* control_service -- the control socket service (see control_service.c). */
#ifndef SLUICE_CONTROL_SERVICE_H
#define SLUICE_CONTROL_SERVICE_H

#include "engine.h"

struct daemon;
struct service *control_service_new(struct engine *e, struct daemon *d);

#endif
