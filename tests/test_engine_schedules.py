"""The order of a decode step's stages under each schedule (ess.decode.run_layer), as the paper draws them: a wrong
edit of a schedule (a wait moved, a copy issued late) changes the order and fails here. And the link's contract."""
import threading
import time

import numpy as np
import pytest
import torch

from ess.decode import run_layer
from ess.link import EmulatedLink, SyncLink, make_link


class _Plan:
    def __init__(self, rid, n_misses):
        self.request_id, self.n_misses = rid, n_misses


class _Cache:
    entry_bytes = 10

    def __init__(self, log):
        self.log = log

    def plan(self, rid, layer, indices, scores=None):
        self.log.append(f"plan {rid}")
        return _Plan(rid, 3)

    def copy(self, plan):
        self.log.append(f"copy {plan.request_id}")

    def commit(self, plan):
        self.log.append(f"commit {plan.request_id}")
        return plan


class _Wiring:
    def __init__(self, log):
        self.log = log

    def select(self, rows):
        self.log.append(f"select {[int(r) for r in rows]}")
        return np.zeros((len(rows), 2), np.int64), np.zeros((len(rows), 2))

    def attend(self, plans, rows, part):
        self.log.append(f"attend {part} {[int(r) for r in rows]}")

    def merge(self, rows):
        self.log.append(f"merge {[int(r) for r in rows]}")

    def finish(self):
        self.log.append("finish")

    def new_entries(self):
        self.log.append("new entries")
        return torch.ones((len(self.rids), 10), dtype=torch.uint8)


class _DeferredLink:
    """Runs a job's copies when it is waited for, and logs submissions and waits: the order is the schedule's."""

    name = "deferred"

    def __init__(self, log):
        self.log, self.records = log, []

    def submit(self, kind, layer, chunks):
        self.log.append(f"submit {kind}")
        log = self.log

        class Job:
            waited_s = 0.0

            def wait(self_inner):
                log.append(f"wait {kind}")
                for fn, _ in chunks:
                    fn()
        return Job()


def _order(schedule, B=2):
    log = []
    wiring = _Wiring(log)
    wiring.rids = list(range(B))
    staging = torch.zeros((1, B, 10), dtype=torch.uint8)
    run_layer(_Cache(log), 0, list(range(B)), wiring, schedule=schedule, link=_DeferredLink(log), staging=staging)
    return log


def test_none_is_fully_serial():
    # PreAttn -> Indexer -> [D2H, H2D] -> Attn -> O_proj -> MLP (paper-facts.md "Overlap strategies")
    assert _order("none") == [
        "select [0, 1]", "plan 0", "plan 1", "new entries", "submit d2h", "wait d2h", "submit h2d", "wait h2d",
        "copy 0", "copy 1", "attend all [0, 1]", "merge [0, 1]", "commit 0", "commit 1", "finish"]


def test_dual_attention_attends_the_hits_while_the_misses_cross():
    # Indexer -> Attn0 || H2D -> Attn1 -> merge -> O_proj || D2H
    assert _order("da") == [
        "select [0, 1]", "plan 0", "plan 1", "submit h2d", "attend hits [0, 1]", "wait h2d", "copy 0", "copy 1",
        "attend misses [0, 1]", "merge [0, 1]", "commit 0", "commit 1", "new entries", "submit d2h", "finish",
        "wait d2h"]


def test_dual_batch_attention_overlaps_each_half_with_the_other():
    # Indexer(B0) -> Indexer(B1) || H2D(B0) -> Attn(B0) || H2D(B1) -> Attn(B1) || D2H -> O_proj -> MLP
    assert _order("dba", B=3) == [
        "select [0, 1]", "plan 0", "plan 1", "submit h2d", "select [2]", "plan 2", "submit h2d",
        "wait h2d", "copy 0", "copy 1", "attend all [0, 1]", "merge [0, 1]",
        "wait h2d", "copy 2", "new entries", "submit d2h", "attend all [2]", "merge [2]", "wait d2h",
        "commit 0", "commit 1", "commit 2", "finish"]


def test_dual_batch_attention_needs_two_requests():
    with pytest.raises(ValueError, match="at least 2 requests"):
        _order("dba", B=1)


def test_a_cache_or_a_wiring_that_breaks_the_contract_is_refused_before_anything_runs():
    log = []
    wiring = _Wiring(log)
    wiring.rids = [0]

    class NoCommit:
        entry_bytes = 10

        def plan(self, *a, **k):
            log.append("plan")

        def copy(self, plan):
            pass
    with pytest.raises(TypeError, match=r"cache must follow ess.decode.StepCache .* NoCommit has no commit"):
        run_layer(NoCommit(), 0, [0], wiring)

    class NoFinish:
        def select(self, rows):
            log.append("select")

        def attend(self, plans, rows, part):
            pass

        def merge(self, rows):
            pass

        def new_entries(self):
            return None
    with pytest.raises(TypeError, match=r"wiring must follow ess.decode.Wiring .* NoFinish has no finish"):
        run_layer(_Cache(log), 0, [0], NoFinish())
    assert log == []                                                 # nothing ran

    with pytest.raises(ValueError, match="schedule"):
        _order("triple")


def test_a_failed_copy_commits_only_what_landed():
    log = []

    class Failing(_Cache):
        def copy(self, plan):
            if plan.request_id == 1:
                raise OSError("injected: link reset")
            super().copy(plan)
    wiring = _Wiring(log)
    wiring.rids = [0, 1]
    with pytest.raises(OSError, match="injected"):
        run_layer(Failing(log), 0, [0, 1], wiring, schedule="da", link=SyncLink())
    assert "commit 0" in log and "commit 1" not in log and "finish" not in log


# ---------------------------------------------------------------------------------------------------------------
# the links
# ---------------------------------------------------------------------------------------------------------------

def test_emulated_link_takes_at_least_bytes_over_bandwidth_and_keeps_order():
    order = []
    with EmulatedLink(0.001) as link:                                # 1 MB/s: 20,000 B take >= 20 ms
        t0 = time.perf_counter()
        a = link.submit("h2d", 0, [(lambda: order.append("a1"), 10_000), (lambda: order.append("a2"), 10_000)])
        b = link.submit("d2h", 0, [(lambda: order.append("b"), 5_000)])
        a.wait()
        assert time.perf_counter() - t0 >= 0.02
        b.wait()
        assert time.perf_counter() - t0 >= 0.025                     # b waits for a: one link
    assert order == ["a1", "a2", "b"]
    assert a.end_s - a.start_s == pytest.approx(0.02) and b.start_s >= a.end_s     # the link's clock
    assert link.busy_s() == pytest.approx(0.025)


def test_emulated_link_runs_beside_the_caller():
    with EmulatedLink(0.001, inline_below_bytes=0) as link:
        job = link.submit("h2d", 0, [(lambda: None, 30_000)])       # 30 ms on the link
        assert not job.done()                                        # submit returned at once
        waited = job.wait()
    assert waited > 0.01


def test_link_errors_reach_the_waiter():
    def boom():
        raise OSError("injected")
    for link in (SyncLink(), EmulatedLink(None), EmulatedLink(None, inline_below_bytes=0)):
        with link:
            job = link.submit("h2d", 3, [(boom, 10)])
            with pytest.raises(OSError, match="injected"):
                job.wait()


def test_a_small_job_is_copied_by_its_waiter_a_large_one_by_the_worker():
    ran_in = {}
    with EmulatedLink(None, inline_below_bytes=100) as link:
        small = link.submit("d2h", 0, [(lambda: ran_in.setdefault("small", threading.current_thread().name), 99)])
        big = link.submit("h2d", 0, [(lambda: ran_in.setdefault("big", threading.current_thread().name), 100)])
        big.wait()
        assert not small.done()                                      # nobody copies it before its wait
        small.wait()
    assert ran_in["small"] == threading.current_thread().name
    assert ran_in["big"] in ("ess-link", threading.current_thread().name)   # the worker (or a waiter that came first)
    with pytest.raises(ValueError, match="inline_below_bytes"):
        EmulatedLink(None, inline_below_bytes=-1)


def test_a_closed_link_refuses_work_and_bad_chunks_are_refused():
    link = EmulatedLink(None)
    with pytest.raises(TypeError, match="callable"):
        link.submit("h2d", 0, [("not callable", 1)])
    link.close()
    link.close()                                                     # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        link.submit("h2d", 0, [(lambda: None, 1)])
    with pytest.raises(ValueError, match="GB_per_s"):
        EmulatedLink(0.0)
    assert isinstance(make_link(None, emulate=False), SyncLink)
    threading.enumerate()                                            # the worker thread has ended
    assert not any(t.name == "ess-link" and t.is_alive() for t in threading.enumerate() if t is link._thread)


def test_a_link_on_the_cpu_clock_crosses_in_the_waiters_cpu_seconds():
    with EmulatedLink(0.001, clock="cpu") as link:                  # 1 MB/s: 20,000 B take 20 ms of CPU time
        t0 = time.thread_time()
        job = link.submit("h2d", 0, [(lambda: None, 20_000)])
        job.wait()                                                   # spins: the thread's CPU clock runs
        assert time.thread_time() - t0 >= 0.02
        assert job.end_s - job.start_s == pytest.approx(0.02)
    with pytest.raises(ValueError, match="clock"):
        EmulatedLink(1.0, clock="sundial")


def test_an_attention_failure_during_a_copy_waits_for_it_then_commits_it():
    """DA attends over the hits while the misses cross; if that attention fails, the copy under way still lands and
    its plan is committed, so that no slot holds bytes its map does not know of."""
    from ess.layout import EntryFormat
    from ess.storage import TieredCache
    fmt = EntryFormat("t", n_layers=1, entry_bytes=16, page_tokens=4, max_context=100, dtype="u8")
    cache = TieredCache(fmt, capacity=4)
    host = np.arange(20 * 16, dtype=np.uint8).reshape(1, 20, 16)
    cache.add_request("r", host)
    cache.step("r", 0, np.arange(4, dtype=np.int64))                 # pool full: the next misses evict

    class Failing:
        def select(self, rows):
            return np.array([[2, 3, 10, 11]]), np.zeros((1, 4))

        def attend(self, plans, rows, part):
            raise RuntimeError("injected: attention failed")

        def merge(self, rows):
            pass

        def finish(self):
            pass

        def new_entries(self):
            return None

    with EmulatedLink(0.000005) as link:                             # 5 KB/s: the 32 missed bytes take 6 ms
        with pytest.raises(RuntimeError, match="injected"):
            run_layer(cache, 0, ["r"], Failing(), schedule="da", link=link)
    slots = cache.slot_map("r", 0)
    assert sorted(slots) == [2, 3, 10, 11]                           # the copy landed and was committed
    toks = np.fromiter(slots, np.int64)
    np.testing.assert_array_equal(cache.device_rows(np.fromiter(slots.values(), np.int64)), host[0][toks])


@pytest.mark.cuda
def test_cuda_stream_link_copies_on_its_stream_and_times_the_job():
    # the CUDA-only remainder of the link: a D2H copy into pinned host memory enqueued on the copy stream; the wait
    # makes the bytes visible to the host and records when the job crossed
    from ess.link import CudaStreamLink
    src = torch.arange(1 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.zeros(1 << 20, dtype=torch.uint8, pin_memory=True)
    link = make_link(None, device="cuda")
    assert isinstance(link, CudaStreamLink)
    job = link.submit("d2h", 0, [(lambda: dst.copy_(src, non_blocking=True), src.numel())])
    job.wait()
    assert torch.equal(dst, src.cpu()) and job.end_s >= job.start_s and job.waited_s >= 0
    assert link.busy_s() >= 0 and link.records == [job]
