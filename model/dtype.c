/*
 * dtype.c — element sizes, names and the f32 <-> f16/bf16 scalar conversions (fp8's are
 * model/fp8.h's, shared with the CUDA kernels; the array conversions here dispatch to them),
 * and --kv-cache-dtype's spellings (here, not in flags.c, so the GPU perf mode's minimal build
 * in scripts/gpu-run.sh, which compiles dtype.c but not the flag parser, has them too).
 *
 * Conversions are done on the bit patterns, not with the compiler's _Float16/__bf16, so they
 * behave the same on every host and compiler: round to nearest even, NaN stays a (quiet) NaN with
 * its sign, overflow becomes infinity, and f16 subnormals are produced and read exactly. They run
 * on weight loading and in the CPU backend, so they avoid branches on the common (normal) path
 * where that is free, but correctness wins over speed here.
 */
#include "model/dtype.h"
#include "common/base/status.h"

#include <string.h>

static const struct {
    const char *name;  /* safetensors */
    const char *torch; /* config.json torch_dtype */
    const char *kv;    /* --kv-cache-dtype */
    size_t size;       /* bytes */
} dtype_info[] = {
    [PD_DTYPE_F32] = {"F32", "float32", "float32", 4},
    [PD_DTYPE_F16] = {"F16", "float16", "float16", 2},
    [PD_DTYPE_BF16] = {"BF16", "bfloat16", "bfloat16", 2},
    [PD_DTYPE_F8E4M3] = {"F8_E4M3", "float8_e4m3fn", "fp8_e4m3", 1},
    [PD_DTYPE_F8E5M2] = {"F8_E5M2", "float8_e5m2", "fp8_e5m2", 1},
};

/* The parsers stop before the fp8 types: checkpoints and config.json name weight types. */
#define N_WEIGHT_DTYPES (PD_DTYPE_BF16 + 1)

static int dtype_valid(enum pd_dtype t) {
    return (unsigned)t < PD_ARRAY_LEN(dtype_info);
}

size_t pd_dtype_size(enum pd_dtype t) {
    PD_ASSERT(dtype_valid(t));
    return dtype_info[t].size;
}

const char *pd_dtype_name(enum pd_dtype t) {
    return dtype_valid(t) ? dtype_info[t].name : "?";
}

const char *pd_dtype_torch_name(enum pd_dtype t) {
    return dtype_valid(t) ? dtype_info[t].torch : "?";
}

const char *pd_dtype_kv_name(enum pd_dtype t) {
    return dtype_valid(t) ? dtype_info[t].kv : "?";
}

int pd_dtype_parse(const char *name, enum pd_dtype *out) {
    for (size_t i = 0; name && i < N_WEIGHT_DTYPES; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (enum pd_dtype)i;
            return PD_OK;
        }
    }
    return pd_errorf(PD_EUNSUPPORTED, "dtype '%s' is not supported (supported: F32, F16, BF16)",
                     name ? name : "(null)");
}

int pd_dtype_parse_torch(const char *name, enum pd_dtype *out) {
    for (size_t i = 0; name && i < N_WEIGHT_DTYPES; i++) {
        if (strcmp(name, dtype_info[i].torch) == 0) {
            *out = (enum pd_dtype)i;
            return PD_OK;
        }
    }
    return pd_errorf(PD_EUNSUPPORTED,
                     "torch_dtype '%s' is not supported (supported: float32, float16, bfloat16)",
                     name ? name : "(null)");
}

uint16_t pd_f32_to_bf16(float f) {
    uint32_t u = pd__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: truncating could clear the payload → inf */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Adding 0x7fff plus the lowest kept bit rounds half to even; a carry into the exponent is
     * the correct result (up to infinity). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

uint16_t pd_f32_to_f16(float f) {
    uint32_t u = pd__f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;

    if (a > 0x7f800000u) /* NaN: quiet it, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 (halfway past 65504, the largest f16) rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal f16: >= 2^-14 */
        uint32_t h = ((a >> 23) - 127 + 15) << 10 | ((a >> 13) & 0x3ffu);
        uint32_t rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
            h++; /* a carry into the exponent is the right answer */
        return (uint16_t)(sign | h);
    }
    if (a <= 0x33000000u) /* <= 2^-25: half the smallest subnormal or less → ±0 (ties to even) */
        return sign;
    /* subnormal f16: value in units of 2^-24 is mant * 2^(e - 126), e = biased f32 exponent */
    uint32_t e = a >> 23;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t h = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u)))
        h++; /* 0x3ff + 1 becomes the smallest normal, which is correct */
    return (uint16_t)(sign | h);
}

void pd_dtype_to_f32(enum pd_dtype t, const void *src, float *dst, size_t n) {
    if (n == 0)
        return;
    switch (t) {
    case PD_DTYPE_F32: memmove(dst, src, n * sizeof(float)); return;
    case PD_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = pd_f16_to_f32(s[i]);
        return;
    }
    case PD_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = pd_bf16_to_f32(s[i]);
        return;
    }
    case PD_DTYPE_F8E4M3: {
        const uint8_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = pd_f8e4m3_to_f32(s[i]);
        return;
    }
    case PD_DTYPE_F8E5M2: {
        const uint8_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = pd_f8e5m2_to_f32(s[i]);
        return;
    }
    }
    PD_ASSERT(!"unknown dtype");
}

void pd_dtype_from_f32(enum pd_dtype t, const float *src, void *dst, size_t n) {
    if (n == 0)
        return;
    switch (t) {
    case PD_DTYPE_F32: memmove(dst, src, n * sizeof(float)); return;
    case PD_DTYPE_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pd_f32_to_f16(src[i]);
        return;
    }
    case PD_DTYPE_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pd_f32_to_bf16(src[i]);
        return;
    }
    case PD_DTYPE_F8E4M3: {
        uint8_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pd_f32_to_f8e4m3(src[i]);
        return;
    }
    case PD_DTYPE_F8E5M2: {
        uint8_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pd_f32_to_f8e5m2(src[i]);
        return;
    }
    }
    PD_ASSERT(!"unknown dtype");
}

/* ---- --kv-cache-dtype ---- */

const char *const pd_kv_cache_dtype_names[] = {"auto", "bf16",    "bfloat16", "fp16",     "float16",
                                               "fp32", "float32", "fp8_e4m3", "fp8_e5m2", NULL};
/* the type of each spelling, in pd_kv_cache_dtype_names' order */
static const enum pd_dtype kv_cache_dtypes[] = {
    PD_DTYPE_F32,    /* auto: resolved by pd_tp_group_new, not read */
    PD_DTYPE_BF16,   /* bf16 */
    PD_DTYPE_BF16,   /* bfloat16 */
    PD_DTYPE_F16,    /* fp16 */
    PD_DTYPE_F16,    /* float16 */
    PD_DTYPE_F32,    /* fp32 */
    PD_DTYPE_F32,    /* float32 */
    PD_DTYPE_F8E4M3, /* fp8_e4m3 */
    PD_DTYPE_F8E5M2, /* fp8_e5m2 */
};

_Static_assert(PD_ARRAY_LEN(kv_cache_dtypes) + 1 == PD_ARRAY_LEN(pd_kv_cache_dtype_names),
               "one type per --kv-cache-dtype spelling");

bool pd_kv_cache_dtype_of(int c, enum pd_dtype *out) {
    PD_ASSERT(c >= 0 && (size_t)c < PD_ARRAY_LEN(kv_cache_dtypes));
    *out = kv_cache_dtypes[c];
    return c != PD_KV_CACHE_DTYPE_AUTO;
}
