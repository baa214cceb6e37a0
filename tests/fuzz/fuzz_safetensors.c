// libFuzzer harness for the safetensors reader: arbitrary bytes as a .safetensors file (header
// length, JSON header, dtypes, shapes, data_offsets). Not part of CI; see tests/fuzz/README.md.
//
// The bytes go to an in-memory file (memfd) opened through its /proc/self/fd path, so the reader
// maps them exactly as it maps a checkpoint shard. When the reader accepts a file, the harness
// checks what acceptance promises: every size fits its shape and dtype, and the tensors' bytes
// tile the data region (sorted by address they start at the first data byte, follow each other
// without gap or overlap, and end at the end of the file) with the file's own bytes in them.
#define _GNU_SOURCE
#include <stdint.h>   // uint8_t
#include <stdio.h>    // snprintf
#include <stdlib.h>   // abort, malloc, free, qsort
#include <string.h>   // memcmp, memcpy
#include <sys/mman.h> // memfd_create
#include <unistd.h>   // write, close

#include "engine/ckpt/safetensors.h" // dsc_st_*

static int by_address(const void *x, const void *y) {
    const dsc_st_tensor *a = *(const dsc_st_tensor *const *)x;
    const dsc_st_tensor *b = *(const dsc_st_tensor *const *)y;
    if (a->data != b->data) return (const char *)a->data < (const char *)b->data ? -1 : 1;
    return (a->nbytes > b->nbytes) - (a->nbytes < b->nbytes);
}

// Size from the shape in 128-bit arithmetic, so that a product the reader wrapped shows up here.
static void check_size(const dsc_st_tensor *t) {
    unsigned __int128 bytes = dsc_st_dtype_size(t->dtype);
    if (!bytes || t->ndim < 0 || t->ndim > DSC_ST_MAX_DIMS) abort();
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0) abort();
        bytes *= (uint64_t)t->shape[d];
        if (bytes > SIZE_MAX) abort();
    }
    if (bytes != t->nbytes) abort();
}

static void check_accepted(const dsc_st_file *f, const uint8_t *data, size_t size) {
    uint64_t hlen;
    memcpy(&hlen, data, 8);
    const uint8_t *region = data + 8 + hlen;
    size_t data_len = size - 8 - hlen;
    int n = dsc_st_count(f);
    const dsc_st_tensor **t = malloc(((size_t)n + 1) * sizeof *t);
    if (!t) return;
    for (int i = 0; i < n; i++) {
        t[i] = dsc_st_get(f, i);
        check_size(t[i]);
    }
    qsort(t, (size_t)n, sizeof *t, by_address);
    size_t at = 0; // offset in the data region of the next expected byte
    for (int i = 0; i < n; i++) {
        if (i > 0 && (const char *)t[i]->data != (const char *)t[i - 1]->data + t[i - 1]->nbytes)
            abort(); // a gap or an overlap
        if (at + t[i]->nbytes > data_len || memcmp(t[i]->data, region + at, t[i]->nbytes)) abort();
        at += t[i]->nbytes;
    }
    if (at != data_len) abort(); // bytes no tensor owns
    free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0) return 0;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    dsc_st_file *f = NULL;
    if (done == size && dsc_st_open(&f, path) == DSC_OK) {
        check_accepted(f, data, size);
        for (int i = 0; i < dsc_st_count(f); i++) (void)dsc_st_find(f, dsc_st_get(f, i)->name);
        (void)dsc_st_meta(f, "format");
    }
    dsc_st_close(f);
    close(fd);
    return 0;
}
