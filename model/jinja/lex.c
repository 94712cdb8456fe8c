/*
 * lex.c — the template source to tokens, with Jinja's whitespace control ({%- -%}, trim_blocks and
 * lstrip_blocks as transformers sets them).
 */
#include "model/jinja/jinja.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- lexer */

static void push_tok(struct lexer *lx, struct tok t) {
    if (lx->n == lx->cap) {
        size_t nc = lx->cap ? lx->cap * 2 : 256;
        struct tok *nt = jj_amalloc(lx->e, nc * sizeof(struct tok));
        if (lx->n)
            memcpy(nt, lx->toks, lx->n * sizeof(struct tok));
        lx->toks = nt;
        lx->cap = nc;
    }
    lx->toks[lx->n++] = t;
}

/* The line of src[pos]. Counted on from the last position asked (the lexer mostly moves
 * forward): counting from the start each time made lexing quadratic in the template's size. */
static int line_at(struct lexer *lx, size_t pos) {
    if (pos < lx->line_pos || !lx->line_no) {
        lx->line_pos = 0;
        lx->line_no = 1;
    }
    for (; lx->line_pos < pos; lx->line_pos++)
        lx->line_no += lx->src[lx->line_pos] == '\n';
    return lx->line_no;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Lexes the inside of a tag up to its closing delimiter; returns the position after it and
 * whether it ended with '-' (strip whitespace after). */
static size_t lex_tag(struct lexer *lx, size_t p, char close, bool *rstrip, bool *keep) {
    struct env *e = lx->e;
    const char *s = lx->src;
    size_t n = lx->len;
    for (;;) {
        while (p < n && is_ws(s[p]))
            p++;
        if (p >= n)
            jj_fail(e, PD_EFORMAT, "line %d: unclosed tag", line_at(lx, p));
        int line = line_at(lx, p);
        /* closing delimiter, possibly with - or + */
        if ((s[p] == '-' || s[p] == '+') && p + 2 < n + 1 && s[p + 1] == close && p + 2 <= n &&
            s[p + 2] == '}') {
            *rstrip = s[p] == '-';
            *keep = s[p] == '+';
            return p + 3;
        }
        if (s[p] == close && p + 1 < n && s[p + 1] == '}') {
            *rstrip = false;
            *keep = false;
            return p + 2;
        }
        char c = s[p];
        struct tok t = {.line = line};
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t q = p;
            while (q < n && ((s[q] >= 'a' && s[q] <= 'z') || (s[q] >= 'A' && s[q] <= 'Z') ||
                             (s[q] >= '0' && s[q] <= '9') || s[q] == '_'))
                q++;
            t.k = T_NAME;
            t.s = s + p;
            t.n = q - p;
            p = q;
        } else if (c >= '0' && c <= '9') {
            size_t q = p;
            bool is_float = false;
            while (q < n && ((s[q] >= '0' && s[q] <= '9') || s[q] == '_'))
                q++;
            if (q + 1 < n && s[q] == '.' && s[q + 1] >= '0' && s[q + 1] <= '9') {
                is_float = true;
                q++;
                while (q < n && s[q] >= '0' && s[q] <= '9')
                    q++;
            }
            if (q < n && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < n && (s[r] == '+' || s[r] == '-'))
                    r++;
                if (r < n && s[r] >= '0' && s[r] <= '9') {
                    is_float = true;
                    q = r;
                    while (q < n && s[q] >= '0' && s[q] <= '9')
                        q++;
                }
            }
            char *num = jj_astrndup(e, s + p, q - p);
            if (is_float) {
                t.k = T_FLOAT;
                t.f = strtod(num, NULL);
            } else {
                t.k = T_INT;
                t.i = strtoll(num, NULL, 10);
            }
            p = q;
        } else if (c == '\'' || c == '"') {
            struct sb b = {.e = e};
            size_t q = p + 1;
            while (q < n && s[q] != c) {
                if (s[q] == '\\' && q + 1 < n) {
                    q++;
                    char x = s[q];
                    const char *rep = x == 'n'    ? "\n"
                                      : x == 't'  ? "\t"
                                      : x == 'r'  ? "\r"
                                      : x == '\\' ? "\\"
                                      : x == '\'' ? "'"
                                      : x == '"'  ? "\""
                                      : x == '0'  ? ""
                                                  : NULL;
                    if (x == 'u' && q + 4 < n) { /* \uXXXX */
                        char hex[5] = {s[q + 1], s[q + 2], s[q + 3], s[q + 4], 0};
                        unsigned long cp = strtoul(hex, NULL, 16);
                        char u[4];
                        size_t ul;
                        if (cp < 0x80) {
                            u[0] = (char)cp;
                            ul = 1;
                        } else if (cp < 0x800) {
                            u[0] = (char)(0xC0 | (cp >> 6));
                            u[1] = (char)(0x80 | (cp & 0x3F));
                            ul = 2;
                        } else {
                            u[0] = (char)(0xE0 | (cp >> 12));
                            u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                            u[2] = (char)(0x80 | (cp & 0x3F));
                            ul = 3;
                        }
                        jj_sb_put(&b, u, ul);
                        q += 5;
                        continue;
                    }
                    if (rep)
                        jj_sb_puts(&b, rep);
                    else { /* unknown escape: Python keeps the backslash */
                        jj_sb_put(&b, "\\", 1);
                        jj_sb_put(&b, &x, 1);
                    }
                    q++;
                } else {
                    jj_sb_put(&b, s + q, 1);
                    q++;
                }
            }
            if (q >= n)
                jj_fail(e, PD_EFORMAT, "line %d: unterminated string", line);
            t.k = T_STRING;
            t.s = b.p ? b.p : "";
            t.n = b.n;
            p = q + 1;
        } else {
            static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                              "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                              "{",  "}",  ",",  ".",  ":",  "|",  "="};
            size_t k;
            for (k = 0; k < PD_ARRAY_LEN(ops); k++) {
                size_t l = strlen(ops[k]);
                if (p + l <= n && memcmp(s + p, ops[k], l) == 0)
                    break;
            }
            if (k == PD_ARRAY_LEN(ops))
                jj_fail(e, PD_EFORMAT, "line %d: unexpected character '%c'", line, c);
            t.k = T_OP;
            t.s = ops[k];
            t.n = strlen(ops[k]);
            p += t.n;
        }
        push_tok(lx, t);
    }
}

/* Jinja's whitespace rules with transformers' trim_blocks=True, lstrip_blocks=True. */
void jj_lex(struct lexer *lx) {
    struct env *e = lx->e;
    const char *s = lx->src;
    size_t n = lx->len, p = 0;
    bool strip_next = false;   /* previous tag ended with '-' */
    bool line_starting = true; /* the text starts a line (template start, or trim_blocks) */
    while (p <= n) {
        /* find the next tag */
        size_t q = p;
        while (q + 1 < n &&
               !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')))
            q++;
        if (q + 1 >= n)
            q = n;
        size_t ts = p, te = q;
        if (strip_next)
            while (ts < te && is_ws(s[ts]))
                ts++;
        char kind = q < n ? s[q + 1] : 0;
        char mod = q + 2 < n ? s[q + 2] : 0;
        if (kind && mod == '-') {
            while (te > ts && is_ws(s[te - 1]))
                te--;
        } else if ((kind == '%' || kind == '#') && mod != '+') {
            /* lstrip_blocks: whitespace between the line start and a block tag goes */
            size_t lpos = te;
            bool has_nl = false;
            while (lpos > ts && !has_nl) {
                if (s[lpos - 1] == '\n')
                    has_nl = true;
                else
                    lpos--;
            }
            if (!has_nl)
                lpos = ts;
            bool all_ws = true;
            for (size_t k = lpos; k < te; k++)
                all_ws &= is_ws(s[k]);
            if ((has_nl || line_starting) && all_ws)
                te = lpos;
        }
        if (te > ts)
            push_tok(lx,
                     (struct tok){.k = T_TEXT, .s = s + ts, .n = te - ts, .line = line_at(lx, ts)});
        if (q >= n)
            break;
        size_t body = q + 2 + (mod == '-' || mod == '+');
        bool rstrip = false, keep = false;
        int line = line_at(lx, q);
        if (kind == '#') {
            const char *end = NULL;
            for (size_t k = body; k + 1 < n; k++)
                if (s[k] == '#' && s[k + 1] == '}') {
                    end = s + k;
                    break;
                }
            if (!end)
                jj_fail(e, PD_EFORMAT, "line %d: unclosed comment", line);
            size_t k = (size_t)(end - s);
            rstrip = k > body && s[k - 1] == '-';
            keep = k > body && s[k - 1] == '+';
            p = k + 2;
            strip_next = rstrip;
            line_starting = false;
            if (!keep && p < n && s[p] == '\n') { /* trim_blocks */
                p++;
                line_starting = true;
            }
            continue;
        }
        if (kind == '%') {
            /* {% raw %} ... {% endraw %}: copied verbatim */
            size_t k = body;
            while (k < n && is_ws(s[k]))
                k++;
            if (n - k >= 3 && memcmp(s + k, "raw", 3) == 0 &&
                !(k + 3 < n && s[k + 3] != ' ' && s[k + 3] != '%' && s[k + 3] != '-')) {
                const char *close = strstr(s + k, "%}");
                if (!close)
                    jj_fail(e, PD_EFORMAT, "line %d: unclosed raw tag", line);
                size_t start = (size_t)(close - s) + 2;
                const char *end = NULL;
                for (size_t m = start; m + 1 < n; m++) {
                    if (s[m] == '{' && s[m + 1] == '%') {
                        size_t r = m + 2;
                        if (r < n && (s[r] == '-' || s[r] == '+'))
                            r++;
                        while (r < n && is_ws(s[r]))
                            r++;
                        if (n - r >= 6 && memcmp(s + r, "endraw", 6) == 0) {
                            end = s + m;
                            break;
                        }
                    }
                }
                if (!end)
                    jj_fail(e, PD_EFORMAT, "line %d: raw without endraw", line);
                size_t re = (size_t)(end - s);
                bool strip_before = s[re + 2] == '-';
                size_t te2 = re;
                if (strip_before)
                    while (te2 > start && is_ws(s[te2 - 1]))
                        te2--;
                if (te2 > start)
                    push_tok(lx, (struct tok){
                                     .k = T_TEXT, .s = s + start, .n = te2 - start, .line = line});
                const char *cl = strstr(end, "%}");
                if (!cl)
                    jj_fail(e, PD_EFORMAT, "line %d: unclosed endraw tag", line);
                size_t after = (size_t)(cl - s);
                strip_next = after > 0 && s[after - 1] == '-';
                p = after + 2;
                line_starting = false;
                if (!(after > 0 && s[after - 1] == '+') && p < n && s[p] == '\n') {
                    p++;
                    line_starting = true;
                }
                continue;
            }
        }
        push_tok(lx, (struct tok){.k = kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, .line = line});
        p = lex_tag(lx, body, kind == '{' ? '}' : '%', &rstrip, &keep);
        push_tok(lx, (struct tok){.k = kind == '{' ? T_VAR_END : T_BLOCK_END, .line = line});
        strip_next = rstrip;
        line_starting = false;
        if (kind == '%' && !keep && p < n && s[p] == '\n') { /* trim_blocks */
            p++;
            line_starting = true;
        }
    }
    push_tok(lx, (struct tok){.k = T_EOF, .line = line_at(lx, n)});
}
