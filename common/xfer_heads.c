/*
 * xfer_heads.c — heterogeneous tensor parallelism in the transfer engine (xfer.h): how our pool's
 * shards split the model's kv heads, the check of a peer that splits them otherwise, and the plan
 * of 2-D copies that regroups a run of our pages into its shards' layout. A host pool's messages
 * are packed by UCX through a generic datatype whose pack callback gathers the pieces straight
 * from our shards into UCX's send buffer (no copy of ours in between); a device pool's runs are
 * 2-D copied into the staging ring (allocated at the first such peer when the pool has none).
 *
 * Everything about a peer's heads comes from the network (Pair): each field is range-checked
 * against ours before any product of them is formed, so no size below can overflow, and a peer
 * whose heads do not fit is refused, never trusted. The copies (xfer_send.c) write every byte of
 * every destination shard of the run exactly once: a destination head comes from the first of our
 * shards that holds it.
 */
#include "common/xfer_internal.h"

/* The first of the n shards of h holding head, or -1. */
static int first_holder(const struct pd_xfer_heads *h, int n, uint32_t head) {
    for (int i = 0; i < n; i++)
        if (head >= h->start[i] && head - h->start[i] < h->count)
            return i;
    return -1;
}

int pd_xfer_register_heads(pd_xfer_t *x, const struct pd_xfer_heads *h) {
    if (!x->n_shards)
        return pd_errorf(PD_EINVAL, "describing the KV pool's heads before registering the pool");
    if (!h->rows_per_page || !h->head_bytes || !h->count || h->count > h->total ||
        h->total > (uint64_t)h->count * (uint64_t)x->n_shards)
        return pd_errorf(PD_EINVAL,
                         "describing the KV pool's heads: %u rows per page, %u bytes per head, "
                         "%u heads per shard of %u, %d shards",
                         h->rows_per_page, h->head_bytes, h->count, h->total, x->n_shards);
    uint64_t row = (uint64_t)h->count * h->head_bytes;
    if (row > UINT32_MAX || row * h->rows_per_page != x->shard_page_bytes)
        return pd_errorf(PD_EINVAL,
                         "describing the KV pool's heads: shard pages of %zu bytes are not %u "
                         "rows of %u heads of %u bytes",
                         x->shard_page_bytes, h->rows_per_page, h->count, h->head_bytes);
    for (int k = 0; k < x->n_shards; k++)
        if (h->start[k] > h->total - h->count)
            return pd_errorf(PD_EINVAL,
                             "describing the KV pool's heads: shard %d's heads [%u, %u) are past "
                             "the model's %u",
                             k, h->start[k], h->start[k] + h->count, h->total);
    for (uint32_t head = 0; head < h->total; head++)
        if (first_holder(h, x->n_shards, head) < 0)
            return pd_errorf(PD_EINVAL, "describing the KV pool's heads: kv head %u is in no shard",
                             head);
    x->heads = *h;
    for (int k = x->n_shards; k < PD_XFER_SHARDS_MAX; k++)
        x->heads.start[k] = 0;
    return PD_OK;
}

/* The staging ring with slots of at least min_slot bytes: the pool's own (staged device pool),
 * or one made now for a device pool UCX maps directly. Not mapped with UCX: its messages are
 * eager copies. */
static int ring_ensure(pd_xfer_t *x, const struct pd_xfer_peer_info *info, size_t min_slot) {
    if (x->slots) {
        if (x->slot_bytes >= min_slot)
            return PD_OK;
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": its pages of %zu bytes do not fit a "
                         "staging slot of %zu bytes",
                         info->remote_id, min_slot, x->slot_bytes);
    }
    size_t want = x->cfg.stage_slot_bytes ? x->cfg.stage_slot_bytes : (size_t)4 << 20;
    int rc = pd__xfer_ring_new(x, want < min_slot ? min_slot : want);
    if (rc == PD_OK)
        pd_info("xfer: staging ring of %d x %zu bytes for peers that split the kv heads otherwise",
                x->n_slots, x->slot_bytes);
    return rc;
}

/* Plans p's 2-D copies: for each of its shards j, its heads in intervals of one first holder
 * among ours. */
static int plan_copies(const pd_xfer_t *x, const struct pd_xfer_peer_info *info, int ns,
                       struct pd_xfer_peer *p) {
    const struct pd_xfer_heads *ph = &info->heads, *mh = &x->heads;
    const uint32_t hb = mh->head_bytes;
    p->n_copies = 0;
    for (int j = 0; j < ns; j++) {
        p->first_copy[j] = p->n_copies;
        const uint32_t b = ph->start[j], end = b + ph->count;
        for (uint32_t h = b; h < end;) {
            int i = first_holder(mh, x->n_shards, h);
            if (i < 0)
                return pd_errorf(PD_EMISMATCH,
                                 "connecting peer %016" PRIx64 ": kv head %u of its shard %d is "
                                 "in none of our %d shards",
                                 info->remote_id, h, j, x->n_shards);
            uint32_t e = h + 1;
            while (e < end && first_holder(mh, x->n_shards, e) == i)
                e++;
            if (p->n_copies == REGROUP_COPIES_MAX)
                return pd_errorf(PD_EMISMATCH,
                                 "connecting peer %016" PRIx64 ": its shards split the kv heads "
                                 "into more than %d pieces of ours",
                                 info->remote_id, REGROUP_COPIES_MAX);
            p->copies[p->n_copies++] = (struct regroup_copy){
                .src = (uint8_t)i,
                .dst = (uint8_t)j,
                .src_off = (h - mh->start[i]) * hb,
                .dst_off = (h - b) * hb,
                .width = (e - h) * hb,
            };
            h = e;
        }
        if (p->n_copies - p->first_copy[j] > REGROUP_PIECES_MAX)
            return pd_errorf(PD_EMISMATCH,
                             "connecting peer %016" PRIx64 ": its shard %d's kv heads are in more "
                             "than %d pieces of ours",
                             info->remote_id, j, REGROUP_PIECES_MAX);
    }
    p->first_copy[ns] = p->n_copies;
    return PD_OK;
}

/* ---- a host pool's regrouped messages, packed by UCX (the generic datatype) ---- */

/* Gathers bytes [pos, pos + n) of the destination shard's part of the run into dest: row by
 * row, piece by piece, each piece one memcpy from the shard of ours holding its heads. A shard
 * page is rows_per_page rows of src_pitch bytes (pd_xfer_register_heads), so the run's rows are
 * equally strided across its pages: one division per call, none per piece (a 64 KiB message is
 * hundreds of 256-byte pieces). */
static void regroup_gather(const struct regroup_msg *m, uint64_t pos, char *dest, size_t n) {
    const pd_xfer_t *x = m->x;
    const uint64_t row = pos / m->dst_pitch;
    uint32_t col = (uint32_t)(pos % m->dst_pitch);
    size_t at = (size_t)m->src_page * x->shard_page_bytes + (size_t)row * m->src_pitch;
    const char *src[REGROUP_PIECES_MAX]; /* each piece's first byte in row 0 of our shards */
    for (int k = 0; k < m->n_pieces; k++)
        src[k] = (const char *)x->pool_bases[m->pieces[k].src] + m->pieces[k].src_off;
    int k = 0;
    while (col >= m->pieces[k].dst_off + m->pieces[k].width) /* pieces cover the row in order */
        k++;
    while (n) {
        const struct regroup_copy *c = &m->pieces[k];
        const uint32_t in = col - c->dst_off, left = c->width - in;
        const size_t take = n < left ? n : left;
        memcpy(dest, src[k] + at + in, take);
        dest += take;
        n -= take;
        col += (uint32_t)take;
        if (++k == m->n_pieces) { /* the row is done (or n is) */
            k = 0;
            col = 0;
            at += m->src_pitch;
        }
    }
}

static void *regroup_start_pack(void *context, const void *buffer, size_t count) {
    (void)context;
    (void)count;
    return (void *)buffer; /* the op's regroup_msg: lives until the send completes */
}

static void *regroup_start_unpack(void *context, void *buffer, size_t count) {
    (void)context;
    (void)count;
    return buffer; /* never: the datatype only sends */
}

static size_t regroup_packed_size(void *state) {
    return ((const struct regroup_msg *)state)->len;
}

static size_t regroup_pack(void *state, size_t offset, void *dest, size_t max_length) {
    const struct regroup_msg *m = state;
    size_t n = offset >= m->len ? 0 : m->len - offset;
    n = n < max_length ? n : max_length;
    regroup_gather(m, m->off + offset, dest, n);
    return n;
}

static ucs_status_t regroup_unpack(void *state, size_t offset, const void *src, size_t length) {
    (void)state;
    (void)offset;
    (void)src;
    (void)length;
    return UCS_ERR_UNSUPPORTED;
}

static void regroup_finish(void *state) {
    (void)state;
}

static int regroup_dt_ensure(pd_xfer_t *x) {
    static const ucp_generic_dt_ops_t ops = {
        .start_pack = regroup_start_pack,
        .start_unpack = regroup_start_unpack,
        .packed_size = regroup_packed_size,
        .pack = regroup_pack,
        .unpack = regroup_unpack,
        .finish = regroup_finish,
    };
    if (x->regroup_dt)
        return PD_OK;
    ucs_status_t st = ucp_dt_create_generic(&ops, NULL, &x->regroup_dt);
    if (st != UCS_OK) {
        x->regroup_dt = 0;
        return pd__ucs_error(st, "creating the datatype of regrouped pages");
    }
    return PD_OK;
}

void pd__xfer_regroup_msg(const pd_xfer_t *x, const struct pd_xfer_peer *p, uint32_t dst,
                          uint32_t src_page, uint64_t off, size_t len, struct regroup_msg *m) {
    const int a = p->first_copy[dst], b = p->first_copy[dst + 1];
    m->x = x;
    m->src_page = src_page;
    m->src_pitch = x->heads.count * x->heads.head_bytes;
    m->dst_pitch = p->dst_pitch;
    m->off = off;
    m->len = len;
    m->n_pieces = b - a;
    memcpy(m->pieces, p->copies + a, (size_t)(b - a) * sizeof(*m->pieces));
}

int pd__xfer_peer_regroup(pd_xfer_t *x, const struct pd_xfer_peer_info *info, int ns, uint64_t spb,
                          struct pd_xfer_peer *p) {
    const struct pd_xfer_heads *ph = &info->heads, *mh = &x->heads;
    const bool described = mh->rows_per_page && ph->rows_per_page;
    bool alike = ns == x->n_shards && spb == x->shard_page_bytes;
    for (int k = 0; alike && described && k < ns; k++)
        alike = ph->count == mh->count && ph->start[k] == mh->start[k];
    if (alike) {
        if (info->page_bytes != x->page_bytes)
            return pd_errorf(PD_EMISMATCH,
                             "connecting peer %016" PRIx64 ": its pages are %" PRIu64
                             " bytes, ours %zu",
                             info->remote_id, info->page_bytes, x->page_bytes);
        return PD_OK; /* shard k to shard k */
    }
    if (!described)
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": its KV pool has %d shard%s of %" PRIu64
                         " bytes per page, ours %d of %zu, and %s not say how its shards split "
                         "the kv heads, so its pages cannot be regrouped into ours",
                         info->remote_id, ns, ns == 1 ? "" : "s", spb, x->n_shards,
                         x->shard_page_bytes,
                         mh->rows_per_page ? "the peer does" : "this engine does");
        /* the model-level geometry first: only then are products of the peer's fields bounded */
#define PD_REGROUP_SAME(field, what)                                                               \
    if (ph->field != mh->field)                                                                    \
        return pd_errorf(PD_EMISMATCH,                                                             \
                         "connecting peer %016" PRIx64 ": " what ": theirs %u, ours %u",           \
                         info->remote_id, ph->field, mh->field);
    PD_REGROUP_SAME(total, "the model's kv heads")
    PD_REGROUP_SAME(head_bytes, "bytes per kv head (head_dim x element size)")
    PD_REGROUP_SAME(rows_per_page, "rows per page (layers x K,V x page_size)")
#undef PD_REGROUP_SAME
    if (!ph->count || ph->count > ph->total)
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": %u kv heads per shard of %u",
                         info->remote_id, ph->count, ph->total);
    for (int k = 0; k < ns; k++)
        if (ph->start[k] > ph->total - ph->count)
            return pd_errorf(PD_EMISMATCH,
                             "connecting peer %016" PRIx64 ": its shard %d's kv heads [%u, %u) are "
                             "past the model's %u",
                             info->remote_id, k, ph->start[k], ph->start[k] + ph->count, ph->total);
    const uint64_t row = (uint64_t)ph->count * ph->head_bytes; /* <= our total's row */
    if (row > UINT32_MAX || row * ph->rows_per_page != spb)
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": its shard pages of %" PRIu64
                         " bytes are not %u rows of %u kv heads of %u bytes",
                         info->remote_id, spb, ph->rows_per_page, ph->count, ph->head_bytes);
    if (x->cfg.data_path == PD_XFER_DATA_PUT)
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": its shards split the kv heads otherwise "
                         "than ours, so pages go regrouped as active messages, but this engine "
                         "is configured to send them as puts",
                         info->remote_id);
    int rc = plan_copies(x, info, ns, p);
    if (!rc)
        rc = x->dm ? ring_ensure(x, info, (size_t)spb * (size_t)ns) : regroup_dt_ensure(x);
    if (rc)
        return rc;
    p->regroup = true;
    p->n_shards = ns;
    p->shard_page_bytes = spb;
    p->dst_pitch = (uint32_t)row;
    return PD_OK;
}
