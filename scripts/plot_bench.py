#!/usr/bin/python3
"""Draws the benchmark plots and the ratio table from one spillarena_bench JSON run.

    python3 scripts/plot_bench.py docs/bench/results.json docs/bench

Writes round_trip.png, training_step.png and ratios.md into the output folder. Every figure
comes from the JSON; nothing is typed in.
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # must come after matplotlib.use("Agg")

METHODS = ["arena", "arena_evicted", "arena_ram", "arena_direct", "per_file", "memcpy", "direct_io"]
MODES = ["none", "recompute", "ram", "disk", "disk_async", "disk_direct", "per_file"]


def load(path):
    data = json.loads(Path(path).read_text())
    rows = {}
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        parts = [p for p in b["name"].split("/")
                 if p != "real_time" and not p.startswith(("min_time:", "repeats:"))]
        rows[tuple(parts)] = b
    return data["context"], rows


def round_trip(rows):
    table = defaultdict(dict)  # method -> MiB -> row
    for key, b in rows.items():
        if key[0] == "BM_RoundTrip":
            table[key[1]][int(key[2])] = b
    return table


def training(rows):
    table = defaultdict(dict)  # shape -> mode -> row
    for key, b in rows.items():
        if key[0] == "BM_TrainingStep" and key[1] in MODES:
            table[key[2]][key[1]] = b
    return table


def paired(rows, name="disk_vs_recompute"):
    return {key[2]: b for key, b in rows.items()
            if key[0] == "BM_TrainingStep" and key[1] == name}


def plot_round_trip(rt, out):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (field, title) in zip(axes, [("bytes_per_second", "round trip"), ("write_Bps", "write"),
                                         ("read_Bps", "read")]):
        for method in METHODS:
            if method not in rt:
                continue
            sizes = sorted(rt[method])
            ax.plot(sizes, [rt[method][s][field] / 1e9 for s in sizes], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tensor size (MiB)")
        ax.set_ylabel("GB/s")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle("Spill one tensor and read it back (BM_RoundTrip)")
    fig.tight_layout()
    fig.savefig(out / "round_trip.png", dpi=110)


def plot_training(tr, out):
    shapes = sorted(tr)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / max(1, len(shapes))
    for i, shape in enumerate(shapes):
        modes = [m for m in MODES if m in tr[shape]]
        xs = [MODES.index(m) + i * width for m in modes]
        axes[0].bar(xs, [tr[shape][m]["step_ms"] for m in modes], width, label=shape)
        axes[1].bar(xs, [tr[shape][m]["peak_rss_anon"] / 2**20 for m in modes], width, label=shape)
    for ax, label in zip(axes, ["step time (ms)", "RssAnon after forward (MiB)"]):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(MODES))])
        ax.set_xticklabels(MODES)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(title="shape")
    fig.suptitle("One forward + backward of a GPT block stack (BM_TrainingStep)")
    fig.tight_layout()
    fig.savefig(out / "training_step.png", dpi=110)


def ratio(a, b):
    return a / b if a and b else float("nan")


def verdict(value, goal, at_least=True):
    if value != value:
        return "n/a"
    return "met" if (value >= goal if at_least else value <= goal) else "missed"


def ratios_markdown(context, rt, tr, rows):
    lines = [f"Measured {context.get('date', '')} on {context.get('num_cpus')} CPUs, "
             f"LibTorch threads {context.get('libtorch_threads')}, spill dir "
             f"`{context.get('spill_dir')}`.", "",
             "| comparison | size / shape | ratio | goal | |", "|---|---|---:|---:|---|"]
    comparisons = [  # (label, method, baseline, field, goal, smallest MiB)
        ("round trip, arena ÷ per_file", "arena", "per_file", "bytes_per_second", 5.0, 16),
        ("write, arena ÷ memcpy (resident)", "arena", "memcpy", "write_Bps", 0.7, 1),
        ("read, arena evicted ÷ direct_io", "arena_evicted", "direct_io", "read_Bps", 0.7, 1),
        ("round trip, arena_direct ÷ direct_io", "arena_direct", "direct_io", "bytes_per_second",
         0.8, 16)]
    for label, method, baseline, field, goal, smallest in comparisons:
        for mib in sorted(rt.get(method, {})):
            a, b = rt[method].get(mib), rt.get(baseline, {}).get(mib)
            if a and b and mib >= smallest:
                r = ratio(a[field], b[field])
                lines.append(f"| {label} | {mib} MiB | {r:.2f}× | ≥ {goal:g}× "
                             f"| {verdict(r, goal)} |")
    for mib, b in sorted(rt.get("arena_direct", {}).items()):
        cached = b.get("page_cache_bytes", float("nan"))
        lines.append(f"| page cache held after arena_direct | {mib} MiB | {cached:.0f} B | 0 B "
                     f"| {verdict(cached, 0, False)} |")
    for variant in ["disk", "disk_async", "disk_direct"]:
        for shape, b in sorted(paired(rows, variant + "_vs_recompute").items()):
            x, n = b["median_ratio"], b["iterations"]
            goal = "≤ 1.03×" if shape == "compute" else "(report)"
            v = verdict(x, 1.03, at_least=False) if shape == "compute" else ""
            lines.append(f"| step time, {variant} ÷ recompute, paired (median of {n}) "
                         f"| {shape} | {x:.3f}× | {goal} | {v} |")
            if variant != "disk":
                s = b["vs_sync"]
                if shape == "io":
                    goal, v = "< 1×", verdict(s, 1.0, at_least=False)
                else:
                    goal, v = "(report)", ""
                lines.append(f"| step time, {variant} ÷ synchronous disk, paired "
                             f"| {shape} | {s:.3f}× | {goal} | {v} |")
                lines.append(f"| overlap achieved (I/O time hidden ÷ I/O time), {variant} "
                             f"| {shape} | {b['overlap']:.2f} | (report) | |")
    for shape in sorted(tr):
        d = tr[shape].get("disk")
        r = tr[shape].get("recompute")
        if d and r:
            x = ratio(d["step_ms"], r["step_ms"])
            lines.append(f"| step time, disk ÷ recompute, separate runs | {shape} | {x:.3f}× "
                         "| (report) | |")
        p = tr[shape].get("per_file")
        if d and p:
            x = ratio(p["step_ms"], d["step_ms"])
            lines.append(f"| step time, per_file ÷ disk | {shape} | {x:.3f}× | (report) | |")
    fixed = rows.get(("BM_Allocator", "fixed"))
    if fixed:
        ns = fixed["real_time"] if fixed["time_unit"] == "ns" else float("nan")
        lines.append(f"| allocate + free, fixed size | 64 KiB | {ns:.0f} ns | ≤ 1000 ns "
                     f"| {verdict(ns, 1000, False)} |")
    varying = next((b for k, b in rows.items() if k[:2] == ("BM_Allocator", "varying")), None)
    if varying:
        per_op_ns = 1e9 / varying["items_per_second"]
        lines.append(f"| allocate or free, varying sizes | 4 KiB–16 MiB | {per_op_ns:.0f} ns "
                     f"| ≤ 1000 ns | {verdict(per_op_ns, 1000, False)} |")
        c = varying["capacity_needed_over_peak_live"]
        lines.append(f"| capacity needed ÷ peak live bytes | random workload | {c:.3f} | ≤ 1.25 "
                     f"| {verdict(c, 1.25, False)} |")
    lines += ["", "Training steps (ms per step; RssAnon after forward, less RssAnon before the "
              "model was built, measured in a fresh process):", "",
              "| shape | " + " | ".join(MODES) + " |", "|---|" + "---:|" * len(MODES)]
    for shape in sorted(tr):
        cells = []
        for m in MODES:
            b = tr[shape].get(m)
            cells.append(f"{b['step_ms']:.1f} ms, {b['peak_rss_anon'] / 2**20:.1f} MiB"
                         if b else "")
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    context, rows = load(sys.argv[1])
    rt, tr = round_trip(rows), training(rows)
    plot_round_trip(rt, out)
    plot_training(tr, out)
    (out / "ratios.md").write_text(ratios_markdown(context, rt, tr, rows))
    print((out / "ratios.md").read_text())


if __name__ == "__main__":
    main()
