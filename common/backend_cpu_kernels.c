/*
 * backend_cpu_kernels.c — the cpu backend's inner loops: dot, axpy, dtype widening and the
 * decode GEMV that reads bf16/f16 weights directly (no f32 copy of the weights exists, so decode
 * streams half the bytes). Each has an AVX2+FMA(+F16C) version chosen once at run time and a
 * portable loop; both sum in f32. No state, no allocation.
 */
#include "common/backend_cpu.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define PD_HAVE_X86 1
#endif

static float load1(enum pd_dtype t, const void *p, int64_t i) {
    switch (t) {
    case PD_DTYPE_F32: return ((const float *)p)[i];
    case PD_DTYPE_BF16: return pd_bf16_to_f32(((const uint16_t *)p)[i]);
    case PD_DTYPE_F16: return pd_f16_to_f32(((const uint16_t *)p)[i]);
    }
    return 0.0f;
}

#ifdef PD_HAVE_X86
/* __builtin_cpu_supports reads flags libgcc filled in at start-up: cheap enough per call. */
static bool has_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

#define PD_AVX2 __attribute__((target("avx2,fma,f16c")))

PD_AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

PD_AVX2 static inline __m256 load8(enum pd_dtype t, const void *p, int64_t i) {
    switch (t) {
    case PD_DTYPE_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case PD_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case PD_DTYPE_F32: break;
    }
    return _mm256_loadu_ps((const float *)p + i);
}

PD_AVX2 static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

PD_AVX2 static void axpy_avx2(float a, const float *x, float *y, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

PD_AVX2 static void to_f32_avx2(enum pd_dtype t, const void *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, load8(t, src, i));
    for (; i < n; i++)
        dst[i] = load1(t, src, i);
}

/* NR (1..4) x rows against one w row: the w row is widened once per 16 values and feeds every x
 * row's two accumulators (two, so the FMA latency chain does not bound a single row), so w is
 * read from memory once per four tokens. Inlined per NR so unused rows cost nothing. */
PD_AVX2 static inline __attribute__((always_inline)) void
gemv_rows(const int NR, enum pd_dtype wt, const void *w, int64_t k, const float *x, float *y,
          int64_t ldy, int64_t j0, int64_t j1) {
    size_t esz = wt == PD_DTYPE_F32 ? 4 : 2;
    for (int64_t j = j0; j < j1; j++) {
        const void *wr = (const char *)w + (size_t)j * (size_t)k * esz;
        __m256 a[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            a[r][0] = a[r][1] = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 16 <= k; c += 16) {
            __m256 w0 = load8(wt, wr, c), w1 = load8(wt, wr, c + 8);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + c), a[r][0]);
                a[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * k + c + 8), a[r][1]);
            }
        }
        for (; c + 8 <= k; c += 8) {
            __m256 w0 = load8(wt, wr, c);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
                a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + c), a[r][0]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            float s = hsum8(_mm256_add_ps(a[r][0], a[r][1]));
            for (int64_t cc = c; cc < k; cc++)
                s += load1(wt, wr, cc) * x[r * k + cc];
            y[r * ldy + j] = s;
        }
    }
}

/* Blocks of 8 w rows stay in L1/L2 while every group of four x rows passes over them, so w
 * comes from memory once per step whatever the batch. */
PD_AVX2 static void gemv_avx2(enum pd_dtype wt, const void *w, int64_t k, const float *x, int nx,
                              float *y, int64_t ldy, int64_t j0, int64_t j1) {
    for (int64_t jb = j0; jb < j1; jb += 8) {
        int64_t je = jb + 8 < j1 ? jb + 8 : j1;
        for (int i0 = 0; i0 < nx; i0 += 4) {
            const float *xs = x + (int64_t)i0 * k;
            float *ys = y + (int64_t)i0 * ldy;
            switch (nx - i0 < 4 ? nx - i0 : 4) {
            case 1: gemv_rows(1, wt, w, k, xs, ys, ldy, jb, je); break;
            case 2: gemv_rows(2, wt, w, k, xs, ys, ldy, jb, je); break;
            case 3: gemv_rows(3, wt, w, k, xs, ys, ldy, jb, je); break;
            default: gemv_rows(4, wt, w, k, xs, ys, ldy, jb, je); break;
            }
        }
    }
}
#endif

float pd__cpu_dot(const float *a, const float *b, int64_t n) {
#ifdef PD_HAVE_X86
    if (has_avx2())
        return dot_avx2(a, b, n);
#endif
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void pd__cpu_axpy(float a, const float *x, float *y, int64_t n) {
#ifdef PD_HAVE_X86
    if (has_avx2()) {
        axpy_avx2(a, x, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void pd__cpu_to_f32(enum pd_dtype t, const void *src, float *dst, int64_t n) {
    if (t == PD_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#ifdef PD_HAVE_X86
    if (has_avx2()) {
        to_f32_avx2(t, src, dst, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        dst[i] = load1(t, src, i);
}

void pd__cpu_gemv(enum pd_dtype wt, const void *w, int64_t k, const float *x, int nx, float *y,
                  int64_t ldy, int64_t j0, int64_t j1) {
#ifdef PD_HAVE_X86
    if (has_avx2()) {
        gemv_avx2(wt, w, k, x, nx, y, ldy, j0, j1);
        return;
    }
#endif
    size_t esz = wt == PD_DTYPE_F32 ? 4 : 2;
    for (int64_t j = j0; j < j1; j++) {
        const void *wr = (const char *)w + (size_t)j * (size_t)k * esz;
        for (int i = 0; i < nx; i++) {
            const float *xi = x + (int64_t)i * k;
            float s = 0.0f;
            for (int64_t c = 0; c < k; c++)
                s += load1(wt, wr, c) * xi[c];
            y[(int64_t)i * ldy + j] = s;
        }
    }
}
