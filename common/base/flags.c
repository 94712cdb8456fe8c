/*
 * flags.c — the table-driven flag parser every binary uses (the daemons' shared server flags are
 * common/server_args.c).
 *
 * The parser never exits and never prints except in pd_flags_usage: errors go back as PD_EINVAL
 * with a message that names the flag and what it accepts, so main() decides how to report them.
 * String values point into argv (which outlives the program's use of them). Numbers are parsed
 * whole ("12abc" is an error, not 12) and range-checked before they reach the destination, so a
 * rejected command line leaves no half-written value behind.
 */
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void pd_flagset_init(struct pd_flagset *fs, const char *prog, const char *summary) {
    memset(fs, 0, sizeof(*fs));
    fs->prog = prog;
    fs->summary = summary;
}

static struct pd_flag *find_flag(struct pd_flagset *fs, const char *name, size_t len) {
    for (int i = 0; i < fs->n; i++) {
        if (strlen(fs->flags[i].name) == len && strncmp(fs->flags[i].name, name, len) == 0)
            return &fs->flags[i];
    }
    return NULL;
}

static void render_default(struct pd_flag *f) {
    char *b = f->default_text;
    size_t n = sizeof(f->default_text);
    switch (f->kind) {
    case PD_FLAG_BOOL: snprintf(b, n, "%s", *(bool *)f->dst ? "true" : "false"); break;
    case PD_FLAG_INT: snprintf(b, n, "%d", *(int *)f->dst); break;
    case PD_FLAG_INT64: snprintf(b, n, "%lld", (long long)*(int64_t *)f->dst); break;
    case PD_FLAG_DOUBLE: snprintf(b, n, "%g", *(double *)f->dst); break;
    case PD_FLAG_STRING: {
        const char *s = *(const char **)f->dst;
        snprintf(b, n, "%s", s ? s : "");
        break;
    }
    case PD_FLAG_CHOICE: snprintf(b, n, "%s", f->choices[*(int *)f->dst]); break;
    }
}

static struct pd_flag *add_flag(struct pd_flagset *fs, const char *name, enum pd_flag_kind kind,
                                void *dst, const char *metavar, const char *help) {
    PD_ASSERT(fs->n < PD_FLAGS_MAX);
    PD_ASSERT(name[0] == '-' && name[1] == '-');
    PD_ASSERT(find_flag(fs, name, strlen(name)) == NULL);
    struct pd_flag *f = &fs->flags[fs->n++];
    memset(f, 0, sizeof(*f));
    f->name = name;
    f->kind = kind;
    f->dst = dst;
    f->metavar = metavar;
    f->help = help;
    f->min = 1;
    f->max = 0; /* min > max: unbounded */
    return f;
}

struct pd_flag *pd_flag_bool(struct pd_flagset *fs, const char *name, bool *dst, const char *help) {
    struct pd_flag *f = add_flag(fs, name, PD_FLAG_BOOL, dst, NULL, help);
    render_default(f);
    return f;
}

static struct pd_flag *add_number(struct pd_flagset *fs, const char *name, enum pd_flag_kind kind,
                                  void *dst, const char *metavar, double min, double max,
                                  const char *help) {
    struct pd_flag *f = add_flag(fs, name, kind, dst, metavar ? metavar : "N", help);
    f->min = min;
    f->max = max;
    render_default(f);
    return f;
}

struct pd_flag *pd_flag_int(struct pd_flagset *fs, const char *name, int *dst, const char *metavar,
                            double min, double max, const char *help) {
    return add_number(fs, name, PD_FLAG_INT, dst, metavar, min, max, help);
}

struct pd_flag *pd_flag_int64(struct pd_flagset *fs, const char *name, int64_t *dst,
                              const char *metavar, double min, double max, const char *help) {
    return add_number(fs, name, PD_FLAG_INT64, dst, metavar, min, max, help);
}

struct pd_flag *pd_flag_double(struct pd_flagset *fs, const char *name, double *dst,
                               const char *metavar, double min, double max, const char *help) {
    return add_number(fs, name, PD_FLAG_DOUBLE, dst, metavar, min, max, help);
}

struct pd_flag *pd_flag_string(struct pd_flagset *fs, const char *name, const char **dst,
                               const char *metavar, const char *help) {
    struct pd_flag *f = add_flag(fs, name, PD_FLAG_STRING, dst, metavar ? metavar : "STR", help);
    render_default(f);
    return f;
}

struct pd_flag *pd_flag_choice(struct pd_flagset *fs, const char *name, int *dst,
                               const char *const *choices, const char *help) {
    struct pd_flag *f = add_flag(fs, name, PD_FLAG_CHOICE, dst, NULL, help);
    f->choices = choices;
    PD_ASSERT(choices && choices[0]);
    int n = 0;
    while (choices[n])
        n++;
    PD_ASSERT(*dst >= 0 && *dst < n);
    render_default(f);
    return f;
}

static bool has_range(const struct pd_flag *f) {
    return f->min <= f->max;
}

/* "a, b, c" into buf */
static void join_choices(const char *const *choices, char *buf, size_t n) {
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; choices[i] && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%s", i ? ", " : "", choices[i]);
}

static void format_range(const struct pd_flag *f, char *buf, size_t n) {
    if (f->kind == PD_FLAG_DOUBLE)
        snprintf(buf, n, "%g..%g", f->min, f->max);
    else
        snprintf(buf, n, "%.0f..%.0f", f->min, f->max);
}

static int set_number(struct pd_flag *f, const char *v) {
    char range[64] = "";
    if (has_range(f))
        format_range(f, range, sizeof(range));
    const char *what = f->kind == PD_FLAG_DOUBLE ? "a number" : "an integer";
    char *end = NULL;
    errno = 0;
    double d;
    long long ll = 0;
    if (f->kind == PD_FLAG_DOUBLE) {
        d = strtod(v, &end);
    } else {
        ll = strtoll(v, &end, 10);
        d = (double)ll;
    }
    if (!*v || end == v || *end != '\0' || errno == ERANGE || isnan(d)) {
        if (range[0])
            return pd_errorf(PD_EINVAL, "%s: '%s' is not %s (allowed: %s)", f->name, v, what,
                             range);
        return pd_errorf(PD_EINVAL, "%s: '%s' is not %s", f->name, v, what);
    }
    if (has_range(f) && (d < f->min || d > f->max))
        return pd_errorf(PD_EINVAL, "%s: %s is out of range (allowed: %s)", f->name, v, range);
    switch (f->kind) {
    case PD_FLAG_INT:
        if (ll < -2147483647LL - 1 || ll > 2147483647LL)
            return pd_errorf(PD_EINVAL, "%s: %s does not fit a 32-bit integer", f->name, v);
        *(int *)f->dst = (int)ll;
        break;
    case PD_FLAG_INT64: *(int64_t *)f->dst = ll; break;
    default: *(double *)f->dst = d; break;
    }
    return PD_OK;
}

static int set_value(struct pd_flag *f, const char *v) {
    switch (f->kind) {
    case PD_FLAG_BOOL:
        if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes")) {
            *(bool *)f->dst = true;
        } else if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no")) {
            *(bool *)f->dst = false;
        } else {
            return pd_errorf(PD_EINVAL, "%s: '%s' is not a boolean (allowed: true, false)", f->name,
                             v);
        }
        return PD_OK;
    case PD_FLAG_INT:
    case PD_FLAG_INT64:
    case PD_FLAG_DOUBLE: return set_number(f, v);
    case PD_FLAG_STRING:
        if (!*v)
            return pd_errorf(PD_EINVAL, "%s: value must not be empty", f->name);
        *(const char **)f->dst = v;
        return PD_OK;
    case PD_FLAG_CHOICE:
        for (int i = 0; f->choices[i]; i++) {
            if (strcmp(f->choices[i], v) == 0) {
                *(int *)f->dst = i;
                return PD_OK;
            }
        }
        char allowed[256];
        join_choices(f->choices, allowed, sizeof(allowed));
        return pd_errorf(PD_EINVAL, "%s: '%s' is not one of %s", f->name, v, allowed);
    }
    return pd_errorf(PD_EINTERNAL, "%s: unknown flag kind", f->name);
}

/* Levenshtein distance, capped: enough to suggest "--model-path" for "--model_path". */
static int edit_distance(const char *a, size_t la, const char *b) {
    size_t lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int best = prev[j - 1] + cost;
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            cur[j] = best;
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

static int unknown_flag(struct pd_flagset *fs, const char *arg, size_t len) {
    const char *best = NULL;
    int best_d = 4;
    for (int i = 0; i < fs->n; i++) {
        int d = edit_distance(arg, len, fs->flags[i].name);
        if (d < best_d) {
            best_d = d;
            best = fs->flags[i].name;
        }
    }
    if (best)
        return pd_errorf(PD_EINVAL, "unknown flag '%.*s' (did you mean '%s'? see %s --help)",
                         (int)len, arg, best, fs->prog);
    return pd_errorf(PD_EINVAL, "unknown flag '%.*s' (%s accepts %d flags; see %s --help)",
                     (int)len, arg, fs->prog, fs->n, fs->prog);
}

int pd_flags_parse(struct pd_flagset *fs, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fs->help = true;
            return PD_OK;
        }
        if (arg[0] != '-' || arg[1] != '-' || arg[2] == '\0')
            return pd_errorf(PD_EINVAL,
                             "unexpected argument '%s' (flags start with --; see %s "
                             "--help)",
                             arg, fs->prog);
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        struct pd_flag *f = find_flag(fs, arg, len);
        if (!f)
            return unknown_flag(fs, arg, len);
        const char *val = eq ? eq + 1 : NULL;
        if (!val && f->kind == PD_FLAG_BOOL) {
            *(bool *)f->dst = true;
        } else {
            if (!val) {
                if (i + 1 >= argc)
                    return pd_errorf(PD_EINVAL, "%s: missing value (expects %s)", f->name,
                                     f->metavar ? f->metavar : "a value");
                val = argv[++i];
            }
            int rc = set_value(f, val);
            if (rc)
                return rc;
        }
        f->seen = true;
    }
    for (int i = 0; i < fs->n; i++) {
        if (fs->flags[i].required && !fs->flags[i].seen)
            return pd_errorf(PD_EINVAL, "%s is required (see %s --help)", fs->flags[i].name,
                             fs->prog);
    }
    return PD_OK;
}

void pd_flags_usage(const struct pd_flagset *fs, FILE *out) {
    fprintf(out, "usage: %s [flags]\n\n%s\n\nflags:\n", fs->prog, fs->summary ? fs->summary : "");
    for (int i = 0; i < fs->n; i++) {
        const struct pd_flag *f = &fs->flags[i];
        char head[96], allowed[256] = "";
        if (f->kind == PD_FLAG_CHOICE) {
            char list[200];
            join_choices(f->choices, list, sizeof(list));
            snprintf(head, sizeof(head), "  %s {%s}", f->name, list);
        } else if (f->kind == PD_FLAG_BOOL) {
            snprintf(head, sizeof(head), "  %s", f->name);
        } else {
            snprintf(head, sizeof(head), "  %s %s", f->name, f->metavar);
        }
        if (has_range(f)) {
            char r[64];
            format_range(f, r, sizeof(r));
            snprintf(allowed, sizeof(allowed), " (%s)", r);
        }
        fprintf(out, "%-40s %s%s", head, f->help ? f->help : "", allowed);
        if (f->required)
            fprintf(out, " [required]");
        else if (f->kind != PD_FLAG_BOOL && f->default_text[0])
            fprintf(out, " [default: %s]", f->default_text);
        fputc('\n', out);
    }
    fprintf(out, "%-40s %s\n", "  --help, -h", "show this help and exit");
}

struct pd_flag *pd_flag_log_level(struct pd_flagset *fs, int *dst) {
    return pd_flag_choice(fs, "--log-level", dst, pd_log_level_names,
                          "lowest level of log lines written to stderr");
}
