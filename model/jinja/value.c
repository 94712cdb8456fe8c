/*
 * value.c — the interpreter's arena and errors (a failure longjmps to the entry point), its values
 * (Python semantics: None, bools, ints, floats, strings, lists, dicts, namespaces, functions),
 * the string builder and how values print (str, repr, tojson).
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

/* ---------------------------------------------------------------- arena and errors */

void jj_fail(struct env *e, int code, const char *fmt, ...) {
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
int64_t jj_to_int(struct env *e, double f, int line) {
    if (!(f > -9223372036854775809.0 && f < 9223372036854775808.0))
        jj_fail(e, PD_ERANGE, "line %d: %g does not fit a 64-bit integer", line, f);
    return (int64_t)f;
}

void *jj_amalloc(struct env *e, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct blk *b = e->arena->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        if (cap > ARENA_MAX || e->arena->total + cap > ARENA_MAX)
            jj_fail(e, PD_ERANGE, "template needs more than %zu MiB", ARENA_MAX >> 20);
        e->arena->total += cap;
        b = pd_malloc(sizeof(struct blk) + cap);
        if (!b)
            jj_fail(e, PD_ENOMEM, "out of memory");
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

void jj_arena_free(struct arena *a) {
    struct blk *b = a->head;
    while (b) {
        struct blk *n = b->next;
        pd_free(b);
        b = n;
    }
    a->head = NULL;
}

char *jj_astrndup(struct env *e, const char *s, size_t n) {
    char *p = jj_amalloc(e, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---------------------------------------------------------------- values */

struct jv jj_v_undef(void) {
    return (struct jv){.k = V_UNDEF};
}
struct jv jj_v_none(void) {
    return (struct jv){.k = V_NONE};
}
struct jv jj_v_bool(bool b) {
    return (struct jv){.k = V_BOOL, .u.b = b};
}
struct jv jj_v_int(int64_t i) {
    return (struct jv){.k = V_INT, .u.i = i};
}
struct jv jj_v_float(double f) {
    return (struct jv){.k = V_FLOAT, .u.f = f};
}
struct jv jj_v_str(const char *p, size_t n) {
    struct jv v = {.k = V_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
struct jv jj_v_cstr(const char *p) {
    return jj_v_str(p, strlen(p));
}

struct jv jj_v_list(struct env *e) {
    struct jv v = {.k = V_LIST};
    v.u.l = jj_amalloc(e, sizeof(struct jlist));
    return v;
}
void jj_list_push(struct env *e, struct jlist *l, struct jv x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 8;
        struct jv *nv = jj_amalloc(e, nc * sizeof(struct jv));
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(struct jv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}
struct jv jj_v_dict(struct env *e, enum vk k) {
    struct jv v = {.k = k};
    v.u.d = jj_amalloc(e, sizeof(struct jdict));
    return v;
}
static bool str_eq(struct jv a, const char *s, size_t n) {
    return a.k == V_STR && a.u.s.n == n && memcmp(a.u.s.p, s, n) == 0;
}
struct jv *jj_dict_find(struct jdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->k[i], key, n))
            return &d->v[i];
    return NULL;
}
void jj_dict_set(struct env *e, struct jdict *d, struct jv key, struct jv val) {
    if (key.k == V_STR) {
        struct jv *p = jj_dict_find(d, key.u.s.p, key.u.s.n);
        if (p) {
            *p = val;
            return;
        }
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        struct jv *nk = jj_amalloc(e, nc * sizeof(struct jv)),
                  *nv = jj_amalloc(e, nc * sizeof(struct jv));
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

struct jv jj_from_json(struct env *e, const cJSON *j) {
    if (!j || cJSON_IsNull(j))
        return jj_v_none();
    if (cJSON_IsBool(j))
        return jj_v_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            return jj_v_int((int64_t)d);
        return jj_v_float(d);
    }
    if (cJSON_IsString(j))
        return jj_v_cstr(jj_astrndup(e, j->valuestring, strlen(j->valuestring)));
    if (cJSON_IsArray(j)) {
        struct jv l = jj_v_list(e);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) jj_list_push(e, l.u.l, jj_from_json(e, it));
        return l;
    }
    struct jv d = jj_v_dict(e, V_DICT);
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        jj_dict_set(e, d.u.d, jj_v_cstr(jj_astrndup(e, it->string, strlen(it->string))),
                    jj_from_json(e, it));
    }
    return d;
}

/* ---------------------------------------------------------------- string builder */

void jj_sb_put(struct sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = jj_amalloc(b->e, nc);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
void jj_sb_puts(struct sb *b, const char *s) {
    jj_sb_put(b, s, strlen(s));
}
struct jv jj_sb_val(struct sb *b) {
    return b->p ? jj_v_str(b->p, b->n) : jj_v_str("", 0);
}

/* Python repr of a float: the shortest digits that read back the same, fixed notation for
 * exponents in [-4, 16), else d.ddde+XX. */
static void put_float(struct sb *b, double f) {
    char buf[48], out[64];
    if (isnan(f)) {
        jj_sb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        jj_sb_puts(b, f > 0 ? "inf" : "-inf");
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
    jj_sb_puts(b, out);
}

/* The containers a walk of a value (printing, tojson, ==) is inside, innermost first: they bound
 * its recursion, and a container met again inside itself (a namespace holding itself) is found
 * there. */
struct nesting {
    const void *c;
    const struct nesting *up;
    int depth;
};

/* Enters container c below up (into *in, also on a cycle: a walk that goes on anyway ends at the
 * bound): false when c is already open above (a cycle); fails past VALUE_DEPTH_MAX levels. what
 * names the walk in the error. */
static bool enter(struct env *e, struct nesting *in, const void *c, const struct nesting *up,
                  const char *what) {
    int depth = up ? up->depth + 1 : 1;
    if (depth > VALUE_DEPTH_MAX)
        jj_fail(e, PD_ERANGE, "%s: a value nested deeper than %d lists, dicts or namespaces", what,
                VALUE_DEPTH_MAX);
    *in = (struct nesting){.c = c, .up = up, .depth = depth};
    for (const struct nesting *n = up; n; n = n->up)
        if (n->c == c)
            return false;
    return true;
}

static void put_repr(struct sb *b, struct jv v, const struct nesting *up);

/* str(v) as Python prints it below the containers up; one already being printed prints as
 * Python's repr guard does: [...] or {...}. */
static void put_str(struct sb *b, struct jv v, const struct nesting *up) {
    char buf[32];
    struct nesting in;
    switch (v.k) {
    case V_UNDEF: return;
    case V_NONE: jj_sb_puts(b, "None"); return;
    case V_BOOL: jj_sb_puts(b, v.u.b ? "True" : "False"); return;
    case V_INT:
        snprintf(buf, sizeof(buf), "%lld", (long long)v.u.i);
        jj_sb_puts(b, buf);
        return;
    case V_FLOAT: put_float(b, v.u.f); return;
    case V_STR: jj_sb_put(b, v.u.s.p, v.u.s.n); return;
    case V_LIST:
        if (!enter(b->e, &in, v.u.l, up, "printing")) {
            jj_sb_puts(b, "[...]");
            return;
        }
        jj_sb_puts(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                jj_sb_puts(b, ", ");
            put_repr(b, v.u.l->v[i], &in);
        }
        jj_sb_puts(b, "]");
        return;
    case V_DICT:
    case V_NS:
        /* Jinja's Namespace prints "<Namespace " and the repr of its attribute dict */
        if (v.k == V_NS)
            jj_sb_puts(b, "<Namespace ");
        if (!enter(b->e, &in, v.u.d, up, "printing")) {
            jj_sb_puts(b, v.k == V_NS ? "{...}>" : "{...}");
            return;
        }
        jj_sb_puts(b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                jj_sb_puts(b, ", ");
            put_repr(b, v.u.d->k[i], &in);
            jj_sb_puts(b, ": ");
            put_repr(b, v.u.d->v[i], &in);
        }
        jj_sb_puts(b, v.k == V_NS ? "}>" : "}");
        return;
    case V_FUNC: jj_sb_puts(b, "<function>"); return;
    }
}

void jj_put_str(struct sb *b, struct jv v) {
    put_str(b, v, NULL);
}

static void put_repr(struct sb *b, struct jv v, const struct nesting *up) {
    if (v.k != V_STR) {
        put_str(b, v, up);
        return;
    }
    bool has_sq = memchr(v.u.s.p, '\'', v.u.s.n) != NULL;
    bool has_dq = memchr(v.u.s.p, '"', v.u.s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jj_sb_put(b, &q, 1);
    for (size_t i = 0; i < v.u.s.n; i++) {
        unsigned char c = (unsigned char)v.u.s.p[i];
        char esc[8];
        if (c == '\\')
            jj_sb_puts(b, "\\\\");
        else if (c == (unsigned char)q)
            jj_sb_puts(b, q == '\'' ? "\\'" : "\\\"");
        else if (c == '\n')
            jj_sb_puts(b, "\\n");
        else if (c == '\r')
            jj_sb_puts(b, "\\r");
        else if (c == '\t')
            jj_sb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\x%02x", c);
            jj_sb_puts(b, esc);
        } else
            jj_sb_put(b, (const char *)&c, 1);
    }
    jj_sb_put(b, &q, 1);
}

/* json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...) below the
 * containers up (Python refuses a circular reference; none can form without a namespace, which
 * is no JSON either) */
static void put_json(struct env *e, struct sb *b, struct jv v, int indent, int depth,
                     const char *item_sep, const char *key_sep, bool sort_keys,
                     const struct nesting *up) {
    char buf[32];
    struct nesting in;
    switch (v.k) {
    case V_UNDEF: jj_fail(e, PD_EINVAL, "tojson: Undefined is not JSON serializable");
    case V_NONE: jj_sb_puts(b, "null"); return;
    case V_BOOL: jj_sb_puts(b, v.u.b ? "true" : "false"); return;
    case V_INT:
        snprintf(buf, sizeof(buf), "%lld", (long long)v.u.i);
        jj_sb_puts(b, buf);
        return;
    case V_FLOAT:
        if (isnan(v.u.f))
            jj_sb_puts(b, "NaN");
        else if (isinf(v.u.f))
            jj_sb_puts(b, v.u.f > 0 ? "Infinity" : "-Infinity");
        else
            put_float(b, v.u.f);
        return;
    case V_STR:
        jj_sb_puts(b, "\"");
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char c = (unsigned char)v.u.s.p[i];
            if (c == '"')
                jj_sb_puts(b, "\\\"");
            else if (c == '\\')
                jj_sb_puts(b, "\\\\");
            else if (c == '\n')
                jj_sb_puts(b, "\\n");
            else if (c == '\r')
                jj_sb_puts(b, "\\r");
            else if (c == '\t')
                jj_sb_puts(b, "\\t");
            else if (c == '\b')
                jj_sb_puts(b, "\\b");
            else if (c == '\f')
                jj_sb_puts(b, "\\f");
            else if (c < 0x20) {
                snprintf(buf, sizeof(buf), "\\u%04x", c);
                jj_sb_puts(b, buf);
            } else
                jj_sb_put(b, (const char *)&c, 1);
        }
        jj_sb_puts(b, "\"");
        return;
    case V_NS: jj_fail(e, PD_EINVAL, "tojson: Object of type Namespace is not JSON serializable");
    case V_LIST:
    case V_DICT: {
        bool is_list = v.k == V_LIST;
        size_t n = is_list ? v.u.l->n : v.u.d->n;
        if (!enter(e, &in, is_list ? (const void *)v.u.l : (const void *)v.u.d, up, "tojson"))
            jj_fail(e, PD_EINVAL, "tojson: circular reference detected");
        jj_sb_puts(b, is_list ? "[" : "{");
        if (n == 0) {
            jj_sb_puts(b, is_list ? "]" : "}");
            return;
        }
        size_t *order = jj_amalloc(e, n * sizeof(size_t));
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
                jj_sb_puts(b, item_sep);
            if (indent >= 0) {
                jj_sb_puts(b, "\n");
                for (int k = 0; k < indent * (depth + 1); k++)
                    jj_sb_puts(b, " ");
            }
            if (is_list) {
                put_json(e, b, v.u.l->v[order[i]], indent, depth + 1, item_sep, key_sep, sort_keys,
                         &in);
            } else {
                struct jv key = v.u.d->k[order[i]];
                if (key.k != V_STR) {
                    struct sb kb = {.e = e};
                    jj_put_str(&kb, key);
                    key = jj_sb_val(&kb);
                }
                put_json(e, b, key, indent, depth + 1, item_sep, key_sep, sort_keys, &in);
                jj_sb_puts(b, key_sep);
                put_json(e, b, v.u.d->v[order[i]], indent, depth + 1, item_sep, key_sep, sort_keys,
                         &in);
            }
        }
        if (indent >= 0) {
            jj_sb_puts(b, "\n");
            for (int k = 0; k < indent * depth; k++)
                jj_sb_puts(b, " ");
        }
        jj_sb_puts(b, is_list ? "]" : "}");
        return;
    }
    case V_FUNC: jj_fail(e, PD_EINVAL, "tojson: a function is not JSON serializable");
    }
}

void jj_put_json(struct env *e, struct sb *b, struct jv v, int indent, int depth,
                 const char *item_sep, const char *key_sep, bool sort_keys) {
    put_json(e, b, v, indent, depth, item_sep, key_sep, sort_keys, NULL);
}

bool jj_truthy(struct jv v) {
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

const char *jj_type_name(struct jv v) {
    static const char *const names[] = {"undefined", "NoneType", "bool", "int",       "float",
                                        "str",       "list",     "dict", "Namespace", "function"};
    return names[v.k];
}

/* a == b below the containers up; a container equals itself at once (Python compares items by
 * identity first), so only distinct values nested that deep are walked. */
static bool values_equal(struct env *e, struct jv a, struct jv b, const struct nesting *up) {
    struct nesting in;
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
        if (a.u.l == b.u.l)
            return true;
        if (a.u.l->n != b.u.l->n)
            return false;
        /* the result is unused: no cycle passes only lists and dicts (namespaces compare by
         * identity), and one would end at the bound */
        (void)enter(e, &in, a.u.l, up, "==");
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!values_equal(e, a.u.l->v[i], b.u.l->v[i], &in))
                return false;
        return true;
    case V_DICT:
        if (a.u.d == b.u.d)
            return true;
        if (a.u.d->n != b.u.d->n)
            return false;
        (void)enter(e, &in, a.u.d, up, "==");
        for (size_t i = 0; i < a.u.d->n; i++) {
            struct jv *o = a.u.d->k[i].k == V_STR
                               ? jj_dict_find(b.u.d, a.u.d->k[i].u.s.p, a.u.d->k[i].u.s.n)
                               : NULL;
            if (!o || !values_equal(e, a.u.d->v[i], *o, &in))
                return false;
        }
        return true;
    default: return a.u.d == b.u.d;
    }
}

bool jj_values_equal(struct env *e, struct jv a, struct jv b) {
    return values_equal(e, a, b, NULL);
}

/* Python's `is` as far as a value here can tell it: containers, namespaces and functions are
 * the same object or not; None and the booleans are singletons; an int, a float or a string is
 * taken as the same as an equal one of its own type (Python shares small ints and literal
 * strings, and a value here has no identity of its own to tell two equal ones apart). An
 * undefined value is a new object at each use, so never the same as anything. */
bool jj_values_same(struct jv a, struct jv b) {
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case V_UNDEF: return false;
    case V_NONE: return true;
    case V_BOOL: return a.u.b == b.u.b;
    case V_INT: return a.u.i == b.u.i;
    case V_FLOAT: return a.u.f == b.u.f;
    case V_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case V_LIST: return a.u.l == b.u.l;
    case V_FUNC: return a.u.fn == b.u.fn;
    default: return a.u.d == b.u.d; /* dicts and namespaces */
    }
}
