/*
 * tokenizer.h — Hugging Face tokenizer.json in C: the ids a daemon computes for a prompt are the
 * ids Hugging Face `tokenizers` computes (one id off and the model sees a different prompt).
 *
 * Supported: BPE models of the two styles real models ship — byte-level BPE behind a Split regex
 * pre-tokenizer (Llama-3, Qwen2/2.5/3, GPT-2's ByteLevel regex; run by PCRE2 with Unicode
 * properties) and SentencePiece-style BPE (Prepend/Replace normalizer or Metaspace pre-tokenizer,
 * byte_fallback, fuse_unk; Llama-2, Mistral). Added/special tokens are matched before the model
 * as HF does; NFC/NFD/NFKC/NFKD normalizers use utf8proc. Anything else in the file (Unigram,
 * WordPiece, an unknown normalizer...) fails at load with PD_EUNSUPPORTED naming it and its JSON
 * path; malformed files fail with PD_EFORMAT and the JSON path of the problem.
 *
 * Invalid UTF-8 in text to encode is rejected (PD_EINVAL, byte offset in the message): HF's
 * Python API cannot even receive such text, so there is no reference behaviour to copy.
 * Decoding follows HF: bytes that do not form UTF-8 become U+FFFD as HF's decoders make them.
 * A loaded tokenizer does not change, but for a bounded internal cache of word encodings (1 MiB,
 * locked); every function taking `const struct pd_tokenizer *` may be called from many threads
 * at once.
 */
#ifndef PD_TOKENIZER_H
#define PD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pd_tokenizer;

/* Encode flags. */
enum {
    /* Apply the post-processor: BOS/EOS as tokenizer.json's TemplateProcessing says, or as
     * tokenizer_config.json's add_bos_token/add_eos_token say when the file has no template. */
    PD_TOK_ADD_SPECIAL = 1u << 0,
    /* Recognise special tokens written in the text ("<|im_start|>" → its id). Without it they
     * are tokenized as plain text (HF's encode_special_tokens=True); non-special added tokens
     * still match, as in HF. */
    PD_TOK_PARSE_SPECIAL = 1u << 1,
    PD_TOK_DEFAULT = PD_TOK_ADD_SPECIAL | PD_TOK_PARSE_SPECIAL,
};

/* A growable id array; zero-initialise, then encode appends. pd_token_ids_free resets it. */
struct pd_token_ids {
    int32_t *ids; /* [n] */
    size_t n, cap;
};
void pd_token_ids_free(struct pd_token_ids *v);

/* Loads DIR/tokenizer.json, DIR/tokenizer_config.json (optional) and DIR/chat_template.jinja
 * (optional; it wins over tokenizer_config's chat_template, as in transformers). */
int pd_tokenizer_new(const char *dir, struct pd_tokenizer **out);
/* The same from memory; config_json may be NULL. `what` names the source in messages. */
int pd_tokenizer_new_from_json(const char *tokenizer_json, size_t len, const char *config_json,
                               const char *what, struct pd_tokenizer **out);
void pd_tokenizer_free(struct pd_tokenizer *t);

/* Appends the ids of text[0..len) to out. PD_EINVAL when text is not valid UTF-8. */
int pd_tokenizer_encode(const struct pd_tokenizer *t, const char *text, size_t len, unsigned flags,
                        struct pd_token_ids *out);

/* One-shot decode into a fresh NUL-terminated string (caller pd_free's *out). Ids outside the
 * vocabulary are skipped, as HF skips them. */
int pd_tokenizer_decode(const struct pd_tokenizer *t, const int32_t *ids, size_t n,
                        bool skip_special, char **out, size_t *out_len);

/* Number of ids (model vocabulary plus added tokens; max id + 1). */
int32_t pd_tokenizer_vocab_size(const struct pd_tokenizer *t);
/* Id of an exact token string (vocab or added token), or -1. */
int32_t pd_tokenizer_token_id(const struct pd_tokenizer *t, const char *token);
/* Token string of an id as stored in tokenizer.json (byte-level tokens in their mapped form), or
 * NULL when id is out of range. */
const char *pd_tokenizer_id_to_token(const struct pd_tokenizer *t, int32_t id);
/* True for added tokens marked special (skipped by skip_special). */
bool pd_tokenizer_is_special(const struct pd_tokenizer *t, int32_t id);
/* BOS/EOS ids from tokenizer_config.json (-1 when absent) and their text (NULL when absent). */
int32_t pd_tokenizer_bos_id(const struct pd_tokenizer *t);
int32_t pd_tokenizer_eos_id(const struct pd_tokenizer *t);
const char *pd_tokenizer_bos_token(const struct pd_tokenizer *t);
const char *pd_tokenizer_eos_token(const struct pd_tokenizer *t);
/* The chat template (chat_template.jinja or tokenizer_config.json's "chat_template"), or NULL. */
const char *pd_tokenizer_chat_template(const struct pd_tokenizer *t);

/*
 * Incremental detokenization for streaming. Feed ids one at a time; each call yields the text
 * that became final with that id (possibly empty: a token ending inside a UTF-8 character, or a
 * run of <0xNN> byte tokens that is not finished, emits nothing until it is). The concatenation
 * of every piece plus the flush equals pd_tokenizer_decode of all ids — exactly, by
 * construction: one-shot decode is this stream run to the end. One stream per request; the
 * tokenizer must outlive it.
 */
struct pd_detok;
int pd_detok_new(const struct pd_tokenizer *t, bool skip_special, struct pd_detok **out);
/* *piece (valid until the next call) receives the newly final text. */
int pd_detok_step(struct pd_detok *d, int32_t id, const char **piece, size_t *len);
/* End of stream: emits what was held back (an unfinished character becomes U+FFFD, as HF). */
int pd_detok_flush(struct pd_detok *d, const char **piece, size_t *len);
void pd_detok_free(struct pd_detok *d);

#endif
