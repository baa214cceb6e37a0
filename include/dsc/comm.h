// dsc/comm.h - communicators: collectives and point-to-point messages between ranks.
//
// A communicator joins `world_size` processes (ranks). Every operation is asynchronous: it is
// enqueued and returns a request that dsc_comm_wait() or dsc_comm_test() completes; passing
// req == NULL makes the call blocking. Buffers are borrowed until the request completes.
//
// Backends:
//   "shm"  ranks of one node, CPU buffers, data moved through one POSIX shared-memory segment;
//          operations run in issue order on a progress thread of the communicator, so that the
//          caller computes while they run.
//   "mpi"  Open MPI (when dsc was built with it); CPU buffers; nonblocking MPI collectives.
//   "nccl" NVIDIA NCCL (when dsc was built with CUDA and NCCL); GPU buffers, device pointers on
//          the communicator's CUDA device (dsc_comm_opts.device; by default LOCAL_RANK modulo the
//          visible devices, the launcher's convention). One GPU per rank: NCCL refuses two ranks
//          of one communicator on the same GPU. Non-blocking NCCL
//          communicators; the ncclUniqueId goes from rank 0 to the others through the rendezvous
//          store. Every operation runs on the communicator's own CUDA stream, after the work
//          already issued there; a request completes when the device finished it (so the
//          caller's other streams may use the results once dsc_comm_wait returned). Sends and
//          receives are issued together (one NCCL group) when the next collective, wait or test
//          comes, so that a ring of send-then-receive does not deadlock.
//
// DETERMINISM (shm): every reduction adds element-wise in rank order, accumulating in fp32,
//     r = ((x_0 + x_1) + x_2) + ... + x_{N-1}
// and rounds once to the dtype (fp16/bf16: round to nearest even, as dsc/half.h). The result is
// therefore independent of timing and of the backend's chunking, identical on every rank, and
// all_reduce is bitwise identical to reduce_scatter followed by all_gather. MAX keeps the first of
// equal values in rank order and propagates NaN. The mpi backend cannot promise this: MPI chooses
// its own summation order (which may depend on message size and process placement), and reduces
// fp16/bf16 by converting to fp32, reducing, and rounding back.
//
// Deadlines: an operation fails when its peers make no progress for timeout_s seconds
// (DSC_ERR_TIMEOUT, naming the operation, its size, the elapsed time and the ranks that had not
// arrived), or as soon as a peer is seen dead (DSC_ERR_PEER, naming the rank and its pid). After
// any failure the communicator is broken: every later operation fails at once with the first
// failure's message, and the caller builds a new communicator (e.g. with another group_tag).
// nccl: NCCL has no deadline of its own; the host polls the operation's completion event and
// NCCL's asynchronous error against timeout_s, and on a timeout or an error aborts the NCCL
// communicator (ncclCommAbort), which ends the kernels still waiting for peers. It cannot tell
// which rank is missing, so the message names the operation, this rank, the world and the fix.
// 16-bit reductions are NCCL's (rounded at each step of its algorithm), not shm's rank-order sum.
#ifndef DSC_COMM_H
#define DSC_COMM_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint64_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_dtype { DSC_DT_F32 = 0, DSC_DT_F16 = 1, DSC_DT_BF16 = 2 } dsc_dtype;
typedef enum dsc_red_op { DSC_OP_SUM = 0, DSC_OP_MAX = 1 } dsc_red_op;

typedef struct dsc_comm dsc_comm;
typedef struct dsc_comm_req dsc_comm_req; // handle of one asynchronous operation
struct dsc_store;                         // comm/store.h: rendezvous key-value store

typedef struct dsc_comm_opts {
    const char *backend;    // "shm" (default when NULL), "mpi" or "nccl"
    int rank, world_size;   // -1: from the environment (dsc_comm_env)
    const char *master_addr; // rendezvous store host; NULL: MASTER_ADDR (dsc_comm_env)
    int master_port;        // rendezvous store port; 0: MASTER_PORT (dsc_comm_env)
    double timeout_s;       // deadline without progress (fault_tolerance.comm_timeout_s); <= 0: 30
    const char *group_tag;  // distinguishes communicators of one job (e.g. after a shrink); NULL ok
    struct dsc_store *store; // optional: an existing store to rendezvous through (borrowed during
                             // create); NULL: rank 0 hosts one on master_addr:master_port for the
                             // duration of dsc_comm_create
    int device;             // nccl: this rank's CUDA device; -1 (the default): LOCAL_RANK (or,
                            // when the environment names no local rank, the rank) modulo the
                            // visible devices. (A zeroed struct means device 0.) Other backends
                            // ignore it.
} dsc_comm_opts;

// Defaults: backend "shm", rank/world from the environment, timeout 30 s, device -1.
dsc_comm_opts dsc_comm_opts_default(void);

// Collective: every rank of the group calls it. Returns after all ranks joined (or the deadline).
dsc_status dsc_comm_create(dsc_comm **out, const dsc_comm_opts *o);
// Not collective. Requests not yet waited are failed and freed (using them afterwards is a bug);
// peers still waiting on this rank fail with DSC_ERR_PEER. destroy(NULL) is a no-op.
void dsc_comm_destroy(dsc_comm *c);

int dsc_comm_rank(const dsc_comm *c);
int dsc_comm_size(const dsc_comm *c);
const char *dsc_comm_backend(const dsc_comm *c); // "shm", "mpi" or "nccl"
// Whether this build has the backend `name` ("shm" always; "mpi" and "nccl" when built).
bool dsc_comm_backend_available(const char *name);
// Size in bytes of one element of the dtype (4 or 2).
size_t dsc_dtype_size(dsc_dtype dt);
const char *dsc_dtype_name(dsc_dtype dt); // "f32", "f16", "bf16"

// recv[i] = reduce over ranks of send[i]; send == recv (in place) is allowed.
dsc_status dsc_comm_all_reduce(dsc_comm *c, const void *send, void *recv, size_t count,
                               dsc_dtype dt, dsc_red_op op, dsc_comm_req **req);
// send: (world, count); rank r receives recv: (count) = reduce over ranks of send[r, :].
dsc_status dsc_comm_reduce_scatter(dsc_comm *c, const void *send, void *recv, size_t count,
                                   dsc_dtype dt, dsc_red_op op, dsc_comm_req **req);
// send: (count); recv: (world, count), recv[r, :] = send of rank r. send may be recv + rank*count.
dsc_status dsc_comm_all_gather(dsc_comm *c, const void *send, void *recv, size_t count,
                               dsc_dtype dt, dsc_comm_req **req);
// buf: (count), root's contents copied to every rank.
dsc_status dsc_comm_broadcast(dsc_comm *c, void *buf, size_t count, dsc_dtype dt, int root,
                              dsc_comm_req **req);
// Like all_reduce, but only root receives; recv is ignored (may be NULL) on other ranks.
dsc_status dsc_comm_reduce(dsc_comm *c, const void *send, void *recv, size_t count, dsc_dtype dt,
                           dsc_red_op op, int root, dsc_comm_req **req);
dsc_status dsc_comm_barrier(dsc_comm *c, dsc_comm_req **req);
// Point to point: messages between one pair arrive in the order they were sent; the receiver's
// count must equal the sender's. Point-to-point operations progress concurrently with
// collectives (a send issued after a collective does not wait for it), so that exchange
// patterns such as a ring (send to next, recv from previous) do not deadlock.
dsc_status dsc_comm_send(dsc_comm *c, const void *buf, size_t count, dsc_dtype dt, int peer,
                         dsc_comm_req **req);
dsc_status dsc_comm_recv(dsc_comm *c, void *buf, size_t count, dsc_dtype dt, int peer,
                         dsc_comm_req **req);

// Wait for the request and free it. Returns its status: DSC_ERR_TIMEOUT, DSC_ERR_PEER,
// DSC_ERR_INVALID_ARG (ranks called different collectives), DSC_ERR_MPI, ... with the message in
// dsc_last_error().
dsc_status dsc_comm_wait(dsc_comm_req *req);
// Non-blocking: *done = true when the request finished; it is then freed and its status returned.
dsc_status dsc_comm_test(dsc_comm_req *req, bool *done);

// Totals over completed operations of this rank. bytes counts the payload as nccl-tests do:
// count * element size for all_reduce, reduce, broadcast, send and recv; world * count * element
// size for reduce_scatter and all_gather. seconds sums the time from start to completion.
typedef struct dsc_comm_stats {
    uint64_t ops, bytes;
    double seconds;
} dsc_comm_stats;
void dsc_comm_get_stats(const dsc_comm *c, dsc_comm_stats *s);

// ---- comms logger (DeepSpeed's comms_logger) ----
// One process-wide record of every completed operation of every communicator, whatever its
// backend, kept per (operation, message size, world size): count, total and trimmed-mean latency
// (submit to completion), and DeepSpeed's bandwidths. Off until configured; thread-safe.

// The operations, as bits of an `ops` mask.
enum {
    DSC_COMM_LOG_ALL_REDUCE = 1 << 0,
    DSC_COMM_LOG_REDUCE_SCATTER = 1 << 1,
    DSC_COMM_LOG_ALL_GATHER = 1 << 2,
    DSC_COMM_LOG_BROADCAST = 1 << 3,
    DSC_COMM_LOG_REDUCE = 1 << 4,
    DSC_COMM_LOG_BARRIER = 1 << 5,
    DSC_COMM_LOG_SEND = 1 << 6,
    DSC_COMM_LOG_RECV = 1 << 7,
    DSC_COMM_LOG_EVERY_OP = 0xff,
};
// The mask bit of an operation name: dsc's names above (lower case, "all_reduce") and
// DeepSpeed's spellings (all_gather_into_tensor, reduce_scatter_tensor, isend, irecv).
// DSC_ERR_INVALID_ARG naming the known names otherwise.
dsc_status dsc_comm_log_op_bit(const char *name, unsigned *bit);
// Start (enabled) or stop recording the operations in `ops`; recorded entries are kept.
void dsc_comm_logger_configure(bool enabled, unsigned ops);
// Forget every entry.
void dsc_comm_logger_reset(void);

typedef struct dsc_comm_log_entry {
    const char *op;        // "all_reduce", ... (static)
    uint64_t msg_bytes;    // per rank: count * element size (reduce_scatter: the output)
    int world;             // ranks of the communicator
    uint64_t count;        // completed operations
    double total_ms;       // summed latency
    double avg_ms;         // mean latency, 10% trimmed at each end (DeepSpeed's trim_mean)
    double algbw_gbps, busbw_gbps; // DeepSpeed's tput_avg and busbw_avg at avg_ms
} dsc_comm_log_entry;
// Up to cap entries, by operation then message size; returns how many there are in all.
size_t dsc_comm_logger_entries(dsc_comm_log_entry *out, size_t cap);
// DeepSpeed's bandwidths (Gbps) of one operation of msg_bytes per rank over ms milliseconds:
// algbw all_reduce 2S/t, all_gather / reduce_scatter nS/t, others S/t; busbw all_reduce
// S/t * 2(n-1)/n, all_gather / reduce_scatter nS/t * (n-1)/n, others S/t.
void dsc_comm_log_bandwidth(const char *op, double msg_bytes, double ms, int world,
                            double *algbw_gbps, double *busbw_gbps);
// DeepSpeed's convert_size: "0B", "512.0 B", "4.0 KB", "1.5 MB" (1024-based, two decimals at
// most, as Python's round() then str() print them), into buf (cap bytes).
void dsc_comm_format_size(uint64_t bytes, char *buf, size_t cap);
// DeepSpeed's log_all table (Comm. Op, Message Size, Count, Total Latency(ms), Avg Latency(ms),
// tput_avg (Gbps), busbw_avg (Gbps)) into out (a FILE *).
void dsc_comm_logger_print(void *out);

// ---- fault tolerance ----

// Abort the communicator from any thread (e.g. a watchdog while another thread is blocked in an
// operation of c): it becomes broken with st and reason (the first reason wins), operations in
// flight fail promptly (shm: within about 10 ms) with that reason, and so do the peers' operations
// on this communicator (shm: through the segment's abort flag). Destroy c afterwards as usual.
void dsc_comm_abort(dsc_comm *c, dsc_status st, const char *reason);
// True when c is broken (by a failed operation or dsc_comm_abort); *st and *msg (borrowed until
// destroy; both may be NULL) give the first failure.
bool dsc_comm_is_broken(dsc_comm *c, dsc_status *st, const char **msg);

typedef enum dsc_peer_state {
    DSC_PEER_UNKNOWN = 0, // the backend cannot tell (mpi)
    DSC_PEER_ALIVE,       // its process exists (it may still be hung: see stopped, heartbeat_age_s)
    DSC_PEER_DEAD,        // its process is gone (exited, killed, zombie)
    DSC_PEER_LEFT,        // it destroyed its communicator (alive, e.g. rebuilding after a failure)
} dsc_peer_state;

typedef struct dsc_comm_peer {
    dsc_peer_state state;
    int pid;                // its process id (0 while unknown)
    bool stopped;           // its process is stopped (SIGSTOP) or traced
    double heartbeat_age_s; // seconds since this process last saw its heartbeat advance; a live
                            // rank advances it at least every 0.1 s while its communicator exists
} dsc_comm_peer;
// What this process knows about rank `rank` of c (works on a broken communicator too).
dsc_status dsc_comm_peer_info(dsc_comm *c, int rank, dsc_comm_peer *out);

// A 64-bit note shared by the ranks of c, 0 at create, that any rank may read and change with
// a compare-and-swap, also after c broke: if it equals *expected it becomes desired (*swapped
// true), otherwise *expected receives its value (*swapped false). Survivors of a fault use it to
// agree where to meet. shm only (one segment); DSC_ERR_UNSUPPORTED elsewhere.
dsc_status dsc_comm_note_cas(dsc_comm *c, uint64_t *expected, uint64_t desired, bool *swapped);

// A new communicator of the ranks of c that are not in exclude[0..n) (ranks of c, each at most
// once), renumbered in order (rank r becomes r minus the excluded ranks below it). Collective over
// the survivors only: every rank that is not excluded calls it with the same list; the excluded
// ones do not call it. Operations of c still in flight are ended (NCCL_SHRINK_ABORT) and fail;
// c stays to be destroyed. nccl only (ncclCommShrink, NCCL 2.27.3 or newer), and only while c's
// NCCL communicator still exists: after a deadline or dsc_comm_abort it was aborted, and a new
// communicator (dsc_comm_create) is the way on. DSC_ERR_UNSUPPORTED with the reason otherwise.
dsc_status dsc_comm_shrink(dsc_comm *c, const int *exclude, int n, dsc_comm **out);

// ---- environment ----

// Where this process sits in the job, read once from the environment. Precedence:
//   torch/DeepSpeed: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   Open MPI:        OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   SLURM:           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_TASKS_PER_NODE + SLURM_NODEID
//   defaults:        rank 0 of 1
// MASTER_ADDR / MASTER_PORT win whenever set; otherwise under SLURM the first host of
// SLURM_JOB_NODELIST (or SLURM_NODELIST), else 127.0.0.1; port 29500.
typedef struct dsc_comm_env_info {
    int rank, world_size, local_rank, local_world_size;
    char master_addr[256];
    int master_port;
    const char *source; // "torch", "ompi", "slurm" or "default" (static string)
} dsc_comm_env_info;
// DSC_ERR_CONFIG naming the variable when one is malformed or they contradict each other.
dsc_status dsc_comm_env(dsc_comm_env_info *out);

// Expand a SLURM host list ("node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5). Bracket
// groups may repeat ("r[1-2]n[1-2]"); zero padding follows the range's first number. *hosts is an
// array of *n strings, caller owns: free with dsc_hostlist_free. DSC_ERR_INVALID_ARG on bad syntax
// or more than 1,000,000 hosts.
dsc_status dsc_hostlist_expand(const char *spec, char ***hosts, size_t *n);
void dsc_hostlist_free(char **hosts, size_t n);

// Tasks on node `node` from SLURM's tasks-per-node form (SLURM_TASKS_PER_NODE, "2(x3),1": nodes
// 0-2 run 2, node 3 runs 1); -1 when spec is NULL or malformed or has no such node.
int dsc_slurm_tasks_on_node(const char *spec, int node);
// The first host of the SLURM allocation (SLURM_JOB_NODELIST, else SLURM_NODELIST) into out (cap
// bytes); out is left alone when neither is set. DSC_ERR_CONFIG naming the list when it does not
// expand.
dsc_status dsc_slurm_first_host(char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
