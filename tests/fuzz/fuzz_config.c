// libFuzzer harness for the config reader: arbitrary bytes as a config text (Hjson syntax,
// typing rules, elasticity, batch resolution). Not part of CI; see tests/fuzz/README.md.
#include <stdint.h> // uint8_t
#include <stdlib.h> // malloc, free
#include <string.h> // memcpy

#include "dsc/config.h" // dsc_config_load_string

static void quiet(void *user, const char *message) { (void)user, (void)message; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // The first byte picks the world size (1..8), the rest is the text (NUL-terminated copy).
    if (size < 1) return 0;
    int world = 1 + data[0] % 8;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    dsc_config cfg;
    dsc_config_load_string(&cfg, text, world, quiet, NULL);
    free(text);
    return 0;
}
