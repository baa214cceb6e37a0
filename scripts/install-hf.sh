#!/usr/bin/env bash
# Install Hugging Face's transformers, tokenizers and safetensors into a private venv: the oracle
# of the tests that compare dsc with Hugging Face (tokenizer.json encoding, model files).
#
# The venv is made from Debian's python3 with --system-site-packages so that it sees Debian's
# python3-torch (1.13, CPU) and numpy. transformers 4.44.2 is the last release line that runs on
# torch 1.13; it wants tokenizers < 0.20. Every package pip would fetch is pinned, so that two
# machines run the same oracle.
#
#   DSC_HF_VENV   where the venv lives (default: <repo>/.venv-hf, git-ignored)
#
# Idempotent and quick when already done. Exit 0: ready (prints the venv's python on the last
# line); exit 77: could not be made (e.g. no network) - the reason is printed as "SKIP: ...".
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${DSC_HF_VENV:-$repo/.venv-hf}
py=$venv/bin/python
PINS=(transformers==4.44.2 tokenizers==0.19.1 safetensors==0.4.5
      huggingface-hub==0.36.2 filelock==4.3.2 fsspec==2026.9.0 hf-xet==1.8.0 packaging==26.4
      regex==2026.11.19 tqdm==4.70.1)
# The stamp names the exact set, so that a change of pins reinstalls.
stamp=$venv/.dsc-hf-$(echo "${PINS[*]}" | cksum | cut -d' ' -f1)

skip() {
  echo "SKIP: Hugging Face oracle (${PINS[*]:0:3}) unavailable: $*" >&2
  exit 77
}

if [ -f "$stamp" ] && [ -x "$py" ]; then
  echo "$py"
  exit 0
fi

[ -x /usr/bin/python3 ] || skip "/usr/bin/python3 is missing (apt-get install python3 python3-venv)"
if [ ! -x "$py" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv" >/dev/null 2>&1 ||
    skip "cannot create a venv at $venv (apt-get install python3-venv)"
fi
log=$venv/install.log
echo "dsc: installing ${PINS[*]:0:3} into $venv" >&2
"$py" -m pip install --disable-pip-version-check -q "${PINS[@]}" >"$log" 2>&1 ||
  skip "pip could not install ${PINS[*]} (no network?); see $log"
"$py" -c 'import tokenizers, safetensors, transformers' >>"$log" 2>&1 ||
  skip "the packages installed but do not import; see $log"
touch "$stamp"
echo "$py"
