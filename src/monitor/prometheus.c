// monitor/prometheus.c - the Prometheus endpoint, served by libmicrohttpd on the loopback address.
//
// Only 127.0.0.1 is bound: the numbers are for a scraper on the same host (or a tunnel), never
// for the network at large.
#include <arpa/inet.h>   // htons, htonl, INADDR_LOOPBACK
#include <ctype.h>       // isalnum, tolower
#include <stdarg.h>      // va_list
#include <stdbool.h>     // bool
#include <microhttpd.h>  // MHD_*
#include <netinet/in.h>  // sockaddr_in
#include <pthread.h>     // pthread_*
#include <stdio.h>       // snprintf
#include <stdlib.h>      // malloc, realloc, free
#include <string.h>      // strcmp, strlen, strncmp, memcpy
#include <sys/socket.h>  // shutdown
#include <time.h>        // clock_gettime

#include "base/status.h"        // dsc__fail
#include "base/time.h"          // dsc_now
#include "monitor/prometheus.h" // dsc__prom_*
#include "monitor/sink.h"       // dsc__fmt_pyfloat

// One open connection, for the header deadline: when its current request began (the
// connection opened, or its previous answer went out) and whether its headers are complete.
typedef struct prom_conn {
    struct prom_conn *prev, *next;
    int fd;
    double begun;
    bool headers_done, dropped;
} prom_conn;

struct dsc__prom {
    struct MHD_Daemon *daemon;
    dsc__prom_render_fn render;
    void *user;
    int port;
    pthread_mutex_t mu; // guards conns and stop: the server thread and the reaper share them
    pthread_cond_t wake;
    prom_conn *conns;
    bool stop, reaper_started;
    pthread_t reaper;
};

// ---- the text format ----

// Prometheus wants base units spelled out at the end of the name: a word "ms" becomes a trailing
// "seconds" (value / 1000), "s" becomes "seconds", or "second" after "per" (tokens_per_second).
double dsc__prom_name(const char *tag, char *out, size_t cap) {
    static const char skip[] = "Train/Samples/";
    if (!strncmp(tag, skip, sizeof skip - 1)) tag += sizeof skip - 1;
    char flat[256];
    size_t n = 0;
    for (; *tag && n + 1 < sizeof flat; tag++)
        flat[n++] = isalnum((unsigned char)*tag) ? (char)tolower((unsigned char)*tag) : '_';
    flat[n] = '\0';
    double scale = 1;
    bool seconds = false;
    size_t k = (size_t)snprintf(out, cap, "dsc");
    const char *prev = ""; // the word before, inside flat
    for (char *word = flat, *end; word && k + 1 < cap; word = end ? end + 1 : NULL) {
        end = strchr(word, '_');
        if (end) *end = '\0';
        const char *w = word;
        if (!strcmp(w, "ms") || (!strcmp(w, "s") && strcmp(prev, "per"))) {
            if (!strcmp(w, "ms")) scale = 1e-3;
            seconds = true;
            w = "";
        } else if (!strcmp(w, "s")) {
            w = "second";
        }
        if (*w) k += (size_t)snprintf(out + k, cap - k, "_%s", w);
        prev = word;
    }
    if (seconds && k + 1 < cap) snprintf(out + k, cap - k, "_seconds");
    return scale;
}

typedef struct strbuf {
    char *p;
    size_t n, cap;
    int failed;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    for (int tries = 0; tries < 2 && !b->failed; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->failed = 1;
        } else if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        } else {
            size_t cap = 2 * b->cap + (size_t)k + 1;
            char *p = realloc(b->p, cap);
            if (!p) {
                b->failed = 1;
            } else {
                b->p = p;
                b->cap = cap;
            }
        }
    }
}

// Prometheus spells the special values +Inf, -Inf and NaN.
static void prom_value(double v, char *out, size_t cap) {
    if (v != v) snprintf(out, cap, "NaN");
    else if (v > 1.7976931348623157e308) snprintf(out, cap, "+Inf");
    else if (v < -1.7976931348623157e308) snprintf(out, cap, "-Inf");
    else dsc__fmt_pyfloat(out, cap, v);
}

// HELP text escapes backslash and newline.
static void help_text(const char *tag, char *out, size_t cap) {
    size_t n = 0;
    for (; *tag && n + 3 < cap; tag++) {
        if (*tag == '\\' || *tag == '\n') out[n++] = '\\';
        out[n++] = *tag == '\n' ? 'n' : *tag;
    }
    out[n] = '\0';
}

enum { NAME_CAP = 200 };

// Final names: two tags may map to one name ("a/b" and "a_b"), and a family may appear only once,
// so a repeated name gets the index of its gauge appended.
static void unique_names(const dsc__prom_gauge *g, int n, char (*names)[NAME_CAP], double *scale) {
    for (int i = 0; i < n; i++) {
        scale[i] = dsc__prom_name(g[i].tag, names[i], NAME_CAP - 16);
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j])) {
                size_t k = strlen(names[i]);
                snprintf(names[i] + k, NAME_CAP - k, "_%d", i);
                break;
            }
    }
}

char *dsc__prom_render(const dsc__prom_gauge *g, int n, int rank, size_t *len) {
    strbuf b = {malloc(4096), 0, 4096, 0};
    char(*names)[NAME_CAP] = malloc((size_t)(n > 0 ? n : 1) * sizeof *names);
    double *scale = malloc((size_t)(n > 0 ? n : 1) * sizeof *scale);
    if (!b.p || !names || !scale) {
        free(b.p);
        free(names);
        free(scale);
        return NULL;
    }
    b.p[0] = '\0';
    unique_names(g, n, names, scale);
    for (int i = 0; i < n; i++) {
        char help[512], value[48];
        help_text(g[i].tag, help, sizeof help);
        prom_value(g[i].value * scale[i], value, sizeof value);
        sb_printf(&b, "# HELP %s %s (latest value)\n# TYPE %s gauge\n%s{rank=\"%d\"} %s\n",
                  names[i], help, names[i], names[i], rank, value);
    }
    free(names);
    free(scale);
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}

// ---- the server ----

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *body, size_t len,
                             const char *type) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer_with_free_callback(len, body, free);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *text) {
    size_t n = strlen(text);
    char *body = malloc(n + 1);
    if (!body) return MHD_NO;
    memcpy(body, text, n + 1);
    return reply(c, status, body, n, "text/plain; charset=utf-8");
}

// ---- the header deadline ----
// libmicrohttpd's own timeout counts from a connection's last byte, so a client sending one byte
// every second holds its slot for ever. The library tells us when connections open and close;
// a thread of ours shuts down the socket of a request still incomplete past the deadline, and
// the library then closes that connection as one its client ended.

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode what) {
    dsc__prom *p = cls;
    prom_conn *pc = *socket_context;
    pthread_mutex_lock(&p->mu);
    if (what == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        pc = calloc(1, sizeof *pc);
        if (pc && ci) { // without memory the connection is left to the idle timeout
            *pc = (prom_conn){.next = p->conns, .fd = ci->connect_fd, .begun = dsc_now()};
            if (p->conns) p->conns->prev = pc;
            p->conns = pc;
        } else {
            free(pc);
            pc = NULL;
        }
        *socket_context = pc;
    } else if (pc) { // closed: the socket is still open while we are told (closed after this)
        if (pc->prev) pc->prev->next = pc->next;
        else p->conns = pc->next;
        if (pc->next) pc->next->prev = pc->prev;
        free(pc);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&p->mu);
}

static prom_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

// A request was answered (or failed): a next request on the same connection starts its clock.
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    dsc__prom *p = cls;
    pthread_mutex_lock(&p->mu);
    prom_conn *pc = conn_of(c);
    if (pc) pc->begun = dsc_now(), pc->headers_done = false;
    pthread_mutex_unlock(&p->mu);
}

static void *reaper_main(void *arg) {
    dsc__prom *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        double now = dsc_now();
        for (prom_conn *pc = p->conns; pc; pc = pc->next)
            if (!pc->headers_done && !pc->dropped &&
                now - pc->begun > DSC__PROM_HEADER_DEADLINE_S) {
                shutdown(pc->fd, SHUT_RDWR);
                pc->dropped = true;
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000; // look ten times a second
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&p->wake, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    dsc__prom *p = cls;
    pthread_mutex_lock(&p->mu);
    prom_conn *pc = conn_of(c);
    if (pc) pc->headers_done = true;
    pthread_mutex_unlock(&p->mu);
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics is served\n");
    if (strcmp(url, "/metrics"))
        return reply_text(c, MHD_HTTP_NOT_FOUND, "dsc serves its metrics at /metrics\n");
    size_t len = 0;
    char *body = p->render(p->user, &len);
    if (!body) return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    return reply(c, MHD_HTTP_OK, body, len, "text/plain; version=0.0.4; charset=utf-8");
}

dsc_status dsc__prom_start(dsc__prom **out, int port, dsc__prom_render_fn fn, void *user) {
    if (port < 0 || port > 65535)
        return dsc__fail(DSC_ERR_CONFIG, "prometheus.port %d: must be 1..65535", port);
    dsc__prom *p = calloc(1, sizeof *p);
    if (!p) return dsc__fail(DSC_ERR_OOM, "out of memory starting the Prometheus endpoint");
    p->render = fn;
    p->user = user;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    // poll(): select() could not watch descriptors past FD_SETSIZE, and epoll is edge-triggered:
    // a socket the reaper shuts down while the server thread is reading it can go unseen until
    // the idle timeout (the header deadline then held a scrape ~6 s). poll() is level-triggered,
    // and a few hundred descriptors cost it nothing.
    p->daemon = MHD_start_daemon(MHD_USE_POLL_INTERNAL_THREAD, (uint16_t)port, NULL, NULL,
                                 on_request, p, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)DSC__PROM_MAX_CONNECTIONS,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)DSC__PROM_IDLE_TIMEOUT_S,
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, p,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, p, MHD_OPTION_END);
    if (!p->daemon) {
        dsc__prom_stop(p);
        return dsc__fail(DSC_ERR_SYSTEM, "prometheus: cannot listen on 127.0.0.1:%d (port in "
                         "use?); set prometheus.port to a free port", port);
    }
    if (pthread_create(&p->reaper, NULL, reaper_main, p) != 0) {
        dsc__prom_stop(p);
        return dsc__fail(DSC_ERR_SYSTEM, "prometheus: cannot start its connection thread");
    }
    p->reaper_started = true;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(p->daemon, MHD_DAEMON_INFO_BIND_PORT);
    p->port = info && info->port ? info->port : port;
    *out = p;
    return DSC_OK;
}

int dsc__prom_port(const dsc__prom *p) { return p ? p->port : 0; }

void dsc__prom_stop(dsc__prom *p) {
    if (!p) return;
    if (p->reaper_started) { // first: it may still shut down a socket of the daemon's
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_signal(&p->wake);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->reaper, NULL);
    }
    if (p->daemon) MHD_stop_daemon(p->daemon); // tells on_connection of every close
    for (prom_conn *pc = p->conns, *next; pc; pc = next) { // none left; a failed start's
        next = pc->next;
        free(pc);
    }
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
