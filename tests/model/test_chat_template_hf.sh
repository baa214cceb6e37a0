#!/usr/bin/env bash
# Chat templates against transformers' apply_chat_template (4.44.2, jinja2 3.1.4): templates in
# the style of Llama 3.1 (tools, dates, system turn), Qwen2.5 (tools), Mistral v0.3 (alternation
# checks, raise_exception), SmolLM2 (ChatML) and Gemma (role mapping, no system role), kept in
# tests/model/chat_templates, render a set of conversations through `dsc data chat` exactly as
# transformers renders them (with and without the generation prompt); the assistant spans and
# `dsc data prepare`'s loss mask (byte tokenizer: one token per byte) are exactly the spans found
# by rendering prefixes with jinja2; conversations a template refuses are refused with its
# message; 18 small templates exercise the rest of the subset (filters, tests, methods, macros,
# loop variables, namespaces, slices, literals, whitespace control) against jinja2; templates
# beyond the subset are refused naming the construct (tests/model/hf_chat.py).
# The oracle is installed by scripts/install-hf.sh; without it (no network) the test exits 77.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$src/tests/cli/lib.sh"

install_log=$(bash "$src/scripts/install-hf.sh" 2>&1)
py=$(tail -n 1 <<<"$install_log")
if [ ! -x "$py" ] || ! "$py" -c 'import jinja2, transformers' 2>/dev/null; then
  echo "$install_log"
  echo "SKIP: the transformers/jinja2 oracle could not be installed; chat templates NOT TESTED"
  exit 77
fi

check "chat templates render as apply_chat_template, masks on the assistant spans" -- \
  "$py" -W ignore "$src/tests/model/hf_chat.py" "$DSC" "$src/tests/model/chat_templates" "$T"
finish
