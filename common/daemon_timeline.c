/*
 * daemon_timeline.c — where a PD request's time to first token goes (issue 17's hand-over
 * timeline): pdserve_handover_seconds{stage} on each daemon (serve_metrics.h names the stages),
 * one debug line per request, and the means in /server_info.
 *
 * Each side measures on its own clock. Prefill knows when its decode's Transfer arrived, when its
 * first chunk's step began, when that chunk's pages and when the last ones were posted; it sends
 * those three spans in the done notice (pd_xfer_notice.sender_us). Decode knows when it reserved
 * the pages and sent the Transfer, when the KV was complete and when the first token reached the
 * client's connection; with prefill's spans its stages add up to its TTFT exactly, and what is
 * left of its wait beyond prefill's own work (the Transfer call, the last pages' and the
 * notice's way) is kv_other.
 */
#include "common/daemon_internal.h"

#include <cjson/cJSON.h>
#include <inttypes.h>

#include "common/base/log.h"
#include "common/base/metrics.h"
#include "common/serve_metrics.h"

static uint32_t to_us(double s) {
    if (!(s > 0))
        return 0;
    return s >= 4294.967295 ? UINT32_MAX : (uint32_t)(s * 1e6 + 0.5);
}

static void observe(struct pd_daemon_state *d, enum pd_handover_stage st, double s) {
    pd_metric_observe(d->sm->handover[st], s > 0 ? s : 0);
}

void pd__timeline_prefill(struct pd_daemon_state *d, struct pd_daemon_req *r, double t_sched,
                          double now, uint32_t us[PD_XFER_NOTICE_STAGES]) {
    /* a request whose first chunk was never scheduled or posted has no spans to give */
    if (t_sched <= 0 || r->t_xfer <= 0)
        return;
    /* eager (--eager-prefill): computing may have begun before the Transfer came; what it did
     * by then hid behind decode's reserve and the Transfer's way, so the spans start at the
     * Transfer and fall inside decode's wait */
    double t0 = t_sched > r->t_waiting ? t_sched : r->t_waiting;
    double spans[PD_XFER_NOTICE_STAGES] = {t0 - r->t_waiting, r->t_xfer - t0, now - r->t_xfer};
    for (int k = 0; k < PD_XFER_NOTICE_STAGES; k++)
        us[k] = to_us(spans[k]);
    observe(d, PD_HO_BOOTSTRAP, r->t_waiting - r->t_start);
    observe(d, PD_HO_QUEUE, spans[0]);
    observe(d, PD_HO_FIRST_CHUNK, spans[1]);
    observe(d, PD_HO_REST, spans[2]);
    pd_debug("room=%" PRIu64 " rid=%s hand-over (ms): bootstrap wait %.3f | queue %.3f, first "
             "chunk %.3f, rest %.3f",
             r->room, r->rid, (r->t_waiting - r->t_start) * 1e3, spans[0] * 1e3, spans[1] * 1e3,
             spans[2] * 1e3);
}

void pd__timeline_decode_kv(struct pd_daemon_req *r, const struct pd_xfer_notice *n, double now) {
    r->t_kv = now;
    for (int k = 0; k < PD_XFER_NOTICE_STAGES; k++)
        r->sender_us[k] = n->sender_us[k];
}

void pd__timeline_decode_first(struct pd_daemon_state *d, struct pd_daemon_req *r, double now) {
    if (r->t_kv <= 0 || r->t_xfer <= 0)
        return;
    double reserve = r->t_xfer - r->t_start, first = now - r->t_kv, prefill = 0;
    double p[PD_XFER_NOTICE_STAGES];
    for (int k = 0; k < PD_XFER_NOTICE_STAGES; k++)
        prefill += p[k] = r->sender_us[k] * 1e-6;
    double other = (r->t_kv - r->t_xfer) - prefill;
    observe(d, PD_HO_RESERVE, reserve);
    observe(d, PD_HO_QUEUE, p[0]);
    observe(d, PD_HO_FIRST_CHUNK, p[1]);
    observe(d, PD_HO_REST, p[2]);
    observe(d, PD_HO_KV_OTHER, other);
    observe(d, PD_HO_FIRST_TOKEN, first);
    pd_debug("room=%" PRIu64 " rid=%s hand-over (ms): reserve %.3f | prefill queue %.3f, first "
             "chunk %.3f, rest %.3f | kv other %.3f | first token %.3f = ttft %.3f",
             r->room, r->rid, reserve * 1e3, p[0] * 1e3, p[1] * 1e3, p[2] * 1e3, other * 1e3,
             first * 1e3, (now - r->t_start) * 1e3);
}

void pd__timeline_server_info(const struct pd_daemon_state *d, struct cJSON *extra) {
    cJSON *h = cJSON_AddObjectToObject(extra, "handover");
    for (int s = 0; s < PD_HO_N; s++) {
        const struct pd_metric *m = d->sm->handover[s];
        uint64_t c = pd_metric_count(m);
        if (c == 0)
            continue;
        cJSON *o = cJSON_AddObjectToObject(h, pd_handover_stage_names[s]);
        cJSON_AddNumberToObject(o, "count", (double)c);
        cJSON_AddNumberToObject(o, "mean_ms", pd_metric_value(m) / (double)c * 1e3);
    }
}
