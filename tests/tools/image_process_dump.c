/*
 * image_process_dump.c — test driver of model/vision/ for tests/python/test_image_processor_hf.py
 * (not a product binary): runs one stage on one image file and writes its output raw, so the
 * Python test can hold it against Pillow and transformers.
 *
 *   image_process_dump decode  IMAGE OUT [drop]          RGB8 bytes [h][w][3]
 *   image_process_dump resize  IMAGE OUT WIDTH HEIGHT FILTER   RGB8 of Pillow's resize
 *   image_process_dump process IMAGE OUT CONFIG.json     pixel_values f32 [rows][cols]
 *
 * It prints one JSON line on stdout: {"width": .., "height": .., "color": "..", "grid_thw":
 * [t, h, w], "rows": .., "cols": ..} (the last three only for process). A failure prints the
 * error on stderr and exits 1, so the test can check error messages too.
 */
#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/status.h"
#include "model/vision/image_decode.h"
#include "model/vision/image_processor.h"
#include "model/vision/image_resample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: image_process_dump decode IMAGE OUT [drop]\n"
                    "       image_process_dump resize IMAGE OUT WIDTH HEIGHT FILTER\n"
                    "       image_process_dump process IMAGE OUT CONFIG.json\n");
    return 2;
}

static int fail(const char *what) {
    fprintf(stderr, "image_process_dump: %s: %s\n", what, pd_error_msg());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4)
        return usage();
    const char *stage = argv[1], *image_path = argv[2], *out_path = argv[3];
    struct pd_image_decode_opts opts = {.alpha = PD_IMAGE_ALPHA_ON_WHITE};
    if (strcmp(stage, "decode") == 0 && argc == 5 && strcmp(argv[4], "drop") == 0)
        opts.alpha = PD_IMAGE_ALPHA_DROP;
    else if (!((strcmp(stage, "decode") == 0 && argc == 4) ||
               (strcmp(stage, "resize") == 0 && argc == 7) ||
               (strcmp(stage, "process") == 0 && argc == 5)))
        return usage();

    char *bytes;
    size_t n_bytes;
    if (pd_file_read_all(image_path, &bytes, &n_bytes) != PD_OK)
        return fail("reading the image");
    struct pd_image img;
    int rc = pd_image_decode(bytes, n_bytes, &opts, &img);
    pd_free(bytes);
    if (rc != PD_OK)
        return fail(image_path);

    if (strcmp(stage, "decode") == 0) {
        rc = pd_file_write_all(out_path, img.rgb, (size_t)img.width * img.height * 3);
        printf("{\"width\": %d, \"height\": %d, \"color\": \"%s\"}\n", img.width, img.height,
               pd_image_color_name(img.color));
    } else if (strcmp(stage, "resize") == 0) {
        struct pd_image resized;
        rc = pd_image_resize(&img, atoi(argv[4]), atoi(argv[5]), (enum pd_resample)atoi(argv[6]),
                             &resized);
        if (rc == PD_OK) {
            rc = pd_file_write_all(out_path, resized.rgb,
                                   (size_t)resized.width * resized.height * 3);
            printf("{\"width\": %d, \"height\": %d, \"color\": \"%s\"}\n", resized.width,
                   resized.height, pd_image_color_name(resized.color));
            pd_image_free(&resized);
        }
    } else {
        struct pd_image_processor_config cfg;
        struct pd_image_patches patches;
        rc = pd_image_processor_config_load(argv[4], &cfg);
        if (rc == PD_OK)
            rc = pd_image_process(&cfg, &img, &patches);
        if (rc == PD_OK) {
            rc = pd_file_write_all(out_path, patches.pixel_values,
                                   (size_t)patches.n_rows * patches.row_len * sizeof(float));
            printf("{\"width\": %d, \"height\": %d, \"color\": \"%s\", \"grid_thw\": [%d, %d, "
                   "%d], \"rows\": %d, \"cols\": %d}\n",
                   img.width, img.height, pd_image_color_name(img.color), patches.grid_t,
                   patches.grid_h, patches.grid_w, patches.n_rows, patches.row_len);
            pd_image_patches_free(&patches);
        }
    }
    pd_image_free(&img);
    return rc == PD_OK ? 0 : fail(stage);
}
