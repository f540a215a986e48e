#!/usr/bin/python3
r"""Draws the head-to-head figure from one head_to_head.py JSON run.

    python3 bench/python/plot_head_to_head.py docs/bench/head_to_head_cpu.json \
        docs/bench/head_to_head_cpu.png
    python3 bench/python/plot_head_to_head.py docs/bench/head_to_head_cpu.json \
        --markdown   # the tables

Panels, for the parts the JSON has: step time per mode relative to transformers' checkpointing
(median of the rounds' ratios); peak RssAnon and the cgroup's peak per mode; step time against
sequence length per mode (no limit); the largest sequence (and micro-batch) that trains under the
search's memory limit. Every figure comes from the JSON; nothing is typed in.
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

MIB = 2**20


def bars(ax, labels, values, ylabel, title, fmt, prefixes=None):
    positions = range(len(labels))
    drawn = ax.bar(positions, [v or 0 for v in values], width=0.6)
    for rect, value, prefix in zip(drawn, values, prefixes or [""] * len(values)):
        ax.annotate("-" if value is None else prefix + fmt.format(value),
                    (rect.get_x() + rect.get_width() / 2, rect.get_height()), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(list(positions))
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)


def main(source, target):
    report = json.loads(Path(source).read_text())
    parts = [p for p in ("table", "lengths", "longest", "batch")
             if p in report and "skipped" not in report[p]]
    panels = len(parts) + ("table" in parts)
    rows = 1 if panels <= 3 else 2
    cols = -(-panels // rows)
    fig, grid = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.8 * rows), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for spare in axes[panels:]:
        spare.set_visible(False)
    if "table" in parts:
        summary = {m: s for m, s in report["table"]["summary"].items() if "step_s_median" in s}
        modes = list(summary)
        shape = report["table"]["shape"]
        bars(axes.pop(0), modes, [summary[m].get("step_vs_torch_median_of_rounds") for m in modes],
             "step time / transformers' checkpointing", f"Step time, median of the rounds' ratios\n"
             f"({shape['layers']} layers, hidden {shape['hidden']}, seq {shape['seq']},"
             f" batch {shape['batch']}; see the JSON for the spread)", "{:.2f}x")
        ax = axes.pop(0)
        width = 0.38
        for offset, key, label in ((-width / 2, "peak_rss_anon_bytes_max", "peak RssAnon"),
                                   (width / 2, "cgroup_peak_bytes_max", "cgroup peak")):
            ax.bar([i + offset for i in range(len(modes))],
                   [(summary[m][key] or 0) / MIB for m in modes], width=width, label=label)
        ax.set_xticks(list(range(len(modes))))
        ax.set_xticklabels(modes, rotation=20, ha="right")
        ax.set_ylabel("MiB")
        ax.set_title("Host memory in the same run", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
    if "lengths" in parts:
        lengths_panel(axes.pop(0), report["lengths"])
    for part in ("longest", "batch"):
        if part not in parts:
            continue
        search = report[part]
        modes = list(search["results"])
        what = ("sequence length" if search["axis"] == "seq"
                else f"micro-batch (seq {search['fixed']})")
        bars(axes.pop(0), modes, [search["results"][m]["largest_ok"] for m in modes],
             f"largest {what}",
             f"Largest {what} that trains under {search['limit_bytes'] // MIB} MiB\n"
             f"({search['overrides'].get('layers')} layers, each trial its own cgroup; "
             "\u2265: the search's cap)", "{}",
             ["\u2265" if search["results"][m].get("capped") else "" for m in modes])
    fig.suptitle("spillarena head-to-head on the CPU (" +
                 report["environment"].get("regime", "shared 2-core VM") + ")")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


def lengths_panel(ax, part):
    seqs = sorted(part["lengths"], key=int)
    modes = list(part["lengths"][seqs[0]]["summary"])
    for mode in modes:
        points = [(int(q), part["lengths"][q]["summary"][mode].get("step_s_median")) for q in seqs]
        points = [(q, t) for q, t in points if t]
        ax.plot([q for q, _ in points], [t for _, t in points], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([int(q) for q in seqs])
    ax.set_xticklabels(seqs)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("step time, median (s)")
    ax.set_title(
        f"Step time by length, no memory limit\n({part['overrides']['layers']} layers, hidden "
        f"{part['overrides']['hidden']}, batch {part['batch']})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def lengths_markdown(part):
    seqs = sorted(part["lengths"], key=int)
    modes = list(part["lengths"][seqs[0]]["summary"])
    lines = ["| tokens | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for q in seqs:
        cells = []
        for mode in modes:
            s = part["lengths"][q]["summary"][mode]
            if "step_s_median" not in s:
                cells.append(f"{s.get('status')}")
                continue
            ratios = [f"{s[f'step_vs_{key}_median_of_rounds']:.2f}x {name} "
                      f"[{min(s[f'step_vs_{key}_rounds']):.2f}–{max(s[f'step_vs_{key}_rounds']):.2f}]"
                      for key, name in (("torch", "torch"), ("disco", "Disco"))
                      if f"step_vs_{key}_median_of_rounds" in s and mode != key]
            cells.append(f"{s['step_s_median'] * 1e3:.0f} ms" +
                         (f": {'; '.join(ratios)}" if ratios else ""))
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    return lines


def mib(value):
    return "-" if not value else f"{value / MIB:.0f}"


def markdown(source):
    """The tables of docs/head_to_head.md, from the JSON."""
    report = json.loads(Path(source).read_text())
    lines = []
    if "table" in report and "summary" in report["table"]:
        lines += ["| mode | step time, median (fastest) "
                  "| vs transformers' checkpointing, median of rounds (range) "
                  "| peak RssAnon | cgroup peak | written per step | files created "
                  "| gradients = no checkpointing |",
                  "|---|---|---|---|---|---|---|---|"]
        for mode, s in report["table"]["summary"].items():
            if "step_s_median" not in s:
                lines.append(f"| {mode} | {s.get('status')}: {s.get('message')} |||||||")
                continue
            grads = s["gradients_bitwise_equal"]
            grads = "reference" if grads == "reference" else (
                "bit-identical" if grads else f"differ (max {s['max_abs_grad_diff']:.1e})")
            ratio = s.get("step_vs_torch_median_of_rounds")
            rounds = s.get("step_vs_torch_rounds") or [ratio]
            lines.append(f"| {mode} | {s['step_s_median'] * 1e3:.0f} ms"
                         f" ({s['step_s_min'] * 1e3:.0f} ms) | {ratio:.2f}x "
                         f"({min(rounds):.2f}–{max(rounds):.2f})"
                         f" | {mib(s['peak_rss_anon_bytes_max'])} MiB "
                         f"| {mib(s['cgroup_peak_bytes_max'])} MiB"
                         f" | {s['bytes_written_per_step'] / MIB:.1f} MiB "
                         f"| {s['files_created']} | {grads} |")
    if "lengths" in report and "lengths" in report["lengths"]:
        lines += [""] + lengths_markdown(report["lengths"])
    for part in ("batch", "longest"):
        search = report.get(part)
        if not search:
            continue
        if "results" not in search:
            lines += ["", f"{part}: skipped: {search.get('skipped')}"]
            continue
        what = "sequence length" if search["axis"] == "seq" else "micro-batch"
        lines += ["", f"| mode | largest {what} under {search['limit_bytes'] // MIB} MiB "
                  "| vs transformers' checkpointing "
                  "| trials (value: status, cgroup peak, step time) |", "|---|---|---|---|"]
        for mode, r in search["results"].items():
            trials = "; ".join(
                f"{t[search['axis']]}: {t['status']}, {mib(t.get('cgroup_peak_bytes'))} MiB" +
                (f", {t['step_s_median']:.1f} s" if t.get("step_s_median") else "")
                for t in r["trials"])
            largest = f"{r['largest_ok']}" + (" (cap: at least)" if r.get("capped") else "")
            ratio = f"{r['ratio_vs_torch']:.2f}x" if r.get("ratio_vs_torch") else "-"
            lines.append(f"| {mode} | {largest} | {ratio} | {trials} |")
    print("\n".join(lines))


if __name__ == "__main__":
    if "--markdown" in sys.argv:
        markdown(sys.argv[1])
    else:
        main(*sys.argv[1:3])
