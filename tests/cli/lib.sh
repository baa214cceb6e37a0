# Shared helpers for the shell tests: expect exit codes and output, count results.
# Needs $DSC (the dsc binary). Each test file ends with `finish`.
pass=0
failed=0
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# expect CODE NEEDLE -- command...: run, check the exit code and that stdout+stderr has NEEDLE.
expect() {
  local code=$1 needle=$2
  shift 3
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: $* -> exit $rc, expected $code"; echo "$out" | head -20; failed=$((failed+1)); return
  fi
  if [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL: $* -> output lacks '$needle'"; echo "$out" | head -20; failed=$((failed+1)); return
  fi
  pass=$((pass+1))
}

check() { # check DESCRIPTION -- command...: passes when the command succeeds
  local what=$1
  shift 2
  if "$@"; then pass=$((pass+1)); else echo "FAIL: $what"; failed=$((failed+1)); fi
}

finish() {
  echo "$pass passed, $failed failed"
  [ "$failed" -eq 0 ]
}

# free_port: a TCP port nobody holds now, drawn below the kernel's ephemeral range: a port the
# kernel hands out may be taken, between the pick and the server's bind, by the local end of some
# other test's connection (rank to store), which no SO_REUSEADDR can share.
free_port() {
  /usr/bin/python3 -c '
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    p = random.randrange(10000, max(lo, 10001))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p)); s.close(); print(p); break
    except OSError:
        s.close()
else:
    raise SystemExit("free_port: no free port below the ephemeral range")'
}
