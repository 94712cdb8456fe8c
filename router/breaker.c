/*
 * breaker.c — the circuit breaker's state machine and the transfer-failure reading (see
 * breaker.h). No clock, no I/O: router.c passes uv_hrtime seconds, tests pass what they like.
 */
#include "router/breaker.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

const char *const pd_router_cb_state_names[] = {"closed", "open", "half_open", NULL};

void pd_router_cb_init(struct pd_router_cb *cb, double now) {
    memset(cb, 0, sizeof(*cb));
    cb->state = PD_ROUTER_CB_CLOSED;
    cb->since = now;
}

static void move(struct pd_router_cb *cb, int to, double now, struct pd_router_cb_change *ch) {
    if (ch)
        *ch = (struct pd_router_cb_change){cb->state, to};
    if (cb->state == to)
        return;
    cb->state = to;
    cb->since = now;
    cb->consecutive_successes = 0;
    if (to != PD_ROUTER_CB_OPEN)
        cb->consecutive_failures = 0; /* a new run starts; open keeps the count that opened it */
}

static void unchanged(const struct pd_router_cb *cb, struct pd_router_cb_change *ch) {
    if (ch)
        *ch = (struct pd_router_cb_change){cb->state, cb->state};
}

int pd_router_cb_state_at(struct pd_router_cb *cb, const struct pd_router_cb_config *cfg,
                          double now, struct pd_router_cb_change *change) {
    unchanged(cb, change);
    if (cfg->disabled)
        return PD_ROUTER_CB_CLOSED;
    if (cb->state == PD_ROUTER_CB_OPEN && now - cb->since >= cfg->timeout_s)
        move(cb, PD_ROUTER_CB_HALF_OPEN, now, change);
    return cb->state;
}

bool pd_router_cb_allows(struct pd_router_cb *cb, const struct pd_router_cb_config *cfg, double now,
                         struct pd_router_cb_change *change) {
    return pd_router_cb_state_at(cb, cfg, now, change) != PD_ROUTER_CB_OPEN;
}

bool pd_router_cb_record(struct pd_router_cb *cb, const struct pd_router_cb_config *cfg,
                         bool success, double now, struct pd_router_cb_change *change) {
    unchanged(cb, change);
    if (cfg->disabled || pd_router_cb_state_at(cb, cfg, now, change) == PD_ROUTER_CB_OPEN)
        return false;
    if (success) {
        cb->total_successes++;
        cb->consecutive_failures = 0;
        cb->consecutive_successes++;
        if (cb->state == PD_ROUTER_CB_HALF_OPEN &&
            cb->consecutive_successes >= cfg->success_threshold)
            move(cb, PD_ROUTER_CB_CLOSED, now, change);
        return true;
    }
    /* a failure long after the last one starts a new run: the window */
    if (cb->consecutive_failures > 0 && now - cb->last_failure > cfg->window_s)
        cb->consecutive_failures = 0;
    cb->total_failures++;
    cb->last_failure = now;
    cb->consecutive_successes = 0;
    cb->consecutive_failures++;
    if (cb->state == PD_ROUTER_CB_HALF_OPEN || cb->consecutive_failures >= cfg->failure_threshold)
        move(cb, PD_ROUTER_CB_OPEN, now, change);
    return true;
}

void pd_router_cb_recovered(struct pd_router_cb *cb, const struct pd_router_cb_config *cfg,
                            double now, struct pd_router_cb_change *change) {
    unchanged(cb, change);
    if (cfg->disabled)
        return;
    move(cb, PD_ROUTER_CB_CLOSED, now, change);
    cb->consecutive_failures = cb->consecutive_successes = 0;
}

double pd_router_cb_open_remaining(const struct pd_router_cb *cb,
                                   const struct pd_router_cb_config *cfg, double now) {
    if (cfg->disabled || cb->state != PD_ROUTER_CB_OPEN)
        return 0;
    double left = cfg->timeout_s - (now - cb->since);
    return left > 0 ? left : 0;
}

/* ---------------------------------------------------------------- whose failure */

/* What pdserve's and SGLang's daemons say when the KV transfer between a pair failed or never
 * started (common/daemon.c end_request; SGLang's disaggregation KVTransferError and its
 * bootstrap failures). Matched case-insensitively inside the message. */
static const char *const TRANSFER_FAILED[] = {
    "kv transfer failed",  "waiting for the prefill's kv cache",
    "kvtransfererror",     "bootstrap failed",
    "failed to bootstrap", "bootstrap timed out",
};

static bool contains_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && (p[i] | 0x20) == (needle[i] | 0x20))
            i++;
        if (i == n)
            return true;
    }
    return false;
}

bool pd_router_transfer_failed(const char *body, size_t len, char *msg, size_t cap) {
    if (msg && cap)
        msg[0] = '\0';
    if (!body)
        return false;
    /* an SSE body: its first event's data */
    size_t off = 0;
    while (off < len && (body[off] == ' ' || body[off] == '\n' || body[off] == '\r'))
        off++;
    if (len - off >= 5 && strncmp(body + off, "data:", 5) == 0) {
        off += 5;
        size_t end = off;
        while (end + 1 < len && !(body[end] == '\n' && body[end + 1] == '\n'))
            end++;
        len = end + 1 < len ? end : len;
    }
    cJSON *j = cJSON_ParseWithLength(body + off, len - off);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message")
                                       : (cJSON_IsString(e) ? e : NULL);
    bool hit = false;
    if (cJSON_IsString(m) && m->valuestring) {
        if (msg && cap)
            snprintf(msg, cap, "%s", m->valuestring);
        for (size_t i = 0; i < sizeof(TRANSFER_FAILED) / sizeof(TRANSFER_FAILED[0]) && !hit; i++)
            hit = contains_ci(m->valuestring, TRANSFER_FAILED[i]);
    }
    cJSON_Delete(j);
    return hit;
}
