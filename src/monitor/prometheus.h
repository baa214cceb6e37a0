// monitor/prometheus.h - the Prometheus endpoint: GET /metrics on 127.0.0.1:<port>.
#ifndef DSC_MONITOR_PROMETHEUS_H
#define DSC_MONITOR_PROMETHEUS_H

#include <stddef.h> // size_t
#include <stdint.h> // int64_t

#include "dsc/status.h" // dsc_status

typedef struct dsc__prom dsc__prom;

// One gauge: a metric's latest value.
typedef struct dsc__prom_gauge {
    const char *tag; // the logged name, e.g. "Train/Samples/train_loss"
    double value;
} dsc__prom_gauge;

// Render gauges in the text exposition format (version 0.0.4) with label rank="<rank>",
// converted to the units their names say.
// Returns malloc'd text (caller frees) and its length, or NULL when out of memory.
char *dsc__prom_render(const dsc__prom_gauge *g, int n, int rank, size_t *len);

// The Prometheus name of a tag: "dsc_" + the tag less a leading "Train/Samples/", lower-case,
// other characters than [a-z0-9_] as '_' ("Train/Samples/train_loss" -> "dsc_train_loss"), with
// time units in seconds at the end ("Comm/time_ms" -> "dsc_comm_time_seconds"). Returns the
// factor that converts the logged value to the unit of the name (1e-3 for milliseconds).
double dsc__prom_name(const char *tag, char *out, size_t cap);

// Produces the page body on the server thread (malloc'd; NULL = 500 error).
typedef char *(*dsc__prom_render_fn)(void *user, size_t *len);

// Connection policy. Idle connections (a client that connects and sends nothing, or keeps a
// connection open between scrapes) are closed after DSC__PROM_IDLE_TIMEOUT_S without traffic, and
// up to DSC__PROM_MAX_CONNECTIONS may be open at once, so that a scrape gets through while many
// are idle; past the limit a new connection waits in the listen backlog for a free slot. A
// request whose headers are not complete DSC__PROM_HEADER_DEADLINE_S after its connection opened
// (or after the connection's previous answer) is dropped, however slowly it trickles in: a slot
// held by a client sending a byte now and then frees within the deadline, so a scrape is answered
// within about that long even when every slot is taken (Prometheus gives up after 10 s).
#define DSC__PROM_MAX_CONNECTIONS 256
#define DSC__PROM_IDLE_TIMEOUT_S 5
#define DSC__PROM_HEADER_DEADLINE_S 1.0

// Serve on 127.0.0.1:port (0 = any free port) from a thread of the HTTP library.
dsc_status dsc__prom_start(dsc__prom **out, int port, dsc__prom_render_fn fn, void *user);
int dsc__prom_port(const dsc__prom *p);
void dsc__prom_stop(dsc__prom *p); // NULL is a no-op; waits for the server thread

#endif
