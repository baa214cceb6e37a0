#!/usr/bin/env python3
"""Checkpoints written by DeepSpeed 0.18.4's own engine, and what DeepSpeed gets when it resumes
them: the fixtures of tests/ckpt/test_ds_real.sh.

Two ranks on the CPU (DS_ACCELERATOR=cpu, gloo), a tiny LlamaForCausalLM and GPT2LMHeadModel
made by transformers, ZeRO stages 1, 2 and 3, fp32 and bf16 (twelve runs: every stage in
each precision for each family; RUN names select some), AdamW (torch's), WarmupLR,
gradient clipping 1.0. Each run trains steps 1-10, saves global_step10, trains on to step 20
(the run's own continuation), and then a fresh engine loads the checkpoint and trains steps
11-20 again (DeepSpeed's resume). Two of the checkpoints are also converted to DeepSpeed's
universal layout (ds_to_universal) and resumed from it with checkpoint.load_universal.

The batches are dsc's: the script reads the token shard it writes and orders the windows as
dsc's data loader does (src/data/loader.c: a Fisher-Yates permutation per epoch keyed by
--seed; step s takes samples (s-1)*G .. s*G-1 of the global batch G), so that dsc, resuming a
checkpoint with `--seed SEED`, sees the same batches at every step whatever its world size.

Writes OUT/data (train_000000.bin, dataset.json), OUT/tiny_llama and OUT/tiny_gpt2 (the Hugging
Face folders the runs start from), and per run OUT/<model>_z<stage>_<dtype>/: ds_config.json,
ckpt/ (latest, global_step10/, for two runs global_step10_universal/ and latest_universal) and
expect.json (per step: loss and learning rate of steps 1-20, and of the resumed steps 11-20;
and the logits of the stream's first 8 tokens from the saved fp32 weights, as DeepSpeed's
zero_to_fp32 hands them to transformers).

  DS_ACCELERATOR=cpu python3 tests/ckpt/ds_real/make_fixtures.py OUT [RUN...]
  DS_ACCELERATOR=cpu python3 tests/ckpt/ds_real/make_fixtures.py --continue OUT RUN EXPORT STAGE R

  DS_ACCELERATOR=cpu python3 tests/ckpt/ds_real/make_fixtures.py --gpt2-124m OUT

The second form is the other direction: DeepSpeed, at ZeRO stage STAGE on 2 ranks, loads EXPORT
(what `dsc ckpt export --deepspeed` wrote from a dsc run of fixture RUN) with
checkpoint.load_universal and trains 10 more steps; their losses and learning rates go to
R (JSON), which test_ds_real.sh compares with dsc's own continuation. The third saves one
ZeRO-3 bf16 step of a randomly initialised GPT-2 124M (OUT/gpt2_124m_z3, its config in
OUT/gpt2_124m), on which docs/performance.md measures the export's peak memory.

Needs torch >= 2, transformers and deepspeed 0.18.4 (its Python files are enough: no ops are
built). The suite does not run this script: it reads the committed output.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

WORLD = 2
T = 32            # sequence length
G = 6             # global batch (train_batch_size): 1 sample per rank and micro-step, 3 micro-steps
SEED = 1234       # dsc's --seed: the data order
STEPS = 10        # saved after this step; the runs go on to 2 * STEPS
VOCAB = 64
NTOK = 128 * T + 1
LOGIT_TOKENS = 8
MASK = (1 << 64) - 1
RUNS = tuple(f"{m}_z{z}_{d}" for m in ("llama", "gpt2") for z in (1, 2, 3)
             for d in ("fp32", "bf16"))
UNIVERSAL = ("llama_z2_bf16", "gpt2_z3_bf16")


# ---- dsc's data order (src/data/loader.c) ----

def mix64(x):
    x &= MASK
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & MASK
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & MASK
    return x ^ (x >> 31)


def permutation(n, seed, epoch):
    key = mix64(seed ^ mix64((epoch * 0x9e3779b97f4a7c15 + 0x5851f42d) & MASK))
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        r = mix64((key + i * 0x9e3779b97f4a7c15) & MASK)
        j = (r * (i + 1)) >> 64
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def make_tokens():
    """A learnable stream: phrases of a few fixed 'words' chosen by a seeded generator."""
    g = torch.Generator().manual_seed(7)
    words = [torch.randint(4, VOCAB, (int(k),), generator=g).tolist()
             for k in torch.randint(2, 6, (24,), generator=g)]
    out = []
    while len(out) < NTOK:
        out += words[int(torch.randint(0, len(words), (1,), generator=g))] + [1]
    return out[:NTOK]


def write_data(out):
    d = os.path.join(out, "data")
    os.makedirs(d, exist_ok=True)
    toks = make_tokens()
    header = [20240520, 1, len(toks)] + [0] * 253
    with open(os.path.join(d, "train_000000.bin"), "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(toks)}H", *toks))
    with open(os.path.join(d, "dataset.json"), "w") as f:
        json.dump({"vocab_size": VOCAB}, f)
    return toks


def batch(toks, step, rank, micro, micro_batch):
    """Inputs and targets of one rank's micro-batch at `step` (1-based), as dsc takes them."""
    nwin = (len(toks) - 1) // T
    gas = G // (micro_batch * WORLD)
    first = ((step - 1) * gas + micro) * micro_batch * WORLD + rank * micro_batch
    rows = []
    for k in range(micro_batch):
        g = first + k
        w = permutation(nwin, SEED, g // nwin)[g % nwin]
        rows.append(toks[w * T:w * T + T + 1])
    x = torch.tensor(rows, dtype=torch.long)
    return x[:, :-1], x[:, 1:]


# ---- models and configs ----

def make_models(out):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        attn_implementation="eager"))
    torch.manual_seed(1)
    gpt2 = GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager"))
    for name, m in (("tiny_llama", llama), ("tiny_gpt2", gpt2)):
        m.save_pretrained(os.path.join(out, name), safe_serialization=True)


def load_model(out, model):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(os.path.join(out, f"tiny_{model}"),
                                             attn_implementation="eager",
                                             torch_dtype=torch.float32)
    m.config.use_cache = False
    return m


def ds_config(stage, dtype, universal=False):
    c = {
        "train_batch_size": G,
        "train_micro_batch_size_per_gpu": 1,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                     "warmup_num_steps": 25,
                                                     "warmup_type": "linear"}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
    }
    if dtype == "bf16":
        c["bf16"] = {"enabled": True}
    if universal:
        c["checkpoint"] = {"load_universal": True}
    return c


def runs(only):
    out = []
    for model in ("llama", "gpt2"):
        for stage in (1, 2, 3):
            for dtype in ("fp32", "bf16"):
                name = f"{model}_z{stage}_{dtype}"
                if name in only or (not only and name in RUNS):
                    out.append((name, model, stage, dtype))
    return out


# ---- the ranks ----

def drop_copied_script(save_dir):
    """DeepSpeed copies its own zero_to_fp32.py beside every save: not part of the fixtures."""
    if dist.get_rank() == 0 and os.path.exists(os.path.join(save_dir, "zero_to_fp32.py")):
        os.remove(os.path.join(save_dir, "zero_to_fp32.py"))


def engine_for(out, model, cfg):
    import copy
    import deepspeed
    m = load_model(out, model)
    # A copy: initialize pops keys (torch_adam) from the dict it is given.
    eng, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(),
                                        config=copy.deepcopy(cfg))
    return eng


def train_steps(eng, toks, first, last):
    """Steps first..last; per step the global mean loss and the learning rate it used."""
    rows = []
    gas = eng.gradient_accumulation_steps()
    for step in range(first, last + 1):
        lr = eng.get_lr()[0]
        total = torch.zeros(1)
        for micro in range(gas):
            x, y = batch(toks, step, dist.get_rank(), micro, 1)
            logits = eng(input_ids=x).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            eng.backward(loss)
            eng.step()
            total += loss.detach().float()
        dist.all_reduce(total)
        rows.append({"step": step, "loss": total.item() / (gas * WORLD), "lr": lr})
    return rows


def join_ranks(rank, port):
    """This process as rank `rank` of WORLD on the CPU (gloo, two threads); DeepSpeed."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(2)
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def saved_logits(out, model, d, toks):
    """Logits of the first LOGIT_TOKENS tokens from the checkpoint's fp32 weights, as DeepSpeed's
    own converter (zero_to_fp32) gives them to the Hugging Face model."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    sd = get_fp32_state_dict_from_zero_checkpoint(os.path.join(d, "ckpt"), f"global_step{STEPS}")
    m = load_model(out, model)
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    with torch.no_grad():
        x = torch.tensor([toks[:LOGIT_TOKENS]])
        return m(input_ids=x).logits[0].tolist()


def rank_main(rank, out, todo, port):
    join_ranks(rank, port)
    toks = make_tokens()
    for name, model, stage, dtype in todo:
        d = os.path.join(out, name)
        cfg = ds_config(stage, dtype)
        eng = engine_for(out, model, cfg)
        first = train_steps(eng, toks, 1, STEPS)
        eng.save_checkpoint(os.path.join(d, "ckpt"), tag=f"global_step{STEPS}")
        drop_copied_script(os.path.join(d, "ckpt"))
        cont = train_steps(eng, toks, STEPS + 1, 2 * STEPS)
        del eng
        eng = engine_for(out, model, cfg)
        path, _ = eng.load_checkpoint(os.path.join(d, "ckpt"))
        assert path is not None, name
        resumed = train_steps(eng, toks, STEPS + 1, 2 * STEPS)
        del eng
        if rank == 0:
            with open(os.path.join(d, "ds_config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            with open(os.path.join(d, "expect.json"), "w") as f:
                json.dump({"steps": first + cont, "resumed": resumed,
                           "logits": saved_logits(out, model, d, toks)}, f, indent=1)
        dist.barrier()


def universal_main(rank, out, todo, port):
    """Resume each universal checkpoint at world 2 (DeepSpeed's own reading of the layout)."""
    join_ranks(rank, port)
    toks = make_tokens()
    for name, model, stage, dtype in todo:
        d = os.path.join(out, name)
        eng = engine_for(out, model, ds_config(stage, dtype, universal=True))
        path, _ = eng.load_checkpoint(os.path.join(d, "ckpt"))
        assert path is not None, name
        resumed = train_steps(eng, toks, STEPS + 1, 2 * STEPS)
        del eng
        if rank == 0:
            p = os.path.join(d, "expect.json")
            e = json.load(open(p))
            e["resumed_universal"] = resumed
            with open(p, "w") as f:
                json.dump(e, f, indent=1)
        dist.barrier()


def continue_main(rank, out, name, export_dir, stage, port, result):
    """DeepSpeed loads dsc's export (a universal checkpoint) and trains 10 more steps."""
    join_ranks(rank, port)
    toks = make_tokens()
    model, _, dtype = name.split("_")
    cfg = ds_config(stage, dtype, universal=True)
    eng = engine_for(out, model, cfg)
    path, _ = eng.load_checkpoint(export_dir)
    assert path is not None, export_dir
    first = eng.global_steps + 1
    rows = train_steps(eng, toks, first, first + STEPS - 1)
    if rank == 0:
        with open(result, "w") as f:
            json.dump(rows, f, indent=1)


def big_main(rank, out, port):
    """GPT-2 124M, ZeRO-3 bf16 on 2 ranks, one step, saved: a checkpoint of a few GB."""
    from transformers import GPT2Config, GPT2LMHeadModel
    deepspeed = join_ranks(rank, port)
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config())
    if rank == 0:
        m.config.save_pretrained(os.path.join(out, "gpt2_124m"))
    cfg = dict(ds_config(3, "bf16"), train_batch_size=2)
    eng, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
    x = torch.randint(0, 50257, (1, T + 1))
    logits = eng(input_ids=x[:, :-1]).logits
    eng.backward(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[0, 1:]))
    eng.step()
    eng.save_checkpoint(os.path.join(out, "gpt2_124m_z3"), tag="global_step1")
    drop_copied_script(os.path.join(out, "gpt2_124m_z3"))


def run_group(out, todo, port):
    """One pair of ranks for the runs in todo, then their universal conversions and resumes."""
    import torch.multiprocessing as mp
    mp.spawn(rank_main, args=(out, todo, port), nprocs=WORLD, join=True)
    uni = [r for r in todo if r[0] in UNIVERSAL]
    for name, *_ in uni:
        ck = os.path.join(out, name, "ckpt")
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", os.path.join(ck, f"global_step{STEPS}"),
                        "--output_folder", os.path.join(ck, f"global_step{STEPS}_universal"),
                        "--inject_missing_state"], check=True, stdout=subprocess.DEVNULL)
    if uni:
        mp.spawn(universal_main, args=(out, uni, port + 1), nprocs=WORLD, join=True)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if sys.argv[1] == "--continue":  # --continue OUT RUN EXPORT_DIR STAGE RESULT.json
        out, name, export_dir, stage, result = sys.argv[2:7]
        import torch.multiprocessing as mp
        mp.spawn(continue_main, args=(out, name, export_dir, int(stage), 29651, result),
                 nprocs=WORLD, join=True)
        return
    if sys.argv[1] == "--gpt2-124m":  # --gpt2-124m OUT
        import torch.multiprocessing as mp
        mp.spawn(big_main, args=(sys.argv[2], 29661), nprocs=WORLD, join=True)
        return
    if sys.argv[1] == "--group":  # a child of main: --group OUT PORT RUN...
        out, port, names = sys.argv[2], int(sys.argv[3]), set(sys.argv[4:])
        run_group(out, runs(names), port)
        return
    out, only = sys.argv[1], set(sys.argv[2:])
    os.makedirs(out, exist_ok=True)
    write_data(out)
    make_models(out)
    todo = runs(only)
    for name, *_ in todo:
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        os.makedirs(os.path.join(out, name))
    # The runs in parallel, a pair of ranks each.
    kids = [subprocess.Popen([sys.executable, __file__, "--group", out, str(29600 + 4 * k), name])
            for k, (name, *_) in enumerate(todo)]
    if any(k.wait() for k in kids):
        sys.exit("a run failed")
    for name, *_ in todo:
        e = json.load(open(os.path.join(out, name, "expect.json")))
        worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(e["steps"][STEPS:], e["resumed"]))
        line = (f"{name}: loss {e['steps'][0]['loss']:.4f} -> {e['steps'][-1]['loss']:.4f}; "
                f"resume vs continuation: max |d loss| {worst:.3g}")
        if "resumed_universal" in e:
            u = max(abs(a["loss"] - b["loss"])
                    for a, b in zip(e["resumed"], e["resumed_universal"]))
            line += f"; universal resume vs resume: {u:.3g}"
        print(line)


if __name__ == "__main__":
    main()
