/*
 * model_load.c — a model from a stock Hugging Face directory: config.json (+
 * generation_config.json) and the safetensors checkpoint, checked against each other, then
 * pd_model_new with tensors looked up in the mapping. The model keeps the checkpoint mapped (its
 * cpu weights alias it) and unmaps it when freed. Kept apart from model.c so the forward pass
 * links without the file readers.
 */
#include "model/model.h"
#include "common/base/status.h"

static const struct pd_tensor_view *find_in_checkpoint(void *ctx, const char *name) {
    return pd_checkpoint_find(ctx, name);
}

static void free_checkpoint(void *ck) {
    pd_checkpoint_free(ck);
}

int pd_model_load(struct pd_backend *be, const char *dir, const struct pd_model_opts *opts,
                  struct pd_model **out) {
    *out = NULL;
    struct pd_model_config cfg;
    struct pd_checkpoint *ck = NULL;
    int rc = pd_model_config_load(dir, &cfg);
    if (rc)
        goto fail;
    if ((rc = pd_checkpoint_open(dir, &ck)) != PD_OK)
        goto fail;
    if ((rc = pd_checkpoint_validate(ck, &cfg)) != PD_OK)
        goto fail_ck;
    if ((rc = pd_model_new(be, &cfg, find_in_checkpoint, ck, opts, out)) != PD_OK)
        goto fail_ck;
    pd__model_own(*out, free_checkpoint, ck);
    return PD_OK;
fail_ck:
    pd_checkpoint_free(ck);
fail:
    return pd_error_wrap(rc, "loading the model in %s", dir);
}
