/*
 * pdfi_common.cuh — what the translation units of libpdflashinfer share: the C interface, the
 * per-head-dim attention entry points, and the guard that turns FlashInfer's C++ exceptions into
 * PDFI_EFLASHINFER plus a message (nothing may unwind through the C interface).
 */
#ifndef PD_KERNELS_PDFI_COMMON_CUH
#define PD_KERNELS_PDFI_COMMON_CUH

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>
#include <flashinfer/attention/scheduler.cuh>

#include "kernels/flashinfer/pdfi.h"

namespace pdfi {

template <uint32_t D>
cudaError_t run_dim(const flashinfer::PrefillPlanInfo &pi, const pdfi_plan *plan,
                    const pdfi_workspace *ws, const pdfi_attention_args *a, cudaStream_t s);
extern template cudaError_t run_dim<64>(const flashinfer::PrefillPlanInfo &, const pdfi_plan *,
                                        const pdfi_workspace *, const pdfi_attention_args *,
                                        cudaStream_t);
extern template cudaError_t run_dim<128>(const flashinfer::PrefillPlanInfo &, const pdfi_plan *,
                                         const pdfi_workspace *, const pdfi_attention_args *,
                                         cudaStream_t);
extern template cudaError_t run_dim<256>(const flashinfer::PrefillPlanInfo &, const pdfi_plan *,
                                         const pdfi_workspace *, const pdfi_attention_args *,
                                         cudaStream_t);

template <uint32_t D>
cudaError_t run_sm90(const flashinfer::PrefillPlanSM90Info &pi, const pdfi_plan *plan,
                     const pdfi_workspace *ws, const pdfi_attention_args *a, cudaStream_t s);
extern template cudaError_t run_sm90<64>(const flashinfer::PrefillPlanSM90Info &, const pdfi_plan *,
                                         const pdfi_workspace *, const pdfi_attention_args *,
                                         cudaStream_t);
extern template cudaError_t run_sm90<128>(const flashinfer::PrefillPlanSM90Info &,
                                          const pdfi_plan *, const pdfi_workspace *,
                                          const pdfi_attention_args *, cudaStream_t);
extern template cudaError_t run_sm90<256>(const flashinfer::PrefillPlanSM90Info &,
                                          const pdfi_plan *, const pdfi_workspace *,
                                          const pdfi_attention_args *, cudaStream_t);

/* Runs f (returning cudaError_t); a thrown exception becomes PDFI_EFLASHINFER with its text. A
 * CUDA error leaves just what in err: the caller's translation adds CUDA's own text. */
template <typename F> int guarded(const char *what, char *err, size_t errlen, F &&f) {
    try {
        cudaError_t e = f();
        if (e != cudaSuccess && err && errlen)
            snprintf(err, errlen, "%s", what);
        return (int)e;
    } catch (const std::exception &x) {
        if (err && errlen)
            snprintf(err, errlen, "%s: %s", what, x.what());
        return PDFI_EFLASHINFER;
    } catch (...) {
        if (err && errlen)
            snprintf(err, errlen, "%s: unknown C++ exception", what);
        return PDFI_EFLASHINFER;
    }
}

} // namespace pdfi

#endif
