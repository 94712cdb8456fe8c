/* libFuzzer target: config.json and generation_config.json of a model dir (model/model_config.c).
 * The dir is the operator's, but a bad file must be an error message, not a crash. A config that
 * parses must print back (pd_model_config_to_json) to text that parses to the same config (its
 * documented promise), and is turned into its tensor list, as the loader does next. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/alloc.h"
#include "model/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct pd_model_config cfg, back;
    if (pd_model_config_parse((const char *)data, size, &cfg) != 0)
        return 0;
    (void)pd_generation_config_parse((const char *)data, size, &cfg);
    char *js = pd_model_config_to_json(&cfg);
    if (!js)
        return 0; /* allocation failure */
    if (pd_model_config_parse(js, strlen(js), &back) != 0)
        abort(); /* our own config.json text refused */
    char *js2 = pd_model_config_to_json(&back);
    if (js2 && strcmp(js, js2) != 0)
        abort(); /* printed, parsed and printed again: not the same config */
    pd_free(js2);
    pd_free(js);
    struct pd_tensor_spec *specs = NULL;
    size_t n = 0;
    if (pd_model_tensor_specs(&cfg, &specs, &n) == 0)
        pd_free(specs);
    return 0;
}
