#!/usr/bin/env bash
# The drop-in case: `dsc launch --num_procs 2 /usr/bin/python3 script.py` where the script uses
# torch.distributed with env:// (init_process_group("gloo")) and all-reduces a tensor.
set -u
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
MARK="dsclaunchtorch$$x$RANDOM"
cleanup() {
  pkill -9 -f "$MARK" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
PY=/usr/bin/python3
if ! "$PY" -c 'import torch.distributed as d; assert d.is_available()' 2>/dev/null; then
  echo "SKIP: $PY cannot import torch.distributed (Debian: apt-get install python3-torch)"
  exit 77
fi
cd "$T" || exit 1
PORT=$((26000 + $$ % 5000))

cat > "$T/allreduce.py" <<'EOF'
import argparse, os, sys
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, required=True)  # appended by the launcher
p.add_argument("--tag", default="")
args = p.parse_args()
dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
assert args.local_rank == int(os.environ["LOCAL_RANK"])
t = torch.arange(4, dtype=torch.float64) + 10 * rank
dist.all_reduce(t)
want = torch.arange(4, dtype=torch.float64) * world + 10 * world * (world - 1) / 2
ok = torch.equal(t, want)
print(f"allreduce rank={rank} world={world} local_rank={args.local_rank} tag={args.tag} "
      f"sum={t.tolist()} ok={ok}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if ok else 1)
EOF

for n in 2 3; do
  "$DSC" launch --num_procs $n --master_port $PORT "$PY" "$T/allreduce.py" --tag "$MARK" \
    > "$T/out$n" 2>&1
  rc=$?
  check "torch gloo all_reduce over $n ranks exits 0 (got $rc)" -- test $rc -eq 0
  check "all $n ranks got the right sum" -- test "$(grep -c 'ok=True' "$T/out$n")" -eq $n
  [ $rc -eq 0 ] || cat "$T/out$n"
  PORT=$((PORT + 1))
done
grep -q "sum=\[30.0, 33.0, 36.0, 39.0\]" "$T/out3"
check "3 ranks: sum is [30, 33, 36, 39]" -- test $? -eq 0

no_leftovers() { ! pgrep -f "$MARK" > /dev/null; }
check "no process left" -- no_leftovers
finish
