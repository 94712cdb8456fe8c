/*
 * safetensors.h — reading (memory-mapped) and writing Hugging Face safetensors checkpoints,
 * single-file ("model.safetensors") or sharded ("model.safetensors.index.json" naming
 * "model-00001-of-00002.safetensors", ...).
 *
 * File format: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the data; offsets are relative to the end of the header. Every field is validated before
 * use: header length past EOF, header not JSON, offsets outside the file or overlapping,
 * shape × dtype size ≠ byte length, unknown dtype, duplicate names — each a clear error naming the
 * file and tensor, never a crash. Tensor data is never copied: pointers point into the mapping,
 * valid until pd_checkpoint_free.
 */
#ifndef PD_SAFETENSORS_H
#define PD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"
#include "model/model_config.h"

#define PD_TENSOR_MAX_DIMS 5 /* the vision encoder's Conv3d patch embedding is 5-D */

struct pd_tensor_view {
    const char *name; /* owned by the checkpoint */
    enum pd_dtype dtype;
    int ndim;
    int64_t shape[PD_TENSOR_MAX_DIMS];
    const void *data; /* into the read-only mapping */
    size_t nbytes;
    int shard; /* index of the file it lives in (shard files in name order, from 0) */
};

struct pd_checkpoint;

/* Opens dir: model.safetensors.index.json if present (every shard it names is mapped), else
 * model.safetensors. */
int pd_checkpoint_open(const char *dir, struct pd_checkpoint **out);
/* Opens one .safetensors file as a checkpoint of one shard. */
int pd_checkpoint_open_file(const char *path, struct pd_checkpoint **out);
void pd_checkpoint_free(struct pd_checkpoint *ck);

size_t pd_checkpoint_count(const struct pd_checkpoint *ck);
/* i-th tensor in name order. */
const struct pd_tensor_view *pd_checkpoint_at(const struct pd_checkpoint *ck, size_t i);
/* NULL (no error recorded) when absent. */
const struct pd_tensor_view *pd_checkpoint_find(const struct pd_checkpoint *ck, const char *name);

/* Checks that every tensor cfg implies is present with the right shape and a float dtype
 * (F32/F16/BF16); the first problem is reported naming the tensor, e.g.
 * "tensor 'model.layers.1.mlp.up_proj.weight' has shape [64, 32], config implies [128, 32]". */
int pd_checkpoint_validate(const struct pd_checkpoint *ck, const struct pd_model_config *cfg);

/* A tensor to write. */
struct pd_tensor_write {
    const char *name;
    enum pd_dtype dtype;
    int ndim;
    int64_t shape[PD_TENSOR_MAX_DIMS];
    const void *data; /* nbytes = product(shape) * dtype size */
};

/* Writes one safetensors file with tensors in the given order ("__metadata__": {"format":"pt"}).
 * The header lists them in that order; the data puts F32 tensors before 2-byte ones (as the
 * safetensors library does) so every tensor is aligned to its element size in a mapping. */
int pd_safetensors_write(const char *path, const struct pd_tensor_write *t, size_t n);

/* Writes a checkpoint into dir: one model.safetensors when max_shard_bytes == 0 or everything
 * fits, else model-0000i-of-0000N.safetensors shards of at most max_shard_bytes each (a tensor
 * larger than that gets a shard of its own) plus model.safetensors.index.json with
 * metadata.total_size and weight_map, as transformers' save_pretrained writes them. */
int pd_checkpoint_write(const char *dir, const struct pd_tensor_write *t, size_t n,
                        size_t max_shard_bytes);

#endif
