// ckpt/ptzip.c - index a zip archive of stored entries (torch.save's container), bounds-checked.
#include "engine/ckpt/ptzip.h"

#include <stdbool.h> // bool
#include <stdlib.h>  // calloc, free, malloc
#include <string.h>  // memcpy, memchr, strcmp

#include "base/status.h" // dsc__fail

enum {
    EOCD_SIG = 0x06054b50,   // end of central directory
    EOCD_LEN = 22,
    LOC64_SIG = 0x07064b50,  // ZIP64 end of central directory locator
    LOC64_LEN = 20,
    EOCD64_SIG = 0x06064b50, // ZIP64 end of central directory record
    EOCD64_LEN = 56,
    CEN_SIG = 0x02014b50,    // central directory entry
    CEN_LEN = 46,
    LOC_SIG = 0x04034b50,    // local file header
    LOC_LEN = 30,
    MAX_COMMENT = 65535,
};

static uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t u32(const uint8_t *p) { return (uint32_t)u16(p) | (uint32_t)u16(p + 2) << 16; }
static uint64_t u64(const uint8_t *p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }

// Where the central directory lies and how many entries it holds.
typedef struct cdir {
    uint64_t off, size, count;
    size_t end; // the offset of the record that ends it: entries' data must lie before
} cdir;

// The end record is the last thing in the file, followed only by its comment.
static bool find_eocd(const uint8_t *b, size_t len, size_t *at) {
    if (len < EOCD_LEN) return false;
    size_t lo = len - EOCD_LEN > MAX_COMMENT ? len - EOCD_LEN - MAX_COMMENT : 0;
    for (size_t i = len - EOCD_LEN + 1; i-- > lo;)
        if (u32(b + i) == EOCD_SIG && i + EOCD_LEN + u16(b + i + 20) == len) {
            *at = i;
            return true;
        }
    return false;
}

static dsc_status read_zip64(const uint8_t *b, size_t eocd, cdir *c, const char *path) {
    if (eocd < LOC64_LEN || u32(b + eocd - LOC64_LEN) != LOC64_SIG)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: a ZIP64 archive without its locator", path);
    uint64_t rec = u64(b + eocd - LOC64_LEN + 8);
    if (rec > eocd - LOC64_LEN || eocd - LOC64_LEN - rec < EOCD64_LEN ||
        u32(b + rec) != EOCD64_SIG)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: the ZIP64 end record is not where its locator "
                         "says (a truncated or damaged file)", path);
    c->count = u64(b + rec + 32);
    c->size = u64(b + rec + 40);
    c->off = u64(b + rec + 48);
    c->end = (size_t)rec;
    return DSC_OK;
}

static dsc_status read_cdir(const uint8_t *b, size_t len, cdir *c, const char *path) {
    size_t eocd = 0;
    if (!find_eocd(b, len, &eocd))
        return dsc__fail(DSC_ERR_CORRUPT, "%s: not a zip archive (no end record: a truncated "
                         "file, or not written by torch.save)", path);
    c->count = u16(b + eocd + 10);
    c->size = u32(b + eocd + 12);
    c->off = u32(b + eocd + 16);
    c->end = eocd;
    if (c->count == 0xFFFF || c->size == 0xFFFFFFFFu || c->off == 0xFFFFFFFFu)
        DSC_TRY(read_zip64(b, eocd, c, path));
    if (c->off > c->end || c->size > c->end - c->off || c->count > c->size / CEN_LEN ||
        c->count > INT32_MAX)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: the central directory (%llu entries, %llu bytes "
                         "at %llu) does not fit in the file", path, (unsigned long long)c->count,
                         (unsigned long long)c->size, (unsigned long long)c->off);
    return DSC_OK;
}

// Sizes and the local header's offset: 32-bit fields, or in the ZIP64 extra field (id 1) when
// a 32-bit field holds 0xFFFFFFFF (in the order uncompressed, compressed, offset).
typedef struct cen_fields {
    uint64_t usize, csize, loc;
} cen_fields;

static bool zip64_fields(const uint8_t *x, size_t xlen, cen_fields *f) {
    bool need_u = f->usize == 0xFFFFFFFFu, need_c = f->csize == 0xFFFFFFFFu,
         need_l = f->loc == 0xFFFFFFFFu;
    if (!need_u && !need_c && !need_l) return true;
    for (size_t i = 0; i + 4 <= xlen;) {
        size_t id = u16(x + i), n = u16(x + i + 2), at = i + 4;
        if (n > xlen - at) return false;
        if (id == 1) {
            size_t want = 8 * ((size_t)need_u + need_c + need_l);
            if (n < want) return false;
            if (need_u) f->usize = u64(x + at), at += 8;
            if (need_c) f->csize = u64(x + at), at += 8;
            if (need_l) f->loc = u64(x + at);
            return true;
        }
        i = at + n;
    }
    return false;
}

// The entry's data, after its local header; it must end before the central directory.
static dsc_status entry_data(const uint8_t *b, const cdir *c, const cen_fields *f,
                             const char *name, size_t nlen, dsc__zip_entry *e, const char *path) {
    if (f->loc > c->off || c->off - f->loc < LOC_LEN || u32(b + f->loc) != LOC_SIG)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: entry %s: no local header at offset %llu", path,
                         e->name, (unsigned long long)f->loc);
    const uint8_t *loc = b + f->loc;
    uint64_t start = f->loc + LOC_LEN + u16(loc + 26) + u16(loc + 28);
    if (u16(loc + 26) != nlen || start > c->off || memcmp(loc + LOC_LEN, name, nlen) != 0 ||
        f->usize > c->off - start)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: entry %s: its local header or its %llu bytes do "
                         "not fit before the central directory (a lying size or offset)", path,
                         e->name, (unsigned long long)f->usize);
    e->data = b + start;
    e->size = f->usize;
    return DSC_OK;
}

static dsc_status read_entry(const uint8_t *b, const cdir *c, size_t *at, dsc__zip_entry *e,
                             const char *path) {
    const uint8_t *p = b + *at;
    size_t left = c->off + c->size - *at;
    if (left < CEN_LEN || u32(p) != CEN_SIG)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: damaged central directory at byte %zu", path, *at);
    size_t nlen = u16(p + 28), xlen = u16(p + 30), clen = u16(p + 32);
    if (CEN_LEN + nlen + xlen + clen > left || nlen == 0 || memchr(p + CEN_LEN, 0, nlen))
        return dsc__fail(DSC_ERR_CORRUPT, "%s: damaged central directory entry at byte %zu", path,
                         *at);
    e->name = malloc(nlen + 1);
    if (!e->name) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", path);
    memcpy(e->name, p + CEN_LEN, nlen);
    e->name[nlen] = 0;
    cen_fields f = {u32(p + 24), u32(p + 20), u32(p + 42)};
    if (u16(p + 8) & 1)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: entry %s is encrypted; torch.save never "
                         "encrypts", path, e->name);
    if (u16(p + 10) != 0)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: entry %s is compressed (method %u); torch.save "
                         "stores entries uncompressed: re-save the file with torch.save", path,
                         e->name, u16(p + 10));
    if (!zip64_fields(p + CEN_LEN + nlen, xlen, &f) || f.csize != f.usize)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: entry %s: inconsistent sizes", path, e->name);
    *at += CEN_LEN + nlen + xlen + clen;
    return entry_data(b, c, &f, (const char *)p + CEN_LEN, nlen, e, path);
}

dsc_status dsc__zip_index(dsc__zip *z, const uint8_t *base, size_t len, const char *path) {
    memset(z, 0, sizeof *z);
    cdir c = {0};
    DSC_TRY(read_cdir(base, len, &c, path));
    z->e = calloc(c.count ? c.count : 1, sizeof *z->e);
    if (!z->e) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", path);
    size_t at = (size_t)c.off;
    dsc_status st = DSC_OK;
    for (uint64_t i = 0; i < c.count && st == DSC_OK; i++) {
        st = read_entry(base, &c, &at, &z->e[i], path);
        z->n = (int)i + 1; // the entry's name is owned from here, even when it failed
    }
    if (st != DSC_OK) dsc__zip_free(z);
    return st;
}

const dsc__zip_entry *dsc__zip_find(const dsc__zip *z, const char *name) {
    for (int i = 0; i < z->n; i++)
        if (z->e[i].name && !strcmp(z->e[i].name, name)) return &z->e[i];
    return NULL;
}

void dsc__zip_free(dsc__zip *z) {
    for (int i = 0; i < z->n; i++) free(z->e[i].name);
    free(z->e);
    z->e = NULL;
    z->n = 0;
}
