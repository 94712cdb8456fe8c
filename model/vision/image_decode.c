/*
 * image_decode.c — PNG (libpng) and JPEG (libjpeg-turbo) from memory to RGB8, the pixels Pillow
 * plus transformers' convert_to_rgb make of the same bytes; base64 data: URLs.
 *
 * Where Pillow's result is not what libpng's own transformations give, the conversion is ours:
 *  - 16-bit grey opens in Pillow as "I;16" and Image.convert("RGB") clips it (v > 255 → 255),
 *    while 16-bit truecolour and grey+alpha are unpacked by keeping the high byte (libpng's
 *    png_set_strip_16 does the same chop); so grey keeps its 16 bits here and is clipped by hand;
 *  - a tRNS colour key is compared by Pillow (convert_transparent) with the 8-bit converted pixel
 *    and only the key's low byte: 1-bit grey keys become 0/255, 2- and 4-bit grey keys are compared
 *    unscaled with the scaled pixel (so they rarely match), 16-bit keys by their low byte. We do
 * the same instead of libpng's png_set_tRNS_to_alpha;
 *  - palettes are looked up here, with the tRNS alphas (entries past them opaque);
 *  - CMYK JPEGs are read inverted ("Adobe polarity", as Pillow always assumes) and converted with
 *    Pillow's formula, not libjpeg's.
 * Alpha over white is Pillow's alpha_composite with an opaque white destination, which reduces to
 * (c·a + 255·(255 − a) + 128) divided by 255 with Pillow's shift-based rounding.
 *
 * libpng and libjpeg report errors by longjmp: the setjmp sits in a function of its own
 * (png_decode_run, jpeg_decode_run) whose caller owns every buffer, so nothing allocated is lost
 * and no local needs volatile. A truncated stream is named as such (our read callback for PNG,
 * libjpeg's "premature end" warning for JPEG). Trailing bytes after the image are ignored, and a
 * missing IEND/EOI after complete pixel data is accepted, as Pillow does.
 */
#include "model/vision/image_decode.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <ctype.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

const char *pd_image_format_name(enum pd_image_format f) {
    switch (f) {
    case PD_IMAGE_FORMAT_PNG: return "PNG";
    case PD_IMAGE_FORMAT_JPEG: return "JPEG";
    default: return "unknown";
    }
}

const char *pd_image_color_name(enum pd_image_color c) {
    switch (c) {
    case PD_IMAGE_COLOR_GREY: return "grey";
    case PD_IMAGE_COLOR_GREY_ALPHA: return "grey+alpha";
    case PD_IMAGE_COLOR_PALETTE: return "palette";
    case PD_IMAGE_COLOR_RGB: return "RGB";
    case PD_IMAGE_COLOR_RGBA: return "RGBA";
    case PD_IMAGE_COLOR_CMYK: return "CMYK";
    }
    return "?";
}

enum pd_image_format pd_image_format_detect(const void *data, size_t len) {
    const uint8_t *p = data;
    if (len >= sizeof png_magic && memcmp(p, png_magic, sizeof png_magic) == 0)
        return PD_IMAGE_FORMAT_PNG;
    if (len >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff)
        return PD_IMAGE_FORMAT_JPEG;
    return PD_IMAGE_FORMAT_UNKNOWN;
}

void pd_image_free(struct pd_image *img) {
    if (!img)
        return;
    pd_free(img->rgb);
    memset(img, 0, sizeof *img);
}

/* ---- pixel helpers shared by both formats ---- */

/* Pillow's division by 255 of a value up to 255·255 + 128 with the rounding term already added:
 * (v + v/256) / 256, exact for every sum of two 8-bit products. */
static inline uint8_t div255_rounded(uint32_t v) {
    return (uint8_t)((v + (v >> 8)) >> 8);
}

/* One pixel with its alpha into dst[0..2]: alpha_composite over opaque white, or the colour as
 * it is. Composite at a = 255 is the identity, so opaque pixels need no special case. */
static inline void put_pixel(uint8_t *dst, unsigned r, unsigned g, unsigned b, unsigned a,
                             enum pd_image_alpha mode) {
    if (mode == PD_IMAGE_ALPHA_ON_WHITE && a != 255) {
        uint32_t white = 255u * (255u - a) + 128u;
        r = div255_rounded(r * a + white);
        g = div255_rounded(g * a + white);
        b = div255_rounded(b * a + white);
    }
    dst[0] = (uint8_t)r;
    dst[1] = (uint8_t)g;
    dst[2] = (uint8_t)b;
}

/* width × height checked against the limit before anything of the image's size is allocated;
 * also keeps width × height × 4 × 2 (the largest row buffer we make) within size_t and int. */
static int check_dimensions(const char *what, uint64_t width, uint64_t height,
                            uint64_t max_pixels) {
    if (width == 0 || height == 0)
        return pd_errorf(PD_EFORMAT, "%s image is %llu x %llu pixels: no pixels", what,
                         (unsigned long long)width, (unsigned long long)height);
    if (width > INT32_MAX || height > INT32_MAX || width * height > max_pixels)
        return pd_errorf(
            PD_ERANGE, "%s image is %llu x %llu pixels, more than the limit of %llu pixels", what,
            (unsigned long long)width, (unsigned long long)height, (unsigned long long)max_pixels);
    return PD_OK;
}

static uint64_t effective_max_pixels(const struct pd_image_decode_opts *opts) {
    uint64_t m = opts && opts->max_pixels ? opts->max_pixels : PD_IMAGE_DEFAULT_MAX_PIXELS;
    /* the RGB buffer must be addressable: 3 bytes a pixel, plus a 16-bit RGBA row */
    uint64_t cap = (uint64_t)(SIZE_MAX / 8);
    return m < cap ? m : cap;
}

/* ---- PNG ---- */

struct png_source {
    const uint8_t *data;
    size_t len;
    size_t pos; /* bytes handed to libpng so far */
    bool truncated;
    char msg[200]; /* libpng's last error message */
};

/* What a decoded row holds and how to make RGB of it. */
struct png_layout {
    int color_type;  /* PNG_COLOR_TYPE_* of the file */
    int bit_depth;   /* of the file: 1, 2, 4, 8, 16 */
    int channels;    /* per pixel in the rows libpng hands us */
    bool grey16;     /* rows hold 16-bit big-endian grey (Pillow's "I;16") */
    bool has_key;    /* tRNS colour key for grey / truecolour */
    unsigned key[3]; /* the key as Pillow compares it: low byte (1-bit grey: 0 or 255) */
    int n_palette;
    uint8_t palette[256][4]; /* RGBA; entries past n_palette are black, opaque */
};

static void png_on_error(png_structp png, png_const_charp msg) {
    struct png_source *src = png_get_error_ptr(png);
    snprintf(src->msg, sizeof src->msg, "%s", msg ? msg : "unknown libpng error");
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    /* libpng recovers from what it warns about (a bad ancillary chunk CRC, extra data), and so
     * does Pillow: nothing to report, and never on stderr */
    (void)png;
    (void)msg;
}

static void png_read_memory(png_structp png, png_bytep dst, size_t n) {
    struct png_source *src = png_get_io_ptr(png);
    if (n > src->len - src->pos) {
        src->truncated = true;
        png_error(png, "truncated");
    }
    memcpy(dst, src->data + src->pos, n);
    src->pos += n;
}

static void png_row_to_rgb(const struct png_layout *lay, const uint8_t *row, uint8_t *dst,
                           int width, enum pd_image_alpha mode) {
    for (int x = 0; x < width; x++, dst += 3) {
        unsigned r, g, b, a = 255;
        switch (lay->color_type) {
        case PNG_COLOR_TYPE_PALETTE: {
            const uint8_t *e = lay->palette[row[x]];
            r = e[0], g = e[1], b = e[2], a = e[3];
            break;
        }
        case PNG_COLOR_TYPE_GRAY:
            if (lay->grey16) {
                const uint8_t *s = row + 2 * (size_t)x;
                r = s[0] ? 255 : s[1]; /* Pillow's I;16 → RGB clips instead of scaling */
            } else {
                r = row[x];
            }
            g = b = r;
            if (lay->has_key && r == lay->key[0])
                a = 0;
            break;
        case PNG_COLOR_TYPE_GRAY_ALPHA:
            r = g = b = row[2 * (size_t)x];
            a = row[2 * (size_t)x + 1];
            break;
        case PNG_COLOR_TYPE_RGB: {
            const uint8_t *s = row + 3 * (size_t)x;
            r = s[0], g = s[1], b = s[2];
            if (lay->has_key && r == lay->key[0] && g == lay->key[1] && b == lay->key[2])
                a = 0;
            break;
        }
        default: { /* PNG_COLOR_TYPE_RGB_ALPHA */
            const uint8_t *s = row + 4 * (size_t)x;
            r = s[0], g = s[1], b = s[2], a = s[3];
            break;
        }
        }
        put_pixel(dst, r, g, b, a, mode);
    }
}

/* Reads the colour key, palette and transparency Pillow would see, and sets libpng's
 * transformations so that rows come as lay describes. */
static void png_setup_layout(png_structp png, png_infop info, struct png_layout *lay) {
    png_bytep trans_alpha = NULL;
    int n_trans = 0;
    png_color_16p trans_color = NULL;
    bool has_trns = png_get_valid(png, info, PNG_INFO_tRNS) &&
                    png_get_tRNS(png, info, &trans_alpha, &n_trans, &trans_color);

    lay->color_type = png_get_color_type(png, info);
    lay->bit_depth = png_get_bit_depth(png, info);
    switch (lay->color_type) {
    case PNG_COLOR_TYPE_PALETTE: {
        png_colorp plte = NULL;
        int n = 0;
        png_get_PLTE(png, info, &plte, &n);
        lay->n_palette = n < 0 ? 0 : n > 256 ? 256 : n;
        memset(lay->palette, 0, sizeof lay->palette);
        for (int i = 0; i < 256; i++)
            lay->palette[i][3] = 255;
        for (int i = 0; i < lay->n_palette; i++) {
            lay->palette[i][0] = plte[i].red;
            lay->palette[i][1] = plte[i].green;
            lay->palette[i][2] = plte[i].blue;
        }
        for (int i = 0; has_trns && trans_alpha && i < n_trans && i < 256; i++)
            lay->palette[i][3] = trans_alpha[i];
        if (lay->bit_depth < 8)
            png_set_packing(png); /* one index per byte */
        lay->channels = 1;
        break;
    }
    case PNG_COLOR_TYPE_GRAY:
        lay->grey16 = lay->bit_depth == 16;
        if (lay->bit_depth < 8)
            png_set_expand_gray_1_2_4_to_8(png); /* scaled: 1 → 255, 2-bit × 85, 4-bit × 17 */
        if (has_trns && trans_color) {
            lay->has_key = true;
            lay->key[0] =
                lay->bit_depth == 1 ? (trans_color->gray ? 255 : 0) : (trans_color->gray & 0xffu);
        }
        lay->channels = 1;
        break;
    case PNG_COLOR_TYPE_GRAY_ALPHA: lay->channels = 2; break;
    case PNG_COLOR_TYPE_RGB:
        if (has_trns && trans_color) {
            lay->has_key = true;
            lay->key[0] = trans_color->red & 0xffu;
            lay->key[1] = trans_color->green & 0xffu;
            lay->key[2] = trans_color->blue & 0xffu;
        }
        lay->channels = 3;
        break;
    default: lay->channels = 4; break;
    }
    if (lay->bit_depth == 16 && !lay->grey16)
        png_set_strip_16(png); /* the high byte, as Pillow's ;16B unpackers */
}

struct png_decode {
    struct png_source src;
    png_structp png;
    png_infop info;
    struct png_layout lay;
    uint8_t *rows; /* interlaced: [height][rowbytes]; else one row */
    uint8_t *rgb;  /* [height][width][3] */
    int err;       /* our own error (not libpng's), PD_OK when none */
};

/* The only frame with setjmp: every buffer lives in *d, which the caller frees. */
static int png_decode_run(struct png_decode *d, enum pd_image_alpha mode, int *width, int *height) {
    if (setjmp(png_jmpbuf(d->png)))
        return -1;
    png_set_read_fn(d->png, &d->src, png_read_memory);
    png_read_info(d->png, d->info);
    png_setup_layout(d->png, d->info, &d->lay);
    bool interlaced = png_get_interlace_type(d->png, d->info) != PNG_INTERLACE_NONE;
    int passes = png_set_interlace_handling(d->png);
    png_read_update_info(d->png, d->info);

    int w = (int)png_get_image_width(d->png, d->info);
    int h = (int)png_get_image_height(d->png, d->info);
    size_t rowbytes = png_get_rowbytes(d->png, d->info);
    size_t want = (size_t)w * (size_t)d->lay.channels * (d->lay.grey16 ? 2 : 1);
    if (rowbytes != want || (int)png_get_channels(d->png, d->info) != d->lay.channels) {
        d->err = pd_errorf(PD_EINTERNAL, "PNG rows are %zu bytes of %d channels, expected %zu",
                           rowbytes, (int)png_get_channels(d->png, d->info), want);
        return -1;
    }
    d->rgb = pd_calloc((size_t)w * (size_t)h, 3);
    d->rows = pd_malloc(interlaced ? rowbytes * (size_t)h : rowbytes);
    if (!d->rgb || !d->rows) {
        d->err = pd_error_wrap(PD_ENOMEM, "decoding a %d x %d PNG", w, h);
        return -1;
    }
    if (interlaced) {
        /* every pass writes into the whole image; rows are converted after the last */
        for (int p = 0; p < passes; p++)
            for (int y = 0; y < h; y++)
                png_read_row(d->png, d->rows + (size_t)y * rowbytes, NULL);
        for (int y = 0; y < h; y++)
            png_row_to_rgb(&d->lay, d->rows + (size_t)y * rowbytes, d->rgb + (size_t)y * w * 3, w,
                           mode);
    } else {
        for (int y = 0; y < h; y++) {
            png_read_row(d->png, d->rows, NULL);
            png_row_to_rgb(&d->lay, d->rows, d->rgb + (size_t)y * w * 3, w, mode);
        }
    }
    *width = w;
    *height = h;
    return 0;
}

static enum pd_image_color png_color_of(int color_type) {
    switch (color_type) {
    case PNG_COLOR_TYPE_GRAY: return PD_IMAGE_COLOR_GREY;
    case PNG_COLOR_TYPE_GRAY_ALPHA: return PD_IMAGE_COLOR_GREY_ALPHA;
    case PNG_COLOR_TYPE_PALETTE: return PD_IMAGE_COLOR_PALETTE;
    case PNG_COLOR_TYPE_RGB: return PD_IMAGE_COLOR_RGB;
    default: return PD_IMAGE_COLOR_RGBA;
    }
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int png_decode(const uint8_t *data, size_t len, uint64_t max_pixels,
                      enum pd_image_alpha mode, struct pd_image *out) {
    /* the size from IHDR (signature, length, "IHDR", width, height) before libpng allocates
     * anything of it */
    if (len < 24)
        return pd_errorf(PD_EFORMAT, "PNG image is truncated: %zu bytes, not even a header", len);
    if (memcmp(data + 12, "IHDR", 4) == 0) {
        int rc = check_dimensions("PNG", be32(data + 16), be32(data + 20), max_pixels);
        if (rc != PD_OK)
            return rc;
    }

    struct png_decode d = {.src = {.data = data, .len = len}};
    d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d.src, png_on_error, png_on_warning);
    if (!d.png)
        return pd_errorf(PD_ENOMEM, "decoding a PNG: libpng could not allocate its state");
    d.info = png_create_info_struct(d.png);
    if (!d.info) {
        png_destroy_read_struct(&d.png, NULL, NULL);
        return pd_errorf(PD_ENOMEM, "decoding a PNG: libpng could not allocate its state");
    }

    int w = 0, h = 0, rc = PD_OK;
    if (png_decode_run(&d, mode, &w, &h) != 0) {
        if (d.err != PD_OK)
            rc = d.err;
        else if (d.src.truncated)
            rc =
                pd_errorf(PD_EFORMAT, "PNG image is truncated: the data ends after %zu bytes", len);
        else
            rc = pd_errorf(PD_EFORMAT, "PNG image is broken: %s", d.src.msg);
    }
    if (rc == PD_OK) {
        *out = (struct pd_image){.width = w,
                                 .height = h,
                                 .rgb = d.rgb,
                                 .format = PD_IMAGE_FORMAT_PNG,
                                 .color = png_color_of(d.lay.color_type),
                                 .transparency = d.lay.has_key ||
                                                 (d.lay.color_type & PNG_COLOR_MASK_ALPHA) ||
                                                 png_get_valid(d.png, d.info, PNG_INFO_tRNS)};
        d.rgb = NULL;
    }
    png_destroy_read_struct(&d.png, &d.info, NULL);
    pd_free(d.rows);
    pd_free(d.rgb);
    return rc;
}

/* ---- JPEG ---- */

struct jpeg_failure {
    struct jpeg_error_mgr pub; /* first: libjpeg hands us &pub */
    jmp_buf jump;
    bool truncated;
    char msg[JMSG_LENGTH_MAX];
};

static void jpeg_on_error(j_common_ptr cinfo) {
    struct jpeg_failure *f = (struct jpeg_failure *)cinfo->err;
    cinfo->err->format_message(cinfo, f->msg);
    longjmp(f->jump, 1);
}

/* Warnings: a stream that ends early is an error (Pillow: "image file is truncated"); the
 * corrupt-data warnings libjpeg recovers from are ignored, as Pillow ignores them. Nothing is
 * ever printed. */
static void jpeg_on_message(j_common_ptr cinfo, int level) {
    struct jpeg_failure *f = (struct jpeg_failure *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
        f->truncated = true;
        longjmp(f->jump, 1);
    }
}

static void jpeg_on_output(j_common_ptr cinfo) {
    (void)cinfo;
}

struct jpeg_decode {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_failure fail;
    bool created;
    uint8_t *row; /* one decoded scanline */
    uint8_t *rgb; /* [height][width][3] */
    int err;      /* our own error (not libjpeg's), PD_OK when none */
};

static void jpeg_row_to_rgb(const uint8_t *row, uint8_t *dst, int width, int components) {
    for (int x = 0; x < width; x++, dst += 3) {
        if (components == 1) {
            dst[0] = dst[1] = dst[2] = row[x];
        } else if (components == 3) {
            memcpy(dst, row + 3 * (size_t)x, 3);
        } else {
            /* Pillow reads CMYK inverted ("CMYK;I") then converts with
             * r = (255 - k') - (c' · (255 - k') / 255), c' = 255 - c, k' = 255 - k */
            const uint8_t *s = row + 4 * (size_t)x;
            int nk = s[3]; /* 255 - k' */
            for (int c = 0; c < 3; c++) {
                uint32_t prod = (uint32_t)(255 - s[c]) * (uint32_t)nk + 128u;
                int v = nk - (int)div255_rounded(prod);
                dst[c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
}

static int jpeg_decode_run(struct jpeg_decode *d, const uint8_t *data, size_t len,
                           uint64_t max_pixels) {
    if (setjmp(d->fail.jump))
        return -1;
    jpeg_create_decompress(&d->cinfo);
    d->created = true;
    jpeg_mem_src(&d->cinfo, data, (unsigned long)len);
    jpeg_read_header(&d->cinfo, TRUE);
    if ((d->err = check_dimensions("JPEG", d->cinfo.image_width, d->cinfo.image_height,
                                   max_pixels)) != PD_OK)
        return -1;
    switch (d->cinfo.num_components) {
    case 1: d->cinfo.out_color_space = JCS_GRAYSCALE; break;
    case 3: d->cinfo.out_color_space = JCS_RGB; break;
    case 4: d->cinfo.out_color_space = JCS_CMYK; break;
    default:
        d->err = pd_errorf(PD_EUNSUPPORTED, "JPEG image has %d colour components (1, 3 or 4 taken)",
                           d->cinfo.num_components);
        return -1;
    }
    jpeg_start_decompress(&d->cinfo);
    int w = (int)d->cinfo.output_width, h = (int)d->cinfo.output_height;
    int comps = d->cinfo.output_components;
    d->rgb = pd_calloc((size_t)w * (size_t)h, 3);
    d->row = pd_malloc((size_t)w * (size_t)comps);
    if (!d->rgb || !d->row) {
        d->err = pd_error_wrap(PD_ENOMEM, "decoding a %d x %d JPEG", w, h);
        return -1;
    }
    while ((int)d->cinfo.output_scanline < h) {
        JSAMPROW rows[1] = {d->row};
        int y = (int)d->cinfo.output_scanline;
        if (jpeg_read_scanlines(&d->cinfo, rows, 1) != 1) {
            d->fail.truncated = true; /* cannot happen with a memory source; be safe */
            return -1;
        }
        jpeg_row_to_rgb(d->row, d->rgb + (size_t)y * w * 3, w, comps);
    }
    /* no jpeg_finish_decompress: the pixels are complete, a missing EOI is no error (Pillow) */
    return 0;
}

/* libjpeg's errors and messages routed to d (a longjmp to d->fail.jump, never a print). */
static void jpeg_errors_to(struct jpeg_decode *d) {
    d->cinfo.err = jpeg_std_error(&d->fail.pub);
    d->fail.pub.error_exit = jpeg_on_error;
    d->fail.pub.emit_message = jpeg_on_message;
    d->fail.pub.output_message = jpeg_on_output;
}

static int jpeg_decode(const uint8_t *data, size_t len, uint64_t max_pixels, struct pd_image *out) {
    struct jpeg_decode d = {0};
    jpeg_errors_to(&d);

    int rc = PD_OK;
    if (jpeg_decode_run(&d, data, len, max_pixels) != 0) {
        if (d.err != PD_OK)
            rc = d.err;
        else if (d.fail.truncated)
            rc = pd_errorf(PD_EFORMAT, "JPEG image is truncated: the data ends after %zu bytes",
                           len);
        else
            rc = pd_errorf(PD_EFORMAT, "JPEG image is broken: %s", d.fail.msg);
    }
    if (rc == PD_OK) {
        int comps = d.cinfo.num_components;
        *out = (struct pd_image){.width = (int)d.cinfo.output_width,
                                 .height = (int)d.cinfo.output_height,
                                 .rgb = d.rgb,
                                 .format = PD_IMAGE_FORMAT_JPEG,
                                 .color = comps == 1   ? PD_IMAGE_COLOR_GREY
                                          : comps == 4 ? PD_IMAGE_COLOR_CMYK
                                                       : PD_IMAGE_COLOR_RGB};
        d.rgb = NULL;
    }
    if (d.created)
        jpeg_destroy_decompress(&d.cinfo);
    pd_free(d.row);
    pd_free(d.rgb);
    return rc;
}

/* JPEG's size from its header alone (libjpeg's jpeg_read_header: no scanline decoded). */
static int jpeg_probe(const uint8_t *data, size_t len, int *width, int *height) {
    struct jpeg_decode d = {0};
    jpeg_errors_to(&d);
    int rc = PD_OK;
    if (setjmp(d.fail.jump)) {
        rc = d.fail.truncated
                 ? pd_errorf(PD_EFORMAT, "JPEG image is truncated: the data ends after %zu bytes",
                             len)
                 : pd_errorf(PD_EFORMAT, "JPEG image is broken: %s", d.fail.msg);
    } else {
        jpeg_create_decompress(&d.cinfo);
        d.created = true;
        jpeg_mem_src(&d.cinfo, data, (unsigned long)len);
        jpeg_read_header(&d.cinfo, TRUE);
        *width = (int)d.cinfo.image_width;
        *height = (int)d.cinfo.image_height;
    }
    if (d.created)
        jpeg_destroy_decompress(&d.cinfo);
    return rc;
}

int pd_image_probe(const void *data, size_t len, const struct pd_image_decode_opts *opts,
                   int *width, int *height) {
    const uint8_t *p = data;
    int rc;
    if (!data || len == 0)
        return pd_errorf(PD_EFORMAT, "image is empty (0 bytes)");
    switch (pd_image_format_detect(data, len)) {
    case PD_IMAGE_FORMAT_PNG:
        if (len < 24 || memcmp(p + 12, "IHDR", 4) != 0)
            return pd_errorf(PD_EFORMAT, "PNG image is broken: no IHDR chunk first");
        rc = check_dimensions("PNG", be32(p + 16), be32(p + 20), effective_max_pixels(opts));
        if (rc == PD_OK) {
            *width = (int)be32(p + 16);
            *height = (int)be32(p + 20);
        }
        return rc;
    case PD_IMAGE_FORMAT_JPEG:
        if ((rc = jpeg_probe(p, len, width, height)) != PD_OK)
            return rc;
        return check_dimensions("JPEG", (uint64_t)*width, (uint64_t)*height,
                                effective_max_pixels(opts));
    default: break;
    }
    return pd_errorf(PD_EFORMAT, "the data is not a PNG or JPEG image (%zu bytes)", len);
}

/* ---- entry points ---- */

int pd_image_decode(const void *data, size_t len, const struct pd_image_decode_opts *opts,
                    struct pd_image *out) {
    PD_ASSERT(out);
    memset(out, 0, sizeof *out);
    if (!data || len == 0)
        return pd_errorf(PD_EFORMAT, "image is empty (0 bytes)");
    enum pd_image_alpha mode = opts ? opts->alpha : PD_IMAGE_ALPHA_ON_WHITE;
    uint64_t max_pixels = effective_max_pixels(opts);
    switch (pd_image_format_detect(data, len)) {
    case PD_IMAGE_FORMAT_PNG: return png_decode(data, len, max_pixels, mode, out);
    case PD_IMAGE_FORMAT_JPEG: return jpeg_decode(data, len, max_pixels, out);
    default: {
        const uint8_t *p = data;
        char head[3 * 8 + 1] = "";
        for (size_t i = 0; i < len && i < 8; i++)
            snprintf(head + 3 * i, sizeof head - 3 * i, "%02x ", p[i]);
        head[strlen(head) ? strlen(head) - 1 : 0] = '\0';
        return pd_errorf(PD_EFORMAT,
                         "not a PNG or JPEG image (%zu bytes starting %s); only PNG and JPEG "
                         "are supported",
                         len, head);
    }
    }
}

static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

int pd_base64_decode(const char *in, size_t len, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    uint8_t *buf = pd_malloc(len / 4 * 3 + 3);
    if (!buf)
        return pd_error_wrap(PD_ENOMEM, "decoding %zu bytes of base64", len);
    size_t n = 0, n_sym = 0, n_pad = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
            continue;
        if (c == '=') {
            n_pad++;
            continue;
        }
        int v = base64_value(c);
        if (v < 0 || n_pad > 0) {
            pd_free(buf);
            if (v < 0)
                return pd_errorf(PD_EINVAL,
                                 "broken base64: character 0x%02x at offset %zu is "
                                 "not in the base64 alphabet",
                                 c, i);
            return pd_errorf(PD_EINVAL, "broken base64: data after the '=' padding at offset %zu",
                             i);
        }
        acc = acc << 6 | (uint32_t)v;
        if (++n_sym % 4 == 0) {
            buf[n++] = (uint8_t)(acc >> 16);
            buf[n++] = (uint8_t)(acc >> 8);
            buf[n++] = (uint8_t)acc;
            acc = 0;
        }
    }
    size_t tail = n_sym % 4;
    if (tail == 1 || n_pad > 2 || (n_pad > 0 && (tail + n_pad) % 4 != 0)) {
        pd_free(buf);
        return pd_errorf(PD_EINVAL,
                         "broken base64: %zu symbols and %zu '=' do not make whole 4-symbol groups",
                         n_sym, n_pad);
    }
    if (tail == 2) {
        buf[n++] = (uint8_t)(acc >> 4);
    } else if (tail == 3) {
        buf[n++] = (uint8_t)(acc >> 10);
        buf[n++] = (uint8_t)(acc >> 2);
    }
    *out = buf;
    *out_len = n;
    return PD_OK;
}

static bool prefix_nocase(const char *s, size_t len, const char *prefix) {
    size_t n = strlen(prefix);
    if (len < n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)s[i]) != tolower((unsigned char)prefix[i]))
            return false;
    return true;
}

int pd_data_url_bytes(const char *url, size_t len, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (!prefix_nocase(url, len, "data:")) {
        size_t scheme = 0;
        while (scheme < len && scheme < 32 &&
               (isalnum((unsigned char)url[scheme]) || url[scheme] == '+' || url[scheme] == '-' ||
                url[scheme] == '.'))
            scheme++;
        if (scheme > 0 && scheme < len && url[scheme] == ':')
            return pd_errorf(PD_EUNSUPPORTED,
                             "image URL scheme '%.*s:' is not supported: only data: URLs with "
                             "base64 image bytes are (remote images are not fetched)",
                             (int)scheme, url);
        return pd_errorf(PD_EUNSUPPORTED, "image URL is not a data: URL (only base64 data: URLs "
                                          "are supported)");
    }
    const char *header = url + 5;
    const char *comma = memchr(header, ',', len - 5);
    if (!comma)
        return pd_errorf(PD_EINVAL, "data URL has no ',' before its data");
    size_t header_len = (size_t)(comma - header);
    const char *semi = memchr(header, ';', header_len);
    size_t type_len = semi ? (size_t)(semi - header) : header_len;
    if (type_len > 0 && !prefix_nocase(header, type_len, "image/"))
        return pd_errorf(PD_EUNSUPPORTED, "data URL media type '%.*s' is not an image",
                         (int)(type_len > 64 ? 64 : type_len), header);
    bool base64 = false;
    for (const char *p = semi; p && p < comma;) {
        const char *next = memchr(p + 1, ';', (size_t)(comma - p - 1));
        size_t plen = (size_t)((next ? next : comma) - (p + 1));
        if (plen == 6 && prefix_nocase(p + 1, plen, "base64"))
            base64 = true;
        p = next;
    }
    if (!base64)
        return pd_errorf(PD_EUNSUPPORTED, "data URL is not base64-encoded (';base64' missing)");

    int rc = pd_base64_decode(comma + 1, len - (size_t)(comma + 1 - url), out, out_len);
    return rc != PD_OK ? pd_error_wrap(rc, "image data URL") : PD_OK;
}

int pd_image_decode_data_url(const char *url, size_t len, const struct pd_image_decode_opts *opts,
                             struct pd_image *out) {
    PD_ASSERT(out);
    memset(out, 0, sizeof *out);
    uint8_t *bytes;
    size_t n_bytes;
    int rc = pd_data_url_bytes(url, len, &bytes, &n_bytes);
    if (rc != PD_OK)
        return rc;
    rc = pd_image_decode(bytes, n_bytes, opts, out);
    pd_free(bytes);
    return rc;
}
