/*
 * metrics.c — the registry, lock-free series updates and the text writer (see metrics.h).
 *
 * Values are doubles kept as their bit patterns in _Atomic uint64_t: C11 offers no fetch-add on
 * floating types that compilers lower without libatomic, and a compare-exchange loop on the bits
 * is exact (every add lands once; integer-valued sums stay exact up to 2^53). Histogram bucket
 * counts are plain atomic integers (fetch_add). Each update is relaxed: a scrape needs each value
 * to be some recent one, not an order between values.
 * Structure (families, series lists) changes under the registry's mutex only; series are
 * allocated one by one and never move, so updaters hold their pointers without locking.
 */
#include "common/base/metrics.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pd_metric {
    struct pd_metric *next;
    const struct pd_metric_family *fam;
    char **values;          /* [fam->n_labels] */
    _Atomic uint64_t bits;  /* counter/gauge value, histogram sum: a double's bits */
    _Atomic uint64_t *hist; /* histogram: [n_bounds + 1] per-bucket (not cumulative) counts */
};

struct pd_metric_family {
    struct pd_metric_family *next;
    struct pd_metrics *reg;
    int kind;
    char *name, *help;
    int n_labels;
    char **labels; /* [n_labels] */
    int n_bounds;
    double *bounds; /* [n_bounds] */
    struct pd_metric *series, *last;
};

struct pd_metrics {
    pthread_mutex_t mu;
    int n_const;
    char **const_names, **const_values;
    struct pd_metric_family *fams, *last;
};

/* ---- doubles in atomics ---- */

static uint64_t dbits(double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}

static double bitsd(uint64_t u) {
    double v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

static void atomic_add_double(_Atomic uint64_t *a, double v) {
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, dbits(bitsd(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

/* ---- names ---- */

static bool valid_name(const char *s, bool colon) {
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (colon && c == ':') || (p > s && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

static void free_strv(char **v, int n) {
    for (int i = 0; v && i < n; i++)
        pd_free(v[i]);
    pd_free(v);
}

static char **dup_strv(const char *const *v, int n) {
    char **out = pd_calloc(n > 0 ? (size_t)n : 1, sizeof(char *));
    if (!out)
        return NULL;
    for (int i = 0; i < n; i++) {
        out[i] = pd_strdup(v[i] ? v[i] : "");
        if (!out[i]) {
            free_strv(out, i);
            return NULL;
        }
    }
    return out;
}

/* ---- registry ---- */

int pd_metrics_new(int n, const char *const *names, const char *const *values,
                   struct pd_metrics **out) {
    *out = NULL;
    for (int i = 0; i < n; i++)
        if (!valid_name(names[i], false) || strncmp(names[i], "__", 2) == 0 ||
            strcmp(names[i], "le") == 0)
            return pd_errorf(PD_EINVAL, "metrics: constant label name \"%s\" is not allowed",
                             names[i] ? names[i] : "(null)");
    struct pd_metrics *m = pd_calloc(1, sizeof(*m));
    if (!m)
        return pd_errorf(PD_ENOMEM, "metrics registry");
    m->n_const = n;
    m->const_names = dup_strv(names, n);
    m->const_values = dup_strv(values, n);
    if (!m->const_names || !m->const_values) {
        free_strv(m->const_names, n);
        free_strv(m->const_values, n);
        pd_free(m);
        return pd_errorf(PD_ENOMEM, "metrics registry labels");
    }
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return PD_OK;
}

static void series_free(struct pd_metric *s) {
    free_strv(s->values, s->fam->n_labels);
    pd_free((void *)s->hist);
    pd_free(s);
}

static void family_free(struct pd_metric_family *f) {
    for (struct pd_metric *s = f->series, *next; s; s = next) {
        next = s->next;
        series_free(s);
    }
    pd_free(f->name);
    pd_free(f->help);
    free_strv(f->labels, f->n_labels);
    pd_free(f->bounds);
    pd_free(f);
}

void pd_metrics_free(struct pd_metrics *m) {
    if (!m)
        return;
    for (struct pd_metric_family *f = m->fams, *next; f; f = next) {
        next = f->next;
        family_free(f);
    }
    free_strv(m->const_names, m->n_const);
    free_strv(m->const_values, m->n_const);
    pthread_mutex_destroy(&m->mu);
    pd_free(m);
}

static int check_desc(const struct pd_metrics *m, const struct pd_metric_desc *d) {
    const char *name = d->name ? d->name : "(null)";
    if (d->kind != PD_METRIC_COUNTER && d->kind != PD_METRIC_GAUGE &&
        d->kind != PD_METRIC_HISTOGRAM)
        return pd_errorf(PD_EINVAL, "metric %s: unknown kind %d", name, d->kind);
    if (!valid_name(d->name, true))
        return pd_errorf(PD_EINVAL, "metric name \"%s\" is not [a-zA-Z_:][a-zA-Z0-9_:]*", name);
    if (d->n_labels < 0 || (d->n_labels > 0 && !d->labels))
        return pd_errorf(PD_EINVAL, "metric %s: %d label names given as NULL", name, d->n_labels);
    for (int i = 0; i < d->n_labels; i++) {
        const char *l = d->labels[i];
        if (!valid_name(l, false) || strncmp(l, "__", 2) == 0)
            return pd_errorf(PD_EINVAL, "metric %s: label name \"%s\" is not allowed", name,
                             l ? l : "(null)");
        if (d->kind == PD_METRIC_HISTOGRAM && strcmp(l, "le") == 0)
            return pd_errorf(PD_EINVAL, "metric %s: a histogram cannot have a label \"le\"", name);
        for (int j = 0; j < i; j++)
            if (strcmp(d->labels[j], l) == 0)
                return pd_errorf(PD_EINVAL, "metric %s: label \"%s\" twice", name, l);
        for (int j = 0; j < m->n_const; j++)
            if (strcmp(m->const_names[j], l) == 0)
                return pd_errorf(PD_EINVAL, "metric %s: label \"%s\" is a constant label", name, l);
    }
    if (d->kind == PD_METRIC_HISTOGRAM) {
        if (d->n_bounds < 1 || !d->bounds)
            return pd_errorf(PD_EINVAL, "histogram %s: needs at least one bucket bound", name);
        for (int i = 0; i < d->n_bounds; i++) {
            if (!isfinite(d->bounds[i]))
                return pd_errorf(
                    PD_EINVAL, "histogram %s: bound %d is not finite (+Inf is implicit)", name, i);
            if (i > 0 && !(d->bounds[i] > d->bounds[i - 1]))
                return pd_errorf(PD_EINVAL, "histogram %s: bounds must increase (%g after %g)",
                                 name, d->bounds[i], d->bounds[i - 1]);
        }
    } else if (d->n_bounds != 0) {
        return pd_errorf(PD_EINVAL, "metric %s: only histograms have bucket bounds", name);
    }
    for (const struct pd_metric_family *f = m->fams; f; f = f->next)
        if (strcmp(f->name, d->name) == 0)
            return pd_errorf(PD_EINVAL, "metric %s registered twice", name);
    return PD_OK;
}

int pd_metrics_family(struct pd_metrics *m, const struct pd_metric_desc *d,
                      struct pd_metric_family **out) {
    *out = NULL;
    pthread_mutex_lock(&m->mu);
    int rc = check_desc(m, d);
    if (rc) {
        pthread_mutex_unlock(&m->mu);
        return rc;
    }
    struct pd_metric_family *f = pd_calloc(1, sizeof(*f));
    if (!f) {
        pthread_mutex_unlock(&m->mu);
        return pd_errorf(PD_ENOMEM, "metric %s", d->name);
    }
    f->reg = m;
    f->kind = d->kind;
    f->n_labels = d->n_labels;
    f->n_bounds = d->kind == PD_METRIC_HISTOGRAM ? d->n_bounds : 0;
    f->name = pd_strdup(d->name);
    f->help = pd_strdup(d->help ? d->help : "");
    f->labels = dup_strv(d->labels, d->n_labels);
    f->bounds = pd_calloc(f->n_bounds > 0 ? (size_t)f->n_bounds : 1, sizeof(double));
    if (!f->name || !f->help || !f->labels || !f->bounds) {
        family_free(f);
        pthread_mutex_unlock(&m->mu);
        return pd_errorf(PD_ENOMEM, "metric %s", d->name);
    }
    if (f->n_bounds)
        memcpy(f->bounds, d->bounds, (size_t)f->n_bounds * sizeof(double));
    if (m->last)
        m->last->next = f;
    else
        m->fams = f;
    m->last = f;
    pthread_mutex_unlock(&m->mu);
    *out = f;
    return PD_OK;
}

int pd_metrics_series(struct pd_metric_family *f, const char *const *values,
                      struct pd_metric **out) {
    *out = NULL;
    struct pd_metrics *m = f->reg;
    pthread_mutex_lock(&m->mu);
    for (struct pd_metric *s = f->series; s; s = s->next) {
        int i = 0;
        while (i < f->n_labels && strcmp(s->values[i], values[i] ? values[i] : "") == 0)
            i++;
        if (i == f->n_labels) {
            pthread_mutex_unlock(&m->mu);
            *out = s;
            return PD_OK;
        }
    }
    struct pd_metric *s = pd_calloc(1, sizeof(*s));
    if (s) {
        s->fam = f;
        s->values = dup_strv(values, f->n_labels);
        if (f->kind == PD_METRIC_HISTOGRAM)
            s->hist = pd_calloc((size_t)f->n_bounds + 1, sizeof(*s->hist));
    }
    if (!s || !s->values || (f->kind == PD_METRIC_HISTOGRAM && !s->hist)) {
        if (s)
            series_free(s);
        pthread_mutex_unlock(&m->mu);
        return pd_errorf(PD_ENOMEM, "a series of metric %s", f->name);
    }
    atomic_init(&s->bits, dbits(0.0));
    for (int i = 0; s->hist && i <= f->n_bounds; i++)
        atomic_init(&s->hist[i], 0);
    if (f->last)
        f->last->next = s;
    else
        f->series = s;
    f->last = s;
    pthread_mutex_unlock(&m->mu);
    *out = s;
    return PD_OK;
}

int pd_metrics_single(struct pd_metrics *m, const struct pd_metric_desc *d,
                      struct pd_metric **out) {
    *out = NULL;
    if (d->n_labels != 0)
        return pd_errorf(PD_EINVAL, "metric %s: pd_metrics_single takes no labels", d->name);
    struct pd_metric_family *f;
    int rc = pd_metrics_family(m, d, &f);
    return rc ? rc : pd_metrics_series(f, NULL, out);
}

/* ---- updates ---- */

void pd_metric_add(struct pd_metric *s, double v) {
    PD_ASSERT(s->fam->kind == PD_METRIC_GAUGE || (s->fam->kind == PD_METRIC_COUNTER && v >= 0));
    atomic_add_double(&s->bits, v);
}

void pd_metric_set(struct pd_metric *s, double v) {
    PD_ASSERT(s->fam->kind != PD_METRIC_HISTOGRAM);
    atomic_store_explicit(&s->bits, dbits(v), memory_order_relaxed);
}

void pd_metric_observe(struct pd_metric *s, double v) {
    const struct pd_metric_family *f = s->fam;
    PD_ASSERT(f->kind == PD_METRIC_HISTOGRAM);
    if (isnan(v))
        return;
    int lo = 0, hi = f->n_bounds; /* first i with v <= bounds[i]; n_bounds: +Inf */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v <= f->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_fetch_add_explicit(&s->hist[lo], 1, memory_order_relaxed);
    atomic_add_double(&s->bits, v);
}

void pd_metrics_family_set(struct pd_metric_family *f, double v) {
    PD_ASSERT(f->kind == PD_METRIC_GAUGE);
    pthread_mutex_lock(&f->reg->mu);
    for (struct pd_metric *s = f->series; s; s = s->next)
        atomic_store_explicit(&s->bits, dbits(v), memory_order_relaxed);
    pthread_mutex_unlock(&f->reg->mu);
}

double pd_metric_value(const struct pd_metric *s) {
    return bitsd(atomic_load_explicit((_Atomic uint64_t *)&s->bits, memory_order_relaxed));
}

uint64_t pd_metric_bucket(const struct pd_metric *s, int i) {
    PD_ASSERT(s->fam->kind == PD_METRIC_HISTOGRAM && i >= 0 && i <= s->fam->n_bounds);
    uint64_t c = 0;
    for (int k = 0; k <= i; k++)
        c += atomic_load_explicit(&s->hist[k], memory_order_relaxed);
    return c;
}

uint64_t pd_metric_count(const struct pd_metric *s) {
    return pd_metric_bucket(s, s->fam->n_bounds);
}

/* ---- text ---- */

struct text {
    char *p;
    size_t len, cap;
    bool oom;
};

static void put(struct text *t, const char *s, size_t n) {
    if (t->oom || pd_array_grow((void **)&t->p, &t->cap, t->len + n + 1, 1)) {
        t->oom = true;
        return;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

static void puts_(struct text *t, const char *s) {
    put(t, s, strlen(s));
}

/* HELP text escapes \ and newline; label values also ". */
static void put_escaped(struct text *t, const char *s, bool quote) {
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            put(t, "\\\\", 2);
        else if (*p == '\n')
            put(t, "\\n", 2);
        else if (quote && *p == '"')
            put(t, "\\\"", 2);
        else
            put(t, p, 1);
    }
}

/* Shortest text that reads back as the same double; Go/Python spellings of the specials. */
static void fmt_double(char *buf, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(buf, cap, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
    } else {
        snprintf(buf, cap, "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, cap, "%.17g", v);
    }
}

static void put_double(struct text *t, double v) {
    char b[40];
    fmt_double(b, sizeof(b), v);
    puts_(t, b);
}

static void put_u64(struct text *t, uint64_t v) {
    char b[32];
    snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
    puts_(t, b);
}

/* name{const...,labels...[,le="x"]} */
static void put_series_name(struct text *t, const struct pd_metrics *m, const struct pd_metric *s,
                            const char *suffix, const char *le) {
    const struct pd_metric_family *f = s->fam;
    puts_(t, f->name);
    puts_(t, suffix);
    int n = m->n_const + f->n_labels + (le != NULL);
    if (n == 0)
        return;
    put(t, "{", 1);
    int k = 0;
    for (int i = 0; i < m->n_const + f->n_labels; i++, k++) {
        if (k)
            put(t, ",", 1);
        bool c = i < m->n_const;
        puts_(t, c ? m->const_names[i] : f->labels[i - m->n_const]);
        put(t, "=\"", 2);
        put_escaped(t, c ? m->const_values[i] : s->values[i - m->n_const], true);
        put(t, "\"", 1);
    }
    if (le) {
        if (k)
            put(t, ",", 1);
        put(t, "le=\"", 4);
        puts_(t, le);
        put(t, "\"", 1);
    }
    put(t, "}", 1);
}

static void put_histogram(struct text *t, const struct pd_metrics *m, const struct pd_metric *s) {
    const struct pd_metric_family *f = s->fam;
    uint64_t cum = 0;
    char le[40];
    for (int i = 0; i <= f->n_bounds; i++) {
        cum += atomic_load_explicit(&s->hist[i], memory_order_relaxed);
        if (i < f->n_bounds)
            fmt_double(le, sizeof(le), f->bounds[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        put_series_name(t, m, s, "_bucket", le);
        put(t, " ", 1);
        put_u64(t, cum);
        put(t, "\n", 1);
    }
    put_series_name(t, m, s, "_sum", NULL);
    put(t, " ", 1);
    put_double(t, pd_metric_value(s));
    put(t, "\n", 1);
    put_series_name(t, m, s, "_count", NULL);
    put(t, " ", 1);
    put_u64(t, cum);
    put(t, "\n", 1);
}

int pd_metrics_render(struct pd_metrics *m, char **out, size_t *len) {
    static const char *const kinds[] = {"", "counter", "gauge", "histogram"};
    struct text t = {0};
    *out = NULL;
    *len = 0;
    pthread_mutex_lock(&m->mu);
    for (const struct pd_metric_family *f = m->fams; f; f = f->next) {
        puts_(&t, "# HELP ");
        puts_(&t, f->name);
        put(&t, " ", 1);
        put_escaped(&t, f->help, false);
        puts_(&t, "\n# TYPE ");
        puts_(&t, f->name);
        put(&t, " ", 1);
        puts_(&t, kinds[f->kind]);
        put(&t, "\n", 1);
        for (const struct pd_metric *s = f->series; s; s = s->next) {
            if (f->kind == PD_METRIC_HISTOGRAM) {
                put_histogram(&t, m, s);
                continue;
            }
            put_series_name(&t, m, s, "", NULL);
            put(&t, " ", 1);
            put_double(&t, pd_metric_value(s));
            put(&t, "\n", 1);
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (t.oom || !t.p) {
        pd_free(t.p);
        return pd_errorf(PD_ENOMEM, "rendering the metrics");
    }
    *out = t.p;
    *len = t.len;
    return PD_OK;
}
