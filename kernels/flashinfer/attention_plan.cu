/*
 * attention_plan.cu — the host half of FlashInfer attention (PrefillPlan: work items of one step,
 * split-KV chunks, the CUDA-graph padding) and the dispatch of a layer's launch to the head
 * dim's translation unit.
 */
#include <algorithm>

#include "kernels/flashinfer/pdfi_common.cuh"

using namespace flashinfer;

extern "C" bool pdfi_attention_supported(enum pdfi_dtype kv, int head_dim) {
    return (head_dim == 64 || head_dim == 128 || head_dim == 256) && kv >= PDFI_F16 &&
           kv <= PDFI_E5M2;
}

extern "C" size_t pdfi_float_workspace_bytes(int sms, int head_dim) {
    /* split-KV partials: at most 2 CTAs per SM of work items, each up to 128 packed rows, every
     * row head_dim values of the output type (≤ 4 bytes) plus its f32 log-sum-exp */
    size_t rows = (size_t)2 * (size_t)(sms > 0 ? sms : 1) * 128;
    return rows * ((size_t)head_dim * 4 + 4) + (1u << 20);
}

static void keep(struct pdfi_plan *plan, const std::vector<int64_t> &v) {
    std::fill(plan->info, plan->info + 16, 0);
    std::copy(v.begin(), v.end(), plan->info);
}

extern "C" int pdfi_plan_step(struct pdfi_plan *plan, const struct pdfi_workspace *ws,
                              int32_t *qo_indptr, int32_t *page_indptr, int32_t *kv_len, int n_rows,
                              int n_reqs, int heads, int kv_heads, int head_dim, int page_size,
                              enum pdfi_dtype kv_dtype, bool graph, bool sm90, void *stream,
                              char *err, size_t errlen) {
    return pdfi::guarded("flashinfer attention plan", err, errlen, [&]() -> cudaError_t {
        if (!pdfi_attention_supported(kv_dtype, head_dim) || kv_heads <= 0 || heads % kv_heads)
            throw std::runtime_error("no kernel for head dim " + std::to_string(head_dim) + ", " +
                                     std::to_string(heads) + "/" + std::to_string(kv_heads) +
                                     " heads");
        plan->heads = heads;
        plan->kv_heads = kv_heads;
        plan->head_dim = head_dim;
        plan->rows = n_rows;
        int max_rows = 0;
        for (int r = 0; r < n_reqs; r++)
            max_rows = std::max(max_rows, qo_indptr[r + 1] - qo_indptr[r]);
        cudaError_t e;
        if (sm90 && !graph && kv_dtype <= PDFI_BF16 && max_rows >= PDFI_SM90_MIN_ROWS) {
            PrefillPlanSM90Info pi;
            e = PrefillSM90Plan<int32_t>(
                ws->float_ws, ws->float_bytes, ws->int_ws, ws->int_ws_host, ws->int_bytes, pi,
                qo_indptr, page_indptr, kv_len, (uint32_t)n_rows, (uint32_t)n_reqs, (uint32_t)heads,
                (uint32_t)kv_heads, (uint32_t)head_dim, (uint32_t)head_dim, (uint32_t)page_size,
                /*causal=*/true,
                /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, (cudaStream_t)stream);
            if (e == cudaSuccess) {
                keep(plan, pi.ToVector());
                plan->kernel = PDFI_SM90;
            }
            return e;
        }
        PrefillPlanInfo pi;
        uint32_t kv_bytes = kv_dtype >= PDFI_E4M3 ? 1 : 2;
        e = PrefillPlan<int32_t>(ws->float_ws, ws->float_bytes, ws->int_ws, ws->int_ws_host,
                                 ws->int_bytes, pi, qo_indptr, page_indptr, (uint32_t)n_rows,
                                 (uint32_t)n_reqs, (uint32_t)heads, (uint32_t)kv_heads,
                                 (uint32_t)head_dim, (uint32_t)head_dim, (uint32_t)page_size, graph,
                                 /*sizeof_dtype_o=*/2, /*window_left=*/-1, /*fixed_split_size=*/-1,
                                 /*disable_split_kv=*/false, /*num_colocated_ctas=*/0,
                                 /*uniform_q_len=*/graph ? 1 : 0, (cudaStream_t)stream, kv_bytes);
        if (e == cudaSuccess) {
            keep(plan, pi.ToVector());
            plan->kernel = PDFI_FA2;
        }
        return e;
    });
}

extern "C" int pdfi_attention(const struct pdfi_plan *plan, const struct pdfi_workspace *ws,
                              const struct pdfi_attention_args *a, void *stream, char *err,
                              size_t errlen) {
    return pdfi::guarded("flashinfer attention", err, errlen, [&]() -> cudaError_t {
        cudaStream_t s = (cudaStream_t)stream;
        if (plan->kernel == PDFI_SM90) {
            PrefillPlanSM90Info pi;
            pi.FromVector(std::vector<int64_t>(plan->info, plan->info + 9));
            switch (plan->head_dim) {
            case 64: return pdfi::run_sm90<64>(pi, plan, ws, a, s);
            case 128: return pdfi::run_sm90<128>(pi, plan, ws, a, s);
            case 256: return pdfi::run_sm90<256>(pi, plan, ws, a, s);
            }
        } else {
            PrefillPlanInfo pi;
            pi.FromVector(std::vector<int64_t>(plan->info, plan->info + 15));
            switch (plan->head_dim) {
            case 64: return pdfi::run_dim<64>(pi, plan, ws, a, s);
            case 128: return pdfi::run_dim<128>(pi, plan, ws, a, s);
            case 256: return pdfi::run_dim<256>(pi, plan, ws, a, s);
            }
        }
        throw std::runtime_error("head dim " + std::to_string(plan->head_dim) +
                                 " not instantiated");
    });
}
