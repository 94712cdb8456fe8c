/* Chat templates: renders byte-identical to transformers' apply_chat_template on the committed
 * fixtures, Jinja semantics the templates rely on, and errors that name what went wrong. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "model/jinja/chat_template.h"
#include "model/tokenizer/tokenizer.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p)
        p[n] = '\0';
    return p;
}

static void test_fixture_renders(void) {
    static const char *const names[] = {"qwen2", "llama3", "llama2", "mistral"};
    char *convs_text = slurp(PD_FIXTURES_DIR "/chat_conversations.json");
    cJSON *convs = cJSON_Parse(convs_text);
    free(convs_text);
    CHECK(cJSON_IsArray(convs));
    int total = 0, same = 0;
    for (size_t f = 0; f < PD_ARRAY_LEN(names); f++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/tokenizers/%s", PD_FIXTURES_DIR, names[f]);
        struct pd_tokenizer *tok = NULL;
        CHECK_OK(pd_tokenizer_new(path, &tok));
        if (!tok)
            continue;
        struct pd_chat_template *t = NULL;
        CHECK_OK(pd_chat_template_new(pd_tokenizer_chat_template(tok), &t));
        snprintf(path, sizeof(path), "%s/tokenizers/%s/chat.jsonl", PD_FIXTURES_DIR, names[f]);
        char *gold = slurp(path);
        for (char *line = strtok(gold, "\n"); line && t; line = strtok(NULL, "\n")) {
            cJSON *g = cJSON_Parse(line);
            int ci = cJSON_GetObjectItem(g, "conversation")->valueint;
            struct pd_chat_args args = {
                .messages = cJSON_GetArrayItem(convs, ci),
                .add_generation_prompt =
                    cJSON_IsTrue(cJSON_GetObjectItem(g, "add_generation_prompt")),
                .bos_token = pd_tokenizer_bos_token(tok),
                .eos_token = pd_tokenizer_eos_token(tok),
            };
            char *out = NULL;
            pd_error_clear();
            int rc = pd_chat_template_render(t, &args, &out, NULL);
            const cJSON *text = cJSON_GetObjectItem(g, "text");
            const cJSON *err = cJSON_GetObjectItem(g, "error");
            bool ok = text ? rc == PD_OK && strcmp(out, text->valuestring) == 0
                           : rc == PD_EINVAL && strstr(pd_error_msg(), err->valuestring);
            total++;
            same += ok;
            pd_test_checks++;
            if (!ok) {
                pd_test_failures++;
                fprintf(stderr, "%s conversation %d gen=%d: rc %d %s\n got: [%s]\nwant: [%s]\n",
                        names[f], ci, args.add_generation_prompt, rc, pd_error_msg(),
                        out ? out : "", text ? text->valuestring : err->valuestring);
            }
            pd_free(out);
            cJSON_Delete(g);
        }
        free(gold);
        pd_chat_template_free(t);
        pd_tokenizer_free(tok);
    }
    fprintf(stderr, "chat renders identical to transformers: %d/%d\n", same, total);
    cJSON_Delete(convs);
}

/* Renders src with messages = [{"role": "user", "content": "hi"}] and extra variables. */
static char *render(const char *src, const char *extra_json, int *rc) {
    struct pd_chat_template *t = NULL;
    char *out = NULL;
    pd_error_clear();
    *rc = pd_chat_template_new(src, &t);
    if (*rc != PD_OK)
        return NULL;
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    cJSON *extra = extra_json ? cJSON_Parse(extra_json) : NULL;
    struct pd_chat_args args = {.messages = msgs, .bos_token = "<s>", .extra = extra};
    *rc = pd_chat_template_render(t, &args, &out, NULL);
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    pd_chat_template_free(t);
    return out;
}

static void expect(const char *src, const char *extra, const char *want) {
    int rc;
    char *out = render(src, extra, &rc);
    pd_test_checks++;
    if (rc != PD_OK || strcmp(out, want) != 0) {
        pd_test_failures++;
        fprintf(stderr, "template %s\n  got [%s] (rc %d %s)\n want [%s]\n", src, out ? out : "", rc,
                pd_error_msg(), want);
    }
    pd_free(out);
}

static void expect_err(const char *src, int code, const char *needle) {
    int rc;
    char *out = render(src, NULL, &rc);
    pd_test_checks++;
    if (rc != code || !strstr(pd_error_msg(), needle)) {
        pd_test_failures++;
        fprintf(stderr, "template %s\n  want error %d containing \"%s\", got %d \"%s\"\n", src,
                code, needle, rc, pd_error_msg());
    }
    pd_free(out);
}

/* Expected outputs below were produced by jinja2 3.1.6 with trim_blocks and lstrip_blocks, as
 * transformers renders. */
static void test_jinja_semantics(void) {
    expect("{{ bos_token }}{{ messages[0].content | upper }}", NULL, "<s>HI");
    expect("a  {%- if true %} b {% endif -%}  c", NULL, "a b c");
    expect("x\n  {% if true %}\n  y\n  {% endif %}\nz", NULL, "x\n  y\nz");
    expect("{# c #}\n{{ 1 }}", NULL, "1");
    expect("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ "
           "loop.revindex0 }},{% endfor %}",
           NULL, "1TrueFalse2,2FalseFalse1,3FalseTrue0,");
    expect("{% for x in range(6) if x % 2 == 0 %}{{ x }}/{{ loop.length }} {% else %}none{% "
           "endfor %}",
           NULL, "0/3 2/3 4/3 ");
    expect("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", NULL, "empty");
    expect("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% "
           "break %}{% endif %}{{ x }}{% endfor %}",
           NULL, "13");
    expect("{% set ns = namespace(n=0) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% "
           "endfor %}{{ ns.n }}",
           NULL, "6");
    expect("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
    expect("{{ 'a,b,,c'.split(',') }} {{ ' x '.strip() }}|{{ 'abc'[::-1] }}{{ 'abcdef'[1:4] }}",
           NULL, "['a', 'b', '', 'c'] x|cbabcd");
    /* a step past the end of the range stops there (the index must not overflow) */
    expect("{{ 'abc'[1::9223372036854775807] }}|{{ [1, 2, 3][::-9223372036854775807] }}|{{ "
           "'abcd'[-1:0:-9223372036854775807] }}",
           NULL, "b|[3]|d");
    expect("{{ [1, 'a', none, true, 1.5] }} {{ {'k': [1, 2]} }}", NULL,
           "[1, 'a', None, True, 1.5] {'k': [1, 2]}");
    expect("{{ {'b': 1, 'a': [1, 'é', none]} | tojson }}|{{ [1,2] | tojson(indent=2) }}", NULL,
           "{\"b\": 1, \"a\": [1, \"é\", null]}|[\n  1,\n  2\n]");
    expect("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.0 "
           "}} {{ 1e20 }} {{ 0.0001 }}",
           NULL, "3 -4 1 2 3.5 1024 1.0 1e+20 0.0001");
    expect("{{ 'x' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ 'b' in 'abc' }} {{ 2 not in [1, 2] }}", NULL,
           "x1None ababab True False");
    expect("{{ undefined_var }}|{{ undefined_var is defined }}|{{ none is none }}|{{ 'a' is "
           "string }}|{{ messages | length }}",
           NULL, "|False|True|True|1");
    /* sameas is Python's `is`, not == (1 == True, but 1 is not True) */
    expect("{% set ns = namespace(a=1) %}{% set a = [1] %}{% set b = a %}{{ 1 is sameas true }}|{{ "
           "true is sameas true }}|{{ none is sameas none }}|{{ 1 is sameas 1.0 }}|{{ 'a' is "
           "sameas 'a' }}|{{ a is sameas b }}|{{ [1] is sameas [1] }}|{{ x is sameas y }}|{{ 0 "
           "is sameas false }}|{{ 2 is sameas 2 }}|{{ ns is sameas ns }}|{{ messages is sameas "
           "messages }}|{{ messages[0] is sameas messages[0] }}",
           NULL, "False|True|True|False|True|True|False|False|False|True|True|True|True");
    expect("{{ 'yes' if messages else 'no' }} {{ x | default('d') }} {{ '' or 'e' }}", NULL,
           "yes d e");
    expect("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | "
           "join(', ') }}",
           NULL, "hi");
    expect("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", NULL,
           "[1B][23]");
    expect("{% set s %}in{{ 1 }}{% endset %}{{ s }}", NULL, "in1");
    expect("{% raw %}{{ not }}{% endraw %}", NULL, "{{ not }}");
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL,
           "a=1;b=2;");
    expect("{{ enable_thinking }}", "{\"enable_thinking\": false}", "False");
    expect("{{ '<think>\\nx</think>\\n\\ny'.split('</think>')[-1].lstrip('\\n') }}", NULL, "y");
    expect("{{ messages[-1]['content'].startswith('h') and 'ok' }}", NULL, "ok");
    expect("{{ '  a\\n b ' | trim }}|{{ [3, 1, 2] | sort | list }}|{{ [1, 2] | first }}", NULL,
           "a\n b|[1, 2, 3]|1");
}

/* n levels of open (e.g. "(") around inner, closed by close; heap */
static char *nest(const char *open, const char *inner, const char *close, int n) {
    size_t lo = strlen(open), li = strlen(inner), lc = strlen(close);
    char *s = pd_malloc(n * (lo + lc) + li + 1), *p = s;
    CHECK(s != NULL);
    for (int i = 0; i < n; i++, p += lo)
        memcpy(p, open, lo);
    memcpy(p, inner, li);
    p += li;
    for (int i = 0; i < n; i++, p += lc)
        memcpy(p, close, lc);
    *p = '\0';
    return s;
}

/* Nesting past the parser's limit is a format error, not a stack overflow; normal depths work. */
static void test_deep_nesting(void) {
    char *s = nest("(", "1", ")", 100000);
    char *t = pd_malloc(strlen(s) + 8);
    CHECK(t != NULL);
    sprintf(t, "{{ %s }}", s);
    expect_err(t, PD_EFORMAT, "nested deeper than 64");
    pd_free(t);
    pd_free(s);
    s = nest("{% if true %}", "x", "{% endif %}", 5000);
    expect_err(s, PD_EFORMAT, "nested deeper than 64");
    pd_free(s);
    s = nest("-", "1", "", 100000);
    t = pd_malloc(strlen(s) + 8);
    CHECK(t != NULL);
    sprintf(t, "{{ %s }}", s);
    expect_err(t, PD_EFORMAT, "nested deeper than 64");
    pd_free(t);
    pd_free(s);
    s = nest("{% if true %}[", "x", "]{% endif %}", 20);
    t = nest("[", "x", "]", 20);
    expect(s, NULL, t);
    pd_free(t);
    pd_free(s);
    s = nest("(", "1", ")", 20);
    t = pd_malloc(strlen(s) + 8);
    CHECK(t != NULL);
    sprintf(t, "{{ %s }}", s);
    expect(t, NULL, "1");
    pd_free(t);
    pd_free(s);
}

/* ns.a and ns.b: [] wrapped in wraps more lists each, then tail */
static void deep_src(char *src, size_t n, int wraps, const char *tail) {
    snprintf(src, n,
             "{%% set ns = namespace(a=[], b=[]) %%}{%% for i in range(%d) %%}{%% set ns.a = "
             "[ns.a] %%}{%% set ns.b = [ns.b] %%}{%% endfor %%}%s",
             wraps, tail);
}

static void test_errors(void) {
    expect_err("{{ raise_exception('Roles must alternate!') }}", PD_EINVAL,
               "Roles must alternate!");
    expect_err("{% include 'x.jinja' %}", PD_EUNSUPPORTED,
               "line 1: unsupported construct '{% include %}'");
    expect_err("\n{{ x | frobnicate }}", PD_EUNSUPPORTED,
               "line 2: unsupported filter 'frobnicate'");
    expect_err("{{ x is prime }}", PD_EUNSUPPORTED, "unsupported test 'prime'");
    expect_err("{{ 'a'.zfill(3) }}", PD_EUNSUPPORTED, "unsupported method 'zfill'");
    expect_err("{% if true %}x", PD_EFORMAT, "missing {% endif %}");
    expect_err("{{ 1 + }}", PD_EFORMAT, "line 1");
    expect_err("{{ 'a' + 1 }}", PD_EINVAL, "unsupported operand types for +: 'str' and 'int'");
    expect_err("{{ x.y }}", PD_EINVAL, "'y' of an undefined value");
    /* found by tests/fuzz/fuzz_chat_template: these overflowed the stack */
    expect_err("{% macro f(a) %}{{ f(a) }}{% endmacro %}{{ f(1) }}", PD_EINVAL,
               "line 1: macro 'f' nested deeper than 32 calls");
    expect_err("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
               PD_EINVAL, "nested deeper than 32 calls");
    expect("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
           NULL, "321");
    test_deep_nesting();
    /* found by fuzz_chat_template: int64 overflow and float-to-int conversions were UB, and
     * nothing bounded what a template may build */
    expect_err("{{ 9223372036854775807 + 1 }}", PD_ERANGE, "line 1: integer overflow in +");
    expect_err("{{ -9223372036854775807 - 2 }}", PD_ERANGE, "integer overflow in -");
    expect_err("{{ 4294967296 * 4294967296 }}", PD_ERANGE, "integer overflow in *");
    expect_err("{{ 2 ** 64 }}", PD_ERANGE, "integer overflow in **");
    expect_err("{{ 1e300 | int }}", PD_ERANGE, "does not fit a 64-bit integer");
    expect_err("{% for i in range(1e300) %}{% endfor %}", PD_ERANGE,
               "does not fit a 64-bit integer");
    expect_err("{{ 'ab' * 1000000000000 }}", PD_ERANGE, "string repeated 1000000000000 times");
    /* an empty string repeated 10^12 times is empty at once (it looped 10^12 times: the fuzzer's
     * timeout), and repetition keeps its text */
    expect(
        "{{ '' * 1000000000000 }}|{{ -21 * 'ab' * 674407185477 }}|{{ 'ab' * 3 }}|{{ 2 * 'xyz' }}",
        NULL, "||ababab|xyzxyz");
    expect_err("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s "
               "%}{% endfor %}{{ ns.s | length }}",
               PD_ERANGE, "template needs more than 256 MiB");
    /* found by fuzz_chat_template: a namespace holding itself printed itself without end (a
     * stack overflow), and nothing bounded how deep a loop may nest a value; outputs as jinja2
     * 3.1.6 gives them */
    const char *ns = "{% set ns = namespace(a=1) %}";
    char src[512];
    snprintf(src, sizeof(src), "%s{%% set ns.a = ns %%}{{ ns.a }}|{{ ns.a == ns }}", ns);
    expect(src, NULL, "<Namespace {'a': <Namespace {...}>}>|True");
    snprintf(src, sizeof(src), "%s{%% set ns.a = [ns, 2] %%}{{ ns }}|{{ ns.a == ns.a }}", ns);
    expect(src, NULL, "<Namespace {'a': [<Namespace {...}>, 2]}>|True");
    snprintf(src, sizeof(src), "%s{%% set ns.a = {'k': ns} %%}{{ ns.a }}", ns);
    expect(src, NULL, "{'k': <Namespace {'a': {...}}>}");
    snprintf(src, sizeof(src), "%s{%% set ns.a = ns %%}{{ ns | tojson }}", ns);
    expect_err(src, PD_EINVAL, "tojson: Object of type Namespace is not JSON serializable");
    /* 999 wraps around []: 1000 lists, the most a walk takes */
    deep_src(src, sizeof(src), 999,
             "{{ (ns.a | string) | length }} {{ (ns.a | tojson) | length }} {{ ns.a == ns.b }}");
    expect(src, NULL, "2000 2000 True");
    deep_src(src, sizeof(src), 3000, "{{ ns.a | length }} {{ ns.a == ns.a }}");
    expect(src, NULL, "1 True");
    deep_src(src, sizeof(src), 1000, "{{ ns.a }}");
    expect_err(src, PD_ERANGE, "printing: a value nested deeper than 1000 lists");
    deep_src(src, sizeof(src), 1000, "{{ ns.a | tojson }}");
    expect_err(src, PD_ERANGE, "tojson: a value nested deeper than 1000");
    deep_src(src, sizeof(src), 3000, "{{ ns.a == ns.b }}");
    expect_err(src, PD_ERANGE, "==: a value nested deeper than 1000");
    deep_src(src, sizeof(src), 3000, "{{ ns.a in [ns.b] }}");
    expect_err(src, PD_ERANGE, "==: a value nested deeper than 1000");
    expect("{{ range(9223372036854775800, 9223372036854775807, 5) | list }}", NULL,
           "[9223372036854775800, 9223372036854775805]");
    expect("{{ 2 ** 62 }} {{ 9223372036854775806 + 1 }} {{ -7 % -1 }}", NULL,
           "4611686018427387904 9223372036854775807 0");
}

static void test_alloc_failures(void) {
    const char *src = "{% for m in messages %}{{ m.role | upper }}:{{ m.content }}{% endfor %}";
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    bool done = false;
    for (long k = 0; k < 200 && !done; k++) {
        struct pd_chat_template *t = NULL;
        char *out = NULL;
        pd_alloc_fail_after(k);
        int rc = pd_chat_template_new(src, &t);
        if (rc == PD_OK) {
            struct pd_chat_args args = {.messages = msgs};
            rc = pd_chat_template_render(t, &args, &out, NULL);
        }
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        if (rc == PD_OK) {
            CHECK_STR(out, "USER:hi");
            done = true;
        }
        pd_free(out);
        pd_chat_template_free(t);
    }
    CHECK(done);
    cJSON_Delete(msgs);
}

PD_TEST_MAIN(PD_TEST(test_fixture_renders), PD_TEST(test_jinja_semantics), PD_TEST(test_errors),
             PD_TEST(test_alloc_failures))
