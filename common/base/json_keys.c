/*
 * json_keys.c — typed reads of a JSON file's keys (see json_keys.h).
 */
#include "common/base/json_keys.h"

#include "common/base/status.h"

#include <math.h>

const char *pd_json_kind(const cJSON *v) {
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsArray(v))
        return "a list";
    if (cJSON_IsObject(v))
        return "an object";
    return "null";
}

const cJSON *pd_json_key(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int pd_json_missing(const char *src, const char *key) {
    return pd_errorf(PD_EINVAL, "%s: missing required key '%s'", src, key);
}

int pd_json_as_int(const char *src, const char *key, const cJSON *v, int64_t lo, int64_t hi,
                   int64_t *out) {
    if (!cJSON_IsNumber(v))
        return pd_errorf(PD_EINVAL, "%s: key '%s' must be an integer, got %s", src, key,
                         pd_json_kind(v));
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return pd_errorf(PD_EINVAL, "%s: key '%s' must be an integer, got %.17g", src, key, d);
    if (d < (double)lo || d > (double)hi)
        return pd_errorf(PD_ERANGE, "%s: key '%s' is %.17g, must be in [%lld, %lld]", src, key, d,
                         (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return PD_OK;
}

int pd_json_int(const char *src, const cJSON *obj, const char *key, int64_t lo, int64_t hi,
                int64_t *out) {
    const cJSON *v = pd_json_key(obj, key);
    return v ? pd_json_as_int(src, key, v, lo, hi, out) : PD_OK;
}

int pd_json_number(const char *src, const cJSON *obj, const char *key, double *out) {
    const cJSON *v = pd_json_key(obj, key);
    if (!v)
        return PD_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return pd_errorf(PD_EINVAL, "%s: key '%s' must be a number, got %s", src, key,
                         pd_json_kind(v));
    *out = v->valuedouble;
    return PD_OK;
}

int pd_json_bool(const char *src, const cJSON *obj, const char *key, bool *out) {
    const cJSON *v = pd_json_key(obj, key);
    if (!v)
        return PD_OK;
    if (!cJSON_IsBool(v))
        return pd_errorf(PD_EINVAL, "%s: key '%s' must be a boolean, got %s", src, key,
                         pd_json_kind(v));
    *out = cJSON_IsTrue(v);
    return PD_OK;
}

int pd_json_string(const char *src, const cJSON *obj, const char *key, const char **out) {
    const cJSON *v = pd_json_key(obj, key);
    if (!v)
        return PD_OK;
    if (!cJSON_IsString(v))
        return pd_errorf(PD_EINVAL, "%s: key '%s' must be a string, got %s", src, key,
                         pd_json_kind(v));
    *out = v->valuestring;
    return PD_OK;
}

size_t pd_json_u64(uint64_t v, char buf[PD_JSON_U64_CHARS]) {
    char rev[PD_JSON_U64_CHARS];
    size_t k = 0;
    do
        rev[k++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    for (size_t i = 0; i < k; i++)
        buf[i] = rev[k - 1 - i];
    buf[k] = '\0';
    return k;
}
