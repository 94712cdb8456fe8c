/*
 * parse.c — tokens to the AST the compiled template keeps (statements, expressions with Jinja's
 * precedence), nesting bounded by PARSE_DEPTH_MAX; pd_chat_template_new and _free.
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

/* ---------------------------------------------------------------- AST */

/* PARSE_DEPTH_MAX, MACRO_DEPTH_MAX: jinja.h */

struct parser {
    struct env *e;
    struct tok *t;
    size_t pos;
    int depth; /* parse_expr / parse_unary / parse_body frames open */
};

static void enter(struct parser *ps) {
    if (++ps->depth > PARSE_DEPTH_MAX)
        jj_fail(ps->e, PD_EFORMAT, "line %d: template nested deeper than %d", ps->t[ps->pos].line,
                PARSE_DEPTH_MAX);
}

static struct node *mk(struct parser *ps, enum nk k, int line) {
    struct node *n = jj_amalloc(ps->e, sizeof(struct node));
    n->k = k;
    n->line = line;
    return n;
}

static void add_child(struct parser *ps, struct node *p, struct node *c) {
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 4;
        struct node **nl = jj_amalloc(ps->e, nc * sizeof(struct node *));
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
        jj_fail(ps->e, PD_EFORMAT, "line %d: expected '%s', found '%.*s'", t->line, op,
                (int)(t->k == T_EOF ? 3 : t->n),
                t->k == T_EOF ? "end"
                : t->s        ? t->s
                              : "tag");
}
static struct tok *expect_name(struct parser *ps) {
    struct tok *t = next(ps);
    if (t->k != T_NAME)
        jj_fail(ps->e, PD_EFORMAT, "line %d: expected a name", t->line);
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
        jj_sb_put(&b, t->s, t->n);
        /* adjacent string literals concatenate */
        while (peek(ps)->k == T_STRING) {
            struct tok *u = next(ps);
            jj_sb_put(&b, u->s, u->n);
        }
        n->lit = jj_sb_val(&b);
        return n;
    }
    case T_INT:
        n = mk(ps, E_LIT, t->line);
        n->lit = jj_v_int(t->i);
        return n;
    case T_FLOAT:
        n = mk(ps, E_LIT, t->line);
        n->lit = jj_v_float(t->f);
        return n;
    case T_NAME:
        n = mk(ps, E_LIT, t->line);
        if (is_name(t, "true") || is_name(t, "True"))
            n->lit = jj_v_bool(true);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->lit = jj_v_bool(false);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->lit = jj_v_none();
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
    jj_fail(ps->e, PD_EFORMAT, "line %d: unexpected '%.*s' in an expression", t->line,
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
                a->b->lit = jj_v_int(nm->i);
            } else {
                jj_fail(ps->e, PD_EFORMAT, "line %d: expected an attribute name after '.'",
                        t->line);
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
                jj_fail(ps->e, PD_EFORMAT, "line %d: expected a test name after 'is'", t->line);
            }
            f->a = n;
            if (accept_op(ps, "(")) {
                parse_args(ps, f);
            } else {
                /* a test takes one argument without parentheses: `is divisibleby 3`, `is
                 * sameas [1]` (as jinja2: a literal, a name, a list or a dict) */
                struct tok *u = peek(ps);
                if (u->k == T_STRING || u->k == T_INT || u->k == T_FLOAT ||
                    (u->k == T_OP && (is_op(u, "[") || is_op(u, "{"))) ||
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
        jj_fail(ps->e, PD_EFORMAT, "line %d: expected the end of the tag, found '%.*s'", t->line,
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
            n->name2 = jj_astrndup(e, t2->s, t2->n);
        }
        if (!accept_name(ps, "in"))
            jj_fail(e, PD_EFORMAT, "line %d: expected 'in' in a for loop", line);
        n->a = parse_or(ps); /* not parse_expr: `if` here filters the loop */
        if (accept_name(ps, "if"))
            n->d = parse_or(ps);
        if (accept_name(ps, "recursive"))
            jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported construct 'for ... recursive'", line);
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
            jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported construct 'set a, b = ...'", line);
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
    jj_fail(e, PD_EUNSUPPORTED, "line %d: unsupported construct '{%% %.*s %%}'", line, (int)kw->n,
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
                jj_fail(ps->e, PD_EFORMAT, "line %d: missing {%% %s %%}", t->line, ends[last]);
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
                jj_fail(ps->e, PD_EFORMAT, "line %d: expected '}}'", end->line);
            add_child(ps, blk, n);
            break;
        }
        case T_BLOCK_BEGIN: {
            struct tok *kw = next(ps);
            if (kw->k != T_NAME)
                jj_fail(ps->e, PD_EFORMAT, "line %d: expected a tag name after '{%%'", kw->line);
            for (size_t i = 0; ends && ends[i]; i++) {
                if (is_name(kw, ends[i])) {
                    *which = ends[i];
                    return blk;
                }
            }
            if (is_name(kw, "endif") || is_name(kw, "endfor") || is_name(kw, "else") ||
                is_name(kw, "elif") || is_name(kw, "endset") || is_name(kw, "endmacro"))
                jj_fail(ps->e, PD_EFORMAT, "line %d: unexpected {%% %.*s %%}", kw->line, (int)kw->n,
                        kw->s);
            add_child(ps, blk, parse_stmt(ps, kw));
            break;
        }
        default: jj_fail(ps->e, PD_EFORMAT, "line %d: unexpected token", t->line);
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
    jj_lex(&lx);
    struct parser ps = {.e = &e, .t = lx.toks};
    t->root = parse_body(&ps, NULL, NULL);
    *out = t;
    return PD_OK;
}

void pd_chat_template_free(struct pd_chat_template *t) {
    if (!t)
        return;
    jj_arena_free(&t->arena);
    pd_free(t);
}
