// ckpt/export.c - one consolidated safetensors file from a sharded checkpoint (the role of
// DeepSpeed's zero_to_fp32.py): every parameter whole, under its Hugging Face name.
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, malloc, free
#include <string.h> // strcmp

#include "base/status.h"             // dsc__fail
#include "dsc/checkpoint.h"          // dsc_ckpt_export
#include "dsc/half.h"                // dsc_fp32_to_bf16_n
#include "engine/ckpt/reader.h"      // struct dsc_ckpt
#include "engine/ckpt/safetensors.h" // dsc_st_write

static dsc_status export_tensors(const dsc_ckpt *ck, bool bf16, dsc_st_tensor *ts, void **bufs) {
    const dsc__manifest *m = &ck->m;
    float *tmp = NULL;
    for (int i = 0; i < m->nparams; i++) {
        const dsc__mparam *p = &m->params[i];
        size_t n = (size_t)p->numel;
        bufs[i] = malloc(n * (bf16 ? 2 : 4));
        if (bf16) {
            free(tmp);
            tmp = malloc(n * sizeof(float));
        }
        if (!bufs[i] || (bf16 && !tmp)) {
            free(tmp);
            return dsc__fail(DSC_ERR_OOM, "out of memory exporting %s", p->name);
        }
        dsc__ckpt_read_flat(ck, 0, p->off, n, bf16 ? tmp : bufs[i]);
        if (bf16) dsc_fp32_to_bf16_n(bufs[i], tmp, n);
        ts[i] = (dsc_st_tensor){.name = p->name, .dtype = bf16 ? "BF16" : "F32", .ndim = p->ndim,
                                .data = bufs[i], .nbytes = n * (bf16 ? 2 : 4)};
        for (int d = 0; d < p->ndim; d++) ts[i].shape[d] = p->shape[d];
    }
    free(tmp);
    return DSC_OK;
}

dsc_status dsc_ckpt_export(const char *dir, const char *tag, const char *out_path,
                           const char *dtype) {
    bool bf16 = dtype && !strcmp(dtype, "bf16");
    if (dtype && !bf16 && strcmp(dtype, "fp32") != 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "export dtype %s: use fp32 or bf16", dtype);
    dsc_ckpt *ck;
    DSC_TRY(dsc_ckpt_open(&ck, dir, tag));
    int n = ck->m.nparams;
    dsc_st_tensor *ts = calloc((size_t)n, sizeof *ts);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    dsc_status st = ts && bufs ? export_tensors(ck, bf16, ts, bufs)
                               : dsc__fail(DSC_ERR_OOM, "out of memory exporting %s", ck->path);
    if (st == DSC_OK) {
        char step[32];
        snprintf(step, sizeof step, "%lld", (long long)ck->m.step);
        // "format": "pt" is what Hugging Face's loaders expect of PyTorch weights.
        const char *meta[] = {"format", "pt", "dsc_tag", ck->m.tag, "dsc_step", step,
                              "dsc_source", "dsc ckpt export"};
        st = dsc_st_write(out_path, ts, n, meta, 4);
    }
    for (int i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    dsc_ckpt_close(ck);
    return st;
}
