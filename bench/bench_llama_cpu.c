// bench/bench_llama_cpu.c - the Llama model's CPU forward + backward, model only: milliseconds
// per pass and tokens/s (median of the timed passes, after one warm-up). The PyTorch side of the
// comparison is bench/bench_llama_cpu.py, which runs this program.
//
// Usage: bench_llama_cpu [SPEC] [VOCAB] [B] [T] [PASSES]   (default llama-d6 256 8 256 5)
#include <stdio.h>  // printf, fprintf
#include <stdlib.h> // malloc, calloc, free, qsort, strtol

#include "base/time.h"         // dsc_now
#include "dsc/status.h"        // dsc_last_error
#include "model/llama/llama.h" // dsc_llama_*

static int arg_int(int argc, char **argv, int i, int def) {
    if (argc <= i) return def;
    char *end = NULL;
    long v = strtol(argv[i], &end, 10);
    return (end != argv[i] && *end == '\0' && v > 0 && v < (1 << 30)) ? (int)v : def;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *spec = argc > 1 ? argv[1] : "llama-d6";
    int V = arg_int(argc, argv, 2, 256), B = arg_int(argc, argv, 3, 8);
    int T = arg_int(argc, argv, 4, 256), passes = arg_int(argc, argv, 5, 5);
    dsc_llama_config c;
    dsc_llama *m = NULL;
    if (dsc_llama_config_parse(spec, V, T, &c) != DSC_OK || dsc_llama_create(&m, &c, B, T)) {
        fprintf(stderr, "bench_llama_cpu: %s\n", dsc_last_error());
        return 1;
    }
    int n = dsc_llama_num_tensors(&c);
    float **p = calloc(n, sizeof *p), **g = calloc(n, sizeof *g);
    for (int i = 0; i < n; i++) {
        dsc_llama_tensor_info info;
        dsc_llama_tensor_info_get(&c, i, &info);
        p[i] = malloc(sizeof(float) * info.numel);
        g[i] = calloc(info.numel, sizeof(float));
    }
    dsc_llama_init_weights(&c, p, 1);
    int32_t *in = malloc(sizeof(int32_t) * B * T), *tg = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) in[i] = (i * 7919) % V, tg[i] = (i * 104729 + 3) % V;
    double *ms = calloc(passes + 1, sizeof(double));
    float loss = 0.0f;
    for (int k = 0; k <= passes; k++) {
        double t0 = dsc_now();
        if (dsc_llama_forward(m, p, in, tg, B, T, NULL, &loss) != DSC_OK ||
            dsc_llama_backward(m, p, g, 1.0f, NULL) != DSC_OK) {
            fprintf(stderr, "bench_llama_cpu: %s\n", dsc_last_error());
            return 1;
        }
        ms[k] = (dsc_now() - t0) * 1e3;
    }
    qsort(ms + 1, passes, sizeof(double), cmp_double);
    double med = ms[1 + passes / 2];
    double flops = dsc_llama_flops_per_token(&c, T) * B * T;
    printf("model %s params %lld B %d T %d loss %.4f\n", spec,
           (long long)dsc_llama_num_params(&c), B, T, loss);
    printf("fwd+bwd median %.1f ms (best %.1f) tokens/s %.0f GFLOP/s %.1f\n", med, ms[1],
           B * T / (med / 1e3), flops / (med / 1e3) / 1e9);
    for (int i = 0; i < n; i++) free(p[i]), free(g[i]);
    free(p), free(g), free(in), free(tg), free(ms);
    dsc_llama_destroy(m);
    return 0;
}
