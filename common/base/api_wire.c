/*
 * api_wire.c — the OpenAI error object: filled by whoever refuses a request, rendered as
 * {"error":{"message","type","param","code"}} by the HTTP server.
 */
#include "common/base/api_wire.h"

#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>

int pd_api_error_set(struct pd_api_error *e, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof(e->type), "%s", type ? type : "invalid_request_error");
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return PD_EINVAL;
}

int pd_api_json_print(struct cJSON *root, char **out) {
    *out = NULL;
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s)
        return pd_errorf(PD_ENOMEM, "out of memory rendering a response");
    *out = s;
    return PD_OK;
}

int pd_api_error_render(const struct pd_api_error *e, char **out) {
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    if (!err) {
        cJSON_Delete(root);
        return pd_api_json_print(NULL, out);
    }
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type[0] ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code[0])
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    return pd_api_json_print(root, out);
}
