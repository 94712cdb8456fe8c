/*
 * backend_reg.h — the backends of this build, by name (model/backend_reg.c, library pdbackends).
 * The registry is the one place that names each backend's constructors, with plain strong
 * references: cpu always, cuda (kernels/) when CMake built it. It also defines pd_backend_new
 * (backend.h) and pd_devmem_new (devmem.h), which pick from it, so pdmodel below it references
 * no backend and no backend references the registry (base ← model ← backends ← registry).
 */
#ifndef PD_BACKEND_REG_H
#define PD_BACKEND_REG_H

#include "model/backend.h"
#include "model/devmem.h"
#include "model/tp.h"

struct pd_backend_reg {
    const char *name; /* as --device spells it */
    enum pd_backend_kind kind;
    int (*backend_new)(const struct pd_backend_opts *opts, struct pd_backend **out);
    /* the device memory the KV transfer stages through (devmem.h); NULL: host memory only */
    int (*devmem_new)(const struct pd_devmem_opts *o, struct pd_devmem **out);
    /* tensor parallelism across devices (tp.h, NCCL); all NULL where this build has none */
    int (*tp_nccl_new)(int size, const int *devices, struct pd_tp_nccl **out);
    void (*tp_nccl_free)(struct pd_tp_nccl *g);
    const struct pd_tp_comm *(*tp_nccl_comm)(struct pd_tp_nccl *g, int rank);
};

/* The entry of kind, or NULL when this build lacks that backend. */
const struct pd_backend_reg *pd_backend_reg_find(enum pd_backend_kind kind);

#endif
