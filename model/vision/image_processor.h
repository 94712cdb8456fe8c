/*
 * image_processor.h — the Qwen2-VL / Qwen2.5-VL image processor (transformers'
 * Qwen2VLImageProcessor, its PIL backend): preprocessor_config.json, smart_resize, Pillow's
 * resize, rescale and normalise, and the patch layout the vision encoder reads.
 *
 * For one RGB8 image (image_decode.h) it makes what the Hugging Face processor returns for the
 * same PIL image: pixel_values [grid_t · grid_h · grid_w][3 · temporal_patch · patch · patch]
 * f32 and grid_thw. A still image is one temporal group: the frame repeated temporal_patch_size
 * times, grid_t = 1. Rows go merge window by merge window (the merge_size × merge_size patches
 * the encoder merges into one token are consecutive), each row channel-major, then the repeated
 * frame, then the patch's rows and columns.
 */
#ifndef PD_IMAGE_PROCESSOR_H
#define PD_IMAGE_PROCESSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/vision/image_decode.h"
#include "model/vision/image_resample.h"

/* preprocessor_config.json as Qwen2VLImageProcessor reads it. */
struct pd_image_processor_config {
    int64_t
        min_pixels; /* size.shortest_edge, or min_pixels when given: fewest pixels after resize */
    int64_t max_pixels; /* size.longest_edge, or max_pixels when given: most pixels after resize */
    int patch_size;     /* pixels a patch is wide and high */
    int temporal_patch_size; /* frames a patch spans (a still image is repeated to fill them) */
    int merge_size;          /* patches merged per side into one token */
    double image_mean[3];    /* per channel, in rescaled units */
    double image_std[3];
    double rescale_factor; /* 1/255 */
    bool do_resize, do_rescale, do_normalize, do_convert_rgb;
    enum pd_resample resample;
};

/* Qwen2VLImageProcessor's defaults (what an absent key means). */
void pd_image_processor_config_default(struct pd_image_processor_config *cfg);

/* Parses the JSON text of a preprocessor_config.json (json need not be NUL-terminated); src names
 * it in messages. Missing required keys (image_processor_type), wrong types, values out of range
 * and processors other than Qwen2VLImageProcessor are errors naming the key. *out is written only
 * on success. */
int pd_image_processor_config_parse(const char *json, size_t len, const char *src,
                                    struct pd_image_processor_config *out);

/* preprocessor_config.json text for cfg as transformers writes it for Qwen2VLImageProcessor
 * (size and the older min_pixels / max_pixels both, processor_class Qwen2VLProcessor); it parses
 * back to cfg. The caller frees it with pd_free; NULL with the error set when memory runs out. */
char *pd_image_processor_config_to_json(const struct pd_image_processor_config *cfg);

/* Reads and parses path. */
int pd_image_processor_config_load(const char *path, struct pd_image_processor_config *out);

/* transformers' smart_resize: the size nearest (height, width) whose sides are multiples of
 * factor and whose area is within [min_pixels, max_pixels], computed with the same roundings
 * (Python's round-half-even, then floor or ceil of the rescaled sides). An aspect ratio above
 * 200 is PD_ERANGE, as in transformers. */
int pd_image_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels,
                          int *out_height, int *out_width);

/* The processor's output for one image; pd_image_patches_free releases it. */
struct pd_image_patches {
    int grid_t, grid_h, grid_w; /* in patches */
    int n_rows;                 /* grid_t · grid_h · grid_w */
    int row_len;                /* 3 · temporal_patch_size · patch_size² */
    float *pixel_values;        /* [n_rows][row_len] f32 */
};

/* The grid pd_image_process makes of an image of width x height pixels, without its pixels
 * (what the decode side of PD needs to place an image it does not encode). */
int pd_image_grid(const struct pd_image_processor_config *cfg, int width, int height, int *grid_t,
                  int *grid_h, int *grid_w);

/* Runs the processor on img. With do_convert_rgb false, an image that was not plain RGB in its
 * file (grey, palette, alpha, CMYK) is refused: transformers would hand the model another number
 * of channels. */
int pd_image_process(const struct pd_image_processor_config *cfg, const struct pd_image *img,
                     struct pd_image_patches *out);

void pd_image_patches_free(struct pd_image_patches *p);

#endif
