#!/usr/bin/env bash
# Install DeepSpeed 0.18.4 as pure Python into a private venv: the oracle of the parity tests.
#
# The venv is made from Debian's python3 with --system-site-packages so that it sees Debian's
# python3-torch (1.13, CPU); DeepSpeed's config, scheduler and loss-scaler modules run on it.
# DeepSpeed's own dependency list asks for more than those modules import, so it is installed with
# --no-deps and its import-time needs are installed by name, pinned.
#
#   DSC_DS_VENV   where the venv lives (default: <repo>/.venv-deepspeed, git-ignored)
#
# Idempotent and quick when already done. Exit 0: ready (prints the venv's python on the last
# line); exit 77: could not be made (e.g. no network) - the reason is printed as "SKIP: ...".
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${DSC_DS_VENV:-$repo/.venv-deepspeed}
py=$venv/bin/python
DS_VERSION=0.18.4
# What DeepSpeed's config, scheduler and loss-scaler modules import, and pydantic's own needs.
PINS=(hjson==3.1.0 py-cpuinfo==9.0.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
      typing-extensions==4.16.0 typing-inspection==0.4.5 packaging==26.4 tqdm==4.70.1
      msgpack==1.2.4 ninja==1.13.2 einops==0.8.2)
# The stamp names the exact set, so that a change of pins reinstalls.
stamp=$venv/.dsc-deepspeed-$DS_VERSION-$(echo "${PINS[*]}" | cksum | cut -d' ' -f1)

skip() {
  echo "SKIP: DeepSpeed $DS_VERSION oracle unavailable: $*" >&2
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
echo "dsc: installing DeepSpeed $DS_VERSION (pure Python) into $venv" >&2
"$py" -m pip install --disable-pip-version-check -q "${PINS[@]}" >"$log" 2>&1 ||
  skip "pip could not install ${PINS[*]} (no network?); see $log"
DS_BUILD_OPS=0 "$py" -m pip install --disable-pip-version-check -q --no-deps \
  --no-build-isolation "deepspeed==$DS_VERSION" >>"$log" 2>&1 ||
  skip "pip could not install deepspeed==$DS_VERSION (no network?); see $log"
"$py" -c 'from deepspeed.runtime.config import DeepSpeedConfig' >>"$log" 2>&1 ||
  skip "deepspeed $DS_VERSION installed but does not import; see $log"
touch "$stamp"
echo "$py"
