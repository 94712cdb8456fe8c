/*
 * report.c — what pdserve-bench writes: the table (bench_serving's layout, plus p90/p99 rows and
 * goodput), one JSON object per load with bench_serving's field names (JSON Lines: one line per
 * request rate of a sweep; a rate of inf is written as the string "inf" so the file stays strict
 * JSON), CSV with one row per request, and the reader that turns a JSON Lines file back into
 * summaries for --plot-from. Beyond bench_serving's fields: "classes" (per --random-mix length
 * class), "turns" (per turn index of a multi-turn load) and "kv_transfer_bytes" (--kv-bytes-url).
 */
#include "bench/serving/serving.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

static const char *const metric_names[] = {"ttft", "tpot", "itl", "e2e_latency"};

static const double *metric(const struct pd_bench_summary *s, int m) {
    return m == 0 ? s->ttft : m == 1 ? s->tpot : m == 2 ? s->itl : s->e2e;
}
static double *metric_mut(struct pd_bench_summary *s, int m) {
    return m == 0 ? s->ttft : m == 1 ? s->tpot : m == 2 ? s->itl : s->e2e;
}

static void row_s(FILE *f, const char *k, const char *v) {
    fprintf(f, "%-40s %-10s\n", k, v);
}
static void row_d(FILE *f, const char *k, double v) {
    fprintf(f, "%-40s %-10.2f\n", k, v);
}
static void row_i(FILE *f, const char *k, long v) {
    fprintf(f, "%-40s %-10ld\n", k, v);
}
static void rule(FILE *f, const char *title, char c) {
    int len = (int)strlen(title), left = (50 - len) / 2, right = 50 - len - left;
    for (int i = 0; i < left; i++)
        fputc(c, f);
    fputs(title, f);
    for (int i = 0; i < right; i++)
        fputc(c, f);
    fputc('\n', f);
}

void pd_bench_print_table(FILE *f, const struct pd_bench_run_info *info,
                          const struct pd_bench_summary *s) {
    char buf[64];
    fputc('\n', f);
    rule(f, " Serving Benchmark Result ", '=');
    row_s(f, "Backend:", info->backend);
    if (isinf(s->request_rate))
        snprintf(buf, sizeof(buf), "inf");
    else
        snprintf(buf, sizeof(buf), "%g", s->request_rate);
    row_s(f, "Traffic request rate:", buf);
    if (s->max_concurrency > 0)
        row_i(f, "Max request concurrency:", s->max_concurrency);
    else
        row_s(f, "Max request concurrency:", "not set");
    row_i(f, "Successful requests:", s->completed);
    row_i(f, "Failed requests:", s->failed);
    if (s->aborted || s->disconnected) {
        row_i(f, "Aborted by the client (on purpose):", s->aborted);
        row_i(f, "Disconnected by the client (on purpose):", s->disconnected);
    }
    row_d(f, "Benchmark duration (s):", s->duration);
    row_i(f, "Total input tokens:", s->total_input_tokens);
    row_i(f, "Total generated tokens:", s->total_output_tokens);
    row_d(f, "Request throughput (req/s):", s->request_throughput);
    row_d(f, "Input token throughput (tok/s):", s->input_throughput);
    row_d(f, "Output token throughput (tok/s):", s->output_throughput);
    row_d(f, "Total token throughput (tok/s):", s->total_throughput);
    row_d(f, "Concurrency:", s->concurrency);
    if (s->slo_ttft_ms > 0 || s->slo_tpot_ms > 0) {
        snprintf(buf, sizeof(buf), "Request goodput (req/s):");
        row_d(f, buf, s->request_goodput);
        char slo[64];
        snprintf(slo, sizeof(slo), "TTFT<=%gms TPOT<=%gms", s->slo_ttft_ms, s->slo_tpot_ms);
        row_s(f, "  SLOs (0 = not set):", slo);
        row_i(f, "  Requests meeting both:", s->good);
    }
    static const char *const titles[] = {"Time to First Token",
                                         "Time per Output Token (excl. 1st token)",
                                         "Inter-Token Latency", "End-to-End Latency"};
    static const char *const short_names[] = {"TTFT", "TPOT", "ITL", "E2E Latency"};
    static const int shown[] = {PD_BENCH_MEAN, PD_BENCH_P50, PD_BENCH_STD,
                                PD_BENCH_P90,  PD_BENCH_P99, PD_BENCH_MAX};
    static const char *const shown_names[] = {"Mean", "Median", "Std", "P90", "P99", "Max"};
    for (int m = 0; m < 4; m++) {
        rule(f, titles[m], '-');
        for (int k = 0; k < 6; k++) {
            char key[64];
            snprintf(key, sizeof(key), "%s %s (ms):", shown_names[k], short_names[m]);
            row_d(f, key, metric(s, m)[shown[k]]);
        }
    }
    if (s->n_classes > 0 && info->mix)
        rule(f, "Prompt length classes (--random-mix)", '-');
    for (int k = 0; k < s->n_classes && info->mix; k++) {
        const struct pd_bench_class_summary *c = &s->cls[k];
        const struct pd_bench_length_class *lc = &info->mix->cls[k];
        char key[64];
        snprintf(key, sizeof(key), "Class %d-%d tokens (share %g):", lc->min_len, lc->max_len,
                 lc->share);
        row_s(f, key, "");
        row_i(f, "  Successful requests:", c->completed);
        row_d(f, "  Median TTFT (ms):", c->median_ttft_ms);
        row_d(f, "  P99 TTFT (ms):", c->p99_ttft_ms);
        if (s->slo_ttft_ms > 0 || s->slo_tpot_ms > 0)
            row_d(f, "  Request goodput (req/s):", c->request_goodput);
    }
    if (s->n_turns > 0)
        rule(f, "Turns (multiturn)", '-');
    for (int k = 0; k < s->n_turns; k++) {
        char key[64];
        snprintf(key, sizeof(key), "Turn %d mean prompt tokens:", k + 1);
        row_d(f, key, s->turn[k].mean_prompt_len);
        snprintf(key, sizeof(key), "Turn %d median TTFT (ms):", k + 1);
        row_d(f, key, s->turn[k].median_ttft_ms);
    }
    if (s->has_kv_bytes) {
        rule(f, "KV moved (--kv-bytes-url)", '-');
        row_d(f, "KV bytes moved (MB):", s->kv_bytes / 1e6);
        long sent = s->completed + s->failed + s->aborted + s->disconnected;
        row_d(f, "KV bytes per request (KB):", sent ? s->kv_bytes / (double)sent / 1e3 : 0);
    }
    for (int i = 0; i < 50; i++)
        fputc('=', f);
    fputc('\n', f);
    fflush(f);
}

static void add_rate(cJSON *o, const char *key, double rate) {
    if (isinf(rate))
        cJSON_AddStringToObject(o, key, "inf");
    else
        cJSON_AddNumberToObject(o, key, rate);
}

int pd_bench_json_line(const struct pd_bench_run_info *info, const struct pd_bench_summary *s,
                       const struct pd_bench_result *r, size_t n, bool details, char **out) {
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return pd_errorf(PD_ENOMEM, "JSON result");
    cJSON_AddStringToObject(o, "backend", info->backend);
    cJSON_AddStringToObject(o, "dataset_name", info->dataset_name);
    cJSON_AddStringToObject(o, "base_url", info->base_url);
    if (info->model)
        cJSON_AddStringToObject(o, "model_id", info->model);
    add_rate(o, "request_rate", s->request_rate);
    if (s->max_concurrency > 0)
        cJSON_AddNumberToObject(o, "max_concurrency", s->max_concurrency);
    else
        cJSON_AddNullToObject(o, "max_concurrency");
    cJSON_AddNumberToObject(o, "num_prompts", info->num_prompts);
    if (info->sharegpt_output_len > 0)
        cJSON_AddNumberToObject(o, "sharegpt_output_len", info->sharegpt_output_len);
    else
        cJSON_AddNullToObject(o, "sharegpt_output_len");
    cJSON_AddNumberToObject(o, "random_input_len", info->random_input_len);
    cJSON_AddNumberToObject(o, "random_output_len", info->random_output_len);
    cJSON_AddNumberToObject(o, "random_range_ratio", info->random_range_ratio);
    if (info->random_mix)
        cJSON_AddStringToObject(o, "random_mix", info->random_mix);
    if (info->multiturn_turns > 0) {
        cJSON_AddNumberToObject(o, "multiturn_conversations", info->multiturn_conversations);
        cJSON_AddNumberToObject(o, "multiturn_turns", info->multiturn_turns);
    }
    cJSON_AddNumberToObject(o, "duration", s->duration);
    cJSON_AddNumberToObject(o, "completed", s->completed);
    cJSON_AddNumberToObject(o, "failed", s->failed);
    cJSON_AddNumberToObject(o, "aborted", s->aborted);
    cJSON_AddNumberToObject(o, "disconnected", s->disconnected);
    cJSON_AddNumberToObject(o, "total_input_tokens", (double)s->total_input_tokens);
    cJSON_AddNumberToObject(o, "total_output_tokens", (double)s->total_output_tokens);
    cJSON_AddNumberToObject(o, "request_throughput", s->request_throughput);
    cJSON_AddNumberToObject(o, "input_throughput", s->input_throughput);
    cJSON_AddNumberToObject(o, "output_throughput", s->output_throughput);
    cJSON_AddNumberToObject(o, "total_throughput", s->total_throughput);
    for (int m = 0; m < 4; m++) {
        for (int k = 0; k < PD_BENCH_NSTAT; k++) {
            char key[64];
            snprintf(key, sizeof(key), "%s_%s_ms", pd_bench_stat_names[k], metric_names[m]);
            cJSON_AddNumberToObject(o, key, metric(s, m)[k]);
        }
    }
    cJSON_AddNumberToObject(o, "concurrency", s->concurrency);
    cJSON_AddNumberToObject(o, "request_goodput", s->request_goodput);
    cJSON_AddNumberToObject(o, "slo_ttft_ms", s->slo_ttft_ms);
    cJSON_AddNumberToObject(o, "slo_tpot_ms", s->slo_tpot_ms);
    if (s->n_classes > 0 && info->mix) {
        cJSON *a = cJSON_AddArrayToObject(o, "classes");
        for (int k = 0; k < s->n_classes; k++) {
            const struct pd_bench_class_summary *c = &s->cls[k];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddItemToArray(a, e);
            cJSON_AddNumberToObject(e, "share", info->mix->cls[k].share);
            cJSON_AddNumberToObject(e, "min_len", info->mix->cls[k].min_len);
            cJSON_AddNumberToObject(e, "max_len", info->mix->cls[k].max_len);
            cJSON_AddNumberToObject(e, "requests", c->requests);
            cJSON_AddNumberToObject(e, "completed", c->completed);
            cJSON_AddNumberToObject(e, "failed", c->failed);
            cJSON_AddNumberToObject(e, "median_ttft_ms", c->median_ttft_ms);
            cJSON_AddNumberToObject(e, "p99_ttft_ms", c->p99_ttft_ms);
            cJSON_AddNumberToObject(e, "request_goodput", c->request_goodput);
        }
    }
    if (s->n_turns > 0) {
        cJSON *a = cJSON_AddArrayToObject(o, "turns");
        for (int k = 0; k < s->n_turns; k++) {
            const struct pd_bench_turn_summary *t = &s->turn[k];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddItemToArray(a, e);
            cJSON_AddNumberToObject(e, "turn", k + 1);
            cJSON_AddNumberToObject(e, "requests", t->requests);
            cJSON_AddNumberToObject(e, "completed", t->completed);
            cJSON_AddNumberToObject(e, "mean_prompt_len", t->mean_prompt_len);
            cJSON_AddNumberToObject(e, "median_ttft_ms", t->median_ttft_ms);
        }
    }
    if (s->has_kv_bytes) { /* --kv-bytes-url: what the servers moved during this load */
        long sent = s->completed + s->failed + s->aborted + s->disconnected;
        cJSON_AddNumberToObject(o, "kv_transfer_bytes", s->kv_bytes);
        cJSON_AddNumberToObject(o, "kv_transfer_bytes_per_request",
                                sent ? s->kv_bytes / (double)sent : 0);
    }
    if (s->timeline) { /* --timeline-url: the servers' stage means over this load */
        const struct pd_bench_timeline_result *t = s->timeline;
        cJSON *h = cJSON_AddObjectToObject(o, "handover");
        cJSON *st = cJSON_AddObjectToObject(h, "stages_ms");
        cJSON *cnt = cJSON_AddObjectToObject(h, "stage_counts");
        cJSON *sm = cJSON_AddArrayToObject(h, "summed");
        for (int i = 0; i < t->n; i++) {
            cJSON_AddNumberToObject(st, t->stage[i].name, t->stage[i].mean_ms);
            cJSON_AddNumberToObject(cnt, t->stage[i].name, (double)t->stage[i].count);
            if (t->stage[i].summed)
                cJSON_AddItemToArray(sm, cJSON_CreateString(t->stage[i].name));
        }
        cJSON_AddNumberToObject(h, "sum_ms", t->sum_ms);
        cJSON_AddNumberToObject(h, "mean_ttft_ms", t->ttft_ms);
        cJSON_AddNumberToObject(h, "ratio", t->ratio);
    }
    if (details) {
        cJSON *a_in = cJSON_AddArrayToObject(o, "input_lens");
        cJSON *a_out = cJSON_AddArrayToObject(o, "output_lens");
        cJSON *a_ttft = cJSON_AddArrayToObject(o, "ttfts");
        cJSON *a_e2e = cJSON_AddArrayToObject(o, "e2e_latencies");
        cJSON *a_start = cJSON_AddArrayToObject(o, "start_times");
        cJSON *a_itl = cJSON_AddArrayToObject(o, "itls");
        cJSON *a_err = cJSON_AddArrayToObject(o, "errors");
        for (size_t i = 0; i < n; i++) {
            const struct pd_bench_result *q = &r[i];
            cJSON_AddItemToArray(a_in, cJSON_CreateNumber(q->prompt_len));
            cJSON_AddItemToArray(a_out, cJSON_CreateNumber(q->ok ? q->output_len : 0));
            cJSON_AddItemToArray(a_ttft, cJSON_CreateNumber(q->ok ? q->ttft : 0));
            cJSON_AddItemToArray(a_e2e, cJSON_CreateNumber(q->ok ? q->e2e : 0));
            cJSON_AddItemToArray(a_start, cJSON_CreateNumber(q->start));
            /* cJSON makes no array of 0 numbers from NULL: the entry would go missing */
            cJSON_AddItemToArray(a_itl, q->n_itl ? cJSON_CreateDoubleArray(q->itl, (int)q->n_itl)
                                                 : cJSON_CreateArray());
            cJSON_AddItemToArray(a_err, cJSON_CreateString(q->error ? q->error : ""));
        }
    }
    char *s_out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s_out)
        return pd_errorf(PD_ENOMEM, "JSON result text");
    *out = pd_strdup(s_out);
    cJSON_free(s_out);
    return *out ? PD_OK : pd_errorf(PD_ENOMEM, "JSON result text");
}

void pd_bench_csv_header(FILE *f) {
    fputs("request_rate,index,start_s,success,prompt_len,output_len,ttft_ms,tpot_ms,e2e_ms,"
          "mean_itl_ms,error,outcome,length_class,conversation,turn\n",
          f);
}

void pd_bench_csv_rows(FILE *f, const struct pd_bench_summary *s, const struct pd_bench_result *r,
                       size_t n) {
    char rate[32];
    if (isinf(s->request_rate))
        snprintf(rate, sizeof(rate), "inf");
    else
        snprintf(rate, sizeof(rate), "%g", s->request_rate);
    for (size_t i = 0; i < n; i++) {
        const struct pd_bench_result *q = &r[i];
        double itl = 0, tpot = 0;
        for (size_t k = 0; k < q->n_itl; k++)
            itl += q->itl[k];
        itl = q->n_itl ? itl / (double)q->n_itl : 0;
        if (q->ok && q->output_len > 1)
            tpot = (q->e2e - q->ttft) / (q->output_len - 1);
        fprintf(f, "%s,%zu,%.6f,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,\"", rate, i, q->start, q->ok ? 1 : 0,
                q->prompt_len, q->ok ? q->output_len : 0, q->ok ? q->ttft * 1e3 : 0, tpot * 1e3,
                q->ok ? q->e2e * 1e3 : 0, itl * 1e3);
        for (const char *c = q->error ? q->error : ""; *c; c++) {
            if (*c == '"')
                fputc('"', f); /* CSV doubles quotes */
            fputc(*c == '\n' ? ' ' : *c, f);
        }
        fprintf(f, "\",%s,", q->ok ? "completed" : q->cut ? "cut" : "failed");
        if (q->length_class >= 0) /* empty fields when the load has no classes / turns */
            fprintf(f, "%d", q->length_class);
        if (q->turn >= 1)
            fprintf(f, ",%d,%d\n", q->conversation, q->turn);
        else
            fputs(",,\n", f);
    }
}

int pd_bench_read_results(const char *path, struct pd_bench_summary **out, size_t *n) {
    char *text = NULL;
    size_t len;
    int rc = pd_file_read_all(path, &text, &len);
    if (rc)
        return pd_error_wrap(rc, "--plot-from");
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    int line_no = 0;
    for (char *line = text, *next; line && *line; line = next) {
        line_no++;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        if (strspn(line, " \t\r") == strlen(line))
            continue;
        cJSON *o = cJSON_Parse(line);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            rc = pd_errorf(PD_EFORMAT, "%s: line %d: not a JSON object", path, line_no);
            break;
        }
        if ((rc = pd_array_grow((void **)out, &cap, *n + 1, sizeof(**out)))) {
            cJSON_Delete(o);
            break;
        }
        struct pd_bench_summary *s = &(*out)[(*n)++];
        memset(s, 0, sizeof(*s));
        const cJSON *rate = cJSON_GetObjectItemCaseSensitive(o, "request_rate");
        if (cJSON_IsNumber(rate)) {
            s->request_rate = rate->valuedouble;
        } else if (cJSON_IsString(rate) && strcmp(rate->valuestring, "inf") == 0) {
            s->request_rate = INFINITY;
        } else {
            cJSON_Delete(o);
            rc = pd_errorf(PD_EFORMAT, "%s: line %d: no request_rate", path, line_no);
            break;
        }
#define NUM(field, dst)                                                                            \
    do {                                                                                           \
        const cJSON *v_ = cJSON_GetObjectItemCaseSensitive(o, field);                              \
        if (cJSON_IsNumber(v_))                                                                    \
            dst = v_->valuedouble;                                                                 \
    } while (0)
        NUM("request_throughput", s->request_throughput);
        NUM("output_throughput", s->output_throughput);
        NUM("input_throughput", s->input_throughput);
        NUM("request_goodput", s->request_goodput);
        NUM("duration", s->duration);
        for (int m = 0; m < 4; m++) {
            for (int k = 0; k < PD_BENCH_NSTAT; k++) {
                char key[64];
                snprintf(key, sizeof(key), "%s_%s_ms", pd_bench_stat_names[k], metric_names[m]);
                NUM(key, metric_mut(s, m)[k]);
            }
        }
#undef NUM
        cJSON_Delete(o);
    }
    pd_free(text);
    if (!rc && *n == 0)
        rc = pd_errorf(PD_EFORMAT, "%s: no results in it", path);
    if (rc) {
        pd_free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}
