// cli/cmd_report.c - `dsc report`: version, build features, devices, native ops (like ds_report).
#include <dlfcn.h>  // dlopen, dlsym
#include <stdio.h>  // printf
#include <string.h> // strcmp

#include "cli/args.h"       // cli_parse
#include "cli/commands.h"   // cmd_report
#include "dsc/comm.h"       // dsc_comm_backend_available
#include "dsc/model.h"      // dsc_model_num_families, dsc_model_family
#include "dsc_build_info.h" // DSC_*
#ifdef _OPENMP
#include <omp.h> // omp_get_max_threads
#endif

static const char *yes_no(int x) { return x ? "yes" : "no"; }

static const char *cpu_simd(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return "AVX-512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "AVX2+FMA";
    return "scalar";
}

// Count CUDA devices through the driver library if one is installed; no link-time dependency.
static int cuda_devices(char *why, size_t cap) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, cap, "no CUDA driver (libcuda.so.1) on this machine");
        return 0;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
    int n = 0;
    if (!init || !count || init(0) != 0 || count(&n) != 0) {
        snprintf(why, cap, "CUDA driver present but no usable device");
        n = 0;
    }
    dlclose(lib);
    return n;
}

int cmd_report(int argc, char **argv) {
    const cli_verb v = {"report", "dsc report",
                        "Show dsc's version, what this build has (CPU SIMD, OpenMP, BLAS, MPI, "
                        "CUDA, NCCL, HIP), the devices found and which native ops are built.",
                        NULL, 0, 0, 0};
    char *pos[1];
    int npos;
    int rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    char why[128] = "";
    int ngpu = cuda_devices(why, sizeof why);
    printf("dsc report\n----------\n");
    printf("%-28s %s (%s, %s)\n", "dsc version", DSC_VERSION_STRING, DSC_BUILD_TYPE, DSC_C_COMPILER);
    printf("%-28s %s\n", "CPU SIMD", cpu_simd());
    printf("%-28s %s (%d threads)\n", "OpenMP", yes_no(DSC_FEATURE_OPENMP), threads);
    printf("%-28s %s\n", "BLAS", DSC_BLAS_NAME);
    printf("%-28s %s %s\n", "MPI", yes_no(DSC_FEATURE_MPI), DSC_MPI_VERSION);
    printf("%-28s %s %s\n", "CUDA toolkit at build", yes_no(DSC_FEATURE_CUDA_TOOLKIT), DSC_CUDA_VERSION);
    printf("%-28s %s\n", "NCCL at build", yes_no(DSC_FEATURE_NCCL));
    char backends[128] = "";
    const char *names[] = {"shm", "mpi", "nccl"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if (!dsc_comm_backend_available(names[k])) continue;
        size_t n = strlen(backends);
        snprintf(backends + n, sizeof backends - n, "%s%s", n ? ", " : "", names[k]);
    }
    printf("%-28s %s%s\n", "comm backends", backends,
           dsc_comm_backend_available("nccl") ? "" : " (nccl not built: needs CUDA and NCCL)");
    printf("%-28s %s\n", "hipcc at build", yes_no(DSC_FEATURE_HIP));
    printf("%-28s DS_BUILD_OPS=%d DS_BUILD_HIP=%d\n", "build switches", DSC_BUILD_OPS, DSC_BUILD_HIP);
    printf("%-28s %d%s%s%s\n", "CUDA devices", ngpu, why[0] ? " (" : "", why, why[0] ? ")" : "");
    printf("\nnative ops\n");
    printf("  %-26s built (%s)\n", "cpu_adam / cpu_lion / sgd", cpu_simd());
    for (int i = 0; i < dsc_model_num_families(); i++) { // each model family's host passes
        char what[64];
        snprintf(what, sizeof what, "%s cpu fwd/bwd", dsc_model_family(i)->family);
        printf("  %-26s built (%s)\n", what, DSC_BLAS_NAME);
    }
#ifdef DSC_GPU_TARGETS
    printf("  %-26s built (%s)\n", "gpu kernels", DSC_GPU_TARGETS);
#else
    printf("  %-26s not built (configure where nvcc is found, or with DS_BUILD_OPS=1; "
           "DS_BUILD_HIP=1 for ROCm)\n", "gpu kernels");
#endif
    return 0;
}
