/*
 * file.h — whole-file reads and complete writes with errors that name the path.
 *
 * Small helpers for the loaders (config.json, generation_config.json, safetensors indexes and
 * writers) so that each of them does not grow its own read loop with its own errno handling.
 * errno is translated with pd_status_from_errno, and the message says what was being done to
 * which file ("cannot open /m/config.json: No such file or directory").
 */
#ifndef PD_FILE_H
#define PD_FILE_H

#include <stdbool.h>
#include <stddef.h>

/* Opens path read-only and checks it is a regular file; *fd is open and *size (bytes) set on
 * success (size may be NULL), nothing is open on failure. */
int pd_file_open_regular(const char *path, int *fd, size_t *size);

/* Reads all of path into *out (NUL-terminated, *len bytes without the NUL; caller pd_frees). */
int pd_file_read_all(const char *path, char **out, size_t *len);

/* Writes len bytes to fd, retrying short writes and EINTR; path is only for the message. */
int pd_file_write_fd(int fd, const void *buf, size_t len, const char *path);

/* Writes buf to path (created or truncated, mode 0644). */
int pd_file_write_all(const char *path, const void *buf, size_t len);

/* True when path exists (any type). */
bool pd_file_exists(const char *path);

#endif
