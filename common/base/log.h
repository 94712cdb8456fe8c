/*
 * log.h — one line per event on stderr (STYLE.md: logs carry the room/request id so one grep
 * follows a request across all three processes).
 *
 * Line format: "2026-11-21T23:20:01.123Z INFO  prefill: message". The level threshold comes from
 * --log-level; lines under it cost one comparison. Each line is written with a single write(2)
 * so lines from different threads never interleave.
 */
#ifndef PD_LOG_H
#define PD_LOG_H

enum pd_log_level {
    PD_LOG_DEBUG = 0,
    PD_LOG_INFO = 1,
    PD_LOG_WARNING = 2,
    PD_LOG_ERROR = 3,
};

/* Names accepted by --log-level, NULL-terminated: debug, info, warning, error. */
extern const char *const pd_log_level_names[];

/* Process-wide settings; call before starting threads. name tags every line ("prefill"). */
void pd_log_set_name(const char *name);
void pd_log_set_level(enum pd_log_level level);
enum pd_log_level pd_log_get_level(void);

/* "debug" | "info" | "warning" | "error" (also "warn") → level. PD_EINVAL if none matches. */
int pd_log_level_parse(const char *s, enum pd_log_level *out);

/* Redirect lines to fd (tests); -1 restores stderr. */
void pd_log_set_fd(int fd);

void pd_log(enum pd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define pd_debug(...)                                                                              \
    do {                                                                                           \
        if (pd_log_get_level() <= PD_LOG_DEBUG)                                                    \
            pd_log(PD_LOG_DEBUG, __VA_ARGS__);                                                     \
    } while (0)
#define pd_info(...) pd_log(PD_LOG_INFO, __VA_ARGS__)
#define pd_warn(...) pd_log(PD_LOG_WARNING, __VA_ARGS__)
#define pd_error(...) pd_log(PD_LOG_ERROR, __VA_ARGS__)

#endif
