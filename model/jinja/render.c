/*
 * render.c — the tree-walking renderer: scopes, attribute and item access, slices, operators,
 * expressions and statements (for loops with loop.*), and pd_chat_template_render.
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

/* ---------------------------------------------------------------- renderer */

static struct jv *lookup(struct rt *r, const char *name, size_t n) {
    for (struct scope *s = r->sc; s; s = s->up) {
        struct jv *v = jj_dict_find(&s->vars, name, n);
        if (v)
            return v;
    }
    return NULL;
}

void jj_set_var(struct rt *r, const char *name, size_t n, struct jv v) {
    jj_dict_set(r->e, &r->sc->vars, jj_v_str(name, n), v);
}

static struct jv make_func(struct rt *r, const char *name, struct jv *self) {
    struct jv v = {.k = V_FUNC};
    v.u.fn = jj_amalloc(r->e, sizeof(struct jfunc));
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
        jj_fail(e, PD_EINVAL, "line %d: '%.*s' of an undefined value", line, (int)n, name);
    if (obj.k == V_NS || obj.k == V_DICT) {
        if (obj.k == V_DICT && in_list(dict_methods, name, n)) {
            struct jv *self = jj_amalloc(e, sizeof(struct jv));
            *self = obj;
            return make_func(r, jj_astrndup(e, name, n), self);
        }
        struct jv *v = jj_dict_find(obj.u.d, name, n);
        return v ? *v : jj_v_undef();
    }
    if (obj.k == V_STR && in_list(str_methods, name, n)) {
        struct jv *self = jj_amalloc(e, sizeof(struct jv));
        *self = obj;
        return make_func(r, jj_astrndup(e, name, n), self);
    }
    return jj_v_undef();
}

static int64_t norm_index(int64_t i, size_t n) {
    return i < 0 ? i + (int64_t)n : i;
}

struct jv jj_get_item(struct rt *r, struct jv obj, struct jv key, int line) {
    struct env *e = r->e;
    if (obj.k == V_UNDEF)
        jj_fail(e, PD_EINVAL, "line %d: subscript of an undefined value", line);
    if (obj.k == V_DICT || obj.k == V_NS) {
        if (key.k == V_STR) {
            struct jv *v = jj_dict_find(obj.u.d, key.u.s.p, key.u.s.n);
            if (v)
                return *v;
            return get_attr(r, obj, key.u.s.p, key.u.s.n, line);
        }
        for (size_t i = 0; i < obj.u.d->n; i++)
            if (jj_values_equal(r->e, obj.u.d->k[i], key))
                return obj.u.d->v[i];
        return jj_v_undef();
    }
    if ((obj.k == V_LIST || obj.k == V_STR) && key.k == V_INT) {
        size_t len = obj.k == V_LIST ? obj.u.l->n : obj.u.s.n;
        int64_t i = norm_index(key.u.i, len);
        if (i < 0 || (size_t)i >= len)
            return jj_v_undef(); /* Jinja: an out-of-range subscript is undefined */
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
            return jj_v_undef();
        while (ci < i) {
            pos++;
            while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80)
                pos++;
            ci++;
        }
        size_t end = pos + 1;
        while (end < len && ((unsigned char)s[end] & 0xC0) == 0x80)
            end++;
        return jj_v_str(s + pos, end - pos);
    }
    if (key.k == V_STR)
        return get_attr(r, obj, key.u.s.p, key.u.s.n, line);
    return jj_v_undef();
}

/* Python slicing of lists and strings (strings by character). */
static struct jv slice(struct rt *r, struct jv obj, struct jv lo, struct jv hi, struct jv st,
                       int line) {
    struct env *e = r->e;
    int64_t step = st.k == V_INT ? st.u.i : 1;
    if (step == 0)
        jj_fail(e, PD_EINVAL, "line %d: slice step cannot be zero", line);
    size_t n;
    const char **starts = NULL; /* character starts for strings */
    if (obj.k == V_LIST) {
        n = obj.u.l->n;
    } else if (obj.k == V_STR) {
        n = 0;
        for (size_t k = 0; k < obj.u.s.n; k++)
            n += ((unsigned char)obj.u.s.p[k] & 0xC0) != 0x80;
        starts = jj_amalloc(e, (n + 1) * sizeof(char *));
        size_t c = 0;
        for (size_t k = 0; k < obj.u.s.n; k++)
            if (((unsigned char)obj.u.s.p[k] & 0xC0) != 0x80)
                starts[c++] = obj.u.s.p + k;
        starts[n] = obj.u.s.p + obj.u.s.n;
    } else {
        jj_fail(e, PD_EINVAL, "line %d: cannot slice a %s", line, jj_type_name(obj));
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
        struct jv out = jj_v_list(e);
        for (int64_t i = a; step > 0 ? i < b : i > b;) {
            jj_list_push(e, out.u.l, obj.u.l->v[i]);
            if (__builtin_add_overflow(i, step, &i)) /* a step past the end: done */
                break;
        }
        return out;
    }
    struct sb sbuf = {.e = e};
    for (int64_t i = a; step > 0 ? i < b : i > b;) {
        jj_sb_put(&sbuf, starts[i], (size_t)(starts[i + 1] - starts[i]));
        if (__builtin_add_overflow(i, step, &i))
            break;
    }
    return jj_sb_val(&sbuf);
}

double jj_num(struct rt *r, struct jv v, int line) {
    if (v.k == V_INT)
        return (double)v.u.i;
    if (v.k == V_FLOAT)
        return v.u.f;
    if (v.k == V_BOOL)
        return v.u.b;
    jj_fail(r->e, PD_EINVAL, "line %d: expected a number, got %s", line, jj_type_name(v));
}

int jj_cmp_values(struct rt *r, struct jv a, struct jv b, int line) {
    if (a.k == V_STR && b.k == V_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, m);
        return c ? c : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    double x = jj_num(r, a, line), y = jj_num(r, b, line);
    return (x > y) - (x < y);
}

bool jj_contains(struct rt *r, struct jv hay, struct jv needle, int line) {
    if (hay.k == V_STR) {
        if (needle.k != V_STR)
            jj_fail(r->e, PD_EINVAL, "line %d: 'in <string>' needs a string on the left", line);
        if (needle.u.s.n == 0)
            return true;
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n; i++)
            if (memcmp(hay.u.s.p + i, needle.u.s.p, needle.u.s.n) == 0)
                return true;
        return false;
    }
    if (hay.k == V_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jj_values_equal(r->e, hay.u.l->v[i], needle))
                return true;
        return false;
    }
    if (hay.k == V_DICT || hay.k == V_NS) {
        for (size_t i = 0; i < hay.u.d->n; i++)
            if (jj_values_equal(r->e, hay.u.d->k[i], needle))
                return true;
        return false;
    }
    if (hay.k == V_UNDEF)
        jj_fail(r->e, PD_EINVAL, "line %d: 'in' on an undefined value", line);
    jj_fail(r->e, PD_EINVAL, "line %d: argument of type '%s' is not iterable", line,
            jj_type_name(hay));
}

struct jv jj_to_str(struct rt *r, struct jv v) {
    if (v.k == V_STR)
        return v;
    struct sb b = {.e = r->e};
    jj_put_str(&b, v);
    return jj_sb_val(&b);
}

struct jv jj_binop(struct rt *r, const struct node *n, struct jv a, struct jv b) {
    struct env *e = r->e;
    const char *op = n->name;
    int line = n->line;
    if (!strcmp(op, "~")) {
        struct sb s = {.e = e};
        jj_put_str(&s, a);
        jj_put_str(&s, b);
        return jj_sb_val(&s);
    }
    if (!strcmp(op, "==") || !strcmp(op, "!="))
        return jj_v_bool(jj_values_equal(e, a, b) == (op[0] == '='));
    if (!strcmp(op, "in"))
        return jj_v_bool(jj_contains(r, b, a, line) != n->negate);
    if (!strcmp(op, "<"))
        return jj_v_bool(jj_cmp_values(r, a, b, line) < 0);
    if (!strcmp(op, ">"))
        return jj_v_bool(jj_cmp_values(r, a, b, line) > 0);
    if (!strcmp(op, "<="))
        return jj_v_bool(jj_cmp_values(r, a, b, line) <= 0);
    if (!strcmp(op, ">="))
        return jj_v_bool(jj_cmp_values(r, a, b, line) >= 0);
    if (!strcmp(op, "+")) {
        if (a.k == V_STR && b.k == V_STR) {
            struct sb s = {.e = e};
            jj_sb_put(&s, a.u.s.p, a.u.s.n);
            jj_sb_put(&s, b.u.s.p, b.u.s.n);
            return jj_sb_val(&s);
        }
        if (a.k == V_LIST && b.k == V_LIST) {
            struct jv l = jj_v_list(e);
            for (size_t i = 0; i < a.u.l->n; i++)
                jj_list_push(e, l.u.l, a.u.l->v[i]);
            for (size_t i = 0; i < b.u.l->n; i++)
                jj_list_push(e, l.u.l, b.u.l->v[i]);
            return l;
        }
        if (a.k == V_STR || b.k == V_STR || a.k == V_LIST || b.k == V_LIST || a.k == V_UNDEF ||
            b.k == V_UNDEF || a.k == V_NONE || b.k == V_NONE)
            jj_fail(e, PD_EINVAL, "line %d: unsupported operand types for +: '%s' and '%s'", line,
                    jj_type_name(a), jj_type_name(b));
    }
    if (!strcmp(op, "*") && ((a.k == V_STR && b.k == V_INT) || (a.k == V_INT && b.k == V_STR))) {
        struct jv s = a.k == V_STR ? a : b;
        int64_t k = a.k == V_INT ? a.u.i : b.u.i;
        if (s.u.s.n && k > 0 && (uint64_t)k > ARENA_MAX / s.u.s.n)
            jj_fail(e, PD_ERANGE, "line %d: string repeated %" PRId64 " times: too long", line, k);
        if (!s.u.s.n || k <= 0) /* nothing to repeat: not k empty copies (k may be 10^12) */
            return jj_v_str("", 0);
        /* one copy, then the result doubles itself: log2(k) copies, not k */
        size_t total = (size_t)k * s.u.s.n, have = s.u.s.n;
        char *p = jj_amalloc(e, total + 1);
        memcpy(p, s.u.s.p, have);
        while (have < total) {
            size_t more = have < total - have ? have : total - have;
            memcpy(p + have, p, more);
            have += more;
        }
        p[total] = '\0';
        return jj_v_str(p, total);
    }
    bool ints = (a.k == V_INT || a.k == V_BOOL) && (b.k == V_INT || b.k == V_BOOL);
    int64_t x = a.k == V_BOOL ? a.u.b : a.u.i, y = b.k == V_BOOL ? b.u.b : b.u.i, z = 0;
    double fx = jj_num(r, a, line), fy = jj_num(r, b, line);
    /* Python's ints do not overflow; ours are int64: past it is an error (C's overflow is UB) */
    if (ints && ((op[0] == '+' && __builtin_add_overflow(x, y, &z)) ||
                 (op[0] == '-' && __builtin_sub_overflow(x, y, &z)) ||
                 (op[0] == '*' && !op[1] && __builtin_mul_overflow(x, y, &z)) ||
                 (op[0] == '/' && op[1] == '/' && x == INT64_MIN && y == -1)))
        jj_fail(e, PD_ERANGE, "line %d: integer overflow in %s", line, op);
    switch (op[0]) {
    case '+': return ints ? jj_v_int(z) : jj_v_float(fx + fy);
    case '-': return ints ? jj_v_int(z) : jj_v_float(fx - fy);
    case '*':
        if (op[1] == '*') {
            if (ints && y >= 0) {
                double p = pow((double)x, (double)y);
                if (!(p >= -9223372036854775808.0 && p < 9223372036854775808.0))
                    jj_fail(e, PD_ERANGE, "line %d: integer overflow in **", line);
                return jj_v_int((int64_t)llround(p));
            }
            return jj_v_float(pow(fx, fy));
        }
        return ints ? jj_v_int(z) : jj_v_float(fx * fy);
    case '/':
        if (fy == 0)
            jj_fail(e, PD_EINVAL, "line %d: division by zero", line);
        if (op[1] == '/') {
            if (ints) {
                int64_t q = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0)))
                    q--;
                return jj_v_int(q);
            }
            return jj_v_float(floor(fx / fy));
        }
        return jj_v_float(fx / fy);
    case '%':
        if (a.k == V_STR)
            jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported construct: string %% formatting",
                    line);
        if (fy == 0)
            jj_fail(e, PD_EINVAL, "line %d: modulo by zero", line);
        if (ints) {
            int64_t m = y == -1 ? 0 : x % y; /* INT64_MIN % -1 overflows in C */
            if (m != 0 && ((m < 0) != (y < 0)))
                m += y;
            return jj_v_int(m);
        }
        return jj_v_float(fx - floor(fx / fy) * fy);
    }
    jj_fail(e, PD_EINTERNAL, "line %d: unknown operator %s", line, op);
}

struct jv jj_eval(struct rt *r, const struct node *n) {
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
        return jj_v_undef();
    }
    case E_ATTR: return get_attr(r, jj_eval(r, n->a), n->name, n->name_n, n->line);
    case E_ITEM: return jj_get_item(r, jj_eval(r, n->a), jj_eval(r, n->b), n->line);
    case E_SLICE:
        return slice(r, jj_eval(r, n->a), n->b ? jj_eval(r, n->b) : jj_v_undef(),
                     n->c ? jj_eval(r, n->c) : jj_v_undef(), n->d ? jj_eval(r, n->d) : jj_v_undef(),
                     n->line);
    case E_CALL: return jj_call(r, n);
    case E_FILTER: return jj_apply_filter(r, n, jj_eval(r, n->a));
    case E_TEST: return jj_v_bool(jj_run_test(r, n, jj_eval(r, n->a)) != n->negate);
    case E_BIN: {
        struct jv a = jj_eval(r, n->a), b = jj_eval(r, n->b);
        return jj_binop(r, n, a, b);
    }
    case E_NEG: {
        struct jv v = jj_eval(r, n->a);
        if (v.k == V_INT && v.u.i == INT64_MIN)
            jj_fail(r->e, PD_ERANGE, "line %d: integer overflow in -", n->line);
        return v.k == V_INT ? jj_v_int(-v.u.i) : jj_v_float(-jj_num(r, v, n->line));
    }
    case E_POS: return jj_eval(r, n->a);
    case E_NOT: return jj_v_bool(!jj_truthy(jj_eval(r, n->a)));
    case E_AND: {
        struct jv a = jj_eval(r, n->a);
        return jj_truthy(a) ? jj_eval(r, n->b) : a;
    }
    case E_OR: {
        struct jv a = jj_eval(r, n->a);
        return jj_truthy(a) ? a : jj_eval(r, n->b);
    }
    case E_COND:
        if (jj_truthy(jj_eval(r, n->b)))
            return jj_eval(r, n->a);
        return n->c ? jj_eval(r, n->c) : jj_v_undef();
    case E_LIST: {
        struct jv l = jj_v_list(e);
        for (size_t i = 0; i < n->n; i++)
            jj_list_push(e, l.u.l, jj_eval(r, n->list[i]));
        return l;
    }
    case E_DICT: {
        struct jv d = jj_v_dict(e, V_DICT);
        for (size_t i = 0; i + 1 < n->n; i += 2)
            jj_dict_set(e, d.u.d, jj_eval(r, n->list[i]), jj_eval(r, n->list[i + 1]));
        return d;
    }
    default: jj_fail(e, PD_EINTERNAL, "line %d: node %d is not an expression", n->line, (int)n->k);
    }
}

static enum flow exec_for(struct rt *r, const struct node *n) {
    struct env *e = r->e;
    struct jv it = jj_eval(r, n->a);
    struct jv items = it.k == V_DICT ? jj_list_of(r, it, n->line) : jj_list_of(r, it, n->line);
    /* `for x in y if cond`: filter first, so loop.* counts only the kept items */
    struct scope sc = {.up = r->sc};
    r->sc = &sc;
    struct jv kept = items;
    if (n->d) {
        kept = jj_v_list(e);
        for (size_t i = 0; i < items.u.l->n; i++) {
            struct jv x = items.u.l->v[i];
            if (n->name2) {
                if (x.k != V_LIST || x.u.l->n != 2)
                    jj_fail(e, PD_EINVAL, "line %d: cannot unpack into two names", n->line);
                jj_set_var(r, n->name, n->name_n, x.u.l->v[0]);
                jj_set_var(r, n->name2, strlen(n->name2), x.u.l->v[1]);
            } else {
                jj_set_var(r, n->name, n->name_n, x);
            }
            if (jj_truthy(jj_eval(r, n->d)))
                jj_list_push(e, kept.u.l, x);
        }
    }
    size_t len = kept.u.l->n;
    for (size_t i = 0; i < len; i++) {
        struct jv x = kept.u.l->v[i];
        if (n->name2) {
            if (x.k != V_LIST || x.u.l->n != 2)
                jj_fail(e, PD_EINVAL, "line %d: cannot unpack into two names", n->line);
            jj_set_var(r, n->name, n->name_n, x.u.l->v[0]);
            jj_set_var(r, n->name2, strlen(n->name2), x.u.l->v[1]);
        } else {
            jj_set_var(r, n->name, n->name_n, x);
        }
        struct jv loop = jj_v_dict(e, V_DICT);
        struct jdict *d = loop.u.d;
        jj_dict_set(e, d, jj_v_cstr("index"), jj_v_int((int64_t)i + 1));
        jj_dict_set(e, d, jj_v_cstr("index0"), jj_v_int((int64_t)i));
        jj_dict_set(e, d, jj_v_cstr("revindex"), jj_v_int((int64_t)(len - i)));
        jj_dict_set(e, d, jj_v_cstr("revindex0"), jj_v_int((int64_t)(len - i - 1)));
        jj_dict_set(e, d, jj_v_cstr("first"), jj_v_bool(i == 0));
        jj_dict_set(e, d, jj_v_cstr("last"), jj_v_bool(i + 1 == len));
        jj_dict_set(e, d, jj_v_cstr("length"), jj_v_int((int64_t)len));
        jj_dict_set(e, d, jj_v_cstr("previtem"), i > 0 ? kept.u.l->v[i - 1] : jj_v_undef());
        jj_dict_set(e, d, jj_v_cstr("nextitem"), i + 1 < len ? kept.u.l->v[i + 1] : jj_v_undef());
        jj_set_var(r, "loop", 4, loop);
        enum flow f = jj_exec(r, n->b);
        if (f == FLOW_BREAK)
            break;
    }
    if (len == 0 && n->c)
        jj_exec(r, n->c);
    r->sc = sc.up;
    return FLOW_NORMAL;
}

enum flow jj_exec(struct rt *r, const struct node *n) {
    struct env *e = r->e;
    switch (n->k) {
    case N_BLOCK:
        for (size_t i = 0; i < n->n; i++) {
            enum flow f = jj_exec(r, n->list[i]);
            if (f != FLOW_NORMAL)
                return f;
        }
        return FLOW_NORMAL;
    case N_TEXT: jj_sb_put(r->out, n->name, n->name_n); return FLOW_NORMAL;
    case N_OUT: jj_put_str(r->out, jj_eval(r, n->a)); return FLOW_NORMAL;
    case N_IF:
        if (jj_truthy(jj_eval(r, n->a)))
            return jj_exec(r, n->b);
        return n->c ? jj_exec(r, n->c) : FLOW_NORMAL;
    case N_FOR: return exec_for(r, n);
    case N_SET:
    case N_SETBLOCK: {
        struct jv v;
        if (n->k == N_SET) {
            v = jj_eval(r, n->b);
        } else {
            struct sb *saved = r->out;
            struct sb body = {.e = e};
            r->out = &body;
            jj_exec(r, n->b);
            r->out = saved;
            v = jj_sb_val(&body);
        }
        if (n->a->k == E_NAME) {
            jj_set_var(r, n->a->name, n->a->name_n, v);
        } else {
            struct jv ns = jj_eval(r, n->a->a);
            if (ns.k != V_NS)
                jj_fail(e, PD_EINVAL,
                        "line %d: cannot assign an attribute of a %s (only of a "
                        "namespace)",
                        n->line, jj_type_name(ns));
            jj_dict_set(e, ns.u.d, jj_v_str(n->a->name, n->a->name_n), v);
        }
        return FLOW_NORMAL;
    }
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    case N_MACRO: {
        struct jv f = make_func(r, "macro", NULL);
        f.u.fn->macro = n;
        jj_set_var(r, n->name, n->name_n, f);
        return FLOW_NORMAL;
    }
    default: jj_fail(e, PD_EINTERNAL, "line %d: node %d is not a statement", n->line, (int)n->k);
    }
}

int pd_chat_template_render(const struct pd_chat_template *t, const struct pd_chat_args *args,
                            char **out, size_t *out_len) {
    *out = NULL;
    struct arena arena = {0};
    struct env e = {.arena = &arena};
    if (setjmp(e.jb)) {
        jj_arena_free(&arena);
        return e.code;
    }
    struct scope globals = {0};
    struct sb text = {.e = &e};
    struct rt r = {.e = &e, .sc = &globals, .out = &text};
    if (!cJSON_IsArray(args->messages))
        jj_fail(&e, PD_EINVAL, "messages must be an array");
    jj_set_var(&r, "messages", 8, jj_from_json(&e, args->messages));
    jj_set_var(&r, "tools", 5, args->tools ? jj_from_json(&e, args->tools) : jj_v_none());
    jj_set_var(&r, "add_generation_prompt", 21, jj_v_bool(args->add_generation_prompt));
    if (args->bos_token)
        jj_set_var(&r, "bos_token", 9, jj_v_cstr(args->bos_token));
    if (args->eos_token)
        jj_set_var(&r, "eos_token", 9, jj_v_cstr(args->eos_token));
    if (cJSON_IsObject(args->extra)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, args->extra) {
            jj_set_var(&r, jj_astrndup(&e, it->string, strlen(it->string)), strlen(it->string),
                       jj_from_json(&e, it));
        }
    }
    jj_exec(&r, t->root);
    char *res = pd_malloc(text.n + 1);
    if (!res)
        jj_fail(&e, PD_ENOMEM, "out of memory");
    memcpy(res, text.p ? text.p : "", text.n);
    res[text.n] = '\0';
    if (out_len)
        *out_len = text.n;
    *out = res;
    jj_arena_free(&arena);
    return PD_OK;
}
