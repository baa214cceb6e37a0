// ckpt/ptzipw.h - write a zip archive of stored (uncompressed) entries laid out as torch.save lays
// out its files (ptzip.h indexes them): each entry's data starts on a 64-byte boundary, padded in
// the local header's extra field as torch pads ("FB" and 'Z's), CRC-32s are filled in, and ZIP64
// records are written where a size or an offset needs them. No data descriptors: every size and
// CRC is known before the entry is written.
#ifndef DSC_CKPT_PTZIPW_H
#define DSC_CKPT_PTZIPW_H

#include <stdbool.h> // bool
#include <stdint.h>  // uint32_t, uint64_t

#include "dsc/status.h" // dsc_status

#define DSC__ZIPW_NAME_MAX 255

typedef struct dsc__zipw_entry {
    char name[DSC__ZIPW_NAME_MAX + 1]; // UTF-8, NUL-terminated
    const void *data;                  // borrowed until written; NULL when size is 0
    uint64_t size;
    uint32_t crc;                      // dsc__crc32(data, size)
} dsc__zipw_entry;

// zip's CRC-32 (reflected polynomial 0xEDB88320).
uint32_t dsc__crc32(const void *data, uint64_t n);

// Write the n entries, in order, to path atomically: path.tmp is written, fsynced and renamed over
// path, then the directory is fsynced; on a failure before the rename path is untouched and
// path.tmp removed. force_zip64: ZIP64 records for every entry and for the end of the archive even
// where the sizes fit (a test's way to check the layout of a file past 4 GiB on a small one).
// DSC_ERR_IO naming the file and the cause, DSC_ERR_INVALID_ARG for a name too long or empty.
dsc_status dsc__zipw_write(const char *path, const dsc__zipw_entry *e, int n, bool force_zip64);

#endif
