/*
 * backend_cpu_kernels.c — the cpu backend's inner loops: dot, axpy, dtype widening, the decode
 * GEMV that reads bf16/f16 weights directly (no f32 copy of the weights exists, so decode streams
 * half the bytes), the prefill GEMM over packed weight panels, and the attention and SwiGLU
 * pieces. Each has versions chosen at run time — AVX-512 where the CPU has it, AVX2+FMA(+F16C),
 * a portable loop — and all sum in f32. The prefill GEMM exists only for AVX-512 (callers ask
 * pd__cpu_gemm_panel_ok and use sgemm otherwise). No state, no allocation.
 */
#include "model/cpu/backend_cpu.h"
#include "common/base/status.h"

#include <math.h>
#include <pthread.h>
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
    case PD_DTYPE_F8E4M3: return pd_f8e4m3_to_f32(((const uint8_t *)p)[i]);
    case PD_DTYPE_F8E5M2: return pd_f8e5m2_to_f32(((const uint8_t *)p)[i]);
    }
    return 0.0f;
}

#ifdef PD_HAVE_X86
/* __builtin_cpu_supports reads flags libgcc filled in at start-up: cheap enough per call. */
static bool has_avx2(void) {
#if defined(__clang__) && __clang_major__ < 15
    /* clang 14 (the fuzz build) rejects "f16c" here; every AVX2 CPU has F16C (Ivy Bridge on) */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
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
    case PD_DTYPE_F8E4M3:
    case PD_DTYPE_F8E5M2: PD_ASSERT(!"fp8 is KV-only: pd__cpu_to_f32 widens it by scalar"); break;
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

/* ---- AVX-512 ---- */

static bool has_avx512(void) {
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

#define PD_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

/* 16 values of type t from p + i as f32; lanes at or past n (from i) read as 0. */
PD_AVX512 static inline __m512 load16(enum pd_dtype t, const void *p, int64_t i, int64_t n) {
    __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    switch (t) {
    case PD_DTYPE_BF16: {
        __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)p + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case PD_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)p + i));
    case PD_DTYPE_F32: break;
    case PD_DTYPE_F8E4M3:
    case PD_DTYPE_F8E5M2: PD_ASSERT(!"fp8 is KV-only: pd__cpu_to_f32 widens it by scalar"); break;
    }
    return _mm512_maskz_loadu_ps(mk, (const float *)p + i);
}

/* 16 values of type t from p + i as f32, all in range. */
PD_AVX512 static inline __m512 load16_full(enum pd_dtype t, const void *p, int64_t i) {
    switch (t) {
    case PD_DTYPE_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case PD_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    case PD_DTYPE_F32: break;
    case PD_DTYPE_F8E4M3:
    case PD_DTYPE_F8E5M2: PD_ASSERT(!"fp8 is KV-only: pd__cpu_to_f32 widens it by scalar"); break;
    }
    return _mm512_loadu_ps((const float *)p + i);
}

/* The four sums of a, b, c, d in one vector: a tree of shuffles instead of four reductions. */
PD_AVX512 static inline __m128 hsum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xee));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* w values ahead of the FMAs that software prefetch asks for. A thread's w rows are one contiguous
 * stream, and at batch 8 the core computes long enough between loads that the hardware
 * prefetcher alone leaves memory idle: asking ~4 KB (bf16) ahead let compute and memory overlap
 * (1024: 25% less, 4096: no better). */
#define PD_GEMV_PREFETCH 2048

/* R (1..8) x rows against three w rows: each 16 widened w values feed R FMAs and each x vector
 * three, so at batch 8 the 24 accumulators keep both FMA ports busy while w streams from memory
 * once. nc < 3 repeats the last w row and drops its sums. Inlined per (R, dtype). */
PD_AVX512 static inline __attribute__((always_inline)) void
gemv_tile512(const int R, const enum pd_dtype wt, const void *w, int64_t k, const float *x,
             float *y, int64_t ldy, int64_t j, int nc) {
    size_t esz = wt == PD_DTYPE_F32 ? 4 : 2;
    const void *wr[3];
    __m512 a[3][8];
    for (int c = 0; c < 3; c++)
        wr[c] = (const char *)w + (size_t)(j + (c < nc ? c : nc - 1)) * (size_t)k * esz;
#pragma GCC unroll 3
    for (int c = 0; c < 3; c++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            a[c][r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
#pragma GCC unroll 3
        for (int c = 0; c < 3; c++) /* past a row's end this lands in the rows after it */
            _mm_prefetch((const char *)wr[c] + (size_t)(i + PD_GEMV_PREFETCH) * esz, _MM_HINT_T0);
        __m512 w0 = load16_full(wt, wr[0], i), w1 = load16_full(wt, wr[1], i);
        __m512 w2 = load16_full(wt, wr[2], i);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * k + i);
            __asm__("" : "+v"(xv)); /* one load per x vector, not one per FMA operand */
            a[0][r] = _mm512_fmadd_ps(w0, xv, a[0][r]);
            a[1][r] = _mm512_fmadd_ps(w1, xv, a[1][r]);
            a[2][r] = _mm512_fmadd_ps(w2, xv, a[2][r]);
        }
    }
    if (i < k) { /* masked tail: zero w lanes make the x lanes past k irrelevant */
        __mmask16 mk = (__mmask16)((1u << (k - i)) - 1);
        __m512 w0 = load16(wt, wr[0], i, k), w1 = load16(wt, wr[1], i, k);
        __m512 w2 = load16(wt, wr[2], i, k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_maskz_loadu_ps(mk, x + r * k + i);
            a[0][r] = _mm512_fmadd_ps(w0, xv, a[0][r]);
            a[1][r] = _mm512_fmadd_ps(w1, xv, a[1][r]);
            a[2][r] = _mm512_fmadd_ps(w2, xv, a[2][r]);
        }
    }
    __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 3
    for (int c = 0; c < 3; c++) {
        if (c >= nc)
            break;
#pragma GCC unroll 2
        for (int r0 = 0; r0 < R; r0 += 4) {
            float s[4];
            _mm_storeu_ps(s,
                          hsum4x16(a[c][r0], r0 + 1 < R ? a[c][r0 + 1] : z,
                                   r0 + 2 < R ? a[c][r0 + 2] : z, r0 + 3 < R ? a[c][r0 + 3] : z));
            for (int r = r0; r < R && r < r0 + 4; r++)
                y[r * ldy + j + c] = s[r - r0];
        }
    }
}

#define PD_GEMV_TILES(WT_)                                                                         \
    for (int64_t j = j0; j < j1; j += 3) {                                                         \
        int nc = j1 - j < 3 ? (int)(j1 - j) : 3;                                                   \
        for (int i0 = 0; i0 < nx; i0 += 8) {                                                       \
            const float *xs = x + (int64_t)i0 * k;                                                 \
            float *ys = y + (int64_t)i0 * ldy;                                                     \
            switch (nx - i0 < 8 ? nx - i0 : 8) {                                                   \
            case 1: gemv_tile512(1, WT_, w, k, xs, ys, ldy, j, nc); break;                         \
            case 2: gemv_tile512(2, WT_, w, k, xs, ys, ldy, j, nc); break;                         \
            case 3: gemv_tile512(3, WT_, w, k, xs, ys, ldy, j, nc); break;                         \
            case 4: gemv_tile512(4, WT_, w, k, xs, ys, ldy, j, nc); break;                         \
            case 5: gemv_tile512(5, WT_, w, k, xs, ys, ldy, j, nc); break;                         \
            case 6: gemv_tile512(6, WT_, w, k, xs, ys, ldy, j, nc); break;                         \
            case 7: gemv_tile512(7, WT_, w, k, xs, ys, ldy, j, nc); break;                         \
            default: gemv_tile512(8, WT_, w, k, xs, ys, ldy, j, nc); break;                        \
            }                                                                                      \
        }                                                                                          \
    }

/* Three w rows (a few KB, in L1) are widened once per group of eight x rows. */
PD_AVX512 static void gemv_avx512(enum pd_dtype wt, const void *w, int64_t k, const float *x,
                                  int nx, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    switch (wt) {
    case PD_DTYPE_BF16: PD_GEMV_TILES(PD_DTYPE_BF16) break;
    case PD_DTYPE_F16: PD_GEMV_TILES(PD_DTYPE_F16) break;
    case PD_DTYPE_F32: PD_GEMV_TILES(PD_DTYPE_F32) break;
    case PD_DTYPE_F8E4M3:
    case PD_DTYPE_F8E5M2: PD_ASSERT(!"fp8 is never a weight"); break;
    }
}
#undef PD_GEMV_TILES

/* r[i] holds row i of a 16x16 f32 block; afterwards r[j] holds column j. */
PD_AVX512 static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* u[4g + c], lane L: column 4L + c of rows 4g..4g+3 */
        u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0xee);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        __m512 w0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        __m512 v1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_f32x4(v0, v1, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(v0, v1, 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(w0, w1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(w0, w1, 0xdd);
    }
}

/* panel[c][jj] = w[j0 + jj][c0 + c] as f32 for c < kc, jj < PD_CPU_GEMM_NR; rows at or past j1
 * are zero. Widening happens here, once per weight value per pass over the activations. */
PD_AVX512 static void pack_panel(enum pd_dtype wt, const void *w, int64_t k, int64_t j0, int64_t j1,
                                 int64_t c0, int kc, float *panel) {
    size_t esz = wt == PD_DTYPE_F32 ? 4 : 2;
    for (int jg = 0; jg < PD_CPU_GEMM_NR; jg += 16) {
        for (int c = 0; c < kc; c += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                int64_t j = j0 + jg + i;
                r[i] = j < j1 ? load16(wt, (const char *)w + (size_t)j * (size_t)k * esz, c0 + c,
                                       c0 + kc)
                              : _mm512_setzero_ps();
            }
            transpose16(r);
            int n = kc - c < 16 ? kc - c : 16;
            for (int i = 0; i < n; i++)
                _mm512_store_ps(panel + (size_t)(c + i) * PD_CPU_GEMM_NR + jg, r[i]);
        }
    }
}

/* MR (1..6) x rows times one packed panel of 64 w rows over kc values: 24 accumulators, four
 * panel loads and MR broadcasts per step, so the FMA ports are the limit. y is read back when
 * accumulating over a second k block; lanes past ncols are neither read nor written. */
PD_AVX512 static inline __attribute__((always_inline)) void
gemm_tile512(const int MR, const float *x, int64_t ldx, const float *panel, int kc, float *y,
             int64_t ldy, bool accum, const __mmask16 mk[4]) {
    __m512 a[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            a[r][c] =
                accum ? _mm512_maskz_loadu_ps(mk[c], y + r * ldy + 16 * c) : _mm512_setzero_ps();
    for (int i = 0; i < kc; i++) {
        const float *p = panel + (size_t)i * PD_CPU_GEMM_NR;
        __m512 b0 = _mm512_load_ps(p), b1 = _mm512_load_ps(p + 16);
        __m512 b2 = _mm512_load_ps(p + 32), b3 = _mm512_load_ps(p + 48);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            __m512 xv = _mm512_set1_ps(x[r * ldx + i]);
            a[r][0] = _mm512_fmadd_ps(xv, b0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(xv, b1, a[r][1]);
            a[r][2] = _mm512_fmadd_ps(xv, b2, a[r][2]);
            a[r][3] = _mm512_fmadd_ps(xv, b3, a[r][3]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(y + r * ldy + 16 * c, mk[c], a[r][c]);
}

PD_AVX512 static void gemm_avx512(enum pd_dtype wt, const void *w, int64_t k, const float *x,
                                  int64_t nx, float *y, int64_t ldy, int64_t j0, int64_t j1,
                                  float *panel) {
    __mmask16 mk[4];
    for (int c = 0; c < 4; c++) {
        int64_t n = j1 - j0 - 16 * c;
        mk[c] = n >= 16 ? (__mmask16)0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0;
    }
    for (int64_t c0 = 0; c0 < k; c0 += PD_CPU_GEMM_KC) {
        int kc = k - c0 < PD_CPU_GEMM_KC ? (int)(k - c0) : PD_CPU_GEMM_KC;
        pack_panel(wt, w, k, j0, j1, c0, kc, panel);
        bool accum = c0 > 0;
        for (int64_t i = 0; i < nx; i += 6) {
            const float *xs = x + i * k + c0;
            float *ys = y + i * ldy + j0;
            switch (nx - i < 6 ? nx - i : 6) {
            case 1: gemm_tile512(1, xs, k, panel, kc, ys, ldy, accum, mk); break;
            case 2: gemm_tile512(2, xs, k, panel, kc, ys, ldy, accum, mk); break;
            case 3: gemm_tile512(3, xs, k, panel, kc, ys, ldy, accum, mk); break;
            case 4: gemm_tile512(4, xs, k, panel, kc, ys, ldy, accum, mk); break;
            case 5: gemm_tile512(5, xs, k, panel, kc, ys, ldy, accum, mk); break;
            default: gemm_tile512(6, xs, k, panel, kc, ys, ldy, accum, mk); break;
            }
        }
    }
}

/* e^x, about 1 ulp: x = n ln2 + r with |r| <= ln2/2, Cephes' degree-6 polynomial for e^r, then
 * scalef multiplies by 2^n, saturating to 0 and inf as expf does. */
PD_AVX512 static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

PD_AVX512 static void silu_mul_avx512(const float *g, const float *u, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 gv = _mm512_maskz_loadu_ps(mk, g + i), uv = _mm512_maskz_loadu_ps(mk, u + i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 sg = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(out + i, mk, _mm512_mul_ps(sg, uv));
    }
}

PD_AVX512 static void softmax_avx512(float *s, int n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        mx = _mm512_mask_max_ps(mx, mk, mx, _mm512_maskz_loadu_ps(mk, s + i));
    }
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + i), m));
        sum = _mm512_mask_add_ps(sum, mk, sum, e);
        _mm512_mask_storeu_ps(s + i, mk, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(s + i, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, s + i), inv));
    }
}

/* R (1..8) query rows against the transposed key run kt [hd][16]: 16 scores per vector, R
 * independent FMA chains, no horizontal sums. */
PD_AVX512 static inline __attribute__((always_inline)) void scores_rows(const int R, const float *q,
                                                                        int hd, const float *kt,
                                                                        float scale, float *s,
                                                                        int64_t lds, __mmask16 mk) {
    __m512 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        a[r] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m512 kv = _mm512_load_ps(kt + (size_t)d * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            a[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)r * hd + d]), kv, a[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        _mm512_mask_storeu_ps(s + (size_t)r * lds, mk, _mm512_mul_ps(a[r], _mm512_set1_ps(scale)));
}

/* The key run is transposed once (16x16 blocks in registers) and then shared by every query row
 * of the item: all query heads of a kv head, for all tokens of a prefill block. */
PD_AVX512 static void attn_scores_avx512(const float *q, int nq, int hd, const float *k,
                                         int64_t ldk, int nk, float scale, float *s, int64_t lds,
                                         float *kt) {
    __mmask16 mk = nk >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nk) - 1);
    for (int d0 = 0; d0 < hd; d0 += 16) {
        __mmask16 dm = hd - d0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - d0)) - 1);
        __m512 r[16];
        for (int j = 0; j < 16; j++)
            r[j] =
                j < nk ? _mm512_maskz_loadu_ps(dm, k + (size_t)j * ldk + d0) : _mm512_setzero_ps();
        transpose16(r);
        for (int d = 0; d < 16 && d0 + d < hd; d++)
            _mm512_store_ps(kt + (size_t)(d0 + d) * 16, r[d]);
    }
    int r = 0;
    for (; nq - r >= 8; r += 8)
        scores_rows(8, q + (size_t)r * hd, hd, kt, scale, s + (size_t)r * lds, lds, mk);
    if (nq - r >= 4) {
        scores_rows(4, q + (size_t)r * hd, hd, kt, scale, s + (size_t)r * lds, lds, mk);
        r += 4;
    }
    if (nq - r >= 2) {
        scores_rows(2, q + (size_t)r * hd, hd, kt, scale, s + (size_t)r * lds, lds, mk);
        r += 2;
    }
    if (nq - r >= 1)
        scores_rows(1, q + (size_t)r * hd, hd, kt, scale, s + (size_t)r * lds, lds, mk);
}

/* R (1..8) output rows, one 16-wide slice of head_dim: each V load feeds R FMAs. */
PD_AVX512 static inline __attribute__((always_inline)) void
pv_rows(const int R, const float *p, int64_t ldp, const float *v, int64_t ldv, int nk, int hd,
        float *o, int d0, __mmask16 dm) {
    __m512 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        a[r] = _mm512_maskz_loadu_ps(dm, o + (size_t)r * hd + d0);
    for (int j = 0; j < nk; j++) {
        __m512 vv = _mm512_maskz_loadu_ps(dm, v + (size_t)j * ldv + d0);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)r * ldp + j]), vv, a[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        _mm512_mask_storeu_ps(o + (size_t)r * hd + d0, dm, a[r]);
}

PD_AVX512 static void attn_pv_avx512(const float *p, int64_t ldp, int nq, const float *v,
                                     int64_t ldv, int nk, int hd, float *o) {
    for (int d0 = 0; d0 < hd; d0 += 16) {
        __mmask16 dm = hd - d0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - d0)) - 1);
        int r = 0;
        for (; nq - r >= 8; r += 8)
            pv_rows(8, p + (size_t)r * ldp, ldp, v, ldv, nk, hd, o + (size_t)r * hd, d0, dm);
        if (nq - r >= 4) {
            pv_rows(4, p + (size_t)r * ldp, ldp, v, ldv, nk, hd, o + (size_t)r * hd, d0, dm);
            r += 4;
        }
        if (nq - r >= 2) {
            pv_rows(2, p + (size_t)r * ldp, ldp, v, ldv, nk, hd, o + (size_t)r * hd, d0, dm);
            r += 2;
        }
        if (nq - r >= 1)
            pv_rows(1, p + (size_t)r * ldp, ldp, v, ldv, nk, hd, o + (size_t)r * hd, d0, dm);
    }
}
#endif

bool pd__cpu_gemm_panel_ok(void) {
#ifdef PD_HAVE_X86
    return has_avx512();
#else
    return false;
#endif
}

void pd__cpu_gemm_panel(enum pd_dtype wt, const void *w, int64_t k, const float *x, int64_t nx,
                        float *y, int64_t ldy, int64_t j0, int64_t j1, float *panel) {
    PD_ASSERT(j1 - j0 <= PD_CPU_GEMM_NR && ((uintptr_t)panel & 63) == 0);
#ifdef PD_HAVE_X86
    if (has_avx512()) {
        gemm_avx512(wt, w, k, x, nx, y, ldy, j0, j1, panel);
        return;
    }
#endif
    PD_ASSERT(!"pd__cpu_gemm_panel without AVX-512");
}

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

/* fp8 (KV only) widens through a table of the 256 values of each format: one load an element
 * instead of model/fp8.h's branches, the same values (the table is made from them). */
static float fp8_table[2][256];
static pthread_once_t fp8_table_once = PTHREAD_ONCE_INIT;

static void fp8_table_init(void) {
    for (int i = 0; i < 256; i++) {
        fp8_table[0][i] = pd_f8e4m3_to_f32((uint8_t)i);
        fp8_table[1][i] = pd_f8e5m2_to_f32((uint8_t)i);
    }
}

void pd__cpu_to_f32(enum pd_dtype t, const void *src, float *dst, int64_t n) {
    if (t == PD_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    if (t == PD_DTYPE_F8E4M3 || t == PD_DTYPE_F8E5M2) {
        pthread_once(&fp8_table_once, fp8_table_init);
        const float *tab = fp8_table[t == PD_DTYPE_F8E5M2];
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = tab[s[i]];
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
    if (has_avx512()) {
        gemv_avx512(wt, w, k, x, nx, y, ldy, j0, j1);
        return;
    }
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

void pd__cpu_silu_mul(const float *gate, const float *up, float *out, int64_t n) {
#ifdef PD_HAVE_X86
    if (has_avx512()) {
        silu_mul_avx512(gate, up, out, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void pd__cpu_softmax(float *s, int n) {
#ifdef PD_HAVE_X86
    if (has_avx512()) {
        softmax_avx512(s, n);
        return;
    }
#endif
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++)
        mx = s[j] > mx ? s[j] : mx;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < n; j++)
        s[j] *= inv;
}

void pd__cpu_attn_scores(const float *q, int nq, int hd, const float *k, int64_t ldk, int nk,
                         float scale, float *s, int64_t lds, float *kt) {
    PD_ASSERT(nk <= 16 && ((uintptr_t)kt & 63) == 0);
#ifdef PD_HAVE_X86
    if (has_avx512()) {
        attn_scores_avx512(q, nq, hd, k, ldk, nk, scale, s, lds, kt);
        return;
    }
#endif
    for (int r = 0; r < nq; r++)
        for (int j = 0; j < nk; j++)
            s[(size_t)r * lds + j] =
                pd__cpu_dot(q + (size_t)r * hd, k + (size_t)j * ldk, hd) * scale;
}

void pd__cpu_attn_pv(const float *p, int64_t ldp, int nq, const float *v, int64_t ldv, int nk,
                     int hd, float *o) {
#ifdef PD_HAVE_X86
    if (has_avx512()) {
        attn_pv_avx512(p, ldp, nq, v, ldv, nk, hd, o);
        return;
    }
#endif
    for (int j = 0; j < nk; j++)
        for (int r = 0; r < nq; r++)
            pd__cpu_axpy(p[(size_t)r * ldp + j], v + (size_t)j * ldv, o + (size_t)r * hd, hd);
}
