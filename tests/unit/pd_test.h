/*
 * pd_test.h — the minimal harness every unit test uses: CHECK macros that report file:line and
 * the values seen, count failures, and a PD_TEST_MAIN that runs the listed cases and exits
 * non-zero when any check failed (CTest reads the exit code). Exit 77 = skipped.
 */
#ifndef PD_TEST_H
#define PD_TEST_H

#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/status.h"

static int pd_test_failures;
static int pd_test_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        pd_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            pd_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_INT(a, b)                                                                            \
    do {                                                                                           \
        long long pd_a_ = (long long)(a), pd_b_ = (long long)(b);                                  \
        pd_test_checks++;                                                                          \
        if (pd_a_ != pd_b_) {                                                                      \
            pd_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b,  \
                    pd_a_, pd_b_);                                                                 \
        }                                                                                          \
    } while (0)

#define CHECK_DBL(a, b, tol)                                                                       \
    do {                                                                                           \
        double pd_a_ = (double)(a), pd_b_ = (double)(b);                                           \
        pd_test_checks++;                                                                          \
        if (!(pd_a_ - pd_b_ <= (tol) && pd_b_ - pd_a_ <= (tol))) {                                 \
            pd_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s ~= %s failed: %.9g != %.9g\n", __FILE__, __LINE__, #a, #b,  \
                    pd_a_, pd_b_);                                                                 \
        }                                                                                          \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *pd_a_ = (a), *pd_b_ = (b);                                                     \
        pd_test_checks++;                                                                          \
        if (!pd_a_ || !pd_b_ || strcmp(pd_a_, pd_b_) != 0) {                                       \
            pd_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__, #a,  \
                    #b, pd_a_ ? pd_a_ : "(null)", pd_b_ ? pd_b_ : "(null)");                       \
        }                                                                                          \
    } while (0)

/* The call must fail with `code` and the error message must contain `needle`. */
#define CHECK_ERR(call, code, needle)                                                              \
    do {                                                                                           \
        pd_error_clear();                                                                          \
        int pd_rc_ = (call);                                                                       \
        pd_test_checks++;                                                                          \
        if (pd_rc_ != (code) || !strstr(pd_error_msg(), (needle))) {                               \
            pd_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s: want %d containing \"%s\", got %d \"%s\"\n", __FILE__,     \
                    __LINE__, #call, (int)(code), (needle), pd_rc_, pd_error_msg());               \
        }                                                                                          \
    } while (0)

#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        int pd_rc_ = (call);                                                                       \
        pd_test_checks++;                                                                          \
        if (pd_rc_ != PD_OK) {                                                                     \
            pd_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s failed: %d %s\n", __FILE__, __LINE__, #call, pd_rc_,        \
                    pd_error_msg());                                                               \
        }                                                                                          \
    } while (0)

typedef void (*pd_test_fn)(void);
struct pd_test_case {
    const char *name;
    pd_test_fn fn;
};
#define PD_TEST(fn)                                                                                \
    { #fn, fn }

/* A scratch directory for this test binary (removed by nobody: the build tree owns it). */
static inline const char *pd_test_tmpdir(void) {
    const char *d = getenv("PD_TEST_TMPDIR");
    return d && *d ? d : "/tmp";
}

/* A fresh directory <tmpdir>/<name>.XXXXXX of this process alone: CTest entries running the
 * same binary at once (ctest -j) never write, or mmap, each other's files. PD_OK or PD_EIO. */
static inline int pd_test_scratch_dir(char *buf, size_t cap, const char *name) {
    int n = snprintf(buf, cap, "%s/%s.XXXXXX", pd_test_tmpdir(), name);
    if (n < 0 || (size_t)n >= cap || !mkdtemp(buf)) {
        fprintf(stderr, "scratch dir %s/%s.XXXXXX: %s\n", pd_test_tmpdir(), name, strerror(errno));
        return PD_EIO;
    }
    return PD_OK;
}

static inline int pd_test_rm_entry_(const char *path, const struct stat *st, int flag,
                                    struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes what pd_test_scratch_dir made, with everything in it. */
static inline void pd_test_scratch_remove(const char *dir) {
    nftw(dir, pd_test_rm_entry_, 16, FTW_DEPTH | FTW_PHYS);
}

/* A TCP port of 127.0.0.1 free a moment ago (bound to 0, read back, closed), for a server the
 * test starts next. */
static inline int pd_test_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        perror("pd_test_free_port");
        exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

static inline int pd_test_run(const char *prog, const struct pd_test_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int before = pd_test_failures;
        cases[i].fn();
        fprintf(stderr, "%s %s: %s\n", pd_test_failures == before ? "PASS" : "FAIL", prog,
                cases[i].name);
    }
    fprintf(stderr, "%s: %d checks, %d failed\n", prog, pd_test_checks, pd_test_failures);
    return pd_test_failures ? 1 : 0;
}

#define PD_TEST_MAIN(...)                                                                          \
    int main(int argc, char **argv) {                                                              \
        (void)argc;                                                                                \
        static const struct pd_test_case cases_[] = {__VA_ARGS__};                                 \
        return pd_test_run(argv[0], cases_, sizeof(cases_) / sizeof(cases_[0]));                   \
    }

#endif
