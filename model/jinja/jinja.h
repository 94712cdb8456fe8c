/*
 * jinja.h — the insides of model/jinja/, a small Jinja interpreter: lexer (with Jinja's whitespace
 * rules), parser to an AST kept by the compiled template, and a tree-walking renderer.
 *
 * Memory: the AST lives in the template's arena; every value made while rendering lives in a
 * per-render arena freed at once when the render ends, so values need no ownership rules.
 * Errors (syntax, unsupported construct, raise_exception, type errors, out of memory) longjmp
 * back to the one entry point, which frees the arena and returns the status: an interpreter
 * checking a status after every sub-expression would bury the semantics that must match Jinja.
 * Values follow Python: str() of None is "None", lists print as ['a', 1], + does not coerce,
 * undefined prints as "" and is falsy (transformers uses Jinja's default Undefined).
 *
 * Files: value.c (arena, errors, values, string builder, printing), lex.c, parse.c (the AST,
 * pd_chat_template_new), render.c (evaluation, statements, pd_chat_template_render) and
 * builtins.c (calls, methods, filters, tests). What they share is declared here, with the jj_
 * prefix; everything else stays static in its file. Internal to model/jinja/.
 */
#ifndef PD_JINJA_H
#define PD_JINJA_H

#include "model/jinja/chat_template.h"

#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

struct sb {
    struct env *e;
    char *p;
    size_t n, cap;
};

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
/* Lists, dicts and namespaces inside each other that printing, tojson and == walk: a namespace
 * attribute set in a loop nests a value one level more each time. cJSON parses a client's JSON
 * to 1000 levels (CJSON_NESTING_LIMIT), so what a request brings always fits. */
#define VALUE_DEPTH_MAX 1000

struct pd_chat_template {
    struct arena arena;
    struct node *root;
};

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

/* Evaluated call arguments: positional and keyword. */
struct args {
    struct jv pos[8];
    size_t npos;
    const char *kw[8];
    size_t kw_n[8];
    struct jv kwv[8];
    size_t nkw;
};

/* value.c: the arena, errors, values, the string builder and printing */
/* n zeroed bytes of the arena (16-aligned); past ARENA_MAX or out of memory: jj_fail */
void *jj_amalloc(struct env *e, size_t n);
void jj_arena_free(struct arena *a);
char *jj_astrndup(struct env *e, const char *s, size_t n);
struct jv *jj_dict_find(struct jdict *d, const char *key, size_t n);
void jj_dict_set(struct env *e, struct jdict *d, struct jv key, struct jv val);
/* Records "chat template: <message>" as the thread's error and longjmps to the entry point. */
_Noreturn void jj_fail(struct env *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A JSON value (messages, tools, extra arguments) as a template value. */
struct jv jj_from_json(struct env *e, const cJSON *j);
void jj_list_push(struct env *e, struct jlist *l, struct jv x);
void jj_put_json(struct env *e, struct sb *b, struct jv v, int indent, int depth,
                 const char *item_sep, const char *key_sep, bool sort_keys);
void jj_put_str(struct sb *b, struct jv v);
void jj_sb_put(struct sb *b, const char *s, size_t n);
void jj_sb_puts(struct sb *b, const char *s);
struct jv jj_sb_val(struct sb *b);
int64_t jj_to_int(struct env *e, double f, int line);
bool jj_truthy(struct jv v);
const char *jj_type_name(struct jv v);
struct jv jj_v_bool(bool b);
struct jv jj_v_cstr(const char *p);
struct jv jj_v_dict(struct env *e, enum vk k);
struct jv jj_v_float(double f);
struct jv jj_v_int(int64_t i);
struct jv jj_v_list(struct env *e);
struct jv jj_v_none(void);
struct jv jj_v_str(const char *p, size_t n);
struct jv jj_v_undef(void);
bool jj_values_equal(struct env *e, struct jv a, struct jv b);
bool jj_values_same(struct jv a, struct jv b); /* `is sameas` */

/* lex.c: the lexer */
void jj_lex(struct lexer *lx);

/* render.c: evaluation */
struct jv jj_binop(struct rt *r, const struct node *n, struct jv a, struct jv b);
int jj_cmp_values(struct rt *r, struct jv a, struct jv b, int line);
bool jj_contains(struct rt *r, struct jv hay, struct jv needle, int line);
/* An expression's value; a statement's effect (FLOW_BREAK / FLOW_CONTINUE inside loops). */
struct jv jj_eval(struct rt *r, const struct node *n);
enum flow jj_exec(struct rt *r, const struct node *n);
struct jv jj_get_item(struct rt *r, struct jv obj, struct jv key, int line);
double jj_num(struct rt *r, struct jv v, int line);
void jj_set_var(struct rt *r, const char *name, size_t n, struct jv v);
struct jv jj_to_str(struct rt *r, struct jv v);

/* builtins.c: calls, methods, filters and tests */
struct jv jj_apply_filter(struct rt *r, const struct node *n, struct jv v);
/* A call node: a global function, a bound method or a macro. */
struct jv jj_call(struct rt *r, const struct node *n);
struct jv jj_list_of(struct rt *r, struct jv v, int line);
bool jj_run_test(struct rt *r, const struct node *n, struct jv v);

#endif
