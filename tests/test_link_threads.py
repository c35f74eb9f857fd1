"""The emulated link's CPU clock from more than one thread (ess.link). Its clock was the calling thread's CPU time:
a job submitted from a second thread, whose CPU time starts near 0, queued behind the first thread's clock and waited
until its own thread had run that many CPU seconds (1-31 s for 10 bytes). A job now queues only behind jobs that
are still crossing, whichever thread submitted it or waits for it. (Times are the link's own model, not wall time.)"""
import threading
import time

import numpy as np
import pytest

from ess.link import EmulatedLink


def _burn(cpu_s: float) -> None:
    """Run this thread for ``cpu_s`` CPU seconds."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def _in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:        # noqa: BLE001 - re-raised in the caller
            out["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _job(link, nbytes=10):
    buf = np.zeros(nbytes, np.uint8)
    return link.submit("h2d", 0, [(lambda: buf.fill(1), nbytes)])


@pytest.mark.parametrize("clock", ["cpu", "wall"])
def test_a_second_thread_does_not_queue_behind_the_first_threads_clock(clock):
    with EmulatedLink(1.0, clock=clock) as link:            # 1 GB/s: 10 bytes cross in 10 ns of the link's time
        _burn(0.3)                                          # this thread's CPU clock is well past the other's
        _job(link).wait()
        job = _in_thread(lambda: _job(link))
        job.wait()
        assert job.start_s == job.submit_s                 # the link was idle: no queue
        # 10 ns of the link's time; the ends are clock readings of ~1e4-1e5 s (uptime on the wall clock), whose
        # difference carries their rounding (~1e-11 s): 1e-10 s still tells 10 ns from anything else
        assert job.end_s - job.start_s == pytest.approx(10 / 1e9, abs=1e-10)


def test_a_job_submitted_in_one_thread_and_waited_in_another_lands_on_one_clock():
    with EmulatedLink(1.0, clock="cpu") as link:
        _burn(0.3)
        job = _job(link)
        waited = _in_thread(job.wait)
        assert job.returned_s >= job.end_s
        assert 0 <= waited < 0.25                          # on the link's clock: not the 0.3 s this thread ran before


def test_jobs_from_two_threads_cross_one_after_the_other():
    with EmulatedLink(1.0, clock="cpu") as link:
        first = _job(link, 1000)
        second = _in_thread(lambda: _job(link, 1000))
        first.wait()
        second.wait()
        assert second.start_s >= first.end_s
        assert second.end_s - second.start_s == pytest.approx(1000 / 1e9)


def test_one_thread_reads_its_own_cpu_time():
    """Used by one thread, the link's CPU clock is that thread's CPU time (the engine's timer compares the two)."""
    with EmulatedLink(None, clock="cpu") as link:
        def run():
            before = time.thread_time()
            job = _job(link)
            job.wait()
            return before, job.submit_s, job.returned_s, time.thread_time()
        before, submit, returned, after = _in_thread(run)
        assert before <= submit <= returned <= after


def test_a_forked_child_is_told_to_make_its_own_link():
    import os
    with EmulatedLink(1.0) as link:
        pid = os.fork()
        if pid == 0:                                      # the child: its parent's copy worker does not run here
            code = 1
            try:
                _job(link, 1 << 20)
            except RuntimeError as exc:
                code = 0 if "forked child" in str(exc) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        _job(link, 1 << 20).wait()                        # the parent's link still works
