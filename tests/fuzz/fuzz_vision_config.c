/* libFuzzer target: a vision-language model's config.json as the vision encoder reads it
 * (model/vision/vision_config.c). The dir is the operator's, but a bad file must be an error
 * message, not a crash. A config that parses must print back (pd_vision_config_json) to a
 * vision_config that parses to the same numbers, and list its tensors, as mkmodel does. */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/alloc.h"
#include "model/vision/vision_encoder.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct pd_vision_config c, back;
    if (pd_vision_config_parse((const char *)data, size, "fuzz", &c) != 0)
        return 0;
    struct pd_tensor_spec *specs = NULL;
    size_t n = 0;
    if (pd_vision_tensor_specs(&c, &specs, &n) == 0)
        pd_free(specs);
    cJSON *v = pd_vision_config_json(&c);
    if (!v)
        return 0; /* no mlp_ratio for its MLP width, or no memory */
    cJSON *root = cJSON_CreateObject();
    char *text = NULL;
    if (root &&
        cJSON_AddStringToObject(root, "model_type",
                                c.family == PD_VISION_QWEN2_VL ? "qwen2_vl" : "qwen2_5_vl") &&
        cJSON_AddItemToObject(root, "vision_config", v)) {
        v = NULL;
        text = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(v);
    cJSON_Delete(root);
    if (!text)
        return 0;
    if (pd_vision_config_parse(text, strlen(text), "fuzz", &back) != 0)
        abort(); /* our own vision_config refused */
    if (back.family != c.family || back.depth != c.depth || back.embed_dim != c.embed_dim ||
        back.num_heads != c.num_heads || back.mlp_dim != c.mlp_dim || back.out_dim != c.out_dim ||
        back.patch_size != c.patch_size || back.act != c.act ||
        back.n_fullatt != (c.family == PD_VISION_QWEN2_VL ? back.n_fullatt : c.n_fullatt))
        abort(); /* printed and parsed: not the same config */
    free(text);
    return 0;
}
