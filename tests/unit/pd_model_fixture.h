/*
 * pd_model_fixture.h — random in-memory checkpoints for model tests: the tensors of a Llama /
 * Qwen2 / Qwen3 config filled from the test's own generator, looked up by name through
 * pd_model_new's callback. Norm weights sit near 1, everything else near 0 with amplitude amp.
 */
#ifndef PD_MODEL_FIXTURE_H
#define PD_MODEL_FIXTURE_H

#include "common/base/alloc.h"
#include "model/dtype.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>

/* The family traits the model tests cover: qwen2 has q/k/v bias and tied embeddings, qwen3 q/k
 * norm, llama llama3 rope scaling. Sizes are the caller's. */
static inline void fixture_family_traits(struct pd_model_config *c, enum pd_arch arch) {
    c->arch = arch;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000;
    c->attention_bias = arch == PD_ARCH_QWEN2;
    c->qk_norm = arch == PD_ARCH_QWEN3;
    c->tie_word_embeddings = arch == PD_ARCH_QWEN2;
    if (arch == PD_ARCH_LLAMA)
        c->rope_scaling = (struct pd_rope_scaling){PD_ROPE_LLAMA3, 8.0, 1.0, 4.0, 32};
}

struct fake_ckpt {
    struct pd_tensor_view t[128];
    char names[128][96];
    int n;
};

/* Adds tensor `name` of rows x cols (rows == 1: a vector of cols), off + amp * rnd() each. */
static inline void fake_ckpt_add(struct fake_ckpt *ck, const char *name, int64_t rows, int64_t cols,
                                 float amp, float off, enum pd_dtype dt, float (*rnd)(void)) {
    struct pd_tensor_view *t = &ck->t[ck->n];
    snprintf(ck->names[ck->n], sizeof(ck->names[0]), "%s", name);
    t->name = ck->names[ck->n];
    t->dtype = dt;
    t->ndim = rows == 1 ? 1 : 2;
    t->shape[0] = rows == 1 ? cols : rows;
    t->shape[1] = rows == 1 ? 0 : cols;
    size_t n = (size_t)(rows * cols);
    t->nbytes = n * pd_dtype_size(dt);
    float *f = pd_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = off + amp * rnd();
    void *d = pd_malloc(t->nbytes);
    pd_dtype_from_f32(dt, f, d, n);
    pd_free(f);
    t->data = d;
    ck->n++;
}

/* pd_model_new's tensor lookup; ctx is the struct fake_ckpt. */
static inline const struct pd_tensor_view *fake_ckpt_find(void *ctx, const char *name) {
    struct fake_ckpt *ck = ctx;
    for (int i = 0; i < ck->n; i++)
        if (strcmp(ck->t[i].name, name) == 0)
            return &ck->t[i];
    return NULL;
}

static inline void fake_ckpt_free(struct fake_ckpt *ck) {
    for (int i = 0; i < ck->n; i++)
        pd_free((void *)ck->t[i].data);
    ck->n = 0;
}

/* Fills ck (emptied first) with every weight config c needs, in dtype dt. */
static inline void fake_ckpt_weights(const struct pd_model_config *c, enum pd_dtype dt, float amp,
                                     float (*rnd)(void), struct fake_ckpt *ck) {
    int64_t hid = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kvd = (int64_t)c->num_key_value_heads * c->head_dim, in = c->intermediate_size;
    float a = amp;
    char n[96];
    ck->n = 0;
    fake_ckpt_add(ck, "model.embed_tokens.weight", c->vocab_size, hid, 1.0f, 0, dt, rnd);
    fake_ckpt_add(ck, "model.norm.weight", 1, hid, 0.2f, 1.0f, dt, rnd);
    if (!c->tie_word_embeddings)
        fake_ckpt_add(ck, "lm_head.weight", c->vocab_size, hid, a, 0, dt, rnd);
    for (int l = 0; l < c->num_hidden_layers; l++) {
#define L(s, r, co, amp_, off)                                                                     \
    snprintf(n, sizeof(n), "model.layers.%d.%s", l, s);                                            \
    fake_ckpt_add(ck, n, r, co, amp_, off, dt, rnd)
        L("input_layernorm.weight", 1, hid, 0.2f, 1.0f);
        L("post_attention_layernorm.weight", 1, hid, 0.2f, 1.0f);
        L("self_attn.q_proj.weight", qd, hid, a, 0);
        L("self_attn.k_proj.weight", kvd, hid, a, 0);
        L("self_attn.v_proj.weight", kvd, hid, a, 0);
        L("self_attn.o_proj.weight", hid, qd, a, 0);
        if (c->attention_bias) {
            L("self_attn.q_proj.bias", 1, qd, a, 0);
            L("self_attn.k_proj.bias", 1, kvd, a, 0);
            L("self_attn.v_proj.bias", 1, kvd, a, 0);
        }
        if (c->qk_norm) {
            L("self_attn.q_norm.weight", 1, c->head_dim, 0.2f, 1.0f);
            L("self_attn.k_norm.weight", 1, c->head_dim, 0.2f, 1.0f);
        }
        L("mlp.gate_proj.weight", in, hid, a, 0);
        L("mlp.up_proj.weight", in, hid, a, 0);
        L("mlp.down_proj.weight", hid, in, a, 0);
#undef L
    }
}

#endif
