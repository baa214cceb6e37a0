// tests/cuda/test_cuda_nccl.cu - the nccl comm backend on the GPU (label kernels).
//
// One GPU (always): every collective (all_reduce SUM and MAX, in and out of place,
// reduce_scatter, all_gather in and out of place, broadcast, reduce, barrier) for f32, f16 and
// bf16 at sizes 1, 7 and 1,000,003 on a one-rank communicator, against the input bit for bit
// (outputs are poisoned first, so an operation that did not run fails); asynchronous requests
// waited out of order and polled with dsc_comm_test; the statistics; argument errors. The 16-bit
// staging kernels of cuda/convert.h against dsc/half.h bit for bit (specials included). The
// deadline: DSC_NCCL_INJECT_DELAY holds the second operation's stream 4 s with comm_timeout_s
// 1: the communicator must turn broken after about 1 s and the call fail with DSC_ERR_TIMEOUT
// naming the operation and the ranks once NCCL's abort returns (it waits for the held stream),
// later operations fail at once, destroy works. An abort from another thread breaks the
// communicator at once and ends the held operation with its reason. (One GPU cannot make NCCL's
// own kernel hang: a one-rank communicator has no peer to wait for, and the comm layer refuses
// messages to oneself; the abort of a kernel stuck on a peer is for several GPUs.)
// dsc_comm_shrink with nobody excluded gives a working one-rank communicator (or is reported as
// refused by NCCL).
// dsc__nccl_after_event (comm/nccl.h): a user stream held by a spinning kernel, then a kernel
// writing the input, then an event; the communicator waits for the event without the host
// waiting, and its all_reduce must see the kernel's data; a wait of 2.5 s on the user stream with
// comm_timeout_s 1 is no timeout; an operation that is late after its wait passed (the test
// hook) times out about comm_timeout_s after the wait passed, not after it was issued.
// dsc__nccl_record_event: a second stream waits for that held collective through the event and
// copies its result.
// Several GPUs (when visible): one thread per GPU, world = GPUs (at most 8), every collective and
// dtype against host sums of small integers (exact in every dtype and summation order), a
// send-then-receive ring, and dsc_comm_shrink without the last rank followed by an all_reduce
// of the survivors. Exit 77 without a device.
#include <netinet/in.h> // sockaddr_in
#include <pthread.h>    // pthread_*
#include <sys/socket.h> // socket, bind
#include <time.h>       // nanosleep
#include <unistd.h>     // close

#include <string> // std::string

#include "cuda_test.h" // require_device, CK, DS, check_true, finish

extern "C" {
#include "base/time.h" // dsc_now
#include "comm/nccl.h" // dsc__nccl_after_event, dsc__nccl_record_event
}
#include "cuda/convert.h" // dsc__cuda_to16, dsc__cuda_from16, dsc__cuda_scale
#include "dsc/comm.h"     // dsc_comm_*

static const dsc_dtype DTS[] = {DSC_DT_F32, DSC_DT_F16, DSC_DT_BF16};

// ---- values of a dtype, as raw bytes ----

static float decode(dsc_dtype dt, const std::vector<uint8_t> &b, size_t i) {
    if (dt == DSC_DT_F32) {
        float f;
        memcpy(&f, b.data() + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, b.data() + 2 * i, 2);
    return dt == DSC_DT_F16 ? dsc_fp16_to_fp32(h) : dsc_bf16_to_fp32(h);
}

static void encode(dsc_dtype dt, std::vector<uint8_t> &b, size_t i, float v) {
    if (dt == DSC_DT_F32) {
        memcpy(b.data() + 4 * i, &v, 4);
        return;
    }
    uint16_t h = dt == DSC_DT_F16 ? dsc_fp32_to_fp16(v) : dsc_fp32_to_bf16(v);
    memcpy(b.data() + 2 * i, &h, 2);
}

static std::vector<uint8_t> randoms(dsc_dtype dt, size_t n) {
    std::vector<uint8_t> b(n * dsc_dtype_size(dt));
    for (size_t i = 0; i < n; i++) encode(dt, b, i, (float)normal());
    return b;
}

// The communicator works on a non-blocking stream of its own, which the legacy default stream does
// not order against: a copy from pageable memory or a memset may still be in flight when
// cudaMemcpy / cudaMemset return, so both wait for the device before a collective reads or
// writes the buffer (without the wait, a one-rank reduce could land before the poison did).
static void *upload(const std::vector<uint8_t> &b) {
    void *p = dev_alloc<uint8_t>(b.size());
    CK(cudaMemcpy(p, b.data(), b.size(), cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    return p;
}

static std::vector<uint8_t> download(const void *p, size_t bytes) {
    std::vector<uint8_t> b(bytes);
    CK(cudaMemcpy(b.data(), p, bytes, cudaMemcpyDeviceToHost));
    return b;
}

static void poison(void *p, size_t bytes) {
    CK(cudaMemset(p, 0xff, bytes));
    CK(cudaDeviceSynchronize());
}

static std::string label(const char *op, dsc_dtype dt, size_t n) {
    char b[128];
    snprintf(b, sizeof b, "world 1 %s %s n=%zu", op, dsc_dtype_name(dt), n);
    return b;
}

// ---- one GPU: every collective of a one-rank communicator is a copy ----

static void single_dtype(dsc_comm *c, dsc_dtype dt, size_t n) {
    size_t bytes = n * dsc_dtype_size(dt);
    std::vector<uint8_t> x = randoms(dt, n);
    void *send = upload(x), *recv = dev_alloc<uint8_t>(bytes), *tmp = upload(x);
    auto same = [&](const void *p) { return download(p, bytes) == x; };
    poison(recv, bytes);
    DS(dsc_comm_all_reduce(c, send, recv, n, dt, DSC_OP_SUM, NULL));
    check_true(label("all_reduce sum", dt, n).c_str(), same(recv) && same(send));
    DS(dsc_comm_all_reduce(c, tmp, tmp, n, dt, DSC_OP_MAX, NULL));
    check_true(label("all_reduce max in place", dt, n).c_str(), same(tmp));
    poison(recv, bytes);
    DS(dsc_comm_reduce_scatter(c, send, recv, n, dt, DSC_OP_SUM, NULL));
    check_true(label("reduce_scatter", dt, n).c_str(), same(recv));
    poison(recv, bytes);
    DS(dsc_comm_all_gather(c, send, recv, n, dt, NULL));
    check_true(label("all_gather", dt, n).c_str(), same(recv));
    DS(dsc_comm_all_gather(c, tmp, tmp, n, dt, NULL));
    check_true(label("all_gather in place", dt, n).c_str(), same(tmp));
    DS(dsc_comm_broadcast(c, tmp, n, dt, 0, NULL));
    check_true(label("broadcast", dt, n).c_str(), same(tmp));
    poison(recv, bytes);
    DS(dsc_comm_reduce(c, send, recv, n, dt, DSC_OP_SUM, 0, NULL));
    check_true(label("reduce", dt, n).c_str(), same(recv));
    CK(cudaFree(send));
    CK(cudaFree(recv));
    CK(cudaFree(tmp));
}

// Four all_reduces in flight, completed in reverse order and by polling; the statistics.
static void single_async(dsc_comm *c) {
    const size_t n = 65536;
    dsc_comm_stats s0, s1;
    dsc_comm_get_stats(c, &s0);
    std::vector<std::vector<uint8_t>> xs;
    void *send[4], *recv[4];
    dsc_comm_req *req[4];
    for (int k = 0; k < 4; k++) {
        xs.push_back(randoms(DSC_DT_F32, n));
        send[k] = upload(xs[k]);
        recv[k] = dev_alloc<uint8_t>(n * 4);
        DS(dsc_comm_all_reduce(c, send[k], recv[k], n, DSC_DT_F32, DSC_OP_SUM, &req[k]));
    }
    bool done = false;
    double t0 = dsc_now();
    while (!done && dsc_now() - t0 < 10) DS(dsc_comm_test(req[3], &done));
    bool ok = done;
    for (int k = 2; k >= 0; k--) DS(dsc_comm_wait(req[k]));
    for (int k = 0; k < 4; k++) {
        ok = ok && download(recv[k], n * 4) == xs[k];
        CK(cudaFree(send[k]));
        CK(cudaFree(recv[k]));
    }
    check_true("world 1 four requests in flight, waited in reverse and polled", ok);
    dsc_comm_get_stats(c, &s1);
    check_true("world 1 statistics count the operations and bytes",
               s1.ops - s0.ops == 4 && s1.bytes - s0.bytes == 4 * n * 4);
    DS(dsc_comm_barrier(c, NULL));
    DS(dsc_comm_all_reduce(c, NULL, NULL, 0, DSC_DT_F32, DSC_OP_SUM, NULL)); // nothing to do
    void *p = dev_alloc<float>(4);
    bool e1 = dsc_comm_send(c, p, 4, DSC_DT_F32, 0, NULL) == DSC_ERR_INVALID_ARG;
    bool e2 = dsc_comm_broadcast(c, p, 4, DSC_DT_F32, 1, NULL) == DSC_ERR_INVALID_ARG;
    check_true("world 1 a message to itself and a root outside the world are refused", e1 && e2);
    check_true("world 1 the communicator is healthy after refused calls",
               !dsc_comm_is_broken(c, NULL, NULL));
    CK(cudaFree(p));
}

static dsc_comm *make_one(double timeout) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.backend = "nccl";
    o.rank = 0;
    o.world_size = 1;
    o.timeout_s = timeout;
    dsc_comm *c = NULL;
    DS(dsc_comm_create(&c, &o));
    return c;
}

static void one_gpu(void) {
    dsc_comm *c = make_one(30);
    check_true("world 1 create: backend nccl, rank 0 of 1",
               !strcmp(dsc_comm_backend(c), "nccl") && dsc_comm_rank(c) == 0 &&
                   dsc_comm_size(c) == 1);
    size_t sizes[] = {1, 7, small_mode() ? (size_t)4099 : (size_t)1000003};
    for (dsc_dtype dt : DTS)
        for (size_t n : sizes) single_dtype(c, dt, n);
    single_async(c);
    dsc_comm_destroy(c);
}

// ---- the staging kernels against dsc/half.h ----

static bool same_bits_or_nan(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}

static void conversions(void) {
    std::vector<float> v = randn(100003, 3.0);
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.0f, 65520.0f,
                              -65536.0f, 6.0e-8f, 2.9e-8f, 3.0e-8f, 1.0e-45f, 5.96e-8f,
                              3.3895314e38f, 3.4028235e38f, 1.0f + 0x1p-8f, 1.0f + 0x1p-9f};
    for (size_t k = 0; k < sizeof specials / sizeof specials[0]; k++) v[k] = specials[k];
    size_t n = v.size();
    float *dx = dev_upload(v), *dy = dev_alloc<float>(n);
    uint16_t *d16 = dev_alloc<uint16_t>(n);
    for (int fp16 = 0; fp16 < 2; fp16++)
        for (float s : {1.0f, 0.5f, 3.0f}) {
            DS(dsc__cuda_to16(d16, dx, n, s, fp16, NULL));
            SYNC();
            std::vector<uint16_t> got = dev_download(d16, n);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                float t = s == 1.0f ? v[i] : v[i] * s;
                uint16_t want = fp16 ? dsc_fp32_to_fp16(t) : dsc_fp32_to_bf16(t);
                float wf = fp16 ? dsc_fp16_to_fp32(want) : dsc_bf16_to_fp32(want);
                float gf = fp16 ? dsc_fp16_to_fp32(got[i]) : dsc_bf16_to_fp32(got[i]);
                if (got[i] != want && !(isnan(wf) && isnan(gf))) bad++;
            }
            char name[96];
            snprintf(name, sizeof name, "to16 %s scale %g bitwise (%zu elements)",
                     fp16 ? "fp16" : "bf16", s, n);
            check_true(name, bad == 0);
            DS(dsc__cuda_from16(dy, d16, n, 1.0f / s, fp16, NULL));
            SYNC();
            std::vector<float> back = dev_download(dy, n);
            bad = 0;
            for (size_t i = 0; i < n; i++) {
                float f = fp16 ? dsc_fp16_to_fp32(got[i]) : dsc_bf16_to_fp32(got[i]);
                if (!same_bits_or_nan(back[i], s == 1.0f ? f : f * (1.0f / s))) bad++;
            }
            snprintf(name, sizeof name, "from16 %s scale %g bitwise", fp16 ? "fp16" : "bf16",
                     1.0f / s);
            check_true(name, bad == 0);
        }
    CK(cudaMemcpy(dy, dx, n * 4, cudaMemcpyDeviceToDevice));
    DS(dsc__cuda_scale(dy, n, 0.125f, NULL));
    SYNC();
    std::vector<float> sc = dev_download(dy, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !same_bits_or_nan(sc[i], v[i] * 0.125f);
    check_true("scale by 0.125 bitwise", bad == 0);
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(d16));
}

// ---- the deadline, an abort from another thread, shrink ----

static bool has(const char *msg, const char *needle) { return strstr(msg, needle) != NULL; }

// A second thread that notes when the communicator turns broken (the moment of detection; the
// caller itself returns only once ncclCommAbort does, and NCCL's abort waits for the stream the
// test hook holds with a host function, which it cannot interrupt, unlike a kernel stuck on a
// peer).
typedef struct watch {
    dsc_comm *c;
    double t0, at; // at: seconds from t0 to broken, -1 while not
    volatile int stop;
} watch;

static void *watch_broken(void *arg) {
    watch *w = (watch *)arg;
    struct timespec ts = {0, 1000 * 1000};
    while (!w->stop) {
        if (dsc_comm_is_broken(w->c, NULL, NULL)) {
            w->at = dsc_now() - w->t0;
            return NULL;
        }
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void deadline(void) {
    setenv("DSC_NCCL_INJECT_DELAY", "2:4", 1); // the second operation holds its stream 4 s
    dsc_comm *c = make_one(1.0);
    unsetenv("DSC_NCCL_INJECT_DELAY");
    float *p = dev_alloc<float>(1024);
    DS(dsc_comm_all_reduce(c, p, p, 1024, DSC_DT_F32, DSC_OP_SUM, NULL));
    watch w = {c, dsc_now(), -1, 0};
    pthread_t th;
    pthread_create(&th, NULL, watch_broken, &w);
    double t0 = w.t0;
    dsc_status st = dsc_comm_all_reduce(c, p, p, 1024, DSC_DT_F32, DSC_OP_SUM, NULL);
    double dt = dsc_now() - t0;
    w.stop = 1;
    pthread_join(th, NULL);
    std::string msg = dsc_last_error();
    printf("  deadline: broken after %.3f s, %s returned after %.3f s: %s\n", w.at,
           dsc_status_name(st), dt, msg.c_str());
    check_true("deadline: detected after about comm_timeout_s (broken within 0.95-2 s of a 1 s "
               "limit)", w.at >= 0.95 && w.at < 2.0);
    check_true("deadline: DSC_ERR_TIMEOUT, returned once the held stream (4 s) let NCCL's abort "
               "finish (< 5.5 s)", st == DSC_ERR_TIMEOUT && dt >= 0.95 && dt < 5.5);
    check_true("deadline: the message names the operation, the rank and the fix",
               has(msg.c_str(), "rank 0 of 1 (cuda:") &&
                   has(msg.c_str(), "all_reduce of 1024 f32: not complete after") &&
                   has(msg.c_str(), "comm_timeout_s 1.0") && has(msg.c_str(), "aborted"));
    dsc_status bst = DSC_OK;
    check_true("deadline: the communicator is broken with DSC_ERR_TIMEOUT",
               dsc_comm_is_broken(c, &bst, NULL) && bst == DSC_ERR_TIMEOUT);
    t0 = dsc_now();
    st = dsc_comm_all_gather(c, p, p, 1024, DSC_DT_F32, NULL);
    check_true("deadline: a later operation fails at once, naming the first failure",
               st == DSC_ERR_TIMEOUT && dsc_now() - t0 < 0.1 &&
                   has(dsc_last_error(), "broken") && has(dsc_last_error(), "not complete"));
    t0 = dsc_now();
    dsc_comm_destroy(c);
    printf("  deadline: destroy took %.3f s\n", dsc_now() - t0);
    check_true("deadline: destroy returns (after the held stream, < 7 s)", dsc_now() - t0 < 7);
    CK(cudaFree(p));
}

static void *abort_later(void *arg) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    dsc_comm_abort((dsc_comm *)arg, DSC_ERR_PEER, "test: rank 3 is gone");
    return NULL;
}

static void abort_from_thread(void) {
    setenv("DSC_NCCL_INJECT_DELAY", "1:2", 1); // the first operation holds its stream 2 s
    dsc_comm *c = make_one(30);
    unsetenv("DSC_NCCL_INJECT_DELAY");
    float *p = dev_alloc<float>(256);
    dsc_comm_req *r = NULL;
    double t0 = dsc_now();
    DS(dsc_comm_all_reduce(c, p, p, 256, DSC_DT_F32, DSC_OP_SUM, &r));
    watch w = {c, t0, -1, 0};
    pthread_t th, tw;
    pthread_create(&tw, NULL, watch_broken, &w);
    pthread_create(&th, NULL, abort_later, c);
    dsc_status st = dsc_comm_wait(r);
    double dt = dsc_now() - t0;
    pthread_join(th, NULL);
    w.stop = 1;
    pthread_join(tw, NULL);
    printf("  abort: broken after %.3f s, %s after %.3f s: %s\n", w.at, dsc_status_name(st), dt,
           dsc_last_error());
    check_true("abort from another thread: the communicator is broken at once (< 0.5 s)",
               w.at >= 0 && w.at < 0.5);
    check_true("abort from another thread ends the held operation with the abort's reason once "
               "NCCL's abort returns (the stream is held 2 s; < 3.5 s)",
               st == DSC_ERR_PEER && dt < 3.5 && has(dsc_last_error(), "rank 3 is gone"));
    check_true("abort: a later operation fails at once",
               dsc_comm_barrier(c, NULL) == DSC_ERR_PEER);
    dsc_comm_destroy(c);
    CK(cudaFree(p));
}

static void shrink_one(void) {
    dsc_comm *c = make_one(30), *s = NULL;
    dsc_status st = dsc_comm_shrink(c, NULL, 0, &s);
    if (st != DSC_OK && (has(dsc_last_error(), "invalid argument") ||
                         has(dsc_last_error(), "invalid usage"))) {
        printf("SKIP shrink at world 1: NCCL refuses an empty exclusion list (%s)\n",
               dsc_last_error());
        dsc_comm_destroy(c);
        return;
    }
    if (st != DSC_OK) printf("  shrink: %s\n", dsc_last_error());
    bool ok = st == DSC_OK && dsc_comm_size(s) == 1 && dsc_comm_rank(s) == 0;
    if (ok) {
        std::vector<uint8_t> x = randoms(DSC_DT_BF16, 999);
        void *a = upload(x), *b = dev_alloc<uint8_t>(x.size());
        ok = dsc_comm_all_reduce(s, a, b, 999, DSC_DT_BF16, DSC_OP_SUM, NULL) == DSC_OK &&
             download(b, x.size()) == x;
        ok = ok && dsc_comm_all_reduce(c, a, b, 999, DSC_DT_BF16, DSC_OP_SUM, NULL) == DSC_OK;
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    check_true("shrink at world 1 (nobody excluded): both communicators work", ok);
    dsc_comm_destroy(s);
    dsc_comm_destroy(c);
}

// ---- waiting for another stream: dsc__nccl_after_event ----

__global__ void fill_kernel(float *x, size_t n, float base) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = base + (float)(i % 1000);
}

// One thread busy for ns nanoseconds of the GPU's global timer: a stream held by device work, as
// a backward holds it (a host function would also hold CUDA's host-function thread, which other
// libraries' host functions queue behind).
__global__ void spin_kernel(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// On `user`: hold the stream *hold_s seconds (a spinning kernel), then fill x (n) with base + i %
// 1000, then record ev. Returns at once.
static void held_fill(cudaStream_t user, const double *hold_s, float *x, size_t n, float base,
                      cudaEvent_t ev) {
    spin_kernel<<<1, 1, 0, user>>>((long long)(*hold_s * 1e9));
    CK(cudaGetLastError());
    fill_kernel<<<64, 256, 0, user>>>(x, n, base);
    CK(cudaGetLastError());
    CK(cudaEventRecord(ev, user));
}

static bool filled(const float *x, size_t n, float base) {
    std::vector<float> h = dev_download(x, n);
    for (size_t i = 0; i < n; i++)
        if (h[i] != base + (float)(i % 1000)) return false;
    return true;
}

// The collective sees what the user stream wrote before the event; nobody waits on the host.
// dsc__nccl_record_event: a second stream (reader) waits for the held collective on the device
// and copies its output; had it not waited, it would have copied the poisoned output.
static void after_event_order(void) {
    dsc_comm *c = make_one(30);
    const size_t n = 1 << 20;
    static const double hold = 1.0;
    float *x = dev_alloc<float>(n), *out = dev_alloc<float>(n), *copy = dev_alloc<float>(n);
    DS(dsc_comm_all_reduce(c, x, out, n, DSC_DT_F32, DSC_OP_SUM, NULL)); // NCCL's first-use setup
    poison(x, n * 4);
    poison(out, n * 4);
    poison(copy, n * 4);
    SYNC();
    cudaStream_t user, reader;
    cudaEvent_t ev, done;
    CK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    double t0 = dsc_now();
    held_fill(user, &hold, x, n, 7.0f, ev);
    dsc_comm_req *r = NULL;
    DS(dsc__nccl_after_event(c, ev));
    DS(dsc_comm_all_reduce(c, x, out, n, DSC_DT_F32, DSC_OP_SUM, &r));
    DS(dsc__nccl_record_event(c, done));
    CK(cudaStreamWaitEvent(reader, done, 0));
    CK(cudaMemcpyAsync(copy, out, n * 4, cudaMemcpyDeviceToDevice, reader));
    double issued = dsc_now() - t0;
    bool early = false;
    DS(dsc_comm_test(r, &early));
    if (!early) DS(dsc_comm_wait(r));
    CK(cudaStreamSynchronize(reader));
    double dt = dsc_now() - t0;
    printf("  after_event: issued after %.3f s, done after %.3f s (user stream held %.1f s)\n",
           issued, dt, hold);
    check_true("after_event: the host did not wait for the user stream (issued < 0.5 s)",
               issued < 0.5);
    check_true("after_event: the collective waited for the event (not done while held, done "
               "after the hold)", !early && dt >= hold * 0.9);
    check_true("after_event: the result is the data the user stream wrote before the event",
               filled(out, n, 7.0f));
    check_true("record_event: the reader stream waited for the collective (its copy is the "
               "result)", filled(copy, n, 7.0f));
    // with no wait in between, the next operation runs at once and the event is not waited again
    DS(dsc_comm_all_reduce(c, out, x, n, DSC_DT_F32, DSC_OP_SUM, NULL));
    check_true("after_event: later operations keep working", filled(x, n, 7.0f));
    bool e1 = dsc__nccl_after_event(c, NULL) == DSC_ERR_INVALID_ARG;
    bool e2 = dsc__nccl_after_event(NULL, ev) == DSC_ERR_INVALID_ARG;
    check_true("after_event: NULL event or communicator refused", e1 && e2);
    e1 = dsc__nccl_record_event(c, NULL) == DSC_ERR_INVALID_ARG;
    e2 = dsc__nccl_record_event(NULL, done) == DSC_ERR_INVALID_ARG;
    check_true("record_event: NULL event or communicator refused", e1 && e2);
    dsc_comm_destroy(c);
    CK(cudaEventDestroy(ev));
    CK(cudaEventDestroy(done));
    CK(cudaStreamDestroy(user));
    CK(cudaStreamDestroy(reader));
    CK(cudaFree(x));
    CK(cudaFree(out));
    CK(cudaFree(copy));
}

// A wait longer than comm_timeout_s on the user stream is not communication: no timeout.
static void after_event_untimed(void) {
    dsc_comm *c = make_one(1.0);
    const size_t n = 4096;
    static const double hold = 2.5;
    float *x = dev_alloc<float>(n);
    cudaStream_t user;
    cudaEvent_t ev;
    CK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    SYNC();
    double t0 = dsc_now();
    held_fill(user, &hold, x, n, 3.0f, ev);
    dsc_status st = dsc__nccl_after_event(c, ev);
    if (st == DSC_OK) st = dsc_comm_all_reduce(c, x, x, n, DSC_DT_F32, DSC_OP_SUM, NULL);
    double dt = dsc_now() - t0;
    printf("  after_event: a %.1f s wait with comm_timeout_s 1: %s after %.3f s%s%s\n", hold,
           dsc_status_name(st), dt, st == DSC_OK ? "" : ": ", st == DSC_OK ? "" : dsc_last_error());
    check_true("after_event: a wait for the user stream longer than comm_timeout_s is no timeout",
               st == DSC_OK && dt >= hold * 0.9 && !dsc_comm_is_broken(c, NULL, NULL) &&
                   filled(x, n, 3.0f));
    dsc_comm_destroy(c);
    CK(cudaEventDestroy(ev));
    CK(cudaStreamDestroy(user));
    CK(cudaFree(x));
}

// The operation behind the wait is late (the test hook holds its stream 3 s after NCCL's work):
// the deadline counts from the wait's end (1 s hold + 1 s limit), not from the issue (1 s).
static void after_event_late(void) {
    setenv("DSC_NCCL_INJECT_DELAY", "1:3", 1);
    dsc_comm *c = make_one(1.0);
    unsetenv("DSC_NCCL_INJECT_DELAY");
    const size_t n = 4096;
    static const double hold = 1.0;
    float *x = dev_alloc<float>(n);
    cudaStream_t user;
    cudaEvent_t ev;
    CK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    SYNC();
    watch w = {c, dsc_now(), -1, 0};
    held_fill(user, &hold, x, n, 1.0f, ev);
    pthread_t th;
    pthread_create(&th, NULL, watch_broken, &w);
    dsc_status st = dsc__nccl_after_event(c, ev);
    if (st == DSC_OK) st = dsc_comm_all_reduce(c, x, x, n, DSC_DT_F32, DSC_OP_SUM, NULL);
    w.stop = 1;
    pthread_join(th, NULL);
    printf("  after_event: a late operation behind a %.1f s wait: broken after %.3f s, %s\n",
           hold, w.at, dsc_status_name(st));
    check_true("after_event: a late operation times out comm_timeout_s after its wait passed "
               "(broken within 1.8-3 s: hold 1 s + limit 1 s)",
               st == DSC_ERR_TIMEOUT && w.at >= 1.8 && w.at < 3.0);
    dsc_comm_destroy(c);
    CK(cudaStreamSynchronize(user));
    CK(cudaEventDestroy(ev));
    CK(cudaStreamDestroy(user));
    CK(cudaFree(x));
}

// ---- several GPUs: one thread per rank ----

typedef struct rank_ctx {
    int rank, world, port;
    pthread_barrier_t *bar;
    int fails, passes;
    std::string log;
} rank_ctx;

static void rcheck(rank_ctx *x, const std::string &name, bool ok) {
    (ok ? x->passes : x->fails)++;
    if (!ok || x->rank == 0) x->log += (ok ? "PASS " : "FAIL ") + name + "\n";
}

// Small integers: exact in f32, f16 and bf16, and so are their sums over up to 8 ranks.
static float val(size_t i, int r) { return (float)((i * 3 + (size_t)r) % 5); }

static std::vector<uint8_t> ints(dsc_dtype dt, size_t n, int r, size_t base = 0) {
    std::vector<uint8_t> b(n * dsc_dtype_size(dt));
    for (size_t i = 0; i < n; i++) encode(dt, b, i, val(base + i, r));
    return b;
}

static bool matches(dsc_dtype dt, const std::vector<uint8_t> &b, size_t n,
                    float (*want)(size_t, void *), void *u) {
    for (size_t i = 0; i < n; i++)
        if (decode(dt, b, i) != want(i, u)) return false;
    return true;
}

typedef struct want_ctx {
    int world, rank;
    size_t n;
} want_ctx;

static float want_sum(size_t i, void *u) {
    want_ctx *w = (want_ctx *)u;
    float s = 0;
    for (int r = 0; r < w->world; r++) s += val(i, r);
    return s;
}
static float want_max(size_t i, void *u) {
    want_ctx *w = (want_ctx *)u;
    float s = 0;
    for (int r = 0; r < w->world; r++) s = fmaxf(s, val(i, r));
    return s;
}
static float want_rs(size_t i, void *u) { // this rank's block of the (world, n) inputs, summed
    want_ctx *w = (want_ctx *)u;
    float s = 0;
    for (int r = 0; r < w->world; r++) s += val((size_t)w->rank * w->n + i, r);
    return s;
}
static float want_ag(size_t i, void *u) { // block q of the (world, n) result is rank q's values
    size_t n = ((want_ctx *)u)->n;
    return val(i % n, (int)(i / n));
}
static float want_bc(size_t i, void *u) { return val(i, ((want_ctx *)u)->world - 1); }

static void rank_collectives(rank_ctx *x, dsc_comm *c, dsc_dtype dt, size_t n) {
    int W = x->world, R = x->rank;
    size_t es = dsc_dtype_size(dt);
    want_ctx w = {W, R, n};
    char tag[64];
    snprintf(tag, sizeof tag, "world %d %s n=%zu", W, dsc_dtype_name(dt), n);
    std::string t = tag;
    std::vector<uint8_t> mine = ints(dt, n, R), all = ints(dt, n * W, R);
    void *a = upload(mine), *big = upload(all), *out = dev_alloc<uint8_t>(n * es * W);
    poison(out, n * es);
    rcheck(x, t + " all_reduce sum",
           dsc_comm_all_reduce(c, a, out, n, dt, DSC_OP_SUM, NULL) == DSC_OK &&
               matches(dt, download(out, n * es), n, want_sum, &w));
    rcheck(x, t + " all_reduce max",
           dsc_comm_all_reduce(c, a, out, n, dt, DSC_OP_MAX, NULL) == DSC_OK &&
               matches(dt, download(out, n * es), n, want_max, &w));
    poison(out, n * es);
    rcheck(x, t + " reduce_scatter",
           dsc_comm_reduce_scatter(c, big, out, n, dt, DSC_OP_SUM, NULL) == DSC_OK &&
               matches(dt, download(out, n * es), n, want_rs, &w));
    poison(out, n * es * W);
    rcheck(x, t + " all_gather",
           dsc_comm_all_gather(c, a, out, n, dt, NULL) == DSC_OK &&
               matches(dt, download(out, n * es * W), n * W, want_ag, &w));
    void *b = upload(mine);
    rcheck(x, t + " broadcast from the last rank",
           dsc_comm_broadcast(c, b, n, dt, W - 1, NULL) == DSC_OK &&
               matches(dt, download(b, n * es), n, want_bc, &w));
    int root = 1 % W;
    poison(out, n * es);
    dsc_status st = dsc_comm_reduce(c, a, R == root ? out : NULL, n, dt, DSC_OP_SUM, root, NULL);
    rcheck(x, t + " reduce to rank 1",
           st == DSC_OK && (R != root || matches(dt, download(out, n * es), n, want_sum, &w)));
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(big));
    CK(cudaFree(out));
}

// Send to the next rank, receive from the previous one, both asynchronous, sends first: the
// backend issues them together at the first wait.
static void rank_ring(rank_ctx *x, dsc_comm *c) {
    int W = x->world, R = x->rank, next = (R + 1) % W, prev = (R + W - 1) % W;
    const size_t n = 100000;
    std::vector<uint8_t> mine = ints(DSC_DT_F32, n, R);
    void *s = upload(mine), *r = dev_alloc<uint8_t>(n * 4);
    dsc_comm_req *rs = NULL, *rr = NULL;
    bool ok = dsc_comm_send(c, s, n, DSC_DT_F32, next, &rs) == DSC_OK &&
              dsc_comm_recv(c, r, n, DSC_DT_F32, prev, &rr) == DSC_OK;
    ok = ok && dsc_comm_wait(rs) == DSC_OK && dsc_comm_wait(rr) == DSC_OK;
    ok = ok && download(r, n * 4) == ints(DSC_DT_F32, n, prev);
    rcheck(x, "send-then-receive ring of " + std::to_string(W), ok);
    CK(cudaFree(s));
    CK(cudaFree(r));
}

// The survivors drop the last rank; their new communicator sums only their values.
static void rank_shrink(rank_ctx *x, dsc_comm *c) {
    int W = x->world, R = x->rank, last = W - 1;
    pthread_barrier_wait(x->bar);
    if (R != last) {
        dsc_comm *s = NULL;
        dsc_status st = dsc_comm_shrink(c, &last, 1, &s);
        bool ok = st == DSC_OK && dsc_comm_size(s) == W - 1 && dsc_comm_rank(s) == R;
        if (st != DSC_OK) x->log += std::string("  shrink: ") + dsc_last_error() + "\n";
        if (ok) {
            float v = (float)(R + 1), *d = dev_upload(std::vector<float>{v});
            ok = dsc_comm_all_reduce(s, d, d, 1, DSC_DT_F32, DSC_OP_SUM, NULL) == DSC_OK &&
                 dev_download(d, 1)[0] == (float)(W - 1) * W / 2;
            CK(cudaFree(d));
        }
        rcheck(x, "shrink without the last rank: the survivors' all_reduce", ok);
        dsc_comm_destroy(s);
    }
    pthread_barrier_wait(x->bar);
}

static void *rank_main(void *arg) {
    rank_ctx *x = (rank_ctx *)arg;
    CK(cudaSetDevice(x->rank));
    dsc_comm_opts o = dsc_comm_opts_default();
    o.backend = "nccl";
    o.rank = x->rank;
    o.world_size = x->world;
    o.master_addr = "127.0.0.1";
    o.master_port = x->port;
    o.timeout_s = 120;
    o.group_tag = "test-gpus";
    o.device = x->rank;
    dsc_comm *c = NULL;
    if (dsc_comm_create(&c, &o) != DSC_OK) {
        rcheck(x, std::string("create: ") + dsc_last_error(), false);
        return NULL;
    }
    size_t sizes[] = {7, small_mode() ? (size_t)4099 : ((size_t)1 << 20) + 3};
    for (dsc_dtype dt : DTS)
        for (size_t n : sizes) rank_collectives(x, c, dt, n);
    rcheck(x, "barrier", dsc_comm_barrier(c, NULL) == DSC_OK);
    rank_ring(x, c);
    rank_shrink(x, c);
    dsc_comm_destroy(c);
    return NULL;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        fprintf(stderr, "FATAL: no free port\n");
        exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

static void several_gpus(void) {
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("SKIP several GPUs: %d visible (the multi-GPU collectives need 2 or more)\n", n);
        return;
    }
    int W = n < 8 ? n : 8, port = free_port();
    printf("several GPUs: world %d, one thread per GPU, port %d\n", W, port);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)W);
    std::vector<rank_ctx> ctx(W);
    std::vector<pthread_t> th(W);
    for (int r = 0; r < W; r++) {
        ctx[r].rank = r;
        ctx[r].world = W;
        ctx[r].port = port;
        ctx[r].bar = &bar;
        ctx[r].fails = ctx[r].passes = 0;
        pthread_create(&th[r], NULL, rank_main, &ctx[r]);
    }
    int fails = 0, passes = 0;
    for (int r = 0; r < W; r++) {
        pthread_join(th[r], NULL);
        fputs(ctx[r].log.c_str(), stdout);
        fails += ctx[r].fails;
        passes += ctx[r].passes;
    }
    pthread_barrier_destroy(&bar);
    char name[96];
    snprintf(name, sizeof name, "world %d: %d checks over all ranks passed", W, passes);
    check_true(name, fails == 0 && passes > 0);
}

int main(void) {
    require_device("test_cuda_nccl");
    CK(cudaSetDevice(0));
    one_gpu();
    conversions();
    deadline();
    abort_from_thread();
    shrink_one();
    after_event_order();
    after_event_untimed();
    after_event_late();
    several_gpus();
    return finish("test_cuda_nccl");
}
