/*
 * vision_prompt.c — placeholder expansion, M-RoPE positions and embedding spans of a prompt with
 * images (vision_prompt.h), following transformers' Qwen2VLProcessor (one <|image_pad|> becomes
 * t·h·w / merge² of them) and Qwen2VLModel.get_rope_index.
 */
#include "model/vision/vision_prompt.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <string.h>

void pd_vision_prompt_free(struct pd_vision_prompt *p) {
    pd_free(p->ids);
    pd_free(p->mpos);
    pd_free(p->img_start);
    pd_free(p->img_tokens);
    memset(p, 0, sizeof(*p));
}

int pd_vision_prompt_build(const struct pd_model_config *lm, int merge_size, const int32_t *ids,
                           int n, const int (*grid_thw)[3], int n_images,
                           struct pd_vision_prompt *out) {
    memset(out, 0, sizeof(*out));
    int img = lm->image_token_id, found = 0;
    if (n_images > 0 && img < 0)
        return pd_errorf(PD_EINVAL, "the model takes no images (its config has no image_token_id)");
    int64_t total = n;
    for (int i = 0; i < n; i++)
        found += ids[i] == img && img >= 0;
    if (found != n_images)
        return pd_errorf(PD_EINVAL,
                         "the prompt has %d image placeholder%s (token %d) for %d image%s: each "
                         "image needs one, where the chat template puts <|image_pad|>",
                         found, found == 1 ? "" : "s", img, n_images, n_images == 1 ? "" : "s");
    for (int k = 0; k < n_images; k++) {
        const int *g = grid_thw[k];
        if (g[0] < 1 || g[1] < merge_size || g[2] < merge_size || g[1] % merge_size ||
            g[2] % merge_size)
            return pd_errorf(PD_EINVAL, "image %d: grid %d x %d x %d does not merge by %d", k, g[0],
                             g[1], g[2], merge_size);
        total += (int64_t)g[0] * (g[1] / merge_size) * (g[2] / merge_size) - 1;
    }
    if (total > INT32_MAX / 4)
        return pd_errorf(PD_ERANGE, "a prompt of %lld tokens with its images", (long long)total);
    out->n = (int)total;
    out->n_images = n_images;
    out->ids = pd_malloc((size_t)total * sizeof(int32_t));
    out->mpos = pd_malloc((size_t)total * 3 * sizeof(int32_t));
    out->img_start = pd_calloc((size_t)n_images + 1, sizeof(int));
    out->img_tokens = pd_calloc((size_t)n_images + 1, sizeof(int));
    if (!out->ids || !out->mpos || !out->img_start || !out->img_tokens) {
        pd_vision_prompt_free(out);
        return PD_ENOMEM;
    }
    int at = 0, k = 0;
    int32_t cur = 0, max = -1;
    for (int i = 0; i < n; i++) {
        if (ids[i] != img || img < 0) { /* text: one step on all three axes */
            out->ids[at] = ids[i];
            out->mpos[at * 3] = out->mpos[at * 3 + 1] = out->mpos[at * 3 + 2] = cur;
            max = cur > max ? cur : max;
            at++, cur++;
            continue;
        }
        const int *g = grid_thw[k];
        int lt = g[0], lh = g[1] / merge_size, lw = g[2] / merge_size;
        out->img_start[k] = at;
        out->img_tokens[k] = lt * lh * lw;
        for (int t = 0; t < lt; t++)
            for (int r = 0; r < lh; r++)
                for (int c = 0; c < lw; c++, at++) {
                    int32_t *p = out->mpos + (size_t)at * 3;
                    out->ids[at] = img;
                    p[0] = cur + t;
                    p[1] = cur + r;
                    p[2] = cur + c;
                    for (int a = 0; a < 3; a++)
                        max = p[a] > max ? p[a] : max;
                }
        cur += lh > lw ? lh : lw;
        k++;
    }
    out->pos_delta = max + 1 - out->n;
    return PD_OK;
}

int pd_vision_prompt_spans(const struct pd_vision_prompt *p, const float *const *emb, int hidden,
                           int start, int len, struct pd_model_embeds *out) {
    int n = 0;
    for (int k = 0; k < p->n_images; k++) {
        int a = p->img_start[k], b = a + p->img_tokens[k];
        int lo = a > start ? a : start, hi = b < start + len ? b : start + len;
        if (lo >= hi)
            continue;
        out[n++] = (struct pd_model_embeds){
            .start = lo - start, .n = hi - lo, .rows = emb[k] + (size_t)(lo - a) * hidden};
    }
    return n;
}
