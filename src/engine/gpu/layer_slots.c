// engine/gpu/layer_slots.c - the two-slot layer stream of the GPU trainer (see layer_slots.h). Host
// code: every build compiles it (tests/unit/test_layer_slots.c drives the hook with recording
// ops).
#include "engine/gpu/layer_slots.h"

#include <stdbool.h> // bool
#include <stdint.h>  // SIZE_MAX
#include <stdlib.h>  // calloc, free

#include "base/status.h"   // dsc__fail, DSC_TRY
#include "engine/device.h" // dsc__engine_span_of, dsc__engine_param_offset

size_t dsc__slots_layout(dsc_engine *eng, int n_layer, size_t *dev_off, size_t *slot_len) {
    size_t at = 0, slot = 0;
    for (int g = 0; g <= n_layer + 1; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(eng, g, &sp);
        if (g >= 1 && g <= n_layer) {
            if (sp.padded > slot) slot = sp.padded;
            continue;
        }
        if (dev_off) dev_off[g] = at;
        at += sp.padded;
    }
    if (slot_len) *slot_len = slot;
    return at + 2 * slot;
}

dsc_status dsc__slots_init(dsc__slots *s, dsc_engine *eng, const dsc_model *model, uint16_t *p16,
                           float *grad, size_t n, const dsc__slots_ops *ops, void *user) {
    *s = (dsc__slots){.ops = ops,
                      .user = user,
                      .L = dsc_model_describe(model)->n_layer,
                      .ntensors = dsc_model_describe(model)->num_tensors,
                      .dev16 = p16,
                      .devgrad = grad,
                      .held = {-1, -1},
                      .gheld = {-1, -1}};
    s->dev_off = calloc((size_t)s->L + 2, sizeof *s->dev_off);
    s->tgroup = calloc((size_t)s->ntensors, sizeof *s->tgroup);
    s->tin = calloc((size_t)s->ntensors, sizeof *s->tin);
    if (!s->dev_off || !s->tgroup || !s->tin) return dsc__fail(DSC_ERR_OOM, "out of memory");
    size_t len = dsc__slots_layout(eng, s->L, s->dev_off, &s->slot_len);
    if (len != n)
        return dsc__fail(DSC_ERR_INTERNAL,
                         "layer slots: device arrays of %zu elements for a "
                         "layout of %zu (a bug: report it)",
                         n, len);
    for (int k = 0; k < 2; k++) {
        s->w[k] = p16 ? p16 + len - (size_t)(2 - k) * s->slot_len : NULL;
        s->g[k] = grad + len - (size_t)(2 - k) * s->slot_len;
    }
    for (int i = 0; i < s->ntensors; i++) {
        int group = dsc_model_param_get(model, i)->group;
        dsc__engine_span sp;
        dsc__engine_span_of(eng, group, &sp);
        s->tgroup[i] = group;
        size_t off = dsc__engine_param_offset(eng, i); // SIZE_MAX: frozen (LoRA's base)
        s->tin[i] = off == SIZE_MAX ? SIZE_MAX : off - sp.off;
    }
    return DSC_OK;
}

size_t dsc__slots_frozen_layout(dsc_engine *eng, int n_layer, size_t *slot_len,
                                size_t end_off[2]) {
    size_t off, padded, slot = 0, ends = 0;
    for (int g = 0; g <= n_layer + 1; g++) {
        dsc__engine_frozen_span(eng, g, &off, &padded);
        if (g >= 1 && g <= n_layer) {
            if (padded > slot) slot = padded;
            continue;
        }
        if (end_off) end_off[g == 0 ? 0 : 1] = ends;
        ends += padded;
    }
    if (slot_len) *slot_len = slot;
    return ends + slot ? ends + 2 * slot : 0;
}

dsc_status dsc__slots_frozen(dsc__slots *s, dsc_engine *eng, uint16_t *dev, size_t n) {
    size_t end_off[2], len = dsc__slots_frozen_layout(eng, s->L, &s->fslot_len, end_off);
    if (!s->w[0] || !dev || len != n)
        return dsc__fail(DSC_ERR_INTERNAL, "layer slots: a frozen device array of %zu elements "
                         "for a layout of %zu, %s (a bug: report it)", n, len,
                         s->w[0] ? "weights streamed" : "weights resident");
    s->fin = calloc((size_t)s->ntensors, sizeof *s->fin);
    if (!s->fin) return dsc__fail(DSC_ERR_OOM, "out of memory");
    s->fdev = dev;
    s->fw[0] = dev + len - 2 * s->fslot_len;
    s->fw[1] = dev + len - s->fslot_len;
    for (int i = 0; i < s->ntensors; i++) {
        s->fin[i] = SIZE_MAX;
        if (s->tin[i] != SIZE_MAX) continue; // trained
        size_t off, padded, at = dsc__engine_frozen_offset(eng, i);
        int g = s->tgroup[i];
        if (g < 0 || g > s->L + 1)
            return dsc__fail(DSC_ERR_INTERNAL, "layer slots: frozen tensor %d in group %d of a "
                             "model of %d layers", i, g, s->L);
        dsc__engine_frozen_span(eng, g, &off, &padded);
        s->fin[i] = at - off + (dsc__slots_layer_group(s, g) ? 0 : end_off[g == 0 ? 0 : 1]);
    }
    return DSC_OK;
}

void dsc__slots_free(dsc__slots *s) {
    free(s->dev_off);
    free(s->tgroup);
    free(s->tin);
    free(s->fin);
    s->dev_off = NULL;
    s->tgroup = NULL;
    s->tin = NULL;
    s->fin = NULL;
}

void dsc__slots_tables(dsc__slots *s, const uint16_t **p16, float **grad) {
    s->p16 = p16;
    s->grad = grad;
    bool weights = s->w[0] != NULL; // else resident: the caller's p16 table stays
    for (int i = 0; i < s->ntensors; i++) {
        int g = s->tgroup[i];
        if (s->tin[i] == SIZE_MAX) { // frozen: no gradient; its weights stay as the caller set
            grad[i] = NULL;          // them, unless they stream too
            if (s->fdev) p16[i] = (dsc__slots_layer_group(s, g) ? s->fw[0] : s->fdev) + s->fin[i];
            continue;
        }
        if (dsc__slots_layer_group(s, g)) { // the layer hook repoints them before every use
            if (weights) p16[i] = s->w[0] + s->tin[i];
            grad[i] = s->g[0] + s->tin[i];
        } else {
            if (weights) p16[i] = s->dev16 + s->dev_off[g] + s->tin[i];
            grad[i] = s->devgrad + s->dev_off[g] + s->tin[i];
        }
    }
}

void dsc__slots_views(dsc__slots *s, dsc_model_device *dev, const uint16_t **p16, float **grad) {
    dsc__slots_tables(s, p16, grad);
    dsc_model_device_set_layer_hook(dev, dsc__slots_hook, s);
}

void dsc__slots_forget(dsc__slots *s) {
    s->held[0] = s->held[1] = -1;
}

static int slot_of(const dsc__slots *s, int layer) {
    for (int k = 0; k < 2; k++)
        if (s->held[k] == layer) return k;
    return -1;
}

// Layer `layer`'s weights into a slot unless one holds them (not the slot of `keep`).
static dsc_status fetch(dsc__slots *s, int layer, int keep) {
    if (layer < 0 || layer >= s->L || slot_of(s, layer) >= 0) return DSC_OK;
    int k = keep >= 0 && slot_of(s, keep) == 0 ? 1 : 0;
    s->held[k] = -1; // until the fetch is enqueued
    DSC_TRY(s->ops->fetch(s->user, k, layer));
    s->held[k] = layer;
    return DSC_OK;
}

// Point the view tables' entries of `layer` (its tensors lie together in the table) at weight
// slot k and, in backward, at gradient buffer g.
static void point(dsc__slots *s, int layer, int k, float *g) {
    for (int i = 0; i < s->ntensors; i++) {
        if (s->tgroup[i] != layer + 1) continue;
        if (s->tin[i] == SIZE_MAX) { // frozen: streamed (dsc__slots_frozen), or left as it is
            if (s->fdev) s->p16[i] = s->fw[k] + s->fin[i];
            continue;
        }
        if (s->w[0]) s->p16[i] = s->w[k] + s->tin[i];
        if (g) s->grad[i] = g + s->tin[i];
    }
}

dsc_status dsc__slots_hook(void *user, int pass, int layer) {
    dsc__slots *s = user;
    if (!s->w[0]) { // resident weights: only the backward's gradient slots
        if (pass != 1 || layer < 0 || layer >= s->L) return DSC_OK;
        int j = layer & 1;
        DSC_TRY(s->ops->reuse(s->user, j, s->gheld[j], layer + 1));
        s->gheld[j] = layer + 1;
        point(s, layer, 0, s->g[j]);
        return DSC_OK;
    }
    int prev = pass == 0 ? layer - 1 : layer + 1, next = pass == 0 ? layer + 1 : layer - 1;
    int k = prev >= 0 && prev < s->L ? slot_of(s, prev) : -1;
    if (k >= 0) DSC_TRY(s->ops->release(s->user, k));
    if (layer < 0 || layer >= s->L) return DSC_OK;
    DSC_TRY(fetch(s, layer, prev));
    k = slot_of(s, layer);
    DSC_TRY(s->ops->use(s->user, k));
    DSC_TRY(fetch(s, next, layer));
    float *g = NULL;
    if (pass == 1) {
        int j = layer & 1;
        DSC_TRY(s->ops->reuse(s->user, j, s->gheld[j], layer + 1));
        s->gheld[j] = layer + 1;
        g = s->g[j];
    }
    point(s, layer, k, g);
    return DSC_OK;
}
