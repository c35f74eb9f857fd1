"""The host <-> device link a decode step's copies cross, as something a schedule can issue work on and wait for.

A decode step (:mod:`ess.decode`) submits its copies -- the misses host -> device (H2D), the new tokens' entries
device -> host (D2H) -- as :class:`Transfer` jobs and waits for them where its schedule needs the bytes. Three links:

* :class:`SyncLink` runs each job at once, in the caller's thread (the serial order; no overlap is possible);
* :class:`EmulatedLink` a copy worker thread beside the compute thread moves the real bytes of the larger jobs (each
  job is a list of chunks, e.g. one request's misses; a small job is copied by its waiter), and a link clock of
  ``GB_per_s`` says when they land: a job starts crossing
  when it is submitted or when the job before it has crossed, and lands ``bytes / bandwidth`` later (on the
  monotonic clock), so a job lasts as long as the link would take, whenever the worker thread gets a CPU. Jobs
  cross one after the other, in the order submitted (a half-duplex link). ``GB_per_s=None`` lands each job when it
  is copied, at the machine's own speed;
* :class:`CudaStreamLink` a CUDA copy stream: jobs are enqueued on it, waits are stream events.

Every link keeps each job in ``records`` (a :class:`Transfer`: kind, layer, bytes, and when it was submitted, crossed
and was waited for) on its clock: :func:`time.perf_counter` (wall time), or for an :class:`EmulatedLink` optionally
:func:`time.thread_time`, the CPU time of the compute thread that submits and waits (see :data:`CLOCKS`; a second
thread joins that clock where it stands).
"""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Sequence

from . import validate

__all__ = ["CLOCKS", "INLINE_BELOW_BYTES", "Transfer", "SyncLink", "EmulatedLink", "CudaStreamLink",
           "make_link"]

#: ``"wall"``: :func:`time.perf_counter`. ``"cpu"``: :func:`time.thread_time` of the calling (compute) thread -- on a
#: shared machine, the time this thread ran, without the other processes' share; an emulated link on this clock
#: crosses its bytes in the compute thread's CPU seconds (its waits spin, so that the clock runs while they wait).
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}

Chunk = tuple          # (fn: Callable[[], None], nbytes: int)


class _SharedCpuClock:
    """The CPU clock of one emulated link, read from any thread: each thread's :func:`time.thread_time` plus an
    offset that brings it onto the link's time. A thread's offset is set when it first reads the clock (it joins at
    the link's latest reading) and grows whenever another thread has read a later time, so the clock never runs
    backwards and a job waits its own crossing time in CPU seconds, whichever thread submits or waits for it.
    (Without it, a second thread's CPU time, near 0, waited until that thread had run as many CPU seconds as the
    first: 1-31 s for a 10-byte job.) Read by one thread only, it is that thread's CPU time exactly."""

    def __init__(self):
        self._lock = threading.Lock()
        self._offsets: dict = {}               # thread id -> offset (s)
        self._now: float | None = None         # the latest reading, any thread

    def __call__(self) -> float:
        raw = time.thread_time()
        tid = threading.get_ident()
        with self._lock:
            off = self._offsets.get(tid)
            if off is None:                    # a new thread (or a reused id): join at the link's latest reading
                off = 0.0 if self._now is None else max(self._now - raw, 0.0)
            now = raw + off
            if self._now is not None and now < self._now:     # another thread read later: catch up
                off += self._now - now
                now = self._now
            self._offsets[tid] = off
            self._now = now
            return now


class Transfer:
    """A submitted job and its record: ``kind`` (``"h2d"``/``"d2h"``), ``layer``, ``nbytes``, and on the clock of
    the link's clock (``clock``) when it was submitted (``submit_s``), began and ended crossing (``start_s``,
    ``end_s``), and when the caller's :meth:`wait` returned (``returned_s``; ``waited_s`` how long it blocked).
    :meth:`wait` re-raises a failure of the job's copy."""

    def __init__(self, kind: str, layer: int, nbytes: int, clock=time.perf_counter):
        self.kind, self.layer, self.nbytes, self.clock = kind, layer, nbytes, clock
        self.submit_s = clock()
        self.start_s = self.end_s = self.returned_s = float("nan")
        self.waited_s = 0.0
        self.error: BaseException | None = None
        self._done = threading.Event()

    def _finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> float:
        """Block until the job has landed; returns (and keeps in ``waited_s``) the seconds spent waiting."""
        t0 = self.clock()
        self._done.wait()
        self.returned_s = self.clock()
        self.waited_s = self.returned_s - t0
        if self.error is not None:
            raise self.error
        return self.waited_s


def _check_chunks(chunks: Sequence) -> list:
    if isinstance(chunks, (str, bytes)) or not hasattr(chunks, "__iter__") or getattr(chunks, "ndim", 1) == 0:
        raise TypeError(f"chunks must be a list of (callable, nbytes) pairs, got {type(chunks).__name__}")
    chunks = list(chunks)
    for i, chunk in enumerate(chunks):
        if not (isinstance(chunk, tuple) and len(chunk) == 2 and callable(chunk[0])):
            raise TypeError(f"chunks[{i}] must be a (callable, nbytes) pair, got {chunk!r}")
        validate.integer("nbytes", chunk[1], lo=0)
    return chunks


def _check_job(kind, layer) -> None:
    validate.one_of("kind", kind, ("h2d", "d2h"))
    validate.integer("layer", layer, lo=0)


class _Link:
    name = "link"
    GB_per_s: float | None = None

    def __init__(self):
        self.records: list[Transfer] = []

    def submit(self, kind: str, layer: int, chunks: Sequence[Chunk]) -> Transfer:
        raise NotImplementedError

    def busy_s(self, start: int = 0) -> float:
        """Seconds the link spent moving the finished jobs recorded from number ``start`` on."""
        from .validate import integer
        start = integer("start", start)
        return sum(r.end_s - r.start_s for r in self.records[start:] if r.done())

    def close(self) -> None:
        """Stop the link's worker, if any (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SyncLink(_Link):
    """Each job runs in the caller's thread when it is submitted (no overlap): the serial baseline."""

    name = "sync"

    def submit(self, kind, layer, chunks):
        _check_job(kind, layer)
        chunks = _check_chunks(chunks)
        job = Transfer(kind, layer, sum(n for _, n in chunks))
        self.records.append(job)
        job.start_s = time.perf_counter()
        try:
            for fn, _ in chunks:
                fn()
        except BaseException as exc:          # noqa: BLE001 - handed to the waiter, as a worker would
            error = exc
        else:
            error = None
        job.end_s = time.perf_counter()
        job._finish(error)
        return job


class _PacedTransfer(Transfer):
    """A job on an :class:`EmulatedLink`: it lands at ``due_s`` on the link's clock (its ``end_s``), and a wait
    returns once that time has come and its bytes are copied. Whoever gets to it first copies it: the worker, or the
    waiter (which then does not depend on when the worker thread is scheduled)."""

    def __init__(self, kind, layer, nbytes, submit_s, start_s, due_s, chunks, clock):
        super().__init__(kind, layer, nbytes, clock)
        self.submit_s, self.start_s, self.due_s = submit_s, start_s, due_s
        self._chunks = chunks
        self._claim = threading.Lock()

    def _copy(self, blocking: bool) -> None:
        """Copy the job's bytes unless someone else has claimed it (then, if ``blocking``, wait for them)."""
        if self._claim.acquire(blocking=False):
            error = None
            try:
                for fn, _ in self._chunks:
                    fn()
            except BaseException as exc:      # noqa: BLE001 - handed to the waiter
                error = exc
            self._chunks = None
            self.end_s = self.due_s                 # the link's clock; the copy is how the bytes get there
            self._finish(error)
        elif blocking:
            self._done.wait()

    def done(self) -> bool:
        return super().done() and self.clock() >= self.due_s

    def wait(self) -> float:
        clock = self.clock
        t0 = clock()
        self._copy(blocking=True)
        if clock is time.perf_counter and self.due_s - clock() > _SLEEP_AHEAD_S:
            time.sleep(self.due_s - clock() - _SLEEP_AHEAD_S)
        while clock() < self.due_s:            # spin (the last stretch of wall time; all of CPU time)
            pass
        self.returned_s = clock()
        self.waited_s = self.returned_s - t0
        if self.error is not None:
            raise self.error
        return self.waited_s


#: Jobs below this many bytes are copied by their waiter, not the copy worker (design choice: well below what a copy
#: costs in the time a handoff to the worker costs the compute thread, see :class:`EmulatedLink`; 64 KiB, as the Numba
#: transfer kernel's single-thread limit, ess.kernels.transfer.numba_cpu.PARALLEL_MIN_BYTES)
INLINE_BELOW_BYTES = 1 << 16

# a wait sleeps until this long before the job is due, then spins (a thread woken from sleep on a loaded machine
# may run late; spinning the last stretch keeps the landing time the link's). Design choice, like CUDA's default
# of spinning in cudaEventSynchronize.
_SLEEP_AHEAD_S = 2e-3


class EmulatedLink(_Link):
    """A link of ``GB_per_s`` (GB = 1e9 B; ``None``: unpaced) emulated by a copy worker thread and a link clock.

    The worker moves the real bytes of each job (its chunks, e.g. one request's misses each) as soon as it gets to
    them, beside the compute thread; a waiter that finds a job not yet taken copies it itself, so a late worker
    thread (a loaded machine) never delays a landing. The link's clock says when the bytes land: a job submitted at
    ``s`` starts crossing at ``max(s, the end of the job before it)`` and lands ``bytes / bandwidth`` later;
    :meth:`Transfer.wait` returns once it has landed and its bytes are copied. So a job lasts what the link would
    take, and jobs cross one after the other in the order submitted (one half-duplex link). Unpaced, a job lands
    when it is submitted and a wait returns when its bytes are copied. A chunk that raises stops its job; the error
    is re-raised by :meth:`Transfer.wait`.

    A job of fewer than ``inline_below_bytes`` bytes is not handed to the worker: its waiter copies it (it still
    lands when the link's clock says). Handing it over would cost the compute thread more than the copy: the worker
    must be woken and must take Python's lock from the compute thread, about 150 us per job measured on the loaded
    2-core machine (cProfile of the engine's offloaded decode at a 64-token context: 1,076 jobs, 0.16 s in the
    submitting thread's waits for the lock), where copying 64 KB takes about 10 us. Larger jobs go to the worker,
    whose copy can overlap the compute thread's work. Default :data:`INLINE_BELOW_BYTES`; 0 hands every job to the
    worker."""

    name = "emulated"

    def __init__(self, GB_per_s: float | None, *, clock: str = "wall", inline_below_bytes: int | None = None):
        super().__init__()
        self.inline_below_bytes = (INLINE_BELOW_BYTES if inline_below_bytes is None
                                   else validate.integer("inline_below_bytes", inline_below_bytes, lo=0))
        self.GB_per_s = None if GB_per_s is None else validate.real("GB_per_s", GB_per_s, lo=0.0, lo_open=True)
        validate.one_of("clock", clock, tuple(CLOCKS))
        # the CPU clock shared by every thread that submits or waits (see _SharedCpuClock); wall time is shared as is
        self.clock = _SharedCpuClock() if clock == "cpu" else CLOCKS[clock]
        self._per_byte = 0.0 if self.GB_per_s is None else 1.0 / (self.GB_per_s * 1e9)
        self._free_at = 0.0                   # when the link's clock has crossed every job submitted so far
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="ess-link", daemon=True)
        self._thread.start()

    def submit(self, kind, layer, chunks):
        _check_job(kind, layer)
        chunks = _check_chunks(chunks)
        if os.getpid() != self._pid:            # a forked child: the copy worker is the parent's (not running here)
            raise RuntimeError(f"this EmulatedLink belongs to process {self._pid}; a forked child (process "
                               f"{os.getpid()}) must make its own link")
        if not self._thread.is_alive():
            raise RuntimeError("the link is closed")
        nbytes = sum(n for _, n in chunks)
        with self._lock:
            now = self.clock()
            start = max(now, self._free_at)
            self._free_at = start + nbytes * self._per_byte
            job = _PacedTransfer(kind, layer, nbytes, now, start, self._free_at, chunks, self.clock)
            self.records.append(job)
        if nbytes >= self.inline_below_bytes:           # a smaller job is copied by its waiter (see the class)
            self._queue.put(job)
        return job

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job._copy(blocking=False)

    def busy_s(self, start: int = 0) -> float:
        with self._lock:
            return super().busy_s(start)

    def close(self) -> None:
        if os.getpid() != self._pid:            # a forked child: nothing of the parent's worker to stop here
            return
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


class _StreamTransfer(Transfer):
    """A job on a CUDA stream: landed when its end event has completed; its interval is timed by CUDA events."""

    def __init__(self, kind: str, layer: int, nbytes: int, stream_of, begin, end):
        super().__init__(kind, layer, nbytes)
        self._device, self._begin, self._end = stream_of, begin, end

    def wait(self) -> float:
        import torch
        t0 = time.perf_counter()
        torch.cuda.current_stream(self._device).wait_event(self._end)
        self._end.synchronize()
        self.returned_s = time.perf_counter()
        self.waited_s = self.returned_s - t0
        if not self.done():
            self.start_s = self.submit_s
            self.end_s = self.submit_s + self._begin.elapsed_time(self._end) * 1e-3
            self._finish()
        return self.waited_s


class CudaStreamLink(_Link):
    """Jobs enqueued on a CUDA copy stream (``torch.cuda.Stream``); :meth:`Transfer.wait` makes the compute stream
    wait for the job's end event and synchronises on it, so the wait is the stall the host sees. Intervals are
    timed with CUDA events, placed on the host clock at submission."""

    name = "cuda_stream"

    def __init__(self, device="cuda"):
        super().__init__()
        import torch
        self._torch = torch
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)

    def submit(self, kind, layer, chunks):
        torch = self._torch
        chunks = _check_chunks(chunks)
        nbytes = sum(n for _, n in chunks)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))      # inputs written by compute so far
        job = _StreamTransfer(kind, layer, nbytes, self.device, begin, end)
        with torch.cuda.stream(self.stream):
            begin.record()
            for fn, _ in chunks:
                fn()
            end.record()
        self.records.append(job)
        return job


def make_link(GB_per_s: float | None = None, *, device: str = "cpu", emulate: bool = True,
              clock: str = "wall") -> _Link:
    """The link for a device: on CUDA a copy stream; on the CPU an :class:`EmulatedLink` of ``GB_per_s`` on
    ``clock`` (``emulate=False``: a :class:`SyncLink`)."""
    from .kernels import check_device, cuda_available
    device = check_device(device)
    emulate = validate.boolean("emulate", emulate)
    if device.startswith("cuda"):
        if not cuda_available():
            raise ValueError(f"device={device!r} was asked for but no CUDA device is available")
        return CudaStreamLink(device)
    if not emulate:
        validate.one_of("clock", clock, tuple(CLOCKS))
        if GB_per_s is not None:
            validate.real("GB_per_s", GB_per_s, lo=0.0, lo_open=True)
    return EmulatedLink(GB_per_s, clock=clock) if emulate else SyncLink()
