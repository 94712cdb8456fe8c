/*
 * server_args.c — the server flags the daemons share (pdserve-prefill, pdserve-decode, their
 * colocated mode), registered on the parser of common/base/flags.c, with SGLang's defaults and
 * the cross-flag checks.
 */
#include "common/server_args.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "model/tp.h"

#include <string.h>

const char *const pd_disagg_mode_names[] = {"null", "prefill", "decode", NULL};
const char *const pd_device_names[] = {"cpu", "cuda", NULL};

const char pd_kv_cache_dtype_help[] =
    "element type of the KV cache; auto = the model's torch_dtype (config.json) on cuda, "
    "float32 on cpu (the CPU backend computes in f32 and its tests compare with transformers "
    "in f32); fp8 (scale 1.0, as SGLang without calibrated scales) holds 4x the tokens of "
    "float32 in the same memory, bf16/fp16 2x, at the cost of rounding K and V";

void pd_server_args_defaults(struct pd_server_args *a) {
    memset(a, 0, sizeof(*a));
    a->host = "127.0.0.1";
    a->port = 30000;
    a->page_size = 16;
    a->chunked_prefill_size = 8192;
    a->max_prefill_tokens = PD_DEFAULT_MAX_PREFILL_TOKENS;
    a->max_running_requests = 256;
    a->max_queued_requests = 1024;
    a->context_length = 0;
    a->mem_fraction_static = 0.88;
    a->max_total_tokens = 0;
    a->tp_size = 1;
    a->disaggregation_mode = PD_DISAGG_NULL;
    a->disaggregation_bootstrap_port = 8998;
    a->device = PD_DEVICE_CPU;
    a->threads = 0;
    a->log_level = PD_LOG_INFO;
    a->random_seed = 0;
    a->limit_mm_per_prompt = 16;
    a->mm_embedding_cache_mb = 256;
    a->image_url_max_bytes = 20 << 20;
    a->image_url_timeout = 10;
}

void pd_server_args_register(struct pd_flagset *fs, struct pd_server_args *a) {
    pd_flag_string(fs, "--model-path", &a->model_path, "DIR",
                   "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)")
        ->required = true;
    pd_flag_string(fs, "--tokenizer-path", &a->tokenizer_path, "DIR",
                   "directory of tokenizer.json (default: --model-path)");
    pd_flag_string(fs, "--served-model-name", &a->served_model_name, "NAME",
                   "model name in the API (default: --model-path)");
    pd_flag_string(fs, "--host", &a->host, "ADDR", "HTTP listen address");
    pd_flag_int(fs, "--port", &a->port, "PORT", 1, 65535, "HTTP listen port");
    pd_flag_choice(fs, "--device", &a->device, pd_device_names, "compute backend");
    pd_flag_int(fs, "--base-gpu-id", &a->base_gpu_id, "N", 0, 1023,
                "--device cuda: index of the GPU to run on (as CUDA_VISIBLE_DEVICES numbers them)");
    pd_flag_int(
        fs, "--tp-size", &a->tp_size, "N", 1, PD_TP_MAX,
        "tensor parallelism: the model's heads and MLP split over N ranks in this process "
        "(cpu: the --threads shared among them; cuda: GPUs --base-gpu-id .. +N-1, summed "
        "over NCCL, libnccl.so.2 or $PDSERVE_NCCL_LIBRARY opened at start); prefill and decode "
        "may run different N (the prefill regroups each page's kv heads into the decode's "
        "ranks)");
    pd_flag_int(fs, "--threads", &a->threads, "N", 0, 1024,
                "CPU backend threads (all --tp-size ranks together), 0 = one per core");
    pd_flag_int(fs, "--page-size", &a->page_size, "TOKENS", 1, 1024, "tokens per KV-cache page");
    pd_flag_int(fs, "--chunked-prefill-size", &a->chunked_prefill_size, "TOKENS", -1, 1 << 24,
                "token budget of one prefill step; -1 disables chunking");
    pd_flag_int(fs, "--max-prefill-tokens", &a->max_prefill_tokens, "TOKENS", 1, 1 << 24,
                "most prompt tokens in one prefill batch");
    pd_flag_int(fs, "--max-running-requests", &a->max_running_requests, "N", 1, 1 << 20,
                "most requests in one decode batch");
    pd_flag_int(fs, "--max-queued-requests", &a->max_queued_requests, "N", 1, 1 << 20,
                "requests waiting beyond this are refused with 503");
    pd_flag_int(fs, "--context-length", &a->context_length, "TOKENS", 0, 1 << 24,
                "longest prompt + output; 0 = max_position_embeddings of config.json");
    pd_flag_double(fs, "--mem-fraction-static", &a->mem_fraction_static, "F", 0.01, 1.0,
                   "share of device memory for weights and the KV pool");
    pd_flag_int(fs, "--max-total-tokens", &a->max_total_tokens, "TOKENS", 0, 1 << 30,
                "KV pool size in tokens, backed by memory at start (CPU: every page touched, "
                "in huge pages where the kernel allows; no request pays a first touch); 0 = "
                "derive from --mem-fraction-static, pages backed as they are first used");
    pd_flag_choice(fs, "--kv-cache-dtype", &a->kv_cache_dtype, pd_kv_cache_dtype_names,
                   pd_kv_cache_dtype_help);
    pd_flag_bool(fs, "--disable-prefix-cache", &a->disable_prefix_cache,
                 "do not reuse KV pages of shared prompt prefixes (a decode in PD mode then keeps "
                 "no finished request's KV and asks its prefill for every prompt page)");
    pd_flag_choice(fs, "--disaggregation-mode", &a->disaggregation_mode, pd_disagg_mode_names,
                   "role in prefill/decode disaggregation; null = colocated");
    pd_flag_int(fs, "--disaggregation-bootstrap-port", &a->disaggregation_bootstrap_port, "PORT", 1,
                65535, "prefill's gRPC bootstrap port that decode daemons pair through");
    pd_flag_string(fs, "--disaggregation-ib-device", &a->disaggregation_ib_device, "DEV",
                   "RDMA device(s) for KV transfer, e.g. mlx5_0 (default: UCX chooses)");
    pd_flag_int64(fs, "--random-seed", &a->random_seed, "N", 0, 9007199254740992.0,
                  "seed of sampling when a request gives none");
    pd_flag_int(fs, "--limit-mm-per-prompt", &a->limit_mm_per_prompt, "N", 0, 64,
                "vision-language models: most images in one request (more is a 400)");
    pd_flag_int(fs, "--mm-embedding-cache-mb", &a->mm_embedding_cache_mb, "MB", 0, 1 << 20,
                "vision-language models: bytes (MB) of image embeddings kept by image content, "
                "so a chunked prefill and repeated images run the vision encoder once; 0 keeps "
                "none past their request");
    pd_flag_bool(fs, "--allow-image-urls", &a->allow_image_urls,
                 "vision-language models: fetch images given as http(s) URLs (otherwise they "
                 "are refused: send data: URLs), within --image-url-max-bytes and "
                 "--image-url-timeout");
    pd_flag_int64(fs, "--image-url-max-bytes", &a->image_url_max_bytes, "BYTES", 1, 1 << 30,
                  "--allow-image-urls: the largest image file fetched");
    pd_flag_double(fs, "--image-url-timeout", &a->image_url_timeout, "SECONDS", 0.1, 600,
                   "--allow-image-urls: the longest one image's fetch may take");
    pd_flag_log_level(fs, &a->log_level);
}

int pd_server_args_finish(struct pd_server_args *a) {
    if (a->chunked_prefill_size == 0)
        return pd_errorf(PD_EINVAL, "--chunked-prefill-size: 0 is not allowed (use -1 to "
                                    "disable chunking, or a positive token budget)");
    if (a->chunked_prefill_size > 0 && a->chunked_prefill_size % a->page_size != 0)
        return pd_errorf(PD_EINVAL,
                         "--chunked-prefill-size %d must be a multiple of --page-size %d "
                         "(chunks are cut at page boundaries)",
                         a->chunked_prefill_size, a->page_size);
    if (a->chunked_prefill_size > 0 && a->max_prefill_tokens < a->chunked_prefill_size)
        return pd_errorf(PD_EINVAL, "--max-prefill-tokens %d is below --chunked-prefill-size %d",
                         a->max_prefill_tokens, a->chunked_prefill_size);
    if (!a->tokenizer_path)
        a->tokenizer_path = a->model_path;
    if (!a->served_model_name)
        a->served_model_name = a->model_path;
    pd_log_set_level((enum pd_log_level)a->log_level);
    return PD_OK;
}
