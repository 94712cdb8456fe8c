/*
 * safetensors_index.h — the sharding half of writing a checkpoint, apart from the tensor data:
 * which tensor goes into which shard, what the shards are called, and the
 * model.safetensors.index.json that names them, as transformers' save_pretrained does it.
 *
 * Apart from safetensors.c so a writer that produces one shard at a time (pdserve-mkmodel, whose
 * real-size models do not fit in memory at once) and pd_checkpoint_write (everything in memory)
 * can share one rule, huggingface_hub's split_state_dict_into_shards: tensors are taken in order;
 * one larger than max_shard_bytes gets a shard of its own at once; otherwise a tensor that would
 * tip the current shard over the limit closes it. Shards are numbered in the order they are
 * closed, so shard numbers are not monotonic in tensor order. Sizes count tensor data only.
 */
#ifndef PD_SAFETENSORS_INDEX_H
#define PD_SAFETENSORS_INDEX_H

#include <stddef.h>
#include <stdint.h>

#define PD_SAFETENSORS_INDEX_NAME "model.safetensors.index.json"
#define PD_SAFETENSORS_SINGLE_NAME "model.safetensors"

/* Fills shard_of[0..n) with each tensor's shard (0-based) and returns the number of shards:
 * 1 when max_shard_bytes == 0 or everything fits, 0 when n == 0. */
int pd_safetensors_shard_plan(const uint64_t *nbytes, size_t n, uint64_t max_shard_bytes,
                              int *shard_of);

/* File name of shard i (0-based) of n: "model.safetensors" when n == 1, else
 * "model-00001-of-00003.safetensors" (1-based, as transformers names them). */
void pd_safetensors_shard_name(int i, int n, char *buf, size_t cap);

/* Writes dir/model.safetensors.index.json: {"metadata": {"total_size": total_bytes},
 * "weight_map": {name: shard file}}, byte for byte as transformers writes it
 * (json.dumps(index, indent=2, sort_keys=True) + "\n"). */
int pd_safetensors_index_write(const char *dir, const char *const *names, const int *shard_of,
                               size_t n, int n_shards, uint64_t total_bytes);

#endif
