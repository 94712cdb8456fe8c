/*
 * plot.c — --plot FILE.png: latency percentiles (TTFT and ITL, p50 and p99) and throughput
 * (output tokens/s, requests/s and goodput) against request rate, one line per series (a
 * series = one server setup, e.g. colocated vs prefill+decode), drawn by gnuplot (Debian
 * gnuplot-nox; scripts/setup.sh installs it) run as a child process on a generated script and
 * data file in a fresh temporary directory. The x axis is categorical (rates in order, inf last)
 * so an "inf" point has a place. gnuplot's own messages go to our stderr; a non-zero exit or a
 * missing PNG is an error.
 */
#include "bench/serving/serving.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/status.h"

#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int pd_bench_plot_check(void) {
    const char *path = getenv("PATH");
    if (path) {
        char *dup = pd_strdup(path);
        if (!dup)
            return pd_errorf(PD_ENOMEM, "PATH");
        for (char *save = NULL, *dir = strtok_r(dup, ":", &save); dir;
             dir = strtok_r(NULL, ":", &save)) {
            char full[4096];
            snprintf(full, sizeof(full), "%s/gnuplot", dir);
            if (access(full, X_OK) == 0) {
                pd_free(dup);
                return PD_OK;
            }
        }
        pd_free(dup);
    }
    return pd_errorf(PD_ENOENT, "--plot needs gnuplot, which is not on PATH: install the Debian "
                                "package gnuplot-nox (scripts/setup.sh does)");
}

static int cmp_rate(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y); /* inf sorts last */
}

static int rate_index(const double *rates, size_t n, double r) {
    for (size_t i = 0; i < n; i++)
        if (rates[i] == r)
            return (int)i;
    return -1;
}

/* The series' label with gnuplot's string quoting made safe. */
static void put_label(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++)
        if (*s != '"' && *s != '\\' && *s != '\n')
            fputc(*s, f);
    fputc('"', f);
}

int pd_bench_plot(const char *png_path, const struct pd_bench_series *series, size_t n_series) {
    int rc = pd_bench_plot_check();
    if (rc)
        return rc;
    size_t n_all = 0;
    for (size_t k = 0; k < n_series; k++)
        n_all += series[k].n;
    double *rates = pd_calloc(n_all + 1, sizeof(double));
    if (!rates)
        return pd_errorf(PD_ENOMEM, "plot rates");
    size_t n_rates = 0;
    for (size_t k = 0; k < n_series; k++)
        for (size_t i = 0; i < series[k].n; i++)
            if (rate_index(rates, n_rates, series[k].s[i].request_rate) < 0)
                rates[n_rates++] = series[k].s[i].request_rate;
    qsort(rates, n_rates, sizeof(double), cmp_rate);

    char dir[] = "/tmp/pdserve-bench-plot-XXXXXX";
    if (!mkdtemp(dir)) {
        pd_free(rates);
        return pd_errorf(pd_status_from_errno(errno), "plot: mkdtemp: %s", strerror(errno));
    }
    char data_path[128], script_path[128];
    snprintf(data_path, sizeof(data_path), "%s/data.txt", dir);
    snprintf(script_path, sizeof(script_path), "%s/plot.gp", dir);
    FILE *d = fopen(data_path, "w");
    FILE *g = d ? fopen(script_path, "w") : NULL;
    if (!d || !g) {
        rc = pd_errorf(PD_EIO, "plot: cannot write in %s: %s", dir, strerror(errno));
        if (d)
            fclose(d);
        goto cleanup;
    }
    /* One data block per series (gnuplot `index k`), rows sorted by rate. */
    for (size_t k = 0; k < n_series; k++) {
        fprintf(d, "# %s\n# x rate ttft_p50 ttft_p99 itl_p50 itl_p99 out_tok_s req_s goodput\n",
                series[k].label);
        for (size_t ri = 0; ri < n_rates; ri++) {
            for (size_t i = 0; i < series[k].n; i++) {
                const struct pd_bench_summary *s = &series[k].s[i];
                if (s->request_rate != rates[ri])
                    continue;
                char rl[32];
                if (isinf(s->request_rate))
                    snprintf(rl, sizeof(rl), "inf");
                else
                    snprintf(rl, sizeof(rl), "%g", s->request_rate);
                fprintf(d, "%zu %s %.4f %.4f %.4f %.4f %.4f %.4f %.4f\n", ri, rl,
                        s->ttft[PD_BENCH_P50], s->ttft[PD_BENCH_P99], s->itl[PD_BENCH_P50],
                        s->itl[PD_BENCH_P99], s->output_throughput, s->request_throughput,
                        s->request_goodput);
                break;
            }
        }
        fputs("\n\n", d);
    }
    fclose(d);

    fprintf(g, "set terminal pngcairo size 1400,1000 noenhanced font 'sans,10'\n");
    fprintf(g, "set output '%s'\n", png_path);
    fprintf(g, "set datafile commentschars '#'\nset grid\nset key top left\n");
    fprintf(g, "set xrange [-0.5:%zu.5]\nset xlabel 'request rate (req/s)'\n",
            n_rates ? n_rates - 1 : 0);
    fprintf(g, "set multiplot layout 2,2 title 'pdserve-bench: latency and throughput vs request "
               "rate'\n");
    static const struct {
        const char *title, *ylabel;
        int col_a, col_b; /* col_b 0 = none */
        const char *a, *b;
    } panels[] = {
        {"Time to first token", "ms", 3, 4, "p50", "p99"},
        {"Inter-token latency", "ms", 5, 6, "p50", "p99"},
        {"Output token throughput", "tokens/s", 7, 0, "", ""},
        {"Request throughput and goodput", "req/s", 8, 9, "throughput", "goodput"},
    };
    for (size_t p = 0; p < 4; p++) {
        fprintf(g, "set title '%s'\nset ylabel '%s'\nplot ", panels[p].title, panels[p].ylabel);
        for (size_t k = 0; k < n_series; k++) {
            fprintf(g,
                    "%s'%s' index %zu using 1:%d:xtic(2) with linespoints lw 2 pt 7 lc %zu dt 1 "
                    "title ",
                    k ? ", " : "", data_path, k, panels[p].col_a, k + 1);
            char t[256];
            snprintf(t, sizeof(t), "%s%s%s", series[k].label, panels[p].a[0] ? " " : "",
                     panels[p].a);
            put_label(g, t);
            if (panels[p].col_b) {
                fprintf(g,
                        ", '%s' index %zu using 1:%d with linespoints lw 2 pt 5 lc %zu dt 2 "
                        "title ",
                        data_path, k, panels[p].col_b, k + 1);
                snprintf(t, sizeof(t), "%s %s", series[k].label, panels[p].b);
                put_label(g, t);
            }
        }
        fputc('\n', g);
    }
    fprintf(g, "unset multiplot\nset output\n");
    if (fclose(g) != 0) {
        rc = pd_errorf(PD_EIO, "plot: writing %s", script_path);
        goto cleanup;
    }

    remove(png_path);
    pid_t pid;
    char *argv[] = {"gnuplot", script_path, NULL};
    int err = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
    if (err) {
        rc = pd_errorf(PD_ENOENT, "plot: cannot run gnuplot: %s", strerror(err));
        goto cleanup;
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    struct stat sb;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        rc = pd_errorf(PD_EIO, "plot: gnuplot failed (exit %d) on %s; its messages are above",
                       WIFEXITED(st) ? WEXITSTATUS(st) : -1, script_path);
    else if (stat(png_path, &sb) != 0 || sb.st_size == 0)
        rc = pd_errorf(PD_EIO, "plot: gnuplot wrote no image at %s", png_path);
cleanup:
    if (rc == PD_OK) { /* keep the script and data for a failed run, to look at */
        remove(data_path);
        remove(script_path);
        rmdir(dir);
    }
    pd_free(rates);
    return rc;
}
