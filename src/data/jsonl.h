// data/jsonl.h - training examples: the text of each, cut into segments that are trained on
// (their tokens are loss targets) or not (prompt text, chat markup, other roles' messages).
//
// A JSONL file holds one JSON object per line (blank lines are skipped), each one of:
//   {"text": "..."}                            one trained segment (plain text, as a text file)
//   {"prompt": "...", "completion": "..."}     the prompt untrained, the completion trained
//   {"messages": [{"role": "...", "content": "..."}, ...], "tools": [...]}
//        rendered with the model's chat template (chat.h); the assistant spans (each assistant
//        message and the template's end of its turn) are trained, everything else is not. At
//        least one assistant message is required; a conversation the template refuses is a bad
//        line with the template's message.
// Other keys are ignored. Adjacent segments with the same flag are merged (tokenized together).
#ifndef DSC_DATA_JSONL_H
#define DSC_DATA_JSONL_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t

#include "data/chat.h"  // dsc_chat_template
#include "dsc/data.h"   // DSC_BAD_LINE_*
#include "dsc/status.h" // dsc_status

typedef struct dsc_segment {
    char *text; // owned, NUL-terminated
    size_t len;
    bool train;
} dsc_segment;

typedef struct dsc_example {
    dsc_segment *seg; // owned
    int nseg;
} dsc_example;

typedef struct dsc_examples {
    dsc_example *v; // owned
    int64_t n, cap;
    int64_t skipped; // bad lines skipped (DSC_BAD_LINE_SKIP)
} dsc_examples;

// Append one example of len bytes of text, trained throughout (copied); none when len is 0.
dsc_status dsc_examples_add_text(dsc_examples *ex, const char *text, size_t len);

// Append the examples of a JSONL file's contents (path names it in messages). A bad line
// (invalid JSON, not an object, none of the three forms, a field of the wrong type, no assistant
// message) is an error naming path:line and the fix (DSC_ERR_INVALID_ARG; the examples of the
// earlier lines stay in ex), or with DSC_BAD_LINE_SKIP a warning and ex->skipped + 1.
// tpl renders "messages" (borrowed).
dsc_status dsc_jsonl_read(const char *path, const char *text, size_t len,
                          const dsc_chat_template *tpl, int on_bad_line, dsc_examples *ex);

void dsc_examples_free(dsc_examples *ex); // frees everything; ex is zeroed

#endif
