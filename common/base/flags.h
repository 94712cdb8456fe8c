/*
 * flags.h — the command-line parser every pdserve binary uses (the server flags the daemons
 * share are common/server_args.h).
 *
 * A binary builds a pd_flagset (each flag: name, kind, destination, range or choices, help),
 * then calls pd_flags_parse. Accepted spellings: "--name value" and "--name=value"; booleans are
 * "--name" (or "--name=true|false"). An unknown flag, a missing or malformed value, a number out of
 * range or a choice not in the list is rejected with a message that names the flag and says what
 * is allowed (an unknown flag also gets the closest known name). --help / -h sets fs->help; the
 * caller prints pd_flags_usage and exits 0 — only main() exits (STYLE.md rule 5).
 * Defaults are whatever the destination holds when the flag is registered; --help shows them.
 */
#ifndef PD_FLAGS_H
#define PD_FLAGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum pd_flag_kind {
    PD_FLAG_BOOL,
    PD_FLAG_INT,    /* int, range-checked */
    PD_FLAG_INT64,  /* int64_t, range-checked */
    PD_FLAG_DOUBLE, /* double, range-checked */
    PD_FLAG_STRING, /* const char *, points into argv */
    PD_FLAG_CHOICE, /* int index into a NULL-terminated list of names */
};

struct pd_flag {
    const char *name; /* "--model-path" */
    enum pd_flag_kind kind;
    void *dst;
    const char *metavar; /* "DIR", "N" */
    const char *help;
    double min, max; /* inclusive range for numbers */
    const char *const *choices;
    bool required; /* must be given (checked after parsing) */
    bool seen;
    char default_text[48]; /* rendered at registration, for --help */
};

#define PD_FLAGS_MAX 96

struct pd_flagset {
    const char *prog;    /* "pdserve-prefill" */
    const char *summary; /* one paragraph for --help */
    struct pd_flag flags[PD_FLAGS_MAX];
    int n;
    bool help; /* --help or -h was given */
};

void pd_flagset_init(struct pd_flagset *fs, const char *prog, const char *summary);

/* Registration; each returns the flag so the caller may set ->required. Registering more than
 * PD_FLAGS_MAX flags or a name twice is a bug (asserts). */
struct pd_flag *pd_flag_bool(struct pd_flagset *fs, const char *name, bool *dst, const char *help);
struct pd_flag *pd_flag_int(struct pd_flagset *fs, const char *name, int *dst, const char *metavar,
                            double min, double max, const char *help);
struct pd_flag *pd_flag_int64(struct pd_flagset *fs, const char *name, int64_t *dst,
                              const char *metavar, double min, double max, const char *help);
struct pd_flag *pd_flag_double(struct pd_flagset *fs, const char *name, double *dst,
                               const char *metavar, double min, double max, const char *help);
struct pd_flag *pd_flag_string(struct pd_flagset *fs, const char *name, const char **dst,
                               const char *metavar, const char *help);
struct pd_flag *pd_flag_choice(struct pd_flagset *fs, const char *name, int *dst,
                               const char *const *choices, const char *help);

/* Parses argv[1..argc-1]. PD_OK, or PD_EINVAL with pd_error_msg() naming the flag and what it
 * accepts. After --help parsing stops with PD_OK and fs->help set. */
int pd_flags_parse(struct pd_flagset *fs, int argc, char **argv);

/* Writes "usage: prog [flags]", the summary and one entry per flag (metavar, help, range or
 * choices, default, required). */
void pd_flags_usage(const struct pd_flagset *fs, FILE *out);

/* --log-level alone, for tools that take no server flags. dst holds an enum pd_log_level. */
struct pd_flag *pd_flag_log_level(struct pd_flagset *fs, int *dst);

#endif
