/*
 * status.h — the one status type of pdserve (STYLE.md rule 3).
 *
 * Every fallible function returns int: PD_OK (0) or a negative PD_E* code; results travel
 * through out-parameters. Alongside the code, the failing function records a human message in
 * a thread-local buffer (pd_errorf), and callers that add context prepend it (pd_error_wrap), so
 * the message a user finally sees reads outermost-first: "loading /m/model.safetensors: tensor
 * 'lm_head.weight' missing". Foreign codes (errno, ucs_status_t, cudaError_t, ...) are each
 * translated in exactly one function; errno's is pd_status_from_errno here.
 */
#ifndef PD_STATUS_H
#define PD_STATUS_H

#include <stddef.h>

enum pd_status {
    PD_OK = 0,
    PD_EINVAL = -1,       /* bad argument or malformed input */
    PD_ENOMEM = -2,       /* allocation failed */
    PD_EIO = -3,          /* read/write/mmap failed */
    PD_ENOENT = -4,       /* file, key or item not found */
    PD_EFORMAT = -5,      /* input present but not in the expected format */
    PD_EUNSUPPORTED = -6, /* valid input we do not support (yet) */
    PD_ERANGE = -7,       /* value outside the allowed range */
    PD_EAGAIN = -8,       /* not ready, poll again */
    PD_ETIMEDOUT = -9,    /* deadline passed */
    PD_ECANCELED = -10,   /* aborted by the user or the peer */
    PD_EFULL = -11,       /* queue or pool full */
    PD_EPEER = -12,       /* remote side failed or vanished */
    PD_EPERM = -13,       /* authentication / permission refused */
    PD_EMISMATCH = -14,   /* two sides disagree (layout, shape, version) */
    PD_EINTERNAL = -15,   /* a bug: an invariant broke */
};

/* Short fixed name of a code, e.g. "invalid argument". Never NULL. */
const char *pd_status_str(int status);

/* errno → PD_E*, the only place errno values are interpreted. */
int pd_status_from_errno(int err);

/* Records "message" as this thread's last error and returns code (for `return pd_errorf(...)`). */
int pd_errorf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to this thread's last error; returns code unchanged. */
int pd_error_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This thread's last error message; "" when none was recorded. Valid until the next pd_error*. */
const char *pd_error_msg(void);

/* Forgets this thread's last error. */
void pd_error_clear(void);

#define PD_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond))                                                                               \
            pd__assert_fail(#cond, __FILE__, __LINE__, __func__);                                  \
    } while (0)

_Noreturn void pd__assert_fail(const char *expr, const char *file, int line, const char *func);

#define PD_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
