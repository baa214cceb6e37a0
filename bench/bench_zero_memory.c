// bench/bench_zero_memory.c - per-rank bytes of model states at ZeRO stages 0-3 for GPT-2 124M at
// N = 1, 2, 4 ranks (real ranks: forked processes on this machine), against the ZeRO paper's
// formulas for fp32 training with Adam: stage 0 16P, stage 1 8P + 8P/N, stage 2 4P + 12P/N,
// stage 3 16P/N bytes (P parameters; parameters 4P, gradients 4P, moments 8P). The measured bytes
// are the engine pool's own accounting (blocks tagged zero.params / zero.grads / zero.optim /
// zero.master, dsc_engine_memory_get); the pool's total allocated bytes are shown beside them.
#include <stdio.h>    // printf
#include <stdlib.h>   // setenv
#include <string.h>   // memset
#include <sys/wait.h> // waitpid
#include <unistd.h>   // fork, pipe

#include "dsc/engine.h"      // dsc_engine_*
#include "dsc/memory.h"      // dsc_mem_pool_stats
#include "model/gpt2/gpt2.h" // dsc_gpt2_*

static int rank_main(int stage, int rank, int world, int fd) {
    dsc_gpt2_config mc;
    if (dsc_gpt2_config_parse("gpt2-124M", 50257, 1024, &mc) != DSC_OK) return 1;
    int n = dsc_gpt2_num_tensors(&mc);
    dsc_param_desc pd[256];
    dsc_gpt2_tensor_info info[256];
    for (int i = 0; i < n; i++) {
        dsc_gpt2_tensor_info_get(&mc, i, &info[i]);
        pd[i] = (dsc_param_desc){.name = info[i].name, .ndim = info[i].ndim, .group = info[i].group};
        for (int d = 0; d < info[i].ndim; d++) pd[i].shape[d] = info[i].shape[d];
    }
    char json[256];
    snprintf(json, sizeof json, "{\"train_batch_size\": %d, \"optimizer\": {\"type\": \"AdamW\"}, "
             "\"zero_optimization\": {\"stage\": %d}}", world, stage);
    dsc_engine_opts o = {.config_json = json, .params = pd, .nparams = n, .rank = rank, .world_size = world};
    dsc_engine *e;
    if (dsc_engine_create(&e, &o) != DSC_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, dsc_last_error());
        return 1;
    }
    dsc_engine_memory m;
    dsc_engine_memory_get(e, &m);
    dsc_mem_stats ps;
    if (dsc_mem_pool_stats(dsc_engine_mem_pool(e), &ps) != DSC_OK) return 1;
    double row[3] = {(double)(m.params + m.grads + m.optimizer), (double)dsc_engine_num_elements(e),
                     (double)ps.allocated};
    if (rank == 0 && write(fd, row, sizeof row) != sizeof row) return 1;
    dsc_engine_destroy(e);
    return 0;
}

int main(void) {
    printf("ZeRO model-state memory per rank, GPT-2 124M, fp32 + AdamW\n");
    printf("| stage | N | measured MiB | formula MiB | measured / formula | pool allocated MiB |\n"
           "|---|---|---|---|---|---|\n");
    int port = 29000 + (int)(getpid() % 1000), bad = 0;
    for (int stage = 0; stage <= 3; stage++) {
        for (int world = 1; world <= 4; world *= 2) {
            int fds[2];
            if (pipe(fds) != 0) return 1;
            char sport[16];
            snprintf(sport, sizeof sport, "%d", port++);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", sport, 1);
            pid_t pids[4];
            for (int r = 0; r < world; r++)
                if ((pids[r] = fork()) == 0) _exit(rank_main(stage, r, world, fds[1]));
            close(fds[1]);
            double row[3] = {0, 0, 0};
            ssize_t got = read(fds[0], row, sizeof row);
            close(fds[0]);
            int ok = got == (ssize_t)sizeof row;
            for (int r = 0; r < world; r++) {
                int status;
                waitpid(pids[r], &status, 0);
                ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
            }
            double P = row[1], N = world;
            double formula = stage == 0 ? 16 * P : stage == 1 ? 8 * P + 8 * P / N
                           : stage == 2 ? 4 * P + 12 * P / N : 16 * P / N;
            double ratio = ok ? row[0] / formula : 0;
            printf("| %d | %d | %.1f | %.1f | %.3f%s | %.1f |\n", stage, world, row[0] / (1 << 20),
                   formula / (1 << 20), ratio, ok ? "" : " (run failed)", row[2] / (1 << 20));
            // The model states are part of the pool; the rest is fault tolerance's snapshots.
            bad |= !ok || ratio > 1.05 || ratio < 0.95 || row[2] < row[0];
        }
    }
    printf("%s\n", bad ? "some stage is outside 5% of its formula" : "every stage within 5% of its formula");
    return bad;
}
