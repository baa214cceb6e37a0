// launch/hosts.h - where ranks may run: hostfiles (`host slots=N`), --include/--exclude filters
// (`host1:0,1@host2`), --num_nodes/--num_gpus limits, and SLURM host lists (`node[01-04,07]`).
#ifndef DSC_LAUNCH_HOSTS_H
#define DSC_LAUNCH_HOSTS_H

#include <stddef.h> // size_t

#include "dsc/status.h" // dsc_status

// One host and the slots (GPU indices on GPU nodes, process slots otherwise) it offers.
typedef struct dsc__launch_host {
    char *name; // owned
    int *slots; // (nslots,) ascending, distinct; owned
    int nslots;
} dsc__launch_host;

// Hosts in hostfile order; rank numbering follows this order (host 0's slots first). Zero-init.
typedef struct dsc__launch_pool {
    dsc__launch_host *hosts; // (nhosts,), owned
    int nhosts;
} dsc__launch_pool;

#define DSC_LAUNCH_MAX_SLOTS 65536 // per host; a sanity bound for hostfiles and filters

// Parse hostfile text: one `HOST slots=N` per line, blank lines and # comments allowed, each host
// once. `origin` names the file in messages. DSC_ERR_CONFIG on malformed lines (with the line
// number), duplicate hosts or an empty file.
dsc_status dsc__launch_hostfile_parse(const char *text, const char *origin, dsc__launch_pool *out);
dsc_status dsc__launch_hostfile_read(const char *path, dsc__launch_pool *out);

// The pool of a machine without a hostfile: "localhost" with slots 0..nslots-1.
dsc_status dsc__launch_pool_local(int nslots, dsc__launch_pool *out);

// Apply --include or --exclude (at most one may be non-NULL) to `in`, writing a new pool to out.
// Syntax: entries separated by '@', each `HOST` (all its slots) or `HOST:S1,S2,...`. Hosts and
// slots must exist in `in`; hosts left without slots are dropped; order follows `in`.
// DSC_ERR_INVALID_ARG on bad syntax, unknown hosts or slots, both filters, or an empty result.
dsc_status dsc__launch_pool_filter(const dsc__launch_pool *in, const char *include,
                                   const char *exclude, dsc__launch_pool *out);

// Keep the first num_nodes hosts and the first slots_per_node slots of each (-1: no limit).
// DSC_ERR_INVALID_ARG when the pool has fewer hosts or a host fewer slots than asked for.
dsc_status dsc__launch_pool_limit(dsc__launch_pool *p, int num_nodes, int slots_per_node);

// Drop a host (no-op when absent).
void dsc__launch_pool_remove(dsc__launch_pool *p, const char *host);

int dsc__launch_pool_size(const dsc__launch_pool *p);                   // total slots
int dsc__launch_pool_find(const dsc__launch_pool *p, const char *host); // index or -1

// The pool as a complete filter string, "h1:0,1@h2:0,1" (caller frees); parse reads it back.
// This string tells node agents the whole job's layout.
dsc_status dsc__launch_pool_format(const dsc__launch_pool *p, char **out);
dsc_status dsc__launch_pool_parse(const char *spec, dsc__launch_pool *out);

dsc_status dsc__launch_pool_copy(const dsc__launch_pool *in, dsc__launch_pool *out);
void dsc__launch_pool_free(dsc__launch_pool *p); // leaves p zeroed

// SLURM's host lists and tasks-per-node form are read by dsc_hostlist_expand,
// dsc_slurm_tasks_on_node and dsc_slurm_first_host (dsc/comm.h), the parsers the launcher and the
// comm layer's environment reading share.

#endif
