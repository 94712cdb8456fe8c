/*
 * test_api_images.c — images in API requests (common/api_images.c and the chat parser): image
 * parts keep a message's parts as the list a vision chat template iterates, in order, with each
 * image's URL collected; /generate image_data as a string or a list; and the refusals, each a
 * 400 naming the part: a model without images, more than --limit-mm-per-prompt, a remote URL,
 * a part without its URL, an unknown part type, a batch of image lists.
 */
#include "pd_test.h"

#include "common/api.h"
#include "common/base/alloc.h"

#include <cjson/cJSON.h>
#include <string.h>

static const struct pd_api_config cfg = {.max_images = 2};

static void expect_bad(const struct pd_api_config *c, enum pd_api_kind kind, const char *body,
                       const char *param, const char *needle, int line) {
    struct pd_api_request r;
    struct pd_api_error e;
    int rc = pd_api_parse(kind, body, strlen(body), c, &r, &e);
    pd_test_checks++;
    if (rc != PD_EINVAL || e.status != 400 || strcmp(e.param, param) != 0 ||
        !strstr(e.message, needle)) {
        pd_test_failures++;
        fprintf(stderr, "line %d: %s\n  want param '%s' containing '%s'\n  got %d '%s' '%s'\n",
                line, body, param, needle, e.status, e.param, e.message);
    }
    CHECK(r.n_images == 0 && r.images == NULL && r.messages == NULL);
    pd_api_request_free(&r);
}
#define BAD(c, kind, body, param, needle) expect_bad(c, kind, body, param, needle, __LINE__)

static void test_chat_parts(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"s1\"},"
        "{\"type\":\"text\",\"text\":\"s2\"}]},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
        "\"text\":\"look\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;"
        "base64,AAAA\"}},{\"type\":\"image\",\"image\":\"data:image/jpeg;base64,BBBB\"},"
        "{\"type\":\"text\",\"text\":\"now\"}]}]}";
    CHECK_OK(pd_api_parse(PD_API_CHAT, body, strlen(body), &cfg, &r, &e));
    CHECK_INT(r.n_images, 2);
    if (r.n_images == 2) {
        CHECK_STR(r.images[0], "data:image/png;base64,AAAA");
        CHECK_STR(r.images[1], "data:image/jpeg;base64,BBBB");
    }
    /* text-only messages are still joined; the one with images keeps its parts, in order */
    const cJSON *m0 = cJSON_GetArrayItem(r.messages, 0), *m1 = cJSON_GetArrayItem(r.messages, 1);
    CHECK_STR(cJSON_GetObjectItem(m0, "content")->valuestring, "s1\ns2");
    const cJSON *parts = cJSON_GetObjectItem(m1, "content");
    CHECK(cJSON_IsArray(parts) && cJSON_GetArraySize(parts) == 4);
    static const char *const types[] = {"text", "image", "image", "text"};
    for (int i = 0; i < 4 && cJSON_IsArray(parts); i++)
        CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(parts, i), "type")->valuestring, types[i]);
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(parts, 3), "text")->valuestring, "now");
    CHECK(!cJSON_GetObjectItem(cJSON_GetArrayItem(parts, 1), "image_url")); /* not kept */
    pd_api_request_free(&r);

    /* the URL as the part's string (vLLM's shorthand) */
    body = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
           "\"image_url\":\"data:image/png;base64,CCCC\"}]}]}";
    CHECK_OK(pd_api_parse(PD_API_CHAT, body, strlen(body), &cfg, &r, &e));
    CHECK(r.n_images == 1 && strcmp(r.images[0], "data:image/png;base64,CCCC") == 0);
    pd_api_request_free(&r);
}

static void test_generate_image_data(void) {
    struct pd_api_request r;
    struct pd_api_error e;
    const char *body = "{\"text\":\"a\",\"image_data\":\"QUJD\"}";
    CHECK_OK(pd_api_parse(PD_API_GENERATE, body, strlen(body), &cfg, &r, &e));
    CHECK(r.n_images == 1 && strcmp(r.images[0], "QUJD") == 0);
    pd_api_request_free(&r);
    body = "{\"text\":\"a\",\"image_data\":[\"data:image/png;base64,QQ==\",\"QkI=\"]}";
    CHECK_OK(pd_api_parse(PD_API_GENERATE, body, strlen(body), &cfg, &r, &e));
    CHECK(r.n_images == 2 && strcmp(r.images[1], "QkI=") == 0);
    pd_api_request_free(&r);
    body = "{\"text\":\"a\",\"image_data\":null}";
    CHECK_OK(pd_api_parse(PD_API_GENERATE, body, strlen(body), &cfg, &r, &e));
    CHECK(r.n_images == 0);
    pd_api_request_free(&r);
}

static void test_refusals(void) {
    const struct pd_api_config text_only = {0};
    BAD(&text_only, PD_API_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
        "{\"url\":\"data:image/png;base64,AA\"}}]}]}",
        "messages[0].content[0]", "takes no images");
    BAD(&text_only, PD_API_GENERATE, "{\"text\":\"a\",\"image_data\":\"QQ==\"}", "image_data",
        "takes no images");
    BAD(&cfg, PD_API_GENERATE, "{\"text\":\"a\",\"image_data\":[\"QQ==\",\"QQ==\",\"QQ==\"]}",
        "image_data[2]", "too many images: at most 2");
    BAD(&cfg, PD_API_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},"
        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://example.com/a.png\"}}]}]}",
        "messages[0].content[1]", "is not fetched");
    BAD(&cfg, PD_API_GENERATE, "{\"text\":\"a\",\"image_data\":\"/etc/passwd\"}", "image_data",
        "is not fetched");
    BAD(&cfg, PD_API_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
        "{}}]}]}",
        "messages[0].content[0]", "must carry 'image_url'");
    BAD(&cfg, PD_API_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"image\":\"QQ\"},"
        "{\"type\":\"input_audio\"}]}]}",
        "messages[0].content", "'text', 'image_url' and 'image' parts are supported");
    BAD(&cfg, PD_API_GENERATE, "{\"text\":\"a\",\"image_data\":[[\"QQ==\"]]}", "image_data",
        "batch");
    BAD(&cfg, PD_API_GENERATE, "{\"text\":\"a\",\"image_data\":7}", "image_data",
        "a string or a list of strings");
}

PD_TEST_MAIN(PD_TEST(test_chat_parts), PD_TEST(test_generate_image_data), PD_TEST(test_refusals))
