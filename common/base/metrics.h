/*
 * metrics.h — Prometheus counters, gauges and histograms, and the text exposition format 0.0.4
 * that /metrics answers with (API.md "Metrics"). A registry (struct pd_metrics) holds families
 * in registration order; a family has a kind, a name, a help text, label names and (histograms)
 * fixed bucket bounds; a series is one set of label values of a family. Constant labels of the
 * registry (model_name on the daemons) come first on every series.
 *
 * Threads: updating a series (pd_metric_add/set/observe) is lock-free and safe from any thread at
 * any time (the engine's compute thread and the daemon's loop thread both do). Creating families
 * and series and rendering take the registry's mutex, so they are safe from any thread too, but
 * they allocate: create series up front where a thread must not allocate. A series lives as long
 * as its registry (pointers stay valid; nothing is ever removed, so a counter never goes back).
 *
 * Histograms: bucket i counts observations v <= bounds[i] (le is inclusive) and > bounds[i-1];
 * the implicit last bucket (+Inf) the rest. The text shows cumulative counts; _count is the sum
 * of the buckets read in the same pass, so a scrape is self-consistent even while observations
 * land. NaN observations are ignored (they would poison _sum for good).
 */
#ifndef PD_METRICS_H
#define PD_METRICS_H

#include <stddef.h>
#include <stdint.h>

enum pd_metric_kind {
    PD_METRIC_COUNTER = 1,
    PD_METRIC_GAUGE,
    PD_METRIC_HISTOGRAM,
};

struct pd_metric_desc {
    int kind; /* enum pd_metric_kind */
    const char *name;
    const char *help;
    int n_labels;              /* beyond the registry's constant labels */
    const char *const *labels; /* [n_labels] label names */
    int n_bounds;              /* histograms: finite, strictly increasing upper bounds */
    const double *bounds;      /* [n_bounds] */
};

struct pd_metrics;
struct pd_metric_family;
struct pd_metric;

/* A registry whose every series carries the n constant labels names[i]=values[i] (copied). */
int pd_metrics_new(int n, const char *const *names, const char *const *values,
                   struct pd_metrics **out);
void pd_metrics_free(struct pd_metrics *m);

/* Registers a family (desc strings and bounds are copied). PD_EINVAL with a message naming the
 * problem: a bad name or label name, a duplicate name, bounds not increasing or not finite. */
int pd_metrics_family(struct pd_metrics *m, const struct pd_metric_desc *d,
                      struct pd_metric_family **out);
/* The series of f with label values values[0..n_labels) (copied): found, or added. */
int pd_metrics_series(struct pd_metric_family *f, const char *const *values,
                      struct pd_metric **out);
/* A family without labels of its own and its one series. */
int pd_metrics_single(struct pd_metrics *m, const struct pd_metric_desc *d, struct pd_metric **out);

/* Counter: v >= 0. Gauge: any v. */
void pd_metric_add(struct pd_metric *s, double v);
/* Gauge; or a counter mirroring a count that only grows elsewhere. */
void pd_metric_set(struct pd_metric *s, double v);
void pd_metric_observe(struct pd_metric *s, double v); /* histogram */

/* Sets every series of a gauge family to v (a scrape zeroes the series of things that are gone
 * before it sets those that are still there). */
void pd_metrics_family_set(struct pd_metric_family *f, double v);

double pd_metric_value(const struct pd_metric *s);   /* counter, gauge; histogram: _sum */
uint64_t pd_metric_count(const struct pd_metric *s); /* histogram: observations */
/* Histogram: cumulative count of bucket i (i == n_bounds: +Inf). */
uint64_t pd_metric_bucket(const struct pd_metric *s, int i);

/* The whole registry as Prometheus text (0.0.4) in *out (NUL-terminated, *len bytes without
 * the NUL); the caller frees it with pd_free. PD_ENOMEM. */
int pd_metrics_render(struct pd_metrics *m, char **out, size_t *len);

/* Prometheus' content type for that text. */
#define PD_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
