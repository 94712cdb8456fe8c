/*
 * cblas.h (compat) — the one CBLAS call the cpu backend makes, for scripts/gpu-run.sh's minimal
 * build on GPU machines whose image has no OpenBLAS. Only that build puts this directory on the
 * include path; every other build uses the system's cblas.h and OpenBLAS.
 */
#ifndef PD_COMPAT_CBLAS_H
#define PD_COMPAT_CBLAS_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m,
                 int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc);

#endif
