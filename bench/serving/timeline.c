/*
 * timeline.c — where the measured TTFT went, as the servers saw it (--timeline-url): before and
 * after each load, pdserve-bench reads /metrics of the given servers and takes the load's share
 * of their hand-over histograms (the sums and counts it added), so every stage's mean covers the
 * requests of that load alone (not the warm-up, not the other rates of a sweep).
 *
 * Two families are read: a router's pdserve_router_handover_seconds{stage} (dispatch, decode,
 * local, relay; reported as "router:<stage>") and a daemon's pdserve_handover_seconds{stage} (a
 * decode's reserve, prefill_queue, prefill_first_chunk, prefill_rest, kv_other, first_token; a
 * prefill's bootstrap_wait). The stages that lie end to end on the first token's path are summed:
 * the router's dispatch and relay, and between them the decode's stages (or, without a decode's
 * figures, the router's decode stage, which holds them and the way there and back) for the PD
 * path, the router's local stage for requests a decode prefilled itself. A stage counts in the
 * sum by the share of the load's requests that passed it (its mean x its count / the requests),
 * so a load split between the two paths adds up to its mean TTFT as one on a single path does.
 * A prefill's bootstrap_wait overlaps decode's stages and is shown, not summed; give a router's
 * and a decode's URL, not a prefill's (its prefill_* stages are the ones decode already
 * reports).
 *
 * The same scrape reads the counter pdserve_kv_transfer_bytes_total (all its series), which
 * --kv-bytes-url turns into the KV bytes a load moved. Both sides of a transfer count it: give
 * the prefills' URLs (or the decodes'), not both.
 */
#include "bench/serving/serving.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <stdlib.h>
#include <string.h>

#define SCRAPE_MAX (4 << 20) /* bytes of one /metrics answer */

static const char ROUTER_FAMILY[] = "pdserve_router_handover_seconds";
static const char DAEMON_FAMILY[] = "pdserve_handover_seconds";
static const char KV_BYTES[] = "pdserve_kv_transfer_bytes_total";

static struct pd_bench_tl_stage *stage_of(struct pd_bench_timeline *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->st[i].name, name) == 0)
            return &t->st[i];
    if (t->n == PD_BENCH_TL_MAX)
        return NULL;
    struct pd_bench_tl_stage *s = &t->st[t->n++];
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s", name);
    return s;
}

/* "pdserve_kv_transfer_bytes_total{...} v" or without labels: v added to t->kv_bytes. */
static void take_kv_bytes(struct pd_bench_timeline *t, const char *line, size_t len) {
    size_t k = sizeof(KV_BYTES) - 1;
    if (len <= k || strncmp(line, KV_BYTES, k) != 0 || (line[k] != '{' && line[k] != ' '))
        return;
    const char *v = line + k;
    if (*v == '{') {
        v = memchr(v, '}', len - k);
        if (!v)
            return;
        v++;
    }
    char *stop;
    double x = strtod(v, &stop);
    if (stop != v)
        t->kv_bytes += x;
}

/* One exposition line: "<family>_sum{...,stage="x",...} v" or "_count". */
static void take_line(struct pd_bench_timeline *t, const char *line, size_t len) {
    const char *fam;
    bool router;
    take_kv_bytes(t, line, len);
    if (len > sizeof(ROUTER_FAMILY) && strncmp(line, ROUTER_FAMILY, sizeof(ROUTER_FAMILY) - 1) == 0)
        fam = ROUTER_FAMILY, router = true;
    else if (len > sizeof(DAEMON_FAMILY) &&
             strncmp(line, DAEMON_FAMILY, sizeof(DAEMON_FAMILY) - 1) == 0)
        fam = DAEMON_FAMILY, router = false;
    else
        return;
    const char *p = line + strlen(fam);
    bool sum;
    if (strncmp(p, "_sum{", 5) == 0)
        sum = true, p += 5;
    else if (strncmp(p, "_count{", 7) == 0)
        sum = false, p += 7;
    else
        return;
    const char *end = memchr(p, '}', len - (size_t)(p - line));
    if (!end)
        return;
    const char *lab = NULL;
    for (const char *q = p; q + 7 <= end; q++)
        if (strncmp(q, "stage=\"", 7) == 0 && (q == p || q[-1] == ',')) {
            lab = q + 7;
            break;
        }
    if (!lab)
        return;
    const char *lab_end = memchr(lab, '"', (size_t)(end - lab));
    if (!lab_end || lab_end - lab > 32)
        return;
    char name[48];
    snprintf(name, sizeof(name), "%s%.*s", router ? "router:" : "", (int)(lab_end - lab), lab);
    char *stop;
    double v = strtod(end + 1, &stop);
    if (stop == end + 1)
        return;
    struct pd_bench_tl_stage *s = stage_of(t, name);
    if (!s)
        return;
    if (sum)
        s->sum += v;
    else
        s->count += v;
}

static int scrape_one(const char *base, const char *api_key, struct pd_bench_timeline *t) {
    char url[1100];
    snprintf(url, sizeof(url), "%s/metrics", base);
    char *body;
    long status;
    int rc = pd_bench_http_get(url, api_key, SCRAPE_MAX, &body, &status);
    if (rc)
        return rc;
    if (status != 200)
        rc = pd_errorf(PD_EPEER, "GET %s answered %ld (not a pdserve server?)", url, status);
    for (const char *p = body; rc == PD_OK && p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        take_line(t, p, len);
        p += len + (nl != NULL);
    }
    pd_free(body);
    return rc;
}

int pd_bench_timeline_scrape(const char *urls, const char *api_key, struct pd_bench_timeline *out) {
    memset(out, 0, sizeof(*out));
    /* the list is checked whole before any server is asked */
    for (int pass = 0; pass < 2; pass++) {
        const char *p = urls;
        do {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            char base[1024];
            if (len == 0 || len >= sizeof(base))
                return pd_errorf(PD_EINVAL, "bad URL in '%s' (an empty item, or one too long)",
                                 urls);
            memcpy(base, p, len);
            base[len] = '\0';
            while (len > 0 && base[len - 1] == '/')
                base[--len] = '\0';
            int rc = pass ? scrape_one(base, api_key, out) : PD_OK;
            if (rc)
                return rc;
            p = comma ? comma + 1 : p + strlen(p);
        } while (*p || p[-1] == ',');
    }
    return PD_OK;
}

/* Summed stages: everything on the first token's path, see the file comment. */
static bool summed(const char *name, bool have_daemon) {
    if (strcmp(name, "bootstrap_wait") == 0)
        return false;
    if (strcmp(name, "router:decode") == 0)
        return !have_daemon;
    return true;
}

void pd_bench_timeline_reduce(const struct pd_bench_timeline *before,
                              const struct pd_bench_timeline *after, double mean_ttft_ms,
                              struct pd_bench_timeline_result *out) {
    memset(out, 0, sizeof(*out));
    bool have_daemon = false;
    for (int i = 0; i < after->n; i++) {
        const struct pd_bench_tl_stage *a = &after->st[i];
        double sum = a->sum, count = a->count;
        for (int j = 0; j < before->n; j++)
            if (strcmp(before->st[j].name, a->name) == 0) {
                sum -= before->st[j].sum;
                count -= before->st[j].count;
            }
        if (count < 0.5)
            continue; /* nothing of this load passed this stage */
        struct pd_bench_tl_mean *m = &out->stage[out->n++];
        snprintf(m->name, sizeof(m->name), "%s", a->name);
        m->mean_ms = sum / count * 1e3;
        m->count = (long)(count + 0.5);
        have_daemon |= strncmp(a->name, "router:", 7) != 0;
    }
    /* the load's requests: those the router dispatched, else the most any stage saw */
    long requests = 0;
    for (int i = 0; i < out->n; i++)
        if (strcmp(out->stage[i].name, "router:dispatch") == 0)
            requests = out->stage[i].count;
    for (int i = 0; requests == 0 && i < out->n; i++)
        if (out->stage[i].count > requests)
            requests = out->stage[i].count;
    for (int i = 0; i < out->n; i++)
        if ((out->stage[i].summed = summed(out->stage[i].name, have_daemon)))
            out->sum_ms += out->stage[i].mean_ms * (double)out->stage[i].count / (double)requests;
    out->ttft_ms = mean_ttft_ms;
    out->ratio = mean_ttft_ms > 0 ? out->sum_ms / mean_ttft_ms : 0;
}

void pd_bench_timeline_print(FILE *f, const struct pd_bench_timeline_result *t) {
    if (t->n == 0) {
        fprintf(f, "Hand-over timeline: the servers reported no stage for this load\n");
        return;
    }
    fprintf(f, "%s\n", "-----Hand-over timeline (servers' means, ms)------");
    for (int i = 0; i < t->n; i++) {
        char k[80];
        snprintf(k, sizeof(k), "%s%s:", t->stage[i].name,
                 t->stage[i].summed ? "" : " (not summed)");
        fprintf(f, "%-40s %-10.3f\n", k, t->stage[i].mean_ms);
    }
    fprintf(f, "%-40s %-10.3f\n", "Stages summed (ms):", t->sum_ms);
    fprintf(f, "%-40s %-10.3f\n", "Mean TTFT measured here (ms):", t->ttft_ms);
    fprintf(f, "%-40s %-10.3f\n", "Stages / TTFT:", t->ratio);
}
