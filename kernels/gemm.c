/*
 * gemm.c — matrix products through cuBLAS: y = x · wᵀ with the weight as stored in the
 * checkpoint ([m][k] row-major, which cuBLAS reads as a k×m column-major matrix, op T), bf16 or
 * f16 inputs on tensor cores with f32 accumulation and f32 output (CUBLAS_COMPUTE_32F), f32 as
 * plain sgemm. The handle is bound to one stream with a workspace fixed at creation, so its
 * launches can be captured in a CUDA graph (cuBLAS must not allocate during capture).
 * cublasStatus_t is translated here only.
 */
#include "common/base/alloc.h"
#include "common/base/status.h"
#include "kernels/kernels.h"

#include <cublas_v2.h>

struct pd_kernel_gemm {
    cublasHandle_t h;
    void *workspace; /* device */
    size_t workspace_bytes;
};

static int blas_status(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return PD_OK;
    int code = st == CUBLAS_STATUS_ALLOC_FAILED      ? PD_ENOMEM
               : st == CUBLAS_STATUS_NOT_SUPPORTED   ? PD_EUNSUPPORTED
               : st == CUBLAS_STATUS_NOT_INITIALIZED ? PD_EUNSUPPORTED
               : st == CUBLAS_STATUS_INVALID_VALUE   ? PD_EINVAL
                                                     : PD_EINTERNAL;
    return pd_errorf(code, "%s: %s (%s)", what, cublasGetStatusString(st), cublasGetStatusName(st));
}

int pd_kernel_gemm_new(cudaStream_t s, size_t workspace_bytes, struct pd_kernel_gemm **out) {
    *out = NULL;
    struct pd_kernel_gemm *g = pd_calloc(1, sizeof(*g));
    if (!g)
        return PD_ENOMEM;
    int rc = blas_status(cublasCreate(&g->h), "creating the cuBLAS handle");
    if (rc)
        goto fail_handle;
    if ((rc = blas_status(cublasSetStream(g->h, s), "binding cuBLAS to the stream")))
        goto fail_setup;
    if ((rc = pd__cuda_status(cudaMalloc(&g->workspace, workspace_bytes), "cuBLAS workspace")))
        goto fail_setup;
    g->workspace_bytes = workspace_bytes;
    if ((rc = blas_status(cublasSetWorkspace(g->h, g->workspace, workspace_bytes),
                          "setting the cuBLAS workspace")))
        goto fail_ws;
    *out = g;
    return PD_OK;
fail_ws:
    cudaFree(g->workspace);
fail_setup:
    cublasDestroy(g->h);
fail_handle:
    pd_free(g);
    return rc;
}

void pd_kernel_gemm_free(struct pd_kernel_gemm *g) {
    if (!g)
        return;
    cublasDestroy(g->h);
    cudaFree(g->workspace);
    pd_free(g);
}

int pd_kernel_gemm_run(struct pd_kernel_gemm *g, const struct pd_kernel_gemm_params *p) {
    if (p->rows <= 0 || p->m <= 0)
        return PD_OK;
    if (p->rows > 0x7fffffff || p->m > 0x7fffffff || p->k > 0x7fffffff)
        return pd_errorf(PD_ERANGE, "gemm of %lld x %lld x %lld", (long long)p->rows,
                         (long long)p->m, (long long)p->k);
    const float one = 1.0f, zero = 0.0f;
    int m = (int)p->m, n = (int)p->rows, k = (int)p->k;
    cudaDataType_t t = p->dtype == PD_DTYPE_BF16  ? CUDA_R_16BF
                       : p->dtype == PD_DTYPE_F16 ? CUDA_R_16F
                                                  : CUDA_R_32F;
    /* column-major: C (m × n) = Wᵀ-view (m × k) · X-view (k × n) */
    cublasStatus_t st =
        cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, p->w, t, k, p->x, t, k, &zero,
                     p->y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return blas_status(st, "cublasGemmEx");
}
