"""GPU head-to-head of activation memory strategies on a Hugging Face Llama-like model.

    python bench/python/gpu_head_to_head.py --out /tmp/smoke.json                      # CPU, tiny
    python bench/python/gpu_head_to_head.py --device cuda --hidden 4096 --heads 32 --kv-heads 8 \
        --intermediate 14336 --layers 8 --seq 8192 --dtype bfloat16 --out head_to_head_gpu.json

The GPU rows of issue 16, at one length per run (its one GPU run, 2026-12-04, at 8 layers and 8k
tokens, measured the weights more than the activations; issue 50's GPU calls in
scripts/gpu-check.sh run bench/python/longest_sequence.py instead, so this runs by hand); the CPU
head-to-head against axolotl's Disco under memory cgroups is bench/python/head_to_head.py. Both
stay separate: the CPU one's modes, cgroups and searches mean nothing on a GPU, and this one's
device peak and save_on_cpu mode nothing on a CPU. tests/python/test_gpu_scripts.py runs this
script on the CPU at a tiny size, so it cannot rot unseen.

Modes, each in a fresh process (host peak RSS is per process): none (no checkpointing),
hf_checkpointing (transformers' gradient checkpointing), hf_offload (the same inside
torch.autograd.graph.save_on_cpu(pin_memory=True): what HF users pick to offload today),
spillarena_direct (spillarena.enable with an O_DIRECT arena), spillarena_gds (io="gds"; only
where libcufile and a GPU are present — otherwise reported as skipped with the reason).
Per mode: step time (median of the timed steps after one warm-up), device peak (CUDA), host peak
RSS (VmHWM of the mode's process), bytes spilled per step, the losses of every step — and whether
they equal the first mode's bit for bit. Random weights from a fixed seed; nothing is downloaded.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h2h_support  # VmHWM, as the CPU head-to-head reads it

MODES = ("none", "hf_checkpointing", "hf_offload", "spillarena_direct", "spillarena_gds")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--spill-dir", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--append", action="store_true",
                   help="add this run to the runs already in --out (one file for several lengths)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "seq", "batch",
                 "steps"):
        if not 1 <= getattr(args, name) <= 1 << 20:
            p.error(f"--{name.replace('_', '-')} must be between 1 and 1048576")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        p.error(f"unknown mode(s) {sorted(unknown)}; choose from {','.join(MODES)}")
    return args


def build_model(args, torch):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=args.seq, attention_dropout=0.0, use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=args.device, dtype=getattr(torch, args.dtype))
    model.train()
    return model


def run_child(args):
    import torch

    import spillarena

    mode = args.child
    model = build_model(args, torch)
    arena = None
    if mode.startswith("spillarena"):
        element = torch.tensor([], dtype=getattr(torch, args.dtype)).element_size()
        capacity = spillarena.bytes_for_layer_inputs(args.layers,
                                                     (args.batch, args.seq, args.hidden), element)
        io = "gds" if mode == "spillarena_gds" else "direct"
        try:
            arena = spillarena.SpillArena(capacity, args.spill_dir, io=io, keep_last=0)
        except spillarena.Error as e:
            return {"mode": mode, "skipped": str(e)}
        spillarena.enable(model, arena)
    elif mode != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
    cuda = args.device.startswith("cuda")
    times, losses = [], []
    written = 0
    for step in range(args.steps + 1):
        if step == 1:
            written = arena.stats()["bytes_written"] if arena else 0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        if mode == "hf_offload":
            with torch.autograd.graph.save_on_cpu(pin_memory=cuda):
                loss = model(input_ids=ids, labels=ids).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        if step > 0:
            times.append(time.perf_counter() - start)
        losses.append(loss.item())
        model.zero_grad(set_to_none=True)
    result = {"mode": mode, "step_s": statistics.median(times), "losses": losses,
              "host_peak_rss_bytes": h2h_support.status_bytes("VmHWM"),
              "device_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None}
    if arena:
        result["spilled_bytes_per_step"] = (arena.stats()["bytes_written"] - written) / args.steps
        result["stash_stats"] = arena.stash_stats()
        result["io_note"] = arena.stats()["io_note"]
    return result


def run_mode(mode, argv):
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", mode]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        failed = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"mode": mode, "failed": failed}
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_arguments(argv, spill):
    """The parent's arguments without those only it uses (--out FILE, --append, --spill-dir DIR)."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--out", "--spill-dir"):
            skip = True
        elif a != "--append" and not a.startswith(("--out=", "--spill-dir=")):
            kept.append(a)
    return kept + ["--spill-dir", spill]


def write_report(args, previous_runs, results):
    """Rewritten after every mode, so a run cut short by a timeout keeps what it measured."""
    reference = next((r["losses"] for r in results if "losses" in r), None)
    for r in results:
        if "losses" in r:
            r["losses_equal_to_first"] = r["losses"] == reference
    if args.out:
        runs = previous_runs + [{"args": vars(args), "results": results}]
        with open(args.out + ".tmp", "w") as out:
            out.write(json.dumps({"runs": runs}, indent=1) + "\n")
        os.replace(args.out + ".tmp", args.out)


def main(argv):
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)))
        return 0
    import spillarena  # only for the default spill directory (never tmpfs)

    previous_runs = []
    if args.append and args.out and os.path.exists(args.out):
        with open(args.out) as previous:
            previous_runs = json.load(previous)["runs"]
    parent = args.spill_dir or spillarena.default_spill_directory()
    results = []
    with tempfile.TemporaryDirectory(prefix="spillarena-h2h-", dir=parent) as spill:
        for mode in args.modes.split(","):
            results.append(run_mode(mode, child_arguments(argv, spill)))
            write_report(args, previous_runs, results)
    for r in results:
        if "step_s" in r:
            print(f"{r['mode']:18s} step {r['step_s'] * 1e3:8.1f} ms"
                  f"  host peak {r['host_peak_rss_bytes'] / 2**20:8.1f} MiB"
                  f"  spilled {r.get('spilled_bytes_per_step', 0) / 2**20:7.1f} MiB"
                  f"  losses equal: {r['losses_equal_to_first']}")
        else:
            print(f"{r['mode']:18s} {r.get('skipped') or r.get('failed')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
