/*
 * test_bootstrap_layout.c — what Pair accepts and refuses of two KV layouts (bootstrap.h): pools
 * of the same model pair whatever their tensor parallelism when both sides give their total kv
 * heads; a model-level difference is named by its field with both values, whatever else differs
 * too (head_dim, not tp_size or the fingerprint); a peer without the total pairs only at our tp.
 * And the layout's protobuf form carries the total (a peer that never sets it reads as 0).
 */
#include <stdio.h>
#include <string.h>

#include "common/bootstrap.h"
#include "common/bootstrap_internal.h"
#include "common/base/status.h"
#include "pd_test.h"

/* A model of 28 layers, 4 kv heads of 64, page size 16, bf16, over tp ranks. */
static struct pd_bootstrap_layout layout(int tp) {
    struct pd_bootstrap_layout l = {.layers = 28,
                                    .kv_heads = tp <= 4 ? 4 / (uint32_t)tp : 1,
                                    .head_dim = 64,
                                    .page_size = 16,
                                    .tp_size = (uint32_t)tp,
                                    .kv_heads_total = 4};
    snprintf(l.model, sizeof(l.model), "LlamaForCausalLM/v128256/l28/kv4x64");
    snprintf(l.dtype, sizeof(l.dtype), "BF16");
    l.page_bytes = (uint64_t)tp * 28 * 2 * 16 * l.kv_heads * 64 * 2;
    return l;
}

static void test_tp_may_differ(void) {
    for (int p = 1; p <= 8; p *= 2)
        for (int d = 1; d <= 8; d *= 2) {
            struct pd_bootstrap_layout a = layout(p), b = layout(d);
            CHECK_OK(pd_bootstrap_layout_check(&a, &b));
        }
}

static void test_model_fields_named(void) {
    struct pd_bootstrap_layout p = layout(2), d = layout(1);
    d.head_dim = 128;
    snprintf(d.model, sizeof(d.model), "LlamaForCausalLM/v128256/l28/kv4x128");
    CHECK_ERR(pd_bootstrap_layout_check(&p, &d), PD_EMISMATCH,
              "layout mismatch: head_dim: prefill 64, decode 128");
    d = layout(1);
    d.layers = 32;
    CHECK_ERR(pd_bootstrap_layout_check(&p, &d), PD_EMISMATCH,
              "layout mismatch: layers: prefill 28, decode 32");
    d = layout(1);
    d.kv_heads_total = 8;
    CHECK_ERR(pd_bootstrap_layout_check(&p, &d), PD_EMISMATCH,
              "layout mismatch: kv_heads_total: prefill 4, decode 8");
    d = layout(1);
    d.page_size = 32;
    CHECK_ERR(pd_bootstrap_layout_check(&p, &d), PD_EMISMATCH,
              "layout mismatch: page_size: prefill 16, decode 32");
    d = layout(4);
    snprintf(d.dtype, sizeof(d.dtype), "F16");
    CHECK_ERR(pd_bootstrap_layout_check(&p, &d), PD_EMISMATCH,
              "layout mismatch: dtype: prefill 'BF16', decode 'F16'");
    d = layout(1);
    snprintf(d.model, sizeof(d.model), "Qwen2ForCausalLM/v128256/l28/kv4x64");
    CHECK_ERR(pd_bootstrap_layout_check(&p, &d), PD_EMISMATCH, "layout mismatch: model:");
    /* same tp: the per-rank share and the page bytes must agree too */
    d = layout(2);
    d.kv_heads = 1;
    CHECK_ERR(pd_bootstrap_layout_check(&p, &d), PD_EMISMATCH,
              "layout mismatch: kv_heads: prefill 2, decode 1");
}

/* A peer that predates heterogeneous tp sends no total: only our tp_size pairs. */
static void test_old_peer(void) {
    struct pd_bootstrap_layout p = layout(2), d = layout(1);
    d.kv_heads_total = 0;
    CHECK_ERR(pd_bootstrap_layout_check(&p, &d), PD_EMISMATCH,
              "layout mismatch: tp_size: prefill 2, decode 1 (the decode does not give its total");
    d = layout(2);
    d.kv_heads_total = 0;
    CHECK_OK(pd_bootstrap_layout_check(&p, &d));
}

static void test_protobuf_round_trip(void) {
    struct pd_bootstrap_layout l = layout(4), back;
    Pdserve__V1__Layout pb;
    pd__bootstrap_layout_to_pb(&l, &pb);
    size_t n = protobuf_c_message_get_packed_size(&pb.base);
    uint8_t buf[512];
    CHECK(n <= sizeof(buf));
    protobuf_c_message_pack(&pb.base, buf);
    Pdserve__V1__Layout *u = pdserve__v1__layout__unpack(NULL, n, buf);
    CHECK(u != NULL);
    pd__bootstrap_layout_from_pb(u, &back);
    pdserve__v1__layout__free_unpacked(u, NULL);
    CHECK_STR(back.model, l.model);
    CHECK_STR(back.dtype, l.dtype);
    CHECK_INT((int)back.tp_size, 4);
    CHECK_INT((int)back.kv_heads, 1);
    CHECK_INT((long long)back.page_bytes, (long long)l.page_bytes);
    CHECK_INT((int)back.kv_heads_total, 4);
    /* an older peer's Layout: no field 10 */
    pb.kv_heads_total = 0;
    n = protobuf_c_message_get_packed_size(&pb.base);
    protobuf_c_message_pack(&pb.base, buf);
    u = pdserve__v1__layout__unpack(NULL, n, buf);
    CHECK(u != NULL);
    pd__bootstrap_layout_from_pb(u, &back);
    pdserve__v1__layout__free_unpacked(u, NULL);
    CHECK_INT((int)back.kv_heads_total, 0);
}

PD_TEST_MAIN(PD_TEST(test_tp_may_differ), PD_TEST(test_model_fields_named), PD_TEST(test_old_peer),
             PD_TEST(test_protobuf_round_trip))
