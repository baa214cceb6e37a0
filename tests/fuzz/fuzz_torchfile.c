// libFuzzer harness for the PyTorch checkpoint reader: arbitrary bytes as a torch.save file (zip
// records, the pickle, storages). See tests/fuzz/README.md; tests/unit/test_torchfile_fuzz.c
// drives the same function with its own mutations for a bounded time in the suite.
//
// The reader gets the fuzzer's buffer itself (dsc_pt_open_mem), so that AddressSanitizer sees
// any read past its end. When the reader accepts a file, the harness checks what acceptance
// promises: every tensor's storage lies inside the buffer, every element its shape and strides
// reach lies inside its storage, and reading the tensor touches nothing else.
#include <stdint.h> // uint8_t
#include <stdlib.h> // abort, malloc, free

#include "engine/ckpt/torchfile.h" // dsc_pt_*

enum { MAX_DEPTH = 64, MAX_VISITS = 100000, MAX_READ = 4096 };

static void check_tensor(const dsc_pt_tensor *t, const uint8_t *data, size_t size) {
    size_t es = dsc_pt_dtype_size(t->dtype);
    const uint8_t *s = t->storage;
    if (t->storage_numel < 0 || s < data ||
        (size_t)t->storage_numel > (size - (size_t)(s - data)) / es)
        abort(); // a storage outside the file
    if (t->ndim < 0 || t->ndim > DSC_PT_MAX_DIMS || t->numel < 0) abort();
    if (t->numel == 0) return;
    unsigned __int128 last = (uint64_t)t->offset;
    for (int d = 0; d < t->ndim; d++) last += (unsigned __int128)(t->shape[d] - 1) * t->stride[d];
    if (last >= (uint64_t)t->storage_numel) abort(); // a view reaching past its storage
    int64_t n = t->numel < MAX_READ ? t->numel : MAX_READ;
    float *out = malloc((size_t)n * sizeof *out);
    if (!out) return;
    dsc_pt_tensor_read(t, 0, n, out);
    dsc_pt_tensor_read(t, t->numel - 1, 1, out);
    free(out);
}

// Values may share children or form cycles through the memo: depth and visits are bounded.
static void walk(const dsc_pt_value *v, int depth, int *visits, const uint8_t *data,
                 size_t size) {
    if (!v || depth > MAX_DEPTH || ++*visits > MAX_VISITS) return;
    if (v->kind == DSC_PT_TENSOR) check_tensor(v->t, data, size);
    if (v->n < 0 || (v->n && !v->items)) abort();
    for (int i = 0; i < v->n; i++) walk(v->items[i], depth + 1, visits, data, size);
    if (v->kind == DSC_PT_OBJECT) walk(v->state, depth + 1, visits, data, size);
    if (v->kind == DSC_PT_DICT && v->n % 2) abort(); // a key without its value
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsc_pt_file *f = NULL;
    if (dsc_pt_open_mem(&f, data, size, "fuzz.pt") == DSC_OK) {
        int visits = 0;
        walk(dsc_pt_root(f), 0, &visits, data, size);
        (void)dsc_pt_dict_get(dsc_pt_root(f), "module");
    }
    dsc_pt_close(f);
    return 0;
}
