// ckpt/reader.c - open and verify a checkpoint, rebuild full tensors from its shards, list a save
// directory.
#include "engine/ckpt/reader.h"

#include <errno.h>    // errno
#include <fcntl.h>    // open
#include <inttypes.h> // PRIx64
#include <stdio.h>    // snprintf
#include <stdlib.h>   // calloc, free, strtoll, qsort
#include <string.h>   // strcmp, strerror, memcpy
#include <sys/mman.h> // mmap
#include <sys/stat.h> // stat
#include <unistd.h>   // close

#include "base/hash.h"            // dsc_hash64
#include "base/io.h"              // dsc__open_regular, dsc__map_drop
#include "base/status.h"          // dsc__fail
#include "engine/ckpt/deepspeed.h" // dsc__ds_model_file
#include "engine/ckpt/shard.h"    // dsc__shard_tensor_name, DSC_CKPT_SHARD_FORMAT

// ---- verification ----

dsc_status dsc__ckpt_hash_file(const char *path, uint64_t *bytes, uint64_t *xxh3) {
    int fd;
    DSC_TRY(dsc__open_regular(path, &fd));
    struct stat sb;
    fstat(fd, &sb);
    *bytes = (uint64_t)sb.st_size;
    size_t size = (size_t)sb.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED) return dsc__fail(DSC_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    // 64 MiB at a time, each piece's pages dropped once hashed: a shard of any size costs the
    // process one piece of resident memory (the streaming XXH3 equals the one-shot one)
    dsc_hasher *h = dsc_hasher_create();
    if (!h) {
        if (map) munmap(map, size);
        return dsc__fail(DSC_ERR_OOM, "out of memory hashing %s", path);
    }
    const size_t piece = (size_t)64 << 20;
    for (size_t at = 0; at < size; at += piece) {
        size_t n = size - at < piece ? size - at : piece;
        dsc_hasher_update(h, (const char *)map + at, n);
        dsc__map_drop((const char *)map + at, n);
    }
    *xxh3 = dsc_hasher_digest(h);
    dsc_hasher_destroy(h);
    if (map) munmap(map, size);
    return DSC_OK;
}

// Size first (a truncated file says so plainly), then the checksum.
static dsc_status verify_file(const dsc_ckpt *ck, const dsc__mfile *f) {
    char path[DSC_CKPT_PATH_MAX];
    DSC_TRY(dsc__ckpt_join(path, sizeof path, ck->path, f->name));
    struct stat sb;
    if (stat(path, &sb) != 0)
        return f->rank >= 0
                   ? dsc__fail(DSC_ERR_IO, "checkpoint %s: shard %s (rank %d) is missing: %s",
                               ck->path, f->name, f->rank, strerror(errno))
                   : dsc__fail(DSC_ERR_IO, "checkpoint %s: attached file %s is missing: %s",
                               ck->path, f->name, strerror(errno));
    if ((uint64_t)sb.st_size != f->bytes)
        return dsc__fail(DSC_ERR_CORRUPT, "checkpoint %s: %s %s is %lld bytes, the manifest "
                         "says %llu (%s)", ck->path, f->rank >= 0 ? "shard" : "attached file",
                         f->name, (long long)sb.st_size,
                         (unsigned long long)f->bytes,
                         (uint64_t)sb.st_size < f->bytes ? "truncated" : "grown");
    uint64_t bytes, h;
    DSC_TRY(dsc__ckpt_hash_file(path, &bytes, &h));
    if (h != f->xxh3)
        return dsc__fail(DSC_ERR_CORRUPT, "checkpoint %s: %s %s checksum mismatch (manifest "
                         "%016" PRIx64 ", file %016" PRIx64 "): the file is corrupted", ck->path,
                         f->rank >= 0 ? "shard" : "attached file", f->name, f->xxh3, h);
    return DSC_OK;
}

static dsc_status shard_mismatch(const dsc_ckpt *ck, const char *file, const char *what) {
    return dsc__fail(DSC_ERR_CORRUPT, "checkpoint %s: shard %s does not match the manifest (%s)",
                     ck->path, file, what);
}

static dsc_status check_meta(const dsc_ckpt *ck, const dsc_st_file *f, int r) {
    const dsc__manifest *m = &ck->m;
    const char *file = m->files[r].name, *fmt = dsc_st_meta(f, "format");
    const char *tag = dsc_st_meta(f, "tag"), *step = dsc_st_meta(f, "step");
    const char *rank = dsc_st_meta(f, "rank"), *world = dsc_st_meta(f, "world_size");
    if (!fmt || strcmp(fmt, DSC_CKPT_SHARD_FORMAT) != 0) return shard_mismatch(ck, file, "not a dsc shard");
    if (!tag || strcmp(tag, m->tag) != 0) return shard_mismatch(ck, file, "another tag");
    if (!step || strtoll(step, NULL, 10) != m->step) return shard_mismatch(ck, file, "another step");
    if (!rank || strtoll(rank, NULL, 10) != r || !world || strtoll(world, NULL, 10) != m->world)
        return shard_mismatch(ck, file, "another rank or world size");
    return DSC_OK;
}

static dsc_status map_shard(dsc_ckpt *ck, int r) {
    const dsc__manifest *m = &ck->m;
    char path[DSC_CKPT_PATH_MAX];
    DSC_TRY(dsc__ckpt_join(path, sizeof path, ck->path, m->files[r].name));
    DSC_TRY(dsc_st_open(&ck->shards[r], path));
    DSC_TRY(check_meta(ck, ck->shards[r], r));
    for (int kind = 0; kind <= m->nmoments; kind++) {
        for (int g = 0; g < m->ngroups; g++) {
            char name[64];
            dsc__shard_tensor_name(m, kind, g, name, sizeof name);
            const dsc_st_tensor *t = dsc_st_find(ck->shards[r], name);
            if (!t || strcmp(t->dtype, "F32") != 0 || t->ndim != 1 ||
                (uint64_t)t->shape[0] != m->groups[g].slice) {
                char why[128];
                snprintf(why, sizeof why, "tensor %s missing or not (%zu,) F32", name, m->groups[g].slice);
                return shard_mismatch(ck, m->files[r].name, why);
            }
            ck->slices[((size_t)r * (1 + m->nmoments) + kind) * m->ngroups + g] = t->data;
        }
    }
    return DSC_OK;
}

static dsc_status check_marker(const dsc_ckpt *ck) {
    char path[DSC_CKPT_PATH_MAX];
    DSC_TRY(dsc__ckpt_join(path, sizeof path, ck->path, DSC_CKPT_BAD_MARKER));
    if (!dsc__ckpt_exists(path)) return DSC_OK;
    char *why = NULL;
    size_t n;
    if (dsc__ckpt_read_file(path, &why, &n) == DSC_OK)
        while (n > 0 && (why[n - 1] == '\n' || why[n - 1] == ' ')) why[--n] = '\0';
    dsc_status st = dsc__fail(DSC_ERR_CORRUPT, "checkpoint %s was marked bad after its save: %s",
                              ck->path, why && why[0] ? why : "(no reason recorded)");
    free(why);
    return st;
}

static dsc_status open_manifest(dsc_ckpt *ck, const char *tag) {
    char path[DSC_CKPT_PATH_MAX];
    DSC_TRY(dsc__ckpt_join(path, sizeof path, ck->path, DSC_CKPT_MANIFEST));
    if (!dsc__ckpt_exists(path))
        return dsc__fail(DSC_ERR_IO, "checkpoint %s: %s is missing (an incomplete save, or not a "
                         "checkpoint)", ck->path, DSC_CKPT_MANIFEST);
    size_t n;
    DSC_TRY(dsc__ckpt_read_file(path, &ck->text, &n));
    DSC_TRY(dsc__manifest_parse(&ck->m, ck->text, n, path));
    if (strcmp(ck->m.tag, tag) != 0)
        return dsc__fail(DSC_ERR_CORRUPT, "checkpoint %s: its manifest belongs to tag %s (a "
                         "manifest from another checkpoint, or a renamed directory)", ck->path,
                         ck->m.tag);
    return DSC_OK;
}

static dsc_status open_verified(dsc_ckpt *ck, const char *dir, const char *tag) {
    DSC_TRY(dsc__ckpt_join(ck->path, sizeof ck->path, dir, tag));
    if (!dsc__ckpt_is_dir(ck->path))
        return dsc__fail(DSC_ERR_IO, "checkpoint %s does not exist; dsc ckpt ls %s lists the tags",
                         ck->path, dir);
    DSC_TRY(check_marker(ck));
    DSC_TRY(open_manifest(ck, tag));
    const dsc__manifest *m = &ck->m;
    for (int r = 0; r < m->nfiles; r++) DSC_TRY(verify_file(ck, &m->files[r]));
    for (int i = 0; i < m->nattach; i++) DSC_TRY(verify_file(ck, &m->attach[i]));
    ck->shards = calloc((size_t)m->world, sizeof *ck->shards);
    ck->slices = calloc((size_t)m->world * (1 + m->nmoments) * m->ngroups, sizeof *ck->slices);
    if (!ck->shards || !ck->slices) return dsc__fail(DSC_ERR_OOM, "out of memory opening %s", ck->path);
    for (int r = 0; r < m->world; r++) DSC_TRY(map_shard(ck, r));
    return DSC_OK;
}

// ---- public: reading ----

dsc_status dsc_ckpt_latest(const char *dir, char *tag, size_t cap) {
    char path[DSC_CKPT_PATH_MAX];
    DSC_TRY(dsc__ckpt_join(path, sizeof path, dir, DSC_CKPT_LATEST));
    if (!dsc__ckpt_exists(path))
        return dsc__fail(DSC_ERR_IO, "%s has no `latest` file: no checkpoint was completed there",
                         dir);
    char *text;
    size_t n;
    DSC_TRY(dsc__ckpt_read_file(path, &text, &n));
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) text[--n] = '\0';
    dsc_status st = DSC_OK;
    if (n == 0 || n >= cap || strchr(text, '/') || !strcmp(text, ".") || !strcmp(text, ".."))
        st = dsc__fail(DSC_ERR_CORRUPT, "%s does not hold a tag name", path);
    else
        snprintf(tag, cap, "%s", text);
    free(text);
    return st;
}

dsc_status dsc_ckpt_open(dsc_ckpt **out, const char *dir, const char *tag) {
    *out = NULL;
    char latest[DSC_CKPT_TAG_MAX];
    if (!tag) {
        DSC_TRY(dsc_ckpt_latest(dir, latest, sizeof latest));
        tag = latest;
    }
    dsc_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck) return dsc__fail(DSC_ERR_OOM, "out of memory opening a checkpoint");
    dsc_status st = open_verified(ck, dir, tag);
    if (st != DSC_OK) {
        dsc_ckpt_close(ck);
        return st;
    }
    *out = ck;
    return DSC_OK;
}

void dsc_ckpt_close(dsc_ckpt *ck) {
    if (!ck) return;
    for (int r = 0; ck->shards && r < ck->m.world; r++) dsc_st_close(ck->shards[r]);
    free(ck->shards);
    free(ck->slices);
    dsc__manifest_free(&ck->m);
    free(ck->text);
    free(ck);
}

void dsc_ckpt_get_info(const dsc_ckpt *ck, dsc_ckpt_info *out) {
    const dsc__manifest *m = &ck->m;
    *out = (dsc_ckpt_info){.tag = m->tag, .precision = m->precision, .optimizer = m->optimizer,
                           .dsc_version = m->dsc_version, .step = m->step,
                           .applied_steps = m->scalars.applied_steps,
                           .skipped_steps = m->scalars.skipped_steps,
                           .loss_scale = m->scalars.cur_scale, .world_size = m->world,
                           .zero_stage = m->stage, .nmoments = m->nmoments,
                           .nparams = m->nparams, .ngroups = m->ngroups, .nfiles = m->nfiles,
                           .created = m->created};
    for (int k = 0; k < m->nmoments; k++) out->moment_names[k] = m->moments[k];
    for (int r = 0; r < m->nfiles; r++) out->bytes += m->files[r].bytes;
}

void dsc_ckpt_get_param(const dsc_ckpt *ck, int i, dsc_ckpt_param *out) {
    const dsc__mparam *p = &ck->m.params[i];
    *out = (dsc_ckpt_param){.name = p->name, .ndim = p->ndim, .numel = p->numel, .group = p->group};
    memcpy(out->shape, p->shape, sizeof out->shape);
}

int dsc_ckpt_find_param(const dsc_ckpt *ck, const char *name) {
    for (int i = 0; i < ck->m.nparams; i++)
        if (!strcmp(ck->m.params[i].name, name)) return i;
    return -1;
}

const char *dsc_ckpt_manifest_text(const dsc_ckpt *ck) { return ck->text; }

// The group holding flat offset x (groups are contiguous and ordered).
static int group_of(const dsc__manifest *m, uint64_t x) {
    int lo = 0, hi = m->ngroups - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->groups[mid].off <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void dsc__ckpt_read_flat(const dsc_ckpt *ck, int kind, uint64_t off, size_t n, float *dst) {
    const dsc__manifest *m = &ck->m;
    int g = group_of(m, off);
    const dsc_state_group *G = &m->groups[g];
    while (n > 0) {
        size_t within = (size_t)(off - G->off), r = within / G->slice, in = within % G->slice;
        size_t take = G->slice - in < n ? G->slice - in : n;
        const float *src = ck->slices[(r * (1 + (size_t)m->nmoments) + (size_t)kind) * m->ngroups + g];
        memcpy(dst, src + in, take * sizeof(float));
        dsc__map_drop(src + in, take * sizeof(float)); // read piece by piece: none stays resident
        dst += take;
        off += take;
        n -= take;
    }
}

dsc_status dsc_ckpt_read_param(const dsc_ckpt *ck, int i, int kind, float *out) {
    if (i < 0 || i >= ck->m.nparams || kind < 0 || kind > ck->m.nmoments)
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint %s: no parameter %d / kind %d", ck->path, i, kind);
    const dsc__mparam *p = &ck->m.params[i];
    dsc__ckpt_read_flat(ck, kind, p->off, (size_t)p->numel, out);
    return DSC_OK;
}

// ---- listing ----

static bool is_partial_name(const char *name) {
    return strstr(name, ".tmp.") != NULL || strstr(name, ".del.") != NULL;
}

// A folder that holds one of our shard files (a save whose manifest was lost).
static bool has_shard_file(const char *path) {
    char **names;
    int n;
    if (dsc__ckpt_list_dir(path, &names, &n) != DSC_OK) return false;
    bool found = false;
    for (int i = 0; i < n && !found; i++)
        found = !strncmp(names[i], "shard_rank", 10) && strstr(names[i], ".safetensors");
    dsc__ckpt_free_names(names, n);
    return found;
}

// Fills *e for the folder dir/name; false when the folder does not look like a checkpoint at
// all (no manifest, no BAD marker, not an interrupted save, not DeepSpeed's, no shard files):
// a save directory may sit beside other folders (logs, data, a model), and those are not listed.
static bool read_entry(const char *dir, const char *name, bool latest, dsc_ckpt_entry *e) {
    snprintf(e->name, sizeof e->name, "%s", name);
    e->step = -1;
    e->latest = latest;
    e->state = is_partial_name(name) ? DSC_CKPT_PARTIAL : DSC_CKPT_COMPLETE;
    char path[DSC_CKPT_PATH_MAX], sub[DSC_CKPT_PATH_MAX];
    if (dsc__ckpt_join(path, sizeof path, dir, name) != DSC_OK) return false;
    if (dsc__ckpt_join(sub, sizeof sub, path, DSC_CKPT_BAD_MARKER) == DSC_OK && dsc__ckpt_exists(sub))
        e->state = DSC_CKPT_BAD;
    if (dsc__ckpt_join(sub, sizeof sub, path, DSC_CKPT_MANIFEST) != DSC_OK) return false;
    char *text = NULL;
    size_t n;
    dsc__manifest m;
    if (dsc__ckpt_exists(sub) && dsc__ckpt_read_file(sub, &text, &n) == DSC_OK &&
        dsc__manifest_parse(&m, text, n, sub) == DSC_OK) {
        e->step = m.step;
        dsc__manifest_free(&m);
    } else if (e->state == DSC_CKPT_COMPLETE && dsc__ds_model_file(path)) {
        e->state = DSC_CKPT_DEEPSPEED; // DeepSpeed writes no manifest
    } else if (e->state == DSC_CKPT_COMPLETE && !dsc__ckpt_exists(sub)) {
        if (!latest && !has_shard_file(path)) {
            free(text);
            return false;
        }
        e->state = DSC_CKPT_PARTIAL;
    }
    free(text);
    if (e->step < 0 && !strncmp(name, "global_step", 11)) e->step = strtoll(name + 11, NULL, 10);
    return true;
}

static int cmp_entries(const void *a, const void *b) {
    const dsc_ckpt_entry *x = a, *y = b;
    if (x->step != y->step) return x->step > y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

dsc_status dsc_ckpt_list(const char *dir, dsc_ckpt_entry **out, int *count) {
    *out = NULL;
    *count = 0;
    char **names;
    int n;
    DSC_TRY(dsc__ckpt_list_dir(dir, &names, &n));
    dsc_ckpt_entry *v = calloc((size_t)n + 1, sizeof *v);
    if (!v) {
        dsc__ckpt_free_names(names, n);
        return dsc__fail(DSC_ERR_OOM, "out of memory listing %s", dir);
    }
    char latest[DSC_CKPT_TAG_MAX] = "";
    if (dsc_ckpt_latest(dir, latest, sizeof latest) != DSC_OK) latest[0] = '\0';
    int k = 0;
    for (int i = 0; i < n; i++) {
        char path[DSC_CKPT_PATH_MAX];
        if (dsc__ckpt_join(path, sizeof path, dir, names[i]) != DSC_OK || !dsc__ckpt_is_dir(path))
            continue;
        if (read_entry(dir, names[i], !strcmp(names[i], latest), &v[k])) k++;
    }
    dsc__ckpt_free_names(names, n);
    qsort(v, (size_t)k, sizeof *v, cmp_entries);
    *out = v;
    *count = k;
    return DSC_OK;
}

dsc_status dsc_ckpt_split_path(const char *path, char *dir, size_t dir_cap, char *tag,
                               size_t tag_cap, bool *has_tag) {
    char buf[DSC_CKPT_PATH_MAX], probe[DSC_CKPT_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return dsc__fail(DSC_ERR_INVALID_ARG, "path %s is too long", path);
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/') buf[--len] = '\0';
    *has_tag = false;
    tag[0] = '\0';
    // A checkpoint directory holds a manifest (or had one: a BAD marker, or its save directory
    // has `latest` while it has none).
    bool is_tag = false;
    if (dsc__ckpt_join(probe, sizeof probe, buf, DSC_CKPT_MANIFEST) == DSC_OK && dsc__ckpt_exists(probe)) is_tag = true;
    if (dsc__ckpt_join(probe, sizeof probe, buf, DSC_CKPT_BAD_MARKER) == DSC_OK && dsc__ckpt_exists(probe)) is_tag = true;
    const char *slash = strrchr(buf, '/');
    char parent[DSC_CKPT_PATH_MAX];
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - buf) : 1, slash ? buf : ".");
    if (slash == buf) snprintf(parent, sizeof parent, "/");
    if (!is_tag && dsc__ckpt_join(probe, sizeof probe, buf, DSC_CKPT_LATEST) == DSC_OK && !dsc__ckpt_exists(probe) &&
        dsc__ckpt_join(probe, sizeof probe, parent, DSC_CKPT_LATEST) == DSC_OK && dsc__ckpt_exists(probe))
        is_tag = true;
    if (!is_tag) {
        snprintf(dir, dir_cap, "%s", buf);
        return DSC_OK;
    }
    const char *base = slash ? slash + 1 : buf;
    if (strlen(base) >= tag_cap || strlen(parent) >= dir_cap)
        return dsc__fail(DSC_ERR_INVALID_ARG, "path %s is too long", path);
    snprintf(dir, dir_cap, "%s", parent);
    snprintf(tag, tag_cap, "%s", base);
    *has_tag = true;
    return DSC_OK;
}

int dsc_ckpt_num_attachments(const dsc_ckpt *ck) { return ck->m.nattach; }

const char *dsc_ckpt_attachment_name(const dsc_ckpt *ck, int i) { return ck->m.attach[i].name; }

bool dsc_ckpt_attachment_path(const dsc_ckpt *ck, const char *name, char *path, size_t cap) {
    for (int i = 0; i < ck->m.nattach; i++)
        if (!strcmp(ck->m.attach[i].name, name))
            return dsc__ckpt_join(path, cap, ck->path, name) == DSC_OK;
    return false;
}
