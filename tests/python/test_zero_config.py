"""Zero configuration: enable(model) and checkpoint(fn, x) with no arena, arenas that grow, inputs
kept in memory when there is no room, and the options that pick the old behaviour. Whatever the
arena does, the gradients are torch's own checkpoint's, and no checkpointing's where torch's own
are in the same run (conftest.assert_as_torch)."""

import functools
import gc
import os
import pathlib
import re
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import spillarena
from conftest import assert_as_torch, assert_drained, fill, wait_for_exit_code

transformers = pytest.importorskip("transformers")


@pytest.fixture
def spill_env(spill_dir, monkeypatch):
    """SPILL_DIR pointed at a fresh directory: where an arena made without one goes."""
    monkeypatch.setenv("SPILL_DIR", str(spill_dir))
    return spill_dir


def tiny_llama(layers=4, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        attention_dropout=0.1)
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config).train()


def gradients(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


# torch's own checkpoint, and transformers', in the form spillarena's default has.
TORCHS = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
NON_REENTRANT = {"use_reentrant": False}


# ---------------------------------------------------------------------------------------------
# Trainer: variable-length batches, no arena argument
# ---------------------------------------------------------------------------------------------

# Each batch padded only to its own longest sequence: the longest (512) comes in the second step,
# so the arena made at the first (short) step grows once and the steps after overflow nothing.
LENGTHS = [32, 20, 512, 400, 48, 300, 16, 256, 128, 64, 200, 100, 384, 24]
BATCH = 2


def variable_length_dataset():
    g = torch.Generator().manual_seed(3)
    return [{"input_ids": torch.randint(1, 256, (n,), generator=g).tolist()} for n in LENGTHS]


def pad_to_longest(features):
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros(len(features), longest, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, : len(f["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class InOrderTrainer(transformers.Trainer):
    """Batches in dataset order (the step with the longest one is known), every loss kept."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses = []

    def _get_train_sampler(self, *args, **kwargs):
        return torch.utils.data.SequentialSampler(self.train_dataset)

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.losses.append((loss[0] if isinstance(loss, tuple) else loss).detach().clone())
        return loss


class ArenaStatsEachStep(transformers.TrainerCallback):
    def __init__(self, model):
        self.model, self.per_step = model, []

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(dict(spillarena.arena_of(self.model).stats()))


def trainer_run(tmp_path, checkpointing):
    """checkpointing: None, "transformers" (its own, non-reentrant) or "spill"."""
    model = tiny_llama()
    spill = checkpointing == "spill"
    if spill:
        spillarena.enable(model)  # no arena, no numbers
    own = checkpointing == "transformers"
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / str(checkpointing)), max_steps=len(LENGTHS) // BATCH,
        activation_checkpointing=own,
        activation_checkpointing_kwargs=NON_REENTRANT if own else None,
        per_device_train_batch_size=BATCH, learning_rate=1e-3, warmup_steps=0, save_strategy="no",
        report_to="none", use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True,
        logging_steps=100, remove_unused_columns=False)
    trainer = InOrderTrainer(model=model, args=args, train_dataset=variable_length_dataset(),
                             data_collator=pad_to_longest)
    recorder = ArenaStatsEachStep(model) if spill else None
    if recorder:
        trainer.add_callback(recorder)
    trainer.train()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return torch.stack(trainer.losses), weights, recorder, model


def test_trainer_with_variable_lengths_needs_no_arena_and_matches_transformers_checkpointing(
        tmp_path, spill_env):
    plain = trainer_run(tmp_path, None)[:2]
    torchs = trainer_run(tmp_path, "transformers")[:2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses, weights, recorder, model = trainer_run(tmp_path, "spill")

    assert_as_torch((losses, weights), torchs, plain)  # every step's gradients bit-identical
    steps = recorder.per_step
    assert len(steps) == len(LENGTHS) // BATCH
    assert steps[0]["overflows"] == 0  # sized from the first input: the first step fits
    assert steps[1]["overflows"] > 0  # the 512-long batch did not
    assert steps[-1]["grows"] >= 1
    assert all(s["overflows"] == steps[1]["overflows"] for s in steps[2:])  # none after the grow
    assert steps[-1]["capacity_bytes"] >= steps[-1]["capacity_needed_bytes"]
    sizing = [w for w in caught if issubclass(w.category, spillarena.SpillArenaWarning)]
    assert len(sizing) == 1, [str(w.message) for w in sizing]  # one warning per arena
    assert "stays in memory for this step" in str(sizing[0].message)
    arena = spillarena.arena_of(model).arena
    assert arena.directory == str(spill_env)
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# A plain loop: an arena for 2 inputs, a model of 8
# ---------------------------------------------------------------------------------------------

def mlp_blocks(layers=8, width=64):
    torch.manual_seed(5)
    return [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                torch.nn.Dropout(0.2)) for _ in range(layers)]


def plain_step(blocks, x0, checkpoint=None):
    for b in blocks:
        b.zero_grad(set_to_none=True)
    torch.manual_seed(9)
    x = x0.clone().requires_grad_(True)
    h = x
    for block in blocks:
        h = checkpoint(block, h) if checkpoint else block(h)
    h.pow(2).mean().backward()
    grads = {f"{i}.{n}": p.grad.clone() for i, b in enumerate(blocks)
             for n, p in b.named_parameters()}
    grads["input"] = x.grad.clone()
    return grads


def as_torch(blocks, x0):
    """assert_as_torch for plain_step's gradients, torch's own and no checkpointing's once."""
    torchs, plain = plain_step(blocks, x0, TORCHS), plain_step(blocks, x0)
    return lambda ours: assert_as_torch(ours, torchs, plain)


def test_an_arena_for_two_inputs_overflows_once_then_spills_all_eight(spill_dir):
    blocks, x0 = mlp_blocks(), torch.randn(16, 64)
    assert_as_torchs = as_torch(blocks, x0)
    input_bytes = x0.numel() * 4
    arena = spillarena.SpillArena(2 * input_bytes, spill_dir, keep_last=0)
    spill = functools.partial(spillarena.checkpoint, arena=arena)

    with pytest.warns(spillarena.SpillArenaWarning, match="no room for an input"):
        assert_as_torchs(plain_step(blocks, x0, spill))
    first = arena.stats()
    assert first["overflows"] == 6 and first["overflow_bytes"] == 6 * input_bytes
    assert first["capacity_needed_bytes"] == 8 * input_bytes
    assert arena.stash_stats()["inputs_spilled"] == 2

    with warnings.catch_warnings():
        warnings.simplefilter("error", spillarena.SpillArenaWarning)  # once per arena
        assert_as_torchs(plain_step(blocks, x0, spill))
    second = arena.stats()
    assert second["overflows"] == 6  # nothing more
    assert second["grows"] == 1
    assert second["capacity_bytes"] >= 8 * input_bytes
    assert arena.stash_stats()["inputs_spilled"] == 2 + 8
    assert_drained(arena)


def test_inputs_of_several_shapes_and_dtypes_share_one_automatic_arena(spill_env):
    # A vision-like tower of wide bf16 inputs, then a decoder of narrow float32 ones: the first
    # arena is sized from the tower's first input, the decoder's do not all fit at first.
    torch.manual_seed(6)
    tower = [torch.nn.Sequential(torch.nn.Linear(96, 96), torch.nn.Dropout(0.1)).bfloat16()
             for _ in range(2)]
    bridge = torch.nn.Linear(96, 32).bfloat16()
    decoder = [torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Dropout(0.1))
               for _ in range(6)]
    automatic = spillarena.AutomaticArena(layers=2, keep_last=0)
    pixels = torch.randn(4, 96).bfloat16()
    tokens = torch.randn(64, 32)

    def step(run):
        for m in tower + decoder + [bridge]:
            m.zero_grad(set_to_none=True)
        torch.manual_seed(8)
        h = pixels.clone().requires_grad_(True)
        for block in tower:
            h = run(block, h) if run else block(h)
        t = tokens + bridge(h).float().mean(0)
        for block in decoder:
            t = run(block, t) if run else block(t)
        t.pow(2).mean().backward()
        return {f"{i}.{n}": p.grad.clone()
                for i, m in enumerate(tower + decoder + [bridge]) for n, p in m.named_parameters()}

    spill = functools.partial(spillarena.checkpoint, arena=automatic)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spillarena.SpillArenaWarning)
        for i in range(3):
            assert_as_torch(step(spill), step(TORCHS), step(None), case=f"step {i}")
    stats = automatic.stats()
    assert stats["overflows"] > 0 and stats["grows"] == 1
    assert automatic.arena.stash_stats()["inputs_stored"] == 3 * 8
    assert_drained(automatic.arena)


def test_when_full_error_raises_the_typed_error_and_leaves_the_arena_consistent(spill_dir):
    blocks, x0 = mlp_blocks(4), torch.randn(16, 64)
    input_bytes = x0.numel() * 4
    arena = spillarena.SpillArena(2 * input_bytes, spill_dir, keep_last=0, when_full="error",
                                  grow=False)
    spill = functools.partial(spillarena.checkpoint, arena=arena)
    with pytest.raises(spillarena.ArenaExhaustedError, match="no room to stash"):
        plain_step(blocks, x0, spill)
    assert_drained(arena, wait_s=10)
    assert arena.stats()["overflows"] == 1
    assert arena.stats()["capacity_bytes"] == 2 * input_bytes
    as_torch(blocks[:2], x0)(plain_step(blocks[:2], x0, spill))
    assert_drained(arena)


def test_checkpoint_without_an_arena_uses_the_default_arena(spill_env):
    automatic = spillarena.AutomaticArena()
    blocks, x0 = mlp_blocks(3), torch.randn(8, 64)
    spill = functools.partial(spillarena.checkpoint, arena=automatic)
    assert automatic.arena is None and automatic.stats() == {}
    as_torch(blocks, x0)(plain_step(blocks, x0, spill))
    # The documented guess for a checkpoint without enable(): 16 inputs, at least 64 MiB.
    assert automatic.arena.stats()["initial_capacity_bytes"] == spillarena.automatic.MIN_FIRST_BYTES
    assert automatic.directory == str(spill_env)
    assert_drained(automatic.arena)
    # arena=None: the process's one default arena, the same object every time.
    assert spillarena.default_arena() is spillarena.default_arena()
    out = spillarena.checkpoint(blocks[0], x0.clone().requires_grad_(True))
    out.sum().backward()
    assert spillarena.default_arena().arena is not None


def test_enable_sizes_the_first_arena_from_the_first_input_and_the_layers(spill_env):
    model = tiny_llama(layers=3)
    spillarena.enable(model)
    automatic = spillarena.arena_of(model)
    assert isinstance(automatic, spillarena.AutomaticArena) and automatic.layers == 3
    ids = torch.randint(0, 256, (2, 40))
    model(input_ids=ids, labels=ids).loss.backward()
    # Three inputs as the arena reserves them (its size class), with the growth margin: what a
    # grow would aim at for that step.
    one = spillarena.bytes_for_layer_input((2, 40, 64), torch.float32)
    expected = -(-int(one * 3 * 1.25) // 4096) * 4096
    assert automatic.arena.stats()["initial_capacity_bytes"] == expected
    assert automatic.arena.stats()["overflows"] == 0
    spillarena.disable(model)
    assert spillarena.arena_of(model) is None


def test_a_full_disk_at_the_first_input_keeps_inputs_in_memory_until_a_step_finds_room(
        small_disk):
    blocks, x0 = mlp_blocks(), torch.randn(16, 64)
    assert_as_torchs = as_torch(blocks, x0)
    input_bytes = x0.numel() * 4
    automatic = spillarena.AutomaticArena(small_disk, layers=8, keep_last=0)  # as enable() would
    erring = spillarena.AutomaticArena(small_disk, layers=8, when_full="error")
    filler = fill(small_disk)
    spill = functools.partial(spillarena.checkpoint, arena=automatic)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 4):
            assert_as_torchs(plain_step(blocks, x0, spill))
            assert automatic.arena is None  # no step found room
            assert automatic.stats()["overflows"] == 8 * step
        made_on_a_full_disk = spillarena.AutomaticArena(small_disk)  # no error either
    sizing = [w for w in caught if issubclass(w.category, spillarena.SpillArenaWarning)]
    assert len(sizing) == 1, [str(w.message) for w in sizing]
    assert f"no room for an arena in {str(small_disk)!r}" in str(sizing[0].message)
    assert re.search(r": \d+ bytes \([\d.]+ (B|KiB|MiB)\) free", str(sizing[0].message))
    stats = automatic.stats()
    assert stats["overflow_bytes"] == 3 * 8 * input_bytes
    assert stats["allocations"] == 0 and stats["capacity_bytes"] == 0
    assert made_on_a_full_disk.directory == str(small_disk)
    # when_full="error": the typed error, at the first input and when the AutomaticArena is made.
    with pytest.raises(spillarena.InsufficientSpaceError):
        plain_step(blocks, x0, functools.partial(spillarena.checkpoint, arena=erring))
    with pytest.raises(spillarena.InsufficientSpaceError):
        spillarena.AutomaticArena(small_disk, when_full="error")

    filler.unlink()
    os.sync()  # the freed blocks are the allocator's once the journal commits
    with warnings.catch_warnings():
        warnings.simplefilter("error", spillarena.SpillArenaWarning)
        assert_as_torchs(plain_step(blocks, x0, spill))
    arena = automatic.arena
    assert arena is not None and arena.directory == str(small_disk)
    assert arena.stats()["allocations"] == 8 and arena.stats()["overflows"] == 0
    assert automatic.stats()["overflows"] == 3 * 8  # those before the arena still count
    assert_drained(arena)
    del arena, automatic, erring, made_on_a_full_disk, spill
    gc.collect()  # the spill file's descriptor, before the disk is unmounted


def test_a_forked_child_gets_its_own_default_arena_and_the_parents_keeps_working(spill_env):
    blocks, x0 = mlp_blocks(3), torch.randn(8, 64)
    assert_as_torchs = as_torch(blocks, x0)
    assert_as_torchs(plain_step(blocks, x0, spillarena.checkpoint))
    parents = spillarena.default_arena()
    assert parents.arena is not None
    pid = os.fork()
    if pid == 0:  # the child: its verdict is its exit code, and nothing of pytest runs here
        code = 99
        try:
            torch.set_num_threads(1)
            # torch's own floats computed here too: one thread may sum in another order than two
            as_torch(blocks, x0)(plain_step(blocks, x0, spillarena.checkpoint))
            childs = spillarena.default_arena()
            own_default = childs is not parents and childs.arena.stats()["allocations"] > 0
            code = 2
            try:  # an arena passed explicitly stays the parent's
                spillarena.checkpoint(blocks[0], x0.clone().requires_grad_(True), arena=parents)
            except spillarena.errors.ForkedProcessError:
                code = 0 if own_default else 1
        finally:
            os._exit(code)
    assert wait_for_exit_code(pid) == 0
    assert spillarena.default_arena() is parents
    before = parents.arena.stats()["allocations"]
    assert_as_torchs(plain_step(blocks, x0, spillarena.checkpoint))
    assert parents.arena.stats()["allocations"] > before


# ---------------------------------------------------------------------------------------------
# Gradient accumulation, evaluation under no_grad, two ranks
# ---------------------------------------------------------------------------------------------

def accumulate(model, batches, eval_batch=None):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(21)
    for i, ids in enumerate(batches):
        (model(input_ids=ids, labels=ids).loss / len(batches)).backward()
        if eval_batch is not None and i == 1:
            model.eval()
            with torch.no_grad():
                model(input_ids=eval_batch, labels=eval_batch)
            model.train()
    return gradients(model)


def test_gradient_accumulation_over_lengths_with_an_eval_in_between(spill_env):
    g = torch.Generator().manual_seed(4)
    batches = [torch.randint(0, 256, (2, n), generator=g) for n in (24, 96, 48, 160)]
    evaluation = torch.randint(0, 256, (4, 200), generator=g)
    plain, torchs = tiny_llama(), tiny_llama()
    torchs.activation_checkpointing_enable(activation_checkpointing_kwargs=NON_REENTRANT)
    model = tiny_llama()
    spillarena.enable(model)
    for step in range(2):
        assert_as_torch(accumulate(model, batches, evaluation),
                        accumulate(torchs, batches, evaluation),
                        accumulate(plain, batches, evaluation), case=f"step {step}")
    stats = spillarena.arena_of(model).stats()
    assert stats["overflows"] > 0  # the first micro-batch was the shortest
    assert stats["grows"] >= 1  # at an empty moment between micro-batches
    assert_drained(spillarena.arena_of(model).arena)


def run_rank(rank, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        from torch.nn.parallel import DistributedDataParallel

        # Each rank its own shapes: rank 0 outgrows its first arena, rank 1 never does.
        lengths = [(16, 200, 64), (180, 32, 100)][rank]
        g = torch.Generator().manual_seed(50 + rank)
        batches = [torch.randint(0, 256, (2, n), generator=g) for n in lengths]

        def run(checkpointing):
            model = tiny_llama(layers=2)
            if checkpointing == "spill":
                spillarena.enable(model)
            elif checkpointing == "transformers":
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=NON_REENTRANT)
            ddp = DistributedDataParallel(model)
            grads = []
            for ids in batches:
                ddp.zero_grad(set_to_none=True)
                torch.manual_seed(10 + rank)
                ddp(input_ids=ids, labels=ids).loss.backward()
                grads.append(gradients(model))
            return grads, model

        plain, _ = run(None)
        torchs, _ = run("transformers")
        spilled, model = run("spill")
        assert_as_torch(spilled, torchs, plain, case=f"rank {rank}")
        stats = spillarena.arena_of(model).stats()
        pathlib.Path(out_dir, f"rank{rank}").write_text(
            f"{stats['grows']} {stats['live_regions']} {spillarena.arena_of(model).directory}")
    finally:
        dist.destroy_process_group()
    # gloo's thread at interpreter finalization: test_distributed.leave_without_finalizing
    sys.stdout.flush()
    os._exit(0)


def test_two_gloo_ranks_each_grow_their_own_arena(tmp_path, spill_env):
    mp.spawn(run_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        grows, live, directory = (tmp_path / f"rank{rank}").read_text().split()
        assert (int(grows), int(live), directory) == (1 if rank == 0 else 0, 0, str(spill_env))


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("margin", [0.5, 0.0, -1.0, 17.0, float("nan"), float("inf")])
def test_a_growth_margin_out_of_range_is_refused(spill_dir, margin):
    with pytest.raises(spillarena.InvalidArgumentError, match="growth_margin"):
        spillarena.SpillArena(1 << 20, spill_dir, growth_margin=margin)
    with pytest.raises(spillarena.InvalidArgumentError, match="growth_margin"):
        spillarena.AutomaticArena(spill_dir, growth_margin=margin)


@pytest.mark.parametrize("capacity", [0, -1, -(1 << 40)])
def test_a_capacity_of_zero_or_below_is_refused_where_given(spill_dir, capacity):
    with pytest.raises(spillarena.InvalidArgumentError, match="capacity_bytes"):
        spillarena.SpillArena(capacity, spill_dir)


def test_automatic_arena_refuses_bad_settings_before_the_first_step(spill_dir):
    with pytest.raises(spillarena.InvalidArgumentError, match="sizes itself"):
        spillarena.AutomaticArena(spill_dir, capacity_bytes=1 << 20)
    with pytest.raises(spillarena.errors.DirectoryError, match="does not exist"):
        spillarena.AutomaticArena(spill_dir / "missing")
    with pytest.raises(spillarena.InvalidArgumentError, match="when_full"):
        spillarena.AutomaticArena(spill_dir, when_full="drop")
    for layers in (0, -3, True, 2.5):
        with pytest.raises(spillarena.InvalidArgumentError, match="layers"):
            spillarena.AutomaticArena(spill_dir, layers=layers)
    with pytest.raises(spillarena.InvalidArgumentError, match="arena= must be"):
        spillarena.enable(tiny_llama(layers=1), arena=42)
    with pytest.raises(spillarena.InvalidArgumentError, match="cannot be pickled"):
        import pickle

        pickle.dumps(spillarena.AutomaticArena(spill_dir))


def test_growth_settings_are_options_and_stats(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir, when_full="error", grow=False,
                                  growth_margin=2.0)
    options = arena.options()
    settings = (options["when_full"], options["grow"], options["growth_margin"])
    assert settings == ("error", False, 2.0)
    for key in ("overflows", "overflow_bytes", "capacity_needed_bytes", "initial_capacity_bytes",
                "grows", "grow_failures", "grow_note"):
        assert key in arena.stats()


def test_a_huge_layer_count_sizes_the_first_arena_at_the_largest_capacity(spill_dir):
    # layers x input overflows 64 bits: the first capacity is the largest an arena takes, never a
    # wrapped or refused figure (the disk's room then decides: Note [No room for the first arena])
    for layers in (1 << 40, 1 << 70):
        automatic = spillarena.AutomaticArena(spill_dir, layers=layers)
        capacity = automatic.first_capacity_bytes(torch.zeros(4, 4))
        assert capacity == spillarena._C.MAX_CAPACITY_BYTES // 4096 * 4096
