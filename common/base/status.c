/*
 * status.c — status names, errno translation and the thread-local error message.
 * The message buffer is per thread so the loop and compute threads never overwrite each other's
 * explanation; it is bounded, and a message that does not fit is cut, never overflowed.
 */
#include "common/base/status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PD_ERROR_MSG_MAX 1024

static _Thread_local char error_msg[PD_ERROR_MSG_MAX];

const char *pd_status_str(int status) {
    switch (status) {
    case PD_OK: return "ok";
    case PD_EINVAL: return "invalid argument";
    case PD_ENOMEM: return "out of memory";
    case PD_EIO: return "i/o error";
    case PD_ENOENT: return "not found";
    case PD_EFORMAT: return "bad format";
    case PD_EUNSUPPORTED: return "unsupported";
    case PD_ERANGE: return "out of range";
    case PD_EAGAIN: return "try again";
    case PD_ETIMEDOUT: return "timed out";
    case PD_ECANCELED: return "canceled";
    case PD_EFULL: return "full";
    case PD_EPEER: return "peer failed";
    case PD_EPERM: return "permission denied";
    case PD_EMISMATCH: return "mismatch";
    case PD_EINTERNAL: return "internal error";
    default: return "unknown status";
    }
}

int pd_status_from_errno(int err) {
    switch (err) {
    case 0: return PD_OK;
    case ENOENT:
    case ENOTDIR: return PD_ENOENT;
    case ENOMEM: return PD_ENOMEM;
    case EINVAL: return PD_EINVAL;
    case EACCES:
    case EPERM: return PD_EPERM;
    case EAGAIN: return PD_EAGAIN;
    case ETIMEDOUT: return PD_ETIMEDOUT;
    case ECANCELED: return PD_ECANCELED;
    case ERANGE:
    case EOVERFLOW: return PD_ERANGE;
    case ECONNRESET:
    case ECONNREFUSED:
    case EPIPE: return PD_EPEER;
    default: return PD_EIO;
    }
}

int pd_errorf(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_msg, sizeof(error_msg), fmt, ap);
    va_end(ap);
    return code;
}

int pd_error_wrap(int code, const char *fmt, ...) {
    char prefix[PD_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    char old[PD_ERROR_MSG_MAX];
    memcpy(old, error_msg, sizeof(old));
    /* a message too long for the buffer is cut, by design */
    int n = snprintf(error_msg, sizeof(error_msg), "%s: %s", prefix,
                     old[0] ? old : pd_status_str(code));
    (void)n;
    return code;
}

const char *pd_error_msg(void) {
    return error_msg;
}

void pd_error_clear(void) {
    error_msg[0] = '\0';
}

void pd__assert_fail(const char *expr, const char *file, int line, const char *func) {
    fprintf(stderr, "pdserve: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}
