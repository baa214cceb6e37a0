// data/jsonl.c - JSONL lines -> examples with trained and untrained segments (see jsonl.h).
#include "data/jsonl.h"

#include <jansson.h> // json_*
#include <stdio.h>   // snprintf
#include <stdlib.h>  // free, malloc, realloc
#include <string.h>  // memchr, memcpy, strcmp

#include "base/log.h"    // DSC_WARN
#include "base/status.h" // dsc__fail, DSC_TRY
#include "data/chat.h"   // dsc__chat_render_spans

#define WARN_LINES 10 // skipped lines reported one by one; the rest only counted

// ---- internal: building examples ----

static void example_free(dsc_example *e) {
    for (int i = 0; i < e->nseg; i++) free(e->seg[i].text);
    free(e->seg);
    *e = (dsc_example){0};
}

// Append a segment, merging it into the last one when both have the same flag. Empty: skipped.
static dsc_status seg_add(dsc_example *e, const char *s, size_t n, bool train) {
    if (n == 0) return DSC_OK;
    dsc_segment *last = e->nseg ? &e->seg[e->nseg - 1] : NULL;
    if (last && last->train == train) {
        char *t = realloc(last->text, last->len + n + 1);
        if (!t) return dsc__fail(DSC_ERR_OOM, "data: out of memory");
        memcpy(t + last->len, s, n);
        last->len += n;
        t[last->len] = '\0';
        last->text = t;
        return DSC_OK;
    }
    dsc_segment *v = realloc(e->seg, ((size_t)e->nseg + 1) * sizeof *v);
    if (!v) return dsc__fail(DSC_ERR_OOM, "data: out of memory");
    e->seg = v;
    char *t = malloc(n + 1);
    if (!t) return dsc__fail(DSC_ERR_OOM, "data: out of memory");
    memcpy(t, s, n);
    t[n] = '\0';
    e->seg[e->nseg++] = (dsc_segment){t, n, train};
    return DSC_OK;
}

// Takes e (on failure too).
static dsc_status examples_push(dsc_examples *ex, dsc_example *e) {
    if (ex->n == ex->cap) {
        int64_t cap = ex->cap ? 2 * ex->cap : 64;
        dsc_example *v = realloc(ex->v, (size_t)cap * sizeof *v);
        if (!v) {
            example_free(e);
            return dsc__fail(DSC_ERR_OOM, "data: out of memory");
        }
        ex->v = v;
        ex->cap = cap;
    }
    ex->v[ex->n++] = *e;
    *e = (dsc_example){0};
    return DSC_OK;
}

// ---- internal: one line ----

// A bad line's reason goes to why; DSC_ERR_INVALID_ARG.
#define BAD(...) (snprintf(why, cap, __VA_ARGS__), DSC_ERR_INVALID_ARG)

static dsc_status from_prompt(json_t *j, dsc_example *e, char *why, size_t cap) {
    json_t *p = json_object_get(j, "prompt"), *c = json_object_get(j, "completion");
    if (!json_is_string(p) || !json_is_string(c))
        return BAD("\"prompt\" and \"completion\" must both be strings");
    DSC_TRY(seg_add(e, json_string_value(p), json_string_length(p), false));
    return seg_add(e, json_string_value(c), json_string_length(c), true);
}

// The rendered conversation cut at its assistant spans: those trained, the rest not.
static dsc_status add_rendered(dsc_example *e, const char *text, size_t len,
                               const dsc_chat_span *sp, int n) {
    size_t at = 0;
    for (int k = 0; k < n; k++) {
        DSC_TRY(seg_add(e, text + at, sp[k].begin - at, false));
        DSC_TRY(seg_add(e, text + sp[k].begin, sp[k].end - sp[k].begin, true));
        at = sp[k].end;
    }
    return seg_add(e, text + at, len - at, false);
}

static dsc_status from_messages(json_t *j, const dsc_chat_template *tpl, dsc_example *e,
                                char *why, size_t cap) {
    json_t *msgs = json_object_get(j, "messages"), *tools = json_object_get(j, "tools");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return BAD("\"messages\" must be a non-empty array of {\"role\", \"content\"} objects");
    int assistant = 0;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *role = json_object_get(json_array_get(msgs, i), "role");
        if (!json_is_string(role)) return BAD("messages[%zu] needs a string \"role\"", i);
        assistant += !strcmp(json_string_value(role), "assistant");
    }
    if (!assistant)
        return BAD("no message has role \"assistant\", so nothing would be trained on");
    char *text;
    size_t len;
    dsc_chat_span *sp;
    int n;
    dsc_status st = dsc__chat_render_spans(tpl, msgs, tools, &text, &len, &sp, &n);
    if (st == DSC_ERR_INVALID_ARG) return BAD("%s", dsc_last_error());
    DSC_TRY(st);
    st = add_rendered(e, text, len, sp, n);
    free(text);
    free(sp);
    return st;
}

// One line's example into e. DSC_ERR_INVALID_ARG with why filled: a bad line.
static dsc_status parse_line(const char *s, size_t n, const dsc_chat_template *tpl,
                             dsc_example *e, char *why, size_t cap) {
    json_error_t err;
    json_t *j = json_loadb(s, n, 0, &err);
    if (!j) return BAD("not valid JSON (column %d: %s)", err.column, err.text);
    dsc_status st;
    int forms = !!json_object_get(j, "text") + !!json_object_get(j, "prompt") +
                !!json_object_get(j, "messages");
    if (!json_is_object(j)) st = BAD("not a JSON object");
    else if (forms == 0)
        st = BAD("no \"text\", \"prompt\"/\"completion\" or \"messages\" field");
    else if (forms > 1)
        st = BAD("more than one of \"text\", \"prompt\" and \"messages\"; give one per line");
    else if (json_object_get(j, "messages")) st = from_messages(j, tpl, e, why, cap);
    else if (json_object_get(j, "prompt")) st = from_prompt(j, e, why, cap);
    else if (!json_is_string(json_object_get(j, "text"))) st = BAD("\"text\" must be a string");
    else
        st = seg_add(e, json_string_value(json_object_get(j, "text")),
                     json_string_length(json_object_get(j, "text")), true);
    json_decref(j);
    return st;
}

#undef BAD

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

// A bad line: the run's error, or (skip) a warning.
static dsc_status bad_line(const char *path, int64_t line, const char *why, int on_bad,
                           dsc_examples *ex) {
    if (on_bad != DSC_BAD_LINE_SKIP)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s:%lld: %s; fix the line, or pass --on-bad-line "
                         "skip to leave such lines out", path, (long long)line, why);
    if (++ex->skipped <= WARN_LINES)
        DSC_WARN("data", "%s:%lld: %s; line skipped", path, (long long)line, why);
    return DSC_OK;
}

// ---- public API ----

dsc_status dsc_examples_add_text(dsc_examples *ex, const char *text, size_t len) {
    if (len == 0) return DSC_OK; // an empty document is no example
    dsc_example e = {0};
    dsc_status st = seg_add(&e, text, len, true);
    if (st != DSC_OK) {
        example_free(&e);
        return st;
    }
    return examples_push(ex, &e);
}

dsc_status dsc_jsonl_read(const char *path, const char *text, size_t len,
                          const dsc_chat_template *tpl, int on_bad_line, dsc_examples *ex) {
    int64_t line = 0;
    size_t at = 0;
    // A UTF-8 byte-order mark (Windows editors write one) is skipped, as Python's utf-8-sig does.
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) at = 3;
    while (at < len) {
        const char *s = text + at, *nl = memchr(s, '\n', len - at);
        size_t n = nl ? (size_t)(nl - s) : len - at;
        at += n + 1;
        line++;
        if (blank(s, n)) continue;
        dsc_example e = {0};
        char why[512] = "";
        dsc_status st = parse_line(s, n, tpl, &e, why, sizeof why);
        if (st == DSC_OK && e.nseg == 0) { // e.g. {"text": ""}
            st = DSC_ERR_INVALID_ARG;
            snprintf(why, sizeof why, "the example is empty");
        }
        if (st == DSC_OK) {
            DSC_TRY(examples_push(ex, &e));
            continue;
        }
        example_free(&e);
        if (st != DSC_ERR_INVALID_ARG || !why[0]) return st; // out of memory, not the line
        DSC_TRY(bad_line(path, line, why, on_bad_line, ex));
    }
    return DSC_OK;
}

void dsc_examples_free(dsc_examples *ex) {
    for (int64_t i = 0; i < ex->n; i++) example_free(&ex->v[i]);
    free(ex->v);
    *ex = (dsc_examples){0};
}
