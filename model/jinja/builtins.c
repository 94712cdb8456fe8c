/*
 * builtins.c — what a template calls: global functions (range, namespace, raise_exception, ...),
 * string / list / dict methods, macros, filters and tests, as Jinja and Python define them.
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

static void eval_args(struct rt *r, const struct node *call, size_t first, struct args *a) {
    memset(a, 0, sizeof(*a));
    for (size_t i = first; i < call->n; i++) {
        const struct node *arg = call->list[i];
        if (arg->k == E_KW) {
            if (a->nkw == 8)
                jj_fail(r->e, PD_EUNSUPPORTED, "line %d: more than 8 keyword arguments",
                        call->line);
            a->kw[a->nkw] = arg->name;
            a->kw_n[a->nkw] = arg->name_n;
            a->kwv[a->nkw++] = jj_eval(r, arg->a);
        } else {
            if (a->npos == 8)
                jj_fail(r->e, PD_EUNSUPPORTED, "line %d: more than 8 arguments", call->line);
            a->pos[a->npos++] = jj_eval(r, arg);
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
    return jj_v_str(p + a, b - a);
}

struct jv jj_list_of(struct rt *r, struct jv v, int line) {
    struct env *e = r->e;
    if (v.k == V_LIST)
        return v;
    struct jv l = jj_v_list(e);
    if (v.k == V_DICT || v.k == V_NS) {
        for (size_t i = 0; i < v.u.d->n; i++)
            jj_list_push(e, l.u.l, v.u.d->k[i]);
        return l;
    }
    if (v.k == V_STR) {
        for (size_t i = 0; i < v.u.s.n;) {
            size_t j = i + 1;
            while (j < v.u.s.n && ((unsigned char)v.u.s.p[j] & 0xC0) == 0x80)
                j++;
            jj_list_push(e, l.u.l, jj_v_str(v.u.s.p + i, j - i));
            i = j;
        }
        return l;
    }
    if (v.k == V_UNDEF)
        return l; /* iterating undefined yields nothing, as Jinja's Undefined */
    jj_fail(e, PD_EINVAL, "line %d: '%s' object is not iterable", line, jj_type_name(v));
}

static struct jv call_method(struct rt *r, struct jv self, const char *m, const struct args *a,
                             int line) {
    struct env *e = r->e;
    struct jv none = jj_v_undef();
    if (self.k == V_DICT) {
        if (!strcmp(m, "items")) {
            struct jv l = jj_v_list(e);
            for (size_t i = 0; i < self.u.d->n; i++) {
                struct jv pair = jj_v_list(e);
                jj_list_push(e, pair.u.l, self.u.d->k[i]);
                jj_list_push(e, pair.u.l, self.u.d->v[i]);
                jj_list_push(e, l.u.l, pair);
            }
            return l;
        }
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            struct jv l = jj_v_list(e);
            for (size_t i = 0; i < self.u.d->n; i++)
                jj_list_push(e, l.u.l, m[0] == 'k' ? self.u.d->k[i] : self.u.d->v[i]);
            return l;
        }
        if (!strcmp(m, "get")) {
            struct jv k = arg(a, 0, "key", none);
            struct jv *v = k.k == V_STR ? jj_dict_find(self.u.d, k.u.s.p, k.u.s.n) : NULL;
            return v ? *v : arg(a, 1, "default", jj_v_none());
        }
    }
    if (self.k != V_STR)
        jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported method '%s' on %s", line, m,
                jj_type_name(self));
    const char *p = self.u.s.p;
    size_t n = self.u.s.n;
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        struct jv x = arg(a, 0, "prefix", none);
        struct jv cands = x.k == V_LIST ? x : jj_v_undef();
        size_t nc = x.k == V_LIST ? x.u.l->n : 1;
        for (size_t i = 0; i < nc; i++) {
            struct jv c = x.k == V_LIST ? cands.u.l->v[i] : x;
            if (c.k != V_STR)
                jj_fail(e, PD_EINVAL, "line %d: %s() needs a string", line, m);
            if (c.u.s.n <= n && memcmp(m[0] == 's' ? p : p + n - c.u.s.n, c.u.s.p, c.u.s.n) == 0)
                return jj_v_bool(true);
        }
        return jj_v_bool(false);
    }
    if (!strcmp(m, "strip"))
        return strip_chars(self, arg(a, 0, "chars", none), true, true);
    if (!strcmp(m, "lstrip"))
        return strip_chars(self, arg(a, 0, "chars", none), true, false);
    if (!strcmp(m, "rstrip"))
        return strip_chars(self, arg(a, 0, "chars", none), false, true);
    if (!strcmp(m, "upper") || !strcmp(m, "lower")) {
        char *o = jj_astrndup(e, p, n);
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)o[i] < 0x80)
                o[i] = (char)(m[0] == 'u' ? (o[i] >= 'a' && o[i] <= 'z' ? o[i] - 32 : o[i])
                                          : (o[i] >= 'A' && o[i] <= 'Z' ? o[i] + 32 : o[i]));
        return jj_v_str(o, n);
    }
    if (!strcmp(m, "title") || !strcmp(m, "capitalize")) {
        char *o = jj_astrndup(e, p, n);
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
        return jj_v_str(o, n);
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        struct jv sep = arg(a, 0, "sep", none);
        struct jv maxv = arg(a, 1, "maxsplit", jj_v_int(-1));
        int64_t maxsplit = maxv.k == V_INT ? maxv.u.i : -1;
        struct jv l = jj_v_list(e);
        if (sep.k != V_STR) { /* whitespace split */
            if (m[0] == 'r' && maxsplit >= 0)
                jj_fail(e, PD_EUNSUPPORTED, "line %d: rsplit() with maxsplit and no separator",
                        line);
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
                    jj_list_push(e, l.u.l, jj_v_str(p + i, end - i));
                    break;
                }
                while (j < n && !is_space_char((unsigned char)p[j]))
                    j++;
                jj_list_push(e, l.u.l, jj_v_str(p + i, j - i));
                splits++;
                i = j;
            }
            return l;
        }
        if (sep.u.s.n == 0)
            jj_fail(e, PD_EINVAL, "line %d: empty separator", line);
        if (m[0] == 'r' && maxsplit >= 0) {
            /* from the right, then reverse */
            struct jv rev = jj_v_list(e);
            size_t end = n;
            int64_t splits = 0;
            size_t i = n;
            while (i >= sep.u.s.n && splits < maxsplit) {
                if (memcmp(p + i - sep.u.s.n, sep.u.s.p, sep.u.s.n) == 0) {
                    jj_list_push(e, rev.u.l, jj_v_str(p + i, end - i));
                    i -= sep.u.s.n;
                    end = i;
                    splits++;
                } else {
                    i--;
                }
            }
            jj_list_push(e, rev.u.l, jj_v_str(p, end));
            for (size_t k = rev.u.l->n; k-- > 0;)
                jj_list_push(e, l.u.l, rev.u.l->v[k]);
            return l;
        }
        size_t start = 0;
        int64_t splits = 0;
        for (size_t i = 0; i + sep.u.s.n <= n;) {
            if ((maxsplit < 0 || splits < maxsplit) && memcmp(p + i, sep.u.s.p, sep.u.s.n) == 0) {
                jj_list_push(e, l.u.l, jj_v_str(p + start, i - start));
                i += sep.u.s.n;
                start = i;
                splits++;
            } else {
                i++;
            }
        }
        jj_list_push(e, l.u.l, jj_v_str(p + start, n - start));
        return l;
    }
    if (!strcmp(m, "splitlines")) {
        struct jv l = jj_v_list(e);
        size_t start = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] == '\n' || p[i] == '\r') {
                jj_list_push(e, l.u.l, jj_v_str(p + start, i - start));
                if (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n')
                    i++;
                start = i + 1;
            }
        }
        if (start < n)
            jj_list_push(e, l.u.l, jj_v_str(p + start, n - start));
        return l;
    }
    if (!strcmp(m, "replace")) {
        struct jv old = arg(a, 0, "old", none), new = arg(a, 1, "new", none);
        struct jv cnt = arg(a, 2, "count", jj_v_int(-1));
        if (old.k != V_STR || new.k != V_STR)
            jj_fail(e, PD_EINVAL, "line %d: replace() needs two strings", line);
        if (old.u.s.n == 0)
            jj_fail(e, PD_EUNSUPPORTED, "line %d: replace() of an empty string", line);
        struct sb o = {.e = e};
        int64_t done = 0, max = cnt.k == V_INT ? cnt.u.i : -1;
        for (size_t i = 0; i < n;) {
            if ((max < 0 || done < max) && i + old.u.s.n <= n &&
                memcmp(p + i, old.u.s.p, old.u.s.n) == 0) {
                jj_sb_put(&o, new.u.s.p, new.u.s.n);
                i += old.u.s.n;
                done++;
            } else {
                jj_sb_put(&o, p + i, 1);
                i++;
            }
        }
        return jj_sb_val(&o);
    }
    if (!strcmp(m, "find") || !strcmp(m, "index") || !strcmp(m, "count")) {
        struct jv x = arg(a, 0, "sub", none);
        if (x.k != V_STR)
            jj_fail(e, PD_EINVAL, "line %d: %s() needs a string", line, m);
        int64_t count = 0;
        for (size_t i = 0; i + x.u.s.n <= n; i++) {
            if (memcmp(p + i, x.u.s.p, x.u.s.n) == 0) {
                if (m[0] != 'c') {
                    int64_t ci = 0; /* character index */
                    for (size_t k = 0; k < i; k++)
                        ci += ((unsigned char)p[k] & 0xC0) != 0x80;
                    return jj_v_int(ci);
                }
                count++;
                i += x.u.s.n ? x.u.s.n - 1 : 0;
            }
        }
        if (m[0] == 'i')
            jj_fail(e, PD_EINVAL, "line %d: substring not found", line);
        return jj_v_int(m[0] == 'c' ? count : -1);
    }
    if (!strcmp(m, "join")) {
        struct jv l = jj_list_of(r, arg(a, 0, "iterable", none), line);
        struct sb o = {.e = e};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i)
                jj_sb_put(&o, p, n);
            jj_put_str(&o, l.u.l->v[i]);
        }
        return jj_sb_val(&o);
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isspace")) {
        if (n == 0)
            return jj_v_bool(false);
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)p[i];
            bool ok = m[2] == 'd'   ? (c >= '0' && c <= '9')
                      : m[2] == 'a' ? ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                                    : is_space_char(c);
            if (!ok)
                return jj_v_bool(false);
        }
        return jj_v_bool(true);
    }
    jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported string method '%s'", line, m);
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
        jj_fail(e, PD_EINVAL, "line %d: macro '%.*s' nested deeper than %d calls", line,
                (int)macro->name_n, macro->name, MACRO_DEPTH_MAX);
    struct scope *saved = r->sc;
    struct sb *saved_out = r->out;
    struct sb body = {.e = e};
    r->sc = &sc;
    r->out = &body;
    const struct node *params = macro->a;
    if (a->npos > params->n)
        jj_fail(e, PD_EINVAL, "line %d: macro '%.*s' takes %zu arguments", line, (int)macro->name_n,
                macro->name, params->n);
    for (size_t i = 0; i < params->n; i++) {
        const struct node *p = params->list[i];
        struct jv v = i < a->npos ? a->pos[i] : jj_v_undef();
        for (size_t k = 0; k < a->nkw; k++)
            if (a->kw_n[k] == p->name_n && !memcmp(a->kw[k], p->name, p->name_n))
                v = a->kwv[k];
        if (v.k == V_UNDEF && p->a)
            v = jj_eval(r, p->a);
        jj_set_var(r, p->name, p->name_n, v);
    }
    jj_exec(r, macro->b);
    r->sc = saved;
    r->out = saved_out;
    r->macro_depth--;
    return jj_sb_val(&body);
}

/* An int argument as is, a float (or bool) converted (to_int) */
static int64_t int_arg(struct rt *r, struct jv v, int line) {
    return v.k == V_INT ? v.u.i : jj_to_int(r->e, jj_num(r, v, line), line);
}

struct jv jj_call(struct rt *r, const struct node *n) {
    struct env *e = r->e;
    struct jv f = jj_eval(r, n->a);
    struct args a;
    eval_args(r, n, 0, &a);
    if (f.k != V_FUNC) {
        if (n->a->k == E_NAME)
            jj_fail(e, f.k == V_UNDEF ? PD_EUNSUPPORTED : PD_EINVAL,
                    "line %d: unsupported construct: '%.*s' is not a known function", n->line,
                    (int)n->a->name_n, n->a->name);
        if (n->a->k == E_ATTR)
            jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported method '%.*s'", n->line,
                    (int)n->a->name_n, n->a->name);
        jj_fail(e, PD_EINVAL, "line %d: '%s' object is not callable", n->line, jj_type_name(f));
    }
    if (f.u.fn->macro)
        return call_macro(r, f.u.fn->macro, &a, n->line);
    if (f.u.fn->self)
        return call_method(r, *f.u.fn->self, f.u.fn->name, &a, n->line);
    const char *name = f.u.fn->name;
    if (!strcmp(name, "raise_exception")) {
        struct jv msg = jj_to_str(r, arg(&a, 0, "message", jj_v_cstr("")));
        jj_fail(e, PD_EINVAL, "%.*s", (int)msg.u.s.n, msg.u.s.p);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        struct jv ns = jj_v_dict(e, name[0] == 'n' ? V_NS : V_DICT);
        if (a.npos == 1 && (a.pos[0].k == V_DICT || a.pos[0].k == V_NS))
            for (size_t i = 0; i < a.pos[0].u.d->n; i++)
                jj_dict_set(e, ns.u.d, a.pos[0].u.d->k[i], a.pos[0].u.d->v[i]);
        for (size_t i = 0; i < a.nkw; i++)
            jj_dict_set(e, ns.u.d, jj_v_str(a.kw[i], a.kw_n[i]), a.kwv[i]);
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
            jj_fail(e, PD_EINVAL, "line %d: range() needs arguments", n->line);
        }
        if (step == 0)
            jj_fail(e, PD_EINVAL, "line %d: range() step is zero", n->line);
        struct jv l = jj_v_list(e);
        for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
            if (l.u.l->n > 1000000)
                jj_fail(e, PD_ERANGE, "line %d: range() too long", n->line);
            jj_list_push(e, l.u.l, jj_v_int(i));
            if (__builtin_add_overflow(i, step, &i))
                break; /* past int64: past hi too */
        }
        return l;
    }
    if (!strcmp(name, "strftime_now")) {
        struct jv fmt = arg(&a, 0, "format", jj_v_cstr(""));
        if (fmt.k != V_STR)
            jj_fail(e, PD_EINVAL, "line %d: strftime_now() needs a format string", n->line);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        char *f2 = jj_astrndup(e, fmt.u.s.p, fmt.u.s.n);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral" /* the template chooses the format */
        size_t len = strftime(buf, sizeof(buf), f2, &tm);
#pragma GCC diagnostic pop
        return jj_v_str(jj_astrndup(e, buf, len), len);
    }
    jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported function '%s'", n->line, name);
}

struct jv jj_apply_filter(struct rt *r, const struct node *n, struct jv v) {
    struct env *e = r->e;
    struct args a;
    eval_args(r, n, 0, &a);
    char name[32];
    snprintf(name, sizeof(name), "%.*s", (int)n->name_n, n->name);
    int line = n->line;
    struct jv none = jj_v_undef();
    if (!strcmp(name, "trim")) {
        struct jv s = jj_to_str(r, v);
        return strip_chars(s, arg(&a, 0, "chars", none), true, true);
    }
    if (!strcmp(name, "tojson")) {
        struct jv ind = arg(&a, 0, "indent", jj_v_none());
        int indent = ind.k == V_INT ? (int)ind.u.i : -1;
        struct jv seps = arg(&a, 1, "separators", jj_v_none());
        const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
        if (seps.k == V_LIST && seps.u.l->n == 2 && seps.u.l->v[0].k == V_STR &&
            seps.u.l->v[1].k == V_STR) {
            item_sep = jj_astrndup(e, seps.u.l->v[0].u.s.p, seps.u.l->v[0].u.s.n);
            key_sep = jj_astrndup(e, seps.u.l->v[1].u.s.p, seps.u.l->v[1].u.s.n);
        }
        bool sort = jj_truthy(arg(&a, 2, "sort_keys", jj_v_bool(false)));
        struct sb b = {.e = e};
        jj_put_json(e, &b, v, indent, 0, item_sep, key_sep, sort);
        return jj_sb_val(&b);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v.k == V_STR) {
            int64_t c = 0;
            for (size_t i = 0; i < v.u.s.n; i++)
                c += ((unsigned char)v.u.s.p[i] & 0xC0) != 0x80;
            return jj_v_int(c);
        }
        if (v.k == V_LIST)
            return jj_v_int((int64_t)v.u.l->n);
        if (v.k == V_DICT || v.k == V_NS)
            return jj_v_int((int64_t)v.u.d->n);
        if (v.k == V_UNDEF)
            return jj_v_int(0);
        jj_fail(e, PD_EINVAL, "line %d: object of type '%s' has no len()", line, jj_type_name(v));
    }
    if (!strcmp(name, "string"))
        return jj_to_str(r, v);
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize")) {
        struct args none_args = {0};
        struct jv s = jj_to_str(r, v);
        if (!strcmp(name, "capitalize")) { /* first upper, rest lower */
            struct jv low = call_method(r, s, "lower", &none_args, line);
            char *o = jj_astrndup(e, low.u.s.p, low.u.s.n);
            if (low.u.s.n && o[0] >= 'a' && o[0] <= 'z')
                o[0] = (char)(o[0] - 32);
            return jj_v_str(o, low.u.s.n);
        }
        return call_method(r, s, name, &none_args, line);
    }
    if (!strcmp(name, "replace")) {
        struct jv s = jj_to_str(r, v);
        return call_method(r, s, "replace", &a, line);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        bool boolean = jj_truthy(arg(&a, 1, "boolean", jj_v_bool(false)));
        if (v.k == V_UNDEF || (boolean && !jj_truthy(v)))
            return arg(&a, 0, "default_value", jj_v_cstr(""));
        return v;
    }
    if (!strcmp(name, "join")) {
        struct jv l = jj_list_of(r, v, line);
        struct jv sep = arg(&a, 0, "d", jj_v_cstr(""));
        struct jv attr = arg(&a, 1, "attribute", jj_v_undef());
        struct sb b = {.e = e};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i)
                jj_put_str(&b, sep);
            struct jv x = l.u.l->v[i];
            if (attr.k == V_STR)
                x = jj_get_item(r, x, attr, line);
            jj_put_str(&b, x);
        }
        return jj_sb_val(&b);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        struct jv l = jj_list_of(r, v, line);
        if (!l.u.l->n)
            return jj_v_undef();
        return l.u.l->v[name[0] == 'f' ? 0 : l.u.l->n - 1];
    }
    if (!strcmp(name, "list"))
        return jj_list_of(r, v, line);
    if (!strcmp(name, "reverse")) {
        if (v.k == V_STR) {
            struct jv l = jj_list_of(r, v, line);
            struct sb b = {.e = e};
            for (size_t i = l.u.l->n; i-- > 0;)
                jj_put_str(&b, l.u.l->v[i]);
            return jj_sb_val(&b);
        }
        struct jv l = jj_list_of(r, v, line), out = jj_v_list(e);
        for (size_t i = l.u.l->n; i-- > 0;)
            jj_list_push(e, out.u.l, l.u.l->v[i]);
        return out;
    }
    if (!strcmp(name, "items")) {
        if (v.k != V_DICT)
            jj_fail(e, PD_EINVAL, "line %d: items needs a mapping", line);
        struct args none_args = {0};
        return call_method(r, v, "items", &none_args, line);
    }
    if (!strcmp(name, "int")) {
        if (v.k == V_INT)
            return v;
        if (v.k == V_FLOAT)
            return jj_v_int(jj_to_int(e, v.u.f, n->line));
        if (v.k == V_BOOL)
            return jj_v_int(v.u.b);
        if (v.k == V_STR) {
            char *s = jj_astrndup(e, v.u.s.p, v.u.s.n), *end;
            long long x = strtoll(s, &end, 10);
            if (end != s && *end == '\0')
                return jj_v_int(x);
            double d = strtod(s, &end);
            if (end != s && *end == '\0')
                return jj_v_int(jj_to_int(e, d, n->line));
        }
        return arg(&a, 0, "default", jj_v_int(0));
    }
    if (!strcmp(name, "float")) {
        if (v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL)
            return jj_v_float(jj_num(r, v, line));
        if (v.k == V_STR) {
            char *s = jj_astrndup(e, v.u.s.p, v.u.s.n), *end;
            double d = strtod(s, &end);
            if (end != s && *end == '\0')
                return jj_v_float(d);
        }
        return arg(&a, 0, "default", jj_v_float(0.0));
    }
    if (!strcmp(name, "abs")) {
        if (v.k == V_INT)
            return jj_v_int(v.u.i < 0 ? -v.u.i : v.u.i);
        return jj_v_float(fabs(jj_num(r, v, line)));
    }
    if (!strcmp(name, "safe") || !strcmp(name, "e") || !strcmp(name, "escape")) {
        if (name[0] == 's')
            return v;
        struct jv s = jj_to_str(r, v);
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
                jj_sb_puts(&b, rep);
            else
                jj_sb_put(&b, &c, 1);
        }
        return jj_sb_val(&b);
    }
    if (!strcmp(name, "indent")) {
        struct jv s = jj_to_str(r, v);
        struct jv w = arg(&a, 0, "width", jj_v_int(4));
        bool first = jj_truthy(arg(&a, 1, "first", jj_v_bool(false)));
        bool blank = jj_truthy(arg(&a, 2, "blank", jj_v_bool(false)));
        struct sb pad = {.e = e};
        if (w.k == V_STR)
            jj_sb_put(&pad, w.u.s.p, w.u.s.n);
        else
            for (int64_t i = 0, width = jj_to_int(e, jj_num(r, w, line), line); i < width; i++)
                if (i >= 4096)
                    jj_fail(e, PD_ERANGE, "line %d: indent of %" PRId64 " spaces", line, width);
                else
                    jj_sb_puts(&pad, " ");
        struct sb b = {.e = e};
        size_t start = 0;
        bool first_line = true;
        for (size_t i = 0; i <= s.u.s.n; i++) {
            if (i == s.u.s.n || s.u.s.p[i] == '\n') {
                size_t len = i - start;
                bool do_pad = first_line ? first : (blank || len > 0);
                if (do_pad && pad.n)
                    jj_sb_put(&b, pad.p, pad.n);
                jj_sb_put(&b, s.u.s.p + start, len);
                if (i < s.u.s.n)
                    jj_sb_puts(&b, "\n");
                start = i + 1;
                first_line = false;
            }
        }
        return jj_sb_val(&b);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "map") ||
        !strcmp(name, "select") || !strcmp(name, "reject") || !strcmp(name, "unique") ||
        !strcmp(name, "sort") || !strcmp(name, "sum") || !strcmp(name, "min") ||
        !strcmp(name, "max")) {
        struct jv l = jj_list_of(r, v, line), out = jj_v_list(e);
        bool is_map = !strcmp(name, "map");
        if (is_map) {
            struct jv attr = arg(&a, 99, "attribute", jj_v_undef());
            if (attr.k != V_STR) {
                /* map('filter_name') */
                if (a.npos < 1 || a.pos[0].k != V_STR)
                    jj_fail(e, PD_EUNSUPPORTED, "line %d: map() without attribute=", line);
                struct node fake = *n;
                fake.name = a.pos[0].u.s.p;
                fake.name_n = a.pos[0].u.s.n;
                fake.n = 0; /* extra filter arguments are not supported */
                if (a.npos > 1)
                    jj_fail(e, PD_EUNSUPPORTED, "line %d: map() with filter arguments", line);
                for (size_t i = 0; i < l.u.l->n; i++)
                    jj_list_push(e, out.u.l, jj_apply_filter(r, &fake, l.u.l->v[i]));
                return out;
            }
            struct jv dflt = arg(&a, 99, "default", jj_v_undef());
            for (size_t i = 0; i < l.u.l->n; i++) {
                struct jv x = jj_get_item(r, l.u.l->v[i], attr, line);
                jj_list_push(e, out.u.l, x.k == V_UNDEF ? dflt : x);
            }
            return out;
        }
        if (!strcmp(name, "unique") || !strcmp(name, "sort") || !strcmp(name, "sum") ||
            !strcmp(name, "min") || !strcmp(name, "max")) {
            struct jv attr = arg(&a, 99, "attribute", jj_v_undef());
            if (!strcmp(name, "unique")) {
                for (size_t i = 0; i < l.u.l->n; i++) {
                    if (!jj_contains(r, out, l.u.l->v[i], line))
                        jj_list_push(e, out.u.l, l.u.l->v[i]);
                }
                return out;
            }
            if (!strcmp(name, "sum")) {
                struct jv acc = arg(&a, 99, "start", jj_v_int(0));
                for (size_t i = 0; i < l.u.l->n; i++) {
                    struct jv x =
                        attr.k == V_STR ? jj_get_item(r, l.u.l->v[i], attr, line) : l.u.l->v[i];
                    struct node plus = {.k = E_BIN, .name = "+", .line = line};
                    acc = jj_binop(r, &plus, acc, x);
                }
                return acc;
            }
            bool rev = jj_truthy(arg(&a, 0, "reverse", jj_v_bool(false)));
            for (size_t i = 0; i < l.u.l->n; i++)
                jj_list_push(e, out.u.l, l.u.l->v[i]);
            for (size_t i = 1; i < out.u.l->n; i++) { /* stable insertion sort */
                struct jv x = out.u.l->v[i];
                size_t j = i;
                while (j > 0) {
                    struct jv pa = out.u.l->v[j - 1], pb = x;
                    if (attr.k == V_STR) {
                        pa = jj_get_item(r, pa, attr, line);
                        pb = jj_get_item(r, pb, attr, line);
                    }
                    int c = jj_cmp_values(r, pa, pb, line);
                    if (rev ? c >= 0 : c <= 0)
                        break;
                    out.u.l->v[j] = out.u.l->v[j - 1];
                    j--;
                }
                out.u.l->v[j] = x;
            }
            if (!strcmp(name, "min") || !strcmp(name, "max")) {
                if (!out.u.l->n)
                    return jj_v_undef();
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
                    jj_fail(e, PD_EINVAL, "line %d: %s needs an attribute name", line, name);
                subject = jj_get_item(r, x, a.pos[0], line);
            }
            bool ok;
            if (a.npos <= test_arg) {
                ok = jj_truthy(subject);
            } else {
                if (a.pos[test_arg].k != V_STR)
                    jj_fail(e, PD_EINVAL, "line %d: %s needs a test name", line, name);
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
                ok = jj_truthy(jj_eval(r, &t));
            }
            if (ok != reject)
                jj_list_push(e, out.u.l, x);
        }
        return out;
    }
    jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported filter '%s'", line, name);
}

bool jj_run_test(struct rt *r, const struct node *n, struct jv v) {
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
        int64_t x = jj_to_int(r->e, jj_num(r, v, n->line), n->line);
        return (x % 2 == 0) == (name[0] == 'e');
    }
    if (!strcmp(name, "divisibleby")) {
        int64_t x = jj_to_int(r->e, jj_num(r, v, n->line), n->line),
                d = jj_to_int(r->e, jj_num(r, arg(&a, 0, "num", jj_v_int(1)), n->line), n->line);
        return d != 0 && (d == -1 || x % d == 0); /* INT64_MIN % -1 overflows in C */
    }
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "=="))
        return jj_values_equal(r->e, v, arg(&a, 0, "other", jj_v_undef()));
    if (!strcmp(name, "sameas"))
        return jj_values_same(v, arg(&a, 0, "other", jj_v_undef()));
    if (!strcmp(name, "ne") || !strcmp(name, "!="))
        return !jj_values_equal(r->e, v, arg(&a, 0, "other", jj_v_undef()));
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan"))
        return jj_cmp_values(r, v, arg(&a, 0, "other", jj_v_undef()), n->line) < 0;
    if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan"))
        return jj_cmp_values(r, v, arg(&a, 0, "other", jj_v_undef()), n->line) > 0;
    if (!strcmp(name, "le") || !strcmp(name, "<="))
        return jj_cmp_values(r, v, arg(&a, 0, "other", jj_v_undef()), n->line) <= 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">="))
        return jj_cmp_values(r, v, arg(&a, 0, "other", jj_v_undef()), n->line) >= 0;
    if (!strcmp(name, "in"))
        return jj_contains(r, arg(&a, 0, "seq", jj_v_undef()), v, n->line);
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
    jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported test '%s'", n->line, name);
}
