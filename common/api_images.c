/*
 * api_images.c — images in requests (issue 18): OpenAI chat content parts
 * {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}} (the url may also
 * be the part's string value, as vLLM takes it) and {"type": "image", "image": "data:..."};
 * SGLang's /generate "image_data" (one string or a list: data: URLs or raw base64). Here they
 * are only collected and checked for form: count against --limit-mm-per-prompt, a model
 * without images, remote URLs (fetched only with --allow-image-urls), paths (never read). The
 * daemon decodes them (model/vision/) and answers a broken one with a 400 naming it.
 */
#include "common/api.h"

#include "common/base/alloc.h"
#include "common/base/json_keys.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int bad(struct pd_api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(struct pd_api_error *e, const char *param, const char *fmt, ...) {
    char msg[sizeof(e->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pd_api_error_set(e, 400, "invalid_request_error", param, NULL, "%s", msg);
    return PD_EINVAL;
}

bool pd__api_is_image_part(const cJSON *part) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    return cJSON_IsString(type) &&
           (strcmp(type->valuestring, "image_url") == 0 || strcmp(type->valuestring, "image") == 0);
}

/* Appends one image string after the checks every form shares. */
static int add_image(const char *s, const char *param, const struct pd_api_config *cfg,
                     struct pd_api_request *r, struct pd_api_error *e) {
    if (cfg->max_images <= 0)
        return bad(e, param,
                   "this model takes no images (it is not a vision-language model); send text");
    if (r->n_images >= cfg->max_images)
        return bad(e, param, "too many images: at most %d per request (--limit-mm-per-prompt)",
                   cfg->max_images);
    bool remote = strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0;
    if ((remote && !cfg->allow_image_urls) || strncmp(s, "file:", 5) == 0 || s[0] == '/')
        return bad(e, param,
                   "the image URL '%.60s' is not fetched: send the image itself as a data: URL "
                   "(data:image/png;base64,...)%s",
                   s, remote ? ", or start the daemon with --allow-image-urls" : "");
    char **grown = pd_realloc(r->images, sizeof(char *) * (size_t)(r->n_images + 1));
    if (!grown)
        goto oom;
    r->images = grown;
    if (!(r->images[r->n_images] = pd_strndup(s, strlen(s))))
        goto oom;
    r->n_images++;
    return PD_OK;
oom:
    pd_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory parsing the request");
    return PD_ENOMEM;
}

int pd__api_add_image_part(const cJSON *part, const char *param, const struct pd_api_config *cfg,
                           struct pd_api_request *r, struct pd_api_error *e) {
    if (cfg->max_images <= 0) /* said first: the image's form does not matter then */
        return bad(e, param,
                   "this model takes no images (it is not a vision-language model); send text");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    bool url_part = strcmp(type->valuestring, "image_url") == 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(part, url_part ? "image_url" : "image");
    if (url_part && cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "url");
    if (!cJSON_IsString(v))
        return bad(e, param,
                   url_part
                       ? "'%s' must carry 'image_url': {\"url\": \"data:image/...;base64,...\"}"
                       : "'%s' must carry 'image': \"data:image/...;base64,...\"",
                   param);
    return add_image(v->valuestring, param, cfg, r, e);
}

int pd__api_parse_image_data(const cJSON *root, const struct pd_api_config *cfg,
                             struct pd_api_request *r, struct pd_api_error *e) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "image_data");
    if (!d || cJSON_IsNull(d))
        return PD_OK;
    if (cJSON_IsString(d))
        return add_image(d->valuestring, "image_data", cfg, r, e);
    if (!cJSON_IsArray(d))
        return bad(e, "image_data", "'image_data' must be a string or a list of strings, got %s",
                   pd_json_kind(d));
    int i = 0, rc;
    const cJSON *x;
    cJSON_ArrayForEach(x, d) {
        char param[48];
        snprintf(param, sizeof(param), "image_data[%d]", i++);
        if (cJSON_IsArray(x))
            return bad(e, "image_data",
                       "'image_data' holds a batch (a list per prompt); send one "
                       "request per prompt");
        if (!cJSON_IsString(x))
            return bad(e, param, "'%s' must be a string, got %s", param, pd_json_kind(x));
        if ((rc = add_image(x->valuestring, param, cfg, r, e)) != PD_OK)
            return rc;
    }
    return PD_OK;
}
