/*
 * tokenizer_encode.c — text → ids, in HF's order: (1) added tokens that are not normalized are
 * cut out of the raw text; (2) each remaining piece is normalized and the normalized added
 * tokens are cut out of it; (3) the pre-tokenizer stages split pieces into words (Split regex,
 * Metaspace, ByteLevel); (4) BPE merges each word; (5) the post-processor adds BOS/EOS.
 *
 * Pieces never leave the call: each pre-tokenizer stage owns one scratch buffer and recurses
 * into the next stage before it reuses it, so nothing is copied twice and nothing outlives the
 * call. The one thing kept between calls is the word cache (BPE ids of short words, shared by
 * all threads, see struct pd__wcache), which is why encode is fast on real text: most words have
 * been seen before. Normalizers hand utf8proc only the pieces that need it. BPE follows HF's
 * word.rs merge loop (lowest rank first, then leftmost) exactly, which matters: a different
 * tie-break gives different ids.
 */
#include "model/tokenizer/tokenizer_internal.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Rust's char::is_whitespace (the White_Space property), which HF's lstrip/rstrip use. */
static bool is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Rust's char::is_alphanumeric, approximated by the letter and number categories. */
static bool is_alnum(uint32_t c) {
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return true;
    default: return false;
    }
}

/* Start of the character that ends at s[n) (s is valid UTF-8). */
static size_t prev_char(const char *s, size_t n) {
    size_t i = n - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

/* ---------------------------------------------------------------- normalizers */

/* A character that every normal form leaves alone and that nothing before it can combine with:
 * no decomposition at all, combining class 0, and not a mark or a Hangul jamo (the only kinds
 * of character that are the second half of a canonical composition). Reordering and composing
 * never look across such a character, so normalizing text piece by piece, cutting before each
 * one, gives the same result as normalizing it whole, and a run of them is copied as it is.
 * Hangul syllables decompose algorithmically (not in the table): inert only when composing. */
static bool norm_inert(uint32_t cp, bool compose) {
    if (cp < 0x80)
        return true;
    if (cp >= 0x1100 && cp <= 0x11FF)
        return false;
    if (cp >= 0xAC00 && cp <= 0xD7A3)
        return compose;
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    return p->combining_class == 0 && p->decomp_seqindex == UINT16_MAX &&
           p->category != UTF8PROC_CATEGORY_MN && p->category != UTF8PROC_CATEGORY_MC &&
           p->category != UTF8PROC_CATEGORY_ME;
}

static int utf8proc_map_put(const char *s, size_t n, int options, struct pd__buf *out) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)options);
    if (r < 0)
        return pd_errorf(PD_EINVAL, "normalizing text: %s", utf8proc_errmsg(r));
    int rc = pd__buf_put(out, dst, (size_t)r);
    free(dst); /* utf8proc's own allocation */
    return rc;
}

/* Most text is already normalized and made of inert characters: copy those runs, and hand
 * utf8proc only the pieces that hold something else (from the inert character before it). */
static int utf8proc_norm(const char *s, size_t n, int options, struct pd__buf *out) {
    bool compose = options & UTF8PROC_COMPOSE;
    size_t done = 0;   /* s[0..done) is in out */
    size_t piece = 0;  /* start of the piece being scanned: 0 or an inert character */
    bool plain = true; /* the piece is all inert */
    for (size_t i = 0; i < n;) {
        uint32_t cp = (uint8_t)s[i];
        size_t l = 1;
        if (cp >= 0x80) {
            l = pd__utf8_valid_len((const uint8_t *)s + i, n - i);
            if (!l)
                return pd_errorf(PD_EINVAL, "normalizing text: invalid UTF-8 at byte %zu", i);
            pd__utf8_decode((const uint8_t *)s + i, &cp);
        }
        if (norm_inert(cp, compose)) {
            if (!plain) {
                int rc = utf8proc_map_put(s + piece, i - piece, options, out);
                if (rc != PD_OK)
                    return rc;
                done = i;
                plain = true;
            }
            piece = i;
        } else if (plain) {
            if (pd__buf_put(out, s + done, piece - done) != PD_OK)
                return PD_ENOMEM;
            done = piece;
            plain = false;
        }
        i += l;
    }
    if (!plain)
        return utf8proc_map_put(s + piece, n - piece, options, out);
    return pd__buf_put(out, s + done, n - done);
}

static int norm_one(const struct pd__norm *m, const char *s, size_t n, struct pd__buf *out) {
    switch (m->kind) {
    case PD__NORM_NFC: return utf8proc_norm(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE, out);
    case PD__NORM_NFD: return utf8proc_norm(s, n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, out);
    case PD__NORM_NFKC:
        return utf8proc_norm(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
    case PD__NORM_NFKD:
        return utf8proc_norm(s, n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
    case PD__NORM_PREPEND:
        if (n && pd__buf_put(out, m->a, m->a_len) != PD_OK)
            return PD_ENOMEM;
        return pd__buf_put(out, s, n);
    case PD__NORM_REPLACE: {
        size_t i = 0;
        while (i < n) {
            if (n - i >= m->a_len && memcmp(s + i, m->a, m->a_len) == 0) {
                if (pd__buf_put(out, m->b, m->b_len) != PD_OK)
                    return PD_ENOMEM;
                i += m->a_len;
            } else {
                size_t j = i + 1;
                while (j < n && (uint8_t)s[j] != (uint8_t)m->a[0])
                    j++;
                if (pd__buf_put(out, s + i, j - i) != PD_OK)
                    return PD_ENOMEM;
                i = j;
            }
        }
        return pd__buf_put(out, "", 0);
    }
    case PD__NORM_LOWERCASE: {
        size_t i = 0;
        while (i < n) {
            uint32_t cp;
            i += pd__utf8_decode((const uint8_t *)s + i, &cp);
            char enc[4];
            size_t l = pd__utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
            if (pd__buf_put(out, enc, l) != PD_OK)
                return PD_ENOMEM;
        }
        return pd__buf_put(out, "", 0);
    }
    case PD__NORM_STRIP: {
        size_t a = 0, b = n;
        while (m->left && a < b) {
            uint32_t cp;
            size_t l = pd__utf8_decode((const uint8_t *)s + a, &cp);
            if (!is_white_space(cp))
                break;
            a += l;
        }
        while (m->right && b > a) {
            size_t p = prev_char(s, b);
            uint32_t cp;
            pd__utf8_decode((const uint8_t *)s + p, &cp);
            if (!is_white_space(cp))
                break;
            b = p;
        }
        return pd__buf_put(out, s + a, b - a);
    }
    }
    return pd_errorf(PD_EINTERNAL, "unknown normalizer kind %d", (int)m->kind);
}

int pd__normalize(const struct pd_tokenizer *t, const char *s, size_t n, struct pd__buf *out) {
    if (t->n_norm == 0)
        return pd__buf_put(out, s, n);
    struct pd__buf tmp[2] = {{0}, {0}};
    const char *cur = s;
    size_t cur_n = n;
    int rc = PD_OK;
    for (int i = 0; i < t->n_norm; i++) {
        struct pd__buf *dst = i == t->n_norm - 1 ? out : &tmp[i & 1];
        if (dst != out)
            dst->n = 0;
        rc = norm_one(&t->norm[i], cur, cur_n, dst);
        if (rc != PD_OK)
            break;
        cur = dst->p ? dst->p : "";
        cur_n = dst->n;
    }
    pd__buf_free(&tmp[0]);
    pd__buf_free(&tmp[1]);
    return rc;
}

/* ---------------------------------------------------------------- encode context */

struct sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool gone;          /* merged into its left neighbour */
};
struct merge_ent {
    int32_t rank, pos, id;
};

struct ctx {
    const struct pd_tokenizer *t;
    unsigned flags;
    struct pd_token_ids *out;
    struct pd__buf norm;               /* normalized piece */
    struct pd__buf stage[PD__MAX_PRE]; /* per pre-tokenizer stage scratch */
    pcre2_match_data *md;
    struct sym *syms;
    size_t syms_cap;
    struct merge_ent *heap;
    size_t heap_cap;
};

static int push_id(struct ctx *c, int32_t id) {
    struct pd_token_ids *o = c->out;
    if (o->n == o->cap && pd_array_grow((void **)&o->ids, &o->cap, o->n + 1, sizeof(int32_t)))
        return PD_ENOMEM;
    o->ids[o->n++] = id;
    return PD_OK;
}

/* ---------------------------------------------------------------- word cache */

/* On a hit appends the cached ids of w to c->out and returns true; false on a miss or when
 * another thread holds the lock. */
static bool wcache_get(struct ctx *c, const char *w, size_t wl, uint32_t h) {
    struct pd__wcache *wc = c->t->wcache;
    struct pd_token_ids *o = c->out;
    /* room for a whole slot, so the copy below has a fixed size (a few vector moves, where a
     * variable-size copy costs more than the rest of a hit) */
    if (o->n + PD__WCACHE_IDS > o->cap &&
        pd_array_grow((void **)&o->ids, &o->cap, o->n + PD__WCACHE_IDS, sizeof(int32_t)) != PD_OK)
        return false; /* the slow path reports the failure */
    if (pthread_mutex_trylock(&wc->mu) != 0)
        return false;
    const struct pd__wcache_slot *sl = &wc->slots[h & (PD__WCACHE_SLOTS - 1)];
    bool hit = sl->key_len == wl && sl->hash == h && memcmp(sl->key, w, wl) == 0;
    if (hit) {
        memcpy(o->ids + o->n, sl->ids, sizeof(sl->ids));
        o->n += sl->n_ids;
    }
    pthread_mutex_unlock(&wc->mu);
    return hit;
}

static void wcache_put(struct pd__wcache *wc, const char *w, size_t wl, uint32_t h,
                       const int32_t *ids, size_t n) {
    if (n > PD__WCACHE_IDS || pthread_mutex_trylock(&wc->mu) != 0)
        return;
    struct pd__wcache_slot *sl = &wc->slots[h & (PD__WCACHE_SLOTS - 1)];
    sl->hash = h;
    sl->key_len = (uint8_t)wl;
    sl->n_ids = (uint8_t)n;
    memcpy(sl->key, w, wl);
    memcpy(sl->ids, ids, n * sizeof(int32_t));
    pthread_mutex_unlock(&wc->mu);
}

/* ---------------------------------------------------------------- BPE */

static bool ent_less(const struct merge_ent *a, const struct merge_ent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct merge_ent *h, size_t *n, struct merge_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ent_less(&e, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct merge_ent heap_pop(struct merge_ent *h, size_t *n) {
    struct merge_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct merge_ent *best = &last;
        if (l < *n && ent_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (r < *n && ent_less(&h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = last;
    return top;
}

static int add_sym(struct ctx *c, size_t *n, int32_t id) {
    if (*n == c->syms_cap &&
        pd_array_grow((void **)&c->syms, &c->syms_cap, *n + 1, sizeof(struct sym)) != PD_OK)
        return PD_ENOMEM;
    c->syms[*n] = (struct sym){id, (int32_t)*n - 1, (int32_t)*n + 1, false};
    (*n)++;
    return PD_OK;
}

/* The unit (one character, or in byte-level mode one byte shown as its GPT-2 character) that
 * is not in the vocabulary: byte fallback, else unk (fused if asked), else dropped — HF's
 * merge_word. */
static int unknown_unit(struct ctx *c, size_t *n, const char *u, size_t ul, bool *unk_open) {
    const struct pd_tokenizer *t = c->t;
    if (t->byte_fallback) {
        bool all = true;
        for (size_t i = 0; i < ul; i++)
            all &= t->byte_token_id[(uint8_t)u[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < ul; i++)
                if (add_sym(c, n, t->byte_token_id[(uint8_t)u[i]]) != PD_OK)
                    return PD_ENOMEM;
            return PD_OK;
        }
    }
    if (t->unk_id < 0)
        return PD_OK;
    if (*unk_open && t->fuse_unk)
        return PD_OK; /* the open unk grows over this unit */
    if (*unk_open && add_sym(c, n, t->unk_id) != PD_OK)
        return PD_ENOMEM;
    *unk_open = true;
    return PD_OK;
}

static int bpe_merge(struct ctx *c, const char *w, size_t wl);

/* BPE of one word through the word cache. */
static int bpe_word(struct ctx *c, const char *w, size_t wl) {
    if (wl == 0)
        return PD_OK;
    if (wl > PD__WCACHE_KEY)
        return bpe_merge(c, w, wl);
    uint32_t h = pd__hash_bytes(w, wl);
    if (wcache_get(c, w, wl, h))
        return PD_OK;
    size_t n0 = c->out->n;
    int rc = bpe_merge(c, w, wl);
    if (rc == PD_OK)
        wcache_put(c->t->wcache, w, wl, h, c->out->ids + n0, c->out->n - n0);
    return rc;
}

/* HF's Word::merge_all on one word, appending its ids. */
static int bpe_merge(struct ctx *c, const char *w, size_t wl) {
    const struct pd_tokenizer *t = c->t;
    if (t->ignore_merges) {
        int32_t id =
            t->byte_level ? pd__strmap_get(&t->raw_vocab, w, wl) : pd__strmap_get(&t->vocab, w, wl);
        if (id >= 0)
            return push_id(c, id);
    }
    size_t n = 0;
    bool unk_open = false;
    for (size_t i = 0; i < wl;) {
        int32_t id;
        char u[4];
        const char *unit;
        size_t ul;
        if (t->byte_level) {
            uint8_t b = (uint8_t)w[i++];
            id = t->byte_char_id[b];
            ul = id >= 0 ? 1 : pd__utf8_encode(pd__byte_to_char(b), u);
            unit = u;
        } else if ((uint8_t)w[i] < 0x80) {
            unit = w + i;
            ul = 1;
            id = t->ascii_id[(uint8_t)w[i++]];
        } else {
            ul = pd__utf8_valid_len((const uint8_t *)w + i, wl - i);
            if (!ul)
                return pd_errorf(PD_EINTERNAL, "BPE word is not valid UTF-8");
            unit = w + i;
            id = pd__strmap_get(&t->vocab, unit, ul);
            i += ul;
        }
        if (id >= 0) {
            if (unk_open) {
                if (add_sym(c, &n, t->unk_id) != PD_OK)
                    return PD_ENOMEM;
                unk_open = false;
            }
            if (add_sym(c, &n, id) != PD_OK)
                return PD_ENOMEM;
        } else if (unknown_unit(c, &n, unit, ul, &unk_open) != PD_OK) {
            return PD_ENOMEM;
        }
    }
    if (unk_open && add_sym(c, &n, t->unk_id) != PD_OK)
        return PD_ENOMEM;
    if (n == 0)
        return PD_OK;
    c->syms[n - 1].next = -1;

    if (n > 1) {
        if (pd_array_grow((void **)&c->heap, &c->heap_cap, n, sizeof(struct merge_ent)) != PD_OK)
            return PD_ENOMEM;
        size_t hn = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t rank, id;
            if (pd__pairmap_get(&t->merges, c->syms[i].id, c->syms[i + 1].id, &rank, &id))
                heap_push(c->heap, &hn, (struct merge_ent){rank, (int32_t)i, id});
        }
        while (hn) {
            struct merge_ent top = heap_pop(c->heap, &hn);
            struct sym *s = &c->syms[top.pos];
            if (s->gone || s->next < 0)
                continue;
            struct sym *r = &c->syms[s->next];
            int32_t rank, id;
            /* stale entry: the pair at pos changed since it was queued */
            if (!pd__pairmap_get(&t->merges, s->id, r->id, &rank, &id) || id != top.id)
                continue;
            s->id = top.id;
            r->gone = true;
            s->next = r->next;
            if (r->next >= 0)
                c->syms[r->next].prev = top.pos;
            /* the heap holds at most one entry per live pair plus stale ones; grow for two */
            if (pd_array_grow((void **)&c->heap, &c->heap_cap, hn + 2, sizeof(struct merge_ent)) !=
                PD_OK)
                return PD_ENOMEM;
            if (s->prev >= 0 && pd__pairmap_get(&t->merges, c->syms[s->prev].id, s->id, &rank, &id))
                heap_push(c->heap, &hn, (struct merge_ent){rank, s->prev, id});
            if (s->next >= 0 && pd__pairmap_get(&t->merges, s->id, c->syms[s->next].id, &rank, &id))
                heap_push(c->heap, &hn, (struct merge_ent){rank, top.pos, id});
        }
    }
    for (int32_t i = 0; i >= 0; i = c->syms[i].next)
        if (push_id(c, c->syms[i].id) != PD_OK)
            return PD_ENOMEM;
    return PD_OK;
}

/* The model's share of a pre-tokenized piece: BPE of the whole piece, or of its marker-started
 * words when the tokenizer showed at load that this gives the same ids (split_before_marker). */
static int model_piece(struct ctx *c, const char *s, size_t n) {
    if (!c->t->split_before_marker)
        return bpe_word(c, s, n);
    const size_t ml = PD__SPM_MARKER_LEN;
    size_t start = 0;
    for (size_t i = 1; i + ml <= n; i++) {
        /* a marker that follows another character (so not the second of a run) starts a word */
        if (memcmp(s + i, PD__SPM_MARKER, ml) == 0 &&
            !(i >= ml && memcmp(s + i - ml, PD__SPM_MARKER, ml) == 0)) {
            int rc = bpe_word(c, s + start, i - start);
            if (rc != PD_OK)
                return rc;
            start = i;
            i += ml - 1;
        }
    }
    return bpe_word(c, s + start, n - start);
}

/* ---------------------------------------------------------------- pre-tokenizers */

static int pre_stage(struct ctx *c, int stage, const char *s, size_t n, bool at_start);

/* Regex split: matches and the text between them are pieces (Isolated), or only the text
 * between them (Removed). Empty pieces are dropped, as HF drops them. */
static int regex_split(struct ctx *c, int stage, const struct pd__pre *p, bool removed,
                       const char *s, size_t n, bool at_start) {
    size_t pos = 0, last = 0;
    while (pos <= n) {
        int r = p->jit ? pcre2_jit_match(p->re, (PCRE2_SPTR)s, n, pos, 0, c->md, NULL)
                       : pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (r == PCRE2_ERROR_NOMATCH)
            break;
        if (r < 0)
            return pd_errorf(PD_EINTERNAL, "pre-tokenizer regex failed (PCRE2 error %d)", r);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step over one character */
            if (ms >= n)
                break;
            size_t l = pd__utf8_valid_len((const uint8_t *)s + ms, n - ms);
            pos = ms + (l ? l : 1);
            continue;
        }
        if (ms > last) {
            int rc = pre_stage(c, stage + 1, s + last, ms - last, at_start && last == 0);
            if (rc != PD_OK)
                return rc;
        }
        if (!removed) {
            int rc = pre_stage(c, stage + 1, s + ms, me - ms, at_start && ms == 0);
            if (rc != PD_OK)
                return rc;
        }
        last = pos = me;
    }
    if (last < n)
        return pre_stage(c, stage + 1, s + last, n - last, at_start && last == 0);
    return PD_OK;
}

static int pre_stage(struct ctx *c, int stage, const char *s, size_t n, bool at_start) {
    const struct pd_tokenizer *t = c->t;
    if (n == 0)
        return PD_OK;
    if (stage == t->n_pre)
        return model_piece(c, s, n);
    const struct pd__pre *p = &t->pre[stage];
    struct pd__buf *b = &c->stage[stage];
    switch (p->kind) {
    case PD__PRE_SPLIT: return regex_split(c, stage, p, p->removed, s, n, at_start);
    case PD__PRE_BYTELEVEL:
        if (p->add_prefix_space && s[0] != ' ') {
            b->n = 0;
            if (pd__buf_put(b, " ", 1) != PD_OK || pd__buf_put(b, s, n) != PD_OK)
                return PD_ENOMEM;
            s = b->p;
            n = b->n;
        }
        if (p->re)
            return regex_split(c, stage, p, false, s, n, at_start);
        return pre_stage(c, stage + 1, s, n, at_start);
    case PD__PRE_METASPACE: {
        b->n = 0;
        bool starts = n >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0;
        if (s[0] == ' ')
            starts = true; /* the space becomes the replacement below */
        if (!starts &&
            (p->prepend == PD__PREPEND_ALWAYS || (p->prepend == PD__PREPEND_FIRST && at_start)))
            if (pd__buf_put(b, p->repl, p->repl_len) != PD_OK)
                return PD_ENOMEM;
        for (size_t i = 0; i < n;) {
            size_t j = i;
            while (j < n && s[j] != ' ')
                j++;
            if (pd__buf_put(b, s + i, j - i) != PD_OK)
                return PD_ENOMEM;
            if (j < n && pd__buf_put(b, p->repl, p->repl_len) != PD_OK)
                return PD_ENOMEM;
            i = j + 1;
        }
        const char *m = b->p;
        size_t mn = b->n;
        if (!p->split)
            return pre_stage(c, stage + 1, m, mn, at_start);
        /* MergedWithNext: every replacement character starts a new piece */
        size_t start = 0;
        for (size_t i = p->repl_len; i + p->repl_len <= mn;) {
            if (memcmp(m + i, p->repl, p->repl_len) == 0) {
                int rc = pre_stage(c, stage + 1, m + start, i - start, at_start && start == 0);
                if (rc != PD_OK)
                    return rc;
                start = i;
                i += p->repl_len;
            } else {
                i++;
            }
        }
        return pre_stage(c, stage + 1, m + start, mn - start, at_start && start == 0);
    }
    }
    return pd_errorf(PD_EINTERNAL, "unknown pre-tokenizer kind %d", (int)p->kind);
}

/* ---------------------------------------------------------------- added tokens */

typedef int (*piece_fn)(struct ctx *c, const char *s, size_t n, bool at_start);

/* HF's AddedVocabulary::find_matches: leftmost-longest matches, each checked for single_word
 * and widened by lstrip/rstrip; the text between matches goes to fn. */
static int split_added(struct ctx *c, const struct pd__added_index *ix, bool normalized,
                       const char *s, size_t n, bool at_start, piece_fn fn) {
    const struct pd_tokenizer *t = c->t;
    bool parse_special = c->flags & PD_TOK_PARSE_SPECIAL;
    size_t start_offset = 0, pos = 0;
    while (ix->n && pos < n) {
        const struct pd__added *a = NULL;
        size_t ms = 0;
        for (size_t i = pos; i < n && !a; i++) {
            uint8_t b = (uint8_t)s[i];
            for (uint32_t k = ix->start[b]; k < ix->start[b + 1]; k++) {
                const struct pd__added *cand = &t->added[ix->order[k]];
                const char *cs = normalized ? cand->norm : cand->content;
                size_t cl = normalized ? cand->norm_len : cand->len;
                if (cl <= n - i && memcmp(s + i, cs, cl) == 0) {
                    a = cand;
                    ms = i;
                    break;
                }
            }
        }
        if (!a)
            break;
        size_t me = ms + (normalized ? a->norm_len : a->len);
        pos = me;
        if (a->special && !parse_special)
            continue;
        if (a->single_word) {
            uint32_t cp;
            bool start_space = ms == 0;
            if (!start_space) {
                pd__utf8_decode((const uint8_t *)s + prev_char(s, ms), &cp);
                start_space = !is_alnum(cp);
            }
            bool stop_space = me == n;
            if (!stop_space) {
                pd__utf8_decode((const uint8_t *)s + me, &cp);
                stop_space = !is_alnum(cp);
            }
            if (!start_space || !stop_space)
                continue;
        }
        size_t st = ms, en = me;
        if (a->lstrip) {
            while (st > 0) {
                size_t p = prev_char(s, st);
                uint32_t cp;
                pd__utf8_decode((const uint8_t *)s + p, &cp);
                if (!is_white_space(cp))
                    break;
                st = p;
            }
            if (st < start_offset)
                st = start_offset; /* the previous match already took those spaces */
        }
        if (a->rstrip) {
            while (en < n) {
                uint32_t cp;
                size_t l = pd__utf8_decode((const uint8_t *)s + en, &cp);
                if (!is_white_space(cp))
                    break;
                en += l;
            }
        }
        if (start_offset < st) {
            int rc = fn(c, s + start_offset, st - start_offset, at_start && start_offset == 0);
            if (rc != PD_OK)
                return rc;
        }
        if (push_id(c, a->id) != PD_OK)
            return PD_ENOMEM;
        start_offset = en;
    }
    if (start_offset < n)
        return fn(c, s + start_offset, n - start_offset, at_start && start_offset == 0);
    return PD_OK;
}

static int normalized_piece(struct ctx *c, const char *s, size_t n, bool at_start) {
    return pre_stage(c, 0, s, n, at_start);
}

static int raw_piece(struct ctx *c, const char *s, size_t n, bool at_start) {
    c->norm.n = 0;
    int rc = pd__normalize(c->t, s, n, &c->norm);
    if (rc != PD_OK)
        return rc;
    /* the normalized text lives in c->norm until the next raw piece: pre-tokenizer stages only
     * use their own buffers */
    return split_added(c, &c->t->norm_index, true, c->norm.p ? c->norm.p : "", c->norm.n, at_start,
                       normalized_piece);
}

int pd_tokenizer_encode(const struct pd_tokenizer *t, const char *text, size_t len, unsigned flags,
                        struct pd_token_ids *out) {
    size_t bad = pd__utf8_check((const uint8_t *)text, len);
    if (bad != len)
        return pd_errorf(PD_EINVAL,
                         "text to tokenize is not valid UTF-8 (byte 0x%02X at offset %zu)",
                         (uint8_t)text[bad], bad);
    struct ctx c = {.t = t, .flags = flags, .out = out};
    size_t n0 = out->n;
    int rc = PD_OK;
    if (t->n_pre) {
        c.md = pcre2_match_data_create(8, NULL);
        if (!c.md) {
            rc = pd_errorf(PD_ENOMEM, "out of memory allocating regex match data");
            goto out;
        }
    }
    if (flags & PD_TOK_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_prefix && rc == PD_OK; i++)
            rc = push_id(&c, t->prefix_ids[i]);
    if (rc == PD_OK)
        rc = split_added(&c, &t->raw_index, false, text, len, true, raw_piece);
    if (flags & PD_TOK_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_suffix && rc == PD_OK; i++)
            rc = push_id(&c, t->suffix_ids[i]);
out:
    pcre2_match_data_free(c.md);
    pd__buf_free(&c.norm);
    for (int i = 0; i < PD__MAX_PRE; i++)
        pd__buf_free(&c.stage[i]);
    pd_free(c.syms);
    pd_free(c.heap);
    if (rc != PD_OK) {
        out->n = n0;
        if (rc == PD_ENOMEM)
            pd_error_wrap(rc, "tokenizing %zu bytes", len);
    }
    return rc;
}
