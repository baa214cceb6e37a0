#!/usr/bin/env bash
# Install Hugging Face transformers 4.44.2 (with tokenizers and safetensors) into a private venv:
# the oracle of the model tests that compare against LlamaForCausalLM, Qwen2ForCausalLM and the
# tokenizers, and (with jinja2) of the chat-template tests (apply_chat_template); with PEFT 0.12.0
# (and accelerate, psutil), the oracle of the LoRA tests.
#
# The venv is made from Debian's python3 with --system-site-packages so that it sees Debian's
# python3-torch (1.13, CPU) and numpy. Every package is pinned, dependencies included, and
# installed with --no-deps so that nothing unpinned comes in.
#
#   DSC_HF_VENV   where the venv lives (default: <repo>/.venv-hf, git-ignored)
#
# Idempotent and quick when already done. Exit 0: ready (prints the venv's python on the last
# line); exit 77: could not be made (e.g. no network) - the reason is printed as "SKIP: ...".
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${DSC_HF_VENV:-$repo/.venv-hf}
py=$venv/bin/python
PINS=(transformers==4.44.2 tokenizers==0.19.1 safetensors==0.4.5 huggingface-hub==0.24.6
      filelock==3.15.4 fsspec==2024.6.1 packaging==24.1 pyyaml==6.0.2 regex==2024.7.24
      requests==2.32.3 tqdm==4.66.5 typing-extensions==4.12.2 idna==3.8 certifi==2024.8.30
      urllib3==2.2.2 charset-normalizer==3.3.2 jinja2==3.1.4 MarkupSafe==2.1.5
      peft==0.12.0 accelerate==0.33.0 psutil==6.0.0)
# The stamp names the exact set, so that a change of pins reinstalls.
stamp=$venv/.dsc-hf-$(echo "${PINS[*]}" | cksum | cut -d' ' -f1)

skip() {
  echo "SKIP: transformers oracle unavailable: $*" >&2
  exit 77
}

if [ -f "$stamp" ] && [ -x "$py" ]; then
  echo "$py"
  exit 0
fi

[ -x /usr/bin/python3 ] || skip "/usr/bin/python3 is missing (apt-get install python3 python3-venv)"
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  skip "Debian's python3-torch is not installed (apt-get install python3-torch)"
if [ ! -x "$py" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv" >/dev/null 2>&1 ||
    skip "cannot create a venv at $venv (apt-get install python3-venv)"
fi
log=$venv/install.log
echo "dsc: installing transformers and its pinned dependencies into $venv" >&2
"$py" -m pip install --disable-pip-version-check -q --no-deps "${PINS[@]}" >"$log" 2>&1 ||
  skip "pip could not install ${PINS[*]} (no network?); see $log"
"$py" -c 'import transformers, tokenizers, safetensors
from transformers import LlamaForCausalLM, Qwen2ForCausalLM
import jinja2, peft' >>"$log" 2>&1 ||
  skip "transformers installed but does not import; see $log"
touch "$stamp"
echo "$py"
