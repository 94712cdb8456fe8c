/*
 * pd_compare.h — how the model tests compare logits: the largest difference relative to the
 * reference's largest magnitude (one number per comparison, so a tolerance reads as "this many
 * digits of the row's scale"), and the greedy choice of a row. NaN is an infinite error.
 */
#ifndef PD_COMPARE_H
#define PD_COMPARE_H

#include <math.h>
#include <stddef.h>

/* The larger of an error so far and a new one, NaN counting as infinite: fmax(d, NaN) is d, so
 * an output with NaNs among good values would otherwise compare as exact. */
static inline double pd_err_max(double so_far, double e) {
    return e != e ? INFINITY : fmax(so_far, e);
}

/* max |a - b| / max |b| over n values (b the reference; an all-zero b divides by 1e-30); a NaN in
 * a or b gives INFINITY. */
static inline double pd_rel_err(const float *a, const float *b, size_t n) {
    double d = 0, mx = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = pd_err_max(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / mx;
}

/* The index of the largest of x[0..n), the first one on a tie (the backends' argmax rule). */
static inline int pd_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

#endif
