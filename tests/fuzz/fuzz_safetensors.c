/* libFuzzer target: a model dir's safetensors files (model/safetensors.c): the JSON header and
 * its offsets against the file's size, and the sharded index (model.safetensors.index.json).
 * Operator input, but a bad file must be an error, not a crash or a read past the mapping.
 * Byte 0 even: the rest is model.safetensors. Odd: "<index json>\0<shard bytes>", the shard
 * written as model-00001-of-00001.safetensors next to the index. Every tensor of a checkpoint
 * that opens is read end to end (ASan catches a view outside the file). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char g_dir[256];

static void remove_dir(void) {
    rmdir(g_dir); /* the files in it are removed after every input */
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/pd_fuzz_st_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("fuzz_safetensors: mkdtemp");
        exit(1);
    }
    atexit(remove_dir);
    return 0;
}

static int write_file(const char *name, const uint8_t *p, size_t n) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static void remove_file(const char *name) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    unlink(path);
}

static void touch_all(const struct pd_checkpoint *ck) {
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < pd_checkpoint_count(ck); i++) {
        const struct pd_tensor_view *v = pd_checkpoint_at(ck, i);
        const uint8_t *b = v->data;
        for (size_t k = 0; k < v->nbytes; k++)
            sink ^= b[k];
        if (pd_checkpoint_find(ck, v->name) == NULL)
            abort(); /* listed but not found by its own name */
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    struct pd_checkpoint *ck = NULL;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if (!(data[0] & 1)) {
        char path[512];
        snprintf(path, sizeof(path), "%s/model.safetensors", g_dir);
        if (write_file("model.safetensors", p, n) != 0)
            abort();
        if (pd_checkpoint_open_file(path, &ck) == 0) {
            touch_all(ck);
            pd_checkpoint_free(ck);
        }
        remove_file("model.safetensors");
        return 0;
    }
    const uint8_t *sep = memchr(p, '\0', n);
    size_t index_len = sep ? (size_t)(sep - p) : n;
    const uint8_t *shard = sep ? sep + 1 : p + n;
    size_t shard_len = n - index_len - (sep ? 1 : 0);
    if (write_file("model.safetensors.index.json", p, index_len) != 0 ||
        write_file("model-00001-of-00001.safetensors", shard, shard_len) != 0)
        abort();
    if (pd_checkpoint_open(g_dir, &ck) == 0) {
        touch_all(ck);
        pd_checkpoint_free(ck);
    }
    remove_file("model.safetensors.index.json");
    remove_file("model-00001-of-00001.safetensors");
    return 0;
}
