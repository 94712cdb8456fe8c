/*
 * safetensors.c — memory-mapped safetensors checkpoints (single file or sharded) and a writer
 * that produces the same bytes layout as the Hugging Face library.
 *
 * Reading trusts nothing in a file: the header length, every offset and every shape is checked
 * against the mapping before a pointer is formed, so a truncated or hostile file gives an error
 * naming the file and tensor, never an out-of-bounds read. Each shard is mapped once, read-only
 * and MAP_PRIVATE; views point into the mappings and live until pd_checkpoint_free. Views are
 * kept sorted by name so lookups are a binary search and duplicates are adjacent.
 *
 * Writing follows safetensors' serialize (8-byte little-endian length, JSON header padded with
 * spaces to a multiple of 8, "__metadata__" {"format": "pt"}, tensors back to back) and
 * huggingface_hub's shard planning as used by transformers' save_pretrained. A failed write
 * removes the partial file.
 */
#include "model/safetensors.h"
#include "model/safetensors_index.h"
#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_NAME PD_SAFETENSORS_INDEX_NAME
#define SINGLE_NAME PD_SAFETENSORS_SINGLE_NAME
/* The Hugging Face reader refuses headers over 100 MB; so do we, before parsing one. */
#define MAX_HEADER_BYTES (100u << 20)
/* Integers in a header are read through a double: only those below 2^53 are exact. */
#define MAX_JSON_INT 9007199254740992.0

struct shard {
    char *path;
    const uint8_t *map; /* whole file, read-only; NULL for an empty mapping */
    size_t size;        /* bytes */
};

struct pd_checkpoint {
    char *where; /* dir or file, for messages */
    struct shard *shards;
    size_t n_shards, cap_shards;
    struct pd_tensor_view *t; /* sorted by name once opening succeeded */
    size_t n, cap;
};

/* ---- a growable string for the writer ---- */

struct sbuf {
    char *p;
    size_t len, cap;
    int rc; /* first failure; later appends do nothing */
};

static void sb_append(struct sbuf *b, const char *s, size_t n) {
    if (b->rc != PD_OK)
        return;
    if ((b->rc = pd_array_grow((void **)&b->p, &b->cap, b->len + n + 1, 1)) != PD_OK)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    PD_ASSERT(n >= 0 && (size_t)n < sizeof(tmp)); /* only short numeric pieces go through here */
    sb_append(b, tmp, (size_t)n);
}

/* A JSON string literal (quotes included); names are UTF-8 and pass through unchanged. */
static void sb_json_string(struct sbuf *b, const char *s) {
    sb_append(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            sb_append(b, esc, 2);
        } else if (*p < 0x20) {
            sb_printf(b, "\\u%04x", *p);
        } else {
            sb_append(b, (const char *)p, 1);
        }
    }
    sb_append(b, "\"", 1);
}

/* ---- reading ---- */

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + 1 + strlen(name) + 1;
    char *p = pd_malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d != floor(d) || d > MAX_JSON_INT)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

static struct shard *shard_add(struct pd_checkpoint *ck, const char *path, size_t *idx) {
    if (pd_array_grow((void **)&ck->shards, &ck->cap_shards, ck->n_shards + 1,
                      sizeof(*ck->shards)) != PD_OK)
        return NULL;
    struct shard *s = &ck->shards[ck->n_shards];
    memset(s, 0, sizeof(*s));
    if (!(s->path = pd_strdup(path)))
        return NULL;
    *idx = ck->n_shards++;
    return s;
}

/* Maps path as a new shard of ck. */
static int shard_map(struct pd_checkpoint *ck, const char *path, size_t *idx) {
    int rc, fd;
    size_t fsize;
    if ((rc = pd_file_open_regular(path, &fd, &fsize)) != PD_OK)
        return rc;
    if (fsize < 8) {
        rc = pd_errorf(PD_EFORMAT,
                       "%s: file is %lld bytes, too short for a safetensors header (truncated?)",
                       path, (long long)fsize);
        goto fail;
    }
    struct shard *s = shard_add(ck, path, idx);
    if (!s) {
        rc = pd_error_wrap(PD_ENOMEM, "opening %s", path);
        goto fail;
    }
    void *m = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = pd_errorf(pd_status_from_errno(errno), "cannot map %s: %s", path, strerror(errno));
        goto fail; /* the shard stays listed with map == NULL; pd_checkpoint_free copes */
    }
    s->map = m;
    s->size = fsize;
    close(fd);
    return PD_OK;
fail:
    close(fd);
    return rc;
}

/* One header entry → a view appended to ck. */
static int parse_entry(struct pd_checkpoint *ck, size_t si, const cJSON *e, const uint8_t *data,
                       uint64_t data_len) {
    const char *path = ck->shards[si].path, *name = e->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    struct pd_tensor_view v;
    uint64_t begin, end, count = 1;
    int rc;

    memset(&v, 0, sizeof(v));
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return pd_errorf(PD_EFORMAT,
                         "%s: tensor '%s' needs an object with 'dtype' (string), 'shape' and "
                         "'data_offsets' (lists)",
                         path, name);
    if (pd_dtype_parse(dt->valuestring, &v.dtype) != PD_OK)
        return pd_errorf(PD_EUNSUPPORTED,
                         "%s: tensor '%s' has dtype '%s', which is not supported (supported: F32, "
                         "F16, BF16)",
                         path, name, dt->valuestring);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > PD_TENSOR_MAX_DIMS)
        return pd_errorf(PD_EUNSUPPORTED, "%s: tensor '%s' has %d dimensions, at most %d supported",
                         path, name, ndim, PD_TENSOR_MAX_DIMS);
    v.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        uint64_t d;
        if (!json_uint(cJSON_GetArrayItem(shape, i), &d))
            return pd_errorf(PD_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                             path, name, i);
        v.shape[i] = (int64_t)d;
        if (d && count > UINT64_MAX / d)
            return pd_errorf(PD_EFORMAT, "%s: tensor '%s': shape overflows", path, name);
        count *= d;
    }
    if (cJSON_GetArraySize(offs) != 2 || !json_uint(cJSON_GetArrayItem(offs, 0), &begin) ||
        !json_uint(cJSON_GetArrayItem(offs, 1), &end))
        return pd_errorf(PD_EFORMAT,
                         "%s: tensor '%s': data_offsets must be two non-negative integers", path,
                         name);
    if (begin > end)
        return pd_errorf(PD_EFORMAT,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin after end",
                         path, name, begin, end);
    if (end > data_len)
        return pd_errorf(PD_EFORMAT,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] run past the data area (%" PRIu64 " bytes; file truncated?)",
                         path, name, begin, end, data_len);
    uint64_t size = pd_dtype_size(v.dtype);
    if (count > UINT64_MAX / size || count * size != end - begin)
        return pd_errorf(PD_EFORMAT,
                         "%s: tensor '%s': %" PRIu64 " bytes of data, but shape and dtype %s "
                         "need %" PRIu64,
                         path, name, end - begin, pd_dtype_name(v.dtype), count * size);
    v.data = data + begin;
    v.nbytes = (size_t)(end - begin);
    v.shard = (int)si;
    if ((rc = pd_array_grow((void **)&ck->t, &ck->cap, ck->n + 1, sizeof(*ck->t))) != PD_OK)
        return pd_error_wrap(rc, "%s", path);
    if (!(v.name = pd_strdup(name)))
        return pd_error_wrap(PD_ENOMEM, "%s", path);
    ck->t[ck->n++] = v;
    return PD_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const struct pd_tensor_view *x = *(const struct pd_tensor_view *const *)a;
    const struct pd_tensor_view *y = *(const struct pd_tensor_view *const *)b;
    const uint8_t *xb = x->data, *yb = y->data;
    if (xb != yb)
        return xb < yb ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Views first..ck->n all belong to one shard: no two may share a byte. */
static int check_overlap(struct pd_checkpoint *ck, size_t first) {
    size_t n = ck->n - first;
    if (n < 2)
        return PD_OK;
    const struct pd_tensor_view **byoff = pd_calloc(n, sizeof(*byoff));
    if (!byoff)
        return pd_error_wrap(PD_ENOMEM, "%s", ck->shards[ck->t[first].shard].path);
    for (size_t i = 0; i < n; i++)
        byoff[i] = &ck->t[first + i];
    qsort(byoff, n, sizeof(*byoff), cmp_by_offset);
    int rc = PD_OK;
    const struct pd_tensor_view *prev = byoff[0];
    for (size_t i = 1; i < n; i++) {
        const struct pd_tensor_view *cur = byoff[i];
        if ((const uint8_t *)cur->data < (const uint8_t *)prev->data + prev->nbytes) {
            rc = pd_errorf(PD_EFORMAT, "%s: tensors '%s' and '%s' overlap in the data area",
                           ck->shards[cur->shard].path, prev->name, cur->name);
            break;
        }
        if (cur->nbytes)
            prev = cur;
    }
    pd_free(byoff);
    return rc;
}

/* Parses shard si's header and appends its tensors to ck. */
static int shard_parse(struct pd_checkpoint *ck, size_t si) {
    const struct shard *s = &ck->shards[si];
    uint64_t hlen = 0;
    size_t first = ck->n;
    int rc = PD_OK;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | s->map[i];
    if (hlen > s->size - 8)
        return pd_errorf(PD_EFORMAT,
                         "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes; "
                         "truncated or not a safetensors file?)",
                         s->path, hlen, s->size);
    if (hlen > MAX_HEADER_BYTES)
        return pd_errorf(PD_EFORMAT, "%s: header length %" PRIu64 " is over the %u byte limit",
                         s->path, hlen, MAX_HEADER_BYTES);
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)s->map + 8, (size_t)hlen, NULL, 0);
    if (!root)
        return pd_errorf(PD_EFORMAT, "%s: header is not valid JSON (not a safetensors file?)",
                         s->path);
    if (!cJSON_IsObject(root)) {
        rc = pd_errorf(PD_EFORMAT, "%s: header is not a JSON object", s->path);
        goto out;
    }
    const uint8_t *data = s->map + 8 + hlen;
    uint64_t data_len = s->size - 8 - hlen;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        if ((rc = parse_entry(ck, si, e, data, data_len)) != PD_OK)
            goto out;
    }
    rc = check_overlap(ck, first);
out:
    cJSON_Delete(root);
    return rc;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const struct pd_tensor_view *)a)->name,
                  ((const struct pd_tensor_view *)b)->name);
}

/* Sorts views by name; a name twice (within a file or across shards) is an error. */
static int sort_and_check_dups(struct pd_checkpoint *ck) {
    if (ck->n > 1)
        qsort(ck->t, ck->n, sizeof(*ck->t), cmp_by_name);
    for (size_t i = 1; i < ck->n; i++) {
        if (strcmp(ck->t[i - 1].name, ck->t[i].name) == 0) {
            const char *a = ck->shards[ck->t[i - 1].shard].path;
            const char *b = ck->shards[ck->t[i].shard].path;
            if (a == b)
                return pd_errorf(PD_EFORMAT, "%s: tensor '%s' appears twice", a, ck->t[i].name);
            return pd_errorf(PD_EFORMAT, "tensor '%s' appears in both %s and %s", ck->t[i].name, a,
                             b);
        }
    }
    return PD_OK;
}

static struct pd_checkpoint *checkpoint_new(const char *where) {
    struct pd_checkpoint *ck = pd_calloc(1, sizeof(*ck));
    if (ck && !(ck->where = pd_strdup(where))) {
        pd_free(ck);
        ck = NULL;
    }
    return ck;
}

void pd_checkpoint_free(struct pd_checkpoint *ck) {
    if (!ck)
        return;
    for (size_t i = 0; i < ck->n; i++)
        pd_free((void *)ck->t[i].name);
    for (size_t i = 0; i < ck->n_shards; i++) {
        if (ck->shards[i].map)
            munmap((void *)ck->shards[i].map, ck->shards[i].size);
        pd_free(ck->shards[i].path);
    }
    pd_free(ck->t);
    pd_free(ck->shards);
    pd_free(ck->where);
    pd_free(ck);
}

int pd_checkpoint_open_file(const char *path, struct pd_checkpoint **out) {
    size_t si;
    int rc;
    struct pd_checkpoint *ck = checkpoint_new(path);
    if (!ck)
        return pd_error_wrap(PD_ENOMEM, "opening %s", path);
    if ((rc = shard_map(ck, path, &si)) != PD_OK || (rc = shard_parse(ck, si)) != PD_OK ||
        (rc = sort_and_check_dups(ck)) != PD_OK)
        goto fail;
    *out = ck;
    return PD_OK;
fail:
    pd_checkpoint_free(ck);
    return rc;
}

/* Shard file names come from a file we do not control: keep them inside dir. */
static int shard_name_ok(const char *name) {
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int open_sharded(struct pd_checkpoint *ck, const char *dir, const char *index_path) {
    char *text = NULL, *spath = NULL;
    const char **names = NULL; /* shard file names, into root */
    size_t len, n_names = 0;
    cJSON *root = NULL;
    const cJSON *wm, *e;
    int rc;
    if ((rc = pd_file_read_all(index_path, &text, &len)) != PD_OK)
        return rc;
    if (!(root = cJSON_ParseWithLengthOpts(text, len, NULL, 0)) || !cJSON_IsObject(root)) {
        rc = pd_errorf(PD_EFORMAT, "%s: not a JSON object", index_path);
        goto out;
    }
    wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        rc = pd_errorf(PD_EFORMAT, "%s: missing 'weight_map' object", index_path);
        goto out;
    }
    /* map every shard named, once, in file name order (so model-00001-of-N is shard 0) */
    int n_entries = cJSON_GetArraySize(wm);
    if (!(names = pd_calloc((size_t)n_entries, sizeof(*names)))) {
        rc = pd_error_wrap(PD_ENOMEM, "%s", index_path);
        goto out;
    }
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring)) {
            rc = pd_errorf(PD_EFORMAT, "%s: weight_map entry '%s' must name a file in %s",
                           index_path, e->string, dir);
            goto out;
        }
        names[n_names++] = e->valuestring;
    }
    if (n_names > 1)
        qsort(names, n_names, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n_names; i++) {
        size_t si;
        if (i > 0 && strcmp(names[i - 1], names[i]) == 0)
            continue;
        if (!(spath = path_join(dir, names[i]))) {
            rc = pd_error_wrap(PD_ENOMEM, "%s", index_path);
            goto out;
        }
        if ((rc = shard_map(ck, spath, &si)) != PD_OK || (rc = shard_parse(ck, si)) != PD_OK) {
            rc = pd_error_wrap(rc, "%s: shard '%s'", index_path, names[i]);
            goto out;
        }
        pd_free(spath);
        spath = NULL;
    }
    if ((rc = sort_and_check_dups(ck)) != PD_OK)
        goto out;
    /* the index and the shards must agree both ways */
    cJSON_ArrayForEach(e, wm) {
        const struct pd_tensor_view *v = pd_checkpoint_find(ck, e->string);
        if (!v) {
            rc = pd_errorf(PD_ENOENT, "%s: tensor '%s' is mapped to %s, which does not contain it",
                           index_path, e->string, e->valuestring);
            goto out;
        }
        if (strcmp(base_name(ck->shards[v->shard].path), e->valuestring) != 0) {
            rc =
                pd_errorf(PD_EFORMAT, "%s: tensor '%s' is mapped to %s but found in %s", index_path,
                          e->string, e->valuestring, base_name(ck->shards[v->shard].path));
            goto out;
        }
    }
    for (size_t i = 0; i < ck->n; i++) {
        if (!cJSON_GetObjectItemCaseSensitive(wm, ck->t[i].name)) {
            rc = pd_errorf(PD_EFORMAT, "%s: %s holds tensor '%s', which weight_map does not list",
                           index_path, base_name(ck->shards[ck->t[i].shard].path), ck->t[i].name);
            goto out;
        }
    }
    rc = PD_OK;
out:
    pd_free(names);
    pd_free(spath);
    cJSON_Delete(root);
    pd_free(text);
    return rc;
}

int pd_checkpoint_open(const char *dir, struct pd_checkpoint **out) {
    struct pd_checkpoint *ck = NULL;
    char *index = path_join(dir, INDEX_NAME), *single = path_join(dir, SINGLE_NAME);
    int rc;
    if (!index || !single) {
        rc = pd_error_wrap(PD_ENOMEM, "opening checkpoint %s", dir);
        goto out;
    }
    if (pd_file_exists(index)) {
        if (!(ck = checkpoint_new(dir))) {
            rc = pd_error_wrap(PD_ENOMEM, "opening checkpoint %s", dir);
            goto out;
        }
        if ((rc = open_sharded(ck, dir, index)) != PD_OK) {
            pd_checkpoint_free(ck);
            goto out;
        }
        *out = ck;
    } else if (pd_file_exists(single)) {
        rc = pd_checkpoint_open_file(single, out);
    } else {
        rc = pd_errorf(PD_ENOENT, "%s: neither %s nor %s found", dir, SINGLE_NAME, INDEX_NAME);
    }
out:
    pd_free(index);
    pd_free(single);
    return rc;
}

size_t pd_checkpoint_count(const struct pd_checkpoint *ck) {
    return ck->n;
}

const struct pd_tensor_view *pd_checkpoint_at(const struct pd_checkpoint *ck, size_t i) {
    return i < ck->n ? &ck->t[i] : NULL;
}

const struct pd_tensor_view *pd_checkpoint_find(const struct pd_checkpoint *ck, const char *name) {
    size_t lo = 0, hi = ck->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->t[mid].name, name);
        if (c == 0)
            return &ck->t[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

int pd_checkpoint_validate(const struct pd_checkpoint *ck, const struct pd_model_config *cfg) {
    struct pd_tensor_spec *specs;
    size_t n;
    int rc = pd_model_tensor_specs(cfg, &specs, &n);
    if (rc != PD_OK)
        return rc;
    for (size_t i = 0; i < n && rc == PD_OK; i++) {
        const struct pd_tensor_spec *s = &specs[i];
        const struct pd_tensor_view *v = pd_checkpoint_find(ck, s->name);
        char have[96], want[96];
        if (!v) {
            rc = pd_errorf(PD_ENOENT, "tensor '%s' missing from checkpoint %s", s->name, ck->where);
            break;
        }
        if (v->dtype != PD_DTYPE_F32 && v->dtype != PD_DTYPE_F16 && v->dtype != PD_DTYPE_BF16) {
            rc = pd_errorf(PD_EUNSUPPORTED,
                           "tensor '%s' has dtype %s, not a float type (F32, F16, BF16)", s->name,
                           pd_dtype_name(v->dtype));
            break;
        }
        bool same = v->ndim == s->ndim;
        for (int d = 0; same && d < s->ndim; d++)
            same = v->shape[d] == s->shape[d];
        if (!same) {
            format_shape(have, sizeof(have), v->ndim, v->shape);
            format_shape(want, sizeof(want), s->ndim, s->shape);
            rc = pd_errorf(PD_EMISMATCH, "tensor '%s' has shape %s, config implies %s", s->name,
                           have, want);
        }
    }
    pd_free(specs);
    return rc;
}

/* ---- writing ---- */

static uint64_t tensor_bytes(const struct pd_tensor_write *w) {
    uint64_t b = (unsigned)w->dtype <= PD_DTYPE_BF16 ? pd_dtype_size(w->dtype) : 0;
    for (int d = 0; d < w->ndim && d < PD_TENSOR_MAX_DIMS; d++)
        b *= w->shape[d] > 0 ? (uint64_t)w->shape[d] : 0;
    return b;
}

/* Data goes out widest element first (F32, then F16/BF16), each class in the given order, as
 * safetensors' serialize does: with the header padded to 8 bytes, every tensor then starts at a
 * multiple of its element size, so readers may use the mapping as float/uint16 arrays. */
static const size_t data_classes[] = {4, 2};

/* Validates t[0..n) and returns the header (padded) and the data size. */
static int build_header(const char *path, const struct pd_tensor_write *t, size_t n,
                        struct sbuf *hdr, uint64_t *data_bytes) {
    uint64_t total = 0, wide = 0; /* bytes: all, and those of 4-byte tensors */
    for (size_t i = 0; i < n; i++) {
        const struct pd_tensor_write *w = &t[i];
        uint64_t count = 1;
        if (!w->name || !w->name[0] || strcmp(w->name, "__metadata__") == 0)
            return pd_errorf(PD_EINVAL, "writing %s: tensor %zu has no usable name", path, i);
        if ((unsigned)w->dtype > PD_DTYPE_BF16 || w->ndim < 0 || w->ndim > PD_TENSOR_MAX_DIMS)
            return pd_errorf(PD_EINVAL, "writing %s: tensor '%s' has a bad dtype or ndim (%d)",
                             path, w->name, w->ndim);
        for (size_t j = 0; j < i; j++)
            if (strcmp(t[j].name, w->name) == 0)
                return pd_errorf(PD_EINVAL, "writing %s: tensor '%s' given twice", path, w->name);
        for (int d = 0; d < w->ndim; d++) {
            if (w->shape[d] < 0)
                return pd_errorf(PD_EINVAL, "writing %s: tensor '%s' has a negative dimension",
                                 path, w->name);
            uint64_t dim = (uint64_t)w->shape[d];
            if (dim && count > (1ull << 50) / dim)
                return pd_errorf(PD_ERANGE, "writing %s: tensor '%s' is too large", path, w->name);
            count *= dim;
        }
        uint64_t bytes = count * pd_dtype_size(w->dtype);
        if (bytes && !w->data)
            return pd_errorf(PD_EINVAL, "writing %s: tensor '%s' has no data", path, w->name);
        total += bytes;
        if (pd_dtype_size(w->dtype) == 4)
            wide += bytes;
        if (total > (1ull << 53))
            return pd_errorf(PD_ERANGE, "writing %s: more than 2^53 bytes of tensors", path);
    }
    uint64_t off_wide = 0, off_narrow = wide;
    sb_append(hdr, "{\"__metadata__\":{\"format\":\"pt\"}", 31);
    for (size_t i = 0; i < n; i++) {
        const struct pd_tensor_write *w = &t[i];
        uint64_t bytes = tensor_bytes(w);
        uint64_t *off = pd_dtype_size(w->dtype) == 4 ? &off_wide : &off_narrow;
        sb_append(hdr, ",", 1);
        sb_json_string(hdr, w->name);
        sb_printf(hdr, ":{\"dtype\":\"%s\",\"shape\":[", pd_dtype_name(w->dtype));
        for (int d = 0; d < w->ndim; d++)
            sb_printf(hdr, "%s%" PRId64, d ? "," : "", w->shape[d]);
        sb_printf(hdr, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", *off, *off + bytes);
        *off += bytes;
    }
    sb_append(hdr, "}", 1);
    while (hdr->rc == PD_OK && hdr->len % 8)
        sb_append(hdr, " ", 1);
    if (hdr->rc != PD_OK)
        return pd_error_wrap(hdr->rc, "writing %s", path);
    *data_bytes = total;
    return PD_OK;
}

int pd_safetensors_write(const char *path, const struct pd_tensor_write *t, size_t n) {
    struct sbuf hdr = {0};
    uint64_t data_bytes;
    uint8_t len8[8];
    bool created = false;
    int fd = -1;
    int rc = build_header(path, t, n, &hdr, &data_bytes);
    if (rc != PD_OK)
        goto out;
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = pd_errorf(pd_status_from_errno(errno), "cannot create %s: %s", path, strerror(errno));
        goto out;
    }
    created = true;
    if ((rc = pd_file_write_fd(fd, len8, 8, path)) != PD_OK ||
        (rc = pd_file_write_fd(fd, hdr.p, hdr.len, path)) != PD_OK)
        goto out;
    for (size_t c = 0; c < PD_ARRAY_LEN(data_classes); c++) {
        for (size_t i = 0; i < n; i++) {
            if (pd_dtype_size(t[i].dtype) != data_classes[c])
                continue;
            if ((rc = pd_file_write_fd(fd, t[i].data, (size_t)tensor_bytes(&t[i]), path)) != PD_OK)
                goto out;
        }
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = pd_errorf(pd_status_from_errno(errno), "cannot write %s: %s", path, strerror(errno));
        goto out;
    }
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    if (rc != PD_OK && created)
        unlink(path); /* no half-written checkpoint left behind */
    pd_free(hdr.p);
    return rc;
}

/* Removes dir/name if present; a stale index next to a fresh single file (or the reverse) would
 * make pd_checkpoint_open read the wrong one. */
static int remove_stale(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    int rc = PD_OK;
    if (!p)
        return pd_error_wrap(PD_ENOMEM, "writing checkpoint %s", dir);
    if (unlink(p) != 0 && errno != ENOENT)
        rc = pd_errorf(pd_status_from_errno(errno), "cannot remove stale %s: %s", p,
                       strerror(errno));
    pd_free(p);
    return rc;
}

int pd_checkpoint_write(const char *dir, const struct pd_tensor_write *t, size_t n,
                        size_t max_shard_bytes) {
    uint64_t *nbytes = pd_calloc(n, sizeof(*nbytes)), total = 0;
    int *shard_of = pd_calloc(n, sizeof(*shard_of));
    const char **names = pd_calloc(n, sizeof(*names));
    struct pd_tensor_write *group = pd_calloc(n, sizeof(*group)); /* one shard's tensors */
    char *path = NULL;
    int rc = PD_OK;
    if (!nbytes || !shard_of || !names || !group) {
        rc = pd_error_wrap(PD_ENOMEM, "writing checkpoint %s", dir);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        nbytes[i] = tensor_bytes(&t[i]);
        names[i] = t[i].name;
        total += nbytes[i];
    }
    int n_shards = pd_safetensors_shard_plan(nbytes, n, max_shard_bytes, shard_of);
    if (n_shards <= 1) {
        if (!(path = path_join(dir, SINGLE_NAME))) {
            rc = pd_error_wrap(PD_ENOMEM, "writing checkpoint %s", dir);
            goto out;
        }
        if ((rc = pd_safetensors_write(path, t, n)) == PD_OK)
            rc = remove_stale(dir, INDEX_NAME);
        goto out;
    }
    size_t plen = strlen(dir) + 64;
    if (!(path = pd_malloc(plen))) {
        rc = pd_error_wrap(PD_ENOMEM, "writing checkpoint %s", dir);
        goto out;
    }
    for (int s = 0; s < n_shards; s++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (shard_of[i] == s)
                group[k++] = t[i];
        char name[64];
        pd_safetensors_shard_name(s, n_shards, name, sizeof(name));
        snprintf(path, plen, "%s/%s", dir, name);
        if ((rc = pd_safetensors_write(path, group, k)) != PD_OK)
            goto out;
    }
    if ((rc = pd_safetensors_index_write(dir, names, shard_of, n, n_shards, total)) == PD_OK)
        rc = remove_stale(dir, SINGLE_NAME);
out:
    pd_free(path);
    pd_free(group);
    pd_free(names);
    pd_free(shard_of);
    pd_free(nbytes);
    return rc;
}
