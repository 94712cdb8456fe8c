/*
 * dtype.h — element types of checkpoints and tensors (safetensors names: F32, F16, BF16) and the
 * scalar conversions between them. Conversions round to nearest even, keep NaN a NaN and are
 * exact where the target can represent the value. The two fp8 types exist for the KV cache only
 * (--kv-cache-dtype fp8_e4m3 / fp8_e5m2; model/fp8.h has their formats and overflow rules):
 * weights are never fp8, so the checkpoint parsers do not accept them.
 */
#ifndef PD_DTYPE_H
#define PD_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model/fp8.h"

enum pd_dtype {
    PD_DTYPE_F32 = 0,
    PD_DTYPE_F16 = 1,
    PD_DTYPE_BF16 = 2,
    PD_DTYPE_F8E4M3 = 3, /* KV cache only: torch.float8_e4m3fn */
    PD_DTYPE_F8E5M2 = 4, /* KV cache only: torch.float8_e5m2 */
};

/* Bytes per element. */
size_t pd_dtype_size(enum pd_dtype t);
/* Safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2". */
const char *pd_dtype_name(enum pd_dtype t);
/* Parses a safetensors dtype name of a weight type (F32, F16, BF16); PD_EUNSUPPORTED naming it
 * (and listing those) else, fp8 included. */
int pd_dtype_parse(const char *name, enum pd_dtype *out);
/* Parses a config.json torch_dtype ("float32", "float16", "bfloat16"). */
int pd_dtype_parse_torch(const char *name, enum pd_dtype *out);
/* torch spelling: "float32", ..., "float8_e4m3fn", "float8_e5m2". */
const char *pd_dtype_torch_name(enum pd_dtype t);
/* --kv-cache-dtype spelling (SGLang's, as /server_info shows it): "float32", "bfloat16",
 * "float16", "fp8_e4m3", "fp8_e5m2". */
const char *pd_dtype_kv_name(enum pd_dtype t);

uint16_t pd_f32_to_bf16(float f);
uint16_t pd_f32_to_f16(float f);

static inline uint32_t pd__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float pd__f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline uint8_t pd_f32_to_f8e4m3(float f) {
    return pd_fp8_e4m3_from_f32_bits(pd__f32_bits(f));
}

static inline uint8_t pd_f32_to_f8e5m2(float f) {
    return pd_fp8_e5m2_from_f32_bits(pd__f32_bits(f));
}

static inline float pd_f8e4m3_to_f32(uint8_t b) {
    return pd__f32_of_bits(pd_fp8_e4m3_to_f32_bits(b));
}

static inline float pd_f8e5m2_to_f32(uint8_t b) {
    return pd__f32_of_bits(pd_fp8_e5m2_to_f32_bits(b));
}

/* Widening is exact; inline because backends call it per element in their scalar paths. */
static inline float pd_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline float pd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (e == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in f32 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    u = e == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((e + 112) << 23) | (mant << 13));
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* --kv-cache-dtype, SGLang's spellings: "auto", "bf16", "bfloat16", "fp16", "float16", "fp32",
 * "float32", "fp8_e4m3", "fp8_e5m2" (the long and short names are the same type). */
extern const char *const pd_kv_cache_dtype_names[];
#define PD_KV_CACHE_DTYPE_AUTO 0 /* index of "auto" */
/* The type of choice index c (of pd_kv_cache_dtype_names); false for "auto", which
 * pd_tp_group_new resolves (the model's torch_dtype on cuda, f32 on cpu). */
bool pd_kv_cache_dtype_of(int c, enum pd_dtype *out);

/* n elements of type t at src → f32 at dst. */
void pd_dtype_to_f32(enum pd_dtype t, const void *src, float *dst, size_t n);
/* n f32 at src → type t at dst. */
void pd_dtype_from_f32(enum pd_dtype t, const float *src, void *dst, size_t n);

#endif
