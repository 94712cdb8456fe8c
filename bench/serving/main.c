/*
 * main.c — pdserve-bench: flags (sglang.bench_serving's names), the order of a run, and exits.
 *
 * A run: check the flags (rates > 0, lengths >= 1, output files writable, gnuplot present when
 * --plot is asked) before anything is sent; probe the server (GET /v1/models, else /health) so
 * an unreachable URL is one clear line naming it; load the tokenizer (--tokenizer, else the
 * model id when it is a local model directory, as it is for pdserve); make the prompts; send
 * --warmup-requests (excluded from every number); then one load per request rate (each after
 * --flush-cache, between reads of --timeline-url / --kv-bytes-url), each printed as a table and
 * appended to --output-file (JSON Lines) and --output-csv; finally --plot.
 * Exit status: 0 when every load completed at least one request, 1 otherwise or on any error.
 */
#include "bench/serving/serving.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/flags.h"
#include "common/base/status.h"
#include "model/tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

const char *const pd_bench_backend_names[] = {"sglang", "openai", "openai-chat"};

/* Accepted --backend names; bench_serving's aliases map onto the three request shapes. */
static const char *const backend_choices[] = {"sglang",        "openai",     "openai-chat",
                                              "sglang-native", "sglang-oai", "sglang-oai-chat",
                                              "vllm",          "vllm-chat",  NULL};
static const enum pd_bench_backend backend_of_choice[] = {
    PD_BENCH_SGLANG, PD_BENCH_OPENAI,      PD_BENCH_OPENAI_CHAT, PD_BENCH_SGLANG,
    PD_BENCH_OPENAI, PD_BENCH_OPENAI_CHAT, PD_BENCH_OPENAI,      PD_BENCH_OPENAI_CHAT};
static const char *const dataset_choices[] = {"random", "sharegpt", "sharegpt-synthetic",
                                              "multiturn", NULL};
enum { DATASET_RANDOM, DATASET_SHAREGPT, DATASET_SHAREGPT_SYNTHETIC, DATASET_MULTITURN };

struct args {
    int backend, dataset, port, num_prompts, random_input_len, random_output_len;
    int sharegpt_output_len, sharegpt_context_len, max_concurrency, warmup_requests;
    int multiturn_conversations, multiturn_turns;
    int64_t seed;
    double random_range_ratio, slo_ttft_ms, slo_tpot_ms, request_timeout;
    double abort_fraction, disconnect_fraction, disconnect_window_ms;
    const char *base_url, *host, *model, *tokenizer, *dataset_path, *request_rate, *sweep;
    const char *output_file, *output_csv, *plot, *plot_from, *plot_label, *extra_body, *api_key;
    const char *timeline_url, *kv_bytes_url;
    const char *output_requests, *random_mix;
    bool output_details, disable_ignore_eos, disable_progress, flush_cache;
};

/* A message of our own, without a pd_error behind it. */
static int die(const char *msg) {
    fprintf(stderr, "pdserve-bench: %s\n", msg);
    return 1;
}

static int fatal(const char *what) {
    fprintf(stderr, "pdserve-bench: %s%s%s\n", what, pd_error_msg()[0] ? ": " : "", pd_error_msg());
    return 1;
}

int pd_bench_parse_rates(const char *s, double **rates, size_t *n) {
    *rates = NULL;
    *n = 0;
    size_t cap = 0;
    const char *p = s;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof(item)) {
            pd_free(*rates);
            *rates = NULL;
            *n = 0;
            return pd_errorf(PD_EINVAL, "request rate list '%s': empty or overlong item", s);
        }
        memcpy(item, p, len);
        item[len] = '\0';
        double v;
        char *e;
        errno = 0;
        if (!strcmp(item, "inf") || !strcmp(item, "infinity")) {
            v = INFINITY;
        } else {
            v = strtod(item, &e);
            if (e == item || *e || errno || isnan(v) || isinf(v)) {
                pd_free(*rates);
                *rates = NULL;
                *n = 0;
                return pd_errorf(
                    PD_EINVAL, "request rate '%s' is not a number (give requests/s, or inf)", item);
            }
        }
        if (!(v > 0)) {
            pd_free(*rates);
            *rates = NULL;
            *n = 0;
            return pd_errorf(PD_EINVAL,
                             "request rate %s must be > 0 requests/s (inf = all at once)", item);
        }
        if (pd_array_grow((void **)rates, &cap, *n + 1, sizeof(double)))
            return PD_ENOMEM;
        (*rates)[(*n)++] = v;
        if (!end)
            break;
        p = end + 1;
    }
    return PD_OK;
}

static void register_flags(struct pd_flagset *fs, struct args *a) {
    pd_flag_choice(fs, "--backend", &a->backend, backend_choices,
                   "request shape: sglang = POST /generate (SGLang native), openai = POST "
                   "/v1/completions, openai-chat = POST /v1/chat/completions; bench_serving's "
                   "names sglang-native, sglang-oai(-chat), vllm(-chat) are accepted too");
    pd_flag_string(fs, "--base-url", &a->base_url, "URL",
                   "server URL, e.g. http://127.0.0.1:30000 (default: http://HOST:PORT)");
    pd_flag_string(fs, "--host", &a->host, "HOST", "server host when --base-url is not given");
    pd_flag_int(fs, "--port", &a->port, "PORT", 1, 65535,
                "server port when --base-url is not given");
    pd_flag_string(fs, "--model", &a->model, "NAME",
                   "model name sent to OpenAI endpoints (default: the first id of GET "
                   "/v1/models; for pdserve that is the model directory)");
    pd_flag_string(fs, "--tokenizer", &a->tokenizer, "DIR",
                   "model directory whose tokenizer.json makes and counts the prompts (default: "
                   "the model id when it is a local directory)");
    pd_flag_choice(fs, "--dataset-name", &a->dataset, dataset_choices,
                   "random = random token ids of the lengths below; sharegpt = a ShareGPT JSON "
                   "file (--dataset-path); sharegpt-synthetic = random token ids with "
                   "ShareGPT's long-tailed lengths: log-normal (sigma 1) prompt and output "
                   "lengths whose means are --random-input-len and --random-output-len, each "
                   "at most 8x its mean, cut to --sharegpt-context-len; multiturn = chat "
                   "conversations (--multiturn-conversations x --multiturn-turns requests; "
                   "--num-prompts is then ignored): turn 1 is random text of --random-input-len "
                   "tokens (with --random-range-ratio), turn k the previous turn's prompt, its "
                   "answer as streamed and new random text of that length, sent once the "
                   "previous turn has ended (openai-chat: as alternating user/assistant "
                   "messages)");
    pd_flag_string(fs, "--dataset-path", &a->dataset_path, "FILE",
                   "ShareGPT JSON: [{\"conversations\": [{\"from\": \"human\", \"value\": ...}, "
                   "{\"from\": \"gpt\", \"value\": ...}]}, ...]");
    pd_flag_int(fs, "--num-prompts", &a->num_prompts, "N", 1, 1e7,
                "requests per load (per request rate)");
    pd_flag_int64(fs, "--seed", &a->seed, "N", 0, 9e18,
                  "seed of the prompts, lengths and arrival times");
    pd_flag_int(fs, "--random-input-len", &a->random_input_len, "N", 1, 1e7,
                "random: prompt tokens (the most; see --random-range-ratio)");
    pd_flag_int(fs, "--random-output-len", &a->random_output_len, "N", 1, 1e7,
                "random: output tokens asked for (the most)");
    pd_flag_double(fs, "--random-range-ratio", &a->random_range_ratio, "R", 0, 1,
                   "random: lengths are uniform in [len*R, len] (1 = exact lengths)");
    pd_flag_string(fs, "--random-mix", &a->random_mix, "SHARE:MIN-MAX[,...]",
                   "random: prompt lengths from length classes instead of --random-input-len: "
                   "each request draws a class with its SHARE (the shares sum to 1), then a "
                   "length uniform in [MIN, MAX] tokens, e.g. 0.7:32-128,0.3:1024-2048 (at "
                   "most 8 classes); output lengths stay --random-output-len's; the report adds "
                   "each class's TTFT median/p99 and goodput (\"classes\" in --output-file)");
    pd_flag_int(fs, "--multiturn-conversations", &a->multiturn_conversations, "N", 1, 1e5,
                "multiturn: conversations, each sending --multiturn-turns requests");
    pd_flag_int(fs, "--multiturn-turns", &a->multiturn_turns, "K", 1, PD_BENCH_MAX_TURNS,
                "multiturn: turns per conversation; arrivals are Poisson over all N x K "
                "requests in turn-major order (every conversation's turn 1, then turn 2, ...), "
                "a turn leaving at its arrival or when its previous turn ended, whichever is "
                "later; the report adds each turn's mean prompt tokens and TTFT median "
                "(\"turns\" in --output-file)");
    pd_flag_int(fs, "--sharegpt-output-len", &a->sharegpt_output_len, "N", 0, 1e7,
                "sharegpt: output tokens for every request (0 = the answer's token count)");
    pd_flag_int(fs, "--sharegpt-context-len", &a->sharegpt_context_len, "N", 0, 1e9,
                "sharegpt: skip pairs whose prompt + output exceed N tokens (0 = the server's "
                "max_model_len from /v1/models, if any)");
    pd_flag_string(fs, "--request-rate", &a->request_rate, "R[,R...]",
                   "Poisson arrivals at R requests/s; inf sends all at once; a comma list runs "
                   "one load per rate (a sweep)");
    pd_flag_string(fs, "--request-rate-sweep", &a->sweep, "R,R,...",
                   "the same as a comma list in --request-rate, e.g. 1,2,4,inf");
    pd_flag_int(fs, "--max-concurrency", &a->max_concurrency, "N", 0, 1e6,
                "at most N requests in flight; an arrival waits for a free slot (0 = no cap)");
    pd_flag_int(fs, "--warmup-requests", &a->warmup_requests, "N", 0, 1e4,
                "requests sent first (the first prompt, at most 32 output tokens), excluded from "
                "the results; the run stops when all of them fail");
    pd_flag_double(fs, "--slo-ttft-ms", &a->slo_ttft_ms, "MS", 0, 1e9,
                   "goodput: a request counts when its TTFT <= MS (0 = no TTFT SLO)");
    pd_flag_double(fs, "--slo-tpot-ms", &a->slo_tpot_ms, "MS", 0, 1e9,
                   "goodput: a request counts when its TPOT <= MS (0 = no TPOT SLO)");
    pd_flag_bool(fs, "--disable-ignore-eos", &a->disable_ignore_eos,
                 "let requests stop at EOS (by default ignore_eos makes every request generate "
                 "exactly its output length)");
    pd_flag_string(fs, "--extra-request-body", &a->extra_body, "JSON",
                   "JSON object whose fields are added to every request body");
    pd_flag_string(fs, "--api-key", &a->api_key, "KEY",
                   "sent as Authorization: Bearer KEY (default: $OPENAI_API_KEY when set)");
    pd_flag_double(fs, "--request-timeout", &a->request_timeout, "S", 0, 1e7,
                   "a request still running after S seconds fails (0 = never)");
    pd_flag_double(fs, "--abort-fraction", &a->abort_fraction, "F", 0, 1,
                   "share of requests whose client closes the stream after reading 1..8 tokens "
                   "(fewer than its output); counted as aborted, not as failed");
    pd_flag_double(fs, "--disconnect-fraction", &a->disconnect_fraction, "F", 0, 1,
                   "share of requests whose client drops its connection (a TCP reset) at a "
                   "time uniform in [0, --disconnect-window-ms] after sending, before or while "
                   "the answer streams; counted as disconnected, not as failed");
    pd_flag_double(fs, "--disconnect-window-ms", &a->disconnect_window_ms, "MS", 0, 1e9,
                   "the window of --disconnect-fraction's drops");
    pd_flag_string(fs, "--output-requests", &a->output_requests, "FILE",
                   "write one JSON line per request as it ends (flushed; every rate of a "
                   "sweep): request_rate, index, fate (read/abort/disconnect), outcome "
                   "(completed/cut/failed), start/end (s since the load began) and "
                   "start_unix/end_unix, prompt_len, tokens received, ttft (s), itl (s), error; "
                   "length_class (--random-mix) and conversation/turn (multiturn)");
    pd_flag_string(fs, "--output-file", &a->output_file, "FILE",
                   "write results as JSON Lines, one object per request rate with "
                   "bench_serving's field names (overwritten)");
    pd_flag_bool(fs, "--output-details", &a->output_details,
                 "add per-request arrays to --output-file: input_lens, output_lens, ttfts, "
                 "e2e_latencies, start_times (s since the load began), itls, errors");
    pd_flag_string(fs, "--output-csv", &a->output_csv, "FILE",
                   "write one CSV row per request (all rates; a request_rate column), after a "
                   "header (overwritten)");
    pd_flag_string(fs, "--plot", &a->plot, "FILE.png",
                   "draw TTFT/ITL p50+p99, output tokens/s, requests/s and goodput against "
                   "request rate with gnuplot (Debian gnuplot-nox)");
    pd_flag_string(fs, "--plot-label", &a->plot_label, "LABEL",
                   "this run's name in the plot's legend (default: the backend)");
    pd_flag_string(fs, "--plot-from", &a->plot_from, "[LABEL=]FILE[,...]",
                   "plot earlier --output-file results instead of running a load (one series "
                   "per file; needs --plot)");
    pd_flag_string(fs, "--timeline-url", &a->timeline_url, "URL[,URL...]",
                   "pdserve servers (base URLs: a pdserve-router's and a decode's) whose "
                   "/metrics are read before and after each load: their hand-over stages "
                   "(pdserve_router_handover_seconds, pdserve_handover_seconds) are printed as "
                   "that load's means, with their sum against the mean TTFT measured here "
                   "(and a 'handover' object in --output-file)");
    pd_flag_string(fs, "--kv-bytes-url", &a->kv_bytes_url, "URL[,URL...]",
                   "pdserve servers (base URLs) whose /metrics pdserve_kv_transfer_bytes_total "
                   "is read before and after each load: the KV bytes the load moved, in all and "
                   "per request (table; kv_transfer_bytes and kv_transfer_bytes_per_request in "
                   "--output-file). Both sides of a transfer count it: give the prefills (or "
                   "the decodes), not both");
    pd_flag_bool(fs, "--flush-cache", &a->flush_cache,
                 "POST /flush_cache to the server before each load (after the warm-up), so no "
                 "load starts with prompts a previous one left in a prefix cache (a router "
                 "passes it to every worker without waiting for them: 0.5 s is left for that)");
    pd_flag_bool(fs, "--disable-progress", &a->disable_progress,
                 "no progress bar (on a terminal) or progress lines (otherwise) on stderr");
}

/* --plot-from: each "LABEL=FILE" or "FILE" becomes a series. */
static int plot_from(const char *list, const char *png) {
    char *dup = pd_strdup(list);
    struct pd_bench_series series[16];
    struct pd_bench_summary *owned[16];
    size_t n = 0;
    int rc = dup ? PD_OK : PD_ENOMEM;
    for (char *save = NULL, *it = dup ? strtok_r(dup, ",", &save) : NULL; it && !rc;
         it = strtok_r(NULL, ",", &save)) {
        if (n == 16) {
            rc = pd_errorf(PD_EINVAL, "--plot-from: at most 16 files");
            break;
        }
        char *eq = strchr(it, '=');
        const char *label = it, *path = it;
        if (eq) {
            *eq = '\0';
            path = eq + 1;
        } else {
            const char *slash = strrchr(it, '/');
            label = slash ? slash + 1 : it;
        }
        size_t k;
        rc = pd_bench_read_results(path, &owned[n], &k);
        if (!rc) {
            series[n] = (struct pd_bench_series){.label = label, .s = owned[n], .n = k};
            n++;
        }
    }
    if (!rc)
        rc = pd_bench_plot(png, series, n);
    for (size_t i = 0; i < n; i++)
        pd_free(owned[i]);
    pd_free(dup);
    return rc;
}

/* The tokenizer directory: --tokenizer, else the model id when it names a local directory. */
static int load_tokenizer(const struct args *a, const char *model_id, struct pd_tokenizer **tok) {
    const char *dir = a->tokenizer;
    char probe[4096];
    if (!dir && model_id) {
        snprintf(probe, sizeof(probe), "%s/tokenizer.json", model_id);
        if (pd_file_exists(probe))
            dir = model_id;
    }
    if (!dir)
        return pd_errorf(PD_EINVAL,
                         "no tokenizer: the model id '%s' is not a local model directory; pass "
                         "--tokenizer DIR (a directory with tokenizer.json) to make and count the "
                         "prompts",
                         model_id ? model_id : "(none)");
    int rc = pd_tokenizer_new(dir, tok);
    if (rc)
        return pd_error_wrap(rc, "--tokenizer %s", dir);
    return PD_OK;
}

static void print_errors(const struct pd_bench_result *r, size_t n, int failed) {
    if (!failed)
        return;
    fprintf(stderr, "pdserve-bench: %d of %zu requests failed; the first errors:\n", failed, n);
    int shown = 0;
    for (size_t i = 0; i < n && shown < 5; i++) {
        if (!r[i].ok && !r[i].cut) {
            fprintf(stderr, "  request %zu: %s\n", i, r[i].error ? r[i].error : "(no reason)");
            shown++;
        }
    }
}

static FILE *open_out(const char *path, const char *what) {
    FILE *f = fopen(path, "w");
    if (!f)
        pd_errorf(PD_EIO, "%s %s: cannot write: %s", what, path, strerror(errno));
    return f;
}

int main(int argc, char **argv) {
    struct args a = {
        .backend = 0,
        .dataset = 0,
        .port = 30000,
        .num_prompts = 1000,
        .random_input_len = 1024,
        .random_output_len = 1024,
        .random_range_ratio = 0.0,
        .max_concurrency = 0,
        .warmup_requests = 1,
        .seed = 1,
        .request_timeout = 3600,
        .disconnect_window_ms = 1000,
        .multiturn_conversations = 8,
        .multiturn_turns = 6,
        .host = "127.0.0.1",
        .request_rate = "inf",
    };
    a.api_key = getenv("OPENAI_API_KEY");
    struct pd_flagset fs;
    pd_flagset_init(&fs, "pdserve-bench",
                    "Serving benchmark (sglang.bench_serving's flags and result fields): open-loop "
                    "load with Poisson arrivals and/or a concurrency cap against an SGLang "
                    "/generate or OpenAI-compatible endpoint, every answer streamed; reports TTFT, "
                    "TPOT, ITL and E2E percentiles, request/token throughput and goodput, as a "
                    "table, JSON Lines, CSV and a gnuplot PNG. Output lengths are exact "
                    "(ignore_eos). Example: pdserve-bench --backend openai --base-url "
                    "http://127.0.0.1:30000 --dataset-name random --random-input-len 1024 "
                    "--random-output-len 128 --random-range-ratio 1 --num-prompts 200 "
                    "--request-rate-sweep 1,2,4,inf --output-file r.jsonl --plot r.png. "
                    "Environment: OPENAI_API_KEY (as --api-key), PD_BENCH_CURL_VERBOSE=1 "
                    "(curl's trace of every request on stderr).");
    register_flags(&fs, &a);
    if (pd_flags_parse(&fs, argc, argv))
        return fatal("bad arguments");
    if (fs.help) {
        pd_flags_usage(&fs, stdout);
        return 0;
    }
    if (a.plot && strchr(a.plot, '\''))
        return die("--plot: the path may not contain a single quote");
    if (a.plot && pd_bench_plot_check())
        return fatal("--plot");
    if (a.plot_from) {
        if (!a.plot)
            return die("--plot-from needs --plot FILE.png");
        if (plot_from(a.plot_from, a.plot))
            return fatal("plot");
        printf("pdserve-bench: wrote %s\n", a.plot);
        return 0;
    }

    double *rates = NULL;
    size_t n_rates = 0;
    const char *rate_text = a.sweep ? a.sweep : a.request_rate;
    for (int i = 0; i < fs.n; i++)
        if (a.sweep && !strcmp(fs.flags[i].name, "--request-rate") && fs.flags[i].seen)
            return die("give either --request-rate or --request-rate-sweep, not both");
    if (pd_bench_parse_rates(rate_text, &rates, &n_rates))
        return fatal(a.sweep ? "--request-rate-sweep" : "--request-rate");
    if (a.extra_body) {
        cJSON *extra = cJSON_Parse(a.extra_body);
        bool ok = cJSON_IsObject(extra);
        cJSON_Delete(extra);
        if (!ok) {
            pd_free(rates);
            return die("--extra-request-body: not a JSON object");
        }
    }
    if (a.dataset == DATASET_SHAREGPT && !a.dataset_path) {
        pd_free(rates);
        return die("--dataset-name sharegpt needs --dataset-path FILE");
    }
    if (a.dataset != DATASET_SHAREGPT && a.dataset_path)
        fprintf(stderr, "pdserve-bench: --dataset-path is ignored by --dataset-name %s\n",
                dataset_choices[a.dataset]);
    struct pd_bench_length_mix mix = {0};
    if (a.random_mix && a.dataset != DATASET_RANDOM) {
        pd_free(rates);
        return die("--random-mix works with --dataset-name random only");
    }
    if (a.random_mix && pd_bench_length_mix_parse(a.random_mix, &mix)) {
        pd_free(rates);
        return fatal("bad arguments");
    }
    if (a.dataset == DATASET_MULTITURN) {
        for (int i = 0; i < fs.n; i++)
            if (!strcmp(fs.flags[i].name, "--num-prompts") && fs.flags[i].seen)
                fprintf(stderr,
                        "pdserve-bench: --num-prompts is ignored by --dataset-name multiturn "
                        "(%d conversations x %d turns = %d requests)\n",
                        a.multiturn_conversations, a.multiturn_turns,
                        a.multiturn_conversations * a.multiturn_turns);
    }
    if (a.abort_fraction + a.disconnect_fraction > 1) {
        pd_free(rates);
        return die("--abort-fraction plus --disconnect-fraction must be at most 1");
    }
    if (a.max_concurrency == 0) {
        for (int i = 0; i < fs.n; i++)
            if (!strcmp(fs.flags[i].name, "--max-concurrency") && fs.flags[i].seen) {
                pd_free(rates);
                return die("--max-concurrency must be >= 1 (leave it out for no cap)");
            }
    }

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max; /* one socket per request in flight */
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        pd_free(rates);
        fprintf(stderr, "pdserve-bench: curl_global_init failed\n");
        return 1;
    }

    int exit_code = 1;
    FILE *json = NULL, *csv = NULL, *reqs = NULL;
    char *model_id = NULL;
    struct pd_tokenizer *tok = NULL;
    struct pd_bench_dataset ds = {0};
    struct pd_bench_summary *sums = pd_calloc(n_rates, sizeof(*sums));
    struct pd_bench_result *res = NULL;
    char base[2048], api_url[2200];
    if (a.base_url) {
        snprintf(base, sizeof(base), "%s", a.base_url);
        size_t bl = strlen(base);
        while (bl && base[bl - 1] == '/')
            base[--bl] = '\0';
    } else {
        snprintf(base, sizeof(base), "http://%s:%d", a.host, a.port);
    }
    enum pd_bench_backend backend = backend_of_choice[a.backend];
    snprintf(api_url, sizeof(api_url), "%s%s", base,
             backend == PD_BENCH_SGLANG   ? "/generate"
             : backend == PD_BENCH_OPENAI ? "/v1/completions"
                                          : "/v1/chat/completions");
    if (!sums) {
        fatal("out of memory");
        goto out;
    }
    if (a.output_file && !(json = open_out(a.output_file, "--output-file"))) {
        fatal("output");
        goto out;
    }
    if (a.output_csv && !(csv = open_out(a.output_csv, "--output-csv"))) {
        fatal("output");
        goto out;
    }
    if (a.output_requests && !(reqs = open_out(a.output_requests, "--output-requests"))) {
        fatal("output");
        goto out;
    }

    int max_model_len = 0;
    if (pd_bench_probe(base, a.api_key, &model_id, &max_model_len)) {
        fatal("server check");
        goto out;
    }
    const char *model = a.model ? a.model : model_id;
    if (!model && backend != PD_BENCH_SGLANG) {
        die("no model name: GET /v1/models gave none; pass --model NAME");
        goto out;
    }
    if (load_tokenizer(&a, a.tokenizer ? NULL : model, &tok)) {
        fatal("tokenizer");
        goto out;
    }
    struct pd_bench_random_spec spec = {.input_len = a.random_input_len,
                                        .output_len = a.random_output_len,
                                        .range_ratio = a.random_range_ratio,
                                        .as_text = backend == PD_BENCH_OPENAI_CHAT,
                                        .mix = a.random_mix ? &mix : NULL};
    if (a.dataset == DATASET_MULTITURN) {
        if (pd_bench_dataset_multiturn(&spec, a.multiturn_conversations, a.multiturn_turns,
                                       (uint64_t)a.seed, tok, &ds)) {
            fatal("dataset");
            goto out;
        }
    } else if (a.dataset == DATASET_RANDOM) {
        if (pd_bench_dataset_random(&spec, (size_t)a.num_prompts, (uint64_t)a.seed, tok, &ds)) {
            fatal("dataset");
            goto out;
        }
    } else if (a.dataset == DATASET_SHAREGPT_SYNTHETIC) {
        int ctx = a.sharegpt_context_len ? a.sharegpt_context_len : max_model_len;
        if (pd_bench_dataset_sharegpt_synthetic(&spec, (size_t)a.num_prompts, (uint64_t)a.seed, ctx,
                                                tok, &ds)) {
            fatal("dataset");
            goto out;
        }
    } else {
        int ctx = a.sharegpt_context_len ? a.sharegpt_context_len : max_model_len;
        if (pd_bench_dataset_sharegpt(a.dataset_path, (size_t)a.num_prompts, (uint64_t)a.seed,
                                      a.sharegpt_output_len, ctx, tok, &ds)) {
            fatal("dataset");
            goto out;
        }
        if (ds.n < (size_t)a.num_prompts)
            fprintf(stderr,
                    "pdserve-bench: %s gave %zu usable conversations of the %d asked for; "
                    "running with %zu\n",
                    a.dataset_path, ds.n, a.num_prompts, ds.n);
    }
    long in_tok = 0, out_tok = 0;
    for (size_t i = 0; i < ds.n; i++) {
        in_tok += ds.p[i].prompt_len;
        out_tok += ds.p[i].output_len;
    }
    printf("pdserve-bench: %s %s, %zu prompts (%ld input%s / %ld output tokens), model %s\n",
           pd_bench_backend_names[backend], api_url, ds.n, in_tok,
           a.dataset == DATASET_MULTITURN ? " tokens new in their turns" : "", out_tok,
           model ? model : "(not needed)");

    struct pd_bench_load load = {
        .backend = backend,
        .api_url = api_url,
        .model = model,
        .api_key = a.api_key,
        .extra_body = a.extra_body,
        .request_rate = INFINITY,
        .max_concurrency = 0,
        .ignore_eos = !a.disable_ignore_eos,
        .seed = (uint64_t)a.seed,
        .progress = false,
        .label = "warmup",
        .timeout_s = a.request_timeout,
        .tok = tok,
    };
    if (a.warmup_requests > 0) {
        size_t nw = (size_t)a.warmup_requests;
        struct pd_bench_prompt *wp = pd_calloc(nw, sizeof(*wp));
        struct pd_bench_result *wr = pd_calloc(nw, sizeof(*wr));
        double wd = 0;
        int rc = wp && wr ? PD_OK : PD_ENOMEM;
        for (size_t i = 0; wp && i < nw; i++) {
            wp[i] = ds.p[0];
            wp[i].turn = 0; /* a multi-turn dataset's first text, sent on its own */
        }
        if (!rc)
            rc = pd_bench_load_run(&load, wp, nw, 32, wr, &wd);
        int ok = 0;
        for (size_t i = 0; wr && i < nw; i++)
            ok += wr[i].ok;
        if (!rc && ok == 0) {
            fprintf(stderr,
                    "pdserve-bench: every warm-up request failed (check the flags and the "
                    "server); the first error: %s\n",
                    wr[0].error ? wr[0].error : "(none)");
            rc = PD_EPEER;
        } else if (!rc) {
            printf("pdserve-bench: warm-up done (%d of %zu requests ok)\n", ok, nw);
        }
        for (size_t i = 0; wr && i < nw; i++)
            pd_bench_result_free(&wr[i]);
        pd_free(wp);
        pd_free(wr);
        if (rc) {
            if (rc != PD_EPEER)
                fatal("warm-up");
            goto out;
        }
    }

    if (csv)
        pd_bench_csv_header(csv);
    struct pd_bench_run_info info = {
        .backend = pd_bench_backend_names[backend],
        .dataset_name = dataset_choices[a.dataset],
        .base_url = base,
        .model = model,
        .num_prompts = (int)ds.n,
        .random_input_len = a.random_input_len,
        .random_output_len = a.random_output_len,
        .random_range_ratio = a.random_range_ratio,
        .sharegpt_output_len = a.sharegpt_output_len,
        .random_mix = a.random_mix,
        .mix = a.random_mix ? &mix : NULL,
        .multiturn_conversations = a.dataset == DATASET_MULTITURN ? a.multiturn_conversations : 0,
        .multiturn_turns = a.dataset == DATASET_MULTITURN ? a.multiturn_turns : 0,
    };
    exit_code = 0;
    for (size_t k = 0; k < n_rates; k++) {
        res = pd_calloc(ds.n, sizeof(*res));
        if (!res) {
            exit_code = fatal("out of memory");
            goto out;
        }
        char label[64];
        if (isinf(rates[k]))
            snprintf(label, sizeof(label), "rate inf");
        else
            snprintf(label, sizeof(label), "rate %g", rates[k]);
        load.request_rate = rates[k];
        load.max_concurrency = a.max_concurrency;
        load.progress = !a.disable_progress;
        load.label = label;
        load.seed = (uint64_t)a.seed + k;
        load.abort_fraction = a.abort_fraction;
        load.disconnect_fraction = a.disconnect_fraction;
        load.disconnect_window_s = a.disconnect_window_ms * 1e-3;
        load.requests_out = reqs;
        double duration = 0;
        struct pd_bench_timeline tl_before, tl_after, kv_before, kv_after;
        struct pd_bench_timeline_result tl;
        if (a.flush_cache) {
            if (pd_bench_flush_cache(base, a.api_key)) {
                exit_code = fatal("--flush-cache");
                goto out;
            }
            usleep(500 * 1000); /* a router answers before its workers have flushed */
        }
        if (a.timeline_url && pd_bench_timeline_scrape(a.timeline_url, a.api_key, &tl_before)) {
            exit_code = fatal("--timeline-url");
            goto out;
        }
        if (a.kv_bytes_url && pd_bench_timeline_scrape(a.kv_bytes_url, a.api_key, &kv_before)) {
            exit_code = fatal("--kv-bytes-url");
            goto out;
        }
        if (pd_bench_load_run(&load, ds.p, ds.n, 0, res, &duration)) {
            exit_code = fatal("load");
            goto out;
        }
        if (a.timeline_url && pd_bench_timeline_scrape(a.timeline_url, a.api_key, &tl_after)) {
            exit_code = fatal("--timeline-url");
            goto out;
        }
        if (a.kv_bytes_url && pd_bench_timeline_scrape(a.kv_bytes_url, a.api_key, &kv_after)) {
            exit_code = fatal("--kv-bytes-url");
            goto out;
        }
        sums[k].request_rate = rates[k];
        sums[k].max_concurrency = a.max_concurrency;
        if (pd_bench_summarize(res, ds.n, duration, a.slo_ttft_ms, a.slo_tpot_ms, &sums[k]) ||
            pd_bench_summarize_groups(res, ds.n, mix.n, info.multiturn_turns, &sums[k])) {
            exit_code = fatal("summary");
            goto out;
        }
        if (a.kv_bytes_url) {
            sums[k].has_kv_bytes = true;
            sums[k].kv_bytes = kv_after.kv_bytes - kv_before.kv_bytes;
        }
        if (a.timeline_url) {
            pd_bench_timeline_reduce(&tl_before, &tl_after, sums[k].ttft[PD_BENCH_MEAN], &tl);
            sums[k].timeline = &tl;
        }
        pd_bench_print_table(stdout, &info, &sums[k]);
        if (a.timeline_url)
            pd_bench_timeline_print(stdout, &tl);
        print_errors(res, ds.n, sums[k].failed);
        if (sums[k].completed == 0) {
            fprintf(stderr, "pdserve-bench: no request of the load at %s completed\n", label);
            exit_code = 1;
        }
        if (json) {
            char *line = NULL;
            if (pd_bench_json_line(&info, &sums[k], res, ds.n, a.output_details, &line)) {
                exit_code = fatal("--output-file");
                goto out;
            }
            fprintf(json, "%s\n", line);
            fflush(json);
            pd_free(line);
        }
        if (csv) {
            pd_bench_csv_rows(csv, &sums[k], res, ds.n);
            fflush(csv);
        }
        sums[k].timeline = NULL; /* tl is this iteration's */
        for (size_t i = 0; i < ds.n; i++)
            pd_bench_result_free(&res[i]);
        pd_free(res);
        res = NULL;
    }
    if (json && ferror(json)) {
        exit_code = fatal("--output-file: write error");
        goto out;
    }
    if (a.plot) {
        struct pd_bench_series s = {
            .label = a.plot_label ? a.plot_label : info.backend, .s = sums, .n = n_rates};
        if (pd_bench_plot(a.plot, &s, 1)) {
            exit_code = fatal("plot");
            goto out;
        }
        printf("pdserve-bench: wrote %s\n", a.plot);
    }
out:
    if (res) {
        for (size_t i = 0; i < ds.n; i++)
            pd_bench_result_free(&res[i]);
        pd_free(res);
    }
    if (json && fclose(json) != 0 && exit_code == 0)
        exit_code = fatal("--output-file: close");
    if (csv && fclose(csv) != 0 && exit_code == 0)
        exit_code = fatal("--output-csv: close");
    if (reqs && fclose(reqs) != 0 && exit_code == 0)
        exit_code = fatal("--output-requests: close");
    pd_bench_dataset_free(&ds);
    pd_tokenizer_free(tok);
    pd_free(model_id);
    pd_free(sums);
    pd_free(rates);
    curl_global_cleanup();
    return exit_code;
}
