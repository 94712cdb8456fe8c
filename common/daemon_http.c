/*
 * daemon_http.c — the daemons' endpoints beyond generation (API.md): /health and
 * /health_generate, /v1/models, /server_info, /model_info, /get_load, /v1/loads, /metrics,
 * /flush_cache, /abort_request, /tokenize, /detokenize, and the error answers every endpoint
 * gives. Loop thread only, as daemon.c; the generation endpoints stay there with the request
 * life they start.
 */
#include "common/daemon_internal.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/metrics.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void pd__daemon_respond_error(struct pd_http_req *h, int status, const char *type,
                              const char *param, const char *fmt, ...) {
    struct pd_api_error e;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pd_api_error_set(&e, status, type, param, NULL, "%s", msg);
    pd_http_respond_error(h, &e);
}

void pd__daemon_respond_json(struct pd_http_req *h, int status, char *json) {
    if (!json) {
        pd__daemon_respond_error(h, 500, "server_error", NULL,
                                 "out of memory rendering the response");
        return;
    }
    pd_http_respond_json(h, status, json);
    pd_free(json);
}

/* A wedged transfer engine must not look healthy (a decode whose pages never arrive, a prefill
 * whose writes never complete, while /health says 200 is what operators of the peers report):
 * the engine counts completed operations and received messages; while it holds operations and
 * that count stands still for --transfer-stall-timeout, /health answers 503 until it moves or
 * nothing is held any more. Checked every tick and at each /health. */
void pd__daemon_xfer_watch(struct pd_daemon_state *d, double now) {
    if (!d->x || d->xfer_stall_timeout <= 0)
        return;
    struct pd_xfer_info xi;
    pd_xfer_get_info(d->x, &xi);
    if (xi.outstanding == 0 || xi.progress != d->xfer_progress) {
        d->xfer_progress = xi.progress;
        d->xfer_progress_at = now;
        if (d->xfer_stalled_ops)
            pd_info("transfer engine moving again (%u operations outstanding)", xi.outstanding);
        d->xfer_stalled_ops = 0;
        return;
    }
    if (!d->xfer_stalled_ops && now - d->xfer_progress_at >= d->xfer_stall_timeout) {
        pd_warn("transfer engine stuck: %u operations outstanding and none completed for %.1f s "
                "(--transfer-stall-timeout); /health answers 503 until it moves",
                xi.outstanding, now - d->xfer_progress_at);
        d->xfer_stalled_ops = xi.outstanding;
    }
    if (d->xfer_stalled_ops)
        d->xfer_stalled_ops = xi.outstanding;
}

static void h_health(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    pd__daemon_xfer_watch(d, now_s());
    if (!d->ready || d->stopping)
        pd__daemon_respond_error(h, 503, "server_error", NULL, "not ready");
    else if (d->xfer_stalled_ops)
        pd__daemon_respond_error(h, 503, "server_error", NULL,
                                 "transfer engine stuck: %u operations outstanding and none "
                                 "completed for %.1f s (--transfer-stall-timeout %g)",
                                 d->xfer_stalled_ops, now_s() - d->xfer_progress_at,
                                 d->xfer_stall_timeout);
    else
        pd_http_respond(h, 200, "text/plain", "", 0);
}

/* /health_generate (SGLang: a real 1-token generation, 200 only if it worked). A daemon in
 * disaggregated mode cannot generate alone (a request needs its peer), so the compute thread
 * runs one token through the model on a free page instead, bypassing scheduler and transfer:
 * it proves the loop, the command queue, the compute thread and the model all work. A daemon
 * whose pool is full is busy serving and answers 200 without running it. */
static struct probe *probe_find(struct pd_daemon_state *d, uint64_t id) {
    for (int i = 0; i < MAX_PROBES; i++)
        if (d->probes[i].id == id)
            return &d->probes[i];
    return NULL;
}

static void probe_answer(struct probe *p, int status, const char *msg) {
    struct pd_http_req *h = p->http;
    p->id = 0;
    p->http = NULL;
    if (!h)
        return;
    if (status == 200)
        pd_http_respond(h, 200, "text/plain", "", 0);
    else
        pd__daemon_respond_error(h, status, "server_error", NULL, "health_generate: %s", msg);
}

static void on_probe_gone(struct pd_http_req *h, void *user) {
    (void)h;
    struct probe *p = user;
    p->http = NULL; /* the slot waits for its event (or the timeout) */
}

void pd__daemon_probe_done(struct pd_daemon_state *d, uint64_t id, int status, int32_t token) {
    struct probe *p = probe_find(d, id);
    if (status == PD_OK)
        d->n_probe_ok++;
    else if (status == PD_EFULL)
        d->n_probe_busy++;
    else
        d->n_probe_failed++;
    if (!p)
        return;
    pd_debug("health_generate: %s (token %d) in %.1f ms",
             status == PD_OK      ? "ok"
             : status == PD_EFULL ? "busy"
                                  : pd_status_str(status),
             (int)token, (now_s() - p->t) * 1e3);
    char msg[200];
    snprintf(msg, sizeof(msg), "the 1-token forward pass failed (%s)", pd_status_str(status));
    probe_answer(p, status == PD_OK || status == PD_EFULL ? 200 : 503, msg);
}

void pd__daemon_probes_expire(struct pd_daemon_state *d, double now, bool all) {
    for (int i = 0; i < MAX_PROBES; i++) {
        struct probe *p = &d->probes[i];
        if (!p->id)
            continue;
        if (all) {
            probe_answer(p, 503, "the daemon is shutting down");
        } else if (now - p->t >= PROBE_TIMEOUT_S) {
            d->n_probe_failed++;
            probe_answer(p, 503, "the compute thread did not answer within 20 s");
        }
    }
}

static void h_health_generate(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    if (!d->ready || d->stopping) {
        pd__daemon_respond_error(h, 503, "server_error", NULL, "not ready");
        return;
    }
    struct probe *p = probe_find(d, 0);
    if (!p) {
        pd__daemon_respond_error(
            h, 503, "server_error", NULL,
            "health_generate: %d probes already waiting for the compute thread", MAX_PROBES);
        return;
    }
    uint64_t id = ++d->probe_seq;
    if (pd_engine_submit(d->eng,
                         &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_PROBE, .room = id})) {
        pd__daemon_respond_error(h, 503, "server_error", NULL, "health_generate: %s",
                                 pd_error_msg());
        return;
    }
    *p = (struct probe){.id = id, .http = h, .t = now_s()};
    pd_http_req_on_gone(h, on_probe_gone, p);
}

static cJSON *body_json(struct pd_http_req *h) {
    size_t len;
    const char *b = pd_http_req_body(h, &len);
    return cJSON_ParseWithLength(b, len);
}

static void h_abort(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    cJSON *j = body_json(h);
    const cJSON *rid = j ? cJSON_GetObjectItemCaseSensitive(j, "rid") : NULL;
    if (!cJSON_IsString(rid)) {
        cJSON_Delete(j);
        pd__daemon_respond_error(h, 400, "invalid_request_error", "rid",
                                 "body must be {\"rid\": string}");
        return;
    }
    struct pd_daemon_req *r = pd__daemon_find_rid(rid->valuestring);
    if (r)
        pd__daemon_abort(r, true);
    for (int32_t i = 0; i < d->cap; i++) { /* a fanned-out request by its client's rid */
        struct pd_daemon_req *s = d->reqs[i];
        if (s && s != r && s->grp && s->grp->rid[0] && !s->ending &&
            strcmp(s->grp->rid, rid->valuestring) == 0) {
            pd__daemon_abort(s, true);
            r = s;
        }
    }
    pd_info("abort_request rid=%s %s", rid->valuestring, r ? "found" : "not found");
    cJSON_Delete(j);
    pd_http_respond_json(h, 200, r ? "{\"success\":true}" : "{\"success\":false}");
}

static void h_flush(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    pd_engine_submit(d->eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_FLUSH_CACHE});
    pd_http_respond(h, 200, "text/plain", "Cache flushed.\n", 15);
}

static void h_models(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    char *out = NULL;
    /* created = now, as SGLang's and vLLM's model cards say (0 reads as 1970 to a dashboard) */
    pd_api_render_models(d->args.served_model_name, d->args.model_path, (int64_t)time(NULL),
                         d->info.context_length, &out);
    pd__daemon_respond_json(h, 200, out);
}

static void h_model_info(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    char *out = NULL;
    const char *arch[1] = {d->info.architecture};
    pd_api_render_model_info(d->args.model_path, d->args.tokenizer_path, d->info.model_type, arch,
                             1, &out);
    pd__daemon_respond_json(h, 200, out);
}

static void h_server_info(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    struct pd_engine_stats s;
    pd_engine_stats(d->eng, &s);
    cJSON *extra = cJSON_CreateObject();
    cJSON *pool = cJSON_AddObjectToObject(extra, "kv_pool");
    cJSON_AddNumberToObject(pool, "num_pages", s.pages_total);
    cJSON_AddNumberToObject(pool, "free_pages", s.pages_free);
    cJSON_AddNumberToObject(pool, "used_pages", s.pages_used);
    cJSON_AddNumberToObject(pool, "cached_pages", s.pages_cached);
    cJSON_AddNumberToObject(pool, "page_size", d->info.page_size);
    cJSON_AddStringToObject(pool, "dtype", d->info.dtype);
    cJSON_AddNumberToObject(pool, "page_bytes", (double)d->info.page_bytes);
    cJSON_AddStringToObject(extra, "kv_cache_dtype", d->info.kv_cache_dtype);
    cJSON *q = cJSON_AddObjectToObject(extra, "queues");
    d->role->server_info(d, &s, extra, q);
    cJSON_AddNumberToObject(q, "draining", s.q_draining);
    if (d->x) { /* the transfer engine's own counters (loop thread, as every xfer call) */
        struct pd_xfer_info xi;
        pd_xfer_get_info(d->x, &xi);
        cJSON *t = cJSON_AddObjectToObject(extra, "kv_transfer");
        cJSON_AddNumberToObject(t, "live_rooms", xi.live_rooms);
        cJSON_AddNumberToObject(t, "live_peers", xi.live_peers);
        cJSON_AddNumberToObject(t, "outstanding_ops", xi.outstanding);
        cJSON_AddBoolToObject(t, "stuck", d->xfer_stalled_ops > 0);
        cJSON_AddNumberToObject(t, "stall_timeout", d->xfer_stall_timeout);
        const struct pd_xfer_doctor *dr = &d->doctor;
        cJSON *sd = cJSON_AddObjectToObject(t, "self_test");
        cJSON_AddStringToObject(sd, "ucx_version", dr->ucx_version);
        cJSON_AddStringToObject(sd, "transports", xi.transports ? xi.transports : "");
        cJSON_AddStringToObject(sd, "net_devices", xi.net_devices ? xi.net_devices : "");
        cJSON_AddStringToObject(sd, "lanes", dr->lanes);
        cJSON_AddStringToObject(sd, "path", dr->path ? dr->path : "");
        cJSON_AddNumberToObject(sd, "page_bytes", (double)dr->page_bytes);
        cJSON_AddNumberToObject(sd, "page_gbps", dr->page_gbps);
        cJSON_AddNumberToObject(sd, "room_bytes", (double)dr->room_bytes);
        cJSON_AddNumberToObject(sd, "room_gbps", dr->room_gbps);
        if (xi.rdma) {
            cJSON_AddStringToObject(sd, "tcp_lanes", dr->tcp_lanes);
            cJSON_AddNumberToObject(sd, "tcp_room_gbps", dr->tcp_room_gbps);
        }
        cJSON_AddNumberToObject(sd, "ms", dr->ms);
        cJSON_AddStringToObject(sd, "error", dr->error);
        cJSON_AddStringToObject(sd, "warning", dr->warning);
        cJSON_AddNumberToObject(t, "shards", xi.n_shards);
        cJSON_AddNumberToObject(t, "shard_page_bytes", (double)xi.shard_page_bytes);
        cJSON_AddNumberToObject(t, "page_bytes", (double)xi.page_bytes);
        cJSON_AddBoolToObject(t, "rdma", xi.rdma);
        cJSON_AddBoolToObject(t, "cuda_memory", xi.cuda_memory);
        cJSON_AddBoolToObject(t, "staged", xi.staged);
        cJSON_AddNumberToObject(t, "dropped_writes", (double)xi.dropped_writes);
        cJSON_AddNumberToObject(t, "staged_bytes", (double)xi.staged_bytes);
        cJSON_AddNumberToObject(t, "ipc_bytes", (double)xi.ipc_bytes);
        cJSON_AddNumberToObject(t, "recv_staged_bytes", (double)xi.recv_staged_bytes);
        cJSON_AddNumberToObject(t, "recv_copying_bytes", (double)xi.recv_copying_bytes);
        cJSON_AddNumberToObject(t, "recv_held", (double)xi.recv_held);
        cJSON_AddNumberToObject(t, "recv_waits", (double)xi.recv_waits);
    }
    pd__timeline_server_info(d, extra);
    cJSON_AddNumberToObject(extra, "live_requests", d->n_live);
    cJSON_AddNumberToObject(extra, "bootstrap_timeout", d->bootstrap_timeout);
    cJSON_AddNumberToObject(extra, "waiting_timeout", d->waiting_timeout);
    struct pd_api_runtime_info rt = {.version = PD_VERSION,
                                     .context_length = d->info.context_length,
                                     .max_total_tokens = d->info.n_pages * d->info.page_size,
                                     .num_pages = s.pages_total,
                                     .free_pages = s.pages_free + s.pages_cached,
                                     .transport = d->transport,
                                     .backend = d->info.backend,
                                     .extra = extra};
    char *out = NULL;
    pd_api_render_server_info(&d->args, &rt, &out);
    cJSON_Delete(extra);
    pd__daemon_respond_json(h, 200, out);
}

static int load_now(struct pd_daemon_state *d, struct pd_engine_stats *s) {
    pd_engine_stats(d->eng, s);
    return d->n_live;
}

static void h_get_load(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    struct pd_engine_stats s;
    char *out = NULL;
    pd_api_render_get_load(load_now(d, &s), d->local_prefill, &out);
    pd__daemon_respond_json(h, 200, out);
}

static void h_loads(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    struct pd_engine_stats s;
    load_now(d, &s);
    int32_t running, waiting;
    d->role->metrics->load(&s, &running, &waiting);
    struct pd_api_rank_load l = {.num_running_reqs = running,
                                 .num_waiting_reqs = waiting,
                                 .num_used_tokens = (int64_t)s.pages_used * d->info.page_size,
                                 .max_total_num_tokens =
                                     (int64_t)s.pages_total * d->info.page_size};
    char ts[40];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
    char *out = NULL;
    pd_api_render_loads(&l, 1, ts, &out);
    pd__daemon_respond_json(h, 200, out);
}

static void h_metrics(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    struct pd_engine_stats s;
    pd_engine_stats(d->eng, &s);
    const int64_t health[3] = {d->n_probe_ok, d->n_probe_busy, d->n_probe_failed};
    char *text = NULL;
    size_t len = 0;
    if (pd_serve_metrics_scrape(d->sm, &s, health, &text, &len) != PD_OK) {
        pd__daemon_respond_error(h, 500, "server_error", NULL, "%s", pd_error_msg());
        return;
    }
    pd_http_respond(h, 200, PD_METRICS_CONTENT_TYPE, text, len);
    pd_free(text);
}

static void h_tokenize(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    cJSON *j = body_json(h);
    const cJSON *p = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt") : NULL;
    if (!cJSON_IsString(p)) {
        cJSON_Delete(j);
        pd__daemon_respond_error(h, 400, "invalid_request_error", "prompt",
                                 "body must be {\"prompt\": string}");
        return;
    }
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(j, "add_special_tokens");
    struct pd_token_ids ids = {0};
    int rc = pd_tokenizer_encode(d->tok, p->valuestring, strlen(p->valuestring),
                                 cJSON_IsFalse(as) ? PD_TOK_PARSE_SPECIAL : PD_TOK_DEFAULT, &ids);
    cJSON_Delete(j);
    if (rc) {
        pd__daemon_respond_error(h, 400, "invalid_request_error", "prompt", "%s", pd_error_msg());
        return;
    }
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; i < ids.n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids.ids[i]));
    cJSON_AddNumberToObject(o, "count", (double)ids.n);
    cJSON_AddNumberToObject(o, "max_model_len", d->info.context_length);
    pd_token_ids_free(&ids);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    pd_http_respond_json(h, 200, s ? s : "{}");
    free(s);
}

static void h_detokenize(struct pd_http_req *h, void *ud) {
    struct pd_daemon_state *d = ud;
    cJSON *j = body_json(h);
    const cJSON *t = j ? cJSON_GetObjectItemCaseSensitive(j, "tokens") : NULL;
    if (!cJSON_IsArray(t)) {
        cJSON_Delete(j);
        pd__daemon_respond_error(h, 400, "invalid_request_error", "tokens",
                                 "body must be {\"tokens\": [int]}");
        return;
    }
    int n = cJSON_GetArraySize(t);
    int32_t *ids = pd_calloc((size_t)n + 1, sizeof(int32_t));
    int i = 0;
    const cJSON *it;
    bool ok = ids != NULL;
    cJSON_ArrayForEach(it, t) {
        if (!ok || !cJSON_IsNumber(it) || it->valuedouble < 0 ||
            it->valuedouble >= d->info.vocab_size) {
            ok = false;
            break;
        }
        ids[i++] = (int32_t)it->valuedouble;
    }
    cJSON_Delete(j);
    char *text = NULL;
    size_t len = 0;
    if (!ok || pd_tokenizer_decode(d->tok, ids, (size_t)i, false, &text, &len) != PD_OK) {
        pd_free(ids);
        pd__daemon_respond_error(h, 400, "invalid_request_error", "tokens",
                                 "tokens must be ids in [0, %d)", d->info.vocab_size);
        return;
    }
    pd_free(ids);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "text", text);
    pd_free(text);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    pd_http_respond_json(h, 200, s ? s : "{}");
    free(s);
}

int pd__daemon_route(struct pd_daemon_state *d) {
    static const struct {
        const char *m, *p;
        unsigned f;
        pd_http_handler_fn fn;
    } routes[] = {
        {"GET", "/v1/models", 0, h_models},
        {"GET", "/health", PD_HTTP_PUBLIC, h_health},
        {"GET", "/health_generate", PD_HTTP_PUBLIC, h_health_generate},
        {"GET", "/server_info", 0, h_server_info},
        {"GET", "/get_server_info", 0, h_server_info},
        {"GET", "/model_info", 0, h_model_info},
        {"GET", "/get_model_info", 0, h_model_info},
        {"GET", "/get_load", 0, h_get_load},
        {"GET", "/v1/loads", 0, h_loads},
        {"GET", "/metrics", PD_HTTP_PUBLIC, h_metrics},
        {"POST", "/flush_cache", 0, h_flush},
        {"GET", "/flush_cache", 0, h_flush},
        {"POST", "/abort_request", 0, h_abort},
        {"POST", "/tokenize", 0, h_tokenize},
        {"POST", "/detokenize", 0, h_detokenize},
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(routes); i++) {
        int rc =
            pd_http_server_route(d->http, routes[i].m, routes[i].p, routes[i].f, routes[i].fn, d);
        if (rc)
            return rc;
    }
    return PD_OK;
}
