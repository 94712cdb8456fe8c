/*
 * daemon_images.c — a request's images on the loop thread (issue 18): each image string (a
 * data: URL, or raw base64 from /generate's image_data) is decoded (model/vision/image_decode.h,
 * PNG or JPEG, pixel count bounded from the header), run through the model's image processor
 * (preprocessor_config.json) and hashed (SHA-256 of its grid and pixel values: the embedding
 * cache's key); the tokenized prompt's placeholders are expanded and its M-RoPE positions
 * planned (model/vision/vision_prompt.h). The compute thread then only encodes (prefill,
 * colocated) and places the embeddings.
 *
 * The expanded placeholders carry ids drawn from their image's hash (SGLang pads image tokens
 * with its hash the same way): the embeddings replace those rows anyway, and the prefix cache,
 * keyed by token ids, then tells two prompts that differ only in an image apart.
 */
#include "common/daemon_internal.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "model/model_config.h"
#include "model/tokenizer/tokenizer.h"
#include "model/vision/image_decode.h"
#include "model/vision/image_processor.h"
#include "model/vision/vision_encoder.h"
#include "model/vision/vision_prompt.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#define MIN_IMAGE_SIDE                                                                             \
    4 /* smaller sides are refused (transformers misreads 1- and 3-pixel ones)                     \
       */

struct pd_daemon_vision {
    struct pd_model_config lm;
    struct pd_vision_config vc;
    struct pd_image_processor_config pc;
};

int pd__daemon_vision_new(struct pd_daemon_state *d) {
    struct pd_model_config lm;
    int rc = pd_model_config_load(d->args.model_path, &lm);
    if (rc || lm.vl == PD_VL_NONE)
        return rc;
    struct pd_daemon_vision *v = pd_calloc(1, sizeof(*v));
    if (!v)
        return PD_ENOMEM;
    char path[4096];
    snprintf(path, sizeof(path), "%s/preprocessor_config.json", d->args.model_path);
    v->lm = lm;
    if ((rc = pd_vision_config_load(d->args.model_path, &v->vc)) ||
        (rc = pd_image_processor_config_load(path, &v->pc))) {
        pd_free(v);
        return pd_error_wrap(rc, "the image processor of %s", d->args.model_path);
    }
    if (v->pc.merge_size != v->vc.spatial_merge_size || v->pc.patch_size != v->vc.patch_size ||
        v->pc.temporal_patch_size != v->vc.temporal_patch_size) {
        pd_free(v);
        return pd_errorf(PD_EMISMATCH,
                         "%s: preprocessor_config.json (patch %d, temporal %d, merge %d) does not "
                         "fit the vision encoder (%d, %d, %d)",
                         d->args.model_path, v->pc.patch_size, v->pc.temporal_patch_size,
                         v->pc.merge_size, v->vc.patch_size, v->vc.temporal_patch_size,
                         v->vc.spatial_merge_size);
    }
    d->vision = v;
    return PD_OK;
}

void pd__daemon_vision_free(struct pd_daemon_state *d) {
    pd_free(d->vision);
    d->vision = NULL;
}

static int bad(struct pd_api_error *e, int k, const char *what) {
    char param[32];
    snprintf(param, sizeof(param), "image %d", k);
    pd_api_error_set(e, 400, "invalid_request_error", param, NULL, "image %d: %s", k, what);
    return PD_EINVAL;
}

/* One image string → its patches and content hash. */
static int load_image(const struct pd_daemon_vision *v, const char *s, int k,
                      struct pd_image_patches *p, uint8_t hash[16], struct pd_api_error *e) {
    struct pd_image img;
    struct pd_image_decode_opts o = {.alpha = PD_IMAGE_ALPHA_ON_WHITE};
    int rc;
    if (strncmp(s, "data:", 5) == 0) {
        rc = pd_image_decode_data_url(s, strlen(s), &o, &img);
    } else { /* generate's raw base64 */
        uint8_t *bytes;
        size_t n;
        rc = pd_base64_decode(s, strlen(s), &bytes, &n);
        if (rc == PD_OK) {
            rc = pd_image_decode(bytes, n, &o, &img);
            pd_free(bytes);
        } else {
            rc = pd_error_wrap(rc, "its base64");
        }
    }
    if (rc)
        return rc == PD_ENOMEM ? rc : bad(e, k, pd_error_msg());
    if (img.width < MIN_IMAGE_SIDE || img.height < MIN_IMAGE_SIDE) {
        char msg[96];
        snprintf(msg, sizeof(msg), "%d x %d pixels is too small (at least %d on each side)",
                 img.width, img.height, MIN_IMAGE_SIDE);
        pd_image_free(&img);
        return bad(e, k, msg);
    }
    rc = pd_image_process(&v->pc, &img, p);
    pd_image_free(&img);
    if (rc)
        return rc == PD_ENOMEM ? rc : bad(e, k, pd_error_msg());
    int32_t grid[4] = {p->grid_t, p->grid_h, p->grid_w, p->row_len};
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned md_len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
              EVP_DigestUpdate(ctx, grid, sizeof(grid)) &&
              EVP_DigestUpdate(ctx, p->pixel_values,
                               (size_t)p->n_rows * (size_t)p->row_len * sizeof(float)) &&
              EVP_DigestFinal_ex(ctx, md, &md_len) && md_len >= 16;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        pd_image_patches_free(p);
        return pd_errorf(PD_EINTERNAL, "hashing an image (SHA-256) failed");
    }
    memcpy(hash, md, 16);
    return PD_OK;
}

/* The id the i-th placeholder of an image with this hash carries (splitmix64 of hash and i). */
static int32_t placeholder_id(const uint8_t hash[16], int32_t i, int vocab) {
    uint64_t x;
    memcpy(&x, hash, sizeof(x));
    x += (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (int32_t)(x % (uint64_t)vocab);
}

int pd__daemon_prepare_images(struct pd_daemon_state *d, struct pd_api_request *api,
                              struct pd_token_ids *ids, struct pd_engine_mm **out,
                              struct pd_api_error *e) {
    *out = NULL;
    const struct pd_daemon_vision *v = d->vision;
    int n = api->n_images, rc = PD_OK;
    PD_ASSERT(v && n > 0 && n <= PD_ENGINE_MAX_IMAGES);
    if (api->return_logprob && api->logprob_start_len >= 0) {
        pd_api_error_set(e, 400, "invalid_request_error", "logprob_start_len", NULL,
                         "prompt logprobs are not computed for prompts with images");
        return PD_EINVAL;
    }
    struct pd_engine_mm *mm = pd_calloc(1, sizeof(*mm));
    int(*grids)[3] = pd_calloc((size_t)n, sizeof(*grids));
    struct pd_vision_prompt vp = {0};
    if (!mm || !grids || !(mm->images = pd_calloc((size_t)n, sizeof(*mm->images)))) {
        rc = PD_ENOMEM;
        goto out;
    }
    mm->n_images = n;
    for (int k = 0; k < n; k++) {
        struct pd_engine_image *im = &mm->images[k];
        if (!(im->patches = pd_calloc(1, sizeof(*im->patches)))) {
            rc = PD_ENOMEM;
            goto out;
        }
        if ((rc = load_image(v, api->images[k], k, im->patches, im->hash, e)) != PD_OK) {
            pd_free(im->patches);
            im->patches = NULL;
            goto out;
        }
        grids[k][0] = im->patches->grid_t;
        grids[k][1] = im->patches->grid_h;
        grids[k][2] = im->patches->grid_w;
    }
    if ((rc = pd_vision_prompt_build(&v->lm, v->vc.spatial_merge_size, ids->ids, (int)ids->n,
                                     (const int(*)[3])grids, n, &vp)) != PD_OK) {
        if (rc != PD_ENOMEM) {
            pd_api_error_set(e, 400, "invalid_request_error", "messages", NULL, "%s",
                             pd_error_msg());
            rc = PD_EINVAL;
        }
        goto out;
    }
    /* the expanded prompt, each image's placeholders carrying ids from its hash */
    if ((rc = pd_array_grow((void **)&ids->ids, &ids->cap, (size_t)vp.n, sizeof(int32_t))))
        goto out;
    memcpy(ids->ids, vp.ids, (size_t)vp.n * sizeof(int32_t));
    ids->n = (size_t)vp.n;
    for (int k = 0; k < n; k++) {
        struct pd_engine_image *im = &mm->images[k];
        im->start = vp.img_start[k];
        im->n_tokens = vp.img_tokens[k];
        for (int32_t i = 0; i < im->n_tokens; i++)
            ids->ids[im->start + i] = placeholder_id(im->hash, i, v->lm.vocab_size);
        if (!d->role->encodes_images) { /* the decode side of PD places, never encodes */
            pd_image_patches_free(im->patches);
            pd_free(im->patches);
            im->patches = NULL;
        }
    }
    mm->mpos = vp.mpos;
    vp.mpos = NULL;
    mm->pos_delta = vp.pos_delta;
out:
    pd_vision_prompt_free(&vp);
    pd_free(grids);
    if (rc) {
        pd_engine_mm_free(mm);
        return rc;
    }
    *out = mm;
    return PD_OK;
}
