// data/chat.h - chat conversations rendered with a model's own chat template (Jinja, see
// data/jinja.h), as Hugging Face's apply_chat_template renders them, and the spans of the text
// that are the assistant's (the loss targets of fine-tuning).
//
// The public calls (dsc_chat_template_load / _create / _destroy, dsc_chat_apply,
// dsc_chat_template_end_of_turn) are declared in dsc/data.h; these take jansson values.
//
// Assistant spans, by rendering prefixes: for the assistant message i of a conversation of n
// messages, P_i = render(messages[0, i), add_generation_prompt=true) and
// Q_i = render(messages[0, i], add_generation_prompt=false). Its span is [len P_i, len Q_i) of the
// whole render R = render(messages, false): the message and what the template closes its turn
// with (e.g. "<|im_end|>\n"), without the header the generation prompt already holds. Each P_i and
// Q_i must be a prefix of R (and the spans in order); a template that renders an earlier turn
// differently once later messages follow is refused for that conversation, naming the message.
#ifndef DSC_DATA_CHAT_H
#define DSC_DATA_CHAT_H

#include <jansson.h>  // json_t
#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "dsc/data.h"   // dsc_chat_template, dsc_chat_span
#include "dsc/status.h" // dsc_status

// Render messages (a JSON array, borrowed) with tools (NULL or JSON null: none). *out is
// caller-owned (free()). Errors: DSC_ERR_INVALID_ARG (the template refused the conversation:
// raise_exception, a value it cannot use), with the reason recorded.
dsc_status dsc__chat_render(const dsc_chat_template *t, json_t *messages, json_t *tools,
                            bool add_generation_prompt, char **out, size_t *len);

// The whole render and its assistant spans (above). *text and *spans are caller-owned (free());
// *nspans is the number of assistant messages.
dsc_status dsc__chat_render_spans(const dsc_chat_template *t, json_t *messages, json_t *tools,
                                  char **text, size_t *len, dsc_chat_span **spans, int *nspans);

#endif
