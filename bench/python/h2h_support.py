"""Process-level measurements for head_to_head.py: memory cgroups, RssAnon, files created, I/O.

Linux only; every helper says why it cannot measure instead of guessing (None, or a reason).

    cg = MemoryCgroup.create("spillarena-h2h-1", limit_bytes=2 << 30)   # None + reason if unusable
    subprocess.run(cmd, preexec_fn=cg.enter)                            # the child starts inside it
    cg.peak_bytes(), cg.oom_kills(); cg.remove()
"""

import ctypes
import json
import os
import select
import struct
import threading
import time

# ---------------------------------------------------------------------------------------------
# Memory cgroups (v2 where the memory controller is on the unified hierarchy, else v1).


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text.split()[0])


def _cgroup_root():
    """(version, directory under which we may create a memory cgroup) or (None, reason)."""
    v2 = "/sys/fs/cgroup"
    try:
        with open(os.path.join(v2, "cgroup.controllers")) as f:
            if "memory" in f.read().split():
                return 2, v2
    except OSError:
        pass
    v1 = "/sys/fs/cgroup/memory"
    if os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
        return 1, v1
    return None, "no memory cgroup controller mounted (neither v2 memory nor /sys/fs/cgroup/memory)"


class MemoryCgroup:
    """One memory cgroup for one child process; limit optional (None: measure only)."""

    def __init__(self, version, path):
        self.version, self.path = version, path

    @staticmethod
    def available():
        """None when cgroups can be made here, else the reason they cannot."""
        version, root = _cgroup_root()
        if version is None:
            return root
        if not os.access(root, os.W_OK):
            return f"{root} is not writable (not root, or a read-only cgroup mount)"
        return None

    @classmethod
    def create(cls, name, limit_bytes=None):
        version, root = _cgroup_root()
        path = os.path.join(root, name)
        os.mkdir(path)
        cg = cls(version, path)
        if version == 2:
            # No swap here, but a host with swap would let the limit leak into it.
            cg._write("memory.swap.max", "0", missing_ok=True)
            cg._write("memory.max", str(limit_bytes) if limit_bytes else "max")
        elif limit_bytes:
            cg._write("memory.limit_in_bytes", str(limit_bytes))
        return cg

    def _write(self, leaf, text, missing_ok=False):
        try:
            with open(os.path.join(self.path, leaf), "w") as f:
                f.write(text)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def enter(self):
        """preexec_fn: moves the calling (child) process into the cgroup before exec."""
        self._write("cgroup.procs", str(os.getpid()))

    def peak_bytes(self):
        leaf = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return _read_int(os.path.join(self.path, leaf))

    def oom_kills(self):
        leaf = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.path, leaf)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
        return None

    def remove(self):
        for _ in range(50):  # the killed child's pages may take a moment to be uncharged
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# Inside the measured process.


def status_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def io_counters():
    """/proc/self/io: wchar (bytes handed to write calls) and write_bytes (sent to storage)."""
    counters = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                counters[key] = int(value)
    except OSError:
        pass
    return counters


class RssAnonSampler:
    """Peak RssAnon, sampled every interval_s on a thread (the kernel keeps no RssAnon peak)."""

    def __init__(self, interval_s=0.002):
        self.interval_s, self.peak, self._stop = interval_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, status_bytes("RssAnon"))
            time.sleep(self.interval_s)

    def __enter__(self):
        self.peak = status_bytes("RssAnon")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_bytes("RssAnon"))


_IN_CREATE, _IN_MOVED_TO, _IN_ISDIR, _IN_NONBLOCK = 0x100, 0x80, 0x40000000, 0o4000
_EVENT = struct.Struct("iIII")


class CreatedFiles:
    """Counts names created under a directory tree (inotify IN_CREATE / IN_MOVED_TO), watching
    each new subdirectory as it appears. An O_TMPFILE file gets no name and is not counted —
    which is the point: it leaves nothing behind in the directory."""

    def __init__(self, directory):
        self.files, self.directories = 0, 0
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(_IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._paths = {}
        self._watch(directory)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _watch(self, path):
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _IN_CREATE | _IN_MOVED_TO)
        if wd >= 0:
            self._paths[wd] = path

    def _drain(self):
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        offset = 0
        while offset < len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if mask & _IN_ISDIR:
                self.directories += 1
                self._watch(os.path.join(self._paths.get(wd, ""), os.fsdecode(name)))
            else:
                self.files += 1

    def _run(self):
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.05)
            if ready:
                self._drain()

    def close(self):
        self._stop.set()
        self._thread.join()
        self._drain()
        os.close(self._fd)
        return {"files": self.files, "directories": self.directories}


def write_report(path, report):
    """Writes `report` as JSON to `path` (nothing when path is empty), whole or not at all."""
    if path:
        with open(path + ".tmp", "w") as out:
            out.write(json.dumps(report, indent=1) + "\n")
        os.replace(path + ".tmp", path)
