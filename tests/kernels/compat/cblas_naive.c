/*
 * cblas_naive.c (compat) — a plain, correct and slow sgemm for the row-major cases the cpu
 * backend uses, so the cpu reference of the kernel tests runs on GPU machines without OpenBLAS
 * (scripts/gpu-run.sh's minimal build only). f64 accumulation: the reference stays exact enough.
 */
#include "cblas.h"

void openblas_set_num_threads(int num_threads);

void openblas_set_num_threads(int num_threads) {}

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m,
                 int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc) {
    /* row-major C[m][n] = alpha * op(A)[m][k] · op(B)[k][n] + beta * C */
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float x = ta == CblasNoTrans ? a[i * lda + p] : a[p * lda + i];
                float y = tb == CblasNoTrans ? b[p * ldb + j] : b[j * ldb + p];
                s += (double)x * y;
            }
            c[i * ldc + j] = (float)(alpha * s + (beta != 0.0f ? beta * c[i * ldc + j] : 0.0));
        }
}
