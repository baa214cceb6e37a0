// ckpt/manifest.h - manifest.json: what a checkpoint holds and how to check it.
//
// The manifest carries its own XXH3 checksum as its last field ("manifest_xxh3"), computed over
// its text with that field's 16 hex digits set to '0', so that any edit of the file is detected.
#ifndef DSC_CKPT_MANIFEST_H
#define DSC_CKPT_MANIFEST_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t, uint64_t

#include "dsc/checkpoint.h" // DSC_CKPT_TAG_MAX
#include "dsc/config.h"     // dsc_config
#include "dsc/engine.h"     // dsc_engine, DSC_PARAM_*
#include "engine/state.h"   // dsc_state_*

#define DSC_CKPT_FORMAT "dsc-checkpoint"
#define DSC_CKPT_FORMAT_VERSION 1
#define DSC_CKPT_MANIFEST "manifest.json"
#define DSC_CKPT_LATEST "latest"
#define DSC_CKPT_BAD_MARKER "BAD"
#define DSC_CKPT_MAX_MOMENTS 2

typedef struct dsc__mparam {
    char name[DSC_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[DSC_PARAM_MAX_DIMS];
    int64_t numel;
    int group;
    uint64_t off; // in the saved flat layout
} dsc__mparam;

typedef struct dsc__mfile {
    char name[96];
    int rank;
    uint64_t bytes, xxh3;
} dsc__mfile;

typedef struct dsc__manifest {
    char tag[DSC_CKPT_TAG_MAX];
    int64_t step;
    int world, stage;
    char precision[8], optimizer[16], dsc_version[32];
    // Storage precision of the master weights and of the moments ("fp32", or "bf16" with
    // bf16.bf16_master_weights_and_grads / bf16_optimizer_states); "fp32" when absent.
    char master_precision[8], moments_precision[8];
    int nmoments;
    char moments[DSC_CKPT_MAX_MOMENTS][24];
    dsc_state_scalars scalars;
    uint64_t total; // flat layout length
    double created;
    int ngroups, nparams, nfiles;
    dsc_state_group *groups; // (ngroups)
    dsc__mparam *params;     // (nparams)
    dsc__mfile *files;       // (nfiles), files[r] is rank r's shard
    int nattach;
    dsc__mfile *attach;      // (nattach) files that travel with the checkpoint (rank -1)
} dsc__manifest;

// An attachment's name: a plain file name that is none of the checkpoint's own files.
bool dsc__ckpt_attachment_name_ok(const char *name);

// The optimizer's moment names as PyTorch's optimizers call them ("exp_avg", "exp_avg_sq",
// "momentum_buffer"); k < nmoments.
const char *dsc__ckpt_moment_name(const char *optimizer, int k);
// "shard_rank<r>_of_<world>.safetensors"
void dsc__ckpt_shard_name(char *out, size_t cap, int rank, int world);

// Fill the tables from the engine's layout (files: names only; sizes and checksums come later).
dsc_status dsc__manifest_from_engine(dsc__manifest *m, dsc_engine *eng, const char *tag);
// The manifest's text with its checksum; caller frees. cfg: the resolved config embedded.
char *dsc__manifest_render(const dsc__manifest *m, const dsc_config *cfg);
// Check the self-checksum, then parse and check the structure. path names the file in errors.
dsc_status dsc__manifest_parse(dsc__manifest *m, const char *text, size_t n, const char *path);
void dsc__manifest_free(dsc__manifest *m); // the tables; m itself is the caller's

#endif
