// monitor/tensorboard.c - TensorBoard event files: TFRecord framing around Event protobufs.
//
// A record is: uint64 length, uint32 masked CRC-32C of those 8 bytes, the payload, uint32 masked
// CRC-32C of the payload (all little-endian). The first payload is an Event carrying
// file_version "brain.Event:2"; each scalar is then one Event {wall_time, step, summary {value
// {tag, simple_value}}}, which is what TensorBoard's SummaryWriter.add_scalar writes.
#include <errno.h>   // errno
#include <pthread.h> // pthread_once
#include <stdio.h>   // FILE, fopen, fwrite, setvbuf
#include <stdlib.h>  // malloc, free
#include <string.h>  // memcpy, strlen, strerror
#include <time.h>    // time
#include <unistd.h>  // gethostname, getpid

#include "base/io.h" // dsc__mkdirs
#include "base/status.h"  // dsc__fail
#include "base/time.h"    // dsc_wall_time
#include "monitor/sink.h" // dsc__sink, dsc__crc32c

// ---- CRC-32C ----

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1))); // reflected poly
        crc_table[b] = c;
    }
}

uint32_t dsc__crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_table_init);
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t dsc__crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

// ---- protobuf encoding (only the wire types the Event message needs) ----

typedef struct pbuf {
    uint8_t *p;
    size_t n, cap; // n counts every byte, also those past cap that were not stored
} pbuf;

static void put_byte(pbuf *b, uint8_t v) {
    if (b->n < b->cap) b->p[b->n] = v;
    b->n++;
}
static void put_varint(pbuf *b, uint64_t v) {
    for (; v >= 0x80; v >>= 7) put_byte(b, (uint8_t)(v | 0x80));
    put_byte(b, (uint8_t)v);
}
static void put_le(pbuf *b, uint64_t v, int nbytes) {
    for (int i = 0; i < nbytes; i++) put_byte(b, (uint8_t)(v >> (8 * i)));
}
static void put_key(pbuf *b, int field, int wire) { put_varint(b, (uint64_t)(field << 3 | wire)); }
static void put_bytes(pbuf *b, int field, const void *s, size_t n) {
    put_key(b, field, 2);
    put_varint(b, n);
    for (size_t i = 0; i < n; i++) put_byte(b, ((const uint8_t *)s)[i]);
}
static size_t varint_len(uint64_t v) {
    size_t n = 1;
    for (; v >= 0x80; v >>= 7) n++;
    return n;
}

// Event fields: 1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary.
// Summary: 1 value (repeated). Summary.Value: 1 tag (string), 2 simple_value (float).
static void put_event_head(pbuf *b, double wall, int64_t step) {
    uint64_t bits;
    memcpy(&bits, &wall, 8);
    put_key(b, 1, 1);
    put_le(b, bits, 8);
    put_key(b, 2, 0);
    put_varint(b, (uint64_t)step); // negative steps take 10 bytes, as protobuf's int64 does
}

size_t dsc__tf_scalar_event(uint8_t *buf, size_t cap, double wall, int64_t step, const char *tag,
                            float value) {
    size_t tag_len = strlen(tag);
    size_t value_len = 1 + varint_len(tag_len) + tag_len + 1 + 4; // tag + simple_value
    size_t summary_len = 1 + varint_len(value_len) + value_len;
    pbuf b = {buf, 0, cap};
    put_event_head(&b, wall, step);
    put_key(&b, 5, 2);
    put_varint(&b, summary_len);
    put_key(&b, 1, 2);
    put_varint(&b, value_len);
    put_bytes(&b, 1, tag, tag_len);
    uint32_t bits;
    memcpy(&bits, &value, 4);
    put_key(&b, 2, 5);
    put_le(&b, bits, 4);
    return b.n;
}

// ---- the sink ----

typedef struct tb_sink {
    FILE *f;
    char path[4200];
    char iobuf[1 << 16]; // stdio buffer: records reach the kernel in 64 KiB writes or on flush
} tb_sink;

static dsc_status write_record(tb_sink *s, const uint8_t *data, size_t n) {
    uint8_t head[12];
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)n >> (8 * i));
    uint32_t hc = dsc__crc32c_mask(dsc__crc32c(0, head, 8));
    uint32_t dc = dsc__crc32c_mask(dsc__crc32c(0, data, n));
    uint8_t tail[4];
    for (int i = 0; i < 4; i++) {
        head[8 + i] = (uint8_t)(hc >> (8 * i));
        tail[i] = (uint8_t)(dc >> (8 * i));
    }
    if (fwrite(head, 1, 12, s->f) != 12 || fwrite(data, 1, n, s->f) != n ||
        fwrite(tail, 1, 4, s->f) != 4)
        return dsc__fail(DSC_ERR_IO, "cannot write %s: %s; check free space", s->path,
                         strerror(errno));
    return DSC_OK;
}

static dsc_status tb_write(void *ctx, const char *tag, double value, int64_t step, double wall) {
    tb_sink *s = ctx;
    uint8_t small[512];
    size_t n = dsc__tf_scalar_event(small, sizeof small, wall, step, tag, (float)value);
    if (n <= sizeof small) return write_record(s, small, n);
    uint8_t *big = malloc(n); // a tag longer than ~480 bytes
    if (!big) return dsc__fail(DSC_ERR_OOM, "out of memory encoding TensorBoard tag %.60s", tag);
    dsc__tf_scalar_event(big, n, wall, step, tag, (float)value);
    dsc_status st = write_record(s, big, n);
    free(big);
    return st;
}

static dsc_status tb_flush(void *ctx) {
    tb_sink *s = ctx;
    if (fflush(s->f) != 0)
        return dsc__fail(DSC_ERR_IO, "cannot write %s: %s; check free space", s->path,
                         strerror(errno));
    return DSC_OK;
}

static void tb_destroy(void *ctx) {
    tb_sink *s = ctx;
    if (!s) return;
    fclose(s->f);
    free(s);
}

static const dsc__sink_ops tb_ops = {
    .name = "tensorboard", .write = tb_write, .flush = tb_flush, .destroy = tb_destroy};

static dsc_status write_file_version(tb_sink *s) {
    uint8_t buf[64];
    pbuf b = {buf, 0, sizeof buf};
    put_event_head(&b, dsc_wall_time(), 0);
    put_bytes(&b, 3, "brain.Event:2", 13);
    DSC_TRY(write_record(s, buf, b.n));
    return tb_flush(s);
}

dsc_status dsc__sink_tensorboard_open(dsc__sink *out, const char *dir) {
    dsc_status made = dsc__mkdirs(dir);
    if (made != DSC_OK) {
        dsc__error_prefix("tensorboard.output_path (choose another): ");
        return made;
    }
    tb_sink *s = calloc(1, sizeof *s);
    if (!s) return dsc__fail(DSC_ERR_OOM, "out of memory opening the TensorBoard sink");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(s->path, sizeof s->path, "%s/events.out.tfevents.%010lld.%s.%d.0", dir,
             (long long)time(NULL), host, (int)getpid());
    s->f = fopen(s->path, "wb");
    if (!s->f) {
        dsc_status st = dsc__fail(DSC_ERR_IO, "cannot create %s: %s; check tensorboard.output_path",
                                  s->path, strerror(errno));
        free(s);
        return st;
    }
    setvbuf(s->f, s->iobuf, _IOFBF, sizeof s->iobuf);
    dsc_status st = write_file_version(s);
    if (st != DSC_OK) {
        tb_destroy(s);
        return st;
    }
    *out = (dsc__sink){&tb_ops, s};
    return DSC_OK;
}
