// monitor/check.c - the monitor's sections checked before a run (dsc_monitor_check_config): the
// output directories the sinks would make, and whether the Prometheus port is taken now.
#include <arpa/inet.h>  // htonl, htons
#include <errno.h>      // errno, EADDRINUSE
#include <netinet/in.h> // sockaddr_in, INADDR_LOOPBACK
#include <stdbool.h>    // bool
#include <stdio.h>      // snprintf
#include <string.h>     // strerror, strrchr
#include <sys/socket.h> // socket, bind, setsockopt
#include <sys/stat.h>   // stat, S_ISDIR
#include <unistd.h>     // access, close

#include "base/status.h" // dsc__fail
#include "dsc/monitor.h" // dsc_monitor_check_config

// Walk <path>/<job> as mkdir -p would: every part that exists must be a directory, and the first
// missing one must be makeable in its parent (write and search permission there).
static dsc_status check_dir(const char *key, const char *path, const char *job) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "%s%s%s", path, job[0] ? "/" : "", job);
    if (n < 0 || (size_t)n >= sizeof buf)
        return dsc__fail(DSC_ERR_CONFIG, "%s: the path is too long", key);
    for (size_t i = 1; i <= (size_t)n; i++) { // each prefix ending at a '/', then the whole
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char keep = buf[i];
        buf[i] = '\0';
        struct stat sb;
        if (stat(buf, &sb) == 0 && !S_ISDIR(sb.st_mode))
            return dsc__fail(DSC_ERR_CONFIG, "%s (choose another): %s exists and is not a "
                             "directory", key, buf);
        if (stat(buf, &sb) != 0) { // the first part to be made: its parent must let us
            char *slash = strrchr(buf, '/');
            if (slash == buf) slash[1] = '\0'; // "/x": the parent is "/"
            else if (slash) *slash = '\0';
            const char *parent = slash ? buf : ".";
            if (access(parent, W_OK | X_OK) != 0)
                return dsc__fail(DSC_ERR_CONFIG, "%s (choose another): cannot create a directory "
                                 "in %s: %s", key, parent, strerror(errno));
            return DSC_OK;
        }
        buf[i] = keep;
    }
    return DSC_OK;
}

// Whether something listens on 127.0.0.1:port now (the endpoint binds only there).
static bool port_taken(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    int one = 1; // as the server does: a port left in TIME_WAIT is not taken
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool taken = bind(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == EADDRINUSE;
    close(fd);
    return taken;
}

dsc_status dsc_monitor_check_config(const dsc_config *cfg,
                                    void (*warn)(void *user, const char *message), void *user) {
    if (!cfg) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_monitor_check_config: NULL config");
    if (cfg->tensorboard.enabled && cfg->tensorboard.output_path[0])
        DSC_TRY(check_dir("tensorboard.output_path", cfg->tensorboard.output_path,
                          cfg->tensorboard.job_name));
    if (cfg->csv_monitor.enabled && cfg->csv_monitor.output_path[0])
        DSC_TRY(check_dir("csv_monitor.output_path", cfg->csv_monitor.output_path,
                          cfg->csv_monitor.job_name));
    int port = (int)cfg->prometheus.port;
    if (cfg->prometheus.enabled && port > 0 && port_taken(port) && warn) {
        char msg[256];
        snprintf(msg, sizeof msg, "prometheus.port %d is in use on 127.0.0.1 now; a run started "
                 "while it is would stop at once: choose a free port (0 picks one)", port);
        warn(user, msg);
    }
    return DSC_OK;
}
