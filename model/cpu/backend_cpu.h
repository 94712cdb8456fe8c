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
/* Weight matrices on AVX2 machines (AVX-512 too) are tiled once at load (pd__cpu_tiles_weights):
 * rows in tiles of PD_CPU_TILE_ROWS, each row cut into lines of PD_CPU_TILE_LINE bytes (32 bf16/f16
 * or 16 f32 values), and a tile stored line 0 of its rows 0..3, then line 1 of rows 0..3, and so
 * on; the last line of a row and the rows past the last are zero. A product then reads each
 * thread's weights as one front-to-back stream. Within a bf16 line, 32-bit lane m holds values m
 * (low half) and 16 + m (high half), so a shift or a mask widens either half in order. Vectors
 * (norms, biases) stay as they are. */
#define PD_CPU_TILE_ROWS 4
#define PD_CPU_TILE_LINE 64
bool pd__cpu_tiles_weights(void);
/* Whether pd__cpu_gemm_panel runs here (AVX-512); elsewhere tiled weights are widened back to
 * rows for sgemm. */
bool pd__cpu_has_gemm_panel(void);
/* The prefill product on AMX machines, for bf16 tiled weights: the activations of up to
 * PD_CPU_AMX_TOKENS rows are packed once (pd__cpu_amx_pack_x, into pd__cpu_amx_x_bytes(k), 64-byte
 * aligned; the threads may split the 16-row tiles [tt0, tt1) among them), then every thread
 * multiplies its weight rows [j0, j1) (j0 a multiple of 32) by all of them: y[t][j] =
 * Σ_c x[t][c] · w[j][c] for t < nx, in f32 sums of exact products (backend_cpu_kernels.c says
 * how). Weight rows are packed PD_CPU_AMX_ROWS x PD_CPU_AMX_KC at a time into the thread's
 * scratch (PD_CPU_AMX_SCRATCH floats, 64-byte aligned). */
#define PD_CPU_AMX_TOKENS 256
#define PD_CPU_AMX_ROWS 128
/* k values per packed block: 128 keeps a pair of activation tiles' three parts (24 KB) in L1
 * across the block's four 32-row weight groups; 3-7% faster than 512 on products of 256-512 rows
 * (in-process alternation), the same on small ones */
#define PD_CPU_AMX_KC 128
#define PD_CPU_AMX_SCRATCH                                                                         \
    (PD_CPU_AMX_ROWS * PD_CPU_AMX_KC / 2 + PD_CPU_AMX_TOKENS * PD_CPU_AMX_ROWS + 1024)
/* LDTILECFG's 64 bytes. pd__cpu_amx_cfg: tiles 0-7 of 16 rows x 64 bytes, the configuration the
 * prefill product (and the bench's peak) loads; a constant object, so no store to it can be
 * dropped before the instruction reads it. */
struct pd__cpu_amx_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
extern const struct pd__cpu_amx_tilecfg pd__cpu_amx_cfg;
bool pd__cpu_has_amx(void);
size_t pd__cpu_amx_x_bytes(int64_t k);
void pd__cpu_amx_pack_x(const float *x, int64_t nx, int64_t k, int64_t tt0, int64_t tt1, void *xp);
void pd__cpu_amx_gemm(const void *w, int64_t m, int64_t k, const void *xp, int64_t nx, float *y,
                      int64_t ldy, int64_t j0, int64_t j1, float *scratch);
/* The instruction set the kernels use: "amx", "avx512", "avx2" or "generic". */
const char *pd__cpu_isa_name(void);
static inline int64_t pd__cpu_tile_vals(enum pd_dtype t) {
    return PD_CPU_TILE_LINE / (int64_t)pd_dtype_size(t);
}
static inline int64_t pd__cpu_tile_blocks(enum pd_dtype t, int64_t cols) {
    return (cols + pd__cpu_tile_vals(t) - 1) / pd__cpu_tile_vals(t);
}
static inline size_t pd__cpu_tiled_bytes(enum pd_dtype t, int64_t rows, int64_t cols) {
    int64_t tiles = (rows + PD_CPU_TILE_ROWS - 1) / PD_CPU_TILE_ROWS;
    return (size_t)(tiles * pd__cpu_tile_blocks(t, cols)) * PD_CPU_TILE_ROWS * PD_CPU_TILE_LINE;
}
/* Byte offset of line b of row j in a tiled matrix of nblk lines a row, and its address. */
static inline size_t pd__cpu_tiled_off(int64_t nblk, int64_t j, int64_t b) {
    return (size_t)(((j / PD_CPU_TILE_ROWS) * nblk + b) * PD_CPU_TILE_ROWS + j % PD_CPU_TILE_ROWS) *
           PD_CPU_TILE_LINE;
}
static inline const char *pd__cpu_tiled_line(const void *w, int64_t nblk, int64_t j, int64_t b) {
    return (const char *)w + pd__cpu_tiled_off(nblk, j, b);
}
/* Rows [j0, j1) of src [rows][cols] of type t → their tiles in dst (pd__cpu_tiled_bytes of
 * them, 64-byte aligned); j0 a multiple of PD_CPU_TILE_ROWS, j1 up to rows rounded up to it (the
 * padding rows are written as zeros). */
void pd__cpu_tile(enum pd_dtype t, int64_t rows, int64_t cols, const void *src, void *dst,
                  int64_t j0, int64_t j1);
/* Row `row` of a tiled [.][cols] matrix of type t → dst [cols] f32. */
void pd__cpu_tiled_row_to_f32(enum pd_dtype t, const void *w, int64_t cols, int64_t row,
                              float *dst);

/* y[i][j] = Σ_c x[i][c] · w[j][c] for i < nx and j in [j0, j1): the memory-bound decode
 * product, reading w once per call. w [m][k] of type wt, tiled (then j0 is a multiple of
 * PD_CPU_TILE_ROWS) or row-major; x [nx][k] f32; y [nx][ldy] f32 */
void pd__cpu_gemv(enum pd_dtype wt, const void *w, bool tiled, int64_t k, const float *x, int nx,
                  float *y, int64_t ldy, int64_t j0, int64_t j1);

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
/* y[i][j] = Σ_c x[i][c] · w[j][c] for i < nx and j in [j0, j1), j1 - j0 <= PD_CPU_GEMM_NR: the
 * prefill product. w's rows are widened into panel one k block at a time and reused by every x
 * row, so w is read once per call whatever nx is. Only for tiled weights (sgemm otherwise).
 * w [m][k] of type wt, tiled; x [nx][k] f32; y [nx][ldy] f32; panel [KC][NR] f32, 64-byte
 * aligned */
void pd__cpu_gemm_panel(enum pd_dtype wt, const void *w, int64_t k, const float *x, int64_t nx,
                        float *y, int64_t ldy, int64_t j0, int64_t j1, float *panel);

#endif
