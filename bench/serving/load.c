/*
 * load.c — one open-loop load: requests leave at their arrival times whatever the server does
 * (Poisson: exponential gaps of mean 1/rate, the first at 0, as bench_serving's get_request),
 * held back only by --max-concurrency; every answer is streamed (SSE) and timed chunk by chunk.
 *
 * One thread, curl multi on its own poll loop (curl_multi_poll with a timeout up to the next
 * arrival): a chunk's timestamp is taken in the write callback, i.e. when curl hands us the
 * bytes after the poll woke, so a timestamp is late by at most one loop turn (microseconds on an
 * idle client). Nothing blocks between arrivals. Bodies are built before the load starts so the
 * send path does no JSON work (except for the turns of a conversation, below).
 *
 * A request fails on a transport error, an HTTP status other than 200, an error event in the
 * stream, a stream with no token, or a stream that ends without `data: [DONE]` (truncated);
 * the failure keeps a one-line reason for the report.
 *
 * Multi-turn conversations (prompts with turn >= 1): a turn leaves at its arrival time or when
 * its conversation's previous turn has ended, whichever is later, so requests may leave out of
 * index order; its prompt is built then (the previous turn's prompt and answer, then the turn's
 * new text) and counted with the tokenizer: the only requests whose body is made on the send
 * path. The answer a turn needs is kept from its stream: /generate streams the whole text so
 * far (SGLang's and pdserve's cumulative text), the OpenAI shapes stream deltas.
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
#include "model/tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
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
    bool keep_answer;        /* a conversation's turn: its answer's text is kept */
    char *answer;            /* NUL-terminated when answer_len > 0 */
    size_t answer_len, answer_cap;
    char errbuf[CURL_ERROR_SIZE];
};

enum req_state { REQ_WAITING = 0, REQ_SENT, REQ_ENDED };
#define NO_PREV SIZE_MAX

/* One load's requests and what the conversations among them have said so far. */
struct run {
    const struct pd_bench_load *l;
    const struct pd_bench_prompt *prompts; /* [n] */
    size_t n;
    int max_output;
    const cJSON *extra;    /* --extra-request-body, or NULL */
    struct req *qs;        /* [n] */
    double *arrival;       /* [n] s since the load began */
    unsigned char *state;  /* [n] enum req_state */
    size_t *prev;          /* [n] the conversation's previous turn, or NO_PREV */
    char **answers;        /* [n] a completed turn's answer text; NULL = none (empty) */
    double t0, t0_unix;    /* the load's start, CLOCK_MONOTONIC and CLOCK_REALTIME s */
    size_t active, done_n; /* requests in flight, ended */
    int failed;            /* ended neither completed nor cut */
    size_t next;           /* no request below it waits to be sent */
    size_t oldest, hi;     /* every request in flight lies in [oldest, hi) */
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

/* A turn's answer text: /generate's text is the whole answer so far, the OpenAI shapes send the
 * new piece. */
static void keep_answer(struct req *q, const char *text, bool whole) {
    if (!q->keep_answer || !text)
        return;
    size_t len = strlen(text), at = whole ? 0 : q->answer_len;
    if (pd_array_grow((void **)&q->answer, &q->answer_cap, at + len + 1, 1) != PD_OK) {
        fail(q, "out of memory keeping the answer (%zu bytes)", at + len);
        return;
    }
    memcpy(q->answer + at, text, len + 1);
    q->answer_len = at + len;
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
        const cJSON *whole = cJSON_GetObjectItemCaseSensitive(ev, "text");
        if (cJSON_IsString(whole))
            keep_answer(q, whole->valuestring, true);
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
        if (cJSON_IsString(tx) && tx->valuestring[0]) {
            keep_answer(q, tx->valuestring, false);
            token_event(q, 1, t);
        }
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

/* The body of one request as the backend wants it. messages (openai-chat; taken over, also on
 * failure): the conversation to send instead of one user message with p's text. */
static char *build_body(const struct pd_bench_load *l, const struct pd_bench_prompt *p,
                        int max_output, const cJSON *extra, cJSON *messages) {
    int out_len = max_output > 0 && p->output_len > max_output ? max_output : p->output_len;
    cJSON *b = cJSON_CreateObject();
    if (!b) {
        cJSON_Delete(messages);
        return NULL;
    }
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
        } else if (messages) {
            cJSON_Delete(prompt);
            cJSON_AddItemToObject(b, "messages", messages);
            messages = NULL;
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
    cJSON_Delete(messages); /* not a chat body */
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
    pd_free(q->answer);
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

/* Whether request i may leave: it is no turn, or its conversation's previous turn has ended. */
static bool turn_ready(const struct run *run, size_t i) {
    return run->prev[i] == NO_PREV || run->state[run->prev[i]] == REQ_ENDED;
}

/* Turn i's body as it leaves: every earlier turn's new text followed by its answer, then turn i's
 * new text (each turn's prompt is the previous turn's prompt + answer + its new text); for
 * openai-chat the same pieces as alternating user / assistant messages. *prompt_len: the text's
 * tokens (no special token added), whatever the backend. */
static int turn_body(const struct run *run, size_t i, char **body, int *prompt_len) {
    const struct pd_bench_load *l = run->l;
    size_t k = 0;
    for (size_t j = i; j != NO_PREV; j = run->prev[j])
        k++;
    size_t *chain = pd_malloc(k * sizeof(size_t)); /* [k] oldest turn first, i last */
    if (!chain)
        return pd_errorf(PD_ENOMEM, "turn %zu: %zu turns", i, k);
    size_t m = k, len = 0;
    for (size_t j = i; j != NO_PREV; j = run->prev[j])
        chain[--m] = j;
    for (m = 0; m < k; m++) {
        PD_ASSERT(run->prompts[chain[m]].text); /* the multiturn dataset makes text */
        len += strlen(run->prompts[chain[m]].text);
        if (m + 1 < k && run->answers[chain[m]])
            len += strlen(run->answers[chain[m]]);
    }
    char *text = pd_malloc(len + 1);
    cJSON *messages = l->backend == PD_BENCH_OPENAI_CHAT ? cJSON_CreateArray() : NULL;
    int rc = PD_OK;
    if (!text || (l->backend == PD_BENCH_OPENAI_CHAT && !messages)) {
        rc = pd_errorf(PD_ENOMEM, "turn %zu: a prompt of %zu bytes", i, len);
        goto done;
    }
    size_t at = 0;
    for (m = 0; m < k; m++) {
        const char *said[2] = {run->prompts[chain[m]].text,
                               m + 1 < k && run->answers[chain[m]] ? run->answers[chain[m]] : ""};
        static const char *const role[2] = {"user", "assistant"};
        for (int w = 0; w < (m + 1 < k ? 2 : 1); w++) {
            size_t n = strlen(said[w]);
            memcpy(text + at, said[w], n);
            at += n;
            if (messages) {
                cJSON *msg = cJSON_CreateObject();
                cJSON_AddItemToArray(messages, msg);
                cJSON_AddStringToObject(msg, "role", role[w]);
                cJSON_AddStringToObject(msg, "content", said[w]);
            }
        }
    }
    text[at] = '\0';
    struct pd_token_ids ids = {0};
    rc = pd_tokenizer_encode(l->tok, text, at, 0, &ids);
    *prompt_len = (int)ids.n;
    pd_token_ids_free(&ids);
    if (rc) {
        rc = pd_error_wrap(rc, "turn %zu: counting the prompt's tokens", i);
        goto done;
    }
    struct pd_bench_prompt p = run->prompts[i];
    p.text = text;
    p.ids = NULL;
    p.prompt_len = *prompt_len;
    *body = build_body(l, &p, run->max_output, run->extra, messages);
    messages = NULL; /* build_body took it */
    if (!*body)
        rc = pd_errorf(PD_ENOMEM, "turn %zu: request body", i);
done:
    cJSON_Delete(messages);
    pd_free(text);
    pd_free(chain);
    return rc;
}

static int req_start(struct run *run, CURLM *multi, size_t i) {
    struct req *q = &run->qs[i];
    if (run->prompts[i].turn >= 1) {
        int rc = turn_body(run, i, &q->body, &q->res->prompt_len);
        if (rc)
            return rc;
        q->keep_answer = true;
    }
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
    q->res->start = q->t_start - run->t0;
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
    if (r->length_class >= 0)
        cJSON_AddNumberToObject(o, "length_class", r->length_class);
    if (r->turn >= 1) {
        cJSON_AddNumberToObject(o, "conversation", r->conversation);
        cJSON_AddNumberToObject(o, "turn", r->turn);
    }
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

/* Ends request q as curl says (CURLE_OK for a connection the client dropped) at now: its record,
 * the answer a later turn needs, its slot. */
static void req_end(struct run *run, struct req *q, CURLcode code, double now) {
    finish(q, code, now - run->t0);
    run->failed += !q->res->ok && !q->res->cut;
    write_request(run->l, q, run->t0_unix);
    if (q->keep_answer && q->res->ok) {
        run->answers[q->index] = q->answer; /* NULL for an empty answer */
        q->answer = NULL;
    }
    run->state[q->index] = REQ_ENDED;
    req_free(q);
    run->active--;
    run->done_n++;
}

/* The turns' order: turn k > 1 of a conversation follows the latest earlier prompt of that
 * conversation, which must be its turn k - 1. Prompts of no turn follow nothing. */
static int link_turns(struct run *run) {
    int max_conv = -1;
    for (size_t i = 0; i < run->n; i++) {
        run->prev[i] = NO_PREV;
        if (run->prompts[i].turn >= 1 && run->prompts[i].conversation > max_conv)
            max_conv = run->prompts[i].conversation;
    }
    if (max_conv < 0)
        return PD_OK;
    if (!run->l->tok)
        return pd_errorf(PD_EINVAL, "a multi-turn load needs the tokenizer to count its prompts");
    size_t *last = pd_malloc(((size_t)max_conv + 1) * sizeof(size_t)); /* [conversation] */
    if (!last)
        return pd_errorf(PD_ENOMEM, "%d conversations", max_conv + 1);
    for (int c = 0; c <= max_conv; c++)
        last[c] = NO_PREV;
    int rc = PD_OK;
    for (size_t i = 0; i < run->n && !rc; i++) {
        const struct pd_bench_prompt *p = &run->prompts[i];
        if (p->turn < 1)
            continue;
        PD_ASSERT(p->conversation >= 0);
        size_t j = last[p->conversation];
        if (p->turn > 1 && (j == NO_PREV || run->prompts[j].turn != p->turn - 1))
            rc = pd_errorf(PD_EINVAL,
                           "prompt %zu: turn %d of conversation %d comes before its "
                           "turn %d",
                           i, p->turn, p->conversation, p->turn - 1);
        run->prev[i] = p->turn > 1 ? j : NO_PREV;
        last[p->conversation] = i;
    }
    pd_free(last);
    return rc;
}

/* Sends every request whose arrival time has come and whose conversation's previous turn has
 * ended, lowest index first, as far as --max-concurrency allows. */
static int send_due(struct run *run, CURLM *multi, double now) {
    int cap = run->l->max_concurrency;
    while (run->next < run->n && run->state[run->next] != REQ_WAITING)
        run->next++;
    for (size_t i = run->next; i < run->n && run->arrival[i] <= now - run->t0; i++) {
        if (cap > 0 && run->active >= (size_t)cap)
            break;
        if (run->state[i] != REQ_WAITING || !turn_ready(run, i))
            continue;
        int rc = req_start(run, multi, i);
        if (rc)
            return rc;
        run->state[i] = REQ_SENT;
        run->active++;
        run->hi = i + 1 > run->hi ? i + 1 : run->hi;
    }
    return PD_OK;
}

/* s since the load began when the next request may leave; INFINITY when none may until a turn
 * ends or a slot frees (a socket event wakes the loop then). Scans past the turns still waiting
 * for their predecessors: a multi-turn load holds conversations x turns requests, few. */
static double next_departure(const struct run *run) {
    int cap = run->l->max_concurrency;
    if (cap > 0 && run->active >= (size_t)cap)
        return INFINITY;
    for (size_t i = run->next; i < run->n; i++)
        if (run->state[i] == REQ_WAITING && turn_ready(run, i))
            return run->arrival[i];
    return INFINITY;
}

/* Disconnecting clients whose time has come drop their connections; *next_drop: the next one's
 * time (CLOCK_MONOTONIC s, INFINITY for none). */
static void drop_due(struct run *run, CURLM *multi, double now, double *next_drop) {
    *next_drop = INFINITY;
    while (run->oldest < run->hi && run->state[run->oldest] == REQ_ENDED)
        run->oldest++;
    for (size_t i = run->oldest; i < run->hi; i++) {
        struct req *q = &run->qs[i];
        if (run->state[i] != REQ_SENT || q->fate != PD_BENCH_FATE_DISCONNECT)
            continue;
        double at = q->t_start + q->disconnect_after;
        if (at > now) {
            *next_drop = at < *next_drop ? at : *next_drop;
            continue;
        }
        curl_multi_remove_handle(multi, q->easy);   /* closes the socket: a reset */
        q->cut = !q->res->error && !q->done_marker; /* a finished answer is not cut */
        req_end(run, q, CURLE_OK, now);
    }
}

int pd_bench_load_run(const struct pd_bench_load *l, const struct pd_bench_prompt *prompts,
                      size_t n, int max_output, struct pd_bench_result *out, double *duration) {
    int rc = PD_OK;
    struct run run = {.l = l, .prompts = prompts, .n = n, .max_output = max_output};
    cJSON *extra = NULL;
    if (l->extra_body) {
        extra = cJSON_Parse(l->extra_body);
        if (!cJSON_IsObject(extra)) {
            cJSON_Delete(extra);
            return pd_errorf(PD_EINVAL, "--extra-request-body: not a JSON object: %s",
                             l->extra_body);
        }
    }
    run.extra = extra;
    size_t m = n ? n : 1;
    run.qs = pd_calloc(m, sizeof(*run.qs));
    run.arrival = pd_calloc(m, sizeof(double));
    run.state = pd_calloc(m, 1);
    run.prev = pd_calloc(m, sizeof(size_t));
    run.answers = pd_calloc(m, sizeof(char *));
    CURLM *multi = curl_multi_init();
    if (!run.qs || !run.arrival || !run.state || !run.prev || !run.answers || !multi) {
        rc = pd_errorf(PD_ENOMEM, "load of %zu requests", n);
        goto done;
    }
    if ((rc = link_turns(&run)))
        goto done;
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
    char auth[512];
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", l->api_key ? l->api_key : "");
    for (size_t i = 0; i < n; i++) {
        struct req *q = &run.qs[i];
        const struct pd_bench_prompt *p = &prompts[i];
        q->l = l;
        q->index = i;
        q->res = &out[i];
        q->server_count = -1;
        q->res->prompt_len = p->prompt_len;
        q->res->length_class = p->length_class;
        q->res->conversation = p->conversation;
        q->res->turn = p->turn;
        /* a turn's body is made when it leaves (turn_body) */
        q->body = p->turn >= 1 ? NULL : build_body(l, p, max_output, extra, NULL);
        q->headers = curl_slist_append(NULL, "Content-Type: application/json");
        /* no "Expect: 100-continue" round trip for bodies over 1 KiB */
        struct curl_slist *h = q->headers ? curl_slist_append(q->headers, "Expect:") : NULL;
        if (h && l->api_key)
            h = curl_slist_append(h, auth);
        if ((!q->body && p->turn < 1) || !h) {
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
        run.arrival[i] = run.arrival[i - 1] + gap;
    }
    draw_fates(l, prompts, n, max_output, run.qs);

    bool tty = isatty(STDERR_FILENO);
    run.t0 = pd_bench_now();
    double last_progress = run.t0;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    run.t0_unix = (double)rt.tv_sec + (double)rt.tv_nsec * 1e-9;
    while (run.done_n < n) {
        if ((rc = send_due(&run, multi, pd_bench_now())))
            goto done;
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
            req_end(&run, q, code, pd_bench_now());
        }
        double next_drop;
        drop_due(&run, multi, pd_bench_now(), &next_drop);
        double now = pd_bench_now();
        if (l->progress && (now - last_progress >= (tty ? 0.2 : 10.0))) {
            progress(l, tty, run.done_n, n, run.failed, now - run.t0, false);
            last_progress = now;
        }
        if (run.done_n == n)
            break;
        /* Sleep until the next departure, a socket event, or a progress tick. */
        double wait = tty ? 0.2 : 1.0;
        double until = run.t0 + next_departure(&run) - now;
        wait = until < wait ? until : wait;
        if (next_drop - now < wait)
            wait = next_drop - now;
        int wait_ms = wait <= 0 ? 0 : (int)ceil(wait * 1e3);
        if (wait_ms > 0 || run.active > 0) {
            mc = curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
            if (mc != CURLM_OK) {
                rc = pd_errorf(PD_EINTERNAL, "curl_multi_poll: %s", curl_multi_strerror(mc));
                goto done;
            }
        }
    }
    *duration = pd_bench_now() - run.t0;
    if (l->progress)
        progress(l, tty, run.done_n, n, run.failed, pd_bench_now() - run.t0, true);
done:
    for (size_t i = 0; run.qs && i < n; i++) {
        if (run.qs[i].easy && multi)
            curl_multi_remove_handle(multi, run.qs[i].easy);
        req_free(&run.qs[i]);
    }
    for (size_t i = 0; run.answers && i < n; i++)
        pd_free(run.answers[i]);
    if (multi)
        curl_multi_cleanup(multi);
    pd_free(run.qs);
    pd_free(run.arrival);
    pd_free(run.state);
    pd_free(run.prev);
    pd_free(run.answers);
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

/* One blocking request: GET, or POST of post_json when it is not NULL. */
static int http_call(const char *url, const char *api_key, const char *post_json, size_t max_bytes,
                     char **body, long *status) {
    *body = NULL;
    *status = 0;
    CURL *e = curl_easy_init();
    if (!e)
        return pd_errorf(PD_ENOMEM, "curl_easy_init");
    char auth[512], errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *h = NULL;
    if (post_json)
        h = curl_slist_append(h, "Content-Type: application/json");
    if (api_key) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", api_key);
        h = curl_slist_append(h, auth);
    }
    struct get_body b = {.max = max_bytes};
    curl_easy_setopt(e, CURLOPT_URL, url);
    if (post_json)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, post_json);
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

int pd_bench_http_get(const char *url, const char *api_key, size_t max_bytes, char **body,
                      long *status) {
    return http_call(url, api_key, NULL, max_bytes, body, status);
}

int pd_bench_flush_cache(const char *base_url, const char *api_key) {
    char url[2100], *body;
    long status;
    snprintf(url, sizeof(url), "%s/flush_cache", base_url);
    int rc = http_call(url, api_key, "{}", 1 << 16, &body, &status); /* the answer is dropped */
    pd_free(body);
    if (rc == PD_OK && status != 200)
        rc = pd_errorf(PD_EPEER, "POST %s answered HTTP %ld", url, status);
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
