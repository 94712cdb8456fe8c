/*
 * sampling.cu — FlashInfer's joint top-k/top-p rejection sampler for the draw. The softmax
 * before it (with penalties and the temperature, in the same passes that sum the raw row for
 * the logprob: measured faster than FlashInfer's OnlineSoftmax plus a separate pass), min-p,
 * greedy rows, logprobs and top-n stay in kernels/sampling.cu, which calls this between its
 * own passes.
 */
#include <flashinfer/sampling.cuh>

#include "kernels/flashinfer/pdfi_common.cuh"

extern "C" int pdfi_sample(const struct pdfi_sample_args *a, void *stream, char *err,
                           size_t errlen) {
    using namespace flashinfer::sampling;
    cudaStream_t s = (cudaStream_t)stream;
    uint32_t rows = (uint32_t)a->rows, d = (uint32_t)a->vocab;
    return pdfi::guarded("flashinfer sampling", err, errlen, [&]() -> cudaError_t {
        if (a->any_top_k)
            return TopKTopPSamplingFromProb<float, int32_t>(
                a->probs, a->top_k, a->top_p, a->out, a->valid, /*indices=*/nullptr, rows,
                /*top_k_val=*/0, /*top_p_val=*/1.0f, d, /*deterministic=*/true, a->seed, 0,
                a->offset, 0, s, /*seed_stride=*/1, /*offset_stride=*/1);
        if (a->any_top_p)
            return TopPSamplingFromProb<float, int32_t>(a->probs, a->out, a->valid, nullptr,
                                                        a->top_p, rows, 1.0f, d, true, a->seed, 0,
                                                        a->offset, 0, s, 1, 1);
        return SamplingFromProb<float, int32_t>(a->probs, a->out, a->valid, nullptr, rows, d, true,
                                                a->seed, 0, a->offset, 0, s, 1, 1);
    });
}
