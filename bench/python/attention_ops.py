"""Which attention operations transformers' Llama runs, per attn_implementation, dropout and
dtype, on this machine's devices, and which of them spillarena.ATTENTION_OPS marks: the table in
README's Python section (issue 51).

    .venv/bin/python bench/python/attention_ops.py [--device cpu|cuda|all] [--json out.json]

A one-layer Llama from a tiny config with random weights runs one forward in training mode under
a dispatch mode that records every aten operation; the rows list the attention kernels and
softmaxes among them (any operation whose name holds "attention" or "softmax") and whether
ATTENTION_OPS holds each. On CUDA it runs fp32, fp16 and bf16, since SDPA picks its kernel by
dtype; on the CPU fp32 and bf16.
"""

import argparse
import json
import sys

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

import spillarena


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def attention_ops(device, implementation, dropout, dtype):
    """The attention and softmax ops of one training forward, sorted by name."""
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, attention_dropout=dropout)
    config._attn_implementation = implementation
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).train()
    ids = torch.randint(0, 256, (2, 64), device=device)
    with _Recorder() as recorder:
        model(input_ids=ids)
    names = {op: str(op) for op in recorder.ops}
    return sorted((name, op in spillarena.ATTENTION_OPS) for op, name in names.items()
                  if "attention" in name or "softmax" in name)


def rows(devices):
    for device in devices:
        dtypes = (torch.float32, torch.float16, torch.bfloat16) if device == "cuda" else \
            (torch.float32, torch.bfloat16)
        for implementation in ("sdpa", "eager"):
            for dropout in (0.0, 0.1):
                for dtype in dtypes:
                    ops = attention_ops(device, implementation, dropout, dtype)
                    yield {"device": device, "attn_implementation": implementation,
                           "dropout": dropout, "dtype": str(dtype).removeprefix("torch."),
                           "ops": [{"op": op, "marked": marked} for op, marked in ops]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda", "all"), default="all")
    p.add_argument("--json")
    args = p.parse_args(argv)
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        if args.device == "cuda":
            sys.exit("attention_ops: --device cuda, but torch sees no CUDA device")
        devices.remove("cuda")
    table = list(rows(devices))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    print("| device | attn_implementation | dropout | dtype | "
          "operation (marked by ATTENTION_OPS) |")
    print("|---|---|---|---|---|")
    for r in table:
        ops = ", ".join(f"`{o['op']}` ({'yes' if o['marked'] else 'no'})" for o in r["ops"])
        print(f"| {r['device']} | {r['attn_implementation']} | {r['dropout']} | {r['dtype']} | "
              f"{ops} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "transformers": transformers.__version__,
                       "rows": table}, f, indent=1)


if __name__ == "__main__":
    main()
