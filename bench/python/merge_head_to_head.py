r"""Merges head_to_head.py reports run part by part (side by side, to fit a time budget) into one.

    python bench/python/merge_head_to_head.py docs/bench/head_to_head_cpu.json \
        table.json lengths.json batch.json longest.json \
        --regime "2 shared vCPUs, load average 10-23"

Each part is taken from the first report that has it; the table's summary is recomputed from its
runs (so a table cut short still gets one), and every part keeps the command that produced it.
"""

import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import head_to_head


def main(target, *sources, regime=None):
    merged = {"commands": [], "environment": None}
    for source in sources:
        with open(source) as f:
            report = json.load(f)
        merged["commands"].append(report["command"])
        merged["environment"] = merged["environment"] or report["environment"]
        merged.setdefault("disco", report.get("disco"))
        for part in ("table", "lengths", "batch", "longest"):
            if part in report and part not in merged:
                merged[part] = report[part]
                merged[part]["command"] = report["command"]
                merged[part]["args"] = report["args"]
                if part == "table":
                    args = SimpleNamespace(**report["args"])
                    merged[part].update(head_to_head.summarize_table(args, report[part]["runs"]))
                    merged[part]["rounds_completed"] = min(
                        len(r) for r in report[part]["runs"].values())
    if regime:
        merged["environment"]["regime"] = regime
    head_to_head.write(target, merged)


if __name__ == "__main__":
    argv = sys.argv[1:]
    regime = None
    if "--regime" in argv:
        at = argv.index("--regime")
        regime = argv[at + 1]
        del argv[at:at + 2]
    main(*argv, regime=regime)
