/* Prompt logprobs in PD mode (router/lpmerge.h): the prefill's input_token_logprobs go before
 * the decode's in the whole answer and in every /generate stream event, by index for lists;
 * completions echo logprobs go before the completion's once per choice in a stream; a streamed
 * prefill answer works as a whole one; the body rewrite says when a request asks for them. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/base/api_wire.h"
#include "router/body.h"
#include "router/config.h"
#include "router/lpmerge.h"

#include <cjson/cJSON.h>
#include <string.h>

static cJSON *merged_body(struct pd_router_lpmerge *m, const char *decode) {
    char *out = NULL;
    size_t len = 0;
    CHECK_OK(pd_router_lpmerge_body(m, decode, strlen(decode), &out, &len));
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    CHECK(j != NULL && strlen(out) == len);
    pd_free(out);
    return j;
}

static cJSON *merged_event(struct pd_router_lpmerge *m, const char *data) {
    char *out = NULL;
    size_t len = 0;
    CHECK_OK(pd_router_lpmerge_event(m, data, strlen(data), &out, &len));
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    pd_free(out);
    return j;
}

static const cJSON *at(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static void test_generate(void) {
    struct pd_router_lpmerge m;
    const char *pf = "{\"text\":\"\",\"meta_info\":{\"input_token_logprobs\":[[null,5,null],"
                     "[-1.5,6,null]],\"input_top_logprobs\":[null,[[-0.5,9,null]]],"
                     "\"output_token_logprobs\":[[-2,7,null]]}}";
    CHECK_OK(pd_router_lpmerge_init(&m, PD_ROUTER_ROUTE_GENERATE, pf, strlen(pf)));
    cJSON *j = merged_body(&m, "{\"text\":\"x\",\"meta_info\":{\"output_token_logprobs\":"
                               "[[-2,7,null],[-3,8,null]]}}");
    const cJSON *mi = at(j, "meta_info");
    const cJSON *il = at(mi, "input_token_logprobs");
    CHECK_INT(cJSON_GetArraySize(il), 2);
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(il, 0), 0)));
    CHECK(cJSON_GetArrayItem(cJSON_GetArrayItem(il, 1), 0)->valuedouble == -1.5);
    CHECK_INT(cJSON_GetArraySize(at(mi, "input_top_logprobs")), 2);
    CHECK_INT(cJSON_GetArraySize(at(mi, "output_token_logprobs")), 2); /* decode's, untouched */
    CHECK_STR(at(j, "text")->valuestring, "x");
    cJSON_Delete(j);
    /* every stream event gets them (a /generate chunk is the whole state so far) */
    for (int i = 0; i < 2; i++) {
        j = merged_event(&m, " {\"text\":\"x\",\"meta_info\":{}}");
        CHECK_INT(cJSON_GetArraySize(at(at(j, "meta_info"), "input_token_logprobs")), 2);
        cJSON_Delete(j);
    }
    /* [DONE] passes unchanged */
    char *out = NULL;
    size_t len = 0;
    CHECK_OK(pd_router_lpmerge_event(&m, " [DONE]", 7, &out, &len));
    CHECK(out && len == 7 && strcmp(out, " [DONE]") == 0);
    pd_free(out);
    /* not JSON: refused, nothing leaks */
    CHECK_INT(pd_router_lpmerge_body(&m, "{oops", 5, &out, &len), PD_EINVAL);
    CHECK(out == NULL);
    pd_router_lpmerge_free(&m);
    CHECK_INT(pd_router_lpmerge_init(&m, PD_ROUTER_ROUTE_GENERATE, "nope", 4), PD_EINVAL);
    pd_router_lpmerge_free(&m);
}

static void test_generate_batch(void) {
    struct pd_router_lpmerge m;
    const char *pf = "[{\"meta_info\":{\"input_token_logprobs\":[[null,1,null]]}},"
                     "{\"meta_info\":{\"input_token_logprobs\":[[null,2,null],[-1,3,null]]}}]";
    CHECK_OK(pd_router_lpmerge_init(&m, PD_ROUTER_ROUTE_GENERATE, pf, strlen(pf)));
    cJSON *j = merged_body(&m, "[{\"meta_info\":{}},{\"meta_info\":{}}]");
    CHECK_INT(
        cJSON_GetArraySize(at(at(cJSON_GetArrayItem(j, 0), "meta_info"), "input_token_logprobs")),
        1);
    CHECK_INT(
        cJSON_GetArraySize(at(at(cJSON_GetArrayItem(j, 1), "meta_info"), "input_token_logprobs")),
        2);
    cJSON_Delete(j);
    j = merged_event(&m, "{\"index\":1,\"meta_info\":{}}"); /* a batch stream event */
    const cJSON *il = at(at(j, "meta_info"), "input_token_logprobs");
    CHECK_INT(cJSON_GetArraySize(il), 2);
    CHECK_INT(cJSON_GetArrayItem(cJSON_GetArrayItem(il, 0), 1)->valueint, 2);
    cJSON_Delete(j);
    pd_router_lpmerge_free(&m);
}

static const char *completion_prefill =
    "{\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":{\"tokens\":[\"a\",\"b\"],"
    "\"token_logprobs\":[null,-1.0],\"top_logprobs\":[null,{\"c\":-0.5}],\"text_offset\":[0,1]}},"
    "{\"index\":1,\"text\":\"\",\"logprobs\":{\"tokens\":[\"a\",\"b\"],\"token_logprobs\":[null,"
    "-1.0],\"top_logprobs\":[null,{\"c\":-0.5}],\"text_offset\":[0,1]}}]}";

static void check_choice(const cJSON *c, int n, const char *last_token) {
    const cJSON *lp = at(c, "logprobs");
    const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int k = 0; k < 4; k++)
        CHECK_INT(cJSON_GetArraySize(at(lp, keys[k])), n);
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(at(lp, "token_logprobs"), 0)));
    CHECK_STR(cJSON_GetArrayItem(at(lp, "tokens"), n - 1)->valuestring, last_token);
}

static void test_completions(void) {
    struct pd_router_lpmerge m;
    CHECK_OK(pd_router_lpmerge_init(&m, PD_ROUTER_ROUTE_COMPLETIONS, completion_prefill,
                                    strlen(completion_prefill)));
    const char *dec =
        "{\"choices\":[{\"index\":1,\"text\":\"abX\",\"logprobs\":{\"tokens\":[\"X\"],"
        "\"token_logprobs\":[-2],\"top_logprobs\":[{\"X\":-2}],\"text_offset\":[2]}},"
        "{\"index\":0,\"text\":\"abY\",\"logprobs\":{\"tokens\":[\"Y\"],"
        "\"token_logprobs\":[-3],\"top_logprobs\":[{\"Y\":-3}],\"text_offset\":[2]}}]}";
    cJSON *j = merged_body(&m, dec);
    check_choice(cJSON_GetArrayItem(at(j, "choices"), 0), 3, "X");
    check_choice(cJSON_GetArrayItem(at(j, "choices"), 1), 3, "Y");
    cJSON_Delete(j);
    /* a stream: choice 0's first event gets them, its next one not; choice 1's first does */
    const char *ev0 = "{\"choices\":[{\"index\":0,\"text\":\"ab\",\"logprobs\":{\"tokens\":[\"Y\"],"
                      "\"token_logprobs\":[-3],\"top_logprobs\":[{}],\"text_offset\":[2]}}]}";
    j = merged_event(&m, ev0);
    check_choice(cJSON_GetArrayItem(at(j, "choices"), 0), 3, "Y");
    cJSON_Delete(j);
    j = merged_event(&m, ev0);
    CHECK_INT(
        cJSON_GetArraySize(at(at(cJSON_GetArrayItem(at(j, "choices"), 0), "logprobs"), "tokens")),
        1);
    cJSON_Delete(j);
    j = merged_event(&m, "{\"choices\":[{\"index\":1,\"text\":\"ab\",\"logprobs\":{\"tokens\":[],"
                         "\"token_logprobs\":[],\"top_logprobs\":[],\"text_offset\":[]}}]}");
    check_choice(cJSON_GetArrayItem(at(j, "choices"), 0), 2, "b"); /* max_tokens 0: the prompt */
    cJSON_Delete(j);
    pd_router_lpmerge_free(&m);
}

/* The prefill answered a stream: its events make the same source. */
static void test_streamed_prefill(void) {
    struct pd_router_lpmerge m;
    const char *pf = "data: {\"meta_info\":{\"input_token_logprobs\":[[null,5,null]]}}\n\n"
                     "data: {\"meta_info\":{\"input_token_logprobs\":[[null,5,null],"
                     "[-1,6,null]]}}\n\ndata: [DONE]\n\n";
    CHECK_OK(pd_router_lpmerge_init(&m, PD_ROUTER_ROUTE_GENERATE, pf, strlen(pf)));
    cJSON *j = merged_event(&m, "{\"meta_info\":{}}");
    CHECK_INT(cJSON_GetArraySize(at(at(j, "meta_info"), "input_token_logprobs")), 2);
    cJSON_Delete(j);
    pd_router_lpmerge_free(&m);

    const char *cf = "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":{\"tokens\":"
                     "[\"a\"],\"token_logprobs\":[null],\"top_logprobs\":[null],"
                     "\"text_offset\":[0]}}]}\n\ndata: {\"choices\":[{\"index\":0,\"text\":\"\","
                     "\"logprobs\":{\"tokens\":[\"b\"],\"token_logprobs\":[-1],\"top_logprobs\":"
                     "[{}],\"text_offset\":[1]}}]}\n\ndata: [DONE]\n\n";
    CHECK_OK(pd_router_lpmerge_init(&m, PD_ROUTER_ROUTE_COMPLETIONS, cf, strlen(cf)));
    j = merged_event(&m, "{\"choices\":[{\"index\":0,\"text\":\"ab\",\"logprobs\":{\"tokens\":"
                         "[\"Z\"],\"token_logprobs\":[-4],\"top_logprobs\":[{}],"
                         "\"text_offset\":[2]}}]}");
    const cJSON *toks = at(at(cJSON_GetArrayItem(at(j, "choices"), 0), "logprobs"), "tokens");
    CHECK_INT(cJSON_GetArraySize(toks), 3);
    CHECK_STR(cJSON_GetArrayItem(toks, 0)->valuestring, "a");
    CHECK_STR(cJSON_GetArrayItem(toks, 1)->valuestring, "b");
    cJSON_Delete(j);
    pd_router_lpmerge_free(&m);

    /* found by tests/fuzz/fuzz_lpmerge: a high index filled its slots in quadratic time (this
     * one took minutes); linear now */
    const char *hi = "data: {\"index\":300000,\"meta_info\":{\"input_token_logprobs\":[]}}\n\n"
                     "data: {\"index\":299999,\"meta_info\":{}}\n\n";
    CHECK_OK(pd_router_lpmerge_init(&m, PD_ROUTER_ROUTE_GENERATE, hi, strlen(hi)));
    CHECK_INT(cJSON_GetArraySize(m.source), 300001);
    CHECK(at(cJSON_GetArrayItem(m.source, 300000), "meta_info") != NULL);
    pd_router_lpmerge_free(&m);
}

static void test_body_flag(void) {
    struct pd_router_rng rng;
    pd_router_rng_seed_with(&rng, 1);
    struct {
        int route;
        const char *body;
        bool want;
    } cases[] = {
        {PD_ROUTER_ROUTE_GENERATE,
         "{\"text\":\"a\",\"return_logprob\":true,\"logprob_start_len\":0}", true},
        {PD_ROUTER_ROUTE_GENERATE, "{\"text\":\"a\",\"return_logprob\":true}", false},
        {PD_ROUTER_ROUTE_GENERATE, "{\"text\":\"a\",\"logprob_start_len\":3}", false},
        {PD_ROUTER_ROUTE_GENERATE,
         "{\"text\":[\"a\",\"b\"],\"return_logprob\":[false,true],\"logprob_start_len\":[-1,2]}",
         true},
        {PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":1}", true},
        {PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"echo\":true}", false},
        {PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":1}", false},
        {PD_ROUTER_ROUTE_CHAT, "{\"messages\":[],\"logprobs\":true}", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct pd_router_body_info info;
        char *out = NULL;
        size_t len = 0;
        CHECK_OK(pd_router_body_rewrite(cases[i].route, PD_API_MAX_N, cases[i].body,
                                        strlen(cases[i].body), "h", 1, &rng, &out, &len, &info));
        CHECK(info.input_logprobs == cases[i].want);
        pd_free(out);
        pd_router_body_info_free(&info);
    }
}

PD_TEST_MAIN(PD_TEST(test_generate), PD_TEST(test_generate_batch), PD_TEST(test_completions),
             PD_TEST(test_streamed_prefill), PD_TEST(test_body_flag))
