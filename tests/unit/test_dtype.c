/*
 * dtype names and the f32 <-> f16/bf16 conversions. Each conversion is checked against a
 * reference computed a different way: the nearest representable value found by searching the
 * ordered list of target bit patterns with double arithmetic (ties to the even pattern), plus the
 * compiler's _Float16 where it has one. Patterns are sampled across every exponent, at and
 * around every rounding midpoint, and at random. The fp8 formats (KV cache) are checked the same
 * way against values computed here from the format definitions with ldexp, with torch's overflow
 * rules: the ladder continues one step past the largest finite value (e4m3: 480, whose pattern
 * 0x7f is NaN; e5m2: 65536, whose pattern 0x7c is inf), so what rounds there becomes that.
 */
#include "pd_test.h"

#include "model/dtype.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Magnitude of a positive pattern; the pattern for infinity stands for the next power of two,
 * the value the ladder would continue with, which is what IEEE overflow rounding compares to. */
static double mag_f16(uint16_t p) {
    if (p == 0x7c00)
        return 65536.0;
    int e = p >> 10, m = p & 0x3ff;
    return e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
}

static double mag_bf16(uint16_t p) {
    if (p == 0x7f80)
        return ldexp(1.0, 128);
    int e = p >> 7, m = p & 0x7f;
    return e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
}

/* Round |x| to the nearest of patterns 0..top by binary search (values increase with the
 * pattern); ties go to the even pattern. */
static uint16_t reference_round(float x, double (*mag)(uint16_t), uint16_t top) {
    double a = fabs((double)x);
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    unsigned lo = 0, hi = top; /* mag(lo) <= a < mag(hi) unless a >= mag(top) */
    if (a >= mag(top))
        return sign | top;
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (mag((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dl = a - mag((uint16_t)lo), dh = mag((uint16_t)hi) - a;
    unsigned r = dl < dh ? lo : dh < dl ? hi : (lo & 1 ? hi : lo);
    return (uint16_t)(sign | r);
}

static int is_nan16(uint16_t h, int exp_bits) {
    uint16_t expmask = exp_bits == 5 ? 0x7c00 : 0x7f80;
    return (h & expmask) == expmask && (h & (uint16_t) ~(expmask | 0x8000));
}

/* One f32 input through both conversions, against the references. */
static int check_one(uint32_t u) {
    float f = float_of(u);
    int bad = 0;
    uint16_t h = pd_f32_to_f16(f), b = pd_f32_to_bf16(f);
    if (isnan(f)) {
        bad |= !is_nan16(h, 5) || !is_nan16(b, 8);
        bad |= (h >> 15) != (u >> 31) || (b >> 15) != (u >> 31);
    } else {
        bad |= h != reference_round(f, mag_f16, 0x7c00);
        bad |= b != reference_round(f, mag_bf16, 0x7f80);
#ifdef __FLT16_MANT_DIG__
        _Float16 c = (_Float16)f;
        uint16_t cb;
        memcpy(&cb, &c, 2);
        bad |= h != cb;
#endif
    }
    if (bad) {
        fprintf(stderr, "f32 0x%08x (%.9g): f16 0x%04x want 0x%04x, bf16 0x%04x want 0x%04x\n", u,
                (double)f, h, isnan(f) ? 0 : reference_round(f, mag_f16, 0x7c00), b,
                isnan(f) ? 0 : reference_round(f, mag_bf16, 0x7f80));
    }
    return bad;
}

static void test_names_and_parse(void) {
    enum pd_dtype t;
    CHECK_INT(pd_dtype_size(PD_DTYPE_F32), 4);
    CHECK_INT(pd_dtype_size(PD_DTYPE_F16), 2);
    CHECK_INT(pd_dtype_size(PD_DTYPE_BF16), 2);
    CHECK_STR(pd_dtype_name(PD_DTYPE_BF16), "BF16");
    CHECK_STR(pd_dtype_torch_name(PD_DTYPE_F16), "float16");
    CHECK_OK(pd_dtype_parse("BF16", &t));
    CHECK_INT(t, PD_DTYPE_BF16);
    CHECK_OK(pd_dtype_parse("F32", &t));
    CHECK_INT(t, PD_DTYPE_F32);
    CHECK_OK(pd_dtype_parse_torch("float16", &t));
    CHECK_INT(t, PD_DTYPE_F16);
    CHECK_ERR(pd_dtype_parse("I64", &t), PD_EUNSUPPORTED, "dtype 'I64'");
    CHECK_ERR(pd_dtype_parse("F8_E4M3", &t), PD_EUNSUPPORTED, "F32, F16, BF16");
    CHECK_ERR(pd_dtype_parse("bf16", &t), PD_EUNSUPPORTED, "'bf16'");
    CHECK_ERR(pd_dtype_parse_torch("float64", &t), PD_EUNSUPPORTED, "float32, float16, bfloat16");
}

static void test_edge_values(void) {
    /* bf16 of a value it represents exactly is the upper half of the f32 */
    CHECK_INT(pd_f32_to_bf16(1.0f), 0x3f80);
    CHECK_INT(pd_f32_to_bf16(-2.0f), 0xc000);
    CHECK_INT(pd_f32_to_bf16(-0.0f), 0x8000);
    CHECK_INT(pd_f32_to_bf16(float_of(0x3f808000)), 0x3f80); /* tie → even (down) */
    CHECK_INT(pd_f32_to_bf16(float_of(0x3f818000)), 0x3f82); /* tie → even (up) */
    CHECK_INT(pd_f32_to_bf16(float_of(0x3f808001)), 0x3f81); /* just past the tie */
    CHECK_INT(pd_f32_to_bf16(FLT_MAX), 0x7f80);              /* overflows to inf */
    CHECK_INT(pd_f32_to_bf16(INFINITY), 0x7f80);
    CHECK_INT(pd_f32_to_bf16(-INFINITY), 0xff80);
    CHECK_INT(pd_f32_to_bf16(float_of(0x00008000)), 0x0000); /* denormal tie → even */
    CHECK_INT(pd_f32_to_bf16(float_of(0x00018000)), 0x0002);
    CHECK(is_nan16(pd_f32_to_bf16(float_of(0x7f800001)), 8)); /* payload only in the low bits */
    CHECK(is_nan16(pd_f32_to_bf16(NAN), 8));
    CHECK(isnan(pd_bf16_to_f32(0x7fc1)));
    CHECK(pd_bf16_to_f32(0xff80) == -INFINITY);

    CHECK_INT(pd_f32_to_f16(1.0f), 0x3c00);
    CHECK_INT(pd_f32_to_f16(0.1f), 0x2e66);
    CHECK_INT(pd_f32_to_f16(-0.0f), 0x8000);
    CHECK_INT(pd_f32_to_f16(65504.0f), 0x7bff);
    CHECK_INT(pd_f32_to_f16(65519.996f), 0x7bff);
    CHECK_INT(pd_f32_to_f16(65520.0f), 0x7c00); /* halfway past the largest → inf */
    CHECK_INT(pd_f32_to_f16(1e10f), 0x7c00);
    CHECK_INT(pd_f32_to_f16(-INFINITY), 0xfc00);
    CHECK_INT(pd_f32_to_f16(ldexpf(1, -14)), 0x0400);       /* smallest normal */
    CHECK_INT(pd_f32_to_f16(ldexpf(1, -24)), 0x0001);       /* smallest subnormal */
    CHECK_INT(pd_f32_to_f16(ldexpf(1, -25)), 0x0000);       /* tie → even (zero) */
    CHECK_INT(pd_f32_to_f16(ldexpf(3, -25)), 0x0002);       /* tie → even (up) */
    CHECK_INT(pd_f32_to_f16(float_of(0x33000001)), 0x0001); /* just past the tie */
    CHECK_INT(pd_f32_to_f16(ldexpf(2047, -25)), 0x0400);    /* rounds up into normals */
    CHECK_INT(pd_f32_to_f16(float_of(0x00000001)), 0x0000); /* f32 denormal */
    CHECK(is_nan16(pd_f32_to_f16(float_of(0x7f800001)), 5));
    CHECK(is_nan16(pd_f32_to_f16(-NAN), 5));
    CHECK(pd_f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(pd_f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(pd_f16_to_f32(0xfbff) == -65504.0f);
    CHECK(pd_f16_to_f32(0x7c00) == INFINITY);
    CHECK(isnan(pd_f16_to_f32(0x7e00)));
    CHECK(signbit(pd_f16_to_f32(0x8000)));
}

/* f16/bf16 → f32 is exact for every pattern, and back gives the same pattern. */
static void test_all_16bit_patterns(void) {
    int bad = 0;
    for (uint32_t p = 0; p < 0x10000; p++) {
        uint16_t h = (uint16_t)p;
        float a = pd_f16_to_f32(h), b = pd_bf16_to_f32(h);
        if (is_nan16(h, 5))
            bad += !isnan(a) || !is_nan16(pd_f32_to_f16(a), 5);
        else
            bad += pd_f32_to_f16(a) != h ||
                   (double)fabsf(a) != ((h & 0x7fff) == 0x7c00 ? INFINITY : mag_f16(h & 0x7fff));
        if (is_nan16(h, 8))
            bad += !isnan(b) || !is_nan16(pd_f32_to_bf16(b), 8);
        else
            bad += pd_f32_to_bf16(b) != h || bits_of(b) != p << 16;
#ifdef __FLT16_MANT_DIG__
        _Float16 c;
        memcpy(&c, &h, 2);
        if (!is_nan16(h, 5))
            bad += (float)c != a;
#endif
    }
    CHECK_INT(bad, 0);
}

/* Every rounding boundary of f16 (and bf16, whose ladder is the f32 one cut short): the
 * midpoint between neighbours and one f32 ulp either side. */
static void test_midpoints(void) {
    int bad = 0;
    for (uint32_t p = 0; p < 0x7c00; p++) {
        double mid = (mag_f16((uint16_t)p) + mag_f16((uint16_t)(p + 1))) / 2;
        uint32_t u = bits_of((float)mid);
        for (uint32_t d = 0; d < 3; d++)
            bad += check_one(u - 1 + d) + check_one((u - 1 + d) | 0x80000000u);
    }
    for (uint32_t p = 0; p < 0x7f80; p++) {
        uint32_t u = p << 16 | 0x8000; /* exact bf16 midpoint */
        for (uint32_t d = 0; d < 3; d++)
            bad += check_one(u - 1 + d);
    }
    CHECK_INT(bad, 0);
}

static void test_random_and_sweep(void) {
    int bad = 0;
    for (int i = 0; i < 300000; i++)
        bad += check_one(rng());
    for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) /* a stride prime to every field */
        bad += check_one((uint32_t)u);
    bad += check_one(0x7f800000) + check_one(0xff800000) + check_one(0x7fffffff) +
           check_one(0x00000000) + check_one(0x80000001);
    CHECK_INT(bad, 0);
}

static void test_bulk(void) {
    float src[7] = {0.0f, -1.5f, 3.14159f, 65504.0f, 1e-6f, -INFINITY, 1e30f};
    float back[7];
    uint16_t half[7];
    float f32[7];
    pd_dtype_from_f32(PD_DTYPE_F16, src, half, 7);
    for (int i = 0; i < 7; i++)
        CHECK_INT(half[i], pd_f32_to_f16(src[i]));
    pd_dtype_to_f32(PD_DTYPE_F16, half, back, 7);
    for (int i = 0; i < 7; i++)
        CHECK(back[i] == pd_f16_to_f32(half[i]));
    pd_dtype_from_f32(PD_DTYPE_BF16, src, half, 7);
    for (int i = 0; i < 7; i++)
        CHECK_INT(half[i], pd_f32_to_bf16(src[i]));
    pd_dtype_to_f32(PD_DTYPE_BF16, half, back, 7);
    for (int i = 0; i < 7; i++)
        CHECK(back[i] == pd_bf16_to_f32(half[i]));
    pd_dtype_from_f32(PD_DTYPE_F32, src, f32, 7);
    CHECK(memcmp(f32, src, sizeof(src)) == 0);
    pd_dtype_to_f32(PD_DTYPE_F32, src, back, 0); /* n = 0 touches nothing */
}

/* ---- fp8 ---- */

/* Magnitude of a positive e4m3 pattern 0..0x7f; 0x7f (NaN) stands for 480, the next step. */
static double mag_e4m3(unsigned p) {
    int e = (int)(p >> 3), m = (int)(p & 7);
    return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
}

/* Magnitude of a positive e5m2 pattern 0..0x7c; 0x7c (inf) stands for 65536. */
static double mag_e5m2(unsigned p) {
    int e = (int)(p >> 2), m = (int)(p & 3);
    return e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17);
}

/* Nearest of patterns 0..top by a plain scan (no shortcut shared with the code under test);
 * ties to the even pattern; at or past mag(top): top. */
static unsigned reference_round8(float x, double (*mag)(unsigned), unsigned top) {
    double a = fabs((double)x);
    unsigned sign = signbit(x) ? 0x80 : 0, best = 0;
    if (a >= mag(top))
        return sign | top;
    for (unsigned p = 1; p <= top; p++) {
        double dp = fabs(mag(p) - a), db = fabs(mag(best) - a);
        if (dp < db || (dp == db && !(p & 1)))
            best = p;
    }
    return sign | best;
}

static int check_one8(uint32_t u) {
    float f = float_of(u);
    unsigned want4, want5, sign = u >> 31 ? 0x80 : 0;
    if (isnan(f)) {
        want4 = want5 = sign | 0x7f; /* torch: NaN keeps its sign, all mantissa bits set */
    } else {
        want4 = reference_round8(f, mag_e4m3, 0x7f);
        want5 = reference_round8(f, mag_e5m2, 0x7c);
    }
    uint8_t g4 = pd_f32_to_f8e4m3(f), g5 = pd_f32_to_f8e5m2(f);
    if (g4 == want4 && g5 == want5)
        return 0;
    fprintf(stderr, "f32 0x%08x (%.9g): e4m3 0x%02x want 0x%02x, e5m2 0x%02x want 0x%02x\n", u,
            (double)f, g4, want4, g5, want5);
    return 1;
}

/* Every one of the 256 codes of each format decodes to the value its definition gives and
 * encodes back to itself (NaNs: to the canonical NaN of their sign). */
static void test_fp8_all_codes(void) {
    int bad = 0;
    for (unsigned c = 0; c < 256; c++) {
        unsigned mag = c & 0x7f, sign = c & 0x80;
        float a = pd_f8e4m3_to_f32((uint8_t)c), b = pd_f8e5m2_to_f32((uint8_t)c);
        if (mag == 0x7f) {
            bad += !isnan(a) || pd_f32_to_f8e4m3(a) != c;
        } else {
            bad += (double)fabsf(a) != mag_e4m3(mag) || (signbit(a) != 0) != (sign != 0);
            bad += pd_f32_to_f8e4m3(a) != c;
        }
        if (mag > 0x7c) {
            bad += !isnan(b) || pd_f32_to_f8e5m2(b) != (sign | 0x7f);
        } else if (mag == 0x7c) {
            bad += b != (sign ? -INFINITY : INFINITY) || pd_f32_to_f8e5m2(b) != c;
        } else {
            bad += (double)fabsf(b) != mag_e5m2(mag) || (signbit(b) != 0) != (sign != 0);
            bad += pd_f32_to_f8e5m2(b) != c;
            /* e5m2 is the top byte of an f16 */
            bad += b != pd_f16_to_f32((uint16_t)(c << 8));
        }
        if (bad) {
            fprintf(stderr, "fp8 code 0x%02x: e4m3 %.9g, e5m2 %.9g\n", c, (double)a, (double)b);
            break;
        }
    }
    CHECK_INT(bad, 0);
}

static void test_fp8_rounding(void) {
    int bad = 0;
    /* every boundary: the midpoint of neighbours (exact in f32) and one f32 ulp either side */
    for (unsigned p = 0; p < 0x7f; p++) {
        uint32_t u = bits_of((float)((mag_e4m3(p) + mag_e4m3(p + 1)) / 2));
        for (uint32_t d = 0; d < 3; d++)
            bad += check_one8(u - 1 + d) + check_one8((u - 1 + d) | 0x80000000u);
    }
    for (unsigned p = 0; p < 0x7c; p++) {
        uint32_t u = bits_of((float)((mag_e5m2(p) + mag_e5m2(p + 1)) / 2));
        for (uint32_t d = 0; d < 3; d++)
            bad += check_one8(u - 1 + d) + check_one8((u - 1 + d) | 0x80000000u);
    }
    for (int i = 0; i < 20000; i++) { /* random patterns, and random values in range */
        bad += check_one8(rng());
        bad += check_one8(bits_of(ldexpf((float)(rng() & 0xffffff), (int)(rng() % 44) - 48)));
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += 1048573)
        bad += check_one8((uint32_t)u);
    bad += check_one8(0x7f800000) + check_one8(0xff800000) + check_one8(0x7fc00000) +
           check_one8(0xffffffff) + check_one8(0x00000001) + check_one8(bits_of(FLT_MAX));
    CHECK_INT(bad, 0);

    /* the rules the comments promise, spelled out */
    CHECK_INT(pd_f32_to_f8e4m3(448.0f), 0x7e);
    CHECK_INT(pd_f32_to_f8e4m3(464.0f), 0x7e);   /* tie → even (448) */
    CHECK_INT(pd_f32_to_f8e4m3(465.0f), 0x7f);   /* past it: NaN, as torch (no saturation) */
    CHECK_INT(pd_f32_to_f8e4m3(-1e6f), 0xff);    /* NaN with the sign */
    CHECK_INT(pd_f32_to_f8e4m3(INFINITY), 0x7f); /* no inf in e4m3fn */
    CHECK_INT(pd_f32_to_f8e4m3(ldexpf(1, -9)), 0x01);
    CHECK_INT(pd_f32_to_f8e4m3(ldexpf(1, -10)), 0x00); /* tie → even (zero) */
    CHECK_INT(pd_f32_to_f8e4m3(ldexpf(3, -10)), 0x02); /* tie → even (up) */
    CHECK_INT(pd_f32_to_f8e4m3(-0.0f), 0x80);
    CHECK_INT(pd_f32_to_f8e4m3(1.0f), 0x38);
    CHECK_INT(pd_f32_to_f8e5m2(57344.0f), 0x7b);
    CHECK_INT(pd_f32_to_f8e5m2(61439.0f), 0x7b);
    CHECK_INT(pd_f32_to_f8e5m2(61440.0f), 0x7c); /* tie → even, which is inf */
    CHECK_INT(pd_f32_to_f8e5m2(-INFINITY), 0xfc);
    CHECK_INT(pd_f32_to_f8e5m2(ldexpf(1, -17)), 0x00);
    CHECK_INT(pd_f32_to_f8e5m2(1.0f), 0x3c);
    CHECK(pd_f8e4m3_to_f32(0x7e) == 448.0f);
    CHECK(pd_f8e4m3_to_f32(0x08) == ldexpf(1, -6));
    CHECK(pd_f8e5m2_to_f32(0x01) == ldexpf(1, -16));
}

static void test_fp8_names_and_bulk(void) {
    enum pd_dtype t;
    CHECK_INT(pd_dtype_size(PD_DTYPE_F8E4M3), 1);
    CHECK_INT(pd_dtype_size(PD_DTYPE_F8E5M2), 1);
    CHECK_STR(pd_dtype_name(PD_DTYPE_F8E4M3), "F8_E4M3");
    CHECK_STR(pd_dtype_name(PD_DTYPE_F8E5M2), "F8_E5M2");
    CHECK_STR(pd_dtype_torch_name(PD_DTYPE_F8E4M3), "float8_e4m3fn");
    CHECK_STR(pd_dtype_torch_name(PD_DTYPE_F8E5M2), "float8_e5m2");
    CHECK_STR(pd_dtype_kv_name(PD_DTYPE_F8E4M3), "fp8_e4m3");
    CHECK_STR(pd_dtype_kv_name(PD_DTYPE_BF16), "bfloat16");
    /* weights are never fp8: the checkpoint and config parsers refuse them */
    CHECK_ERR(pd_dtype_parse("F8_E5M2", &t), PD_EUNSUPPORTED, "F32, F16, BF16");
    CHECK_ERR(pd_dtype_parse_torch("float8_e4m3fn", &t), PD_EUNSUPPORTED, "float8_e4m3fn");

    float src[8] = {0.0f, -1.5f, 3.14159f, 448.0f, 1e-3f, -INFINITY, 1e30f, NAN};
    float back[8];
    uint8_t b8[8];
    pd_dtype_from_f32(PD_DTYPE_F8E4M3, src, b8, 8);
    for (int i = 0; i < 8; i++)
        CHECK_INT(b8[i], pd_f32_to_f8e4m3(src[i]));
    pd_dtype_to_f32(PD_DTYPE_F8E4M3, b8, back, 8);
    for (int i = 0; i < 8; i++)
        CHECK(bits_of(back[i]) == bits_of(pd_f8e4m3_to_f32(b8[i])));
    pd_dtype_from_f32(PD_DTYPE_F8E5M2, src, b8, 8);
    for (int i = 0; i < 8; i++)
        CHECK_INT(b8[i], pd_f32_to_f8e5m2(src[i]));
    pd_dtype_to_f32(PD_DTYPE_F8E5M2, b8, back, 8);
    for (int i = 0; i < 8; i++)
        CHECK(bits_of(back[i]) == bits_of(pd_f8e5m2_to_f32(b8[i])));
}

PD_TEST_MAIN(PD_TEST(test_names_and_parse), PD_TEST(test_edge_values),
             PD_TEST(test_all_16bit_patterns), PD_TEST(test_midpoints),
             PD_TEST(test_random_and_sweep), PD_TEST(test_bulk), PD_TEST(test_fp8_all_codes),
             PD_TEST(test_fp8_rounding), PD_TEST(test_fp8_names_and_bulk))
