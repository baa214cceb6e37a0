#!/usr/bin/env bash
# The memory plan against what dsc train really holds: the plan printed in the banner (host bytes
# per rank) is within 10% of each rank's peak resident size, in several modes (stages 0-3, fp32
# and bf16, one and two ranks, gradient accumulation, fault-tolerance snapshots); a run that
# does not fit is refused before it allocates, naming both numbers and what would fit.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=1
# 23.7 M parameters: the model states (hundreds of MiB) outweigh the process itself
run=(--model llama-d8 --seq-len 64 --sample-tokens 0 --eval-every 0 --max-steps 2 --device cpu)
cfg() { # cfg FILE STAGE PRECISION GAS
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": $4,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "$3": {"enabled": true},
 "zero_optimization": {"stage": $2}}
JSON
}

# plan_bytes LOG: the banner's host bytes per rank, from "host N MiB|GiB of"
plan_bytes() {
  sed -n 's/.*memory plan per rank.*: host \([0-9.]*\) \(MiB\|GiB\) of.*/\1 \2/p' "$1" | head -1 |
    awk '{ print ($2 == "GiB") ? $1 * 1073741824 : $1 * 1048576 }'
}

# within10 NAME PLAN MEASURED_KB: |plan - measured| <= 10% of measured
within10() {
  awk -v p="$2" -v m="$(( $3 * 1024 ))" -v n="$1" 'BEGIN {
    d = (p - m) / m; printf "%s: plan %.1f MiB, measured peak %.1f MiB (%+.1f%%)\n", n,
    p / 1048576, m / 1048576, 100 * d; exit (d > 0.10 || d < -0.10) }'
}

run1() { # run1 NAME CONFIG [flags...]: one rank
  local name=$1 conf=$2
  shift 2
  /usr/bin/time -f "maxrss_kb %M" -o "$T/$name.0.rss" timeout 600 "$DSC" train "${run[@]}" \
    --config "$conf" --out "$T/$name" "$@" > "$T/$name.0.log" 2>&1 ||
    { tail -5 "$T/$name.0.log"; return 1; }
  check_rank "$name" 0 "$T/$name.0.log"
}

run2() { # run2 NAME CONFIG: two ranks (shm), each measured
  local port pids=() r rc=0
  port=$(free_port)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port /usr/bin/time -f "maxrss_kb %M" -o "$T/$1.$r.rss" timeout 600 \
      "$DSC" train "${run[@]}" --config "$2" --out "$T/$1" > "$T/$1.$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc -eq 0 ] || { echo "run $1 failed:"; tail -5 "$T/$1".*.log; return 1; }
  # rank 0 prints the plan; every rank's plan is the same (equal partitions)
  check_rank "$1" 0 "$T/$1.0.log" && check_rank "$1" 1 "$T/$1.0.log"
}

check_rank() { # check_rank NAME RANK LOG-WITH-PLAN
  local p m
  p=$(plan_bytes "$3")
  m=$(sed -n 's/^maxrss_kb //p' "$T/$1.$2.rss")
  [ -n "$p" ] && [ -n "$m" ] || { echo "$1: no plan or no peak"; return 1; }
  within10 "$1 rank $2" "$p" "$m"
}

fp32() { sed -i 's/"\(bf16\|fp16\)": {"enabled": true}/"bf16": {"enabled": false}/' "$1"; }
cfg "$T/s0.json" 0 bf16 1 && fp32 "$T/s0.json"
cfg "$T/s2b.json" 2 bf16 1
cfg "$T/s1g.json" 1 bf16 2
cfg "$T/s3b.json" 3 bf16 1
cfg "$T/s3f.json" 3 bf16 2 && fp32 "$T/s3f.json"

check "one rank, stage 0, fp32" -- run1 s0 "$T/s0.json"
check "one rank, stage 2, bf16" -- run1 s2b "$T/s2b.json"
check "two ranks, stage 0, fp32 (fault-tolerance snapshots)" -- run2 r2s0 "$T/s0.json"
check "two ranks, stage 1, bf16, accumulation 2" -- run2 r2s1 "$T/s1g.json"
check "two ranks, stage 3, bf16" -- run2 r2s3 "$T/s3b.json"
check "two ranks, stage 3, fp32, accumulation 2" -- run2 r2s3f "$T/s3f.json"
# LoRA at ZeRO stage 3 on two ranks: the frozen base is partitioned (each rank keeps its half
# and its buddy's half for fault tolerance, a layer's base gathered per use); measured against
# the plan as above. Planned for four ranks, stage 3 keeps a quarter of the base that stage 2 holds
# whole on every rank, and a quarter more as its buddy's replica.
sed 's/"zero_optimization"/"lora": {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"}, "zero_optimization"/' \
  "$T/s3b.json" >"$T/l3.json"
sed 's/"stage": 3/"stage": 2/' "$T/l3.json" >"$T/l2.json"
check "two ranks, stage 3, bf16, LoRA (the base partitioned)" -- run2 r2l3 "$T/l3.json"
lora_parted_plan() {
  local c
  for c in l2 l3; do
    "$DSC" config check "$T/$c.json" --model llama-d8 --vocab-size 256 --seq-len 64 \
      --world-size 4 --json >"$T/$c.plan.json" || return 1
  done
  # the frozen base's parameters: all of them less the trainable ones, from the LoRA line
  base=$(sed -n 's/.*: \([0-9.]*\)M trainable parameters of \([0-9.]*\)M (the frozen base.*/\2 \1/p' \
    "$T/r2l3.0.log" | head -1 | awk '{ print $1 - $2 }')
  /usr/bin/python3 - "$T/l2.plan.json" "$T/l3.plan.json" "$base" <<'PY'
import json, sys
a, b = (json.load(open(f))['memory_plan'] for f in sys.argv[1:3])
base = float(sys.argv[3]) * 1e6 * 4  # fp32 bytes of the frozen base
w = (a['host']['weights'] - b['host']['weights']) / base
s = (b['host']['snapshots'] - a['host']['snapshots']) / base
print(f'LoRA on 4 ranks: stage 3 keeps {w:.3f} of the fp32 base less as weights, {s:.3f} more as '
      f'the buddy\'s replica; host {a["host_bytes"] / 2**20:.1f} -> {b["host_bytes"] / 2**20:.1f} MiB')
sys.exit(0 if 0.72 < w < 0.76 and 0.24 < s < 0.27 and b['host_bytes'] < a['host_bytes'] else 1)
PY
}
check "LoRA on four ranks: stage 3 plans a quarter of the frozen base and a quarter as the replica" -- lora_parted_plan

# A checkpoint at the end: the writer's snapshot and the validation's re-read count; an in-line
# save (checkpoint.async false) writes from the live state and needs no snapshot.
sed 's/"zero_optimization"/"checkpoint": {"async": false}, "zero_optimization"/' "$T/s2b.json" >"$T/s2sync.json"
check "one rank, stage 2, bf16, a checkpoint saved" -- run1 ck "$T/s2b.json" --save-dir "$T/ck.ck" --save-at-end
check "the same saved in line (checkpoint.async false)" -- run1 cksync "$T/s2sync.json" --save-dir "$T/cksync.ck" --save-at-end
snap_plan() { sed -n 's/.*memory plan per rank.*snapshots \([0-9.]*\) MiB.*/\1/p' "$1" | head -1; }
check "the in-line save plans less (no snapshot buffer)" -- awk -v a="$(snap_plan "$T/ck.0.log")" \
  -v b="$(snap_plan "$T/cksync.0.log")" 'BEGIN { print "snapshots planned: " a " MiB with the " \
  "async writer, " b " MiB in line"; exit !(a > 0 && b > 0 && b < a) }'
ck_cap=$(awk -v a="$(plan_bytes "$T/ck.0.log")" -v b="$(plan_bytes "$T/cksync.0.log")" \
  'BEGIN { printf "%d", (a + b) / 2 / 1048576 }') # between the two plans
DSC_HOST_MEM_LIMIT=${ck_cap}M expect 1 "would fit: checkpoint.async false" -- "$DSC" train "${run[@]}" \
  --config "$T/s2b.json" --save-dir "$T/refused.ck" --save-at-end --out "$T/refused_ck"
check "the in-line save holds less at its peak" -- awk -v a="$(sed -n 's/^maxrss_kb //p' "$T/ck.0.rss")" \
  -v b="$(sed -n 's/^maxrss_kb //p' "$T/cksync.0.rss")" 'BEGIN { exit !(b < a) }'

# Refused before allocating: the cap is below the plan; the message names both numbers and
# settings that would fit (here a smaller micro batch: the activations of 32 x 64 tokens are
# most of the plan), and nothing ran (no metrics were written).
cfg "$T/small.json" 0 bf16 1
cfg "$T/big.json" 0 bf16 1
sed -i 's/"train_micro_batch_size_per_gpu": 4/"train_micro_batch_size_per_gpu": 32/' "$T/big.json"
host_plan() { # host bytes per rank of llama-d8 at T 64 with CONFIG, as dsc config check plans it
  "$DSC" config check "$1" --model llama-d8 --vocab-size 256 --seq-len 64 --json |
    /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["memory_plan"]["host_bytes"])'
}
# The cap lies halfway between the plans of micro batch 4 and 32 (about 500 MiB apart), so that
# what the process itself holds (more threads, more libraries on another machine) moves neither
# across it.
cap_mib=$(( ($(host_plan "$T/small.json") + $(host_plan "$T/big.json")) / 2 / 1048576 ))
DSC_HOST_MEM_LIMIT=${cap_mib}M expect 1 "of host memory per rank, $cap_mib MiB available" -- \
  "$DSC" train "${run[@]}" --config "$T/big.json" --out "$T/refused"
DSC_HOST_MEM_LIMIT=${cap_mib}M expect 1 "would fit: train_micro_batch_size_per_gpu" -- \
  "$DSC" train "${run[@]}" --config "$T/big.json" --out "$T/refused"
check "the refused run wrote no metrics" -- test ! -e "$T/refused/metrics.jsonl"
DSC_HOST_MEM_LIMIT=100M expect 1 "no mode dsc has today fits this machine" -- \
  "$DSC" train "${run[@]}" --config "$T/s0.json" --out "$T/refused"
# DSC_MEM_PLAN=warn starts it anyway
DSC_HOST_MEM_LIMIT=300M DSC_MEM_PLAN=warn expect 0 "DSC_MEM_PLAN=warn: starting anyway" -- \
  "$DSC" train "${run[@]}" --config "$T/s0.json" --out "$T/warned"

# dsc config check --model prints the same plan; --json adds memory_plan with the per-rank bytes
expect 0 "# memory plan per rank (CPU, ZeRO stage 0" -- \
  "$DSC" config check "$T/s0.json" --model llama-d8 --vocab-size 256 --seq-len 64
cfg "$T/off.json" 2 bf16 1
sed -i 's/"stage": 2}/"stage": 2, "offload_optimizer": {"device": "cpu"}}/' "$T/off.json"
plan_json() { # plan_json CONFIG DEVICE: "host device params" of llama-3.1-8B at T 2048
  "$DSC" config check "$1" --model llama-3.1-8B --device "$2" --seq-len 2048 --json |
    /usr/bin/python3 -c 'import json, sys; p = json.load(sys.stdin)["memory_plan"];
print(p["host_bytes"], p["device_bytes"], p["parameters"])'
}
offload_per_param() { # the host holds master and moments (12 B) and four group-sized slots
  local h d n
  read -r h d n <<<"$(plan_json "$T/off.json" cuda)"
  awk -v h="$h" -v n="$n" 'BEGIN { printf "ZeRO-Offload 8B: %.1f host bytes per parameter\n",
    h / n; exit !(h / n >= 12 && h / n < 13.5) }'
}
cfg "$T/gpu.json" 1 bf16 1
sed 's/"bf16": {"enabled": true}/"bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true}/' \
  "$T/gpu.json" >"$T/gpu16.json"
device_per_param() { # model states: fp32 master 4 + gradients 4 + bf16 weights 2 + moments 8 =
  # 18 bytes a parameter; bf16 master, gradients and moments: 2 + 2 + 4 = 8, plus the fp32
  # gradient scratch of the end groups and two layer slots (0.74 for 8B; activations apart)
  local f
  for f in gpu gpu16; do
    "$DSC" config check "$T/$f.json" --model llama-3.1-8B --device cuda --seq-len 2048 --json \
      >"$T/$f.plan.json" || return 1
  done
  /usr/bin/python3 - "$T/gpu.plan.json" "$T/gpu16.plan.json" <<'PY'
import json, sys
def states(f):
    p = json.load(open(f))['memory_plan']
    d = p['device']
    return sum(d[k] for k in ('weights', 'master', 'moments', 'gradients')) / p['parameters']
a, b = states(sys.argv[1]), states(sys.argv[2])
print(f'GPU-resident 8B model states: {a:.2f} device bytes per parameter with an fp32 master, '
      f'{b:.2f} with bf16 master and moments')
sys.exit(0 if 17.9 < a < 18.1 and 8.6 < b < 8.9 else 1)
PY
}
check "GPU-resident llama-3.1-8B: bf16 master and moments save 8 device bytes per parameter" -- device_per_param
resident_host() { # the GPU-resident state has no host copy: staging and the process only;
  # with DSC_DEVICE_STATE=0 master and moments are kept there too (12 bytes a parameter)
  local h d n h0
  read -r h d n <<<"$(plan_json "$T/gpu.json" cuda)"
  read -r h0 d n <<<"$(DSC_DEVICE_STATE=0 plan_json "$T/gpu.json" cuda)"
  awk -v h="$h" -v h0="$h0" -v n="$n" 'BEGIN { printf "GPU-resident 8B host plan: %.2f GiB, " \
    "%.1f bytes per parameter with the host copy\n", h / 2^30, h0 / n;
    exit !(h < 2^31 && h0 / n >= 12 && h0 / n < 12.5) }'
}
check "GPU-resident llama-3.1-8B: the host plan is under 2 GiB (12 bytes a parameter with DSC_DEVICE_STATE=0)" -- resident_host
cpu_no_device() {
  local h d n
  read -r h d n <<<"$(plan_json "$T/s0.json" cpu)"
  [ "$d" = 0 ] && [ "$h" -gt 0 ]
}
check "ZeRO-Offload of llama-3.1-8B: 12-13.5 bytes per parameter on the host" -- offload_per_param
check "a CPU plan has no device bytes" -- cpu_no_device
expect 1 "--device tpu: give cpu or cuda" -- "$DSC" config check "$T/s0.json" --model llama-d8 \
  --vocab-size 256 --device tpu
# activation_checkpointing.cpu_checkpointing on the GPU (llama-3.1-8B, micro batch 1, T 2048):
# the layers' inputs (32 x 2048 tokens x 4096 channels, bf16) move from the device to the host
cat >"$T/ac.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
 "activation_checkpointing": {"partition_activations": false}}
JSON
sed 's/"partition_activations": false/"partition_activations": false, "cpu_checkpointing": true/' \
  "$T/ac.json" >"$T/ach.json"
cpu_ckpt_moves() {
  local h0 d0 n0 h1 d1 n1
  read -r h0 d0 n0 <<<"$(plan_json "$T/ac.json" cuda)"
  read -r h1 d1 n1 <<<"$(plan_json "$T/ach.json" cuda)"
  local want=$((32 * 2048 * 4096 * 2)) got_h=$((h1 - h0)) got_d=$((d0 - d1))
  echo "cpu_checkpointing: host +$got_h, device -$got_d bytes (the inputs: $want)"
  [ "$got_h" = "$want" ] && [ "$got_d" -ge $((want * 29 / 33)) ] && [ "$got_d" -le "$want" ]
}
check "cpu_checkpointing: the plan moves the layers' inputs from the device to the host" -- cpu_ckpt_moves
# LoRA on one GPU (llama-3.1-8B, r 16 on every linear module): the frozen base in bf16 on the
# device (about 15 GiB of the 8.07B parameters) and no state for it; on the host nothing of it
# (with DSC_DEVICE_STATE=0 the engine's fp32 frozen store, about 30 GiB; measured on an H100:
# device 25.5 GiB, host 30.8 GiB).
cat >"$T/lora8.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
 "lora": {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}}
JSON
lora_gpu_plan() {
  local h d n h0
  read -r h d n <<<"$(plan_json "$T/lora8.json" cuda)"
  read -r h0 d n <<<"$(DSC_DEVICE_STATE=0 plan_json "$T/lora8.json" cuda)"
  awk -v h="$h" -v h0="$h0" -v d="$d" 'BEGIN { printf "LoRA 8B on a GPU: device %.1f GiB, " \
    "host %.2f GiB (%.1f GiB with the host copy)\n", d / 2^30, h / 2^30, h0 / 2^30;
    exit !(d / 2^30 > 24 && d / 2^30 < 27 && h < 2^31 && h0 / 2^30 > 29.5 && h0 / 2^30 < 32) }'
}
check "LoRA on a GPU: the plan counts the 16-bit base on the device and no state for it" -- lora_gpu_plan
# LoRA with ZeRO-Offload on a GPU: the base in 16 bits on the device, the adapters' master and
# moments on the host beside the engine's fp32 frozen store (29.9 GiB)
cat >"$T/lora8off.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
 "lora": {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}}
JSON
lora_offload_plan() {
  local h d n
  read -r h d n <<<"$(plan_json "$T/lora8off.json" cuda)"
  awk -v h="$h" -v d="$d" 'BEGIN { printf "LoRA 8B with ZeRO-Offload: device %.1f GiB, host " \
    "%.1f GiB\n", d / 2^30, h / 2^30; exit !(d / 2^30 > 23 && d / 2^30 < 27 && h / 2^30 > 29.9 &&
    h / 2^30 < 32) }'
}
check "LoRA with ZeRO-Offload on a GPU: the base on the device, the adapters' state on the host" -- lora_offload_plan
# ... and with offload_param: the layers' base streams from a 16-bit host copy (about 14 GiB more
# host memory), the device keeps the end groups' base and two layers' of it (from 15 GiB to under 3)
sed 's/"stage": 2, "offload_optimizer": {"device": "cpu"}/"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}/' \
  "$T/lora8off.json" >"$T/lora8offp.json"
lora_offload_param_plan() {
  local h0 d0 h1 d1 n
  read -r h0 d0 n <<<"$(plan_json "$T/lora8off.json" cuda)"
  read -r h1 d1 n <<<"$(plan_json "$T/lora8offp.json" cuda)"
  awk -v h0="$h0" -v d0="$d0" -v h1="$h1" -v d1="$d1" 'BEGIN { printf "LoRA 8B with " \
    "offload_param: device %.1f -> %.1f GiB, host %.1f -> %.1f GiB\n", d0 / 2^30, d1 / 2^30,
    h0 / 2^30, h1 / 2^30; exit !((d0 - d1) / 2^30 > 11.5 && (d0 - d1) / 2^30 < 13.5 &&
    (h1 - h0) / 2^30 > 13 && (h1 - h0) / 2^30 < 15) }'
}
check "LoRA with offload_param on a GPU: the layers' base planned on the host, not the device" -- lora_offload_param_plan
check "GPT-2 LoRA on a GPU (its device passes take adapters): planned" -- "$DSC" config check \
  "$T/lora8.json" --model gpt2-124M --device cuda
finish
