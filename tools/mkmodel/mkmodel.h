/*
 * mkmodel.h — writes a complete Hugging Face model directory with random weights: config.json,
 * generation_config.json, model.safetensors (or shards + model.safetensors.index.json),
 * tokenizer.json and tokenizer_config.json, for every family pdserve runs and any size from a
 * few-hundred-KB test model to the published shapes of Llama-3.1-8B, Qwen3-8B and others.
 * pdserve-mkmodel is flags around pd_mkmodel_write; tests call it directly.
 *
 * Determinism: every tensor is filled from a PRNG stream derived from (seed, tensor name, block
 * index), so the files are byte-identical for the same options whatever the thread count, and
 * the tensors identical whatever the shard size. Memory: one shard is generated and written at a
 * time, so peak memory is about the largest shard, not the model.
 */
#ifndef PD_MKMODEL_H
#define PD_MKMODEL_H

#include <stdint.h>

#include "model/dtype.h"
#include "model/model_config.h"

enum pd_mkmodel_family {
    PD_MKMODEL_LLAMA = 0,   /* Llama-3 style: byte-level tokenizer, rope_scaling llama3 */
    PD_MKMODEL_LLAMA2 = 1,  /* Llama-2 style: sentencepiece BPE tokenizer, plain rope */
    PD_MKMODEL_MISTRAL = 2, /* MistralForCausalLM, sentencepiece BPE tokenizer */
    PD_MKMODEL_QWEN2 = 3,   /* Qwen2ForCausalLM (q/k/v bias), Qwen2 tokenizer */
    PD_MKMODEL_QWEN3 = 4,   /* Qwen3ForCausalLM (q/k norm, explicit head_dim) */
    /* vision-language: a Qwen2 language model with M-RoPE, a vision encoder (visual.*, its
     * vision_config), preprocessor_config.json, and Qwen2-VL's vision tokens and chat template */
    PD_MKMODEL_QWEN2_VL = 5,   /* Qwen2VLForConditionalGeneration */
    PD_MKMODEL_QWEN2_5_VL = 6, /* Qwen2_5_VLForConditionalGeneration (window attention) */
};

/* NULL-terminated, indexed by enum pd_mkmodel_family: "llama", "llama2", ... */
extern const char *const pd_mkmodel_family_names[];
/* NULL-terminated: "tiny", then the published shapes ("llama-3.1-8b", "qwen2.5-0.5b", ...). */
extern const char *const pd_mkmodel_shape_names[];

struct pd_mkmodel_opts {
    int shape;  /* index into pd_mkmodel_shape_names; 0 = tiny */
    int family; /* enum pd_mkmodel_family; -1 = the shape's (tiny: llama) */
    /* overrides of the shape's numbers; 0 keeps the shape's */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;            /* 0: the shape's, or hidden/heads when those were overridden */
    int tie_word_embeddings; /* -1 keeps the shape's; 0 or 1 */
    int sliding_window;      /* mistral, qwen2, qwen3: attention window in tokens; 0 = none */
    int max_window_layers;   /* qwen2, qwen3: the window applies to layers >= this */
    enum pd_dtype dtype;
    uint64_t seed;
    uint64_t max_shard_bytes; /* 0: one model.safetensors however large */
    int threads;              /* weight generation threads; 0: online CPUs, at most 16 */
};

/* tiny llama, bf16, seed 0, 5 GiB shards (transformers' default size), auto threads. */
void pd_mkmodel_opts_defaults(struct pd_mkmodel_opts *o);

/* Shape + family + overrides → the config that will be written, tokens ids not yet known
 * (bos/eos/pad -1). PD_EINVAL / PD_ERANGE naming the offending option when the combination
 * cannot be a model (heads not a multiple of kv heads, odd head_dim, vocab too small for the
 * family's tokenizer, a family contradicting the shape). */
int pd_mkmodel_config(const struct pd_mkmodel_opts *o, struct pd_model_config *cfg);

/* Writes the model directory dir (created with parents when missing). Files of an earlier
 * checkpoint in dir (model.safetensors, model-*-of-*.safetensors, the index) are removed first,
 * so a sharded write never leaves a stale single file behind or the other way round. */
int pd_mkmodel_write(const struct pd_mkmodel_opts *o, const char *dir);

/* "4096", "64K", "512M", "5G" (K/M/G are powers of 1024) → bytes. PD_EINVAL otherwise. */
int pd_mkmodel_size_parse(const char *s, uint64_t *out);

#endif
