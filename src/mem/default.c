// mem/default.c - the process-wide default pools (one per device) and dsc_memory_stats.
#include <pthread.h> // pthread_mutex_t
#include <string.h>  // memset

#include "base/status.h"   // dsc__fail
#include "mem/pool_impl.h" // dsc_mem_pool

#define MAX_DEVICES 64

// Index 0 is the host, index d + 1 device d. Guarded by g_mu; g_mu is taken before a pool's
// mutex, never after, so the two cannot deadlock.
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static dsc_mem_pool *g_pools[MAX_DEVICES + 1];

static dsc_status slot_of(int device, int *slot) {
    if (device < DSC_MEM_HOST || device >= MAX_DEVICES)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "memory: device %d is out of range (-1 for host, "
                         "0..%d for CUDA devices)",
                         device, MAX_DEVICES - 1);
#ifndef DSC_WITH_CUDA
    if (device != DSC_MEM_HOST)
        return dsc__fail(DSC_ERR_UNSUPPORTED,
                         "memory: device %d: this build of dsc has no CUDA "
                         "support; only host memory (device -1) exists",
                         device);
#endif
    *slot = device + 1;
    return DSC_OK;
}

dsc_status dsc_mem_default_pool(int device, dsc_mem_pool **out) {
    int slot = 0;
    if (!out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_mem_default_pool: out is NULL");
    *out = NULL;
    DSC_TRY(slot_of(device, &slot));
    dsc_status st = DSC_OK;
    pthread_mutex_lock(&g_mu);
    if (!g_pools[slot]) st = dsc_mem_pool_create(&g_pools[slot], device, 0, NULL);
    *out = g_pools[slot];
    pthread_mutex_unlock(&g_mu);
    return st;
}

dsc_status dsc_memory_stats(int device, dsc_mem_stats *out) {
    int slot = 0;
    if (!out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_memory_stats: out is NULL");
    memset(out, 0, sizeof *out);
    DSC_TRY(slot_of(device, &slot));
    dsc_status st = DSC_OK;
    pthread_mutex_lock(&g_mu);
    if (g_pools[slot]) st = dsc_mem_pool_stats(g_pools[slot], out);
    pthread_mutex_unlock(&g_mu);
    return st;
}

void dsc_mem_shutdown(void) {
    pthread_mutex_lock(&g_mu);
    for (int s = 0; s <= MAX_DEVICES; s++) {
        dsc_mem_pool_destroy(g_pools[s]);
        g_pools[s] = NULL;
    }
    pthread_mutex_unlock(&g_mu);
}
