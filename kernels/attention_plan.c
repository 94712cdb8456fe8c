/*
 * attention_plan.c — the host half of paged attention (STYLE.md rule 9: plan once per step, run
 * per layer): cuts each request's (query token × head-in-group) rows into items of R rows and,
 * when the step is too small to fill the GPU (decode), its keys into splits whose partials the
 * reduce kernel combines. Pure arithmetic on host arrays; no CUDA calls.
 */
#include "kernels/kernels.h"

#define PD_ATTN_MIN_SPLIT_KEYS 256 /* fewer keys per split than this costs more than it saves */

static int rows_for(int max_new, int group) {
    return (int64_t)max_new * group <= 4 ? 4 : PD_KERNEL_ATTN_ROWS;
}

static int ceil_div(int64_t a, int64_t b) {
    return (int)((a + b - 1) / b);
}

int pd_kernel_attn_max_items(int n_tokens, int n_reqs, int group) {
    /* every request: ceil(n_new*G/4) tiles at worst (R = 4 only when n_new*G <= 4, so 1 tile),
     * plus the padding and split items of a decode bucket */
    int64_t tiles = (int64_t)ceil_div((int64_t)n_tokens * group, PD_KERNEL_ATTN_ROWS) + n_reqs;
    int64_t dec = (int64_t)n_reqs * ceil_div(group, 4) * PD_KERNEL_ATTN_MAX_SPLITS;
    int64_t ext = tiles * PD_KERNEL_ATTN_MAX_SPLITS;
    int64_t m = dec > ext ? dec : ext;
    return m > 0x7fffffff ? 0x7fffffff : (int)m;
}

int pd_kernel_attn_plan(const struct pd_kernel_attn_plan_in *in, struct pd_kernel_attn_item *items,
                        int cap_items, int32_t *tok_splits, struct pd_kernel_attn_batch *out) {
    int max_new = 1, n_tokens = in->req_tok_start[in->n_reqs];
    for (int r = 0; r < in->n_reqs; r++) {
        int nn = in->req_tok_start[r + 1] - in->req_tok_start[r];
        max_new = nn > max_new ? nn : max_new;
    }
    int R = rows_for(max_new, in->group);
    int64_t base = 0;
    for (int r = 0; r < in->n_reqs; r++)
        base += ceil_div((int64_t)(in->req_tok_start[r + 1] - in->req_tok_start[r]) * in->group, R);
    int want = 1; /* splits that would fill target_blocks */
    if (in->fixed_splits > 0) {
        want = in->fixed_splits;
    } else if (n_tokens <= in->max_split_tokens && base > 0 &&
               base * in->kv_heads < in->target_blocks) {
        want = ceil_div(in->target_blocks, base * in->kv_heads);
    }
    if (want > PD_KERNEL_ATTN_MAX_SPLITS)
        want = PD_KERNEL_ATTN_MAX_SPLITS;
    if (n_tokens > in->max_split_tokens)
        want = 1;

    int n = 0, max_splits = 1;
    for (int r = 0; r < in->n_reqs; r++) {
        int t0 = in->req_tok_start[r], nn = in->req_tok_start[r + 1] - t0;
        int len = in->req_kv_len[r];
        int S = want;
        if (in->fixed_splits <= 0) {
            int by_len = ceil_div(len, PD_ATTN_MIN_SPLIT_KEYS);
            S = S < by_len ? S : by_len;
            S = S < 1 ? 1 : S;
        }
        /* split ranges start on 16-key boundaries so tiles stay aligned to pages of 16 */
        int chunk = ceil_div(ceil_div(len, S), 16) * 16;
        int tiles = ceil_div((int64_t)nn * in->group, R);
        for (int t = 0; t < tiles; t++) {
            for (int sp = 0; sp < S; sp++) {
                if (n >= cap_items)
                    return -1;
                int b = sp * chunk, e = b + chunk;
                items[n++] = (struct pd_kernel_attn_item){
                    .req = r,
                    .row0 = t * R,
                    .kv_begin = b < len ? b : len,
                    .kv_end = e < len ? e : len,
                    .split = sp,
                    .n_splits = S,
                };
            }
        }
        for (int i = t0; i < t0 + nn; i++)
            tok_splits[i] = S;
        max_splits = S > max_splits ? S : max_splits;
    }
    /* a graph bucket: padding requests keep the item count a function of pad_reqs alone */
    if (in->fixed_splits > 0) {
        int per = ceil_div(in->group, R) * want;
        for (int r = in->n_reqs; r < in->pad_reqs; r++) {
            for (int k = 0; k < per; k++) {
                if (n >= cap_items)
                    return -1;
                items[n++] = (struct pd_kernel_attn_item){.req = -1};
            }
        }
        max_splits = want;
    }
    out->n_items = n;
    out->n_tokens = n_tokens;
    out->max_splits = max_splits;
    out->rows_per_item = R;
    return n;
}
