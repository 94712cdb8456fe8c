/*
 * engine_mm.c — images on the compute thread (issue 18): the vision encoder runs on rank 0's
 * backend, beside the language model, and its output goes through the embedding cache
 * (common/embed_cache.h) by image content. A prefill chunk that covers an image's placeholders
 * takes the image's embeddings from the request (held since an earlier chunk), else from the
 * cache, else from the encoder — so an image is encoded once per request however many chunks
 * cut it, and once overall while it stays cached. The request holds its cache entries until
 * its prompt is computed or it ends.
 */
#include "common/engine_internal.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "common/embed_cache.h"
#include "model/vision/image_processor.h"
#include "model/vision/vision_encoder.h"
#include "model/vision/vision_prompt.h"

#include <inttypes.h>
#include <string.h>

int pd__engine_mm_new(struct pd_engine *e) {
    const struct pd_model_config *mc = pd_model_config_of(e->model);
    e->hidden = mc->hidden_size;
    e->mm_spans = pd_calloc((size_t)e->max_reqs * PD_ENGINE_MAX_IMAGES, sizeof(*e->mm_spans));
    e->mm_mpos_cap = pd_model_opts_of(e->model)->max_tokens;
    e->mm_mpos = pd_calloc((size_t)e->mm_mpos_cap * 3, sizeof(int32_t));
    if (!e->mm_spans || !e->mm_mpos)
        return pd_error_wrap(PD_ENOMEM, "engine image spans");
    if (mc->vl == PD_VL_NONE || !e->cfg.vision)
        return PD_OK;
    struct pd_vision_config vc;
    struct pd_image_processor_config pc;
    char path[4096];
    snprintf(path, sizeof(path), "%s/preprocessor_config.json", e->cfg.model_path);
    int rc;
    if ((rc = pd_vision_config_load(e->cfg.model_path, &vc)) ||
        (rc = pd_image_processor_config_load(path, &pc)) ||
        (rc = pd_checkpoint_open(e->cfg.model_path, &e->vck)))
        return pd_error_wrap(rc, "the vision encoder of %s", e->cfg.model_path);
    if (vc.out_dim != mc->hidden_size)
        return pd_errorf(PD_EMISMATCH,
                         "the vision encoder's output (%d) is not the model's width %d", vc.out_dim,
                         mc->hidden_size);
    struct pd_vision_encoder_opts eo = {
        .max_patches = (int)(pc.max_pixels / ((int64_t)pc.patch_size * pc.patch_size))};
    if ((rc = pd_vision_encoder_new(e->be, &vc, e->vck, &eo, &e->venc)) ||
        (rc = pd_embed_cache_new(e->cfg.mm_cache_bytes, &e->embc)))
        return rc;
    pd_info("vision encoder: %s, %d blocks of width %d, images of up to %d patches; embedding "
            "cache %.1f MB",
            vc.family == PD_VISION_QWEN2_VL ? "qwen2_vl" : "qwen2_5_vl", vc.depth, vc.embed_dim,
            eo.max_patches, (double)e->cfg.mm_cache_bytes / 1e6);
    return PD_OK;
}

void pd__engine_mm_free(struct pd_engine *e) {
    pd_vision_encoder_free(e->venc);
    pd_embed_cache_free(e->embc);
    pd_checkpoint_free(e->vck);
    pd_free(e->mm_spans);
    pd_free(e->mm_mpos);
}

/* Image i of r as embeddings: held already, from the cache, or encoded now. */
static int ensure_image(struct pd_engine *e, struct pd_engine_req *r, struct pd_engine_image *im) {
    if (im->emb)
        return PD_OK;
    if (!e->venc)
        return pd_errorf(PD_EUNSUPPORTED,
                         "request %" PRIu64 ": its image tokens cannot be computed here (no "
                         "vision encoder on the %s side)",
                         r->room, e->ops->name);
    if ((im->emb = pd_embed_cache_get(e->embc, im->hash)) == NULL) {
        if (!im->patches)
            return pd_errorf(PD_EINVAL, "request %" PRIu64 ": an image without pixels", r->room);
        size_t bytes = (size_t)im->n_tokens * (size_t)e->hidden * sizeof(float);
        float *rows = pd_malloc(bytes);
        if (!rows)
            return pd_error_wrap(PD_ENOMEM, "an image's embeddings (%zu bytes)", bytes);
        int rc = pd_vision_encode(e->venc, im->patches, rows);
        if (rc) {
            pd_free(rows);
            return pd_error_wrap(rc, "request %" PRIu64 ": encoding an image", r->room);
        }
        e->mm_encoder_runs++;
        if (!(im->emb = pd_embed_cache_put(e->embc, im->hash, rows, im->n_tokens, e->hidden)))
            return PD_ENOMEM;
    }
    if (pd_embed_entry_n_rows(im->emb) != im->n_tokens)
        return pd_errorf(PD_EINTERNAL,
                         "request %" PRIu64 ": a cached image of %d embeddings for "
                         "%d placeholders",
                         r->room, pd_embed_entry_n_rows(im->emb), im->n_tokens);
    /* the pixels are not needed again: the embeddings stay held until the prompt is done */
    pd_image_patches_free(im->patches);
    pd_free(im->patches);
    im->patches = NULL;
    return PD_OK;
}

int pd__engine_mm_seq(struct pd_engine *e, struct pd_engine_req *r, int32_t k,
                      struct pd_model_seq *s) {
    struct pd_engine_mm *mm = r->mm;
    if (k == 0) /* a new step (or batch): its position scratch is free again */
        e->mm_mpos_used = 0;
    if (!mm)
        return PD_OK;
    s->pos_delta = mm->pos_delta; /* the tokens past the prompt */
    int32_t a = s->n_cached, b = s->n_cached + s->n_new;
    if (a >= r->n_prompt)
        return PD_OK;
    if (b <= r->n_prompt) {
        s->mpos = mm->mpos + (size_t)a * 3;
    } else { /* a recompute (retraction) running into the output: those tokens turn by index +
                delta, after the prompt's own positions; built in the step's scratch */
        int32_t n = s->n_new;
        if (e->mm_mpos_used + n > e->mm_mpos_cap)
            return pd_errorf(PD_ERANGE, "request %" PRIu64 ": %d positions past the step's %d",
                             r->room, n, e->mm_mpos_cap - e->mm_mpos_used);
        int32_t *mp = e->mm_mpos + (size_t)e->mm_mpos_used * 3;
        e->mm_mpos_used += n;
        memcpy(mp, mm->mpos + (size_t)a * 3, (size_t)(r->n_prompt - a) * 3 * sizeof(int32_t));
        for (int32_t t = r->n_prompt; t < b; t++)
            mp[(t - a) * 3] = mp[(t - a) * 3 + 1] = mp[(t - a) * 3 + 2] = t + mm->pos_delta;
        s->mpos = mp;
    }
    struct pd_model_embeds *sp = e->mm_spans + (size_t)k * PD_ENGINE_MAX_IMAGES;
    s->embeds = sp;
    s->n_embeds = 0;
    for (int32_t i = 0; i < mm->n_images; i++) {
        struct pd_engine_image *im = &mm->images[i];
        int32_t lo = im->start > a ? im->start : a;
        int32_t hi = im->start + im->n_tokens < b ? im->start + im->n_tokens : b;
        if (lo >= hi)
            continue;
        int rc = ensure_image(e, r, im);
        if (rc)
            return rc;
        sp[s->n_embeds++] = (struct pd_model_embeds){
            .start = lo - a,
            .n = hi - lo,
            .rows = pd_embed_entry_rows(im->emb) + (size_t)(lo - im->start) * (size_t)e->hidden};
    }
    return PD_OK;
}

void pd__engine_mm_release(struct pd_engine *e, struct pd_engine_req *r) {
    if (!r->mm)
        return;
    for (int32_t i = 0; i < r->mm->n_images; i++) {
        pd_embed_cache_release(e->embc, r->mm->images[i].emb);
        r->mm->images[i].emb = NULL;
    }
}

void pd__engine_mm_stats(const struct pd_engine *e, struct pd_engine_stats *s) {
    s->mm_encoder_runs = e->mm_encoder_runs;
    if (!e->embc)
        return;
    struct pd_embed_cache_stats cs;
    pd_embed_cache_get_stats(e->embc, &cs);
    s->mm_cache_hits = cs.hits;
    s->mm_cache_misses = cs.misses;
    s->mm_cache_bytes = (int64_t)cs.bytes;
    s->mm_cache_entries = cs.entries;
}
