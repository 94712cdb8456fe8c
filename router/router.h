/*
 * router.h — pdserve-router's core: the worker registry with health and load polling, and the
 * life of a client request (DESIGN.md §2, router paragraph): pick a prefill (policy) and a decode
 * (least load), add the bootstrap fields, send the same body to both at once, stream decode's
 * answer to the client, drain prefill's; prefill error → abort decode + 502; client gone → abort
 * both; a worker unreachable before any byte went to the client → out of rotation; a request
 * that failed before the client saw a byte is retried on another pair (--retry-*), and a worker
 * that keeps failing has its circuit opened (breaker.h, --cb-*). Decode's stream is read only as
 * fast as the client takes it (backpressure).
 *
 * Workers are the static --prefill/--decode ones plus those --prefill-dns/--decode-dns names
 * resolve to, re-resolved periodically: new addresses join once /health answers, vanished ones
 * drain (no new requests; in-flight ones finish). GET /workers lists them.
 *
 * Everything runs on one libuv loop thread. The router owns its HTTP server (common/
 * http_server), its upstream client and the per-request state; pd_router_shutdown closes their
 * handles and pd_router_free releases the memory.
 */
#ifndef PD_ROUTER_ROUTER_H
#define PD_ROUTER_ROUTER_H

#include <stdint.h>
#include <uv.h>

#include "router/config.h"

struct pd_router;

typedef void (*pd_router_done_fn)(struct pd_router *rt, void *ud);

/* Starts listening and health-checking on loop. cfg must outlive the router. On failure *out is
 * still set and holds loop handles: the process is meant to exit. */
int pd_router_new(uv_loop_t *loop, const struct pd_router_config *cfg, struct pd_router **out);
/* The port it listens on (the real one when --port 0). */
int pd_router_port(const struct pd_router *rt);
/* Graceful stop: no new connections (requests on open ones and /health get 503); requests in
 * flight may finish for timeout_ms. Then the rest are aborted on their workers and their clients
 * get an error (a stream: one error event and [DONE]); a client that does not take it is cut 1 s
 * later. Once the aborts went out (at most 2 s more) every handle is closed and done runs; then
 * call pd_router_free. A second call aborts what is still in flight at once. */
void pd_router_shutdown(struct pd_router *rt, uint64_t timeout_ms, pd_router_done_fn done,
                        void *ud);
/* After done. NULL is fine. */
void pd_router_free(struct pd_router *rt);

#endif
