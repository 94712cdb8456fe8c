/*
 * backend_cpu.h — internals shared by the cpu backend's files: the thread pool
 * (backend_cpu_pool.c) and the vectorised inner loops (backend_cpu_kernels.c) that
 * backend_cpu.c builds its ops from, and the backend's constructor. Not for use outside the cpu
 * backend but by the registry (model/backend_reg.c), which names the constructor.
 *
 * The pool runs one task at a time as nth parts claimed by whichever of its threads (the caller
 * included) gets there first; a task splits its work by (part, nth) itself and may use the
 * thread-scratch slot of its part, so no queue and no allocation happens per op. Kernels pick an
 * AVX-512 or AVX2/FMA version at run time when the CPU has it, else a portable loop.
 */
#ifndef PD_BACKEND_CPU_H
#define PD_BACKEND_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/dtype.h"

/* The cpu backend (backend.h's PD_BACKEND_CPU); the registry's pd_backend_new calls it. */
int pd__backend_cpu_new(const struct pd_backend_opts *opts, struct pd_backend **out);

struct pd__cpu_pool;
typedef void (*pd__cpu_task)(void *ctx, int tid, int nth);

int pd__cpu_pool_new(int n_threads, struct pd__cpu_pool **out);
void pd__cpu_pool_free(struct pd__cpu_pool *p);
int pd__cpu_pool_size(const struct pd__cpu_pool *p);
/* Runs fn(ctx, part, nth) once for each part = 0..nth-1, on whichever threads claim them (the
 * caller runs every part no worker got to), and returns when all are done. */
void pd__cpu_pool_run(struct pd__cpu_pool *p, pd__cpu_task fn, void *ctx);

/* [i0, i1) of n items for thread tid of nth, in contiguous runs. */
static inline void pd__cpu_split(int64_t n, int tid, int nth, int64_t *i0, int64_t *i1) {
    int64_t per = n / nth, rem = n % nth;
    *i0 = tid * per + (tid < rem ? tid : rem);
    *i1 = *i0 + per + (tid < rem ? 1 : 0);
}

float pd__cpu_dot(const float *a, const float *b, int64_t n);
/* y += a * x over n values. */
void pd__cpu_axpy(float a, const float *x, float *y, int64_t n);
/* n values of type t → f32. */
void pd__cpu_to_f32(enum pd_dtype t, const void *src, float *dst, int64_t n);
/* y[i][j] = Σ_c x[i][c] · w[j][c] for i < nx and j in [j0, j1), reading each row of w once per
 * group of four x rows: the memory-bound decode product.
 * w [m][k] of type wt; x [nx][k] f32; y [nx][ldy] f32 */
void pd__cpu_gemv(enum pd_dtype wt, const void *w, int64_t k, const float *x, int nx, float *y,
                  int64_t ldy, int64_t j0, int64_t j1);

/* out = silu(gate) * up over n values. */
void pd__cpu_silu_mul(const float *gate, const float *up, float *out, int64_t n);
/* s = softmax(s) in place, two passes (max, then exp and sum) as the reference. */
void pd__cpu_softmax(float *s, int n);
/* s[r][j] = scale · q[r] · k[j] for r < nq, j < nk <= 16, via kt, a transposed copy of the key
 * run. q [nq][hd]; k [nk][ldk]; s [nq][lds] f32; kt [hd][16] f32 scratch, 64-byte aligned */
void pd__cpu_attn_scores(const float *q, int nq, int hd, const float *k, int64_t ldk, int nk,
                         float scale, float *s, int64_t lds, float *kt);
/* o[r] += Σ_j p[r][j] · v[j] for r < nq, j < nk.  p [nq][ldp]; v [nk][ldv]; o [nq][hd] */
void pd__cpu_attn_pv(const float *p, int64_t ldp, int nq, const float *v, int64_t ldv, int nk,
                     int hd, float *o);

#define PD_CPU_GEMM_NR 64  /* weight rows per packed panel */
#define PD_CPU_GEMM_KC 512 /* k values per packed panel: [KC][NR] f32 = 128 KB, L2-resident */
/* Whether pd__cpu_gemm_panel can run here (AVX-512); when not, use sgemm. */
bool pd__cpu_gemm_panel_ok(void);
/* y[i][j] = Σ_c x[i][c] · w[j][c] for i < nx and j in [j0, j1), j1 - j0 <= PD_CPU_GEMM_NR: the
 * prefill product. w's rows are widened into panel one k block at a time and reused by every x
 * row, so w is read once per call whatever nx is.
 * w [m][k] of type wt; x [nx][k] f32; y [nx][ldy] f32; panel [KC][NR] f32, 64-byte aligned */
void pd__cpu_gemm_panel(enum pd_dtype wt, const void *w, int64_t k, const float *x, int64_t nx,
                        float *y, int64_t ldy, int64_t j0, int64_t j1, float *panel);

#endif
