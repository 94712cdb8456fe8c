/*
 * daemon_images.c — a request's images on the loop thread (issue 18): each image string (a
 * data: URL, or raw base64 from /generate's image_data) is decoded (model/vision/image_decode.h,
 * PNG or JPEG, pixel count bounded from the header), run through the model's image processor
 * (preprocessor_config.json) and hashed (SHA-256 of its grid and pixel values: the embedding
 * cache's key); the tokenized prompt's placeholders are expanded and its M-RoPE positions
 * planned (model/vision/vision_prompt.h). The compute thread then only encodes (prefill,
 * colocated) and places the embeddings.
 *
 * Loading (fetch, decode, process, hash) reads only the request and the daemon's settings, so a
 * request's images load on libuv's worker threads (common/daemon.c) and the loop never decodes a
 * large image itself; placing them in the prompt runs back on the loop. Remote URLs are fetched
 * only with --allow-image-urls, within --image-url-max-bytes and --image-url-timeout.
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

#include <curl/curl.h>
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
    /* libcurl's global state before any worker fetches (it is not thread-safe to make) */
    if (d->args.allow_image_urls && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        pd_free(v);
        return pd_errorf(PD_EINTERNAL, "--allow-image-urls: libcurl did not initialise");
    }
    d->vision = v;
    return PD_OK;
}

void pd__daemon_vision_free(struct pd_daemon_state *d) {
    if (d->vision && d->args.allow_image_urls)
        curl_global_cleanup();
    pd_free(d->vision);
    d->vision = NULL;
}

/* A load failure of image k: 400 with what, kept for the loop thread (this may run on a
 * worker). */
static int bad(struct pd_daemon_images *li, int k, const char *what) {
    li->status = 400;
    snprintf(li->err, sizeof(li->err), "image %d: %s", k, what);
    return PD_EINVAL;
}

/* A remote image's bytes (--allow-image-urls): http(s) only, at most max_bytes, within
 * timeout_s, redirects followed up to 3 times. */
struct fetch_buf {
    uint8_t *p;
    size_t n, cap, max;
};

static size_t fetch_write(char *data, size_t size, size_t nmemb, void *ud) {
    struct fetch_buf *b = ud;
    size_t n = size * nmemb;
    if (b->n + n > b->max || pd_array_grow((void **)&b->p, &b->cap, b->n + n, 1) != PD_OK)
        return 0; /* curl fails the transfer: too large (or no memory) */
    memcpy(b->p + b->n, data, n);
    b->n += n;
    return n;
}

static int fetch(const struct pd_daemon_state *d, const char *url, int k, struct fetch_buf *b,
                 struct pd_daemon_images *li) {
    CURL *c = curl_easy_init();
    if (!c)
        return bad(li, k, "could not start a fetch");
    b->max = (size_t)d->args.image_url_max_bytes;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 3L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(d->args.image_url_timeout * 1000));
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)(size_t)d->args.image_url_max_bytes);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, fetch_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    CURLcode cc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    char msg[256];
    if (cc == CURLE_WRITE_ERROR || cc == CURLE_FILESIZE_EXCEEDED)
        snprintf(msg, sizeof(msg), "%.80s is larger than --image-url-max-bytes (%zu)", url,
                 (size_t)d->args.image_url_max_bytes);
    else if (cc == CURLE_OPERATION_TIMEDOUT)
        snprintf(msg, sizeof(msg), "fetching %.80s took longer than --image-url-timeout (%g s)",
                 url, d->args.image_url_timeout);
    else if (cc != CURLE_OK)
        snprintf(msg, sizeof(msg), "fetching %.80s failed: %s", url, curl_easy_strerror(cc));
    else if (code != 200)
        snprintf(msg, sizeof(msg), "fetching %.80s: HTTP %ld", url, code);
    else
        return PD_OK;
    return bad(li, k, msg);
}

/* An image string's file bytes: a data: URL, an http(s) URL (fetched), or raw base64. */
static int image_bytes(const struct pd_daemon_state *d, const char *s, int k,
                       struct pd_daemon_images *li, uint8_t **bytes, size_t *n) {
    int rc;
    if (strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0) {
        struct fetch_buf b = {0};
        if ((rc = fetch(d, s, k, &b, li)) != PD_OK) {
            pd_free(b.p);
            return rc;
        }
        *bytes = b.p;
        *n = b.n;
        return PD_OK;
    }
    bool url = strncmp(s, "data:", 5) == 0;
    rc = url ? pd_data_url_bytes(s, strlen(s), bytes, n) : pd_base64_decode(s, strlen(s), bytes, n);
    if (rc && !url && rc != PD_ENOMEM)
        rc = pd_error_wrap(rc, "its base64");
    return rc && rc != PD_ENOMEM ? bad(li, k, pd_error_msg()) : rc;
}

/* One image string → its grid (and, where the encoder runs, its patches) and content hash:
 * SHA-256 of the file's bytes and the grid, which the decode side of PD computes alike from
 * the header alone (pd_image_probe), never decoding the pixels it would not use. */
static int load_image(const struct pd_daemon_state *d, const char *s, int k,
                      struct pd_image_patches *p, int grid[3], uint8_t hash[16],
                      struct pd_daemon_images *li) {
    const struct pd_daemon_vision *v = d->vision;
    struct pd_image_decode_opts o = {.alpha = PD_IMAGE_ALPHA_ON_WHITE,
                                     .max_pixels = PD_DAEMON_MAX_IMAGE_PIXELS};
    uint8_t *bytes = NULL;
    size_t n = 0;
    int rc = image_bytes(d, s, k, li, &bytes, &n), w = 0, h = 0;
    if (rc)
        return rc;
    struct pd_image img = {0};
    if (d->role->encodes_images) {
        rc = pd_image_decode(bytes, n, &o, &img);
        w = img.width;
        h = img.height;
    } else {
        rc = pd_image_probe(bytes, n, &o, &w, &h);
    }
    if (rc)
        goto out;
    if (w < MIN_IMAGE_SIDE || h < MIN_IMAGE_SIDE) {
        char msg[96];
        snprintf(msg, sizeof(msg), "%d x %d pixels is too small (at least %d on each side)", w, h,
                 MIN_IMAGE_SIDE);
        rc = bad(li, k, msg);
        goto out;
    }
    if (d->role->encodes_images) {
        if ((rc = pd_image_process(&v->pc, &img, p)) != PD_OK)
            goto out;
        grid[0] = p->grid_t, grid[1] = p->grid_h, grid[2] = p->grid_w;
    } else if ((rc = pd_image_grid(&v->pc, w, h, &grid[0], &grid[1], &grid[2])) != PD_OK) {
        goto out;
    }
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned md_len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
              EVP_DigestUpdate(ctx, grid, 3 * sizeof(int)) && EVP_DigestUpdate(ctx, bytes, n) &&
              EVP_DigestFinal_ex(ctx, md, &md_len) && md_len >= 16;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        pd_image_patches_free(p);
        li->status = 500;
        snprintf(li->err, sizeof(li->err), "hashing image %d (SHA-256) failed", k);
        rc = PD_EINTERNAL;
        goto out;
    }
    memcpy(hash, md, 16);
out:
    pd_image_free(&img);
    pd_free(bytes);
    if (rc && !li->status && rc != PD_ENOMEM)
        return bad(li, k, pd_error_msg());
    return rc;
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

int pd__daemon_load_images(const struct pd_daemon_state *d, const struct pd_api_request *api,
                           struct pd_daemon_images *li) {
    memset(li, 0, sizeof(*li));
    int n = api->n_images;
    PD_ASSERT(d->vision && n > 0 && n <= PD_ENGINE_MAX_IMAGES);
    li->p = pd_calloc((size_t)n, sizeof(*li->p));
    li->hash = pd_calloc((size_t)n, sizeof(*li->hash));
    li->grid = pd_calloc((size_t)n, sizeof(*li->grid));
    if (!li->p || !li->hash || !li->grid) {
        pd__daemon_images_free(li);
        li->status = 500;
        snprintf(li->err, sizeof(li->err), "out of memory preparing the request's images");
        return PD_ENOMEM;
    }
    li->n = n;
    for (int k = 0; k < n; k++) {
        int rc = load_image(d, api->images[k], k, &li->p[k], li->grid[k], li->hash[k], li);
        if (rc) {
            if (!li->status) {
                li->status = 500;
                snprintf(li->err, sizeof(li->err), "image %d: %s", k, pd_error_msg());
            }
            return rc;
        }
    }
    return PD_OK;
}

void pd__daemon_images_free(struct pd_daemon_images *li) {
    for (int k = 0; li->p && k < li->n; k++)
        pd_image_patches_free(&li->p[k]);
    pd_free(li->p);
    pd_free(li->hash);
    pd_free(li->grid);
    li->p = NULL;
    li->hash = NULL;
    li->grid = NULL;
    li->n = 0;
}

int pd__daemon_place_images(struct pd_daemon_state *d, struct pd_api_request *api,
                            struct pd_token_ids *ids, struct pd_daemon_images *li,
                            struct pd_engine_mm **out, struct pd_api_error *e) {
    *out = NULL;
    const struct pd_daemon_vision *v = d->vision;
    int n = li->n, rc = PD_OK;
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
    for (int k = 0; k < n; k++) { /* the patches (where loaded) move into the engine's images */
        struct pd_engine_image *im = &mm->images[k];
        if (li->p[k].pixel_values) {
            if (!(im->patches = pd_malloc(sizeof(*im->patches)))) {
                rc = PD_ENOMEM;
                goto out;
            }
            *im->patches = li->p[k];
            memset(&li->p[k], 0, sizeof(li->p[k]));
        }
        memcpy(im->hash, li->hash[k], sizeof(im->hash));
        memcpy(grids[k], li->grid[k], sizeof(grids[k]));
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
    }
    mm->mpos = vp.mpos;
    vp.mpos = NULL;
    mm->pos_delta = vp.pos_delta;
out:
    pd_vision_prompt_free(&vp);
    pd_free(grids);
    if (rc) {
        pd_engine_mm_free(mm);
        if (rc == PD_ENOMEM)
            pd_api_error_set(e, 500, "server_error", NULL, NULL,
                             "out of memory preparing the request's images");
        return rc;
    }
    *out = mm;
    return PD_OK;
}
