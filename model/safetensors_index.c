/*
 * safetensors_index.c — shard planning, shard names and the index file of safetensors_index.h.
 * The index text is assembled in memory and written in one call, so a failure never leaves half
 * an index behind that a reader could mistake for a checkpoint.
 */
#include "model/safetensors_index.h"
#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/status.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pd_safetensors_shard_plan(const uint64_t *nbytes, size_t n, uint64_t max_shard_bytes,
                              int *shard_of) {
    int n_shards = 0, cur = -1; /* cur: shard id of the open shard, assigned when it closes */
    size_t cur_first = 0;       /* first tensor that may belong to the open shard */
    uint64_t cur_bytes = 0;
    bool cur_used = false;
    for (size_t i = 0; i < n; i++) {
        if (max_shard_bytes && nbytes[i] > max_shard_bytes) {
            shard_of[i] = n_shards++; /* its own shard, before the open one closes */
            continue;
        }
        if (max_shard_bytes && cur_used && nbytes[i] > max_shard_bytes - cur_bytes) {
            cur = n_shards++;
            for (size_t j = cur_first; j < i; j++)
                if (shard_of[j] == -1)
                    shard_of[j] = cur;
            cur_first = i;
            cur_bytes = 0;
        }
        shard_of[i] = -1; /* open shard */
        cur_bytes += nbytes[i];
        cur_used = true;
    }
    if (cur_used) {
        cur = n_shards++;
        for (size_t j = cur_first; j < n; j++)
            if (shard_of[j] == -1)
                shard_of[j] = cur;
    }
    return n_shards;
}

void pd_safetensors_shard_name(int i, int n, char *buf, size_t cap) {
    if (n == 1)
        snprintf(buf, cap, "%s", PD_SAFETENSORS_SINGLE_NAME);
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i + 1, n);
}

struct named {
    const char *name;
    int shard;
};

static int named_cmp(const void *a, const void *b) {
    return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

struct text {
    char *p;
    size_t len, cap;
    int rc;
};

static void text_add(struct text *t, const char *s, size_t n) {
    if (t->rc == PD_OK &&
        (t->rc = pd_array_grow((void **)&t->p, &t->cap, t->len + n + 1, 1)) == PD_OK) {
        memcpy(t->p + t->len, s, n);
        t->len += n;
    }
}

/* A JSON string as Python's json.dumps spells it (ASCII escapes for controls and non-ASCII). */
static void text_json_string(struct text *t, const char *s) {
    text_add(t, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            text_add(t, esc, 2);
        } else if (c < 0x20 || c >= 0x7F) {
            snprintf(esc, sizeof(esc), "\\u%04x", c); /* tensor names are ASCII in practice */
            text_add(t, esc, 6);
        } else {
            text_add(t, (const char *)&c, 1);
        }
    }
    text_add(t, "\"", 1);
}

int pd_safetensors_index_write(const char *dir, const char *const *names, const int *shard_of,
                               size_t n, int n_shards, uint64_t total_bytes) {
    struct text t = {0};
    char line[96], *path = NULL;
    struct named *sorted = pd_calloc(n ? n : 1, sizeof(*sorted));
    if (!sorted)
        return pd_error_wrap(PD_ENOMEM, "writing %s/%s", dir, PD_SAFETENSORS_INDEX_NAME);
    for (size_t i = 0; i < n; i++)
        sorted[i] = (struct named){names[i], shard_of[i]};
    qsort(sorted, n, sizeof(*sorted), named_cmp);

    int len =
        snprintf(line, sizeof(line),
                 "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n", total_bytes);
    text_add(&t, line, (size_t)len);
    text_add(&t, "  \"weight_map\": {\n", 18);
    for (size_t i = 0; i < n; i++) {
        char file[64];
        PD_ASSERT(sorted[i].shard >= 0 && sorted[i].shard < n_shards);
        pd_safetensors_shard_name(sorted[i].shard, n_shards, file, sizeof(file));
        text_add(&t, "    ", 4);
        text_json_string(&t, sorted[i].name);
        len = snprintf(line, sizeof(line), ": \"%s\"%s\n", file, i + 1 < n ? "," : "");
        text_add(&t, line, (size_t)len);
    }
    text_add(&t, "  }\n}\n", 6);
    int rc = t.rc;
    size_t plen = strlen(dir) + sizeof(PD_SAFETENSORS_INDEX_NAME) + 1;
    if (rc == PD_OK && !(path = pd_malloc(plen)))
        rc = PD_ENOMEM;
    if (rc == PD_OK) {
        snprintf(path, plen, "%s/%s", dir, PD_SAFETENSORS_INDEX_NAME);
        rc = pd_file_write_all(path, t.p, t.len);
    } else {
        pd_error_wrap(rc, "writing %s/%s", dir, PD_SAFETENSORS_INDEX_NAME);
    }
    pd_free(path);
    pd_free(t.p);
    pd_free(sorted);
    return rc;
}
