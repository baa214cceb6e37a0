// data/chat.h - chat messages as text: a simple role/content template, read from a Hugging Face
// chat_template (Jinja) where dsc recognises its shape, else the default ChatML.
//
// The default (ChatML): each message is "<|im_start|>" ROLE "\n" CONTENT "<|im_end|>\n".
//
// A Jinja template is recognised when, after Hugging Face's whitespace rules (trim_blocks and
// lstrip_blocks, and the "-" markers of {%- -%} {{- -}}), it is exactly:
//   [text and {{ bos_token }} / {{ eos_token }}]
//   {% for message in messages %} BODY {% endfor %}
//   [{% if add_generation_prompt %} ... {% endif %}]   (ignored: training adds no prompt)
//   [text]
// where BODY is text and {{ EXPR }} blocks, EXPR a "+" chain of string literals ('..' or "..",
// escapes \n \t \\ \' \"), message['role'] / message['content'] (or message["..."],
// message.role, message.content), bos_token and eos_token; content appears exactly once in BODY.
// {# comments #} are skipped. Anything else ({% if %} inside the loop, {% set %}, filters such as
// | trim, loop.*, raise_exception) is not recognised.
// A message renders as PREFIX CONTENT SUFFIX: PREFIX is BODY before the content, SUFFIX after it,
// with the message's role substituted.
#ifndef DSC_DATA_CHAT_H
#define DSC_DATA_CHAT_H

#include <stddef.h> // size_t

#include "dsc/status.h" // dsc_status

typedef struct dsc_chat_template dsc_chat_template;

// The default ChatML template. Caller owns *out.
dsc_status dsc_chat_template_chatml(dsc_chat_template **out);

// Recognise a Jinja chat template (bos, eos: the tokenizer's special token texts, NULL = none).
// Not recognised: DSC_ERR_CONFIG with the reason recorded (dsc_last_error), *out NULL.
dsc_status dsc_chat_template_parse(const char *jinja, const char *bos, const char *eos,
                                   dsc_chat_template **out);

// The template for `dsc data prepare`: spec "chatml", a tokenizer_config.json file (its
// "chat_template"), a folder holding one, or a file of Jinja text; spec NULL: the
// tokenizer_config.json of an "hf:DIR" tokenizer when there is one, else ChatML. A template given
// but not recognised falls back to ChatML; `note` (cap bytes) then says why, else it names the
// template used. Errors: DSC_ERR_IO (a given file is unreadable), DSC_ERR_CORRUPT (bad JSON, no
// chat_template key).
dsc_status dsc_chat_template_load(const char *spec, const char *tokenizer_spec,
                                  dsc_chat_template **out, char *note, size_t cap);

void dsc_chat_template_destroy(dsc_chat_template *t); // NULL is a no-op

// Text before the first message and after the last one (borrowed; often "").
const char *dsc_chat_template_begin(const dsc_chat_template *t);
const char *dsc_chat_template_end(const dsc_chat_template *t);

// The text around one message's content for `role`. *prefix and *suffix are caller-owned
// (free()), NUL-terminated.
dsc_status dsc_chat_render(const dsc_chat_template *t, const char *role, char **prefix,
                           char **suffix);

#endif
