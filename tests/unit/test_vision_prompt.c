/*
 * test_vision_prompt.c — model/vision/vision_prompt.c apart from the model: the placeholder
 * count must match the images (the error names both), a grid that does not merge is refused,
 * every image's placeholders are expanded in place, and the spans a chunked prefill asks for
 * cover each image's embeddings exactly once, in order, whatever the chunk length. The positions
 * themselves are held to transformers' get_rope_index by tests/python/test_vision_hf.py.
 */
#include "pd_test.h"

#include "model/vision/vision_prompt.h"

#include <string.h>

enum { IMG = 9, HID = 3 };

static void test_errors(void) {
    struct pd_model_config lm = {.image_token_id = IMG};
    struct pd_vision_prompt p;
    int32_t ids[] = {1, IMG, 2, IMG};
    int grids[3][3] = {{1, 4, 6}, {1, 2, 2}, {1, 2, 2}};
    CHECK_ERR(pd_vision_prompt_build(&lm, 2, ids, 4, (const int(*)[3])grids, 3, &p), PD_EINVAL,
              "the prompt has 2 image placeholders (token 9) for 3 images");
    CHECK_ERR(pd_vision_prompt_build(&lm, 2, ids, 3, (const int(*)[3])grids, 2, &p), PD_EINVAL,
              "the prompt has 1 image placeholder (token 9) for 2 images");
    grids[1][2] = 3;
    CHECK_ERR(pd_vision_prompt_build(&lm, 2, ids, 4, (const int(*)[3])grids, 2, &p), PD_EINVAL,
              "image 1: grid 1 x 2 x 3 does not merge by 2");
    lm.image_token_id = -1;
    CHECK_ERR(pd_vision_prompt_build(&lm, 2, ids, 4, (const int(*)[3])grids, 2, &p), PD_EINVAL,
              "the model takes no images");
}

static void test_expand_and_spans(void) {
    struct pd_model_config lm = {.image_token_id = IMG};
    struct pd_vision_prompt p;
    int32_t ids[] = {1, 2, IMG, 3, IMG, 4, 5};
    int grids[2][3] = {{1, 4, 6}, {1, 2, 2}}; /* 6 and 1 embeddings */
    CHECK_OK(pd_vision_prompt_build(&lm, 2, ids, 7, (const int(*)[3])grids, 2, &p));
    CHECK_INT(p.n, 7 - 2 + 6 + 1);
    CHECK_INT(p.img_tokens[0], 6);
    CHECK_INT(p.img_tokens[1], 1);
    int n_img = 0;
    for (int i = 0; i < p.n; i++)
        n_img += p.ids[i] == IMG;
    CHECK_INT(n_img, 7);
    CHECK(p.ids[p.img_start[0] - 1] == 2 && p.ids[p.img_start[0] + 6] == 3);
    CHECK(p.ids[p.img_start[1] - 1] == 3 && p.ids[p.img_start[1] + 1] == 4);
    for (int i = 0; i < p.n; i++) /* text tokens turn all three axes alike */
        if (p.ids[i] != IMG)
            CHECK(p.mpos[i * 3] == p.mpos[i * 3 + 1] && p.mpos[i * 3 + 1] == p.mpos[i * 3 + 2]);
    float e0[6 * HID], e1[1 * HID];
    const float *emb[2] = {e0, e1};
    for (int chunk = 1; chunk <= p.n; chunk++) {
        int seen[2] = {0, 0}, ok = 1;
        for (int at = 0; at < p.n; at += chunk) {
            int len = p.n - at < chunk ? p.n - at : chunk;
            struct pd_model_embeds sp[2];
            int k = pd_vision_prompt_spans(&p, emb, HID, at, len, sp);
            for (int j = 0; j < k; j++) {
                int img = sp[j].rows >= e1 && sp[j].rows < e1 + HID ? 1 : 0;
                int first = (int)((sp[j].rows - emb[img]) / HID);
                ok &= first == seen[img] && at + sp[j].start == p.img_start[img] + first &&
                      sp[j].start >= 0 && sp[j].start + sp[j].n <= len;
                seen[img] += sp[j].n;
            }
        }
        CHECK(ok && seen[0] == 6 && seen[1] == 1);
    }
    pd_vision_prompt_free(&p);
}

PD_TEST_MAIN(PD_TEST(test_errors), PD_TEST(test_expand_and_spans))
