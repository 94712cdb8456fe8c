/*
 * cuda_status.c — the one translation of cudaError_t into pdserve's status codes (STYLE.md
 * rule 3). The message keeps CUDA's own name and text so a user can search for it.
 */
#include "common/base/status.h"
#include "kernels/kernels.h"

int pd__cuda_status(cudaError_t err, const char *what) {
    if (err == cudaSuccess)
        return PD_OK;
    int code;
    switch (err) {
    case cudaErrorMemoryAllocation: code = PD_ENOMEM; break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion: code = PD_EUNSUPPORTED; break;
    case cudaErrorInvalidValue: code = PD_EINVAL; break;
    default: code = PD_EINTERNAL; break;
    }
    return pd_errorf(code, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

int pd__pdfi_status(int rc, const char *what) {
    if (rc == PDFI_EFLASHINFER) /* FlashInfer refused what we asked of it: our bug */
        return pd_errorf(PD_EINTERNAL, "%s", what);
    return pd__cuda_status((cudaError_t)rc, what);
}
