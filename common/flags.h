/*
 * flags.h — the command-line parser every pdserve binary uses, and the server flags the daemons
 * share, spelled as SGLang spells them where the concept is the same (--model-path, --page-size,
 * --chunked-prefill-size, --disaggregation-mode, ...), so an operator's launch line carries over.
 *
 * A binary builds a pd_flagset (each flag: name, kind, destination, range or choices, help),
 * then calls pd_flags_parse. Accepted spellings: "--name value" and "--name=value"; booleans are
 * "--name" (or "--name=true|false"). An unknown flag, a missing or malformed value, a number out of
 * range or a choice not in the list is rejected with a message that names the flag and says what
 * is allowed (an unknown flag also gets the closest known name). --help / -h sets fs->help; the
 * caller prints pd_flags_usage and exits 0 — only main() exits (STYLE.md rule 5).
 * Defaults are whatever the destination holds when the flag is registered; --help shows them.
 */
#ifndef PD_FLAGS_H
#define PD_FLAGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/dtype.h"

enum pd_flag_kind {
    PD_FLAG_BOOL,
    PD_FLAG_INT,    /* int, range-checked */
    PD_FLAG_INT64,  /* int64_t, range-checked */
    PD_FLAG_DOUBLE, /* double, range-checked */
    PD_FLAG_STRING, /* const char *, points into argv */
    PD_FLAG_CHOICE, /* int index into a NULL-terminated list of names */
};

struct pd_flag {
    const char *name; /* "--model-path" */
    enum pd_flag_kind kind;
    void *dst;
    const char *metavar; /* "DIR", "N" */
    const char *help;
    double min, max; /* inclusive range for numbers */
    const char *const *choices;
    bool required; /* must be given (checked after parsing) */
    bool seen;
    char default_text[48]; /* rendered at registration, for --help */
};

#define PD_FLAGS_MAX 96

struct pd_flagset {
    const char *prog;    /* "pdserve-prefill" */
    const char *summary; /* one paragraph for --help */
    struct pd_flag flags[PD_FLAGS_MAX];
    int n;
    bool help; /* --help or -h was given */
};

void pd_flagset_init(struct pd_flagset *fs, const char *prog, const char *summary);

/* Registration; each returns the flag so the caller may set ->required. Registering more than
 * PD_FLAGS_MAX flags or a name twice is a bug (asserts). */
struct pd_flag *pd_flag_bool(struct pd_flagset *fs, const char *name, bool *dst, const char *help);
struct pd_flag *pd_flag_int(struct pd_flagset *fs, const char *name, int *dst, const char *metavar,
                            double min, double max, const char *help);
struct pd_flag *pd_flag_int64(struct pd_flagset *fs, const char *name, int64_t *dst,
                              const char *metavar, double min, double max, const char *help);
struct pd_flag *pd_flag_double(struct pd_flagset *fs, const char *name, double *dst,
                               const char *metavar, double min, double max, const char *help);
struct pd_flag *pd_flag_string(struct pd_flagset *fs, const char *name, const char **dst,
                               const char *metavar, const char *help);
struct pd_flag *pd_flag_choice(struct pd_flagset *fs, const char *name, int *dst,
                               const char *const *choices, const char *help);

/* Parses argv[1..argc-1]. PD_OK, or PD_EINVAL with pd_error_msg() naming the flag and what it
 * accepts. After --help parsing stops with PD_OK and fs->help set. */
int pd_flags_parse(struct pd_flagset *fs, int argc, char **argv);

/* Writes "usage: prog [flags]", the summary and one entry per flag (metavar, help, range or
 * choices, default, required). */
void pd_flags_usage(const struct pd_flagset *fs, FILE *out);

/* ---- flags shared by the daemons (prefill, decode; the router uses host/port/log) ---- */

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

/* --kv-cache-dtype: its spellings and types are common/dtype.h's (pd_kv_cache_dtype_names). */
/* The help text both the daemons and pdserve-generate give the flag. */
extern const char pd_kv_cache_dtype_help[];

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
};

/* SGLang's defaults (port 30000, page size 16 for pdserve, chunked prefill 8192, bootstrap port
 * 8998, mem fraction 0.88, ...). */
void pd_server_args_defaults(struct pd_server_args *a);
/* Registers every server flag on fs, defaults taken from *a. */
void pd_server_args_register(struct pd_flagset *fs, struct pd_server_args *a);
/* Cross-flag checks after parsing (e.g. chunked prefill size must be a multiple of the page
 * size) and fills derived defaults (tokenizer path, served name); applies --log-level. */
int pd_server_args_finish(struct pd_server_args *a);

/* --log-level alone, for tools that take no server flags. dst holds an enum pd_log_level. */
struct pd_flag *pd_flag_log_level(struct pd_flagset *fs, int *dst);

#endif
