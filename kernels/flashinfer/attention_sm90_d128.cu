/* attention_sm90_d128.cu — FlashInfer's Hopper paged attention for head dim 128
 * (attention_sm90.cuh). */
#include "kernels/flashinfer/attention_sm90.cuh"

template cudaError_t pdfi::run_sm90<128>(const flashinfer::PrefillPlanSM90Info &, const pdfi_plan *,
                                         const pdfi_workspace *, const pdfi_attention_args *,
                                         cudaStream_t);
