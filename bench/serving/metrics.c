/*
 * metrics.c — per-request records to bench_serving's summary. The definitions are
 * bench_serving's (so numbers compare across the two tools):
 *   TTFT   request sent → first chunk carrying a token;
 *   ITL    gaps between chunks after the first (a k-token chunk is k gaps of 1/k);
 *   TPOT   (E2E − TTFT) / (output tokens − 1), for requests with more than one token;
 *   E2E    request sent → end of the stream;
 *   percentiles interpolate linearly between order statistics (numpy's default), std is the
 *   population standard deviation; throughputs divide by the load's wall time; concurrency is
 *   the sum of E2E over the wall time.
 * Goodput: completed requests whose TTFT and TPOT are both within the SLOs given (an unset SLO
 * always holds; a one-token request has no TPOT and meets any TPOT SLO), per second.
 * Only successful requests enter latencies and token counts; requests the client cut on
 * purpose (aborted, disconnected) are counted apart and enter nothing else.
 * Groups: per length class of --random-mix (TTFT median and p99, goodput over the load's whole
 * duration, so the classes' goodputs add up to the load's) and per turn index of a multi-turn
 * load (mean prompt length over all its requests, TTFT median over the completed ones).
 */
#include "bench/serving/serving.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const pd_bench_stat_names[] = {"mean", "median", "std", "p90", "p95", "p99", "max"};

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy.percentile(v, q), linear; v sorted, n > 0. */
static double percentile(const double *v, size_t n, double q) {
    double pos = q / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    double f = pos - (double)lo;
    return v[lo] + (v[hi] - v[lo]) * f;
}

/* Fills st[PD_BENCH_NSTAT] in ms from v[n] seconds (sorted in place); zeros when n == 0. */
static void stats(double *v, size_t n, double *st) {
    memset(st, 0, sizeof(double) * PD_BENCH_NSTAT);
    if (n == 0)
        return;
    qsort(v, n, sizeof(double), cmp_dbl);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    double mean = sum / (double)n;
    for (size_t i = 0; i < n; i++)
        sq += (v[i] - mean) * (v[i] - mean);
    st[PD_BENCH_MEAN] = mean * 1e3;
    st[PD_BENCH_P50] = percentile(v, n, 50) * 1e3;
    st[PD_BENCH_STD] = sqrt(sq / (double)n) * 1e3;
    st[PD_BENCH_P90] = percentile(v, n, 90) * 1e3;
    st[PD_BENCH_P95] = percentile(v, n, 95) * 1e3;
    st[PD_BENCH_P99] = percentile(v, n, 99) * 1e3;
    st[PD_BENCH_MAX] = v[n - 1] * 1e3;
}

/* TPOT of a completed request, s; -1 when it has one token (no TPOT). */
static double tpot_of(const struct pd_bench_result *q) {
    return q->output_len > 1 ? (q->e2e - q->ttft) / (q->output_len - 1) : -1;
}

/* Whether a completed request meets the SLOs (0 = not set). */
static bool meets_slo(const struct pd_bench_result *q, double slo_ttft_ms, double slo_tpot_ms) {
    double tp = tpot_of(q);
    return (slo_ttft_ms <= 0 || q->ttft * 1e3 <= slo_ttft_ms) &&
           (slo_tpot_ms <= 0 || tp < 0 || tp * 1e3 <= slo_tpot_ms);
}

int pd_bench_summarize(const struct pd_bench_result *r, size_t n, double duration,
                       double slo_ttft_ms, double slo_tpot_ms, struct pd_bench_summary *s) {
    double rate = s->request_rate; /* set by the caller, kept */
    int maxc = s->max_concurrency;
    memset(s, 0, sizeof(*s));
    s->request_rate = rate;
    s->max_concurrency = maxc;
    s->duration = duration;
    s->slo_ttft_ms = slo_ttft_ms;
    s->slo_tpot_ms = slo_tpot_ms;
    size_t n_itl = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].ok)
            n_itl += r[i].n_itl;
    double *ttft = pd_calloc(n + 1, sizeof(double)), *tpot = pd_calloc(n + 1, sizeof(double));
    double *e2e = pd_calloc(n + 1, sizeof(double)), *itl = pd_calloc(n_itl + 1, sizeof(double));
    if (!ttft || !tpot || !e2e || !itl) {
        pd_free(ttft);
        pd_free(tpot);
        pd_free(e2e);
        pd_free(itl);
        return pd_errorf(PD_ENOMEM, "summary of %zu requests", n);
    }
    size_t nt = 0, np = 0, ni = 0;
    double e2e_sum = 0;
    for (size_t i = 0; i < n; i++) {
        const struct pd_bench_result *q = &r[i];
        if (q->cut) {
            s->aborted += q->fate == PD_BENCH_FATE_ABORT;
            s->disconnected += q->fate == PD_BENCH_FATE_DISCONNECT;
            continue;
        }
        if (!q->ok) {
            s->failed++;
            continue;
        }
        ttft[nt++] = q->ttft;
        e2e[s->completed++] = q->e2e;
        s->total_input_tokens += q->prompt_len;
        s->total_output_tokens += q->output_len;
        e2e_sum += q->e2e;
        if (q->output_len > 1)
            tpot[np++] = tpot_of(q);
        if (q->n_itl) {
            memcpy(itl + ni, q->itl, q->n_itl * sizeof(double));
            ni += q->n_itl;
        }
        s->good += meets_slo(q, slo_ttft_ms, slo_tpot_ms);
    }
    stats(ttft, nt, s->ttft);
    stats(tpot, np, s->tpot);
    stats(itl, ni, s->itl);
    stats(e2e, (size_t)s->completed, s->e2e);
    if (duration > 0) {
        s->request_throughput = s->completed / duration;
        s->input_throughput = (double)s->total_input_tokens / duration;
        s->output_throughput = (double)s->total_output_tokens / duration;
        s->total_throughput = (double)(s->total_input_tokens + s->total_output_tokens) / duration;
        s->concurrency = e2e_sum / duration;
        s->request_goodput = s->good / duration;
    }
    pd_free(ttft);
    pd_free(tpot);
    pd_free(e2e);
    pd_free(itl);
    return PD_OK;
}

int pd_bench_summarize_groups(const struct pd_bench_result *r, size_t n, int n_classes, int n_turns,
                              struct pd_bench_summary *s) {
    PD_ASSERT(n_classes >= 0 && n_classes <= PD_BENCH_MAX_CLASSES);
    PD_ASSERT(n_turns >= 0 && n_turns <= PD_BENCH_MAX_TURNS);
    s->n_classes = n_classes;
    s->n_turns = n_turns;
    memset(s->cls, 0, sizeof(s->cls));
    memset(s->turn, 0, sizeof(s->turn));
    if (n_classes == 0 && n_turns == 0)
        return PD_OK;
    double *ttft = pd_calloc(n + 1, sizeof(double)), st[PD_BENCH_NSTAT];
    if (!ttft)
        return pd_errorf(PD_ENOMEM, "per-class summary of %zu requests", n);
    for (int k = 0; k < n_classes; k++) {
        struct pd_bench_class_summary *c = &s->cls[k];
        size_t nt = 0;
        for (size_t i = 0; i < n; i++) {
            const struct pd_bench_result *q = &r[i];
            if (q->length_class != k)
                continue;
            c->requests++;
            c->failed += !q->ok && !q->cut;
            if (!q->ok)
                continue;
            c->completed++;
            c->good += meets_slo(q, s->slo_ttft_ms, s->slo_tpot_ms);
            ttft[nt++] = q->ttft;
        }
        stats(ttft, nt, st);
        c->median_ttft_ms = st[PD_BENCH_P50];
        c->p99_ttft_ms = st[PD_BENCH_P99];
        c->request_goodput = s->duration > 0 ? c->good / s->duration : 0;
    }
    for (int k = 0; k < n_turns; k++) {
        struct pd_bench_turn_summary *t = &s->turn[k];
        size_t nt = 0;
        double prompt_sum = 0;
        for (size_t i = 0; i < n; i++) {
            const struct pd_bench_result *q = &r[i];
            if (q->turn != k + 1)
                continue;
            t->requests++;
            prompt_sum += q->prompt_len;
            if (q->ok) {
                t->completed++;
                ttft[nt++] = q->ttft;
            }
        }
        stats(ttft, nt, st);
        t->median_ttft_ms = st[PD_BENCH_P50];
        t->mean_prompt_len = t->requests ? prompt_sum / t->requests : 0;
    }
    pd_free(ttft);
    return PD_OK;
}
