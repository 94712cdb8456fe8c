/*
 * serving.h — pdserve-bench, the serving benchmark: open-loop load against an OpenAI-compatible
 * or SGLang /generate endpoint, measured as sglang.bench_serving measures it (same flags, same
 * result field names), so numbers from both tools can be put side by side.
 *
 * The pieces, one file each: dataset.c makes the prompts (random token ids, from one length or
 * from length classes, a ShareGPT file, or the turns of multi-turn chats), load.c sends them
 * (Poisson arrivals and/or a concurrency cap, a chat's turn not before the turn it answers has
 * ended, curl multi on its own poll loop, SSE streams parsed as they arrive, one timestamp per
 * chunk), metrics.c reduces the per-request records to the summary (also per length class and
 * per turn), report.c prints the table and writes JSON Lines / CSV, plot.c draws a sweep with
 * gnuplot, timeline.c reads the servers' /metrics around each load, main.c holds the flags and
 * runs one load per request rate.
 *
 * Times are seconds (double) on CLOCK_MONOTONIC unless a name says _ms or _unix. Nothing here is
 * shared between threads: the whole benchmark runs on one thread.
 *
 * Besides measuring, a load can misbehave as real clients do (--abort-fraction,
 * --disconnect-fraction): those requests are ended by the client on purpose and counted apart
 * from the completed and the failed ones, so a soak can tell a deliberate cut from a server error.
 */
#ifndef PD_BENCH_SERVING_H
#define PD_BENCH_SERVING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct pd_tokenizer;

enum pd_bench_backend {
    PD_BENCH_SGLANG = 0,      /* POST /generate, SGLang native */
    PD_BENCH_OPENAI = 1,      /* POST /v1/completions */
    PD_BENCH_OPENAI_CHAT = 2, /* POST /v1/chat/completions */
};
extern const char *const pd_bench_backend_names[]; /* "sglang", "openai", "openai-chat" */

/* One prompt to send. Exactly one of text / ids is set. A turn of a multi-turn conversation
 * (turn >= 1) holds only the turn's new text: load.c builds the prompt the turn sends when the
 * conversation's previous turn has ended (the previous prompt and answer, then this text). */
struct pd_bench_prompt {
    char *text;       /* NUL-terminated, or NULL */
    int32_t *ids;     /* [prompt_len] token ids, or NULL */
    int prompt_len;   /* tokens (of a turn: of its new text until load.c counts the whole) */
    int output_len;   /* tokens asked for (max_tokens / max_new_tokens) */
    int length_class; /* --random-mix: index of the prompt's length class; -1 = none */
    int conversation; /* multiturn: 0-based conversation (with turn >= 1) */
    int turn;         /* multiturn: 1-based turn in its conversation; 0 = a prompt of its own */
};

struct pd_bench_dataset {
    struct pd_bench_prompt *p; /* [n] */
    size_t n;
};

/* --random-mix SHARE:MIN-MAX[,...]: prompt lengths drawn per request from length classes, a
 * class with probability share, then a length uniform in [min_len, max_len]. */
#define PD_BENCH_MAX_CLASSES 8
struct pd_bench_length_class {
    double share;
    int min_len, max_len; /* tokens */
};
struct pd_bench_length_mix {
    struct pd_bench_length_class cls[PD_BENCH_MAX_CLASSES];
    int n; /* 0 = no mix */
};
/* Parses the flag's text; shares > 0 summing to 1 within 1e-6, 1 <= MIN <= MAX. PD_EINVAL with a
 * message naming --random-mix and what is wrong. */
int pd_bench_length_mix_parse(const char *s, struct pd_bench_length_mix *out);

/* Random dataset (sglang's --dataset-name random): lengths uniform in [len*ratio, len] (input
 * lengths from mix instead when it has classes); prompts are random non-special token ids, sent
 * as ids when as_text is false, else decoded to text. */
struct pd_bench_random_spec {
    int input_len, output_len;
    double range_ratio;
    bool as_text;
    const struct pd_bench_length_mix *mix; /* or NULL: random dataset only */
};
int pd_bench_dataset_random(const struct pd_bench_random_spec *spec, size_t n, uint64_t seed,
                            const struct pd_tokenizer *tok, struct pd_bench_dataset *out);

/* Multi-turn chat (--dataset-name multiturn): conversations x turns prompts in turn-major order
 * (every conversation's turn 1, then every turn 2, ...; index = (turn - 1) * conversations +
 * conversation). Each holds its turn's new text: random non-special token ids decoded to text,
 * of a length as the random dataset draws input lengths (spec's input_len and range_ratio; the
 * text cut where it would encode to more tokens than that); output lengths as the random
 * dataset's. */
int pd_bench_dataset_multiturn(const struct pd_bench_random_spec *spec, int conversations,
                               int turns, uint64_t seed, const struct pd_tokenizer *tok,
                               struct pd_bench_dataset *out);

/* ShareGPT JSON file: [{"conversations": [{"from", "value"}, ...]}, ...]. The first turn is the
 * prompt, the second turn's token count the output length (unless fixed_output_len > 0).
 * Shuffled with seed; pairs with a prompt or output under 2 tokens are skipped, and those longer
 * than context_len together (when > 0). Malformed files fail with the path and the JSON path /
 * line of the problem. */
int pd_bench_dataset_sharegpt(const char *path, size_t n, uint64_t seed, int fixed_output_len,
                              int context_len, const struct pd_tokenizer *tok,
                              struct pd_bench_dataset *out);
void pd_bench_dataset_free(struct pd_bench_dataset *d);

/* Synthetic ShareGPT-like dataset (--dataset-name sharegpt-synthetic): random non-special token
 * ids as the random dataset makes them, with ShareGPT's long-tailed lengths: prompt and output
 * lengths log-normal with sigma PD_BENCH_SHAREGPT_SIGMA and means input_len / output_len, each
 * at least 2 and at most PD_BENCH_SHAREGPT_MAX_X times its mean; a pair longer than context_len
 * (when > 0) has its output cut to fit (and its prompt, when that alone does not fit). */
#define PD_BENCH_SHAREGPT_SIGMA 1.0
#define PD_BENCH_SHAREGPT_MAX_X 8
int pd_bench_dataset_sharegpt_synthetic(const struct pd_bench_random_spec *spec, size_t n,
                                        uint64_t seed, int context_len,
                                        const struct pd_tokenizer *tok,
                                        struct pd_bench_dataset *out);

/* What the client does with a request. */
enum pd_bench_fate {
    PD_BENCH_FATE_READ = 0,       /* reads the whole answer */
    PD_BENCH_FATE_ABORT = 1,      /* closes the stream (FIN) once it has read a few tokens */
    PD_BENCH_FATE_DISCONNECT = 2, /* drops the connection (RST) at a time drawn in advance,
                                   * whatever has arrived: before the answer or while it streams */
};
extern const char *const pd_bench_fate_names[]; /* "read", "abort", "disconnect" */

/* What one request measured. */
struct pd_bench_result {
    bool ok;      /* completed: the whole answer arrived */
    bool cut;     /* ended by the client as its fate said (not ok, not failed) */
    int fate;     /* enum pd_bench_fate */
    int tokens;   /* tokens received (also for cut and failed requests) */
    double start; /* s since the load began: when the request was handed to curl */
    double end;   /* s since the load began: when it ended, however it ended */
    double ttft;  /* s, first token (first chunk with text / new tokens) */
    double e2e;   /* s, until the end of the stream */
    double *itl;  /* [n_itl] s between chunks (a chunk of k tokens gives k gaps of 1/k) */
    size_t n_itl, cap_itl;
    int prompt_len; /* tokens, from the dataset (as bench_serving counts); a turn's when sent */
    int output_len; /* tokens generated: the server's usage / meta_info count, else chunks */
    char *error;    /* NULL when ok */
    int length_class, conversation, turn; /* the prompt's (struct pd_bench_prompt) */
};
void pd_bench_result_free(struct pd_bench_result *r);

/* One load (one request rate). */
struct pd_bench_load {
    enum pd_bench_backend backend;
    const char *api_url;    /* full URL of the generation endpoint */
    const char *model;      /* "model" field for OpenAI backends */
    const char *api_key;    /* Authorization: Bearer, or NULL */
    const char *extra_body; /* JSON object merged into every body, or NULL */
    double request_rate;    /* requests/s, INFINITY = all at once */
    int max_concurrency;    /* 0 = no cap */
    bool ignore_eos;
    uint64_t seed;     /* arrival times */
    bool progress;     /* progress bar / lines on stderr */
    const char *label; /* for progress lines */
    double timeout_s;  /* per request, 0 = none */
    /* Client misbehaviour, drawn per request from seed: a share abort_fraction aborts after 1..8
     * tokens (fewer than the output length), a share disconnect_fraction drops its connection
     * uniformly within disconnect_window_s of being sent. */
    double abort_fraction, disconnect_fraction, disconnect_window_s;
    FILE *requests_out; /* one JSON line per request as it ends (flushed), or NULL */
    /* Counts the tokens of a multi-turn prompt when it is built; needed when a prompt has
     * turn >= 1. */
    const struct pd_tokenizer *tok;
};

/* Sends prompts[0..n) (each with output_len capped at max_output when > 0) as the load says and
 * fills out[0..n) (zero-initialised by the caller). *duration: s from the first send to the last
 * end. PD_OK when the load ran, whatever the requests' fates; an error only when the load could
 * not run (curl setup, memory).
 * Turns of a conversation (turn >= 1): turn k > 1 leaves at its arrival time or when turn k - 1
 * of its conversation has ended, whichever is later (so requests may leave out of index order),
 * and sends turn k - 1's prompt, the answer it received (empty when it did not complete) and its
 * own new text; for openai-chat the conversation as alternating user / assistant messages. */
int pd_bench_load_run(const struct pd_bench_load *l, const struct pd_bench_prompt *prompts,
                      size_t n, int max_output, struct pd_bench_result *out, double *duration);

/* GET url (Authorization: Bearer api_key when not NULL; 10 s): *body (caller frees; NULL for an
 * empty answer) and the HTTP status, whatever it is. PD_EPEER naming the URL when it cannot be
 * reached or answers more than max_bytes. */
int pd_bench_http_get(const char *url, const char *api_key, size_t max_bytes, char **body,
                      long *status);
/* POST base_url/flush_cache (--flush-cache, as bench_serving's): PD_EPEER naming the URL unless
 * it answers 200. */
int pd_bench_flush_cache(const char *base_url, const char *api_key);

/* GET base_url/v1/models then /health: PD_OK when the server answers. *model_id (caller frees)
 * gets data[0].id when /v1/models gives one, *max_model_len its max_model_len (0 if absent). A
 * connection failure is PD_EPEER naming the URL and curl's error. */
int pd_bench_probe(const char *base_url, const char *api_key, char **model_id, int *max_model_len);

/* One length class of --random-mix over one load (ms). */
struct pd_bench_class_summary {
    int requests, completed, failed, good;
    double median_ttft_ms, p99_ttft_ms;
    double request_goodput; /* good / the load's duration, req/s */
};
/* One turn index of a multi-turn load. */
#define PD_BENCH_MAX_TURNS 64
struct pd_bench_turn_summary {
    int requests, completed;
    double mean_prompt_len; /* tokens, over the requests of this turn */
    double median_ttft_ms;  /* over the completed ones */
};

/* The summary of one load, bench_serving's fields. */
struct pd_bench_summary {
    double request_rate; /* as asked; INFINITY for inf */
    int max_concurrency;
    double duration; /* s */
    int completed, failed;
    int aborted, disconnected; /* cut by the client on purpose (--abort/--disconnect-fraction) */
    long total_input_tokens, total_output_tokens;
    double request_throughput, input_throughput, output_throughput, total_throughput;
    double concurrency; /* sum of e2e / duration */
    double request_goodput;
    int good;                        /* requests meeting both SLOs */
    double slo_ttft_ms, slo_tpot_ms; /* 0 = not set */
    /* [0]=mean [1]=median [2]=std [3]=p90 [4]=p95 [5]=p99 [6]=max; ms */
    double ttft[7], tpot[7], itl[7], e2e[7];
    const struct pd_bench_timeline_result *timeline;         /* --timeline-url, or NULL */
    struct pd_bench_class_summary cls[PD_BENCH_MAX_CLASSES]; /* [n_classes] */
    int n_classes;                                           /* 0 = no --random-mix */
    struct pd_bench_turn_summary turn[PD_BENCH_MAX_TURNS];   /* [n_turns], turn k at [k - 1] */
    int n_turns;                                             /* 0 = not multi-turn */
    bool has_kv_bytes;                                       /* --kv-bytes-url given */
    double kv_bytes;                                         /* moved during the load, bytes */
};
enum {
    PD_BENCH_MEAN,
    PD_BENCH_P50,
    PD_BENCH_STD,
    PD_BENCH_P90,
    PD_BENCH_P95,
    PD_BENCH_P99,
    PD_BENCH_MAX,
    PD_BENCH_NSTAT
};
extern const char *const pd_bench_stat_names[]; /* "mean", "median", "std", "p90", ... */

int pd_bench_summarize(const struct pd_bench_result *r, size_t n, double duration,
                       double slo_ttft_ms, double slo_tpot_ms, struct pd_bench_summary *s);
/* After pd_bench_summarize: the per-class (n_classes > 0) and per-turn (n_turns > 0) figures,
 * from the results' length_class and turn. */
int pd_bench_summarize_groups(const struct pd_bench_result *r, size_t n, int n_classes, int n_turns,
                              struct pd_bench_summary *s);

/* Output. */
struct pd_bench_run_info {
    const char *backend, *dataset_name, *base_url, *model;
    int num_prompts;
    int random_input_len, random_output_len;
    double random_range_ratio;
    int sharegpt_output_len;
    const char *random_mix;                       /* the flag's text, or NULL */
    const struct pd_bench_length_mix *mix;        /* parsed, or NULL */
    int multiturn_conversations, multiturn_turns; /* 0 unless --dataset-name multiturn */
};
void pd_bench_print_table(FILE *f, const struct pd_bench_run_info *info,
                          const struct pd_bench_summary *s);
/* One JSON object (one line) with bench_serving's field names; details adds per-request arrays. */
int pd_bench_json_line(const struct pd_bench_run_info *info, const struct pd_bench_summary *s,
                       const struct pd_bench_result *r, size_t n, bool details, char **out);
void pd_bench_csv_header(FILE *f);
void pd_bench_csv_rows(FILE *f, const struct pd_bench_summary *s, const struct pd_bench_result *r,
                       size_t n);

/* Plot: one series per label; each point is one summary (one request rate). */
struct pd_bench_series {
    const char *label;
    const struct pd_bench_summary *s; /* [n] */
    size_t n;
};
/* PD_OK when gnuplot is on PATH; else PD_ENOENT with a message saying how to get it. */
int pd_bench_plot_check(void);
int pd_bench_plot(const char *png_path, const struct pd_bench_series *series, size_t n_series);
/* Reads a JSON Lines result file written by --output-file back into summaries (for --plot-from). */
int pd_bench_read_results(const char *path, struct pd_bench_summary **out, size_t *n);

/* The servers' hand-over timeline (timeline.c, --timeline-url): their stage histograms' sums
 * and counts, read from /metrics of each of a comma-separated list of base URLs (summed over
 * them), before and after a load; the load's mean per stage, and how the stages on the first
 * token's path add up against the TTFT measured here. */
#define PD_BENCH_TL_MAX 24
struct pd_bench_tl_stage {
    char name[48]; /* "router:dispatch", "reserve", ... */
    double sum, count;
};
struct pd_bench_timeline {
    struct pd_bench_tl_stage st[PD_BENCH_TL_MAX];
    int n;
    double kv_bytes; /* pdserve_kv_transfer_bytes_total, summed over the servers (--kv-bytes-url) */
};
struct pd_bench_tl_mean {
    char name[48];
    double mean_ms;
    long count;  /* requests of this load through the stage */
    bool summed; /* on the first token's path (timeline.c) */
};
struct pd_bench_timeline_result {
    struct pd_bench_tl_mean stage[PD_BENCH_TL_MAX];
    int n;
    double sum_ms, ttft_ms, ratio; /* summed stages, the mean TTFT here, sum / TTFT */
};
/* PD_EPEER naming the URL when a server does not answer 200; PD_EINVAL for a bad list. The same
 * scrape serves --kv-bytes-url (only kv_bytes read then). */
int pd_bench_timeline_scrape(const char *urls, const char *api_key, struct pd_bench_timeline *out);
void pd_bench_timeline_reduce(const struct pd_bench_timeline *before,
                              const struct pd_bench_timeline *after, double mean_ttft_ms,
                              struct pd_bench_timeline_result *out);
void pd_bench_timeline_print(FILE *f, const struct pd_bench_timeline_result *t);

/* CLOCK_MONOTONIC seconds. */
double pd_bench_now(void);
/* Parses "1,2.5,inf": each rate > 0 (inf allowed). PD_EINVAL naming the bad item. */
int pd_bench_parse_rates(const char *s, double **rates, size_t *n);

#endif
