/* common/http_server on 127.0.0.1 (ephemeral port), in-process on its own uv loop thread, driven
 * by libcurl as a client would: JSON routes, 404/405, 401 API key, 413 for a 10 MB body (with
 * and without Expect: 100-continue, and chunked), 400 from the API parser, SSE streams whose
 * tokens come from a separate "compute" thread through uv_async (one and several at once),
 * a client leaving mid-stream and before any byte, also on a GET without a body (the daemon's
 * on_gone fires and the compute side stops), raw streams (any status and content type, bytes as
 * they are), backpressure (a producer that waits on pd_http_stream_on_drain keeps a slow
 * client's backlog bounded), a client that resets its connection (RST) mid-stream or before
 * the answer (the connection still closes), an idle keep-alive connection reset by its client
 * (it closes), and a graceful shutdown that finishes a running stream, cuts a stuck request at the
 * deadline and closes every handle (uv_loop_close succeeds).
 * With --tls the same cases run over HTTPS (a self-signed certificate made here with OpenSSL in a
 * scratch directory; the clients trust it), plus: the context's errors name the flag and file
 * (missing file, no PEM, a key of another certificate, one of the two flags alone, a CA bundle
 * without certificates), a plain HTTP client and a client that does not trust the certificate
 * fail cleanly and the server serves on, and a client that closes with a TLS close_notify before
 * its FIN is still seen leaving.
 * Limits: 413 and 431 messages with the sizes, and a second server's per-client limit (429 with
 * Retry-After, per address, released when a request is answered or its client leaves). */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/api.h"
#include "common/base/http_server.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "common/base/tls.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define API_KEY "sk-test"
#define MAX_JOBS 64

/* ---------------------------------------------------------------- fake compute thread */

struct job {
    atomic_int state; /* 0 free, 1 queued/running, 2 finished */
    atomic_int cancel;
    atomic_int produced;
    int n_tokens;
    int delay_ms;
    int64_t next_at_ms;
};

struct token_event {
    int job;
    int index;
    bool last;
};

static struct job jobs[MAX_JOBS];
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct token_event events[4096];
static int n_events;
static atomic_int compute_stop;
static atomic_int compute_hold; /* set: no job produces a token (cancels still end jobs) */
static atomic_int chat_streams; /* streams h_chat handed to the compute thread */
static uv_async_t token_async;  /* compute → loop */
static uv_async_t ctl_async;    /* main → loop: shutdown */
static uv_async_t stats_async;  /* main → loop: read the server's connection count */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *compute_main(void *arg) {
    (void)arg;
    while (!atomic_load(&compute_stop)) {
        int64_t t = now_ms();
        bool any = false;
        for (int i = 0; i < MAX_JOBS; i++) {
            struct job *j = &jobs[i];
            if (atomic_load(&j->state) != 1 || t < j->next_at_ms)
                continue;
            if (atomic_load(&j->cancel)) {
                atomic_store(&j->state, 2);
                continue;
            }
            if (atomic_load(&compute_hold))
                continue;
            int k = atomic_load(&j->produced);
            pthread_mutex_lock(&ev_mu);
            bool room = n_events < (int)PD_ARRAY_LEN(events);
            if (room)
                events[n_events++] = (struct token_event){i, k, k + 1 == j->n_tokens};
            pthread_mutex_unlock(&ev_mu);
            if (!room)
                continue;
            atomic_store(&j->produced, k + 1);
            j->next_at_ms = t + j->delay_ms;
            if (k + 1 == j->n_tokens)
                atomic_store(&j->state, 2);
            any = true;
        }
        if (any)
            uv_async_send(&token_async);
        usleep(1000);
    }
    return NULL;
}

/* ---------------------------------------------------------------- the daemon side (loop) */

struct stream {
    struct pd_http_req *req; /* NULL when finished or gone */
    struct pd_api_request api;
    int job;
    char id[64];
};

static struct stream streams[MAX_JOBS];
static struct pd_http_server *srv;
static atomic_int gone_count;
static atomic_int closed_called;
static struct pd_http_req *stuck_req; /* /slow: never answered */
static uv_loop_t loop;

static void stream_gone(struct pd_http_req *req, void *user) {
    struct stream *st = user;
    (void)req;
    atomic_fetch_add(&gone_count, 1);
    if (st) {
        atomic_store(&jobs[st->job].cancel, 1); /* the daemon aborts the request */
        st->req = NULL;
        pd_api_request_free(&st->api);
    } else {
        stuck_req = NULL;
    }
}

static void on_tokens(uv_async_t *a) {
    (void)a;
    struct token_event batch[4096];
    pthread_mutex_lock(&ev_mu);
    int n = n_events;
    memcpy(batch, events, (size_t)n * sizeof(batch[0]));
    n_events = 0;
    pthread_mutex_unlock(&ev_mu);
    for (int i = 0; i < n; i++) {
        struct stream *st = &streams[batch[i].job];
        if (!st->req)
            continue;
        char piece[32];
        snprintf(piece, sizeof(piece), "tok%d ", batch[i].index);
        struct pd_api_result res = {.id = st->id,
                                    .model = "tiny",
                                    .created = 1,
                                    .text = piece,
                                    .text_len = strlen(piece),
                                    .prompt_tokens = 3,
                                    .completion_tokens = batch[i].index + 1,
                                    .matched_token = -1,
                                    .finish =
                                        batch[i].last ? PD_API_FINISH_LENGTH : PD_API_FINISH_NONE};
        char *json = NULL;
        CHECK_OK(pd_api_render_chat_chunk(&st->api, &res, batch[i].index == 0, &json));
        int rc = pd_http_sse_send(st->req, json, strlen(json));
        pd_free(json);
        if (rc != PD_OK)
            continue; /* gone: on_gone already ran */
        if (batch[i].last) {
            if (st->api.include_usage) {
                CHECK_OK(pd_api_render_usage_chunk(&st->api, &res, &json));
                pd_http_sse_send(st->req, json, strlen(json));
                pd_free(json);
            }
            pd_http_sse_end(st->req);
            st->req = NULL;
            pd_api_request_free(&st->api);
        }
    }
}

static void h_health(struct pd_http_req *r, void *ud) {
    (void)ud;
    pd_http_respond_json(r, 200, "{\"status\":\"ok\"}");
}

static void h_echo(struct pd_http_req *r, void *ud) {
    (void)ud;
    size_t len;
    pd_http_req_body(r, &len);
    char out[128];
    snprintf(out, sizeof(out), "{\"len\":%zu,\"query\":\"%s\"}", len, pd_http_req_query(r));
    pd_http_req_add_header(r, "X-Request-Id", "abc");
    pd_http_respond_json(r, 200, out);
}

/* /raw: a raw stream, bytes exactly as given (no SSE framing), any status and content type. */
static void h_raw(struct pd_http_req *r, void *ud) {
    (void)ud;
    CHECK_OK(pd_http_stream_start(r, 201, "application/x-ndjson"));
    CHECK_OK(pd_http_stream_send(r, "{\"a\":1}\n", 8));
    CHECK_OK(pd_http_stream_send(r, "", 0));
    CHECK_OK(pd_http_stream_send(r, "data: x\r\n\x01\xff", 11));
    CHECK_OK(pd_http_stream_end(r));
}

/* /flood: FLOOD_TOTAL bytes (byte i = i % 251) as fast as the client takes them, but never more
 * than FLOOD_HIGH queued: the producer waits on pd_http_stream_on_drain. */
#define FLOOD_TOTAL (8u << 20)
#define FLOOD_CHUNK (16u << 10)
#define FLOOD_HIGH (128u << 10)
struct flood {
    struct pd_http_req *req;
    size_t sent;
};
static struct flood flood;
static atomic_size_t flood_peak;     /* the largest backlog right after a send */
static atomic_size_t flood_srv_peak; /* pd_http_server_stats' peak, read on the loop */
static atomic_int flood_waits, flood_done;

static void flood_gone(struct pd_http_req *r, void *ud) {
    (void)r;
    ((struct flood *)ud)->req = NULL;
    atomic_fetch_add(&gone_count, 1);
}

static void flood_pump(struct pd_http_req *r, void *ud) {
    struct flood *f = ud;
    static char chunk[FLOOD_CHUNK];
    while (f->sent < FLOOD_TOTAL) {
        if (pd_http_stream_backlog(r) > FLOOD_HIGH) {
            int rc = pd_http_stream_on_drain(r, FLOOD_HIGH / 2, flood_pump, f);
            if (rc == PD_EAGAIN) {
                atomic_fetch_add(&flood_waits, 1);
                return;
            }
            if (rc != PD_OK)
                return; /* gone */
        }
        size_t n = FLOOD_TOTAL - f->sent < FLOOD_CHUNK ? FLOOD_TOTAL - f->sent : FLOOD_CHUNK;
        for (size_t i = 0; i < n; i++)
            chunk[i] = (char)((f->sent + i) % 251);
        if (pd_http_stream_send(r, chunk, n) != PD_OK)
            return;
        f->sent += n;
        size_t b = pd_http_stream_backlog(r);
        if (b > atomic_load(&flood_peak))
            atomic_store(&flood_peak, b);
    }
    struct pd_http_server_stats st;
    pd_http_server_stats(srv, &st);
    atomic_store(&flood_srv_peak, st.stream_backlog_peak);
    f->req = NULL;
    pd_http_stream_end(r);
    atomic_store(&flood_done, 1);
}

static void h_flood(struct pd_http_req *r, void *ud) {
    (void)ud;
    flood = (struct flood){.req = r};
    CHECK_OK(pd_http_stream_start(r, 200, "application/octet-stream"));
    pd_http_req_on_gone(r, flood_gone, &flood);
    flood_pump(r, &flood);
}

static void h_slow(struct pd_http_req *r, void *ud) {
    (void)ud;
    stuck_req = r; /* answered by nobody: only a disconnect or the shutdown deadline ends it */
    pd_http_req_on_gone(r, stream_gone, NULL);
}

/* /v1/chat/completions: the real parser; "max_tokens" = number of tokens, "temperature" × 100 =
 * ms between tokens (a test convenience). */
static void h_chat(struct pd_http_req *r, void *ud) {
    (void)ud;
    const struct pd_api_config cfg = {.served_model_name = "tiny", .context_length = 4096};
    size_t len;
    const char *body = pd_http_req_body(r, &len);
    struct pd_api_request api;
    struct pd_api_error e;
    if (pd_api_parse(PD_API_CHAT, body, len, &cfg, &api, &e) != PD_OK) {
        pd_http_respond_error(r, &e);
        return;
    }
    if (!api.stream) {
        pd_api_request_free(&api);
        pd_http_respond_json(r, 200, "{\"object\":\"chat.completion\"}");
        return;
    }
    if (api.rid && strcmp(api.rid, "fail") == 0) { /* a mid-stream failure */
        pd_api_request_free(&api);
        CHECK_OK(pd_http_sse_start(r));
        CHECK_OK(pd_http_sse_send(r, "{\"partial\":1}", 13));
        pd_api_error_set(&e, 500, "server_error", NULL, NULL, "the model failed");
        pd_http_sse_fail(r, &e);
        return;
    }
    int slot = -1;
    for (int i = 0; i < MAX_JOBS && slot < 0; i++)
        if (!streams[i].req && atomic_load(&jobs[i].state) != 1)
            slot = i;
    if (slot < 0) {
        pd_api_error_set(&e, 503, "server_error", NULL, NULL, "too many streams");
        pd_api_request_free(&api);
        pd_http_respond_error(r, &e);
        return;
    }
    struct stream *st = &streams[slot];
    st->api = api;
    st->req = r;
    st->job = slot;
    snprintf(st->id, sizeof(st->id), "chatcmpl-%d", slot);
    CHECK_OK(pd_http_sse_start(r));
    pd_http_req_on_gone(r, stream_gone, st);
    struct job *j = &jobs[slot];
    j->n_tokens = api.sampling.max_new_tokens;
    j->delay_ms = (int)(api.sampling.temperature * 100);
    j->next_at_ms = 0;
    atomic_store(&j->produced, 0);
    atomic_store(&j->cancel, 0);
    atomic_store(&j->state, 1); /* handed to the compute thread */
    atomic_fetch_add(&chat_streams, 1);
}

static void on_closed(struct pd_http_server *s, void *ud) {
    (void)s;
    (void)ud;
    atomic_store(&closed_called, 1);
    uv_close((uv_handle_t *)&token_async, NULL);
    uv_close((uv_handle_t *)&ctl_async, NULL);
    uv_close((uv_handle_t *)&stats_async, NULL);
}

static void on_idle_closed(struct pd_http_server *s, void *ud) {
    (void)s;
    (void)ud;
    atomic_store(&closed_called, 1);
}

static atomic_int shutdown_timeout_ms;
static atomic_int shutdown_started; /* pd_http_server_shutdown has returned (listener closed) */
static void on_ctl(uv_async_t *a) {
    (void)a;
    pd_http_server_shutdown(srv, (uint64_t)atomic_load(&shutdown_timeout_ms), on_closed, NULL);
    atomic_store(&shutdown_started, 1);
}

static bool wait_for(atomic_int *v, int want, int timeout_ms);
static atomic_size_t stats_connections;
static atomic_int stats_seq;
static void on_stats(uv_async_t *a) {
    (void)a;
    struct pd_http_server_stats st;
    pd_http_server_stats(srv, &st);
    atomic_store(&stats_connections, st.connections);
    atomic_fetch_add(&stats_seq, 1);
}

/* The server's open connections now (asked on the loop thread). */
static size_t server_connections(void) {
    int seq = atomic_load(&stats_seq);
    uv_async_send(&stats_async);
    wait_for(&stats_seq, seq + 1, 5000);
    return atomic_load(&stats_connections);
}

static void *loop_main(void *arg) {
    (void)arg;
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---------------------------------------------------------------- a server with a per-client limit
 */

/* srv2: max_requests_per_client PER_CLIENT; POST /hold (PD_HTTP_PER_CLIENT) is answered when the
 * test says so, POST /quick (PD_HTTP_PER_CLIENT) at once, GET /health (not counted) at once. */
#define PER_CLIENT 2
#define MAX_HELD 8
static struct pd_http_server *srv2;
static char url2[64];
static struct pd_http_req *held2[MAX_HELD]; /* loop thread only */
static atomic_int n_held2;                  /* /hold requests the handler took, ever */
static atomic_int gone2;
static atomic_int answer2[MAX_HELD]; /* set by the test: on_answer2 answers held2[i] */
static uv_async_t answer2_async, ctl2_async;
static atomic_int closed2;

static void held2_gone(struct pd_http_req *r, void *ud) {
    (void)r;
    held2[(intptr_t)ud] = NULL;
    atomic_fetch_add(&gone2, 1);
}

static void h_hold2(struct pd_http_req *r, void *ud) {
    (void)ud;
    int i = atomic_load(&n_held2);
    CHECK(i < MAX_HELD);
    held2[i] = r;
    pd_http_req_on_gone(r, held2_gone, (void *)(intptr_t)i);
    atomic_store(&n_held2, i + 1);
}

static void h_quick2(struct pd_http_req *r, void *ud) {
    (void)ud;
    pd_http_respond_json(r, 200, "{\"ok\":true}");
}

static void on_answer2(uv_async_t *a) {
    (void)a;
    for (int i = 0; i < MAX_HELD; i++)
        if (atomic_exchange(&answer2[i], 0) && held2[i]) {
            pd_http_respond_json(held2[i], 200, "{\"held\":true}");
            held2[i] = NULL;
        }
}

static void on_closed2(struct pd_http_server *s, void *ud) {
    (void)s;
    (void)ud;
    uv_close((uv_handle_t *)&answer2_async, NULL);
    uv_close((uv_handle_t *)&ctl2_async, NULL);
    atomic_store(&closed2, 1);
}

static void on_ctl2(uv_async_t *a) {
    (void)a;
    pd_http_server_shutdown(srv2, 1000, on_closed2, NULL);
}

/* ---------------------------------------------------------------- client helpers */

struct resp {
    long status;
    char *body;
    size_t len;
    char ctype[128];
    char retry_after[16];
    int abort_after_events; /* > 0: drop the connection after this many SSE events */
    /* set before the call (resp_free keeps none of them): */
    const char *base;       /* another server's http://host:port; NULL = url_base */
    const char *local_addr; /* the client's own address (127.0.0.2: another client) */
    atomic_int *cancel;     /* set: the client drops the connection (within ~100 ms) */
};

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    struct resp *r = ud;
    size_t k = sz * n;
    char *nb = realloc(r->body, r->len + k + 1);
    if (!nb)
        return 0;
    r->body = nb;
    memcpy(r->body + r->len, p, k);
    r->len += k;
    r->body[r->len] = '\0';
    if (r->abort_after_events > 0) {
        int n_ev = 0;
        for (const char *q = r->body; (q = strstr(q, "\n\n")); q += 2)
            n_ev++;
        if (n_ev >= r->abort_after_events)
            return 0; /* curl aborts the transfer and closes the connection */
    }
    return k;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
    struct resp *r = ud;
    size_t k = sz * n;
    if (k > 14 && strncasecmp(p, "content-type: ", 14) == 0)
        snprintf(r->ctype, sizeof(r->ctype), "%.*s", (int)(k - 16), p + 14);
    if (k > 13 && strncasecmp(p, "retry-after: ", 13) == 0)
        snprintf(r->retry_after, sizeof(r->retry_after), "%.*s", (int)(k - 15), p + 13);
    return k;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)dn, (void)ut, (void)un;
    struct resp *r = ud;
    return r->cancel && atomic_load(r->cancel) ? 1 : 0; /* nonzero: curl aborts */
}

static char url_base[64];
static char tls_cert[512];  /* --tls: the server's self-signed certificate, which clients trust */
static SSL_CTX *client_ctx; /* --tls: raw_open's TLS client */

/* A curl handle trusts the server's certificate (after curl_easy_init/reset). */
static void client_tls(CURL *c) {
    if (tls_cert[0])
        curl_easy_setopt(c, CURLOPT_CAINFO, tls_cert);
}

/* body NULL = GET; extra: NULL-terminated headers (an Authorization one replaces the key) */
static CURLcode http(CURL *c, const char *method, const char *path, const char *body, size_t len,
                     const char *const *extra, long timeout_ms, struct resp *out) {
    char url[256];
    snprintf(url, sizeof(url), "%s%s", out->base ? out->base : url_base, path);
    struct curl_slist *h = NULL;
    bool own_auth = false;
    for (int i = 0; extra && extra[i]; i++) {
        h = curl_slist_append(h, extra[i]);
        own_auth |= strncasecmp(extra[i], "Authorization:", 14) == 0;
    }
    if (!own_auth)
        h = curl_slist_append(h, "Authorization: Bearer " API_KEY);
    h = curl_slist_append(h, "Content-Type: application/json");
    curl_easy_reset(c);
    client_tls(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (out->local_addr)
        curl_easy_setopt(c, CURLOPT_INTERFACE, out->local_addr);
    if (out->cancel) {
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, out);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    }
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(h);
    return rc;
}

static void resp_free(struct resp *r) {
    free(r->body);
    memset(r, 0, sizeof(*r));
}

static bool wait_for(atomic_int *v, int want, int timeout_ms) {
    for (int t = 0; t < timeout_ms; t += 5) {
        if (atomic_load(v) >= want)
            return true;
        usleep(5000);
    }
    return atomic_load(v) >= want;
}

/* An OpenAI error body: {"error":{"message","type","param","code"}} */
static void check_error_json(const struct resp *r, const char *code) {
    cJSON *j = r->body ? cJSON_Parse(r->body) : NULL;
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    CHECK(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    CHECK(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    CHECK(cJSON_GetObjectItem(e, "param") != NULL);
    const cJSON *c = cJSON_GetObjectItem(e, "code");
    if (code)
        CHECK(cJSON_IsString(c) && strcmp(c->valuestring, code) == 0);
    if (!e)
        fprintf(stderr, "not an error object: %s\n", r->body ? r->body : "(none)");
    CHECK_STR(r->ctype, "application/json");
    cJSON_Delete(j);
}

/* Checks an SSE chat stream body: n content chunks "tok0 tok1 ...", usage chunk, [DONE]. */
static void check_stream(const struct resp *r, int n, bool usage) {
    CHECK_INT(r->status, 200);
    CHECK_STR(r->ctype, "text/event-stream");
    char want[4096] = "", got[4096] = "";
    for (int i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "tok%d ", i);
    int chunks = 0, usage_chunks = 0, done = 0;
    const char *p = r->body ? r->body : "";
    while (*p) {
        const char *end = strstr(p, "\n\n");
        if (!end || strncmp(p, "data: ", 6) != 0) {
            CHECK(!"malformed SSE event");
            break;
        }
        char ev[2048];
        snprintf(ev, sizeof(ev), "%.*s", (int)(end - p - 6), p + 6);
        if (strcmp(ev, "[DONE]") == 0) {
            done++;
        } else {
            CHECK(done == 0);
            cJSON *j = cJSON_Parse(ev);
            const cJSON *choices = cJSON_GetObjectItem(j, "choices");
            if (cJSON_GetArraySize(choices) == 0) {
                usage_chunks++;
                CHECK(cJSON_IsObject(cJSON_GetObjectItem(j, "usage")));
            } else {
                const cJSON *c0 = cJSON_GetArrayItem(choices, 0);
                const cJSON *d = cJSON_GetObjectItem(c0, "delta");
                strncat(got, cJSON_GetObjectItem(d, "content")->valuestring,
                        sizeof(got) - strlen(got) - 1);
                CHECK((chunks == 0) == (cJSON_GetObjectItem(d, "role") != NULL));
                chunks++;
                const cJSON *fr = cJSON_GetObjectItem(c0, "finish_reason");
                CHECK(chunks == n ? cJSON_IsString(fr) : cJSON_IsNull(fr));
            }
            cJSON_Delete(j);
        }
        p = end + 2;
    }
    CHECK_INT(chunks, n);
    CHECK_INT(usage_chunks, usage ? 1 : 0);
    CHECK_INT(done, 1);
    CHECK_STR(got, want);
}

static char *stream_body(int n_tokens, int delay_ms, bool usage) {
    char *b = malloc(512);
    snprintf(b, 512,
             "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
             "\"stream\":true,\"max_tokens\":%d,\"temperature\":%g%s}",
             n_tokens, delay_ms / 100.0,
             usage ? ",\"stream_options\":{\"include_usage\":true}" : "");
    return b;
}

/* ---------------------------------------------------------------- tests */

static CURL *keepalive; /* reused across tests: an idle keep-alive connection at shutdown */

static void test_routes(void) {
    struct resp r = {0};
    CHECK_INT(http(keepalive, "GET", "/health", NULL, 0, NULL, 5000, &r), CURLE_OK);
    CHECK_INT(r.status, 200);
    CHECK_STR(r.body, "{\"status\":\"ok\"}");
    CHECK_STR(r.ctype, "application/json");
    resp_free(&r);

    CHECK_INT(http(keepalive, "POST", "/echo?x=1", "{\"a\":1}", 7, NULL, 5000, &r), CURLE_OK);
    CHECK_INT(r.status, 200);
    CHECK_STR(r.body, "{\"len\":7,\"query\":\"x=1\"}");
    resp_free(&r);

    CHECK_INT(http(keepalive, "GET", "/nope", NULL, 0, NULL, 5000, &r), CURLE_OK);
    CHECK_INT(r.status, 404);
    check_error_json(&r, "not_found");
    resp_free(&r);

    CHECK_INT(http(keepalive, "POST", "/health", "{}", 2, NULL, 5000, &r), CURLE_OK);
    CHECK_INT(r.status, 405);
    check_error_json(&r, "method_not_allowed");
    resp_free(&r);
}

static void test_api_key(void) {
    CURL *c = curl_easy_init();
    struct resp r = {0};
    char url[256];
    snprintf(url, sizeof(url), "%s/echo", url_base);
    /* no Authorization header at all */
    client_tls(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{}");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    CHECK_INT(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    CHECK_INT(r.status, 401);
    check_error_json(&r, "invalid_api_key");
    resp_free(&r);
    /* a wrong key */
    const char *wrong[] = {"Authorization: Bearer sk-nope", NULL};
    CHECK_INT(http(c, "POST", "/echo", "{}", 2, wrong, 5000, &r), CURLE_OK);
    CHECK_INT(r.status, 401);
    resp_free(&r);
    /* /health is public */
    curl_easy_reset(c);
    client_tls(c);
    snprintf(url, sizeof(url), "%s/health", url_base);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    CHECK_INT(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    CHECK_INT(r.status, 200);
    resp_free(&r);
    curl_easy_cleanup(c);
}

static size_t read_zeros(char *p, size_t sz, size_t n, void *ud) {
    size_t *left = ud;
    size_t k = sz * n < *left ? sz * n : *left;
    memset(p, ' ', k);
    *left -= k;
    return k;
}

static void test_body_limit(void) {
    size_t big = 10u << 20; /* the 10 MB body against the 8 MB default */
    char *body = malloc(big);
    memset(body, ' ', big);
    body[0] = '{';
    body[big - 1] = '}';
    struct resp r = {0};
    /* curl sends Expect: 100-continue for a body this size: refused before the body is sent */
    CURL *c = curl_easy_init();
    CHECK_INT(http(c, "POST", "/v1/chat/completions", body, big, NULL, 10000, &r), CURLE_OK);
    CHECK_INT(r.status, 413);
    check_error_json(&r, "request_too_large");
    CHECK(r.body && strstr(r.body, "\"The request body is larger than the limit of 8388608 "
                                   "bytes.\"") != NULL);
    resp_free(&r);
    /* without Expect: the client is already sending; it still gets the 413 */
    const char *noexpect[] = {"Expect:", NULL};
    CURLcode rc = http(c, "POST", "/v1/chat/completions", body, big, noexpect, 10000, &r);
    if (rc == CURLE_OK) {
        CHECK_INT(r.status, 413);
        check_error_json(&r, "request_too_large");
    } else {
        /* the server closed while the client was still writing; the kernel may reset before the
         * client reads the answer. Acceptable, but say so. */
        fprintf(stderr, "note: 413 without Expect: curl %s (status %ld)\n", curl_easy_strerror(rc),
                r.status);
        CHECK(r.status == 413 || r.status == 0);
    }
    resp_free(&r);
    /* chunked, no length announced: refused once the limit is passed, long before the client
     * could push 64 MB through the socket buffers */
    size_t left = 64u << 20;
    char url[256];
    snprintf(url, sizeof(url), "%s/echo", url_base);
    struct curl_slist *h = curl_slist_append(NULL, "Transfer-Encoding: chunked");
    h = curl_slist_append(h, "Authorization: Bearer " API_KEY);
    curl_easy_reset(c);
    client_tls(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, read_zeros);
    curl_easy_setopt(c, CURLOPT_READDATA, &left);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    if (rc == CURLE_OK) {
        CHECK_INT(r.status, 413);
        check_error_json(&r, "request_too_large");
        CHECK(r.body && strstr(r.body, "\"The request body is larger than the limit of 8388608 "
                                       "bytes.\"") != NULL);
    } else {
        fprintf(stderr, "note: chunked 413: curl %s (status %ld)\n", curl_easy_strerror(rc),
                r.status);
    }
    CHECK(left > 0); /* the server did not take the whole body */
    resp_free(&r);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    /* a body just under the limit is taken */
    size_t ok = PD_HTTP_DEFAULT_MAX_BODY - 1;
    CHECK_INT(http(keepalive, "POST", "/echo", body, ok, NULL, 10000, &r), CURLE_OK);
    CHECK_INT(r.status, 200);
    char want[64];
    snprintf(want, sizeof(want), "{\"len\":%zu,", ok);
    CHECK(r.body && strncmp(r.body, want, strlen(want)) == 0);
    resp_free(&r);
    free(body);
    /* and the server still serves */
    CHECK_INT(http(keepalive, "GET", "/health", NULL, 0, NULL, 5000, &r), CURLE_OK);
    CHECK_INT(r.status, 200);
    resp_free(&r);
}

/* 431 past PD_HTTP_DEFAULT_MAX_HEADER (request line + headers, counted as sent), the exact
 * count in the message; just under it is served, and so is the connection's next request. */
static void test_header_limit(void) {
    CURL *c = curl_easy_init();
    struct resp r = {0};
    /* curl sends: "GET /health HTTP/1.1\r\n" "Host: 127.0.0.1:PORT\r\n" "Accept: * / *\r\n"
     * (no spaces) "Authorization: Bearer sk-test\r\n" "Content-Type: application/json\r\n"
     * "X-Pad: <pad>\r\n" "\r\n" */
    char host[64];
    snprintf(host, sizeof(host), "Host: %s\r\n", strstr(url_base, "://") + 3); /* http, https */
    size_t fixed = strlen("GET /health HTTP/1.1\r\n") + strlen(host) + strlen("Accept: */*\r\n") +
                   strlen("Authorization: Bearer " API_KEY "\r\n") +
                   strlen("Content-Type: application/json\r\n") + strlen("X-Pad: \r\n") + 2;
    size_t limit = PD_HTTP_DEFAULT_MAX_HEADER;
    for (int over = 0; over <= 1; over++) {
        size_t pad = limit - fixed + (size_t)over; /* exactly the limit, then one byte more */
        char *hdr = malloc(pad + 16);
        memcpy(hdr, "X-Pad: ", 7);
        memset(hdr + 7, 'p', pad);
        hdr[7 + pad] = '\0';
        const char *extra[] = {hdr, NULL};
        CHECK_INT(http(c, "GET", "/health", NULL, 0, extra, 5000, &r), CURLE_OK);
        if (!over) {
            CHECK_INT(r.status, 200);
        } else {
            CHECK_INT(r.status, 431);
            check_error_json(&r, "request_header_fields_too_large");
            char want[256];
            snprintf(want, sizeof(want),
                     "Request header fields too large: the request line and headers are %zu "
                     "bytes, more than the limit of %zu bytes.",
                     limit + 1, limit);
            cJSON *j = cJSON_Parse(r.body ? r.body : "");
            const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
            CHECK(cJSON_IsString(m) && strcmp(m->valuestring, want) == 0);
            if (!cJSON_IsString(m) || strcmp(m->valuestring, want) != 0)
                fprintf(stderr, "431 message: %s\nwant: %s\n", r.body, want);
            cJSON_Delete(j);
        }
        resp_free(&r);
        free(hdr);
        /* the connection (curl keeps it) serves the next request */
        CHECK_INT(http(c, "GET", "/health", NULL, 0, NULL, 5000, &r), CURLE_OK);
        CHECK_INT(r.status, 200);
        resp_free(&r);
    }
    curl_easy_cleanup(c);
}

struct holder {
    pthread_t t;
    struct resp r;
    CURLcode rc;
    atomic_int cancel;
};

static void *holder_main(void *p) {
    struct holder *h = p;
    CURL *c = curl_easy_init();
    h->r.base = url2;
    h->r.cancel = &h->cancel;
    h->rc = http(c, "POST", "/hold", "{}", 2, NULL, 20000, &h->r);
    curl_easy_cleanup(c);
    return NULL;
}

/* A /hold request from 127.0.0.1 that the server has taken. */
static void hold(struct holder *h) {
    int before = atomic_load(&n_held2);
    pthread_create(&h->t, NULL, holder_main, h);
    CHECK(wait_for(&n_held2, before + 1, 5000));
}

/* POST /quick on srv2 from local_addr: its status (429: also its Retry-After and message). */
static long quick(const char *local_addr, char *msg, size_t cap) {
    CURL *c = curl_easy_init();
    struct resp r = {.base = url2, .local_addr = local_addr};
    CHECK_INT(http(c, "POST", "/quick", "{}", 2, NULL, 5000, &r), CURLE_OK);
    long st = r.status;
    if (st == 429) {
        check_error_json(&r, "rate_limit_exceeded");
        CHECK_STR(r.retry_after, "1");
        cJSON *j = cJSON_Parse(r.body ? r.body : "");
        const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
        snprintf(msg, cap, "%s", cJSON_IsString(m) ? m->valuestring : "");
        cJSON_Delete(j);
    }
    resp_free(&r);
    curl_easy_cleanup(c);
    return st;
}

/* max_requests_per_client: the third request of an address with two in flight gets 429 (with
 * Retry-After and a message naming the numbers and the flag) on any counted route, while an
 * uncounted route and another address are served; a slot comes back when a request is
 * answered and when its client goes away. */
static void test_per_client_limit(void) {
    char msg[512];
    struct holder a = {0}, b = {0}, d = {0};
    hold(&a);
    hold(&b);
    CHECK_INT(quick(NULL, msg, sizeof(msg)), 429);
    CHECK_STR(msg, "Too many concurrent requests from 127.0.0.1: 2 in flight, the limit is 2 per "
                   "client address (--max-concurrent-requests-per-client). Retry once one has "
                   "finished.");
    /* /hold is counted too: refused, never reaches its handler */
    {
        CURL *c = curl_easy_init();
        struct resp r = {.base = url2};
        CHECK_INT(http(c, "POST", "/hold", "{}", 2, NULL, 5000, &r), CURLE_OK);
        CHECK_INT(r.status, 429);
        CHECK_INT(atomic_load(&n_held2), 2);
        resp_free(&r);
        /* an uncounted route is served */
        r.base = url2;
        CHECK_INT(http(c, "GET", "/health", NULL, 0, NULL, 5000, &r), CURLE_OK);
        CHECK_INT(r.status, 200);
        resp_free(&r);
        curl_easy_cleanup(c);
    }
    /* another client address has its own budget */
    CHECK_INT(quick("127.0.0.2", msg, sizeof(msg)), 200);
    /* a request answered gives its slot back */
    atomic_store(&answer2[0], 1);
    uv_async_send(&answer2_async);
    pthread_join(a.t, NULL);
    CHECK_INT(a.rc, CURLE_OK);
    CHECK_INT(a.r.status, 200);
    CHECK_INT(quick(NULL, msg, sizeof(msg)), 200);
    hold(&d); /* two in flight again (b, d) */
    CHECK_INT(quick(NULL, msg, sizeof(msg)), 429);
    /* a client that goes away gives its slot back */
    int gone_before = atomic_load(&gone2);
    atomic_store(&b.cancel, 1);
    pthread_join(b.t, NULL);
    CHECK_INT(b.rc, CURLE_ABORTED_BY_CALLBACK);
    CHECK(wait_for(&gone2, gone_before + 1, 5000));
    CHECK_INT(quick(NULL, msg, sizeof(msg)), 200);
    atomic_store(&d.cancel, 1);
    pthread_join(d.t, NULL);
    CHECK(wait_for(&gone2, gone_before + 2, 5000));
    resp_free(&a.r);
    resp_free(&b.r);
    resp_free(&d.r);
    uv_async_send(&ctl2_async);
    CHECK(wait_for(&closed2, 1, 10000));
}

static void test_bad_requests(void) {
    struct resp r = {0};
    const char *bodies[] = {
        "{not json",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"temperature\":-1}",
        "{\"model\":\"tiny\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(bodies); i++) {
        CHECK_INT(http(keepalive, "POST", "/v1/chat/completions", bodies[i], strlen(bodies[i]),
                       NULL, 5000, &r),
                  CURLE_OK);
        CHECK_INT(r.status, 400);
        check_error_json(&r, NULL);
        resp_free(&r);
    }
    const char *unknown =
        "{\"model\":\"gpt-9\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}";
    CHECK_INT(
        http(keepalive, "POST", "/v1/chat/completions", unknown, strlen(unknown), NULL, 5000, &r),
        CURLE_OK);
    CHECK_INT(r.status, 404);
    check_error_json(&r, "model_not_found");
    resp_free(&r);
}

static void test_stream(void) {
    CURL *c = curl_easy_init();
    struct resp r = {0};
    char *b = stream_body(20, 2, true);
    CHECK_INT(http(c, "POST", "/v1/chat/completions", b, strlen(b), NULL, 20000, &r), CURLE_OK);
    check_stream(&r, 20, true);
    resp_free(&r);
    free(b);
    /* the same connection serves a second stream (keep-alive after a chunked response) */
    b = stream_body(5, 0, false);
    CHECK_INT(http(c, "POST", "/v1/chat/completions", b, strlen(b), NULL, 20000, &r), CURLE_OK);
    check_stream(&r, 5, false);
    resp_free(&r);
    free(b);
    curl_easy_cleanup(c);
}

static void test_stream_error(void) {
    struct resp r = {0};
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stream\":true,"
                    "\"rid\":\"fail\"}";
    CHECK_INT(http(keepalive, "POST", "/v1/chat/completions", b, strlen(b), NULL, 5000, &r),
              CURLE_OK);
    CHECK_INT(r.status, 200);
    CHECK_STR(r.body,
              "data: {\"partial\":1}\n\ndata: {\"error\":{\"message\":\"the model failed\","
              "\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n");
    resp_free(&r);
}

struct client_arg {
    int n_tokens;
    struct resp r;
    CURLcode rc;
};

static void *client_main(void *p) {
    struct client_arg *a = p;
    CURL *c = curl_easy_init();
    char *b = stream_body(a->n_tokens, 1, true);
    a->rc = http(c, "POST", "/v1/chat/completions", b, strlen(b), NULL, 30000, &a->r);
    free(b);
    curl_easy_cleanup(c);
    return NULL;
}

static void test_concurrent_streams(void) {
    enum { N = 16 };
    pthread_t t[N];
    struct client_arg args[N];
    memset(args, 0, sizeof(args));
    for (int i = 0; i < N; i++) {
        args[i].n_tokens = 10 + i * 3;
        pthread_create(&t[i], NULL, client_main, &args[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        CHECK_INT(args[i].rc, CURLE_OK);
        check_stream(&args[i].r, args[i].n_tokens, true);
        resp_free(&args[i].r);
    }
}

static void test_disconnect_mid_stream(void) {
    int before = atomic_load(&gone_count);
    CURL *c = curl_easy_init();
    struct resp r = {.abort_after_events = 3};
    char *b = stream_body(1000, 5, false); /* 5 s of tokens if nobody stops it */
    CURLcode rc = http(c, "POST", "/v1/chat/completions", b, strlen(b), NULL, 20000, &r);
    CHECK_INT(rc, CURLE_WRITE_ERROR); /* we dropped it */
    curl_easy_cleanup(c);
    int64_t t0 = now_ms();
    CHECK(wait_for(&gone_count, before + 1, 3000)); /* on_gone: the daemon aborts */
    fprintf(stderr, "note: on_gone %lld ms after the client left\n", (long long)(now_ms() - t0));
    /* the compute side was told to stop long before the 1000 tokens */
    int produced = 0;
    for (int i = 0; i < MAX_JOBS; i++)
        if (jobs[i].n_tokens == 1000)
            produced = atomic_load(&jobs[i].produced);
    CHECK(produced > 0 && produced < 1000);
    resp_free(&r);
    free(b);
}

static void test_disconnect_before_response(void) {
    int before = atomic_load(&gone_count);
    CURL *c = curl_easy_init();
    struct resp r = {0};
    /* the handler never answers; the client gives up after 300 ms */
    CURLcode rc = http(c, "POST", "/slow", "{\"x\":1}", 7, NULL, 300, &r);
    CHECK_INT(rc, CURLE_OPERATION_TIMEDOUT);
    curl_easy_cleanup(c);
    CHECK(wait_for(&gone_count, before + 1, 3000));
    resp_free(&r);
}

/* The same for a GET: no body, so h2o left method/path/headers in the socket buffer that the
 * server's watch reads into; the request must still be seen leaving. */
static void test_disconnect_before_response_get(void) {
    int before = atomic_load(&gone_count);
    CURL *c = curl_easy_init();
    struct resp r = {0};
    CURLcode rc = http(c, "GET", "/slow?x=1", NULL, 0, NULL, 300, &r);
    CHECK_INT(rc, CURLE_OPERATION_TIMEDOUT);
    curl_easy_cleanup(c);
    CHECK(wait_for(&gone_count, before + 1, 3000));
    resp_free(&r);
}

static void test_raw_stream(void) {
    struct resp r = {0};
    CHECK_INT(http(keepalive, "POST", "/raw", "{}", 2, NULL, 5000, &r), CURLE_OK);
    CHECK_INT(r.status, 201);
    CHECK_STR(r.ctype, "application/x-ndjson");
    CHECK_INT(r.len, 19);
    CHECK(r.body && memcmp(r.body, "{\"a\":1}\ndata: x\r\n\x01\xff", 19) == 0);
    resp_free(&r);
    /* the connection is still good */
    CHECK_INT(http(keepalive, "GET", "/health", NULL, 0, NULL, 5000, &r), CURLE_OK);
    CHECK_INT(r.status, 200);
    resp_free(&r);
}

struct slow_reader {
    size_t got;
    bool bad;
    bool slept;
};

static size_t slow_read(char *p, size_t sz, size_t n, void *ud) {
    struct slow_reader *s = ud;
    size_t k = sz * n;
    if (!s->slept) {
        s->slept = true;
        usleep(700000); /* the client stops reading for a while */
    }
    for (size_t i = 0; i < k; i++)
        s->bad |= (unsigned char)p[i] != (s->got + i) % 251;
    s->got += k;
    return k;
}

static int small_rcvbuf(void *ud, curl_socket_t fd, curlsocktype purpose) {
    (void)ud;
    (void)purpose;
    int v = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
    return CURL_SOCKOPT_OK;
}

static void test_backpressure(void) {
    CURL *c = curl_easy_init();
    struct slow_reader sr = {0};
    char url[256];
    snprintf(url, sizeof(url), "%s/flood", url_base);
    struct curl_slist *h = curl_slist_append(NULL, "Authorization: Bearer " API_KEY);
    client_tls(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, slow_read);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sr);
    curl_easy_setopt(c, CURLOPT_SOCKOPTFUNCTION, small_rcvbuf);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30000L);
    CHECK_INT(curl_easy_perform(c), CURLE_OK);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    CHECK_INT(status, 200);
    CHECK(sr.got == FLOOD_TOTAL && !sr.bad); /* every byte, in order */
    CHECK(wait_for(&flood_done, 1, 3000));
    /* the producer had to wait for the slow client, and what was queued stayed bounded */
    CHECK(atomic_load(&flood_waits) >= 1);
    CHECK(atomic_load(&flood_peak) <= FLOOD_HIGH + FLOOD_CHUNK);
    CHECK(atomic_load(&flood_srv_peak) <= FLOOD_HIGH + FLOOD_CHUNK);
    fprintf(stderr, "note: backpressure: %d waits, peak backlog %zu bytes for %u sent\n",
            atomic_load(&flood_waits), (size_t)atomic_load(&flood_peak), FLOOD_TOTAL);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
}

/* ---- a raw client connection (TLS under --tls), for what curl will not do: resets, half-reads */

struct raw {
    int fd;
    SSL *ssl; /* --tls */
};

static bool raw_open(struct raw *c) {
    c->ssl = NULL;
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(pd_http_server_port(srv)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        return false;
    struct timeval tv = {.tv_sec = 5};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (!client_ctx)
        return true;
    c->ssl = SSL_new(client_ctx);
    SSL_set_fd(c->ssl, c->fd);
    return SSL_connect(c->ssl) == 1;
}

static bool raw_send(struct raw *c, const char *p, size_t n) {
    return c->ssl ? SSL_write(c->ssl, p, (int)n) == (int)n : send(c->fd, p, n, 0) == (ssize_t)n;
}

static ssize_t raw_recv(struct raw *c, char *p, size_t n) {
    return c->ssl ? SSL_read(c->ssl, p, (int)n) : recv(c->fd, p, n, 0);
}

/* Reads into got (NUL-terminated) until `until` arrived, EOF or 5 s; true when it arrived. */
static bool raw_recv_until(struct raw *c, char *got, size_t cap, const char *until) {
    size_t len = strlen(got);
    while (!strstr(got, until) && len < cap - 1) {
        ssize_t k = raw_recv(c, got + len, cap - 1 - len);
        if (k <= 0)
            break;
        len += (size_t)k;
        got[len] = '\0';
    }
    return strstr(got, until) != NULL;
}

/* Ends the connection: reset (SO_LINGER 0: RST, not FIN), or an orderly close (over TLS a
 * close_notify first, as a client library closing its connection sends, on its own for a moment
 * so that the server reads it apart from the FIN). */
static void raw_close(struct raw *c, bool reset) {
    if (reset) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    } else if (c->ssl) {
        SSL_shutdown(c->ssl);
        usleep(200000);
    }
    SSL_free(c->ssl);
    close(c->fd);
}

/* A raw client that sends `path` with `body`, reads until `until` arrived (NULL: until /slow's
 * handler has the request), then
 * resets the connection (SO_LINGER 0: RST, not FIN). The server sees the reset through its
 * watch read, which leaves the stream unwritable for libuv; the answer h2o then writes must not
 * wait forever for a write callback: the connection has to close (it did not: a draining router
 * hung at SIGTERM). */
static void leave_client(const char *path, const char *body, const char *until, bool reset) {
    int before_gone = atomic_load(&gone_count);
    size_t before = server_connections();
    struct raw c;
    CHECK(raw_open(&c));
    char req[1024];
    int n = snprintf(req, sizeof(req),
                     "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " API_KEY
                     "\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     path, strlen(body), body);
    CHECK(raw_send(&c, req, (size_t)n));
    char got[8192] = "";
    CHECK(!until || raw_recv_until(&c, got, sizeof(got), until));
    for (int i = 0; !until && !stuck_req && i < 500; i++) /* /slow reached its handler */
        usleep(10000);
    CHECK(until || stuck_req);
    raw_close(&c, reset);
    CHECK(wait_for(&gone_count, before_gone + 1, 3000)); /* on_gone: the daemon stops */
    size_t now = before + 1;
    for (int i = 0; i < 300 && (now = server_connections()) > before; i++)
        usleep(10000);
    if (now > before)
        fprintf(stderr, "%s: the client's connection is still open (%zu > %zu)\n", path, now,
                before);
    CHECK(now <= before);
}

static void reset_client(const char *path, const char *body, const char *until) {
    leave_client(path, body, until, true);
}

static void test_reset_mid_stream(void) {
    /* tokens every 50 ms: between two writes nothing is in flight when the reset arrives */
    char *b = stream_body(1000, 50, false);
    reset_client("/v1/chat/completions", b, "tok1 ");
    free(b);
}

static void test_reset_before_response(void) {
    reset_client("/slow", "{\"x\":1}", NULL);
}

/* A keep-alive connection that served a request and sits idle is reset by its client: h2o's own
 * read sees the reset (no request is open, so no watch of ours), and the connection must close.
 * (Over TLS the close used to write a close_notify that libuv refused: it never closed.) */
static void test_reset_idle(void) {
    size_t before = server_connections();
    struct raw c;
    CHECK(raw_open(&c));
    const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(raw_send(&c, req, sizeof(req) - 1));
    char got[1024] = "";
    CHECK(raw_recv_until(&c, got, sizeof(got), "{\"status\":\"ok\"}"));
    CHECK(server_connections() == before + 1);
    raw_close(&c, true);
    size_t now = before + 1;
    for (int i = 0; i < 300 && (now = server_connections()) > before; i++)
        usleep(10000);
    CHECK(now <= before);
}

/* ---- --tls only */

/* Writes a fresh P-256 key and a self-signed certificate for 127.0.0.1 / localhost. */
static bool make_cert(const char *cert_path, const char *key_path) {
    EVP_PKEY *pk = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    bool ok = pk && x;
    if (ok) {
        X509_set_version(x, 2);
        ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
        X509_gmtime_adj(X509_getm_notBefore(x), -60);
        X509_gmtime_adj(X509_getm_notAfter(x), 86400);
        X509_set_pubkey(x, pk);
        X509_NAME *nm = X509_get_subject_name(x);
        X509_NAME_add_entry_by_txt(nm, "CN", MBSTRING_ASC, (const unsigned char *)"pdserve test",
                                   -1, -1, 0);
        X509_set_issuer_name(x, nm);
        X509V3_CTX v3;
        X509V3_set_ctx_nodb(&v3);
        X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
        X509_EXTENSION *ext =
            X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
        ok = ext && X509_add_ext(x, ext, -1) && X509_sign(x, pk, EVP_sha256());
        X509_EXTENSION_free(ext);
    }
    FILE *fc = ok ? fopen(cert_path, "w") : NULL, *fk = ok ? fopen(key_path, "w") : NULL;
    ok = fc && fk && PEM_write_X509(fc, x) &&
         PEM_write_PrivateKey(fk, pk, NULL, NULL, 0, NULL, NULL);
    if (fc)
        fclose(fc);
    if (fk)
        fclose(fk);
    X509_free(x);
    EVP_PKEY_free(pk);
    return ok;
}

static char tls_dir[512];

static bool has(const char *msg, const char *a, const char *b) {
    bool ok = strstr(msg, a) && (!b || strstr(msg, b));
    if (!ok)
        fprintf(stderr, "message lacks '%s'/'%s': %s\n", a, b ? b : "", msg);
    return ok;
}

static void test_tls_ctx_errors(void) {
    char key[600], other_cert[600], other_key[600], junk[600];
    snprintf(key, sizeof(key), "%s/key.pem", tls_dir);
    snprintf(other_cert, sizeof(other_cert), "%s/other-cert.pem", tls_dir);
    snprintf(other_key, sizeof(other_key), "%s/other-key.pem", tls_dir);
    snprintf(junk, sizeof(junk), "%s/junk.pem", tls_dir);
    CHECK(make_cert(other_cert, other_key));
    FILE *f = fopen(junk, "w");
    fputs("not a certificate\n", f);
    fclose(f);
    struct ssl_ctx_st *ctx = NULL;
    CHECK_INT(pd_tls_server_ctx_new("/nonexistent/cert.pem", key, &ctx), PD_ENOENT);
    CHECK(has(pd_error_msg(), "--ssl-certfile", "/nonexistent/cert.pem"));
    CHECK_INT(pd_tls_server_ctx_new(tls_cert, "/nonexistent/key.pem", &ctx), PD_ENOENT);
    CHECK(has(pd_error_msg(), "--ssl-keyfile", "/nonexistent/key.pem"));
    CHECK_INT(pd_tls_server_ctx_new(junk, key, &ctx), PD_EFORMAT);
    CHECK(has(pd_error_msg(), "--ssl-certfile", junk));
    CHECK_INT(pd_tls_server_ctx_new(tls_cert, junk, &ctx), PD_EFORMAT);
    CHECK(has(pd_error_msg(), "--ssl-keyfile", junk));
    CHECK_INT(pd_tls_server_ctx_new(tls_cert, other_key, &ctx), PD_EMISMATCH);
    CHECK(has(pd_error_msg(), other_key, "is not the private key"));
    CHECK(ctx == NULL);
    CHECK_OK(pd_tls_server_ctx_new(other_cert, other_key, &ctx));
    pd_tls_ctx_free(ctx);
    struct pd_tls_flags only_cert = {.certfile = tls_cert}, only_key = {.keyfile = key};
    CHECK_INT(pd_tls_flags_check(&only_cert), PD_EINVAL);
    CHECK(has(pd_error_msg(), "--ssl-keyfile", NULL));
    CHECK_INT(pd_tls_flags_check(&only_key), PD_EINVAL);
    CHECK(has(pd_error_msg(), "--ssl-certfile", NULL));
    CHECK_OK(pd_tls_ca_check(tls_cert));
    CHECK_INT(pd_tls_ca_check(junk), PD_EFORMAT);
    CHECK(has(pd_error_msg(), "--ssl-ca-certs", junk));
    CHECK_INT(pd_tls_ca_check("/nonexistent/ca.pem"), PD_ENOENT);
}

/* curl on url (its own handle); the result, after which the connection is gone. */
static CURLcode get_once(const char *url, bool trust) {
    CURL *c = curl_easy_init();
    struct resp r = {0};
    if (trust)
        client_tls(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    resp_free(&r);
    return rc;
}

/* Plain HTTP on the HTTPS port, and a client that does not trust the certificate: both fail at
 * once (no hang, no answer), their connections close, and the server serves on. */
static void test_tls_refusals(void) {
    size_t before = server_connections();
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/health", pd_http_server_port(srv));
    int64_t t0 = now_ms();
    CURLcode rc = get_once(url, false);
    fprintf(stderr, "note: plain HTTP on the HTTPS port: curl %s after %lld ms\n",
            curl_easy_strerror(rc), (long long)(now_ms() - t0));
    CHECK(rc == CURLE_GOT_NOTHING || rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR);
    snprintf(url, sizeof(url), "%s/health", url_base);
    rc = get_once(url, false); /* the system's roots only */
    CHECK(rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE);
    size_t now = before + 1;
    for (int i = 0; i < 300 && (now = server_connections()) > before; i++)
        usleep(10000);
    CHECK(now <= before);
    CHECK_INT(get_once(url, true), CURLE_OK);
}

/* A client that closes the TLS way (close_notify, then FIN) while its request waits: the record
 * decrypts to no data, and the FIN after it must still be seen. */
static void test_tls_close_notify_before_response(void) {
    leave_client("/slow", "{\"x\":1}", NULL, false);
}

static void *slow_client_main(void *p) {
    struct client_arg *a = p;
    CURL *c = curl_easy_init();
    a->rc = http(c, "POST", "/slow", "{\"x\":1}", 7, NULL, 30000, &a->r);
    curl_easy_cleanup(c);
    return NULL;
}

static void test_graceful_shutdown(void) {
    /* a stream held by the compute thread (it cannot finish before the shutdown starts), and a
     * request nobody answers */
    enum { DEADLINE_MS = 2000 };
    struct client_arg streaming = {.n_tokens = 30};
    struct client_arg stuck = {0};
    pthread_t ts, tk;
    int streams_before = atomic_load(&chat_streams);
    atomic_store(&compute_hold, 1);
    pthread_create(&ts, NULL, client_main, &streaming);
    pthread_create(&tk, NULL, slow_client_main, &stuck);
    /* both reached their handlers: the stream started (headers sent), /slow is held */
    CHECK(wait_for(&chat_streams, streams_before + 1, 10000));
    for (int i = 0; i < 2000 && !stuck_req; i++)
        usleep(5000);
    CHECK(stuck_req != NULL);
    int before = atomic_load(&gone_count);
    int64_t t0 = now_ms();
    atomic_store(&shutdown_timeout_ms, DEADLINE_MS);
    uv_async_send(&ctl_async);
    CHECK(wait_for(&shutdown_started, 1, 10000));
    /* no new connections */
    CURL *c = curl_easy_init();
    struct resp r = {0};
    CURLcode rc = http(c, "GET", "/health", NULL, 0, NULL, 2000, &r);
    CHECK(rc == CURLE_COULDNT_CONNECT);
    resp_free(&r);
    curl_easy_cleanup(c);
    /* the held stream runs now, during the drain (~30 ms of tokens against a 2 s deadline) */
    atomic_store(&compute_hold, 0);
    pthread_join(ts, NULL);
    /* the running stream finished whole */
    CHECK_INT(streaming.rc, CURLE_OK);
    check_stream(&streaming.r, 30, true);
    resp_free(&streaming.r);
    pthread_join(tk, NULL);
    int64_t took = now_ms() - t0;
    /* the stuck one was cut by the server at the deadline (on_gone), not by the client's own
     * 30 s timeout; t0 was read before the shutdown began, so it cannot read as early */
    CHECK(stuck.rc != CURLE_OK || stuck.r.status == 499);
    CHECK(stuck.rc != CURLE_OPERATION_TIMEDOUT);
    CHECK(wait_for(&gone_count, before + 1, 10000));
    CHECK(stuck_req == NULL);
    CHECK(took >= DEADLINE_MS - 100);
    fprintf(stderr, "note: shutdown: stuck request ended after %lld ms (deadline %d)\n",
            (long long)took, DEADLINE_MS);
    resp_free(&stuck.r);
    CHECK(wait_for(&closed_called, 1, 10000));
}

int main(int argc, char **argv) {
    bool tls = argc > 1 && strcmp(argv[1], "--tls") == 0;
    signal(SIGPIPE, SIG_IGN); /* as the daemons and the router: a write to a gone peer fails */
    pd_log_set_level(PD_LOG_WARNING);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CHECK_INT(uv_loop_init(&loop), 0);
    uv_async_init(&loop, &token_async, on_tokens);
    uv_async_init(&loop, &ctl_async, on_ctl);
    uv_async_init(&loop, &stats_async, on_stats);
    struct pd_http_server_config cfg = {.host = "127.0.0.1", .port = 0, .api_key = API_KEY};
    if (tls) {
        char key[600];
        if (pd_test_scratch_dir(tls_dir, sizeof(tls_dir), "http_server_tls") != PD_OK)
            return 1;
        snprintf(tls_cert, sizeof(tls_cert), "%s/cert.pem", tls_dir);
        snprintf(key, sizeof(key), "%s/key.pem", tls_dir);
        CHECK(make_cert(tls_cert, key));
        CHECK_OK(pd_tls_server_ctx_new(tls_cert, key, &cfg.ssl_ctx));
        client_ctx = SSL_CTX_new(TLS_client_method());
        SSL_CTX_load_verify_locations(client_ctx, tls_cert, NULL);
        SSL_CTX_set_verify(client_ctx, SSL_VERIFY_PEER, NULL);
    }
    CHECK_OK(pd_http_server_new(&loop, &cfg, &srv));
    pd_tls_ctx_free(cfg.ssl_ctx); /* the server keeps its own reference */
    CHECK_OK(pd_http_server_route(srv, "GET", "/health", PD_HTTP_PUBLIC, h_health, NULL));
    CHECK_OK(pd_http_server_route(srv, "POST", "/echo", 0, h_echo, NULL));
    CHECK_OK(pd_http_server_route(srv, "POST", "/slow", 0, h_slow, NULL));
    CHECK_OK(pd_http_server_route(srv, "GET", "/slow", 0, h_slow, NULL));
    CHECK_OK(pd_http_server_route(srv, "POST", "/raw", 0, h_raw, NULL));
    CHECK_OK(pd_http_server_route(srv, "GET", "/flood", 0, h_flood, NULL));
    CHECK_OK(pd_http_server_route(srv, "POST", "/v1/chat/completions", 0, h_chat, NULL));
    CHECK_OK(pd_http_server_listen(srv));
    CHECK(pd_http_server_port(srv) > 0);
    snprintf(url_base, sizeof(url_base), "%s://127.0.0.1:%d", tls ? "https" : "http",
             pd_http_server_port(srv));
    uv_async_init(&loop, &answer2_async, on_answer2);
    uv_async_init(&loop, &ctl2_async, on_ctl2);
    struct pd_http_server_config cfg2 = {
        .host = "0.0.0.0", .port = 0, .max_requests_per_client = PER_CLIENT};
    CHECK_OK(pd_http_server_new(&loop, &cfg2, &srv2));
    CHECK_OK(pd_http_server_route(srv2, "POST", "/hold", PD_HTTP_PER_CLIENT, h_hold2, NULL));
    CHECK_OK(pd_http_server_route(srv2, "POST", "/quick", PD_HTTP_PER_CLIENT, h_quick2, NULL));
    CHECK_OK(pd_http_server_route(srv2, "GET", "/health", PD_HTTP_PUBLIC, h_health, NULL));
    CHECK_OK(pd_http_server_listen(srv2));
    snprintf(url2, sizeof(url2), "http://127.0.0.1:%d", pd_http_server_port(srv2));

    pthread_t loop_thread, compute_thread;
    pthread_create(&compute_thread, NULL, compute_main, NULL);
    pthread_create(&loop_thread, NULL, loop_main, NULL);

    keepalive = curl_easy_init();
    static const struct pd_test_case cases[] = {
        PD_TEST(test_routes),
        PD_TEST(test_api_key),
        PD_TEST(test_body_limit),
        PD_TEST(test_header_limit),
        PD_TEST(test_per_client_limit),
        PD_TEST(test_bad_requests),
        PD_TEST(test_stream),
        PD_TEST(test_stream_error),
        PD_TEST(test_concurrent_streams),
        PD_TEST(test_disconnect_mid_stream),
        PD_TEST(test_disconnect_before_response),
        PD_TEST(test_disconnect_before_response_get),
        PD_TEST(test_raw_stream),
        PD_TEST(test_backpressure),
        PD_TEST(test_reset_mid_stream),
        PD_TEST(test_reset_before_response),
        PD_TEST(test_reset_idle),
        PD_TEST(test_graceful_shutdown),
    };
    static const struct pd_test_case tls_cases[] = {
        PD_TEST(test_tls_ctx_errors),
        PD_TEST(test_tls_refusals),
        PD_TEST(test_tls_close_notify_before_response),
    };
    int rc = tls ? pd_test_run(argv[0], tls_cases, PD_ARRAY_LEN(tls_cases)) : 0;
    rc |= pd_test_run(argv[0], cases, PD_ARRAY_LEN(cases));

    pthread_join(loop_thread, NULL); /* returns once every handle is closed */
    atomic_store(&compute_stop, 1);
    pthread_join(compute_thread, NULL);
    pd_http_server_free(srv);
    pd_http_server_free(srv2);
    int lc = uv_loop_close(&loop);
    if (lc != 0) {
        fprintf(stderr, "uv_loop_close: %s\n", uv_strerror(lc));
        rc = 1;
    }
    /* a server shut down with no connection at all (dispose right away) closes cleanly */
    uv_loop_t idle_loop;
    struct pd_http_server *idle = NULL;
    CHECK_INT(uv_loop_init(&idle_loop), 0);
    struct pd_http_server_config icfg = {.host = "127.0.0.1", .port = 0};
    CHECK_OK(pd_http_server_new(&idle_loop, &icfg, &idle));
    CHECK_OK(pd_http_server_listen(idle));
    atomic_store(&closed_called, 0);
    pd_http_server_shutdown(idle, 1000, on_idle_closed, NULL);
    uv_run(&idle_loop, UV_RUN_DEFAULT);
    CHECK_INT(atomic_load(&closed_called), 1);
    pd_http_server_free(idle);
    CHECK_INT(uv_loop_close(&idle_loop), 0);
    if (pd_test_failures)
        rc = 1;

    curl_easy_cleanup(keepalive);
    curl_global_cleanup();
    SSL_CTX_free(client_ctx);
    if (tls_dir[0])
        pd_test_scratch_remove(tls_dir);
    for (int i = 0; i < MAX_JOBS; i++)
        pd_api_request_free(&streams[i].api);
    return rc;
}
