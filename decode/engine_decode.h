/*
 * engine_decode.h — the decode daemon's roles of the compute thread: pass one as
 * pd_engine_config.ops. pd_engine_decode_ops (decode/engine_decode.c): disaggregated decode, the
 * prompt's KV received from a prefill daemon. pd_engine_coloc_ops (decode/engine_coloc.c):
 * colocated (--disaggregation-mode null), prefill chunks and decode tokens in mixed steps.
 */
#ifndef PD_ENGINE_DECODE_H
#define PD_ENGINE_DECODE_H

#include "common/engine.h"

extern const struct pd_engine_ops pd_engine_decode_ops;
extern const struct pd_engine_ops pd_engine_coloc_ops;

/* Internal to decode/: the step_rows of both roles (engine_internal.h) — a row per running
 * request (colocated: per admitted one), and the step's tokens at least one per row. */
int32_t pd__engine_running_rows(const struct pd_engine_config *cfg, int32_t budget,
                                int32_t *max_tokens);

#endif
