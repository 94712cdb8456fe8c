/*
 * api_wire.h — what the router and the daemons share of the HTTP user plane (API.md): the
 * OpenAI error object every error answer carries, and the request limits the router checks
 * before a daemon parses the body (common/api.h does the rest of the parsing, daemon side).
 */
#ifndef PD_API_WIRE_H
#define PD_API_WIRE_H

#define PD_API_MAX_N 128       /* n (parallel samples) per prompt: --max-n's default */
#define PD_API_MAX_FANOUT 1024 /* sub-requests per body: prompts x n */

struct pd_api_error {
    int status;     /* HTTP status: 400, 401, 404, 413, 429, 500, 503 */
    char type[32];  /* "invalid_request_error", "authentication_error", "server_error", ... */
    char param[64]; /* offending field; "" renders as null */
    char code[40];  /* machine code ("model_not_found"); "" renders as null */
    char message[512];
};

/* Fills e (status, type, param, code may be NULL) and returns PD_EINVAL. */
int pd_api_error_set(struct pd_api_error *e, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{"message","type","param","code"}}; heap string, caller pd_free's. */
int pd_api_error_render(const struct pd_api_error *e, char **out);

struct cJSON;
/* root printed unformatted into a heap string (pd_free it) and deleted; NULL root or a failed
 * print: PD_ENOMEM. */
int pd_api_json_print(struct cJSON *root, char **out);

#endif
