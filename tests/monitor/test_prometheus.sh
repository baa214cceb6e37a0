#!/usr/bin/env bash
# The Prometheus endpoint of a running `dsc train`: scraped twice over HTTP on 127.0.0.1, parsed
# strictly by prom_check.py, and linted by `promtool check metrics` where Debian's prometheus
# package provides promtool. Only the loopback address is used; the trainer is stopped at the end.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$src/tests/cli/lib.sh"
PY=${PYTHON:-python3}

# GET 127.0.0.1:$1$2 into $3 with bash's /dev/tcp (no client needed); the body only.
scrape() {
  local port=$1 path=$2 out=$3
  exec 9<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&9
  cat <&9 >"$out.raw"
  exec 9<&-
  sed -e '1,/^\r$/d' "$out.raw" >"$out"
  head -1 "$out.raw" | tr -d '\r' >"$out.status"
}

pid=
stop_trainer() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=; }
trap 'stop_trainer; rm -rf "$T"' EXIT

# A free port: a few tries at random high ports (a busy one makes dsc exit at start).
up=0
for try in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 30000))
  printf '{ "train_batch_size": 4, "prometheus": {"enabled": true, "port": %d} }\n' "$port" >"$T/ds.json"
  "$DSC" train --config "$T/ds.json" --model d1 --seq-len 16 --max-steps 1000000 --eval-every 0 \
    --sample-tokens 0 --threads 1 --out "$T/run" >"$T/train.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do # up to 20 s for the first step
    if scrape "$port" /metrics "$T/m1" 2>/dev/null && grep -q '^dsc_step{rank="0"} [1-9]' "$T/m1"; then
      up=1
      break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  [ "$up" = 1 ] && break
  stop_trainer
done
if [ "$up" != 1 ]; then
  echo "FAIL: no metrics served; trainer output:"; tail -5 "$T/train.log"; failed=$((failed+1))
  finish
  exit
fi
sleep 0.5
scrape "$port" /metrics "$T/m2"
check "HTTP 200 on /metrics" -- grep -q " 200 " "$T/m2.status"
check "Content-Type is the text exposition format 0.0.4" -- grep -qi "^Content-Type: text/plain; version=0.0.4" "$T/m2.raw"
check "both scrapes parse; families present; step advances" -- "$PY" "$src/tests/monitor/prom_check.py" "$T/m1" "$T/m2" 0
scrape "$port" /nothing "$T/m3"
check "404 for other paths" -- grep -q " 404 " "$T/m3.status"
if command -v promtool >/dev/null; then
  check "promtool check metrics accepts the page" -- bash -c "promtool check metrics <'$T/m2'"
else
  echo "note: promtool not installed (Debian package prometheus); lint skipped"
fi
stop_trainer
check "the port is closed once the trainer has stopped" -- bash -c "! (exec 9<>/dev/tcp/127.0.0.1/$port) 2>/dev/null"
finish
