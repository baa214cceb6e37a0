// ckpt/saver.h - the checkpointing state of one engine, shared by save.c (snapshot, writer
// thread, periodic trigger) and publish.c (the cross-rank completion of a save).
//
// A save has two halves:
//   begin (caller's thread, collective): agree on the tag, snapshot this rank's slices and the
//       scalars into the host buffer, start the writer (a thread when async) that writes the
//       shard into <save_dir>/<tag>.tmp.<nonce>/ and fsyncs it.
//   complete (caller's thread, collective, once every rank's writer is done): exchange sizes and
//       checksums, rank 0 writes the manifest, renames the directory to <tag>, fsyncs the
//       parent; validation; rank 0 replaces `latest` (or writes BAD) and prunes old tags.
// Between the two, training goes on; the collectives of both halves run on the caller's thread
// at step boundaries, in the same order on every rank, so they never interleave with training's.
#ifndef DSC_CKPT_SAVER_H
#define DSC_CKPT_SAVER_H

#include <pthread.h>     // pthread_t
#include <stdatomic.h>   // atomic_bool

#include "dsc/checkpoint.h"       // dsc_ckpt_opts, dsc_ckpt_stats
#include "engine/ckpt/fs.h"       // DSC_CKPT_PATH_MAX
#include "engine/ckpt/manifest.h" // dsc__manifest

typedef struct dsc__saver {
    dsc_engine *eng;
    char dir[DSC_CKPT_PATH_MAX];
    dsc_ckpt_opts o;
    float *buf;     // snapshot: (1 + nmoments, part) fp32, reused from save to save
    size_t buf_cap; // floats
    bool prefault_live; // a thread allocates and touches the buffer ahead of the first save
    pthread_t prefault;
    // background snapshot: the writer copies the state first, then tells the fence
    pthread_mutex_t snap_lock;
    pthread_cond_t snap_cond;
    bool snap_waiting; // a copy is outstanding (protected by snap_lock)
    // the save in flight
    bool pending;
    dsc__manifest m;                    // its layout and scalars (files filled in on completion)
    char tmp_name[DSC_CKPT_TAG_MAX + 48]; // <tag>.tmp.<nonce>
    char nonce[24];
    char last_tag[DSC_CKPT_TAG_MAX]; // of the newest save begun
    char *header;   // shard header bytes
    size_t hlen, data_bytes;
    bool thread_live;
    pthread_t thread;
    atomic_bool writer_done;
    dsc_status wst; // the writer's result, its message, size and checksum of the shard
    char werr[1024];
    uint64_t wbytes, wxxh3;
    double w_snapshot_s, w_write_s; // the writer's timings, copied into stats on completion
    double test_delay_s; // DSC_CKPT_TEST_WRITE_DELAY_S: the writer waits this long (a test hook)
    // files written into every checkpoint by rank 0 (dsc_checkpoint_attach), copies
    int nattach;
    struct dsc__attachment {
        char name[96];
        void *data;
        size_t len;
    } *attach;
    // trigger
    double last_save_time;
    int64_t last_save_step;
    dsc_ckpt_stats stats;
} dsc__saver;

// save.c: free the save in flight's manifest and header (after completion).
void dsc__saver_forget(dsc__saver *s);

// publish.c
// Complete the save in flight (collective). Returns DSC_OK when it became `latest`; an error
// naming the cause when a rank failed to write or validation failed (it is then cleaned up or
// marked BAD, and `latest` stays where it was).
dsc_status dsc__saver_complete(dsc__saver *s);
// Remove leftovers of interrupted saves (*.tmp.*, *.del.*, latest.tmp.*) in the save directory.
void dsc__saver_clean(const char *dir);

// Small collectives on the engine's communicator (no-ops on one rank). bytes: a multiple of 4.
dsc_status dsc__ckpt_bcast(dsc_engine *eng, void *buf, size_t bytes, int root);
dsc_status dsc__ckpt_max(dsc_engine *eng, float *v, int n);

#endif
