// comm/store.c - rendezvous key-value store: a poll() server thread and a deadline-bound client.
#define _GNU_SOURCE // pipe2, accept flags
#include "comm/store.h"

#include <arpa/inet.h>   // htonl, ntohl
#include <errno.h>       // errno
#include <fcntl.h>       // fcntl, O_NONBLOCK
#include <inttypes.h>    // PRId64
#include <netdb.h>       // getaddrinfo
#include <netinet/in.h>  // sockaddr_in, INADDR_*
#include <netinet/tcp.h> // TCP_NODELAY
#include <poll.h>        // poll
#include <pthread.h>     // pthread_*
#include <stdatomic.h>   // _Atomic
#include <stdio.h>       // snprintf
#include <stdlib.h>      // malloc, free, strtoll
#include <string.h>      // memcpy, strcmp, strerror
#include <sys/socket.h>  // socket, bind, ...
#include <time.h>        // nanosleep
#include <unistd.h>      // close, pipe, read, write

#include "base/log.h"    // DSC_DEBUG
#include "base/status.h" // dsc__fail
#include "base/time.h"   // dsc_now

enum { CMD_SET = 1, CMD_GET, CMD_ADD, CMD_CHECK, CMD_DEL, CMD_WAIT };
enum { RES_OK = 0, RES_ABSENT = 1, RES_BAD = 2 };
#define REQ_HDR 9 // u8 cmd, u32 key length, u32 value length
#define RES_HDR 5 // u8 result, u32 length

// ---- byte helpers ----

static void put_u32(uint8_t *p, uint32_t v) {
    v = htonl(v);
    memcpy(p, &v, 4);
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return ntohl(v);
}

static void put_i64(uint8_t *p, int64_t v) {
    put_u32(p, (uint32_t)((uint64_t)v >> 32));
    put_u32(p + 4, (uint32_t)(uint64_t)v);
}

static int64_t get_i64(const uint8_t *p) {
    return (int64_t)(((uint64_t)get_u32(p) << 32) | get_u32(p + 4));
}

// Append n bytes to a growable buffer; false when out of memory.
static bool buf_append(uint8_t **buf, size_t *len, size_t *cap, const void *src, size_t n) {
    if (!n) return true;
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n) c *= 2;
        uint8_t *b = realloc(*buf, c);
        if (!b) return false;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    return true;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

// ---- server ----

typedef struct kv {
    char *key;
    uint8_t *val;
    size_t len;
} kv;

typedef struct conn {
    int fd;
    uint8_t *in, *out;
    size_t in_len, in_cap, out_len, out_cap, out_off;
    bool waiting; // a GET/WAIT on an absent key is parked until a SET/ADD provides it
    uint8_t wcmd;
    char *wkey;
} conn;

typedef struct server {
    int lfd, wake[2];
    pthread_t thread;
    _Atomic int stop;
    kv *kvs;
    size_t nkv, kv_cap;
    conn *conns;
    size_t nconn, conn_cap;
} server;

static kv *kv_find(server *sv, const char *key) {
    for (size_t i = 0; i < sv->nkv; i++)
        if (!strcmp(sv->kvs[i].key, key)) return &sv->kvs[i];
    return NULL;
}

// Replace or insert key (value copied). False when out of memory.
static bool kv_set(server *sv, const char *key, const uint8_t *val, size_t len) {
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return false;
    if (len) memcpy(copy, val, len);
    kv *e = kv_find(sv, key);
    if (!e) {
        if (sv->nkv == sv->kv_cap) {
            size_t c = sv->kv_cap ? sv->kv_cap * 2 : 64;
            kv *k = realloc(sv->kvs, c * sizeof *k);
            if (!k) return free(copy), false;
            sv->kvs = k;
            sv->kv_cap = c;
        }
        char *kc = strdup(key);
        if (!kc) return free(copy), false;
        e = &sv->kvs[sv->nkv++];
        e->key = kc;
        e->val = NULL;
    }
    free(e->val);
    e->val = copy;
    e->len = len;
    return true;
}

static bool kv_del(server *sv, const char *key) {
    kv *e = kv_find(sv, key);
    if (!e) return false;
    free(e->key);
    free(e->val);
    *e = sv->kvs[--sv->nkv];
    return true;
}

static void reply(conn *cn, uint8_t res, const void *payload, size_t len) {
    uint8_t hdr[RES_HDR] = {res};
    put_u32(hdr + 1, (uint32_t)len);
    if (!buf_append(&cn->out, &cn->out_len, &cn->out_cap, hdr, RES_HDR) ||
        !buf_append(&cn->out, &cn->out_len, &cn->out_cap, payload, len)) {
        close(cn->fd); // out of memory: drop the client, it sees a closed connection
        cn->fd = -1;
    }
}

static void handle_add(server *sv, conn *cn, const char *key, const uint8_t *val, uint32_t vlen) {
    if (vlen != 8) return reply(cn, RES_BAD, NULL, 0);
    kv *e = kv_find(sv, key);
    int64_t cur = 0;
    if (e) {
        char tmp[32] = "";
        char *end = NULL;
        memcpy(tmp, e->val, e->len < 31 ? e->len : 31);
        cur = strtoll(tmp, &end, 10);
        if (end == tmp) return reply(cn, RES_BAD, NULL, 0); // not a counter
    }
    int64_t next = cur + get_i64(val);
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRId64, next);
    if (!kv_set(sv, key, (const uint8_t *)text, (size_t)n)) return reply(cn, RES_BAD, NULL, 0);
    uint8_t out[8];
    put_i64(out, next);
    reply(cn, RES_OK, out, 8);
}

// Answer a GET/WAIT whose key is present; false when still absent.
static bool answer_get(server *sv, conn *cn, uint8_t cmd, const char *key) {
    kv *e = kv_find(sv, key);
    if (!e) return false;
    if (cmd == CMD_GET) reply(cn, RES_OK, e->val, e->len);
    else reply(cn, RES_OK, NULL, 0);
    return true;
}

static void handle(server *sv, conn *cn, uint8_t cmd, const char *key, const uint8_t *val,
                   uint32_t vlen) {
    switch (cmd) {
    case CMD_SET:
        reply(cn, kv_set(sv, key, val, vlen) ? RES_OK : RES_BAD, NULL, 0);
        break;
    case CMD_ADD: handle_add(sv, cn, key, val, vlen); break;
    case CMD_CHECK: reply(cn, kv_find(sv, key) ? RES_OK : RES_ABSENT, NULL, 0); break;
    case CMD_DEL: reply(cn, kv_del(sv, key) ? RES_OK : RES_ABSENT, NULL, 0); break;
    case CMD_GET:
    case CMD_WAIT:
        if (answer_get(sv, cn, cmd, key)) break;
        cn->wkey = strdup(key);
        if (!cn->wkey) return reply(cn, RES_BAD, NULL, 0);
        cn->waiting = true;
        cn->wcmd = cmd;
        break;
    default: reply(cn, RES_BAD, NULL, 0);
    }
}

// Execute every complete request in the connection's input, unless it is parked.
static void parse(server *sv, conn *cn) {
    size_t off = 0;
    while (cn->fd >= 0 && !cn->waiting && cn->in_len - off >= REQ_HDR) {
        const uint8_t *p = cn->in + off;
        uint32_t klen = get_u32(p + 1), vlen = get_u32(p + 5);
        if (klen == 0 || klen > DSC_STORE_KEY_MAX || vlen > DSC_STORE_VALUE_MAX) {
            close(cn->fd); // not our protocol: drop the client
            cn->fd = -1;
            break;
        }
        if (cn->in_len - off < REQ_HDR + (size_t)klen + vlen) break;
        char key[DSC_STORE_KEY_MAX + 1];
        memcpy(key, p + REQ_HDR, klen);
        key[klen] = '\0';
        handle(sv, cn, p[0], key, p + REQ_HDR + klen, vlen);
        off += REQ_HDR + (size_t)klen + vlen;
    }
    memmove(cn->in, cn->in + off, cn->in_len - off);
    cn->in_len -= off;
}

// Answer parked requests whose key appeared; repeat while answering ran new requests.
static void resolve_waiters(server *sv) {
    bool again = true;
    while (again) {
        again = false;
        for (size_t i = 0; i < sv->nconn; i++) {
            conn *cn = &sv->conns[i];
            if (cn->fd < 0 || !cn->waiting || !answer_get(sv, cn, cn->wcmd, cn->wkey)) continue;
            cn->waiting = false;
            free(cn->wkey);
            cn->wkey = NULL;
            size_t before = cn->in_len;
            parse(sv, cn);
            again |= cn->in_len != before;
        }
    }
}

static void conn_free(conn *cn) {
    if (cn->fd >= 0) close(cn->fd);
    free(cn->in);
    free(cn->out);
    free(cn->wkey);
}

static void accept_client(server *sv) {
    int fd = accept(sv->lfd, NULL, NULL);
    if (fd < 0) return;
    if (sv->nconn == sv->conn_cap) {
        size_t c = sv->conn_cap ? sv->conn_cap * 2 : 16;
        conn *cs = realloc(sv->conns, c * sizeof *cs);
        if (!cs) return (void)close(fd);
        sv->conns = cs;
        sv->conn_cap = c;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sv->conns[sv->nconn++] = (conn){.fd = fd};
}

// Read what arrived and run it; a closed or failed connection gets fd = -1.
static void conn_read(server *sv, conn *cn) {
    uint8_t tmp[65536];
    for (;;) {
        ssize_t n = recv(cn->fd, tmp, sizeof tmp, 0);
        if (n > 0) {
            if (!buf_append(&cn->in, &cn->in_len, &cn->in_cap, tmp, (size_t)n)) n = 0;
            else continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        close(cn->fd);
        cn->fd = -1;
        return;
    }
    parse(sv, cn);
    resolve_waiters(sv); // a SET or ADD may have provided parked keys
}

static void conn_flush(conn *cn) {
    while (cn->fd >= 0 && cn->out_off < cn->out_len) {
        ssize_t n = send(cn->fd, cn->out + cn->out_off, cn->out_len - cn->out_off, MSG_NOSIGNAL);
        if (n > 0) cn->out_off += (size_t)n;
        else if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        else {
            close(cn->fd);
            cn->fd = -1;
        }
    }
    cn->out_off = cn->out_len = 0;
}

static void drop_closed(server *sv) {
    size_t j = 0;
    for (size_t i = 0; i < sv->nconn; i++) {
        if (sv->conns[i].fd < 0) conn_free(&sv->conns[i]);
        else sv->conns[j++] = sv->conns[i];
    }
    sv->nconn = j;
}

static void *server_main(void *arg) {
    server *sv = arg;
    struct pollfd *pfd = NULL;
    size_t pcap = 0;
    while (!atomic_load(&sv->stop)) {
        if (pcap < sv->nconn + 2) {
            struct pollfd *p = realloc(pfd, (sv->nconn + 2) * 2 * sizeof *p);
            if (!p) break;
            pfd = p;
            pcap = (sv->nconn + 2) * 2;
        }
        pfd[0] = (struct pollfd){.fd = sv->lfd, .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = sv->wake[0], .events = POLLIN};
        for (size_t i = 0; i < sv->nconn; i++) {
            conn *cn = &sv->conns[i];
            pfd[i + 2] = (struct pollfd){.fd = cn->fd,
                                         .events = POLLIN | (cn->out_len ? POLLOUT : 0)};
        }
        size_t n = sv->nconn; // accept below may grow conns; poll results cover the first n
        if (poll(pfd, n + 2, 1000) < 0 && errno != EINTR) break;
        for (size_t i = 0; i < n; i++) {
            if (pfd[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) conn_read(sv, &sv->conns[i]);
        }
        for (size_t i = 0; i < sv->nconn; i++) conn_flush(&sv->conns[i]);
        if (pfd[0].revents & POLLIN) accept_client(sv);
        drop_closed(sv);
    }
    free(pfd);
    return NULL;
}

// A loopback host gets a loopback-only listener; anything else listens on every interface.
static bool host_is_loopback(const char *host) {
    return !strcmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "::1");
}

static dsc_status server_listen(server *sv, const char *host, int *port) {
    sv->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sv->lfd < 0) return dsc__fail(DSC_ERR_SYSTEM, "store: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(sv->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port)};
    a.sin_addr.s_addr = htonl(host_is_loopback(host) ? INADDR_LOOPBACK : INADDR_ANY);
    if (bind(sv->lfd, (struct sockaddr *)&a, sizeof a) < 0)
        return dsc__fail(DSC_ERR_SYSTEM,
                         "store: cannot listen on port %d: %s; choose another MASTER_PORT", *port,
                         strerror(errno));
    if (listen(sv->lfd, 1024) < 0)
        return dsc__fail(DSC_ERR_SYSTEM, "store: listen: %s", strerror(errno));
    socklen_t alen = sizeof a;
    getsockname(sv->lfd, (struct sockaddr *)&a, &alen);
    *port = ntohs(a.sin_port);
    fcntl(sv->lfd, F_SETFL, fcntl(sv->lfd, F_GETFL) | O_NONBLOCK);
    return DSC_OK;
}

static void server_stop(server *sv) {
    if (!sv) return;
    if (sv->thread) {
        atomic_store(&sv->stop, 1);
        ssize_t w = write(sv->wake[1], "x", 1);
        (void)w;
        pthread_join(sv->thread, NULL);
    }
    for (size_t i = 0; i < sv->nconn; i++) conn_free(&sv->conns[i]);
    for (size_t i = 0; i < sv->nkv; i++) {
        free(sv->kvs[i].key);
        free(sv->kvs[i].val);
    }
    if (sv->lfd >= 0) close(sv->lfd);
    if (sv->wake[0] >= 0) close(sv->wake[0]);
    if (sv->wake[1] >= 0) close(sv->wake[1]);
    free(sv->conns);
    free(sv->kvs);
    free(sv);
}

static dsc_status server_start(server **out, const char *host, int *port) {
    server *sv = calloc(1, sizeof *sv);
    if (!sv) return dsc__fail(DSC_ERR_OOM, "store: out of memory");
    sv->lfd = sv->wake[0] = sv->wake[1] = -1;
    dsc_status st = server_listen(sv, host, port);
    if (st == DSC_OK && pipe2(sv->wake, O_CLOEXEC) < 0)
        st = dsc__fail(DSC_ERR_SYSTEM, "store: pipe: %s", strerror(errno));
    if (st == DSC_OK && pthread_create(&sv->thread, NULL, server_main, sv) != 0) {
        sv->thread = 0;
        st = dsc__fail(DSC_ERR_SYSTEM, "store: cannot start the server thread");
    }
    if (st != DSC_OK) {
        server_stop(sv);
        return st;
    }
    *out = sv;
    return DSC_OK;
}

// ---- client ----

struct dsc_store {
    char host[256];
    int port;
    double timeout_s;
    int fd; // -1: not connected (first call, or after a failure)
    pthread_mutex_t mu;
    server *srv;
};

static void disconnect(dsc_store *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

// One non-blocking connect to addr, bounded by the deadline; the socket or -1 with errno set.
static int connect_one(const struct addrinfo *ai, double deadline) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) goto fail;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    double left = deadline - dsc_now();
    if (poll(&p, 1, left > 0 ? (int)(left * 1000) + 1 : 0) <= 0) {
        errno = ETIMEDOUT;
        goto fail;
    }
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err) {
        errno = err;
        goto fail;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
fail:;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

// Connect, retrying (the server may not be up yet) until the deadline.
static dsc_status ensure_connected(dsc_store *s, double deadline) {
    if (s->fd >= 0) return DSC_OK;
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gai = getaddrinfo(s->host, port, &hints, &res);
    if (gai != 0)
        return dsc__fail(DSC_ERR_CONFIG, "store: cannot resolve host '%s': %s; check MASTER_ADDR",
                         s->host, gai_strerror(gai));
    int err = 0;
    double pause = 0.01;
    while (s->fd < 0) {
        for (struct addrinfo *ai = res; ai && s->fd < 0; ai = ai->ai_next) {
            s->fd = connect_one(ai, deadline);
            if (s->fd < 0) err = errno;
        }
        double left = deadline - dsc_now();
        if (s->fd >= 0 || left <= 0) break;
        sleep_s(pause < left ? pause : left); // then one last attempt at the deadline
        pause = pause < 0.2 ? pause * 2 : 0.2;
    }
    freeaddrinfo(res);
    if (s->fd >= 0) return DSC_OK;
    return dsc__fail(DSC_ERR_TIMEOUT,
                     "store %s:%d: no connection within %.1f s (%s); is rank 0 running, and are "
                     "MASTER_ADDR/MASTER_PORT right?",
                     s->host, s->port, s->timeout_s, strerror(err));
}

// Move all n bytes in the given direction before the deadline. 0 ok, 1 deadline, 2 peer closed.
static int xfer(int fd, void *buf, size_t n, bool out, double deadline) {
    uint8_t *p = buf;
    while (n) {
        struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        double left = deadline - dsc_now();
        if (left <= 0) return 1;
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return 1;
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (k <= 0) return 2;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static dsc_status rpc_fail(dsc_store *s, int why, const char *what, const char *key) {
    disconnect(s);
    if (why == 1)
        return dsc__fail(DSC_ERR_TIMEOUT, "store %s:%d: %s '%s' got no answer within %.1f s",
                         s->host, s->port, what, key, s->timeout_s);
    return dsc__fail(DSC_ERR_PEER,
                     "store %s:%d: the server closed the connection during %s '%s' (did the "
                     "process hosting it, usually rank 0, exit?)",
                     s->host, s->port, what, key);
}

// One request/response; *payload (malloc'd, NUL-terminated) only when wanted.
static dsc_status rpc(dsc_store *s, uint8_t cmd, const char *key, const void *val, size_t vlen,
                      double deadline, uint8_t *res, void **payload, size_t *plen) {
    static const char *names[] = {"", "set", "get", "add", "check", "delete", "wait"};
    size_t klen = strlen(key);
    if (klen == 0 || klen > DSC_STORE_KEY_MAX || vlen > DSC_STORE_VALUE_MAX)
        return dsc__fail(DSC_ERR_INVALID_ARG, "store %s: key '%.64s' or value too long",
                         names[cmd], key);
    DSC_TRY(ensure_connected(s, deadline));
    uint8_t hdr[REQ_HDR] = {cmd};
    put_u32(hdr + 1, (uint32_t)klen);
    put_u32(hdr + 5, (uint32_t)vlen);
    int why = xfer(s->fd, hdr, REQ_HDR, true, deadline);
    if (!why) why = xfer(s->fd, (void *)key, klen, true, deadline);
    if (!why && vlen) why = xfer(s->fd, (void *)val, vlen, true, deadline);
    uint8_t rh[RES_HDR];
    if (!why) why = xfer(s->fd, rh, RES_HDR, false, deadline);
    if (why) return rpc_fail(s, why, names[cmd], key);
    uint32_t n = get_u32(rh + 1);
    uint8_t *body = malloc((size_t)n + 1);
    if (!body) return disconnect(s), dsc__fail(DSC_ERR_OOM, "store: out of memory");
    why = xfer(s->fd, body, n, false, deadline);
    if (why) return free(body), rpc_fail(s, why, names[cmd], key);
    body[n] = '\0';
    *res = rh[0];
    if (rh[0] == RES_BAD) {
        free(body);
        return dsc__fail(DSC_ERR_INVALID_ARG, "store %s '%s': the server refused it "
                         "(an add on a key that is not a counter?)", names[cmd], key);
    }
    if (payload) {
        *payload = body;
        *plen = n;
    } else {
        free(body);
    }
    return DSC_OK;
}

// The client's lock around one rpc with the store's deadline.
static dsc_status call(dsc_store *s, uint8_t cmd, const char *key, const void *val, size_t vlen,
                       uint8_t *res, void **payload, size_t *plen) {
    if (!s || !key) return dsc__fail(DSC_ERR_INVALID_ARG, "store: NULL argument");
    pthread_mutex_lock(&s->mu);
    dsc_status st = rpc(s, cmd, key, val, vlen, dsc_now() + s->timeout_s, res, payload, plen);
    pthread_mutex_unlock(&s->mu);
    return st;
}

// ---- public API ----

dsc_status dsc_store_create(dsc_store **out, const char *host, int port, bool serve,
                            double timeout_s) {
    if (!out || !host || port < 0 || port > 65535 || (port == 0 && !serve))
        return dsc__fail(DSC_ERR_INVALID_ARG, "store: bad host or port %d", port);
    *out = NULL;
    dsc_store *s = calloc(1, sizeof *s);
    if (!s) return dsc__fail(DSC_ERR_OOM, "store: out of memory");
    snprintf(s->host, sizeof s->host, "%s", host);
    s->port = port;
    s->timeout_s = timeout_s > 0 ? timeout_s : 30;
    s->fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    dsc_status st = serve ? server_start(&s->srv, host, &s->port) : DSC_OK;
    if (st == DSC_OK) st = ensure_connected(s, dsc_now() + s->timeout_s);
    if (st != DSC_OK) {
        dsc_store_destroy(s);
        return st;
    }
    DSC_DEBUG("comm", "store %s:%d connected%s", s->host, s->port, serve ? " (hosting)" : "");
    *out = s;
    return DSC_OK;
}

void dsc_store_destroy(dsc_store *s) {
    if (!s) return;
    disconnect(s);
    server_stop(s->srv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int dsc_store_port(const dsc_store *s) { return s ? s->port : 0; }

void dsc_store_set_timeout(dsc_store *s, double timeout_s) {
    if (s && timeout_s > 0) s->timeout_s = timeout_s;
}

dsc_status dsc_store_set(dsc_store *s, const char *key, const void *value, size_t len) {
    if (len && !value) return dsc__fail(DSC_ERR_INVALID_ARG, "store set: NULL value");
    uint8_t res;
    return call(s, CMD_SET, key, value, len, &res, NULL, NULL);
}

dsc_status dsc_store_get(dsc_store *s, const char *key, void **value, size_t *len) {
    if (!value || !len) return dsc__fail(DSC_ERR_INVALID_ARG, "store get: NULL argument");
    uint8_t res;
    return call(s, CMD_GET, key, NULL, 0, &res, value, len);
}

dsc_status dsc_store_add(dsc_store *s, const char *key, int64_t delta, int64_t *result) {
    uint8_t d[8], res;
    put_i64(d, delta);
    void *body = NULL;
    size_t n = 0;
    DSC_TRY(call(s, CMD_ADD, key, d, 8, &res, &body, &n));
    if (n != 8) {
        free(body);
        return dsc__fail(DSC_ERR_CORRUPT, "store add '%s': malformed answer", key);
    }
    if (result) *result = get_i64(body);
    free(body);
    return DSC_OK;
}

dsc_status dsc_store_wait(dsc_store *s, const char *const *keys, size_t n) {
    if (!s || (n && !keys)) return dsc__fail(DSC_ERR_INVALID_ARG, "store wait: NULL argument");
    pthread_mutex_lock(&s->mu);
    double deadline = dsc_now() + s->timeout_s;
    dsc_status st = DSC_OK;
    uint8_t res;
    for (size_t i = 0; i < n && st == DSC_OK; i++)
        st = rpc(s, CMD_WAIT, keys[i], NULL, 0, deadline, &res, NULL, NULL);
    pthread_mutex_unlock(&s->mu);
    return st;
}

dsc_status dsc_store_check(dsc_store *s, const char *key, bool *present) {
    uint8_t res = RES_ABSENT;
    DSC_TRY(call(s, CMD_CHECK, key, NULL, 0, &res, NULL, NULL));
    if (present) *present = res == RES_OK;
    return DSC_OK;
}

dsc_status dsc_store_delete(dsc_store *s, const char *key, bool *existed) {
    uint8_t res = RES_ABSENT;
    DSC_TRY(call(s, CMD_DEL, key, NULL, 0, &res, NULL, NULL));
    if (existed) *existed = res == RES_OK;
    return DSC_OK;
}
