// config/elastic.c - DeepSpeed's elasticity: a global batch size usable over many GPU counts.
//
// The rules are DeepSpeed 0.18.4's (deepspeed/elasticity/elasticity.py), including its quirks:
// a candidate base that fits no listed highly composite number wraps to the last one (a Python
// negative index), version 0.2 falls back to float arithmetic when the world size is not one of
// the valid ones, and the result is truncated to an integer.
#include "config/elastic.h"

#include <math.h>    // floor
#include <stdbool.h> // bool
#include <stdlib.h>  // calloc, free

#include "base/status.h" // dsc__fail

// The smallest highly composite numbers DeepSpeed scales candidates by.
static const int64_t hcn[] = {
    1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 840, 1260, 1680, 2520, 5040,
    7560, 10080, 15120, 20160, 25200, 27720, 45360, 50400, 55440, 83160, 110880, 166320, 221760,
    277200, 332640, 498960, 554400, 665280, 720720};
#define NHCN ((int)(sizeof hcn / sizeof hcn[0]))
#define MAX_CAND 17 // micro batch sizes (at most 16) + their lcm

typedef struct micro_list {
    const int64_t *v;
    int n;
} micro_list;

// A set of GPU counts 1..cap as flags, with its size.
typedef struct gpu_set {
    bool *has;
    int64_t cap, count;
} gpu_set;

static int64_t gcd(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

static dsc_status lcm_of(micro_list m, int64_t *out) {
    int64_t l = 1;
    for (int k = 0; k < m.n; k++) {
        int64_t g = gcd(l, m.v[k]);
        if (l / g > INT64_MAX / m.v[k])
            return dsc__fail(DSC_ERR_CONFIG, "elasticity.micro_batch_sizes: their least common "
                             "multiple is too large; list fewer or smaller sizes");
        l = l / g * m.v[k];
    }
    *out = l;
    return DSC_OK;
}

// get_candidate_batch_sizes: each base scaled by the largest HCN that keeps it within max_acc.
static int candidates(micro_list m, int64_t lcm, int64_t max_acc, int64_t *out) {
    int n = 0;
    for (int b = 0; b <= m.n; b++) {
        int64_t base = b < m.n ? m.v[b] : lcm, c = base;
        if (base < max_acc) {
            int64_t value = max_acc / base;
            int idx = 0; // first HCN above value; none -> 0, and [idx - 1] wraps to the last
            while (idx < NHCN && hcn[idx] <= value) idx++;
            if (idx == NHCN) idx = 0;
            c = hcn[(idx + NHCN - 1) % NHCN] * base;
        }
        bool seen = false;
        for (int k = 0; k < n; k++) seen |= out[k] == c;
        if (!seen) out[n++] = c;
    }
    return n;
}

static void set_add(gpu_set *s, int64_t g) {
    if (g >= 1 && g <= s->cap && !s->has[g]) s->has[g] = true, s->count++;
}

// get_valid_gpus: GPU counts in [lo, hi] over which `batch` splits into whole micro batches.
static void valid_gpus(int64_t batch, micro_list m, int64_t lo, int64_t hi, gpu_set *s) {
    for (int64_t g = 0; g <= s->cap; g++) s->has[g] = false;
    s->count = 0;
    for (int k = 0; k < m.n; k++) {
        if (batch % m.v[k]) continue;
        int64_t most = batch / m.v[k];
        if (lo <= most && most <= hi) set_add(s, most);
        for (int64_t i = 1; i <= most / 2 && i <= hi; i++)
            if (i >= lo && most % i == 0) set_add(s, i);
    }
}

typedef struct v01_result {
    int64_t batch;
    bool has_gpus; // false: DeepSpeed's list is None (no candidate won)
    gpu_set gpus;  // the winning candidate's GPU counts (caller frees .has)
} v01_result;

static dsc_status new_set(gpu_set *s, int64_t cap) {
    *s = (gpu_set){calloc((size_t)cap + 1, 1), cap, 0};
    return s->has ? DSC_OK : dsc__fail(DSC_ERR_OOM, "elasticity: out of memory");
}

// get_best_candidates: most valid GPU counts, then the larger (or smaller) batch.
static void best_candidate(const int64_t *cand, int nc, micro_list m, int64_t lo, int64_t hi,
                           bool prefer_larger, gpu_set *cur, v01_result *r) {
    int64_t best_count = 0;
    for (int c = 0; c < nc; c++) {
        valid_gpus(cand[c], m, lo, hi, cur);
        bool better = cur->count > best_count ||
                      (cur->count == best_count &&
                       (prefer_larger ? cand[c] > r->batch : cand[c] < r->batch));
        if (!better) continue;
        best_count = cur->count, r->batch = cand[c], r->has_gpus = true;
        for (int64_t g = 0; g <= cur->cap; g++) r->gpus.has[g] = cur->has[g];
        r->gpus.count = cur->count;
    }
}

// _get_compatible_gpus_v01.
static dsc_status v01(micro_list m, int64_t max_acc, int64_t min_gpus, int64_t max_gpus,
                      bool prefer_larger, v01_result *r) {
    int64_t min_mb = m.v[0], lcm = 1, cand[MAX_CAND];
    for (int k = 0; k < m.n; k++) {
        if (m.v[k] < min_mb) min_mb = m.v[k];
        if (m.v[k] > max_acc)
            return dsc__fail(DSC_ERR_CONFIG, "elasticity: micro batch size %lld exceeds the "
                             "largest acceptable batch (%lld)", (long long)m.v[k],
                             (long long)max_acc);
    }
    if (min_gpus == 0) min_gpus = 1;
    if (max_gpus == 0) max_gpus = max_acc / min_mb;
    DSC_TRY(lcm_of(m, &lcm));
    int nc = candidates(m, lcm, max_acc, cand);
    // Every valid count is at most max_gpus (DeepSpeed stops there), which bounds the sets.
    gpu_set cur;
    DSC_TRY(new_set(&cur, max_gpus));
    dsc_status st = new_set(&r->gpus, max_gpus);
    r->batch = min_mb, r->has_gpus = false;
    if (st == DSC_OK) best_candidate(cand, nc, m, min_gpus, max_gpus, prefer_larger, &cur, r);
    free(cur.has);
    return st;
}

// The micro batch DeepSpeed takes for a world size: the largest listed one dividing batch // world.
static bool largest_micro(micro_list m, int64_t batch, int world, int64_t *micro) {
    *micro = 0;
    for (int k = 0; k < m.n; k++)
        if ((batch / world) % m.v[k] == 0 && m.v[k] > *micro) *micro = m.v[k];
    return *micro > 0;
}

// Whether g is in DeepSpeed's list of valid counts, each scaled by `scale`.
static bool gpus_contain(const v01_result *r, int64_t g, int64_t scale) {
    if (!r->has_gpus || g < 1 || g % scale) return false;
    return g / scale <= r->gpus.cap && r->gpus.has[g / scale];
}

// _get_compatible_gpus_v02, then whether `world` is among the valid counts.
static dsc_status v02(const dsc_config *cfg, micro_list m, int world, v01_result *r,
                      int64_t *batch, bool *valid) {
    int64_t mp = cfg->elasticity.model_parallel_size, gpn = cfg->elasticity.num_gpus_per_node;
    if (gpn % mp)
        return dsc__fail(DSC_ERR_CONFIG, "elasticity 0.2: num_gpus_per_node (%lld) must be "
                         "divisible by model_parallel_size (%lld)", (long long)gpn, (long long)mp);
    int64_t dp = gpn / mp, max_acc = cfg->elasticity.max_train_batch_size;
    DSC_TRY(v01(m, (int64_t)((double)max_acc / (double)dp),
                (int64_t)((double)cfg->elasticity.min_gpus / (double)gpn),
                (int64_t)((double)cfg->elasticity.max_gpus / (double)gpn),
                cfg->elasticity.prefer_larger_batch, r));
    if (!r->has_gpus)
        return dsc__fail(DSC_ERR_CONFIG, "elasticity: no candidate batch size fits a GPU count "
                         "in [min_gpus, max_gpus]; widen the range or change micro_batch_sizes");
    if (gpus_contain(r, world / mp, dp)) {
        *batch = r->batch * dp;
        *valid = gpus_contain(r, world, dp);
        return DSC_OK;
    }
    // Not a valid size: DeepSpeed computes a batch for this size in floating point.
    double cur_dp = (double)world / (double)gpn * (double)dp, pick = 0;
    for (int k = 0; k < m.n; k++) {
        double min_batch = (double)m.v[k] * cur_dp;
        double c = floor((double)max_acc / min_batch) * min_batch;
        if (k == 0 || (cfg->elasticity.prefer_larger_batch ? c > pick : c < pick)) pick = c;
    }
    *batch = (int64_t)pick;
    *valid = world == (int64_t)cur_dp;
    return DSC_OK;
}

dsc_status dsc__elastic_batch(const dsc_config *cfg, int world, int64_t *train, int64_t *micro,
                              int64_t *gas) {
    micro_list m = {cfg->elasticity.micro_batch_sizes, (int)cfg->elasticity.n_micro_batch_sizes};
    if (m.n <= 0 || m.n > MAX_CAND - 1)
        return dsc__fail(DSC_ERR_CONFIG, "elasticity.micro_batch_sizes: give 1 to %d sizes",
                         MAX_CAND - 1);
    int64_t batch = 0;
    bool valid = false;
    v01_result r = {0, false, {NULL, 0, 0}};
    dsc_status st;
    if (cfg->elasticity.version == 0.1) {
        st = v01(m, cfg->elasticity.max_train_batch_size, cfg->elasticity.min_gpus,
                 cfg->elasticity.max_gpus, cfg->elasticity.prefer_larger_batch, &r);
        batch = r.batch, valid = gpus_contain(&r, world, 1);
    } else {
        st = v02(cfg, m, world, &r, &batch, &valid);
    }
    free(r.gpus.has);
    DSC_TRY(st);
    if (!valid)
        return dsc__fail(DSC_ERR_CONFIG, "elasticity: world size %d is not one of the GPU counts "
                         "this elastic config supports; run on a valid count or change "
                         "micro_batch_sizes / min_gpus / max_gpus", world);
    if (!largest_micro(m, batch, world, micro))
        return dsc__fail(DSC_ERR_CONFIG, "elasticity: no micro batch size divides %lld / %d; "
                         "change micro_batch_sizes", (long long)batch, world);
    *train = batch;
    *gas = batch / (*micro * world);
    return DSC_OK;
}

dsc_status dsc__elastic_check(const dsc_config *cfg, const char *source) {
    if (!dsc_config_given(cfg, "elasticity.max_train_batch_size") ||
        !dsc_config_given(cfg, "elasticity.micro_batch_sizes"))
        return dsc__fail(DSC_ERR_CONFIG, "config %s: elasticity is enabled: it needs "
                         "max_train_batch_size and micro_batch_sizes", source);
    if (cfg->elasticity.n_micro_batch_sizes == 0) // DeepSpeed: min() of an empty list
        return dsc__fail(DSC_ERR_CONFIG, "config %s: elasticity.micro_batch_sizes is empty",
                         source);
    if (cfg->elasticity.max_gpus < cfg->elasticity.min_gpus)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: elasticity.min_gpus (%lld) exceeds max_gpus "
                         "(%lld)", source, (long long)cfg->elasticity.min_gpus,
                         (long long)cfg->elasticity.max_gpus);
    double v = cfg->elasticity.version;
    if (cfg->elasticity.model_parallel_size > 1 && v != 0.2)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: elasticity version %g does not support "
                         "model_parallel_size > 1 (use version 0.2)", source, v);
    if (v != 0.1 && v != 0.2)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: elasticity.version %g: DeepSpeed implements "
                         "0.1 and 0.2", source, v);
    return DSC_OK;
}
