/*
 * router_workers.c — the router's workers: the registry of each role, health and load polls, each
 * worker's circuit breaker as the polls and calls see it, DNS discovery (names re-resolved every
 * --dns-refresh-secs, workers that leave drain), and the choice of a worker by the policy.
 */
#include "router/router_internal.h"

/* ---------------------------------------------------------------- workers */

const char *pd__router_role(const struct worker *w) {
    return w->is_prefill ? "prefill" : "decode";
}

/* A circuit breaker state change: one log line and the transition counter. */
void pd__router_cb_note(struct worker *w, const struct pd_router_cb_change *ch, const char *why) {
    if (ch->from == ch->to)
        return;
    const char *from = pd_router_cb_state_names[ch->from], *to = pd_router_cb_state_names[ch->to];
    if (ch->to == PD_ROUTER_CB_OPEN)
        pd_warn("worker %s (%s) circuit %s -> open after %d consecutive failures: no new "
                "requests for %g s",
                w->spec.url, pd__router_role(w), from, w->cb.consecutive_failures,
                w->rt->cfg->cb.timeout_s);
    else
        pd_info("worker %s (%s) circuit %s -> %s%s", w->spec.url, pd__router_role(w), from, to,
                why);
    pd_router_metrics_cb_transition(w->rt->metrics, w->spec.url, ch->from, ch->to);
}

/* May a new request go to w now, as far as its circuit breaker goes? */
bool pd__router_cb_allows(struct worker *w) {
    struct pd_router_cb_change ch;
    bool ok = pd_router_cb_allows(&w->cb, &w->rt->cfg->cb, pd__router_now_s(), &ch);
    pd__router_cb_note(w, &ch, ": timeout over, trial requests go to it");
    return ok;
}

int pd__router_cb_state(struct worker *w) {
    struct pd_router_cb_change ch;
    int st = pd_router_cb_state_at(&w->cb, &w->rt->cfg->cb, pd__router_now_s(), &ch);
    pd__router_cb_note(w, &ch, ": timeout over, trial requests go to it");
    return st;
}

void pd__router_set_healthy(struct worker *w, bool ok, const char *why) {
    if (ok && !w->load.healthy) {
        pd_info("worker %s (%s) in rotation: /health answered 200", w->spec.url,
                pd__router_role(w));
        /* a worker that comes back (a restart) starts with a clean slate */
        struct pd_router_cb_change ch;
        pd_router_cb_recovered(&w->cb, &w->rt->cfg->cb, pd__router_now_s(), &ch);
        pd__router_cb_note(w, &ch, ": /health answers again");
    } else if (!ok && w->load.healthy) {
        pd_warn("worker %s (%s) out of rotation: %s", w->spec.url, pd__router_role(w), why);
    }
    if (!ok) { /* what it takes is learned again when it comes back (a restart may change it) */
        w->join_on_load = false;
        pd_upstream_call_cancel(w->load_call);
        w->load_call = NULL;
    }
    if (!ok)
        snprintf(w->last_error, sizeof(w->last_error), "%s", why);
    else
        w->last_error[0] = '\0';
    w->load.healthy = ok;
}

static long health_timeout_ms(const struct pd_router *rt) {
    long ms = (long)(rt->cfg->health_check_interval_secs * 2000);
    return ms < 1000 ? 1000 : ms > 10000 ? 10000 : ms;
}

static void start_load_poll(struct pd_router *rt, struct worker *w);

static void on_health_done(void *ud, struct pd_upstream_call *call,
                           const struct pd_upstream_result *r) {
    struct worker *w = ud;
    w->health_call = NULL;
    if (r->status == PD_OK) { /* it answers: alive, whatever it says */
        w->silent_since_s = 0;
        w->given_up = false;
    } else if (w->silent_since_s == 0) {
        w->silent_since_s = w->health_sent_s;
    }
    if (r->status == PD_OK && r->http_status == 200) {
        w->health_timeouts = 0;
        /* with the local path on, a decode joins once it said whether it takes prompts alone */
        if (!w->load.healthy && !w->is_prefill && w->rt->cfg->local_prefill_max_tokens > 0) {
            w->join_on_load = true;
            if (!w->load_call)
                start_load_poll(w->rt, w);
            if (w->load_call)
                return; /* on_load_done puts it in rotation */
            w->join_on_load = false;
        }
        pd__router_set_healthy(w, true, "");
        return;
    }
    /* a slow answer on a busy machine is not a dead worker: only --health-failure-threshold
     * timeouts in a row take it out (its requests still fail it at once, and a silence past
     * --worker-unresponsive-secs gives them up); a refusal or a 503 is the worker's own word */
    if (r->status == PD_ETIMEDOUT && ++w->health_timeouts < w->rt->cfg->health_failure_threshold) {
        if (w->load.healthy)
            pd_info("worker %s (%s): /health timed out (%d of %d in a row before it leaves "
                    "rotation)",
                    w->spec.url, pd__router_role(w), w->health_timeouts,
                    w->rt->cfg->health_failure_threshold);
        return;
    }
    if (r->status != PD_ETIMEDOUT)
        w->health_timeouts = 0;
    char why[160];
    if (r->status != PD_OK)
        snprintf(why, sizeof(why), "/health failed: %s", r->error);
    else
        snprintf(why, sizeof(why), "/health answered %ld", r->http_status);
    pd__router_set_healthy(w, false, why);
}

static void on_load_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct worker *w = ud;
    if (w->load_body.len < 65536)
        pd__router_sb_put(&w->load_body, buf, len);
}

/* {"load": N} (API.md), with "local_prefill": true from a pdserve decode that takes prompts
 * alone; or SGLang's per-rank list [{"num_reqs", "num_waiting_reqs"}, ...]. */
static bool parse_load(const char *s, int64_t *out, bool *local_prefill) {
    cJSON *j = cJSON_Parse(s);
    *local_prefill = false;
    if (!j)
        return false;
    bool ok = false;
    double total = 0;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "load");
    if (cJSON_IsNumber(l)) {
        total = l->valuedouble;
        *local_prefill = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "local_prefill"));
        ok = true;
    } else if (cJSON_IsArray(j)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "load");
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "num_reqs");
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "num_waiting_reqs");
            total += cJSON_IsNumber(a) ? a->valuedouble
                                       : (cJSON_IsNumber(b) ? b->valuedouble : 0) +
                                             (cJSON_IsNumber(c) ? c->valuedouble : 0);
        }
        ok = true;
    }
    cJSON_Delete(j);
    *out = total < 0 ? 0 : (int64_t)total;
    return ok;
}

static void on_load_done(void *ud, struct pd_upstream_call *call,
                         const struct pd_upstream_result *r) {
    struct worker *w = ud;
    w->load_call = NULL;
    int64_t load;
    bool local;
    if (r->status == PD_OK && r->http_status == 200 && w->load_body.p &&
        parse_load(w->load_body.p, &load, &local)) {
        w->load.polled = load;
        w->local_prefill = local;
    } else if (r->status == PD_OK || w->join_on_load) {
        w->local_prefill = false; /* it answered otherwise (not a pdserve decode), or not yet */
    }
    w->load_body.len = 0;
    if (w->join_on_load) {
        w->join_on_load = false;
        pd__router_set_healthy(w, true, "");
    }
}

static void start_load_poll(struct pd_router *rt, struct worker *w) {
    char url[600];
    snprintf(url, sizeof(url), "%s/get_load", w->spec.url);
    struct pd_upstream_req req = {
        .method = "GET", .url = url, .auth = rt->worker_auth, .timeout_ms = health_timeout_ms(rt)};
    struct pd_upstream_cbs cbs = {.on_data = on_load_data, .on_done = on_load_done};
    w->load_body.len = 0;
    if (pd_upstream_call_start(rt->up, &req, &cbs, w, &w->load_call))
        w->load_call = NULL;
}

static void poll_worker(struct pd_router *rt, struct worker *w) {
    char url[600];
    struct pd_upstream_req req = {
        .method = "GET", .url = url, .auth = rt->worker_auth, .timeout_ms = health_timeout_ms(rt)};
    if (w->draining)
        return; /* it gets no new requests; its health no longer matters */
    if (!w->health_call) {
        snprintf(url, sizeof(url), "%s/health", w->spec.url);
        struct pd_upstream_cbs cbs = {.on_done = on_health_done};
        w->health_sent_s = pd__router_now_s();
        if (pd_upstream_call_start(rt->up, &req, &cbs, w, &w->health_call))
            w->health_call = NULL;
    }
    if (!w->load_call && w->load.healthy)
        start_load_poll(rt, w);
}

/* A worker silent past --worker-unresponsive-secs (its /health unanswered: timed out, refused,
 * or still pending that long) loses the router's requests on it, once per silence: a stopped,
 * wedged or cut-off process would otherwise hold each of them until --request-timeout-secs,
 * since nothing else in the pair notices (a stopped process keeps its sockets, and the UCX
 * keepalive sees it alive). A worker that answers anything is alive: slow compute never
 * delays /health, which the loop thread answers. */
static void check_silence(struct pd_router *rt, struct worker *w, double now) {
    double limit = rt->cfg->worker_unresponsive_secs;
    if (limit <= 0 || w->given_up || w->draining)
        return;
    double since = w->silent_since_s;
    if (since == 0 && w->health_call && now - w->health_sent_s >= limit)
        since = w->health_sent_s; /* still waiting for this one */
    if (since == 0 || now - since < limit)
        return;
    w->given_up = true;
    char why[200];
    snprintf(why, sizeof(why), "its /health has not answered for %.1f s (%s)", now - since,
             w->last_error[0] ? w->last_error : "pending");
    pd__router_set_healthy(w, false, why); /* the retries go elsewhere */
    pd__router_give_up_worker(rt, w, why);
}

void pd__router_on_health_tick(uv_timer_t *t) {
    struct pd_router *rt = t->data;
    double now = pd__router_now_s();
    for (int i = 0; i < rt->prefill.n; i++) {
        check_silence(rt, rt->prefill.w[i], now);
        poll_worker(rt, rt->prefill.w[i]);
    }
    for (int i = 0; i < rt->decode.n; i++) {
        check_silence(rt, rt->decode.w[i], now);
        poll_worker(rt, rt->decode.w[i]);
    }
}

void pd__router_stop_polls(struct worker *w) {
    pd_upstream_call_cancel(w->health_call);
    pd_upstream_call_cancel(w->load_call);
    w->health_call = w->load_call = NULL;
}

struct worker *pd__router_worker_ref(struct worker *w) {
    if (w)
        w->refs++;
    return w;
}

void pd__router_worker_unref(struct worker *w) {
    if (!w || --w->refs > 0)
        return;
    PD_ASSERT(!w->listed && !w->health_call && !w->load_call);
    pd_free(w->spec.url);
    pd_free(w->spec.host);
    pd_free(w->load_body.p);
    pd_free(w);
}

static struct registry *registry_of(struct pd_router *rt, bool is_prefill) {
    return is_prefill ? &rt->prefill : &rt->decode;
}

/* Lists a new worker (spec's strings move into it); it enters rotation once /health answers.
 * NULL on allocation failure (spec freed). */
struct worker *pd__router_registry_add(struct pd_router *rt, bool is_prefill,
                                       struct pd_router_worker_spec *spec, int dns,
                                       const char *addr) {
    struct registry *g = registry_of(rt, is_prefill);
    struct worker *w = pd_calloc(1, sizeof(*w));
    if (!w || pd_array_grow((void **)&g->w, &g->cap, (size_t)g->n + 1, sizeof(*g->w)) ||
        pd_array_grow((void **)&rt->scratch, &rt->scratch_cap, (size_t)g->n + 1,
                      sizeof(*rt->scratch))) {
        pd_free(w);
        pd_free(spec->url);
        pd_free(spec->host);
        pd_errorf(PD_ENOMEM, "adding a worker");
        return NULL;
    }
    int tenant = -1;
    struct pd_cache_tree *tree = rt->tree[!is_prefill];
    if (tree &&
        (pd_array_grow((void **)&rt->ca_matched, &rt->ca_matched_cap, (size_t)g->n + 1,
                       sizeof(*rt->ca_matched)) ||
         pd_array_grow((void **)&rt->ca_size, &rt->ca_size_cap, (size_t)g->n + 1,
                       sizeof(*rt->ca_size)) ||
         pd_cache_tree_tenant_add(tree, &tenant) ||
         pd_array_grow((void **)&rt->ca_by_tenant, &rt->ca_by_tenant_cap,
                       (size_t)pd_cache_tree_tenant_cap(tree), sizeof(*rt->ca_by_tenant)))) {
        if (tenant >= 0)
            pd_cache_tree_tenant_remove(tree, tenant);
        pd_free(w);
        pd_free(spec->url);
        pd_free(spec->host);
        pd_errorf(PD_ENOMEM, "adding a worker");
        return NULL;
    }
    *w = (struct worker){.rt = rt,
                         .spec = *spec,
                         .is_prefill = is_prefill,
                         .listed = true,
                         .refs = 1,
                         .dns = dns,
                         .tenant = tenant};
    pd_router_cb_init(&w->cb, pd__router_now_s());
    if (pd_router_url_normalize(w->spec.url, w->key, sizeof(w->key)) != PD_OK)
        snprintf(w->key, sizeof(w->key), "%s", w->spec.url);
    if (addr)
        snprintf(w->addr, sizeof(w->addr), "%s", addr);
    snprintf(w->last_error, sizeof(w->last_error), "not checked yet");
    g->w[g->n++] = w;
    return w;
}

/* The listed worker of that role whose normalized URL is key, or NULL. */
struct worker *pd__router_registry_find(struct pd_router *rt, bool is_prefill, const char *key) {
    struct registry *g = registry_of(rt, is_prefill);
    for (int i = 0; i < g->n; i++)
        if (strcmp(g->w[i]->key, key) == 0)
            return g->w[i];
    return NULL;
}

/* Out of the registry: no polls, no new requests; freed once no request holds it. */
void pd__router_registry_remove(struct worker *w) {
    struct registry *g = registry_of(w->rt, w->is_prefill);
    PD_ASSERT(w->listed);
    int i = 0;
    while (i < g->n && g->w[i] != w)
        i++;
    PD_ASSERT(i < g->n);
    memmove(&g->w[i], &g->w[i + 1], sizeof(*g->w) * (size_t)(g->n - i - 1));
    g->n--;
    pd__router_stop_polls(w);
    w->listed = false;
    /* gone from the router (not merely unhealthy or open-circuited): its part of the prefix
     * tree goes too, as sglang-router's remove_worker does */
    if (w->tenant >= 0)
        pd_cache_tree_tenant_remove(w->rt->tree[!w->is_prefill], w->tenant);
    w->tenant = -1;
    pd__router_worker_unref(w);
}

/* A router call on w ended. The last one of a draining worker takes it out of the registry. */
void pd__router_worker_call_ended(struct worker *w) {
    PD_ASSERT(w->load.inflight > 0);
    w->load.inflight--;
    if (w->draining && w->listed && w->load.inflight == 0) {
        pd_info("worker %s (%s) drained: removed", w->spec.url, pd__router_role(w));
        pd__router_registry_remove(w);
    }
}

/* cache_aware's choice among g's workers (scratch filled): the role's prefix tree's match of
 * rq's routing text (rq->rtext), then policy.h's rules; the text is recorded for the chosen one. */
static int pick_cache_aware(struct pd_router *rt, struct pd_cache_tree *tree, struct registry *g,
                            int ex, uint64_t *rr, struct rreq *rq) {
    /* start_attempt took the text from the parsed body; NULL: no memory for it, so it routes
     * as an empty one (smallest tree) */
    const char *text = rq->rtext ? rq->rtext : "";
    int n_ids = pd_cache_tree_tenant_cap(tree);
    pd_cache_tree_match(tree, text, rq->rtext_len, rt->ca_by_tenant, n_ids);
    for (int i = 0; i < g->n; i++) {
        int id = g->w[i]->tenant;
        rt->ca_matched[i] = id >= 0 ? rt->ca_by_tenant[id] : 0;
        rt->ca_size[i] = pd_cache_tree_tenant_size(tree, id);
    }
    int decision = PD_ROUTER_CA_SMALLEST;
    int i = pd_router_pick_cache_aware(&rt->cfg->ca, rt->scratch, rt->ca_matched, rt->ca_size, g->n,
                                       ex, rq->rtext_len, rr, &decision);
    if (i < 0)
        return i;
    struct worker *w = g->w[i];
    if (tree == rt->tree[1])
        rq->d_matched = rt->ca_matched[i]; /* what it likely holds: start_attempt's local rule */
    pd_debug("cache_aware: %s → %s (matched %zu of %zu bytes, tree %zu bytes, %" PRId64
             " in flight)",
             pd_router_ca_decision_names[decision], w->spec.url, rt->ca_matched[i], rq->rtext_len,
             rt->ca_size[i], w->load.inflight);
    pd_router_metrics_cache_aware(rt->metrics, w->spec.url, decision);
    /* sglang-router records the text for the chosen worker whatever the rule that chose it */
    if (rq->rtext_len && pd_cache_tree_insert(tree, w->tenant, text, rq->rtext_len))
        pd_warn("cache_aware: %s", pd_error_msg());
    return i;
}

/* A worker whose policy may pick it, or NULL: healthy, not draining, not `exclude`. rq: the
 * request it is for (cache_aware reads its text). */
struct worker *pd__router_pick_worker(struct pd_router *rt, bool is_prefill,
                                      const struct worker *exclude, struct rreq *rq) {
    struct registry *g = registry_of(rt, is_prefill);
    int ex = -1;
    for (int i = 0; i < g->n; i++) {
        rt->scratch[i] = g->w[i]->load;
        /* an open circuit takes the worker out of the policy's view until its timeout */
        rt->scratch[i].healthy =
            g->w[i]->load.healthy && !g->w[i]->draining && pd__router_cb_allows(g->w[i]);
        if (g->w[i] == exclude)
            ex = i;
    }
    int policy = is_prefill ? rt->cfg->prefill_policy : rt->cfg->decode_policy;
    uint64_t *rr = is_prefill ? &rt->rr_prefill : &rt->rr_decode;
    struct pd_cache_tree *tree = rt->tree[!is_prefill];
    int i;
    if (policy == PD_ROUTER_POLICY_LEAST_LOAD)
        i = pd_router_pick_least_load(rt->scratch, g->n, ex, rr);
    else if (tree && rq)
        i = pick_cache_aware(rt, tree, g, ex, rr, rq);
    else /* cache_aware without a request (a pass-through GET): power_of_two */
        i = pd_router_pick(policy, rt->scratch, g->n, ex, rr, &rt->rng);
    return i < 0 ? NULL : g->w[i];
}

int pd__router_count_healthy(const struct registry *g) {
    int k = 0;
    for (int i = 0; i < g->n; i++)
        k += g->w[i]->load.healthy && !g->w[i]->draining;
    return k;
}

/* Why no worker of a role could be picked, for the 503: none healthy, or every healthy
 * one has its circuit open (then when the first turns half-open). */
void pd__router_no_worker_msg(struct pd_router *rt, bool is_prefill, char *buf, size_t size) {
    const struct registry *g = registry_of(rt, is_prefill);
    const char *r = is_prefill ? "prefill" : "decode";
    int healthy = 0, open = 0;
    double next = -1, now = pd__router_now_s();
    for (int i = 0; i < g->n; i++) {
        struct worker *w = g->w[i];
        if (!w->load.healthy || w->draining)
            continue;
        healthy++;
        if (pd__router_cb_allows(w))
            continue;
        open++;
        double left = pd_router_cb_open_remaining(&w->cb, &rt->cfg->cb, now);
        if (next < 0 || left < next)
            next = left;
    }
    if (healthy > 0 && open == healthy)
        snprintf(buf, size,
                 "no %s worker available: the circuit breaker of %s %d healthy %s worker%s is "
                 "open after repeated failures (next trial in %.1f s)",
                 r, healthy == 1 ? "the" : "all", healthy, r, healthy == 1 ? "" : "s",
                 next < 0 ? 0 : next);
    else
        snprintf(buf, size, "no healthy %s worker", r);
}

/* ---------------------------------------------------------------- DNS discovery */

static const char *dns_flag(const struct dns_entry *e) {
    return e->is_prefill ? "--prefill-dns" : "--decode-dns";
}

static void dns_add(struct dns_entry *e, const char *addr) {
    struct pd_router *rt = e->rt;
    char url[80];
    struct pd_router_worker_spec spec = {
        .port = e->spec->port,
        .bootstrap_port = e->is_prefill ? e->spec->bootstrap_port : PD_ROUTER_BOOTSTRAP_PORT_NULL};
    char key[320];
    if (pd_router_dns_worker_url(addr, e->spec->port, url, sizeof(url)) == PD_OK &&
        pd_router_url_normalize(url, key, sizeof(key)) == PD_OK) {
        /* already listed (given statically, or by another name): one worker, one share of the
         * traffic; the first entry wins, and this name's answers never drain or remove it */
        struct worker *same = pd__router_registry_find(rt, e->is_prefill, key);
        if (same) {
            if (!same->dns_shadowed)
                pd_info("dns %s: %s is worker %s (%s, %s) already; not added twice", e->spec->name,
                        url, same->spec.url, pd__router_role(same),
                        same->dns < 0 ? "static" : rt->dns[same->dns].spec->name);
            same->dns_shadowed = true;
            return;
        }
        spec.url = pd_strdup(url);
        spec.host = pd_strdup(addr); /* the bootstrap host decode connects to */
    }
    struct worker *w = spec.url && spec.host
                           ? pd__router_registry_add(rt, e->is_prefill, &spec, e->index, addr)
                           : (pd_free(spec.url), pd_free(spec.host), NULL);
    if (!w) {
        pd_error("dns %s: cannot add a worker for %s: out of memory", e->spec->name, addr);
        return;
    }
    pd_info("worker %s (%s, dns %s) added: in rotation once /health answers", w->spec.url,
            pd__router_role(w), e->spec->name);
    poll_worker(rt, w);
}

/* One answer applied: new addresses get workers, vanished ones drain (or go at once when
 * nothing is in flight), returning ones are re-checked before they take traffic again. */
static void dns_apply(struct dns_entry *e, const char *const *addrs, int n) {
    struct pd_router *rt = e->rt;
    struct registry *g = registry_of(rt, e->is_prefill);
    int n_known = 0;
    for (int i = 0; i < g->n; i++)
        n_known += g->w[i]->dns == e->index;
    struct worker **mine = pd_calloc((size_t)n_known + 1, sizeof(*mine));
    struct pd_router_dns_known *known = pd_calloc((size_t)n_known + 1, sizeof(*known));
    enum pd_router_dns_step *steps = pd_calloc((size_t)n_known + 1, sizeof(*steps));
    bool *add = pd_calloc((size_t)n + 1, sizeof(*add));
    if (!mine || !known || !steps || !add) {
        pd_error("dns %s: out of memory applying an answer; keeping the current workers",
                 e->spec->name);
        goto out;
    }
    for (int i = 0, k = 0; i < g->n; i++) {
        if (g->w[i]->dns != e->index)
            continue;
        mine[k] = g->w[i];
        known[k++] = (struct pd_router_dns_known){.addr = g->w[i]->addr,
                                                  .draining = g->w[i]->draining,
                                                  .inflight = g->w[i]->load.inflight};
    }
    pd_router_dns_plan(known, n_known, addrs, n, steps, add);
    for (int k = 0; k < n_known; k++) {
        struct worker *w = mine[k];
        switch (steps[k]) {
        case PD_ROUTER_DNS_KEEP: break;
        case PD_ROUTER_DNS_DRAIN:
            pd_info("worker %s (%s) left dns %s: draining %" PRId64 " requests in flight",
                    w->spec.url, pd__router_role(w), e->spec->name, w->load.inflight);
            w->draining = true;
            pd__router_stop_polls(w);
            break;
        case PD_ROUTER_DNS_REVIVE:
            pd_info("worker %s (%s) back in dns %s: in rotation again once /health answers",
                    w->spec.url, pd__router_role(w), e->spec->name);
            w->draining = false;
            w->load.healthy = false;
            snprintf(w->last_error, sizeof(w->last_error), "re-added; not checked yet");
            poll_worker(rt, w);
            break;
        case PD_ROUTER_DNS_REMOVE:
            pd_info("worker %s (%s) left dns %s: removed (nothing in flight)", w->spec.url,
                    pd__router_role(w), e->spec->name);
            pd__router_registry_remove(w);
            break;
        }
    }
    for (int a = 0; a < n; a++)
        if (add[a])
            dns_add(e, addrs[a]);
out:
    pd_free(mine);
    pd_free(known);
    pd_free(steps);
    pd_free(add);
}

static void on_dns_resolved(void *ud, const struct pd_router_resolve_result *r) {
    struct dns_entry *e = ud;
    struct pd_router *rt = e->rt;
    e->pending = NULL;
    if (rt->shutting_down)
        return;
    e->lookups++;
    int held = 0;
    const struct registry *g = registry_of(rt, e->is_prefill);
    for (int i = 0; i < g->n; i++)
        held += g->w[i]->dns == e->index && !g->w[i]->draining;
    if (r->status != PD_OK) {
        /* logged once per change, not on every refresh */
        if (e->state != DNS_FAILED || strcmp(e->last_error, r->error) != 0)
            pd_warn("dns %s (%s): lookup failed: %s; keeping its %d workers", e->spec->name,
                    dns_flag(e), r->error, held);
        e->state = DNS_FAILED;
        snprintf(e->last_error, sizeof(e->last_error), "%s", r->error);
        return;
    }
    if (r->n == 0 && e->state != DNS_EMPTY)
        pd_warn("dns %s (%s): no addresses (no such name or no records)%s", e->spec->name,
                dns_flag(e), held ? "; draining its workers" : "");
    else if (r->n > 0 && e->state != DNS_ANSWERED)
        pd_info("dns %s (%s): %d addresses", e->spec->name, dns_flag(e), r->n);
    e->state = r->n ? DNS_ANSWERED : DNS_EMPTY;
    e->last_error[0] = '\0';
    dns_apply(e, r->addrs, r->n);
}

void pd__router_on_dns_tick(uv_timer_t *t) {
    struct pd_router *rt = t->data;
    const struct pd_router_config *cfg = rt->cfg;
    struct pd_router_resolve_opts o = {.family = cfg->dns_family,
                                       .server = cfg->dns_server ? cfg->dns_server_addr : NULL,
                                       .server_port = cfg->dns_server_port};
    for (int i = 0; i < rt->n_dns; i++) {
        struct dns_entry *e = &rt->dns[i];
        if (e->pending)
            continue; /* a slow lookup: the next tick tries again */
        if (pd_router_resolve_start(rt->loop, e->spec->name, &o, on_dns_resolved, e, &e->pending) !=
            PD_OK) {
            e->pending = NULL;
            struct pd_router_resolve_result r = {.status = PD_EIO, .error = pd_error_msg()};
            on_dns_resolved(e, &r);
        }
    }
}

void pd__router_stop_dns(struct pd_router *rt) {
    for (int i = 0; i < rt->n_dns; i++) {
        pd_router_resolve_cancel(rt->dns[i].pending);
        rt->dns[i].pending = NULL;
    }
}
