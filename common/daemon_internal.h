/*
 * daemon_internal.h — what daemon.c (the loop, the request table, generation requests, the
 * transfer events), daemon_http.c (the endpoints beyond generation: health, server and model
 * info, loads, metrics, abort, flush, tokenize) and the roles (prefill/role.c, decode/role.c)
 * share: the daemon's state, its request records, and struct pd_role — what a role adds to the
 * shared daemon. common/ never asks which role runs: it calls the role's hooks.
 */
#ifndef PD_DAEMON_INTERNAL_H
#define PD_DAEMON_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "common/api.h"
#include "common/base/http_server.h"
#include "common/base/room_table.h"
#include "common/base/tls.h"
#include "common/bootstrap.h"
#include "model/devmem.h"
#include "common/engine.h"
#include "common/grpc_bridge.h"
#include "common/serve_metrics.h"
#include "common/server_args.h"
#include "common/xfer.h"
#include "common/base/flags.h"
#include "model/jinja/chat_template.h"
#include "model/tokenizer/tokenizer.h"

#define MAX_PROBES 16        /* /health_generate calls waiting for the compute thread */
#define PROBE_TIMEOUT_S 20.0 /* ... before they answer 503 (SGLang waits 20 s too) */

struct pd_daemon_group;

struct pd_daemon_req {
    uint64_t room;
    int32_t slot;
    struct pd_daemon_group
        *grp; /* fan-out (batch / n > 1): the group answering the client; else NULL */
    int sub;  /* index in grp: prompt * n + sample */
    char rid[96];
    char id[64]; /* response id: "chatcmpl-…" / "cmpl-…" / rid */
    struct pd_http_req *http;
    struct pd_api_request api;
    struct pd_engine_req *ereq; /* before ADD: ours; after: the engine's until END */
    int32_t n_prompt;
    double t_start;
    int64_t created;
    /* metrics (serve_metrics.h says what each timing measures) */
    double t_last_token; /* decode: the last output token reached the client's connection */
    double t_waiting;    /* entered the scheduler's waiting queue (queue time counts from it):
                            prefill when its Transfer arrived, decode and colocated on arrival */
    double t_xfer;       /* prefill: first pages posted; decode: Transfer sent */
    double xfer_bytes;   /* prefill: bytes posted */
    double t_kv;         /* decode: the done notice and every page in (0: not yet) */
    uint32_t sender_us[PD_XFER_NOTICE_STAGES]; /* decode: the prefill's spans (its notice) */
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
    bool given_up; /* decode: the engine gave the room up (QUIESCE): its transfer's end is moot */
    struct pd_bootstrap_client *client; /* decode: the client of the room's prefill */
    int cached_tokens;
    int fail_status;
    char fail_msg[256];
    bool aborted;      /* by the user (abort_request, or the client went away) */
    bool peer_aborted; /* decode: the prefill's user aborted the pair's request (its notice) */
};

/* One client request cut into sub-requests (pd_api_split): each sub-request is a pd_daemon_req of
 * its own (room, rid, engine request) whose http is the group's while the group answers; the group
 * renders the merged answer once every sub-request answered, or fails the whole request at the
 * first failure (the others are aborted). Freed when its last sub-request is. */
struct pd_daemon_group {
    struct pd_http_req *http; /* NULL once answered or the client left */
    enum pd_api_kind kind;
    int count, n;
    int refs;     /* sub-requests not yet freed */
    int answered; /* sub-requests whose answer is in */
    bool batch, streaming, include_usage;
    struct pd_daemon_req **subs; /* [count]; an entry is NULL once that request is freed */
    char **bodies;               /* [count] non-streamed answers */
    int prompt_tokens, completion_tokens, cached_tokens; /* streamed usage */
    char rid[96]; /* the client's rid (abort_request), "" if none */
    char id[64];
    int64_t created;
};

/* A /health_generate call waiting for its PROBE event; http NULL once the caller left. */
struct probe {
    uint64_t id; /* 0: slot free */
    struct pd_http_req *http;
    double t;
};

struct pd_daemon_state {
    const struct pd_role *role; /* the one running (decode's configure may pick colocated) */
    bool mixed_chunk;           /* colocated: prefill chunks and decode tokens in one step */
    bool disable_mixed_flag;
    double conservativeness; /* decode roles: SGLang's --schedule-conservativeness */
    uint64_t room_seq;       /* colocated: rooms are drawn here */
    struct pd_server_args args;
    double bootstrap_timeout, waiting_timeout, shutdown_timeout;
    bool eager_prefill; /* prefill: --eager-prefill */
    bool local_prefill; /* decode: --local-prefill (bodies without bootstrap fields taken) */
    /* --transfer-stall-timeout: the transfer engine counts as stuck (/health 503) while it has
     * operations outstanding and its progress count has not moved for this long (0: never) */
    double xfer_stall_timeout;
    uint64_t xfer_progress;       /* the engine's progress count when last seen to move */
    double xfer_progress_at;      /* when that was (or when the engine last had nothing held) */
    uint32_t xfer_stalled_ops;    /* > 0: stuck, with this many operations outstanding */
    struct pd_xfer_doctor doctor; /* the transfer engine's self-check at start */
    const char *cluster_key_path, *api_key;
    int max_n;          /* --max-n: samples per prompt at most */
    int max_per_client; /* --max-concurrent-requests-per-client; 0 = unlimited */
    uint8_t key[PD_CLUSTER_KEY_MAX];
    size_t key_len;
    /* --ssl-*: the HTTP API over TLS with ssl_ctx (made at start, before the model loads, so a
     * bad file fails at once); prefill's bootstrap port and decode's calls to it (their roles) */
    struct pd_tls_flags tls;
    struct ssl_ctx_st *ssl_ctx; /* NULL: plain HTTP */

    /* a vision-language model: its processor and what placing images needs (NULL: text) */
    struct pd_daemon_vision *vision;

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
    struct pd_bootstrap_layout layout;
    char node_id[64];
    char transport[128];

    struct pd_room_table slots;  /* room → slot of reqs */
    struct pd_daemon_req **reqs; /* [cap] */
    int32_t cap, n_live;
    struct probe probes[MAX_PROBES];
    uint64_t probe_seq;
    int64_t n_probe_ok, n_probe_busy, n_probe_failed;

    bool ready, stopping, http_listening;
    double stop_deadline;
    int exit_code;
    uint64_t id_seq;
    struct pd_serve_metrics *sm;
};

/* ---- images (common/daemon_images.c) ---- */

/* d->vision for a vision-language model (its config.json and preprocessor_config.json); NULL
 * for a text-only one. */
int pd__daemon_vision_new(struct pd_daemon_state *d);
void pd__daemon_vision_free(struct pd_daemon_state *d);
/* Images a decoder may open: PIL's MAX_IMAGE_PIXELS (its decompression-bomb bound), checked
 * from the header before any pixel is allocated. */
#define PD_DAEMON_MAX_IMAGE_PIXELS 89478485u

/* A request's images, loaded: grids, patches (where encoded) and content hashes (of the
 * file's bytes and grid: both sides of PD compute the same), or why not (status 400/500,
 * err). */
struct pd_daemon_images {
    int n;
    struct pd_image_patches *p; /* [n] (the decode side of PD: none, only their grids) */
    int (*grid)[3];             /* [n] t, h, w in patches */
    uint8_t (*hash)[16];        /* [n] */
    int status;
    char err[512];
};
struct pd_token_ids;
/* Fetches (remote URLs, with --allow-image-urls), decodes, processes and hashes api's images.
 * Thread-safe: reads only api and d's settings (libuv's workers call it). */
int pd__daemon_load_images(const struct pd_daemon_state *d, const struct pd_api_request *api,
                           struct pd_daemon_images *li);
void pd__daemon_images_free(struct pd_daemon_images *li);
/* Loop thread: the prompt ids[] expanded around the loaded images (each placeholder repeated
 * per embedding, then filled with ids drawn from the image's content hash, so the prefix cache
 * never matches one image's pages for another's) and their M-RoPE positions planned into *mm,
 * which takes li's patches (the decode side of PD keeps none). A placeholder count that does not
 * match: 400 in e. */
int pd__daemon_place_images(struct pd_daemon_state *d, struct pd_api_request *api,
                            struct pd_token_ids *ids, struct pd_daemon_images *li,
                            struct pd_engine_mm **mm, struct pd_api_error *e);

/* What a role adds to the daemon. Hooks run on the loop thread; NULL: nothing to do. */
struct pd_role {
    const char *name;                /* "prefill", "decode", "colocated": logs, node id */
    const char *prog;                /* the binary: "pdserve-prefill" */
    const char *about;               /* its --help summary */
    int disaggregation_mode;         /* --disaggregation-mode's default (server_args.h) */
    const struct pd_engine_ops *ops; /* the compute thread's role (engine.h) */
    bool disaggregated;              /* requests carry bootstrap fields (api.h's config) */
    bool encodes_images;             /* runs the vision encoder (prefill, colocated); the decode
                                        side of PD gets the images' KV and only places them */
    const char *timeout_msg;         /* the answer to a request its scheduler timed out */

    /* flags: the role's own, registered after the shared ones; configure: after parsing, the
     * role that runs (decode: colocated for --disaggregation-mode null), or NULL after
     * printing why the flags do not fit (exit 2) */
    void (*flags)(struct pd_flagset *fs, struct pd_daemon_state *d);
    const struct pd_role *(*configure)(struct pd_daemon_state *d);
    /* start: after the engine, before it runs (the transfer engine, the bootstrap side; sets
     * d->transport); ready: the READY line on stdout; stop: at shutdown, after the engine
     * stopped and before the transfer engine is freed; tick: every 100 ms */
    int (*start)(struct pd_daemon_state *d);
    void (*ready)(struct pd_daemon_state *d);
    void (*stop)(struct pd_daemon_state *d);
    void (*tick)(struct pd_daemon_state *d, double now);

    /* a request: room: its room (NULL: the body's bootstrap_room); prepare: the role's part of
     * it once its engine request exists (e says why not); submitted: the engine has it;
     * aborting: the daemon aborts it (user, client gone, shutdown) */
    uint64_t (*room)(struct pd_daemon_state *d, struct pd_daemon_req *r);
    int (*prepare)(struct pd_daemon_state *d, struct pd_daemon_req *r, struct pd_api_error *e);
    void (*submitted)(struct pd_daemon_state *d, struct pd_daemon_req *r);
    void (*aborting)(struct pd_daemon_state *d, struct pd_daemon_req *r);

    /* engine events (r NULL: no live request of the event's): SEND, ADMIT, QUIESCE; ending:
     * the END of r with its final reason, before it is counted and answered */
    void (*on_send)(struct pd_daemon_state *d, struct pd_daemon_req *r,
                    const struct pd_engine_event *ev);
    void (*on_admit)(struct pd_daemon_state *d, struct pd_daemon_req *r,
                     const struct pd_engine_event *ev);
    void (*on_quiesce)(struct pd_daemon_state *d, struct pd_daemon_req *r,
                       const struct pd_engine_event *ev);
    void (*ending)(struct pd_daemon_state *d, struct pd_daemon_req *r,
                   const struct pd_engine_event *ev, int reason);

    /* transfer engine events: a room ended (r: its live request or NULL; n: the done notice,
     * decode side only), a peer's endpoint closed */
    void (*room_end)(struct pd_daemon_state *d, struct pd_daemon_req *r, uint64_t room, int status,
                     const struct pd_xfer_notice *n);
    void (*peer_closed)(struct pd_daemon_state *d, pd_xfer_peer_t *p);
    /* a call from a peer over its endpoint (prefill: the decode's Transfer and Abort); NULL:
     * the engine answers every call PD_EUNSUPPORTED */
    void (*xfer_call)(struct pd_daemon_state *d, pd_xfer_peer_t *p, const struct pd_xfer_ctl *call);

    /* /server_info: the role's queues (into queues) and facts (into extra) */
    void (*server_info)(struct pd_daemon_state *d, const struct pd_engine_stats *s,
                        struct cJSON *extra, struct cJSON *queues);
    /* /metrics: its series beyond the shared ones, and its requests running and waiting (also
     * /get_loads) */
    const struct pd_serve_metrics_role *metrics;
};

static inline double now_s(void) {
    return (double)uv_hrtime() / 1e9;
}

/* daemon.c: the live request of a client's rid or of a room (NULL: none); its abort (user: by
 * the client). */
struct pd_daemon_req *pd__daemon_find_rid(const char *rid);
struct pd_daemon_req *pd__daemon_find_room(uint64_t room);
void pd__daemon_abort(struct pd_daemon_req *r, bool user);
/* daemon.c: one more output token of r (decode and colocated; index: its output position);
 * smp: the engine's record with top logprobs, or NULL. */
void pd__daemon_take_token(struct pd_daemon_req *r, int32_t token, int index, int finish,
                           float logprob, const struct pd_sample *smp);
/* daemon.c: s[0..n) appended to r's answer text. PD_ENOMEM. */
int pd__daemon_append_text(struct pd_daemon_req *r, const char *s, size_t n);
/* daemon.c: prompt logprobs for r when its body asks for them (prefill, colocated: where the
 * prompt is prefilled); e says why not. */
int pd__daemon_prepare_input_logprobs(struct pd_daemon_req *r, struct pd_api_error *e);
/* daemon.c: "host:port" for gRPC (an IPv6 host in brackets). */
void pd__daemon_host_port(char *out, size_t size, const char *host, int port);
/* daemon.c: the transfer engine on the KV pool and the layout both sides must agree on
 * (d->x, d->layout, d->node_id, d->key, d->transport): what disaggregation needs beyond the
 * engine, before the role's bootstrap side. */
int pd__daemon_start_transfer(struct pd_daemon_state *d);

/* daemon_timeline.c: the hand-over's stages (serve_metrics.h). Prefill, as its last pages and
 * notice are posted: its spans into us (the notice's sender_us) and its histograms. Decode: the
 * KV complete (its notice), then its first token to the client: its histograms and debug line. */
void pd__timeline_prefill(struct pd_daemon_state *d, struct pd_daemon_req *r, double t_sched,
                          double now, uint32_t us[PD_XFER_NOTICE_STAGES]);
void pd__timeline_decode_kv(struct pd_daemon_req *r, const struct pd_xfer_notice *n, double now);
void pd__timeline_decode_first(struct pd_daemon_state *d, struct pd_daemon_req *r, double now);
/* /server_info's "handover": count and mean of each stage observed here */
void pd__timeline_server_info(const struct pd_daemon_state *d, struct cJSON *extra);

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
/* Every tick: whether the transfer engine is stuck (see xfer_stall_timeout). */
void pd__daemon_xfer_watch(struct pd_daemon_state *d, double now);

#endif
