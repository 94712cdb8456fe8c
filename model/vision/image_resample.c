/*
 * image_resample.c — Pillow's convolution resize for 8-bit RGB (Image.resize with BICUBIC,
 * BILINEAR, LANCZOS, BOX or HAMMING), reproduced bit for bit.
 *
 * Each output column (then row) is a weighted sum of the input samples within the filter's
 * support around its centre, (i + 0.5) · scale in input coordinates. When shrinking, the filter
 * is stretched by the scale (support × scale, argument ÷ scale), which is what makes it
 * antialias. Weights are computed in double, normalised to sum 1, then rounded half away from
 * zero to signed fixed point with 22 fraction bits (32 − 8 bits of pixel − 2 bits of headroom
 * for the overshoot of negative lobes). A sum starts at half a unit, is shifted down and clipped
 * to 0..255. The two passes go through an 8-bit intermediate, horizontal first (over only the
 * input rows the vertical pass will read) unless the height shrinks much more than the width
 * (Pillow 13's rule, below). Every one of these choices
 * changes some output values, so none of them may be "improved" here: the model was trained on
 * images resized this way.
 */
#include "model/vision/image_resample.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <math.h>
#include <string.h>

#define RESAMPLE_FRAC_BITS 22 /* fixed-point fraction bits of a weight (Pillow's precision) */

struct resample_filter {
    double (*weight)(double x);
    double support; /* half-width in input samples at scale 1 */
};

static double box_weight(double x) {
    return x > -0.5 && x <= 0.5 ? 1.0 : 0.0;
}

static double triangle_weight(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Keys' cubic convolution with a = -0.5, written in the same operation order as Pillow's so the
 * doubles round the same way. */
static double cubic_weight(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc(double x) {
    if (x == 0.0)
        return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos3_weight(double x) {
    return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0;
}

/* Pillow's window constants are float literals (0.54f, 0.46f) widened to double: keep them. */
static double hamming_weight(double x) {
    x = fabs(x);
    if (x == 0.0)
        return 1.0;
    if (x >= 1.0)
        return 0.0;
    x = x * M_PI;
    return sin(x) / x * ((double)0.54f + (double)0.46f * cos(x));
}

static const struct resample_filter *filter_of(int filter) {
    static const struct resample_filter box = {box_weight, 0.5};
    static const struct resample_filter bilinear = {triangle_weight, 1.0};
    static const struct resample_filter hamming = {hamming_weight, 1.0};
    static const struct resample_filter bicubic = {cubic_weight, 2.0};
    static const struct resample_filter lanczos = {lanczos3_weight, 3.0};
    switch (filter) {
    case PD_RESAMPLE_BOX: return &box;
    case PD_RESAMPLE_BILINEAR: return &bilinear;
    case PD_RESAMPLE_HAMMING: return &hamming;
    case PD_RESAMPLE_BICUBIC: return &bicubic;
    case PD_RESAMPLE_LANCZOS: return &lanczos;
    default: return NULL;
    }
}

bool pd_resample_supported(int filter) {
    return filter_of(filter) != NULL;
}

const char *pd_resample_name(int filter) {
    switch (filter) {
    case PD_RESAMPLE_NEAREST: return "NEAREST";
    case PD_RESAMPLE_LANCZOS: return "LANCZOS";
    case PD_RESAMPLE_BILINEAR: return "BILINEAR";
    case PD_RESAMPLE_BICUBIC: return "BICUBIC";
    case PD_RESAMPLE_BOX: return "BOX";
    case PD_RESAMPLE_HAMMING: return "HAMMING";
    default: return "unknown";
    }
}

/* The weights of one axis: output sample i reads input samples first[i] .. first[i]+count[i]-1
 * with weight[i * taps + k]. */
struct resample_axis {
    int out_size;
    int taps;        /* weights stored per output sample (count[i] <= taps) */
    int *first;      /* [out_size] */
    int *count;      /* [out_size] */
    int32_t *weight; /* [out_size][taps] fixed point, RESAMPLE_FRAC_BITS fraction bits */
};

static void axis_free(struct resample_axis *ax) {
    pd_free(ax->first);
    pd_free(ax->count);
    pd_free(ax->weight);
    memset(ax, 0, sizeof *ax);
}

static int axis_init(struct resample_axis *ax, int in_size, int out_size,
                     const struct resample_filter *f) {
    memset(ax, 0, sizeof *ax);
    /* Pillow takes the source box as floats: the width goes through float before the division */
    double scale = (double)(float)in_size / out_size;
    double stretch = scale < 1.0 ? 1.0 : scale; /* widen the filter only when shrinking */
    double support = f->support * stretch;
    int taps = (int)ceil(support) * 2 + 1;

    ax->out_size = out_size;
    ax->taps = taps;
    ax->first = pd_calloc((size_t)out_size, sizeof *ax->first);
    ax->count = pd_calloc((size_t)out_size, sizeof *ax->count);
    ax->weight = pd_calloc((size_t)out_size * (size_t)taps, sizeof *ax->weight);
    double *w = pd_calloc((size_t)taps, sizeof *w);
    if (!ax->first || !ax->count || !ax->weight || !w) {
        pd_free(w);
        axis_free(ax);
        return pd_error_wrap(PD_ENOMEM, "resampling %d to %d samples", in_size, out_size);
    }
    for (int i = 0; i < out_size; i++) {
        double center = (i + 0.5) * scale;
        double inv_stretch = 1.0 / stretch;
        /* bounds rounded by truncation after + 0.5, as Pillow does (negative values truncate
         * towards zero before the clamp) */
        int lo = (int)(center - support + 0.5);
        if (lo < 0)
            lo = 0;
        int hi = (int)(center + support + 0.5);
        if (hi > in_size)
            hi = in_size;
        int n = hi - lo;
        double sum = 0.0;
        for (int k = 0; k < n; k++) {
            w[k] = f->weight(((k + lo) - center + 0.5) * inv_stretch);
            sum += w[k];
        }
        int32_t *fixed = ax->weight + (size_t)i * (size_t)taps;
        for (int k = 0; k < n; k++) {
            double v = sum != 0.0 ? w[k] / sum : w[k];
            double scaled = v * (1 << RESAMPLE_FRAC_BITS);
            fixed[k] = (int32_t)(v < 0 ? -0.5 + scaled : 0.5 + scaled);
        }
        ax->first[i] = lo;
        ax->count[i] = n;
    }
    pd_free(w);
    return PD_OK;
}

/* Sum with half a unit added, back to 8 bits: negative clips to 0, above 255 to 255. */
static inline uint8_t fixed_to_u8(int64_t acc) {
    if (acc < 0)
        return 0;
    int64_t v = acc >> RESAMPLE_FRAC_BITS;
    return (uint8_t)(v > 255 ? 255 : v);
}

/* Rows [row0, row0 + n_rows) of src (src_w wide) resampled horizontally into dst. */
static void resample_horizontal(const uint8_t *src, int src_w, int row0, int n_rows,
                                const struct resample_axis *ax, uint8_t *dst) {
    const int64_t half = (int64_t)1 << (RESAMPLE_FRAC_BITS - 1);
    for (int y = 0; y < n_rows; y++) {
        const uint8_t *in = src + (size_t)(row0 + y) * (size_t)src_w * 3;
        uint8_t *out = dst + (size_t)y * (size_t)ax->out_size * 3;
        for (int x = 0; x < ax->out_size; x++) {
            const int32_t *w = ax->weight + (size_t)x * (size_t)ax->taps;
            const uint8_t *p = in + (size_t)ax->first[x] * 3;
            int64_t r = half, g = half, b = half;
            for (int k = 0; k < ax->count[x]; k++, p += 3) {
                r += (int64_t)p[0] * w[k];
                g += (int64_t)p[1] * w[k];
                b += (int64_t)p[2] * w[k];
            }
            out[3 * x + 0] = fixed_to_u8(r);
            out[3 * x + 1] = fixed_to_u8(g);
            out[3 * x + 2] = fixed_to_u8(b);
        }
    }
}

/* src (width wide, its row 0 being input row row0) resampled vertically into dst. */
static void resample_vertical(const uint8_t *src, int width, int row0,
                              const struct resample_axis *ax, uint8_t *dst) {
    const int64_t half = (int64_t)1 << (RESAMPLE_FRAC_BITS - 1);
    size_t stride = (size_t)width * 3;
    for (int y = 0; y < ax->out_size; y++) {
        const int32_t *w = ax->weight + (size_t)y * (size_t)ax->taps;
        const uint8_t *base = src + (size_t)(ax->first[y] - row0) * stride;
        uint8_t *out = dst + (size_t)y * stride;
        for (size_t x = 0; x < stride; x++) {
            int64_t acc = half;
            const uint8_t *p = base + x;
            for (int k = 0; k < ax->count[y]; k++, p += stride)
                acc += (int64_t)*p * w[k];
            out[x] = fixed_to_u8(acc);
        }
    }
}

int pd_image_resize(const struct pd_image *in, int width, int height, enum pd_resample filter,
                    struct pd_image *out) {
    PD_ASSERT(in && in->rgb && in->width > 0 && in->height > 0 && out);
    memset(out, 0, sizeof *out);
    const struct resample_filter *f = filter_of(filter);
    if (!f)
        return pd_errorf(PD_EUNSUPPORTED,
                         "resampling filter %d (%s) is not supported: LANCZOS (1), BILINEAR (2), "
                         "BICUBIC (3), BOX (4) and HAMMING (5) are",
                         (int)filter, pd_resample_name(filter));
    if (width <= 0 || height <= 0)
        return pd_errorf(PD_EINVAL, "cannot resize to %d x %d pixels", width, height);

    *out = *in;
    out->width = width;
    out->height = height;
    out->rgb = pd_malloc((size_t)width * (size_t)height * 3);
    if (!out->rgb) {
        memset(out, 0, sizeof *out);
        return pd_error_wrap(PD_ENOMEM, "resizing to %d x %d", width, height);
    }
    if (width == in->width && height == in->height) {
        memcpy(out->rgb, in->rgb, (size_t)width * (size_t)height * 3);
        return PD_OK;
    }

    struct resample_axis horiz = {0}, vert = {0};
    uint8_t *tmp = NULL;
    int rc;
    if ((rc = axis_init(&vert, in->height, height, f)) != PD_OK ||
        (rc = axis_init(&horiz, in->width, width, f)) != PD_OK)
        goto fail;
    if (width == in->width) {
        resample_vertical(in->rgb, width, 0, &vert, out->rgb);
    } else if (height == in->height) {
        resample_horizontal(in->rgb, in->width, 0, height, &horiz, out->rgb);
    } else if (height < in->height &&
               (int64_t)in->height - height > 2 * ((int64_t)in->width - width)) {
        /* Pillow 13 (python-pillow/Pillow#9549) goes vertical first when the height shrinks by
         * more than twice as many pixels as the width (found by experiment against Pillow
         * 13.0.0, not taken from its source); the order changes the rounding of the 8-bit
         * intermediate, so it is Pillow's rule, to the pixel. Older Pillows always go
         * horizontal first. */
        if (!(tmp = pd_malloc((size_t)in->width * (size_t)height * 3)))
            goto fail_nomem;
        resample_vertical(in->rgb, in->width, 0, &vert, tmp);
        resample_horizontal(tmp, in->width, 0, height, &horiz, out->rgb);
    } else {
        /* horizontal first, over only the input rows the vertical pass will read */
        int row0 = vert.first[0];
        int row_end = vert.first[height - 1] + vert.count[height - 1];
        if (!(tmp = pd_malloc((size_t)width * (size_t)(row_end - row0) * 3)))
            goto fail_nomem;
        resample_horizontal(in->rgb, in->width, row0, row_end - row0, &horiz, tmp);
        resample_vertical(tmp, width, row0, &vert, out->rgb);
    }

    pd_free(tmp);
    axis_free(&horiz);
    axis_free(&vert);
    return PD_OK;

fail_nomem:
    rc = pd_error_wrap(PD_ENOMEM, "resizing %d x %d to %d x %d", in->width, in->height, width,
                       height);
fail:
    pd_free(tmp);
    axis_free(&horiz);
    axis_free(&vert);
    pd_image_free(out);
    return rc;
}
