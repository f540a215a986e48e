"""Who holds the device memory at a step's peak, from the CUDA caching allocator's own trace.

    torch.cuda.memory._record_memory_history(max_entries=100_000, context="alloc", stacks="python")
    ...one training step, with phase_mark()-style markers...
    snapshot = torch.cuda.memory._snapshot()
    peak = at_peak(snapshot, device=0, rules=Rules(...),
                   known=[("weights", [p.data_ptr() ...]), ("grads", [p.grad.data_ptr() ...])])
    peak["allocated_bytes"], peak["owners"]["layer_inputs_held"]["bytes"], peak["phase"]

A snapshot (torch/cuda/memory.py, `_snapshot`) is {"segments": [{"device", "address",
"total_size", "blocks": [{"address", "size", "requested_size", "state", "frames"}]}],
"device_traces": [[{"action", "addr", "size", "stream", "frames", "time_us"}]]}: the
allocator's state when it was taken, and one list per device of what it did while recording
(alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map,
segment_unmap, oom, snapshot). A block counts as allocated from its alloc to its free_requested
(torch.cuda.max_memory_allocated counts the same way), and as pending from free_requested to
free_completed (another stream may still use it: it is neither allocated nor reusable). Frames
are innermost first, {"filename", "line", "name"}; stacks="python" gives the Python frames of the
thread that allocated (none for kernels the autograd engine runs in C++).

Replaying the trace gives the allocated bytes after every event, hence the peak and the blocks
alive at it: those allocated by then and not yet freed, whether their alloc is in the trace or
came before it (those are the snapshot's survivors and the blocks the trace frees without having
seen them allocated). Each is given one owner by the first rule that matches (Rules). The
reserved bytes at the peak are the snapshot's less the segments the trace added after the peak;
the allocator's cache is reserved less allocated.

No torch here: tests/python/test_gpu_scripts.py feeds it fabricated snapshots on the CPU.
"""

import bisect
import collections

# The owners, in the order a table shows them.
OWNERS = (
    "weights",             # known (at_peak's known=): a parameter's storage
    "grads",               # known: a parameter's .grad at the end of the step
    "stack_output",        # known: the last layer's output, kept by the step until its end
    "layer_inputs_held",   # a layer output of the forward still on the device when backward began
    "copies_in_flight",    # ... freed before backward began: held only until its copy completed
    "restored_inputs",     # device memory the stash allocated to read an input back (prefetched
                           # or restored)
    "forward_working",     # the forward's other allocations (the layer running, the loss)
    "recompute",           # the layer recomputed in backward (its output included)
    "backward",            # the rest of backward: activation gradients and temporaries
    "before_step",         # allocated before the trace began, neither weight nor grad
    "other",
)

SEGMENTS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


class Rules:
    """What the frames of an allocation say about it. Each code location is (file suffix,
    function names): a frame matches when its filename ends with the suffix and its function is
    one of the names.
      layer_output: the function whose result is a layer's output (the next layer's input);
      layer_code:   the layer's own functions (its working memory, in forward or recompute);
      restore:      where the stash allocates device memory for an input read back;
      marker:       the phase marker (see phase_marks): allocations freed at once that show
                    where each phase of the step begins."""

    DEVICE_COPIES = ("spillarena/device_copies.py", ("empty",))

    def __init__(self, layer_output, layer_code, restore=DEVICE_COPIES, marker=None):
        self.layer_output, self.layer_code = layer_output, layer_code
        self.restore, self.marker = restore, marker

    @staticmethod
    def matches(frames, location):
        if location is None:
            return False
        suffix, names = location
        return any(f.get("name") in names and str(f.get("filename", "")).endswith(suffix)
                   for f in frames)


class Allocation:
    """One allocation as the trace saw it: event indexes of its alloc (-1: before the trace),
    free_requested and free_completed (None: not in the trace)."""

    __slots__ = ("addr", "allocated_at", "frames", "freed_at", "released_at", "size", "stream")

    def __init__(self, addr, size, allocated_at, frames, stream=None):
        self.addr, self.size, self.allocated_at, self.frames = addr, size, allocated_at, frames
        self.stream = stream
        self.freed_at = self.released_at = None

    def allocated_during(self, index):
        """Counted in the allocated bytes just after event `index` (-1: before the first)."""
        return self.allocated_at <= index and (self.freed_at is None or self.freed_at > index)

    def pending_during(self, index):
        return (self.freed_at is not None and self.freed_at <= index
                and (self.released_at is None or self.released_at > index))


# ---------------------------------------------------------------------------------------------
# Reading a snapshot.


def block_frames(block):
    """A block's allocation frames, in the current format or the older one ("history")."""
    if "frames" in block:
        return block["frames"] or []
    history = block.get("history") or [{}]
    return history[-1].get("frames") or []


def device_segments(snapshot, device):
    return [s for s in snapshot.get("segments", []) if s.get("device", device) == device]


def device_trace(snapshot, device):
    traces = snapshot.get("device_traces") or []
    return traces[device] if device < len(traces) else []


def allocations(snapshot, device):
    """Every allocation the trace or the snapshot shows, in order of first sight."""
    trace = device_trace(snapshot, device)
    seen, current, pending = [], {}, {}
    for index, event in enumerate(trace):
        action, addr = event.get("action"), event.get("addr")
        if action == "alloc":
            a = Allocation(addr, event["size"], index, event.get("frames") or [],
                           event.get("stream"))
            current[addr] = a
            seen.append(a)
        elif action == "free_requested":
            a = current.pop(addr, None)
            if a is None:  # allocated before the trace began
                a = Allocation(addr, event["size"], -1, [])
                seen.append(a)
            a.freed_at = index
            pending[addr] = a
        elif action == "free_completed":
            a = pending.pop(addr, None)
            if a is None:  # requested before the trace began: pending since before it
                a = Allocation(addr, event["size"], -1, [])
                a.freed_at = -1
                seen.append(a)
            a.released_at = index
    for segment in device_segments(snapshot, device):
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated" or block["address"] in current:
                continue
            a = Allocation(block["address"], block["size"], -1, block_frames(block))
            seen.append(a)  # alive from before the trace to the snapshot
    return seen, trace


def levels(records, trace):
    """Allocated bytes before the first event (index -1) and after each event."""
    start = sum(a.size for a in records if a.allocated_at < 0 and a.freed_at != -1)
    out, level = [start], start
    for event in trace:
        if event.get("action") == "alloc":
            level += event["size"]
        elif event.get("action") == "free_requested":
            level -= event["size"]
        out.append(level)
    return out  # out[i + 1] is the level after event i


def reserved_after(snapshot, device, trace, index):
    """Reserved bytes just after event `index`: the snapshot's less what the trace changed
    after it."""
    end = sum(s.get("total_size", 0) for s in device_segments(snapshot, device))
    later = sum(SEGMENTS.get(e.get("action"), 0) * e.get("size", 0) for e in trace[index + 1:])
    return end - later


def phase_marks(trace, rules, unit):
    """[(phase number, event index)] of the markers' allocations: a marker allocates
    unit * (phase number + 1) bytes inside rules.marker."""
    marks = []
    for index, event in enumerate(trace):
        if event.get("action") == "alloc" and Rules.matches(event.get("frames") or [],
                                                             rules.marker):
            marks.append((event["size"] // unit - 1, index))
    return marks


def phase_of(index, phases):
    """The name of the phase an event index falls in; phases: [(name, first index)] in order."""
    name = "before_phases"
    for phase, first in phases:
        if index >= first:
            name = phase
    return name


# ---------------------------------------------------------------------------------------------
# Owners.


def _contains(starts, a):
    """Whether one of the sorted addresses lies inside a's block."""
    i = bisect.bisect_left(starts, a.addr)
    return i < len(starts) and starts[i] < a.addr + a.size


def owner(a, rules, phases, known, backward_at):
    """The first rule that matches, in the order of OWNERS. known: [(owner, sorted addresses)],
    addresses taken when the snapshot was: they name only blocks alive then."""
    if a.freed_at is None:
        for who, starts in known:
            if _contains(starts, a):
                return who
    if a.allocated_at < 0:
        return "before_step"
    if Rules.matches(a.frames, rules.restore):
        return "restored_inputs"
    phase = phase_of(a.allocated_at, phases)
    in_backward = backward_at is not None and a.allocated_at >= backward_at
    if Rules.matches(a.frames, rules.layer_output) and not in_backward:
        held = a.freed_at is None or backward_at is None or a.freed_at >= backward_at
        return "layer_inputs_held" if held else "copies_in_flight"
    if in_backward:
        return "recompute" if Rules.matches(a.frames, rules.layer_code) else "backward"
    if phase == "forward":
        return "forward_working"
    return "other"


def innermost(frames, skip=("torch/", "<")):
    """file:line function of the innermost frame outside torch, or "(no Python frame)"."""
    for f in frames:
        filename = str(f.get("filename", ""))
        if not any(part in filename for part in skip):
            return f"{filename.rsplit('/', 1)[-1]}:{f.get('line')} {f.get('name')}"
    if frames:
        f = frames[0]
        return f"{str(f.get('filename', '')).rsplit('/', 1)[-1]}:{f.get('line')} {f.get('name')}"
    return "(no Python frame)"


def at_peak(snapshot, device, rules, known=(), phase_names=(), unit=512, largest=12):
    """The peak of allocated bytes in the trace and who holds them. known: [(owner, data_ptrs)]
    taken when the snapshot was (weights, grads, ...), tried first, in order. phase_names[k]
    names the phase whose marker allocated unit * (k + 1) bytes (phase_marks); the phase named
    "backward" separates a layer input held into backward from one freed before it."""
    records, trace = allocations(snapshot, device)
    level = levels(records, trace)
    peak_index = max(range(len(level)), key=level.__getitem__) - 1  # -1: before the trace
    marks = phase_marks(trace, rules, unit) if rules.marker else []
    phases = [(phase_names[k] if 0 <= k < len(phase_names) else f"phase{k}", i) for k, i in marks]
    backward_at = next((i for name, i in phases if name == "backward"), None)
    known = [(who, sorted(ptrs)) for who, ptrs in known]
    owners = {name: {"bytes": 0, "count": 0} for name in OWNERS}
    owners.update((who, {"bytes": 0, "count": 0}) for who, _ in known if who not in owners)
    alive, pending_bytes, per_stream = [], 0, collections.Counter()
    for a in records:
        if a.allocated_during(peak_index):
            who = owner(a, rules, phases, known, backward_at)
            owners[who]["bytes"] += a.size
            owners[who]["count"] += 1
            per_stream[str(a.stream) if a.stream is not None else "before the trace"] += a.size
            alive.append((a, who))
        elif a.pending_during(peak_index):
            pending_bytes += a.size
    allocated = level[peak_index + 1]
    reserved = reserved_after(snapshot, device, trace, peak_index)
    per_phase = collections.OrderedDict()
    for i in range(-1, len(trace)):
        name = phase_of(i, phases)
        if level[i + 1] > per_phase.get(name, -1):
            per_phase[name] = level[i + 1]
    alive.sort(key=lambda pair: -pair[0].size)
    return {
        "events": len(trace),
        "peak_event": peak_index,
        "phase": phase_of(peak_index, phases),
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "allocator_cache_bytes": reserved - allocated,
        "pending_free_bytes": pending_bytes,  # part of the cache: freed, another stream may use it
        "owners": owners,
        "bytes_per_stream": dict(per_stream),  # the streams the blocks were allocated on
        "peak_bytes_per_phase": dict(per_phase),
        "largest": [{"bytes": a.size, "owner": who, "where": innermost(a.frames)}
                    for a, who in alive[:largest]],
        "end_allocated_bytes": level[-1],
    }


def check_sum(peak):
    """The owners' bytes add up to the allocated bytes at the peak (a self-check of the replay)."""
    return sum(o["bytes"] for o in peak["owners"].values()) == peak["allocated_bytes"]


def table(rows):
    """rows: [(label, peak)] -> text, one line per label, GB per owner."""
    every = list(OWNERS) + [n for _, p in rows for n in p["owners"] if n not in OWNERS]
    names = [n for n in dict.fromkeys(every)
             if any(p["owners"].get(n, {}).get("bytes") for _, p in rows)]
    short = {"layer_inputs_held": "inputs held", "copies_in_flight": "in flight",
             "restored_inputs": "restored", "forward_working": "fwd work",
             "before_step": "before", "stack_output": "output"}
    head = (f"{'GB at the peak':24s} {'alloc':>6s} {'cache':>6s} {'pend.':>6s} {'phase':9s}"
            + "".join(f" {short.get(n, n):>11s}" for n in names))
    lines = [head]
    for label, p in rows:
        lines.append(
            f"{label:24s} {p['allocated_bytes'] / 1e9:6.2f} {p['allocator_cache_bytes'] / 1e9:6.2f}"
            f" {p['pending_free_bytes'] / 1e9:6.2f} {p['phase'][:9]:9s}"
            + "".join(f" {p['owners'].get(n, {}).get('bytes', 0) / 1e9:11.2f}" for n in names))
    return "\n".join(lines)
