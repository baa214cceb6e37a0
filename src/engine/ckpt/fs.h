// ckpt/fs.h - the file-system steps a crash-safe checkpoint is made of: durable writes, fsync of
// files and directories, atomic replacement, recursive removal, directory listing.
#ifndef DSC_CKPT_FS_H
#define DSC_CKPT_FS_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "dsc/status.h" // dsc_status

// Paths are at most this long; longer ones are refused with DSC_ERR_INVALID_ARG.
#define DSC_CKPT_PATH_MAX 4096

// out = a "/" b; DSC_ERR_INVALID_ARG naming the path when it does not fit.
dsc_status dsc__ckpt_join(char *out, size_t cap, const char *a, const char *b);

// fsync a file or a directory by path (a directory's fsync makes its entries durable: created,
// renamed and removed names).
dsc_status dsc__ckpt_fsync_path(const char *path);

// Write n bytes to path, fsynced. atomic: written to path.tmp.<pid>, fsynced, renamed over path,
// and the parent directory fsynced, so that a crash leaves either the old file or the new one.
dsc_status dsc__ckpt_write_file(const char *path, const void *data, size_t n, bool atomic);

// Whole file into *out (NUL-terminated, caller frees), *n bytes (without the NUL).
dsc_status dsc__ckpt_read_file(const char *path, char **out, size_t *n);

// rm -rf; a missing path is fine.
dsc_status dsc__ckpt_rmtree(const char *path);

bool dsc__ckpt_is_dir(const char *path);
bool dsc__ckpt_exists(const char *path);

// Names in directory `dir` (no "." or ".."), sorted; *names: array of *n strings, caller frees
// with dsc__ckpt_free_names. A missing directory gives 0 names.
dsc_status dsc__ckpt_list_dir(const char *dir, char ***names, int *n);
void dsc__ckpt_free_names(char **names, int n);

#endif
