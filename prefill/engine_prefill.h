/*
 * engine_prefill.h — the prefill role of the compute thread: pass &pd_engine_prefill_ops as
 * pd_engine_config.ops (prefill/engine_prefill.c).
 */
#ifndef PD_ENGINE_PREFILL_H
#define PD_ENGINE_PREFILL_H

#include "common/engine.h"

extern const struct pd_engine_ops pd_engine_prefill_ops;

#endif
