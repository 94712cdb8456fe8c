/*
 * tokenizer_decode.c — ids → text through the decoder chain of tokenizer.json, as a stream.
 *
 * HF decodes a whole id list at once: each decoder maps the list of token strings to a new
 * list, and the result is joined. Here every decoder is a stage that receives one string at a
 * time and passes what is final to the next stage; what is not final yet is held: the bytes of
 * an unfinished UTF-8 character after ByteLevel, a run of <0xNN> tokens before ByteFallback
 * (HF turns the whole run into U+FFFDs if any part is invalid, so no part is final until the run
 * ends). One-shot decode is the stream run to the end, so streamed text always equals it; the
 * fixtures check that both equal HF's decode.
 */
#include "model/tokenizer/tokenizer_internal.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <string.h>

#define REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD */

struct pd_detok {
    const struct pd_tokenizer *tok;
    bool skip_special;
    bool first_out;                      /* no decoder: tokens are joined with " " */
    size_t seen[PD__MAX_DEC];            /* strings that reached each stage (Metaspace) */
    struct pd__buf scratch[PD__MAX_DEC]; /* per-stage rewritten string */
    struct pd__buf run;                  /* ByteFallback: bytes of the open <0xNN> run */
    struct pd__buf bytes;                /* ByteLevel: tail + new bytes */
    uint8_t tail[4];                     /* ByteLevel: unfinished UTF-8 character */
    size_t tail_len;
    size_t strip_seen; /* Strip after Fuse: leading characters examined */
    bool strip_done;
    struct pd__buf out; /* text made final by the current call */
};

static int feed(struct pd_detok *d, int stage, const char *s, size_t n);

static int sink(struct pd_detok *d, const char *s, size_t n) {
    return pd__buf_put(&d->out, s, n);
}

/* "<0xNN>" → the byte, or -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

/* How many bytes of s[0..n) follow the pattern of a well-formed sequence, and whether they are
 * a complete character (*complete) — Rust's from_utf8_lossy replaces each maximal ill-formed
 * subpart with one U+FFFD. */
static size_t utf8_prefix(const uint8_t *s, size_t n, bool *complete) {
    *complete = false;
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
        *complete = true;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return 1; /* not a lead byte: a subpart of its own */
    }
    size_t i = 1;
    for (; i < need && i < n; i++) {
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80)
            return i; /* ill-formed after i bytes */
    }
    *complete = i == need;
    return i;
}

/* ByteLevel's output: bytes → text, holding an unfinished character in d->tail. */
static int bytes_out(struct pd_detok *d, int stage, const uint8_t *b, size_t n) {
    struct pd__buf *in = &d->bytes, *sc = &d->scratch[stage];
    in->n = sc->n = 0;
    if (pd__buf_put(in, d->tail, d->tail_len) != PD_OK || pd__buf_put(in, b, n) != PD_OK)
        return PD_ENOMEM;
    d->tail_len = 0;
    const uint8_t *s = (const uint8_t *)in->p;
    for (size_t p = 0; p < in->n;) {
        bool complete;
        size_t l = utf8_prefix(s + p, in->n - p, &complete);
        if (complete) {
            if (pd__buf_put(sc, s + p, l) != PD_OK)
                return PD_ENOMEM;
        } else if (p + l == in->n) {
            memcpy(d->tail, s + p, l); /* cut short, not wrong: the next token may finish it */
            d->tail_len = l;
        } else if (pd__buf_put(sc, REPLACEMENT, 3) != PD_OK) {
            return PD_ENOMEM;
        }
        p += l;
    }
    return sc->n ? feed(d, stage + 1, sc->p, sc->n) : PD_OK;
}

static int flush_run(struct pd_detok *d, int stage) {
    if (!d->run.n)
        return PD_OK;
    size_t n = d->run.n;
    d->run.n = 0;
    if (pd__utf8_check((const uint8_t *)d->run.p, n) == n)
        return feed(d, stage + 1, d->run.p, n);
    /* HF: an invalid run becomes one U+FFFD per byte */
    for (size_t i = 0; i < n; i++) {
        int rc = feed(d, stage + 1, REPLACEMENT, 3);
        if (rc != PD_OK)
            return rc;
    }
    return PD_OK;
}

static int feed(struct pd_detok *d, int stage, const char *s, size_t n) {
    const struct pd_tokenizer *t = d->tok;
    if (stage == t->n_dec) {
        if (!t->has_decoder) {
            if (!d->first_out && sink(d, " ", 1) != PD_OK)
                return PD_ENOMEM;
            d->first_out = false;
        }
        return sink(d, s, n);
    }
    const struct pd__dec *k = &t->dec[stage];
    struct pd__buf *sc = &d->scratch[stage];
    size_t index = d->seen[stage]++;
    switch (k->kind) {
    case PD__DEC_FUSE: return feed(d, stage + 1, s, n);
    case PD__DEC_REPLACE: {
        sc->n = 0;
        for (size_t i = 0; i < n;) {
            if (n - i >= k->pat_len && memcmp(s + i, k->pat, k->pat_len) == 0) {
                if (pd__buf_put(sc, k->content, k->content_len) != PD_OK)
                    return PD_ENOMEM;
                i += k->pat_len;
            } else {
                if (pd__buf_put(sc, s + i, 1) != PD_OK)
                    return PD_ENOMEM;
                i++;
            }
        }
        return feed(d, stage + 1, sc->p ? sc->p : "", sc->n);
    }
    case PD__DEC_STRIP: {
        size_t a = 0, b = n;
        if (k->fused) { /* the joined text: strip its first `start` characters once */
            while (!d->strip_done && d->strip_seen < k->start && a < n) {
                if (n - a >= k->strip_len && memcmp(s + a, k->strip_char, k->strip_len) == 0) {
                    a += k->strip_len;
                    d->strip_seen++;
                } else {
                    d->strip_done = true;
                }
            }
            if (d->strip_seen == k->start)
                d->strip_done = true;
        } else {
            for (size_t i = 0; i < k->start && n - a >= k->strip_len &&
                               memcmp(s + a, k->strip_char, k->strip_len) == 0;
                 i++)
                a += k->strip_len;
            for (size_t i = 0; i < k->stop && b - a >= k->strip_len &&
                               memcmp(s + b - k->strip_len, k->strip_char, k->strip_len) == 0;
                 i++)
                b -= k->strip_len;
        }
        if (a == b && !k->fused)
            return feed(d, stage + 1, "", 0);
        if (a == b)
            return PD_OK;
        return feed(d, stage + 1, s + a, b - a);
    }
    case PD__DEC_METASPACE: {
        /* HF: in the first token every replacement character goes (the prepended space), in
         * the others each becomes a space. After Fuse the whole text is that first token. */
        bool drop = (k->fused || index == 0) && k->prepend != PD__PREPEND_NEVER;
        sc->n = 0;
        for (size_t i = 0; i < n;) {
            if (n - i >= k->repl_len && memcmp(s + i, k->repl, k->repl_len) == 0) {
                if (!drop && pd__buf_put(sc, " ", 1) != PD_OK)
                    return PD_ENOMEM;
                i += k->repl_len;
            } else {
                if (pd__buf_put(sc, s + i, 1) != PD_OK)
                    return PD_ENOMEM;
                i++;
            }
        }
        return feed(d, stage + 1, sc->p ? sc->p : "", sc->n);
    }
    case PD__DEC_BYTEFALLBACK: {
        int b = k->fused ? -1 : byte_token(s, n);
        if (b >= 0) {
            uint8_t c = (uint8_t)b;
            return pd__buf_put(&d->run, &c, 1);
        }
        int rc = flush_run(d, stage);
        if (rc != PD_OK)
            return rc;
        return feed(d, stage + 1, s, n);
    }
    case PD__DEC_BYTELEVEL: {
        /* each character stands for a byte; a token with any other character is taken as its
         * raw UTF-8 bytes (HF does the same) */
        struct pd__buf raw = {0};
        bool mapped = true;
        for (size_t i = 0; i < n && mapped;) {
            uint32_t cp;
            size_t l = pd__utf8_decode((const uint8_t *)s + i, &cp);
            int byte = pd__char_to_byte(cp);
            if (byte < 0) {
                mapped = false;
                break;
            }
            uint8_t c = (uint8_t)byte;
            if (pd__buf_put(&raw, &c, 1) != PD_OK) {
                pd__buf_free(&raw);
                return PD_ENOMEM;
            }
            i += l;
        }
        int rc = mapped ? bytes_out(d, stage, (const uint8_t *)raw.p, raw.n)
                        : bytes_out(d, stage, (const uint8_t *)s, n);
        pd__buf_free(&raw);
        return rc;
    }
    }
    return pd_errorf(PD_EINTERNAL, "unknown decoder kind %d", (int)k->kind);
}

int pd_detok_new(const struct pd_tokenizer *t, bool skip_special, struct pd_detok **out) {
    *out = pd_calloc(1, sizeof(**out));
    if (!*out)
        return pd_error_wrap(PD_ENOMEM, "starting a detokenizer stream");
    (*out)->tok = t;
    (*out)->skip_special = skip_special;
    (*out)->first_out = true;
    return PD_OK;
}

static int result(struct pd_detok *d, int rc, const char **piece, size_t *len) {
    if (rc == PD_OK && pd__buf_put(&d->out, "", 0) != PD_OK)
        rc = PD_ENOMEM;
    if (rc != PD_OK) {
        *piece = "";
        *len = 0;
        return rc == PD_ENOMEM ? pd_error_wrap(rc, "detokenizing") : rc;
    }
    *piece = d->out.p;
    *len = d->out.n;
    return PD_OK;
}

int pd_detok_step(struct pd_detok *d, int32_t id, const char **piece, size_t *len) {
    const struct pd_tokenizer *t = d->tok;
    d->out.n = 0;
    int rc = PD_OK;
    /* HF drops ids it has no token for, and special tokens when asked, before the decoders */
    if (id >= 0 && id < t->n_ids && !(d->skip_special && t->is_special[id])) {
        const char *s = pd_tokenizer_id_to_token(t, id);
        rc = feed(d, 0, s, strlen(s));
    }
    return result(d, rc, piece, len);
}

int pd_detok_flush(struct pd_detok *d, const char **piece, size_t *len) {
    const struct pd_tokenizer *t = d->tok;
    d->out.n = 0;
    int rc = PD_OK;
    for (int i = 0; i < t->n_dec && rc == PD_OK; i++) {
        if (t->dec[i].kind == PD__DEC_BYTEFALLBACK)
            rc = flush_run(d, i);
        else if (t->dec[i].kind == PD__DEC_BYTELEVEL && d->tail_len) {
            d->tail_len = 0; /* an unfinished character at the end: one U+FFFD, as HF */
            rc = feed(d, i + 1, REPLACEMENT, 3);
        }
    }
    return result(d, rc, piece, len);
}

void pd_detok_free(struct pd_detok *d) {
    if (!d)
        return;
    for (int i = 0; i < PD__MAX_DEC; i++)
        pd__buf_free(&d->scratch[i]);
    pd__buf_free(&d->run);
    pd__buf_free(&d->bytes);
    pd__buf_free(&d->out);
    pd_free(d);
}

int pd_tokenizer_decode(const struct pd_tokenizer *t, const int32_t *ids, size_t n,
                        bool skip_special, char **out, size_t *out_len) {
    *out = NULL;
    struct pd_detok *d;
    int rc = pd_detok_new(t, skip_special, &d);
    if (rc != PD_OK)
        return rc;
    struct pd__buf text = {0};
    const char *piece;
    size_t len;
    for (size_t i = 0; i < n && rc == PD_OK; i++) {
        rc = pd_detok_step(d, ids[i], &piece, &len);
        if (rc == PD_OK)
            rc = pd__buf_put(&text, piece, len);
    }
    if (rc == PD_OK)
        rc = pd_detok_flush(d, &piece, &len);
    if (rc == PD_OK)
        rc = pd__buf_put(&text, piece, len);
    pd_detok_free(d);
    if (rc != PD_OK) {
        pd__buf_free(&text);
        return rc;
    }
    *out = text.p;
    if (out_len)
        *out_len = text.n;
    return PD_OK;
}
