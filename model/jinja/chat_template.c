/*
 * chat_template.c — a small Jinja interpreter: lexer (with Jinja's whitespace rules), parser to
 * an AST kept by the compiled template, and a tree-walking renderer.
 *
 * Memory: the AST lives in the template's arena; every value made while rendering lives in a
 * per-render arena freed at once when the render ends, so values need no ownership rules.
 * Errors (syntax, unsupported construct, raise_exception, type errors, out of memory) longjmp
 * back to the one entry point, which frees the arena and returns the status: an interpreter
 * checking a status after every sub-expression would bury the semantics that must match Jinja.
 * Values follow Python: str() of None is "None", lists print as ['a', 1], + does not coerce,
 * undefined prints as "" and is falsy (transformers uses Jinja's default Undefined).
 */
#include "model/jinja/chat_template.h"

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

/* ---------------------------------------------------------------- arena and errors */

struct blk {
    struct blk *next;
    size_t used, cap;
    max_align_t data[];
};

struct arena {
    struct blk *head;
    size_t total; /* bytes of all blocks */
};

/* A template that builds more than this ('x' * 10**12, huge ranges) is an error, not an OOM. */
#define ARENA_MAX ((size_t)256 << 20)

struct env {
    struct arena *arena;
    jmp_buf jb;
    int code;
};

_Noreturn static void fail(struct env *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(struct env *e, int code, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pd_errorf(code, "chat template: %s", msg);
    e->code = code;
    longjmp(e->jb, 1);
}

/* A float as an int64 (truncated, as Python's int()); out of range or not finite is an error,
 * not C's undefined conversion. */
static int64_t to_int(struct env *e, double f, int line) {
    if (!(f > -9223372036854775809.0 && f < 9223372036854775808.0))
        fail(e, PD_ERANGE, "line %d: %g does not fit a 64-bit integer", line, f);
    return (int64_t)f;
}

static void *amalloc(struct env *e, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct blk *b = e->arena->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        if (cap > ARENA_MAX || e->arena->total + cap > ARENA_MAX)
            fail(e, PD_ERANGE, "template needs more than %zu MiB", ARENA_MAX >> 20);
        e->arena->total += cap;
        b = pd_malloc(sizeof(struct blk) + cap);
        if (!b)
            fail(e, PD_ENOMEM, "out of memory");
        b->cap = cap;
        b->used = 0;
        b->next = e->arena->head;
        e->arena->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(struct arena *a) {
    struct blk *b = a->head;
    while (b) {
        struct blk *n = b->next;
        pd_free(b);
        b = n;
    }
    a->head = NULL;
}

static char *astrndup(struct env *e, const char *s, size_t n) {
    char *p = amalloc(e, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---------------------------------------------------------------- values */

enum vk { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC };

struct jv;
struct jlist {
    struct jv *v;
    size_t n, cap;
};
struct jdict {
    struct jv *k, *v; /* keys are strings (or numbers) */
    size_t n, cap;
};
struct node;
struct jfunc {
    const char *name; /* builtin or method name */
    struct jv *self;  /* bound method receiver, or NULL */
    const struct node *macro;
};
struct jv {
    enum vk k;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct jlist *l;
        struct jdict *d;
        struct jfunc *fn;
    } u;
};

static struct jv v_undef(void) {
    return (struct jv){.k = V_UNDEF};
}
static struct jv v_none(void) {
    return (struct jv){.k = V_NONE};
}
static struct jv v_bool(bool b) {
    return (struct jv){.k = V_BOOL, .u.b = b};
}
static struct jv v_int(int64_t i) {
    return (struct jv){.k = V_INT, .u.i = i};
}
static struct jv v_float(double f) {
    return (struct jv){.k = V_FLOAT, .u.f = f};
}
static struct jv v_str(const char *p, size_t n) {
    struct jv v = {.k = V_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static struct jv v_cstr(const char *p) {
    return v_str(p, strlen(p));
}

static struct jv v_list(struct env *e) {
    struct jv v = {.k = V_LIST};
    v.u.l = amalloc(e, sizeof(struct jlist));
    return v;
}
static void list_push(struct env *e, struct jlist *l, struct jv x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 8;
        struct jv *nv = amalloc(e, nc * sizeof(struct jv));
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(struct jv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}
static struct jv v_dict(struct env *e, enum vk k) {
    struct jv v = {.k = k};
    v.u.d = amalloc(e, sizeof(struct jdict));
    return v;
}
static bool str_eq(struct jv a, const char *s, size_t n) {
    return a.k == V_STR && a.u.s.n == n && memcmp(a.u.s.p, s, n) == 0;
}
static struct jv *dict_find(struct jdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->k[i], key, n))
            return &d->v[i];
    return NULL;
}
static void dict_set(struct env *e, struct jdict *d, struct jv key, struct jv val) {
    if (key.k == V_STR) {
        struct jv *p = dict_find(d, key.u.s.p, key.u.s.n);
        if (p) {
            *p = val;
            return;
        }
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        struct jv *nk = amalloc(e, nc * sizeof(struct jv)),
                  *nv = amalloc(e, nc * sizeof(struct jv));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(struct jv));
            memcpy(nv, d->v, d->n * sizeof(struct jv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = key;
    d->v[d->n++] = val;
}

static struct jv from_json(struct env *e, const cJSON *j) {
    if (!j || cJSON_IsNull(j))
        return v_none();
    if (cJSON_IsBool(j))
        return v_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            return v_int((int64_t)d);
        return v_float(d);
    }
    if (cJSON_IsString(j))
        return v_cstr(astrndup(e, j->valuestring, strlen(j->valuestring)));
    if (cJSON_IsArray(j)) {
        struct jv l = v_list(e);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) list_push(e, l.u.l, from_json(e, it));
        return l;
    }
    struct jv d = v_dict(e, V_DICT);
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        dict_set(e, d.u.d, v_cstr(astrndup(e, it->string, strlen(it->string))), from_json(e, it));
    }
    return d;
}

/* ---------------------------------------------------------------- string builder */

struct sb {
    struct env *e;
    char *p;
    size_t n, cap;
};
static void sb_put(struct sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = amalloc(b->e, nc);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void sb_puts(struct sb *b, const char *s) {
    sb_put(b, s, strlen(s));
}
static struct jv sb_val(struct sb *b) {
    return b->p ? v_str(b->p, b->n) : v_str("", 0);
}

/* Python repr of a float: the shortest digits that read back the same, fixed notation for
 * exponents in [-4, 16), else d.ddde+XX. */
static void put_float(struct sb *b, double f) {
    char buf[48], out[64];
    if (isnan(f)) {
        sb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        sb_puts(b, f > 0 ? "inf" : "-inf");
        return;
    }
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*e", prec, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    bool neg = buf[0] == '-';
    char digits[24];
    size_t nd = 0;
    const char *p = buf + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = -1; i > exp; i--)
                out[o++] = '0';
            for (size_t i = 0; i < nd; i++)
                out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t i = (size_t)exp + 1; i < nd; i++)
                    out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        snprintf(out + o, sizeof(out) - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    sb_puts(b, out);
}

static void put_repr(struct sb *b, struct jv v);

/* str(v) as Python prints it. */
static void put_str(struct sb *b, struct jv v) {
    char buf[32];
    switch (v.k) {
    case V_UNDEF: return;
    case V_NONE: sb_puts(b, "None"); return;
    case V_BOOL: sb_puts(b, v.u.b ? "True" : "False"); return;
    case V_INT:
        snprintf(buf, sizeof(buf), "%lld", (long long)v.u.i);
        sb_puts(b, buf);
        return;
    case V_FLOAT: put_float(b, v.u.f); return;
    case V_STR: sb_put(b, v.u.s.p, v.u.s.n); return;
    case V_LIST:
        sb_puts(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                sb_puts(b, ", ");
            put_repr(b, v.u.l->v[i]);
        }
        sb_puts(b, "]");
        return;
    case V_DICT:
    case V_NS:
        sb_puts(b, v.k == V_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                sb_puts(b, ", ");
            put_repr(b, v.u.d->k[i]);
            sb_puts(b, ": ");
            put_repr(b, v.u.d->v[i]);
        }
        sb_puts(b, v.k == V_NS ? "}>" : "}");
        return;
    case V_FUNC: sb_puts(b, "<function>"); return;
    }
}

static void put_repr(struct sb *b, struct jv v) {
    if (v.k != V_STR) {
        put_str(b, v);
        return;
    }
    bool has_sq = memchr(v.u.s.p, '\'', v.u.s.n) != NULL;
    bool has_dq = memchr(v.u.s.p, '"', v.u.s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < v.u.s.n; i++) {
        unsigned char c = (unsigned char)v.u.s.p[i];
        char esc[8];
        if (c == '\\')
            sb_puts(b, "\\\\");
        else if (c == (unsigned char)q)
            sb_puts(b, q == '\'' ? "\\'" : "\\\"");
        else if (c == '\n')
            sb_puts(b, "\\n");
        else if (c == '\r')
            sb_puts(b, "\\r");
        else if (c == '\t')
            sb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\x%02x", c);
            sb_puts(b, esc);
        } else
            sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, &q, 1);
}

/* json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...) */
static void put_json(struct env *e, struct sb *b, struct jv v, int indent, int depth,
                     const char *item_sep, const char *key_sep, bool sort_keys) {
    char buf[32];
    switch (v.k) {
    case V_UNDEF: fail(e, PD_EINVAL, "tojson: Undefined is not JSON serializable");
    case V_NONE: sb_puts(b, "null"); return;
    case V_BOOL: sb_puts(b, v.u.b ? "true" : "false"); return;
    case V_INT:
        snprintf(buf, sizeof(buf), "%lld", (long long)v.u.i);
        sb_puts(b, buf);
        return;
    case V_FLOAT:
        if (isnan(v.u.f))
            sb_puts(b, "NaN");
        else if (isinf(v.u.f))
            sb_puts(b, v.u.f > 0 ? "Infinity" : "-Infinity");
        else
            put_float(b, v.u.f);
        return;
    case V_STR:
        sb_puts(b, "\"");
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char c = (unsigned char)v.u.s.p[i];
            if (c == '"')
                sb_puts(b, "\\\"");
            else if (c == '\\')
                sb_puts(b, "\\\\");
            else if (c == '\n')
                sb_puts(b, "\\n");
            else if (c == '\r')
                sb_puts(b, "\\r");
            else if (c == '\t')
                sb_puts(b, "\\t");
            else if (c == '\b')
                sb_puts(b, "\\b");
            else if (c == '\f')
                sb_puts(b, "\\f");
            else if (c < 0x20) {
                snprintf(buf, sizeof(buf), "\\u%04x", c);
                sb_puts(b, buf);
            } else
                sb_put(b, (const char *)&c, 1);
        }
        sb_puts(b, "\"");
        return;
    case V_LIST:
    case V_DICT:
    case V_NS: {
        bool is_list = v.k == V_LIST;
        size_t n = is_list ? v.u.l->n : v.u.d->n;
        sb_puts(b, is_list ? "[" : "{");
        if (n == 0) {
            sb_puts(b, is_list ? "]" : "}");
            return;
        }
        size_t *order = amalloc(e, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        if (!is_list && sort_keys) {
            for (size_t i = 1; i < n; i++) { /* insertion sort by key bytes */
                size_t x = order[i], j = i;
                while (j > 0) {
                    struct jv a = v.u.d->k[order[j - 1]], c = v.u.d->k[x];
                    size_t m = a.u.s.n < c.u.s.n ? a.u.s.n : c.u.s.n;
                    int r = memcmp(a.u.s.p, c.u.s.p, m);
                    if (r < 0 || (r == 0 && a.u.s.n <= c.u.s.n))
                        break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        for (size_t i = 0; i < n; i++) {
            if (i)
                sb_puts(b, item_sep);
            if (indent >= 0) {
                sb_puts(b, "\n");
                for (int k = 0; k < indent * (depth + 1); k++)
                    sb_puts(b, " ");
            }
            if (is_list) {
                put_json(e, b, v.u.l->v[order[i]], indent, depth + 1, item_sep, key_sep, sort_keys);
            } else {
                struct jv key = v.u.d->k[order[i]];
                if (key.k != V_STR) {
                    struct sb kb = {.e = e};
                    put_str(&kb, key);
                    key = sb_val(&kb);
                }
                put_json(e, b, key, indent, depth + 1, item_sep, key_sep, sort_keys);
                sb_puts(b, key_sep);
                put_json(e, b, v.u.d->v[order[i]], indent, depth + 1, item_sep, key_sep, sort_keys);
            }
        }
        if (indent >= 0) {
            sb_puts(b, "\n");
            for (int k = 0; k < indent * depth; k++)
                sb_puts(b, " ");
        }
        sb_puts(b, is_list ? "]" : "}");
        return;
    }
    case V_FUNC: fail(e, PD_EINVAL, "tojson: a function is not JSON serializable");
    }
}

static bool truthy(struct jv v) {
    switch (v.k) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0.0;
    case V_STR: return v.u.s.n != 0;
    case V_LIST: return v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static const char *type_name(struct jv v) {
    static const char *const names[] = {"undefined", "NoneType", "bool", "int",       "float",
                                        "str",       "list",     "dict", "Namespace", "function"};
    return names[v.k];
}

static bool values_equal(struct jv a, struct jv b) {
    if ((a.k == V_INT || a.k == V_FLOAT || a.k == V_BOOL) &&
        (b.k == V_INT || b.k == V_FLOAT || b.k == V_BOOL)) {
        double x = a.k == V_INT ? (double)a.u.i : a.k == V_BOOL ? a.u.b : a.u.f;
        double y = b.k == V_INT ? (double)b.u.i : b.k == V_BOOL ? b.u.b : b.u.f;
        return x == y;
    }
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case V_LIST:
        if (a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!values_equal(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case V_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            struct jv *o = a.u.d->k[i].k == V_STR
                               ? dict_find(b.u.d, a.u.d->k[i].u.s.p, a.u.d->k[i].u.s.n)
                               : NULL;
            if (!o || !values_equal(a.u.d->v[i], *o))
                return false;
        }
        return true;
    default: return a.u.d == b.u.d;
    }
}

/* ---------------------------------------------------------------- lexer */

enum tk {
    T_EOF,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
};

struct tok {
    enum tk k;
    const char *s; /* text, name, string (unescaped) or operator */
    size_t n;
    int64_t i;
    double f;
    int line;
};

struct lexer {
    struct env *e;
    const char *src;
    size_t len, pos;
    int line;
    struct tok *toks;
    size_t n, cap;
    size_t line_pos; /* line_at's cache: src[0..line_pos) holds line_no - 1 newlines */
    int line_no;
};

static void push_tok(struct lexer *lx, struct tok t) {
    if (lx->n == lx->cap) {
        size_t nc = lx->cap ? lx->cap * 2 : 256;
        struct tok *nt = amalloc(lx->e, nc * sizeof(struct tok));
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
            fail(e, PD_EFORMAT, "line %d: unclosed tag", line_at(lx, p));
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
            char *num = astrndup(e, s + p, q - p);
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
                        sb_put(&b, u, ul);
                        q += 5;
                        continue;
                    }
                    if (rep)
                        sb_puts(&b, rep);
                    else { /* unknown escape: Python keeps the backslash */
                        sb_put(&b, "\\", 1);
                        sb_put(&b, &x, 1);
                    }
                    q++;
                } else {
                    sb_put(&b, s + q, 1);
                    q++;
                }
            }
            if (q >= n)
                fail(e, PD_EFORMAT, "line %d: unterminated string", line);
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
                fail(e, PD_EFORMAT, "line %d: unexpected character '%c'", line, c);
            t.k = T_OP;
            t.s = ops[k];
            t.n = strlen(ops[k]);
            p += t.n;
        }
        push_tok(lx, t);
    }
}

/* Jinja's whitespace rules with transformers' trim_blocks=True, lstrip_blocks=True. */
static void lex(struct lexer *lx) {
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
                fail(e, PD_EFORMAT, "line %d: unclosed comment", line);
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
                    fail(e, PD_EFORMAT, "line %d: unclosed raw tag", line);
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
                    fail(e, PD_EFORMAT, "line %d: raw without endraw", line);
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
                    fail(e, PD_EFORMAT, "line %d: unclosed endraw tag", line);
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

/* ---------------------------------------------------------------- AST */

enum nk {
    N_BLOCK,
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_MACRO,
    E_LIT,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_BIN,
    E_NEG,
    E_POS,
    E_NOT,
    E_AND,
    E_OR,
    E_COND,
    E_LIST,
    E_DICT,
    E_KW,
};

struct node {
    enum nk k;
    int line;
    const char *name; /* names, attributes, operators, filters, tests, kw names */
    size_t name_n;
    const char *name2; /* for-loop second target */
    struct jv lit;
    struct node *a, *b, *c, *d;
    struct node **list; /* block statements, call args, list items, dict k/v pairs */
    size_t n, cap;
    bool negate; /* "is not", "not in" */
};

/* Nesting limits: the parser and the renderer recurse, so a template nested (or a macro
 * calling itself) past these is an error, not a stack overflow. Real templates nest a few deep. */
#define PARSE_DEPTH_MAX 64
#define MACRO_DEPTH_MAX 32

struct parser {
    struct env *e;
    struct tok *t;
    size_t pos;
    int depth; /* parse_expr / parse_unary / parse_body frames open */
};

static void enter(struct parser *ps) {
    if (++ps->depth > PARSE_DEPTH_MAX)
        fail(ps->e, PD_EFORMAT, "line %d: template nested deeper than %d", ps->t[ps->pos].line,
             PARSE_DEPTH_MAX);
}

static struct node *mk(struct parser *ps, enum nk k, int line) {
    struct node *n = amalloc(ps->e, sizeof(struct node));
    n->k = k;
    n->line = line;
    return n;
}

static void add_child(struct parser *ps, struct node *p, struct node *c) {
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 4;
        struct node **nl = amalloc(ps->e, nc * sizeof(struct node *));
        if (p->n)
            memcpy(nl, p->list, p->n * sizeof(struct node *));
        p->list = nl;
        p->cap = nc;
    }
    p->list[p->n++] = c;
}

static struct tok *peek(struct parser *ps) {
    return &ps->t[ps->pos];
}
static struct tok *next(struct parser *ps) {
    return &ps->t[ps->pos++];
}
static bool is_op(const struct tok *t, const char *op) {
    return t->k == T_OP && t->n == strlen(op) && memcmp(t->s, op, t->n) == 0;
}
static bool is_name(const struct tok *t, const char *nm) {
    return t->k == T_NAME && t->n == strlen(nm) && memcmp(t->s, nm, t->n) == 0;
}
static bool accept_op(struct parser *ps, const char *op) {
    if (is_op(peek(ps), op)) {
        ps->pos++;
        return true;
    }
    return false;
}
static bool accept_name(struct parser *ps, const char *nm) {
    if (is_name(peek(ps), nm)) {
        ps->pos++;
        return true;
    }
    return false;
}
static void expect_op(struct parser *ps, const char *op) {
    struct tok *t = peek(ps);
    if (!accept_op(ps, op))
        fail(ps->e, PD_EFORMAT, "line %d: expected '%s', found '%.*s'", t->line, op,
             (int)(t->k == T_EOF ? 3 : t->n),
             t->k == T_EOF ? "end"
             : t->s        ? t->s
                           : "tag");
}
static struct tok *expect_name(struct parser *ps) {
    struct tok *t = next(ps);
    if (t->k != T_NAME)
        fail(ps->e, PD_EFORMAT, "line %d: expected a name", t->line);
    return t;
}

static struct node *parse_expr(struct parser *ps);
static struct node *parse_or(struct parser *ps);

static struct node *parse_primary(struct parser *ps) {
    struct tok *t = next(ps);
    struct node *n;
    switch (t->k) {
    case T_STRING: {
        n = mk(ps, E_LIT, t->line);
        struct sb b = {.e = ps->e};
        sb_put(&b, t->s, t->n);
        /* adjacent string literals concatenate */
        while (peek(ps)->k == T_STRING) {
            struct tok *u = next(ps);
            sb_put(&b, u->s, u->n);
        }
        n->lit = sb_val(&b);
        return n;
    }
    case T_INT:
        n = mk(ps, E_LIT, t->line);
        n->lit = v_int(t->i);
        return n;
    case T_FLOAT:
        n = mk(ps, E_LIT, t->line);
        n->lit = v_float(t->f);
        return n;
    case T_NAME:
        n = mk(ps, E_LIT, t->line);
        if (is_name(t, "true") || is_name(t, "True"))
            n->lit = v_bool(true);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->lit = v_bool(false);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->lit = v_none();
        else {
            n->k = E_NAME;
            n->name = t->s;
            n->name_n = t->n;
        }
        return n;
    case T_OP:
        if (is_op(t, "(")) {
            struct node *inner = parse_expr(ps);
            if (is_op(peek(ps), ",")) { /* a tuple: treated as a list */
                n = mk(ps, E_LIST, t->line);
                add_child(ps, n, inner);
                while (accept_op(ps, ",")) {
                    if (is_op(peek(ps), ")"))
                        break;
                    add_child(ps, n, parse_expr(ps));
                }
                inner = n;
            }
            expect_op(ps, ")");
            return inner;
        }
        if (is_op(t, "[")) {
            n = mk(ps, E_LIST, t->line);
            while (!is_op(peek(ps), "]")) {
                add_child(ps, n, parse_expr(ps));
                if (!accept_op(ps, ","))
                    break;
            }
            expect_op(ps, "]");
            return n;
        }
        if (is_op(t, "{")) {
            n = mk(ps, E_DICT, t->line);
            while (!is_op(peek(ps), "}")) {
                add_child(ps, n, parse_expr(ps));
                expect_op(ps, ":");
                add_child(ps, n, parse_expr(ps));
                if (!accept_op(ps, ","))
                    break;
            }
            expect_op(ps, "}");
            return n;
        }
        break;
    default: break;
    }
    fail(ps->e, PD_EFORMAT, "line %d: unexpected '%.*s' in an expression", t->line,
         (int)(t->s ? t->n : 3), t->s ? t->s : "tag");
}

/* f(a, b, key=value) — the '(' is already taken. */
static void parse_args(struct parser *ps, struct node *call) {
    while (!is_op(peek(ps), ")")) {
        struct tok *t = peek(ps);
        if (t->k == T_NAME && is_op(&ps->t[ps->pos + 1], "=")) {
            ps->pos += 2;
            struct node *kw = mk(ps, E_KW, t->line);
            kw->name = t->s;
            kw->name_n = t->n;
            kw->a = parse_expr(ps);
            add_child(ps, call, kw);
        } else {
            add_child(ps, call, parse_expr(ps));
        }
        if (!accept_op(ps, ","))
            break;
    }
    expect_op(ps, ")");
}

static struct node *parse_postfix(struct parser *ps, struct node *n) {
    for (;;) {
        struct tok *t = peek(ps);
        if (accept_op(ps, ".")) {
            struct tok *nm = next(ps);
            struct node *a = mk(ps, E_ATTR, t->line);
            a->a = n;
            if (nm->k == T_NAME) {
                a->name = nm->s;
                a->name_n = nm->n;
            } else if (nm->k == T_INT) { /* x.0 */
                a->k = E_ITEM;
                a->b = mk(ps, E_LIT, t->line);
                a->b->lit = v_int(nm->i);
            } else {
                fail(ps->e, PD_EFORMAT, "line %d: expected an attribute name after '.'", t->line);
            }
            n = a;
        } else if (accept_op(ps, "[")) {
            struct node *lo = NULL, *hi = NULL, *step = NULL;
            bool slice = false;
            if (!is_op(peek(ps), ":"))
                lo = parse_expr(ps);
            if (accept_op(ps, ":")) {
                slice = true;
                if (!is_op(peek(ps), "]") && !is_op(peek(ps), ":"))
                    hi = parse_expr(ps);
                if (accept_op(ps, ":") && !is_op(peek(ps), "]"))
                    step = parse_expr(ps);
            }
            expect_op(ps, "]");
            struct node *it = mk(ps, slice ? E_SLICE : E_ITEM, t->line);
            it->a = n;
            it->b = lo;
            it->c = hi;
            it->d = step;
            n = it;
        } else if (accept_op(ps, "(")) {
            struct node *c = mk(ps, E_CALL, t->line);
            c->a = n;
            parse_args(ps, c);
            n = c;
        } else {
            return n;
        }
    }
}

/* x | filter(args) and x is [not] test(args) */
static struct node *parse_filters(struct parser *ps, struct node *n) {
    for (;;) {
        struct tok *t = peek(ps);
        if (accept_op(ps, "|")) {
            struct tok *nm = expect_name(ps);
            struct node *f = mk(ps, E_FILTER, t->line);
            f->name = nm->s;
            f->name_n = nm->n;
            f->a = n;
            if (accept_op(ps, "("))
                parse_args(ps, f);
            n = f;
        } else if (accept_name(ps, "is")) {
            struct node *f = mk(ps, E_TEST, t->line);
            f->negate = accept_name(ps, "not");
            struct tok *nm = next(ps);
            if (nm->k == T_NAME) {
                f->name = nm->s;
                f->name_n = nm->n;
            } else if (nm->k == T_OP && (is_op(nm, "==") || is_op(nm, "!=") || is_op(nm, "<") ||
                                         is_op(nm, ">") || is_op(nm, "<=") || is_op(nm, ">="))) {
                f->name = nm->s;
                f->name_n = nm->n;
            } else {
                fail(ps->e, PD_EFORMAT, "line %d: expected a test name after 'is'", t->line);
            }
            f->a = n;
            if (accept_op(ps, "(")) {
                parse_args(ps, f);
            } else {
                /* a test takes one argument without parentheses: `is divisibleby 3` */
                struct tok *u = peek(ps);
                if (u->k == T_STRING || u->k == T_INT || u->k == T_FLOAT ||
                    (u->k == T_NAME && !is_name(u, "and") && !is_name(u, "or") &&
                     !is_name(u, "else") && !is_name(u, "if") && !is_name(u, "in") &&
                     !is_name(u, "is") && !is_name(u, "not")))
                    add_child(ps, f, parse_postfix(ps, parse_primary(ps)));
            }
            n = f;
        } else {
            return n;
        }
    }
}

static struct node *parse_unary(struct parser *ps) {
    struct tok *t = peek(ps);
    struct node *n;
    enter(ps);
    if (accept_op(ps, "-")) {
        n = mk(ps, E_NEG, t->line);
        n->a = parse_unary(ps);
    } else if (accept_op(ps, "+")) {
        n = mk(ps, E_POS, t->line);
        n->a = parse_unary(ps);
    } else {
        n = parse_filters(ps, parse_postfix(ps, parse_primary(ps)));
    }
    ps->depth--;
    return n;
}

static struct node *bin(struct parser *ps, const char *op, struct node *a, struct node *b,
                        int line) {
    struct node *n = mk(ps, E_BIN, line);
    n->name = op;
    n->a = a;
    n->b = b;
    return n;
}

static struct node *parse_pow(struct parser *ps) {
    struct node *n = parse_unary(ps);
    while (is_op(peek(ps), "**")) {
        int line = next(ps)->line;
        n = bin(ps, "**", n, parse_unary(ps), line);
    }
    return n;
}

static struct node *parse_mul(struct parser *ps) {
    struct node *n = parse_pow(ps);
    for (;;) {
        struct tok *t = peek(ps);
        const char *op = is_op(t, "*")    ? "*"
                         : is_op(t, "//") ? "//"
                         : is_op(t, "/")  ? "/"
                         : is_op(t, "%")  ? "%"
                                          : NULL;
        if (!op)
            return n;
        ps->pos++;
        n = bin(ps, op, n, parse_pow(ps), t->line);
    }
}

static struct node *parse_concat(struct parser *ps) {
    struct node *n = parse_mul(ps);
    while (is_op(peek(ps), "~")) {
        int line = next(ps)->line;
        n = bin(ps, "~", n, parse_mul(ps), line);
    }
    return n;
}

static struct node *parse_add(struct parser *ps) {
    struct node *n = parse_concat(ps);
    for (;;) {
        struct tok *t = peek(ps);
        const char *op = is_op(t, "+") ? "+" : is_op(t, "-") ? "-" : NULL;
        if (!op)
            return n;
        ps->pos++;
        n = bin(ps, op, n, parse_concat(ps), t->line);
    }
}

static struct node *parse_compare(struct parser *ps) {
    struct node *n = parse_add(ps);
    for (;;) {
        struct tok *t = peek(ps);
        static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        const char *op = NULL;
        for (size_t i = 0; i < PD_ARRAY_LEN(ops); i++)
            if (is_op(t, ops[i]))
                op = ops[i];
        if (op) {
            ps->pos++;
            n = bin(ps, op, n, parse_add(ps), t->line);
        } else if (is_name(t, "in")) {
            ps->pos++;
            n = bin(ps, "in", n, parse_add(ps), t->line);
        } else if (is_name(t, "not") && is_name(&ps->t[ps->pos + 1], "in")) {
            ps->pos += 2;
            n = bin(ps, "in", n, parse_add(ps), t->line);
            n->negate = true;
        } else {
            return n;
        }
    }
}

static struct node *parse_not(struct parser *ps) {
    struct tok *t = peek(ps);
    if (accept_name(ps, "not")) {
        struct node *n = mk(ps, E_NOT, t->line);
        n->a = parse_not(ps);
        return n;
    }
    return parse_compare(ps);
}

static struct node *parse_and(struct parser *ps) {
    struct node *n = parse_not(ps);
    while (is_name(peek(ps), "and")) {
        struct node *a = mk(ps, E_AND, next(ps)->line);
        a->a = n;
        a->b = parse_not(ps);
        n = a;
    }
    return n;
}

static struct node *parse_or(struct parser *ps) {
    struct node *n = parse_and(ps);
    while (is_name(peek(ps), "or")) {
        struct node *o = mk(ps, E_OR, next(ps)->line);
        o->a = n;
        o->b = parse_and(ps);
        n = o;
    }
    return n;
}

/* a if cond else b (else optional: undefined) */
static struct node *parse_expr(struct parser *ps) {
    enter(ps);
    struct node *n = parse_or(ps);
    while (is_name(peek(ps), "if")) {
        struct node *c = mk(ps, E_COND, next(ps)->line);
        c->a = n;
        c->b = parse_or(ps);
        if (accept_name(ps, "else"))
            c->c = parse_expr(ps);
        n = c;
    }
    ps->depth--;
    return n;
}

static void expect_block_end(struct parser *ps) {
    struct tok *t = peek(ps);
    if (t->k != T_BLOCK_END)
        fail(ps->e, PD_EFORMAT, "line %d: expected the end of the tag, found '%.*s'", t->line,
             (int)(t->s ? t->n : 1), t->s ? t->s : "?");
    ps->pos++;
}

/* Parses statements until one of the end tags (NULL-terminated list); leaves the parser on
 * the end tag's name and stores which one in *which. */
static struct node *parse_body(struct parser *ps, const char *const *ends, const char **which);

static struct node *parse_stmt(struct parser *ps, struct tok *kw) {
    struct env *e = ps->e;
    int line = kw->line;
    if (is_name(kw, "if")) {
        struct node *n = mk(ps, N_IF, line);
        n->a = parse_expr(ps);
        expect_block_end(ps);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        const char *which;
        n->b = parse_body(ps, ends, &which);
        struct node *cur = n;
        while (!strcmp(which, "elif")) {
            struct node *el = mk(ps, N_IF, peek(ps)->line);
            el->a = parse_expr(ps);
            expect_block_end(ps);
            el->b = parse_body(ps, ends, &which);
            cur->c = el;
            cur = el;
        }
        if (!strcmp(which, "else")) {
            expect_block_end(ps);
            static const char *const ends2[] = {"endif", NULL};
            cur->c = parse_body(ps, ends2, &which);
        }
        expect_block_end(ps);
        return n;
    }
    if (is_name(kw, "for")) {
        struct node *n = mk(ps, N_FOR, line);
        struct tok *t1 = expect_name(ps);
        n->name = t1->s;
        n->name_n = t1->n;
        if (accept_op(ps, ",")) {
            struct tok *t2 = expect_name(ps);
            n->name2 = astrndup(e, t2->s, t2->n);
        }
        if (!accept_name(ps, "in"))
            fail(e, PD_EFORMAT, "line %d: expected 'in' in a for loop", line);
        n->a = parse_or(ps); /* not parse_expr: `if` here filters the loop */
        if (accept_name(ps, "if"))
            n->d = parse_or(ps);
        if (accept_name(ps, "recursive"))
            fail(e, PD_EUNSUPPORTED, "line %d: unsupported construct 'for ... recursive'", line);
        expect_block_end(ps);
        static const char *const ends[] = {"else", "endfor", NULL};
        const char *which;
        n->b = parse_body(ps, ends, &which);
        if (!strcmp(which, "else")) {
            expect_block_end(ps);
            static const char *const ends2[] = {"endfor", NULL};
            n->c = parse_body(ps, ends2, &which);
        }
        expect_block_end(ps);
        return n;
    }
    if (is_name(kw, "set")) {
        struct tok *t = expect_name(ps);
        struct node *target = mk(ps, E_NAME, line);
        target->name = t->s;
        target->name_n = t->n;
        if (accept_op(ps, ".")) {
            struct tok *attr = expect_name(ps);
            struct node *a = mk(ps, E_ATTR, line);
            a->a = target;
            a->name = attr->s;
            a->name_n = attr->n;
            target = a;
        }
        if (is_op(peek(ps), ","))
            fail(e, PD_EUNSUPPORTED, "line %d: unsupported construct 'set a, b = ...'", line);
        if (accept_op(ps, "=")) {
            struct node *n = mk(ps, N_SET, line);
            n->a = target;
            n->b = parse_expr(ps);
            expect_block_end(ps);
            return n;
        }
        /* {% set x %}...{% endset %} */
        expect_block_end(ps);
        struct node *n = mk(ps, N_SETBLOCK, line);
        n->a = target;
        static const char *const ends[] = {"endset", NULL};
        const char *which;
        n->b = parse_body(ps, ends, &which);
        expect_block_end(ps);
        return n;
    }
    if (is_name(kw, "break") || is_name(kw, "continue")) {
        struct node *n = mk(ps, is_name(kw, "break") ? N_BREAK : N_CONTINUE, line);
        expect_block_end(ps);
        return n;
    }
    if (is_name(kw, "macro")) {
        struct tok *t = expect_name(ps);
        struct node *n = mk(ps, N_MACRO, line);
        n->name = t->s;
        n->name_n = t->n;
        n->a = mk(ps, E_LIST, line); /* parameters: E_KW with optional default */
        expect_op(ps, "(");
        while (!is_op(peek(ps), ")")) {
            struct tok *p = expect_name(ps);
            struct node *param = mk(ps, E_KW, line);
            param->name = p->s;
            param->name_n = p->n;
            if (accept_op(ps, "="))
                param->a = parse_expr(ps);
            add_child(ps, n->a, param);
            if (!accept_op(ps, ","))
                break;
        }
        expect_op(ps, ")");
        expect_block_end(ps);
        static const char *const ends[] = {"endmacro", NULL};
        const char *which;
        n->b = parse_body(ps, ends, &which);
        expect_block_end(ps);
        return n;
    }
    if (is_name(kw, "generation")) {
        /* transformers' AssistantTracker tag: only marks a span; render its body */
        expect_block_end(ps);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        struct node *body = parse_body(ps, ends, &which);
        expect_block_end(ps);
        return body;
    }
    fail(e, PD_EUNSUPPORTED, "line %d: unsupported construct '{%% %.*s %%}'", line, (int)kw->n,
         kw->s);
}

static struct node *parse_block(struct parser *ps, const char *const *ends, const char **which) {
    struct node *blk = mk(ps, N_BLOCK, peek(ps)->line);
    for (;;) {
        struct tok *t = next(ps);
        switch (t->k) {
        case T_EOF:
            if (!ends)
                return blk;
            {
                size_t last = 0;
                while (ends[last + 1])
                    last++;
                fail(ps->e, PD_EFORMAT, "line %d: missing {%% %s %%}", t->line, ends[last]);
            }
        case T_TEXT: {
            struct node *n = mk(ps, N_TEXT, t->line);
            n->name = t->s;
            n->name_n = t->n;
            add_child(ps, blk, n);
            break;
        }
        case T_VAR_BEGIN: {
            struct node *n = mk(ps, N_OUT, t->line);
            n->a = parse_expr(ps);
            struct tok *end = next(ps);
            if (end->k != T_VAR_END)
                fail(ps->e, PD_EFORMAT, "line %d: expected '}}'", end->line);
            add_child(ps, blk, n);
            break;
        }
        case T_BLOCK_BEGIN: {
            struct tok *kw = next(ps);
            if (kw->k != T_NAME)
                fail(ps->e, PD_EFORMAT, "line %d: expected a tag name after '{%%'", kw->line);
            for (size_t i = 0; ends && ends[i]; i++) {
                if (is_name(kw, ends[i])) {
                    *which = ends[i];
                    return blk;
                }
            }
            if (is_name(kw, "endif") || is_name(kw, "endfor") || is_name(kw, "else") ||
                is_name(kw, "elif") || is_name(kw, "endset") || is_name(kw, "endmacro"))
                fail(ps->e, PD_EFORMAT, "line %d: unexpected {%% %.*s %%}", kw->line, (int)kw->n,
                     kw->s);
            add_child(ps, blk, parse_stmt(ps, kw));
            break;
        }
        default: fail(ps->e, PD_EFORMAT, "line %d: unexpected token", t->line);
        }
    }
}

/* parse_block, counted against PARSE_DEPTH_MAX: blocks nest through parse_stmt */
static struct node *parse_body(struct parser *ps, const char *const *ends, const char **which) {
    enter(ps);
    struct node *blk = parse_block(ps, ends, which);
    ps->depth--;
    return blk;
}

struct pd_chat_template {
    struct arena arena;
    struct node *root;
};

int pd_chat_template_new(const char *src, struct pd_chat_template **out) {
    *out = NULL;
    struct pd_chat_template *t = pd_calloc(1, sizeof(*t));
    if (!t)
        return pd_error_wrap(PD_ENOMEM, "compiling the chat template");
    struct env e = {.arena = &t->arena};
    if (setjmp(e.jb)) {
        pd_chat_template_free(t);
        return e.code;
    }
    struct lexer lx = {.e = &e, .src = src, .len = strlen(src), .line = 1};
    lex(&lx);
    struct parser ps = {.e = &e, .t = lx.toks};
    t->root = parse_body(&ps, NULL, NULL);
    *out = t;
    return PD_OK;
}

void pd_chat_template_free(struct pd_chat_template *t) {
    if (!t)
        return;
    arena_free(&t->arena);
    pd_free(t);
}

/* ---------------------------------------------------------------- renderer */

struct scope {
    struct scope *up;
    struct jdict vars;
};

enum flow { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

struct rt {
    struct env *e;
    struct scope *sc;
    struct sb *out;
    int macro_depth; /* macro calls open */
};

static struct jv eval(struct rt *r, const struct node *n);
static enum flow exec(struct rt *r, const struct node *n);

static struct jv *lookup(struct rt *r, const char *name, size_t n) {
    for (struct scope *s = r->sc; s; s = s->up) {
        struct jv *v = dict_find(&s->vars, name, n);
        if (v)
            return v;
    }
    return NULL;
}

static void set_var(struct rt *r, const char *name, size_t n, struct jv v) {
    dict_set(r->e, &r->sc->vars, v_str(name, n), v);
}

static struct jv make_func(struct rt *r, const char *name, struct jv *self) {
    struct jv v = {.k = V_FUNC};
    v.u.fn = amalloc(r->e, sizeof(struct jfunc));
    v.u.fn->name = name;
    v.u.fn->self = self;
    return v;
}

static const char *const str_methods[] = {
    "startswith", "endswith", "strip",   "lstrip",     "rstrip", "split", "upper",  "lower",
    "replace",    "title",    "find",    "capitalize", "count",  "join",  "format", "rsplit",
    "splitlines", "isdigit",  "isalpha", "isspace",    "index",  NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

static bool in_list(const char *const *l, const char *s, size_t n) {
    for (size_t i = 0; l[i]; i++)
        if (strlen(l[i]) == n && memcmp(l[i], s, n) == 0)
            return true;
    return false;
}

static struct jv get_attr(struct rt *r, struct jv obj, const char *name, size_t n, int line) {
    struct env *e = r->e;
    if (obj.k == V_UNDEF)
        fail(e, PD_EINVAL, "line %d: '%.*s' of an undefined value", line, (int)n, name);
    if (obj.k == V_NS || obj.k == V_DICT) {
        if (obj.k == V_DICT && in_list(dict_methods, name, n)) {
            struct jv *self = amalloc(e, sizeof(struct jv));
            *self = obj;
            return make_func(r, astrndup(e, name, n), self);
        }
        struct jv *v = dict_find(obj.u.d, name, n);
        return v ? *v : v_undef();
    }
    if (obj.k == V_STR && in_list(str_methods, name, n)) {
        struct jv *self = amalloc(e, sizeof(struct jv));
        *self = obj;
        return make_func(r, astrndup(e, name, n), self);
    }
    return v_undef();
}

static int64_t norm_index(int64_t i, size_t n) {
    return i < 0 ? i + (int64_t)n : i;
}

static struct jv get_item(struct rt *r, struct jv obj, struct jv key, int line) {
    struct env *e = r->e;
    if (obj.k == V_UNDEF)
        fail(e, PD_EINVAL, "line %d: subscript of an undefined value", line);
    if (obj.k == V_DICT || obj.k == V_NS) {
        if (key.k == V_STR) {
            struct jv *v = dict_find(obj.u.d, key.u.s.p, key.u.s.n);
            if (v)
                return *v;
            return get_attr(r, obj, key.u.s.p, key.u.s.n, line);
        }
        for (size_t i = 0; i < obj.u.d->n; i++)
            if (values_equal(obj.u.d->k[i], key))
                return obj.u.d->v[i];
        return v_undef();
    }
    if ((obj.k == V_LIST || obj.k == V_STR) && key.k == V_INT) {
        size_t len = obj.k == V_LIST ? obj.u.l->n : obj.u.s.n;
        int64_t i = norm_index(key.u.i, len);
        if (i < 0 || (size_t)i >= len)
            return v_undef(); /* Jinja: an out-of-range subscript is undefined */
        if (obj.k == V_LIST)
            return obj.u.l->v[i];
        /* strings index by character */
        const char *s = obj.u.s.p;
        size_t pos = 0;
        int64_t ci = 0;
        int64_t nchars = 0;
        for (size_t k = 0; k < len; k++)
            nchars += ((unsigned char)s[k] & 0xC0) != 0x80;
        i = norm_index(key.u.i, (size_t)nchars);
        if (i < 0 || i >= nchars)
            return v_undef();
        while (ci < i) {
            pos++;
            while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80)
                pos++;
            ci++;
        }
        size_t end = pos + 1;
        while (end < len && ((unsigned char)s[end] & 0xC0) == 0x80)
            end++;
        return v_str(s + pos, end - pos);
    }
    if (key.k == V_STR)
        return get_attr(r, obj, key.u.s.p, key.u.s.n, line);
    return v_undef();
}

/* Python slicing of lists and strings (strings by character). */
static struct jv slice(struct rt *r, struct jv obj, struct jv lo, struct jv hi, struct jv st,
                       int line) {
    struct env *e = r->e;
    int64_t step = st.k == V_INT ? st.u.i : 1;
    if (step == 0)
        fail(e, PD_EINVAL, "line %d: slice step cannot be zero", line);
    size_t n;
    const char **starts = NULL; /* character starts for strings */
    if (obj.k == V_LIST) {
        n = obj.u.l->n;
    } else if (obj.k == V_STR) {
        n = 0;
        for (size_t k = 0; k < obj.u.s.n; k++)
            n += ((unsigned char)obj.u.s.p[k] & 0xC0) != 0x80;
        starts = amalloc(e, (n + 1) * sizeof(char *));
        size_t c = 0;
        for (size_t k = 0; k < obj.u.s.n; k++)
            if (((unsigned char)obj.u.s.p[k] & 0xC0) != 0x80)
                starts[c++] = obj.u.s.p + k;
        starts[n] = obj.u.s.p + obj.u.s.n;
    } else {
        fail(e, PD_EINVAL, "line %d: cannot slice a %s", line, type_name(obj));
    }
    int64_t len = (int64_t)n, a, b;
    if (step > 0) {
        a = lo.k == V_INT ? norm_index(lo.u.i, n) : 0;
        b = hi.k == V_INT ? norm_index(hi.u.i, n) : len;
        a = a < 0 ? 0 : a > len ? len : a;
        b = b < 0 ? 0 : b > len ? len : b;
    } else {
        a = lo.k == V_INT ? norm_index(lo.u.i, n) : len - 1;
        b = hi.k == V_INT ? norm_index(hi.u.i, n) : -1;
        a = a < -1 ? -1 : a > len - 1 ? len - 1 : a;
        b = b < -1 ? -1 : b > len - 1 ? len - 1 : b;
    }
    if (obj.k == V_LIST) {
        struct jv out = v_list(e);
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
            list_push(e, out.u.l, obj.u.l->v[i]);
        return out;
    }
    struct sb sbuf = {.e = e};
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
        sb_put(&sbuf, starts[i], (size_t)(starts[i + 1] - starts[i]));
    return sb_val(&sbuf);
}

static double num(struct rt *r, struct jv v, int line) {
    if (v.k == V_INT)
        return (double)v.u.i;
    if (v.k == V_FLOAT)
        return v.u.f;
    if (v.k == V_BOOL)
        return v.u.b;
    fail(r->e, PD_EINVAL, "line %d: expected a number, got %s", line, type_name(v));
}

static int cmp_values(struct rt *r, struct jv a, struct jv b, int line) {
    if (a.k == V_STR && b.k == V_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, m);
        return c ? c : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    double x = num(r, a, line), y = num(r, b, line);
    return (x > y) - (x < y);
}

static bool contains(struct rt *r, struct jv hay, struct jv needle, int line) {
    if (hay.k == V_STR) {
        if (needle.k != V_STR)
            fail(r->e, PD_EINVAL, "line %d: 'in <string>' needs a string on the left", line);
        if (needle.u.s.n == 0)
            return true;
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n; i++)
            if (memcmp(hay.u.s.p + i, needle.u.s.p, needle.u.s.n) == 0)
                return true;
        return false;
    }
    if (hay.k == V_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (values_equal(hay.u.l->v[i], needle))
                return true;
        return false;
    }
    if (hay.k == V_DICT || hay.k == V_NS) {
        for (size_t i = 0; i < hay.u.d->n; i++)
            if (values_equal(hay.u.d->k[i], needle))
                return true;
        return false;
    }
    if (hay.k == V_UNDEF)
        fail(r->e, PD_EINVAL, "line %d: 'in' on an undefined value", line);
    fail(r->e, PD_EINVAL, "line %d: argument of type '%s' is not iterable", line, type_name(hay));
}

static struct jv to_str(struct rt *r, struct jv v) {
    if (v.k == V_STR)
        return v;
    struct sb b = {.e = r->e};
    put_str(&b, v);
    return sb_val(&b);
}

static struct jv binop(struct rt *r, const struct node *n, struct jv a, struct jv b) {
    struct env *e = r->e;
    const char *op = n->name;
    int line = n->line;
    if (!strcmp(op, "~")) {
        struct sb s = {.e = e};
        put_str(&s, a);
        put_str(&s, b);
        return sb_val(&s);
    }
    if (!strcmp(op, "==") || !strcmp(op, "!="))
        return v_bool(values_equal(a, b) == (op[0] == '='));
    if (!strcmp(op, "in"))
        return v_bool(contains(r, b, a, line) != n->negate);
    if (!strcmp(op, "<"))
        return v_bool(cmp_values(r, a, b, line) < 0);
    if (!strcmp(op, ">"))
        return v_bool(cmp_values(r, a, b, line) > 0);
    if (!strcmp(op, "<="))
        return v_bool(cmp_values(r, a, b, line) <= 0);
    if (!strcmp(op, ">="))
        return v_bool(cmp_values(r, a, b, line) >= 0);
    if (!strcmp(op, "+")) {
        if (a.k == V_STR && b.k == V_STR) {
            struct sb s = {.e = e};
            sb_put(&s, a.u.s.p, a.u.s.n);
            sb_put(&s, b.u.s.p, b.u.s.n);
            return sb_val(&s);
        }
        if (a.k == V_LIST && b.k == V_LIST) {
            struct jv l = v_list(e);
            for (size_t i = 0; i < a.u.l->n; i++)
                list_push(e, l.u.l, a.u.l->v[i]);
            for (size_t i = 0; i < b.u.l->n; i++)
                list_push(e, l.u.l, b.u.l->v[i]);
            return l;
        }
        if (a.k == V_STR || b.k == V_STR || a.k == V_LIST || b.k == V_LIST || a.k == V_UNDEF ||
            b.k == V_UNDEF || a.k == V_NONE || b.k == V_NONE)
            fail(e, PD_EINVAL, "line %d: unsupported operand types for +: '%s' and '%s'", line,
                 type_name(a), type_name(b));
    }
    if (!strcmp(op, "*") && ((a.k == V_STR && b.k == V_INT) || (a.k == V_INT && b.k == V_STR))) {
        struct jv s = a.k == V_STR ? a : b;
        int64_t k = a.k == V_INT ? a.u.i : b.u.i;
        if (s.u.s.n && k > 0 && (uint64_t)k > ARENA_MAX / s.u.s.n)
            fail(e, PD_ERANGE, "line %d: string repeated %" PRId64 " times: too long", line, k);
        struct sb out = {.e = e};
        for (int64_t i = 0; i < k; i++)
            sb_put(&out, s.u.s.p, s.u.s.n);
        return sb_val(&out);
    }
    bool ints = (a.k == V_INT || a.k == V_BOOL) && (b.k == V_INT || b.k == V_BOOL);
    int64_t x = a.k == V_BOOL ? a.u.b : a.u.i, y = b.k == V_BOOL ? b.u.b : b.u.i, z = 0;
    double fx = num(r, a, line), fy = num(r, b, line);
    /* Python's ints do not overflow; ours are int64: past it is an error (C's overflow is UB) */
    if (ints && ((op[0] == '+' && __builtin_add_overflow(x, y, &z)) ||
                 (op[0] == '-' && __builtin_sub_overflow(x, y, &z)) ||
                 (op[0] == '*' && !op[1] && __builtin_mul_overflow(x, y, &z)) ||
                 (op[0] == '/' && op[1] == '/' && x == INT64_MIN && y == -1)))
        fail(e, PD_ERANGE, "line %d: integer overflow in %s", line, op);
    switch (op[0]) {
    case '+': return ints ? v_int(z) : v_float(fx + fy);
    case '-': return ints ? v_int(z) : v_float(fx - fy);
    case '*':
        if (op[1] == '*') {
            if (ints && y >= 0) {
                double p = pow((double)x, (double)y);
                if (!(p >= -9223372036854775808.0 && p < 9223372036854775808.0))
                    fail(e, PD_ERANGE, "line %d: integer overflow in **", line);
                return v_int((int64_t)llround(p));
            }
            return v_float(pow(fx, fy));
        }
        return ints ? v_int(z) : v_float(fx * fy);
    case '/':
        if (fy == 0)
            fail(e, PD_EINVAL, "line %d: division by zero", line);
        if (op[1] == '/') {
            if (ints) {
                int64_t q = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0)))
                    q--;
                return v_int(q);
            }
            return v_float(floor(fx / fy));
        }
        return v_float(fx / fy);
    case '%':
        if (a.k == V_STR)
            fail(e, PD_EUNSUPPORTED, "line %d: unsupported construct: string %% formatting", line);
        if (fy == 0)
            fail(e, PD_EINVAL, "line %d: modulo by zero", line);
        if (ints) {
            int64_t m = y == -1 ? 0 : x % y; /* INT64_MIN % -1 overflows in C */
            if (m != 0 && ((m < 0) != (y < 0)))
                m += y;
            return v_int(m);
        }
        return v_float(fx - floor(fx / fy) * fy);
    }
    fail(e, PD_EINTERNAL, "line %d: unknown operator %s", line, op);
}

/* Evaluated call arguments: positional and keyword. */
struct args {
    struct jv pos[8];
    size_t npos;
    const char *kw[8];
    size_t kw_n[8];
    struct jv kwv[8];
    size_t nkw;
};

static void eval_args(struct rt *r, const struct node *call, size_t first, struct args *a) {
    memset(a, 0, sizeof(*a));
    for (size_t i = first; i < call->n; i++) {
        const struct node *arg = call->list[i];
        if (arg->k == E_KW) {
            if (a->nkw == 8)
                fail(r->e, PD_EUNSUPPORTED, "line %d: more than 8 keyword arguments", call->line);
            a->kw[a->nkw] = arg->name;
            a->kw_n[a->nkw] = arg->name_n;
            a->kwv[a->nkw++] = eval(r, arg->a);
        } else {
            if (a->npos == 8)
                fail(r->e, PD_EUNSUPPORTED, "line %d: more than 8 arguments", call->line);
            a->pos[a->npos++] = eval(r, arg);
        }
    }
}

/* Positional argument i or keyword `name`, else dflt. */
static struct jv arg(const struct args *a, size_t i, const char *name, struct jv dflt) {
    if (i < a->npos)
        return a->pos[i];
    for (size_t k = 0; k < a->nkw; k++)
        if (strlen(name) == a->kw_n[k] && !memcmp(a->kw[k], name, a->kw_n[k]))
            return a->kwv[k];
    return dflt;
}

static bool is_space_char(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static struct jv strip_chars(struct jv s, struct jv chars, bool left, bool right) {
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    bool ws = chars.k != V_STR;
#define STRIPPABLE(c)                                                                              \
    (ws ? is_space_char((unsigned char)(c)) : memchr(chars.u.s.p, (c), chars.u.s.n) != NULL)
    while (left && a < b && STRIPPABLE(p[a]))
        a++;
    while (right && b > a && STRIPPABLE(p[b - 1]))
        b--;
#undef STRIPPABLE
    return v_str(p + a, b - a);
}

static struct jv list_of(struct rt *r, struct jv v, int line) {
    struct env *e = r->e;
    if (v.k == V_LIST)
        return v;
    struct jv l = v_list(e);
    if (v.k == V_DICT || v.k == V_NS) {
        for (size_t i = 0; i < v.u.d->n; i++)
            list_push(e, l.u.l, v.u.d->k[i]);
        return l;
    }
    if (v.k == V_STR) {
        for (size_t i = 0; i < v.u.s.n;) {
            size_t j = i + 1;
            while (j < v.u.s.n && ((unsigned char)v.u.s.p[j] & 0xC0) == 0x80)
                j++;
            list_push(e, l.u.l, v_str(v.u.s.p + i, j - i));
            i = j;
        }
        return l;
    }
    if (v.k == V_UNDEF)
        return l; /* iterating undefined yields nothing, as Jinja's Undefined */
    fail(e, PD_EINVAL, "line %d: '%s' object is not iterable", line, type_name(v));
}

static struct jv call_method(struct rt *r, struct jv self, const char *m, const struct args *a,
                             int line) {
    struct env *e = r->e;
    struct jv none = v_undef();
    if (self.k == V_DICT) {
        if (!strcmp(m, "items")) {
            struct jv l = v_list(e);
            for (size_t i = 0; i < self.u.d->n; i++) {
                struct jv pair = v_list(e);
                list_push(e, pair.u.l, self.u.d->k[i]);
                list_push(e, pair.u.l, self.u.d->v[i]);
                list_push(e, l.u.l, pair);
            }
            return l;
        }
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            struct jv l = v_list(e);
            for (size_t i = 0; i < self.u.d->n; i++)
                list_push(e, l.u.l, m[0] == 'k' ? self.u.d->k[i] : self.u.d->v[i]);
            return l;
        }
        if (!strcmp(m, "get")) {
            struct jv k = arg(a, 0, "key", none);
            struct jv *v = k.k == V_STR ? dict_find(self.u.d, k.u.s.p, k.u.s.n) : NULL;
            return v ? *v : arg(a, 1, "default", v_none());
        }
    }
    if (self.k != V_STR)
        fail(e, PD_EUNSUPPORTED, "line %d: unsupported method '%s' on %s", line, m,
             type_name(self));
    const char *p = self.u.s.p;
    size_t n = self.u.s.n;
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        struct jv x = arg(a, 0, "prefix", none);
        struct jv cands = x.k == V_LIST ? x : v_undef();
        size_t nc = x.k == V_LIST ? x.u.l->n : 1;
        for (size_t i = 0; i < nc; i++) {
            struct jv c = x.k == V_LIST ? cands.u.l->v[i] : x;
            if (c.k != V_STR)
                fail(e, PD_EINVAL, "line %d: %s() needs a string", line, m);
            if (c.u.s.n <= n && memcmp(m[0] == 's' ? p : p + n - c.u.s.n, c.u.s.p, c.u.s.n) == 0)
                return v_bool(true);
        }
        return v_bool(false);
    }
    if (!strcmp(m, "strip"))
        return strip_chars(self, arg(a, 0, "chars", none), true, true);
    if (!strcmp(m, "lstrip"))
        return strip_chars(self, arg(a, 0, "chars", none), true, false);
    if (!strcmp(m, "rstrip"))
        return strip_chars(self, arg(a, 0, "chars", none), false, true);
    if (!strcmp(m, "upper") || !strcmp(m, "lower")) {
        char *o = astrndup(e, p, n);
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)o[i] < 0x80)
                o[i] = (char)(m[0] == 'u' ? (o[i] >= 'a' && o[i] <= 'z' ? o[i] - 32 : o[i])
                                          : (o[i] >= 'A' && o[i] <= 'Z' ? o[i] + 32 : o[i]));
        return v_str(o, n);
    }
    if (!strcmp(m, "title") || !strcmp(m, "capitalize")) {
        char *o = astrndup(e, p, n);
        bool start = true;
        for (size_t i = 0; i < n; i++) {
            char c = o[i];
            bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
            if (alpha) {
                if (start)
                    o[i] = (char)(c >= 'a' && c <= 'z' ? c - 32 : c);
                else
                    o[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            }
            if (m[0] == 't')
                start = !alpha;
            else
                start = false;
        }
        return v_str(o, n);
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        struct jv sep = arg(a, 0, "sep", none);
        struct jv maxv = arg(a, 1, "maxsplit", v_int(-1));
        int64_t maxsplit = maxv.k == V_INT ? maxv.u.i : -1;
        struct jv l = v_list(e);
        if (sep.k != V_STR) { /* whitespace split */
            if (m[0] == 'r' && maxsplit >= 0)
                fail(e, PD_EUNSUPPORTED, "line %d: rsplit() with maxsplit and no separator", line);
            size_t i = 0;
            int64_t splits = 0;
            while (i < n) {
                while (i < n && is_space_char((unsigned char)p[i]))
                    i++;
                if (i >= n)
                    break;
                size_t j = i;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    size_t end = n;
                    while (end > i && is_space_char((unsigned char)p[end - 1]))
                        end--;
                    list_push(e, l.u.l, v_str(p + i, end - i));
                    break;
                }
                while (j < n && !is_space_char((unsigned char)p[j]))
                    j++;
                list_push(e, l.u.l, v_str(p + i, j - i));
                splits++;
                i = j;
            }
            return l;
        }
        if (sep.u.s.n == 0)
            fail(e, PD_EINVAL, "line %d: empty separator", line);
        if (m[0] == 'r' && maxsplit >= 0) {
            /* from the right, then reverse */
            struct jv rev = v_list(e);
            size_t end = n;
            int64_t splits = 0;
            size_t i = n;
            while (i >= sep.u.s.n && splits < maxsplit) {
                if (memcmp(p + i - sep.u.s.n, sep.u.s.p, sep.u.s.n) == 0) {
                    list_push(e, rev.u.l, v_str(p + i, end - i));
                    i -= sep.u.s.n;
                    end = i;
                    splits++;
                } else {
                    i--;
                }
            }
            list_push(e, rev.u.l, v_str(p, end));
            for (size_t k = rev.u.l->n; k-- > 0;)
                list_push(e, l.u.l, rev.u.l->v[k]);
            return l;
        }
        size_t start = 0;
        int64_t splits = 0;
        for (size_t i = 0; i + sep.u.s.n <= n;) {
            if ((maxsplit < 0 || splits < maxsplit) && memcmp(p + i, sep.u.s.p, sep.u.s.n) == 0) {
                list_push(e, l.u.l, v_str(p + start, i - start));
                i += sep.u.s.n;
                start = i;
                splits++;
            } else {
                i++;
            }
        }
        list_push(e, l.u.l, v_str(p + start, n - start));
        return l;
    }
    if (!strcmp(m, "splitlines")) {
        struct jv l = v_list(e);
        size_t start = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] == '\n' || p[i] == '\r') {
                list_push(e, l.u.l, v_str(p + start, i - start));
                if (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n')
                    i++;
                start = i + 1;
            }
        }
        if (start < n)
            list_push(e, l.u.l, v_str(p + start, n - start));
        return l;
    }
    if (!strcmp(m, "replace")) {
        struct jv old = arg(a, 0, "old", none), new = arg(a, 1, "new", none);
        struct jv cnt = arg(a, 2, "count", v_int(-1));
        if (old.k != V_STR || new.k != V_STR)
            fail(e, PD_EINVAL, "line %d: replace() needs two strings", line);
        if (old.u.s.n == 0)
            fail(e, PD_EUNSUPPORTED, "line %d: replace() of an empty string", line);
        struct sb o = {.e = e};
        int64_t done = 0, max = cnt.k == V_INT ? cnt.u.i : -1;
        for (size_t i = 0; i < n;) {
            if ((max < 0 || done < max) && i + old.u.s.n <= n &&
                memcmp(p + i, old.u.s.p, old.u.s.n) == 0) {
                sb_put(&o, new.u.s.p, new.u.s.n);
                i += old.u.s.n;
                done++;
            } else {
                sb_put(&o, p + i, 1);
                i++;
            }
        }
        return sb_val(&o);
    }
    if (!strcmp(m, "find") || !strcmp(m, "index") || !strcmp(m, "count")) {
        struct jv x = arg(a, 0, "sub", none);
        if (x.k != V_STR)
            fail(e, PD_EINVAL, "line %d: %s() needs a string", line, m);
        int64_t count = 0;
        for (size_t i = 0; i + x.u.s.n <= n; i++) {
            if (memcmp(p + i, x.u.s.p, x.u.s.n) == 0) {
                if (m[0] != 'c') {
                    int64_t ci = 0; /* character index */
                    for (size_t k = 0; k < i; k++)
                        ci += ((unsigned char)p[k] & 0xC0) != 0x80;
                    return v_int(ci);
                }
                count++;
                i += x.u.s.n ? x.u.s.n - 1 : 0;
            }
        }
        if (m[0] == 'i')
            fail(e, PD_EINVAL, "line %d: substring not found", line);
        return v_int(m[0] == 'c' ? count : -1);
    }
    if (!strcmp(m, "join")) {
        struct jv l = list_of(r, arg(a, 0, "iterable", none), line);
        struct sb o = {.e = e};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i)
                sb_put(&o, p, n);
            put_str(&o, l.u.l->v[i]);
        }
        return sb_val(&o);
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isspace")) {
        if (n == 0)
            return v_bool(false);
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)p[i];
            bool ok = m[2] == 'd'   ? (c >= '0' && c <= '9')
                      : m[2] == 'a' ? ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                                    : is_space_char(c);
            if (!ok)
                return v_bool(false);
        }
        return v_bool(true);
    }
    fail(e, PD_EUNSUPPORTED, "line %d: unsupported string method '%s'", line, m);
}

static struct jv call_macro(struct rt *r, const struct node *macro, const struct args *a,
                            int line) {
    struct env *e = r->e;
    struct scope sc = {.up = NULL};
    /* macros see the globals (the outermost scope) and their parameters */
    struct scope *g = r->sc;
    while (g->up)
        g = g->up;
    sc.up = g;
    if (++r->macro_depth > MACRO_DEPTH_MAX)
        fail(e, PD_EINVAL, "line %d: macro '%.*s' nested deeper than %d calls", line,
             (int)macro->name_n, macro->name, MACRO_DEPTH_MAX);
    struct scope *saved = r->sc;
    struct sb *saved_out = r->out;
    struct sb body = {.e = e};
    r->sc = &sc;
    r->out = &body;
    const struct node *params = macro->a;
    if (a->npos > params->n)
        fail(e, PD_EINVAL, "line %d: macro '%.*s' takes %zu arguments", line, (int)macro->name_n,
             macro->name, params->n);
    for (size_t i = 0; i < params->n; i++) {
        const struct node *p = params->list[i];
        struct jv v = i < a->npos ? a->pos[i] : v_undef();
        for (size_t k = 0; k < a->nkw; k++)
            if (a->kw_n[k] == p->name_n && !memcmp(a->kw[k], p->name, p->name_n))
                v = a->kwv[k];
        if (v.k == V_UNDEF && p->a)
            v = eval(r, p->a);
        set_var(r, p->name, p->name_n, v);
    }
    exec(r, macro->b);
    r->sc = saved;
    r->out = saved_out;
    r->macro_depth--;
    return sb_val(&body);
}

/* An int argument as is, a float (or bool) converted (to_int) */
static int64_t int_arg(struct rt *r, struct jv v, int line) {
    return v.k == V_INT ? v.u.i : to_int(r->e, num(r, v, line), line);
}

static struct jv call(struct rt *r, const struct node *n) {
    struct env *e = r->e;
    struct jv f = eval(r, n->a);
    struct args a;
    eval_args(r, n, 0, &a);
    if (f.k != V_FUNC) {
        if (n->a->k == E_NAME)
            fail(e, f.k == V_UNDEF ? PD_EUNSUPPORTED : PD_EINVAL,
                 "line %d: unsupported construct: '%.*s' is not a known function", n->line,
                 (int)n->a->name_n, n->a->name);
        if (n->a->k == E_ATTR)
            fail(e, PD_EUNSUPPORTED, "line %d: unsupported method '%.*s'", n->line,
                 (int)n->a->name_n, n->a->name);
        fail(e, PD_EINVAL, "line %d: '%s' object is not callable", n->line, type_name(f));
    }
    if (f.u.fn->macro)
        return call_macro(r, f.u.fn->macro, &a, n->line);
    if (f.u.fn->self)
        return call_method(r, *f.u.fn->self, f.u.fn->name, &a, n->line);
    const char *name = f.u.fn->name;
    if (!strcmp(name, "raise_exception")) {
        struct jv msg = to_str(r, arg(&a, 0, "message", v_cstr("")));
        fail(e, PD_EINVAL, "%.*s", (int)msg.u.s.n, msg.u.s.p);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        struct jv ns = v_dict(e, name[0] == 'n' ? V_NS : V_DICT);
        if (a.npos == 1 && (a.pos[0].k == V_DICT || a.pos[0].k == V_NS))
            for (size_t i = 0; i < a.pos[0].u.d->n; i++)
                dict_set(e, ns.u.d, a.pos[0].u.d->k[i], a.pos[0].u.d->v[i]);
        for (size_t i = 0; i < a.nkw; i++)
            dict_set(e, ns.u.d, v_str(a.kw[i], a.kw_n[i]), a.kwv[i]);
        return ns;
    }
    if (!strcmp(name, "range")) {
        int64_t lo = 0, hi, step = 1;
        if (a.npos == 1) {
            hi = int_arg(r, a.pos[0], n->line);
        } else if (a.npos >= 2) {
            lo = int_arg(r, a.pos[0], n->line);
            hi = int_arg(r, a.pos[1], n->line);
            if (a.npos == 3)
                step = int_arg(r, a.pos[2], n->line);
        } else {
            fail(e, PD_EINVAL, "line %d: range() needs arguments", n->line);
        }
        if (step == 0)
            fail(e, PD_EINVAL, "line %d: range() step is zero", n->line);
        struct jv l = v_list(e);
        for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
            if (l.u.l->n > 1000000)
                fail(e, PD_ERANGE, "line %d: range() too long", n->line);
            list_push(e, l.u.l, v_int(i));
            if (__builtin_add_overflow(i, step, &i))
                break; /* past int64: past hi too */
        }
        return l;
    }
    if (!strcmp(name, "strftime_now")) {
        struct jv fmt = arg(&a, 0, "format", v_cstr(""));
        if (fmt.k != V_STR)
            fail(e, PD_EINVAL, "line %d: strftime_now() needs a format string", n->line);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        char *f2 = astrndup(e, fmt.u.s.p, fmt.u.s.n);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral" /* the template chooses the format */
        size_t len = strftime(buf, sizeof(buf), f2, &tm);
#pragma GCC diagnostic pop
        return v_str(astrndup(e, buf, len), len);
    }
    fail(e, PD_EUNSUPPORTED, "line %d: unsupported function '%s'", n->line, name);
}

static struct jv apply_filter(struct rt *r, const struct node *n, struct jv v) {
    struct env *e = r->e;
    struct args a;
    eval_args(r, n, 0, &a);
    char name[32];
    snprintf(name, sizeof(name), "%.*s", (int)n->name_n, n->name);
    int line = n->line;
    struct jv none = v_undef();
    if (!strcmp(name, "trim")) {
        struct jv s = to_str(r, v);
        return strip_chars(s, arg(&a, 0, "chars", none), true, true);
    }
    if (!strcmp(name, "tojson")) {
        struct jv ind = arg(&a, 0, "indent", v_none());
        int indent = ind.k == V_INT ? (int)ind.u.i : -1;
        struct jv seps = arg(&a, 1, "separators", v_none());
        const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
        if (seps.k == V_LIST && seps.u.l->n == 2 && seps.u.l->v[0].k == V_STR &&
            seps.u.l->v[1].k == V_STR) {
            item_sep = astrndup(e, seps.u.l->v[0].u.s.p, seps.u.l->v[0].u.s.n);
            key_sep = astrndup(e, seps.u.l->v[1].u.s.p, seps.u.l->v[1].u.s.n);
        }
        bool sort = truthy(arg(&a, 2, "sort_keys", v_bool(false)));
        struct sb b = {.e = e};
        put_json(e, &b, v, indent, 0, item_sep, key_sep, sort);
        return sb_val(&b);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v.k == V_STR) {
            int64_t c = 0;
            for (size_t i = 0; i < v.u.s.n; i++)
                c += ((unsigned char)v.u.s.p[i] & 0xC0) != 0x80;
            return v_int(c);
        }
        if (v.k == V_LIST)
            return v_int((int64_t)v.u.l->n);
        if (v.k == V_DICT || v.k == V_NS)
            return v_int((int64_t)v.u.d->n);
        if (v.k == V_UNDEF)
            return v_int(0);
        fail(e, PD_EINVAL, "line %d: object of type '%s' has no len()", line, type_name(v));
    }
    if (!strcmp(name, "string"))
        return to_str(r, v);
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize")) {
        struct args none_args = {0};
        struct jv s = to_str(r, v);
        if (!strcmp(name, "capitalize")) { /* first upper, rest lower */
            struct jv low = call_method(r, s, "lower", &none_args, line);
            char *o = astrndup(e, low.u.s.p, low.u.s.n);
            if (low.u.s.n && o[0] >= 'a' && o[0] <= 'z')
                o[0] = (char)(o[0] - 32);
            return v_str(o, low.u.s.n);
        }
        return call_method(r, s, name, &none_args, line);
    }
    if (!strcmp(name, "replace")) {
        struct jv s = to_str(r, v);
        return call_method(r, s, "replace", &a, line);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        bool boolean = truthy(arg(&a, 1, "boolean", v_bool(false)));
        if (v.k == V_UNDEF || (boolean && !truthy(v)))
            return arg(&a, 0, "default_value", v_cstr(""));
        return v;
    }
    if (!strcmp(name, "join")) {
        struct jv l = list_of(r, v, line);
        struct jv sep = arg(&a, 0, "d", v_cstr(""));
        struct jv attr = arg(&a, 1, "attribute", v_undef());
        struct sb b = {.e = e};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i)
                put_str(&b, sep);
            struct jv x = l.u.l->v[i];
            if (attr.k == V_STR)
                x = get_item(r, x, attr, line);
            put_str(&b, x);
        }
        return sb_val(&b);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        struct jv l = list_of(r, v, line);
        if (!l.u.l->n)
            return v_undef();
        return l.u.l->v[name[0] == 'f' ? 0 : l.u.l->n - 1];
    }
    if (!strcmp(name, "list"))
        return list_of(r, v, line);
    if (!strcmp(name, "reverse")) {
        if (v.k == V_STR) {
            struct jv l = list_of(r, v, line);
            struct sb b = {.e = e};
            for (size_t i = l.u.l->n; i-- > 0;)
                put_str(&b, l.u.l->v[i]);
            return sb_val(&b);
        }
        struct jv l = list_of(r, v, line), out = v_list(e);
        for (size_t i = l.u.l->n; i-- > 0;)
            list_push(e, out.u.l, l.u.l->v[i]);
        return out;
    }
    if (!strcmp(name, "items")) {
        if (v.k != V_DICT)
            fail(e, PD_EINVAL, "line %d: items needs a mapping", line);
        struct args none_args = {0};
        return call_method(r, v, "items", &none_args, line);
    }
    if (!strcmp(name, "int")) {
        if (v.k == V_INT)
            return v;
        if (v.k == V_FLOAT)
            return v_int(to_int(e, v.u.f, n->line));
        if (v.k == V_BOOL)
            return v_int(v.u.b);
        if (v.k == V_STR) {
            char *s = astrndup(e, v.u.s.p, v.u.s.n), *end;
            long long x = strtoll(s, &end, 10);
            if (end != s && *end == '\0')
                return v_int(x);
            double d = strtod(s, &end);
            if (end != s && *end == '\0')
                return v_int(to_int(e, d, n->line));
        }
        return arg(&a, 0, "default", v_int(0));
    }
    if (!strcmp(name, "float")) {
        if (v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL)
            return v_float(num(r, v, line));
        if (v.k == V_STR) {
            char *s = astrndup(e, v.u.s.p, v.u.s.n), *end;
            double d = strtod(s, &end);
            if (end != s && *end == '\0')
                return v_float(d);
        }
        return arg(&a, 0, "default", v_float(0.0));
    }
    if (!strcmp(name, "abs")) {
        if (v.k == V_INT)
            return v_int(v.u.i < 0 ? -v.u.i : v.u.i);
        return v_float(fabs(num(r, v, line)));
    }
    if (!strcmp(name, "safe") || !strcmp(name, "e") || !strcmp(name, "escape")) {
        if (name[0] == 's')
            return v;
        struct jv s = to_str(r, v);
        struct sb b = {.e = e};
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            const char *rep = c == '&'    ? "&amp;"
                              : c == '<'  ? "&lt;"
                              : c == '>'  ? "&gt;"
                              : c == '"'  ? "&#34;"
                              : c == '\'' ? "&#39;"
                                          : NULL;
            if (rep)
                sb_puts(&b, rep);
            else
                sb_put(&b, &c, 1);
        }
        return sb_val(&b);
    }
    if (!strcmp(name, "indent")) {
        struct jv s = to_str(r, v);
        struct jv w = arg(&a, 0, "width", v_int(4));
        bool first = truthy(arg(&a, 1, "first", v_bool(false)));
        bool blank = truthy(arg(&a, 2, "blank", v_bool(false)));
        struct sb pad = {.e = e};
        if (w.k == V_STR)
            sb_put(&pad, w.u.s.p, w.u.s.n);
        else
            for (int64_t i = 0, width = to_int(e, num(r, w, line), line); i < width; i++)
                if (i >= 4096)
                    fail(e, PD_ERANGE, "line %d: indent of %" PRId64 " spaces", line, width);
                else
                    sb_puts(&pad, " ");
        struct sb b = {.e = e};
        size_t start = 0;
        bool first_line = true;
        for (size_t i = 0; i <= s.u.s.n; i++) {
            if (i == s.u.s.n || s.u.s.p[i] == '\n') {
                size_t len = i - start;
                bool do_pad = first_line ? first : (blank || len > 0);
                if (do_pad && pad.n)
                    sb_put(&b, pad.p, pad.n);
                sb_put(&b, s.u.s.p + start, len);
                if (i < s.u.s.n)
                    sb_puts(&b, "\n");
                start = i + 1;
                first_line = false;
            }
        }
        return sb_val(&b);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "map") ||
        !strcmp(name, "select") || !strcmp(name, "reject") || !strcmp(name, "unique") ||
        !strcmp(name, "sort") || !strcmp(name, "sum") || !strcmp(name, "min") ||
        !strcmp(name, "max")) {
        struct jv l = list_of(r, v, line), out = v_list(e);
        bool is_map = !strcmp(name, "map");
        if (is_map) {
            struct jv attr = arg(&a, 99, "attribute", v_undef());
            if (attr.k != V_STR) {
                /* map('filter_name') */
                if (a.npos < 1 || a.pos[0].k != V_STR)
                    fail(e, PD_EUNSUPPORTED, "line %d: map() without attribute=", line);
                struct node fake = *n;
                fake.name = a.pos[0].u.s.p;
                fake.name_n = a.pos[0].u.s.n;
                fake.n = 0; /* extra filter arguments are not supported */
                if (a.npos > 1)
                    fail(e, PD_EUNSUPPORTED, "line %d: map() with filter arguments", line);
                for (size_t i = 0; i < l.u.l->n; i++)
                    list_push(e, out.u.l, apply_filter(r, &fake, l.u.l->v[i]));
                return out;
            }
            struct jv dflt = arg(&a, 99, "default", v_undef());
            for (size_t i = 0; i < l.u.l->n; i++) {
                struct jv x = get_item(r, l.u.l->v[i], attr, line);
                list_push(e, out.u.l, x.k == V_UNDEF ? dflt : x);
            }
            return out;
        }
        if (!strcmp(name, "unique") || !strcmp(name, "sort") || !strcmp(name, "sum") ||
            !strcmp(name, "min") || !strcmp(name, "max")) {
            struct jv attr = arg(&a, 99, "attribute", v_undef());
            if (!strcmp(name, "unique")) {
                for (size_t i = 0; i < l.u.l->n; i++) {
                    if (!contains(r, out, l.u.l->v[i], line))
                        list_push(e, out.u.l, l.u.l->v[i]);
                }
                return out;
            }
            if (!strcmp(name, "sum")) {
                struct jv acc = arg(&a, 99, "start", v_int(0));
                for (size_t i = 0; i < l.u.l->n; i++) {
                    struct jv x =
                        attr.k == V_STR ? get_item(r, l.u.l->v[i], attr, line) : l.u.l->v[i];
                    struct node plus = {.k = E_BIN, .name = "+", .line = line};
                    acc = binop(r, &plus, acc, x);
                }
                return acc;
            }
            bool rev = truthy(arg(&a, 0, "reverse", v_bool(false)));
            for (size_t i = 0; i < l.u.l->n; i++)
                list_push(e, out.u.l, l.u.l->v[i]);
            for (size_t i = 1; i < out.u.l->n; i++) { /* stable insertion sort */
                struct jv x = out.u.l->v[i];
                size_t j = i;
                while (j > 0) {
                    struct jv pa = out.u.l->v[j - 1], pb = x;
                    if (attr.k == V_STR) {
                        pa = get_item(r, pa, attr, line);
                        pb = get_item(r, pb, attr, line);
                    }
                    int c = cmp_values(r, pa, pb, line);
                    if (rev ? c >= 0 : c <= 0)
                        break;
                    out.u.l->v[j] = out.u.l->v[j - 1];
                    j--;
                }
                out.u.l->v[j] = x;
            }
            if (!strcmp(name, "min") || !strcmp(name, "max")) {
                if (!out.u.l->n)
                    return v_undef();
                return out.u.l->v[name[1] == 'i' ? 0 : out.u.l->n - 1];
            }
            return out;
        }
        bool reject = name[0] == 'r';
        bool by_attr = strstr(name, "attr") != NULL;
        size_t test_arg = by_attr ? 1 : 0;
        for (size_t i = 0; i < l.u.l->n; i++) {
            struct jv x = l.u.l->v[i];
            struct jv subject = x;
            if (by_attr) {
                if (a.npos < 1 || a.pos[0].k != V_STR)
                    fail(e, PD_EINVAL, "line %d: %s needs an attribute name", line, name);
                subject = get_item(r, x, a.pos[0], line);
            }
            bool ok;
            if (a.npos <= test_arg) {
                ok = truthy(subject);
            } else {
                if (a.pos[test_arg].k != V_STR)
                    fail(e, PD_EINVAL, "line %d: %s needs a test name", line, name);
                struct node t = {.k = E_TEST, .line = line};
                t.name = a.pos[test_arg].u.s.p;
                t.name_n = a.pos[test_arg].u.s.n;
                /* remaining positional arguments go to the test */
                struct node lit_nodes[4];
                struct node *lits[4];
                size_t nl = 0;
                for (size_t k = test_arg + 1; k < a.npos && nl < 4; k++, nl++) {
                    memset(&lit_nodes[nl], 0, sizeof(lit_nodes[nl]));
                    lit_nodes[nl].k = E_LIT;
                    lit_nodes[nl].lit = a.pos[k];
                    lits[nl] = &lit_nodes[nl];
                }
                t.list = lits;
                t.n = nl;
                struct node subj = {.k = E_LIT, .lit = subject};
                t.a = &subj;
                ok = truthy(eval(r, &t));
            }
            if (ok != reject)
                list_push(e, out.u.l, x);
        }
        return out;
    }
    fail(e, PD_EUNSUPPORTED, "line %d: unsupported filter '%s'", line, name);
}

static bool run_test(struct rt *r, const struct node *n, struct jv v) {
    struct env *e = r->e;
    char name[32];
    snprintf(name, sizeof(name), "%.*s", (int)n->name_n, n->name);
    struct args a;
    eval_args(r, n, 0, &a);
    if (!strcmp(name, "defined"))
        return v.k != V_UNDEF;
    if (!strcmp(name, "undefined"))
        return v.k == V_UNDEF;
    if (!strcmp(name, "none"))
        return v.k == V_NONE;
    if (!strcmp(name, "string"))
        return v.k == V_STR;
    if (!strcmp(name, "number"))
        return v.k == V_INT || v.k == V_FLOAT;
    if (!strcmp(name, "integer"))
        return v.k == V_INT;
    if (!strcmp(name, "float"))
        return v.k == V_FLOAT;
    if (!strcmp(name, "boolean"))
        return v.k == V_BOOL;
    if (!strcmp(name, "true"))
        return v.k == V_BOOL && v.u.b;
    if (!strcmp(name, "false"))
        return v.k == V_BOOL && !v.u.b;
    if (!strcmp(name, "mapping"))
        return v.k == V_DICT || v.k == V_NS;
    if (!strcmp(name, "sequence") || !strcmp(name, "iterable"))
        return v.k == V_LIST || v.k == V_STR || v.k == V_DICT;
    if (!strcmp(name, "callable"))
        return v.k == V_FUNC;
    if (!strcmp(name, "even") || !strcmp(name, "odd")) {
        int64_t x = to_int(r->e, num(r, v, n->line), n->line);
        return (x % 2 == 0) == (name[0] == 'e');
    }
    if (!strcmp(name, "divisibleby")) {
        int64_t x = to_int(r->e, num(r, v, n->line), n->line),
                d = to_int(r->e, num(r, arg(&a, 0, "num", v_int(1)), n->line), n->line);
        return d != 0 && (d == -1 || x % d == 0); /* INT64_MIN % -1 overflows in C */
    }
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==") ||
        !strcmp(name, "sameas"))
        return values_equal(v, arg(&a, 0, "other", v_undef()));
    if (!strcmp(name, "ne") || !strcmp(name, "!="))
        return !values_equal(v, arg(&a, 0, "other", v_undef()));
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan"))
        return cmp_values(r, v, arg(&a, 0, "other", v_undef()), n->line) < 0;
    if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan"))
        return cmp_values(r, v, arg(&a, 0, "other", v_undef()), n->line) > 0;
    if (!strcmp(name, "le") || !strcmp(name, "<="))
        return cmp_values(r, v, arg(&a, 0, "other", v_undef()), n->line) <= 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">="))
        return cmp_values(r, v, arg(&a, 0, "other", v_undef()), n->line) >= 0;
    if (!strcmp(name, "in"))
        return contains(r, arg(&a, 0, "seq", v_undef()), v, n->line);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v.k != V_STR)
            return false;
        for (size_t i = 0; i < v.u.s.n; i++) {
            char c = v.u.s.p[i];
            if (name[0] == 'l' ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z'))
                return false;
        }
        return true;
    }
    fail(e, PD_EUNSUPPORTED, "line %d: unsupported test '%s'", n->line, name);
}

static struct jv eval(struct rt *r, const struct node *n) {
    struct env *e = r->e;
    switch (n->k) {
    case E_LIT: return n->lit;
    case E_NAME: {
        struct jv *v = lookup(r, n->name, n->name_n);
        if (v)
            return *v;
        static const char *const builtins[] = {"raise_exception", "namespace", "range",
                                               "strftime_now",    "dict",      NULL};
        for (size_t i = 0; builtins[i]; i++)
            if (strlen(builtins[i]) == n->name_n && !memcmp(builtins[i], n->name, n->name_n))
                return make_func(r, builtins[i], NULL);
        return v_undef();
    }
    case E_ATTR: return get_attr(r, eval(r, n->a), n->name, n->name_n, n->line);
    case E_ITEM: return get_item(r, eval(r, n->a), eval(r, n->b), n->line);
    case E_SLICE:
        return slice(r, eval(r, n->a), n->b ? eval(r, n->b) : v_undef(),
                     n->c ? eval(r, n->c) : v_undef(), n->d ? eval(r, n->d) : v_undef(), n->line);
    case E_CALL: return call(r, n);
    case E_FILTER: return apply_filter(r, n, eval(r, n->a));
    case E_TEST: return v_bool(run_test(r, n, eval(r, n->a)) != n->negate);
    case E_BIN: {
        struct jv a = eval(r, n->a), b = eval(r, n->b);
        return binop(r, n, a, b);
    }
    case E_NEG: {
        struct jv v = eval(r, n->a);
        if (v.k == V_INT && v.u.i == INT64_MIN)
            fail(r->e, PD_ERANGE, "line %d: integer overflow in -", n->line);
        return v.k == V_INT ? v_int(-v.u.i) : v_float(-num(r, v, n->line));
    }
    case E_POS: return eval(r, n->a);
    case E_NOT: return v_bool(!truthy(eval(r, n->a)));
    case E_AND: {
        struct jv a = eval(r, n->a);
        return truthy(a) ? eval(r, n->b) : a;
    }
    case E_OR: {
        struct jv a = eval(r, n->a);
        return truthy(a) ? a : eval(r, n->b);
    }
    case E_COND:
        if (truthy(eval(r, n->b)))
            return eval(r, n->a);
        return n->c ? eval(r, n->c) : v_undef();
    case E_LIST: {
        struct jv l = v_list(e);
        for (size_t i = 0; i < n->n; i++)
            list_push(e, l.u.l, eval(r, n->list[i]));
        return l;
    }
    case E_DICT: {
        struct jv d = v_dict(e, V_DICT);
        for (size_t i = 0; i + 1 < n->n; i += 2)
            dict_set(e, d.u.d, eval(r, n->list[i]), eval(r, n->list[i + 1]));
        return d;
    }
    default: fail(e, PD_EINTERNAL, "line %d: node %d is not an expression", n->line, (int)n->k);
    }
}

static enum flow exec_for(struct rt *r, const struct node *n) {
    struct env *e = r->e;
    struct jv it = eval(r, n->a);
    struct jv items = it.k == V_DICT ? list_of(r, it, n->line) : list_of(r, it, n->line);
    /* `for x in y if cond`: filter first, so loop.* counts only the kept items */
    struct scope sc = {.up = r->sc};
    r->sc = &sc;
    struct jv kept = items;
    if (n->d) {
        kept = v_list(e);
        for (size_t i = 0; i < items.u.l->n; i++) {
            struct jv x = items.u.l->v[i];
            if (n->name2) {
                if (x.k != V_LIST || x.u.l->n != 2)
                    fail(e, PD_EINVAL, "line %d: cannot unpack into two names", n->line);
                set_var(r, n->name, n->name_n, x.u.l->v[0]);
                set_var(r, n->name2, strlen(n->name2), x.u.l->v[1]);
            } else {
                set_var(r, n->name, n->name_n, x);
            }
            if (truthy(eval(r, n->d)))
                list_push(e, kept.u.l, x);
        }
    }
    size_t len = kept.u.l->n;
    for (size_t i = 0; i < len; i++) {
        struct jv x = kept.u.l->v[i];
        if (n->name2) {
            if (x.k != V_LIST || x.u.l->n != 2)
                fail(e, PD_EINVAL, "line %d: cannot unpack into two names", n->line);
            set_var(r, n->name, n->name_n, x.u.l->v[0]);
            set_var(r, n->name2, strlen(n->name2), x.u.l->v[1]);
        } else {
            set_var(r, n->name, n->name_n, x);
        }
        struct jv loop = v_dict(e, V_DICT);
        struct jdict *d = loop.u.d;
        dict_set(e, d, v_cstr("index"), v_int((int64_t)i + 1));
        dict_set(e, d, v_cstr("index0"), v_int((int64_t)i));
        dict_set(e, d, v_cstr("revindex"), v_int((int64_t)(len - i)));
        dict_set(e, d, v_cstr("revindex0"), v_int((int64_t)(len - i - 1)));
        dict_set(e, d, v_cstr("first"), v_bool(i == 0));
        dict_set(e, d, v_cstr("last"), v_bool(i + 1 == len));
        dict_set(e, d, v_cstr("length"), v_int((int64_t)len));
        dict_set(e, d, v_cstr("previtem"), i > 0 ? kept.u.l->v[i - 1] : v_undef());
        dict_set(e, d, v_cstr("nextitem"), i + 1 < len ? kept.u.l->v[i + 1] : v_undef());
        set_var(r, "loop", 4, loop);
        enum flow f = exec(r, n->b);
        if (f == FLOW_BREAK)
            break;
    }
    if (len == 0 && n->c)
        exec(r, n->c);
    r->sc = sc.up;
    return FLOW_NORMAL;
}

static enum flow exec(struct rt *r, const struct node *n) {
    struct env *e = r->e;
    switch (n->k) {
    case N_BLOCK:
        for (size_t i = 0; i < n->n; i++) {
            enum flow f = exec(r, n->list[i]);
            if (f != FLOW_NORMAL)
                return f;
        }
        return FLOW_NORMAL;
    case N_TEXT: sb_put(r->out, n->name, n->name_n); return FLOW_NORMAL;
    case N_OUT: put_str(r->out, eval(r, n->a)); return FLOW_NORMAL;
    case N_IF:
        if (truthy(eval(r, n->a)))
            return exec(r, n->b);
        return n->c ? exec(r, n->c) : FLOW_NORMAL;
    case N_FOR: return exec_for(r, n);
    case N_SET:
    case N_SETBLOCK: {
        struct jv v;
        if (n->k == N_SET) {
            v = eval(r, n->b);
        } else {
            struct sb *saved = r->out;
            struct sb body = {.e = e};
            r->out = &body;
            exec(r, n->b);
            r->out = saved;
            v = sb_val(&body);
        }
        if (n->a->k == E_NAME) {
            set_var(r, n->a->name, n->a->name_n, v);
        } else {
            struct jv ns = eval(r, n->a->a);
            if (ns.k != V_NS)
                fail(e, PD_EINVAL,
                     "line %d: cannot assign an attribute of a %s (only of a "
                     "namespace)",
                     n->line, type_name(ns));
            dict_set(e, ns.u.d, v_str(n->a->name, n->a->name_n), v);
        }
        return FLOW_NORMAL;
    }
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    case N_MACRO: {
        struct jv f = make_func(r, "macro", NULL);
        f.u.fn->macro = n;
        set_var(r, n->name, n->name_n, f);
        return FLOW_NORMAL;
    }
    default: fail(e, PD_EINTERNAL, "line %d: node %d is not a statement", n->line, (int)n->k);
    }
}

int pd_chat_template_render(const struct pd_chat_template *t, const struct pd_chat_args *args,
                            char **out, size_t *out_len) {
    *out = NULL;
    struct arena arena = {0};
    struct env e = {.arena = &arena};
    if (setjmp(e.jb)) {
        arena_free(&arena);
        return e.code;
    }
    struct scope globals = {0};
    struct sb text = {.e = &e};
    struct rt r = {.e = &e, .sc = &globals, .out = &text};
    if (!cJSON_IsArray(args->messages))
        fail(&e, PD_EINVAL, "messages must be an array");
    set_var(&r, "messages", 8, from_json(&e, args->messages));
    set_var(&r, "tools", 5, args->tools ? from_json(&e, args->tools) : v_none());
    set_var(&r, "add_generation_prompt", 21, v_bool(args->add_generation_prompt));
    if (args->bos_token)
        set_var(&r, "bos_token", 9, v_cstr(args->bos_token));
    if (args->eos_token)
        set_var(&r, "eos_token", 9, v_cstr(args->eos_token));
    if (cJSON_IsObject(args->extra)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, args->extra) {
            set_var(&r, astrndup(&e, it->string, strlen(it->string)), strlen(it->string),
                    from_json(&e, it));
        }
    }
    exec(&r, t->root);
    char *res = pd_malloc(text.n + 1);
    if (!res)
        fail(&e, PD_ENOMEM, "out of memory");
    memcpy(res, text.p ? text.p : "", text.n);
    res[text.n] = '\0';
    if (out_len)
        *out_len = text.n;
    *out = res;
    arena_free(&arena);
    return PD_OK;
}
