// dsc/checkpoint.h - checkpoints: sharded, atomic, asynchronous, validated, reshardable,
// exportable. The format is in docs/checkpoint-format.md.
//
// A checkpoint is a directory <save_dir>/<tag> (tag global_step<N> by default) holding one
// safetensors shard per rank (that rank's slices of the fp32 master weights and optimizer moments
// of every layer group, plus the step counters and loss-scaler state) and manifest.json (step,
// config, world size, ZeRO stage, precision, optimizer, parameter and group tables, every file's
// size and XXH3 checksum). <save_dir>/latest names the newest checkpoint that was completely
// written, made durable and validated; it is replaced last and atomically, so a crash at any
// instant leaves it on a complete checkpoint.
//
// Saving: dsc_checkpointing_start, then dsc_checkpoint_step_end after every optimizer step (it
// saves when checkpoint.interval_steps / interval_s say so, or when a rank asks to stop). With
// checkpoint.async the step only copies this rank's state into a host buffer (allocated once);
// a writer thread writes and fsyncs the shard; the cross-rank part (checksum exchange, manifest,
// rename, validation, `latest`) runs on the caller's thread at a later dsc_checkpoint_step_end
// once every rank's writer is done, or at the next save, dsc_checkpoint_wait or
// dsc_checkpointing_stop. Every call here that takes an engine is collective: all ranks call it
// at the same step.
//
// Loading: dsc_load_checkpoint verifies the manifest and every checksum first, then gives the
// engine its slices: a checkpoint written by N ranks at ZeRO stage k loads on M ranks at any stage.
#ifndef DSC_CHECKPOINT_H
#define DSC_CHECKPOINT_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t, uint64_t

#include "dsc/config.h" // dsc_config
#include "dsc/engine.h" // dsc_engine
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_CKPT_TAG_MAX 128

// ---- reading a checkpoint (no engine needed) ----

typedef struct dsc_ckpt dsc_ckpt; // an opened checkpoint whose files all verified

typedef struct dsc_ckpt_info {
    const char *tag, *precision, *optimizer, *dsc_version; // borrowed until dsc_ckpt_close
    int64_t step, applied_steps, skipped_steps;
    double loss_scale;            // the loss scaler's scale at the save (1 without fp16)
    int world_size, zero_stage;
    int nmoments;                 // 2 (Adam, AdamW), 1 (SGD, Lion)
    const char *moment_names[2];  // "exp_avg", "exp_avg_sq", "momentum_buffer"
    int nparams, ngroups, nfiles;
    uint64_t bytes;               // all shard files together
    double created;               // Unix time of the save
} dsc_ckpt_info;

typedef struct dsc_ckpt_param {
    const char *name; // Hugging Face name (borrowed until dsc_ckpt_close)
    int ndim;
    int64_t shape[DSC_PARAM_MAX_DIMS];
    int64_t numel;
    int group;
} dsc_ckpt_param;

// Open <dir>/<tag> (tag NULL: the one `latest` names) and verify it: manifest checksum and
// structure, every file present with the manifest's size and XXH3 checksum, shard headers
// matching the manifest, no BAD marker. Errors name the file and what is wrong
// (DSC_ERR_CORRUPT for damaged or inconsistent files, DSC_ERR_IO for missing ones).
dsc_status dsc_ckpt_open(dsc_ckpt **out, const char *dir, const char *tag);
void dsc_ckpt_close(dsc_ckpt *ck); // NULL ok
void dsc_ckpt_get_info(const dsc_ckpt *ck, dsc_ckpt_info *out);
void dsc_ckpt_get_param(const dsc_ckpt *ck, int i, dsc_ckpt_param *out); // 0 <= i < nparams
int dsc_ckpt_find_param(const dsc_ckpt *ck, const char *name);           // index or -1
// Parameter i, whole, fp32, into out (numel floats, caller-owned), rebuilt from the shards.
// kind 0: master weights; kind 1 .. nmoments: optimizer moment kind - 1.
dsc_status dsc_ckpt_read_param(const dsc_ckpt *ck, int i, int kind, float *out);
// The manifest's text (borrowed until dsc_ckpt_close).
const char *dsc_ckpt_manifest_text(const dsc_ckpt *ck);

// Files attached to the checkpoint (dsc_checkpoint_attach): how many, their names (borrowed until
// dsc_ckpt_close), and the path of one by name (verified at open: size and checksum). false when
// the checkpoint holds no attachment of that name, or the path does not fit in cap.
int dsc_ckpt_num_attachments(const dsc_ckpt *ck);
const char *dsc_ckpt_attachment_name(const dsc_ckpt *ck, int i);
bool dsc_ckpt_attachment_path(const dsc_ckpt *ck, const char *name, char *path, size_t cap);

// The tag `latest` names (DSC_ERR_IO when there is none).
dsc_status dsc_ckpt_latest(const char *dir, char *tag, size_t cap);

typedef enum dsc_ckpt_state {
    DSC_CKPT_COMPLETE = 0, // renamed into place with a manifest (not verified by dsc_ckpt_list)
    DSC_CKPT_BAD,          // failed validation after its save (BAD marker inside)
    DSC_CKPT_PARTIAL,      // an interrupted save (*.tmp.*) or a directory without manifest
    DSC_CKPT_DEEPSPEED,    // a DeepSpeed checkpoint (mp_rank_00_model_states.pt, no manifest)
} dsc_ckpt_state;

typedef struct dsc_ckpt_entry {
    char name[DSC_CKPT_TAG_MAX + 64]; // directory name (the tag for complete ones)
    int64_t step;                     // -1 when unknown
    dsc_ckpt_state state;
    bool latest;                      // `latest` names it
} dsc_ckpt_entry;

// Checkpoint directories under dir, newest step first; *out caller-owned (free()).
dsc_status dsc_ckpt_list(const char *dir, dsc_ckpt_entry **out, int *n);

// "DIR" (a save directory: tag NULL = latest) or "DIR/TAG" (a checkpoint directory) -> dir, tag.
dsc_status dsc_ckpt_split_path(const char *path, char *dir, size_t dir_cap, char *tag,
                               size_t tag_cap, bool *has_tag);

// One consolidated safetensors file with every parameter's full fp32 master weights under its
// Hugging Face name, as "F32" (dtype "fp32") or "BF16" (dtype "bf16", rounded to nearest even).
dsc_status dsc_ckpt_export(const char *dir, const char *tag, const char *out_path,
                           const char *dtype);

// transformers' default shard size (save_pretrained's max_shard_size "5GB").
#define DSC_HF_SHARD_BYTES 5000000000ull

// A Hugging Face model folder out_dir (created if needed) from the checkpoint: every parameter
// whole under its Hugging Face name as "F32" or "BF16" (dtype "fp32"/NULL or "bf16"), in
// save_pretrained's layout (model.safetensors, or model-0000K-of-0000N.safetensors shards of at
// most shard_bytes each, 0 = DSC_HF_SHARD_BYTES, with model.safetensors.index.json), plus every
// file attached to the checkpoint (config.json, generation_config.json, the tokenizer's files).
// One tensor is held at a time, whatever the checkpoint's world size and stage. A checkpoint
// without an attached config.json is an error that says to export the weights alone.
dsc_status dsc_ckpt_export_hf(const char *dir, const char *tag, const char *out_dir,
                              const char *dtype, uint64_t shard_bytes);

// ---- DeepSpeed's checkpoints (read) ----

// A DeepSpeed checkpoint: <dir>/latest naming <tag>, and <dir>/<tag>/ holding
// mp_rank_00_model_states.pt (ZeRO 0-2; zero_pp_rank_0_mp_rank_00_model_states.pt at ZeRO-3)
// and one [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt per data-parallel rank. Files are
// read by dsc's restricted torch.save reader, which never runs anything from them. Parameters
// are the fp32 master weights of the ZeRO partitions (the module's own tensors without ZeRO),
// under the names DeepSpeed recorded (param_shapes: the Hugging Face names of an HF model).
typedef struct dsc_ds_ckpt dsc_ds_ckpt;

typedef struct dsc_ds_ckpt_info {
    const char *tag, *ds_version, *precision; // borrowed until dsc_ds_ckpt_close
    int zero_stage, world_size, nparams, ngroups, nfiles;
    int64_t global_steps, global_samples, skipped_steps, numel;
    double loss_scale;
    uint64_t bytes; // all its files together
    bool universal; // the universal layout (zero/<param>/fp32.pt, ...; ds_to_universal's)
} dsc_ds_ckpt_info;

// Whether <dir>/<tag> (tag NULL: the tag <dir>/latest names, or dir itself) is a DeepSpeed
// checkpoint directory.
bool dsc_ds_ckpt_detect(const char *dir, const char *tag);
// Open it: every file parsed, every partition checked against the parameter shapes (the checks
// zero_to_fp32.py makes). Errors name the file and the fault.
dsc_status dsc_ds_ckpt_open(dsc_ds_ckpt **out, const char *dir, const char *tag);
void dsc_ds_ckpt_close(dsc_ds_ckpt *ds); // NULL ok
void dsc_ds_ckpt_get_info(const dsc_ds_ckpt *ds, dsc_ds_ckpt_info *out);
// group: the ZeRO optimizer group (index in param_shapes).
void dsc_ds_ckpt_get_param(const dsc_ds_ckpt *ds, int i, dsc_ckpt_param *out);
int dsc_ds_ckpt_find_param(const dsc_ds_ckpt *ds, const char *name);           // index or -1
// Elements [begin, begin + count) of parameter i's fp32 master weights into out, gathered from
// the ranks' partitions; the pages read are released afterwards, so that reading a model tensor
// by tensor holds one tensor's pages at a time.
dsc_status dsc_ds_ckpt_read_param(dsc_ds_ckpt *ds, int i, int64_t begin, int64_t count,
                                  float *out);

// What a DeepSpeed checkpoint holds besides the weights: what continuing its run needs.
typedef struct dsc_ds_ckpt_state {
    bool has_moments;            // Adam's exp_avg and exp_avg_sq for every partition
    int64_t adam_step;           // the optimizer's step count; -1 when the files record none
    bool has_scheduler;          // lr_scheduler.last_batch_iteration is recorded
    double last_batch_iteration;
    bool dynamic_scale;          // a DynamicLossScaler (fp16): the fields below are its state
    double cur_scale;
    int64_t cur_iter, last_overflow_iter;
    int cur_hysteresis;
    const char *optimizer, *scheduler; // ds_config's optimizer.type, scheduler.type, or NULL
} dsc_ds_ckpt_state;

void dsc_ds_ckpt_get_state(const dsc_ds_ckpt *ds, dsc_ds_ckpt_state *out);

// Elements [begin, begin + count) of parameter i's kind: 0 the fp32 master weights (as
// dsc_ds_ckpt_read_param), 1 Adam's exp_avg, 2 exp_avg_sq (only with has_moments).
dsc_status dsc_ds_ckpt_read_state(dsc_ds_ckpt *ds, int i, int kind, int64_t begin,
                                  int64_t count, float *out);

// A Hugging Face model folder out_dir from a DeepSpeed checkpoint, as dsc_ckpt_export_hf writes
// one from dsc's (names as DeepSpeed recorded them). config.json, generation_config.json and
// the tokenizer's files are copied from config_dir, or when it is NULL from dir itself (where
// the Hugging Face Trainer saves them beside `latest`); without a config.json it is an error
// that names both. One tensor is held at a time.
dsc_status dsc_ds_ckpt_export_hf(const char *dir, const char *tag, const char *config_dir,
                                 const char *out_dir, const char *dtype, uint64_t shard_bytes);
// DeepSpeed's universal checkpoint of dsc checkpoint <dir>/<tag>: out_dir/latest_universal
// naming global_step<N> and out_dir/global_step<N>/ (model states, zero/optimizer_state.pt and
// zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt) as DeepSpeed 0.18 loads it at any world size
// with checkpoint.load_universal. zero_stage: the DeepSpeed run's stage, 1-3 (its files differ
// between ZeRO 1-2 and ZeRO-3; DeepSpeed loads none at stage 0); -1: the checkpoint's own. config_path: the run's config (NULL:
// the ds_config.json dsc train attaches to its checkpoints). Adam and AdamW checkpoints only.
// An existing out_dir/global_step<N> is an error (nothing is written); one tensor is held at a
// time.
dsc_status dsc_ckpt_export_deepspeed(const char *dir, const char *tag, const char *out_dir,
                                     int zero_stage, const char *config_path);
// The weights alone as one safetensors file (as dsc_ckpt_export), one tensor at a time.
dsc_status dsc_ds_ckpt_export(const char *dir, const char *tag, const char *out_path,
                              const char *dtype);

// ---- saving ----

// What validation sees: the checkpoint read back from disk, and the state the save snapshotted.
typedef struct dsc_ckpt_validation {
    const char *dir, *tag;
    int64_t step;
    const dsc_ckpt *ckpt;       // the checkpoint, re-opened (every checksum verified)
    int nparams;                // in the order the tensors were registered (frozen ones: their
                                // live values on both sides, as checkpoints do not hold them):
    const float *const *live;   // full fp32 master weights of the training state that was saved
    const float *const *loaded; // the same, rebuilt from the checkpoint's files
} dsc_ckpt_validation;

// Called on every rank, on the thread that drives the engine, at a step boundary: it may use
// collectives (e.g. dsc_engine_mean) but must not change the engine's state. Sets *ok (and a
// reason in why); a failure status counts as not ok.
typedef dsc_status (*dsc_ckpt_validate_fn)(void *user, dsc_engine *eng,
                                           const dsc_ckpt_validation *v, bool *ok, char *why,
                                           size_t why_cap);

typedef struct dsc_ckpt_opts {
    double interval_s;      // save every this many seconds (0 = off)
    int64_t interval_steps; // save every this many optimizer steps (0 = off)
    bool async;             // write on a background thread
    bool validate;          // re-read, check checksums, call validate_fn
    int64_t keep_last;      // keep the newest N good checkpoints (0 = all)
    dsc_ckpt_validate_fn validate_fn; // NULL: checksums only
    void *validate_user;
    // With async: the snapshot copy runs on the writer thread as well, while training computes
    // the next step; the caller then calls dsc_checkpoint_fence before the engine's state
    // changes (before the dsc_step that ends a gradient accumulation, before loading).
    bool background_snapshot;
} dsc_ckpt_opts;

// The config's "checkpoint" section: interval_s, interval_steps, async, validate, keep_last.
void dsc_ckpt_opts_from_config(const dsc_config *cfg, dsc_ckpt_opts *out);

// Start checkpointing the engine into save_dir (created if needed). o NULL: from the config.
// Stop with dsc_checkpointing_stop before dsc_engine_destroy.
dsc_status dsc_checkpointing_start(dsc_engine *eng, const char *save_dir, const dsc_ckpt_opts *o);
// Set the time interval and the validation function (DESIGN's seed API); after start.
dsc_status dsc_checkpointing_configure(dsc_engine *eng, double interval_s,
                                       dsc_ckpt_validate_fn validate_fn, void *user);

typedef struct dsc_ckpt_tick {
    bool saved;     // a save of this step started (async) or completed
    bool finalised; // a save was completed: latest moved to it, or it was marked bad
    bool stop;      // some rank asked to stop: this step's state is saved and final; leave the loop
    char tag[DSC_CKPT_TAG_MAX]; // of the save started or finalised here
} dsc_ckpt_tick;

// Call on every rank after each optimizer step (after dsc_step's boundary). stop_requested (e.g.
// on SIGUSR1 on any rank): save now, wait until it is complete, and report stop. With several
// ranks this costs one small all-reduce per step.
dsc_status dsc_checkpoint_step_end(dsc_engine *eng, bool stop_requested, dsc_ckpt_tick *out);
// A file that travels with every checkpoint saved from now on (the model's config.json, the
// tokenizer's files: what generation and export need besides the weights): data is copied; rank 0
// writes it into each checkpoint directory, the manifest lists its size and checksum, and
// dsc_ckpt_open verifies it. The same name again replaces the content. name: a plain file name
// (no '/'), not manifest.json, BAD or a shard's name. Not collective: call it on every rank or
// on rank 0 alone. After dsc_checkpointing_start.
dsc_status dsc_checkpoint_attach(dsc_engine *eng, const char *name, const void *data, size_t len);
// Save now (tag NULL: global_step<N>); async per the options (complete it with
// dsc_checkpoint_wait). Call at a step boundary.
dsc_status dsc_save_checkpoint(dsc_engine *eng, const char *tag);
// background_snapshot: wait until the save in flight has copied the engine's state (at once
// when it has, or when there is none). Not collective; NULL-safe for engines not checkpointed.
dsc_status dsc_checkpoint_fence(dsc_engine *eng);
// Complete the save in flight, if any (waits for every rank's writer, finalises).
dsc_status dsc_checkpoint_wait(dsc_engine *eng);
// finish: complete the save in flight (collective); otherwise (after an error) only join the
// writer thread and leave its directory for the next save to clean. Frees everything. NULL ok.
dsc_status dsc_checkpointing_stop(dsc_engine *eng, bool finish);

typedef struct dsc_ckpt_stats {
    int64_t saves, failed, bad;    // completed, failed to write, failed validation
    double snapshot_s;             // the last save's snapshot copy (either thread)
    double fence_s;                // the caller's wait in dsc_checkpoint_fence, all saves
    double write_s;                // the last shard write + fsync (writer thread)
    double finalise_s;             // the last finalisation (exchange, manifest, rename, latest)
    double validate_s;             // the last validation
    uint64_t shard_bytes;          // this rank's last shard
    char latest[DSC_CKPT_TAG_MAX]; // "" before the first completed save
} dsc_ckpt_stats;
void dsc_checkpointing_stats(dsc_engine *eng, dsc_ckpt_stats *out);

// ---- loading ----

// Load <dir>/<tag> (NULL: latest) into the engine, on every rank, at a step boundary: verifies
// first, then checks that the parameter tables match by name and shape and that the optimizer
// moments are the same kind, then reshards to this engine's world size and stage. The step
// counters, learning-rate position and (fp16 to fp16) loss-scaler state continue from the save.
// loaded (may be NULL) receives the tag.
dsc_status dsc_load_checkpoint(dsc_engine *eng, const char *dir, const char *tag, char *loaded,
                               size_t cap);
// Resume: like dsc_load_checkpoint, but when tag is NULL and the latest checkpoint fails to
// verify, says why and falls back to the newest one that verifies. *none = true (and DSC_OK)
// when dir holds no checkpoint at all.
dsc_status dsc_resume_checkpoint(dsc_engine *eng, const char *dir, const char *tag, char *loaded,
                                 size_t cap, bool *none);

#ifdef __cplusplus
}
#endif
#endif
