/*
 * tokgen.h — makes the tokenizer files of a Hugging Face model directory (tokenizer.json,
 * tokenizer_config.json) for pdserve-mkmodel: a BPE vocabulary trained by bpe_train.c on the
 * built-in corpus, wrapped in the normalizer / pre-tokenizer / post-processor / decoder and
 * special tokens of a real model family, with that family's chat template.
 *
 * Ids: regular tokens first (0..bpe.n_tokens-1), then the family's added special tokens
 * (byte-level families), as Llama-3 and Qwen2 number them; Llama-2/Mistral keep <unk> <s> </s>
 * at 0, 1, 2 inside the BPE vocabulary, as SentencePiece does. n_tokens never exceeds the
 * max_tokens asked for, which the caller keeps ≤ config.json's vocab_size.
 * Nothing here does I/O: the JSON comes back as strings for the caller to write.
 */
#ifndef PD_TOKGEN_H
#define PD_TOKGEN_H

#include "tools/mkmodel/bpe_train.h"

enum pd_tokgen_flavor {
    PD_TOKGEN_LLAMA3 = 0,   /* byte-level, Llama-3 split regex, <|begin_of_text|>, header turns */
    PD_TOKGEN_LLAMA2 = 1,   /* sentencepiece BPE + byte fallback, <s> </s>, [INST] <<SYS>> */
    PD_TOKGEN_MISTRAL = 2,  /* as Llama-2, with Mistral's [INST] template */
    PD_TOKGEN_QWEN2 = 3,    /* byte-level, Qwen2 split regex, NFC, ChatML + default system */
    PD_TOKGEN_QWEN3 = 4,    /* as Qwen2, ChatML without a default system message */
    PD_TOKGEN_QWEN2_VL = 5, /* as Qwen2 with Qwen2-VL's vision tokens and image chat template */
};

#define PD_TOKGEN_MAX_EOS 4

struct pd_tokgen {
    enum pd_tokgen_flavor flavor;
    struct pd_bpe_vocab bpe;  /* model vocabulary: ids 0..bpe.n_tokens-1 */
    const char *const *added; /* special tokens after the BPE ids (byte-level families) */
    int n_added;
    int n_tokens;                   /* bpe.n_tokens + n_added: ids the tokenizer can produce */
    int bos_id;                     /* -1 when the family has none (Qwen) */
    int eos_id;                     /* tokenizer_config eos_token: what ends an assistant turn */
    int eos_ids[PD_TOKGEN_MAX_EOS]; /* generation_config eos_token_id, eos_id first */
    int n_eos_ids;
    int pad_id; /* -1 none */
    int unk_id; /* -1 none */
};

/* The built-in training text (tokgen_corpus.c). */
extern const char pd_tokgen_corpus[];
extern const unsigned long pd_tokgen_corpus_len;

/* "llama3", "llama2", "mistral", "qwen2", "qwen3", "qwen2_vl". */
const char *pd_tokgen_flavor_name(enum pd_tokgen_flavor f);

/* Smallest max_tokens the flavor accepts: its fixed alphabet plus special tokens. */
int pd_tokgen_min_tokens(enum pd_tokgen_flavor f);

/* Trains the vocabulary (at most max_tokens ids in all, fewer when the corpus runs out of
 * pairs) and fills *out; release with pd_tokgen_free. */
int pd_tokgen_build(enum pd_tokgen_flavor f, int max_tokens, struct pd_tokgen *out);
void pd_tokgen_free(struct pd_tokgen *t);

/* The id of added special token text ("<|image_pad|>"); -1 when the flavor has none. */
int pd_tokgen_added_id(const struct pd_tokgen *t, const char *text);

/* tokenizer.json / tokenizer_config.json text; the caller frees with pd_free. NULL with the
 * error recorded when memory runs out. */
char *pd_tokgen_tokenizer_json(const struct pd_tokgen *t);
char *pd_tokgen_tokenizer_config_json(const struct pd_tokgen *t, int model_max_length);

#endif
