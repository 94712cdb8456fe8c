/*
 * attention_sm90.cuh — one head dim's instantiations of FlashInfer's Hopper paged prefill
 * (attention/hopper/prefill_sm90.cuh: TMA loads and wgmma, CUTLASS underneath), included by
 * attention_sm90_d{64,128,256}.cu. Taken for extend steps over 2-byte pools (a request of at
 * least PDFI_SM90_MIN_ROWS rows): on an H200 it reaches ~0.85x cuDNN's causal attention where
 * the FA2 kernel (attention_impl.cuh) reaches ~0.55x. Same page-major pool, through strides:
 * k/v_page_stride spans a whole page of every layer.
 */
#include <flashinfer/attention/hopper/default_params.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/cutlass_utils.cuh>

#include "kernels/flashinfer/pdfi_common.cuh"

namespace pdfi {

template <typename T, uint32_t D>
static cudaError_t sm90_typed(const flashinfer::PrefillPlanSM90Info &pi, const pdfi_plan *plan,
                              const pdfi_workspace *ws, const pdfi_attention_args *a,
                              cudaStream_t s) {
    using namespace flashinfer;
    using P = BatchPrefillPagedParams<T, T, T, int32_t>;
    P p;
    p.q_ptr = (T *)a->q;
    p.k_ptr = (T *)a->k;
    p.v_ptr = (T *)a->v;
    p.o_ptr = (T *)a->o;
    p.lse_ptr = nullptr;
    p.q_stride_n = (int64_t)plan->heads * D;
    p.q_stride_h = D;
    p.o_stride_n = (int64_t)plan->heads * D;
    p.o_stride_h = D;
    p.k_stride_n = a->stride_n;
    p.k_stride_h = a->stride_h;
    p.v_stride_n = a->stride_n;
    p.v_stride_h = a->stride_h;
    p.k_page_stride = a->stride_page;
    p.v_page_stride = a->stride_page;
    p.nnz_qo = plan->rows;
    p.num_qo_heads = plan->heads;
    p.num_kv_heads = plan->kv_heads;
    p.group_size = plan->heads / plan->kv_heads;
    p.page_size = a->page_size;
    p.window_left = -1;
    p.causal = true;
    void *ib = ws->int_ws;
    p.qo_tile_indices = GetPtrFromBaseOffset<int32_t>(ib, pi.qo_tile_indices_offset);
    p.qo_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.qo_indptr_offset);
    p.kv_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.kv_indptr_offset);
    p.qo_lens = GetPtrFromBaseOffset<int32_t>(ib, pi.qo_len_offset);
    p.kv_lens = GetPtrFromBaseOffset<int32_t>(ib, pi.kv_len_offset);
    p.head_indices = GetPtrFromBaseOffset<int32_t>(ib, pi.head_indices_offset);
    p.work_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.work_indptr_offset);
    p.batch_indices = GetPtrFromBaseOffset<int32_t>(ib, pi.batch_indices_offset);
    p.kv_indices = a->page_indices;
    p.additional_params.logits_soft_cap = 0.0f;
    p.additional_params.sm_scale = a->scale;
    p.additional_params.maybe_prefix_len_ptr = nullptr;
    p.additional_params.maybe_token_pos_in_items_ptr = nullptr;
    p.additional_params.token_pos_in_items_len = 0;
    p.additional_params.maybe_max_item_len_ptr = nullptr;
    if (pi.same_schedule_for_all_heads)
        return BatchPrefillWithPagedKVCacheDispatched<D, D, MaskMode::kCausal, false, true,
                                                      StandardAttention, P>(p, false, s);
    return BatchPrefillWithPagedKVCacheDispatched<D, D, MaskMode::kCausal, false, false,
                                                  StandardAttention, P>(p, false, s);
}

template <uint32_t D>
cudaError_t run_sm90(const flashinfer::PrefillPlanSM90Info &pi, const pdfi_plan *plan,
                     const pdfi_workspace *ws, const pdfi_attention_args *a, cudaStream_t s) {
    switch (a->kv_dtype) {
    case PDFI_F16: return sm90_typed<cutlass::half_t, D>(pi, plan, ws, a, s);
    case PDFI_BF16: return sm90_typed<cutlass::bfloat16_t, D>(pi, plan, ws, a, s);
    default: break;
    }
    throw std::runtime_error("hopper attention: pool type " + std::to_string((int)a->kv_dtype) +
                             " not instantiated");
}

} // namespace pdfi
