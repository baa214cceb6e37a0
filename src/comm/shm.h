// comm/shm.h - the shared-memory backend (ranks of one node).
//
// Rendezvous: rank 0 creates a POSIX shared-memory segment named
//   /dsc-<master port>-<group tag>-<pid>-<random token>
// and publishes its name through the store; the other ranks open and map it. The last rank to
// map it (and rank 0 again, once it sees everyone attached) unlinks the name, so nothing is left
// in /dev/shm once dsc_comm_create returns, even if processes are killed later.
//
// Segment: a header (abort flag), one control block per rank (chunk counters, pid, heartbeat,
// futex doorbell, the descriptors of its last collectives), two staging slots per rank, two
// result slots, and one byte ring per ordered pair of ranks for send/recv.
//
// Tunables (read by rank 0 at create): DSC_SHM_SLOT_BYTES, the staging slot size (default 1 MiB,
// 256 KiB above 16 ranks; buffers larger than a slot move in chunks), DSC_SHM_CHAN_BYTES, the
// send/recv ring size per pair of ranks (default about 32 MiB over all pairs, 1 KiB to 1 MiB
// each). At most 256 ranks. docs/comm.md describes the protocol.
#ifndef DSC_COMM_SHM_H
#define DSC_COMM_SHM_H

#include "comm/backend.h" // dsc__comm_ops

// Prefix of every segment name (under /dev/shm on Linux).
#define DSC_SHM_NAME_PREFIX "dsc-"

extern const dsc__comm_ops dsc__shm_ops;

#endif
