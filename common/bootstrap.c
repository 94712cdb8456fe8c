/*
 * bootstrap.c — the bootstrap protocol's shared part (bootstrap.h): the layout both pools must
 * agree on and its protobuf form, the cluster key and its check, and the request encoders tests
 * and tools use. The server (prefill) is prefill/bootstrap_server.c, the client (decode)
 * decode/bootstrap_client.c.
 *
 * Every request body comes from the network and is parsed, never trusted (protobuf-c unpack,
 * then range checks in the transfer engine).
 */
#include "common/bootstrap.h"
#include "common/bootstrap_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/alloc.h"
#include "common/base/ct.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "pdserve/v1/bootstrap.pb-c.h"

/* ---- layout and key ---- */

int pd_bootstrap_layout_check(const struct pd_bootstrap_layout *p,
                              const struct pd_bootstrap_layout *d) {
#define PD_CHECK_U(field)                                                                          \
    if (p->field != d->field)                                                                      \
        return pd_errorf(PD_EMISMATCH,                                                             \
                         "layout mismatch: " #field ": prefill %" PRIu64 ", decode %" PRIu64,      \
                         (uint64_t)p->field, (uint64_t)d->field);
#define PD_CHECK_S(field)                                                                          \
    if (strcmp(p->field, d->field) != 0)                                                           \
        return pd_errorf(PD_EMISMATCH, "layout mismatch: " #field ": prefill '%s', decode '%s'",   \
                         p->field, d->field);
    /* A peer that predates heterogeneous tp (no total kv heads) only pairs at our tp_size. */
    const bool totals = p->kv_heads_total && d->kv_heads_total;
    if (p->tp_size != d->tp_size && !totals)
        return pd_errorf(PD_EMISMATCH,
                         "layout mismatch: tp_size: prefill %" PRIu32 ", decode %" PRIu32
                         " (the %s does not give its total kv heads, so both must run the same "
                         "--tp-size)",
                         p->tp_size, d->tp_size, p->kv_heads_total ? "decode" : "prefill");
    /* the model-level geometry, each named; the fingerprint (which repeats some of it) after */
    PD_CHECK_U(layers)
    if (totals) {
        PD_CHECK_U(kv_heads_total)
    }
    PD_CHECK_U(head_dim)
    PD_CHECK_U(page_size)
    if (strcmp(p->dtype, d->dtype) != 0)
        return pd_errorf(PD_EMISMATCH,
                         "layout mismatch: dtype: prefill '%s', decode '%s' (both must run the "
                         "same --kv-cache-dtype: pages move between the pools as they are)",
                         p->dtype, d->dtype);
    PD_CHECK_S(model)
    PD_CHECK_U(tp_rank)
    if (p->tp_size == d->tp_size) { /* same split: same share per rank, same pages */
        PD_CHECK_U(kv_heads)
        PD_CHECK_U(page_bytes)
    }
#undef PD_CHECK_U
#undef PD_CHECK_S
    return PD_OK;
}

void pd__bootstrap_layout_to_pb(const struct pd_bootstrap_layout *l, Pdserve__V1__Layout *pb) {
    pdserve__v1__layout__init(pb);
    pb->model = (char *)l->model;
    pb->layers = l->layers;
    pb->kv_heads = l->kv_heads;
    pb->head_dim = l->head_dim;
    pb->page_size = l->page_size;
    pb->dtype = (char *)l->dtype;
    pb->tp_rank = l->tp_rank;
    pb->tp_size = l->tp_size;
    pb->page_bytes = l->page_bytes;
    pb->kv_heads_total = l->kv_heads_total;
}

void pd__bootstrap_layout_from_pb(const Pdserve__V1__Layout *pb, struct pd_bootstrap_layout *l) {
    memset(l, 0, sizeof(*l));
    if (!pb)
        return;
    snprintf(l->model, sizeof(l->model), "%s", pb->model ? pb->model : "");
    l->layers = pb->layers;
    l->kv_heads = pb->kv_heads;
    l->head_dim = pb->head_dim;
    l->page_size = pb->page_size;
    snprintf(l->dtype, sizeof(l->dtype), "%s", pb->dtype ? pb->dtype : "");
    l->tp_rank = pb->tp_rank;
    l->tp_size = pb->tp_size;
    l->page_bytes = pb->page_bytes;
    l->kv_heads_total = pb->kv_heads_total;
}

struct pd_flag *pd_flag_cluster_key(struct pd_flagset *fs, const char **path) {
    return pd_flag_string(fs, "--cluster-key", path, "FILE",
                          "file holding the shared secret every bootstrap call carries (default: "
                          "env PDSERVE_CLUSTER_KEY)");
}

int pd_cluster_key_load(const char *path, uint8_t key[PD_CLUSTER_KEY_MAX], size_t *len) {
    *len = 0;
    if (!path || !*path) {
        const char *env = getenv("PDSERVE_CLUSTER_KEY");
        if (!env || !*env) {
            pd_warn("bootstrap: no cluster key (--cluster-key or PDSERVE_CLUSTER_KEY): the "
                    "bootstrap port trusts anyone who can reach it");
            return PD_OK;
        }
        size_t n = strlen(env);
        if (n > PD_CLUSTER_KEY_MAX)
            return pd_errorf(PD_ERANGE, "PDSERVE_CLUSTER_KEY: %zu bytes, at most %d", n,
                             PD_CLUSTER_KEY_MAX);
        memcpy(key, env, n);
        *len = n;
        return PD_OK;
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return pd_errorf(pd_status_from_errno(errno), "--cluster-key %s: %s", path,
                         strerror(errno));
    size_t n = fread(key, 1, PD_CLUSTER_KEY_MAX, f);
    int extra = fgetc(f);
    fclose(f);
    while (n > 0 && (key[n - 1] == '\n' || key[n - 1] == '\r'))
        n--;
    if (extra != EOF)
        return pd_errorf(PD_ERANGE, "--cluster-key %s: longer than %d bytes", path,
                         PD_CLUSTER_KEY_MAX);
    if (n == 0)
        return pd_errorf(PD_EINVAL, "--cluster-key %s: empty", path);
    *len = n;
    return PD_OK;
}

/* In time that says nothing about the key (ct.h): neither how much was right nor its length. */
bool pd__bootstrap_key_ok(const uint8_t *want, size_t want_len, ProtobufCBinaryData got) {
    return pd_ct_equal(got.data, got.len, want, want_len);
}

int pd_bootstrap_encode_transfer(const uint8_t *key, size_t key_len, uint64_t room,
                                 const char *decode_id, const uint32_t *pages, uint32_t n,
                                 uint64_t pair_id, uint8_t **out, size_t *len) {
    Pdserve__V1__TransferRequest rq = PDSERVE__V1__TRANSFER_REQUEST__INIT;
    rq.cluster_key.data = (uint8_t *)key;
    rq.cluster_key.len = key_len;
    rq.room = room;
    rq.decode_id = (char *)decode_id;
    rq.dst_pages = (uint32_t *)pages;
    rq.n_dst_pages = n;
    rq.pair_id = pair_id;
    *len = protobuf_c_message_get_packed_size(&rq.base);
    *out = pd_malloc(*len ? *len : 1);
    if (!*out)
        return pd_error_wrap(PD_ENOMEM, "encoding a TransferRequest");
    protobuf_c_message_pack(&rq.base, *out);
    return PD_OK;
}

int pd_bootstrap_encode_abort(const uint8_t *key, size_t key_len, uint64_t room,
                              const char *decode_id, uint64_t pair_id, uint8_t **out, size_t *len) {
    Pdserve__V1__AbortRequest rq = PDSERVE__V1__ABORT_REQUEST__INIT;
    rq.cluster_key.data = (uint8_t *)key;
    rq.cluster_key.len = key_len;
    rq.room = room;
    rq.decode_id = (char *)decode_id;
    rq.pair_id = pair_id;
    *len = protobuf_c_message_get_packed_size(&rq.base);
    *out = pd_malloc(*len ? *len : 1);
    if (!*out)
        return pd_error_wrap(PD_ENOMEM, "encoding an AbortRequest");
    protobuf_c_message_pack(&rq.base, *out);
    return PD_OK;
}

int pd_bootstrap_decode_abort_reply(const uint8_t *reply, size_t len, bool *found) {
    Pdserve__V1__AbortReply *rp = pdserve__v1__abort_reply__unpack(NULL, len, reply);
    if (!rp)
        return pd_errorf(PD_EINVAL, "malformed AbortReply (%zu bytes)", len);
    *found = rp->found;
    pdserve__v1__abort_reply__free_unpacked(rp, NULL);
    return PD_OK;
}

int pd_bootstrap_encode_health(const uint8_t *key, size_t key_len, uint8_t **out, size_t *len) {
    Pdserve__V1__HealthRequest rq = PDSERVE__V1__HEALTH_REQUEST__INIT;
    rq.cluster_key.data = (uint8_t *)key;
    rq.cluster_key.len = key_len;
    *len = protobuf_c_message_get_packed_size(&rq.base);
    *out = pd_malloc(*len ? *len : 1);
    if (!*out)
        return pd_error_wrap(PD_ENOMEM, "encoding a HealthRequest");
    protobuf_c_message_pack(&rq.base, *out);
    return PD_OK;
}
