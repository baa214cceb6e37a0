// cli/train_obs.c - the trainer's breakdown, flops profile, comms summary and progress line.
#include "cli/train_obs.h"

#include <errno.h>  // errno
#include <jansson.h> // json_* (comms_logger.prof_ops)
#include <stdio.h>  // printf, fopen
#include <stdlib.h> // calloc, free, getenv
#include <string.h> // strcmp, strerror
#include <unistd.h> // isatty

#include "dsc/base.h"    // dsc_env
#include "dsc/comm.h"    // dsc_comm_logger_*
#include "dsc/monitor.h" // dsc_flops_profile_write
#include "dsc/status.h"  // dsc_fail, DSC_TRY

// ---- wall_clock_breakdown ----

void obs_breakdown_print(const train_times *s) {
    printf("[Rank 0] time (ms) | fwd: %.2f | bwd: %.2f | bwd_inner: %.2f | bwd_allreduce: %.2f | "
           "step: %.2f\n", s->fwd * 1e3, s->bwd * 1e3, s->bwd_inner * 1e3,
           s->bwd_allreduce * 1e3, s->step * 1e3);
}

dsc_status obs_breakdown_log(dsc_monitor *m, const train_times *t, int64_t samples) {
    DSC_TRY(dsc_monitor_log(m, DSC_METRIC_FORWARD_MS, t->fwd * 1e3, samples));
    DSC_TRY(dsc_monitor_log(m, DSC_METRIC_BACKWARD_MS, t->bwd * 1e3, samples));
    DSC_TRY(dsc_monitor_log(m, DSC_METRIC_BACKWARD_INNER_MS, t->bwd_inner * 1e3, samples));
    DSC_TRY(dsc_monitor_log(m, DSC_METRIC_BACKWARD_ALLREDUCE_MS, t->bwd_allreduce * 1e3, samples));
    return dsc_monitor_log(m, DSC_METRIC_STEP_MS, t->step * 1e3, samples);
}

// ---- comms_logger ----

static dsc_status prof_ops_mask(const char *text, unsigned *mask) {
    *mask = 0;
    json_t *list = json_loads(text && *text ? text : "[]", 0, NULL);
    dsc_status st = DSC_OK;
    if (!json_is_array(list))
        st = dsc_fail(DSC_ERR_CONFIG, "comms_logger.prof_ops must be a list of operation names");
    for (size_t i = 0; st == DSC_OK && i < json_array_size(list); i++) {
        const char *name = json_string_value(json_array_get(list, i));
        unsigned bit;
        st = dsc_comm_log_op_bit(name ? name : "(not a string)", &bit);
        if (st != DSC_OK) dsc_error_prefix("config key comms_logger.prof_ops[%zu]: ", i);
        *mask |= st == DSC_OK ? bit : 0;
    }
    json_decref(list);
    return st;
}

dsc_status obs_comms_setup(const dsc_config *cfg) {
    unsigned ops = DSC_COMM_LOG_EVERY_OP;
    if (!cfg->comms_logger.prof_all) DSC_TRY(prof_ops_mask(cfg->comms_logger.prof_ops, &ops));
    dsc_comm_logger_reset();
    dsc_comm_logger_configure(cfg->comms_logger.enabled, ops);
    return DSC_OK;
}

void obs_comms_print(const dsc_config *cfg, int64_t step) {
    if (!cfg->comms_logger.enabled) return;
    printf("comms logger, rank 0, after step %lld:\n", (long long)step);
    dsc_comm_logger_print(stdout);
    fflush(stdout);
}

// ---- flops_profiler ----

static dsc_status write_profile(FILE *f, const dsc_config *cfg, const obs_profile *p,
                                dsc_model_module *gm, dsc_prof_module *pm, int n) {
    dsc_model_modules(p->model, p->B * p->gas, p->T, gm);
    for (int i = 0; i < n; i++)
        pm[i] = (dsc_prof_module){gm[i].name, gm[i].type, gm[i].depth, gm[i].params,
                                  gm[i].fwd_flops, gm[i].slot >= 0 ? p->times[gm[i].slot] : 0};
    dsc_prof_summary s = {.step = p->step, .world = p->world, .dp = p->world, .mp = 1,
                          .batch_per_rank = (int64_t)p->B * p->gas, .fwd_s = p->tt.fwd,
                          .bwd_s = p->tt.bwd, .step_s = p->tt.step, .iter_s = p->iter_s};
    dsc_prof_opts o = {cfg->flops_profiler.module_depth, cfg->flops_profiler.top_modules,
                       cfg->flops_profiler.detailed};
    return dsc_flops_profile_write(f, &s, pm, n, &o);
}

dsc_status obs_flops_report(const dsc_config *cfg, const obs_profile *p) {
    const char *path = cfg->flops_profiler.output_file;
    int n = dsc_model_modules(p->model, 1, p->T, NULL);
    dsc_model_module *gm = calloc((size_t)n, sizeof *gm);
    dsc_prof_module *pm = calloc((size_t)n, sizeof *pm);
    FILE *f = path[0] ? fopen(path, "w") : stdout;
    dsc_status st = DSC_OK;
    if (!gm || !pm) st = dsc_fail(DSC_ERR_OOM, "out of memory for the flops profile");
    else if (!f) st = dsc_fail(DSC_ERR_IO, "flops_profiler.output_file %s: cannot write: %s; "
                               "give a path in a writable directory", path, strerror(errno));
    else st = write_profile(f, cfg, p, gm, pm, n);
    if (f && f != stdout && fclose(f) != 0 && st == DSC_OK)
        st = dsc_fail(DSC_ERR_IO, "flops_profiler.output_file %s: %s", path, strerror(errno));
    if (st == DSC_OK && path[0]) printf("flops profile of step %lld written to %s\n",
                                        (long long)p->step, path);
    free(gm);
    free(pm);
    return st;
}

// ---- progress ----

static int tty_state = -1; // -1 unknown, 0 plain output, 1 terminal
static bool line_shown;

bool obs_progress_on(void) {
    if (tty_state < 0) {
        const char *force = dsc_env("DSC_PROGRESS"); // "tty" / "plain": for scripts and tests
        if (force && !strcmp(force, "tty")) tty_state = 1;
        else if (force && !strcmp(force, "plain")) tty_state = 0;
        else tty_state = isatty(STDOUT_FILENO) ? 1 : 0;
    }
    return tty_state == 1;
}

static void eta_text(double s, char *buf, size_t cap) {
    long long x = s > 0 && s < 1e9 ? (long long)(s + 0.5) : 0;
    if (x >= 3600) snprintf(buf, cap, "%lldh%02lldm", x / 3600, x / 60 % 60);
    else snprintf(buf, cap, "%lldm%02llds", x / 60, x % 60);
}

void obs_progress_update(int64_t step, int64_t total, double loss, double tok_s, double eta_s) {
    if (!obs_progress_on()) return;
    char eta[32];
    eta_text(eta_s, eta, sizeof eta);
    printf("\r\033[Kstep %lld/%lld | loss %.4f | %.0f tok/s | ETA %s", (long long)step,
           (long long)total, loss, tok_s, eta);
    fflush(stdout);
    line_shown = true;
}

void obs_progress_clear(void) {
    if (!line_shown) return;
    printf("\r\033[K");
    line_shown = false;
}
