/*
 * bpe_train.h — a small, deterministic byte-pair-encoding trainer, so pdserve-mkmodel can ship a
 * real tokenizer with every random-weight model instead of downloading one.
 *
 * Two alphabets, matching the two tokenizer families of DESIGN.md §4:
 *   byte-level (Llama-3, Qwen2): the 256 bytes in GPT-2's byte-to-unicode order, then merges;
 *     words come from an approximation of the family's split regex (the approximation only
 *     changes which merges are learnt, never whether the result is a valid tokenizer).
 *   sentencepiece (Llama-2, Mistral): caller's prefix tokens (<unk>, <s>, </s>), the 256 byte
 *     fallback tokens <0x00>..<0xFF>, the corpus's most frequent characters, then merges; spaces
 *     are "▁" and words start at one, digits never merge, as SentencePiece does for Llama.
 * Invariants of the result: every merge joins two existing tokens into a NEW token (a pair whose
 * concatenation already exists is never chosen), so n_tokens == n_base + n_merges; token texts
 * are unique. Same corpus and options give the same vocabulary on every machine: ties between
 * equally frequent pairs break by the pair's bytes, never by hash order.
 */
#ifndef PD_BPE_TRAIN_H
#define PD_BPE_TRAIN_H

#include <stddef.h>

enum pd_bpe_style {
    PD_BPE_BYTE_LEVEL = 0,
    PD_BPE_SENTENCEPIECE = 1,
};

struct pd_bpe_train_opts {
    enum pd_bpe_style style;
    const char *corpus; /* UTF-8 text */
    size_t corpus_len;  /* bytes */
    int max_tokens;     /* size cap of the whole vocabulary (prefix + alphabet + merges) */
    int max_digits;     /* byte-level: digits per word, 3 for Llama-3, 1 for Qwen2 */
    const char *const *prefix_tokens; /* sentencepiece: texts given ids 0..n_prefix-1 */
    int n_prefix;
};

struct pd_bpe_vocab {
    /* [n_tokens] NUL-terminated token texts as tokenizer.json spells them: byte-level tokens in
     * the GPT-2 unicode mapping ("Ġthe"), sentencepiece ones with "▁" ("▁the", "<0x0A>"). */
    char **tokens;
    int n_tokens;
    int n_base;       /* tokens that no merge produced; merge i produced token n_base + i */
    int (*merges)[2]; /* [n_merges] token ids (left, right), highest priority first */
    int n_merges;
};

/* The smallest max_tokens a style accepts (its fixed alphabet plus prefix tokens). */
int pd_bpe_min_tokens(enum pd_bpe_style style, int n_prefix);

/* Trains on o->corpus until the vocabulary holds o->max_tokens tokens or no pair is left to
 * merge. PD_ERANGE when max_tokens is under pd_bpe_min_tokens. *out is owned by the caller and
 * released with pd_bpe_vocab_free. */
int pd_bpe_train(const struct pd_bpe_train_opts *o, struct pd_bpe_vocab *out);
void pd_bpe_vocab_free(struct pd_bpe_vocab *v);

/* GPT-2's byte-to-unicode mapping: the code point that stands for byte b in byte-level token
 * texts (printable Latin-1 bytes map to themselves, the others to U+0100 and up). */
unsigned pd_bpe_byte_to_codepoint(unsigned char b);

#endif
