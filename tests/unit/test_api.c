/* HTTP API bodies (common/api.h): every field of /generate, /v1/completions and
 * /v1/chat/completions lands in the request struct; every bad input the issue lists is a 4xx
 * with an OpenAI error naming the field; responses and chunks carry API.md's fields. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/api.h"
#include "common/base/json_keys.h"
#include "model/jinja/chat_template.h"
#include "common/server_args.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

static const struct pd_api_config cfg = {
    .served_model_name = "tiny",
    .model_path = "/models/tiny",
    .disaggregated = false,
    .context_length = 100,
};

static int parse(enum pd_api_kind kind, const char *body, struct pd_api_request *r,
                 struct pd_api_error *e) {
    return pd_api_parse(kind, body, strlen(body), &cfg, r, e);
}

/* The body must fail with status and an error whose param is `param` and message has needle. */
static void expect_bad_cfg(const struct pd_api_config *c, enum pd_api_kind kind, const char *body,
                           int status, const char *param, const char *needle, int line) {
    struct pd_api_request r;
    struct pd_api_error e;
    int rc = pd_api_parse(kind, body, strlen(body), c, &r, &e);
    pd_test_checks++;
    if (rc != PD_EINVAL || e.status != status || strcmp(e.param, param) != 0 ||
        !strstr(e.message, needle)) {
        pd_test_failures++;
        fprintf(stderr,
                "line %d: %s\n  want %d param '%s' containing '%s'\n  got rc %d %d '%s' '%s'\n",
                line, body, status, param, needle, rc, e.status, e.param, e.message);
    }
    CHECK(r.text == NULL && r.messages == NULL && r.input_ids == NULL && r.n_stop == 0);
    pd_api_request_free(&r);
}
#define EXPECT_BAD(kind, body, status, param, needle)                                              \
    expect_bad_cfg(&cfg, kind, body, status, param, needle, __LINE__)

static void test_generate_fields(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_INT(
        parse(PD_API_GENERATE,
              "{\"text\":\"Hello\",\"sampling_params\":{\"max_new_tokens\":7,"
              "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,\"min_p\":0.05,\"stop\":[\"\\n\","
              "\"END\"],\"stop_token_ids\":[2,3],\"ignore_eos\":true,\"n\":1,"
              "\"frequency_penalty\":0.5,\"presence_penalty\":-0.5,\"repetition_penalty\":1.1,"
              "\"skip_special_tokens\":false,\"sampling_seed\":42,\"min_new_tokens\":4},"
              "\"stream\":true,"
              "\"return_logprob\":true,\"top_logprobs_num\":3,\"logprob_start_len\":0,"
              "\"rid\":\"req-1\",\"bootstrap_host\":\"10.0.0.1\",\"bootstrap_port\":9000,"
              "\"bootstrap_room\":9223372036854775807}",
              &r, &e),
        PD_OK);
    CHECK_STR(r.text, "Hello");
    CHECK_INT(r.text_len, 5);
    CHECK(r.input_ids == NULL);
    CHECK_INT(r.sampling.max_new_tokens, 7);
    CHECK(r.max_tokens_given);
    CHECK_DBL(r.sampling.temperature, 0.5, 1e-6);
    CHECK_DBL(r.sampling.top_p, 0.9, 1e-6);
    CHECK_INT(r.sampling.top_k, 20);
    CHECK_DBL(r.sampling.min_p, 0.05, 1e-6);
    CHECK_INT(r.sampling.min_new_tokens, 4); /* SGLang's name */
    CHECK_INT(r.n_stop, 2);
    CHECK_STR(r.stop[0], "\n");
    CHECK_STR(r.stop[1], "END");
    CHECK_INT(r.sampling.n_stop_token_ids, 2);
    CHECK_INT(r.sampling.stop_token_ids[1], 3);
    CHECK(r.sampling.ignore_eos);
    CHECK_DBL(r.sampling.frequency_penalty, 0.5, 1e-6);
    CHECK_DBL(r.sampling.presence_penalty, -0.5, 1e-6);
    CHECK_DBL(r.sampling.repetition_penalty, 1.1, 1e-6);
    CHECK(!r.skip_special_tokens);
    CHECK(r.sampling.has_seed);
    CHECK_INT(r.sampling.seed, 42);
    CHECK(r.stream);
    CHECK(r.return_logprob);
    CHECK_INT(r.sampling.n_logprobs, 3);
    CHECK_INT(r.logprob_start_len, 0);
    CHECK_STR(r.rid, "req-1");
    CHECK_STR(r.bootstrap_host, "10.0.0.1");
    CHECK_INT(r.bootstrap_port, 9000);
    CHECK(r.has_bootstrap_room);
    CHECK(r.bootstrap_room == 9223372036854775807ull); /* exact, beyond a double's 2^53 */
    pd_api_request_free(&r);

    /* defaults */
    CHECK_INT(parse(PD_API_GENERATE, "{\"input_ids\":[1,2,3],\"bootstrap_port\":null}", &r, &e),
              PD_OK);
    CHECK_INT(r.n_input_ids, 3);
    CHECK_INT(r.input_ids[2], 3);
    CHECK(r.text == NULL);
    CHECK_INT(r.sampling.max_new_tokens, 128);
    CHECK(!r.max_tokens_given);
    CHECK_DBL(r.sampling.temperature, 1.0, 0);
    CHECK_DBL(r.sampling.top_p, 1.0, 0);
    CHECK_INT(r.sampling.top_k, 0);
    CHECK(r.skip_special_tokens);
    CHECK(!r.stream && !r.return_logprob && !r.has_bootstrap_room);
    CHECK_INT(r.bootstrap_port, PD_API_DEFAULT_BOOTSTRAP_PORT);
    CHECK(r.rid == NULL);
    pd_api_request_free(&r);

    /* top_k -1 = all; max_new_tokens 0 allowed on /generate; stop as a string */
    CHECK_INT(parse(PD_API_GENERATE,
                    "{\"text\":\"x\",\"sampling_params\":{\"top_k\":-1,\"max_new_tokens\":0,"
                    "\"stop\":\"##\"}}",
                    &r, &e),
              PD_OK);
    CHECK_INT(r.sampling.top_k, 0);
    CHECK_INT(r.sampling.max_new_tokens, 0);
    CHECK_INT(r.n_stop, 1);
    CHECK_STR(r.stop[0], "##");
    pd_api_request_free(&r);
}

static void test_generate_bad(void) {
    EXPECT_BAD(PD_API_GENERATE, "{}", 400, "text", "needs 'text' or 'input_ids'");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"input_ids\":[1]}", 400, "text", "not both");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":[\"a\",\"b\"]}", 400, "text", "batch");
    EXPECT_BAD(PD_API_GENERATE, "{\"input_ids\":[[1],[2]]}", 400, "input_ids", "batch");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":5}", 400, "text", "must be a string, got a number");
    EXPECT_BAD(PD_API_GENERATE, "{\"input_ids\":[1,-2]}", 400, "input_ids", "[1]");
    EXPECT_BAD(PD_API_GENERATE, "{\"input_ids\":[1,\"a\"]}", 400, "input_ids", "got a string");
    EXPECT_BAD(PD_API_GENERATE, "{\"input_ids\":[]}", 400, "input_ids", "must not be empty");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":-1}}", 400,
               "sampling_params.max_new_tokens", "must be in [0, 2147483647]");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":1e12}}",
               400, "sampling_params.max_new_tokens", "must be in");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":1.5}}",
               400, "sampling_params.max_new_tokens", "fractional");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"temperature\":-0.1}}", 400,
               "sampling_params.temperature", "must be >= 0");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"temperature\":\"hot\"}}",
               400, "sampling_params.temperature", "must be a number, got a string");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"top_p\":0}}", 400,
               "sampling_params.top_p", "(0, 1]");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"top_p\":1.01}}", 400,
               "sampling_params.top_p", "(0, 1]");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"top_k\":-2}}", 400,
               "sampling_params.top_k", "must be in [-1,");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"min_p\":2}}", 400,
               "sampling_params.min_p", "[0, 1]");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"n\":2}}", 400,
               "sampling_params.n", "only n = 1");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"stop\":[1]}}", 400,
               "sampling_params.stop", "must hold strings");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"stop_token_ids\":[-1]}}",
               400, "sampling_params.stop_token_ids", "token ids");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"ignore_eos\":1}}", 400,
               "sampling_params.ignore_eos", "must be a boolean");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"frequency_penalty\":3}}",
               400, "sampling_params.frequency_penalty", "[-2, 2]");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":[]}", 400, "sampling_params",
               "batch");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":3}", 400, "sampling_params",
               "must be an object");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"stream\":\"yes\"}", 400, "stream",
               "must be a boolean");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"top_logprobs_num\":21}", 400, "top_logprobs_num",
               "[0, 20]");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"rid\":5}", 400, "rid", "must be a string");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"rid\":[\"a\"]}", 400, "rid", "batch");
    char many[1024] = "{\"text\":\"a\",\"sampling_params\":{\"stop\":[";
    for (int i = 0; i <= PD_API_MAX_STOP; i++)
        strcat(many, i ? ",\"s\"" : "\"s\"");
    strcat(many, "]}}");
    EXPECT_BAD(PD_API_GENERATE, many, 400, "sampling_params.stop", "more than 16");
}

static void test_body_errors(void) {
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":", 400, "", "not valid JSON");
    EXPECT_BAD(PD_API_CHAT, "not json", 400, "", "not valid JSON");
    EXPECT_BAD(PD_API_CHAT, "", 400, "", "not valid JSON");
    EXPECT_BAD(PD_API_CHAT, "[1,2]", 400, "", "must be a JSON object, got a list");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\"} trailing", 400, "", "not valid JSON");
    /* raw non-UTF-8 bytes anywhere in the body: a lone continuation byte, an overlong, a
     * surrogate encoded in UTF-8, a truncated sequence */
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\x80\"}", 400, "", "not valid UTF-8 (byte 10)");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"\xC0\xAF\"}", 400, "", "not valid UTF-8");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"\xED\xA0\x80\"}", 400, "", "not valid UTF-8");
    EXPECT_BAD(PD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xE2\x82\"}]}", 400,
               "", "not valid UTF-8");
    /* a lone surrogate escape is refused by the JSON parser */
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"\\ud800\"}", 400, "", "not valid JSON");
    /* a body that is not NUL-terminated is read only up to len */
    struct pd_api_request r;
    struct pd_api_error e;
    const char body[] = "{\"text\":\"hi\"}GARBAGE";
    CHECK_INT(pd_api_parse(PD_API_GENERATE, body, 13, &cfg, &r, &e), PD_OK);
    CHECK_STR(r.text, "hi");
    pd_api_request_free(&r);
    /* valid multi-byte UTF-8 passes untouched */
    CHECK_INT(
        parse(PD_API_GENERATE, "{\"text\":\"h\xC3\xA9llo \xE4\xB8\x96 \xF0\x9F\x98\x80\"}", &r, &e),
        PD_OK);
    CHECK_STR(r.text, "h\xC3\xA9llo \xE4\xB8\x96 \xF0\x9F\x98\x80");
    pd_api_request_free(&r);
}

static void test_utf8(void) {
    size_t at = 99;
    CHECK(pd_api_utf8_valid("", 0, &at));
    CHECK(pd_api_utf8_valid("\xF4\x8F\xBF\xBF", 4, &at));  /* U+10FFFF */
    CHECK(!pd_api_utf8_valid("\xF4\x90\x80\x80", 4, &at)); /* > U+10FFFF */
    CHECK_INT(at, 0);
    CHECK(!pd_api_utf8_valid("ab\xE0\x80\x80", 5, &at)); /* overlong 3-byte */
    CHECK_INT(at, 2);
    CHECK(!pd_api_utf8_valid("abc\xF0\x9F\x98", 6, &at)); /* truncated */
    CHECK_INT(at, 3);
    CHECK(!pd_api_utf8_valid("\xFF", 1, NULL));
}

static void test_bootstrap(void) {
    struct pd_api_config dis = cfg;
    dis.disaggregated = true;
    struct pd_api_request r;
    struct pd_api_error e;
    expect_bad_cfg(&dis, PD_API_GENERATE, "{\"text\":\"a\"}", 400, "bootstrap_room",
                   "disaggregated", __LINE__);
    expect_bad_cfg(&dis, PD_API_CHAT,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"bootstrap_room\":null}",
                   400, "bootstrap_room", "needs 'bootstrap_room'", __LINE__);
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":-1}", 400, "bootstrap_room",
               "[0, 2^63)");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":9223372036854775808}", 400,
               "bootstrap_room", "[0, 2^63)");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":99999999999999999999999}", 400,
               "bootstrap_room", "[0, 2^63)");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":1.5}", 400, "bootstrap_room",
               "must be an integer");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":\"7\"}", 400, "bootstrap_room",
               "must be an integer, got a string");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":[1,2]}", 400, "bootstrap_room",
               "batch");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"bootstrap_port\":70000}", 400, "bootstrap_port",
               "[1, 65535]");
    EXPECT_BAD(PD_API_GENERATE, "{\"text\":\"a\",\"bootstrap_host\":1}", 400, "bootstrap_host",
               "must be a string");
    /* the exact value, read from the text even when nested values and strings come first */
    const char *body = "{\"text\":\"bootstrap_room\",\"x\":{\"bootstrap_room\":1},\"arr\":[1,[2]],"
                       "\"bootstrap_room\" : 9007199254740993 ,\"bootstrap_host\":\"h\"}";
    CHECK_INT(pd_api_parse(PD_API_GENERATE, body, strlen(body), &dis, &r, &e), PD_OK);
    CHECK(r.bootstrap_room == 9007199254740993ull); /* 2^53 + 1: a double would say ...992 */
    CHECK_STR(r.bootstrap_host, "h");
    pd_api_request_free(&r);
    body = "{\"bootstrap_room\":0,\"text\":\"a\"}";
    CHECK_INT(pd_api_parse(PD_API_GENERATE, body, strlen(body), &dis, &r, &e), PD_OK);
    CHECK(r.has_bootstrap_room && r.bootstrap_room == 0);
    pd_api_request_free(&r);
}

static void test_completions(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_INT(parse(PD_API_COMPLETIONS,
                    "{\"model\":\"tiny\",\"prompt\":\"Once upon\",\"max_tokens\":5,\"logprobs\":2,"
                    "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"seed\":7,"
                    "\"stop\":\".\",\"user\":\"bob\",\"logit_bias\":{},\"echo\":false,\"n\":1}",
                    &r, &e),
              PD_OK);
    CHECK_STR(r.text, "Once upon");
    CHECK_STR(r.model, "tiny");
    CHECK_INT(r.sampling.max_new_tokens, 5);
    CHECK(r.return_logprob);
    CHECK_INT(r.sampling.n_logprobs, 2);
    CHECK(r.stream && r.include_usage);
    CHECK(r.sampling.has_seed && r.sampling.seed == 7);
    CHECK_INT(r.n_stop, 1);
    pd_api_request_free(&r);

    CHECK_INT(parse(PD_API_COMPLETIONS, "{\"prompt\":[5,6,7],\"model\":\"/models/tiny\"}", &r, &e),
              PD_OK);
    CHECK_INT(r.n_input_ids, 3);
    CHECK_INT(r.sampling.max_new_tokens, 16); /* OpenAI's completions default */
    CHECK(!r.return_logprob);
    pd_api_request_free(&r);

    CHECK_INT(parse(PD_API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":0}", &r, &e), PD_OK);
    CHECK(r.return_logprob);
    CHECK_INT(r.sampling.n_logprobs, 0);
    pd_api_request_free(&r);

    EXPECT_BAD(PD_API_COMPLETIONS, "{\"model\":\"tiny\"}", 400, "prompt", "needs 'prompt'");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":{}}", 400, "prompt", "got an object");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "batch");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":[[1],[2]]}", 400, "prompt", "batch");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":-5}", 400, "max_tokens",
               "must be in [0, 2147483647]");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":-1}", 400, "max_tokens",
               "must be in [0,");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":99999999999}", 400,
               "max_tokens", "must be in [0, 2147483647]");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":\"5\"}", 400, "max_tokens",
               "must be an integer, got a string");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":-1}", 400, "temperature",
               "must be >= 0");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"top_p\":1.5}", 400, "top_p", "(0, 1]");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"n\":3}", 400, "n", "only n = 1");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"best_of\":2}", 400, "best_of", "only 1");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"x5\":10}}", 400,
               "logit_bias", "\"x5\" is not a token id");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"-1\":10}}", 400,
               "logit_bias", "not a token id");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":101}}", 400,
               "logit_bias", "[-100, 100]");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":\"1\"}}", 400,
               "logit_bias", "must be a number");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":[1]}", 400, "logit_bias",
               "must be an object");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":true}", 400, "logprobs",
               "must be an integer");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens",
               "needs 'echo'");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"echo\":1}", 400, "echo",
               "must be a boolean");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":1}}",
               400, "stream_options.include_usage", "must be a boolean");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"seed\":1.5}", 400, "seed",
               "must be an integer");
    /* found by tests/fuzz/fuzz_api: numbers past int / uint64 were converted (UB) */
    EXPECT_BAD(PD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":7e102}",
               400, "n", "'n' is");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"best_of\":-7e102}", 400, "best_of",
               "'best_of' is");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"seed\":18446744073709551615}", 400, "seed",
               "must be an integer");
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"seed\":-1e19}", 400, "seed",
               "must be an integer");
    CHECK_INT(parse(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"seed\":-9223372036854775808}", &r, &e),
              PD_OK);
    CHECK(r.sampling.has_seed && r.sampling.seed == UINT64_C(1) << 63);
    pd_api_request_free(&r);
}

static void test_model_name(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    EXPECT_BAD(PD_API_COMPLETIONS, "{\"model\":\"gpt-4\",\"prompt\":\"a\"}", 404, "model",
               "`gpt-4` does not exist");
    CHECK_INT(parse(PD_API_CHAT,
                    "{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
                    &r, &e),
              PD_EINVAL);
    CHECK_INT(e.status, 404);
    CHECK_STR(e.code, "model_not_found");
    EXPECT_BAD(PD_API_CHAT, "{\"model\":5,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
               400, "model", "must be a string");
    /* absent or empty model: the served one; a config without a name accepts anything */
    CHECK_OK(parse(PD_API_COMPLETIONS, "{\"prompt\":\"a\"}", &r, &e));
    pd_api_request_free(&r);
    CHECK_OK(parse(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"model\":\"\"}", &r, &e));
    pd_api_request_free(&r);
    struct pd_api_config any = {0};
    const char *b = "{\"prompt\":\"a\",\"model\":\"whatever\"}";
    CHECK_OK(pd_api_parse(PD_API_COMPLETIONS, b, strlen(b), &any, &r, &e));
    pd_api_request_free(&r);
}

static void test_chat(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_INT(
        parse(PD_API_CHAT,
              "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
              "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},{\"type\":"
              "\"text\",\"text\":\"there\"}],\"name\":\"bob\"},{\"role\":\"assistant\","
              "\"content\":null}],\"max_completion_tokens\":9,\"logprobs\":true,"
              "\"top_logprobs\":4,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
              "\"top_k\":5,\"min_p\":0.1,\"repetition_penalty\":1.2,\"ignore_eos\":true,"
              "\"min_tokens\":2,\"stop_token_ids\":[7],\"skip_special_tokens\":false,"
              "\"chat_template_kwargs\":{\"enable_thinking\":false},"
              "\"add_generation_prompt\":false,\"seed\":3,\"user\":\"u\"}",
              &r, &e),
        PD_OK);
    CHECK(r.text == NULL);
    CHECK_INT(cJSON_GetArraySize(r.messages), 3);
    const cJSON *m1 = cJSON_GetArrayItem(r.messages, 1);
    CHECK_STR(cJSON_GetObjectItem(m1, "content")->valuestring, "Hi\nthere");
    CHECK_STR(cJSON_GetObjectItem(m1, "name")->valuestring, "bob");
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 2), "content")->valuestring, "");
    CHECK_INT(r.sampling.max_new_tokens, 9);
    CHECK(r.max_tokens_given);
    CHECK(r.return_logprob);
    CHECK_INT(r.sampling.n_logprobs, 4);
    CHECK(r.stream && r.include_usage);
    CHECK_INT(r.sampling.top_k, 5);
    CHECK_DBL(r.sampling.min_p, 0.1, 1e-6);
    CHECK_DBL(r.sampling.repetition_penalty, 1.2, 1e-6);
    CHECK(r.sampling.ignore_eos);
    CHECK_INT(r.min_tokens, 2);
    CHECK_INT(r.sampling.min_new_tokens, 2);
    CHECK_INT(r.sampling.stop_token_ids[0], 7);
    CHECK(!r.skip_special_tokens);
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(r.chat_template_kwargs, "enable_thinking")));
    CHECK(!r.add_generation_prompt);
    CHECK(r.sampling.has_seed && r.sampling.seed == 3);
    pd_api_request_free(&r);

    /* defaults: max_tokens not given (filled from the context later), add_generation_prompt */
    CHECK_OK(parse(PD_API_CHAT,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                   "\"max_tokens\":null}",
                   &r, &e));
    CHECK(!r.max_tokens_given);
    CHECK(r.add_generation_prompt);
    CHECK(!r.return_logprob);
    pd_api_request_free(&r);

    EXPECT_BAD(PD_API_CHAT, "{\"model\":\"tiny\"}", 400, "messages", "needs 'messages'");
    EXPECT_BAD(PD_API_CHAT, "{\"messages\":[]}", 400, "messages", "must not be empty");
    EXPECT_BAD(PD_API_CHAT, "{\"messages\":\"hi\"}", 400, "messages", "must be a list");
    EXPECT_BAD(PD_API_CHAT, "{\"messages\":[\"hi\"]}", 400, "messages[0]", "must be an object");
    EXPECT_BAD(PD_API_CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "messages[0].role",
               "must be a string, got nothing");
    EXPECT_BAD(PD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
               "messages[0].content", "string or a list of text parts");
    EXPECT_BAD(PD_API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
               "\"image_url\":{}}]}]}",
               400, "messages[0].content[0]", "takes no images"); /* test_api_images.c */
    EXPECT_BAD(PD_API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
               "messages[0].content", ".text must be a string");
    const char *ok = "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]";
    char b[512];
#define CHAT_BAD(extra, param, needle)                                                             \
    snprintf(b, sizeof(b), "{%s,%s}", ok, extra);                                                  \
    EXPECT_BAD(PD_API_CHAT, b, 400, param, needle)
    CHAT_BAD("\"max_tokens\":-1", "max_tokens", "must be in [1,");
    CHAT_BAD("\"max_completion_tokens\":3e10", "max_completion_tokens", "must be in [1,");
    CHAT_BAD("\"temperature\":-0.5", "temperature", "must be >= 0");
    CHAT_BAD("\"temperature\":\"0\"", "temperature", "must be a number");
    CHAT_BAD("\"top_p\":0", "top_p", "(0, 1]");
    CHAT_BAD("\"logprobs\":1", "logprobs", "must be a boolean");
    CHAT_BAD("\"top_logprobs\":2", "top_logprobs", "needs 'logprobs': true");
    CHAT_BAD("\"logprobs\":true,\"top_logprobs\":21", "top_logprobs", "[0, 20]");
    CHAT_BAD("\"n\":2", "n", "only n = 1");
    CHAT_BAD("\"stop\":{}", "stop", "string or a list");
    CHAT_BAD("\"chat_template_kwargs\":[]", "chat_template_kwargs", "must be an object");
    CHAT_BAD("\"logit_bias\":{\"1\":-100.5}", "logit_bias", "[-100, 100]");
    CHAT_BAD("\"tools\":[{\"type\":\"function\"}]", "tools", "not supported");
    CHAT_BAD("\"stream\":1", "stream", "must be a boolean");
    CHAT_BAD("\"presence_penalty\":-2.5", "presence_penalty", "[-2, 2]");
    CHAT_BAD("\"repetition_penalty\":0", "repetition_penalty", "(0, 2]");
    CHAT_BAD("\"min_tokens\":-1", "min_tokens", "[0,");
#undef CHAT_BAD
}

static void test_length_and_ids(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    /* logit_bias: every entry parsed; ids checked against the vocabulary with the prompt's */
    CHECK_OK(parse(PD_API_CHAT,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                   "\"logit_bias\":{\"5\":10,\"99\":-100}}",
                   &r, &e));
    CHECK_INT(r.sampling.n_logit_bias, 2);
    CHECK(r.sampling.logit_bias_ids[0] == 5 && r.sampling.logit_bias[0] == 10.0f);
    CHECK(r.sampling.logit_bias_ids[1] == 99 && r.sampling.logit_bias[1] == -100.0f);
    CHECK_OK(pd_api_check_token_ids(&r, 100, &e));
    CHECK_INT(pd_api_check_token_ids(&r, 99, &e), PD_EINVAL);
    CHECK_STR(e.param, "logit_bias");
    CHECK(strstr(e.message, "token id 99 is outside the vocabulary") != NULL);
    pd_api_request_free(&r);
    CHECK_OK(parse(PD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", &r, &e));
    CHECK_INT(pd_api_check_length(&r, 100, 100, &e), PD_EINVAL);
    CHECK_INT(e.status, 400);
    CHECK_STR(e.message, "The input (100 tokens) is longer than the model's context length (100 "
                         "tokens, --context-length).");
    CHECK_STR(e.code, "context_length_exceeded");
    CHECK_STR(e.param, "messages");
    CHECK_INT(pd_api_check_length(&r, 250, 100, &e), PD_EINVAL);
    CHECK(strstr(e.message, "250 tokens") && strstr(e.message, "100 tokens"));
    CHECK_OK(pd_api_check_length(&r, 30, 100, &e));
    CHECK_INT(r.sampling.max_new_tokens, 70); /* chat default: the rest of the context */
    CHECK_INT(pd_api_check_length(&r, 0, 100, &e), PD_EINVAL);
    CHECK(strstr(e.message, "empty") != NULL);
    pd_api_request_free(&r);

    /* prompt logprobs: asked for when logprob_start_len falls inside the prompt */
    CHECK_OK(parse(PD_API_GENERATE,
                   "{\"text\":\"a\",\"return_logprob\":true,\"logprob_start_len\":2}", &r, &e));
    CHECK_OK(pd_api_check_length(&r, 5, 1000, &e));
    CHECK(pd_api_wants_input_logprobs(&r, 5));
    CHECK(!pd_api_wants_input_logprobs(&r, 2)); /* starts past the prompt: nothing asked */
    r.return_logprob = false;
    CHECK(!pd_api_wants_input_logprobs(&r, 5)); /* no logprobs at all: ignored, as SGLang */
    pd_api_request_free(&r);
    /* completions echo + logprobs: every prompt token's, as vLLM; max_tokens 0 with echo */
    CHECK_OK(parse(PD_API_COMPLETIONS,
                   "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":2,\"max_tokens\":0}", &r, &e));
    CHECK_INT(r.logprob_start_len, 0);
    CHECK_INT(r.sampling.max_new_tokens, 0);
    CHECK(pd_api_wants_input_logprobs(&r, 1));
    pd_api_request_free(&r);
    CHECK_OK(parse(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":2}", &r, &e));
    CHECK(!pd_api_wants_input_logprobs(&r, 5)); /* no echo: the completion's only */
    pd_api_request_free(&r);

    CHECK_OK(parse(PD_API_COMPLETIONS, "{\"prompt\":[1,2,99],\"max_tokens\":60}", &r, &e));
    CHECK_OK(pd_api_check_length(&r, 40, 100, &e));
    CHECK_INT(pd_api_check_length(&r, 41, 100, &e), PD_EINVAL);
    CHECK_STR(e.param, "max_tokens");
    CHECK_STR(e.code, "context_length_exceeded");
    CHECK_STR(e.message,
              "Requested token count exceeds the model's maximum context length of 100 tokens "
              "(--context-length). You requested a total of 101 tokens: 41 tokens from the input "
              "and 60 tokens for the completion. Please reduce the input or the completion to fit "
              "within the limit.");
    CHECK_OK(pd_api_check_length(&r, 41, 0, &e)); /* unknown context: no check */
    CHECK_OK(pd_api_check_token_ids(&r, 100, &e));
    CHECK_INT(pd_api_check_token_ids(&r, 99, &e), PD_EINVAL);
    CHECK_STR(e.param, "prompt");
    CHECK(strstr(e.message, "[2] = 99") != NULL);
    pd_api_request_free(&r);

    CHECK_OK(parse(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"stop_token_ids\":[5]}}",
                   &r, &e));
    CHECK_INT(pd_api_check_token_ids(&r, 5, &e), PD_EINVAL);
    CHECK_STR(e.param, "stop_token_ids");
    CHECK_INT(pd_api_check_length(&r, 10, 100, &e), PD_EINVAL); /* 10 + 128 > 100 */
    CHECK_STR(e.param, "sampling_params.max_new_tokens");
    pd_api_request_free(&r);
}

static void test_chat_prompt(void) {
    struct pd_chat_template *t = NULL;
    CHECK_OK(pd_chat_template_new(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}{% if enable_thinking is defined and "
        "not enable_thinking %}[nothink]{% endif %}"
        "{% if messages[0].content == 'boom' %}{{ raise_exception('no boom') }}{% endif %}",
        &t));
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_OK(parse(PD_API_CHAT,
                   "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                   "\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
                   "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                   &r, &e));
    char *s = NULL;
    size_t n = 0;
    CHECK_OK(pd_api_render_chat_prompt(&r, t, "<s>", "</s>", &s, &n, &e));
    CHECK_STR(s, "<user>a\nb<assistant>[nothink]");
    CHECK_INT(n, strlen("<user>a\nb<assistant>[nothink]"));
    pd_free(s);
    pd_api_request_free(&r);
    CHECK_OK(parse(PD_API_CHAT,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"boom\"}],"
                   "\"add_generation_prompt\":false}",
                   &r, &e));
    CHECK_INT(pd_api_render_chat_prompt(&r, t, NULL, NULL, &s, &n, &e), PD_EINVAL);
    CHECK_INT(e.status, 400);
    CHECK(strstr(e.message, "no boom") != NULL);
    pd_api_request_free(&r);
    pd_chat_template_free(t);
}

static cJSON *parse_out(char *s) {
    cJSON *j = cJSON_Parse(s);
    CHECK(j != NULL);
    pd_free(s);
    return j;
}

static const char *jstr(const cJSON *o, const char *path) {
    /* "a.b.c" through objects */
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cJSON_IsString(cur) ? cur->valuestring : NULL;
}

static double jnum(const cJSON *o, const char *path) {
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cJSON_IsNumber(cur) ? cur->valuedouble : -12345;
}

static void test_error_render(void) {
    struct pd_api_error e;
    CHECK_INT(pd_api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                               "no model %s", "x"),
              PD_EINVAL);
    char *s;
    CHECK_OK(pd_api_error_render(&e, &s));
    CHECK_STR(s, "{\"error\":{\"message\":\"no model x\",\"type\":\"invalid_request_error\","
                 "\"param\":\"model\",\"code\":\"model_not_found\"}}");
    pd_free(s);
    pd_api_error_set(&e, 503, "server_error", NULL, NULL, "queue full");
    CHECK_OK(pd_api_error_render(&e, &s));
    CHECK_STR(s, "{\"error\":{\"message\":\"queue full\",\"type\":\"server_error\",\"param\":null,"
                 "\"code\":null}}");
    pd_free(s);
    char id[64];
    pd_api_format_id(id, sizeof(id), "chatcmpl-", 0x0123456789abcdefull, 0xfull);
    CHECK_STR(id, "chatcmpl-0123456789abcdef000000000000000f");
}

static size_t tok_text(void *ud, int32_t id, char *buf, size_t cap) {
    (void)ud;
    if (id == 9) { /* half a UTF-8 character */
        buf[0] = (char)0xE4;
        return 1;
    }
    return (size_t)snprintf(buf, cap, "t%d", (int)id);
}

static void test_render_generate(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_OK(parse(PD_API_GENERATE,
                   "{\"text\":\"a\",\"return_logprob\":true,\"top_logprobs_num\":2}", &r, &e));
    int32_t ids[] = {5, 9, 2};
    struct pd_sample lp[3] = {{.token = 5,
                               .logprob = -0.5f,
                               .n_top = 2,
                               .top_ids = {5, 6},
                               .top_logprobs = {-0.5f, -1.5f}},
                              {.token = 9, .logprob = -1.0f},
                              {.token = 2, .logprob = -0.25f}};
    struct pd_api_result res = {.id = "req-1",
                                .text = "hello",
                                .text_len = 5,
                                .output_ids = ids,
                                .n_output_ids = 3,
                                .prompt_tokens = 4,
                                .completion_tokens = 3,
                                .cached_tokens = 2,
                                .finish = PD_API_FINISH_STOP,
                                .matched_token = 2,
                                .e2e_latency = 0.25,
                                .logprobs = lp,
                                .n_logprobs = 3};
    char *s;
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    cJSON *j = parse_out(s);
    CHECK_STR(jstr(j, "text"), "hello");
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "output_ids")), 3);
    CHECK_STR(jstr(j, "meta_info.id"), "req-1");
    CHECK_STR(jstr(j, "meta_info.finish_reason.type"), "stop");
    CHECK_INT(jnum(j, "meta_info.finish_reason.matched"), 2);
    CHECK_INT(jnum(j, "meta_info.prompt_tokens"), 4);
    CHECK_INT(jnum(j, "meta_info.completion_tokens"), 3);
    CHECK_INT(jnum(j, "meta_info.cached_tokens"), 2);
    CHECK_DBL(jnum(j, "meta_info.e2e_latency"), 0.25, 1e-9);
    const cJSON *mi = cJSON_GetObjectItem(j, "meta_info");
    const cJSON *otl = cJSON_GetObjectItem(mi, "output_token_logprobs");
    CHECK_INT(cJSON_GetArraySize(otl), 3);
    CHECK_DBL(cJSON_GetArrayItem(cJSON_GetArrayItem(otl, 0), 0)->valuedouble, -0.5, 1e-6);
    CHECK_INT(cJSON_GetArrayItem(cJSON_GetArrayItem(otl, 0), 1)->valuedouble, 5);
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(otl, 0), 2)));
    const cJSON *top = cJSON_GetObjectItem(mi, "output_top_logprobs");
    CHECK_INT(cJSON_GetArraySize(cJSON_GetArrayItem(top, 0)), 2);
    cJSON_Delete(j);

    /* stop string, length, abort, and a stream event that is still running */
    res.matched_stop = "\n\n";
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "meta_info.finish_reason.matched"), "\n\n");
    cJSON_Delete(j);
    res.finish = PD_API_FINISH_LENGTH;
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "meta_info.finish_reason.type"), "length");
    CHECK_INT(jnum(j, "meta_info.finish_reason.length"), 3);
    cJSON_Delete(j);
    res.finish = PD_API_FINISH_ABORT;
    res.abort_message = "client gone";
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "meta_info.finish_reason.type"), "abort");
    CHECK_STR(jstr(j, "meta_info.finish_reason.message"), "client gone");
    cJSON_Delete(j);
    res.finish = PD_API_FINISH_NONE;
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    j = parse_out(s);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "meta_info"), "finish_reason")));
    cJSON_Delete(j);
    pd_api_request_free(&r);

    /* without logprobs: no logprob keys; text with a NUL-free slice of a longer buffer */
    CHECK_OK(parse(PD_API_GENERATE, "{\"text\":\"a\"}", &r, &e));
    res.text = "hello world";
    res.text_len = 5;
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "text"), "hello");
    CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "meta_info"), "output_token_logprobs") ==
          NULL);
    cJSON_Delete(j);

    /* a NUL byte in the generated text (byte-level token 0x00) is escaped, not a cut */
    res.text = "a\0b\"\x01"
               "c";
    res.text_len = 6;
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    CHECK(strstr(s, "\"text\":\"a\\u0000b\\\"\\u0001c\"") != NULL);
    j = parse_out(s);
    CHECK(j != NULL);
    cJSON_Delete(j);

    /* output_ids print exactly: none, 0, the largest id, and more than fit the stack buffer */
    res.text = "x";
    res.text_len = 1;
    res.n_output_ids = 0;
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    CHECK(strstr(s, "\"output_ids\":[]") != NULL);
    pd_free(s);
    int32_t many[300];
    for (int i = 0; i < 300; i++)
        many[i] = i == 0 ? 0 : i == 1 ? INT32_MAX : i * 7919;
    res.output_ids = many;
    res.n_output_ids = 300;
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    j = parse_out(s);
    const cJSON *oid = cJSON_GetObjectItem(j, "output_ids");
    CHECK_INT(cJSON_GetArraySize(oid), 300);
    for (int i = 0; i < 300; i++)
        CHECK(cJSON_GetArrayItem(oid, i)->valuedouble == (double)many[i]);
    cJSON_Delete(j);
    pd_api_request_free(&r);
}

static void test_render_openai(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_OK(
        parse(PD_API_CHAT,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,"
              "\"top_logprobs\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
              &r, &e));
    struct pd_sample lp[2] = {{.token = 5,
                               .logprob = -0.5f,
                               .n_top = 2,
                               .top_ids = {5, 6},
                               .top_logprobs = {-0.5f, -1.5f}},
                              {.token = 9, .logprob = -1.0f}};
    struct pd_api_result res = {.id = "chatcmpl-abc",
                                .model = "tiny",
                                .created = 1700000000,
                                .text = "Hi",
                                .text_len = 2,
                                .prompt_tokens = 7,
                                .completion_tokens = 2,
                                .cached_tokens = 3,
                                .finish = PD_API_FINISH_STOP,
                                .matched_token = -1,
                                .logprobs = lp,
                                .n_logprobs = 2,
                                .token_text = tok_text};
    char *s;
    CHECK_OK(pd_api_render_chat(&r, &res, &s));
    cJSON *j = parse_out(s);
    CHECK_STR(jstr(j, "id"), "chatcmpl-abc");
    CHECK_STR(jstr(j, "object"), "chat.completion");
    CHECK_INT(jnum(j, "created"), 1700000000);
    CHECK_STR(jstr(j, "model"), "tiny");
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK_INT(jnum(c0, "index"), 0);
    CHECK_STR(jstr(c0, "message.role"), "assistant");
    CHECK_STR(jstr(c0, "message.content"), "Hi");
    CHECK_STR(jstr(c0, "finish_reason"), "stop");
    const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content");
    CHECK_INT(cJSON_GetArraySize(content), 2);
    CHECK_STR(jstr(cJSON_GetArrayItem(content, 0), "token"), "t5");
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(content, 0), "bytes")), 2);
    CHECK_INT(
        cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(content, 0), "top_logprobs")),
        1); /* capped at top_logprobs */
    /* half a character: the token string is U+FFFD, the bytes are the raw byte */
    CHECK_STR(jstr(cJSON_GetArrayItem(content, 1), "token"), "\xEF\xBF\xBD");
    CHECK_INT(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(content, 1), "bytes"), 0)
                  ->valuedouble,
              0xE4);
    CHECK_INT(jnum(j, "usage.prompt_tokens"), 7);
    CHECK_INT(jnum(j, "usage.completion_tokens"), 2);
    CHECK_INT(jnum(j, "usage.total_tokens"), 9);
    CHECK_INT(jnum(j, "usage.prompt_tokens_details.cached_tokens"), 3);
    cJSON_Delete(j);

    /* chunks: first has the role; running chunks say finish_reason null; usage null in every
     * chunk with include_usage, then the usage chunk with choices [] */
    res.finish = PD_API_FINISH_NONE;
    res.logprobs = NULL;
    res.n_logprobs = 0;
    CHECK_OK(pd_api_render_chat_chunk(&r, &res, true, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "object"), "chat.completion.chunk");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK_STR(jstr(c0, "delta.role"), "assistant");
    CHECK_STR(jstr(c0, "delta.content"), "Hi");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "usage")));
    cJSON_Delete(j);
    res.finish = PD_API_FINISH_LENGTH;
    CHECK_OK(pd_api_render_chat_chunk(&r, &res, false, &s));
    j = parse_out(s);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK(jstr(c0, "delta.role") == NULL);
    CHECK_STR(jstr(c0, "finish_reason"), "length");
    cJSON_Delete(j);
    CHECK_OK(pd_api_render_usage_chunk(&r, &res, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "object"), "chat.completion.chunk");
    CHECK(cJSON_IsArray(cJSON_GetObjectItem(j, "choices")));
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 0);
    CHECK_INT(jnum(j, "usage.total_tokens"), 9);
    cJSON_Delete(j);
    pd_api_request_free(&r);

    /* completions */
    CHECK_OK(parse(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":1}", &r, &e));
    res = (struct pd_api_result){.id = "cmpl-x",
                                 .model = "tiny",
                                 .created = 5,
                                 .text = "t5t9",
                                 .text_len = 4,
                                 .prompt_tokens = 1,
                                 .completion_tokens = 2,
                                 .finish = PD_API_FINISH_LENGTH,
                                 .matched_token = -1,
                                 .logprobs = lp,
                                 .n_logprobs = 2,
                                 .token_text = tok_text};
    CHECK_OK(pd_api_render_completion(&r, &res, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "object"), "text_completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK_STR(jstr(c0, "text"), "t5t9");
    CHECK_STR(jstr(c0, "finish_reason"), "length");
    const cJSON *clp = cJSON_GetObjectItem(c0, "logprobs");
    CHECK_STR(cJSON_GetArrayItem(cJSON_GetObjectItem(clp, "tokens"), 0)->valuestring, "t5");
    CHECK_INT(cJSON_GetArrayItem(cJSON_GetObjectItem(clp, "text_offset"), 1)->valuedouble, 2);
    CHECK_DBL(jnum(cJSON_GetArrayItem(cJSON_GetObjectItem(clp, "top_logprobs"), 0), "t6"), -1.5,
              1e-6);
    CHECK_INT(jnum(j, "usage.total_tokens"), 3);
    cJSON_Delete(j);
    res.finish = PD_API_FINISH_NONE;
    CHECK_OK(pd_api_render_completion_chunk(&r, &res, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "object"), "text_completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    CHECK(cJSON_GetObjectItem(j, "usage") == NULL); /* no include_usage */
    cJSON_Delete(j);
    pd_api_request_free(&r);
    /* no logprobs asked: "logprobs": null */
    CHECK_OK(parse(PD_API_COMPLETIONS, "{\"prompt\":\"a\"}", &r, &e));
    CHECK_OK(pd_api_render_completion(&r, &res, &s));
    j = parse_out(s);
    CHECK(cJSON_IsNull(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs")));
    cJSON_Delete(j);
    pd_api_request_free(&r);
}

static void test_info(void) {
    char *s;
    CHECK_OK(pd_api_render_models("tiny", "/models/tiny", 1700000000, 2048, &s));
    cJSON *j = parse_out(s);
    CHECK_STR(jstr(j, "object"), "list");
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    CHECK_STR(jstr(m, "id"), "tiny");
    CHECK_STR(jstr(m, "object"), "model");
    CHECK_STR(jstr(m, "owned_by"), "sglang");
    CHECK_STR(jstr(m, "root"), "/models/tiny");
    CHECK_INT(jnum(m, "max_model_len"), 2048);
    CHECK_INT(jnum(m, "created"), 1700000000);
    cJSON_Delete(j);

    struct pd_server_args a;
    pd_server_args_defaults(&a);
    a.model_path = "/models/tiny";
    a.served_model_name = "tiny";
    a.disaggregation_mode = PD_DISAGG_DECODE;
    cJSON *extra = cJSON_CreateObject();
    cJSON_AddStringToObject(extra, "role", "decode");
    struct pd_api_runtime_info rt = {.version = "0.1.0",
                                     .context_length = 2048,
                                     .max_total_tokens = 4096,
                                     .num_pages = 256,
                                     .free_pages = 250,
                                     .transport = "ucx:sm",
                                     .backend = "cpu",
                                     .extra = extra};
    CHECK_OK(pd_api_render_server_info(&a, &rt, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "model_path"), "/models/tiny");
    CHECK_STR(jstr(j, "served_model_name"), "tiny");
    CHECK_STR(jstr(j, "disaggregation_mode"), "decode");
    CHECK_INT(jnum(j, "tp_size"), a.tp_size);
    CHECK_INT(jnum(j, "dp_size"), 1);
    CHECK_INT(jnum(j, "context_length"), 2048);
    CHECK_INT(jnum(j, "max_total_tokens"), 4096);
    CHECK_INT(jnum(j, "max_running_requests"), a.max_running_requests);
    CHECK_INT(jnum(j, "page_size"), a.page_size);
    CHECK_INT(jnum(j, "port"), a.port);
    CHECK_STR(jstr(j, "version"), "0.1.0");
    CHECK_STR(jstr(j, "transfer_transport"), "ucx:sm");
    CHECK_INT(jnum(j, "kv_pool.num_pages"), 256);
    CHECK_INT(jnum(j, "kv_pool.free_pages"), 250);
    CHECK_STR(jstr(j, "role"), "decode");
    const cJSON *is = cJSON_GetObjectItem(j, "internal_states");
    CHECK(cJSON_IsArray(is) && cJSON_GetArraySize(is) >= 1);
    CHECK(cJSON_IsObject(cJSON_GetArrayItem(is, 0)));
    cJSON_Delete(j);
    cJSON_Delete(extra);

    const char *arch[] = {"LlamaForCausalLM"};
    CHECK_OK(pd_api_render_model_info("/m", NULL, "llama", arch, 1, &s));
    j = parse_out(s);
    CHECK_STR(jstr(j, "model_path"), "/m");
    CHECK_STR(jstr(j, "tokenizer_path"), "/m");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "is_generation")));
    CHECK_STR(jstr(j, "model_type"), "llama");
    CHECK_STR(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0)->valuestring,
              "LlamaForCausalLM");
    cJSON_Delete(j);

    CHECK_OK(pd_api_render_get_load(7, false, &s));
    CHECK_STR(s, "{\"load\":7}");
    pd_free(s);
    CHECK_OK(pd_api_render_get_load(2, true, &s));
    CHECK_STR(s, "{\"load\":2,\"local_prefill\":true}");
    pd_free(s);

    struct pd_api_rank_load l = {.num_running_reqs = 3,
                                 .num_waiting_reqs = 2,
                                 .num_used_tokens = 100,
                                 .max_total_num_tokens = 400};
    CHECK_OK(pd_api_render_loads(&l, 1, "2026-01-01T00:00:00Z", &s));
    j = parse_out(s);
    CHECK_INT(jnum(j, "dp_rank_count"), 1);
    const cJSON *l0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "loads"), 0);
    CHECK_INT(jnum(l0, "dp_rank"), 0);
    CHECK_INT(jnum(l0, "num_running_reqs"), 3);
    CHECK_INT(jnum(l0, "num_waiting_reqs"), 2);
    CHECK_INT(jnum(l0, "num_used_tokens"), 100);
    CHECK_INT(jnum(l0, "max_total_num_tokens"), 400);
    CHECK_DBL(jnum(l0, "token_usage"), 0.25, 1e-9);
    CHECK_INT(jnum(j, "aggregate.total_reqs"), 5);
    cJSON_Delete(j);
}

/* A "\u0000" inside a stop string is part of it; matching is byte-exact past NUL bytes. */
static void test_stop_nul(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_INT(parse(PD_API_GENERATE,
                    "{\"text\":\"a\",\"sampling_params\":{\"stop\":[\"x\\u0000y\",\"\\u00e9\\n\","
                    "\"\\ud83d\\ude00\"]}}",
                    &r, &e),
              PD_OK);
    CHECK_INT(r.n_stop, 3);
    CHECK_INT(r.stop_len[0], 3);
    CHECK(memcmp(r.stop[0], "x\0y", 3) == 0);
    CHECK_INT(r.stop_len[1], 3);
    CHECK(memcmp(r.stop[1], "\xc3\xa9\n", 3) == 0);
    CHECK_INT(r.stop_len[2], 4);
    CHECK(memcmp(r.stop[2], "\xf0\x9f\x98\x80", 4) == 0);
    size_t at = 99;
    const char text[] = "ab\0cx\0y tail"; /* 12 bytes */
    CHECK_INT(pd_api_find_stop(&r, text, 12, 0, &at), 0);
    CHECK_INT(at, 4);
    /* new text from byte 6 on: the match straddling the old end (bytes 4..6) is found */
    CHECK_INT(pd_api_find_stop(&r, text, 12, 6, &at), 0);
    CHECK_INT(pd_api_find_stop(&r, text, 6, 0, &at), -1); /* "x\0" only: no match yet */
    CHECK_INT(pd_api_find_stop(&r, "\0\0\xc3\xa9\n", 5, 3, &at), 1);
    CHECK_INT(at, 2);
    pd_api_request_free(&r);
    /* OpenAI: top-level stop, a string */
    CHECK_INT(parse(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":\"\\u0000\"}", &r, &e), PD_OK);
    CHECK_INT(r.n_stop, 1);
    CHECK_INT(r.stop_len[0], 1);
    CHECK_INT(pd_api_find_stop(&r, "ab\0", 3, 0, &at), 0);
    CHECK_INT(at, 2);
    pd_api_request_free(&r);
    /* a rendered matched stop keeps its NUL */
    struct pd_api_request g = {.kind = PD_API_GENERATE};
    struct pd_api_result res = {.finish = PD_API_FINISH_STOP,
                                .matched_stop = "x\0y",
                                .matched_stop_len = 3,
                                .matched_token = -1};
    char *out = NULL;
    CHECK_OK(pd_api_render_generate(&g, &res, &out));
    CHECK(out && strstr(out, "\"matched\":\"x\\u0000y\""));
    pd_free(out);
}

static const struct pd_api_config pd_cfg = {.disaggregated = true, .context_length = 100};

static cJSON *split_body(const struct pd_api_split *sp, int k) {
    cJSON *j = cJSON_Parse(sp->bodies[k]);
    CHECK(j != NULL);
    return j;
}

static void test_split(void) {
    struct pd_api_split sp;
    struct pd_api_error e;
    const char *b = "{\"text\":\"a\"}";
    /* one prompt, n 1: nothing to cut */
    CHECK_OK(pd_api_split(PD_API_GENERATE, b, strlen(b), &cfg, &sp, &e));
    CHECK(sp.count == 1 && !sp.bodies && !sp.batch);
    pd_api_split_free(&sp);
    /* a batch of one is still a batch (a list answer) */
    b = "{\"text\":[\"a\"]}";
    CHECK_OK(pd_api_split(PD_API_GENERATE, b, strlen(b), &cfg, &sp, &e));
    CHECK(sp.count == 1 && sp.bodies && sp.batch);
    pd_api_split_free(&sp);
    /* 2 prompts x n 2, per-prompt sampling_params, rooms exact, rid per prompt */
    b = "{\"input_ids\":[[1,2],[3]],\"sampling_params\":[{\"n\":2,\"max_new_tokens\":3},"
        "{\"n\":2,\"max_new_tokens\":5}],\"return_logprob\":[true,false],\"rid\":[\"p\",\"q\"],"
        "\"bootstrap_host\":\"h\",\"bootstrap_port\":[1,2,3,4],"
        "\"bootstrap_room\":[9223372036854775807,1,2,9007199254740993]}";
    CHECK_OK(pd_api_split(PD_API_GENERATE, b, strlen(b), &pd_cfg, &sp, &e));
    CHECK_INT(sp.count, 4);
    CHECK_INT(sp.n, 2);
    CHECK_INT(sp.n_prompts, 2);
    CHECK(sp.batch && sp.rid == NULL);
    const char *want_rid[] = {"p_0", "p_1", "q_0", "q_1"};
    const uint64_t want_room[] = {UINT64_C(9223372036854775807), 1, 2, UINT64_C(9007199254740993)};
    for (int k = 0; k < 4; k++) {
        struct pd_api_request r;
        CHECK_OK(
            pd_api_parse(PD_API_GENERATE, sp.bodies[k], strlen(sp.bodies[k]), &pd_cfg, &r, &e));
        CHECK_STR(r.rid, want_rid[k]);
        CHECK(r.bootstrap_room == want_room[k]);
        CHECK_INT(r.bootstrap_port, k + 1);
        CHECK_STR(r.bootstrap_host, "h");
        CHECK_INT(r.n_input_ids, k < 2 ? 2 : 1);
        CHECK_INT(r.input_ids[0], k < 2 ? 1 : 3);
        CHECK_INT(r.sampling.max_new_tokens, k < 2 ? 3 : 5);
        CHECK(r.return_logprob == (k < 2));
        pd_api_request_free(&r);
    }
    pd_api_split_free(&sp);
    /* OpenAI: n from the top level, a string rid gets _k, the prompt list is cut */
    b = "{\"prompt\":[\"x\",\"y\"],\"n\":3,\"rid\":\"r\",\"seed\":5}";
    CHECK_OK(pd_api_split(PD_API_COMPLETIONS, b, strlen(b), &cfg, &sp, &e));
    CHECK_INT(sp.count, 6);
    CHECK_STR(sp.rid, "r");
    cJSON *j = split_body(&sp, 4);
    CHECK_STR(cJSON_GetObjectItem(j, "prompt")->valuestring, "y");
    CHECK_STR(cJSON_GetObjectItem(j, "rid")->valuestring, "r_4");
    CHECK(cJSON_GetObjectItem(j, "n") == NULL);
    CHECK_INT(cJSON_GetObjectItem(j, "seed")->valueint, 5);
    cJSON_Delete(j);
    pd_api_split_free(&sp);
    /* chat n 2; a token-id prompt [int...] is one prompt, not a batch */
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":2}";
    CHECK_OK(pd_api_split(PD_API_CHAT, b, strlen(b), &cfg, &sp, &e));
    CHECK(sp.count == 2 && !sp.batch);
    pd_api_split_free(&sp);
    b = "{\"prompt\":[5,6,7],\"n\":2}";
    CHECK_OK(pd_api_split(PD_API_COMPLETIONS, b, strlen(b), &cfg, &sp, &e));
    CHECK(sp.count == 2 && !sp.batch);
    j = split_body(&sp, 1);
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "prompt")), 3);
    cJSON_Delete(j);
    pd_api_split_free(&sp);
    /* a body pd_api_parse refuses anyway passes through uncut */
    b = "{\"text\":";
    CHECK_OK(pd_api_split(PD_API_GENERATE, b, strlen(b), &cfg, &sp, &e));
    CHECK(sp.count == 1 && !sp.bodies);
    pd_api_split_free(&sp);
    /* refusals */
#define SPLIT_BAD(kind, c, body, want_param, needle)                                               \
    do {                                                                                           \
        const char *bb = body;                                                                     \
        CHECK_INT(pd_api_split(kind, bb, strlen(bb), c, &sp, &e), PD_EINVAL);                      \
        CHECK_INT(e.status, 400);                                                                  \
        CHECK_STR(e.param, want_param);                                                            \
        CHECK(strstr(e.message, needle) != NULL);                                                  \
        CHECK(sp.bodies == NULL);                                                                  \
    } while (0)
    SPLIT_BAD(PD_API_COMPLETIONS, &cfg, "{\"prompt\":\"a\",\"n\":0}", "n", "[1, 128]");
    SPLIT_BAD(PD_API_COMPLETIONS, &cfg, "{\"prompt\":\"a\",\"n\":129}", "n",
              "'n' is 129: must be in [1, 128] (at most --max-n samples per prompt)");
    SPLIT_BAD(PD_API_COMPLETIONS, NULL, "{\"prompt\":\"a\",\"n\":129}", "n", "[1, 128]");
    /* --max-n: the configured cap, whatever side of the default */
    static const struct pd_api_config cfg4 = {.context_length = 100, .max_n = 4};
    static const struct pd_api_config cfg200 = {.context_length = 100, .max_n = 200};
    SPLIT_BAD(PD_API_CHAT, &cfg4, "{\"messages\":[],\"n\":5}", "n",
              "'n' is 5: must be in [1, 4] (at most --max-n samples per prompt)");
    SPLIT_BAD(PD_API_GENERATE, &cfg4, "{\"text\":\"a\",\"sampling_params\":{\"n\":9}}",
              "sampling_params.n", "'sampling_params.n' is 9: must be in [1, 4]");
    b = "{\"prompt\":\"a\",\"n\":4}";
    CHECK_OK(pd_api_split(PD_API_COMPLETIONS, b, strlen(b), &cfg4, &sp, &e));
    CHECK_INT(sp.count, 4);
    pd_api_split_free(&sp);
    b = "{\"prompt\":\"a\",\"n\":200}";
    CHECK_OK(pd_api_split(PD_API_COMPLETIONS, b, strlen(b), &cfg200, &sp, &e));
    CHECK_INT(sp.count, 200);
    pd_api_split_free(&sp);
    SPLIT_BAD(PD_API_CHAT, &cfg, "{\"messages\":[],\"n\":2.5}", "n", "fractional");
    SPLIT_BAD(PD_API_GENERATE, &cfg, "{\"text\":\"a\",\"sampling_params\":{\"n\":-1}}",
              "sampling_params.n", "[1, 128]");
    SPLIT_BAD(PD_API_GENERATE, &cfg, "{\"text\":[]}", "text", "must not be empty");
    SPLIT_BAD(PD_API_GENERATE, &cfg,
              "{\"text\":[\"a\",\"b\"],\"sampling_params\":[{\"n\":2},{\"n\":3}]}",
              "sampling_params", "same 'n'");
    SPLIT_BAD(PD_API_GENERATE, &cfg, "{\"text\":[\"a\",\"b\"],\"sampling_params\":[{}]}",
              "sampling_params", "one entry per prompt (2), got 1");
    SPLIT_BAD(PD_API_GENERATE, &cfg, "{\"text\":[\"a\",\"b\"],\"rid\":[\"a\",\"b\",\"c\"]}", "rid",
              "list of 2 strings");
    SPLIT_BAD(PD_API_GENERATE, &pd_cfg, "{\"text\":[\"a\",\"b\"],\"bootstrap_room\":[1]}",
              "bootstrap_room", "list of 2 rooms");
    SPLIT_BAD(PD_API_COMPLETIONS, &pd_cfg, "{\"prompt\":\"a\",\"n\":2,\"bootstrap_room\":7}",
              "bootstrap_room", "must be a list of 2 rooms");
    SPLIT_BAD(PD_API_COMPLETIONS, &cfg,
              "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"],\"n\":128}", "n",
              "at most 1024");
    SPLIT_BAD(PD_API_COMPLETIONS, &pd_cfg,
              "{\"prompt\":\"a\",\"n\":2,\"bootstrap_room\":[1,2],\"bootstrap_host\":[\"h\"]}",
              "bootstrap_host", "list of 2 entries");
#undef SPLIT_BAD
    /* n copies of a long prompt are bounded in bytes */
    {
        size_t plen = 1u << 20;
        char *big = pd_malloc(plen + 64);
        CHECK(big != NULL);
        if (big) {
            int o = snprintf(big, 64, "{\"n\":100,\"prompt\":\"");
            memset(big + o, 'a', plen);
            strcpy(big + o + plen, "\"}");
            CHECK_INT(pd_api_split(PD_API_COMPLETIONS, big, strlen(big), &cfg, &sp, &e), PD_EINVAL);
            CHECK_STR(e.param, "n");
            CHECK(strstr(e.message, "64 MiB") != NULL);
            CHECK(sp.bodies == NULL);
            pd_free(big);
        }
    }
    /* colocated: a scalar room is ignored, as without fan-out */
    b = "{\"prompt\":\"a\",\"n\":2,\"bootstrap_room\":7}";
    CHECK_OK(pd_api_split(PD_API_COMPLETIONS, b, strlen(b), &cfg, &sp, &e));
    CHECK_INT(sp.count, 2);
    pd_api_split_free(&sp);
    /* allocation failures: a 500 or success, nothing leaked (ASan) */
    b = "{\"text\":[\"a\",\"b\"],\"rid\":\"r\",\"sampling_params\":{\"n\":2},"
        "\"bootstrap_room\":[1,2,3,4]}";
    int saw_oom = 0;
    for (long n = 0; n < 80; n++) {
        pd_alloc_fail_after(n);
        int rc = pd_api_split(PD_API_GENERATE, b, strlen(b), &pd_cfg, &sp, &e);
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || (rc == PD_ENOMEM && e.status == 500));
        saw_oom += rc == PD_ENOMEM;
        pd_api_split_free(&sp);
    }
    CHECK(saw_oom > 0);
}

/* A single request is parsed once in the daemons: pd_api_split's tree through pd_api_parse_tree
 * answers what pd_api_parse answers on the text, field for field and error for error; a body
 * the split cannot take whole (trailing bytes, not an object, batches) leaves no tree. */
static void expect_tree_same(enum pd_api_kind kind, const char *b) {
    struct pd_api_split sp;
    struct pd_api_error se, e1, e2;
    struct pd_api_request r1, r2;
    CHECK_OK(pd_api_split(kind, b, strlen(b), &pd_cfg, &sp, &se));
    CHECK(sp.root != NULL && sp.count == 1 && !sp.bodies);
    int rc1 = pd_api_parse(kind, b, strlen(b), &pd_cfg, &r1, &e1);
    int rc2 = pd_api_parse_tree(kind, b, strlen(b), sp.root, &pd_cfg, &r2, &e2);
    sp.root = NULL;
    pd_api_split_free(&sp);
    CHECK_INT(rc2, rc1);
    CHECK_INT(e2.status, e1.status);
    CHECK_STR(e2.param, e1.param);
    CHECK_STR(e2.message, e1.message);
    CHECK_INT(r2.n_input_ids, r1.n_input_ids);
    CHECK(r1.n_input_ids == 0 ||
          memcmp(r1.input_ids, r2.input_ids, (size_t)r1.n_input_ids * sizeof(int32_t)) == 0);
    CHECK((r1.text == NULL) == (r2.text == NULL));
    CHECK(!r1.text || strcmp(r1.text, r2.text) == 0);
    CHECK((r1.messages == NULL) == (r2.messages == NULL));
    CHECK_INT(r2.sampling.max_new_tokens, r1.sampling.max_new_tokens);
    CHECK(r2.sampling.temperature == r1.sampling.temperature);
    CHECK(r2.stream == r1.stream && r2.has_bootstrap_room == r1.has_bootstrap_room);
    CHECK(r2.bootstrap_room == r1.bootstrap_room && r2.bootstrap_port == r1.bootstrap_port);
    CHECK((r1.rid == NULL) == (r2.rid == NULL));
    CHECK(!r1.rid || strcmp(r1.rid, r2.rid) == 0);
    pd_api_request_free(&r1);
    pd_api_request_free(&r2);
}

static void expect_no_tree(enum pd_api_kind kind, const char *b) {
    struct pd_api_split sp;
    struct pd_api_error se;
    CHECK_OK(pd_api_split(kind, b, strlen(b), &pd_cfg, &sp, &se));
    CHECK(sp.root == NULL);
    pd_api_split_free(&sp);
}

static void test_parse_tree(void) {
    expect_tree_same(PD_API_GENERATE,
                     "{\"input_ids\":[5,6,7],\"sampling_params\":{\"max_new_tokens\":9,"
                     "\"temperature\":0.5},\"stream\":true,\"rid\":\"r1\",\"bootstrap_host\":"
                     "\"h\",\"bootstrap_port\":7,\"bootstrap_room\":9007199254740993}");
    expect_tree_same(PD_API_GENERATE, "{\"text\":\"hello\"}");
    expect_tree_same(PD_API_COMPLETIONS,
                     "{\"model\":\"tiny\",\"prompt\":\"a b\",\"max_tokens\":3}");
    expect_tree_same(PD_API_CHAT,
                     "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    /* the same refusals, naming the same field */
    expect_tree_same(PD_API_GENERATE, "{\"input_ids\":[1,\"x\"]}");
    expect_tree_same(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"temperature\":-1}}");
    expect_tree_same(PD_API_CHAT, "{\"messages\":7}");
    expect_tree_same(PD_API_GENERATE, "{}");
    /* no tree: pd_api_parse parses again and says what is wrong */
    expect_no_tree(PD_API_GENERATE, "{\"text\":\"a\"} x");
    expect_no_tree(PD_API_GENERATE, "[1]");
    expect_no_tree(PD_API_GENERATE, "{\"text\":[\"a\",\"b\"]}");
    expect_no_tree(PD_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"n\":2}}");
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_INT(parse(PD_API_GENERATE, "{\"text\":\"a\"} x", &r, &e), PD_EINVAL);
    CHECK(strstr(e.message, "not valid JSON") != NULL);
}

/* The hand printer the renderer (ids) and the router (routing text) share, against printf. */
static void test_json_u64(void) {
    uint64_t vals[] = {0,
                       9,
                       10,
                       99,
                       100,
                       151935,
                       UINT64_C(4294967296),
                       UINT64_C(9007199254740993),
                       UINT64_MAX - 1,
                       UINT64_MAX};
    uint64_t x = UINT64_C(0x9E3779B97F4A7C15);
    for (int i = 0; i < 10 + 1000; i++) {
        uint64_t v = i < 10 ? vals[i] : (x = x * UINT64_C(6364136223846793005) + 1) >> (i % 64);
        char got[PD_JSON_U64_CHARS], want[32];
        size_t n = pd_json_u64(v, got);
        snprintf(want, sizeof(want), "%" PRIu64, v);
        CHECK_STR(got, want);
        CHECK_INT(n, strlen(want));
    }
}

static void test_merge(void) {
    char *out = NULL;
    char *gen[] = {"{\"text\":\"a\"}", "{\"text\":\"b\"}"};
    CHECK_OK(pd_api_merge(PD_API_GENERATE, 1, gen, 2, &out));
    CHECK_STR(out, "[{\"text\":\"a\"},{\"text\":\"b\"}]");
    pd_free(out);
    /* 2 prompts x n 2: prompt tokens once per prompt, completion tokens all */
    char *oa[4];
    char buf[4][256];
    const int prompt[] = {5, 5, 7, 7}, completion[] = {1, 2, 3, 4}, cached[] = {2, 2, 0, 0};
    for (int k = 0; k < 4; k++) {
        snprintf(buf[k], sizeof(buf[k]),
                 "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,"
                 "\"text\":\"t%d\"}],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                 "\"total_tokens\":0,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}",
                 k, prompt[k], completion[k], cached[k]);
        oa[k] = buf[k];
    }
    CHECK_OK(pd_api_merge(PD_API_COMPLETIONS, 2, oa, 4, &out));
    cJSON *j = cJSON_Parse(out);
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    CHECK_INT(cJSON_GetArraySize(ch), 4);
    for (int k = 0; k < 4; k++) {
        char want[8];
        snprintf(want, sizeof(want), "t%d", k);
        CHECK_INT(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, k), "index")->valueint, k);
        CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, k), "text")->valuestring, want);
    }
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    CHECK_INT(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 12);
    CHECK_INT(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 10);
    CHECK_INT(cJSON_GetObjectItem(u, "total_tokens")->valueint, 22);
    CHECK_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")
                  ->valueint,
              2);
    cJSON_Delete(j);
    pd_free(out);
    char *broken[] = {"{\"choices\":[]}"};
    CHECK_ERR(pd_api_merge(PD_API_CHAT, 1, broken, 1, &out), PD_EINVAL, "no choice");
}

static void test_alloc_failures(void) {
    /* every allocation failure is a 500 with nothing leaked (ASan checks the leaks) */
    const char *body =
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
        "\"text\":\"Hi\"},{\"type\":\"text\",\"text\":\"x\"}]}],\"stop\":[\"a\",\"b\"],"
        "\"chat_template_kwargs\":{\"k\":1},\"rid\":\"r\"}";
    int saw_oom = 0;
    for (long n = 0; n < 40; n++) {
        struct pd_api_request r;
        struct pd_api_error e;
        pd_alloc_fail_after(n);
        int rc = pd_api_parse(PD_API_CHAT, body, strlen(body), &cfg, &r, &e);
        pd_alloc_fail_after(-1);
        if (rc == PD_ENOMEM) {
            saw_oom++;
            CHECK_INT(e.status, 500);
        } else {
            CHECK_INT(rc, PD_OK);
        }
        pd_api_request_free(&r);
    }
    CHECK(saw_oom > 0);
}

/* Prompt logprobs: /generate input_token_logprobs/input_top_logprobs with the first prompt
 * token's null; completions echo lists the prompt's entries, then the completion's from
 * logprob_offset, the first token's logprob and top null (vLLM). */
static void test_render_input_logprobs(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    CHECK_OK(parse(PD_API_GENERATE,
                   "{\"text\":\"a\",\"return_logprob\":true,\"top_logprobs_num\":1,"
                   "\"logprob_start_len\":0}",
                   &r, &e));
    struct pd_sample in[2] = {
        {.token = 7, .logprob = NAN},
        {.token = 8, .logprob = -2.0f, .n_top = 1, .top_ids = {3}, .top_logprobs = {-0.5f}}};
    struct pd_sample out[1] = {{.token = 4, .logprob = -0.75f}};
    struct pd_api_result res = {.id = "x",
                                .text = "T",
                                .text_len = 1,
                                .prompt_tokens = 2,
                                .completion_tokens = 1,
                                .matched_token = -1,
                                .logprobs = out,
                                .n_logprobs = 1,
                                .logprob_offset = 2,
                                .input_logprobs = in,
                                .n_input_logprobs = 2};
    char *s;
    CHECK_OK(pd_api_render_generate(&r, &res, &s));
    cJSON *j = parse_out(s);
    const cJSON *mi = cJSON_GetObjectItem(j, "meta_info");
    const cJSON *il = cJSON_GetObjectItem(mi, "input_token_logprobs");
    CHECK_INT(cJSON_GetArraySize(il), 2);
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(il, 0), 0)));
    CHECK_INT(cJSON_GetArrayItem(cJSON_GetArrayItem(il, 0), 1)->valueint, 7);
    CHECK(cJSON_GetArrayItem(cJSON_GetArrayItem(il, 1), 0)->valuedouble == -2.0);
    const cJSON *it = cJSON_GetObjectItem(mi, "input_top_logprobs");
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(it, 0)));
    CHECK_INT(cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetArrayItem(it, 1), 0), 1)->valueint, 3);
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(mi, "output_token_logprobs")), 1);
    cJSON_Delete(j);
    pd_api_request_free(&r);

    CHECK_OK(parse(PD_API_COMPLETIONS, "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":1}", &r, &e));
    CHECK_OK(pd_api_render_completion(&r, &res, &s));
    j = parse_out(s);
    const cJSON *lp =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
    const cJSON *tlp = cJSON_GetObjectItem(lp, "token_logprobs");
    const cJSON *off = cJSON_GetObjectItem(lp, "text_offset");
    const cJSON *top = cJSON_GetObjectItem(lp, "top_logprobs");
    CHECK_INT(cJSON_GetArraySize(tlp), 3);
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(tlp, 0)));
    CHECK(cJSON_GetArrayItem(tlp, 1)->valuedouble == -2.0);
    CHECK(cJSON_GetArrayItem(tlp, 2)->valuedouble == -0.75);
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(top, 0)));
    CHECK(cJSON_GetObjectItem(cJSON_GetArrayItem(top, 1), "<3>") != NULL);
    /* token texts "<7>", "<8>" (3 bytes each): offsets 0, 3; the completion's at 2 */
    CHECK_INT(cJSON_GetArrayItem(off, 0)->valueint, 0);
    CHECK_INT(cJSON_GetArrayItem(off, 1)->valueint, 3);
    CHECK_INT(cJSON_GetArrayItem(off, 2)->valueint, 2);
    cJSON_Delete(j);
    pd_api_request_free(&r);
}

PD_TEST_MAIN(PD_TEST(test_generate_fields), PD_TEST(test_generate_bad), PD_TEST(test_body_errors),
             PD_TEST(test_utf8), PD_TEST(test_bootstrap), PD_TEST(test_completions),
             PD_TEST(test_model_name), PD_TEST(test_chat), PD_TEST(test_length_and_ids),
             PD_TEST(test_chat_prompt), PD_TEST(test_error_render), PD_TEST(test_render_generate),
             PD_TEST(test_render_openai), PD_TEST(test_info), PD_TEST(test_alloc_failures),
             PD_TEST(test_stop_nul), PD_TEST(test_split), PD_TEST(test_parse_tree),
             PD_TEST(test_json_u64), PD_TEST(test_merge), PD_TEST(test_render_input_logprobs))
