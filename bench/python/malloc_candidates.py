"""RssAnon growth and step time of one training run under one malloc candidate (one process each).

    for c in none trim_backward trim_layer thresholds_128k; do
      L=12 S=128 STEPS=2 python bench/python/malloc_candidates.py torch none 8
      L=12 S=128 STEPS=2 python bench/python/malloc_candidates.py spill $c 8
    done

mode: torch (transformers' checkpointing) or spill (spillarena.enable, buffered arena, keep_last=0).
candidate: none (glibc as it is); trim_backward (malloc_trim(0) after each layer's backward);
trim_layer (after each layer's forward and backward: spillarena.malloc's policy);
thresholds_128k (mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD at 128 KiB, the C++ side's
spill::return_freed_memory_promptly). Environment: L layers (12), S tokens (128), STEPS (2).
Prints one JSON line: RssAnon of the built model (base), its peak during the steps (sampled every
2 ms), and each step's time. The model is head_to_head.py's (StableLM as a Llama, hidden 256,
hidden dropout 0.1). This is how the policy in python/spillarena/malloc.py was chosen.
"""

import ctypes
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spillarena
import h2h_support

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
CANDIDATES = ("none", "trim_backward", "trim_layer", "thresholds_128k")


def main(mode, candidate, batch):
    assert mode in ("torch", "spill") and candidate in CANDIDATES, __doc__
    libc = ctypes.CDLL("libc.so.6")
    layers, seq = int(os.environ.get("L", "12")), int(os.environ.get("S", "128"))
    if candidate == "thresholds_128k":
        libc.mallopt(M_MMAP_THRESHOLD, 131072)
        libc.mallopt(M_TRIM_THRESHOLD, 131072)
    torch.set_num_threads(os.cpu_count() or 1)
    from transformers import StableLmConfig, StableLmForCausalLM

    torch.manual_seed(0)
    model = StableLmForCausalLM(
        StableLmConfig(vocab_size=1024, hidden_size=256, intermediate_size=688,
                       num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                       max_position_embeddings=seq, hidden_dropout=0.1, attention_dropout=0.0,
                       partial_rotary_factor=1.0, use_cache=False))
    model.train()

    class TrimAfterBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            libc.malloc_trim(0)
            return grad

    trims = candidate in ("trim_backward", "trim_layer")
    if mode == "torch":
        from torch.utils.checkpoint import checkpoint as inner

        inner = __import__("functools").partial(inner, use_reentrant=False)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        arena = spillarena.SpillArena(
            spillarena.bytes_for_layer_inputs(layers + 1, (batch, seq, 256), torch.float32), None,
            io="buffered", keep_last=0)
        inner = __import__("functools").partial(spillarena.checkpoint, arena=arena)
        spillarena.enable(model, arena)

    def checkpoint(function, x, *args, **kwargs):
        out = inner(function, TrimAfterBackward.apply(x) if trims else x, *args, **kwargs)
        if candidate == "trim_layer":
            libc.malloc_trim(0)
        return out

    if trims:
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=checkpoint)
    torch.manual_seed(1)
    ids = torch.randint(0, 1024, (batch, seq))
    base = h2h_support.status_bytes("RssAnon")
    times = []
    with h2h_support.RssAnonSampler() as rss:
        for _ in range(int(os.environ.get("STEPS", "2"))):
            start = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            times.append(round(time.perf_counter() - start, 3))
            model.zero_grad(set_to_none=True)
    print(
        json.dumps({
            "mode": mode, "candidate": candidate, "batch": batch, "layers": layers, "seq": seq,
            "base_mib": round(base / 2**20, 1), "peak_mib": round(rss.peak / 2**20, 1),
            "growth_mib": round((rss.peak - base) / 2**20, 1), "step_s": times
        }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
