/*
 * daemon_internal.h — what daemon.c (the loop, the request table, generation requests, the
 * transfer and bootstrap events) and daemon_http.c (the endpoints beyond generation: health,
 * server and model info, loads, metrics, abort, flush, tokenize) share: the daemon's state and
 * its request records. Internal to those two files.
 */
#ifndef PD_DAEMON_INTERNAL_H
#define PD_DAEMON_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "common/api.h"
#include "common/base/http_server.h"
#include "common/base/room_map.h"
#include "common/bootstrap.h"
#include "model/devmem.h"
#include "common/engine.h"
#include "common/grpc_bridge.h"
#include "common/serve_metrics.h"
#include "common/server_args.h"
#include "common/xfer.h"
#include "model/jinja/chat_template.h"
#include "model/tokenizer/tokenizer.h"

#define MAX_CLIENTS 64       /* distinct prefills one decode talks to */
#define MAX_EARLY_ROOMS 4096 /* prefill: Transfers that came before their HTTP body */
#define MAX_PROBES 16        /* /health_generate calls waiting for the compute thread */
#define PROBE_TIMEOUT_S 20.0 /* ... before they answer 503 (SGLang waits 20 s too) */

struct dgroup;

struct dreq {
    uint64_t room;
    int32_t slot;
    struct dgroup *grp; /* fan-out (batch / n > 1): the group answering the client; else NULL */
    int sub;            /* index in grp: prompt * n + sample */
    char rid[96];
    char id[64]; /* response id: "chatcmpl-…" / "cmpl-…" / rid */
    struct pd_http_req *http;
    struct pd_api_request api;
    struct pd_engine_req *ereq; /* before ADD: ours; after: the engine's until END */
    int32_t n_prompt;
    double t_start;
    int64_t created;
    /* metrics (serve_metrics.h says what each timing measures) */
    double t_last_token;   /* decode: the last output token reached the client's connection */
    double t_waiting;      /* prefill: entered the waiting queue (its Transfer arrived) */
    double t_xfer;         /* prefill: first pages posted; decode: Transfer sent */
    double xfer_bytes;     /* prefill: bytes posted */
    bool ending;           /* end_request runs: room endings it causes are not failures */
    bool bootstrap_failed; /* decode: the Transfer could not be placed or was refused */
    bool xfer_failed;      /* the room ended with a failure */
    /* decode output */
    int32_t *out_ids;
    int n_out;
    size_t cap_out;
    struct pd_sample *lps; /* [max_new_tokens] with return_logprob (decode), else NULL */
    int lp_sent;           /* entries already in stream chunks (OpenAI: deltas) */
    /* prompt logprobs (prefill and colocated), the engine request's (in_lp): readable once
     * in_lp_ready (the first output token's event came: the engine wrote them all before) */
    const struct pd_sample *in_lp;
    int n_in_lp;
    bool in_lp_ready, in_lp_sent; /* sent: a completions stream chunk carried them */
    bool prompt_only;             /* max_tokens 0: the prompt's logprobs; no output token */
    struct pd_detok *detok;
    char *text;
    size_t text_len, text_cap, sent_len;
    size_t echo_len; /* completions echo: text starts with the prompt's (stop strings skip it) */
    int finish;      /* enum pd_api_finish once known */
    int32_t matched_token;
    int matched_stop; /* index into api.stop, -1 */
    bool streaming, first_chunk_sent;
    bool stopped_here; /* a stop string ended it: the engine's END is a formality */
    /* transfer */
    bool bootstrapped; /* prefill: Transfer arrived */
    bool xfer_live;    /* decode: room handed to the bootstrap client, not ended */
    pd_bootstrap_client_t *client;
    int cached_tokens;
    int fail_status;
    char fail_msg[256];
    bool aborted; /* by the user (abort_request) */
};

/* One client request cut into sub-requests (pd_api_split): each sub-request is a dreq of its
 * own (room, rid, engine request) whose http is the group's while the group answers; the group
 * renders the merged answer once every sub-request answered, or fails the whole request at the
 * first failure (the others are aborted). Freed when its last sub-request is. */
struct dgroup {
    struct pd_http_req *http; /* NULL once answered or the client left */
    enum pd_api_kind kind;
    int count, n;
    int refs;     /* sub-requests not yet freed */
    int answered; /* sub-requests whose answer is in */
    bool batch, streaming, include_usage;
    struct dreq **subs; /* [count]; an entry is NULL once that dreq is freed */
    char **bodies;      /* [count] non-streamed answers */
    int prompt_tokens, completion_tokens, cached_tokens; /* streamed usage */
    char rid[96]; /* the client's rid (abort_request), "" if none */
    char id[64];
    int64_t created;
};

struct early_room {
    uint64_t room;
    double t;
};

/* A /health_generate call waiting for its PROBE event; http NULL once the caller left. */
struct probe {
    uint64_t id; /* 0: slot free */
    struct pd_http_req *http;
    double t;
};

struct client_slot {
    char target[300];
    pd_bootstrap_client_t *c;
};

struct pd_daemon_state {
    int role;
    bool coloc;       /* pdserve-decode --disaggregation-mode null: prefill and decode here */
    bool mixed_chunk; /* colocated: prefill chunks and decode tokens in one step */
    bool disable_mixed_flag;
    double conservativeness; /* decode roles: SGLang's --schedule-conservativeness */
    uint64_t room_seq;       /* colocated: rooms are drawn here */
    struct pd_server_args args;
    double bootstrap_timeout, waiting_timeout, shutdown_timeout;
    const char *cluster_key_path, *api_key;
    uint8_t key[PD_CLUSTER_KEY_MAX];
    size_t key_len;

    uv_loop_t loop;
    uv_signal_t sigterm, sigint;
    uv_timer_t tick;
    struct pd_engine *eng;
    struct pd_engine_info info;
    struct pd_tokenizer *tok;
    struct pd_chat_template *chat;
    struct pd_http_server *http;
    pd_grpc_bridge_t *bridge;
    pd_xfer_t *x;
    struct pd_devmem *dm; /* --device cuda: the transfer's copies (freed after the loop) */
    pd_bootstrap_server_t *bserver;
    struct client_slot clients[MAX_CLIENTS];
    int n_clients;
    struct pd_bootstrap_layout layout;
    char node_id[64];
    char transport[128];

    struct pd_room_map rooms;
    struct dreq **reqs; /* [cap] */
    int32_t *free_slots;
    int32_t n_free, cap, n_live;
    struct early_room early[MAX_EARLY_ROOMS];
    int n_early;
    struct probe probes[MAX_PROBES];
    uint64_t probe_seq;
    int64_t n_probe_ok, n_probe_busy, n_probe_failed;

    bool ready, stopping, http_listening;
    double stop_deadline;
    int exit_code;
    uint64_t id_seq;
    struct pd_serve_metrics *sm;
};

static inline double now_s(void) {
    return (double)uv_hrtime() / 1e9;
}

/* daemon.c: the live request of a client's rid (NULL: none); its abort (user: by the client). */
struct dreq *pd__daemon_find_rid(const char *rid);
void pd__daemon_abort(struct dreq *r, bool user);

/* daemon_http.c */
void pd__daemon_respond_error(struct pd_http_req *h, int status, const char *type,
                              const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* json (heap, pd_free'd here) as the answer; NULL: a 500 (rendering ran out of memory) */
void pd__daemon_respond_json(struct pd_http_req *h, int status, char *json);
/* Registers every endpoint; the handlers get d. */
int pd__daemon_route(struct pd_daemon_state *d);
/* /health_generate: the compute thread's answer to probe id, and the probes that waited too
 * long (all: every probe, at shutdown). */
void pd__daemon_probe_done(struct pd_daemon_state *d, uint64_t id, int status, int32_t token);
void pd__daemon_probes_expire(struct pd_daemon_state *d, double now, bool all);

#endif
