// comm/store.h - the rendezvous store: a small key-value server over TCP.
//
// One process of the job hosts the server (a thread inside it, e.g. rank 0 on MASTER_ADDR:
// MASTER_PORT); every process, the host included, talks to it as a client. Values are byte
// strings; counters are decimal strings updated atomically by dsc_store_add. Every call carries
// the store's deadline, so a rank never hangs on it: no connection or no answer within the
// deadline is DSC_ERR_TIMEOUT; a server that went away (connection closed or reset) is
// DSC_ERR_PEER. After such a failure the next call reconnects.
//
// Wire format (both directions, integers big-endian):
//   request:  u8 cmd, u32 key length, u32 value length, key, value
//   response: u8 result (0 ok, 1 absent, 2 bad request), u32 length, payload
// Keys are at most 1024 bytes, values at most 64 MiB.
#ifndef DSC_COMM_STORE_H
#define DSC_COMM_STORE_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t

#include "dsc/status.h" // dsc_status

typedef struct dsc_store dsc_store;

#define DSC_STORE_KEY_MAX 1024
#define DSC_STORE_VALUE_MAX (64u << 20)

// Connect to host:port, retrying until timeout_s (the server may start later). With serve, first
// host the server in this process on port (0: any free port, see dsc_store_port), listening on the
// loopback interface when host is a loopback address and on every interface otherwise.
dsc_status dsc_store_create(dsc_store **out, const char *host, int port, bool serve,
                            double timeout_s);
// Closes the connection and, when hosting, stops the server: clients still waiting get
// DSC_ERR_PEER. destroy(NULL) is a no-op.
void dsc_store_destroy(dsc_store *s);

// The port of the server (the bound one when created with serve and port 0).
int dsc_store_port(const dsc_store *s);
// Deadline of every later call, seconds.
void dsc_store_set_timeout(dsc_store *s, double timeout_s);

// key = value (copied); replaces an earlier value and wakes waiters.
dsc_status dsc_store_set(dsc_store *s, const char *key, const void *value, size_t len);
// Wait until key is present, then return a copy: *value (caller frees; NUL-terminated for
// convenience, not counted in *len).
dsc_status dsc_store_get(dsc_store *s, const char *key, void **value, size_t *len);
// Atomically add delta to the counter key (absent counts as 0); *result (may be NULL) gets the
// new value.
dsc_status dsc_store_add(dsc_store *s, const char *key, int64_t delta, int64_t *result);
// Wait until every key is present (one deadline for all of them).
dsc_status dsc_store_wait(dsc_store *s, const char *const *keys, size_t n);
// Non-blocking: is key present now?
dsc_status dsc_store_check(dsc_store *s, const char *key, bool *present);
// Remove key; *existed (may be NULL) says whether it was there.
dsc_status dsc_store_delete(dsc_store *s, const char *key, bool *existed);

#endif
