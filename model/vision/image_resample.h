/*
 * image_resample.h — resizing RGB8 images exactly as Pillow's Image.resize does for 8-bit
 * images: the same filters, support widened by the downscale factor, coefficients normalised
 * per output pixel and rounded to fixed point, a horizontal then a vertical pass through an 8-bit
 * intermediate. Hugging Face's PIL image processors resize with it, so the model sees these
 * pixels; bit-equality with Pillow is what tests/python/test_image_processor_hf.py checks.
 *
 * NEAREST (0) is not here: Pillow takes another path for it (an affine transform) that no
 * Qwen-VL processor uses; it is refused as unsupported.
 */
#ifndef PD_IMAGE_RESAMPLE_H
#define PD_IMAGE_RESAMPLE_H

#include <stdbool.h>

#include "model/vision/image_decode.h"

/* Pillow's filter numbers (PIL.Image.Resampling): the "resample" of preprocessor_config.json. */
enum pd_resample {
    PD_RESAMPLE_NEAREST = 0,
    PD_RESAMPLE_LANCZOS = 1,
    PD_RESAMPLE_BILINEAR = 2,
    PD_RESAMPLE_BICUBIC = 3,
    PD_RESAMPLE_BOX = 4,
    PD_RESAMPLE_HAMMING = 5,
};

/* True for the filters pd_image_resize implements (LANCZOS, BILINEAR, BICUBIC, BOX, HAMMING). */
bool pd_resample_supported(int filter);

/* "BICUBIC", ...; "unknown" for other numbers. */
const char *pd_resample_name(int filter);

/* Resizes in to width × height (both > 0) into a new image *out (pd_image_free), copying format
 * and colour. The same size is a copy, as in Pillow. */
int pd_image_resize(const struct pd_image *in, int width, int height, enum pd_resample filter,
                    struct pd_image *out);

#endif
