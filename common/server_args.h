/*
 * server_args.h — the server flags the daemons share, spelled as SGLang spells them where the
 * concept is the same (--model-path, --page-size, --chunked-prefill-size,
 * --disaggregation-mode, ...), so an operator's launch line carries over.
 */
#ifndef PD_SERVER_ARGS_H
#define PD_SERVER_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/base/flags.h"
#include "model/dtype.h"

enum pd_disagg_mode {
    PD_DISAGG_NULL = 0, /* colocated: one daemon does prefill and decode */
    PD_DISAGG_PREFILL = 1,
    PD_DISAGG_DECODE = 2,
};
extern const char *const pd_disagg_mode_names[]; /* "null", "prefill", "decode" */

enum pd_device_kind {
    PD_DEVICE_CPU = 0,
    PD_DEVICE_CUDA = 1,
};
extern const char *const pd_device_names[]; /* "cpu", "cuda" */

/* --kv-cache-dtype: its spellings and types are model/dtype.h's (pd_kv_cache_dtype_names). */
/* The help text both the daemons and pdserve-generate give the flag. */
extern const char pd_kv_cache_dtype_help[];

/* --max-prefill-tokens unless given (SGLang's default); also the engine's when its config leaves
 * it 0 */
#define PD_DEFAULT_MAX_PREFILL_TOKENS 16384

struct pd_server_args {
    const char *model_path;
    const char *tokenizer_path;    /* defaults to model_path */
    const char *served_model_name; /* defaults to model_path */
    const char *host;
    int port;
    int page_size;            /* tokens per KV page */
    int chunked_prefill_size; /* token budget of one prefill step; -1 disables chunking */
    int max_prefill_tokens;   /* cap on tokens of one prefill batch */
    int max_running_requests; /* decode batch cap */
    int max_queued_requests;
    int context_length;         /* 0 = from config.json */
    double mem_fraction_static; /* share of device memory for weights + KV pool */
    int max_total_tokens;       /* 0 = derive the KV pool from mem_fraction_static */
    int tp_size;
    int disaggregation_mode; /* enum pd_disagg_mode */
    int disaggregation_bootstrap_port;
    const char *disaggregation_ib_device;
    int device;         /* enum pd_device_kind */
    int base_gpu_id;    /* cuda: the GPU this daemon runs on (SGLang's --base-gpu-id) */
    int threads;        /* CPU backend threads; 0 = all cores */
    int kv_cache_dtype; /* index into pd_kv_cache_dtype_names; PD_KV_CACHE_DTYPE_AUTO */
    int log_level;      /* enum pd_log_level */
    bool disable_prefix_cache;
    int64_t random_seed;
    int limit_mm_per_prompt;     /* images one request may carry (vision-language models) */
    int mm_embedding_cache_mb;   /* the vision encoder's output cache, MB (10^6 bytes) */
    bool allow_image_urls;       /* fetch http(s) image URLs (else a 400) ... */
    int64_t image_url_max_bytes; /* ... of at most this many bytes ... */
    double image_url_timeout;    /* ... within this many seconds */
};

/* SGLang's defaults (port 30000, page size 16 for pdserve, chunked prefill 8192, bootstrap port
 * 8998, mem fraction 0.88, ...). */
void pd_server_args_defaults(struct pd_server_args *a);
/* Registers every server flag on fs, defaults taken from *a. */
void pd_server_args_register(struct pd_flagset *fs, struct pd_server_args *a);
/* Cross-flag checks after parsing (e.g. chunked prefill size must be a multiple of the page
 * size) and fills derived defaults (tokenizer path, served name); applies --log-level. */
int pd_server_args_finish(struct pd_server_args *a);

#endif
