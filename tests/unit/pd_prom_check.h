/*
 * pd_prom_check.h — a strict reader of the Prometheus text format 0.0.4 for the unit tests of
 * common/metrics and its users: HELP/TYPE before samples, names, label syntax and escapes,
 * numbers, histogram buckets increasing and cumulative ending in +Inf with _count equal to it.
 * check_exposition returns the number of samples, or -1 with chk_err saying what is wrong.
 * check_naming holds pdserve's series to Prometheus naming (promtool check metrics' main rules,
 * for machines without promtool): no colon outside SGLang's own sglang:… names, counters and
 * only counters end in _total, every family has a HELP text.
 */
#ifndef PD_PROM_CHECK_H
#define PD_PROM_CHECK_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct chk_hist { /* the histogram series being read: its labels without le */
    char key[512];
    double last_le;
    double last_count;
    bool open, saw_inf;
    double inf_count;
};

static char chk_err[256];

static int chk_fail(int line, const char *what) {
    snprintf(chk_err, sizeof(chk_err), "line %d: %s", line, what);
    return -1;
}

static bool name_char(char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

static bool parse_value(const char *s, const char *end, double *v) {
    size_t n = (size_t)(end - s);
    if ((n == 4 && !strncmp(s, "+Inf", 4)) || (n == 4 && !strncmp(s, "-Inf", 4)) ||
        (n == 3 && !strncmp(s, "NaN", 3))) {
        *v = s[0] == 'N' ? NAN : s[0] == '+' ? INFINITY : -INFINITY;
        return true;
    }
    char buf[64], *e;
    if (n == 0 || n >= sizeof(buf))
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    *v = strtod(buf, &e);
    return *e == '\0';
}

/* Returns the number of samples, or -1 with chk_err set. */
static int check_exposition(const char *text) {
    char fam[128] = "", type[16] = "";
    char typed[64][128];
    int n_typed = 0, samples = 0, line = 0;
    struct chk_hist h = {0};
    const char *next;
    for (const char *p = text; *p; p = next) {
        line++;
        const char *eol = strchr(p, '\n');
        if (!eol)
            return chk_fail(line, "no newline at the end");
        next = eol + 1;
        if (eol == p)
            return chk_fail(line, "empty line");
        if (!strncmp(p, "# HELP ", 7) || !strncmp(p, "# TYPE ", 7)) {
            bool is_type = p[2] == 'T';
            const char *n = p + 7, *q = n;
            while (q < eol && name_char(*q, q == n))
                q++;
            if (q == n || q >= eol || *q != ' ')
                return chk_fail(line, "bad metric name in a comment");
            char name[128];
            snprintf(name, sizeof(name), "%.*s", (int)(q - n), n);
            if (!is_type) {
                for (const char *c = q + 1; c < eol; c++) {
                    if (*c != '\\')
                        continue;
                    if (c + 1 >= eol || (c[1] != '\\' && c[1] != 'n'))
                        return chk_fail(line, "bad escape in HELP");
                    c++;
                }
                continue;
            }
            for (int i = 0; i < n_typed; i++)
                if (!strcmp(typed[i], name))
                    return chk_fail(line, "TYPE twice for one name");
            if (n_typed < 64)
                snprintf(typed[n_typed++], 128, "%s", name);
            snprintf(fam, sizeof(fam), "%s", name);
            snprintf(type, sizeof(type), "%.*s", (int)(eol - q - 1), q + 1);
            if (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "histogram"))
                return chk_fail(line, "unknown TYPE");
            if (h.open)
                return chk_fail(line, "histogram without _count");
            continue;
        }
        if (*p == '#')
            return chk_fail(line, "unknown comment");
        /* a sample */
        const char *q = p;
        while (q < eol && name_char(*q, q == p))
            q++;
        char name[160];
        snprintf(name, sizeof(name), "%.*s", (int)(q - p), p);
        if (!fam[0])
            return chk_fail(line, "sample before any TYPE");
        const char *suffix = "";
        size_t fl = strlen(fam);
        if (strncmp(name, fam, fl) != 0)
            return chk_fail(line, "sample of another family than the last TYPE");
        suffix = name + fl;
        bool hist = !strcmp(type, "histogram");
        if (hist ? strcmp(suffix, "_bucket") && strcmp(suffix, "_sum") && strcmp(suffix, "_count")
                 : *suffix != '\0')
            return chk_fail(line, "sample name does not fit its family's type");
        char key[512] = "";
        size_t kl = 0;
        double le = NAN;
        bool has_le = false;
        if (q < eol && *q == '{') {
            q++;
            while (q < eol && *q != '}') {
                const char *ln = q;
                while (q < eol && name_char(*q, q == ln) && *q != ':')
                    q++;
                if (q == ln || q + 1 >= eol || q[0] != '=' || q[1] != '"')
                    return chk_fail(line, "bad label");
                char lname[64];
                snprintf(lname, sizeof(lname), "%.*s", (int)(q - ln), ln);
                q += 2;
                char val[256];
                size_t vl = 0;
                while (q < eol && *q != '"') {
                    char c = *q++;
                    if (c == '\\') {
                        if (q >= eol || (*q != '\\' && *q != '"' && *q != 'n'))
                            return chk_fail(line, "bad escape in a label value");
                        c = *q == 'n' ? '\n' : *q;
                        q++;
                    }
                    if (vl + 1 < sizeof(val))
                        val[vl++] = c;
                }
                val[vl] = '\0';
                if (q >= eol)
                    return chk_fail(line, "unterminated label value");
                q++;
                if (!strcmp(lname, "le")) {
                    if (!parse_value(val, val + vl, &le))
                        return chk_fail(line, "le is not a number");
                    has_le = true;
                } else {
                    kl += (size_t)snprintf(key + kl, sizeof(key) - kl, "%s=%s,", lname, val);
                    if (kl >= sizeof(key))
                        return chk_fail(line, "labels too long for the checker");
                }
                if (q < eol && *q == ',')
                    q++;
                else if (q < eol && *q != '}')
                    return chk_fail(line, "labels not separated by commas");
            }
            if (q >= eol)
                return chk_fail(line, "unterminated labels");
            q++;
        }
        if (q >= eol || *q != ' ')
            return chk_fail(line, "no space before the value");
        double v;
        if (!parse_value(q + 1, eol, &v))
            return chk_fail(line, "value is not a number");
        if (!strcmp(type, "counter") && !(v >= 0))
            return chk_fail(line, "negative counter");
        if (hist && !strcmp(suffix, "_bucket")) {
            if (!has_le)
                return chk_fail(line, "bucket without le");
            if (!h.open || strcmp(h.key, key)) {
                if (h.open)
                    return chk_fail(line, "new bucket series before _count of the last");
                h = (struct chk_hist){.open = true, .last_le = -INFINITY, .last_count = 0};
                snprintf(h.key, sizeof(h.key), "%s", key);
            }
            if (!(le > h.last_le) || h.saw_inf)
                return chk_fail(line, "le not increasing");
            if (v < h.last_count)
                return chk_fail(line, "bucket counts not cumulative");
            h.last_le = le;
            h.last_count = v;
            if (isinf(le)) {
                h.saw_inf = true;
                h.inf_count = v;
            }
        } else if (hist) {
            if (has_le)
                return chk_fail(line, "le on _sum/_count");
            if (!h.open || strcmp(h.key, key) || !h.saw_inf)
                return chk_fail(line, "_sum/_count without a full bucket list (+Inf last)");
            if (!strcmp(suffix, "_count")) {
                if (v != h.inf_count)
                    return chk_fail(line, "_count differs from the +Inf bucket");
                h.open = false;
            }
        } else if (has_le) {
            return chk_fail(line, "le on a non-histogram");
        }
        samples++;
    }
    if (h.open)
        return chk_fail(line, "histogram without _count at the end");
    return samples;
}

/* The names of text's families follow Prometheus naming (see the top): 0, or -1 with chk_err. */
static inline int check_naming(const char *text) {
    char helped[128][128];
    int n_helped = 0, line = 0;
    for (const char *p = text; *p; p = strchr(p, '\n') + 1) {
        line++;
        const char *eol = strchr(p, '\n');
        if (!eol)
            return chk_fail(line, "no newline at the end");
        bool help = !strncmp(p, "# HELP ", 7), type = !strncmp(p, "# TYPE ", 7);
        if (!help && !type)
            continue;
        const char *n = p + 7, *sp = memchr(n, ' ', (size_t)(eol - n));
        if (!sp)
            return chk_fail(line, "no space after the name");
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)(sp - n), n);
        if (help) {
            if (sp + 1 >= eol)
                return chk_fail(line, "empty HELP text");
            if (n_helped < 128)
                snprintf(helped[n_helped++], sizeof(helped[0]), "%s", name);
            continue;
        }
        bool found = false;
        for (int i = 0; i < n_helped && !found; i++)
            found = !strcmp(helped[i], name);
        if (!found)
            return chk_fail(line, "a family without HELP");
        if (strchr(name, ':') && strncmp(name, "sglang:", 7) != 0)
            return chk_fail(line, "a colon in a name that is not SGLang's (sglang:...)");
        size_t nl = strlen(name);
        bool total = nl > 6 && !strcmp(name + nl - 6, "_total");
        bool counter = (size_t)(eol - sp - 1) == 7 && !strncmp(sp + 1, "counter", 7);
        if (counter != total)
            return chk_fail(line, counter ? "a counter without _total"
                                          : "_total on a family that is not a counter");
    }
    return 0;
}

/* check_naming's verdict, printing what is wrong. */
static inline bool naming_ok(const char *text) {
    if (check_naming(text) == 0)
        return true;
    fprintf(stderr, "metric naming: %s\n", chk_err);
    return false;
}

#endif
