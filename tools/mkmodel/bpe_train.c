/*
 * bpe_train.c — the trainer behind bpe_train.h. Owns: splitting a corpus into words (an
 * approximation of the Llama-3/Qwen2 split regex for byte-level, whitespace-led pieces for
 * sentencepiece), the alphabet, and the merge loop.
 *
 * The loop is the textbook one: count every adjacent pair over the distinct words (weighted by
 * how often each word occurs), merge the best pair everywhere, repeat. It recounts from scratch
 * each round instead of maintaining counts incrementally: corpora here are a few KB and merges a
 * few thousand, so a round costs microseconds and the simple version is obviously right.
 * Deliberately not here: tokenizer.json layout and special tokens (tokgen.c), encoding text.
 */
#include "tools/mkmodel/bpe_train.h"
#include "common/base/alloc.h"
#include "model/tokenizer/byte_level.h"
#include "common/base/status.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPT-2 byte alphabet ---- */

unsigned pd_bpe_byte_to_codepoint(unsigned char b) {
    return pd__byte_to_char(b);
}

int pd_bpe_min_tokens(enum pd_bpe_style style, int n_prefix) {
    return n_prefix + 256;
}

/* ---- UTF-8 and a coarse Unicode classification ---- */

/* Decodes one code point at s[0..n); *len gets its byte length. Malformed bytes decode as
 * U+FFFD of length 1 so every byte still lands in some word. */
static uint32_t utf8_decode(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0];
    size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (need == 0 || need > n) {
        *len = 1;
        return c < 0x80 ? c : 0xFFFD;
    }
    uint32_t cp = need == 1 ? c : need == 2 ? (c & 0x1F) : need == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *len = need;
    return cp;
}

enum cp_class { CLS_LETTER, CLS_DIGIT, CLS_SPACE, CLS_OTHER };

/* \s, \p{N} and \p{L} over the scripts a test corpus uses (Latin, Greek, Cyrillic, CJK, kana,
 * Hangul). Anything else counts as "other": a wrong guess only moves a word boundary. */
static enum cp_class cp_classify(uint32_t c) {
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
        (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
        c == 0x3000)
        return CLS_SPACE;
    if ((c >= '0' && c <= '9') || (c >= 0x660 && c <= 0x669) || (c >= 0xFF10 && c <= 0xFF19) ||
        c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE))
        return CLS_DIGIT;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == 0xAA || c == 0xB5 || c == 0xBA ||
        (c >= 0xC0 && c <= 0x2AF && c != 0xD7 && c != 0xF7) ||
        (c >= 0x370 && c <= 0x3FF && c != 0x37E && c != 0x387) ||
        (c >= 0x400 && c <= 0x52F && !(c >= 0x482 && c <= 0x489)) || (c >= 0x3041 && c <= 0x3096) ||
        (c >= 0x30A1 && c <= 0x30FA) || (c >= 0x30FC && c <= 0x30FF) ||
        (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) ||
        (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0xFF21 && c <= 0xFF3A) ||
        (c >= 0xFF41 && c <= 0xFF5A))
        return CLS_LETTER;
    return CLS_OTHER;
}

static uint32_t ascii_lower(uint32_t c) {
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* End (exclusive, code point index) of the word starting at i under the Llama-3/Qwen2 pattern
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * taking the alternatives in order, as the regex engine does. */
static size_t split_bytelevel(const uint32_t *cp, const unsigned char *cls, size_t n, size_t i,
                              int max_digits) {
    uint32_t c = cp[i];
    if (c == '\'' && i + 1 < n) {
        uint32_t c1 = ascii_lower(cp[i + 1]), c2 = i + 2 < n ? ascii_lower(cp[i + 2]) : 0;
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
            return i + 3;
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
            return i + 2;
    }
    size_t j = i;
    if (cls[i] == CLS_LETTER ||
        (c != '\r' && c != '\n' && cls[i] != CLS_DIGIT && i + 1 < n && cls[i + 1] == CLS_LETTER)) {
        j = i + 1;
        while (j < n && cls[j] == CLS_LETTER)
            j++;
        return j;
    }
    if (cls[i] == CLS_DIGIT) {
        while (j < n && cls[j] == CLS_DIGIT && (int)(j - i) < max_digits)
            j++;
        return j;
    }
    if (c == ' ' && i + 1 < n && cls[i + 1] == CLS_OTHER)
        j = i + 1;
    if (cls[j] == CLS_OTHER) {
        while (j < n && cls[j] == CLS_OTHER)
            j++;
        while (j < n && (cp[j] == '\r' || cp[j] == '\n'))
            j++;
        return j;
    }
    /* whitespace: through the last newline of the run, else all but the last blank (which
     * then leads the next word), else the whole run */
    j = i;
    size_t last_nl = SIZE_MAX;
    while (j < n && cls[j] == CLS_SPACE) {
        if (cp[j] == '\r' || cp[j] == '\n')
            last_nl = j;
        j++;
    }
    if (last_nl != SIZE_MAX)
        return last_nl + 1;
    if (j < n && j - i >= 2)
        return j - 1;
    return j > i ? j : i + 1;
}

/* ---- hash maps: token text -> id, and (left, right) pair -> count ---- */

static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

struct tok {
    char *bytes; /* raw bytes (byte-level) or UTF-8 text (sentencepiece), not NUL-terminated */
    size_t len;
};

/* Open addressing; slots hold id + 1 (0 = empty). Grows at half load. */
struct tok_map {
    int *slots;
    size_t cap; /* power of two */
    size_t n;
};

/* Slot of text s: *slot is where it is, or the empty slot where it would go (returns -1). */
static int tok_map_find(const struct tok_map *m, const struct tok *toks, const void *s, size_t len,
                        size_t *slot) {
    size_t i = fnv1a(s, len) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        int v = m->slots[i];
        if (v == 0) {
            *slot = i;
            return -1;
        }
        const struct tok *t = &toks[v - 1];
        if (t->len == len && memcmp(t->bytes, s, len) == 0) {
            *slot = i;
            return v - 1;
        }
    }
}

static int tok_map_insert(struct tok_map *m, const struct tok *toks, int id) {
    if (2 * (m->n + 1) > m->cap) {
        size_t ncap = m->cap ? 2 * m->cap : 1024;
        int *ns = pd_calloc(ncap, sizeof(int));
        if (!ns)
            return pd_error_wrap(PD_ENOMEM, "growing the BPE token map");
        struct tok_map g = {ns, ncap, 0};
        for (size_t i = 0; i < m->cap; i++) {
            if (m->slots[i]) {
                size_t s;
                const struct tok *t = &toks[m->slots[i] - 1];
                tok_map_find(&g, toks, t->bytes, t->len, &s);
                g.slots[s] = m->slots[i];
                g.n++;
            }
        }
        pd_free(m->slots);
        *m = g;
    }
    size_t s;
    int found = tok_map_find(m, toks, toks[id].bytes, toks[id].len, &s);
    PD_ASSERT(found < 0); /* token texts are unique by construction */
    m->slots[s] = id + 1;
    m->n++;
    return PD_OK;
}

struct pair_slot {
    uint64_t key; /* left << 32 | right */
    long long count;
    uint32_t stamp; /* slot is live in round `stamp` only: clearing is one increment */
};

struct pair_map {
    struct pair_slot *slots;
    size_t cap; /* power of two, > 2 * most pairs a round can see */
    uint32_t stamp;
};

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static void pair_add(struct pair_map *m, uint64_t key, long long count) {
    for (size_t i = mix64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        struct pair_slot *s = &m->slots[i];
        if (s->stamp != m->stamp) {
            s->stamp = m->stamp;
            s->key = key;
            s->count = count;
            return;
        }
        if (s->key == key) {
            s->count += count;
            return;
        }
    }
}

static int pair_banned(const uint64_t *banned, size_t n_banned, uint64_t key) {
    for (size_t i = 0; i < n_banned; i++)
        if (banned[i] == key)
            return 1;
    return 0;
}

/* ---- the trainer's state ---- */

/* One distinct word: its current symbols and how often the corpus has it. */
struct word {
    size_t sym_off;  /* into trainer.syms */
    int n_syms;      /* shrinks as merges apply */
    long long count; /* occurrences in the corpus */
    size_t text_off; /* initial text in trainer.word_text, the deduplication key */
    size_t text_len; /* bytes */
};

struct trainer {
    const struct pd_bpe_train_opts *o;
    struct tok *toks;
    size_t n_toks, cap_toks;
    struct tok_map map;
    struct word *words;
    size_t n_words, cap_words;
    int *word_slots; /* open addressing over words by initial text; word id + 1, 0 = empty */
    size_t word_cap;
    int *syms; /* every word's symbols, back to back */
    size_t n_syms, cap_syms;
    char *word_text;
    size_t n_word_text, cap_word_text;
    int (*merges)[2];
    size_t n_merges, cap_merges;
};

static int tok_add(struct trainer *t, const char *bytes, size_t len, int *id) {
    if (pd_array_grow((void **)&t->toks, &t->cap_toks, t->n_toks + 1, sizeof(*t->toks)))
        return pd_error_wrap(PD_ENOMEM, "growing the BPE vocabulary");
    char *b = pd_malloc(len + 1);
    if (!b)
        return pd_error_wrap(PD_ENOMEM, "storing a BPE token");
    memcpy(b, bytes, len);
    b[len] = 0;
    t->toks[t->n_toks] = (struct tok){b, len};
    int rc = tok_map_insert(&t->map, t->toks, (int)t->n_toks);
    if (rc) {
        pd_free(b);
        return rc;
    }
    *id = (int)t->n_toks++;
    return PD_OK;
}

static int tok_lookup(const struct trainer *t, const void *s, size_t len) {
    size_t slot;
    return t->map.cap ? tok_map_find(&t->map, t->toks, s, len, &slot) : -1;
}

static size_t word_slot(const struct trainer *t, const int *slots, size_t cap, const char *s,
                        size_t len) {
    size_t i = fnv1a(s, len) & (cap - 1);
    for (; slots[i]; i = (i + 1) & (cap - 1)) {
        const struct word *w = &t->words[slots[i] - 1];
        if (w->text_len == len && memcmp(t->word_text + w->text_off, s, len) == 0)
            break;
    }
    return i;
}

/* Adds one occurrence of the word whose initial text is s[0..len) and symbols ids[0..n). */
static int word_add(struct trainer *t, const char *s, size_t len, const int *ids, int n) {
    if (n < 2)
        return PD_OK; /* a one-symbol word has no pair to offer */
    if (2 * (t->n_words + 1) > t->word_cap) {
        size_t ncap = t->word_cap ? 2 * t->word_cap : 4096;
        int *ns = pd_calloc(ncap, sizeof(int));
        if (!ns)
            return pd_error_wrap(PD_ENOMEM, "growing the BPE word map");
        for (size_t w = 0; w < t->n_words; w++) {
            const struct word *wd = &t->words[w];
            ns[word_slot(t, ns, ncap, t->word_text + wd->text_off, wd->text_len)] = (int)w + 1;
        }
        pd_free(t->word_slots);
        t->word_slots = ns;
        t->word_cap = ncap;
    }
    size_t slot = word_slot(t, t->word_slots, t->word_cap, s, len);
    if (t->word_slots[slot]) {
        t->words[t->word_slots[slot] - 1].count++;
        return PD_OK;
    }
    if (pd_array_grow((void **)&t->words, &t->cap_words, t->n_words + 1, sizeof(*t->words)) ||
        pd_array_grow((void **)&t->syms, &t->cap_syms, t->n_syms + (size_t)n, sizeof(int)) ||
        pd_array_grow((void **)&t->word_text, &t->cap_word_text, t->n_word_text + len, 1))
        return pd_error_wrap(PD_ENOMEM, "growing the BPE word list");
    t->words[t->n_words] = (struct word){t->n_syms, n, 1, t->n_word_text, len};
    memcpy(t->syms + t->n_syms, ids, (size_t)n * sizeof(int));
    t->n_syms += (size_t)n;
    memcpy(t->word_text + t->n_word_text, s, len);
    t->n_word_text += len;
    t->word_slots[slot] = (int)++t->n_words;
    return PD_OK;
}

/* Decoded corpus (or normalized corpus): code points with their byte spans. */
struct cps {
    uint32_t *cp;
    unsigned char *cls;
    size_t *off; /* [n + 1] byte offsets */
    size_t n;
};

static void cps_free(struct cps *c) {
    pd_free(c->cp);
    pd_free(c->cls);
    pd_free(c->off);
}

static int cps_decode(const char *text, size_t len, struct cps *out) {
    memset(out, 0, sizeof(*out));
    out->cp = pd_malloc((len + 1) * sizeof(uint32_t));
    out->cls = pd_malloc(len + 1);
    out->off = pd_malloc((len + 1) * sizeof(size_t));
    if (!out->cp || !out->cls || !out->off) {
        cps_free(out);
        return pd_error_wrap(PD_ENOMEM, "decoding the BPE corpus");
    }
    size_t i = 0;
    while (i < len) {
        size_t l;
        uint32_t c = utf8_decode((const unsigned char *)text + i, len - i, &l);
        out->off[out->n] = i;
        out->cp[out->n] = c;
        out->cls[out->n] = (unsigned char)cp_classify(c);
        out->n++;
        i += l;
    }
    out->off[out->n] = len;
    return PD_OK;
}

/* ---- byte-level alphabet and words ---- */

static int bytelevel_setup(struct trainer *t, int **scratch, size_t *scratch_cap) {
    /* ids 0..255 are the bytes ordered by the code point GPT-2 maps them to: printable bytes
     * first (they map to themselves), then the rest from U+0100 on, as Llama-3 and Qwen2 do */
    unsigned char order[256];
    int n = 0;
    for (unsigned b = 0; b < 256; b++)
        if (pd__byte_is_printable(b))
            order[n++] = (unsigned char)b;
    for (unsigned b = 0; b < 256; b++)
        if (!pd__byte_is_printable(b))
            order[n++] = (unsigned char)b;
    int byte_id[256];
    for (int i = 0; i < 256; i++) {
        int rc = tok_add(t, (const char *)&order[i], 1, &byte_id[order[i]]);
        if (rc)
            return rc;
    }

    struct cps c;
    int rc = cps_decode(t->o->corpus, t->o->corpus_len, &c);
    if (rc)
        return rc;
    int max_digits = t->o->max_digits > 0 ? t->o->max_digits : 3;
    for (size_t i = 0; i < c.n && rc == PD_OK;) {
        size_t j = split_bytelevel(c.cp, c.cls, c.n, i, max_digits);
        const char *s = t->o->corpus + c.off[i];
        size_t len = c.off[j] - c.off[i];
        if (pd_array_grow((void **)scratch, scratch_cap, len, sizeof(int))) {
            rc = pd_error_wrap(PD_ENOMEM, "splitting the BPE corpus");
            break;
        }
        for (size_t k = 0; k < len; k++)
            (*scratch)[k] = byte_id[(unsigned char)s[k]];
        rc = word_add(t, s, len, *scratch, (int)len);
        i = j;
    }
    cps_free(&c);
    return rc;
}

/* ---- sentencepiece alphabet and words ---- */

#define SP_SPACE "\xE2\x96\x81" /* U+2581 "▁", SentencePiece's visible space */

struct char_count {
    uint32_t cp;
    long long count;
};

static int char_count_cmp(const void *a, const void *b) {
    const struct char_count *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return x->cp < y->cp ? -1 : x->cp > y->cp;
}

static int uint32_cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Emits one piece (code points [i, j) of the normalized text), cut further wherever a
 * character is outside the alphabet: such characters are left to byte fallback. */
static int sp_piece(struct trainer *t, const struct cps *c, const char *text, size_t i, size_t j,
                    int **scratch, size_t *scratch_cap) {
    while (i < j) {
        int n = 0;
        size_t start = i;
        if (pd_array_grow((void **)scratch, scratch_cap, j - i, sizeof(int)))
            return pd_error_wrap(PD_ENOMEM, "splitting the BPE corpus");
        for (; i < j; i++) {
            int id = tok_lookup(t, text + c->off[i], c->off[i + 1] - c->off[i]);
            if (id < 0)
                break;
            (*scratch)[n++] = id;
        }
        int rc = word_add(t, text + c->off[start], c->off[i] - c->off[start], *scratch, n);
        if (rc)
            return rc;
        if (i < j)
            i++; /* skip the character byte fallback will spell */
    }
    return PD_OK;
}

static int is_sp_space(const struct cps *c, size_t i) {
    return c->cp[i] == 0x2581;
}

static int sp_breaks_word(const struct cps *c, size_t i) {
    return c->cp[i] < 0x20 || c->cp[i] == 0x7F || (c->cp[i] >= '0' && c->cp[i] <= '9');
}

static int sentencepiece_setup(struct trainer *t, int **scratch, size_t *scratch_cap) {
    const struct pd_bpe_train_opts *o = t->o;
    int rc = PD_OK, id;
    char *norm = NULL;
    struct cps c = {0};
    struct char_count *counts = NULL;
    uint32_t *sorted = NULL;

    for (int i = 0; i < o->n_prefix; i++)
        if ((rc = tok_add(t, o->prefix_tokens[i], strlen(o->prefix_tokens[i]), &id)))
            return rc;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        if ((rc = tok_add(t, name, strlen(name), &id)))
            return rc;
    }

    /* the normalizer Llama-2's tokenizer.json runs: Prepend("▁"), Replace(" ", "▁") */
    size_t nlen = 3;
    for (size_t i = 0; i < o->corpus_len; i++)
        nlen += o->corpus[i] == ' ' ? 3 : 1;
    norm = pd_malloc(nlen);
    if (!norm)
        return pd_error_wrap(PD_ENOMEM, "normalizing the BPE corpus");
    size_t k = 0;
    memcpy(norm, SP_SPACE, 3);
    k = 3;
    for (size_t i = 0; i < o->corpus_len; i++) {
        if (o->corpus[i] == ' ') {
            memcpy(norm + k, SP_SPACE, 3);
            k += 3;
        } else {
            norm[k++] = o->corpus[i];
        }
    }
    if ((rc = cps_decode(norm, nlen, &c)))
        goto out;

    /* alphabet: the most frequent printable characters, at most half of the room left after
     * the fixed tokens, so merges get the other half */
    sorted = pd_malloc((c.n + 1) * sizeof(uint32_t));
    counts = pd_malloc((c.n + 1) * sizeof(*counts));
    if (!sorted || !counts) {
        rc = pd_error_wrap(PD_ENOMEM, "counting BPE corpus characters");
        goto out;
    }
    size_t ns = 0;
    for (size_t i = 0; i < c.n; i++)
        if (c.cp[i] >= 0x20 && c.cp[i] != 0x7F && c.cp[i] != 0xFFFD)
            sorted[ns++] = c.cp[i];
    qsort(sorted, ns, sizeof(uint32_t), uint32_cmp);
    size_t nc = 0;
    for (size_t i = 0; i < ns; i++) {
        if (nc && counts[nc - 1].cp == sorted[i])
            counts[nc - 1].count++;
        else
            counts[nc++] = (struct char_count){sorted[i], 1};
    }
    qsort(counts, nc, sizeof(*counts), char_count_cmp);
    size_t room = ((size_t)o->max_tokens - t->n_toks) / 2;
    if (nc > room)
        nc = room;
    for (size_t i = 0; i < nc; i++) {
        char u[4];
        size_t l = pd__utf8_encode(counts[i].cp, u);
        if (tok_lookup(t, u, l) >= 0)
            continue; /* a one-character prefix token */
        if ((rc = tok_add(t, u, l, &id)))
            goto out;
    }

    /* words: a run of n "▁" before a word gives "▁"×(n-1) and "▁word" (so indentation can
     * merge into "▁▁▁"); digits stand alone; control characters separate words. */
    for (size_t i = 0; i < c.n;) {
        if (sp_breaks_word(&c, i)) {
            if (c.cp[i] >= '0' && c.cp[i] <= '9')
                rc = sp_piece(t, &c, norm, i, i + 1, scratch, scratch_cap);
            i++;
        } else if (is_sp_space(&c, i)) {
            size_t j = i;
            while (j < c.n && is_sp_space(&c, j))
                j++;
            if (j < c.n && !sp_breaks_word(&c, j)) {
                if (j - i > 1)
                    rc = sp_piece(t, &c, norm, i, j - 1, scratch, scratch_cap);
                i = j - 1;
                j++;
                while (j < c.n && !is_sp_space(&c, j) && !sp_breaks_word(&c, j))
                    j++;
            }
            if (rc == PD_OK)
                rc = sp_piece(t, &c, norm, i, j, scratch, scratch_cap);
            i = j;
        } else {
            size_t j = i + 1;
            while (j < c.n && !is_sp_space(&c, j) && !sp_breaks_word(&c, j))
                j++;
            rc = sp_piece(t, &c, norm, i, j, scratch, scratch_cap);
            i = j;
        }
        if (rc)
            goto out;
    }
out:
    pd_free(counts);
    pd_free(sorted);
    cps_free(&c);
    pd_free(norm);
    return rc;
}

/* ---- merge loop ---- */

/* Orders candidate pairs: more frequent first, then by the left token's bytes, then the
 * right's, so the choice never depends on hash layout. */
static int pair_better(const struct trainer *t, long long ca, uint64_t a, long long cb,
                       uint64_t b) {
    if (ca != cb)
        return ca > cb;
    const struct tok *la = &t->toks[a >> 32], *ra = &t->toks[(uint32_t)a];
    const struct tok *lb = &t->toks[b >> 32], *rb = &t->toks[(uint32_t)b];
    size_t ma = la->len < lb->len ? la->len : lb->len;
    int d = memcmp(la->bytes, lb->bytes, ma);
    if (d || la->len != lb->len)
        return d ? d < 0 : la->len < lb->len;
    size_t mr = ra->len < rb->len ? ra->len : rb->len;
    d = memcmp(ra->bytes, rb->bytes, mr);
    return d ? d < 0 : ra->len < rb->len;
}

static int train_loop(struct trainer *t) {
    int rc = PD_OK;
    struct pair_map pm = {0};
    uint64_t *banned = NULL;
    size_t n_banned = 0, cap_banned = 0;
    char *cat = NULL;
    size_t cap_cat = 0;

    pm.cap = 64;
    while (pm.cap < 2 * t->n_syms + 2)
        pm.cap *= 2;
    pm.slots = pd_calloc(pm.cap, sizeof(*pm.slots));
    if (!pm.slots)
        return pd_error_wrap(PD_ENOMEM, "allocating BPE pair counts");

    while (t->n_toks < (size_t)t->o->max_tokens) {
        pm.stamp++;
        for (size_t w = 0; w < t->n_words; w++) {
            const struct word *wd = &t->words[w];
            const int *s = t->syms + wd->sym_off;
            for (int k = 0; k + 1 < wd->n_syms; k++)
                pair_add(&pm, (uint64_t)s[k] << 32 | (uint32_t)s[k + 1], wd->count);
        }
        uint64_t best = 0;
        long long best_count = 0;
        for (;;) {
            best_count = 0;
            for (size_t i = 0; i < pm.cap; i++) {
                const struct pair_slot *s = &pm.slots[i];
                if (s->stamp != pm.stamp)
                    continue;
                if ((best_count == 0 || pair_better(t, s->count, s->key, best_count, best)) &&
                    !pair_banned(banned, n_banned, s->key)) {
                    best = s->key;
                    best_count = s->count;
                }
            }
            if (best_count == 0)
                break;
            const struct tok *l = &t->toks[best >> 32], *r = &t->toks[(uint32_t)best];
            if (pd_array_grow((void **)&cat, &cap_cat, l->len + r->len, 1)) {
                rc = pd_error_wrap(PD_ENOMEM, "merging BPE tokens");
                goto out;
            }
            memcpy(cat, l->bytes, l->len);
            memcpy(cat + l->len, r->bytes, r->len);
            if (tok_lookup(t, cat, l->len + r->len) < 0)
                break;
            /* the pair spells a token we already have: never merge it (keeps texts unique) */
            if (pd_array_grow((void **)&banned, &cap_banned, n_banned + 1, sizeof(uint64_t))) {
                rc = pd_error_wrap(PD_ENOMEM, "merging BPE tokens");
                goto out;
            }
            banned[n_banned++] = best;
        }
        if (best_count == 0)
            break; /* every word is a single token: the corpus has nothing more to teach */

        int left = (int)(best >> 32), right = (int)(uint32_t)best, id;
        size_t len = t->toks[left].len + t->toks[right].len;
        if ((rc = tok_add(t, cat, len, &id)))
            goto out;
        if (pd_array_grow((void **)&t->merges, &t->cap_merges, t->n_merges + 1,
                          sizeof(*t->merges))) {
            rc = pd_error_wrap(PD_ENOMEM, "recording a BPE merge");
            goto out;
        }
        t->merges[t->n_merges][0] = left;
        t->merges[t->n_merges][1] = right;
        t->n_merges++;

        for (size_t w = 0; w < t->n_words; w++) {
            struct word *wd = &t->words[w];
            int *s = t->syms + wd->sym_off, n = wd->n_syms, o = 0;
            for (int k = 0; k < n; k++) {
                if (k + 1 < n && s[k] == left && s[k + 1] == right) {
                    s[o++] = id;
                    k++;
                } else {
                    s[o++] = s[k];
                }
            }
            wd->n_syms = o;
        }
    }
out:
    pd_free(cat);
    pd_free(banned);
    pd_free(pm.slots);
    return rc;
}

/* Token texts as tokenizer.json spells them. Moves the merges out of t. */
static int export_vocab(struct trainer *t, struct pd_bpe_vocab *out) {
    out->tokens = pd_calloc(t->n_toks, sizeof(char *));
    if (!out->tokens)
        return pd_error_wrap(PD_ENOMEM, "exporting the BPE vocabulary");
    out->n_tokens = (int)t->n_toks;
    for (size_t i = 0; i < t->n_toks; i++) {
        struct tok *k = &t->toks[i];
        if (t->o->style == PD_BPE_SENTENCEPIECE) {
            out->tokens[i] = k->bytes; /* already text; ownership moves */
            k->bytes = NULL;
            continue;
        }
        char *s = pd_malloc(2 * k->len + 1); /* mapped code points take at most 2 bytes */
        if (!s)
            return pd_error_wrap(PD_ENOMEM, "exporting the BPE vocabulary");
        size_t n = 0;
        for (size_t j = 0; j < k->len; j++)
            n += pd__utf8_encode(pd_bpe_byte_to_codepoint((unsigned char)k->bytes[j]), s + n);
        s[n] = 0;
        out->tokens[i] = s;
    }
    out->merges = t->merges;
    out->n_merges = (int)t->n_merges;
    out->n_base = (int)(t->n_toks - t->n_merges);
    t->merges = NULL;
    return PD_OK;
}

int pd_bpe_train(const struct pd_bpe_train_opts *o, struct pd_bpe_vocab *out) {
    memset(out, 0, sizeof(*out));
    int min = pd_bpe_min_tokens(o->style, o->style == PD_BPE_SENTENCEPIECE ? o->n_prefix : 0);
    if (o->max_tokens < min)
        return pd_errorf(PD_ERANGE, "a %s BPE vocabulary needs at least %d tokens, got %d",
                         o->style == PD_BPE_SENTENCEPIECE ? "sentencepiece" : "byte-level", min,
                         o->max_tokens);

    struct trainer t = {.o = o};
    int *scratch = NULL;
    size_t scratch_cap = 0;
    int rc = o->style == PD_BPE_SENTENCEPIECE ? sentencepiece_setup(&t, &scratch, &scratch_cap)
                                              : bytelevel_setup(&t, &scratch, &scratch_cap);
    if (rc == PD_OK)
        rc = train_loop(&t);
    if (rc == PD_OK)
        rc = export_vocab(&t, out);
    if (rc)
        pd_bpe_vocab_free(out);

    for (size_t i = 0; i < t.n_toks; i++)
        pd_free(t.toks[i].bytes);
    pd_free(t.toks);
    pd_free(t.map.slots);
    pd_free(t.words);
    pd_free(t.word_slots);
    pd_free(t.syms);
    pd_free(t.word_text);
    pd_free(t.merges);
    pd_free(scratch);
    return rc;
}

void pd_bpe_vocab_free(struct pd_bpe_vocab *v) {
    if (!v)
        return;
    if (v->tokens)
        for (int i = 0; i < v->n_tokens; i++)
            pd_free(v->tokens[i]);
    pd_free(v->tokens);
    pd_free(v->merges);
    memset(v, 0, sizeof(*v));
}
