/*
 * role.h — the prefill daemon's role: prefill/main.c hands &pd_prefill_role to
 * pd_daemon_main (common/daemon.h).
 */
#ifndef PD_PREFILL_ROLE_H
#define PD_PREFILL_ROLE_H

#include "common/daemon.h"
#include "common/serve_metrics.h"

extern const struct pd_role pd_prefill_role;
/* Its /metrics series beyond the shared ones (common/serve_metrics.h). */
extern const struct pd_serve_metrics_role pd_prefill_metrics;

#endif
