/*
 * test_image_processor.c — model/vision/: PNG and JPEG decoding, data: URLs, Pillow's resize and
 * the Qwen2-VL image processor, on images this test encodes itself with libpng and libjpeg (no
 * binary fixtures). Expected values are computed here independently of the code under test:
 * compositing by integer rounding, smart_resize by integer inequalities, the patch layout by
 * index arithmetic. Bit-equality with Pillow and transformers themselves is
 * tests/python/test_image_processor_hf.py's job.
 */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "model/vision/image_decode.h"
#include "model/vision/image_processor.h"
#include "model/vision/image_resample.h"

#include <setjmp.h>
#include <stdint.h>

#include <jpeglib.h>
#include <png.h>

/* ---- encoders (the test's own, through the libraries) ---- */

struct byte_buf {
    uint8_t *data;
    size_t len, cap;
};

static void buf_append(struct byte_buf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->data = realloc(b->data, b->cap);
        if (!b->data)
            abort();
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void png_write_to_buf(png_structp png, png_bytep p, size_t n) {
    buf_append(png_get_io_ptr(png), p, n);
}

static void png_flush_nothing(png_structp png) {
    (void)png;
}

struct png_spec {
    int width, height, color_type, bit_depth;
    bool interlace;
    const uint8_t *rows; /* [height][rowbytes] packed as PNG stores them (16-bit big-endian) */
    const png_color *palette;
    int n_palette;
    const uint8_t *trns_alpha; /* palette alphas */
    int n_trns;
    const png_color_16 *trns_key; /* grey / truecolour key */
};

static size_t png_rowbytes(const struct png_spec *s) {
    int channels = s->color_type == PNG_COLOR_TYPE_GRAY || s->color_type == PNG_COLOR_TYPE_PALETTE
                       ? 1
                   : s->color_type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                   : s->color_type == PNG_COLOR_TYPE_RGB        ? 3
                                                                : 4;
    return ((size_t)s->width * channels * s->bit_depth + 7) / 8;
}

/* The encoded PNG in *out (free()). */
static void png_encode(const struct png_spec *s, struct byte_buf *out) {
    memset(out, 0, sizeof *out);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (!png || !info || setjmp(png_jmpbuf(png)))
        abort();
    png_set_write_fn(png, out, png_write_to_buf, png_flush_nothing);
    png_set_IHDR(png, info, s->width, s->height, s->bit_depth, s->color_type,
                 s->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (s->palette)
        png_set_PLTE(png, info, s->palette, s->n_palette);
    if (s->trns_alpha || s->trns_key)
        png_set_tRNS(png, info, s->trns_alpha, s->n_trns, s->trns_key);
    png_write_info(png, info);
    png_bytep *rows = calloc((size_t)s->height, sizeof *rows);
    for (int y = 0; y < s->height; y++)
        rows[y] = (png_bytep)s->rows + (size_t)y * png_rowbytes(s);
    png_write_image(png, rows);
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    free(rows);
}

/* components 1 (grey), 3 (RGB) or 4 (CMYK, written as Adobe-inverted like Pillow does) */
static void jpeg_encode(const uint8_t *pixels, int width, int height, int components, int quality,
                        struct byte_buf *out) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    unsigned char *mem = NULL;
    unsigned long mem_len = 0;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &mem, &mem_len);
    c.image_width = (JDIMENSION)width;
    c.image_height = (JDIMENSION)height;
    c.input_components = components;
    c.in_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    for (int i = 0; i < c.num_components; i++) /* 4:4:4: no chroma blur */
        c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)pixels + (size_t)c.next_scanline * width * components;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    memset(out, 0, sizeof *out);
    buf_append(out, mem, mem_len);
    free(mem);
}

static void base64_encode(const uint8_t *in, size_t n, struct byte_buf *out) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        char q[4] = {abc[v >> 18], abc[(v >> 12) & 63], i + 1 < n ? abc[(v >> 6) & 63] : '=',
                     i + 2 < n ? abc[v & 63] : '='};
        buf_append(out, q, 4);
    }
}

/* deterministic pixel bytes: a gradient with a pseudo-random wobble */
static uint8_t test_byte(int x, int y, int c) {
    uint32_t h = (uint32_t)x * 73856093u ^ (uint32_t)y * 19349663u ^ (uint32_t)c * 83492791u;
    return (uint8_t)((x * 7 + y * 3 + c * 50 + (h >> 13) % 23) & 0xff);
}

/* Pillow's alpha over opaque white, by plain rounded division: round((c·a + 255·(255−a)) / 255) */
static uint8_t over_white(int c, int a) {
    return (uint8_t)((c * a + 255 * (255 - a) + 127) / 255);
}

static int decode(const struct byte_buf *b, enum pd_image_alpha alpha, struct pd_image *img) {
    struct pd_image_decode_opts opts = {.alpha = alpha};
    return pd_image_decode(b->data, b->len, &opts, img);
}

/* ---- decoding ---- */

static void test_png_rgb_round_trip(void) {
    enum { W = 37, H = 23 };
    uint8_t px[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                px[y][x][c] = test_byte(x, y, c);
    struct byte_buf b;
    png_encode(&(struct png_spec){.width = W,
                                  .height = H,
                                  .color_type = PNG_COLOR_TYPE_RGB,
                                  .bit_depth = 8,
                                  .rows = &px[0][0][0]},
               &b);
    struct pd_image img;
    CHECK_INT(pd_image_format_detect(b.data, b.len), PD_IMAGE_FORMAT_PNG);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_INT(img.width, W);
    CHECK_INT(img.height, H);
    CHECK_INT(img.format, PD_IMAGE_FORMAT_PNG);
    CHECK_INT(img.color, PD_IMAGE_COLOR_RGB);
    CHECK(!img.transparency);
    CHECK(img.rgb && memcmp(img.rgb, px, sizeof px) == 0);
    pd_image_free(&img);
    pd_image_free(&img); /* twice: a freed image is zeroed */
    pd_image_free(NULL);

    /* the same pixels interlaced (Adam7) decode the same */
    struct byte_buf bi;
    png_encode(&(struct png_spec){.width = W,
                                  .height = H,
                                  .color_type = PNG_COLOR_TYPE_RGB,
                                  .bit_depth = 8,
                                  .interlace = true,
                                  .rows = &px[0][0][0]},
               &bi);
    CHECK_OK(decode(&bi, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK(img.rgb && memcmp(img.rgb, px, sizeof px) == 0);
    pd_image_free(&img);
    free(b.data);
    free(bi.data);
}

static void test_png_grey_depths(void) {
    enum { W = 19, H = 5 };
    /* 8-bit grey: replicated into R, G, B */
    uint8_t g8[H][W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            g8[y][x] = test_byte(x, y, 0);
    struct byte_buf b;
    struct pd_image img;
    png_encode(&(struct png_spec){.width = W,
                                  .height = H,
                                  .color_type = PNG_COLOR_TYPE_GRAY,
                                  .bit_depth = 8,
                                  .rows = &g8[0][0]},
               &b);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_INT(img.color, PD_IMAGE_COLOR_GREY);
    int bad = 0;
    for (int i = 0; i < W * H; i++)
        for (int c = 0; c < 3; c++)
            bad += img.rgb[3 * i + c] != (&g8[0][0])[i];
    CHECK_INT(bad, 0);
    pd_image_free(&img);
    free(b.data);

    /* 1-, 2- and 4-bit grey: scaled to 0..255 (v · 255 / (2^depth − 1)) */
    for (int depth = 1; depth <= 4; depth *= 2) {
        int maxv = (1 << depth) - 1;
        int stride = (W * depth + 7) / 8; /* PNG rows are packed MSB first, byte-aligned */
        uint8_t packed[H][(W * 4 + 7) / 8];
        memset(packed, 0, sizeof packed);
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                int v = (x + y) % (maxv + 1), bit = x * depth;
                (&packed[0][0])[y * stride + bit / 8] |= (uint8_t)(v << (8 - depth - bit % 8));
            }
        png_encode(&(struct png_spec){.width = W,
                                      .height = H,
                                      .color_type = PNG_COLOR_TYPE_GRAY,
                                      .bit_depth = depth,
                                      .rows = &packed[0][0]},
                   &b);
        CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
        bad = 0;
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                bad += img.rgb[3 * (y * W + x)] != ((x + y) % (maxv + 1)) * 255 / maxv;
        CHECK_INT(bad, 0);
        pd_image_free(&img);
        free(b.data);
    }

    /* 16-bit grey: Pillow's "I;16" → RGB clips at 255 rather than scaling */
    uint8_t g16[1][4 * 2] = {{0x00, 0x07, 0x00, 0xff, 0x01, 0x00, 0xff, 0xff}};
    png_encode(&(struct png_spec){.width = 4,
                                  .height = 1,
                                  .color_type = PNG_COLOR_TYPE_GRAY,
                                  .bit_depth = 16,
                                  .rows = &g16[0][0]},
               &b);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_INT(img.rgb[0], 7);
    CHECK_INT(img.rgb[3], 255);
    CHECK_INT(img.rgb[6], 255); /* 256 clips */
    CHECK_INT(img.rgb[9], 255);
    pd_image_free(&img);
    free(b.data);
}

static void test_png_alpha_and_palette(void) {
    enum { W = 16, H = 16 };
    uint8_t px[H][W][4];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            for (int c = 0; c < 3; c++)
                px[y][x][c] = test_byte(x, y, c);
            px[y][x][3] = (uint8_t)(y * W + x); /* every alpha from 0 to 255 */
        }
    struct byte_buf b;
    struct pd_image img, dropped;
    png_encode(&(struct png_spec){.width = W,
                                  .height = H,
                                  .color_type = PNG_COLOR_TYPE_RGB_ALPHA,
                                  .bit_depth = 8,
                                  .rows = &px[0][0][0]},
               &b);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_DROP, &dropped));
    CHECK_INT(img.color, PD_IMAGE_COLOR_RGBA);
    CHECK(img.transparency);
    int bad_white = 0, bad_drop = 0;
    for (int i = 0; i < W * H; i++)
        for (int c = 0; c < 3; c++) {
            const uint8_t *p = &px[0][0][0] + 4 * i;
            bad_white += img.rgb[3 * i + c] != over_white(p[c], p[3]);
            bad_drop += dropped.rgb[3 * i + c] != p[c];
        }
    CHECK_INT(bad_white, 0);
    CHECK_INT(bad_drop, 0);
    pd_image_free(&img);
    pd_image_free(&dropped);
    free(b.data);

    /* 16-bit RGBA keeps the high bytes (Pillow's RGBA;16B), then composites */
    uint8_t px16[1][2 * 8] = {{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0x80, 0xff,   /* a = 0x80 */
                               0xff, 0x00, 0x00, 0xff, 0x40, 0x00, 0xff, 0xff}}; /* opaque */
    png_encode(&(struct png_spec){.width = 2,
                                  .height = 1,
                                  .color_type = PNG_COLOR_TYPE_RGB_ALPHA,
                                  .bit_depth = 16,
                                  .rows = &px16[0][0]},
               &b);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_INT(img.rgb[0], over_white(0x12, 0x80));
    CHECK_INT(img.rgb[1], over_white(0x56, 0x80));
    CHECK_INT(img.rgb[2], over_white(0x9a, 0x80));
    CHECK_INT(img.rgb[3], 0xff);
    CHECK_INT(img.rgb[4], 0x00);
    CHECK_INT(img.rgb[5], 0x40);
    pd_image_free(&img);
    free(b.data);

    /* palette (4-bit indices) with tRNS alphas for the first entries; entries past them opaque */
    png_color pal[5] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}, {200, 100, 50}};
    uint8_t alphas[2] = {0, 128};
    uint8_t idx[1][3] = {{0x01, 0x23, 0x40}}; /* indices 0 1 2 3 4 (and a pad nibble) */
    png_encode(&(struct png_spec){.width = 5,
                                  .height = 1,
                                  .color_type = PNG_COLOR_TYPE_PALETTE,
                                  .bit_depth = 4,
                                  .rows = &idx[0][0],
                                  .palette = pal,
                                  .n_palette = 5,
                                  .trns_alpha = alphas,
                                  .n_trns = 2},
               &b);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_INT(img.color, PD_IMAGE_COLOR_PALETTE);
    CHECK(img.transparency);
    uint8_t want[5][3] = {{255, 255, 255},
                          {over_white(0, 128), over_white(255, 128), over_white(0, 128)},
                          {0, 0, 255},
                          {10, 20, 30},
                          {200, 100, 50}};
    CHECK(memcmp(img.rgb, want, sizeof want) == 0);
    pd_image_free(&img);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_DROP, &img));
    CHECK_INT(img.rgb[0], 255);
    CHECK_INT(img.rgb[1], 0);
    pd_image_free(&img);
    free(b.data);

    /* a truecolour tRNS key: the matching pixel turns white, the others stay */
    uint8_t rgb[1][6] = {{1, 2, 3, 4, 5, 6}};
    png_color_16 key = {.red = 4, .green = 5, .blue = 6};
    png_encode(&(struct png_spec){.width = 2,
                                  .height = 1,
                                  .color_type = PNG_COLOR_TYPE_RGB,
                                  .bit_depth = 8,
                                  .rows = &rgb[0][0],
                                  .trns_key = &key},
               &b);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK(img.transparency);
    uint8_t want_key[6] = {1, 2, 3, 255, 255, 255};
    CHECK(memcmp(img.rgb, want_key, 6) == 0);
    pd_image_free(&img);
    free(b.data);
}

static void test_jpeg_decode(void) {
    enum { W = 40, H = 24 };
    uint8_t rgb[H][W][3], grey[H][W], cmyk[H][W][4];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            for (int c = 0; c < 3; c++)
                rgb[y][x][c] = (uint8_t)(x * 4 + c * 60 + y); /* smooth: JPEG keeps it close */
            grey[y][x] = (uint8_t)(x * 5 + y * 2);
            /* flat CMYK, stored inverted as Adobe/Pillow do: raw c = 255 − C */
            cmyk[y][x][0] = 255 - 40, cmyk[y][x][1] = 255 - 120, cmyk[y][x][2] = 255 - 200;
            cmyk[y][x][3] = 255 - 30;
        }
    struct byte_buf b;
    struct pd_image img;
    jpeg_encode(&rgb[0][0][0], W, H, 3, 100, &b);
    CHECK_INT(pd_image_format_detect(b.data, b.len), PD_IMAGE_FORMAT_JPEG);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_INT(img.width, W);
    CHECK_INT(img.height, H);
    CHECK_INT(img.format, PD_IMAGE_FORMAT_JPEG);
    CHECK_INT(img.color, PD_IMAGE_COLOR_RGB);
    int worst = 0;
    for (size_t i = 0; i < sizeof rgb; i++) {
        int d = abs((int)img.rgb[i] - (int)(&rgb[0][0][0])[i]);
        worst = d > worst ? d : worst;
    }
    CHECK(worst <= 4); /* quality 100, 4:4:4: a few levels of DCT rounding at most */
    pd_image_free(&img);
    free(b.data);

    jpeg_encode(&grey[0][0], W, H, 1, 95, &b);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_INT(img.color, PD_IMAGE_COLOR_GREY);
    int not_grey = 0;
    for (int i = 0; i < W * H; i++)
        not_grey += img.rgb[3 * i] != img.rgb[3 * i + 1] || img.rgb[3 * i] != img.rgb[3 * i + 2];
    CHECK_INT(not_grey, 0);
    pd_image_free(&img);
    free(b.data);

    /* CMYK: C=40 M=120 Y=200 K=30 → Pillow's r = (255−K) − C·(255−K)/255 (rounded) */
    jpeg_encode(&cmyk[0][0][0], W, H, 4, 100, &b);
    CHECK_OK(decode(&b, PD_IMAGE_ALPHA_ON_WHITE, &img));
    CHECK_INT(img.color, PD_IMAGE_COLOR_CMYK);
    int nk = 255 - 30;
    int want[3] = {nk - (40 * nk + 127) / 255, nk - (120 * nk + 127) / 255,
                   nk - (200 * nk + 127) / 255};
    for (int c = 0; c < 3; c++)
        CHECK(abs(img.rgb[3 * (W * H / 2) + c] - want[c]) <= 2); /* a flat block: ±DC rounding */
    pd_image_free(&img);
    free(b.data);
}

/* ---- what must be refused ---- */

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* CRC-32 of PNG chunks (ISO 3309), bit by bit: enough for one header */
static uint32_t png_crc(const uint8_t *p, size_t n) {
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? 0xedb88320u ^ (crc >> 1) : crc >> 1;
    }
    return crc ^ 0xffffffffu;
}

/* A PNG signature and an IHDR (with its CRC) claiming width × height, and nothing after. */
static size_t png_header_only(uint8_t out[33], uint32_t width, uint32_t height) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memcpy(out, sig, 8);
    put_be32(out + 8, 13);
    memcpy(out + 12, "IHDR", 4);
    put_be32(out + 16, width);
    put_be32(out + 20, height);
    out[24] = 8, out[25] = PNG_COLOR_TYPE_RGB, out[26] = out[27] = out[28] = 0;
    put_be32(out + 29, png_crc(out + 12, 17));
    return 33;
}

static void test_decode_errors(void) {
    struct pd_image img;
    uint8_t garbage[64];
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (uint8_t)(i * 37 + 11);
    CHECK_ERR(pd_image_decode(garbage, sizeof garbage, NULL, &img), PD_EFORMAT,
              "not a PNG or JPEG");
    CHECK(img.rgb == NULL);
    CHECK_ERR(pd_image_decode(garbage, 0, NULL, &img), PD_EFORMAT, "empty");

    enum { W = 30, H = 20 };
    uint8_t px[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                px[y][x][c] = test_byte(x, y, c);
    struct byte_buf png, jpg;
    png_encode(&(struct png_spec){.width = W,
                                  .height = H,
                                  .color_type = PNG_COLOR_TYPE_RGB,
                                  .bit_depth = 8,
                                  .rows = &px[0][0][0]},
               &png);
    jpeg_encode(&px[0][0][0], W, H, 3, 90, &jpg);

    /* cut anywhere: always an error naming the truncation, never a crash or a partial image */
    CHECK_ERR(pd_image_decode(png.data, png.len / 2, NULL, &img), PD_EFORMAT, "truncated");
    CHECK_ERR(pd_image_decode(png.data, 12, NULL, &img), PD_EFORMAT, "truncated");
    CHECK_ERR(pd_image_decode(png.data, 40, NULL, &img), PD_EFORMAT, "truncated");
    CHECK_ERR(pd_image_decode(jpg.data, jpg.len / 2, NULL, &img), PD_EFORMAT, "truncated");
    CHECK_ERR(pd_image_decode(jpg.data, 3, NULL, &img), PD_EFORMAT, "truncated");
    CHECK(img.rgb == NULL);
    for (size_t cut = 1; cut < png.len - 12; cut += 7) {
        int rc = pd_image_decode(png.data, cut, NULL, &img);
        CHECK(rc != PD_OK);
        pd_image_free(&img);
    }
    for (size_t cut = 1; cut < jpg.len - 2; cut += 5) {
        int rc = pd_image_decode(jpg.data, cut, NULL, &img);
        CHECK(rc != PD_OK);
        pd_image_free(&img);
    }

    /* a flipped bit inside the compressed data: libpng's error, caught, with its words */
    uint8_t *broken = malloc(png.len);
    memcpy(broken, png.data, png.len);
    broken[png.len - 20] ^= 0x55; /* inside IDAT, so its CRC no longer matches */
    CHECK_ERR(pd_image_decode(broken, png.len, NULL, &img), PD_EFORMAT, "PNG image is broken");
    free(broken);

    /* the caller's pixel limit, from the header alone: 20000 × 20000 is refused before any
     * pixel buffer exists (with every allocation failing, the answer is still the limit) */
    uint8_t head[33];
    size_t n = png_header_only(head, 20000, 20000);
    pd_alloc_fail_after(0);
    CHECK_ERR(pd_image_decode(head, n, NULL, &img), PD_ERANGE, "more than the limit");
    pd_alloc_fail_after(-1);
    CHECK_ERR(
        pd_image_decode(png.data, png.len, &(struct pd_image_decode_opts){.max_pixels = 599}, &img),
        PD_ERANGE, "30 x 20 pixels, more than the limit of 599 pixels");
    CHECK_OK(pd_image_decode(png.data, png.len, &(struct pd_image_decode_opts){.max_pixels = 600},
                             &img));
    pd_image_free(&img);
    n = png_header_only(head, 0, 10);
    CHECK_ERR(pd_image_decode(head, n, NULL, &img), PD_EFORMAT, "no pixels");

    /* a JPEG whose frame header claims 60000 × 60000 */
    uint8_t *big = malloc(jpg.len);
    memcpy(big, jpg.data, jpg.len);
    size_t sof = 2;
    while (sof + 9 < jpg.len && !(big[sof] == 0xff && big[sof + 1] == 0xc0))
        sof++;
    CHECK(sof + 9 < jpg.len);
    big[sof + 5] = big[sof + 7] = 60000 >> 8;
    big[sof + 6] = big[sof + 8] = 60000 & 0xff;
    pd_alloc_fail_after(0);
    CHECK_ERR(pd_image_decode(big, jpg.len, NULL, &img), PD_ERANGE, "60000 x 60000 pixels");
    pd_alloc_fail_after(-1);
    free(big);
    free(png.data);
    free(jpg.data);
}

/* Every allocation of a decode, failing one after the other: PD_ENOMEM each time, nothing
 * leaked (ASan's leak check runs this in CI), and success once allocations are allowed. */
static void test_decode_alloc_failures(void) {
    enum { W = 9, H = 7 };
    uint8_t px[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                px[y][x][c] = test_byte(x, y, c);
    struct byte_buf png, jpg, url = {0};
    png_encode(&(struct png_spec){.width = W,
                                  .height = H,
                                  .color_type = PNG_COLOR_TYPE_RGB,
                                  .bit_depth = 8,
                                  .interlace = true,
                                  .rows = &px[0][0][0]},
               &png);
    jpeg_encode(&px[0][0][0], W, H, 3, 90, &jpg);
    buf_append(&url, "data:image/png;base64,", 22);
    base64_encode(png.data, png.len, &url);
    struct pd_image_processor_config cfg;
    pd_image_processor_config_default(&cfg);

    for (int which = 0; which < 3; which++) {
        int rc = PD_ENOMEM;
        long n;
        for (n = 0; n < 50 && rc != PD_OK; n++) {
            struct pd_image img;
            struct pd_image_patches patches = {0};
            pd_alloc_fail_after(n);
            if (which == 0)
                rc = pd_image_decode(png.data, png.len, NULL, &img);
            else if (which == 1)
                rc = pd_image_decode(jpg.data, jpg.len, NULL, &img);
            else
                rc = pd_image_decode_data_url((const char *)url.data, url.len, NULL, &img);
            if (rc == PD_OK) {
                rc = pd_image_process(&cfg, &img, &patches);
                pd_image_free(&img);
            }
            pd_alloc_fail_after(-1);
            CHECK(rc == PD_OK || rc == PD_ENOMEM);
            pd_image_patches_free(&patches);
        }
        CHECK_INT(rc, PD_OK);
        CHECK(n > 2); /* the loop did meet failing allocations */
    }
    free(png.data);
    free(jpg.data);
    free(url.data);
}

/* ---- data: URLs and base64 ---- */

static void test_base64(void) {
    static const struct {
        const char *in, *out;
    } ok[] = {{"", ""},
              {"Zg==", "f"},
              {"Zm8=", "fo"},
              {"Zm9v", "foo"},
              {"Zm9vYg", "foob"},
              {"Zm9v\r\nYmE=", "fooba"},
              {" Zm9vYmFy ", "foobar"}};
    for (size_t i = 0; i < PD_ARRAY_LEN(ok); i++) {
        uint8_t *out;
        size_t n;
        CHECK_OK(pd_base64_decode(ok[i].in, strlen(ok[i].in), &out, &n));
        CHECK_INT(n, strlen(ok[i].out));
        CHECK(out && memcmp(out, ok[i].out, n) == 0);
        pd_free(out);
    }
    uint8_t *out;
    size_t n;
    CHECK_ERR(pd_base64_decode("Zm9v!", 5, &out, &n), PD_EINVAL, "character 0x21 at offset 4");
    CHECK(out == NULL);
    CHECK_ERR(pd_base64_decode("Zm9vY", 5, &out, &n), PD_EINVAL, "whole 4-symbol groups");
    CHECK_ERR(pd_base64_decode("Zg=", 3, &out, &n), PD_EINVAL, "whole 4-symbol groups");
    CHECK_ERR(pd_base64_decode("Zg==Zg==", 8, &out, &n), PD_EINVAL, "after the '=' padding");
    CHECK_ERR(pd_base64_decode("Zm-_", 4, &out, &n), PD_EINVAL, "not in the base64 alphabet");
}

static void test_data_url(void) {
    enum { W = 5, H = 3 };
    uint8_t px[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                px[y][x][c] = test_byte(x, y, c);
    struct byte_buf png, url = {0};
    png_encode(&(struct png_spec){.width = W,
                                  .height = H,
                                  .color_type = PNG_COLOR_TYPE_RGB,
                                  .bit_depth = 8,
                                  .rows = &px[0][0][0]},
               &png);
    buf_append(&url, "DATA:image/png;base64,", 22);
    base64_encode(png.data, png.len, &url);
    buf_append(&url, "\n", 1); /* whitespace is skipped */
    struct pd_image img;
    CHECK_OK(pd_image_decode_data_url((const char *)url.data, url.len, NULL, &img));
    CHECK(img.rgb && memcmp(img.rgb, px, sizeof px) == 0);
    pd_image_free(&img);

    /* a JPEG behind an image/png label: the bytes decide */
    struct byte_buf jpg, url2 = {0};
    jpeg_encode(&px[0][0][0], W, H, 3, 90, &jpg);
    buf_append(&url2, "data:image/png;charset=x;base64,", 32);
    base64_encode(jpg.data, jpg.len, &url2);
    CHECK_OK(pd_image_decode_data_url((const char *)url2.data, url2.len, NULL, &img));
    CHECK_INT(img.format, PD_IMAGE_FORMAT_JPEG);
    pd_image_free(&img);

    static const struct {
        const char *url;
        int code;
        const char *needle;
    } bad[] = {
        {"https://example.com/cat.png", PD_EUNSUPPORTED, "scheme 'https:' is not supported"},
        {"file:///etc/passwd", PD_EUNSUPPORTED, "scheme 'file:'"},
        {"/tmp/cat.png", PD_EUNSUPPORTED, "not a data: URL"},
        {"data:image/png;base64", PD_EINVAL, "no ','"},
        {"data:image/png,iVBORw0KGgo=", PD_EUNSUPPORTED, "not base64-encoded"},
        {"data:text/plain;base64,aGVsbG8=", PD_EUNSUPPORTED, "'text/plain' is not an image"},
        {"data:image/png;base64,iVBO%%%", PD_EINVAL, "broken base64"},
        {"data:image/png;base64,aGVsbG8gd29ybGQ=", PD_EFORMAT, "not a PNG or JPEG"},
        {"data:image/jpeg;base64,", PD_EFORMAT, "empty"},
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(bad); i++) {
        CHECK_ERR(pd_image_decode_data_url(bad[i].url, strlen(bad[i].url), NULL, &img), bad[i].code,
                  bad[i].needle);
        CHECK(img.rgb == NULL);
    }
    free(png.data);
    free(url.data);
    free(jpg.data);
    free(url2.data);
}

/* ---- resize ---- */

static void test_resize(void) {
    uint8_t two[6] = {10, 0, 255, 21, 255, 0};
    struct pd_image in = {.width = 2, .height = 1, .rgb = two}, out;
    /* 2 → 1 with the triangle filter: both samples weigh 1/2, halves round up */
    CHECK_OK(pd_image_resize(&in, 1, 1, PD_RESAMPLE_BILINEAR, &out));
    CHECK_INT(out.rgb[0], 16); /* (10 + 21) / 2 = 15.5 */
    CHECK_INT(out.rgb[1], 128);
    CHECK_INT(out.rgb[2], 128);
    pd_image_free(&out);

    /* a flat image stays flat under every filter, whatever the sizes (weights sum to one) */
    enum { W = 23, H = 17 };
    static uint8_t flat[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            flat[y][x][0] = 200;
            flat[y][x][1] = 3;
            flat[y][x][2] = 77;
        }
    struct pd_image src = {.width = W, .height = H, .rgb = &flat[0][0][0]};
    static const int sizes[][2] = {{7, 5}, {50, 9}, {11, 40}, {23, 3}, {1, 1}, {100, 80}};
    for (int f = 1; f <= 5; f++)
        for (size_t s = 0; s < PD_ARRAY_LEN(sizes); s++) {
            CHECK_OK(pd_image_resize(&src, sizes[s][0], sizes[s][1], (enum pd_resample)f, &out));
            int bad = 0;
            for (int i = 0; i < out.width * out.height; i++)
                bad += out.rgb[3 * i] != 200 || out.rgb[3 * i + 1] != 3 || out.rgb[3 * i + 2] != 77;
            CHECK_INT(bad, 0);
            pd_image_free(&out);
        }
    /* the same size is a copy */
    CHECK_OK(pd_image_resize(&src, W, H, PD_RESAMPLE_BICUBIC, &out));
    CHECK(memcmp(out.rgb, flat, sizeof flat) == 0);
    pd_image_free(&out);
    CHECK_ERR(pd_image_resize(&src, 4, 4, PD_RESAMPLE_NEAREST, &out), PD_EUNSUPPORTED, "NEAREST");
    CHECK(out.rgb == NULL);
    CHECK_ERR(pd_image_resize(&src, 0, 4, PD_RESAMPLE_BICUBIC, &out), PD_EINVAL, "0 x 4");
}

/* ---- smart_resize ---- */

/* Python's round(n / d) for positive integers: half to even */
static int64_t round_half_even(int64_t n, int64_t d) {
    int64_t q = n / d, r = n % d;
    return 2 * r > d || (2 * r == d && (q & 1)) ? q + 1 : q;
}

/* transformers' smart_resize by integer reasoning: floor(h / beta / f) is the largest k with
 * (k·f)² · w <= h · max_pixels, ceil(h · beta / f) the smallest k with (k·f)² · w >= h ·
 * min_pixels (beta being the square root of the area ratio). Returns false where a side lands
 * exactly on a bound (the float path could then go either way: the test avoids those sizes). */
static bool expect_smart_resize(int64_t h, int64_t w, int64_t f, int64_t min_px, int64_t max_px,
                                int64_t *eh, int64_t *ew) {
    int64_t hb = round_half_even(h, f) * f, wb = round_half_even(w, f) * f;
    int64_t side[2] = {h, w}, other[2] = {w, h}, out[2] = {hb, wb};
    for (int i = 0; i < 2; i++) {
        if (hb * wb > max_px) {
            int64_t k = 0;
            while (((k + 1) * f) * ((k + 1) * f) * other[i] <= side[i] * max_px)
                k++;
            if ((k * f) * (k * f) * other[i] == side[i] * max_px)
                return false;
            out[i] = k * f > f ? k * f : f;
        } else if (hb * wb < min_px) {
            int64_t k = 1;
            while ((k * f) * (k * f) * other[i] < side[i] * min_px)
                k++;
            if ((k * f) * (k * f) * other[i] == side[i] * min_px)
                return false;
            out[i] = k * f;
        }
    }
    *eh = out[0];
    *ew = out[1];
    return true;
}

static void test_smart_resize(void) {
    static const int sizes[][2] = {{1, 1},       {28, 28}, {29, 27},   {42, 700},  {70, 700},
                                   {98, 700},    {15, 40}, {480, 640}, {640, 480}, {1080, 1920},
                                   {1200, 1500}, {1, 200}, {200, 1},   {3, 200},   {20000, 15000},
                                   {4032, 3024}, {56, 30}, {999, 17}};
    static const int64_t bounds[][2] = {{3136, 1003520}, {3136, 12845056}, {200704, 401408}};
    int checked = 0;
    for (size_t s = 0; s < PD_ARRAY_LEN(sizes); s++)
        for (size_t b = 0; b < PD_ARRAY_LEN(bounds); b++) {
            int h = sizes[s][0], w = sizes[s][1], oh = -1, ow = -1;
            int64_t eh, ew;
            if (!expect_smart_resize(h, w, 28, bounds[b][0], bounds[b][1], &eh, &ew))
                continue;
            CHECK_OK(pd_image_smart_resize(h, w, 28, bounds[b][0], bounds[b][1], &oh, &ow));
            if (oh != eh || ow != ew)
                fprintf(stderr, "smart_resize(%d, %d, [%lld, %lld]) = %d x %d, want %lld x %lld\n",
                        h, w, (long long)bounds[b][0], (long long)bounds[b][1], oh, ow,
                        (long long)eh, (long long)ew);
            CHECK(oh == eh && ow == ew);
            checked++;
        }
    CHECK(checked > 45);

    /* values transformers gives (run by hand), and Python's half-to-even rounding */
    int oh, ow;
    CHECK_OK(pd_image_smart_resize(1, 1, 28, 3136, 1003520, &oh, &ow));
    CHECK(oh == 56 && ow == 56);
    CHECK_OK(pd_image_smart_resize(70, 700, 28, 3136, 1003520, &oh, &ow));
    CHECK(oh == 56 && ow == 700); /* round(2.5) = 2 */
    CHECK_OK(pd_image_smart_resize(98, 700, 28, 3136, 1003520, &oh, &ow));
    CHECK(oh == 112 && ow == 700); /* round(3.5) = 4 */
    CHECK_OK(pd_image_smart_resize(1080, 1920, 28, 3136, 1003520, &oh, &ow));
    CHECK(oh == 728 && ow == 1316);
    CHECK_OK(pd_image_smart_resize(1, 200, 28, 3136, 1003520, &oh, &ow));
    CHECK(oh == 28 && ow == 812);
    CHECK_ERR(pd_image_smart_resize(1, 201, 28, 3136, 1003520, &oh, &ow), PD_ERANGE,
              "aspect ratio must be smaller than 200");
    CHECK_ERR(pd_image_smart_resize(4020, 20, 28, 3136, 1003520, &oh, &ow), PD_ERANGE, "got 201");
}

/* ---- preprocessor_config.json ---- */

static int parse(const char *json, struct pd_image_processor_config *cfg) {
    return pd_image_processor_config_parse(json, strlen(json), "preprocessor_config.json", cfg);
}

static void test_config(void) {
    struct pd_image_processor_config c;
    /* Qwen2-VL's file: the old top-level bounds, the rest defaults */
    CHECK_OK(parse("{\"min_pixels\": 3136, \"max_pixels\": 12845056, \"patch_size\": 14,"
                   "\"temporal_patch_size\": 2, \"merge_size\": 2,"
                   "\"image_mean\": [0.48145466, 0.4578275, 0.40821073],"
                   "\"image_std\": [0.26862954, 0.26130258, 0.27577711],"
                   "\"image_processor_type\": \"Qwen2VLImageProcessor\","
                   "\"processor_class\": \"Qwen2VLProcessor\"}",
                   &c));
    CHECK_INT(c.min_pixels, 3136);
    CHECK_INT(c.max_pixels, 12845056);
    CHECK_INT(c.patch_size, 14);
    CHECK_INT(c.merge_size, 2);
    CHECK_INT(c.temporal_patch_size, 2);
    CHECK_DBL(c.image_std[2], 0.27577711, 0);
    CHECK_DBL(c.rescale_factor, 1.0 / 255, 0);
    CHECK(c.do_resize && c.do_rescale && c.do_normalize && c.do_convert_rgb);
    CHECK_INT(c.resample, PD_RESAMPLE_BICUBIC);

    /* transformers 5's spelling: size, every flag; an explicit min_pixels overrides size */
    CHECK_OK(parse("{\"size\": {\"longest_edge\": 1000000, \"shortest_edge\": 4000},"
                   "\"do_normalize\": false, \"resample\": 2, \"rescale_factor\": 0.5,"
                   "\"image_mean\": 0.5, \"patch_size\": 16, \"do_convert_rgb\": null,"
                   "\"image_processor_type\": \"Qwen2VLImageProcessorFast\"}",
                   &c));
    CHECK_INT(c.min_pixels, 4000);
    CHECK_INT(c.max_pixels, 1000000);
    CHECK(!c.do_normalize && c.do_convert_rgb);
    CHECK_INT(c.resample, PD_RESAMPLE_BILINEAR);
    CHECK_DBL(c.rescale_factor, 0.5, 0);
    CHECK_DBL(c.image_mean[1], 0.5, 0);
    CHECK_INT(c.patch_size, 16);
    CHECK_OK(parse("{\"size\": {\"longest_edge\": 1000000, \"shortest_edge\": 4000},"
                   "\"min_pixels\": 5000, \"image_processor_type\": \"Qwen2VLImageProcessor\"}",
                   &c));
    CHECK_INT(c.min_pixels, 5000);
    /* no size at all: the class defaults */
    CHECK_OK(parse("{\"image_processor_type\": \"Qwen2VLImageProcessor\"}", &c));
    CHECK_INT(c.min_pixels, 56 * 56);
    CHECK_INT(c.max_pixels, 28 * 28 * 1280);

    static const struct {
        const char *json;
        int code;
        const char *needle;
    } bad[] = {
        {"[1, 2]", PD_EFORMAT, "top level must be a JSON object"},
        {"{\"min_pixels\": ", PD_EFORMAT, "not valid JSON"},
        {"{\"patch_size\": 14}", PD_EINVAL, "missing required key 'image_processor_type'"},
        {"{\"image_processor_type\": \"CLIPImageProcessor\"}", PD_EUNSUPPORTED,
         "'CLIPImageProcessor' is not supported"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": \"14\"}", PD_EINVAL,
         "key 'patch_size' must be an integer, got a string"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"merge_size\": 0}", PD_ERANGE,
         "key 'merge_size' is 0"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"max_pixels\": 1.5}", PD_EINVAL,
         "key 'max_pixels' must be an integer"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"resample\": 0}", PD_EUNSUPPORTED,
         "resample 0 (NEAREST) is not supported"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"resample\": 9}", PD_ERANGE,
         "key 'resample' is 9"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"image_mean\": [0.5, 0.5]}",
         PD_EINVAL, "key 'image_mean' must list 3 values"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"image_std\": [0.5, 0, 0.5]}",
         PD_ERANGE, "key 'image_std' value 1 is 0"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"do_resize\": 1}", PD_EINVAL,
         "key 'do_resize' must be a boolean"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"size\": {\"shortest_edge\": "
         "3136}}",
         PD_EINVAL, "'size' must give 'shortest_edge' and 'longest_edge'"},
        {"{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"min_pixels\": 9000,"
         "\"max_pixels\": 8000}",
         PD_ERANGE, "min_pixels 9000 is above max_pixels 8000"},
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(bad); i++)
        CHECK_ERR(parse(bad[i].json, &c), bad[i].code, bad[i].needle);
    CHECK_ERR(pd_image_processor_config_load("/nonexistent/preprocessor_config.json", &c),
              PD_ENOENT, "/nonexistent/preprocessor_config.json");
}

/* ---- the processor ---- */

static void test_process_layout(void) {
    /* 56 × 84 stays that size (multiples of 28 within the bounds), so every value is a pixel:
     * rescale and normalise off, pixel_values hold the bytes */
    enum { W = 84, H = 56, P = 14, M = 2, T = 2 };
    static uint8_t px[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                px[y][x][c] = test_byte(x, y, c);
    struct pd_image img = {
        .width = W, .height = H, .rgb = &px[0][0][0], .color = PD_IMAGE_COLOR_RGB};
    struct pd_image_processor_config cfg;
    pd_image_processor_config_default(&cfg);
    cfg.do_rescale = cfg.do_normalize = false;
    struct pd_image_patches out;
    CHECK_OK(pd_image_process(&cfg, &img, &out));
    CHECK_INT(out.grid_t, 1);
    CHECK_INT(out.grid_h, H / P);
    CHECK_INT(out.grid_w, W / P);
    CHECK_INT(out.n_rows, (H / P) * (W / P));
    CHECK_INT(out.row_len, 3 * T * P * P);
    /* row = ((block_row · blocks_per_row + block_col) · M + mh) · M + mw,
     * col = ((c · T + t) · P + py) · P + px, value = pixel of patch (block_row·M+mh,
     * block_col·M+mw) at (py, px), channel c, the same for both frames t */
    int bad = 0, gw = W / P;
    for (int r = 0; r < out.n_rows; r++)
        for (int col = 0; col < out.row_len; col++) {
            int mw = r % M, mh = (r / M) % M, block = r / (M * M);
            int bw = block % (gw / M), bh = block / (gw / M);
            int pxx = col % P, py = (col / P) % P, c = col / (P * P * T);
            int y = (bh * M + mh) * P + py, x = (bw * M + mw) * P + pxx;
            bad += out.pixel_values[(size_t)r * out.row_len + col] != (float)px[y][x][c];
        }
    CHECK_INT(bad, 0);
    pd_image_patches_free(&out);
    pd_image_patches_free(&out);

    /* rescale then normalise, in transformers' types: double product narrowed to float, then
     * float subtract and divide */
    pd_image_processor_config_default(&cfg);
    CHECK_OK(pd_image_process(&cfg, &img, &out));
    float want =
        ((float)((double)px[0][1][2] * (1.0 / 255)) - (float)0.40821073) / (float)0.27577711;
    CHECK(out.pixel_values[2 * T * P * P + 1] == want); /* row 0, channel 2, frame 0, (0, 1) */
    pd_image_patches_free(&out);

    /* a 1 × 1 image grows to 56 × 56, as transformers does (no error there) */
    uint8_t one[3] = {9, 99, 199};
    struct pd_image tiny = {.width = 1, .height = 1, .rgb = one, .color = PD_IMAGE_COLOR_RGB};
    CHECK_OK(pd_image_process(&cfg, &tiny, &out));
    CHECK(out.grid_h == 4 && out.grid_w == 4 && out.n_rows == 16 && out.row_len == 1176);
    pd_image_patches_free(&out);

    /* the processor's own refusals */
    static uint8_t line[201][3];
    struct pd_image thin = {
        .width = 201, .height = 1, .rgb = &line[0][0], .color = PD_IMAGE_COLOR_RGB};
    CHECK_ERR(pd_image_process(&cfg, &thin, &out), PD_ERANGE, "aspect ratio");
    CHECK(out.pixel_values == NULL);
    cfg.do_resize = false;
    struct pd_image odd = {
        .width = 30, .height = 28, .rgb = &px[0][0][0], .color = PD_IMAGE_COLOR_RGB};
    CHECK_ERR(pd_image_process(&cfg, &odd, &out), PD_EINVAL, "not a multiple of 28");
    cfg.do_resize = true;
    cfg.do_convert_rgb = false;
    img.color = PD_IMAGE_COLOR_GREY;
    CHECK_ERR(pd_image_process(&cfg, &img, &out), PD_EUNSUPPORTED, "do_convert_rgb is false");
}

/* The decode side of PD places an image from its header alone: pd_image_probe gives the size
 * pd_image_decode would (PNG of several colour types, interlaced; JPEG grey, RGB, CMYK), with
 * the same refusals (not an image, over the pixel limit, a JPEG cut inside its header), and
 * pd_image_grid gives the grid pd_image_process makes, for sizes across smart_resize's cases
 * (upscaled to min_pixels, downscaled to max_pixels, aspect ratios up to 150) and without
 * resizing. */
static void test_probe_and_grid(void) {
    static const uint8_t fill[64 * 48 * 4] = {7};
    struct byte_buf b;
    int w = 0, h = 0;
    struct png_spec specs[] = {
        {.width = 33, .height = 17, .bit_depth = 8, .color_type = PNG_COLOR_TYPE_RGB},
        {.width = 5, .height = 40, .bit_depth = 8, .color_type = PNG_COLOR_TYPE_GRAY},
        {.width = 20, .height = 9, .bit_depth = 16, .color_type = PNG_COLOR_TYPE_RGB_ALPHA},
        {.width = 12,
         .height = 12,
         .bit_depth = 8,
         .color_type = PNG_COLOR_TYPE_RGB,
         .interlace = true},
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(specs); i++) {
        specs[i].rows = fill;
        png_encode(&specs[i], &b);
        struct pd_image img;
        CHECK_OK(pd_image_probe(b.data, b.len, NULL, &w, &h));
        CHECK_OK(pd_image_decode(b.data, b.len, NULL, &img));
        CHECK(w == img.width && h == img.height && w == specs[i].width);
        pd_image_free(&img);
        struct pd_image_decode_opts small = {.max_pixels = (uint64_t)w * h - 1};
        CHECK_ERR(pd_image_probe(b.data, b.len, &small, &w, &h), PD_ERANGE, "more than the limit");
        free(b.data);
    }
    for (int comps = 1; comps <= 4; comps += comps == 1 ? 2 : 1) {
        jpeg_encode(fill, 64, 48, comps, 90, &b);
        CHECK_OK(pd_image_probe(b.data, b.len, NULL, &w, &h));
        CHECK(w == 64 && h == 48);
        CHECK_ERR(pd_image_probe(b.data, 20, NULL, &w, &h), PD_EFORMAT, "JPEG image is");
        free(b.data);
    }
    CHECK_ERR(pd_image_probe("GIF89a......", 12, NULL, &w, &h), PD_EFORMAT, "not a PNG or JPEG");
    CHECK_ERR(pd_image_probe("", 0, NULL, &w, &h), PD_EFORMAT, "empty");

    struct pd_image_processor_config cfg;
    pd_image_processor_config_default(&cfg);
    cfg.max_pixels = 28 * 28 * 64;
    static const int sizes[][2] = {{4, 4},    {56, 56},   {57, 55},   {300, 20},  {20, 300},
                                   {1000, 7}, {640, 480}, {123, 456}, {28, 2800}, {250, 251}};
    static uint8_t rgb[3000 * 3000 * 3 / 100];
    for (int pass = 0; pass < 2; pass++) {
        cfg.do_resize = pass == 0;
        for (size_t i = 0; i < PD_ARRAY_LEN(sizes); i++) {
            int sw = sizes[i][0], sh = sizes[i][1];
            if (!cfg.do_resize) /* as it is: only multiples of patch x merge */
                sw = (sw / 28 + 1) * 28, sh = (sh / 28 + 1) * 28;
            if ((size_t)sw * (size_t)sh * 3 > sizeof(rgb))
                continue;
            struct pd_image img = {
                .width = sw, .height = sh, .rgb = rgb, .color = PD_IMAGE_COLOR_RGB};
            struct pd_image_patches p;
            int t, gh, gw;
            int rc_grid = pd_image_grid(&cfg, sw, sh, &t, &gh, &gw);
            int rc_proc = pd_image_process(&cfg, &img, &p);
            CHECK_INT(rc_grid, rc_proc);
            if (rc_proc == PD_OK) {
                CHECK(t == p.grid_t && gh == p.grid_h && gw == p.grid_w);
                pd_image_patches_free(&p);
            }
        }
    }
    CHECK_ERR(pd_image_grid(&cfg, 29, 28, &w, &h, &w), PD_EINVAL, "not a multiple of 28");
}

PD_TEST_MAIN(PD_TEST(test_probe_and_grid), PD_TEST(test_png_rgb_round_trip),
             PD_TEST(test_png_grey_depths), PD_TEST(test_png_alpha_and_palette),
             PD_TEST(test_jpeg_decode), PD_TEST(test_decode_errors),
             PD_TEST(test_decode_alloc_failures), PD_TEST(test_base64), PD_TEST(test_data_url),
             PD_TEST(test_resize), PD_TEST(test_smart_resize), PD_TEST(test_config),
             PD_TEST(test_process_layout))
