/* The bootstrap rewrite of generation bodies: the three fields and rid are added with the
 * prefill's host and port, rooms in [0, 2^63) printed exactly, arrays for batches, the client's
 * bytes kept, the client's own bootstrap fields replaced, its rid kept, bad bodies refused; for a
 * decode alone (local prefill) no bootstrap fields, the rid still added; the prompt estimate. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/base/api_wire.h"
#include "router/body.h"
#include "router/prompt_size.h"
#include "router/config.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>

static struct pd_router_rng rng;

static cJSON *rewrite(int route, const char *body, const char *host, int port,
                      struct pd_router_body_info *info, char **text) {
    size_t len = 0;
    int rc = pd_router_body_rewrite(route, PD_API_MAX_N, body, strlen(body), host, port, &rng, text,
                                    &len, info);
    CHECK_OK(rc);
    if (rc)
        return NULL;
    CHECK_INT(len, strlen(*text));
    cJSON *j = cJSON_Parse(*text);
    CHECK(j != NULL);
    return j;
}

/* The room printed in text must be exactly `room` (no double rounding). */
static void check_room_text(const char *text, uint64_t room) {
    char want[64];
    snprintf(want, sizeof(want), "\"bootstrap_room\":%" PRIu64, room);
    CHECK(strstr(text, want) != NULL);
}

static void test_single(void) {
    struct pd_router_body_info info;
    char *text;
    const char *body = " {\"text\":\"hi\",\"seed\":18446744073709551615,\"stream\":true}";
    cJSON *j = rewrite(PD_ROUTER_ROUTE_GENERATE, body, "10.0.0.1", 9000, &info, &text);
    CHECK_INT(info.n, 1);
    CHECK(!info.batch);
    CHECK(info.stream);
    CHECK(info.rid_added);
    CHECK(info.rooms[0] < (UINT64_C(1) << 63));
    CHECK_STR(cJSON_GetObjectItem(j, "bootstrap_host")->valuestring, "10.0.0.1");
    CHECK_INT(cJSON_GetObjectItem(j, "bootstrap_port")->valueint, 9000);
    char room[24];
    snprintf(room, sizeof(room), "%" PRIu64, info.rooms[0]);
    CHECK_STR(cJSON_GetObjectItem(j, "rid")->valuestring, room);
    CHECK_STR(info.rids[0], room);
    check_room_text(text, info.rooms[0]);
    CHECK(strstr(text, "\"seed\":18446744073709551615") != NULL); /* client bytes kept */
    CHECK_STR(cJSON_GetObjectItem(j, "text")->valuestring, "hi");
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);
}

static void test_null_port_rid_kept_empty_object(void) {
    struct pd_router_body_info info;
    char *text;
    cJSON *j = rewrite(PD_ROUTER_ROUTE_CHAT,
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"rid\":\"mine\"}",
                       "pf", PD_ROUTER_BOOTSTRAP_PORT_NULL, &info, &text);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "bootstrap_port")));
    CHECK(!info.rid_added);
    CHECK_STR(info.rids[0], "mine");
    CHECK_STR(cJSON_GetObjectItem(j, "rid")->valuestring, "mine");
    CHECK(!info.stream);
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);

    j = rewrite(PD_ROUTER_ROUTE_COMPLETIONS, "{}", "h\"q", 1, &info, &text);
    CHECK_STR(cJSON_GetObjectItem(j, "bootstrap_host")->valuestring, "h\"q"); /* escaped */
    CHECK_INT(cJSON_GetArraySize(j), 4);
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);
}

static void test_batches(void) {
    static const struct {
        int route;
        const char *body;
        int n;
    } cases[] = {
        {PD_ROUTER_ROUTE_GENERATE, "{\"text\":[\"a\",\"b\",\"c\"]}", 3},
        {PD_ROUTER_ROUTE_GENERATE, "{\"input_ids\":[[1,2],[3]]}", 2},
        {PD_ROUTER_ROUTE_GENERATE, "{\"input_ids\":[1,2,3]}", 1},
        {PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", 2},
        {PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":[[1],[2],[3],[4]]}", 4},
        {PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":[1,2]}", 1},
        {PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":\"a\"}", 1},
    };
    for (size_t c = 0; c < PD_ARRAY_LEN(cases); c++) {
        struct pd_router_body_info info;
        char *text;
        cJSON *j = rewrite(cases[c].route, cases[c].body, "h", 8998, &info, &text);
        CHECK_INT(info.n, cases[c].n);
        CHECK(info.batch == (cases[c].n > 1));
        cJSON *rooms = cJSON_GetObjectItem(j, "bootstrap_room");
        if (info.batch) {
            CHECK_INT(cJSON_GetArraySize(rooms), info.n);
            CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "bootstrap_host")), info.n);
            CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "bootstrap_port")), info.n);
            CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "rid")), info.n);
            for (int i = 0; i < info.n; i++) {
                char want[24];
                snprintf(want, sizeof(want), "%" PRIu64, info.rooms[i]);
                CHECK(strstr(text, want) != NULL);
                CHECK_STR(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "rid"), i)->valuestring, want);
                for (int k = 0; k < i; k++)
                    CHECK(info.rooms[k] != info.rooms[i]);
            }
        } else {
            CHECK(cJSON_IsNumber(rooms));
            check_room_text(text, info.rooms[0]);
        }
        cJSON_Delete(j);
        pd_free(text);
        pd_router_body_info_free(&info);
    }
}

static void test_client_bootstrap_fields_replaced(void) {
    struct pd_router_body_info info;
    char *text;
    cJSON *j = rewrite(PD_ROUTER_ROUTE_GENERATE,
                       "{\"text\":\"x\",\"bootstrap_room\":5,\"bootstrap_host\":\"evil\"}", "good",
                       7, &info, &text);
    CHECK_STR(cJSON_GetObjectItem(j, "bootstrap_host")->valuestring, "good");
    CHECK(strstr(text, "evil") == NULL);
    CHECK(strstr(text, "\"bootstrap_room\":5,") == NULL);
    check_room_text(text, info.rooms[0]);
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);
}

static void test_refusals(void) {
    struct pd_router_body_info info;
    char *text;
    size_t len;
#define REFUSE(route, body, code, needle)                                                          \
    CHECK_ERR(pd_router_body_rewrite(route, PD_API_MAX_N, body, strlen(body), "h", 1, &rng, &text, \
                                     &len, &info),                                                 \
              code, needle)
    REFUSE(PD_ROUTER_ROUTE_GENERATE, "{\"text\":", PD_EINVAL, "not valid JSON");
    REFUSE(PD_ROUTER_ROUTE_GENERATE, "[1]", PD_EINVAL, "JSON object");
    REFUSE(PD_ROUTER_ROUTE_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"n\":0}}", PD_EINVAL,
           "'n' must be an integer in [1, 128]");
    REFUSE(PD_ROUTER_ROUTE_CHAT, "{\"messages\":[],\"n\":1.5}", PD_EINVAL, "'n' must be");
    REFUSE(PD_ROUTER_ROUTE_CHAT, "{\"messages\":[],\"n\":129}", PD_EINVAL, "[1, 128]");
    /* found by tests/fuzz/fuzz_router_body: converted to int before the range check (UB) */
    REFUSE(PD_ROUTER_ROUTE_GENERATE, "{\"text\":[\"a\"],\"sampling_params\":{\"n\":31e308}}",
           PD_EINVAL, "[1, 128]");
    REFUSE(PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"n\":-1e300}", PD_EINVAL, "[1, 128]");
    REFUSE(PD_ROUTER_ROUTE_COMPLETIONS,
           "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"],\"n\":128}",
           PD_EINVAL, "at most 1024");
    REFUSE(PD_ROUTER_ROUTE_CHAT, "{\"messages\":[],\"n\":129}", PD_EINVAL,
           "'n' must be an integer in [1, 128] (at most --max-n samples per prompt)");
    /* --max-n: the router's own cap, below and above the default */
    CHECK_ERR(pd_router_body_rewrite(PD_ROUTER_ROUTE_CHAT, 4, "{\"n\":5}", 7, "h", 1, &rng, &text,
                                     &len, &info),
              PD_EINVAL, "[1, 4] (at most --max-n");
    CHECK_OK(pd_router_body_rewrite(PD_ROUTER_ROUTE_CHAT, 4, "{\"n\":4}", 7, "h", 1, &rng, &text,
                                    &len, &info));
    CHECK_INT(info.n, 4);
    pd_free(text);
    pd_router_body_info_free(&info);
    CHECK_OK(pd_router_body_rewrite(PD_ROUTER_ROUTE_CHAT, 200, "{\"n\":200}", 9, "h", 1, &rng,
                                    &text, &len, &info));
    CHECK_INT(info.n, 200);
    pd_free(text);
    pd_router_body_info_free(&info);
    REFUSE(PD_ROUTER_ROUTE_GENERATE, "{\"text\":[]}", PD_EINVAL, "empty");
    REFUSE(PD_ROUTER_ROUTE_GENERATE, "{\"text\":\"a\",\"rid\":5}", PD_EINVAL, "'rid' must be");
    REFUSE(PD_ROUTER_ROUTE_GENERATE, "{\"text\":[\"a\",\"b\"],\"rid\":[\"x\"]}", PD_EINVAL,
           "list of 2 strings");
    REFUSE(PD_ROUTER_ROUTE_GENERATE,
           "{\"text\":[\"a\",\"b\"],\"rid\":[\"x\",\"y\",\"z\"],\"sampling_params\":{\"n\":2}}",
           PD_EINVAL, "of 2 (one per prompt)");
    CHECK(info.rooms == NULL && info.rids == NULL); /* nothing left to free on failure */
#undef REFUSE
}

static void test_alloc_failures_leak_nothing(void) {
    /* every allocation point fails once; ASan's leak check sees the rest */
    for (long k = 0; k < 40; k++) {
        struct pd_router_body_info info;
        char *text = NULL;
        size_t len;
        const char *body = "{\"text\":[\"a\",\"b\"],\"bootstrap_port\":3}";
        pd_alloc_fail_after(k);
        int rc = pd_router_body_rewrite(PD_ROUTER_ROUTE_GENERATE, PD_API_MAX_N, body, strlen(body),
                                        "h", 1, &rng, &text, &len, &info);
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        pd_free(text);
        pd_router_body_info_free(&info);
    }
}

/* n > 1: one room and rid per sub-request (prompts x n, prompt-major), as the daemons fan out */
static void test_parallel_samples(void) {
    struct pd_router_body_info info;
    char *text;
    cJSON *j = rewrite(PD_ROUTER_ROUTE_CHAT, "{\"messages\":[],\"n\":3,\"rid\":\"q\"}", "h", 5,
                       &info, &text);
    CHECK_INT(info.n, 3);
    CHECK_INT(info.samples, 3);
    CHECK(info.batch);
    CHECK(!info.rid_added);
    const cJSON *rooms = cJSON_GetObjectItem(j, "bootstrap_room");
    CHECK_INT(cJSON_GetArraySize(rooms), 3);
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "bootstrap_host")), 3);
    CHECK(info.rooms[0] != info.rooms[1] && info.rooms[1] != info.rooms[2]);
    CHECK_STR(info.rids[0], "q_0");
    CHECK_STR(info.rids[2], "q_2");
    CHECK_STR(cJSON_GetObjectItem(j, "rid")->valuestring, "q"); /* the client's, kept */
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);

    j = rewrite(PD_ROUTER_ROUTE_GENERATE,
                "{\"text\":[\"a\",\"b\"],\"rid\":[\"x\",\"y\"],\"sampling_params\":{\"n\":2}}", "h",
                5, &info, &text);
    CHECK_INT(info.n, 4);
    CHECK_STR(info.rids[0], "x_0");
    CHECK_STR(info.rids[1], "x_1");
    CHECK_STR(info.rids[3], "y_1");
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "bootstrap_room")), 4);
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);

    j = rewrite(PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"n\":2}", "h", 5, &info, &text);
    CHECK(info.rid_added); /* the router's rids: one per sub-request, the rooms */
    const cJSON *rids = cJSON_GetObjectItem(j, "rid");
    CHECK_INT(cJSON_GetArraySize(rids), 2);
    char room[24];
    snprintf(room, sizeof(room), "%" PRIu64, info.rooms[1]);
    CHECK_STR(cJSON_GetArrayItem(rids, 1)->valuestring, room);
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);
}

/* host NULL: a body for a decode alone: the client's bootstrap fields dropped, none added, the
 * router's rid added unless the client has one. */
static void test_local(void) {
    struct pd_router_body_info info;
    char *text;
    cJSON *j = rewrite(PD_ROUTER_ROUTE_GENERATE,
                       "{\"text\":\"hi\",\"bootstrap_room\":5,\"bootstrap_host\":\"x\"}", NULL, 0,
                       &info, &text);
    CHECK(!cJSON_GetObjectItem(j, "bootstrap_room") && !cJSON_GetObjectItem(j, "bootstrap_host") &&
          !cJSON_GetObjectItem(j, "bootstrap_port"));
    CHECK(info.rid_added);
    CHECK_STR(cJSON_GetObjectItem(j, "rid")->valuestring, info.rids[0]);
    CHECK_STR(cJSON_GetObjectItem(j, "text")->valuestring, "hi");
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);
    j = rewrite(PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"rid\":\"mine\"}", NULL, 0, &info,
                &text);
    CHECK_STR(text, "{\"prompt\":\"a\",\"rid\":\"mine\"}"); /* the client's bytes, as sent */
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);
    j = rewrite(PD_ROUTER_ROUTE_COMPLETIONS, "{}", NULL, 0, &info, &text);
    CHECK_INT(cJSON_GetArraySize(j), 1); /* the rid alone */
    cJSON_Delete(j);
    pd_free(text);
    pd_router_body_info_free(&info);
}

/* The default rate's estimate (4 bytes a token), or -1 when the body has no one prompt. */
static long est(int route, const char *body) {
    struct pd_router_prompt_size sz = {.id_tokens = -7};
    struct pd_router_token_rate none = {0};
    cJSON *root = cJSON_Parse(body);
    int rc = pd_router_body_prompt_size(route, root, &sz);
    cJSON_Delete(root);
    if (rc != PD_OK) {
        CHECK_INT(sz.id_tokens, -7); /* untouched */
        return -1;
    }
    return pd_router_prompt_tokens(&sz, &none);
}

static void test_prompt_estimate(void) {
    const int G = PD_ROUTER_ROUTE_GENERATE, C = PD_ROUTER_ROUTE_COMPLETIONS,
              H = PD_ROUTER_ROUTE_CHAT;
    CHECK_INT(est(G, "{\"text\":\"abcdefgh\"}"), 2);
    CHECK_INT(est(G, "{\"text\":\"abcdefghi\"}"), 3); /* rounded up */
    CHECK_INT(est(G, "{\"text\":\"\"}"), 0);
    CHECK_INT(est(G, "{\"input_ids\":[1,2,3,4,5]}"), 5);
    CHECK_INT(est(G, "{\"input_ids\":[1,2],\"text\":\"abcdefghijklmnop\"}"), 2); /* ids win */
    CHECK_INT(est(C, "{\"prompt\":[7,8,9]}"), 3);
    CHECK_INT(est(C, "{\"prompt\":\"\\u00e9t\\u00e9\"}"), 2); /* bytes of the decoded text */
    CHECK_INT(est(H,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"abcd\"},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"abcdefgh\"}]}]}"),
              8 + 8 + 3); /* 12 bytes of text: 3 tokens */
    /* not one prompt of one sample, or no prompt: the PD path */
    CHECK_INT(est(G, "{\"text\":[\"a\",\"b\"]}"), -1);
    CHECK_INT(est(G, "{\"input_ids\":[[1],[2]]}"), -1);
    CHECK_INT(est(G, "{\"text\":\"a\",\"sampling_params\":{\"n\":2}}"), -1);
    CHECK_INT(est(C, "{\"prompt\":\"a\",\"n\":3}"), -1);
    CHECK_INT(est(C, "{\"prompt\":[\"a\",\"b\"]}"), -1);
    CHECK_INT(est(G, "{}"), -1);
    CHECK_INT(est(G, "[1]"), -1);
    CHECK_INT(est(G, "{not json"), -1);
    CHECK_INT(est(H, "{\"messages\":\"x\"}"), -1);
    CHECK_INT(est(C, "{\"prompt\":[1,\"x\"]}"), -1);
    /* images: no size without the processor, and only the prefill encodes them */
    CHECK_INT(est(G, "{\"text\":\"ab\",\"image_data\":\"QUJD\"}"), -1);
    CHECK_INT(est(G, "{\"text\":\"ab\",\"image_data\":null}"), 1);
    CHECK_INT(
        est(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
               "\"text\":\"ab\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:,\"}}]}]}"),
        -1);
}

static bool answer_tokens(const char *answer, long *n) {
    return pd_router_answer_prompt_tokens(answer, strlen(answer), n);
}

/* The count decode's answer reports: SGLang's meta_info, OpenAI's usage, a stream's event. */
static void test_answer_prompt_tokens(void) {
    long n = -1;
    CHECK(answer_tokens("{\"text\":\"x\",\"meta_info\":{\"prompt_tokens\":37,\"id\":\"a\"}}", &n));
    CHECK_INT(n, 37);
    CHECK(answer_tokens("{\"usage\": {\"prompt_tokens\" :\n 5, \"completion_tokens\": 9}}", &n));
    CHECK_INT(n, 5);
    CHECK(answer_tokens("data: {\"meta_info\":{\"prompt_tokens\":0}}\n\n", &n));
    CHECK_INT(n, 0);
    n = -1;
    /* the key's bytes inside a string are escaped there: not a key */
    CHECK(!answer_tokens("{\"text\":\"say \\\"prompt_tokens\\\":3\"}", &n));
    CHECK(!answer_tokens("{\"prompt_tokens_details\":{\"cached_tokens\":4}}", &n));
    CHECK(!answer_tokens("{\"prompt_tokens\":-3}", &n));
    CHECK(!answer_tokens("{\"prompt_tokens\":3.5}", &n));
    CHECK(!answer_tokens("{\"prompt_tokens\":1e3}", &n));
    CHECK(!answer_tokens("{\"prompt_tokens\":\"12\"}", &n));
    CHECK(!answer_tokens("{\"prompt_tokens\":", &n));
    CHECK(!answer_tokens("{\"prompt_tokens\" 12}", &n));
    CHECK(!answer_tokens("{\"prompt_tokens\":99999999999999999999999}", &n));
    CHECK(!answer_tokens("", &n));
    CHECK_INT(n, -1);
    /* the length bounds the search: a count cut off after its first digit is that digit */
    const char *cut = "{\"prompt_tokens\":123}";
    CHECK(pd_router_answer_prompt_tokens(cut, strlen("{\"prompt_tokens\":1"), &n));
    CHECK_INT(n, 1);
}

/* The rate follows the answers, longer prompts weighing more, within its bounds. */
static void test_token_rate(void) {
    struct pd_router_token_rate r = {0};
    CHECK(pd_router_token_rate_get(&r) == PD_ROUTER_BYTES_PER_TOKEN_DEFAULT);
    struct pd_router_prompt_size text = {.text_bytes = 400},
                                 chat = {.id_tokens = 16, .text_bytes = 300};
    struct pd_router_prompt_size ids = {.id_tokens = 50};
    CHECK(!pd_router_token_rate_learn(&r, &ids, 50));  /* no text: nothing to learn */
    CHECK(!pd_router_token_rate_learn(&r, &chat, 16)); /* no text tokens left */
    CHECK(!pd_router_token_rate_learn(&r, &chat, 3));
    CHECK_INT((long)r.answers, 0);
    CHECK(pd_router_token_rate_learn(&r, &text, 200)); /* 2 bytes a token */
    CHECK(fabs(pd_router_token_rate_get(&r) - 2.0) < 1e-12);
    CHECK_INT(pd_router_prompt_tokens(&text, &r), 200);
    CHECK_INT(pd_router_prompt_tokens(&chat, &r), 16 + 150);
    CHECK(pd_router_token_rate_learn(&r, &chat, 16 + 50)); /* 6 bytes a token, but shorter */
    double want = (400 * 0.98 + 300) / (200 * 0.98 + 50);
    CHECK(fabs(pd_router_token_rate_get(&r) - want) < 1e-12);
    for (int i = 0; i < 500; i++) /* old answers fade: the rate becomes the new one */
        pd_router_token_rate_learn(&r, &text, 100);
    CHECK(fabs(pd_router_token_rate_get(&r) - 4.0) < 1e-4);
    for (int i = 0; i < 500; i++)
        pd_router_token_rate_learn(&r, &text, 4000); /* 0.1 bytes a token: held at the bound */
    CHECK(pd_router_token_rate_get(&r) == PD_ROUTER_BYTES_PER_TOKEN_MIN);
    for (int i = 0; i < 500; i++)
        pd_router_token_rate_learn(&r, &text, 1);
    CHECK(pd_router_token_rate_get(&r) == PD_ROUTER_BYTES_PER_TOKEN_MAX);
    CHECK_INT((long)r.answers, 1502);
}

static void test_abort_body(void) {
    char *b = pd_router_abort_body("r\"1");
    CHECK_STR(b, "{\"rid\":\"r\\\"1\"}");
    pd_free(b);
}

int main(void) {
    pd_router_rng_seed_with(&rng, 99);
    static const struct pd_test_case cases[] = {PD_TEST(test_single),
                                                PD_TEST(test_null_port_rid_kept_empty_object),
                                                PD_TEST(test_batches),
                                                PD_TEST(test_client_bootstrap_fields_replaced),
                                                PD_TEST(test_refusals),
                                                PD_TEST(test_alloc_failures_leak_nothing),
                                                PD_TEST(test_abort_body),
                                                PD_TEST(test_parallel_samples),
                                                PD_TEST(test_local),
                                                PD_TEST(test_prompt_estimate),
                                                PD_TEST(test_answer_prompt_tokens),
                                                PD_TEST(test_token_rate)};
    return pd_test_run("unit_router_body", cases, PD_ARRAY_LEN(cases));
}
