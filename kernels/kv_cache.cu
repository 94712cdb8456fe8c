/*
 * kv_cache.cu — writes into and moves pages of the page-major KV pool (DESIGN.md §3: page p
 * holds, for every layer, K then V, each [page_size][kv_heads][head_dim]).
 *
 * kv_store converts a step's K/V rows to the pool's dtype (f32, bf16, f16, fp8) at their slots
 * (slot < 0 = padding of a graph bucket, skipped). page_copy moves whole pages with 16-byte loads:
 * pool to pool (a prefix-cache copy), pool to a contiguous staging run (gather before a transfer)
 * and back.
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

template <typename T> static __global__ void kv_store_kernel(struct pd_kernel_kv_store_params p) {
    int64_t i = blockIdx.x;
    int32_t slot = p.slots[i];
    if (slot < 0)
        return;
    int page = slot / p.kv.page_size, off = slot % p.kv.page_size;
    int width = p.kv.kv_heads * p.kv.head_dim;
    size_t plane = (size_t)p.kv.page_size * width; /* elements of one K or V block */
    T *kdst = (T *)((char *)p.kv.base + (size_t)page * p.kv.page_bytes) +
              (size_t)p.layer * 2 * plane + (size_t)off * width;
    T *vdst = kdst + plane;
    const float *k = p.k + i * width, *v = p.v + i * width;
    for (int d = threadIdx.x; d < width; d += blockDim.x) {
        kdst[d] = from_f<T>(k[d]);
        vdst[d] = from_f<T>(v[d]);
    }
}

extern "C" int pd_kernel_kv_store(const struct pd_kernel_kv_store_params *p, cudaStream_t s) {
    if (p->n <= 0)
        return PDK_OK;
    PDK_DISPATCH_KV(p->kv.dtype, kv_store_kernel<T><<<(unsigned)p->n, 128, 0, s>>>(*p));
    return PDK_LAUNCHED("kv store");
}

/* grid (chunks of a page, pages) */
static __global__ void page_copy_kernel(struct pd_kernel_page_copy_params p) {
    int64_t i = blockIdx.y;
    const char *src =
        (const char *)p.src + (size_t)(p.src_pages ? p.src_pages[i] : i) * p.page_bytes;
    char *dst = (char *)p.dst + (size_t)(p.dst_pages ? p.dst_pages[i] : i) * p.page_bytes;
    size_t n16 = p.page_bytes / 16;
    const int4 *s4 = (const int4 *)src;
    int4 *d4 = (int4 *)dst;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n16;
         j += (size_t)gridDim.x * blockDim.x)
        d4[j] = s4[j];
}

extern "C" int pd_kernel_page_copy(const struct pd_kernel_page_copy_params *p, cudaStream_t s) {
    if (p->n <= 0)
        return PDK_OK;
    if (p->page_bytes % 16 || ((uintptr_t)p->src | (uintptr_t)p->dst) % 16 || p->n > 65535)
        return pd__cuda_status(cudaErrorInvalidValue,
                               "page copy: pages must be 16-byte multiples, at most 65535 a call");
    unsigned chunks = blocks_for((int64_t)(p->page_bytes / 16), 256 * 4);
    chunks = chunks > 64 ? 64 : chunks;
    page_copy_kernel<<<dim3(chunks, (unsigned)p->n), 256, 0, s>>>(*p);
    return PDK_LAUNCHED("page copy");
}
