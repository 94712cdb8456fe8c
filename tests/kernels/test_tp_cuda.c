/*
 * test_tp_cuda.c — tensor parallelism on GPUs over NCCL (kernels/tp_nccl.c): a tiny model as a
 * group of 2 ranks on GPUs 0 and 1 computes what the same model computes on GPU 0 alone — the
 * prompts' logits (up to the reassociation of the split sums, bf16 weights as on the cpu) and the
 * greedy ids of a few decode steps. Skips (77) with fewer than two GPUs or without NCCL in the
 * build, saying which.
 */
#include "pd_test.h"

#include "common/alloc.h"
#include "common/mkmodel.h"
#include "common/tp.h"
#include "common/tp_group.h"

#include <cuda_runtime_api.h>
#include <math.h>

#define NREQ 3
#define STEPS 6

static char model_dir[512];
static const int plen[NREQ] = {37, 16, 5};
static const int32_t pages[NREQ][4] = {{3, 9, 1, 14}, {2, 20, 5, 6}, {11, 0, 7, 8}};

struct run {
    int vocab;
    float *ext; /* [NREQ][vocab] */
    int32_t greedy[STEPS][NREQ];
};

static int run_group(int size, struct run *out) {
    struct pd_tp_group_opts o = {
        .size = size,
        .backend = {.kind = PD_BACKEND_CUDA, .device_index = 0},
        .model_path = model_dir,
        .model = {.max_tokens = 64, .max_reqs = 4, .page_size = 16},
        .kv_dtype = PD_DTYPE_F32,
        .n_pages = 24,
    };
    struct pd_tp_group *g = NULL;
    int rc = pd_tp_group_new(&o, &g);
    if (rc) {
        fprintf(stderr, "FAIL: tp %d group: %s\n", size, pd_error_msg());
        return rc;
    }
    int V = pd_model_config_of(pd_tp_group_model(g, 0))->vocab_size;
    out->vocab = V;
    out->ext = pd_calloc((size_t)NREQ * V, sizeof(float));
    int32_t toks[NREQ][64];
    for (int q = 0; q < NREQ; q++)
        for (int i = 0; i < 64; i++)
            toks[q][i] = (int32_t)((i * (q + 5) + 11 * q + 1) % V);
    struct pd_model_seq s[NREQ];
    for (int q = 0; q < NREQ; q++)
        s[q] = (struct pd_model_seq){toks[q], plen[q], 0, pages[q], 4};
    rc = pd_tp_group_extend(g, s, NREQ, false, out->ext);
    float lp[NREQ];
    int32_t next[NREQ];
    for (int q = 0; q < NREQ; q++) { /* each request continues with its own greedy choice */
        const float *row = out->ext + (size_t)q * V;
        next[q] = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[next[q]])
                next[q] = v;
    }
    for (int st = 0; st < STEPS && !rc; st++) {
        for (int q = 0; q < NREQ; q++)
            s[q] = (struct pd_model_seq){&next[q], 1, plen[q] + st, pages[q], 4};
        rc = pd_tp_group_decode_greedy(g, s, NREQ, out->greedy[st], lp);
        for (int q = 0; q < NREQ && !rc; q++)
            next[q] = out->greedy[st][q];
    }
    if (rc)
        fprintf(stderr, "FAIL: tp %d steps: %s\n", size, pd_error_msg());
    pd_tp_group_free(g);
    return rc;
}

static void test_tp2_equals_tp1(void) {
    struct pd_mkmodel_opts mo;
    pd_mkmodel_opts_defaults(&mo);
    mo.seed = 5;
    snprintf(model_dir, sizeof(model_dir), "%s/tp_cuda/llama", pd_test_tmpdir());
    CHECK_OK(pd_mkmodel_write(&mo, model_dir));
    struct run one = {0}, two = {0};
    CHECK_OK(run_group(1, &one));
    CHECK_OK(run_group(2, &two));
    if (one.ext && two.ext) {
        double d = 0, mx = 1e-30;
        for (size_t i = 0; i < (size_t)NREQ * one.vocab; i++) {
            d = fmax(d, fabs((double)one.ext[i] - two.ext[i]));
            mx = fmax(mx, fabs((double)one.ext[i]));
        }
        printf("tp 2 vs tp 1 on the GPU: logits relative error %.3g\n", d / mx);
        CHECK(d / mx < 1e-3);
        CHECK(memcmp(one.greedy, two.greedy, sizeof(one.greedy)) == 0);
    }
    pd_free(one.ext);
    pd_free(two.ext);
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("SKIP: tensor parallelism over NCCL needs 2 GPUs, %d here\n", n);
        return 77;
    }
    if (!pd_tp_nccl_new) {
        printf("SKIP: this build has no NCCL (kernels/CMakeLists.txt did not find it)\n");
        return 77;
    }
    test_tp2_equals_tp1();
    fprintf(stderr, "%s: %d checks, %d failed\n", "test_tp_cuda", pd_test_checks, pd_test_failures);
    return pd_test_failures ? 1 : 0;
}
