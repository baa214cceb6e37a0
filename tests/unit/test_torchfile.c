// Unit tests of the PyTorch checkpoint reader (engine/ckpt/torchfile.c, ptzip.c) on files that
// torch.save wrote (tests/unit/torchfile/, made by make_torch_files.py there), and on hostile
// ones: foreign globals, a REDUCE of os.system, truncated archives, lying sizes and offsets.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>    // snprintf
#include <stdlib.h>   // malloc, free
#include <string.h>   // strstr, memcpy
#include <unistd.h>   // access

#include "dsc/status.h"            // dsc_last_error
#include "engine/ckpt/torchfile.h" // dsc_pt_*

#define DIR DSC_SOURCE_DIR "/tests/unit/torchfile/"

static dsc_pt_file *open_ok(const char *name) {
    dsc_pt_file *f = NULL;
    dsc_status st = dsc_pt_open(&f, name);
    if (st != DSC_OK) fail_msg("%s: %s", name, dsc_last_error());
    return f;
}

// Opening must fail with DSC_ERR_CORRUPT and a message holding `want`.
static void refused(const char *name, const char *want) {
    dsc_pt_file *f = NULL;
    dsc_status st = dsc_pt_open(&f, name);
    assert_int_equal(st, DSC_ERR_CORRUPT);
    assert_null(f);
    if (!strstr(dsc_last_error(), want))
        fail_msg("%s: '%s' lacks '%s'", name, dsc_last_error(), want);
}

static const dsc_pt_tensor *tensor(const dsc_pt_value *root, const char *key) {
    const dsc_pt_value *v = dsc_pt_dict_get(root, key);
    assert_non_null(v);
    assert_int_equal(v->kind, DSC_PT_TENSOR);
    return v->t;
}

static void read_all(const dsc_pt_tensor *t, float *out) {
    dsc_pt_tensor_read(t, 0, t->numel, out);
}

static void test_good_tensors(void **state) {
    (void)state;
    dsc_pt_file *f = open_ok(DIR "good.pt");
    const dsc_pt_value *root = dsc_pt_root(f);
    float v[24];
    const dsc_pt_tensor *t = tensor(root, "f32");
    assert_int_equal(t->dtype, DSC_PT_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 4);
    assert_int_equal(t->shape[1], 6);
    read_all(t, v);
    for (int i = 0; i < 24; i++) assert_true(v[i] == 0.5f * (float)i - 3);
    t = tensor(root, "view_t"); // (6, 4), transposed
    read_all(t, v);
    for (int c = 0; c < 6; c++)
        for (int r = 0; r < 4; r++) assert_true(v[c * 4 + r] == 0.5f * (float)(6 * r + c) - 3);
    t = tensor(root, "view_slice"); // rows 1-2, columns 2-4
    assert_int_equal(t->numel, 6);
    read_all(t, v);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++)
            assert_true(v[r * 3 + c] == 0.5f * (float)(6 * (r + 1) + c + 2) - 3);
    dsc_pt_tensor_read(t, 4, 2, v); // a range starting inside the view
    assert_true(v[0] == 0.5f * (float)(6 * 2 + 3) - 3);
    assert_true(v[1] == 0.5f * (float)(6 * 2 + 4) - 3);
    dsc_pt_close(f);
}

static void test_good_dtypes(void **state) {
    (void)state;
    dsc_pt_file *f = open_ok(DIR "good.pt");
    const dsc_pt_value *root = dsc_pt_root(f);
    float v[8];
    const dsc_pt_tensor *t = tensor(root, "bf16");
    assert_int_equal(t->dtype, DSC_PT_BF16);
    read_all(t, v);
    for (int i = 0; i < 5; i++) assert_true(v[i] == 0.25f * (float)i);
    t = tensor(root, "f16");
    assert_int_equal(t->dtype, DSC_PT_F16);
    read_all(t, v);
    for (int i = 0; i < 4; i++) assert_true(v[i] == (float)i - 1.5f);
    read_all(tensor(root, "f64"), v);
    for (int i = 0; i < 3; i++) assert_true(v[i] == (float)i / 4);
    read_all(tensor(root, "i64"), v);
    for (int i = 0; i < 7; i++) assert_true(v[i] == (float)(i - 3));
    t = tensor(root, "scalar");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    read_all(t, v);
    assert_true(v[0] == 2.5f);
    assert_int_equal(tensor(root, "empty")->numel, 0);
    t = tensor(root, "param"); // an nn.Parameter: _rebuild_parameter
    read_all(t, v);
    for (int i = 0; i < 6; i++) assert_true(v[i] == (float)(i + 1));
    dsc_pt_close(f);
}

static void test_good_values(void **state) {
    (void)state;
    dsc_pt_file *f = open_ok(DIR "good.pt");
    const dsc_pt_value *root = dsc_pt_root(f), *od = dsc_pt_dict_get(root, "od");
    assert_non_null(od);
    assert_int_equal(od->kind, DSC_PT_DICT);
    assert_true(dsc_pt_is_str(od->items[0], "b")); // insertion order kept
    const dsc_pt_value *size = dsc_pt_dict_get(od, "b");
    assert_int_equal(size->kind, DSC_PT_TUPLE); // torch.Size
    int64_t x;
    assert_true(dsc_pt_int(dsc_pt_item(size, 1), &x) && x == 3);
    const dsc_pt_value *p = dsc_pt_dict_get(root, "plain");
    assert_int_equal(p->kind, DSC_PT_LIST);
    assert_int_equal(p->n, 13);
    assert_int_equal(dsc_pt_item(p, 0)->kind, DSC_PT_NONE);
    assert_true(dsc_pt_int(dsc_pt_item(p, 1), &x) && x == 1);
    assert_true(dsc_pt_int(dsc_pt_item(p, 2), &x) && x == 0);
    const int64_t ints[] = {7, -3, 300, 70000, 1ll << 40, -(1ll << 40)};
    for (int i = 0; i < 6; i++) assert_true(dsc_pt_int(dsc_pt_item(p, 3 + i), &x) && x == ints[i]);
    double d;
    assert_true(dsc_pt_num(dsc_pt_item(p, 9), &d) && d == 1.5);
    assert_true(dsc_pt_is_str(dsc_pt_item(p, 10), "text"));
    assert_int_equal(dsc_pt_item(p, 11)->kind, DSC_PT_TUPLE);
    assert_true(dsc_pt_is_str(dsc_pt_dict_get(dsc_pt_item(p, 12), "k"), "v"));
    assert_null(dsc_pt_dict_get(root, "absent"));
    dsc_pt_close(f);
}

static void test_deepspeed_objects(void **state) {
    (void)state;
    dsc_pt_file *f = open_ok(DIR "ds_state.pt");
    const dsc_pt_value *root = dsc_pt_root(f);
    const dsc_pt_value *ls = dsc_pt_dict_get(root, "loss_scaler");
    assert_int_equal(ls->kind, DSC_PT_OBJECT);
    assert_string_equal(ls->s, "deepspeed.runtime.fp16.loss_scaler.LossScaler");
    double d;
    int64_t x;
    assert_true(dsc_pt_num(dsc_pt_attr(ls, "cur_scale"), &d) && d == 1.0);
    const dsc_pt_value *dls = dsc_pt_dict_get(root, "dyn_scaler");
    assert_true(dsc_pt_num(dsc_pt_attr(dls, "cur_scale"), &d) && d == 65536.0);
    assert_true(dsc_pt_int(dsc_pt_attr(dls, "cur_iter"), &x) && x == 10);
    assert_true(dsc_pt_int(dsc_pt_dict_get(root, "zero_stage"), &x) && x == 2);
    assert_true(dsc_pt_int(dsc_pt_attr(dsc_pt_dict_get(root, "fragment"), "numel"), &x) &&
                x == 12);
    assert_int_equal(dsc_pt_dict_get(root, "names")->kind, DSC_PT_LIST); // set()
    assert_true(dsc_pt_is_str(dsc_pt_attr(dsc_pt_dict_get(root, "args"), "name"), "run"));
    dsc_pt_close(f);
}

// What torch 2 writes for DeepSpeed 0.18.4 (tests/ckpt/ds_real): a state_dict() with its
// _metadata attribute (a BUILD of the OrderedDict), ZeRO-3's flat groups carrying a ds_id
// attribute (_rebuild_from_type_v2 of torch.Tensor).
static void test_torch2_deepspeed(void **state) {
    (void)state;
    const char *ck = DSC_SOURCE_DIR "/tests/ckpt/ds_real/gpt2_z3_bf16/ckpt/global_step10/";
    char p[512];
    snprintf(p, sizeof p, "%szero_pp_rank_0_mp_rank_00_model_states.pt", ck);
    dsc_pt_file *f = open_ok(p);
    const dsc_pt_value *mod = dsc_pt_dict_get(dsc_pt_root(f), "module");
    assert_non_null(mod);
    assert_int_equal(mod->kind, DSC_PT_DICT);
    assert_non_null(mod->state); // the attributes BUILD gave it
    assert_non_null(dsc_pt_dict_get(mod->state, "_metadata"));
    dsc_pt_close(f);
    snprintf(p, sizeof p, "%sbf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", ck);
    if (access(p, F_OK)) snprintf(p, sizeof p, "%szero_pp_rank_1_mp_rank_00_optim_states.pt", ck);
    f = open_ok(p);
    const dsc_pt_value *osd = dsc_pt_dict_get(dsc_pt_root(f), "optimizer_state_dict");
    const dsc_pt_value *g = dsc_pt_item(dsc_pt_dict_get(osd, "fp32_flat_groups"), 0);
    assert_non_null(g);
    assert_int_equal(g->kind, DSC_PT_TENSOR);
    assert_int_equal(g->t->dtype, DSC_PT_F32);
    assert_int_equal(g->t->ndim, 1);
    assert_true(g->t->numel > 0);
    dsc_pt_close(f);
}

static void test_hostile(void **state) {
    (void)state;
    refused(DIR "os_system.pt", "global posix.system is not one torch.save writes");
    refused(DIR "eval.pt", "global __builtin__.eval is not");
    refused(DIR "foreign.pt", "collections.Counter");
    refused(DIR "legacy.pt", "legacy torch.save file");
    refused(DIR "compressed.pt", "compressed");
    refused(DIR "lying_numel.pt", "9 elements of 4 bytes, but its entry holds 16 bytes");
    refused(DIR "short_storage.pt", "entry holds 8 bytes");
    refused(DIR "short_view.pt", "reaches element 4 of a storage of 4");
    // Nothing ran: the file's os.system would have created this in the working directory.
    assert_int_not_equal(access("dsc-torchfile-test-ran-code", F_OK), 0);
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc(*len);
    assert_int_equal(fread(b, 1, *len, fp), *len);
    fclose(fp);
    return b;
}

// Every truncation of a good file is refused (the end record moves or vanishes).
static void test_truncated(void **state) {
    (void)state;
    size_t len;
    unsigned char *b = slurp(DIR "good.pt", &len);
    for (size_t n = 0; n < len; n++) {
        dsc_pt_file *f = NULL;
        assert_int_not_equal(dsc_pt_open_mem(&f, b, n, "good.pt (truncated)"), DSC_OK);
        assert_null(f);
    }
    free(b);
}

static size_t find_sig(const unsigned char *b, size_t len, uint32_t sig, bool last) {
    size_t at = len;
    for (size_t i = 0; i + 4 <= len; i++) {
        uint32_t v;
        memcpy(&v, b + i, 4);
        if (v == sig) {
            at = i;
            if (!last) break;
        }
    }
    assert_true(at < len);
    return at;
}

// Offsets and sizes in the archive's records that point outside the file, or disagree.
static void test_lying_archive(void **state) {
    (void)state;
    size_t len;
    unsigned char *b = slurp(DIR "good.pt", &len), *m = malloc(len);
    size_t eocd = find_sig(b, len, 0x06054b50, true), cen = find_sig(b, len, 0x02014b50, false);
    const struct { size_t at; uint32_t v; const char *want; } lies[] = {
        {eocd + 16, 0x7fffffff, "does not fit"},       // central directory offset
        {eocd + 12, 0x7fffffff, "does not fit"},       // central directory size
        {cen + 42, 0x7ffffff0, "no local header"},     // first entry's local header
        {cen + 24, 0x7ffffff0, "inconsistent sizes"},  // uncompressed != compressed
    };
    for (size_t k = 0; k < sizeof lies / sizeof lies[0]; k++) {
        memcpy(m, b, len);
        memcpy(m + lies[k].at, &lies[k].v, 4);
        dsc_pt_file *f = NULL;
        assert_int_equal(dsc_pt_open_mem(&f, m, len, "lie.pt"), DSC_ERR_CORRUPT);
        if (!strstr(dsc_last_error(), lies[k].want))
            fail_msg("lie %zu: '%s' lacks '%s'", k, dsc_last_error(), lies[k].want);
    }
    // Both sizes agreeing on a lie: the entry no longer fits before the central directory.
    memcpy(m, b, len);
    uint32_t big = 0x7ffffff0;
    memcpy(m + cen + 20, &big, 4);
    memcpy(m + cen + 24, &big, 4);
    dsc_pt_file *f = NULL;
    assert_int_equal(dsc_pt_open_mem(&f, m, len, "lie.pt"), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "lying size or offset"));
    free(m);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_tensors),  cmocka_unit_test(test_good_dtypes),
        cmocka_unit_test(test_good_values),   cmocka_unit_test(test_deepspeed_objects),
        cmocka_unit_test(test_torch2_deepspeed),
        cmocka_unit_test(test_hostile),       cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_lying_archive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
