// ptwrite_emit DIR: writes torch.save files with dsc's writer (engine/ckpt/ptwrite.c) for
// tests/ckpt/test_ptwrite_torch.sh, whose ptwrite_check.py builds the same values in Python and
// compares what torch.load reads with them. Keep the two in step: every value here is there.
#include <math.h>   // INFINITY, NAN
#include <stdint.h> // int64_t
#include <stdio.h>  // fprintf, snprintf
#include <stdlib.h> // malloc, free

#include "dsc/status.h"          // dsc_last_error
#include "engine/ckpt/ptwrite.h" // dsc__ptw_*

static const char *dir;
static int failed;

// Tensor contents both sides compute: byte j of a tensor with this seed; bools hold 0 or 1.
static void tensor(dsc__ptw *w, dsc_pt_dtype dtype, int seed, int ndim, const int64_t *shape) {
    size_t bytes = dsc_pt_dtype_size(dtype);
    for (int d = 0; d < ndim; d++) bytes *= (size_t)shape[d];
    uint8_t *b = malloc(bytes ? bytes : 1);
    for (size_t j = 0; j < bytes; j++) {
        b[j] = (uint8_t)(j * 131 + (size_t)seed * 71 + 7);
        if (dtype == DSC_PT_BOOL8) b[j] &= 1;
    }
    dsc__ptw_tensor(w, dtype, ndim, shape, b);
    free(b);
}

static void save(dsc__ptw *w, const char *name, const char *archive) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (dsc__ptw_save(w, path, archive) != DSC_OK) {
        fprintf(stderr, "ptwrite_emit: %s\n", dsc_last_error());
        failed = 1;
    }
    dsc__ptw_free(w);
}

static dsc__ptw *writer(void) {
    dsc__ptw *w = NULL;
    if (dsc__ptw_new(&w) != DSC_OK) {
        fprintf(stderr, "ptwrite_emit: %s\n", dsc_last_error());
        exit(1);
    }
    return w;
}

// Every dtype in 7 shapes: a scalar, 1 to 4 dimensions, two empty ones. Key "<dtype>_<case>".
static const int64_t shapes[7][5] = {{0}, {1, 5}, {2, 3, 4}, {3, 2, 1, 3}, {4, 2, 3, 1, 2},
                                     {2, 0, 3}, {3, 3, 0, 2}}; // ndim, then the shape
static void all_tensors(dsc__ptw *w, int first_seed) {
    dsc__ptw_dict_begin(w);
    for (int dt = 0; dt <= DSC_PT_BOOL8; dt++)
        for (int c = 0; c < 7; c++) {
            char key[32];
            snprintf(key, sizeof key, "%s_%d", dsc_pt_dtype_name((dsc_pt_dtype)dt), c);
            dsc__ptw_str(w, key);
            tensor(w, (dsc_pt_dtype)dt, first_seed + 7 * dt + c, (int)shapes[c][0], shapes[c] + 1);
        }
    dsc__ptw_dict_end(w);
}

static void values(dsc__ptw *w) {
    const int64_t ints[] = {0, 1, 255, 256, 65535, 65536, -1, -128, -129, INT32_MAX, INT32_MIN,
                            (int64_t)INT32_MAX + 1, (int64_t)INT32_MIN - 1, (int64_t)1 << 39,
                            -((int64_t)1 << 39), -((int64_t)1 << 39) - 1, INT64_MAX, INT64_MIN};
    const double floats[] = {0.0, -0.0, 1.5, -2.25e300, INFINITY, -INFINITY, NAN, 4.9e-324, 0.1};
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "ints");
    dsc__ptw_list_begin(w);
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) dsc__ptw_int(w, ints[k]);
    dsc__ptw_list_end(w);
    dsc__ptw_str(w, "floats");
    dsc__ptw_tuple_begin(w);
    for (size_t k = 0; k < sizeof floats / sizeof floats[0]; k++) dsc__ptw_float(w, floats[k]);
    dsc__ptw_tuple_end(w);
    dsc__ptw_str(w, "strs");
    dsc__ptw_list_begin(w);
    dsc__ptw_str(w, "");
    dsc__ptw_str(w, "ünïcödé 日本語 😀");
    dsc__ptw_str(w, "quotes \" ' and a\nnewline");
    dsc__ptw_list_end(w);
    dsc__ptw_str(w, "flags");
    dsc__ptw_tuple_begin(w);
    dsc__ptw_bool(w, true);
    dsc__ptw_bool(w, false);
    dsc__ptw_none(w);
    dsc__ptw_tuple_end(w);
    dsc__ptw_str(w, "tuples"); // (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)
    dsc__ptw_list_begin(w);
    for (int n = 0; n <= 4; n++) {
        dsc__ptw_tuple_begin(w);
        for (int k = 1; k <= n; k++) dsc__ptw_int(w, k);
        dsc__ptw_tuple_end(w);
    }
    dsc__ptw_list_end(w);
    dsc__ptw_str(w, "nested"); // {'a': [{'b': ({},)}, [], OrderedDict()]}
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "a");
    dsc__ptw_list_begin(w);
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "b");
    dsc__ptw_tuple_begin(w);
    dsc__ptw_dict_begin(w);
    dsc__ptw_dict_end(w);
    dsc__ptw_tuple_end(w);
    dsc__ptw_dict_end(w);
    dsc__ptw_list_begin(w);
    dsc__ptw_list_end(w);
    dsc__ptw_ordered_dict_begin(w);
    dsc__ptw_dict_end(w);
    dsc__ptw_list_end(w);
    dsc__ptw_dict_end(w);
    dsc__ptw_str(w, "keys"); // {7: 'int', (1, 'x'): 'tuple', None: 'none', True: 'bool'}
    dsc__ptw_dict_begin(w);
    dsc__ptw_int(w, 7);
    dsc__ptw_str(w, "int");
    dsc__ptw_tuple_begin(w);
    dsc__ptw_int(w, 1);
    dsc__ptw_str(w, "x");
    dsc__ptw_tuple_end(w);
    dsc__ptw_str(w, "tuple");
    dsc__ptw_none(w);
    dsc__ptw_str(w, "none");
    dsc__ptw_bool(w, true);
    dsc__ptw_str(w, "bool");
    dsc__ptw_dict_end(w);
    dsc__ptw_dict_end(w);
}

// OrderedDict([('weight', f32 (4, 3)), ('bias', bf16 (4,)), ('step', 7), ('name', 'layer.0'),
//              ('empty', OrderedDict()), ('shape', [4, 3])])
static void ordered(dsc__ptw *w) {
    const int64_t ws[2] = {4, 3}, bs[1] = {4};
    dsc__ptw_ordered_dict_begin(w);
    dsc__ptw_str(w, "weight");
    tensor(w, DSC_PT_F32, 1, 2, ws);
    dsc__ptw_str(w, "bias");
    tensor(w, DSC_PT_BF16, 2, 1, bs);
    dsc__ptw_str(w, "step");
    dsc__ptw_int(w, 7);
    dsc__ptw_str(w, "name");
    dsc__ptw_str(w, "layer.0");
    dsc__ptw_str(w, "empty");
    dsc__ptw_ordered_dict_begin(w);
    dsc__ptw_dict_end(w);
    dsc__ptw_str(w, "shape");
    dsc__ptw_list_begin(w);
    dsc__ptw_int(w, 4);
    dsc__ptw_int(w, 3);
    dsc__ptw_list_end(w);
    dsc__ptw_dict_end(w);
}

// {'list': [0..1000], 'dict': {'k0': 0, ..., 'k1999': 1999}, 'od': OrderedDict(k0=0..k1000=-1000)}
static void batches(dsc__ptw *w) {
    char key[16];
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "list");
    dsc__ptw_list_begin(w);
    for (int i = 0; i <= 1000; i++) dsc__ptw_int(w, i);
    dsc__ptw_list_end(w);
    dsc__ptw_str(w, "dict");
    dsc__ptw_dict_begin(w);
    for (int i = 0; i < 2000; i++) {
        snprintf(key, sizeof key, "k%d", i);
        dsc__ptw_str(w, key);
        dsc__ptw_int(w, i);
    }
    dsc__ptw_dict_end(w);
    dsc__ptw_str(w, "od");
    dsc__ptw_ordered_dict_begin(w);
    for (int i = 0; i <= 1000; i++) {
        snprintf(key, sizeof key, "k%d", i);
        dsc__ptw_str(w, key);
        dsc__ptw_int(w, -i);
    }
    dsc__ptw_dict_end(w);
    dsc__ptw_dict_end(w);
}

// {'scaler': DynamicLossScaler with its state, 'args': argparse.Namespace(lr=0.001, name='x')}
static void objects(dsc__ptw *w) {
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "scaler");
    dsc__ptw_object_begin(w, "deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler");
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "cur_scale");
    dsc__ptw_float(w, 65536.0);
    dsc__ptw_str(w, "cur_iter");
    dsc__ptw_int(w, 10);
    dsc__ptw_str(w, "scale_window");
    dsc__ptw_int(w, 1000);
    dsc__ptw_str(w, "dynamic");
    dsc__ptw_bool(w, true);
    dsc__ptw_dict_end(w);
    dsc__ptw_object_end(w);
    dsc__ptw_str(w, "args");
    dsc__ptw_object_begin(w, "argparse", "Namespace");
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "lr");
    dsc__ptw_float(w, 0.001);
    dsc__ptw_str(w, "name");
    dsc__ptw_str(w, "x");
    dsc__ptw_dict_end(w);
    dsc__ptw_object_end(w);
    dsc__ptw_dict_end(w);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: ptwrite_emit DIR\n");
        return 2;
    }
    dir = argv[1];
    dsc__ptw *w = writer();
    all_tensors(w, 0);
    save(w, "tensors.pt", NULL);
    w = writer();
    all_tensors(w, 100);
    dsc__ptw_force_zip64(w, true);
    save(w, "zip64.pt", NULL);
    w = writer();
    values(w);
    save(w, "values.pt", NULL);
    w = writer();
    ordered(w);
    save(w, "ordered.pt", "archive");
    w = writer();
    const int64_t none[1] = {0};
    tensor(w, DSC_PT_F32, 5, 0, none);
    save(w, "scalar.pt", NULL);
    w = writer();
    batches(w);
    save(w, "batches.pt", NULL);
    w = writer();
    objects(w);
    save(w, "objects.pt", NULL);
    return failed;
}
