/*
 * router.h — pdserve-router's core: the worker registry with health and load polling, and the
 * life of a client request (DESIGN.md §2, router paragraph): pick a prefill (policy) and a decode
 * (least load), add the bootstrap fields, send the same body to both at once, stream decode's
 * answer to the client, drain prefill's; prefill error → abort decode + 502; client gone → abort
 * both; a worker unreachable before any byte went to the client → out of rotation, retry once on
 * another pair.
 *
 * Everything runs on one libuv loop thread. The router owns its front (HTTP server), its upstream
 * client and the per-request state; pd_router_free tears them down.
 */
#ifndef PD_ROUTER_ROUTER_H
#define PD_ROUTER_ROUTER_H

#include <uv.h>

#include "router/config.h"

struct pd_router;

/* Starts listening and health-checking on loop. cfg must outlive the router. */
int pd_router_new(uv_loop_t *loop, const struct pd_router_config *cfg, struct pd_router **out);
/* The port it listens on (the real one when --port 0). */
int pd_router_port(const struct pd_router *rt);
/* Stops accepting, cancels what is in flight (clients get an error), closes handles; the loop
 * then runs to completion and the router is freed. */
void pd_router_shutdown(struct pd_router *rt);

#endif
