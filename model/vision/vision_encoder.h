/*
 * vision_encoder.h — the Qwen2-VL and Qwen2.5-VL vision transformers (transformers'
 * Qwen2VisionTransformerPretrainedModel, Qwen2_5_VisionTransformerPretrainedModel) on a backend:
 * from one image's pixel_values (model/vision/image_processor.h) to the embeddings that replace
 * its placeholder tokens in the prompt, one per merge window, in the language model's width.
 *
 *   patch embedding   the Conv3d of stride = kernel as one product: [patches][C·T·P·P] · Wᵀ
 *   blocks × depth    x += proj(attention(rope2d(qkv(norm1 x))));  x += mlp(norm2 x)
 *                      Qwen2-VL: LayerNorm, fc1 → QuickGELU → fc2, every block attends over the
 *                      whole image; Qwen2.5-VL: RMSNorm, SwiGLU with biases, and blocks outside
 *                      fullatt_block_indexes attend only inside windows of window_size pixels
 *   merger            norm, the merge_size² patches of a window side by side, Linear → GELU →
 *                      Linear to the language model's hidden size
 *
 * The 2-D rotary angles (row and column of each patch, head_dim / 4 frequencies each) and
 * Qwen2.5-VL's window order are computed on the host per image; the device sees explicit angles
 * and segment bounds (backend.h's vision ops). An image is encoded alone: attention never crosses
 * images, so a prompt's images encoded together or one by one give the same embeddings, and each
 * can be cached by itself. Activations are f32; weights stay in the checkpoint's dtype.
 */
#ifndef PD_VISION_ENCODER_H
#define PD_VISION_ENCODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/safetensors.h"
#include "model/vision/image_processor.h"

enum pd_vision_family {
    PD_VISION_QWEN2_VL = 0,   /* model_type "qwen2_vl" */
    PD_VISION_QWEN2_5_VL = 1, /* model_type "qwen2_5_vl" */
};

#define PD_VISION_MAX_FULLATT 64

/* config.json's vision_config (keys as transformers 5 writes them, and as the Hub's Qwen
 * checkpoints do: in_chans for in_channels), with the family from the top-level model_type. */
struct pd_vision_config {
    enum pd_vision_family family;
    int depth;       /* blocks */
    int embed_dim;   /* width of the blocks (Qwen2-VL embed_dim, Qwen2.5-VL hidden_size) */
    int num_heads;   /* head_dim = embed_dim / num_heads */
    int mlp_dim;     /* Qwen2-VL embed_dim · mlp_ratio, Qwen2.5-VL intermediate_size */
    int out_dim;     /* the language model's hidden size (hidden_size / out_hidden_size) */
    int in_channels; /* 3 */
    int patch_size, temporal_patch_size, spatial_merge_size;
    enum pd_act act;   /* Qwen2-VL's MLP activation (quick_gelu or gelu); Qwen2.5-VL: silu, gated */
    double rope_theta; /* rope_parameters.rope_theta; 10000 when absent */
    int window_size;   /* Qwen2.5-VL: pixels a window spans per side */
    int n_fullatt;     /* Qwen2.5-VL: blocks that attend over the whole image */
    int fullatt_block_indexes[PD_VISION_MAX_FULLATT];
};

/* Parses config.json text (len bytes, not necessarily NUL-terminated; src names it in messages).
 * A model_type other than qwen2_vl / qwen2_5_vl is PD_EUNSUPPORTED ("has no vision encoder");
 * a missing vision_config, a missing or out-of-range key, widths that do not split into heads
 * are errors naming the key. */
int pd_vision_config_parse(const char *json, size_t len, const char *src,
                           struct pd_vision_config *out);
/* Reads dir/config.json. */
int pd_vision_config_load(const char *dir, struct pd_vision_config *out);
/* cfg as config.json's "vision_config" object, with transformers 5's keys for its family (it
 * parses back to cfg; Qwen2-VL's mlp_dim must be a multiple of embed_dim, its mlp_ratio); NULL
 * with the error set when memory runs out or cfg cannot be written. The caller owns it. */
struct cJSON *pd_vision_config_json(const struct pd_vision_config *cfg);
/* The tensors of the encoder, as the Hub's checkpoints name them ("visual.blocks.0.attn.qkv.
 * weight"; the patch embedding a 5-D Conv3d kernel). *out pd_malloc'ed, the caller frees it. */
int pd_vision_tensor_specs(const struct pd_vision_config *cfg, struct pd_tensor_spec **out,
                           size_t *n_out);

struct pd_vision_encoder_opts {
    /* the most patches one image may have (the processor's max_pixels / patch_size²); buffers
     * are sized for it at creation */
    int max_patches;
};

struct pd_vision_encoder;

/* Builds the encoder from the checkpoint's visual.* tensors (also accepted as model.visual.*,
 * the names transformers 5 uses in memory). The backend must have the vision ops
 * (pd_backend_has_vision), else PD_EUNSUPPORTED. Shapes and dtypes are checked against cfg. */
int pd_vision_encoder_new(struct pd_backend *be, const struct pd_vision_config *cfg,
                          const struct pd_checkpoint *ck, const struct pd_vision_encoder_opts *opts,
                          struct pd_vision_encoder **out);
void pd_vision_encoder_free(struct pd_vision_encoder *e);
const struct pd_vision_config *pd_vision_encoder_config(const struct pd_vision_encoder *e);

/* Embeddings one image of grid (t, h, w) patches yields: t · h · w / merge_size². */
int64_t pd_vision_tokens(const struct pd_vision_config *cfg, int grid_t, int grid_h, int grid_w);

/* Encodes one image: img's pixel_values (rows as the processor lays them out, row_len =
 * in_channels · temporal_patch_size · patch_size²) → out, host [pd_vision_tokens][out_dim] f32,
 * in the order of the image's placeholder tokens. PD_EINVAL when img does not fit the config
 * (row length, a grid not divisible by merge_size), PD_ERANGE beyond max_patches. */
int pd_vision_encode(struct pd_vision_encoder *e, const struct pd_image_patches *img, float *out);

#endif
