// engine/ft/ft.h - fault tolerance inside the engine (docs/fault-tolerance.md): the step
// watchdog, snapshots of this rank's state and a buddy's replica, recovery after a communication
// fault (agree on the survivors, new communicator, re-layout, restore, redo the step), and fault
// injection for tests. engine.c and zero/zero.c call these; the public face is in dsc/engine.h.
#ifndef DSC_ENGINE_FT_H
#define DSC_ENGINE_FT_H

#include "dsc/engine.h" // dsc_engine, dsc_ft_report

// After the engine's communicator exists (no-op on one rank, where there is nothing to recover).
dsc_status dsc__ft_create(dsc_engine *e);
void dsc__ft_destroy(dsc_engine *e); // stops the watchdog; NULL state ok

// The optimizer step's deadline (fault_tolerance.step_timeout_s): armed by dsc_step_begin,
// disarmed at the end of dsc_step's boundary.
void dsc__ft_step_begin(dsc_engine *e);
void dsc__ft_step_end(dsc_engine *e);

// Where the step is (a static string: "forward", "backward", "reduce", "optimizer", ...): named
// by the watchdog's message, and the place where DSC_FT_INJECT faults fire.
void dsc__ft_point(dsc_engine *e, const char *phase);

// At the optimizer step's boundary, after the update: copy this rank's state into a snapshot and
// start sending it to the buddy rank (rank + 1); the exchange runs during the next step's compute.
// _end waits for it, at the next boundary before the gradient-norm collective (so no rank passes
// that collective before every replica is whole). Together they commit the step: from there it
// survives the loss of any one rank.
dsc_status dsc__ft_commit_begin(dsc_engine *e);
dsc_status dsc__ft_commit_end(dsc_engine *e);
// The state changed outside a step (initial weights, a checkpoint load): snapshot and replicate
// it (every rank calls it).
dsc_status dsc__ft_state_changed(dsc_engine *e);

// Whether a fault could use the snapshots: several ranks and fault_tolerance.on_failure not abort.
bool dsc__ft_keeps_state(const dsc_engine *e);
// Whether the buddy keeps a replica of this rank's partition (fault_tolerance.replicate, stages
// 1-3): a partitioned frozen base sends it its slices once (zero/frozen.c).
bool dsc__ft_replicates(const dsc_engine *e);

// Snapshots a device fills (engine/device.h): reserve the slot of the boundary just made (its
// scalars taken now; NULL without fault tolerance) for the caller's asynchronous copy of the
// packed state (nvec x len floats, dsc__ft_snapshot_floats); publish it once the copy is complete
// (after this boundary's dsc__ft_commit_end): tagged, its replica sent to the buddy. Cancel after
// a fault (the slot stays untagged). The own slots can live in the caller's memory (page-locked
// for the copy): dsc__ft_own_external copies what they hold into bufs (two of
// dsc__ft_snapshot_floats each), or with NULL back into the engine's pool; a re-layout
// (recovery on fewer ranks) puts them back into the pool by itself.
float *dsc__ft_snapshot_reserve(dsc_engine *e);
dsc_status dsc__ft_snapshot_publish(dsc_engine *e);
void dsc__ft_snapshot_cancel(dsc_engine *e);
size_t dsc__ft_snapshot_floats(const dsc_engine *e);
dsc_status dsc__ft_own_external(dsc_engine *e, float *const bufs[2]);
// On one node the own slots are in a segment shared with the buddy (no replica is sent): true
// and their addresses (two of dsc__ft_snapshot_floats, page-aligned, stable until the next
// recovery or the engine's end), which the caller fills in place (page-locked for the copy)
// instead of bringing its own; dsc__ft_own_external then keeps them. False otherwise.
bool dsc__ft_own_shared(dsc_engine *e, float *bufs[2]);
// The caller's own slots are forgotten (untagged, no memory) once the exchange reading them ends:
// before the caller frees them at the end of a run, when no snapshot is needed any more.
void dsc__ft_own_drop(dsc_engine *e);

// Re-read the snapshot slots' addresses after the engine's pool moved blocks.
void dsc__ft_resolve(dsc_engine *e);

// dsc_engine_recover (see dsc/engine.h).
dsc_status dsc__ft_recover(dsc_engine *e, dsc_status failure, dsc_ft_report *out);
int64_t dsc__ft_events(const dsc_engine *e);

// Test hooks (docs/fault-tolerance.md): the full training state at a step boundary to and from
// one safetensors file, independent of world size and stage (collective; rank 0 writes).
dsc_status dsc__ft_save_state(dsc_engine *e, const char *path);
dsc_status dsc__ft_load_state(dsc_engine *e, const char *path);

#endif
