// tests/unit/test_loss_scaler.c - the loss scaler against a transcription of DeepSpeed's
// DynamicLossScaler.update_scale written here, over chosen and random overflow sequences, with
// every scale value checked, plus hand-computed sequences.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>  // printf
#include <stdlib.h> // getenv, strtoull
#include <string.h> // strstr

#include "engine/optim/loss_scaler.h" // dsc_loss_scaler_*

static uint64_t g_seed = 7;

// ---- the transcription (update_scale, line by line) ----

typedef struct {
    double cur_scale, scale_factor, min_scale;
    long long scale_window, cur_iter, last_overflow_iter;
    int delayed_shift, cur_hysteresis;
    bool consecutive_hysteresis, raise_error_at_min_scale;
} py_scaler;

static py_scaler py_init(double init_scale, int window, double min_scale, int delayed_shift,
                         bool consecutive, bool raise_at_min) {
    return (py_scaler){.cur_scale = init_scale, .scale_factor = 2.0, .min_scale = min_scale,
                       .scale_window = window, .cur_iter = 0, .last_overflow_iter = -1,
                       .delayed_shift = delayed_shift, .cur_hysteresis = delayed_shift,
                       .consecutive_hysteresis = consecutive,
                       .raise_error_at_min_scale = raise_at_min};
}

// Returns false where Python raises.
static bool py_update(py_scaler *s, bool overflow) {
    if (overflow) {
        if (s->delayed_shift == 1 || s->cur_hysteresis == 1) {
            if (s->cur_scale == s->min_scale && s->raise_error_at_min_scale) return false;
            double next_scale = s->cur_scale / s->scale_factor;
            if (next_scale < s->min_scale) next_scale = s->min_scale;
            s->cur_scale = next_scale;
        } else {
            s->cur_hysteresis -= 1;
        }
        s->last_overflow_iter = s->cur_iter;
    } else {
        if (s->consecutive_hysteresis) s->cur_hysteresis = s->delayed_shift;
        long long stable_interval = (s->cur_iter - s->last_overflow_iter) - 1;
        if (stable_interval > 0 && stable_interval % s->scale_window == 0) {
            if (!s->consecutive_hysteresis) s->cur_hysteresis = s->delayed_shift;
            s->cur_scale *= s->scale_factor;
        }
    }
    s->cur_iter += 1;
    return true;
}

// ---- driver ----

typedef struct {
    int power, window, hysteresis;
    bool consecutive, raise_at_min;
    double min_scale;
} scaler_cfg;

// Runs `n` updates with overflow[i]; checks the scale after every one. Returns the number of
// updates made before an error (n if none).
static int run_sequence(const char *label, const scaler_cfg *c, const bool *overflow, int n) {
    dsc_loss_scaler s;
    dsc_loss_scaler_init(&s, 0, c->power, c->window, c->hysteresis, c->consecutive, c->min_scale);
    s.raise_error_at_min_scale = c->raise_at_min;
    py_scaler py = py_init((double)(1ull << c->power), c->window, c->min_scale, c->hysteresis,
                           c->consecutive, c->raise_at_min);
    assert_true(dsc_loss_scaler_scale(&s) == py.cur_scale);
    for (int i = 0; i < n; i++) {
        bool ok = py_update(&py, overflow[i]);
        dsc_status st = dsc_loss_scaler_update(&s, overflow[i]);
        if (!ok) {
            if (st != DSC_ERR_CONFIG) {
                print_error("%s update %d: DeepSpeed raises here, got status %d; seed %llu\n",
                            label, i, st, (unsigned long long)g_seed);
                fail();
            }
            assert_true(dsc_loss_scaler_scale(&s) == py.cur_scale); // unchanged
            return i;
        }
        if (st != DSC_OK || dsc_loss_scaler_scale(&s) != py.cur_scale ||
            s.cur_hysteresis != py.cur_hysteresis) {
            print_error("%s update %d (overflow %d): status %d scale %g hysteresis %d, want scale "
                        "%g hysteresis %d; seed %llu\n",
                        label, i, overflow[i], st, dsc_loss_scaler_scale(&s), s.cur_hysteresis,
                        py.cur_scale, py.cur_hysteresis, (unsigned long long)g_seed);
            fail();
        }
    }
    return n;
}

static const scaler_cfg DEFAULTS = {.power = 16, .window = 1000, .hysteresis = 2,
                                    .consecutive = false, .raise_at_min = true, .min_scale = 1};

#define N 3000
static bool seq[N];

static void set_pattern(const int *at, int count) {
    for (int i = 0; i < N; i++) seq[i] = false;
    for (int k = 0; k < count; k++) seq[at[k]] = true;
}

// ---- tests ----

static void test_no_overflow(void **state) {
    set_pattern(NULL, 0);
    assert_int_equal(run_sequence("clean", &DEFAULTS, seq, N), N);
    // By hand: the scale doubles at the updates with cur_iter 1000 and 2000.
    dsc_loss_scaler s;
    dsc_loss_scaler_init(&s, 0, 16, 1000, 2, false, 1);
    for (int i = 0; i < 1000; i++) assert_int_equal(dsc_loss_scaler_update(&s, false), DSC_OK);
    assert_true(dsc_loss_scaler_scale(&s) == 65536.0);
    assert_int_equal(dsc_loss_scaler_update(&s, false), DSC_OK);
    assert_true(dsc_loss_scaler_scale(&s) == 131072.0);
    for (int i = 1001; i < N; i++) dsc_loss_scaler_update(&s, false);
    assert_true(dsc_loss_scaler_scale(&s) == 262144.0);
}

static void test_isolated_and_bursts(void **state) {
    static const int isolated[] = {5, 700, 1500, 1501, 2999};
    set_pattern(isolated, 5);
    assert_int_equal(run_sequence("isolated", &DEFAULTS, seq, N), N);
    static const int bursts[] = {10, 11, 12, 13, 14, 400, 401, 402, 2000, 2001, 2002, 2003};
    set_pattern(bursts, 12);
    scaler_cfg c = DEFAULTS;
    c.window = 100;
    assert_int_equal(run_sequence("bursts", &c, seq, N), N);
    c.consecutive = true;
    assert_int_equal(run_sequence("bursts consecutive", &c, seq, N), N);
    c.hysteresis = 1;
    assert_int_equal(run_sequence("bursts no hysteresis", &c, seq, N), N);
}

// By hand, hysteresis 2: the first overflow only spends hysteresis; the second halves; without
// consecutive_hysteresis it stays spent until the scale grows again, with it a clean step refills.
static void test_hysteresis_by_hand(void **state) {
    dsc_loss_scaler s;
    dsc_loss_scaler_init(&s, 0, 10, 1000, 2, false, 1);
    static const bool pattern[] = {true, false, true, false, true};
    static const double plain[] = {1024, 1024, 512, 512, 256};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(dsc_loss_scaler_update(&s, pattern[i]), DSC_OK);
        assert_true(dsc_loss_scaler_scale(&s) == plain[i]);
    }
    dsc_loss_scaler_init(&s, 0, 10, 1000, 2, true, 1);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(dsc_loss_scaler_update(&s, pattern[i]), DSC_OK);
        assert_true(dsc_loss_scaler_scale(&s) == 1024); // refilled after every clean step
    }
    assert_int_equal(dsc_loss_scaler_update(&s, false), DSC_OK); // refill
    assert_int_equal(dsc_loss_scaler_update(&s, true), DSC_OK);
    assert_true(dsc_loss_scaler_scale(&s) == 1024);
    assert_int_equal(dsc_loss_scaler_update(&s, true), DSC_OK);
    assert_true(dsc_loss_scaler_scale(&s) == 512); // two in a row do drop it
}

static void test_minimum(void **state) {
    for (int i = 0; i < N; i++) seq[i] = true;
    scaler_cfg c = DEFAULTS;
    c.power = 4;
    // 16 -> 8 after one spent hysteresis ... -> 1, then DeepSpeed raises.
    assert_int_equal(run_sequence("to the minimum", &c, seq, N), 5);
    dsc_loss_scaler s;
    dsc_loss_scaler_init(&s, 0, 4, 1000, 1, false, 1);
    for (int i = 0; i < 4; i++) assert_int_equal(dsc_loss_scaler_update(&s, true), DSC_OK);
    assert_true(dsc_loss_scaler_scale(&s) == 1);
    assert_int_equal(dsc_loss_scaler_update(&s, true), DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "fp16.min_loss_scale"));
    assert_true(dsc_loss_scaler_scale(&s) == 1 && s.cur_iter == 4);
    // raise_error_at_min_scale=False: stays at the floor.
    c.raise_at_min = false;
    assert_int_equal(run_sequence("floor without error", &c, seq, N), N);
    // A floor that is not a power of two: 16 -> 8 -> max(4, 5) = 5, then the error.
    c.raise_at_min = true, c.min_scale = 5, c.hysteresis = 1;
    assert_int_equal(run_sequence("floor 5", &c, seq, N), 2);
}

static uint64_t rng_u64(uint64_t *x) { // splitmix64
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void test_random_sequences(void **state) {
    uint64_t rng = g_seed;
    static const double mins[] = {1, 0.25, 3, 1024};
    for (int r = 0; r < 200; r++) {
        scaler_cfg c = {.power = (int)(rng_u64(&rng) % 25), .window = 1 + (int)(rng_u64(&rng) % 60),
                        .hysteresis = 1 + (int)(rng_u64(&rng) % 4),
                        .consecutive = rng_u64(&rng) & 1, .raise_at_min = rng_u64(&rng) % 4 != 0,
                        .min_scale = mins[rng_u64(&rng) % 4]};
        // Overflow probability per run from 0.1% to 30%, sometimes in bursts.
        uint64_t per_mille = 1 + rng_u64(&rng) % 300;
        bool bursty = rng_u64(&rng) & 1;
        for (int i = 0; i < N; i++) {
            seq[i] = rng_u64(&rng) % 1000 < per_mille;
            if (bursty && i > 0 && seq[i - 1] && rng_u64(&rng) % 2) seq[i] = true;
        }
        char label[64];
        snprintf(label, sizeof label, "random run %d", r);
        run_sequence(label, &c, seq, N);
    }
}

static void test_static_and_window_zero(void **state) {
    dsc_loss_scaler s;
    dsc_loss_scaler_init(&s, 128.0, 16, 1000, 2, false, 1);
    for (int i = 0; i < 2000; i++) {
        assert_int_equal(dsc_loss_scaler_update(&s, i % 3 == 0), DSC_OK);
        assert_true(dsc_loss_scaler_scale(&s) == 128.0);
    }
    // Python's `% 0` raises on the first clean step with a positive stable interval.
    dsc_loss_scaler_init(&s, 0, 16, 0, 2, false, 1);
    assert_int_equal(dsc_loss_scaler_update(&s, false), DSC_OK); // stable interval 0
    assert_int_equal(dsc_loss_scaler_update(&s, false), DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "fp16.loss_scale_window"));
}

int main(void) {
    const char *seed = getenv("DSC_TEST_SEED");
    if (seed != NULL) g_seed = strtoull(seed, NULL, 10);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_overflow),        cmocka_unit_test(test_isolated_and_bursts),
        cmocka_unit_test(test_hysteresis_by_hand), cmocka_unit_test(test_minimum),
        cmocka_unit_test(test_random_sequences),   cmocka_unit_test(test_static_and_window_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
