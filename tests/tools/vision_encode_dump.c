/*
 * vision_encode_dump.c — test driver of model/vision/'s encoder for tests/python/test_vision_hf.py
 * (not a product binary): loads a Qwen2-VL / Qwen2.5-VL directory's vision encoder and image
 * processor on the cpu backend, runs each image file through both, and writes the embeddings raw.
 *
 *   vision_encode_dump MODEL_DIR OUT_PREFIX IMAGE...   OUT_PREFIX.<i>.f32: [tokens][out_dim] f32
 *
 * It prints one JSON line per image on stdout: {"grid_thw": [t, h, w], "tokens": .., "dim": ..}.
 * A failure prints the error on stderr and exits 1, so the test can check error messages too.
 */
#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/status.h"
#include "model/backend.h"
#include "model/safetensors.h"
#include "model/vision/image_decode.h"
#include "model/vision/image_processor.h"
#include "model/vision/vision_encoder.h"

#include <stdio.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "vision_encode_dump: %s: %s\n", what, pd_error_msg());
    return 1;
}

/* One image file → its embeddings in OUT_PREFIX.<i>.f32. */
static int encode_one(struct pd_vision_encoder *enc, const struct pd_image_processor_config *pc,
                      const char *path, const char *prefix, int i) {
    char *bytes;
    size_t n_bytes;
    if (pd_file_read_all(path, &bytes, &n_bytes) != PD_OK)
        return fail(path);
    struct pd_image_decode_opts dopts = {.alpha = PD_IMAGE_ALPHA_ON_WHITE};
    struct pd_image img;
    int rc = pd_image_decode(bytes, n_bytes, &dopts, &img);
    pd_free(bytes);
    if (rc != PD_OK)
        return fail(path);
    struct pd_image_patches p;
    rc = pd_image_process(pc, &img, &p);
    pd_image_free(&img);
    if (rc != PD_OK)
        return fail(path);
    const struct pd_vision_config *vc = pd_vision_encoder_config(enc);
    int64_t tokens = pd_vision_tokens(vc, p.grid_t, p.grid_h, p.grid_w);
    float *emb = pd_malloc((size_t)tokens * (size_t)vc->out_dim * sizeof(float));
    rc = emb ? pd_vision_encode(enc, &p, emb) : PD_ENOMEM;
    char out[4096];
    snprintf(out, sizeof(out), "%s.%d.f32", prefix, i);
    if (rc == PD_OK)
        rc = pd_file_write_all(out, emb, (size_t)tokens * (size_t)vc->out_dim * sizeof(float));
    if (rc == PD_OK)
        printf("{\"grid_thw\": [%d, %d, %d], \"tokens\": %lld, \"dim\": %d}\n", p.grid_t, p.grid_h,
               p.grid_w, (long long)tokens, vc->out_dim);
    pd_free(emb);
    pd_image_patches_free(&p);
    return rc == PD_OK ? 0 : fail(path);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: vision_encode_dump MODEL_DIR OUT_PREFIX IMAGE...\n");
        return 2;
    }
    const char *dir = argv[1];
    char path[4096];
    snprintf(path, sizeof(path), "%s/preprocessor_config.json", dir);
    struct pd_image_processor_config pc;
    struct pd_vision_config vc;
    if (pd_image_processor_config_load(path, &pc) != PD_OK)
        return fail(path);
    if (pd_vision_config_load(dir, &vc) != PD_OK)
        return fail(dir);
    struct pd_checkpoint *ck;
    if (pd_checkpoint_open(dir, &ck) != PD_OK)
        return fail(dir);
    struct pd_backend *be;
    struct pd_backend_opts bopts = {.kind = PD_BACKEND_CPU};
    if (pd_backend_new(&bopts, &be) != PD_OK)
        return fail("cpu backend");
    int64_t max_patches = pc.max_pixels / ((int64_t)pc.patch_size * pc.patch_size);
    struct pd_vision_encoder_opts eopts = {.max_patches = (int)max_patches};
    struct pd_vision_encoder *enc;
    if (pd_vision_encoder_new(be, &vc, ck, &eopts, &enc) != PD_OK)
        return fail("the vision encoder");
    int rc = 0;
    for (int i = 3; i < argc && rc == 0; i++)
        rc = encode_one(enc, &pc, argv[i], argv[2], i - 3);
    pd_vision_encoder_free(enc);
    pd_backend_free(be);
    pd_checkpoint_free(ck);
    return rc;
}
