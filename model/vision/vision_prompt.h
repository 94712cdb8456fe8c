/*
 * vision_prompt.h — a tokenized prompt with images, made ready for a Qwen2-VL / Qwen2.5-VL
 * language model (model/model.h's M-RoPE and embedding rows):
 *  - placeholder expansion: each image's one image_token_id (what the chat template's
 *    <|image_pad|> tokenizes to) becomes as many as the image has embeddings, as the Hugging Face
 *    processor expands it;
 *  - M-RoPE positions, as transformers' get_rope_index: text tokens count up on all three axes;
 *    an image's tokens take (start + t, start + row, start + column) over its merged grid, and
 *    the text after it goes on from start + max(rows, columns); pos_delta = the largest position
 *    + 1 - the prompt's length, which every later token (the output) adds to its index;
 *  - where each image's embeddings go, and the part of them that falls in a chunk of a chunked
 *    prefill.
 */
#ifndef PD_VISION_PROMPT_H
#define PD_VISION_PROMPT_H

#include <stdint.h>

#include "model/model.h"

struct pd_vision_prompt {
    int32_t *ids; /* [n] the prompt, placeholders expanded */
    int n;
    int32_t *mpos; /* [n][3] temporal, height, width position of each token */
    int pos_delta; /* the output's rope position = its index + pos_delta */
    int n_images;
    int *img_start;  /* [n_images] index of image i's first placeholder */
    int *img_tokens; /* [n_images] its placeholders (= its embeddings) */
};

/* Builds *out from ids[0..n) holding exactly one image_token_id per image, in the order of
 * grid_thw[0..n_images) (the processor's grids in patches; merge_size the vision config's
 * spatial_merge_size). PD_EINVAL names the mismatch when the prompt's placeholders and the
 * images differ in number, or the model has no images (lm->image_token_id < 0). */
int pd_vision_prompt_build(const struct pd_model_config *lm, int merge_size, const int32_t *ids,
                           int n, const int (*grid_thw)[3], int n_images,
                           struct pd_vision_prompt *out);
void pd_vision_prompt_free(struct pd_vision_prompt *p);

/* The parts of the images' embeddings over prompt tokens [start, start + len): out[k] with
 * start relative to `start`, rows into emb[i] (host [img_tokens[i]][hidden]). Returns how many
 * (at most n_images). */
int pd_vision_prompt_spans(const struct pd_vision_prompt *p, const float *const *emb, int hidden,
                           int start, int len, struct pd_model_embeds *out);

#endif
