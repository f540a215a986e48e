"""What spilling more than the layer input buys (issue 51): five ways to train one Llama-like
model on the CPU, each in a process of its own, timed in one run.

    .venv/bin/python bench/python/offload_modes.py [--layers 8] [--seq 2048] [--batch 1]
        [--hidden 256] [--warmup 2] [--steps 3] [--rounds 3] [--dir /var/tmp] [--json out.json]
        [--modes offload,none] [--no-verify]

Modes: recompute (transformers' own non-reentrant checkpointing: every layer recomputed),
inputs (spillarena.enable: layer inputs to the disk arena, the rest recomputed),
inputs+attention (the same with selective_checkpoint_contexts(ATTENTION_OPS): attention's
outputs to the arena too, not recomputed), offload (spillarena.offload, no checkpointing: every
saved tensor of at least 64 KiB to the arena), none (no checkpointing). SDPA attention without
dropout: on the CPU its kernel is _scaled_dot_product_flash_attention_for_cpu. Each mode runs
--rounds times, in alternating order, each time in a fresh child with the same malloc policy
(GLIBC_TUNABLES mmap_threshold 128 KiB, so freed memory goes back and peaks mean something):
--warmup steps (the arena made and grown), then --steps timed ones. Per mode: the median step;
the peak RSS of the timed steps (VmHWM, reset after the warm-up) over the RSS before them, in
MiB, which counts the arena's mapped file pages too; and the peak of its anonymous memory (RssAnon,
sampled every 2 ms), what a memory limit cannot reclaim. Ratios: each mode's median step over
recompute's and over none's, and its fastest step over none's (noise on a shared machine only
adds time, so the fastest steps are the least disturbed); inputs+attention's step and anonymous
peak over inputs'.
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_args import count

from h2h_support import RssAnonSampler, status_bytes

MODES = ("recompute", "inputs", "inputs+attention", "offload", "none")


def _status_mib(field):
    value = status_bytes(field)
    return float("nan") if value is None else value / (1 << 20)


def _reset_peak_rss():
    """VmHWM back to the RSS of now (Linux: clear_refs 5), so the peak is the timed steps'."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def run_mode(args):
    """In the child: builds the model, trains, prints one JSON line."""
    import torch
    import transformers

    import spillarena

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=args.hidden,
                                   intermediate_size=args.hidden * 8 // 3,
                                   num_hidden_layers=args.layers, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=args.seq)
    model = transformers.LlamaForCausalLM(cfg)
    model.config._attn_implementation = "sdpa"
    model.config.use_cache = False
    model.train()
    context = None
    arena = None
    if args.mode == "recompute":
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    elif args.mode in ("inputs", "inputs+attention"):
        arena = spillarena.AutomaticArena(args.dir, verify_integrity=args.verify)
        extra = {}
        if args.mode == "inputs+attention":
            extra["context_fn"] = functools.partial(spillarena.selective_checkpoint_contexts,
                                                    spillarena.ATTENTION_OPS, arena=arena)
        spillarena.enable(model, arena, **extra)
    elif args.mode == "offload":
        arena = spillarena.AutomaticArena(args.dir, verify_integrity=args.verify)
        context = functools.partial(spillarena.offload, arena, min_bytes=64 << 10)
    ids = torch.randint(4, 1024, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1))

    def step():
        model.zero_grad(set_to_none=True)
        if context is None:
            loss = model(input_ids=ids, labels=ids).loss
        else:
            with context():
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.item()

    for _ in range(args.warmup):  # the arena made and grown, the allocator warm
        step()
    _reset_peak_rss()
    before, anon_before = _status_mib("VmRSS"), _status_mib("RssAnon")
    # anonymous memory is what a memory limit cannot reclaim; VmHWM also counts the arena's
    # mapped file pages
    with RssAnonSampler() as anon:
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    peak = _status_mib("VmHWM")
    stash = arena.arena.stash_stats() if arena is not None and arena.arena is not None else {}
    print(json.dumps({"mode": args.mode, "step_s": statistics.median(times), "times_s": times,
                      "peak_rss_mib": peak, "rss_before_mib": before,
                      "peak_added_mib": peak - before,
                      "peak_anon_added_mib": anon.peak / (1 << 20) - anon_before,
                      "inputs_stored": stash.get("inputs_stored", 0),
                      "inputs_spilled": stash.get("inputs_spilled", 0),
                      "saved_tensors_stored": stash.get("saved_tensors_stored", 0),
                      "saved_tensors_spilled": stash.get("saved_tensors_spilled", 0)}))


def child(args, mode):
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072",
               OMP_WAIT_POLICY="PASSIVE")
    command = [sys.executable, __file__, "--child", mode, "--layers", str(args.layers),
               "--seq", str(args.seq), "--batch", str(args.batch), "--hidden", str(args.hidden),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--dir", args.dir]
    if not args.verify:
        command.append("--no-verify")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"offload_modes: {mode} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(results):
    """Per mode: median step and added peak over the rounds; the ratios (None where a mode they
    need was not run)."""
    by_mode = {m: [r for r in results if r["mode"] == m] for m in MODES}
    table = {m: {"step_s": statistics.median(r["step_s"] for r in rs),
                 "fastest_s": min(t for r in rs for t in r["times_s"]),
                 "peak_added_mib": statistics.median(r["peak_added_mib"] for r in rs),
                 "peak_anon_added_mib": statistics.median(r["peak_anon_added_mib"] for r in rs),
                 "inputs_stored": rs[-1]["inputs_stored"],
                 "saved_tensors_stored": rs[-1].get("saved_tensors_stored", 0)}
             for m, rs in by_mode.items() if rs}

    def ratio(a, b, key):
        return table[a][key] / table[b][key] if a in table and b in table else None

    for mode, row in table.items():
        row["step_vs_recompute"] = ratio(mode, "recompute", "step_s")
        row["step_vs_none"] = ratio(mode, "none", "step_s")
        row["fastest_vs_none"] = ratio(mode, "none", "fastest_s")
    ratios = {
        "inputs+attention_step_vs_inputs": ratio("inputs+attention", "inputs", "step_s"),
        "inputs+attention_fastest_vs_inputs": ratio("inputs+attention", "inputs", "fastest_s"),
        "offload_fastest_vs_none": ratio("offload", "none", "fastest_s"),
        "inputs+attention_anon_peak_vs_inputs":
            ratio("inputs+attention", "inputs", "peak_anon_added_mib"),
        "offload_step_vs_none": ratio("offload", "none", "step_s"),
    }
    return table, ratios


def _shown(value, width, digits=3):
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}s}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=count(1, 256), default=8)
    parser.add_argument("--seq", type=count(16, 1 << 17), default=2048)
    parser.add_argument("--batch", type=count(1, 4096), default=1)
    parser.add_argument("--hidden", type=count(64, 1 << 15), default=256)
    parser.add_argument("--steps", type=count(1, 1000), default=3)
    parser.add_argument("--warmup", type=count(1, 100), default=2)
    parser.add_argument("--rounds", type=count(1, 100), default=3)
    parser.add_argument("--dir", default=None,
                        help="where the arenas' temporary folder goes (default /var/tmp: a disk)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="the arenas without their XXH3 integrity check (verify_integrity)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="which of the modes to run, comma-separated (all by default)")
    parser.add_argument("--child", choices=MODES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.mode = args.child
        return run_mode(args)
    args.modes = [m.strip() for m in args.modes.split(",")]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown or not args.modes:
        parser.error(f"--modes: unknown {', '.join(unknown) or 'none given'}; the modes are "
                     f"{', '.join(MODES)}")
    if args.hidden % 8 != 0:  # 4 heads of an even width (rotary embeddings pair the dimensions)
        parser.error(f"--hidden {args.hidden} must be a multiple of 8: 4 heads of an even width")
    with tempfile.TemporaryDirectory(prefix="offload-modes-", dir=args.dir or "/var/tmp") as tmp:
        args.dir = tmp  # the arenas' files have no name; the folder goes too
        return measure(args)


def measure(args):
    results = []
    for round_index in range(args.rounds):
        chosen = tuple(m for m in MODES if m in args.modes)
        order = chosen if round_index % 2 == 0 else tuple(reversed(chosen))
        for mode in order:
            results.append(child(args, mode))
            r = results[-1]
            print(f"round {round_index + 1} {mode:17s} step {r['step_s']:.3f} s, peak +"
                  f"{r['peak_added_mib']:.0f} MiB (anonymous +{r['peak_anon_added_mib']:.0f})",
                  flush=True)
    table, ratios = summary(results)
    print(f"\n{args.layers} layers, hidden {args.hidden}, seq {args.seq}, batch {args.batch}, "
          f"{os.cpu_count()} threads; medians over {args.rounds} rounds of {args.steps} steps")
    print(f"{'mode':17s} {'step s':>8s} {'÷ recompute':>12s} {'÷ none':>8s} {'fastest s':>10s} "
          f"{'÷ none':>8s} {'peak + MiB':>11s} {'anon + MiB':>11s}")
    for mode, row in table.items():
        print(f"{mode:17s} {row['step_s']:8.3f} {_shown(row['step_vs_recompute'], 12)} "
              f"{_shown(row['step_vs_none'], 8)} {row['fastest_s']:10.3f} "
              f"{_shown(row['fastest_vs_none'], 8)} {row['peak_added_mib']:11.0f} "
              f"{row['peak_anon_added_mib']:11.0f}")
    for name, value in ratios.items():
        if value is not None:
            print(f"{name}: {value:.3f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "child"},
                       "rounds": results, "table": table, "ratios": ratios}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
