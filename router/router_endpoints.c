/*
 * router_endpoints.c — the router's own endpoints (/workers, /list_workers, /server_info, /metrics,
 * /get_load, /health, /abort_request, /flush_cache) and the dispatch of every request to its
 * endpoint (generation and pass-through go to router.c), the API key checked first.
 */
#include "router/router_internal.h"

#include "common/base/ct.h"

/* ---------------------------------------------------------------- router's own endpoints */

static const char *worker_state(const struct worker *w) {
    return w->draining ? "draining" : w->load.healthy ? "healthy" : "unhealthy";
}

/* A worker's circuit breaker as /workers shows it. */
static cJSON *cb_json(struct worker *w) {
    const struct pd_router_cb_config *c = &w->rt->cfg->cb;
    cJSON *o = cJSON_CreateObject();
    int st = pd__router_cb_state(w);
    cJSON_AddStringToObject(o, "state", c->disabled ? "disabled" : pd_router_cb_state_names[st]);
    cJSON_AddNumberToObject(o, "consecutive_failures", w->cb.consecutive_failures);
    cJSON_AddNumberToObject(o, "consecutive_successes", w->cb.consecutive_successes);
    cJSON_AddNumberToObject(o, "total_failures", (double)w->cb.total_failures);
    cJSON_AddNumberToObject(o, "total_successes", (double)w->cb.total_successes);
    if (st == PD_ROUTER_CB_OPEN)
        cJSON_AddNumberToObject(o, "open_remaining_secs",
                                pd_router_cb_open_remaining(&w->cb, c, pd__router_now_s()));
    return o;
}

/* Every listed worker; draining ones too, since requests still run on them. */
static cJSON *workers_json(struct pd_router *rt) {
    cJSON *arr = cJSON_CreateArray();
    for (int side = 0; side < 2; side++) {
        const struct registry *g = side ? &rt->decode : &rt->prefill;
        for (int i = 0; i < g->n; i++) {
            struct worker *w = g->w[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "url", w->spec.url);
            cJSON_AddStringToObject(o, "worker_type", side ? "decode" : "prefill");
            if (!side) {
                if (w->spec.bootstrap_port == PD_ROUTER_BOOTSTRAP_PORT_NULL)
                    cJSON_AddNullToObject(o, "bootstrap_port");
                else
                    cJSON_AddNumberToObject(o, "bootstrap_port", w->spec.bootstrap_port);
            }
            /* "healthy" = in rotation; sglang-router's /workers calls it is_healthy */
            bool in_rotation = w->load.healthy && !w->draining;
            cJSON_AddBoolToObject(o, "healthy", in_rotation);
            cJSON_AddBoolToObject(o, "is_healthy", in_rotation);
            cJSON_AddStringToObject(o, "state", worker_state(w));
            /* available = a new request may go to it now: in rotation, circuit not open */
            cJSON_AddBoolToObject(o, "available", in_rotation && pd__router_cb_allows(w));
            cJSON_AddItemToObject(o, "circuit_breaker", cb_json(w));
            cJSON_AddStringToObject(o, "source", w->dns >= 0 ? "dns" : "static");
            if (w->dns >= 0)
                cJSON_AddStringToObject(o, "dns_name", rt->dns[w->dns].spec->name);
            cJSON_AddNumberToObject(o, "load", (double)w->load.polled);
            if (side)
                cJSON_AddBoolToObject(o, "local_prefill", w->local_prefill);
            cJSON_AddNumberToObject(o, "router_inflight", (double)w->load.inflight);
            cJSON_AddNumberToObject(o, "requests_total", (double)w->n_requests);
            if (w->tenant >= 0)
                cJSON_AddNumberToObject(
                    o, "cache_tree_bytes",
                    (double)pd_cache_tree_tenant_size(rt->tree[side], w->tenant));
            if (w->last_error[0] && !in_rotation)
                cJSON_AddStringToObject(o, "last_error", w->last_error);
            cJSON_AddItemToArray(arr, o);
        }
    }
    return arr;
}

/* GET /workers in sglang-router's shape: {"workers": [...], "total", "stats"}, plus what each
 * DNS name last answered. */
static void handle_workers(struct pd_router *rt, struct pd_http_req *hr) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "workers", workers_json(rt));
    cJSON_AddNumberToObject(o, "total", rt->prefill.n + rt->decode.n);
    cJSON *st = cJSON_AddObjectToObject(o, "stats");
    cJSON_AddNumberToObject(st, "prefill_count", rt->prefill.n);
    cJSON_AddNumberToObject(st, "decode_count", rt->decode.n);
    cJSON_AddNumberToObject(st, "regular_count", 0);
    cJSON *names = cJSON_AddArrayToObject(o, "dns");
    static const char *const states[] = {"pending", "answered", "empty", "failed"};
    for (int i = 0; i < rt->n_dns; i++) {
        const struct dns_entry *e = &rt->dns[i];
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "name", e->spec->name);
        cJSON_AddStringToObject(d, "worker_type", e->is_prefill ? "prefill" : "decode");
        cJSON_AddNumberToObject(d, "port", e->spec->port);
        cJSON_AddStringToObject(d, "state", states[e->state]);
        cJSON_AddNumberToObject(d, "lookups", (double)e->lookups);
        if (e->last_error[0])
            cJSON_AddStringToObject(d, "last_error", e->last_error);
        cJSON_AddItemToArray(names, d);
    }
    pd__router_respond_cjson(hr, 200, o);
}

/* GET /list_workers, sglang-router's older listing: {"urls": [...]}. */
static void handle_list_workers(struct pd_router *rt, struct pd_http_req *hr) {
    cJSON *o = cJSON_CreateObject();
    cJSON *urls = cJSON_AddArrayToObject(o, "urls");
    for (int side = 0; side < 2; side++) {
        const struct registry *g = side ? &rt->decode : &rt->prefill;
        for (int i = 0; i < g->n; i++)
            cJSON_AddItemToArray(urls, cJSON_CreateString(g->w[i]->spec.url));
    }
    pd__router_respond_cjson(hr, 200, o);
}

static void handle_server_info(struct pd_router *rt, struct pd_http_req *hr) {
    const struct pd_router_config *cfg = rt->cfg;
    struct pd_http_server_stats hs;
    pd_http_server_stats(rt->http, &hs);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", PD_VERSION);
    cJSON_AddStringToObject(o, "disaggregation_mode", "router");
    cJSON_AddBoolToObject(o, "pd_disaggregation", true);
    cJSON_AddStringToObject(o, "policy", pd_router_policy_names[cfg->policy]);
    cJSON_AddStringToObject(o, "prefill_policy", pd_router_policy_name(cfg->prefill_policy));
    cJSON_AddStringToObject(o, "decode_policy", pd_router_policy_name(cfg->decode_policy));
    cJSON_AddNumberToObject(o, "cache_threshold", cfg->ca.cache_threshold);
    cJSON_AddNumberToObject(o, "balance_abs_threshold", (double)cfg->ca.balance_abs);
    cJSON_AddNumberToObject(o, "balance_rel_threshold", cfg->ca.balance_rel);
    cJSON_AddNumberToObject(o, "eviction_interval_secs", cfg->ca.eviction_secs);
    cJSON_AddNumberToObject(o, "max_tree_size", (double)cfg->ca.max_tree_size);
    for (int side = 0; side < 2; side++) {
        if (!rt->tree[side])
            continue;
        char key[40];
        snprintf(key, sizeof(key), "%s_cache_tree_nodes", side ? "decode" : "prefill");
        cJSON_AddNumberToObject(o, key, (double)pd_cache_tree_nodes(rt->tree[side]));
        snprintf(key, sizeof(key), "%s_cache_tree_bytes", side ? "decode" : "prefill");
        cJSON_AddNumberToObject(o, key, (double)pd_cache_tree_bytes(rt->tree[side]));
    }
    cJSON_AddStringToObject(o, "host", cfg->host);
    cJSON_AddNumberToObject(o, "port", pd_http_server_port(rt->http));
    cJSON_AddBoolToObject(o, "api_key_required", cfg->api_key != NULL);
    cJSON_AddNumberToObject(o, "request_timeout_secs", cfg->request_timeout_secs);
    cJSON_AddNumberToObject(o, "max_concurrent_requests", cfg->max_concurrent_requests);
    cJSON_AddNumberToObject(o, "max_concurrent_requests_per_client",
                            cfg->max_concurrent_requests_per_client);
    cJSON_AddNumberToObject(o, "max_n", cfg->max_n);
    cJSON_AddNumberToObject(o, "local_prefill_max_tokens", cfg->local_prefill_max_tokens);
    cJSON_AddNumberToObject(o, "local_prefill_bytes_per_token",
                            pd_router_token_rate_get(&rt->token_rate));
    cJSON_AddNumberToObject(o, "local_prefill_rate_answers", (double)rt->token_rate.answers);
    cJSON_AddNumberToObject(o, "health_check_interval_secs", cfg->health_check_interval_secs);
    cJSON_AddNumberToObject(o, "health_failure_threshold", cfg->health_failure_threshold);
    cJSON_AddNumberToObject(o, "shutdown_timeout_secs", cfg->shutdown_timeout_secs);
    cJSON_AddNumberToObject(o, "dns_refresh_secs", cfg->dns_refresh_secs);
    cJSON_AddStringToObject(o, "dns_family", pd_router_dns_family_names[cfg->dns_family]);
    pd_router_metrics_handover_info(rt->metrics, o);
    if (cfg->dns_server)
        cJSON_AddStringToObject(o, "dns_server", cfg->dns_server);
    cJSON_AddBoolToObject(o, "disable_circuit_breaker", cfg->cb.disabled);
    cJSON_AddNumberToObject(o, "cb_failure_threshold", cfg->cb.failure_threshold);
    cJSON_AddNumberToObject(o, "cb_success_threshold", cfg->cb.success_threshold);
    cJSON_AddNumberToObject(o, "cb_timeout_duration_secs", cfg->cb.timeout_s);
    cJSON_AddNumberToObject(o, "cb_window_duration_secs", cfg->cb.window_s);
    cJSON_AddNumberToObject(o, "retry_max_retries", cfg->retry_max_retries);
    cJSON_AddNumberToObject(o, "retry_initial_backoff_ms", cfg->backoff.initial_ms);
    cJSON_AddNumberToObject(o, "retry_max_backoff_ms", cfg->backoff.max_ms);
    cJSON_AddNumberToObject(o, "retry_backoff_multiplier", cfg->backoff.multiplier);
    cJSON_AddNumberToObject(o, "retry_jitter_factor", cfg->backoff.jitter);
    cJSON_AddNumberToObject(o, "num_running_reqs", rt->active);
    cJSON_AddNumberToObject(o, "num_requests_total", (double)rt->n_total);
    cJSON_AddNumberToObject(o, "num_failed_requests_total", (double)rt->n_failed);
    cJSON_AddNumberToObject(o, "num_retried_requests_total", (double)rt->n_retried);
    /* backpressure: what the router holds for slow clients, and how often decode waited */
    cJSON_AddNumberToObject(o, "stream_buffer_bytes_limit", cfg->stream_buffer_bytes);
    cJSON_AddNumberToObject(o, "stream_buffer_bytes", (double)hs.stream_backlog);
    cJSON_AddNumberToObject(o, "stream_buffer_peak_bytes", (double)hs.stream_backlog_peak);
    cJSON_AddNumberToObject(o, "num_stream_pauses_total", (double)rt->n_pauses);
    cJSON_AddNumberToObject(o, "num_slow_clients_cut_total", (double)hs.slow_clients_cut);
    cJSON_AddItemToObject(o, "workers", workers_json(rt));
    /* benchmark clients index internal_states[0] */
    cJSON *states = cJSON_AddArrayToObject(o, "internal_states");
    cJSON_AddItemToArray(states, cJSON_CreateObject());
    pd__router_respond_cjson(hr, 200, o);
}

/* GET /metrics: the registry gauges from the workers there are now, then the text. */
static void handle_metrics(struct pd_router *rt, struct pd_http_req *hr) {
    pd_router_metrics_workers_begin(rt->metrics);
    for (int side = 0; side < 2; side++) {
        const struct registry *reg = side ? &rt->decode : &rt->prefill;
        for (int i = 0; i < reg->n; i++) {
            struct worker *w = reg->w[i];
            pd_router_metrics_worker(rt->metrics, w->spec.url, !side,
                                     w->load.healthy && !w->draining, w->load.inflight,
                                     pd__router_cb_state(w));
            if (w->tenant >= 0)
                pd_router_metrics_tree_size(rt->metrics, w->spec.url,
                                            pd_cache_tree_tenant_size(rt->tree[side], w->tenant));
        }
    }
    char *text = NULL;
    size_t len = 0;
    if (pd_router_metrics_render(rt->metrics, &text, &len) != PD_OK) {
        pd__router_respond_error(hr, 500, pd_error_msg());
        return;
    }
    pd_http_respond(hr, 200, PD_METRICS_CONTENT_TYPE, text, len);
    pd_free(text);
}

static void handle_get_load(struct pd_router *rt, struct pd_http_req *hr) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "load", rt->active);
    cJSON_AddItemToObject(o, "workers", workers_json(rt));
    pd__router_respond_cjson(hr, 200, o);
}

static void handle_health(struct pd_router *rt, struct pd_http_req *hr) {
    int hp = pd__router_count_healthy(&rt->prefill);
    int hd = pd__router_count_healthy(&rt->decode);
    if (hp > 0 && hd > 0 && !rt->shutting_down) {
        pd_http_respond(hr, 200, "text/plain", "", 0);
        return;
    }
    char msg[160];
    if (rt->shutting_down)
        snprintf(msg, sizeof(msg), "the router is shutting down");
    else
        snprintf(msg, sizeof(msg), "not ready: %d/%d prefill and %d/%d decode workers healthy", hp,
                 rt->prefill.n, hd, rt->decode.n);
    pd__router_respond_error(hr, 503, msg);
}

/* POST /abort_request from a client: the rid may live on any worker; tell them all. */
static void handle_abort(struct pd_router *rt, struct pd_http_req *hr) {
    size_t len;
    const char *body = pd_http_req_body(hr, &len);
    cJSON *j = cJSON_ParseWithLength(body, len);
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(j, "rid");
    if (!cJSON_IsString(rid)) {
        cJSON_Delete(j);
        pd__router_respond_error(hr, 400, "abort_request needs {\"rid\": \"...\"}");
        return;
    }
    bool oom;
    char *line = pd__router_auth_line_new(hr, &oom);
    for (int i = 0; i < rt->prefill.n; i++)
        pd__router_send_abort(rt, NULL, rt->prefill.w[i], rid->valuestring, line);
    for (int i = 0; i < rt->decode.n; i++)
        pd__router_send_abort(rt, NULL, rt->decode.w[i], rid->valuestring, line);
    pd_free(line);
    cJSON_Delete(j);
    pd__router_respond_json(hr, 200, "{}");
}

/* POST /flush_cache: every worker holds its own prefix cache, so every worker is told (as
 * sglang-router fans it out); like /abort_request the answer does not wait for theirs, and a
 * worker that fails logs at debug level (a flush only drops unused entries, so one missed is
 * harmless). The cache_aware trees of what each worker holds are emptied too: kept, they would
 * route by text the workers no longer have, and --local-prefill-max-tokens would count a long
 * prompt as held by its decode and send it to a local prefill of the whole prompt. */
static void handle_flush_cache(struct pd_router *rt, struct pd_http_req *hr) {
    for (int side = 0; side < 2; side++) {
        int tree_oom = 0;
        if (rt->tree[side])
            pd_cache_tree_evict(rt->tree[side], 0, &tree_oom);
        if (tree_oom)
            pd_warn("flush_cache: the %s cache tree kept some entries (out of memory)",
                    side ? "decode" : "prefill");
    }
    bool oom;
    char *line = pd__router_auth_line_new(hr, &oom);
    int n = 0;
    for (int side = 0; side < 2; side++) {
        const struct registry *g = side ? &rt->decode : &rt->prefill;
        for (int i = 0; i < g->n; i++, n++)
            pd__router_send_worker_post(rt, NULL, g->w[i], "/flush_cache", "{}", "flush_cache",
                                        line);
    }
    pd_free(line);
    char msg[80];
    snprintf(msg, sizeof(msg), "Cache flush sent to %d workers.\n", n);
    pd_http_respond(hr, 200, "text/plain", msg, strlen(msg));
}

/* "Authorization: Bearer <key>", compared in time that says nothing about the key (ct.h). */
static bool authorized(const struct pd_router *rt, struct pd_http_req *hr) {
    const char *key = rt->cfg->api_key;
    if (!key)
        return true;
    size_t alen, klen = strlen(key);
    const char *a = pd_http_req_header(hr, "authorization", &alen);
    if (!a || alen < 7 || strncmp(a, "Bearer ", 7) != 0)
        return false;
    return pd_ct_equal(a + 7, alen - 7, key, klen);
}

void pd__router_on_request(struct pd_http_req *hr, void *ud) {
    const struct endpoint *ep = ud;
    struct pd_router *rt = ep->rt;
    if (ep->kind == EP_HEALTH) {
        handle_health(rt, hr);
        return;
    }
    if (ep->kind == EP_METRICS) { /* public, like the daemons' (and served while draining) */
        handle_metrics(rt, hr);
        return;
    }
    if (rt->shutting_down) {
        pd__router_respond_error(hr, 503, "the router is shutting down");
        return;
    }
    if (!authorized(rt, hr)) {
        pd__router_respond_error(hr, 401, "invalid or missing API key (Authorization: Bearer ...)");
        return;
    }
    switch (ep->kind) {
    case EP_GENERATE: pd__router_handle_generate(rt, hr, ep->route); break;
    case EP_PROXY_GET: pd__router_handle_proxy(rt, hr, false); break;
    case EP_PROXY_POST: pd__router_handle_proxy(rt, hr, true); break;
    case EP_FLUSH_CACHE: handle_flush_cache(rt, hr); break;
    case EP_SERVER_INFO: handle_server_info(rt, hr); break;
    case EP_GET_LOAD: handle_get_load(rt, hr); break;
    case EP_ABORT: handle_abort(rt, hr); break;
    case EP_WORKERS: handle_workers(rt, hr); break;
    case EP_LIST_WORKERS: handle_list_workers(rt, hr); break;
    case EP_HEALTH:
    case EP_METRICS: break;
    }
}
