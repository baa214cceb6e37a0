#!/usr/bin/env bash
# Install what dsc needs to build and test, from Debian's packages; a no-op when all is present.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libjansson-dev libcmocka-dev libopenblas-dev
      libxxhash-dev libmicrohttpd-dev libopenmpi-dev openmpi-bin librsvg2-bin
      python3 python3-numpy python3-torch python3-venv python3-pip)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "dsc: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "dsc: need root to install packages (run as root or with sudo)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
