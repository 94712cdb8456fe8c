/* attention_d64.cu — FlashInfer paged attention for head dim 64 (attention_impl.cuh). */
#include "kernels/flashinfer/attention_impl.cuh"

template cudaError_t pdfi::run_dim<64>(const flashinfer::PrefillPlanInfo &, const pdfi_plan *,
                                       const pdfi_workspace *, const pdfi_attention_args *,
                                       cudaStream_t);
