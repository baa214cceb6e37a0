// infer/sample.c - next-token choice (see sample.h).
#include "infer/sample.h"

#include <math.h>   // exp
#include <stdlib.h> // qsort

typedef struct cand {
    float v;   // logit / temperature
    int32_t i; // token id
} cand;

// a ranks before b: the larger value, then the lower id.
static int better(const cand *a, const cand *b) {
    return a->v > b->v || (a->v == b->v && a->i < b->i);
}

static int cmp_cand(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t dsc__sample_stream(uint64_t seed, int index) {
    return mix64(seed ^ mix64((uint64_t)index * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull));
}

double dsc__sample_uniform(uint64_t *state) { // splitmix64
    *state += 0x9E3779B97F4A7C15ull;
    return (double)(mix64(*state) >> 11) * 0x1.0p-53;
}

static int32_t argmax(const float *l, int V) {
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

// The heap's root is its worst candidate; children are not worse than their parent.
static void sift_down(cand *h, int n, int at) {
    for (;;) {
        int c = 2 * at + 1;
        if (c >= n) return;
        if (c + 1 < n && better(&h[c], &h[c + 1])) c++; // the worse child
        if (!better(&h[at], &h[c])) return;
        cand t = h[at];
        h[at] = h[c];
        h[c] = t;
        at = c;
    }
}

// The k best of c[0..n) into c[0..k), in no particular order: O(n log k).
static void select_top(cand *c, int n, int k) {
    for (int j = k / 2 - 1; j >= 0; j--)
        sift_down(c, k, j);
    for (int j = k; j < n; j++) {
        if (!better(&c[j], &c[0])) continue;
        c[0] = c[j];
        sift_down(c, k, 0);
    }
}

int32_t dsc__sample(const float *logits, int V, const dsc_gen_opts *o, uint64_t *state,
                    float *scratch, int32_t *idx) {
    (void)idx;
    if (o->temperature <= 0.0f) return argmax(logits, V);
    cand *c = (cand *)scratch; // 2 V floats hold V candidates
    for (int32_t v = 0; v < V; v++)
        c[v] = (cand){logits[v] / o->temperature, v};
    int m = V;
    if (o->top_k > 0 && o->top_k < V) {
        select_top(c, V, o->top_k);
        m = o->top_k;
    }
    bool nucleus = o->top_p > 0.0f && o->top_p < 1.0f;
    if (nucleus) qsort(c, (size_t)m, sizeof *c, cmp_cand);
    float mx = c[0].v;
    for (int j = 1; j < m; j++)
        mx = c[j].v > mx ? c[j].v : mx;
    double z = 0.0;
    for (int j = 0; j < m; j++)
        z += exp((double)c[j].v - mx);
    if (nucleus) { // the shortest prefix whose probability reaches top_p
        double acc = 0.0;
        int keep = 0;
        while (keep < m && acc < o->top_p * z)
            acc += exp((double)c[keep++].v - mx);
        m = keep;
        z = acc;
    }
    double u = dsc__sample_uniform(state) * z, acc = 0.0;
    for (int j = 0; j < m; j++) {
        acc += exp((double)c[j].v - mx);
        if (acc > u) return c[j].i;
    }
    return c[m - 1].i; // u within rounding of z
}
