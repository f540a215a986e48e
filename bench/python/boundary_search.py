"""The search both limit benchmarks share: the largest value (tokens, micro-batch) that trains.

    clock = TrialClock(deadline_s=2400)
    done, cause = clock.run_process(cmd, timeout_s=900)   # a fresh process; None: timed out
    found = bisect_boundary(attempt, start=8, granularity=2, cap=32)
    found["boundary"] = confirm_boundary(attempt, found["largest_ok"], found["first_failed"])

attempt(value, repeat=False) runs one trial and answers True (it trained), False (it failed:
killed, out of memory) or None (stop: the deadline came, or the mode cannot run here). The
caller keeps its own record of the trials; these functions only choose the values.

Used by head_to_head.py (host memory cgroups) and longest_sequence.py (device memory).
"""

import subprocess
import time


class TrialClock:
    """Starts trials as fresh processes and keeps the clock for a --deadline-s."""

    def __init__(self, deadline_s):
        self.deadline_s = deadline_s
        self.started = time.monotonic()

    def time_left(self):
        return self.deadline_s - (time.monotonic() - self.started)

    def run_process(self, cmd, timeout_s, **popen):
        """(the finished process, None), or (None, what stopped it: "--deadline-s" or
        "--trial-timeout-s") once min(timeout_s, the time left) has passed."""
        try:
            return subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=self.timeout(timeout_s), **popen), None
        except subprocess.TimeoutExpired:
            return None, "--deadline-s" if self.time_left() <= 0 else "--trial-timeout-s"

    def timeout(self, timeout_s):
        return max(1.0, min(timeout_s, self.time_left()))


def bisect_boundary(attempt, start, granularity, cap, below_start=False):
    """Doubling from `start` (clamped to `cap`) to the first failure, then bisection between the
    last success and it down to `granularity`. below_start: when `start` itself fails, bisect
    between 0 and it (else the answer is 0). Returns largest_ok (0: nothing trained; None: no
    trial ran), first_failed (None: none failed), capped (`cap` trained: a lower bound) and
    incomplete (an attempt said stop)."""
    found = {"largest_ok": None, "first_failed": None, "capped": False, "incomplete": False}
    low, high, value = 0, None, start
    while high is None:
        ok = attempt(value)
        if ok is None:
            found.update(largest_ok=low or None, incomplete=True)
            return found
        if not ok:
            high = value
        elif value >= cap:
            found.update(largest_ok=value, capped=True)
            return found
        else:
            low, value = value, min(2 * value, cap)
    if low == 0 and not below_start:
        found.update(largest_ok=0, first_failed=high)
        return found
    while high - low > granularity:
        mid = low + (high - low) // 2 // granularity * granularity
        if mid <= low:
            break
        ok = attempt(mid)
        if ok is None:
            found["incomplete"] = True
            break
        low, high = (mid, high) if ok else (low, mid)
    found.update(largest_ok=low, first_failed=high)
    return found


def confirm_boundary(attempt, largest_ok, first_failed):
    """Tries the largest value that trained and the smallest that failed once more each
    (attempt(value, repeat=True)). "confirmed": both repeats agree with the first trials;
    "unstable": one does not; "incomplete": an attempt said stop first. A search without a
    failure (capped) or without a success repeats the one side it has."""
    sides = [(v, ok) for v, ok in ((largest_ok, True), (first_failed, False)) if v]
    repeats = []
    for value, expected in sides:
        ok = attempt(value, repeat=True)
        if ok is None:
            return {"status": "incomplete", "repeats": repeats}
        repeats.append({"value": value, "expected": "ok" if expected else "failed",
                        "agrees": ok == expected})
    return {"status": "confirmed" if all(r["agrees"] for r in repeats) else "unstable",
            "repeats": repeats}
