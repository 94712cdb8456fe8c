/*
 * image_decode.h — PNG and JPEG bytes (or a base64 data: URL holding them) to 8-bit RGB pixels,
 * the pixels Hugging Face's image processors see for the same file.
 *
 * The reference is what transformers does with a PIL image: Image.open() (Pillow's own mode for
 * each PNG colour type and bit depth, libjpeg-turbo for JPEG), then, with do_convert_rgb,
 * transformers' convert_to_rgb: an image with an alpha channel or a tRNS transparency is composited
 * onto opaque white (PIL.Image.alpha_composite), every other one goes through Image.convert("RGB")
 * (grey replicated, palette looked up, 16-bit grey clipped at 255, CMYK by Pillow's formula).
 * PD_IMAGE_ALPHA_DROP gives plain Image.convert("RGB") instead (alpha ignored, not composited).
 *
 * Every failure is a status with a message naming the problem (not an image, truncated, 0 pixels
 * wide, over the caller's pixel limit, broken base64); libpng's and libjpeg's errors are caught
 * and never print or abort. The pixel limit is checked from the header, before any pixel buffer
 * is allocated.
 */
#ifndef PD_IMAGE_DECODE_H
#define PD_IMAGE_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum pd_image_format {
    PD_IMAGE_FORMAT_UNKNOWN = 0,
    PD_IMAGE_FORMAT_PNG,
    PD_IMAGE_FORMAT_JPEG,
};

/* What the file held, as Pillow would name its mode (before any conversion). */
enum pd_image_color {
    PD_IMAGE_COLOR_GREY,       /* PNG grey (any depth), JPEG 1 component: PIL "1", "L", "I;16" */
    PD_IMAGE_COLOR_GREY_ALPHA, /* PNG grey + alpha: PIL "LA" (8-bit) or "RGBA" (16-bit) */
    PD_IMAGE_COLOR_PALETTE,    /* PNG indexed: PIL "P" */
    PD_IMAGE_COLOR_RGB,        /* PNG truecolour, JPEG 3 components: PIL "RGB" */
    PD_IMAGE_COLOR_RGBA,       /* PNG truecolour + alpha: PIL "RGBA" */
    PD_IMAGE_COLOR_CMYK,       /* JPEG 4 components: PIL "CMYK" */
};

/* How transparency becomes RGB. */
enum pd_image_alpha {
    PD_IMAGE_ALPHA_ON_WHITE = 0, /* transformers' convert_to_rgb: composite over opaque white */
    PD_IMAGE_ALPHA_DROP,         /* PIL Image.convert("RGB"): keep the colour, ignore the alpha */
};

/* Limit when the caller gives none: 16384 × 16384, far above any max_pixels a processor resizes
 * to, and 768 MiB of RGB. */
#define PD_IMAGE_DEFAULT_MAX_PIXELS ((uint64_t)16384 * 16384)

struct pd_image_decode_opts {
    uint64_t max_pixels; /* width × height above this is refused; 0 = PD_IMAGE_DEFAULT_MAX_PIXELS */
    enum pd_image_alpha alpha;
};

/* A decoded image, owned by the caller: pd_image_free releases rgb. */
struct pd_image {
    int width;    /* pixels, > 0 */
    int height;   /* pixels, > 0 */
    uint8_t *rgb; /* [height][width][3] R, G, B, rows without padding */
    enum pd_image_format format;
    enum pd_image_color color;
    bool transparency; /* the file had an alpha channel or a tRNS chunk */
};

/* The format named by the leading magic bytes, PD_IMAGE_FORMAT_UNKNOWN when neither. */
enum pd_image_format pd_image_format_detect(const void *data, size_t len);

/* Decodes a PNG or JPEG held in memory (data is only read). opts may be NULL (the defaults).
 * On failure *out is left zeroed and nothing is allocated. */
int pd_image_decode(const void *data, size_t len, const struct pd_image_decode_opts *opts,
                    struct pd_image *out);

/* An image's width and height from its header alone (PNG's IHDR, JPEG's frame header), with
 * the same pixel limit and format errors as pd_image_decode; the rest of the file is not read,
 * so a file broken after its header probes fine and fails only when decoded. */
int pd_image_probe(const void *data, size_t len, const struct pd_image_decode_opts *opts,
                   int *width, int *height);

/* Decodes "data:image/png;base64,...." (any image/ media type; the bytes' magic decides the
 * format). Another scheme (http:, https:, file:, ...) is PD_EUNSUPPORTED with a message saying
 * only data: URLs are taken; a data URL that is not base64 or whose base64 is broken is
 * PD_EINVAL. url need not be NUL-terminated. */
int pd_image_decode_data_url(const char *url, size_t len, const struct pd_image_decode_opts *opts,
                             struct pd_image *out);

/* The bytes of a base64 data: URL with an image/ media type (or none), checked as
 * pd_image_decode_data_url checks them, into a new buffer (caller pd_frees). */
int pd_data_url_bytes(const char *url, size_t len, uint8_t **out, size_t *out_len);

/* Standard base64 (RFC 4648 alphabet, '=' padding optional, ASCII whitespace skipped) into a new
 * buffer *out of *out_len bytes (caller pd_frees; never NULL on success, even when empty). A
 * character outside the alphabet or a bad length is PD_EINVAL naming its offset. */
int pd_base64_decode(const char *in, size_t len, uint8_t **out, size_t *out_len);

/* Frees img's pixels and zeroes it; accepts NULL and a zeroed image. */
void pd_image_free(struct pd_image *img);

/* Short name of a format ("PNG", "JPEG", "unknown") and of a colour ("grey", "palette", ...). */
const char *pd_image_format_name(enum pd_image_format f);
const char *pd_image_color_name(enum pd_image_color c);

#endif
