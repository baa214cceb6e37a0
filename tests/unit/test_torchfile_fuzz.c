// A bounded fuzzing run of the PyTorch checkpoint reader in the suite: the libFuzzer harness
// (tests/fuzz/fuzz_torchfile.c) driven by mutations of the files torch.save wrote in
// tests/unit/torchfile/ (bytes flipped, set to boundary values, 32-bit fields replaced, the file
// cut or spliced), for DSC_FUZZ_SECONDS seconds (default 10). The harness aborts on a broken
// promise; under DSC_SANITIZE a bad read or leak stops the test. The seed is printed, and
// DSC_FUZZ_SEED replays a run.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // printf
#include <stdlib.h> // getenv, strtoull, malloc
#include <string.h> // memcpy, memmove
#include <time.h>   // time, clock_gettime

#include "../fuzz/fuzz_torchfile.c" // LLVMFuzzerTestOneInput

#define DIR DSC_SOURCE_DIR "/tests/unit/torchfile/"

static uint64_t rng;
static uint64_t next(void) { // xorshift64*
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc(*len + 64);
    assert_int_equal(fread(b, 1, *len, fp), *len);
    fclose(fp);
    return b;
}

// One mutation of buf (cap bytes available) in place; returns the new length.
static size_t mutate(uint8_t *buf, size_t len, size_t cap) {
    static const uint32_t special[] = {0, 1, 0x7f, 0x80, 0xff, 0xffff, 0xffffffffu, 0x7fffffff};
    size_t at = len ? next() % len : 0;
    switch (next() % 6) {
    case 0: buf[at] ^= (uint8_t)(1u << (next() % 8)); break;
    case 1: buf[at] = (uint8_t)special[next() % 8]; break;
    case 2:
        if (at + 4 <= len) memcpy(buf + at, &special[next() % 8], 4);
        break;
    case 3: return at; // cut
    case 4: // duplicate a run of bytes over another place
        if (len) {
            size_t from = next() % len, n = 1 + next() % 16;
            if (from + n <= len && at + n <= len) memmove(buf + at, buf + from, n);
        }
        break;
    default: // insert a byte
        if (len < cap) {
            memmove(buf + at + 1, buf + at, len - at);
            buf[at] = (uint8_t)next();
            return len + 1;
        }
    }
    return len;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_fuzz(void **state) {
    (void)state;
    // Seeds: torch 1.13's files of tests/unit/torchfile, and what torch 2 wrote for DeepSpeed's
    // engine (a state_dict with attributes, ZeRO-3's flat groups rebuilt by _rebuild_from_type_v2).
#define REAL "../../ckpt/ds_real/gpt2_z3_bf16/ckpt/global_step10/"
    const char *seeds[] = {"good.pt", "ds_state.pt", "short_view.pt", "os_system.pt",
                           REAL "zero_pp_rank_0_mp_rank_00_model_states.pt",
                           REAL "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"};
#undef REAL
    enum { NSEED = 6 };
    uint8_t *seed[NSEED];
    size_t seed_len[NSEED], cap = 0;
    for (int i = 0; i < NSEED; i++) {
        char path[512];
        snprintf(path, sizeof path, DIR "%s", seeds[i]);
        seed[i] = slurp(path, &seed_len[i]);
        if (seed_len[i] + 64 > cap) cap = seed_len[i] + 64;
    }
    const char *s = getenv("DSC_FUZZ_SEED"), *t = getenv("DSC_FUZZ_SECONDS");
    rng = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull | 1;
    double seconds = t ? strtod(t, NULL) : 10, t0 = now();
    printf("fuzz seed %llu (replay with DSC_FUZZ_SEED), %.0f s\n", (unsigned long long)rng,
           seconds);
    long long runs = 0;
    uint8_t *buf = malloc(cap);
    while (now() - t0 < seconds) {
        int k = (int)(next() % NSEED);
        size_t len = seed_len[k];
        memcpy(buf, seed[k], len);
        for (int m = 1 + (int)(next() % 4); m > 0; m--) len = mutate(buf, len, cap);
        // An exact-size copy, so that a sanitizer sees a read past the end of the file.
        uint8_t *exact = malloc(len ? len : 1);
        memcpy(exact, buf, len);
        LLVMFuzzerTestOneInput(exact, len);
        free(exact);
        runs++;
    }
    printf("%lld inputs in %.1f s\n", runs, now() - t0);
    assert_true(runs > 0);
    free(buf);
    for (int i = 0; i < NSEED; i++) free(seed[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fuzz)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
