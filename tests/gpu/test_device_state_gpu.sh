#!/usr/bin/env bash
# DSC_DEVICE_STATE=1 (the default): one GPU with the optimizer on it keeps no host copy of the
# master weights and moments (nor LoRA's frozen base): the initial weights go to the device in
# pieces, checkpoints are written from it and loaded into it piece by piece, --dump-weights,
# --dump-grads, exports and the closing sample read it tensor by tensor. Against the same runs
# with the host copy (DSC_DEVICE_STATE=0), for GPT-2 and Llama in bf16 (fp32 master), with the
# bf16 master keys, in fp16 and with LoRA: the metrics, the checkpoints' shards, --dump-weights
# and --dump-grads are bit for bit the same; a resume from the device's checkpoint continues bit
# for bit; weights from a file (--init-weights) start the same run. The banner and the memory
# plan say where the state is. Exit 77 (skipped) when no CUDA device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # cfg, run_one, cols
gpu_or_skip
CK='"checkpoint": {"interval_steps": 5}'
cfg "$T/bf16.json" ", \"bf16\": {\"enabled\": true}, $CK"
cfg "$T/m16.json" ", \"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true, \"bf16_optimizer_states\": true}, \"zero_optimization\": {\"stage\": 1}, $CK"
cfg "$T/fp16.json" ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 12}, $CK"
cfg "$T/lora.json" ", \"bf16\": {\"enabled\": true}, \"lora\": {\"r\": 8, \"lora_alpha\": 16, \"target_modules\": \"all-linear\"}, $CK"

# same NAME: the two runs' metrics, step-10 shards and dumped weights are identical
same() {
    local a="$T/${1}_host" b="$T/${1}_dev"
    check "$1: 10 steps bitwise with and without the host copy" -- diff <(cols "$a/metrics.jsonl") <(cols "$b/metrics.jsonl")
    check "$1: the step-10 checkpoint's shards are the same bytes" -- $PY - "$a/ck" "$b/ck" <<'PYEOF'
import os, sys, filecmp
a, b = (os.path.join(d, "global_step10") for d in sys.argv[1:3])
shards = [f for f in os.listdir(a) if f.endswith(".safetensors")]
assert shards and sorted(shards) == sorted(f for f in os.listdir(b) if f.endswith(".safetensors"))
for f in shards:
    assert filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False), f
PYEOF
    check "$1: --dump-weights the same" -- cmp "$a.safetensors" "$b.safetensors"
}

for run in d2:bf16 llama-d2:bf16 llama-d2:m16 llama-d2:fp16 llama-d2:lora; do
    m=${run%%:*} c=${run#*:} name=${run//:/_}
    DSC_DEVICE_STATE=0 MODEL=$m run_one "${name}_host" cuda "$T/$c.json" 10 --save-dir "$T/${name}_host/ck" --dump-weights "$T/${name}_host.safetensors"
    DSC_DEVICE_STATE=1 MODEL=$m run_one "${name}_dev" cuda "$T/$c.json" 10 --save-dir "$T/${name}_dev/ck" --dump-weights "$T/${name}_dev.safetensors"
    same "$name"
done
check "the banner says the host keeps no copy" -- grep -q "no host copy: checkpoints read it from the device" "$T/llama-d2_bf16_dev.log"
check "... and the plan too" -- grep -q "no host copy of master or moments" "$T/llama-d2_bf16_dev.log"
for s in 0 1; do
    DSC_DEVICE_STATE=$s MODEL=llama-d2 run_one "sample$s" cuda "$T/bf16.json" 2 --sample-tokens 16
    awk '/^sample \(temperature/ { f = 1 } f { print; if (/^----$/ && ++n == 2) exit }' \
        "$T/sample$s.log" > "$T/sample$s.txt"
done
check "the closing sample is read from the device's weights: the same text as from the host copy" -- \
    bash -c "grep -q temperature '$T/sample1.txt' && cmp '$T/sample0.txt' '$T/sample1.txt'"
check "without it the host keeps one" -- grep -q "host mirror of master and moments" "$T/llama-d2_bf16_host.log"

# --dump-grads reads the device's gradients tensor by tensor: the same file
for c in bf16 m16 lora; do
    for s in 0 1; do
        DSC_DEVICE_STATE=$s MODEL=llama-d2 run_one "g_${c}_$s" cuda "$T/$c.json" 1 --dump-grads "$T/g_${c}_$s.safetensors"
    done
    check "$c: --dump-grads bitwise with and without the host copy" -- cmp "$T/g_${c}_0.safetensors" "$T/g_${c}_1.safetensors"
done

# resume from the device's step-5 checkpoint: steps 6-10 and the final weights as the whole run
for c in bf16 m16; do
    rm -rf "$T/res_$c" && mkdir -p "$T/res_$c" && cp -r "$T/llama-d2_${c}_dev/ck" "$T/res_$c/ck"
    rm -rf "$T/res_$c/ck/global_step10"
    DSC_DEVICE_STATE=1 MODEL=llama-d2 run_one "res_$c" cuda "$T/$c.json" 10 --save-dir "$T/res_$c/ck" --resume global_step5 --dump-weights "$T/res_$c.safetensors"
    check "$c: resumed on the device at step 5, steps 6-10 bit for bit" -- diff <(cols "$T/llama-d2_${c}_dev/metrics.jsonl" | tail -5) <(cols "$T/res_$c/metrics.jsonl" | tail -5)
    check "$c: resumed weights bit for bit" -- cmp "$T/res_$c.safetensors" "$T/llama-d2_${c}_dev.safetensors"
done

# weights from a file go to the device in pieces, as they go to the host copy
"$DSC" ckpt export "$T/llama-d2_bf16_dev/ck/global_step10" --hf "$T/hf" > "$T/export.log" 2>&1
check "export --hf of the device's checkpoint" -- test -s "$T/hf/config.json"
for s in host dev; do
    DSC_DEVICE_STATE=$([ $s = dev ] && echo 1 || echo 0) MODEL=llama-d2 run_one "init_$s" cuda "$T/bf16.json" 3 --init-weights "$T/hf" --dump-weights "$T/init_$s.safetensors"
done
check "--init-weights: the weights after 3 steps bitwise with and without the host copy" -- cmp "$T/init_host.safetensors" "$T/init_dev.safetensors"
check "--init-weights: the same metrics" -- diff <(cols "$T/init_host/metrics.jsonl") <(cols "$T/init_dev/metrics.jsonl")
finish
