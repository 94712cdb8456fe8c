/*
 * attention_impl.cuh — one head dim's instantiations of FlashInfer's FA2 paged prefill kernel,
 * included by attention_d{64,128,256}.cu (one translation unit per head dim, so a 2-core build
 * compiles them side by side). The same kernel serves extend (a chunk of rows per request,
 * causal over its pages) and decode (one row per request: FlashInfer's tensor-core decode path,
 * which reads the KV once per GQA group). pdserve's pool is page-major: page p holds every
 * layer's K then V block, each [page_size][kv_heads][head_dim]; paged_kv_t takes it through
 * custom strides (a page's stride spans all layers; K and V of one layer are two base pointers).
 */
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kernels/flashinfer/pdfi_common.cuh"

namespace pdfi {

using Variant = flashinfer::DefaultAttention<false, false, false, false>;

template <uint32_t CTA, uint32_t D, typename P>
static cudaError_t launch(P &p, typename P::DTypeO *tmp_v, float *tmp_s, cudaStream_t s) {
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        true, CTA, D, D, flashinfer::PosEncodingMode::kNone, false, flashinfer::MaskMode::kCausal,
        Variant, P>(p, tmp_v, tmp_s, false, s);
}

template <typename Q, typename KV, uint32_t D>
static cudaError_t run_typed(const flashinfer::PrefillPlanInfo &pi, const pdfi_plan *plan,
                             const pdfi_workspace *ws, const pdfi_attention_args *a,
                             cudaStream_t s) {
    using namespace flashinfer;
    using P = BatchPrefillPagedParams<Q, KV, Q, int32_t>;
    /* NHD: strides {page, token (stride_n), head (stride_h), 1} */
    int64_t strides[4] = {a->stride_page, a->stride_n, a->stride_h, 1};
    paged_kv_t<KV, int32_t> kv((uint32_t)plan->kv_heads, (uint32_t)a->page_size, D,
                               (uint32_t)a->n_reqs, QKVLayout::kNHD, (KV *)a->k, (KV *)a->v,
                               strides, a->page_indices, a->page_indptr, a->last_page_len);
    P p;
    p.q = (Q *)a->q;
    p.paged_kv = kv;
    p.q_indptr = a->qo_indptr;
    p.o = (Q *)a->o;
    p.lse = nullptr;
    p.num_qo_heads = (uint32_t)plan->heads;
    p.group_size = uint_fastdiv((uint32_t)(plan->heads / plan->kv_heads));
    p.q_stride_n = plan->heads * (int)D;
    p.q_stride_h = (int)D;
    p.window_left = -1;
    p.logits_soft_cap = 0.0f;
    p.sm_scale = a->scale;
    p.rope_rcp_scale = 1.0f;
    p.rope_rcp_theta = 1.0f / 1e4f;
    void *ib = ws->int_ws, *fb = ws->float_ws;
    p.request_indices = GetPtrFromBaseOffset<int32_t>(ib, pi.request_indices_offset);
    p.qo_tile_indices = GetPtrFromBaseOffset<int32_t>(ib, pi.qo_tile_indices_offset);
    p.kv_tile_indices = GetPtrFromBaseOffset<int32_t>(ib, pi.kv_tile_indices_offset);
    p.o_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.o_indptr_offset);
    p.kv_chunk_size_ptr = GetPtrFromBaseOffset<int32_t>(ib, pi.kv_chunk_size_ptr_offset);
    Q *tmp_v = nullptr;
    float *tmp_s = nullptr;
    if (pi.split_kv) {
        p.merge_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.merge_indptr_offset);
        tmp_v = GetPtrFromBaseOffset<Q>(fb, pi.v_offset);
        tmp_s = GetPtrFromBaseOffset<float>(fb, pi.s_offset);
    }
    p.padded_batch_size = (uint32_t)pi.padded_batch_size;
    p.max_total_num_rows = (uint32_t)pi.total_num_rows;
    p.partition_kv = pi.split_kv;
    if (pi.enable_cuda_graph) {
        p.block_valid_mask = GetPtrFromBaseOffset<bool>(ib, pi.block_valid_mask_offset);
        p.total_num_rows = GetPtrFromBaseOffset<uint32_t>(ib, pi.total_num_rows_offset);
    }
    switch (pi.cta_tile_q) {
    case 16: return launch<16, D>(p, tmp_v, tmp_s, s);
    case 64: return launch<64, D>(p, tmp_v, tmp_s, s);
    case 128:
        if constexpr (D < 256)
            return launch<128, D>(p, tmp_v, tmp_s, s);
        break;
    }
    throw std::runtime_error("attention plan chose a query tile of " +
                             std::to_string(pi.cta_tile_q) + " rows, not instantiated");
}

/* q/o are f16 with an f16 pool, bf16 with the others (fp8 pools: bf16 queries, as SGLang) */
template <uint32_t D>
cudaError_t run_dim(const flashinfer::PrefillPlanInfo &pi, const pdfi_plan *plan,
                    const pdfi_workspace *ws, const pdfi_attention_args *a, cudaStream_t s) {
    switch (a->kv_dtype) {
    case PDFI_F16: return run_typed<half, half, D>(pi, plan, ws, a, s);
    case PDFI_BF16: return run_typed<nv_bfloat16, nv_bfloat16, D>(pi, plan, ws, a, s);
    case PDFI_E4M3: return run_typed<nv_bfloat16, __nv_fp8_e4m3, D>(pi, plan, ws, a, s);
    case PDFI_E5M2: return run_typed<nv_bfloat16, __nv_fp8_e5m2, D>(pi, plan, ws, a, s);
    }
    throw std::runtime_error("attention: pool type " + std::to_string((int)a->kv_dtype) +
                             " not instantiated");
}

} // namespace pdfi
