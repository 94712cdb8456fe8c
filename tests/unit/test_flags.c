/* The shared flag parser: SGLang spellings, both value syntaxes, and a clear message for every
 * kind of bad command line (unknown flag with a suggestion, bad number, out of range, bad
 * choice, missing value, missing required flag, stray argument). */
#include "pd_test.h"

#include "common/server_args.h"
#include "common/base/log.h"

#include <stdarg.h>

/* argv from a NULL-terminated list; argv[0] is the program. */
static int parse(struct pd_flagset *fs, ...) {
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"pdserve-test";
    va_list ap;
    va_start(ap, fs);
    for (char *a = va_arg(ap, char *); a; a = va_arg(ap, char *))
        argv[argc++] = a;
    va_end(ap);
    return pd_flags_parse(fs, argc, argv);
}

static void server_flags(struct pd_flagset *fs, struct pd_server_args *a) {
    pd_server_args_defaults(a);
    pd_flagset_init(fs, "pdserve-test", "test daemon");
    pd_server_args_register(fs, a);
}

static void test_sglang_names(void) {
    struct pd_flagset fs;
    struct pd_server_args a;
    server_flags(&fs, &a);
    CHECK_OK(parse(&fs, "--model-path", "/models/qwen", "--host=0.0.0.0", "--port", "8100",
                   "--page-size", "32", "--chunked-prefill-size", "4096", "--max-prefill-tokens",
                   "8192", "--max-running-requests", "64", "--context-length", "4096",
                   "--mem-fraction-static", "0.8", "--tp-size", "2", "--disaggregation-mode",
                   "prefill", "--disaggregation-bootstrap-port", "9000",
                   "--disaggregation-ib-device", "mlx5_0", "--log-level", "debug", "--device",
                   "cuda", "--disable-prefix-cache", NULL));
    CHECK_OK(pd_server_args_finish(&a));
    CHECK(!fs.help);
    CHECK_STR(a.model_path, "/models/qwen");
    CHECK_STR(a.tokenizer_path, "/models/qwen");
    CHECK_STR(a.host, "0.0.0.0");
    CHECK_INT(a.port, 8100);
    CHECK_INT(a.page_size, 32);
    CHECK_INT(a.chunked_prefill_size, 4096);
    CHECK_INT(a.max_prefill_tokens, 8192);
    CHECK_INT(a.max_running_requests, 64);
    CHECK_INT(a.context_length, 4096);
    CHECK_DBL(a.mem_fraction_static, 0.8, 1e-12);
    CHECK_INT(a.tp_size, 2);
    CHECK_INT(a.disaggregation_mode, PD_DISAGG_PREFILL);
    CHECK_INT(a.disaggregation_bootstrap_port, 9000);
    CHECK_STR(a.disaggregation_ib_device, "mlx5_0");
    CHECK_INT(a.log_level, PD_LOG_DEBUG);
    CHECK_INT(a.device, PD_DEVICE_CUDA);
    CHECK(a.disable_prefix_cache);
    pd_log_set_level(PD_LOG_INFO);
}

static void test_defaults_and_help(void) {
    struct pd_flagset fs;
    struct pd_server_args a;
    server_flags(&fs, &a);
    CHECK_OK(parse(&fs, "--model-path", "m", NULL));
    CHECK_OK(pd_server_args_finish(&a));
    CHECK_INT(a.port, 30000);
    CHECK_INT(a.disaggregation_bootstrap_port, 8998);
    CHECK_INT(a.disaggregation_mode, PD_DISAGG_NULL);
    CHECK_INT(a.device, PD_DEVICE_CPU);
    CHECK_INT(a.chunked_prefill_size % a.page_size, 0);

    server_flags(&fs, &a);
    CHECK_OK(parse(&fs, "--port", "1", "--help", "--bogus", NULL));
    CHECK(fs.help);

    /* --help lists every registered flag with its default */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    pd_flags_usage(&fs, mem);
    fclose(mem);
    for (int i = 0; i < fs.n; i++)
        CHECK(strstr(text, fs.flags[i].name) != NULL);
    CHECK(strstr(text, "{null, prefill, decode}") != NULL);
    CHECK(strstr(text, "[default: 8998]") != NULL);
    CHECK(strstr(text, "[required]") != NULL);
    free(text);
}

static void test_rejections(void) {
    struct pd_flagset fs;
    struct pd_server_args a;
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--model_path", "m", NULL), PD_EINVAL,
              "unknown flag '--model_path' (did you mean '--model-path'?");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--zzzzzzzzzzzz", NULL), PD_EINVAL, "unknown flag '--zzzzzzzzzzzz'");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--port", "80x", NULL), PD_EINVAL,
              "--port: '80x' is not an integer (allowed: 1..65535)");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--port=70000", NULL), PD_EINVAL,
              "--port: 70000 is out of range (allowed: 1..65535)");
    CHECK_INT(a.port, 30000); /* a rejected value is not stored */
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--device", "tpu", NULL), PD_EINVAL,
              "--device: 'tpu' is not one of cpu, cuda");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--disaggregation-mode", "both", NULL), PD_EINVAL,
              "'both' is not one of null, prefill, decode");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--model-path", "m", "--page-size", NULL), PD_EINVAL,
              "--page-size: missing value");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--port", "8000", NULL), PD_EINVAL, "--model-path is required");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--model-path", "m", "extra", NULL), PD_EINVAL,
              "unexpected argument 'extra'");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--mem-fraction-static", "nan", NULL), PD_EINVAL,
              "--mem-fraction-static: 'nan' is not a number");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--log-level", "loud", NULL), PD_EINVAL,
              "'loud' is not one of debug, info, warning, error");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--disable-prefix-cache=maybe", NULL), PD_EINVAL,
              "'maybe' is not a boolean");
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--model-path=", NULL), PD_EINVAL,
              "--model-path: value must not be empty");

    server_flags(&fs, &a);
    CHECK_OK(parse(&fs, "--model-path", "m", "--page-size", "16", "--chunked-prefill-size", "100",
                   NULL));
    CHECK_ERR(pd_server_args_finish(&a), PD_EINVAL,
              "--chunked-prefill-size 100 must be a multiple of --page-size 16");
    server_flags(&fs, &a);
    CHECK_OK(parse(&fs, "--model-path", "m", "--chunked-prefill-size", "-1", NULL));
    CHECK_OK(pd_server_args_finish(&a));
}

static void test_custom_flags(void) {
    struct pd_flagset fs;
    int64_t big = 5;
    double temp = 1.0;
    bool quiet = true;
    const char *out = NULL;
    pd_flagset_init(&fs, "tool", "a tool");
    pd_flag_int64(&fs, "--bytes", &big, "N", 0, 1e15, "bytes");
    pd_flag_double(&fs, "--temperature", &temp, "T", 0, 2, "temperature");
    pd_flag_bool(&fs, "--quiet", &quiet, "quiet");
    pd_flag_string(&fs, "--out", &out, "DIR", "out")->required = true;
    CHECK_OK(parse(&fs, "--bytes", "123456789012", "--temperature=0.25", "--quiet=false", "--out",
                   "x", NULL));
    CHECK_INT(big, 123456789012LL);
    CHECK_DBL(temp, 0.25, 0);
    CHECK(!quiet);
    CHECK_STR(out, "x");
    CHECK_ERR(parse(&fs, "--temperature", "2.5", NULL), PD_EINVAL,
              "--temperature: 2.5 is out of range (allowed: 0..2)");
}

/* --kv-cache-dtype: SGLang's spellings (long and short name the same type), auto by default
 * (left to pd_tp_group_new), anything else refused naming the flag and the choices. */
static void test_kv_cache_dtype(void) {
    static const struct {
        const char *name;
        enum pd_dtype t;
    } ok[] = {{"bf16", PD_DTYPE_BF16},       {"bfloat16", PD_DTYPE_BF16},
              {"fp16", PD_DTYPE_F16},        {"float16", PD_DTYPE_F16},
              {"fp32", PD_DTYPE_F32},        {"float32", PD_DTYPE_F32},
              {"fp8_e4m3", PD_DTYPE_F8E4M3}, {"fp8_e5m2", PD_DTYPE_F8E5M2}};
    struct pd_flagset fs;
    struct pd_server_args a;
    enum pd_dtype t;
    server_flags(&fs, &a);
    CHECK_OK(parse(&fs, "--model-path", "m", NULL));
    CHECK_INT(a.kv_cache_dtype, PD_KV_CACHE_DTYPE_AUTO);
    CHECK(!pd_kv_cache_dtype_of(a.kv_cache_dtype, &t));
    for (size_t i = 0; i < PD_ARRAY_LEN(ok); i++) {
        server_flags(&fs, &a);
        CHECK_OK(parse(&fs, "--model-path", "m", "--kv-cache-dtype", ok[i].name, NULL));
        CHECK(pd_kv_cache_dtype_of(a.kv_cache_dtype, &t));
        CHECK_INT(t, ok[i].t);
    }
    server_flags(&fs, &a);
    CHECK_ERR(parse(&fs, "--kv-cache-dtype", "fp8", NULL), PD_EINVAL,
              "--kv-cache-dtype: 'fp8' is not one of auto, bf16, bfloat16, fp16, float16, fp32, "
              "float32, fp8_e4m3, fp8_e5m2");
}

PD_TEST_MAIN(PD_TEST(test_sglang_names), PD_TEST(test_defaults_and_help), PD_TEST(test_rejections),
             PD_TEST(test_custom_flags), PD_TEST(test_kv_cache_dtype))
