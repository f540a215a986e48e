"""Step time of spillarena.checkpoint's two forms on one model, in one process, alternating.

    .venv/bin/python bench/python/reentrant_forms.py

A 4-layer Llama (hidden 256, 1024 tokens), each form through make_in_memory_stash() (no I/O:
the difference is the form's own), one warm-up step each, then 6 rounds alternating; prints the
median forward and backward time of each. The head-to-head table (head_to_head.py --modes
...,spillarena_reentrant) measures the same with spilling, memory and fresh processes.
"""

import statistics
import time

import torch
import transformers

import spillarena

FORMS = {"non-reentrant": {}, "reentrant": {"use_reentrant": True}}


def model_for(form):
    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    return spillarena.enable(model, spillarena.make_in_memory_stash(), **FORMS[form])


def step(model, ids):
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    forward_done = time.perf_counter()
    loss.backward()
    backward_done = time.perf_counter()
    model.zero_grad(set_to_none=True)
    return forward_done - start, backward_done - forward_done


def main():
    torch.set_num_threads(2)
    ids = torch.randint(0, 1024, (1, 1024), generator=torch.Generator().manual_seed(0))
    models = {form: model_for(form) for form in FORMS}
    for model in models.values():
        step(model, ids)
    times = {form: [] for form in FORMS}
    for _ in range(6):
        for form, model in models.items():
            times[form].append(step(model, ids))
    for form, runs in times.items():
        forward = 1000 * statistics.median(r[0] for r in runs)
        backward = 1000 * statistics.median(r[1] for r in runs)
        print(f"{form:14s} forward {forward:6.1f} ms  backward {backward:6.1f} ms  "
              f"step {forward + backward:6.1f} ms")


if __name__ == "__main__":
    main()
