/*
 * image_processor.c — Qwen2VLImageProcessor (transformers 5.x, PIL backend) in C: the config,
 * smart_resize, then rescale, normalise and patchify with the arithmetic transformers does.
 *
 * The numbers must be transformers' to the bit, so each step copies its precision, not just its
 * formula: smart_resize in doubles as Python computes it (round-half-even of height / factor,
 * floor/ceil of the side divided or multiplied by beta); rescale as numpy does it, the uint8
 * pixel widened to double, multiplied by rescale_factor, narrowed to float; normalise in float
 * ((x - mean) / std with mean and std narrowed to float, no fused multiply-add: the build is
 * strict C11, which keeps -ffp-contract off). A pixel's value depends only on its channel and its
 * byte, so both steps are a 3 × 256 table computed once per image.
 *
 * Config keys follow Qwen2VLImageProcessor.__init__: "size" {"shortest_edge", "longest_edge"}
 * (what transformers 5 writes) with the older top-level "min_pixels"/"max_pixels" overriding it;
 * an absent key takes the class default, null counts as absent. Unknown keys are ignored, as
 * transformers ignores them. Video options are not read here.
 */
#include "model/vision/image_processor.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/json_keys.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Bounds far above any real processor, low enough that no product of them overflows. */
#define MAX_PATCH_SIZE 1024
#define MAX_TEMPORAL_PATCH 64
#define MAX_MERGE_SIZE 64
#define MAX_PROCESSOR_PIXELS ((int64_t)1 << 30)

/* The processors whose arithmetic this file reproduces (transformers 5 names the PIL one with
 * "Pil"; older configs name "Qwen2VLImageProcessor", and Qwen3-VL's the torchvision "Fast" one,
 * which resizes with torch's antialiased kernels, close to but not bit-equal with Pillow). */
static const char *const accepted_types[] = {"Qwen2VLImageProcessor", "Qwen2VLImageProcessorPil",
                                             "Qwen2VLImageProcessorFast"};

void pd_image_processor_config_default(struct pd_image_processor_config *cfg) {
    /* OPENAI_CLIP_MEAN / OPENAI_CLIP_STD of transformers' image_utils */
    *cfg = (struct pd_image_processor_config){
        .min_pixels = 56 * 56,
        .max_pixels = 28 * 28 * 1280,
        .patch_size = 14,
        .temporal_patch_size = 2,
        .merge_size = 2,
        .image_mean = {0.48145466, 0.4578275, 0.40821073},
        .image_std = {0.26862954, 0.26130258, 0.27577711},
        .rescale_factor = 1.0 / 255,
        .do_resize = true,
        .do_rescale = true,
        .do_normalize = true,
        .do_convert_rgb = true,
        .resample = PD_RESAMPLE_BICUBIC,
    };
}

/* ---- typed JSON access (common/base/json_keys.h); every message names the file and the key */

static int read_small_int(const char *src, const cJSON *obj, const char *key, int hi, int *out) {
    int64_t v = *out;
    int rc = pd_json_int(src, obj, key, 1, hi, &v);
    if (rc == PD_OK)
        *out = (int)v;
    return rc;
}

/* A list of 3 numbers, one per channel, or one number for all three (transformers takes both). */
static int read_channels(const char *src, const cJSON *obj, const char *key, bool nonzero,
                         double out[3]) {
    const cJSON *v = pd_json_key(obj, key);
    double vals[3];
    if (!v)
        return PD_OK;
    if (cJSON_IsNumber(v)) {
        vals[0] = vals[1] = vals[2] = v->valuedouble;
    } else if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) != 3)
            return pd_errorf(PD_EINVAL, "%s: key '%s' must list 3 values (R, G, B), got %d", src,
                             key, cJSON_GetArraySize(v));
        for (int c = 0; c < 3; c++) {
            const cJSON *e = cJSON_GetArrayItem(v, c);
            if (!cJSON_IsNumber(e))
                return pd_errorf(PD_EINVAL, "%s: key '%s' must list numbers, found %s", src, key,
                                 pd_json_kind(e));
            vals[c] = e->valuedouble;
        }
    } else {
        return pd_errorf(PD_EINVAL, "%s: key '%s' must be a list of 3 numbers, got %s", src, key,
                         pd_json_kind(v));
    }
    for (int c = 0; c < 3; c++) {
        if (!isfinite(vals[c]) || (nonzero && vals[c] == 0))
            return pd_errorf(PD_ERANGE, "%s: key '%s' value %d is %g, must be finite%s", src, key,
                             c, vals[c], nonzero ? " and not 0" : "");
        out[c] = vals[c];
    }
    return PD_OK;
}

static int check_processor_type(const char *src, const cJSON *root) {
    const cJSON *t = pd_json_key(root, "image_processor_type");
    if (!t)
        return pd_errorf(PD_EINVAL, "%s: missing required key 'image_processor_type'", src);
    if (!cJSON_IsString(t))
        return pd_errorf(PD_EINVAL, "%s: key 'image_processor_type' must be a string, got %s", src,
                         pd_json_kind(t));
    for (size_t i = 0; i < PD_ARRAY_LEN(accepted_types); i++)
        if (strcmp(t->valuestring, accepted_types[i]) == 0)
            return PD_OK;
    return pd_errorf(PD_EUNSUPPORTED,
                     "%s: image_processor_type '%s' is not supported (Qwen2VLImageProcessor is)",
                     src, t->valuestring);
}

static int parse_root(const char *src, const cJSON *root, struct pd_image_processor_config *c) {
    int rc;
    int64_t resample = c->resample;
    if ((rc = check_processor_type(src, root)) != PD_OK)
        return rc;

    /* size first, then the older min_pixels / max_pixels over it, as __init__ does */
    const cJSON *size = pd_json_key(root, "size");
    if (size) {
        if (!cJSON_IsObject(size))
            return pd_errorf(PD_EINVAL, "%s: key 'size' must be an object, got %s", src,
                             pd_json_kind(size));
        c->min_pixels = c->max_pixels = 0; /* a size object replaces the default one whole */
        if ((rc = pd_json_int(src, size, "shortest_edge", 1, MAX_PROCESSOR_PIXELS,
                              &c->min_pixels)) != PD_OK ||
            (rc = pd_json_int(src, size, "longest_edge", 1, MAX_PROCESSOR_PIXELS,
                              &c->max_pixels)) != PD_OK)
            return pd_error_wrap(rc, "in 'size'");
    }
    if ((rc = pd_json_int(src, root, "min_pixels", 1, MAX_PROCESSOR_PIXELS, &c->min_pixels)) !=
            PD_OK ||
        (rc = pd_json_int(src, root, "max_pixels", 1, MAX_PROCESSOR_PIXELS, &c->max_pixels)) !=
            PD_OK)
        return rc;
    if (c->min_pixels == 0 || c->max_pixels == 0)
        return pd_errorf(PD_EINVAL,
                         "%s: 'size' must give 'shortest_edge' and 'longest_edge' (or the file "
                         "'min_pixels' and 'max_pixels')",
                         src);
    if (c->min_pixels > c->max_pixels)
        return pd_errorf(PD_ERANGE, "%s: min_pixels %lld is above max_pixels %lld", src,
                         (long long)c->min_pixels, (long long)c->max_pixels);

    if ((rc = read_small_int(src, root, "patch_size", MAX_PATCH_SIZE, &c->patch_size)) != PD_OK ||
        (rc = read_small_int(src, root, "temporal_patch_size", MAX_TEMPORAL_PATCH,
                             &c->temporal_patch_size)) != PD_OK ||
        (rc = read_small_int(src, root, "merge_size", MAX_MERGE_SIZE, &c->merge_size)) != PD_OK ||
        (rc = read_channels(src, root, "image_mean", false, c->image_mean)) != PD_OK ||
        (rc = read_channels(src, root, "image_std", true, c->image_std)) != PD_OK ||
        (rc = pd_json_number(src, root, "rescale_factor", &c->rescale_factor)) != PD_OK ||
        (rc = pd_json_bool(src, root, "do_resize", &c->do_resize)) != PD_OK ||
        (rc = pd_json_bool(src, root, "do_rescale", &c->do_rescale)) != PD_OK ||
        (rc = pd_json_bool(src, root, "do_normalize", &c->do_normalize)) != PD_OK ||
        (rc = pd_json_bool(src, root, "do_convert_rgb", &c->do_convert_rgb)) != PD_OK ||
        (rc = pd_json_int(src, root, "resample", 0, 7, &resample)) != PD_OK)
        return rc;
    if (!pd_resample_supported((int)resample))
        return pd_errorf(PD_EUNSUPPORTED,
                         "%s: resample %d (%s) is not supported: LANCZOS (1), BILINEAR (2), "
                         "BICUBIC (3), BOX (4) and HAMMING (5) are",
                         src, (int)resample, pd_resample_name((int)resample));
    c->resample = (enum pd_resample)resample;
    return PD_OK;
}

int pd_image_processor_config_parse(const char *json, size_t len, const char *src,
                                    struct pd_image_processor_config *out) {
    struct pd_image_processor_config c;
    pd_image_processor_config_default(&c);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return pd_errorf(PD_EFORMAT, "%s: not valid JSON", src);
    int rc = cJSON_IsObject(root) ? parse_root(src, root, &c)
                                  : pd_errorf(PD_EFORMAT,
                                              "%s: top level must be a JSON object, "
                                              "got %s",
                                              src, pd_json_kind(root));
    cJSON_Delete(root);
    if (rc == PD_OK)
        *out = c;
    return rc;
}

int pd_image_processor_config_load(const char *path, struct pd_image_processor_config *out) {
    char *text;
    size_t len;
    int rc = pd_file_read_all(path, &text, &len);
    if (rc != PD_OK)
        return rc;
    rc = pd_image_processor_config_parse(text, len, path, out);
    pd_free(text);
    return rc;
}

char *pd_image_processor_config_to_json(const struct pd_image_processor_config *cfg) {
    cJSON *o = cJSON_CreateObject(), *size = cJSON_CreateObject();
    bool ok = o && size && cJSON_AddItemToObject(o, "size", size);
    if (!ok)
        cJSON_Delete(size);
    ok = ok && cJSON_AddNumberToObject(size, "shortest_edge", (double)cfg->min_pixels) &&
         cJSON_AddNumberToObject(size, "longest_edge", (double)cfg->max_pixels) &&
         cJSON_AddStringToObject(o, "image_processor_type", "Qwen2VLImageProcessor") &&
         cJSON_AddStringToObject(o, "processor_class", "Qwen2VLProcessor") &&
         cJSON_AddNumberToObject(o, "min_pixels", (double)cfg->min_pixels) &&
         cJSON_AddNumberToObject(o, "max_pixels", (double)cfg->max_pixels) &&
         cJSON_AddNumberToObject(o, "patch_size", cfg->patch_size) &&
         cJSON_AddNumberToObject(o, "temporal_patch_size", cfg->temporal_patch_size) &&
         cJSON_AddNumberToObject(o, "merge_size", cfg->merge_size) &&
         cJSON_AddItemToObject(o, "image_mean", cJSON_CreateDoubleArray(cfg->image_mean, 3)) &&
         cJSON_AddItemToObject(o, "image_std", cJSON_CreateDoubleArray(cfg->image_std, 3)) &&
         cJSON_AddNumberToObject(o, "rescale_factor", cfg->rescale_factor) &&
         cJSON_AddBoolToObject(o, "do_resize", cfg->do_resize) &&
         cJSON_AddBoolToObject(o, "do_rescale", cfg->do_rescale) &&
         cJSON_AddBoolToObject(o, "do_normalize", cfg->do_normalize) &&
         cJSON_AddBoolToObject(o, "do_convert_rgb", cfg->do_convert_rgb) &&
         cJSON_AddNumberToObject(o, "resample", (int)cfg->resample);
    char *text = ok ? cJSON_Print(o) : NULL, *copy = NULL;
    cJSON_Delete(o);
    if (text && (copy = pd_malloc(strlen(text) + 2))) {
        strcpy(copy, text);
        strcat(copy, "\n");
    }
    free(text); /* cJSON allocates with malloc */
    if (!copy)
        pd_errorf(PD_ENOMEM, "writing preprocessor_config.json");
    return copy;
}

/* ---- smart_resize ---- */

int pd_image_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels,
                          int *out_height, int *out_width) {
    PD_ASSERT(factor > 0 && min_pixels > 0 && max_pixels > 0);
    if (height <= 0 || width <= 0)
        return pd_errorf(PD_EINVAL, "image of %d x %d pixels cannot be resized", width, height);
    double ratio = (double)(height > width ? height : width) / (height > width ? width : height);
    if (ratio > 200)
        return pd_errorf(PD_ERANGE,
                         "image of %d x %d pixels: absolute aspect ratio must be smaller than "
                         "200, got %g",
                         width, height, ratio);
    /* Python's round() of a float is half-to-even, as rint in the default rounding mode */
    int64_t h_bar = (int64_t)rint((double)height / factor) * factor;
    int64_t w_bar = (int64_t)rint((double)width / factor) * factor;
    double area = (double)((int64_t)height * width); /* exact: below 2^53 */
    if (h_bar * w_bar > max_pixels) {
        double beta = sqrt(area / (double)max_pixels);
        h_bar = (int64_t)floor((double)height / beta / factor) * factor;
        w_bar = (int64_t)floor((double)width / beta / factor) * factor;
        h_bar = h_bar > factor ? h_bar : factor;
        w_bar = w_bar > factor ? w_bar : factor;
    } else if (h_bar * w_bar < min_pixels) {
        double beta = sqrt((double)min_pixels / area);
        h_bar = (int64_t)ceil((double)height * beta / factor) * factor;
        w_bar = (int64_t)ceil((double)width * beta / factor) * factor;
    }
    if (h_bar > INT32_MAX || w_bar > INT32_MAX)
        return pd_errorf(PD_ERANGE, "image of %d x %d pixels resizes to an impossible %lld x %lld",
                         width, height, (long long)w_bar, (long long)h_bar);
    *out_height = (int)h_bar;
    *out_width = (int)w_bar;
    return PD_OK;
}

/* ---- the processor ---- */

void pd_image_patches_free(struct pd_image_patches *p) {
    if (!p)
        return;
    pd_free(p->pixel_values);
    memset(p, 0, sizeof *p);
}

/* value[c][v]: what rescale then normalise make of byte v in channel c, in transformers' types */
static void value_table(const struct pd_image_processor_config *cfg, float table[3][256]) {
    for (int c = 0; c < 3; c++) {
        float mean = (float)cfg->image_mean[c], std = (float)cfg->image_std[c];
        for (int v = 0; v < 256; v++) {
            float x = cfg->do_rescale ? (float)((double)v * cfg->rescale_factor) : (float)v;
            if (cfg->do_normalize)
                x = (x - mean) / std;
            table[c][v] = x;
        }
    }
}

/* pixel_values in the encoder's order: merge window (block row, block column), patch within it
 * (row, column), then channel, repeated frame, pixel row and column within the patch. */
static void patchify(const struct pd_image *img, int patch, int temporal, int merge,
                     const float table[3][256], float *dst) {
    int grid_h = img->height / patch, grid_w = img->width / patch;
    size_t stride = (size_t)img->width * 3;
    for (int bh = 0; bh < grid_h / merge; bh++)
        for (int bw = 0; bw < grid_w / merge; bw++)
            for (int mh = 0; mh < merge; mh++)
                for (int mw = 0; mw < merge; mw++) {
                    const uint8_t *origin = img->rgb +
                                            (size_t)((bh * merge + mh) * patch) * stride +
                                            (size_t)((bw * merge + mw) * patch) * 3;
                    for (int c = 0; c < 3; c++)
                        for (int t = 0; t < temporal; t++)
                            for (int py = 0; py < patch; py++) {
                                const uint8_t *p = origin + (size_t)py * stride + c;
                                for (int px = 0; px < patch; px++)
                                    *dst++ = table[c][p[3 * px]];
                            }
                }
}

/* The size an image of width x height is processed at (smart_resize, or as it is). */
static int processed_size(const struct pd_image_processor_config *cfg, int width, int height,
                          int *out_w, int *out_h) {
    int factor = cfg->patch_size * cfg->merge_size;
    if (cfg->do_resize)
        return pd_image_smart_resize(height, width, factor, cfg->min_pixels, cfg->max_pixels, out_h,
                                     out_w);
    if (height % factor != 0 || width % factor != 0)
        return pd_errorf(PD_EINVAL,
                         "do_resize is false and the image is %d x %d pixels, not a multiple of "
                         "%d (patch_size x merge_size) on each side",
                         width, height, factor);
    *out_w = width;
    *out_h = height;
    return PD_OK;
}

int pd_image_grid(const struct pd_image_processor_config *cfg, int width, int height, int *grid_t,
                  int *grid_h, int *grid_w) {
    int w, h, rc = processed_size(cfg, width, height, &w, &h);
    if (rc)
        return rc;
    *grid_t = 1;
    *grid_h = h / cfg->patch_size;
    *grid_w = w / cfg->patch_size;
    return PD_OK;
}

int pd_image_process(const struct pd_image_processor_config *cfg, const struct pd_image *img,
                     struct pd_image_patches *out) {
    PD_ASSERT(cfg && img && img->rgb && out);
    memset(out, 0, sizeof *out);
    if (!cfg->do_convert_rgb && (img->color != PD_IMAGE_COLOR_RGB || img->transparency))
        return pd_errorf(
            PD_EUNSUPPORTED, "do_convert_rgb is false but the image is %s%s, not plain RGB",
            pd_image_color_name(img->color), img->transparency ? " with transparency" : "");
    struct pd_image resized = {0};
    const struct pd_image *src = img;
    int rc, w, h;
    if ((rc = processed_size(cfg, img->width, img->height, &w, &h)) != PD_OK)
        return rc;
    if (h != img->height || w != img->width) { /* Pillow's resize to the same size copies */
        if ((rc = pd_image_resize(img, w, h, cfg->resample, &resized)) != PD_OK)
            return rc;
        src = &resized;
    }

    int grid_h = src->height / cfg->patch_size, grid_w = src->width / cfg->patch_size;
    size_t row_len = (size_t)3 * cfg->temporal_patch_size * cfg->patch_size * cfg->patch_size;
    size_t n_rows = (size_t)grid_h * (size_t)grid_w;
    if (n_rows > INT32_MAX || row_len > INT32_MAX) {
        pd_image_free(&resized);
        return pd_errorf(PD_ERANGE, "image of %d x %d pixels makes too many patches", src->width,
                         src->height);
    }
    float *values = pd_calloc(n_rows * row_len, sizeof *values);
    if (!values) {
        pd_image_free(&resized);
        return pd_error_wrap(PD_ENOMEM, "pixel_values of %zu patches", n_rows);
    }
    float table[3][256];
    value_table(cfg, table);
    patchify(src, cfg->patch_size, cfg->temporal_patch_size, cfg->merge_size, table, values);
    pd_image_free(&resized);

    *out = (struct pd_image_patches){.grid_t = 1,
                                     .grid_h = grid_h,
                                     .grid_w = grid_w,
                                     .n_rows = (int)n_rows,
                                     .row_len = (int)row_len,
                                     .pixel_values = values};
    return PD_OK;
}
