"""spillarena under torch.compile: each checkpointed layer is a graph break and runs eagerly
(Note [The checkpoint under torch.compile] in checkpoint.py); everything else is compiled.

Dropout is on in every model here, so a recomputation that drew other masks than its forward
would show in the gradients."""

import pytest
import torch

import spillarena
from conftest import assert_drained
from test_transformers import LAYERS, step, tiny_llama

transformers = pytest.importorskip("transformers")
dynamo = pytest.importorskip("torch._dynamo")

# Dynamo and AOTAutograd, the parts a checkpoint has to get through, without Inductor's C++ builds
# (minutes on two cores); the Inductor test below is the one that compiles kernels.
BACKEND = "aot_eager"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    dynamo.reset()
    dynamo.utils.counters.clear()
    yield
    dynamo.reset()


def eager_reference(seed):
    torch.manual_seed(0)
    return step(tiny_llama().train(), seed)


def plain_names(grads):
    return {name.replace("_orig_mod.", ""): grad for name, grad in grads.items()}


def assert_same(result, reference):
    (loss, grads), (ref_loss, ref_grads) = result, reference
    grads, ref_grads = plain_names(grads), plain_names(ref_grads)
    assert torch.equal(loss, ref_loss), (loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert torch.equal(grads[name], ref_grads[name]), name


def spillarena_graph_breaks():
    return sum(count for reason, count in dynamo.utils.counters["graph_break"].items()
               if "spillarena" in reason)


def test_whole_model_compile_breaks_the_graph_at_each_layer_and_matches_eager_bit_for_bit(
        spill_dir):
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    torch.manual_seed(0)
    model = spillarena.enable(tiny_llama().train(), arena)  # enable first, then compile
    compiled = torch.compile(model, backend=BACKEND)
    for seed in (7, 8):  # the second step runs the cached graphs
        assert_same(step(compiled, seed), eager_reference(seed))
    assert arena.stats()["allocations"] == 2 * LAYERS
    assert spillarena_graph_breaks() >= 1
    assert_drained(arena)


@pytest.mark.parametrize("how", ["in place", "wrapper"])
def test_compiled_decoder_layers_match_eager_bit_for_bit(how, spill_dir):
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    torch.manual_seed(0)
    model = spillarena.enable(tiny_llama().train(), arena)
    layers = model.model.layers
    for i in range(len(layers)):
        if how == "in place":
            layers[i].compile(backend=BACKEND)
        else:
            layers[i] = torch.compile(layers[i], backend=BACKEND)
    for seed in (7, 8):
        assert_same(step(model, seed), eager_reference(seed))
    assert arena.stats()["allocations"] == 2 * LAYERS
    assert spillarena_graph_breaks() >= 1
    spillarena.disable(model)  # reaches the layers inside torch.compile's wrappers too
    assert not model.is_activation_checkpointing
    assert_drained(arena)


def test_inductor_whole_model_the_spill_changes_nothing_and_only_the_compiled_head_differs(
        spill_dir):
    # The layers run eagerly either way; Inductor compiles the embedding, the final norm, lm_head
    # and the loss, whose fused kernels round differently from eager in the last bits. The same
    # compile with in-RAM checkpointing through the same code (make_in_memory_stash: no spill)
    # must give the same bits as the spill.
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    runs = {}
    for name, stash in (("spilled", arena), ("in RAM", spillarena.make_in_memory_stash())):
        torch.manual_seed(0)
        model = spillarena.enable(tiny_llama().train(), stash)
        runs[name] = step(torch.compile(model), seed=7)
    assert_same(runs["spilled"], runs["in RAM"])
    assert arena.stats()["allocations"] == LAYERS
    loss, grads = runs["spilled"][0], plain_names(runs["spilled"][1])
    ref_loss, ref_grads = eager_reference(seed=7)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert_drained(arena)
