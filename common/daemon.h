/*
 * daemon.h — the body of pdserve-prefill and pdserve-decode (DESIGN.md §1, §2, §2a): flags, model
 * load (common/engine.h: the compute thread), the HTTP surface of API.md
 * (common/base/http_server.h, common/api.h), the UCX transfer engine registered on the KV pool, and
 * the gRPC bootstrap (prefill: server on --disaggregation-bootstrap-port; decode: one client per
 * prefill it is sent to), all on one libuv loop. The two roles share everything but their request
 * life, which each role's struct pd_role and engine ops (prefill/, decode/) carry:
 *
 *  prefill: HTTP body → tokens → engine ADD (bootstrap queue); decode's Transfer for the room
 *           (before or after the body) → BOOTSTRAPPED; engine SENDs → room_send, the last with
 *           room_finish carrying the first token; the room's end → XFER_END → engine END →
 *           a small JSON answer (or error) the router drains.
 *  decode:  HTTP body → tokens → engine ADD (prealloc); ADMIT → Transfer(room, pages) to the
 *           prefill at bootstrap_host:bootstrap_port; the done notice streams the first token and
 *           → XFER_END; then one TOKEN per step, detokenized and streamed here (stop strings are
 *           matched here and end the request); END → the final answer.
 *
 * Colocated (pdserve-decode --disaggregation-mode null): no transfer engine, no bootstrap; the
 * daemon draws each request's room itself (bootstrap fields in a body are ignored, as SGLang
 * ignores them without disaggregation) and its engine prefills and decodes in mixed steps.
 *
 * Requests are found by room (one live request per room on each side) and by rid for
 * /abort_request. A client that goes away aborts its request (on prefill also the room, which
 * fails the decode side). SIGTERM/SIGINT: stop accepting, let requests finish until
 * --shutdown-timeout, then fail what is left, exit 0. Only main() exits.
 */
#ifndef PD_DAEMON_H
#define PD_DAEMON_H

#include "common/engine.h"

/* What a role adds to the daemon (common/daemon_internal.h): pd_prefill_role (prefill/role.c),
 * pd_decode_role (decode/role.c, which serves colocated with --disaggregation-mode null). */
struct pd_role;

/* Runs a daemon of role with argv; returns the process exit code (0 after a clean shutdown, 2
 * for bad flags, 1 when it could not start). */
int pd_daemon_main(const struct pd_role *role, int argc, char **argv);

#endif
