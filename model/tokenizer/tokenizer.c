/*
 * tokenizer.c — loads tokenizer.json (+ tokenizer_config.json, chat_template.jinja) into the
 * struct pd_tokenizer of tokenizer_internal.h (immutable after load but for its word cache), plus
 * the small shared helpers (hash maps, UTF-8, GPT-2's byte table).
 *
 * Every problem in the file is reported with its JSON path ("model.merges[12]: ...") so a user
 * can find it; a construct we do not implement is PD_EUNSUPPORTED and names the construct, never
 * silently ignored, because a quietly different pipeline gives quietly different ids.
 */
#include "model/tokenizer/tokenizer_internal.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

uint32_t pd__hash_bytes(const void *p, size_t n) {
    /* FNV-1a: keys are short token strings; good enough spread, no table. */
    const uint8_t *s = p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 16777619u;
    return h;
}

static int strmap_grow(struct pd__strmap *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    struct pd__strmap_slot *ns = pd_calloc(ncap, sizeof(*ns));
    if (!ns)
        return PD_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        struct pd__strmap_slot *s = &m->slots[i];
        if (!s->key)
            continue;
        size_t j = s->hash & (ncap - 1);
        while (ns[j].key)
            j = (j + 1) & (ncap - 1);
        ns[j] = *s;
    }
    pd_free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return PD_OK;
}

int pd__strmap_put(struct pd__strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m) != PD_OK)
        return PD_ENOMEM;
    uint32_t h = pd__hash_bytes(key, len);
    size_t i = h & (m->cap - 1);
    while (m->slots[i].key) {
        struct pd__strmap_slot *s = &m->slots[i];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            s->val = val;
            return PD_OK;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->slots[i] = (struct pd__strmap_slot){key, (uint32_t)len, h, val};
    m->n++;
    return PD_OK;
}

int32_t pd__strmap_get(const struct pd__strmap *m, const char *key, size_t len) {
    if (!m->cap)
        return -1;
    uint32_t h = pd__hash_bytes(key, len);
    size_t i = h & (m->cap - 1);
    while (m->slots[i].key) {
        const struct pd__strmap_slot *s = &m->slots[i];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0)
            return s->val;
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

void pd__strmap_free(struct pd__strmap *m) {
    pd_free(m->slots);
    memset(m, 0, sizeof(*m));
}

static int pairmap_grow(struct pd__pairmap *m) {
    size_t ncap = m->cap ? m->cap * 2 : 1024;
    struct pd__pairmap n = {0};
    n.keys = pd_malloc(ncap * sizeof(uint64_t));
    n.rank = pd_malloc(ncap * sizeof(int32_t));
    n.id = pd_malloc(ncap * sizeof(int32_t));
    if (!n.keys || !n.rank || !n.id) {
        pd__pairmap_free(&n);
        return PD_ENOMEM;
    }
    memset(n.keys, 0xff, ncap * sizeof(uint64_t));
    n.cap = ncap;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == UINT64_MAX)
            continue;
        size_t j = (size_t)((m->keys[i] * 0x9E3779B97F4A7C15ull) >> 32) & (ncap - 1);
        while (n.keys[j] != UINT64_MAX)
            j = (j + 1) & (ncap - 1);
        n.keys[j] = m->keys[i];
        n.rank[j] = m->rank[i];
        n.id[j] = m->id[i];
    }
    n.n = m->n;
    pd__pairmap_free(m);
    *m = n;
    return PD_OK;
}

int pd__pairmap_put(struct pd__pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    if ((m->n + 1) * 2 > m->cap && pairmap_grow(m) != PD_OK)
        return PD_ENOMEM;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 32) & (m->cap - 1);
    while (m->keys[i] != UINT64_MAX) {
        if (m->keys[i] == k)
            return PD_OK;
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = k;
    m->rank[i] = rank;
    m->id[i] = id;
    m->n++;
    return PD_OK;
}

void pd__pairmap_free(struct pd__pairmap *m) {
    pd_free(m->keys);
    pd_free(m->rank);
    pd_free(m->id);
    memset(m, 0, sizeof(*m));
}

int pd__buf_put(struct pd__buf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap && pd_array_grow((void **)&b->p, &b->cap, b->n + n + 1, 1) != PD_OK)
        return PD_ENOMEM;
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
    return PD_OK;
}

void pd__buf_free(struct pd__buf *b) {
    pd_free(b->p);
    memset(b, 0, sizeof(*b));
}

size_t pd__utf8_valid_len(const uint8_t *s, size_t n) {
    if (n == 0)
        return 0;
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

size_t pd__utf8_check(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) { /* prompts are mostly ASCII: step over it eight bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                i += 8;
                continue;
            }
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = pd__utf8_valid_len(s + i, n - i);
        if (!l)
            return i;
        i += l;
    }
    return n;
}

size_t pd__utf8_decode(const uint8_t *s, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

size_t pd__utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2 bytes_to_unicode (model/tokenizer/byte_level.h). */
/* Both directions as tables: they sit on the encode and decode paths of every token. */
struct byte_tables {
    uint16_t cp[256];  /* byte → code point */
    int16_t byte[324]; /* code point → byte, -1 */
};
static struct byte_tables tables;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void) {
    uint32_t n = 0;
    for (int i = 0; i < 324; i++)
        tables.byte[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        tables.cp[b] = (uint16_t)(pd__byte_is_printable(b) ? b : 256 + n++);
        tables.byte[tables.cp[b]] = (int16_t)b;
    }
}

static const struct byte_tables *byte_tables(void) {
    pthread_once(&tables_once, tables_init);
    return &tables;
}

uint32_t pd__byte_to_char(uint8_t b) {
    return byte_tables()->cp[b];
}

int pd__char_to_byte(uint32_t cp) {
    return cp < 324 ? byte_tables()->byte[cp] : -1;
}

/* ---------------------------------------------------------------- JSON access */

struct load {
    const char *what; /* "/m/tokenizer.json" */
    struct pd_tokenizer *t;
};

static int bad(const struct load *ld, const char *path, const char *msg) {
    return pd_errorf(PD_EFORMAT, "%s: %s: %s", ld->what, path, msg);
}

static int unsupported(const struct load *ld, const char *path, const char *what) {
    return pd_errorf(PD_EUNSUPPORTED, "%s: %s: %s is not supported", ld->what, path, what);
}

static const char *get_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool get_bool(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v);
    return dflt;
}

/* A one-character string (Metaspace replacement, Strip content) as UTF-8 in out[8]. */
static int get_char(const struct load *ld, const cJSON *o, const char *key, const char *path,
                    const char *dflt, char out[8], size_t *len) {
    const char *s = get_str(o, key);
    if (!s)
        s = dflt;
    if (!s) {
        char p[128];
        snprintf(p, sizeof(p), "%s.%s", path, key);
        return bad(ld, p, "missing");
    }
    size_t n = strlen(s);
    size_t l = pd__utf8_valid_len((const uint8_t *)s, n);
    if (l == 0 || l != n) {
        char p[128];
        snprintf(p, sizeof(p), "%s.%s", path, key);
        return bad(ld, p, "must be exactly one character");
    }
    memcpy(out, s, n);
    out[n] = '\0';
    *len = n;
    return PD_OK;
}

static int prepend_scheme(const struct load *ld, const cJSON *o, const char *path,
                          enum pd__prepend *out) {
    const char *s = get_str(o, "prepend_scheme");
    if (!s) {
        /* files before tokenizers 0.15 spell it add_prefix_space */
        *out = get_bool(o, "add_prefix_space", true) ? PD__PREPEND_ALWAYS : PD__PREPEND_NEVER;
        return PD_OK;
    }
    if (!strcmp(s, "always"))
        *out = PD__PREPEND_ALWAYS;
    else if (!strcmp(s, "first"))
        *out = PD__PREPEND_FIRST;
    else if (!strcmp(s, "never"))
        *out = PD__PREPEND_NEVER;
    else {
        char p[128];
        snprintf(p, sizeof(p), "%s.prepend_scheme", path);
        return bad(ld, p, "must be always, first or never");
    }
    return PD_OK;
}

/* ---------------------------------------------------------------- model */

static int add_token_string(struct pd_tokenizer *t, int32_t id, const char *s, size_t len) {
    pd_free(t->tokens[id]);
    t->tokens[id] = pd_strndup(s, len);
    if (!t->tokens[id])
        return PD_ENOMEM;
    t->token_len[id] = (uint32_t)len;
    return PD_OK;
}

static int merge_ids(const struct load *ld, struct pd_tokenizer *t, const char *path, const char *a,
                     size_t al, const char *b, size_t bl, int32_t rank) {
    int32_t ia = pd__strmap_get(&t->vocab, a, al), ib = pd__strmap_get(&t->vocab, b, bl);
    if (ia < 0 || ib < 0)
        return pd_errorf(PD_EFORMAT, "%s: %s: token '%.*s' is not in model.vocab", ld->what, path,
                         (int)(ia < 0 ? al : bl), ia < 0 ? a : b);
    char stack[256];
    char *cat = al + bl <= sizeof(stack) ? stack : pd_malloc(al + bl);
    if (!cat)
        return PD_ENOMEM;
    memcpy(cat, a, al);
    memcpy(cat + al, b, bl);
    int32_t id = pd__strmap_get(&t->vocab, cat, al + bl);
    int rc = PD_OK;
    if (id < 0)
        rc = pd_errorf(PD_EFORMAT, "%s: %s: merged token '%.*s' is not in model.vocab", ld->what,
                       path, (int)(al + bl), cat);
    else
        rc = pd__pairmap_put(&t->merges, ia, ib, rank, id);
    if (cat != stack)
        pd_free(cat);
    return rc;
}

static int load_model(const struct load *ld, struct pd_tokenizer *t, const cJSON *model,
                      int32_t max_added_id) {
    if (!cJSON_IsObject(model))
        return bad(ld, "model", "missing or not an object");
    const char *type = get_str(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!type) {
        /* old files leave the type out; HF then tells the models apart by their fields */
        if (merges)
            type = "BPE";
        else if (cJSON_IsArray(vocab))
            type = "Unigram";
        else
            type = "WordPiece";
    }
    if (strcmp(type, "BPE") != 0) {
        return pd_errorf(PD_EUNSUPPORTED,
                         "%s: model.type: '%s' models are not supported (only BPE is)", ld->what,
                         type);
    }
    if (!cJSON_IsObject(vocab))
        return bad(ld, "model.vocab", "missing or not an object");
    if (!cJSON_IsArray(merges))
        return bad(ld, "model.merges", "missing or not an array");
    const char *pfx = get_str(model, "continuing_subword_prefix");
    const char *sfx = get_str(model, "end_of_word_suffix");
    if (pfx && *pfx)
        return unsupported(ld, "model.continuing_subword_prefix", "a non-empty prefix");
    if (sfx && *sfx)
        return unsupported(ld, "model.end_of_word_suffix", "a non-empty suffix");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0.0)
        return unsupported(ld, "model.dropout", "BPE dropout");
    t->byte_fallback = get_bool(model, "byte_fallback", false);
    t->fuse_unk = get_bool(model, "fuse_unk", false);
    t->ignore_merges = get_bool(model, "ignore_merges", false);

    int32_t max_id = max_added_id;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e8 ||
            it->valuedouble != (double)(int32_t)it->valuedouble) {
            char p[160];
            snprintf(p, sizeof(p), "model.vocab[\"%.100s\"]", it->string);
            return bad(ld, p, "id must be a non-negative integer");
        }
        if (it->valueint > max_id)
            max_id = it->valueint;
    }
    t->n_ids = max_id + 1;
    t->tokens = pd_calloc((size_t)t->n_ids, sizeof(char *));
    t->token_len = pd_calloc((size_t)t->n_ids, sizeof(uint32_t));
    t->is_special = pd_calloc((size_t)t->n_ids, sizeof(bool));
    if (!t->tokens || !t->token_len || !t->is_special)
        return PD_ENOMEM;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = it->valueint;
        size_t len = strlen(it->string);
        if (add_token_string(t, id, it->string, len) != PD_OK)
            return PD_ENOMEM;
        if (pd__strmap_put(&t->vocab, t->tokens[id], len, id) != PD_OK)
            return PD_ENOMEM;
    }
    for (int32_t i = 0; i < t->n_ids; i++)
        if (!t->tokens[i] && add_token_string(t, i, "", 0) != PD_OK)
            return PD_ENOMEM;

    int32_t rank = 0;
    cJSON_ArrayForEach(it, merges) {
        char path[64];
        snprintf(path, sizeof(path), "model.merges[%d]", rank);
        int rc;
        if (cJSON_IsString(it)) {
            /* "a b": exactly one space, as HF requires */
            const char *s = it->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return bad(ld, path, "a merge string must be two tokens separated by one space");
            rc = merge_ids(ld, t, path, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), rank);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            const char *a = cJSON_GetArrayItem(it, 0)->valuestring;
            const char *b = cJSON_GetArrayItem(it, 1)->valuestring;
            rc = merge_ids(ld, t, path, a, strlen(a), b, strlen(b), rank);
        } else {
            return bad(ld, path, "a merge must be \"a b\" or [\"a\", \"b\"]");
        }
        if (rc != PD_OK)
            return rc;
        rank++;
    }

    t->unk_id = -1;
    const char *unk = get_str(model, "unk_token");
    if (unk) {
        t->unk_id = pd__strmap_get(&t->vocab, unk, strlen(unk));
        if (t->unk_id < 0)
            return pd_errorf(PD_EFORMAT, "%s: model.unk_token: '%s' is not in model.vocab",
                             ld->what, unk);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        t->byte_token_id[b] = pd__strmap_get(&t->vocab, name, 6);
    }
    for (int b = 0; b < 128; b++) {
        char c = (char)b;
        t->ascii_id[b] = pd__strmap_get(&t->vocab, &c, 1);
    }
    return PD_OK;
}

static bool starts_with_marker(const char *s, size_t n) {
    return n >= PD__SPM_MARKER_LEN && memcmp(s, PD__SPM_MARKER, PD__SPM_MARKER_LEN) == 0;
}
static bool ends_with_marker(const char *s, size_t n) {
    return n >= PD__SPM_MARKER_LEN &&
           memcmp(s + n - PD__SPM_MARKER_LEN, PD__SPM_MARKER, PD__SPM_MARKER_LEN) == 0;
}

/* Decides split_before_marker. Cut a text before a marker that follows another character: the
 * last symbol left of the cut covers that character, so its token string ends in something else
 * (a vocabulary character, a "<0xNN>" byte token, or unk, checked here), and every merge keeps
 * that true; the first symbol right of the cut starts with the marker (which must be in the
 * vocabulary, or byte fallback would turn it into "<0xE2>"...). If no merge joins such a pair,
 * nothing ever merges across the cut, and since BPE picks merges by rank and then position, each
 * side goes through the same merges in the same order alone as together. ignore_merges looks the
 * whole word up first, which a cut would change, so it keeps whole words; byte-level models are
 * split by their regex instead. */
static void plan_marker_split(struct pd_tokenizer *t) {
    t->split_before_marker = false;
    if (t->byte_level || t->ignore_merges ||
        pd__strmap_get(&t->vocab, PD__SPM_MARKER, PD__SPM_MARKER_LEN) < 0)
        return;
    if (t->unk_id >= 0 && ends_with_marker(t->tokens[t->unk_id], t->token_len[t->unk_id]))
        return;
    for (size_t i = 0; i < t->merges.cap; i++) {
        uint64_t k = t->merges.keys[i];
        if (k == UINT64_MAX)
            continue;
        int32_t a = (int32_t)(k >> 32), b = (int32_t)(uint32_t)k;
        if (starts_with_marker(t->tokens[b], t->token_len[b]) &&
            !ends_with_marker(t->tokens[a], t->token_len[a]))
            return;
    }
    t->split_before_marker = true;
}

/* Byte-level mode: BPE runs on raw bytes, so index the vocabulary by the bytes each token
 * stands for (ignore_merges looks whole words up there). */
static int build_byte_level(struct pd_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char c[4];
        size_t l = pd__utf8_encode(pd__byte_to_char((uint8_t)b), c);
        t->byte_char_id[b] = pd__strmap_get(&t->vocab, c, l);
    }
    size_t total = 0;
    for (int32_t i = 0; i < t->n_ids; i++)
        total += t->token_len[i];
    t->raw_arena = pd_malloc(total + 1);
    if (!t->raw_arena)
        return PD_ENOMEM;
    size_t off = 0;
    for (size_t s = 0; s < t->vocab.cap; s++) {
        const struct pd__strmap_slot *sl = &t->vocab.slots[s];
        if (!sl->key)
            continue;
        const uint8_t *p = (const uint8_t *)sl->key;
        size_t n = sl->len, i = 0, start = off;
        bool ok = true;
        while (i < n) {
            size_t l = pd__utf8_valid_len(p + i, n - i);
            uint32_t cp;
            if (!l) {
                ok = false;
                break;
            }
            pd__utf8_decode(p + i, &cp);
            int byte = pd__char_to_byte(cp);
            if (byte < 0) {
                ok = false;
                break;
            }
            t->raw_arena[off++] = (char)byte;
            i += l;
        }
        if (!ok) {
            off = start; /* not a byte-level token: BPE can never produce it */
            continue;
        }
        if (pd__strmap_put(&t->raw_vocab, t->raw_arena + start, off - start, sl->val) != PD_OK)
            return PD_ENOMEM;
    }
    return PD_OK;
}

/* ---------------------------------------------------------------- added tokens */

static int load_added_tokens(const struct load *ld, struct pd_tokenizer *t, const cJSON *arr,
                             int32_t *max_id) {
    *max_id = -1;
    if (!arr || cJSON_IsNull(arr))
        return PD_OK;
    if (!cJSON_IsArray(arr))
        return bad(ld, "added_tokens", "not an array");
    size_t n = (size_t)cJSON_GetArraySize(arr);
    t->added = pd_calloc(n ? n : 1, sizeof(*t->added));
    if (!t->added)
        return PD_ENOMEM;
    const cJSON *it;
    size_t i = 0;
    cJSON_ArrayForEach(it, arr) {
        char path[64];
        snprintf(path, sizeof(path), "added_tokens[%zu]", i);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const char *content = get_str(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8)
            return bad(ld, path, "needs an integer \"id\"");
        if (!content || !*content)
            return bad(ld, path, "needs a non-empty \"content\"");
        struct pd__added *a = &t->added[i++];
        t->n_added = i;
        a->content = pd_strdup(content);
        if (!a->content)
            return PD_ENOMEM;
        a->len = strlen(content);
        a->id = id->valueint;
        a->special = get_bool(it, "special", false);
        a->single_word = get_bool(it, "single_word", false);
        a->lstrip = get_bool(it, "lstrip", false);
        a->rstrip = get_bool(it, "rstrip", false);
        a->normalized = get_bool(it, "normalized", !a->special);
        if (a->id > *max_id)
            *max_id = a->id;
    }
    return PD_OK;
}

/* ---------------------------------------------------------------- normalizer */

typedef int (*load_fn)(const struct load *ld, struct pd_tokenizer *t, const cJSON *n,
                       const char *path);

/* A "Sequence" normalizer or pre-tokenizer: each entry of its array `key`, loaded in order. */
static int load_sequence(const struct load *ld, struct pd_tokenizer *t, const cJSON *n,
                         const char *path, const char *key, load_fn load) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, key);
    if (!cJSON_IsArray(list)) {
        char what[64];
        snprintf(what, sizeof(what), "Sequence needs a \"%s\" array", key);
        return bad(ld, path, what);
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        char p[128];
        snprintf(p, sizeof(p), "%s.%s[%d]", path, key, i++);
        int rc = load(ld, t, it, p);
        if (rc != PD_OK)
            return rc;
    }
    return PD_OK;
}

static int load_normalizer(const struct load *ld, struct pd_tokenizer *t, const cJSON *n,
                           const char *path) {
    if (!n || cJSON_IsNull(n))
        return PD_OK;
    const char *type = get_str(n, "type");
    if (!type)
        return bad(ld, path, "needs a \"type\"");
    if (!strcmp(type, "Sequence"))
        return load_sequence(ld, t, n, path, "normalizers", load_normalizer);
    if (t->n_norm == PD__MAX_NORM)
        return unsupported(ld, path, "a normalizer sequence this long");
    struct pd__norm *m = &t->norm[t->n_norm];
    memset(m, 0, sizeof(*m));
    if (!strcmp(type, "NFC"))
        m->kind = PD__NORM_NFC;
    else if (!strcmp(type, "NFD"))
        m->kind = PD__NORM_NFD;
    else if (!strcmp(type, "NFKC"))
        m->kind = PD__NORM_NFKC;
    else if (!strcmp(type, "NFKD"))
        m->kind = PD__NORM_NFKD;
    else if (!strcmp(type, "Lowercase"))
        m->kind = PD__NORM_LOWERCASE;
    else if (!strcmp(type, "Strip")) {
        m->kind = PD__NORM_STRIP;
        m->left = get_bool(n, "strip_left", false);
        m->right = get_bool(n, "strip_right", false);
    } else if (!strcmp(type, "Prepend")) {
        const char *s = get_str(n, "prepend");
        if (!s)
            return bad(ld, path, "Prepend needs a \"prepend\" string");
        m->kind = PD__NORM_PREPEND;
        m->a = pd_strdup(s);
        if (!m->a)
            return PD_ENOMEM;
        m->a_len = strlen(s);
    } else if (!strcmp(type, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *ps = get_str(pat, "String"), *c = get_str(n, "content");
        if (!ps && get_str(pat, "Regex"))
            return unsupported(ld, path, "a Replace normalizer with a Regex pattern");
        if (!ps || !*ps || !c)
            return bad(ld, path, "Replace needs pattern.String and content");
        m->kind = PD__NORM_REPLACE;
        m->a = pd_strdup(ps);
        m->b = pd_strdup(c);
        if (!m->a || !m->b) {
            pd_free(m->a);
            pd_free(m->b);
            return PD_ENOMEM;
        }
        m->a_len = strlen(ps);
        m->b_len = strlen(c);
    } else {
        char what[96];
        snprintf(what, sizeof(what), "normalizer '%s'", type);
        return unsupported(ld, path, what);
    }
    t->n_norm++;
    return PD_OK;
}

/* ---------------------------------------------------------------- pre-tokenizer */

/* GPT-2's pre-tokenizer regex, used by ByteLevel with use_regex. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int compile_regex(const struct load *ld, const char *path, const char *pattern,
                         pcre2_code **out, bool *jit) {
    int err;
    PCRE2_SIZE off;
    /* UTF + UCP: \s, \w, \d and POSIX classes follow Unicode as Oniguruma does in HF */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return pd_errorf(PD_EFORMAT, "%s: %s: regex /%s/ does not compile at offset %zu: %s",
                         ld->what, path, pattern, (size_t)off, (char *)msg);
    }
    /* JIT makes the split several times faster; without it (no JIT on this CPU) we still work */
    *jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    *out = re;
    return PD_OK;
}

static int load_pre(const struct load *ld, struct pd_tokenizer *t, const cJSON *n,
                    const char *path) {
    if (!n || cJSON_IsNull(n))
        return PD_OK;
    const char *type = get_str(n, "type");
    if (!type)
        return bad(ld, path, "needs a \"type\"");
    if (!strcmp(type, "Sequence"))
        return load_sequence(ld, t, n, path, "pretokenizers", load_pre);
    if (t->n_pre == PD__MAX_PRE)
        return unsupported(ld, path, "a pre-tokenizer sequence this long");
    if (t->n_pre > 0 && t->pre[t->n_pre - 1].kind == PD__PRE_BYTELEVEL)
        return unsupported(ld, path, "a pre-tokenizer after ByteLevel");
    struct pd__pre *p = &t->pre[t->n_pre];
    memset(p, 0, sizeof(*p));
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *re = get_str(pat, "Regex"), *str = get_str(pat, "String");
        const char *beh = get_str(n, "behavior");
        if (get_bool(n, "invert", false))
            return unsupported(ld, path, "Split with invert=true");
        if (!beh || (strcmp(beh, "Isolated") != 0 && strcmp(beh, "Removed") != 0)) {
            char what[96];
            snprintf(what, sizeof(what), "Split behavior '%s'", beh ? beh : "(missing)");
            return unsupported(ld, path, what);
        }
        p->removed = !strcmp(beh, "Removed");
        p->kind = PD__PRE_SPLIT;
        char rp[160];
        snprintf(rp, sizeof(rp), "%s.pattern", path);
        if (re) {
            int rc = compile_regex(ld, rp, re, &p->re, &p->jit);
            if (rc != PD_OK)
                return rc;
        } else if (str && *str) {
            /* a literal: quote it for PCRE2 */
            size_t l = strlen(str);
            char *q = pd_malloc(l * 2 + 8);
            if (!q)
                return PD_ENOMEM;
            snprintf(q, l * 2 + 8, "\\Q%s\\E", str);
            int rc = strstr(str, "\\E") ? unsupported(ld, rp, "a String pattern containing \\E")
                                        : compile_regex(ld, rp, q, &p->re, &p->jit);
            pd_free(q);
            if (rc != PD_OK)
                return rc;
        } else {
            return bad(ld, rp, "needs a Regex or String");
        }
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = PD__PRE_BYTELEVEL;
        p->add_prefix_space = get_bool(n, "add_prefix_space", true);
        if (get_bool(n, "use_regex", true)) {
            int rc = compile_regex(ld, path, gpt2_pattern, &p->re, &p->jit);
            if (rc != PD_OK)
                return rc;
        }
        t->byte_level = true;
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = PD__PRE_METASPACE;
        int rc = get_char(ld, n, "replacement", path, "\u2581", p->repl, &p->repl_len);
        if (rc == PD_OK)
            rc = prepend_scheme(ld, n, path, &p->prepend);
        if (rc != PD_OK)
            return rc;
        p->split = get_bool(n, "split", true);
    } else {
        char what[96];
        snprintf(what, sizeof(what), "pre-tokenizer '%s'", type);
        return unsupported(ld, path, what);
    }
    t->n_pre++;
    return PD_OK;
}

/* ---------------------------------------------------------------- post-processor */

static int push_special_ids(const struct load *ld, const cJSON *specials, const char *name,
                            const char *path, int32_t **ids, size_t *n) {
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(specials, name);
    const cJSON *list = sp ? cJSON_GetObjectItemCaseSensitive(sp, "ids") : NULL;
    if (!cJSON_IsArray(list))
        return pd_errorf(PD_EFORMAT, "%s: %s: special token '%s' is not in special_tokens",
                         ld->what, path, name);
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        if (!cJSON_IsNumber(it) || it->valueint < 0 || it->valueint >= ld->t->n_ids)
            return pd_errorf(PD_EFORMAT,
                             "%s: %s: special token '%s' has an id outside the vocabulary",
                             ld->what, path, name);
        int32_t *np = pd_realloc(*ids, (*n + 1) * sizeof(int32_t));
        if (!np)
            return PD_ENOMEM;
        *ids = np;
        (*ids)[(*n)++] = it->valueint;
    }
    return PD_OK;
}

static int load_post(const struct load *ld, struct pd_tokenizer *t, const cJSON *n,
                     const char *path, bool *has_template) {
    if (!n || cJSON_IsNull(n))
        return PD_OK;
    const char *type = get_str(n, "type");
    if (!type)
        return bad(ld, path, "needs a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "processors");
        if (!cJSON_IsArray(list))
            return bad(ld, path, "Sequence needs a \"processors\" array");
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            char p[128];
            snprintf(p, sizeof(p), "%s.processors[%d]", path, i++);
            int rc = load_post(ld, t, it, p, has_template);
            if (rc != PD_OK)
                return rc;
        }
        return PD_OK;
    }
    if (!strcmp(type, "ByteLevel"))
        return PD_OK; /* only trims offsets, which we do not report */
    if (strcmp(type, "TemplateProcessing") != 0) {
        char what[96];
        snprintf(what, sizeof(what), "post-processor '%s'", type);
        return unsupported(ld, path, what);
    }
    if (*has_template)
        return unsupported(ld, path, "two TemplateProcessing post-processors");
    *has_template = true;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(n, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(n, "special_tokens");
    if (!cJSON_IsArray(single))
        return bad(ld, path, "TemplateProcessing needs a \"single\" array");
    bool seen_a = false;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        char p[160];
        snprintf(p, sizeof(p), "%s.single[%d]", path, i++);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        if (st) {
            const char *name = get_str(st, "id");
            if (!name)
                return bad(ld, p, "SpecialToken needs an \"id\"");
            int rc = seen_a ? push_special_ids(ld, specials, name, p, &t->suffix_ids, &t->n_suffix)
                            : push_special_ids(ld, specials, name, p, &t->prefix_ids, &t->n_prefix);
            if (rc != PD_OK)
                return rc;
        } else if (sq) {
            const char *id = get_str(sq, "id");
            if (!id || strcmp(id, "A") != 0 || seen_a)
                return bad(ld, p, "the single template must hold sequence A exactly once");
            seen_a = true;
        } else {
            return bad(ld, p, "expected SpecialToken or Sequence");
        }
    }
    if (!seen_a)
        return bad(ld, path, "the single template has no sequence A");
    return PD_OK;
}

/* ---------------------------------------------------------------- decoder */

static int load_decoder(const struct load *ld, struct pd_tokenizer *t, const cJSON *n,
                        const char *path) {
    if (!n || cJSON_IsNull(n))
        return PD_OK;
    const char *type = get_str(n, "type");
    if (!type)
        return bad(ld, path, "needs a \"type\"");
    t->has_decoder = true;
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "decoders");
        if (!cJSON_IsArray(list))
            return bad(ld, path, "Sequence needs a \"decoders\" array");
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            char p[128];
            snprintf(p, sizeof(p), "%s.decoders[%d]", path, i++);
            int rc = load_decoder(ld, t, it, p);
            if (rc != PD_OK)
                return rc;
        }
        return PD_OK;
    }
    if (t->n_dec == PD__MAX_DEC)
        return unsupported(ld, path, "a decoder sequence this long");
    bool fused = false;
    for (int i = 0; i < t->n_dec; i++)
        fused |= t->dec[i].kind == PD__DEC_FUSE || t->dec[i].kind == PD__DEC_BYTELEVEL;
    struct pd__dec *d = &t->dec[t->n_dec];
    memset(d, 0, sizeof(*d));
    d->fused = fused;
    if (!strcmp(type, "ByteLevel")) {
        d->kind = PD__DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d->kind = PD__DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d->kind = PD__DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *ps = get_str(pat, "String"), *c = get_str(n, "content");
        if (!ps && get_str(pat, "Regex"))
            return unsupported(ld, path, "a Replace decoder with a Regex pattern");
        if (!ps || !*ps || !c)
            return bad(ld, path, "Replace needs pattern.String and content");
        /* after the tokens are joined the stream sees the text in pieces; a one-character
         * pattern can never straddle two pieces, a longer one could */
        if (fused && pd__utf8_valid_len((const uint8_t *)ps, strlen(ps)) != strlen(ps))
            return unsupported(ld, path, "a multi-character Replace after Fuse");
        d->kind = PD__DEC_REPLACE;
        d->pat = pd_strdup(ps);
        d->content = pd_strdup(c);
        if (!d->pat || !d->content) {
            pd_free(d->pat);
            pd_free(d->content);
            return PD_ENOMEM;
        }
        d->pat_len = strlen(ps);
        d->content_len = strlen(c);
    } else if (!strcmp(type, "Strip")) {
        d->kind = PD__DEC_STRIP;
        int rc = get_char(ld, n, "content", path, NULL, d->strip_char, &d->strip_len);
        if (rc != PD_OK)
            return rc;
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(n, "start");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(n, "stop");
        d->start = cJSON_IsNumber(st) && st->valueint > 0 ? (size_t)st->valueint : 0;
        d->stop = cJSON_IsNumber(sp) && sp->valueint > 0 ? (size_t)sp->valueint : 0;
        if (fused && d->stop)
            return unsupported(ld, path, "a Strip decoder with stop > 0 after Fuse");
    } else if (!strcmp(type, "Metaspace")) {
        d->kind = PD__DEC_METASPACE;
        int rc = get_char(ld, n, "replacement", path, "\u2581", d->repl, &d->repl_len);
        if (rc == PD_OK)
            rc = prepend_scheme(ld, n, path, &d->prepend);
        if (rc != PD_OK)
            return rc;
    } else {
        char what[96];
        snprintf(what, sizeof(what), "decoder '%s'", type);
        return unsupported(ld, path, what);
    }
    t->n_dec++;
    return PD_OK;
}

/* ---------------------------------------------------------------- added token index */

/* Order of a matching set: by first byte, then longest first (leftmost-longest matching), then
 * file order. */
static bool added_before(const struct pd_tokenizer *t, bool normalized, int32_t x, int32_t y) {
    const struct pd__added *a = &t->added[x], *b = &t->added[y];
    const char *as = normalized ? a->norm : a->content, *bs = normalized ? b->norm : b->content;
    size_t al = normalized ? a->norm_len : a->len, bl = normalized ? b->norm_len : b->len;
    if ((uint8_t)as[0] != (uint8_t)bs[0])
        return (uint8_t)as[0] < (uint8_t)bs[0];
    if (al != bl)
        return al > bl;
    return x < y;
}

static int build_index(struct pd_tokenizer *t, struct pd__added_index *ix, bool normalized) {
    size_t n = 0;
    for (size_t i = 0; i < t->n_added; i++)
        n += t->added[i].normalized == normalized && (!normalized || t->added[i].norm_len > 0);
    ix->order = pd_calloc(n ? n : 1, sizeof(int32_t));
    if (!ix->order)
        return PD_ENOMEM;
    ix->n = 0;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && (!normalized || t->added[i].norm_len > 0))
            ix->order[ix->n++] = (int32_t)i;
    for (size_t i = 1; i < ix->n; i++) { /* insertion sort: qsort has no context argument */
        int32_t v = ix->order[i];
        size_t j = i;
        while (j > 0 && added_before(t, normalized, v, ix->order[j - 1])) {
            ix->order[j] = ix->order[j - 1];
            j--;
        }
        ix->order[j] = v;
    }
    size_t k = 0;
    for (unsigned b = 0; b <= 256; b++) {
        while (k < ix->n) {
            const struct pd__added *a = &t->added[ix->order[k]];
            uint8_t first = (uint8_t)(normalized ? a->norm[0] : a->content[0]);
            if (first >= b)
                break;
            k++;
        }
        ix->start[b] = (uint32_t)k;
    }
    return PD_OK;
}

/* ---------------------------------------------------------------- config */

/* "bos_token": "<s>" | {"content": "<s>", ...} | null */
static int config_token(const cJSON *cfg, const char *key, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : get_str(v, "content");
    if (!s)
        return PD_OK;
    *out = pd_strdup(s);
    return *out ? PD_OK : PD_ENOMEM;
}

static int set_template(struct pd_tokenizer *t, const char *s) {
    pd_free(t->chat_template);
    t->chat_template = pd_strdup(s);
    return t->chat_template ? PD_OK : PD_ENOMEM;
}

static int load_config(struct pd_tokenizer *t, const char *config_json, const char *what,
                       bool has_template) {
    cJSON *cfg = cJSON_Parse(config_json);
    if (!cfg)
        return pd_errorf(PD_EFORMAT, "%s: tokenizer_config.json is not valid JSON", what);
    int rc = PD_ENOMEM;
    if (config_token(cfg, "bos_token", &t->bos_token) != PD_OK ||
        config_token(cfg, "eos_token", &t->eos_token) != PD_OK)
        goto out;
    t->bos_id = t->bos_token ? pd_tokenizer_token_id(t, t->bos_token) : -1;
    t->eos_id = t->eos_token ? pd_tokenizer_token_id(t, t->eos_token) : -1;

    /* transformers lets tokenizer.json's TemplateProcessing decide; the config flags matter
     * for files without one (older conversions that only carry add_bos_token). */
    if (!has_template) {
        if (get_bool(cfg, "add_bos_token", false) && t->bos_id >= 0) {
            t->prefix_ids = pd_malloc(sizeof(int32_t));
            if (!t->prefix_ids)
                goto out;
            t->prefix_ids[0] = t->bos_id;
            t->n_prefix = 1;
        }
        if (get_bool(cfg, "add_eos_token", false) && t->eos_id >= 0) {
            t->suffix_ids = pd_malloc(sizeof(int32_t));
            if (!t->suffix_ids)
                goto out;
            t->suffix_ids[0] = t->eos_id;
            t->n_suffix = 1;
        }
    }

    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(ct)) {
        if (set_template(t, ct->valuestring) != PD_OK)
            goto out;
    } else if (cJSON_IsArray(ct)) {
        /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
        const cJSON *it, *pick = NULL;
        cJSON_ArrayForEach(it, ct) {
            const char *name = get_str(it, "name");
            if (!pick || (name && !strcmp(name, "default")))
                pick = it;
        }
        const char *tmpl = pick ? get_str(pick, "template") : NULL;
        if (tmpl && set_template(t, tmpl) != PD_OK)
            goto out;
    }
    rc = PD_OK;
out:
    cJSON_Delete(cfg);
    return rc;
}

/* ---------------------------------------------------------------- public */

int pd_tokenizer_new_from_json(const char *tokenizer_json, size_t len, const char *config_json,
                               const char *what, struct pd_tokenizer **out) {
    *out = NULL;
    if (!what)
        what = "tokenizer.json";
    struct pd_tokenizer *t = pd_calloc(1, sizeof(*t));
    if (!t)
        return pd_error_wrap(PD_ENOMEM, "loading %s", what);
    t->unk_id = t->bos_id = t->eos_id = -1;
    struct load ld = {what, t};
    int rc;
    cJSON *root = cJSON_ParseWithLength(tokenizer_json, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= tokenizer_json && at <= tokenizer_json + len
                         ? (size_t)(at - tokenizer_json)
                         : 0;
        rc = pd_errorf(PD_EFORMAT, "%s: not valid JSON (near byte %zu)", what, off);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        rc = bad(&ld, "$", "the top level must be an object");
        goto fail;
    }
    int32_t max_added = -1;
    rc = load_added_tokens(&ld, t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"),
                           &max_added);
    if (rc == PD_OK)
        rc = load_model(&ld, t, cJSON_GetObjectItemCaseSensitive(root, "model"), max_added);
    if (rc != PD_OK)
        goto fail;
    t->added_of_id = pd_malloc((size_t)t->n_ids * sizeof(int32_t));
    if (!t->added_of_id) {
        rc = PD_ENOMEM;
        goto fail;
    }
    memset(t->added_of_id, 0xff, (size_t)t->n_ids * sizeof(int32_t));
    for (size_t i = 0; i < t->n_added; i++) {
        struct pd__added *a = &t->added[i];
        t->added_of_id[a->id] = (int32_t)i;
        t->is_special[a->id] = a->special;
        if (pd__strmap_put(&t->added_map, a->content, a->len, (int32_t)i) != PD_OK) {
            rc = PD_ENOMEM;
            goto fail;
        }
    }
    rc =
        load_normalizer(&ld, t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer");
    if (rc == PD_OK)
        rc = load_pre(&ld, t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                      "pre_tokenizer");
    bool has_template = false;
    if (rc == PD_OK)
        rc = load_post(&ld, t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                       "post_processor", &has_template);
    if (rc == PD_OK)
        rc = load_decoder(&ld, t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoder");
    if (rc == PD_OK && t->byte_level)
        rc = build_byte_level(t);
    if (rc != PD_OK)
        goto fail;
    plan_marker_split(t);
    t->wcache = pd_calloc(1, sizeof(*t->wcache));
    if (!t->wcache) {
        rc = PD_ENOMEM;
        goto fail;
    }
    if (pthread_mutex_init(&t->wcache->mu, NULL) != 0) {
        pd_free(t->wcache);
        t->wcache = NULL;
        rc = pd_errorf(PD_ENOMEM, "%s: cannot initialise the word cache lock", what);
        goto fail;
    }
    /* normalized added tokens match the normalized text, so index their normalized form */
    for (size_t i = 0; i < t->n_added; i++) {
        struct pd__added *a = &t->added[i];
        if (!a->normalized)
            continue;
        struct pd__buf b = {0};
        rc = pd__normalize(t, a->content, a->len, &b);
        if (rc == PD_OK && !b.p)
            rc = pd__buf_put(&b, "", 0);
        if (rc != PD_OK) {
            pd__buf_free(&b);
            goto fail;
        }
        a->norm = b.p;
        a->norm_len = b.n;
    }
    rc = build_index(t, &t->raw_index, false);
    if (rc == PD_OK)
        rc = build_index(t, &t->norm_index, true);
    if (rc == PD_OK && config_json)
        rc = load_config(t, config_json, what, has_template);
    if (rc != PD_OK)
        goto fail;
    cJSON_Delete(root);
    *out = t;
    return PD_OK;
fail:
    cJSON_Delete(root);
    pd_tokenizer_free(t);
    if (rc == PD_ENOMEM)
        pd_error_wrap(rc, "loading %s", what);
    return rc;
}

int pd_tokenizer_new(const char *dir, struct pd_tokenizer **out) {
    *out = NULL;
    char path[4096];
    char *json = NULL, *cfg = NULL, *jinja = NULL;
    size_t len = 0, cfg_len = 0, jinja_len = 0;
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    int rc = pd_file_read_all(path, &json, &len);
    if (rc != PD_OK)
        return pd_error_wrap(rc, "loading the tokenizer of %s", dir);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    rc = pd_file_read_all(path, &cfg, &cfg_len);
    if (rc == PD_ENOENT) {
        pd_error_clear();
        rc = PD_OK;
    }
    if (rc != PD_OK)
        goto out;
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    rc = pd_tokenizer_new_from_json(json, len, cfg, path, out);
    if (rc != PD_OK)
        goto out;
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    rc = pd_file_read_all(path, &jinja, &jinja_len);
    if (rc == PD_ENOENT) {
        pd_error_clear();
        rc = PD_OK;
    } else if (rc == PD_OK) {
        rc = set_template(*out, jinja);
    }
    if (rc != PD_OK) {
        pd_tokenizer_free(*out);
        *out = NULL;
    }
out:
    pd_free(json);
    pd_free(cfg);
    pd_free(jinja);
    return rc;
}

void pd_tokenizer_free(struct pd_tokenizer *t) {
    if (!t)
        return;
    pd__strmap_free(&t->vocab);
    for (int32_t i = 0; t->tokens && i < t->n_ids; i++)
        pd_free(t->tokens[i]);
    pd_free(t->tokens);
    pd_free(t->token_len);
    pd__pairmap_free(&t->merges);
    pd__strmap_free(&t->raw_vocab);
    pd_free(t->raw_arena);
    for (int i = 0; i < t->n_norm; i++) {
        pd_free(t->norm[i].a);
        pd_free(t->norm[i].b);
    }
    for (int i = 0; i < t->n_pre; i++)
        pcre2_code_free(t->pre[i].re);
    for (int i = 0; i < t->n_dec; i++) {
        pd_free(t->dec[i].pat);
        pd_free(t->dec[i].content);
    }
    for (size_t i = 0; i < t->n_added; i++) {
        pd_free(t->added[i].content);
        pd_free(t->added[i].norm);
    }
    pd_free(t->added);
    pd__strmap_free(&t->added_map);
    pd_free(t->raw_index.order);
    pd_free(t->norm_index.order);
    pd_free(t->is_special);
    pd_free(t->added_of_id);
    pd_free(t->prefix_ids);
    pd_free(t->suffix_ids);
    pd_free(t->bos_token);
    pd_free(t->eos_token);
    pd_free(t->chat_template);
    if (t->wcache) {
        pthread_mutex_destroy(&t->wcache->mu);
        pd_free(t->wcache);
    }
    pd_free(t);
}

void pd_token_ids_free(struct pd_token_ids *v) {
    pd_free(v->ids);
    memset(v, 0, sizeof(*v));
}

int32_t pd_tokenizer_vocab_size(const struct pd_tokenizer *t) {
    return t->n_ids;
}

int32_t pd_tokenizer_token_id(const struct pd_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    int32_t a = pd__strmap_get(&t->added_map, token, n);
    if (a >= 0)
        return t->added[a].id;
    return pd__strmap_get(&t->vocab, token, n);
}

const char *pd_tokenizer_id_to_token(const struct pd_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids)
        return NULL;
    if (t->added_of_id[id] >= 0)
        return t->added[t->added_of_id[id]].content;
    return t->tokens[id];
}

bool pd_tokenizer_is_special(const struct pd_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->is_special[id];
}

int32_t pd_tokenizer_bos_id(const struct pd_tokenizer *t) {
    return t->bos_id;
}

int32_t pd_tokenizer_eos_id(const struct pd_tokenizer *t) {
    return t->eos_id;
}

const char *pd_tokenizer_bos_token(const struct pd_tokenizer *t) {
    return t->bos_token;
}

const char *pd_tokenizer_eos_token(const struct pd_tokenizer *t) {
    return t->eos_token;
}

const char *pd_tokenizer_chat_template(const struct pd_tokenizer *t) {
    return t->chat_template;
}
