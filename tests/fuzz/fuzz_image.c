/* libFuzzer target: image bytes as users send them (model/vision/image_decode.c: PNG and JPEG
 * through libpng and libjpeg), then the Qwen2-VL processor on what decodes (image_processor.c)
 * and, as a data: URL, the same bytes base64-encoded. The bytes are anyone's: whatever they are,
 * the result is an image or an error, never a crash, a leak or a read past the input; a pixel
 * limit from the header keeps a claimed giant from being allocated. A decoded image has the
 * size it says, the header probe (pd_image_probe) says the same size, and the processor's
 * output has the rows its grid says. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/alloc.h"
#include "model/vision/image_decode.h"
#include "model/vision/image_processor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* "data:image/png;base64," + base64 of data (NULL when memory runs out). */
static char *as_data_url(const uint8_t *d, size_t n, size_t *len) {
    static const char head[] = "data:image/png;base64,";
    size_t out = sizeof(head) - 1 + (n + 2) / 3 * 4;
    char *s = pd_malloc(out + 1), *p;
    if (!s)
        return NULL;
    memcpy(s, head, sizeof(head) - 1);
    p = s + sizeof(head) - 1;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) |
                     (i + 2 < n ? d[i + 2] : 0);
        *p++ = b64[v >> 18 & 63];
        *p++ = b64[v >> 12 & 63];
        *p++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? b64[v & 63] : '=';
    }
    *p = '\0';
    *len = out;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct pd_image_decode_opts o = {
        .max_pixels = 1u << 20, .alpha = size % 2 ? PD_IMAGE_ALPHA_DROP : PD_IMAGE_ALPHA_ON_WHITE};
    struct pd_image img;
    int pw = 0, ph = 0;
    int probed = pd_image_probe(data, size, &o, &pw, &ph); /* the decode side's header read */
    if (pd_image_decode(data, size, &o, &img) == 0) {
        if (probed != 0 || pw != img.width || ph != img.height)
            abort(); /* the header said another size than the pixels have */
        if (img.width < 1 || img.height < 1 || (uint64_t)img.width * img.height > o.max_pixels)
            abort(); /* decoded an image of a size it may not have */
        struct pd_image_processor_config pc;
        pd_image_processor_config_default(&pc);
        pc.max_pixels = 28 * 28 * 64; /* small grids: the fuzzer's time goes to the decoders */
        struct pd_image_patches p;
        if (pd_image_process(&pc, &img, &p) == 0) {
            if (p.n_rows != p.grid_t * p.grid_h * p.grid_w ||
                p.row_len != 3 * pc.temporal_patch_size * pc.patch_size * pc.patch_size)
                abort(); /* the patches disagree with their grid */
            pd_image_patches_free(&p);
        }
        pd_image_free(&img);
    }
    size_t ulen;
    char *url = size <= 4096 ? as_data_url(data, size, &ulen) : NULL;
    if (url) {
        if (pd_image_decode_data_url(url, ulen, &o, &img) == 0)
            pd_image_free(&img);
        pd_free(url);
    }
    return 0;
}
