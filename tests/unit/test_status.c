/* Status codes, error messages with context, and allocation failure injection. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/base/log.h"

#include <errno.h>
#include <unistd.h>

static void test_error_wrap(void) {
    CHECK_INT(pd_errorf(PD_ENOENT, "tensor '%s' missing", "lm_head.weight"), PD_ENOENT);
    CHECK_INT(pd_error_wrap(PD_ENOENT, "loading %s", "/m/model.safetensors"), PD_ENOENT);
    CHECK_STR(pd_error_msg(), "loading /m/model.safetensors: tensor 'lm_head.weight' missing");
    pd_error_clear();
    CHECK_STR(pd_error_msg(), "");
    pd_error_wrap(PD_EIO, "reading x");
    CHECK_STR(pd_error_msg(), "reading x: i/o error");
}

static void test_errno_translation(void) {
    CHECK_INT(pd_status_from_errno(ENOENT), PD_ENOENT);
    CHECK_INT(pd_status_from_errno(ENOMEM), PD_ENOMEM);
    CHECK_INT(pd_status_from_errno(EAGAIN), PD_EAGAIN);
    CHECK_INT(pd_status_from_errno(EBADF), PD_EIO);
    for (int s = PD_EINTERNAL; s <= PD_OK; s++)
        CHECK(strcmp(pd_status_str(s), "unknown status") != 0);
    CHECK_STR(pd_status_str(-999), "unknown status");
}

static void test_alloc_injection(void) {
    pd_alloc_fail_after(2);
    void *a = pd_malloc(16), *b = pd_calloc(4, 4), *c = pd_malloc(16);
    CHECK(a && b);
    CHECK(c == NULL);
    CHECK(strstr(pd_error_msg(), "out of memory") != NULL);
    CHECK_INT(pd_alloc_injected_failures(), 1);
    pd_alloc_fail_after(-1);
    pd_free(a);
    pd_free(b);
    pd_free(NULL);
    CHECK(pd_calloc((size_t)-1, 16) == NULL);
    CHECK(strstr(pd_error_msg(), "overflows") != NULL);

    int *arr = NULL;
    size_t cap = 0;
    CHECK_OK(pd_array_grow((void **)&arr, &cap, 100, sizeof(int)));
    CHECK(cap >= 100);
    arr[99] = 7;
    pd_free(arr);
}

static void test_log_levels(void) {
    enum pd_log_level lv;
    CHECK_OK(pd_log_level_parse("WARNING", &lv));
    CHECK_INT(lv, PD_LOG_WARNING);
    CHECK_ERR(pd_log_level_parse("loud", &lv), PD_EINVAL, "'loud'");
    CHECK(strstr(pd_error_msg(), "debug, info, warning, error") != NULL);

    int fds[2];
    CHECK(pipe(fds) == 0);
    pd_log_set_fd(fds[1]);
    pd_log_set_name("unit");
    pd_log_set_level(PD_LOG_WARNING);
    pd_info("hidden %d", 1);
    pd_warn("room=%d two\nlines", 42);
    pd_log_set_fd(-1);
    close(fds[1]);
    char buf[512] = {0};
    ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    CHECK(n > 0);
    CHECK(strstr(buf, "hidden") == NULL);
    CHECK(strstr(buf, "WARN  unit: room=42 two lines\n") != NULL);
    CHECK(strchr(buf, '\n') == buf + n - 1);
}

PD_TEST_MAIN(PD_TEST(test_error_wrap), PD_TEST(test_errno_translation),
             PD_TEST(test_alloc_injection), PD_TEST(test_log_levels))
