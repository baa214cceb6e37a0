// cuda/device_model.cu - see device_model.h.
#include "cuda/device_model.h"

#include "cuda/common.cuh" // DSC_CUDA_TRY, DSC_CUDA_ARG
#include "cuda/kernels.h"  // dsc__cuda_sum

// Ids in [0, V); with ignore_negative, negative ids (ignored targets) pass too.
static dsc_status check_ids(const int32_t *tok, const char *who, const char *what, int n, int T,
                            int V, bool ignore_negative) {
    for (int i = 0; i < n; i++) {
        if (tok[i] < V && (tok[i] >= 0 || ignore_negative)) continue;
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s forward: %s[b=%d, t=%d] = %d is outside the vocabulary [0, %d); "
                         "check the tokenizer and vocab_size",
                         who, what, i / T, i % T, tok[i], V);
    }
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_tokens_upload(int32_t *tokens, const int32_t *inputs,
                                              const int32_t *targets, int B, int T, int V,
                                              const char *who, int *ntargets, void *stream) {
    int BT = B * T;
    cudaStream_t st = (cudaStream_t)stream;
    DSC_TRY(check_ids(inputs, who, "inputs", BT, T, V, false));
    if (targets) DSC_TRY(check_ids(targets, who, "targets", BT, T, V, true));
    *ntargets = 0;
    for (int i = 0; targets && i < BT; i++) *ntargets += targets[i] >= 0;
    DSC_CUDA_TRY(cudaMemcpyAsync(tokens, inputs, sizeof(int32_t) * BT, cudaMemcpyHostToDevice, st));
    if (targets)
        DSC_CUDA_TRY(cudaMemcpyAsync(tokens + BT, targets, sizeof(int32_t) * BT,
                                     cudaMemcpyHostToDevice, st));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_positions_upload(int32_t *dst, const int32_t *pos, int B, int T,
                                                 int max_pos, const char *who, void *stream) {
    for (int64_t i = 0; i < (int64_t)B * T; i++)
        if (pos[i] < 0 || pos[i] >= max_pos)
            return dsc__fail(DSC_ERR_INVALID_ARG, "%s: position id pos[b=%d, t=%d] = %d is outside "
                             "[0, %d), the sequence length this model was created for", who,
                             (int)(i / T), (int)(i % T), pos[i], max_pos);
    DSC_CUDA_TRY(cudaMemcpyAsync(dst, pos, sizeof(int32_t) * (size_t)B * T,
                                 cudaMemcpyHostToDevice, (cudaStream_t)stream));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_table_check(const void *const *t, int n, const char *who,
                                            const char *what,
                                            void (*name)(const void *cfg, int i, char *buf,
                                                         int cap),
                                            const void *cfg, const bool *required) {
    DSC_CUDA_ARG(t != NULL, "%s: the %s array is NULL", who, what);
    for (int i = 0; i < n; i++) {
        if (t[i] || (required && !required[i])) continue;
        char buf[128];
        name(cfg, i, buf, (int)sizeof buf);
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: %s[%d] (%s) is NULL", who, what, i, buf);
    }
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_mean_loss(float *loss_dev, const float *losses, int64_t n,
                                          int ntargets, void *stream) {
    float scale = ntargets ? 1.0f / (float)ntargets : 0.0f; // 0 when all are ignored
    return dsc__cuda_sum(loss_dev, losses, n, scale, stream);
}

extern "C" dsc_status dsc__cuda_mean_loss_read(float *loss, float *loss_dev, const float *losses,
                                               int64_t n, int ntargets, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    DSC_TRY(dsc__cuda_mean_loss(loss_dev, losses, n, ntargets, stream));
    DSC_CUDA_TRY(cudaMemcpyAsync(loss, loss_dev, sizeof(float), cudaMemcpyDeviceToHost, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    return DSC_OK;
}

extern "C" size_t dsc__cuda_carve(const dsc__cuda_carve_entry *t, size_t n, char *base) {
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (base) *t[i].view = t[i].bytes ? base + off : NULL;
        off += (t[i].bytes + 255) / 256 * 256;
    }
    return off;
}
