r"""Head-to-head of activation-memory strategies on a Hugging Face Llama-like model, on the CPU.

    python bench/python/head_to_head.py --out docs/bench/head_to_head_cpu.json     # all parts
    python bench/python/head_to_head.py --parts table --repeats 3 --out table.json
    python bench/python/head_to_head.py --parts lengths --lengths 256,512,1024,2048 \
        --out lengths.json
    python bench/python/head_to_head.py --parts longest --limit-mib 900 --out longest.json
    python bench/python/head_to_head.py --parts batch --batch-limit-mib 1100 --out batch.json

Modes (each run is a fresh process in its own memory cgroup):
  none                 no checkpointing (the reference gradients)
  torch                transformers' gradient checkpointing (torch.utils.checkpoint, non-reentrant)
  torch_trimmed        the same under an allocator policy that returns freed memory: the child
                       starts with GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072:
                       glibc.malloc.trim_threshold=131072 (what spill::return_freed_memory_promptly
                       sets), so a comparison does not give only spillarena a tuned allocator;
                       every child reports whether the tunables took effect (malloc_probe)
  spillarena_trimmed   spillarena_buffered under the same tunables: both sides with one allocator
  disco                the seed: axolotl 0.21.0's disk offload ("Disco") driven directly,
                       Disco.get_instance(prefetch_size=1, prefetch_to_gpu=False, save_workers=4)
                       and model._set_gradient_checkpointing(True,
                                                             hf_grad_checkpoint_disk_offload_wrapper)
  spillarena_buffered  spillarena.enable with SpillArena(capacity, dir, io="buffered")
  spillarena_direct    the same with io="direct" (O_DIRECT through the staging pool)
  spillarena_reentrant spillarena_buffered with use_reentrant=True: the autograd Function per
                       layer that was the only form before the non-reentrant default
  attention_trimmed    spillarena_trimmed with context_fn=selective_checkpoint_contexts(
                       ATTENTION_OPS): attention's outputs to the arena too (room for twice
                       the layer inputs), not recomputed
  offload_trimmed      no checkpointing, every saved tensor of at least 64 KiB to a SpillArena
                       with room for 32 layer inputs per layer from the first step
                       (spillarena.offload), under the same tunables

The model: transformers' StableLM architecture configured as a Llama (SwiGLU MLP, full rotary,
sequential residual; LayerNorm instead of RMSNorm) because it has a dropout in its config that
stays inside each decoder layer (hidden_dropout = 0.1, on the MLP output): Llama's only dropout
is attention_dropout, and on the CPU an attention dropout moves scaled_dot_product_attention off
its flash kernel onto the math path, whose T x T matrices dwarf every layer input (measured:
259 MiB at 4096 tokens without dropout, 2310 MiB with). --arch llama runs Llama with
attention_dropout instead. Random weights from a fixed seed; nothing is downloaded.

Parts:
  table    every mode at one shape, --repeats rounds with the mode order rotated each round
           (the host is shared and noisy: ratios are taken within a round). Per mode: step time,
           peak RssAnon (sampled every 2 ms), the cgroup's peak (page cache included), bytes
           written (/proc/self/io wchar, and the arena's own count), files created in the temp
           directory (inotify; spillarena's O_TMPFILE spill file has no name), and whether every
           parameter's gradient equals no checkpointing's bit for bit (torch.equal).
  lengths  step time per mode at each of --lengths tokens, on the longest part's model
           (--search-layers, batch 1), no memory limit (each run still has its cgroup, to
           measure it); --repeats rounds per length, the mode order rotated; ratios to
           transformers' checkpointing and to Disco taken within a round. The "step time <= the
           seed's at every length" check, where no limit makes one mode thrash.
  longest  the largest sequence length that trains per mode under --limit-mib (memory cgroup),
           --search-layers decoder layers: doubling from --start-seq, then bisection to
           --granularity, up to --max-seq; each trial a fresh process in a fresh cgroup (ok, or
           oom: killed). By default (--limit-mib 0) the limit is calibrated: transformers'
           checkpointing's cgroup peak at --start-seq plus --calibration-margin-mib, and the cap
           is 2 x --start-seq — the question being whether a mode trains twice the length.
  batch    the same search over the micro-batch at --batch-seq tokens, under --batch-limit-mib:
           the "saving reaches a user who changes nothing" check (transformers' checkpointing in
           the default environment against spillarena with the package's malloc policy), and,
           with torch_trimmed, what spilling buys beyond the allocator.

Both searches confirm their boundary: once the largest value that trained and the smallest that
was killed are found, each is tried once more (a fresh process in a fresh cgroup). The boundary
is "confirmed" when both repeats agree with the first trials, "unstable" otherwise (glibc's
dynamic mmap threshold can make a killed batch sit below one that trains), with the trials.

Disco is not installed anywhere: the axolotl 0.21.0 wheel is downloaded once with
`pip download --no-deps --python-version 3.12 --only-binary=:all: axolotl==0.21.0` into
.deps/axolotl-wheel/ (git-ignored; axolotl requires Python >= 3.12, hence --python-version),
unzipped there, and that directory is put on sys.path in the disco child only. Its
gradient_checkpointing package imports nothing beyond torch, transformers and packaging, so no
shim is needed; none of its code is copied. --axolotl-dir points at an unzipped wheel elsewhere.

The spillarena modes call spillarena.malloc.use_for_spilling(arena) themselves until
enable()/checkpoint() call it (--malloc keep: glibc's default behaviour, for comparison).
"""

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import boundary_search
import h2h_support

MODES = ("none", "torch", "torch_trimmed", "disco", "spillarena_buffered", "spillarena_direct",
         "spillarena_reentrant", "spillarena_trimmed", "attention_trimmed", "offload_trimmed")
SPILLING = ("spillarena_buffered", "spillarena_direct", "spillarena_reentrant",
            "spillarena_trimmed", "attention_trimmed")
TRIMMED = ("torch_trimmed", "spillarena_trimmed", "attention_trimmed",
           "offload_trimmed")  # started with GLIBC_TUNABLES below
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AXOLOTL_VERSION = "0.21.0"
AXOLOTL_DIR = os.path.join(REPO, ".deps", "axolotl-wheel", "axolotl-" + AXOLOTL_VERSION)
GOAL_SEQ_RATIO = 2.0
GOAL_BATCH_RATIO = 2.0
GOAL_STEP_RATIO = 1.1
# spill::return_freed_memory_promptly's thresholds, set at process start through glibc's tunables.
TRIMMED_TUNABLES = "glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072"
SHAPE = ("arch", "layers", "hidden", "heads", "intermediate", "vocab", "dropout", "steps", "malloc")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="table,lengths,longest,batch")
    p.add_argument("--arch", default="stablelm", choices=("stablelm", "llama"))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=172)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seq", type=int, default=256, help="table: tokens per sequence")
    p.add_argument("--batch", type=int, default=2, help="table: micro-batch")
    p.add_argument("--steps", type=int, default=2, help="timed steps (after one warm-up step)")
    p.add_argument("--repeats", type=int, default=2, help="table: rounds, mode order rotated")
    p.add_argument("--modes", default=",".join(
        m for m in MODES if m != "spillarena_reentrant" and m not in TRIMMED))
    p.add_argument("--limit-mib", type=int, default=0,
                   help="longest: the memory cgroup limit; 0: transformers' checkpointing's peak "
                        "at --start-seq + --calibration-margin-mib")
    p.add_argument("--calibration-margin-mib", type=int, default=8)
    p.add_argument("--search-layers", type=int, default=32)
    p.add_argument("--search-hidden", type=int, default=64)
    p.add_argument("--search-heads", type=int, default=2)
    p.add_argument("--start-seq", type=int, default=1024, help="longest: the first length tried")
    p.add_argument("--granularity", type=int, default=256)
    p.add_argument("--max-seq", type=int, default=0, help="longest: the cap (0: 2 x --start-seq)")
    p.add_argument("--search-modes", default="torch,disco,spillarena_buffered,spillarena_direct")
    p.add_argument("--lengths", default="256,512,1024,2048",
                   help="lengths: the sequence lengths timed")
    p.add_argument("--length-modes", default="torch,disco,spillarena_buffered,spillarena_direct")
    p.add_argument("--batch-limit-mib", type=int, default=0,
                   help="batch: as --limit-mib, at --start-batch")
    p.add_argument("--batch-layers", type=int, default=8)
    p.add_argument("--batch-hidden", type=int, default=256)
    p.add_argument("--batch-heads", type=int, default=4)
    p.add_argument("--batch-seq", type=int, default=128)
    p.add_argument("--start-batch", type=int, default=8)
    p.add_argument("--batch-granularity", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=0, help="batch: the cap (0: 2 x --start-batch)")
    p.add_argument("--batch-modes", default="torch,spillarena_buffered,spillarena_direct")
    p.add_argument("--malloc", default="package", choices=("package", "keep"),
                   help="spillarena modes: the package's malloc policy, or glibc's defaults")
    p.add_argument("--trial-timeout-s", type=float, default=900.0)
    p.add_argument("--deadline-s", type=float, default=2400.0, help="start no trial after this")
    p.add_argument("--spill-dir", default=None,
                   help="default: spillarena.default_spill_directory()")
    p.add_argument("--axolotl-dir", default=AXOLOTL_DIR)
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--reference", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("layers", "hidden", "heads", "intermediate", "vocab", "seq", "batch", "steps",
                 "repeats"):
        if not 1 <= getattr(args, name) <= 1 << 20:
            p.error(f"--{name} must be between 1 and 1048576")
    for hidden, heads in (("hidden", "heads"), ("search_hidden", "search_heads"),
                          ("batch_hidden", "batch_heads")):
        if getattr(args, hidden) % getattr(args, heads):
            p.error(
                f"--{hidden.replace('_', '-')} must be a multiple of --{heads.replace('_', '-')}")
    try:
        lengths = [int(v) for v in args.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths: comma-separated whole numbers, not {args.lengths!r}")
    if not all(1 <= v <= 1 << 20 for v in lengths):
        p.error("--lengths: each between 1 and 1048576")
    unknown_parts = set(args.parts.split(",")) - {"table", "lengths", "longest", "batch"}
    if unknown_parts:
        p.error(f"--parts: unknown part(s) {sorted(unknown_parts)}; "
                "choose from table,lengths,longest,batch")
    for flag in ("modes", "search_modes", "batch_modes", "length_modes"):
        unknown = set(getattr(args, flag).split(",")) - set(MODES)
        if unknown:
            p.error(f"--{flag.replace('_', '-')}: unknown mode(s) {sorted(unknown)}")
    return args


# ---------------------------------------------------------------------------------------------
# The measured run (child process): one mode, one shape.


def build_model(args, seq, torch):
    torch.manual_seed(0)
    common = dict(vocab_size=args.vocab, hidden_size=args.hidden,
                  intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                  num_attention_heads=args.heads, num_key_value_heads=args.heads,
                  max_position_embeddings=seq, use_cache=False)
    if args.arch == "stablelm":
        from transformers import StableLmConfig, StableLmForCausalLM

        config = StableLmConfig(**common, hidden_dropout=args.dropout, attention_dropout=0.0,
                                partial_rotary_factor=1.0, use_parallel_residual=False)
        model = StableLmForCausalLM(config)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**common, attention_dropout=args.dropout))
    model.train()
    return model


def load_disco(axolotl_dir):
    """axolotl 0.21.0's Disco and its transformers wrapper, imported from the unzipped wheel."""
    if not os.path.isdir(os.path.join(axolotl_dir, "axolotl")):
        raise RuntimeError(f"no unzipped axolotl wheel at {axolotl_dir}; the parent fetches it")
    sys.path.insert(0, axolotl_dir)
    from axolotl.monkeypatch.gradient_checkpointing import hf_grad_checkpoint_disk_offload_wrapper
    from axolotl.monkeypatch.gradient_checkpointing.offload_disk import Disco

    return Disco, hf_grad_checkpoint_disk_offload_wrapper


def disco_call(disco, wrapper):
    """axolotl's wrapper, or — where it cannot tell this transformers' layer calls apart — the
    branch it takes for them under the transformers axolotl 0.21.0 pins (5.20.1).

    The wrapper detects a GradientCheckpointingLayer through `layer.func.__self__`: in 5.20.1
    the layer passes partial(super().__call__, **kwargs), a bound method; from 5.23 on it passes
    partial(forward, self, **kwargs), whose func has no __self__, and the wrapper raises
    AttributeError. Its GradientCheckpointingLayer branch is Disco.apply(layer, *args): the same
    call is made here, nothing of Disco's code is changed or copied."""

    def call(layer, *args, use_reentrant=None):
        if isinstance(layer, functools.partial) and not hasattr(layer.func, "__self__"):
            return disco.apply(layer, *args)
        return wrapper(layer, *args, use_reentrant=use_reentrant)

    return call


def prepare(args, mode, shape, model, torch):
    """Turns the mode on; returns the arena (or None) and the context each step runs in."""
    arena = _prepare(args, mode, shape, model, torch)
    if mode != "offload_trimmed":
        return arena, contextlib.nullcontext
    import spillarena

    return arena, functools.partial(spillarena.offload, arena, min_bytes=64 << 10)


def _prepare(args, mode, shape, model, torch):
    if mode == "offload_trimmed":
        # Room for every saved tensor of one step from the start: a trial may be one step, and
        # an AutomaticArena's first step keeps what does not fit in memory until it grows.
        # offload_modes.py measured 379 MB saved per step at 8 layers of 2 MiB inputs: some 24
        # layer inputs' worth per layer. (offload() puts the malloc policy in force.)
        import spillarena

        capacity = 32 * spillarena.bytes_for_layer_inputs(args.layers, shape, torch.float32)
        return spillarena.SpillArena(capacity, args.workdir)
    if mode in ("torch", "torch_trimmed"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif mode == "disco":
        disco, wrapper = load_disco(args.axolotl_dir)
        disco.get_instance(prefetch_size=1, prefetch_to_gpu=False, save_workers=4)
        model._set_gradient_checkpointing(True, disco_call(disco, wrapper))
    elif mode in SPILLING:
        import spillarena

        capacity = spillarena.bytes_for_layer_inputs(args.layers, shape, torch.float32)
        if mode == "attention_trimmed":  # each attention's output is a layer input's size
            capacity *= 2
        io = "direct" if mode == "spillarena_direct" else "buffered"
        arena = spillarena.SpillArena(capacity, args.workdir, io=io)
        extra = {"use_reentrant": True} if mode == "spillarena_reentrant" else {}
        if mode == "attention_trimmed":
            extra["context_fn"] = functools.partial(spillarena.selective_checkpoint_contexts,
                                                    spillarena.ATTENTION_OPS, arena=arena)
        spillarena.enable(model, arena, **extra)
        if args.malloc == "package" and not package_calls_malloc_hook(spillarena):
            apply_malloc_policy_here(model, arena, spillarena, torch)
        return arena
    return None


def package_calls_malloc_hook(spillarena):
    import inspect

    # job.py runs both forms' layers since the non-reentrant default; checkpoint.py held the
    # reentrant Function before (this looked there, and raised once it moved)
    module = sys.modules.get("spillarena.job") or sys.modules["spillarena.checkpoint"]
    return "layer_done" in inspect.getsource(module)


def apply_malloc_policy_here(model, arena, spillarena, torch):
    """What enable()/checkpoint() are to do themselves (until they do): put spillarena.malloc's
    policy in force and call its hook when each checkpointed layer's forward and backward are
    done. An identity node on the layer input runs its backward right after the checkpoint's."""
    from spillarena import malloc

    class AfterLayerBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.device_type = x.device.type
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            malloc.layer_done(ctx.device_type)
            return grad

    def checkpoint(function, hidden_states, *args, **kwargs):
        out = spillarena.checkpoint(function, AfterLayerBackward.apply(hidden_states), *args,
                                    arena=arena, **kwargs)
        malloc.layer_done(hidden_states.device.type)
        return out

    if malloc.use_for_spilling(arena):
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=checkpoint)


def malloc_probe():
    """Whether glibc's mmap threshold is fixed (GLIBC_TUNABLES took effect), seen in behaviour:
    malloc 1 MiB, free it, malloc 1 MiB again and count mmapped chunks (mallinfo2's hblks) while
    it is held. glibc's default raises its dynamic threshold above a freed mmapped chunk, so the
    second block comes from the heap; a threshold fixed at 128 KiB maps it again."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                   "usmblks", "fsmblks", "uordblks", "fordblks",
                                                   "keepcost")]

    probe = {"GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES")}
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError) as error:
        probe["mmap_after_free"] = f"not measured: {error}"
        return probe
    libc.free(libc.malloc(1 << 20))
    before = libc.mallinfo2().hblks
    block = libc.malloc(1 << 20)
    probe["mmap_after_free"] = libc.mallinfo2().hblks > before  # True: threshold fixed
    libc.free(block)
    return probe


def gradient_comparison(model, reference_path, torch):
    """The first step's gradients against no checkpointing's, every parameter, bit for bit."""
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    if not os.path.exists(reference_path):
        torch.save(grads, reference_path)
        return {"reference": True}
    reference = torch.load(reference_path)
    differing = [n for n in reference if n not in grads or not torch.equal(grads[n], reference[n])]
    worst = max((float((grads[n] - reference[n]).abs().max()) for n in differing if n in grads),
                default=0.0)
    return {
        "bitwise_equal": not differing and len(grads) == len(reference),
        "parameters": len(reference), "parameters_differing": len(differing), "max_abs_diff": worst
    }


def _arena_stats(arena):
    """An arena's stats; an AutomaticArena's are its SpillArena's once it made one."""
    made = getattr(arena, "arena", None)
    return (made if made is not None else arena).stats()


def run_child(args, mode, seq, batch):
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    created = h2h_support.CreatedFiles(args.workdir)
    model = build_model(args, seq, torch)
    shape = (batch, seq, args.hidden)
    arena, step_context = prepare(args, mode, shape, model, torch)
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab, (batch, seq))
    times, losses, result = [], [], {
        "mode": mode, "seq": seq, "batch": batch, "threads": torch.get_num_threads(),
        "malloc_probe": malloc_probe()
    }
    io_before = h2h_support.io_counters()
    with h2h_support.RssAnonSampler() as rss:
        for step in range(args.steps + 1):
            if step == 1:
                io_before = h2h_support.io_counters()
                written_before = _arena_stats(arena).get("bytes_written", 0) if arena else 0
            start = time.perf_counter()
            with step_context():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if step > 0:
                times.append(time.perf_counter() - start)
            losses.append(loss.item())
            if step == 0 and args.reference:
                result["gradients"] = gradient_comparison(model, args.reference, torch)
            model.zero_grad(set_to_none=True)
    io_after = h2h_support.io_counters()
    result.update(step_s=times, losses=losses, peak_rss_anon_bytes=rss.peak,
                  vm_hwm_bytes=h2h_support.status_bytes("VmHWM"),
                  wchar_per_step=(io_after.get("wchar", 0)
                                  - io_before.get("wchar", 0)) / args.steps,
                  write_bytes_per_step=(io_after.get("write_bytes", 0)
                                        - io_before.get("write_bytes", 0)) / args.steps)
    if arena is not None:
        stats = _arena_stats(arena)
        result["arena_bytes_written_per_step"] = (
            (stats.get("bytes_written", 0) - written_before) / args.steps)
        result["io"] = {k: stats.get(k) for k in ("io_mode", "io_backend", "io_note",
                                                   "staging_bytes")}
        from spillarena import malloc

        result["malloc"] = malloc.state()
    if mode == "disco":
        time.sleep(0.2)  # Disco's save workers report files just after forward
    result["created"] = created.close()
    return result


# ---------------------------------------------------------------------------------------------
# The parent: fetching Disco, starting children in cgroups, the searches.


def fetch_axolotl(axolotl_dir):
    """Unzips the axolotl wheel into axolotl_dir (downloading it once, no dependencies)."""
    if os.path.isdir(os.path.join(axolotl_dir, "axolotl")):
        return None
    wheels = os.path.dirname(axolotl_dir)
    wheel = os.path.join(wheels, f"axolotl-{AXOLOTL_VERSION}-py3-none-any.whl")
    if not os.path.exists(wheel):
        done = subprocess.run([
            sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--python-version", "3.12",
            "--only-binary=:all:", f"axolotl=={AXOLOTL_VERSION}", "-d", wheels
        ], capture_output=True, text=True)
        if done.returncode != 0:
            return f"pip download axolotl=={AXOLOTL_VERSION} failed: {done.stderr.strip()[-300:]}"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(axolotl_dir)
    return None


class Runner(boundary_search.TrialClock):
    def __init__(self, args, spill_parent):
        super().__init__(args.deadline_s)
        self.args, self.spill_parent, self.count = args, spill_parent, 0
        self.lock = threading.Lock()
        self.cgroup_reason = h2h_support.MemoryCgroup.available()

    def run(self, mode, seq, batch, limit_bytes=None, overrides=(), reference=None):
        """One child in its own cgroup and temp directory; its result with the cgroup's view."""
        with self.lock:
            self.count += 1
            number = self.count
        workdir = tempfile.mkdtemp(prefix=f"h2h-{mode}-", dir=self.spill_parent)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--workdir", workdir,
               "--seq", str(seq), "--batch", str(batch)]
        for name in SHAPE:
            cmd += [f"--{name}", str(dict(overrides).get(name, getattr(self.args, name)))]
        cmd += ["--axolotl-dir", self.args.axolotl_dir]
        if reference:
            cmd += ["--reference", reference]
        env = dict(os.environ, TMPDIR=workdir)  # where Disco's mkdtemp puts its files
        env.pop("GLIBC_TUNABLES", None)
        if mode in TRIMMED:
            env["GLIBC_TUNABLES"] = TRIMMED_TUNABLES
        cg = None
        if self.cgroup_reason is None:
            cg = h2h_support.MemoryCgroup.create(f"spillarena-h2h-{os.getpid()}-{number}",
                                                 limit_bytes)
        start = time.monotonic()
        done, cause = self.run_process(cmd, self.args.trial_timeout_s, env=env,
                                       preexec_fn=cg.enter if cg else None)
        result = parse_child(done) if done else {"status": "timeout", "message": cause}
        result.update(mode=mode, seq=seq, batch=batch, wall_s=round(time.monotonic() - start, 1))
        if cg:
            result["cgroup_peak_bytes"] = cg.peak_bytes()
            kills = cg.oom_kills()
            if kills and result["status"] != "ok":
                result["status"] = "oom"
            cg.remove()
        shutil.rmtree(workdir, ignore_errors=True)
        return result


def parse_child(done):
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        result = json.loads(lines[-1])
        result["status"] = "ok"
        return result
    tail = done.stderr.strip().splitlines()[-1:] or [""]
    status = "oom" if done.returncode in (-9, 137) else "error"
    return {"status": status, "message": f"exit {done.returncode}: {tail[0][:300]}"}


def summarize_mode(runs):
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return {
            "status": runs[0]["status"] if runs else "not run",
            "message": runs[0].get("message") if runs else None
        }
    grads = [r["gradients"] for r in ok if "gradients" in r and "reference" not in r["gradients"]]
    return {
        "step_s_median": statistics.median(t for r in ok for t in r["step_s"]),
        # Contention only ever adds time: the fastest step is the least disturbed estimate.
        "step_s_min": min(t for r in ok for t in r["step_s"]),
        "peak_rss_anon_bytes_max": max(r["peak_rss_anon_bytes"] for r in ok),
        "cgroup_peak_bytes_max": max((r.get("cgroup_peak_bytes") or 0) for r in ok) or None,
        # io_uring's writes do not show in /proc/self/io's wchar; the arena counts its own.
        "bytes_written_per_step": statistics.median(
            max(r["wchar_per_step"], r.get("arena_bytes_written_per_step") or 0) for r in ok),
        "malloc": ok[0].get("malloc"),
        "arena_bytes_written_per_step": ok[0].get("arena_bytes_written_per_step"),
        "files_created": max(r["created"]["files"] for r in ok),
        "directories_created": max(r["created"]["directories"] for r in ok),
        "gradients_bitwise_equal": all(g["bitwise_equal"] for g in grads) if grads else "reference",
        "max_abs_grad_diff": max((g["max_abs_diff"] for g in grads), default=0.0),
        "losses": ok[0]["losses"],
        "runs": len(ok)
    }


def run_rounds(runner, modes, seq, batch, repeats, label, overrides=(), reference=None,
               progress=lambda runs: None):
    """Every mode `repeats` times at one shape, the order rotated each round; runs[m][i] is mode
    m in round i."""
    runs = {m: [] for m in modes}
    for round_index in range(repeats):
        order = modes[round_index % len(modes):] + modes[:round_index % len(modes)]
        for mode in order:
            r = runner.run(mode, seq, batch, overrides=overrides, reference=reference)
            runs[mode].append(r)
            progress(runs)
            print(
                f"  {label} round {round_index + 1} {mode:20s} {r['status']:6s} "
                f"{statistics.median(r['step_s']) * 1e3 if r.get('step_s') else 0:8.0f} ms",
                file=sys.stderr, flush=True)
    return runs


def run_table(args, runner, progress=lambda partial: None):
    modes = args.modes.split(",")
    reference = os.path.join(runner.spill_parent, "reference_grads.pt")
    if "none" in modes:  # the reference is written first, so every round can compare
        modes = ["none"] + [m for m in modes if m != "none"]
    runs = run_rounds(runner, modes, args.seq, args.batch, args.repeats, "table",
                      reference=reference, progress=lambda runs: progress({"runs": runs}))
    return summarize_table(args, runs)


def step_ratios(runs, base):
    """Per mode: the ratios of its median step to `base`'s, round by round."""
    return {
        m: [
            statistics.median(r["step_s"]) / statistics.median(b["step_s"])
            for r, b in zip(mode_runs, runs.get(base, [])) if r.get("step_s") and b.get("step_s")
        ] for m, mode_runs in runs.items()
    }


def summarize_table(args, runs):
    """Per mode over the rounds; step-time ratios to torch are taken within each round (runs[m][i]
    is mode m in round i), so a round slowed by the host's other work does not skew them."""
    summary = {m: summarize_mode(r) for m, r in runs.items()}
    for m, ratios in step_ratios(runs, "torch").items():
        if ratios:
            summary[m]["step_vs_torch_median_of_rounds"] = statistics.median(ratios)
            summary[m]["step_vs_torch_rounds"] = ratios
    shape = {"seq": args.seq, "batch": args.batch, "layers": args.layers, "hidden": args.hidden}
    return {"shape": shape, "summary": summary, "runs": runs}


def longest_overrides(args):
    """The model of the longest part (and of the lengths part): a 7B model's depth, small width."""
    return {"layers": args.search_layers, "hidden": args.search_hidden, "heads": args.search_heads,
            "intermediate": int(args.search_hidden * 2.6875) // 4 * 4}


def run_lengths(args, runner, progress=lambda partial: None):
    """Step time per mode at each length, no limit; ratios to torch and Disco within a round."""
    modes, overrides = args.length_modes.split(","), longest_overrides(args)
    results = {}
    for seq in (int(v) for v in args.lengths.split(",")):
        runs = run_rounds(runner, modes, seq, 1, args.repeats, f"seq {seq}", overrides=overrides)
        summary = {m: summarize_mode(r) for m, r in runs.items()}
        for base in ("torch", "disco"):
            for m, ratios in step_ratios(runs, base).items():
                if ratios:
                    summary[m][f"step_vs_{base}_median_of_rounds"] = statistics.median(ratios)
                    summary[m][f"step_vs_{base}_rounds"] = ratios
        results[str(seq)] = {"summary": summary, "runs": runs}
        progress({"overrides": overrides, "batch": 1, "lengths": results})
    return {"overrides": overrides, "batch": 1, "lengths": results}


def search(runner, mode, axis, start, granularity, cap, limit_bytes, fixed, overrides, log):
    """Doubling then bisection on `axis` ('seq' or 'batch'); each trial a fresh cgroup. Then
    the boundary is confirmed: the largest value that trained and the smallest that failed are
    each tried once more (boundary_search)."""
    trials = []

    def attempt(value, repeat=False):
        if runner.time_left() <= 0:
            return None
        seq, batch = (value, fixed) if axis == "seq" else (fixed, value)
        r = runner.run(mode, seq, batch, limit_bytes=limit_bytes, overrides=overrides)
        slim = {k: r.get(k) for k in ("seq", "batch", "status", "message", "cgroup_peak_bytes",
                                      "peak_rss_anon_bytes", "wall_s")}
        slim["step_s_median"] = statistics.median(r["step_s"]) if r.get("step_s") else None
        slim["mmap_after_free"] = (r.get("malloc_probe") or {}).get("mmap_after_free")
        slim["repeat"] = repeat
        trials.append(slim)
        log(f"  {axis} search {mode:20s} {axis} {value:6d} {r['status']:6s} "
            f"peak {(r.get('cgroup_peak_bytes') or 0) / 2**20:7.0f} MiB  {r['wall_s']} s"
            + ("  (repeat)" if repeat else ""))
        return r["status"] == "ok"

    found = boundary_search.bisect_boundary(attempt, start, granularity, cap)
    found["trials"] = trials
    found["boundary"] = boundary_search.confirm_boundary(attempt, found["largest_ok"],
                                                         found["first_failed"])
    return found


def run_search(args, runner, part):
    if runner.cgroup_reason:
        return {"skipped": runner.cgroup_reason}
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if part == "longest":
        modes, limit = args.search_modes.split(","), args.limit_mib << 20
        overrides = dict(longest_overrides(args), steps=1)
        axis, start, granularity, cap, fixed = (
            "seq", args.start_seq, args.granularity, args.max_seq, 1)
        cap = cap or 2 * start
    else:
        modes, limit = args.batch_modes.split(","), args.batch_limit_mib << 20
        overrides = {
            "layers": args.batch_layers, "hidden": args.batch_hidden, "heads": args.batch_heads,
            "steps": 1, "intermediate": int(args.batch_hidden * 2.6875) // 8 * 8, "vocab": 1024
        }
        axis, start, granularity, cap, fixed = (
            "batch", args.start_batch, args.batch_granularity, args.max_batch, args.batch_seq)
        cap = cap or 2 * start
    calibration = None
    if limit == 0:
        # The limit is where transformers' checkpointing just trains at `start` (its cgroup peak
        # unconstrained, plus a margin); the searches then ask who trains 2x that under it.
        seq, batch = (start, fixed) if axis == "seq" else (fixed, start)
        calibration = runner.run("torch", seq, batch, overrides=overrides)
        if calibration["status"] != "ok":
            return {"skipped": f"calibration run failed: {calibration.get('message')}"}
        limit = calibration["cgroup_peak_bytes"] + (args.calibration_margin_mib << 20)
        log(f"  {part}: limit {limit >> 20} MiB (torch at {axis} {start}: cgroup peak "
            f"{calibration['cgroup_peak_bytes'] >> 20} MiB + {args.calibration_margin_mib} MiB)")
    # The modes' searches run side by side (a search only asks "did it train under the limit?");
    # their step times are then comparable with each other, not with the table's.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(modes)) as pool:
        futures = {
            m: pool.submit(search, runner, m, axis, start, granularity, cap, limit, fixed,
                           overrides, log) for m in modes
        }
        results = {m: f.result() for m, f in futures.items()}
    base = results.get("torch", {}).get("largest_ok")
    for r in results.values():
        r["ratio_vs_torch"] = (r["largest_ok"] / base
                               if base and r["largest_ok"] is not None else None)
    return {"axis": axis, "limit_bytes": limit, "fixed": fixed, "overrides": overrides,
            "results": results,
            "calibration": None if calibration is None else
            {k: calibration.get(k)
             for k in ("seq", "batch", "cgroup_peak_bytes", "peak_rss_anon_bytes")}}


def environment(runner):
    import platform

    import torch
    import transformers

    import spillarena

    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "spillarena": spillarena.__version__, "axolotl_disco": AXOLOTL_VERSION,
            "python": platform.python_version(), "cpus": os.cpu_count(), "loadavg_at_start": load,
            "cgroup": runner.cgroup_reason or "per-run memory cgroups",
            "glibc": os.confstr("CS_GNU_LIBC_VERSION")}


def main(argv):
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args, args.child, args.seq, args.batch)))
        return 0
    reason = fetch_axolotl(args.axolotl_dir)
    if reason:
        print(f"head_to_head: disco mode unavailable: {reason}", file=sys.stderr)
        for flag in ("modes", "search_modes"):
            setattr(args, flag, ",".join(m for m in getattr(args, flag).split(",") if m != "disco"))
    import spillarena  # only for the default spill directory (never tmpfs)

    parent = args.spill_dir or spillarena.default_spill_directory()
    report = {
        "command": "python bench/python/head_to_head.py " + " ".join(argv), "args": vars(args),
        "disco": reason or f"axolotl {AXOLOTL_VERSION} from {args.axolotl_dir}"
    }
    with tempfile.TemporaryDirectory(prefix="spillarena-h2h-", dir=parent) as spill:
        runner = Runner(args, spill)
        report["environment"] = environment(runner)
        for part in args.parts.split(","):
            if part == "table":
                report[part] = run_table(
                    args, runner, lambda partial: write(args.out, dict(report, table=partial)))
            elif part == "lengths":
                report[part] = run_lengths(
                    args, runner, lambda partial: write(args.out, dict(report, lengths=partial)))
            else:
                report[part] = run_search(args, runner, part)
            write(args.out, report)
    report["environment"]["loadavg_at_end"] = open("/proc/loadavg").read().split()[:3]
    write(args.out, report)
    print(text_table(report))
    return 0


def write(path, report):
    if path:
        with open(path + ".tmp", "w") as out:
            out.write(json.dumps(report, indent=1) + "\n")
        os.replace(path + ".tmp", path)


def text_table(report):
    rows = []
    if "table" in report:
        rows.append(f"{'mode':20s} {'step ms':>8s} {'vs torch':>8s} {'RssAnon MiB':>11s}"
                    f" {'cgroup MiB':>10s} {'written MiB':>11s} {'files':>6s}  grads bitwise")
        for mode, s in report["table"]["summary"].items():
            if "step_s_median" not in s:
                rows.append(f"{mode:20s} {s['status']}: {s.get('message')}")
                continue
            rows.append(f"{mode:20s} {s['step_s_median'] * 1e3:8.0f}"
                        f" {s.get('step_vs_torch_median_of_rounds', 0):8.2f}"
                        f" {s['peak_rss_anon_bytes_max'] / 2**20:11.0f}"
                        f" {(s['cgroup_peak_bytes_max'] or 0) / 2**20:10.0f}"
                        f" {s['bytes_written_per_step'] / 2**20:11.1f} {s['files_created']:6d}"
                        f"  {s['gradients_bitwise_equal']}")
    if "lengths" in report:
        for seq, entry in report["lengths"]["lengths"].items():
            rows.append(f"seq {seq}: " + ", ".join(
                f"{m} {s['step_s_median'] * 1e3:.0f} ms"
                f" ({s.get('step_vs_disco_median_of_rounds', 0):.2f}x disco)"
                for m, s in entry["summary"].items() if "step_s_median" in s))
    for part in ("longest", "batch"):
        if part in report and "results" in report[part]:
            rows.append(f"{part}: largest {report[part]['axis']}"
                        f" under {report[part]['limit_bytes'] >> 20} MiB")
            for mode, r in report[part]["results"].items():
                ratio = f"{r['ratio_vs_torch']:.2f}x" if r.get("ratio_vs_torch") else "-"
                axis, boundary = report[part]["axis"], r.get("boundary", {})
                peak = max((t["cgroup_peak_bytes"] or 0 for t in r["trials"]
                            if t["status"] == "ok" and t[axis] == r["largest_ok"]), default=0)
                rows.append(f"  {mode:20s} {r['largest_ok']!s:>6s} {ratio:>7s}"
                            f"  (first failure {r['first_failed'] or 'none: the cap'};"
                            f" peak at largest {peak / 2**20:.0f} MiB;"
                            f" boundary {boundary.get('status')}: "
                            + ", ".join(f"{b['value']} {'agrees' if b['agrees'] else 'differs'}"
                                        for b in boundary.get("repeats", [])) + ")")
        elif part in report:
            rows.append(f"{part}: skipped: {report[part].get('skipped')}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
