/*
 * backend_cpu_kernels.c — the cpu backend's inner loops: dot, axpy, dtype widening, the decode
 * GEMV that reads bf16/f16 weights directly (no f32 copy of the weights exists, so decode streams
 * half the bytes), the prefill GEMM over packed weight panels, and the attention and SwiGLU
 * pieces. Each has versions chosen at run time — AVX-512 where the CPU has it, AVX2+FMA(+F16C),
 * a portable loop (PDSERVE_CPU_ISA may choose a lower one) — and all sum in f32. With AVX2 (and
 * AVX-512) the weight matrices are tiled (backend_cpu.h) and the GEMV reads them so; the prefill
 * GEMM exists only on AVX-512 (callers use sgemm on widened rows otherwise), and on AMX machines
 * bf16 weights' prefill products run as bf16 tile products (exact, summed in f32). No allocation.
 */
#include "model/cpu/backend_cpu.h"
#include "common/base/status.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
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

/* The instruction set the kernels use: the best the CPU has, or a lower one that
 * PDSERVE_CPU_ISA names (amx, avx512, avx2, generic), read once, so the fallbacks can be tested on
 * any machine. */
enum cpu_isa { ISA_GENERIC, ISA_AVX2, ISA_AVX512, ISA_AMX };
static enum cpu_isa isa_level;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

#ifdef PD_HAVE_X86
/* AMX with bf16 tiles: the CPU has it (CPUID leaf 7: AMX-BF16 is EDX bit 22, AMX-TILE bit 24)
 * and Linux lets this process use the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XTILEDATA, Linux 5.16 on; refused where the kernel or hypervisor does not enable it). The
 * permission is the process's, so every pool thread may then load a tile configuration. */
static bool amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
        return false;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#endif

static void isa_init(void) {
    enum cpu_isa have = ISA_GENERIC;
#ifdef PD_HAVE_X86
    /* clang 14 (the fuzz build) rejects "f16c" here; every AVX2 CPU has F16C (Ivy Bridge on) */
#if defined(__clang__) && __clang_major__ < 15
    bool f16c = true;
#else
    bool f16c = __builtin_cpu_supports("f16c");
#endif
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
        have = ISA_AVX2;
    if (have == ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        have = ISA_AVX512;
    if (have == ISA_AVX512 && amx_usable())
        have = ISA_AMX;
#endif
    const char *e = getenv("PDSERVE_CPU_ISA");
    enum cpu_isa want = have;
    if (e && strcmp(e, "generic") == 0)
        want = ISA_GENERIC;
    else if (e && strcmp(e, "avx2") == 0)
        want = ISA_AVX2;
    else if (e && strcmp(e, "avx512") == 0)
        want = ISA_AVX512;
    isa_level = want < have ? want : have;
}

/* AMX's prefill product: bf16 parts each activation is cut into, bytes of a 16x64-byte tile */
#define AMX_PARTS 3
#define AMX_TILE_BYTES 1024

static enum cpu_isa cpu_isa(void) {
    pthread_once(&isa_once, isa_init);
    return isa_level;
}

const char *pd__cpu_isa_name(void) {
    static const char *const names[] = {"generic", "avx2", "avx512", "amx"};
    return names[cpu_isa()];
}

#ifdef PD_HAVE_X86
static bool has_avx2(void) {
    return cpu_isa() >= ISA_AVX2;
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

/* e^x = 2^n e^r with x = n ln2 + r, |r| <= ln2/2 (ln2 in two parts, so r is exact), e^r from
 * Cephes' degree-6 expf polynomial: 1 + r + r^2 (c0 r^5 + ... + c5), about 1 ulp. */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
static const float exp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

/* e^x, with 2^n built in the exponent bits: x is held within
 * [-87.33, 88.37] so n stays a normal exponent, and below -87.33 the result is 0 where expf
 * gives a denormal (under 1.2e-38); above 88.37 it is 2.4e38 where expf overflows. The callers
 * (softmax after its max is taken off, silu) never get there but for such tails. */
PD_AVX2 static inline __m256 exp256(__m256 x) {
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33f)), _mm256_set1_ps(88.37f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(exp_poly[0]);
    for (int i = 1; i < 6; i++)
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly[i]));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* Lanes [0, n) of 8 set (n may be <= 0 or >= 8): the mask of a partial load or store. */
PD_AVX2 static inline __m256i lanes8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n < 0   ? 0
                                                : n > 8 ? 8
                                                        : (int)n),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

PD_AVX2 static void silu_mul_avx2(const float *g, const float *u, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __m256i mk = lanes8(n - i);
        __m256 gv = _mm256_maskload_ps(g + i, mk), uv = _mm256_maskload_ps(u + i, mk);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_maskstore_ps(out + i, mk, _mm256_mul_ps(sg, uv));
    }
}

PD_AVX2 static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

PD_AVX2 static void softmax_avx2(float *s, int n) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 8) {
        __m256i mk = lanes8(n - i);
        __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(s + i, mk),
                                    _mm256_castsi256_ps(mk));
        mx = _mm256_max_ps(mx, x);
    }
    __m256 m = _mm256_set1_ps(hmax8(mx)), sum = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256i mk = lanes8(n - i);
        __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_maskload_ps(s + i, mk), m)),
                                 _mm256_castsi256_ps(mk));
        sum = _mm256_add_ps(sum, e);
        _mm256_maskstore_ps(s + i, mk, e);
    }
    __m256 inv = _mm256_set1_ps(1.0f / hsum8(sum));
    for (int i = 0; i < n; i += 8) {
        __m256i mk = lanes8(n - i);
        _mm256_maskstore_ps(s + i, mk, _mm256_mul_ps(_mm256_maskload_ps(s + i, mk), inv));
    }
}

/* r[0..8) transposed in place: r[d] lane j = the old r[j] lane d. */
PD_AVX2 static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* R (1..6) query rows against the transposed key run kt [hd][16]: 16 scores in two vectors,
 * 2R independent FMA chains, no horizontal sums. */
PD_AVX2 static inline __attribute__((always_inline)) void
scores_rows8(const int R, const float *q, int hd, const float *kt, float scale, float *s,
             int64_t lds, __m256i m0, __m256i m1) {
    __m256 a[6][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m256 k0 = _mm256_load_ps(kt + (size_t)d * 16),
               k1 = _mm256_load_ps(kt + (size_t)d * 16 + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 b = _mm256_broadcast_ss(q + (size_t)r * hd + d);
            a[r][0] = _mm256_fmadd_ps(b, k0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(b, k1, a[r][1]);
        }
    }
    __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_maskstore_ps(s + (size_t)r * lds, m0, _mm256_mul_ps(a[r][0], sc));
        _mm256_maskstore_ps(s + (size_t)r * lds + 8, m1, _mm256_mul_ps(a[r][1], sc));
    }
}

/* As attn_scores_avx512: the key run is transposed once (8x8 blocks in registers; keys past
 * nk are zeros) and shared by every query row of the item. */
PD_AVX2 static void attn_scores_avx2(const float *q, int nq, int hd, const float *k, int64_t ldk,
                                     int nk, float scale, float *s, int64_t lds, float *kt) {
    for (int d0 = 0; d0 < hd; d0 += 8) {
        __m256i dm = lanes8(hd - d0);
        for (int j0 = 0; j0 < 16; j0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++)
                r[j] = j0 + j < nk ? _mm256_maskload_ps(k + (size_t)(j0 + j) * ldk + d0, dm)
                                   : _mm256_setzero_ps();
            transpose8(r);
            for (int d = 0; d < 8 && d0 + d < hd; d++)
                _mm256_store_ps(kt + (size_t)(d0 + d) * 16 + j0, r[d]);
        }
    }
    __m256i m0 = lanes8(nk), m1 = lanes8(nk - 8);
    int r = 0;
    for (; nq - r >= 6; r += 6)
        scores_rows8(6, q + (size_t)r * hd, hd, kt, scale, s + (size_t)r * lds, lds, m0, m1);
    for (; nq - r >= 2; r += 2)
        scores_rows8(2, q + (size_t)r * hd, hd, kt, scale, s + (size_t)r * lds, lds, m0, m1);
    if (nq - r >= 1)
        scores_rows8(1, q + (size_t)r * hd, hd, kt, scale, s + (size_t)r * lds, lds, m0, m1);
}

/* R (1..8) output rows, one 8-wide slice of head_dim: each V load feeds R FMAs. */
PD_AVX2 static inline __attribute__((always_inline)) void pv_rows8(const int R, const float *p,
                                                                   int64_t ldp, const float *v,
                                                                   int64_t ldv, int nk, int hd,
                                                                   float *o, int d0, __m256i dm) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        a[r] = _mm256_maskload_ps(o + (size_t)r * hd + d0, dm);
    for (int j = 0; j < nk; j++) {
        __m256 vv = _mm256_maskload_ps(v + (size_t)j * ldv + d0, dm);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (size_t)r * ldp + j), vv, a[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        _mm256_maskstore_ps(o + (size_t)r * hd + d0, dm, a[r]);
}

PD_AVX2 static void attn_pv_avx2(const float *p, int64_t ldp, int nq, const float *v, int64_t ldv,
                                 int nk, int hd, float *o) {
    for (int d0 = 0; d0 < hd; d0 += 8) {
        __m256i dm = lanes8(hd - d0);
        int r = 0;
        for (; nq - r >= 8; r += 8)
            pv_rows8(8, p + (size_t)r * ldp, ldp, v, ldv, nk, hd, o + (size_t)r * hd, d0, dm);
        for (; nq - r >= 2; r += 2)
            pv_rows8(2, p + (size_t)r * ldp, ldp, v, ldv, nk, hd, o + (size_t)r * hd, d0, dm);
        if (nq - r >= 1)
            pv_rows8(1, p + (size_t)r * ldp, ldp, v, ldv, nk, hd, o + (size_t)r * hd, d0, dm);
    }
}

/* ---- AVX2 over tiled weights ---- */

/* Values off..off+7 of a tiled line as f32 (off a multiple of 8). A bf16 line holds values m and
 * 16 + m in its 32-bit lane m (pd__cpu_tile): values 0-7 and 16-23 are the low and high halves
 * of its first 32 bytes, 8-15 and 24-31 of its second, so each takes one load and one shift or
 * mask. */
PD_AVX2 static inline __m256 tiled_load8(enum pd_dtype t, const char *line, int off) {
    switch (t) {
    case PD_DTYPE_BF16: {
        __m256i v = _mm256_load_si256((const __m256i *)(line + (off & 8) * 4));
        return _mm256_castsi256_ps(off & 16
                                       ? _mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))
                                       : _mm256_slli_epi32(v, 16));
    }
    case PD_DTYPE_F16: return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(line + off * 2)));
    case PD_DTYPE_F32: break;
    case PD_DTYPE_F8E4M3:
    case PD_DTYPE_F8E5M2: PD_ASSERT(!"fp8 is never a weight"); break;
    }
    return _mm256_load_ps((const float *)line + off);
}

/* A whole tiled line of type t → its values in order as f32. */
PD_AVX2 static void tiled_line_to_f32_avx2(enum pd_dtype t, const char *line, float *dst) {
    for (int off = 0; off < (int)pd__cpu_tile_vals(t); off += 8)
        _mm256_storeu_ps(dst + off, tiled_load8(t, line, off));
}

/* The four sums of a, b, c, d in one vector. */
PD_AVX2 static inline __m128 hsum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* x rows a pass over a tile takes: 4R sums + 4 w + R x vectors in 16 registers. R = 3 (12 sums,
 * 4 w, 3 x: 19) spills, and measured 1.13x the row-major kernel at batch 8 against R = 2's 1.41x */
#define GEMV_R256 2

/* Sub-block h (8 values) of a line against R x rows at column i + h; masked: k ends inside it. */
PD_AVX2 static inline __attribute__((always_inline)) void
gemv_sub256(const int R, const enum pd_dtype wt, const char *line, int h, const float *x, int64_t k,
            int64_t i, __m256 a[][GEMV_R256], bool masked) {
    __m256 xv[GEMV_R256];
    if (!masked) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            xv[r] = _mm256_loadu_ps(x + r * k + i + h);
    } else {
        __m256i mk = lanes8(k - i - h);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            xv[r] = _mm256_maskload_ps(x + r * k + i + h, mk);
    }
#pragma GCC unroll 4
    for (int c = 0; c < PD_CPU_TILE_ROWS; c++) {
        __m256 w = tiled_load8(wt, line + c * PD_CPU_TILE_LINE, h);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            a[c][r] = _mm256_fmadd_ps(w, xv[r], a[c][r]);
    }
}

/* R (1..GEMV_R256) x rows against one tile of PD_CPU_TILE_ROWS (4) w rows, 8 values at a time:
 * each widened w vector feeds R FMAs and each x vector four, one chain per (w row, x row)
 * whatever R is, so a row's sums do not depend on the batch it came in. Whole lines run
 * unmasked and without per-block tests (the tests and jumps cost about 10% at batch 8), the partial
 * last line masked. The tile is one contiguous run, so each thread streams its weights front to
 * back; pf > 0 prefetches the stream pf bytes ahead. nr: the tile's rows that exist. Against
 * the row-major kernel this replaced (one w row × up to 4 x rows, widened per row), one decode
 * step's products of a qwen2.5-0.5b shape on 2 threads ran 1.16x as fast at batch 1, 1.19x at
 * 2, 1.49x at 8 and 1.58x at 32 (paired medians in one process). */
PD_AVX2 static inline __attribute__((always_inline)) void
gemv_tile256(const int R, const enum pd_dtype wt, const char *tile, int64_t k, const float *x,
             float *y, int64_t ldy, int nr, int pf) {
    const int E = wt == PD_DTYPE_F32 ? 16 : 32;         /* values a line */
    const int LB = PD_CPU_TILE_ROWS * PD_CPU_TILE_LINE; /* bytes a line of the tile */
    __m256 a[PD_CPU_TILE_ROWS][GEMV_R256];
#pragma GCC unroll 4
    for (int c = 0; c < PD_CPU_TILE_ROWS; c++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            a[c][r] = _mm256_setzero_ps();
    int64_t i = 0;
    const char *line = tile;
    for (; i + E <= k; i += E, line += LB) {
        if (pf)
            for (int l = 0; l < PD_CPU_TILE_ROWS; l++)
                _mm_prefetch(line + pf + l * PD_CPU_TILE_LINE, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int h = 0; h < E; h += 8)
            gemv_sub256(R, wt, line, h, x, k, i, a, false);
    }
    /* the last, partial line: past k the w lanes are zero padding and the x lanes are not read */
    for (int h = 0; i + h < k; h += 8)
        gemv_sub256(R, wt, line, h, x, k, i, a, true);
    __m128i ym = _mm_cmpgt_epi32(_mm_set1_epi32(nr), _mm_setr_epi32(0, 1, 2, 3));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        _mm_maskstore_ps(y + r * ldy, ym, hsum4x8(a[0][r], a[1][r], a[2][r], a[3][r]));
}

/* Bytes ahead of the tile being read that a product of several x rows prefetches, both ISAs'
 * (AVX-512: without it batch 8 ran 20% slower; 2, 4 and 8 KB alike). At batch 1 it only slowed
 * the stream. */
#define GEMV_PREFETCH 4096

/* Every group of up to GEMV_R256 x rows against one tile: the first reads it from memory, the
 * later ones find it in L1/L2 and meanwhile prefetch the next tile. */
PD_AVX2 static inline __attribute__((always_inline)) void
gemv_groups256(const enum pd_dtype wt, const char *tile, int tile_bytes, int64_t k, const float *x,
               int nx, float *y, int64_t ldy, int nr) {
    for (int i0 = 0; i0 < nx; i0 += GEMV_R256) {
        const float *xs = x + (int64_t)i0 * k;
        float *ys = y + (int64_t)i0 * ldy;
        int pf = i0 == 0 ? (nx > GEMV_R256 ? GEMV_PREFETCH : 0) : tile_bytes;
        if (nx - i0 == 1)
            gemv_tile256(1, wt, tile, k, xs, ys, ldy, nr, pf);
        else
            gemv_tile256(2, wt, tile, k, xs, ys, ldy, nr, pf);
    }
}

PD_AVX2 static void gemv_tiled256(enum pd_dtype wt, const void *w, int64_t k, const float *x,
                                  int nx, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    PD_ASSERT(j0 % PD_CPU_TILE_ROWS == 0);
    int64_t nblk = pd__cpu_tile_blocks(wt, k);
    int tb = (int)(nblk * PD_CPU_TILE_ROWS * PD_CPU_TILE_LINE); /* bytes a tile */
    for (int64_t j = j0; j < j1; j += PD_CPU_TILE_ROWS) {
        const char *tile = pd__cpu_tiled_line(w, nblk, j, 0);
        int nr = j1 - j < PD_CPU_TILE_ROWS ? (int)(j1 - j) : PD_CPU_TILE_ROWS;
        switch (wt) {
        case PD_DTYPE_BF16:
            gemv_groups256(PD_DTYPE_BF16, tile, tb, k, x, nx, y + j, ldy, nr);
            break;
        case PD_DTYPE_F16: gemv_groups256(PD_DTYPE_F16, tile, tb, k, x, nx, y + j, ldy, nr); break;
        case PD_DTYPE_F32: gemv_groups256(PD_DTYPE_F32, tile, tb, k, x, nx, y + j, ldy, nr); break;
        case PD_DTYPE_F8E4M3:
        case PD_DTYPE_F8E5M2: PD_ASSERT(!"fp8 is never a weight"); break;
        }
    }
}

/* The lines of row j of src (cols values of 16 bits) into dst: bf16 lanes paired (m, 16 + m),
 * values past cols zero. SSE2 unpacks, 8 pairs at a time. */
static void tile_row16_sse2(enum pd_dtype t, const uint16_t *src, int64_t cols, int64_t j,
                            int64_t nblk, char *dst) {
    for (int64_t b = 0; b < nblk; b++) {
        int64_t n = cols - b * 32 < 32 ? cols - b * 32 : 32;
        uint16_t v[32] = {0};
        memcpy(v, src + j * cols + b * 32, (size_t)n * 2);
        char *line = dst + pd__cpu_tiled_off(nblk, j, b);
        if (t != PD_DTYPE_BF16) {
            memcpy(line, v, sizeof(v));
            continue;
        }
        for (int q = 0; q < 2; q++) { /* lanes 8q..8q+7: values 8q.. and 16 + 8q.. */
            __m128i lo = _mm_loadu_si128((const __m128i *)(v + 8 * q)),
                    hi = _mm_loadu_si128((const __m128i *)(v + 16 + 8 * q));
            _mm_storeu_si128((__m128i *)(line + 32 * q), _mm_unpacklo_epi16(lo, hi));
            _mm_storeu_si128((__m128i *)(line + 32 * q + 16), _mm_unpackhi_epi16(lo, hi));
        }
    }
}

/* ---- AVX-512 ---- */

static bool has_avx512(void) {
    return cpu_isa() >= ISA_AVX512;
}

#define PD_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

/* The four sums of a, b, c, d in one vector: a tree of shuffles instead of four reductions. */
PD_AVX512 static inline __m128 hsum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xee));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Values off..off+15 of a tiled line as f32 (off: 0, or 16 in a line of 16-bit values). A bf16
 * line holds values m and 16 + m in its 32-bit lane m (pd__cpu_tile), so both halves come from
 * one load and one shift or mask each. */
PD_AVX512 static inline __m512 tiled_load16(enum pd_dtype t, const char *line, int off) {
    switch (t) {
    case PD_DTYPE_BF16: {
        __m512i v = _mm512_load_si512((const void *)line);
        return _mm512_castsi512_ps(off ? _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u))
                                       : _mm512_slli_epi32(v, 16));
    }
    case PD_DTYPE_F16: return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(line + off * 2)));
    case PD_DTYPE_F32: break;
    case PD_DTYPE_F8E4M3:
    case PD_DTYPE_F8E5M2: PD_ASSERT(!"fp8 is never a weight"); break;
    }
    return _mm512_load_ps((const float *)line);
}

/* R (1..8) x rows against one tile of PD_CPU_TILE_ROWS (4) w rows, 16 values at a time: each
 * widened w vector feeds R FMAs and each x vector four. The tile's bytes are one contiguous run,
 * so each thread streams its weights front to back — what the hardware prefetcher follows best
 * (rows read side by side from their own places reached ~70% of a plain read's rate). With
 * several x rows the core computes long enough per line that memory would idle between the
 * prefetcher's requests: pf > 0 asks for the stream pf bytes ahead. At R = 8 the 32 accumulators
 * and the 4 w vectors are more than the 32 registers (one accumulator lives in L1); that still
 * beat a pass of 6 rows and one of 2 (by 19% at batch 8) and two passes of 8 over half the tile
 * (by 45%). nr: the tile's rows that exist (the sums of padding rows are dropped). */
PD_AVX512 static inline __attribute__((always_inline)) void
gemv_tile512(const int R, const enum pd_dtype wt, const char *tile, int64_t k, const float *x,
             float *y, int64_t ldy, int nr, int pf) {
    const int E = wt == PD_DTYPE_F32 ? 16 : 32; /* values a line */
    __m512 a[PD_CPU_TILE_ROWS][8];
#pragma GCC unroll 4
    for (int c = 0; c < PD_CPU_TILE_ROWS; c++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            a[c][r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += E) {
        const char *line = tile + (i / E) * (PD_CPU_TILE_ROWS * PD_CPU_TILE_LINE);
        if (pf)
            for (int l = 0; l < PD_CPU_TILE_ROWS; l++)
                _mm_prefetch(line + pf + l * PD_CPU_TILE_LINE, _MM_HINT_T0);
#pragma GCC unroll 2
        for (int h = 0; h < E; h += 16) {
            if (i + h >= k)
                break;
            /* past k the w lanes are zero padding and the x lanes are not read */
            __mmask16 mk =
                k - i - h >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - i - h)) - 1);
            __m512 w[PD_CPU_TILE_ROWS];
#pragma GCC unroll 4
            for (int c = 0; c < PD_CPU_TILE_ROWS; c++)
                w[c] = tiled_load16(wt, line + c * PD_CPU_TILE_LINE, h);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512 xv = _mm512_maskz_loadu_ps(mk, x + r * k + i + h);
#pragma GCC unroll 4
                for (int c = 0; c < PD_CPU_TILE_ROWS; c++)
                    a[c][r] = _mm512_fmadd_ps(w[c], xv, a[c][r]);
            }
        }
    }
    __mmask8 ym = (__mmask8)((1u << nr) - 1);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        _mm_mask_storeu_ps(y + r * ldy, ym, hsum4x16(a[0][r], a[1][r], a[2][r], a[3][r]));
}

/* Every group of up to 8 x rows against one tile: the first reads it from memory, the later
 * ones find it in L1/L2 and meanwhile prefetch the next tile, so that memory keeps streaming
 * while they compute (6% more tokens/s at batch 32). */
PD_AVX512 static inline __attribute__((always_inline)) void
gemv_groups(const enum pd_dtype wt, const char *tile, int tile_bytes, int64_t k, const float *x,
            int nx, float *y, int64_t ldy, int nr) {
    for (int i0 = 0; i0 < nx; i0 += 8) {
        const float *xs = x + (int64_t)i0 * k;
        float *ys = y + (int64_t)i0 * ldy;
        int pf = i0 == 0 ? (nx > 1 ? GEMV_PREFETCH : 0) : tile_bytes;
        switch (nx - i0 < 8 ? nx - i0 : 8) {
        case 1: gemv_tile512(1, wt, tile, k, xs, ys, ldy, nr, pf); break;
        case 2: gemv_tile512(2, wt, tile, k, xs, ys, ldy, nr, pf); break;
        case 3: gemv_tile512(3, wt, tile, k, xs, ys, ldy, nr, pf); break;
        case 4: gemv_tile512(4, wt, tile, k, xs, ys, ldy, nr, pf); break;
        case 5: gemv_tile512(5, wt, tile, k, xs, ys, ldy, nr, pf); break;
        case 6: gemv_tile512(6, wt, tile, k, xs, ys, ldy, nr, pf); break;
        case 7: gemv_tile512(7, wt, tile, k, xs, ys, ldy, nr, pf); break;
        default: gemv_tile512(8, wt, tile, k, xs, ys, ldy, nr, pf); break;
        }
    }
}

PD_AVX512 static void gemv_tiled512(enum pd_dtype wt, const void *w, int64_t k, const float *x,
                                    int nx, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    PD_ASSERT(j0 % PD_CPU_TILE_ROWS == 0);
    int64_t nblk = pd__cpu_tile_blocks(wt, k);
    int tb = (int)(nblk * PD_CPU_TILE_ROWS * PD_CPU_TILE_LINE); /* bytes a tile */
    for (int64_t j = j0; j < j1; j += PD_CPU_TILE_ROWS) {
        const char *tile = pd__cpu_tiled_line(w, nblk, j, 0);
        int nr = j1 - j < PD_CPU_TILE_ROWS ? (int)(j1 - j) : PD_CPU_TILE_ROWS;
        switch (wt) {
        case PD_DTYPE_BF16: gemv_groups(PD_DTYPE_BF16, tile, tb, k, x, nx, y + j, ldy, nr); break;
        case PD_DTYPE_F16: gemv_groups(PD_DTYPE_F16, tile, tb, k, x, nx, y + j, ldy, nr); break;
        case PD_DTYPE_F32: gemv_groups(PD_DTYPE_F32, tile, tb, k, x, nx, y + j, ldy, nr); break;
        case PD_DTYPE_F8E4M3:
        case PD_DTYPE_F8E5M2: PD_ASSERT(!"fp8 is never a weight"); break;
        }
    }
}

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
    const int64_t E = pd__cpu_tile_vals(wt), nblk = pd__cpu_tile_blocks(wt, k);
    for (int jg = 0; jg < PD_CPU_GEMM_NR; jg += 16) {
        for (int c = 0; c < kc; c += 16) {
            __m512 r[16];
            int64_t col = c0 + c; /* 16 | E: the 16 values are one half of a line */
            for (int i = 0; i < 16; i++) {
                int64_t j = j0 + jg + i;
                r[i] = j < j1 ? tiled_load16(wt, pd__cpu_tiled_line(w, nblk, j, col / E),
                                             (int)(col % E))
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

/* e^x as exp256's comment says; scalef multiplies by 2^n, saturating to 0 and inf as expf
 * does. */
PD_AVX512 static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(exp_poly[0]);
    for (int i = 1; i < 6; i++)
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_poly[i]));
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

/* ---- AMX: the prefill product on bf16 weights ---- */

/* One TDPBF16PS multiplies a 16x32 bf16 tile by a 32x16 one into 16x16 f32 sums, 16 times the
 * products of an AVX-512 FMA per instruction. Activations are f32, so each is cut into three
 * bf16 parts that add up to it exactly (hi = x with the low 16 bits cleared, mid the same of
 * x - hi, lo = x - hi - mid, which fits in bf16: 8 + 8 + 8 bits of a 24-bit significand); the
 * weights are bf16 already, so every product is exact and the sums are f32 sums, as in the f32
 * kernels (only their order differs). Three passes of bf16 tiles still do 5x the work of the f32
 * FMAs in the same time.
 *
 * Operands: the A tiles are 16 weight rows, one 64-byte line each — a line as pd__cpu_tile lays
 * it out, whose 32-bit lane m pairs values m and 16 + m; the B tiles are the activations in the
 * same pairing, pair m of 16 rows in B's row m (a 16x16 transpose of 32-bit pairs). C[w][t] then
 * sums over the line's 32 values in the tiled order. Tiles 0-3 hold the sums of 32 weight rows x
 * 32 activation rows, 4-5 the weight tiles, 6-7 an activation part. */
#define PD_AMX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,amx-tile,amx-bf16")))

/* The tile loads are asm statements that do not say they read memory: stores before them (the
 * packing) must not be moved past. */
#define AMX_MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

/* The 32 values of row r's line b as AMX_PARTS 32-bit lane vectors of bf16 pairs (m, 16 + m). */
PD_AMX static inline void amx_split_line(const float *row, int64_t k, int64_t b,
                                         __m512i part[AMX_PARTS]) {
    int64_t c0 = b * 32, rem = k - c0;
    __mmask16 m0 = rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1);
    __mmask16 m1 = rem >= 32  ? (__mmask16)0xffff
                   : rem > 16 ? (__mmask16)((1u << (rem - 16)) - 1)
                              : (__mmask16)0;
    __m512i lo = _mm512_castps_si512(_mm512_maskz_loadu_ps(m0, row + c0));
    __m512i hi = _mm512_castps_si512(_mm512_maskz_loadu_ps(m1, row + c0 + 16));
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    for (int p = 0; p < AMX_PARTS; p++) {
        __m512i lt = _mm512_and_si512(lo, top), ht = _mm512_and_si512(hi, top);
        part[p] = _mm512_or_si512(_mm512_srli_epi32(lt, 16), ht);
        lo = _mm512_castps_si512(_mm512_sub_ps(_mm512_castsi512_ps(lo), _mm512_castsi512_ps(lt)));
        hi = _mm512_castps_si512(_mm512_sub_ps(_mm512_castsi512_ps(hi), _mm512_castsi512_ps(ht)));
    }
}

PD_AMX static void amx_pack_x(const float *x, int64_t nx, int64_t k, int64_t tt0, int64_t tt1,
                              char *xp) {
    int64_t nblk = (k + 31) / 32;
    for (int64_t tt = tt0; tt < tt1; tt++)
        for (int64_t b = 0; b < nblk; b++) {
            __m512 r[AMX_PARTS][16];
            for (int n = 0; n < 16; n++) {
                __m512i part[AMX_PARTS];
                if (tt * 16 + n < nx) {
                    amx_split_line(x + (tt * 16 + n) * k, k, b, part);
                } else {
                    for (int p = 0; p < AMX_PARTS; p++)
                        part[p] = _mm512_setzero_si512();
                }
                for (int p = 0; p < AMX_PARTS; p++)
                    r[p][n] = _mm512_castsi512_ps(part[p]);
            }
            char *dst = xp + (size_t)((tt * nblk + b) * AMX_PARTS) * AMX_TILE_BYTES;
            for (int p = 0; p < AMX_PARTS; p++) {
                transpose16(r[p]); /* r[p][m]: pair m of the 16 rows */
                for (int m = 0; m < 16; m++)
                    _mm512_store_ps((float *)(dst + p * AMX_TILE_BYTES) + 16 * m, r[p][m]);
            }
        }
}

/* Lines [b0, b1) of nwt groups of 16 weight rows from j0 → panel [b - b0][group][16][64 bytes];
 * rows past the matrix's (4-row padded) end are zero. */
static void amx_pack_w(const void *w, int64_t m, int64_t k, int64_t j0, int nwt, int64_t b0,
                       int64_t b1, char *panel) {
    int64_t nblk = (k + 31) / 32, mpad = (m + PD_CPU_TILE_ROWS - 1) / PD_CPU_TILE_ROWS * 4;
    for (int64_t b = b0; b < b1; b++)
        for (int g = 0; g < nwt; g++)
            for (int q = 0; q < 16; q += PD_CPU_TILE_ROWS) {
                char *dst = panel + ((size_t)((b - b0) * nwt + g) * 16 + (size_t)q) * 64;
                int64_t j = j0 + 16 * g + q;
                if (j < mpad)
                    memcpy(dst, pd__cpu_tiled_line(w, nblk, j, b), PD_CPU_TILE_ROWS * 64);
                else
                    memset(dst, 0, PD_CPU_TILE_ROWS * 64);
            }
}

/* A 16x16 tile of sums, c[w][t] → y[t0 + t][j0 + w] for t < nt and j0 + w < j1. */
PD_AMX static void amx_store_sums(const float *c, float *y, int64_t ldy, int64_t t0, int64_t nt,
                                  int64_t j0, int64_t j1) {
    __m512 r[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_load_ps(c + 16 * i);
    transpose16(r);
    int64_t nj = j1 - j0;
    __mmask16 mk = nj >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nj) - 1);
    for (int t = 0; t < 16 && t < nt - t0; t++)
        _mm512_mask_storeu_ps(y + (t0 + t) * ldy + j0, mk, r[t]);
}

PD_AMX static void amx_gemm(const void *w, int64_t m, int64_t k, const char *xp, int64_t nx,
                            float *y, int64_t ldy, int64_t j0, int64_t j1, float *scratch) {
    const int64_t nblk = (k + 31) / 32, ntt = (nx + 15) / 16, kcb = PD_CPU_AMX_KC / 32;
    char *panel = (char *)scratch; /* [kcb][ROWS / 16][1 KB] */
    float *part =
        scratch + PD_CPU_AMX_ROWS * PD_CPU_AMX_KC / 2;        /* [TOKENS / 32][ROWS / 32][4][256] */
    float *sums = part + PD_CPU_AMX_TOKENS * PD_CPU_AMX_ROWS; /* [4][256] */
    _tile_loadconfig(&pd__cpu_amx_cfg);
    for (int64_t jp = j0; jp < j1; jp += PD_CPU_AMX_ROWS) {
        int64_t jend = jp + PD_CPU_AMX_ROWS < j1 ? jp + PD_CPU_AMX_ROWS : j1;
        int nsub = (int)((jend - jp + 31) / 32);
        for (int64_t b0 = 0; b0 < nblk; b0 += kcb) {
            int64_t b1 = b0 + kcb < nblk ? b0 + kcb : nblk;
            bool first = b0 == 0, last = b1 == nblk;
            amx_pack_w(w, m, k, jp, 2 * nsub, b0, b1, panel);
            AMX_MEMORY_BARRIER();
            for (int64_t tt = 0; tt < ntt; tt += 2) {
                /* an odd last tile pairs with itself; the copy's sums are dropped */
                const char *x0 = xp + (size_t)(tt * nblk * AMX_PARTS) * AMX_TILE_BYTES;
                const char *x1 =
                    tt + 1 < ntt ? x0 + (size_t)(nblk * AMX_PARTS) * AMX_TILE_BYTES : x0;
                for (int s = 0; s < nsub; s++) {
                    float *ps = part + ((tt / 2) * (PD_CPU_AMX_ROWS / 32) + s) * 1024;
                    if (first) {
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_zero(2);
                        _tile_zero(3);
                    } else {
                        _tile_loadd(0, ps, 64);
                        _tile_loadd(1, ps + 256, 64);
                        _tile_loadd(2, ps + 512, 64);
                        _tile_loadd(3, ps + 768, 64);
                    }
                    for (int64_t b = b0; b < b1; b++) {
                        const char *a =
                            panel + (size_t)((b - b0) * 2 * nsub + 2 * s) * AMX_TILE_BYTES;
                        const char *xb0 = x0 + (size_t)(b * AMX_PARTS) * AMX_TILE_BYTES;
                        const char *xb1 = x1 + (size_t)(b * AMX_PARTS) * AMX_TILE_BYTES;
                        _tile_loadd(4, a, 64);
                        _tile_loadd(5, a + AMX_TILE_BYTES, 64);
                        for (int p = 0; p < AMX_PARTS; p++) {
                            _tile_loadd(6, xb0 + p * AMX_TILE_BYTES, 64);
                            _tile_loadd(7, xb1 + p * AMX_TILE_BYTES, 64);
                            _tile_dpbf16ps(0, 4, 6);
                            _tile_dpbf16ps(1, 4, 7);
                            _tile_dpbf16ps(2, 5, 6);
                            _tile_dpbf16ps(3, 5, 7);
                        }
                    }
                    if (!last) {
                        _tile_stored(0, ps, 64);
                        _tile_stored(1, ps + 256, 64);
                        _tile_stored(2, ps + 512, 64);
                        _tile_stored(3, ps + 768, 64);
                        continue;
                    }
                    _tile_stored(0, sums, 64);
                    _tile_stored(1, sums + 256, 64);
                    _tile_stored(2, sums + 512, 64);
                    _tile_stored(3, sums + 768, 64);
                    /* tile q: weight rows jw + 16 (q / 2).., activation rows 16 (tt + q % 2).. */
                    int64_t jw = jp + 32 * s, jm = jw + 16 < jend ? jw + 16 : jend;
                    for (int q = 0; q < 4; q++) {
                        int64_t t0 = (tt + (q & 1)) * 16, ja = q < 2 ? jw : jm;
                        int64_t jb = q < 2 ? jm : (jm + 16 < jend ? jm + 16 : jend);
                        if (t0 < nx && ja < jb)
                            amx_store_sums(sums + 256 * q, y, ldy, t0, nx, ja, jb);
                    }
                }
            }
        }
    }
    _tile_release();
}
#endif

bool pd__cpu_tiles_weights(void) {
#ifdef PD_HAVE_X86
    return has_avx2();
#else
    return false;
#endif
}

const struct pd__cpu_amx_tilecfg pd__cpu_amx_cfg = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

bool pd__cpu_has_amx(void) {
    return cpu_isa() >= ISA_AMX;
}

size_t pd__cpu_amx_x_bytes(int64_t k) {
    return (size_t)(PD_CPU_AMX_TOKENS / 16) * (size_t)((k + 31) / 32) * AMX_PARTS * AMX_TILE_BYTES;
}

bool pd__cpu_has_gemm_panel(void) {
#ifdef PD_HAVE_X86
    return has_avx512();
#else
    return false;
#endif
}

void pd__cpu_tile(enum pd_dtype t, int64_t rows, int64_t cols, const void *src, void *dst,
                  int64_t j0, int64_t j1) {
    PD_ASSERT(j0 % PD_CPU_TILE_ROWS == 0);
    size_t esz = pd_dtype_size(t);
    int64_t E = pd__cpu_tile_vals(t), nblk = pd__cpu_tile_blocks(t, cols);
    for (int64_t j = j0; j < j1; j++) {
        if (j >= rows) { /* a padding row of the last tile */
            for (int64_t b = 0; b < nblk; b++)
                memset((char *)dst + pd__cpu_tiled_off(nblk, j, b), 0, PD_CPU_TILE_LINE);
            continue;
        }
        if (esz == 2) { /* weights are tiled only where AVX2 runs */
#ifdef PD_HAVE_X86
            PD_ASSERT(has_avx2());
            tile_row16_sse2(t, src, cols, j, nblk, dst);
#else
            PD_ASSERT(!"16-bit weights are tiled only on x86");
#endif
            continue;
        }
        for (int64_t b = 0; b < nblk; b++) {
            int64_t n = cols - b * E < E ? cols - b * E : E;
            char *line = (char *)dst + pd__cpu_tiled_off(nblk, j, b);
            memset(line, 0, PD_CPU_TILE_LINE);
            memcpy(line, (const char *)src + (size_t)(j * cols + b * E) * esz, (size_t)n * esz);
        }
    }
}

void pd__cpu_tiled_row_to_f32(enum pd_dtype t, const void *w, int64_t cols, int64_t row,
                              float *dst) {
    int64_t E = pd__cpu_tile_vals(t), nblk = pd__cpu_tile_blocks(t, cols);
    for (int64_t b = 0; b < nblk; b++) {
        const char *line = pd__cpu_tiled_line(w, nblk, row, b);
        int64_t n = cols - b * E < E ? cols - b * E : E;
#ifdef PD_HAVE_X86
        if (n == E && has_avx2()) {
            tiled_line_to_f32_avx2(t, line, dst + b * E);
            continue;
        }
#endif
        if (t != PD_DTYPE_BF16) {
            pd__cpu_to_f32(t, line, dst + b * E, n);
            continue;
        }
        for (int64_t v = 0; v < n; v++) {
            uint16_t h;
            memcpy(&h, line + (v < 16 ? 4 * v : 4 * (v - 16) + 2), 2);
            dst[b * E + v] = pd_bf16_to_f32(h);
        }
    }
}

void pd__cpu_amx_pack_x(const float *x, int64_t nx, int64_t k, int64_t tt0, int64_t tt1, void *xp) {
    PD_ASSERT(nx <= PD_CPU_AMX_TOKENS && ((uintptr_t)xp & 63) == 0);
#ifdef PD_HAVE_X86
    if (pd__cpu_has_amx()) {
        amx_pack_x(x, nx, k, tt0, tt1, xp);
        return;
    }
#endif
    PD_ASSERT(!"pd__cpu_amx_pack_x without AMX");
}

void pd__cpu_amx_gemm(const void *w, int64_t m, int64_t k, const void *xp, int64_t nx, float *y,
                      int64_t ldy, int64_t j0, int64_t j1, float *scratch) {
    PD_ASSERT(nx <= PD_CPU_AMX_TOKENS && j0 % 32 == 0 && ((uintptr_t)scratch & 63) == 0);
#ifdef PD_HAVE_X86
    if (pd__cpu_has_amx()) {
        amx_gemm(w, m, k, xp, nx, y, ldy, j0, j1, scratch);
        return;
    }
#endif
    PD_ASSERT(!"pd__cpu_amx_gemm without AMX");
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
    PD_ASSERT(!"pd__cpu_gemm_panel without AVX-512: sgemm on widened tiles instead");
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

void pd__cpu_gemv(enum pd_dtype wt, const void *w, bool tiled, int64_t k, const float *x, int nx,
                  float *y, int64_t ldy, int64_t j0, int64_t j1) {
#ifdef PD_HAVE_X86
    if (tiled) {
        if (has_avx512())
            gemv_tiled512(wt, w, k, x, nx, y, ldy, j0, j1);
        else
            gemv_tiled256(wt, w, k, x, nx, y, ldy, j0, j1);
        return;
    }
#endif
    PD_ASSERT(!tiled);
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
    if (has_avx2()) {
        silu_mul_avx2(gate, up, out, n);
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
    if (has_avx2()) {
        softmax_avx2(s, n);
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
    if (has_avx2()) {
        attn_scores_avx2(q, nq, hd, k, ldk, nk, scale, s, lds, kt);
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
    if (has_avx2()) {
        attn_pv_avx2(p, ldp, nq, v, ldv, nk, hd, o);
        return;
    }
#endif
    for (int j = 0; j < nk; j++)
        for (int r = 0; r < nq; r++)
            pd__cpu_axpy(p[(size_t)r * ldp + j], v + (size_t)j * ldv, o + (size_t)r * hd, hd);
}
