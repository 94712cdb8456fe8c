/*
 * backend_reg.c — the table of backends this build links (backend_reg.h). PD_HAVE_CUDA and
 * PD_HAVE_NCCL come from model/CMakeLists.txt when kernels/ is built (and found nccl.h); the
 * table's strong references are what pull each backend's objects out of its static library.
 */
#include "model/backend_reg.h"

#include "model/backend_impl.h"
#include "model/cpu/backend_cpu.h"
#include "common/base/status.h"
#ifdef PD_HAVE_CUDA
#include "kernels/backend_cuda.h"
#endif

static const struct pd_backend_reg regs[] = {
    {.name = "cpu", .kind = PD_BACKEND_CPU, .backend_new = pd__backend_cpu_new},
#ifdef PD_HAVE_CUDA
    {
        .name = "cuda",
        .kind = PD_BACKEND_CUDA,
        .backend_new = pd__backend_cuda_new,
        .devmem_new = pd__devmem_cuda_new,
#ifdef PD_HAVE_NCCL
        .tp_nccl_new = pd_tp_nccl_new,
        .tp_nccl_free = pd_tp_nccl_free,
        .tp_nccl_comm = pd_tp_nccl_comm,
#endif
    },
#endif
};

const struct pd_backend_reg *pd_backend_reg_find(enum pd_backend_kind kind) {
    for (size_t i = 0; i < PD_ARRAY_LEN(regs); i++)
        if (regs[i].kind == kind)
            return &regs[i];
    return NULL;
}

int pd_backend_new(const struct pd_backend_opts *opts, struct pd_backend **out) {
    *out = NULL;
    const struct pd_backend_reg *r = pd_backend_reg_find(opts->kind);
    if (r)
        return r->backend_new(opts, out);
    if (opts->kind == PD_BACKEND_CUDA)
        return pd_errorf(PD_EUNSUPPORTED,
                         "the cuda backend is not in this build (configure with PD_CUDA=ON)");
    return pd_errorf(PD_EINVAL, "unknown backend kind %d", (int)opts->kind);
}

int pd_devmem_new(const struct pd_devmem_opts *o, struct pd_devmem **out) {
    *out = NULL;
    const struct pd_backend_reg *r = pd_backend_reg_find(PD_BACKEND_CUDA);
    switch (o->kind) {
    case PD_DEVMEM_HOST: return pd__devmem_host_new(o, out);
    case PD_DEVMEM_CUDA:
        if (!r || !r->devmem_new)
            return pd_errorf(PD_EUNSUPPORTED, "GPU page transfer: the CUDA code is not in this "
                                              "build (configure with PD_CUDA=ON)");
        return r->devmem_new(o, out);
    }
    return pd_errorf(PD_EINVAL, "unknown device memory kind %d", (int)o->kind);
}
