/*
 * file.c — whole-file reads and complete writes. The read refuses anything that is not a
 * regular file (a directory named config.json must say so, not read as empty) and reads until
 * EOF rather than trusting st_size, so a file that shrinks meanwhile is still read correctly.
 */
#include "common/base/file.h"
#include "common/base/alloc.h"
#include "common/base/status.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int pd_file_open_regular(const char *path, int *fd_out, size_t *size) {
    struct stat st;
    int rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pd_errorf(pd_status_from_errno(errno), "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        rc = pd_errorf(pd_status_from_errno(errno), "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = pd_errorf(PD_EINVAL, "%s is not a regular file", path);
        goto fail;
    }
    *fd_out = fd;
    if (size)
        *size = (size_t)st.st_size;
    return PD_OK;
fail:
    close(fd);
    return rc;
}

int pd_file_read_all(const char *path, char **out, size_t *len) {
    int rc, fd;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if ((rc = pd_file_open_regular(path, &fd, NULL)) != PD_OK)
        return rc;
    for (;;) {
        if (pd_array_grow((void **)&buf, &cap, n + 4096 + 1, 1) != PD_OK) {
            rc = pd_error_wrap(PD_ENOMEM, "reading %s", path);
            goto fail;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc =
                pd_errorf(pd_status_from_errno(errno), "cannot read %s: %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    close(fd);
    *out = buf;
    *len = n;
    return PD_OK;
fail:
    pd_free(buf);
    close(fd);
    return rc;
}

int pd_file_write_fd(int fd, const void *buf, size_t len, const char *path) {
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return pd_errorf(pd_status_from_errno(errno), "cannot write %s: %s", path,
                             strerror(errno));
        p += w;
        len -= (size_t)w;
    }
    return PD_OK;
}

int pd_file_write_all(const char *path, const void *buf, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return pd_errorf(pd_status_from_errno(errno), "cannot create %s: %s", path,
                         strerror(errno));
    int rc = pd_file_write_fd(fd, buf, len, path);
    if (close(fd) != 0 && rc == PD_OK)
        rc = pd_errorf(pd_status_from_errno(errno), "cannot write %s: %s", path, strerror(errno));
    return rc;
}

bool pd_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
