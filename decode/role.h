/*
 * role.h — the decode daemon's role: decode/main.c hands &pd_decode_role to pd_daemon_main
 * (common/daemon.h); with --disaggregation-mode null it serves colocated.
 */
#ifndef PD_DECODE_ROLE_H
#define PD_DECODE_ROLE_H

#include "common/daemon.h"
#include "common/serve_metrics.h"

extern const struct pd_role pd_decode_role;
/* Its /metrics series beyond the shared ones (common/serve_metrics.h). */
extern const struct pd_serve_metrics_role pd_decode_metrics;

#endif
