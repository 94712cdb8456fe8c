/*
 * bootstrap.h — the control plane between a decode and a prefill daemon (DESIGN.md §1, §3):
 * the prefill serves Pair/Transfer/Abort/Health on its bootstrap port, the decode calls it, and
 * both wire what they learn into their transfer engines (common/xfer.h).
 *
 * Server (prefill, prefill/bootstrap_server.h). Every call's cluster key is checked first (wrong or
 * missing → PERMISSION_DENIED, a log line, no state change); requests are parsed with protobuf-c
 * (malformed → INVALID_ARGUMENT); Pair checks the layout (FAILED_PRECONDITION naming the field)
 * and connects an endpoint to the decode's pool (a decode already paired pairs again only when it
 * holds no endpoint to us any more: ours is closed and replaced); Transfer from a decode that is
 * not paired is NOT_FOUND (the decode closes its endpoint and pairs again), else it adds the room
 * to the engine, which checks every destination page (OUT_OF_RANGE / INVALID_ARGUMENT) and that
 * the room id is new (ALREADY_EXISTS); Abort aborts the room in the engine (its failed notice
 * follows over UCX).
 *
 * Client (decode, decode/bootstrap_client.h). Pairs on first use (queueing rooms meanwhile) and
 * connects back to the prefill's worker so that a dead prefill fails the rooms; a room enters the
 * engine before its Transfer is sent, so a notice can never arrive for an unknown room. A room that
 * never reached the engine ends through on_room_rejected; every other ending comes from the
 * engine's on_room_end. Every RPC carries a deadline.
 */
#ifndef PD_BOOTSTRAP_H
#define PD_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/grpc_bridge.h"
#include "common/xfer.h"

struct pd_flagset;
struct pd_flag;

#define PD_CLUSTER_KEY_MAX 256 /* bytes */
#define PD_BOOTSTRAP_DEADLINE_MS 5000

/* What both KV pools must agree on (bootstrap.proto Layout). */
struct pd_bootstrap_layout {
    char model[128]; /* fingerprint: architecture, vocab, layers, total kv heads, head dim */
    uint32_t layers;
    uint32_t kv_heads; /* per tp rank */
    uint32_t head_dim;
    uint32_t page_size; /* tokens */
    char dtype[16];
    uint32_t tp_rank;
    uint32_t tp_size;
    uint64_t page_bytes;     /* one page, all layers, K and V, every rank */
    uint32_t kv_heads_total; /* the model's; 0: a peer that predates heterogeneous tp */
};

/* Compares two layouts; PD_EMISMATCH naming the first differing field ("layout mismatch:
 * head_dim: prefill 64, decode 128"). The model-level fields must agree (layers, total kv heads,
 * head_dim, page_size, dtype, then the fingerprint); tp_size may differ when both sides give
 * their total kv heads (the transfer regroups the heads, common/xfer.h), and with equal tp_size
 * the per-rank kv_heads and page_bytes must agree too. */
int pd_bootstrap_layout_check(const struct pd_bootstrap_layout *prefill,
                              const struct pd_bootstrap_layout *decode);

/* --cluster-key FILE; the key is the file's content without a trailing newline. Without the
 * flag the environment variable PDSERVE_CLUSTER_KEY is used; neither → empty key (a warning at
 * start: the bootstrap port then trusts anyone who can reach it). */
struct pd_flag *pd_flag_cluster_key(struct pd_flagset *fs, const char **path);
int pd_cluster_key_load(const char *path, uint8_t key[PD_CLUSTER_KEY_MAX], size_t *len);

/* Helpers that encode requests for tests and tools; caller frees *out with pd_free. */
int pd_bootstrap_encode_transfer(const uint8_t *key, size_t key_len, uint64_t room,
                                 const char *decode_id, const uint32_t *pages, uint32_t n,
                                 uint64_t pair_id, uint8_t **out, size_t *len);
int pd_bootstrap_encode_abort(const uint8_t *key, size_t key_len, uint64_t room,
                              const char *decode_id, uint64_t pair_id, uint8_t **out, size_t *len);
int pd_bootstrap_encode_health(const uint8_t *key, size_t key_len, uint8_t **out, size_t *len);
/* An AbortReply's found (the prefill had the room live and ended it); PD_EINVAL if malformed. */
int pd_bootstrap_decode_abort_reply(const uint8_t *reply, size_t len, bool *found);

#define PD_BOOTSTRAP_METHOD_PAIR "/pdserve.v1.Bootstrap/Pair"
#define PD_BOOTSTRAP_METHOD_TRANSFER "/pdserve.v1.Bootstrap/Transfer"
#define PD_BOOTSTRAP_METHOD_ABORT "/pdserve.v1.Bootstrap/Abort"
#define PD_BOOTSTRAP_METHOD_HEALTH "/pdserve.v1.Bootstrap/Health"

/* Transfer and Abort as calls over the pair's UCX endpoints (pd_xfer_call, method numbers
 * below): the same protobuf request and reply as the gRPC methods, served by the same code, for
 * a prefill that says so at Pair (PairReply.serves_ucx_calls). A room's control messages then
 * cost an active message each way instead of a gRPC call: the gRPC threads' CPU per request went
 * from 0.23 ms (prefill) and 0.13 ms (decode) to 0.02 and 0.01 (2-core VM, 1,024-token prompts),
 * most of it spent beside the prefill's forward pass. Calls carry no key: the endpoint is the
 * pair's, which proved it at Pair. They go that way only while the decode's gRPC channel to the
 * prefill is connected (bootstrap_client.c over_ucx): a prefill that died closed it at once,
 * while its UCX endpoint may look alive for a keepalive interval, and a Transfer over gRPC
 * reaches whoever serves the address now (NOT_FOUND from a restarted prefill: pair again). A call
 * the prefill cannot answer (it holds no endpoint to this decode any more) ends at the deadline;
 * the decode then closes its endpoint and pairs again. */
enum pd_bootstrap_call {
    PD_BOOTSTRAP_CALL_TRANSFER = 1,
    PD_BOOTSTRAP_CALL_ABORT = 2,
};

#endif
