/*
 * daemon_services -- what the services are given from a loaded configuration: each
 * service's part of it (daemon_services_*_conf(), the milter's handler) and the sessions'
 * limits, at start and at each reload alike; and the rule set they run now, for the
 * control handlers.
 *
 * Pure translations of a configuration, but for daemon_services_limits(), which sets the
 * services' limits (main thread), and daemon_services_rules(), which reads the running
 * configuration under cfg_lock (any thread).  Calls nothing of the daemon's other rooms.
 */
#include <pthread.h>
#include <stdint.h>

#include "daemon_int.h"
#include "engine.h"
#include "fd_plan.h"
#include "milter_policy.h"
#include "milter_static.h"
#include "policy.h"

void daemon_services_limits(struct daemon *d, const struct sluice_config *c)
{
	struct service_limits lim = {
		.max_sessions = c->milter.max_sessions,
		.idle_timeout_ms = (uint64_t)c->milter.idle_timeout_ms,
		.command_timeout_ms = (uint64_t)c->milter.command_timeout_ms,
		.max_input = c->milter.max_packet + 65536,
	};
	if (d->milter)
		service_set_limits(d->milter, &lim);
	if (d->policy) {
		struct service_limits pl = {
			.max_sessions = c->policy.max_sessions,
			.idle_timeout_ms = (uint64_t)c->policy.idle_timeout_ms,
			.command_timeout_ms = (uint64_t)c->policy.command_timeout_ms,
			.max_input = c->policy.max_request + 4096,
		};
		service_set_limits(d->policy, &pl);
	}
	if (d->intake) {
		struct service_limits il = {
			.max_sessions = c->intake.max_sessions,
			.idle_timeout_ms = (uint64_t)c->intake.idle_timeout_ms,
			.command_timeout_ms = (uint64_t)c->intake.command_timeout_ms,
			.max_input = 256 * 1024,
			.fds_per_session = FD_PLAN_INTAKE_SESSION,
		};
		service_set_limits(d->intake, &il);
	}
	if (d->control) {
		/* FD_PLAN_CONTROL_SESSIONS: the reserve holds them */
		struct service_limits cl = { .max_sessions = FD_PLAN_CONTROL_SESSIONS,
					     .idle_timeout_ms = 60 * 1000,
					     .command_timeout_ms = 10 * 1000,
					     .max_input = 64 * 1024,
					     .reserved = true };
		service_set_limits(d->control, &cl);
	}
}

struct milter_service_conf daemon_services_milter_conf(const struct sluice_config *c)
{
	return (struct milter_service_conf){ .max_packet = c->milter.max_packet,
					     .max_macros = 256 * 1024 };
}

struct milter_handler *daemon_services_milter_handler(struct sluice_config *c)
{
	struct daemon_config *dc = daemon_config_of(c);
	if (dc->milter_static || (policy_rule_count(dc->rules) == 0 &&
				  !policy_has_classes(dc->rules)))
		return milter_static_new(&dc->milter_handler);
	return milter_policy_new(dc->rules);
}

struct pfpolicy_conf daemon_services_pfpolicy_conf(const struct sluice_config *c)
{
	return (struct pfpolicy_conf){ .max_request = c->policy.max_request };
}

struct intake_conf daemon_services_intake_conf(const struct sluice_config *c)
{
	return (struct intake_conf){
		.allow = c->intake.allow,
		.nallow = c->intake.nallow,
		.max_message_size = c->intake.max_message_size,
		.min_free = c->queue.min_free,
		.max_recipients = c->intake.max_recipients,
		.max_errors = c->intake.max_errors,
		.max_line = c->intake.max_line_length,
		.reject_bare_newline = c->intake.bare_newline == INTAKE_BARE_REJECT,
		.hostname = c->intake.hostname,
		/* command_timeout, and a second per data_min_rate bytes, within data_timeout;
		 * or with no rate, data_timeout */
		.data = { .base_ms = (uint64_t)(c->intake.data_min_rate ?
						c->intake.command_timeout_ms :
						c->intake.data_timeout_ms),
			  .min_rate = c->intake.data_min_rate,
			  .max_ms = (uint64_t)c->intake.data_timeout_ms },
		.line = { .base_ms = (uint64_t)c->intake.command_timeout_ms,
			  .max_ms = (uint64_t)c->intake.command_timeout_ms },
	};
}

struct policy *daemon_services_rules(struct daemon *d)
{
	pthread_mutex_lock(&d->cfg_lock);
	struct policy *p = policy_ref(daemon_config_of(d->cfg)->rules);
	pthread_mutex_unlock(&d->cfg_lock);
	return p;
}
