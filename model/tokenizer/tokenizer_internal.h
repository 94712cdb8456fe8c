/*
 * tokenizer_internal.h — the parsed form of tokenizer.json shared by tokenizer.c (loading),
 * tokenizer_encode.c (text → ids) and tokenizer_decode.c (ids → text). Not for other modules.
 *
 * Invariants after a successful load: every id in [0, n_ids) has a token string (a hole in the
 * vocabulary gets ""), merges map (left id, right id) to (rank, merged id) with all three ids
 * valid, a ByteLevel pre-tokenizer is the last pre-tokenizer stage (then BPE runs on raw bytes
 * and byte_char_id maps each byte to the id of its GPT-2 byte character), and the decoder list
 * holds only kinds the stream in tokenizer_decode.c implements exactly.
 */
#ifndef PD_TOKENIZER_INTERNAL_H
#define PD_TOKENIZER_INTERNAL_H

#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

/* ---- string → id and (id, id) → (rank, id) hash maps, open addressing ---- */
struct pd__strmap_slot {
    const char *key; /* not owned; NULL = empty */
    uint32_t len;    /* bytes */
    uint32_t hash;
    int32_t val;
};
struct pd__strmap {
    struct pd__strmap_slot *slots; /* [cap], cap a power of two */
    size_t cap, n;
};
uint32_t pd__hash_bytes(const void *p, size_t n);
/* Inserts or overwrites; the key bytes must outlive the map. */
int pd__strmap_put(struct pd__strmap *m, const char *key, size_t len, int32_t val);
int32_t pd__strmap_get(const struct pd__strmap *m, const char *key, size_t len); /* -1: absent */
void pd__strmap_free(struct pd__strmap *m);

struct pd__pairmap {
    uint64_t *keys; /* [cap]; UINT64_MAX = empty */
    int32_t *rank;  /* [cap] */
    int32_t *id;    /* [cap] merged token */
    size_t cap, n;
};
/* Keeps the first (lowest-rank) entry for a pair, as HF's merge map does. */
int pd__pairmap_put(struct pd__pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
/* true when (a, b) merges; rank and id through the out-parameters. */
static inline bool pd__pairmap_get(const struct pd__pairmap *m, int32_t a, int32_t b, int32_t *rank,
                                   int32_t *id) {
    if (!m->cap)
        return false;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1, i = (size_t)(h >> 32) & mask;
    for (;;) {
        if (m->keys[i] == k) {
            *rank = m->rank[i];
            *id = m->id[i];
            return true;
        }
        if (m->keys[i] == UINT64_MAX)
            return false;
        i = (i + 1) & mask;
    }
}
void pd__pairmap_free(struct pd__pairmap *m);

/* ---- pipeline stages ---- */
enum pd__norm_kind {
    PD__NORM_NFC,
    PD__NORM_NFD,
    PD__NORM_NFKC,
    PD__NORM_NFKD,
    PD__NORM_PREPEND,
    PD__NORM_REPLACE,
    PD__NORM_LOWERCASE,
    PD__NORM_STRIP,
};
struct pd__norm {
    enum pd__norm_kind kind;
    char *a; /* Prepend: text; Replace: pattern */
    size_t a_len;
    char *b; /* Replace: content */
    size_t b_len;
    bool left, right; /* Strip */
};

enum pd__pre_kind {
    PD__PRE_SPLIT,     /* regex, behavior Isolated or Removed */
    PD__PRE_BYTELEVEL, /* optional prefix space, optional GPT-2 regex; always last */
    PD__PRE_METASPACE,
};
enum pd__prepend { PD__PREPEND_ALWAYS, PD__PREPEND_FIRST, PD__PREPEND_NEVER };
struct pd__pre {
    enum pd__pre_kind kind;
    pcre2_code *re; /* Split, ByteLevel with use_regex */
    bool jit;       /* re was JIT-compiled: pcre2_jit_match skips the interpreter's checks */
    bool removed;   /* Split behavior Removed: matches are dropped */
    bool add_prefix_space;
    char repl[8]; /* Metaspace replacement (UTF-8) */
    size_t repl_len;
    enum pd__prepend prepend;
    bool split;
};

enum pd__dec_kind {
    PD__DEC_BYTELEVEL,
    PD__DEC_REPLACE,
    PD__DEC_BYTEFALLBACK,
    PD__DEC_FUSE,
    PD__DEC_STRIP,
    PD__DEC_METASPACE,
};
struct pd__dec {
    enum pd__dec_kind kind;
    char *pat, *content; /* Replace */
    size_t pat_len, content_len;
    char strip_char[8]; /* Strip content (UTF-8) */
    size_t strip_len, start, stop;
    char repl[8]; /* Metaspace replacement */
    size_t repl_len;
    enum pd__prepend prepend;
    bool fused; /* an earlier decoder (Fuse, ByteLevel) already joined the tokens */
};

struct pd__added {
    char *content; /* as written */
    size_t len;
    char *norm; /* content after the normalizer (normalized tokens match this) */
    size_t norm_len;
    int32_t id;
    bool special, single_word, lstrip, rstrip, normalized;
};

/* Added tokens of one matching set, grouped by first byte, longest first. */
struct pd__added_index {
    int32_t *order;      /* [n] indices into pd_tokenizer.added */
    uint32_t start[257]; /* order[start[b] .. start[b+1]) begin with byte b */
    size_t n;
};

/*
 * Word cache: BPE output of recently seen words, as HF's BPE cache. BPE of a word depends on the
 * word's bytes alone, so a hit returns exactly what the merge loop would. Direct-mapped and fixed
 * in size: a colliding word replaces the old one, memory never grows. Words longer than
 * PD__WCACHE_KEY bytes or with more than PD__WCACHE_IDS ids are not cached. The tokenizer may be
 * used from many threads at once, so slots are read and written under `mu`, taken with trylock:
 * a thread that finds it busy computes the word itself (HF's try_read/try_write), so the cache
 * never makes one encode wait for another.
 */
#define PD__WCACHE_SLOTS 8192 /* power of two; 128 bytes each, 1 MiB per tokenizer */
#define PD__WCACHE_KEY 40     /* bytes */
#define PD__WCACHE_IDS 20
struct pd__wcache_slot {
    uint32_t hash;
    uint8_t key_len; /* 0: empty (empty words never reach BPE) */
    uint8_t n_ids;
    char key[PD__WCACHE_KEY];
    int32_t ids[PD__WCACHE_IDS];
};
struct pd__wcache {
    pthread_mutex_t mu;
    struct pd__wcache_slot slots[PD__WCACHE_SLOTS];
};

#define PD__MAX_NORM 8
#define PD__MAX_PRE 8
#define PD__MAX_DEC 8

struct pd_tokenizer {
    /* model (BPE) */
    struct pd__strmap vocab; /* token string → id, model vocabulary */
    char **tokens;           /* [n_ids] token string of every id (owned), "" for holes */
    uint32_t *token_len;     /* [n_ids] bytes */
    int32_t n_ids;
    struct pd__pairmap merges;
    int32_t unk_id; /* -1 when the model has no unk token */
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_token_id[256]; /* "<0xNN>" ids, -1 when absent */
    int32_t ascii_id[128];      /* id of each one-character ASCII token, -1 when absent */
    /* SentencePiece-style models: no merge joins a token ending in something other than "▁"
     * to one starting with "▁" (checked at load), so BPE of a text equals BPE of its pieces cut
     * before every "▁" that follows another character; cutting keeps words short and cacheable. */
    bool split_before_marker;
#define PD__SPM_MARKER "\xE2\x96\x81" /* U+2581 */
#define PD__SPM_MARKER_LEN 3
    struct pd__wcache *wcache; /* owned; NULL when it could not be allocated */

    /* byte-level mode (ByteLevel pre-tokenizer): BPE on raw bytes */
    bool byte_level;
    int32_t byte_char_id[256];   /* id of the GPT-2 character of each byte, -1 when absent */
    struct pd__strmap raw_vocab; /* raw bytes → id, for ignore_merges */
    char *raw_arena;             /* key bytes of raw_vocab */

    struct pd__norm norm[PD__MAX_NORM];
    int n_norm;
    struct pd__pre pre[PD__MAX_PRE];
    int n_pre;
    struct pd__dec dec[PD__MAX_DEC];
    int n_dec;
    bool has_decoder;

    struct pd__added *added; /* [n_added] */
    size_t n_added;
    struct pd__strmap added_map; /* content → index into added */
    struct pd__added_index raw_index, norm_index;
    bool *is_special;     /* [n_ids] */
    int32_t *added_of_id; /* [n_ids] index into added, -1 for model tokens */

    int32_t *prefix_ids, *suffix_ids; /* post-processor, applied with PD_TOK_ADD_SPECIAL */
    size_t n_prefix, n_suffix;

    int32_t bos_id, eos_id;
    char *bos_token, *eos_token;
    char *chat_template;
};

/* ---- UTF-8 helpers ---- */
/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is invalid or cut short. */
size_t pd__utf8_valid_len(const uint8_t *s, size_t n);
/* Decodes one valid character (caller validated). Returns its byte length. */
size_t pd__utf8_decode(const uint8_t *s, uint32_t *cp);
/* Offset of the first invalid byte of s[0..n), or n when all of it is valid UTF-8. */
size_t pd__utf8_check(const uint8_t *s, size_t n);

/* Runs the normalizer of t on s[0..n), appending to out (tokenizer_encode.c). */
struct pd__buf;
int pd__normalize(const struct pd_tokenizer *t, const char *s, size_t n, struct pd__buf *out);

/* A growable byte buffer. */
struct pd__buf {
    char *p;
    size_t n, cap;
};
int pd__buf_put(struct pd__buf *b, const void *p, size_t n);
void pd__buf_free(struct pd__buf *b);

#endif
