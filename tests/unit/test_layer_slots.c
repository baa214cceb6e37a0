// Tests of the two-slot layer stream (src/engine/gpu/layer_slots.c) on the host, in every build: the
// device layout and view tables made from an engine's groups, and the model's layer hook driven
// through forward and backward passes with ops that act at once on host arrays (a fetch copies
// the layer's weights, a reuse zeroes the gradient slot) and record what they were asked. Checked:
// every layer computes with its own weights and writes its gradients into a zeroed slot; a fetch
// never lands in the slot of the layer computing, nor in a slot whose readers were not released;
// the next layer is always on its way before a layer computes; layers still held are not fetched
// again (between forward and backward, between micro-steps) until the weights change; a gradient
// slot is reused only after the group that used it before was named to the owner.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h> // calloc, free
#include <string.h> // memcpy

#include "engine/gpu/layer_slots.h" // dsc__slots_*
#include "dsc/engine.h"       // dsc_engine_*
#include "engine/device.h"    // dsc__engine_span_of, dsc__engine_param_offset
#include "model/gpt2/gpt2.h"  // dsc_gpt2_*
#include "model/gpt2/model.h" // dsc__model_gpt2_create

static const dsc_gpt2_config cfg = {
    .n_layer = 5, .n_head = 2, .n_embd = 16, .vocab_size = 37, .max_seq_len = 8};

typedef struct sim {
    const dsc_gpt2_config *c;
    dsc_model *model; // the same shape behind the model interface (what the slots read)
    dsc_engine *eng;
    dsc__slots s;
    size_t n;        // device layout length
    uint16_t *dev16; // device arrays (host memory here)
    float *devgrad;
    uint16_t *src;        // every layer's 16-bit weights in the engine's layout (value: a tag)
    uint16_t *fsrc;       // the frozen tensors' in the frozen store's layout (streamed runs)
    uint16_t *fdev;       // the frozen device array (dsc__slots_frozen)
    const uint16_t **p16; // the view tables
    float **grad;
    int ntensors;
    // what the ops saw
    bool in_use[2]; // weight slot k has unreleased readers
    int fetches;
    int gused[2]; // the group that last took gradient slot j
    int reuses;
} sim;

// Layer l's tensor i, element e: a 16-bit tag that names all three.
static uint16_t tag(int i, size_t e) {
    return (uint16_t)(i * 97 + (int)(e % 89) + 1);
}

static dsc_status op_fetch(void *u, int k, int layer) {
    sim *m = u;
    assert_false(m->in_use[k]); // its readers were released
    dsc__engine_span sp;
    dsc__engine_span_of(m->eng, layer + 1, &sp);
    memcpy(m->s.w[k], m->src + sp.off, sp.padded * sizeof(uint16_t));
    if (m->s.fdev) { // the layer's frozen range into frozen slot k
        size_t off, padded;
        dsc__engine_frozen_span(m->eng, layer + 1, &off, &padded);
        memcpy(m->s.fw[k], m->fsrc + off, padded * sizeof(uint16_t));
    }
    m->fetches++;
    return DSC_OK;
}

static dsc_status op_use(void *u, int k) {
    ((sim *)u)->in_use[k] = true;
    return DSC_OK;
}

static dsc_status op_release(void *u, int k) {
    sim *m = u;
    assert_true(m->in_use[k]);
    m->in_use[k] = false;
    return DSC_OK;
}

static dsc_status op_reuse(void *u, int j, int before, int g) {
    sim *m = u;
    assert_int_equal(before, m->gused[j]);
    assert_int_equal(j, (g - 1) & 1);
    memset(m->s.g[j], 0, m->s.slot_len * sizeof(float));
    m->gused[j] = g;
    m->reuses++;
    return DSC_OK;
}

static const dsc__slots_ops ops = {op_fetch, op_use, op_release, op_reuse};

// LoRA's shape of a frozen base: every matrix of the layers frozen (their biases and norms train);
// freeze 2: the embeddings too (group 0).
static bool frozen_in(const dsc_gpt2_config *c, const dsc_gpt2_tensor_info *ti, int freeze) {
    if (freeze == 2 && ti->group == 0) return true;
    return freeze && ti->ndim == 2 && ti->group >= 1 && ti->group <= c->n_layer;
}

static sim make_with(const dsc_gpt2_config *c, int freeze) {
    sim m = {.c = c, .ntensors = dsc_gpt2_num_tensors(c), .gused = {-1, -1}};
    dsc_param_desc *pd = calloc((size_t)m.ntensors, sizeof *pd);
    dsc_gpt2_tensor_info *ti = calloc((size_t)m.ntensors, sizeof *ti);
    for (int i = 0; i < m.ntensors; i++) {
        dsc_gpt2_tensor_info_get(c, i, &ti[i]);
        pd[i] = (dsc_param_desc){.name = ti[i].name, .ndim = ti[i].ndim, .group = ti[i].group,
                                 .frozen = frozen_in(c, &ti[i], freeze)};
        for (int d = 0; d < ti[i].ndim; d++)
            pd[i].shape[d] = ti[i].shape[d];
    }
    dsc_engine_opts eo = {.config_json = "{\"train_batch_size\": 2, \"zero_optimization\": "
                                         "{\"stage\": 3}}",
                          .params = pd,
                          .nparams = m.ntensors,
                          .world_size = 1};
    if (dsc_engine_create(&m.eng, &eo) != DSC_OK) fail_msg("engine: %s", dsc_last_error());
    size_t total = dsc__engine_layout_len(m.eng);
    m.src = calloc(total, sizeof *m.src);
    for (int i = 0; i < m.ntensors; i++) {
        size_t off = dsc__engine_param_offset(m.eng, i);
        if (off == SIZE_MAX) continue; // frozen: not in the layout
        for (int64_t e = 0; e < ti[i].numel; e++)
            m.src[off + (size_t)e] = tag(i, (size_t)e);
    }
    m.n = dsc__slots_layout(m.eng, c->n_layer, NULL, NULL);
    m.dev16 = calloc(m.n, sizeof *m.dev16);
    m.devgrad = calloc(m.n, sizeof *m.devgrad);
    m.p16 = calloc((size_t)m.ntensors, sizeof *m.p16);
    m.grad = calloc((size_t)m.ntensors, sizeof *m.grad);
    free(pd);
    free(ti);
    if (dsc__model_gpt2_create(&m.model, c) != DSC_OK) fail_msg("model: %s", dsc_last_error());
    if (dsc__slots_init(&m.s, m.eng, m.model, m.dev16, m.devgrad, m.n, &ops, NULL) != DSC_OK)
        fail_msg("slots: %s", dsc_last_error());
    dsc__slots_tables(&m.s, m.p16, m.grad);
    return m;
}

static sim make(const dsc_gpt2_config *c) { return make_with(c, 0); }

// make_with, and the frozen tensors streamed through the frozen slots (parameter offload).
static sim make_streamed(const dsc_gpt2_config *c, int freeze) {
    sim m = make_with(c, freeze);
    size_t flen = 0;
    dsc__engine_frozen_store(m.eng, &flen);
    m.fsrc = calloc(flen, sizeof *m.fsrc);
    for (int i = 0; i < m.ntensors; i++) {
        size_t fo = dsc__engine_frozen_offset(m.eng, i);
        int64_t numel = dsc__engine_tensor_numel(m.eng, i);
        for (int64_t e = 0; fo != SIZE_MAX && e < numel; e++)
            m.fsrc[fo + (size_t)e] = tag(i, (size_t)e);
    }
    size_t n = dsc__slots_frozen_layout(m.eng, c->n_layer, NULL, NULL);
    m.fdev = calloc(n, sizeof *m.fdev);
    if (dsc__slots_frozen(&m.s, m.eng, m.fdev, n) != DSC_OK)
        fail_msg("frozen slots: %s", dsc_last_error());
    dsc__slots_tables(&m.s, m.p16, m.grad);
    return m;
}

static void release_sim(sim *m) {
    dsc__slots_free(&m->s);
    dsc_model_destroy(m->model);
    dsc_engine_destroy(m->eng);
    free(m->src);
    free(m->fsrc);
    free(m->fdev);
    free(m->dev16);
    free(m->devgrad);
    free(m->p16);
    free(m->grad);
}

// The layout: resident groups (0 and n_layer + 1) in order, then two slots of the largest layer;
// the tables point resident tensors at their offsets, layer tensors into slot 0.
static void test_layout_and_tables(void **state) {
    sim m = make(&cfg);
    dsc__engine_span first, last, layer;
    dsc__engine_span_of(m.eng, 0, &first);
    dsc__engine_span_of(m.eng, cfg.n_layer + 1, &last);
    dsc__engine_span_of(m.eng, 1, &layer);
    assert_int_equal(m.s.slot_len, layer.padded);
    assert_int_equal(m.n, first.padded + last.padded + 2 * layer.padded);
    assert_int_equal(m.s.dev_off[0], 0);
    assert_int_equal(m.s.dev_off[cfg.n_layer + 1], first.padded);
    assert_ptr_equal(m.s.w[0], m.dev16 + first.padded + last.padded);
    assert_ptr_equal(m.s.g[1], m.devgrad + first.padded + last.padded + layer.padded);
    for (int i = 0; i < m.ntensors; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        dsc__engine_span sp;
        dsc__engine_span_of(m.eng, ti.group, &sp);
        size_t in = dsc__engine_param_offset(m.eng, i) - sp.off;
        if (ti.group >= 1 && ti.group <= cfg.n_layer) {
            assert_ptr_equal(m.p16[i], m.s.w[0] + in);
            assert_ptr_equal(m.grad[i], m.s.g[0] + in);
        } else {
            assert_ptr_equal(m.p16[i], m.dev16 + m.s.dev_off[ti.group] + in);
            assert_ptr_equal(m.grad[i], m.devgrad + m.s.dev_off[ti.group] + in);
        }
    }
    // a device array of the wrong length is refused
    dsc__slots other;
    assert_int_equal(dsc__slots_init(&other, m.eng, m.model, m.dev16, m.devgrad, m.n - 1, &ops, &m),
                     DSC_ERR_INTERNAL);
    dsc__slots_free(&other);
    release_sim(&m);
}

// Layer l computes: its tensors' views hold its own weights; in backward its gradient views are
// in a zeroed slot, which it then writes.
static void compute(sim *m, int pass, int l) {
    int k = -1;
    for (int i = 0; i < m->ntensors; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(m->c, i, &ti);
        if (ti.group != l + 1 || dsc__engine_param_offset(m->eng, i) == SIZE_MAX) continue;
        k = m->p16[i] >= m->s.w[1] && m->p16[i] < m->s.w[1] + m->s.slot_len ? 1 : 0;
        assert_true(m->in_use[k]);
        for (int64_t e = 0; e < ti.numel; e++)
            assert_int_equal(m->p16[i][e], tag(i, (size_t)e));
        if (pass == 1) {
            assert_true(m->grad[i] >= m->s.g[l & 1] && m->grad[i] < m->s.g[l & 1] + m->s.slot_len);
            for (int64_t e = 0; e < ti.numel; e++) {
                assert_true(m->grad[i][e] == 0.0f);
                m->grad[i][e] += 1.0f;
            }
        }
    }
    assert_true(k >= 0);
    for (int i = 0; m->s.fdev && i < m->ntensors; i++) { // streamed frozen tensors: slot k's twin
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(m->c, i, &ti);
        if (ti.group != l + 1 || dsc__engine_param_offset(m->eng, i) != SIZE_MAX) continue;
        assert_true(m->p16[i] >= m->s.fw[k] && m->p16[i] < m->s.fw[k] + m->s.fslot_len);
        for (int64_t e = 0; e < ti.numel; e++)
            assert_int_equal(m->p16[i][e], tag(i, (size_t)e));
        assert_null(m->grad[i]);
    }
}

// One pass (0 forward, 1 backward) with the hook as the model calls it. The next layer must be
// on its way (held by a slot) before each layer computes.
static void pass(sim *m, int p) {
    int L = m->c->n_layer;
    for (int i = 0; i < L; i++) {
        int l = p == 0 ? i : L - 1 - i;
        assert_int_equal(dsc__slots_hook(&m->s, p, l), DSC_OK);
        int next = p == 0 ? l + 1 : l - 1;
        if (next >= 0 && next < L) assert_true(m->s.held[0] == next || m->s.held[1] == next);
        compute(m, p, l);
    }
    assert_int_equal(dsc__slots_hook(&m->s, p, p == 0 ? L : -1), DSC_OK);
    assert_false(m->in_use[0] || m->in_use[1]); // every slot released at the pass's end
}

static void test_hook_passes(void **state) {
    sim m = make(&cfg);
    m.s.user = &m;
    int L = cfg.n_layer;
    pass(&m, 0);
    assert_int_equal(m.fetches, L); // a first forward fetches every layer
    pass(&m, 1);
    assert_int_equal(m.fetches, L + L - 2); // the last two layers were still held
    assert_int_equal(m.reuses, L);
    pass(&m, 0); // the next micro-step: the first two layers are still held
    assert_int_equal(m.fetches, 3 * L - 4);
    pass(&m, 1);
    dsc__slots_forget(&m.s); // an optimizer step changed the weights
    int before = m.fetches;
    pass(&m, 0);
    assert_int_equal(m.fetches - before, L);
    // an evaluation forward, then a training step: the forward's last layers serve the backward
    pass(&m, 0);
    pass(&m, 1);
    release_sim(&m);
}

// One layer: the hook still fetches, uses and releases it, and the backward finds it held; its
// gradients use slot 0 only.
static void test_one_layer(void **state) {
    dsc_gpt2_config c1 = cfg;
    c1.n_layer = 1;
    sim m = make(&c1);
    m.s.user = &m;
    pass(&m, 0);
    pass(&m, 1);
    pass(&m, 0);
    pass(&m, 1);
    assert_int_equal(m.fetches, 1);
    assert_int_equal(m.reuses, 2);
    assert_int_equal(m.gused[0], 1);
    assert_int_equal(m.gused[1], -1);
    release_sim(&m);
}

// Frozen tensors (LoRA's base) are outside the layout: no offset there, one in the engine's
// frozen store; the tables give them no gradient and leave their weight views to the caller;
// the passes point and fetch the trained tensors only.
static void test_frozen_tensors(void **state) {
    sim m = make_with(&cfg, 1);
    size_t flen = 0;
    const float *store = dsc__engine_frozen_store(m.eng, &flen);
    assert_non_null(store);
    size_t seen = 0, trained = 0;
    for (int i = 0; i < m.ntensors; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        if (frozen_in(&cfg, &ti, 1)) {
            assert_true(dsc__engine_param_offset(m.eng, i) == SIZE_MAX);
            size_t fo = dsc__engine_frozen_offset(m.eng, i);
            assert_true(fo + (size_t)ti.numel <= flen);
            assert_null(m.grad[i]);
            assert_null(m.p16[i]); // untouched: the caller points it at its 16-bit copy
            seen += (size_t)ti.numel;
        } else {
            assert_true(dsc__engine_frozen_offset(m.eng, i) == SIZE_MAX);
            assert_non_null(m.grad[i]);
            trained++;
        }
    }
    assert_true(seen > 0 && seen <= flen && trained > 0);
    m.s.user = &m;
    pass(&m, 0);
    pass(&m, 1);
    for (int i = 0; i < m.ntensors; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        if (frozen_in(&cfg, &ti, 1)) assert_null(m.grad[i]);
    }
    release_sim(&m);
}

// The frozen tensors streamed too (parameter offload with LoRA): the frozen device array holds
// the end groups' frozen tensors (here the embeddings) in front of two slots of the largest
// layer's frozen range; a layer computes with its frozen tensors in the twin of its weight slot,
// fetched with it; the embeddings point into the array's front; none has a gradient.
static void test_frozen_streamed(void **state) {
    sim m = make_streamed(&cfg, 2);
    size_t off, padded, slot, end_off[2];
    size_t n = dsc__slots_frozen_layout(m.eng, cfg.n_layer, &slot, end_off);
    dsc__engine_frozen_span(m.eng, 0, &off, &padded);
    assert_true(padded > 0);
    assert_int_equal(end_off[0], 0);
    assert_int_equal(end_off[1], padded);
    size_t last_off, last_padded, layer_off, layer_padded;
    dsc__engine_frozen_span(m.eng, cfg.n_layer + 1, &last_off, &last_padded);
    dsc__engine_frozen_span(m.eng, 1, &layer_off, &layer_padded);
    assert_int_equal(slot, layer_padded);
    assert_int_equal(n, padded + last_padded + 2 * slot);
    assert_ptr_equal(m.s.fw[0], m.fdev + padded + last_padded);
    for (int i = 0; i < m.ntensors; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        if (ti.group != 0) continue;
        assert_true(dsc__engine_param_offset(m.eng, i) == SIZE_MAX); // frozen
        assert_ptr_equal(m.p16[i], m.fdev + dsc__engine_frozen_offset(m.eng, i));
        assert_null(m.grad[i]);
    }
    m.s.user = &m;
    pass(&m, 0);
    pass(&m, 1);
    pass(&m, 0);
    pass(&m, 1);
    // resident weights (no weight slots) take no frozen stream; a wrong length is refused
    sim r = make_with(&cfg, 2);
    dsc__slots resident;
    assert_int_equal(dsc__slots_init(&resident, r.eng, r.model, NULL, r.devgrad, r.n, &ops, &r),
                     DSC_OK);
    assert_int_equal(dsc__slots_frozen(&resident, r.eng, m.fdev, n), DSC_ERR_INTERNAL);
    dsc__slots_free(&resident);
    dsc__slots other;
    assert_int_equal(dsc__slots_init(&other, r.eng, r.model, r.dev16, r.devgrad, r.n, &ops, &r),
                     DSC_OK);
    assert_int_equal(dsc__slots_frozen(&other, r.eng, m.fdev, n - 1), DSC_ERR_INTERNAL);
    dsc__slots_free(&other);
    release_sim(&r);
    release_sim(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_tables),
        cmocka_unit_test(test_hook_passes),
        cmocka_unit_test(test_one_layer),
        cmocka_unit_test(test_frozen_tensors),
        cmocka_unit_test(test_frozen_streamed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
