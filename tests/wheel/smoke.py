"""What a new user does first with the installed wheel (run by tests/wheel/wheel_check.sh in a
virtualenv that holds torch and the wheel, nothing else, unless transformers is importable).

  1. a checkpointed training step whose layer inputs go to a disk arena, with gradients
     bit-identical to the same step without checkpointing (dropout on);
  2. the error table: every class is a spillarena.Error, and bad input raises the typed one;
  3. spillarena.enable on a tiny transformers model, when transformers is importable.

Prints one line per part and the seconds from the start of the import; exits non-zero on failure.
"""

import os
import sys
import tempfile
import time

started = time.monotonic()

import torch  # noqa: E402

import spillarena  # noqa: E402


def say(what):
    print(f"smoke: {what} ({time.monotonic() - started:.1f} s since start)", flush=True)


def stack(seed):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Dropout(0.1))
        for _ in range(6)
    )


def step(layers, x, arena):
    torch.manual_seed(1)
    h = x
    for layer in layers:
        h = spillarena.checkpoint(layer, h, arena=arena) if arena is not None else layer(h)
    h.square().mean().backward()
    return [p.grad.clone() for p in layers.parameters()]


def checkpointed_step(directory):
    x = torch.randn(1, 32, 64, requires_grad=True)
    arena = spillarena.SpillArena(spillarena.bytes_for_layer_inputs(6, (1, 32, 64), torch.float32),
                                  directory)
    spilled = step(stack(0), x, arena)
    plain = step(stack(0), x, None)
    assert all(torch.equal(a, b) for a, b in zip(spilled, plain)), "gradients differ"
    stats = arena.stats()
    # Every input but the last layer's (keep_last=1, the default: backward needs it first).
    assert stats["bytes_written"] >= 5 * 32 * 64 * 4, stats
    assert stats["bytes_in_use"] == 0, stats
    say(f"checkpointed step through a disk arena: {stats['bytes_written']} bytes spilled, "
        f"io backend {stats['io_backend']}, gradients bit-identical")


def error_table(directory):
    names = spillarena.errors.__all__
    assert "Error" in names and len(names) > 5, names
    for name in names:
        base = UserWarning if name.endswith("Warning") else spillarena.Error
        assert issubclass(getattr(spillarena.errors, name), base), name
    try:
        spillarena.SpillArena(0, directory)
    except spillarena.InvalidArgumentError as e:
        assert "0" in str(e), e
    else:
        raise AssertionError("a zero capacity was accepted")
    say(f"error table: {len(names)} classes; a zero capacity raises InvalidArgumentError")


def transformers_model(directory):
    try:
        import transformers
    except ImportError:
        say("transformers is not importable here: enable() on a model not tried")
        return
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    arena = spillarena.SpillArena(1 << 20, directory)
    spillarena.enable(model, arena)
    ids = torch.randint(0, 128, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert arena.stats()["bytes_written"] > 0
    say(f"spillarena.enable on a tiny Llama (transformers {transformers.__version__}): trained")


def main():
    say(f"imported spillarena {spillarena.__version__} from {os.path.dirname(spillarena.__file__)}"
        f" with torch {torch.__version__}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("SPILL_DIR")) as directory:
        checkpointed_step(directory)
        error_table(directory)
        transformers_model(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
