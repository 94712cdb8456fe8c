/*
 * load.c — one open-loop load: requests leave at their arrival times whatever the server does
 * (Poisson: exponential gaps of mean 1/rate, the first at 0, as bench_serving's get_request),
 * held back only by --max-concurrency; every answer is streamed (SSE) and timed chunk by chunk.
 *
 * One thread, curl multi on its own poll loop (curl_multi_poll with a timeout up to the next
 * arrival): a chunk's timestamp is taken in the write callback, i.e. when curl hands us the
 * bytes after the poll woke, so a timestamp is late by at most one loop turn (microseconds on an
 * idle client). Nothing blocks between arrivals. Bodies are built before the load starts so the
 * send path does no JSON work.
 *
 * A request fails on a transport error, an HTTP status other than 200, an error event in the
 * stream, a stream with no token, or a stream that ends without `data: [DONE]` (truncated);
 * the failure keeps a one-line reason for the report.
 *
 * Client misbehaviour, drawn per request from the seed before the load starts: an aborting
 * client stops reading once it has its few tokens (the write callback refuses the next bytes,
 * curl closes the connection: a FIN after a partial answer); a disconnecting client has its
 * connection of its own (never reused, SO_LINGER 0) and drops it at its drawn time, whatever has
 * arrived, so the server sees a reset before or while it answers. Either ends the request as
 * "cut", which is neither completed nor failed; an error seen before the cut is a failure.
 */
#include "bench/serving/serving.h"

#include "common/base/alloc.h"
#include "common/base/rng.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { ERRBODY_MAX = 2048 };

struct req {
    const struct pd_bench_load *l;
    struct pd_bench_result *res;
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    char *buf; /* received bytes not yet cut into lines */
    size_t len, cap;
    long status; /* HTTP status, read at the first byte */
    bool got_first, done_marker;
    double t_start, t_last, t_end;
    int tokens_seen;         /* sum of new tokens over chunks */
    int server_count;        /* usage.completion_tokens / meta_info.completion_tokens, -1 = none */
    int fate;                /* enum pd_bench_fate */
    int abort_after;         /* PD_BENCH_FATE_ABORT: tokens read before the stream is closed */
    double disconnect_after; /* PD_BENCH_FATE_DISCONNECT: s after the send */
    bool cut;                /* the client ended it as its fate says */
    size_t index;            /* in the load */
    char errbuf[CURL_ERROR_SIZE];
};

const char *const pd_bench_fate_names[] = {"read", "abort", "disconnect"};

double pd_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void pd_bench_result_free(struct pd_bench_result *r) {
    if (!r)
        return;
    pd_free(r->itl);
    pd_free(r->error);
    r->itl = NULL;
    r->error = NULL;
    r->n_itl = r->cap_itl = 0;
}

static void fail(struct req *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct req *q, const char *fmt, ...) {
    if (q->res->error)
        return; /* the first reason is the one that matters */
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    q->res->error = pd_strdup(msg);
}

static void token_event(struct req *q, int k, double t) {
    if (k <= 0)
        return;
    if (!q->got_first) {
        q->got_first = true;
        q->res->ttft = t - q->t_start;
    } else {
        /* A chunk that carries k tokens counts as k gaps of equal share (bench_serving). */
        double gap = (t - q->t_last) / k;
        if (pd_array_grow((void **)&q->res->itl, &q->res->cap_itl, q->res->n_itl + (size_t)k,
                          sizeof(double)) == PD_OK) {
            for (int i = 0; i < k; i++)
                q->res->itl[q->res->n_itl++] = gap;
        }
    }
    q->t_last = t;
    q->tokens_seen += k;
    if (q->fate == PD_BENCH_FATE_ABORT && q->tokens_seen >= q->abort_after && !q->res->error)
        q->cut = true; /* on_write refuses what follows: curl closes the connection */
}

static void sse_event(struct req *q, const char *data, double t) {
    if (strcmp(data, "[DONE]") == 0) {
        q->done_marker = true;
        q->t_end = t;
        return;
    }
    cJSON *ev = cJSON_Parse(data);
    if (!ev) {
        fail(q, "unparsable stream event: %.200s", data);
        return;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(ev, "error");
    if (err) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        fail(q, "error in stream: %.300s", cJSON_IsString(m) ? m->valuestring : "(no message)");
        cJSON_Delete(ev);
        return;
    }
    q->t_end = t;
    if (q->l->backend == PD_BENCH_SGLANG) {
        const cJSON *mi = cJSON_GetObjectItemCaseSensitive(ev, "meta_info");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(mi, "completion_tokens");
        if (cJSON_IsNumber(ct)) {
            int now = (int)ct->valuedouble;
            int prev = q->server_count < 0 ? 0 : q->server_count;
            token_event(q, now - prev, t);
            q->server_count = now;
        } else {
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(ev, "text");
            if (cJSON_IsString(tx) && tx->valuestring[0])
                token_event(q, 1, t);
        }
    } else {
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ev, "choices"), 0);
        const cJSON *tx = q->l->backend == PD_BENCH_OPENAI
                              ? cJSON_GetObjectItemCaseSensitive(ch, "text")
                              : cJSON_GetObjectItemCaseSensitive(
                                    cJSON_GetObjectItemCaseSensitive(ch, "delta"), "content");
        if (cJSON_IsString(tx) && tx->valuestring[0])
            token_event(q, 1, t);
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        if (cJSON_IsNumber(ct))
            q->server_count = (int)ct->valuedouble;
    }
    cJSON_Delete(ev);
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *userp) {
    struct req *q = userp;
    size_t n = size * nmemb;
    double t = pd_bench_now();
    if (q->cut)
        return 0;
    if (q->status == 0)
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->status);
    size_t room = q->status == 200 ? n : (q->len < ERRBODY_MAX ? ERRBODY_MAX - q->len : 0);
    size_t take = n < room ? n : room;
    if (pd_array_grow((void **)&q->buf, &q->cap, q->len + take + 1, 1) != PD_OK)
        return 0; /* curl fails the transfer with a write error */
    memcpy(q->buf + q->len, ptr, take);
    q->len += take;
    q->buf[q->len] = '\0';
    if (q->status != 200)
        return n; /* kept for the error message */
    /* Cut complete lines; a `data:` line is one event (servers send one JSON per line). */
    size_t pos = 0;
    while (!q->cut) {
        char *nl = memchr(q->buf + pos, '\n', q->len - pos);
        if (!nl)
            break;
        char *line = q->buf + pos;
        size_t ll = (size_t)(nl - line);
        pos += ll + 1;
        if (ll && line[ll - 1] == '\r')
            ll--;
        line[ll] = '\0';
        if (strncmp(line, "data:", 5) == 0) {
            char *d = line + 5;
            while (*d == ' ')
                d++;
            sse_event(q, d, t);
        }
    }
    if (q->cut)
        return 0; /* the aborting client stops reading here */
    memmove(q->buf, q->buf + pos, q->len - pos);
    q->len -= pos;
    q->buf[q->len] = '\0';
    return n;
}

/* The body of one request as the backend wants it. */
static char *build_body(const struct pd_bench_load *l, const struct pd_bench_prompt *p,
                        int max_output, const cJSON *extra) {
    int out_len = max_output > 0 && p->output_len > max_output ? max_output : p->output_len;
    cJSON *b = cJSON_CreateObject();
    if (!b)
        return NULL;
    cJSON *prompt =
        p->ids ? cJSON_CreateIntArray(p->ids, p->prompt_len) : cJSON_CreateString(p->text);
    if (l->backend == PD_BENCH_SGLANG) {
        cJSON_AddItemToObject(b, p->ids ? "input_ids" : "text", prompt);
        cJSON *sp = cJSON_AddObjectToObject(b, "sampling_params");
        cJSON_AddNumberToObject(sp, "max_new_tokens", out_len);
        cJSON_AddNumberToObject(sp, "temperature", 0.0);
        cJSON_AddBoolToObject(sp, "ignore_eos", l->ignore_eos);
    } else {
        cJSON_AddStringToObject(b, "model", l->model ? l->model : "default");
        if (l->backend == PD_BENCH_OPENAI) {
            cJSON_AddItemToObject(b, "prompt", prompt);
        } else {
            cJSON *msgs = cJSON_AddArrayToObject(b, "messages");
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "user");
            cJSON_AddItemToObject(m, "content", prompt);
            cJSON_AddItemToArray(msgs, m);
        }
        cJSON_AddNumberToObject(b, "max_tokens", out_len);
        cJSON_AddNumberToObject(b, "temperature", 0.0);
        cJSON_AddBoolToObject(b, "ignore_eos", l->ignore_eos);
        cJSON *so = cJSON_AddObjectToObject(b, "stream_options");
        cJSON_AddBoolToObject(so, "include_usage", true);
    }
    cJSON_AddBoolToObject(b, "stream", true);
    const cJSON *it;
    cJSON_ArrayForEach(it, extra) {
        cJSON_DeleteItemFromObjectCaseSensitive(b, it->string);
        cJSON_AddItemToObject(b, it->string, cJSON_Duplicate(it, true));
    }
    char *s = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    return s;
}

static void req_free(struct req *q) {
    if (q->easy)
        curl_easy_cleanup(q->easy);
    curl_slist_free_all(q->headers);
    if (q->body)
        cJSON_free(q->body);
    pd_free(q->buf);
    memset(q, 0, sizeof(*q));
}

/* Fills res from how the transfer ended, at t (s since the load began). */
static void finish(struct req *q, CURLcode code, double t) {
    struct pd_bench_result *r = q->res;
    r->end = t;
    r->tokens = q->tokens_seen;
    if (q->status == 0)
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->status);
    if (q->cut && !r->error) {
        r->cut = true; /* whatever curl says: the client closed it */
        return;
    }
    if (code != CURLE_OK) {
        fail(q, "transport: %s", q->errbuf[0] ? q->errbuf : curl_easy_strerror(code));
    } else if (q->status != 200) {
        const char *msg = q->buf ? q->buf : "";
        cJSON *j = cJSON_Parse(msg);
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
        if (!cJSON_IsString(m))
            m = cJSON_GetObjectItemCaseSensitive(j, "message");
        if (!cJSON_IsString(m))
            m = cJSON_GetObjectItemCaseSensitive(j, "detail");
        fail(q, "HTTP %ld: %.300s", q->status, cJSON_IsString(m) ? m->valuestring : msg);
        cJSON_Delete(j);
    } else if (!q->got_first) {
        fail(q, "the stream ended without a token");
    } else if (!q->done_marker) {
        fail(q, "the stream ended without data: [DONE] (truncated)");
    }
    r->ok = r->error == NULL;
    if (r->ok) {
        r->e2e = q->t_end - q->t_start;
        r->output_len = q->server_count >= 0 ? q->server_count : q->tokens_seen;
    }
}

/* A disconnecting client's socket: close() sends a reset, not an orderly FIN. */
static int sockopt_reset(void *clientp, curl_socket_t fd, curlsocktype purpose) {
    (void)clientp;
    (void)purpose;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    return CURL_SOCKOPT_OK;
}

static int req_start(struct req *q, CURLM *multi, size_t i, double t0) {
    q->easy = curl_easy_init();
    if (!q->easy)
        return pd_errorf(PD_ENOMEM, "curl_easy_init for request %zu", i);
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, q->l->api_url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(q->body));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, q->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, q->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    if (getenv("PD_BENCH_CURL_VERBOSE"))
        curl_easy_setopt(e, CURLOPT_VERBOSE, 1L);
    if (q->l->timeout_s > 0)
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(q->l->timeout_s * 1e3));
    if (q->fate == PD_BENCH_FATE_DISCONNECT) { /* a connection of its own, reset when dropped */
        curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
        curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
        curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, sockopt_reset);
    }
    q->t_start = pd_bench_now();
    q->res->start = q->t_start - t0;
    CURLMcode mc = curl_multi_add_handle(multi, e);
    if (mc != CURLM_OK)
        return pd_errorf(PD_EINTERNAL, "curl_multi_add_handle: %s", curl_multi_strerror(mc));
    return PD_OK;
}

static void progress(const struct pd_bench_load *l, bool tty, size_t done, size_t n, int failed,
                     double elapsed, bool last) {
    if (tty) {
        int width = 30, fill = n ? (int)(width * done / n) : width;
        fprintf(stderr, "\r%s [", l->label ? l->label : "");
        for (int i = 0; i < width; i++)
            fputc(i < fill ? '#' : ' ', stderr);
        fprintf(stderr, "] %zu/%zu  %.1f s  %d failed%s", done, n, elapsed, failed,
                last ? "\n" : "");
    } else {
        fprintf(stderr, "%s: %zu/%zu requests done, %d failed, %.1f s\n", l->label ? l->label : "",
                done, n, failed, elapsed);
    }
    fflush(stderr);
}

/* Each request's fate, from a stream of its own (seeded apart from the arrivals, so adding
 * misbehaviour leaves the arrival times as they were). An aborting client reads 1..8 tokens,
 * always fewer than its output when that has two or more. */
static void draw_fates(const struct pd_bench_load *l, const struct pd_bench_prompt *prompts,
                       size_t n, int max_output, struct req *qs) {
    uint64_t x = l->seed ^ 0xfa7ef00du, s[4];
    for (int i = 0; i < 4; i++)
        s[i] = pd_splitmix64(&x);
    for (size_t i = 0; i < n; i++) {
        double u = (double)(pd_xoshiro256ss(s) >> 11) * 0x1.0p-53;
        double v = (double)(pd_xoshiro256ss(s) >> 11) * 0x1.0p-53;
        int out_len = prompts[i].output_len;
        if (max_output > 0 && out_len > max_output)
            out_len = max_output;
        struct req *q = &qs[i];
        if (u < l->abort_fraction) {
            int most = out_len - 1 < 8 ? out_len - 1 : 8;
            most = most < 1 ? 1 : most;
            q->fate = PD_BENCH_FATE_ABORT;
            q->abort_after = 1 + (int)(v * most);
        } else if (u < l->abort_fraction + l->disconnect_fraction) {
            q->fate = PD_BENCH_FATE_DISCONNECT;
            q->disconnect_after = v * l->disconnect_window_s;
        }
        q->res->fate = q->fate;
    }
}

/* --output-requests: one line per request as it ends; times also as Unix seconds, so a test or
 * a soak can put them beside its own clock. */
static void write_request(const struct pd_bench_load *l, const struct req *q, double t0_unix) {
    if (!l->requests_out)
        return;
    const struct pd_bench_result *r = q->res;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
    if (isinf(l->request_rate))
        cJSON_AddStringToObject(o, "request_rate", "inf");
    else
        cJSON_AddNumberToObject(o, "request_rate", l->request_rate);
    cJSON_AddNumberToObject(o, "index", (double)q->index);
    cJSON_AddStringToObject(o, "fate", pd_bench_fate_names[q->fate]);
    cJSON_AddStringToObject(o, "outcome", r->ok ? "completed" : r->cut ? "cut" : "failed");
    cJSON_AddNumberToObject(o, "start", r->start);
    cJSON_AddNumberToObject(o, "end", r->end);
    cJSON_AddNumberToObject(o, "start_unix", t0_unix + r->start);
    cJSON_AddNumberToObject(o, "end_unix", t0_unix + r->end);
    cJSON_AddNumberToObject(o, "prompt_len", r->prompt_len);
    cJSON_AddNumberToObject(o, "tokens", r->tokens);
    if (q->got_first)
        cJSON_AddNumberToObject(o, "ttft", r->ttft);
    else
        cJSON_AddNullToObject(o, "ttft");
    /* cJSON makes no array of 0 numbers from NULL: the key would go missing */
    cJSON_AddItemToObject(
        o, "itl", r->n_itl ? cJSON_CreateDoubleArray(r->itl, (int)r->n_itl) : cJSON_CreateArray());
    if (r->error)
        cJSON_AddStringToObject(o, "error", r->error);
    else
        cJSON_AddNullToObject(o, "error");
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (line) {
        fprintf(l->requests_out, "%s\n", line);
        fflush(l->requests_out);
        cJSON_free(line);
    }
}

int pd_bench_load_run(const struct pd_bench_load *l, const struct pd_bench_prompt *prompts,
                      size_t n, int max_output, struct pd_bench_result *out, double *duration) {
    int rc = PD_OK;
    cJSON *extra = NULL;
    if (l->extra_body) {
        extra = cJSON_Parse(l->extra_body);
        if (!cJSON_IsObject(extra)) {
            cJSON_Delete(extra);
            return pd_errorf(PD_EINVAL, "--extra-request-body: not a JSON object: %s",
                             l->extra_body);
        }
    }
    struct req *qs = pd_calloc(n ? n : 1, sizeof(*qs));
    double *arrival = pd_calloc(n ? n : 1, sizeof(double));
    CURLM *multi = curl_multi_init();
    if (!qs || !arrival || !multi) {
        rc = pd_errorf(PD_ENOMEM, "load of %zu requests", n);
        goto done;
    }
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
    char auth[512];
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", l->api_key ? l->api_key : "");
    for (size_t i = 0; i < n; i++) {
        struct req *q = &qs[i];
        q->l = l;
        q->index = i;
        q->res = &out[i];
        q->server_count = -1;
        q->res->prompt_len = prompts[i].prompt_len;
        q->body = build_body(l, &prompts[i], max_output, extra);
        q->headers = curl_slist_append(NULL, "Content-Type: application/json");
        /* no "Expect: 100-continue" round trip for bodies over 1 KiB */
        struct curl_slist *h = q->headers ? curl_slist_append(q->headers, "Expect:") : NULL;
        if (h && l->api_key)
            h = curl_slist_append(h, auth);
        if (!q->body || !h) {
            rc = pd_errorf(PD_ENOMEM, "request body %zu", i);
            goto done;
        }
    }
    /* Arrival times: the first at 0, then exponential gaps (Poisson process). */
    struct {
        uint64_t s[4];
    } rng;
    uint64_t x = l->seed ^ 0x5bd1e995u;
    for (int i = 0; i < 4; i++)
        rng.s[i] = pd_splitmix64(&x);
    for (size_t i = 1; i < n; i++) {
        double gap = 0;
        if (isfinite(l->request_rate)) {
            double u = (double)(pd_xoshiro256ss(rng.s) >> 11) * 0x1.0p-53; /* [0, 1) */
            gap = -log1p(-u) / l->request_rate;
        }
        arrival[i] = arrival[i - 1] + gap;
    }
    draw_fates(l, prompts, n, max_output, qs);

    bool tty = isatty(STDERR_FILENO);
    size_t next = 0, done_n = 0, oldest = 0; /* no request below oldest is in flight */
    int active = 0, failed = 0;
    double t0 = pd_bench_now(), last_progress = t0;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    double t0_unix = (double)rt.tv_sec + (double)rt.tv_nsec * 1e-9;
    while (done_n < n) {
        double now = pd_bench_now();
        while (next < n && arrival[next] <= now - t0 &&
               (l->max_concurrency <= 0 || active < l->max_concurrency)) {
            if ((rc = req_start(&qs[next], multi, next, t0)))
                goto done;
            next++;
            active++;
        }
        int running;
        CURLMcode mc = curl_multi_perform(multi, &running);
        if (mc != CURLM_OK) {
            rc = pd_errorf(PD_EINTERNAL, "curl_multi_perform: %s", curl_multi_strerror(mc));
            goto done;
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct req *q;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&q);
            CURLcode code = msg->data.result;
            curl_multi_remove_handle(multi, q->easy);
            finish(q, code, pd_bench_now() - t0);
            failed += !q->res->ok && !q->res->cut;
            write_request(l, q, t0_unix);
            req_free(q);
            active--;
            done_n++;
        }
        /* Disconnecting clients whose time has come drop their connections. */
        double next_drop = INFINITY;
        now = pd_bench_now();
        while (oldest < next && !qs[oldest].easy)
            oldest++;
        for (size_t i = oldest; i < next; i++) {
            struct req *q = &qs[i];
            if (!q->easy || q->fate != PD_BENCH_FATE_DISCONNECT)
                continue;
            double at = q->t_start + q->disconnect_after;
            if (at > now) {
                next_drop = at < next_drop ? at : next_drop;
                continue;
            }
            curl_multi_remove_handle(multi, q->easy);   /* closes the socket: a reset */
            q->cut = !q->res->error && !q->done_marker; /* a finished answer is not cut */
            finish(q, CURLE_OK, now - t0);
            failed += !q->res->ok && !q->res->cut;
            write_request(l, q, t0_unix);
            req_free(q);
            active--;
            done_n++;
        }
        now = pd_bench_now();
        if (l->progress && (now - last_progress >= (tty ? 0.2 : 10.0))) {
            progress(l, tty, done_n, n, failed, now - t0, false);
            last_progress = now;
        }
        if (done_n == n)
            break;
        /* Sleep until the next arrival (if one may start), a socket event, or a progress tick. */
        double wait = tty ? 0.2 : 1.0;
        if (next < n && (l->max_concurrency <= 0 || active < l->max_concurrency)) {
            double until = arrival[next] - (now - t0);
            wait = until < wait ? until : wait;
        }
        if (next_drop - now < wait)
            wait = next_drop - now;
        int wait_ms = wait <= 0 ? 0 : (int)ceil(wait * 1e3);
        if (wait_ms > 0 || active > 0) {
            mc = curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
            if (mc != CURLM_OK) {
                rc = pd_errorf(PD_EINTERNAL, "curl_multi_poll: %s", curl_multi_strerror(mc));
                goto done;
            }
        }
    }
    *duration = pd_bench_now() - t0;
    if (l->progress)
        progress(l, tty, done_n, n, failed, pd_bench_now() - t0, true);
done:
    if (qs) {
        for (size_t i = 0; i < n; i++) {
            if (qs[i].easy && multi)
                curl_multi_remove_handle(multi, qs[i].easy);
            req_free(&qs[i]);
        }
    }
    if (multi)
        curl_multi_cleanup(multi);
    pd_free(qs);
    pd_free(arrival);
    cJSON_Delete(extra);
    return rc;
}

/* A GET's answer, kept up to its cap. */
struct get_body {
    char *p;
    size_t len, cap, max;
    bool too_big;
};

static size_t on_get_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    struct get_body *b = ud;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->max) {
        b->too_big = true;
        return 0; /* curl fails the transfer with a write error */
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *q = pd_realloc(b->p, cap);
        if (!q)
            return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, ptr, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

int pd_bench_http_get(const char *url, const char *api_key, size_t max_bytes, char **body,
                      long *status) {
    *body = NULL;
    *status = 0;
    CURL *e = curl_easy_init();
    if (!e)
        return pd_errorf(PD_ENOMEM, "curl_easy_init");
    char auth[512], errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *h = NULL;
    if (api_key) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", api_key);
        h = curl_slist_append(NULL, auth);
    }
    struct get_body b = {.max = max_bytes};
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_get_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
    CURLcode code = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    int rc = PD_OK;
    if (b.too_big)
        rc = pd_errorf(PD_EPEER, "%s: answer longer than %zu bytes", url, max_bytes);
    else if (code != CURLE_OK)
        rc = pd_errorf(PD_EPEER, "cannot reach %s: %s (curl error %d)", url,
                       errbuf[0] ? errbuf : curl_easy_strerror(code), (int)code);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    if (rc)
        pd_free(b.p);
    else
        *body = b.p;
    return rc;
}

int pd_bench_probe(const char *base_url, const char *api_key, char **model_id, int *max_model_len) {
    *model_id = NULL;
    *max_model_len = 0;
    static const char *const paths[] = {"/v1/models", "/health"};
    for (int k = 0; k < 2; k++) {
        char url[2048];
        snprintf(url, sizeof(url), "%s%s", base_url, paths[k]);
        char *body;
        long status;
        int rc = pd_bench_http_get(url, api_key, 1 << 20, &body, &status);
        if (rc)
            return rc;
        if (k == 0 && status == 200) {
            cJSON *j = cJSON_Parse(body ? body : "");
            const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "data"), 0);
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m0, "id");
            const cJSON *ml = cJSON_GetObjectItemCaseSensitive(m0, "max_model_len");
            if (cJSON_IsString(id))
                *model_id = pd_strdup(id->valuestring);
            if (cJSON_IsNumber(ml))
                *max_model_len = (int)ml->valuedouble;
            cJSON_Delete(j);
        }
        pd_free(body);
        if (k == 0 && status == 200)
            return PD_OK;
        if (k == 1 && status != 200 && status != 404)
            return pd_errorf(PD_EPEER, "%s answered HTTP %ld (and %s/v1/models did not answer 200)",
                             url, status, base_url);
    }
    return PD_OK;
}
