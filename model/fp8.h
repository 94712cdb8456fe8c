/*
 * fp8.h — the two 8-bit float formats of an fp8 KV cache, as bit conversions from and to the
 * bits of an f32, shared by the host (model/dtype.c, the CPU backend) and the CUDA kernels
 * (kernels/kcommon.cuh), so both backends write and read identical bytes: an fp8 pool moved
 * from a CPU prefill to a GPU decode (or compared in a test) means the same values.
 *
 * E4M3 is torch.float8_e4m3fn (OCP "E4M3FN"): bias 7, no infinities, NaN = S.1111.111 (0x7f /
 * 0xff), largest finite 448 (0x7e), smallest subnormal 2^-9. E5M2 is torch.float8_e5m2: IEEE
 * style, bias 15, infinities 0x7c / 0xfc, NaN exponent 31 with a nonzero mantissa, largest
 * finite 57344 (0x7b), smallest subnormal 2^-16 (it is the top byte of an f16).
 *
 * Encoding rounds to nearest, ties to even, and handles overflow exactly as torch's casts do
 * (c10/util/Float8_e4m3fn.h, Float8_e5m2.h), which is what SGLang's KV pool does without
 * calibrated scales (set_kv_buffer: cache_k.to(float8 dtype), scale 1.0):
 *   e4m3: NOT saturating. |x| that rounds past 448 — anything above 464, the midpoint between
 *         448 and the 480 the exponent would reach next — and ±inf become NaN (sign kept);
 *         |x| in (448, 464] rounds to 448.
 *   e5m2: |x| >= 61440 (the midpoint past 57344, ties to the even inf) and ±inf become ±inf.
 *   NaN stays NaN (0x7f | sign in both formats).
 * Note cuda_fp8.h's __nv_fp8_e4m3(float) saturates instead (__NV_SATFINITE), which is why the
 * kernels use these functions rather than that constructor.
 * Integer arithmetic only: no rounding mode, no compiler float8 support, no table.
 */
#ifndef PD_FP8_H
#define PD_FP8_H

#include <stdint.h>

#ifdef __CUDACC__
#define PD_FP8_FN static __host__ __device__ __forceinline__
#else
#define PD_FP8_FN static inline
#endif

/* Rounds the f32 bits u (sign stripped: a = u & 0x7fffffff, finite and nonzero in the target's
 * range) to a format with `mbits` mantissa bits and exponent bias `bias`, whose subnormals are
 * multiples of 2^(1 - bias - mbits). Returns the magnitude code; a carry out of the top finite
 * code is left to the caller's overflow rule. */
PD_FP8_FN uint32_t pd__fp8_round(uint32_t a, int mbits, int bias) {
    uint32_t e = a >> 23; /* biased f32 exponent */
    int drop = 23 - mbits;
    if ((int)e - 127 >= 1 - bias) { /* normal in the target */
        uint32_t h = ((e - 127 + (uint32_t)bias) << mbits) | ((a >> drop) & ((1u << mbits) - 1u));
        uint32_t rest = a & ((1u << drop) - 1u), half = 1u << (drop - 1);
        if (rest > half || (rest == half && (h & 1u)))
            h++; /* a carry into the exponent is the right answer */
        return h;
    }
    /* subnormal in the target: the value in units of 2^(1 - bias - mbits) is
     * mant * 2^(e - 150 + bias + mbits - 1), mant with its implicit bit (values below half the
     * smallest subnormal, f32 subnormals among them, were made 0 by the caller) */
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 150 - (int)e - bias - mbits + 1; /* <= 24: the callers cut below half of it */
    uint32_t h = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u)))
        h++; /* the largest subnormal + 1 is the smallest normal, which is correct */
    return h;
}

/* f32 bits → float8_e4m3fn. */
PD_FP8_FN uint8_t pd_fp8_e4m3_from_f32_bits(uint32_t u) {
    uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a >= 0x43f00000u) /* >= 480, inf, NaN: torch gives NaN */
        return (uint8_t)(sign | 0x7fu);
    if (a < 0x3a800000u) /* below 2^-10, half the smallest subnormal (2^-10 itself ties to 0) */
        return (uint8_t)sign;
    return (uint8_t)(sign | pd__fp8_round(a, 3, 7)); /* 464 < |x| < 480 carries into 0x7f: NaN */
}

/* f32 bits → float8_e5m2. */
PD_FP8_FN uint8_t pd_fp8_e5m2_from_f32_bits(uint32_t u) {
    uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (a >= 0x47800000u) /* >= 65536 and inf: inf (61440..65536 carry into it below) */
        return (uint8_t)(sign | 0x7cu);
    if (a < 0x37000000u) /* below 2^-17, half the smallest subnormal */
        return (uint8_t)sign;
    return (uint8_t)(sign | pd__fp8_round(a, 2, 15));
}

/* The f32 bits of m * 2^unit_exp, 0 < m < 8 (an fp8 subnormal's mantissa): exact. */
PD_FP8_FN uint32_t pd__fp8_subnormal_bits(uint32_t m, int unit_exp) {
    int p = m >= 4 ? 2 : m >= 2 ? 1 : 0; /* the leading bit */
    return ((uint32_t)(unit_exp + p + 127) << 23) | ((m - (1u << p)) << (23 - p));
}

/* float8_e4m3fn → f32 bits; exact. */
PD_FP8_FN uint32_t pd_fp8_e4m3_to_f32_bits(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
    if ((b & 0x7fu) == 0x7fu)
        return sign | 0x7fc00000u;
    if (e == 0)
        return m ? sign | pd__fp8_subnormal_bits(m, -9) : sign;
    return sign | ((e + 120) << 23) | (m << 20);
}

/* float8_e5m2 → f32 bits; exact, NaN payload kept (it is an f16's top byte). */
PD_FP8_FN uint32_t pd_fp8_e5m2_to_f32_bits(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 2) & 0x1fu, m = b & 3u;
    if (e == 31)
        return sign | 0x7f800000u | (m << 21) | (m ? 0x400000u : 0u);
    if (e == 0)
        return m ? sign | pd__fp8_subnormal_bits(m, -16) : sign;
    return sign | ((e + 112) << 23) | (m << 21);
}

#endif
