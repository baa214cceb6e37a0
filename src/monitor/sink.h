// monitor/sink.h - the sinks behind dsc_monitor: a table of functions per kind, and the helpers
// they share (number formatting, directories, host memory).
#ifndef DSC_MONITOR_SINK_H
#define DSC_MONITOR_SINK_H

#include <stddef.h> // size_t
#include <stdint.h> // int64_t, uint32_t

#include "dsc/status.h" // dsc_status

// A sink records (tag, value, index, wall time) events. write() may buffer; flush() makes what was
// written durable in the file system; destroy() flushes and frees (NULL ctx is a no-op).
typedef struct dsc__sink_ops {
    const char *name;
    dsc_status (*write)(void *ctx, const char *tag, double value, int64_t step, double wall);
    dsc_status (*flush)(void *ctx);
    void (*destroy)(void *ctx);
} dsc__sink_ops;

typedef struct dsc__sink {
    const dsc__sink_ops *ops;
    void *ctx; // owned by the sink
} dsc__sink;

// TensorBoard event file events.out.tfevents.<time>.<host>.<pid>.0 in dir (created if missing).
dsc_status dsc__sink_tensorboard_open(dsc__sink *out, const char *dir);
// DeepSpeed's csv_monitor layout: one <tag with '/' and ' ' as '_'>.csv per tag in dir.
dsc_status dsc__sink_csv_open(dsc__sink *out, const char *dir);

// CRC-32C (Castagnoli), as TFRecord framing uses; crc is 0 for a fresh checksum.
uint32_t dsc__crc32c(uint32_t crc, const void *data, size_t n);
// TFRecord's masked form of a CRC-32C.
uint32_t dsc__crc32c_mask(uint32_t crc);
// Encode an Event protobuf: {wall_time, step, summary {value {tag, simple_value}}} into buf.
// Returns the encoded size (which may exceed cap: then nothing past cap was written).
size_t dsc__tf_scalar_event(uint8_t *buf, size_t cap, double wall, int64_t step, const char *tag,
                            float value);

// Format v as Python's repr(float) does (shortest text that reads back to v: "0.1", "1e-05",
// "65536.0", "inf", "nan"). Returns the length written (text truncated to cap - 1).
int dsc__fmt_pyfloat(char *buf, size_t cap, double v);

// Host memory: used fraction (MemTotal - MemAvailable) / MemTotal and this process's RSS bytes.
dsc_status dsc__host_mem(double *used_fraction, double *rss_bytes);

#endif
