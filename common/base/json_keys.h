/*
 * json_keys.h — typed reads of the keys of a JSON file a model directory holds (config.json,
 * generation_config.json, preprocessor_config.json). Absent and null both mean "the default", as
 * in transformers; every error names the file (src) and the key, and says what was found.
 */
#ifndef PD_BASE_JSON_KEYS_H
#define PD_BASE_JSON_KEYS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What v is, for messages: "a boolean", "a number", "a string", "a list", "an object", "null". */
const char *pd_json_kind(const cJSON *v);

/* The value of key in obj; NULL when it is absent or null. */
const cJSON *pd_json_key(const cJSON *obj, const char *key);

/* PD_EINVAL "src: missing required key 'key'". */
int pd_json_missing(const char *src, const char *key);

/* v as an integer in [lo, hi]: PD_EINVAL when it is not an integer (naming what it is),
 * PD_ERANGE when it is out of range; *out is set only on PD_OK. */
int pd_json_as_int(const char *src, const char *key, const cJSON *v, int64_t lo, int64_t hi,
                   int64_t *out);

/* The key's value into *out, checked as above; absent or null leaves *out as it is. */
int pd_json_int(const char *src, const cJSON *obj, const char *key, int64_t lo, int64_t hi,
                int64_t *out);
int pd_json_number(const char *src, const cJSON *obj, const char *key, double *out); /* finite */
int pd_json_bool(const char *src, const cJSON *obj, const char *key, bool *out);
/* *out points into obj's string. */
int pd_json_string(const char *src, const cJSON *obj, const char *key, const char **out);

/* v in decimal into buf, NUL-terminated; returns its length (digits only). Printed by hand:
 * cJSON prints a number through "%1.15g" and reads it back, snprintf of a double goes through the
 * float printer, a microsecond or so each, which lists of token ids pay once per id. */
#define PD_JSON_U64_CHARS 21 /* 20 digits and the NUL */
size_t pd_json_u64(uint64_t v, char buf[PD_JSON_U64_CHARS]);

#endif
