/*
 * log.c — formatting and emission of log lines. The threshold and the process name are set once
 * at start (before threads exist) and only read afterwards, so no lock is needed; each line is
 * assembled in a stack buffer and emitted with one write(2), which keeps lines whole.
 */
#include "common/base/log.h"
#include "common/base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define PD_LOG_LINE_MAX 2048

const char *const pd_log_level_names[] = {"debug", "info", "warning", "error", NULL};
static const char *const level_tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

static enum pd_log_level log_level = PD_LOG_INFO;
static char log_name[32] = "pdserve";
static int log_fd = STDERR_FILENO;

void pd_log_set_name(const char *name) {
    snprintf(log_name, sizeof(log_name), "%s", name);
}

void pd_log_set_level(enum pd_log_level level) {
    log_level = level;
}

enum pd_log_level pd_log_get_level(void) {
    return log_level;
}

void pd_log_set_fd(int fd) {
    log_fd = fd < 0 ? STDERR_FILENO : fd;
}

int pd_log_level_parse(const char *s, enum pd_log_level *out) {
    for (int i = 0; pd_log_level_names[i]; i++) {
        if (strcasecmp(s, pd_log_level_names[i]) == 0) {
            *out = (enum pd_log_level)i;
            return PD_OK;
        }
    }
    if (strcasecmp(s, "warn") == 0) {
        *out = PD_LOG_WARNING;
        return PD_OK;
    }
    return pd_errorf(PD_EINVAL, "unknown log level '%s' (allowed: debug, info, warning, error)", s);
}

void pd_log(enum pd_log_level level, const char *fmt, ...) {
    if (level < log_level)
        return;
    if ((int)level < 0 || level > PD_LOG_ERROR)
        level = PD_LOG_ERROR;
    char line[PD_LOG_LINE_MAX];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_tags[level], log_name);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    /* one event, one line: newlines inside a message would split it for grep */
    for (size_t i = (size_t)n; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[len++] = '\n';
    ssize_t w = write(log_fd, line, len);
    (void)w;
}
