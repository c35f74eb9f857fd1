"""Memory safety of the Numba entry points: every input that once wrote or read out of bounds (segfaults, heap
corruption, a wrong miss count after overwriting an unrelated array) now gives a clear error. Each case runs in its
own Python process, so that a regression shows up as a failed test (exit code and stderr checked), not as a
crashed test run."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ess import cachesim as C
from ess.traces import Trace, index_rows

SETUP = """
import numpy as np
from ess import cachesim as C
from ess.traces import Trace
"""

# (case, script, the exception's last stderr line must contain this); each script once crashed or read out of bounds
CRASHES = [
    ("n_positions below the largest index",
     "C.sequence_misses(np.array([[0, 1, 5_000_000], [2, 3, 4]], np.int32), 4, n_positions=10)",
     "ValueError: steps holds 5000000 but n_positions = 10"),
    ("n_positions zero",
     "C.sequence_misses(np.array([[0, 1], [1, 2]]), 4, n_positions=0)",
     "ValueError: n_positions must be in [1, 2147483648), got 0"),
    ("a position that wraps in int32",
     "C.sequence_misses(np.array([[0, 2**31 + 5, 2], [1, 2, 3]]), 4)",
     "ValueError: steps holds 2147483653: positions must be < 2**31 - 1"),
    ("repeated positions within a step",
     "C.sequence_misses(np.array([[1, 1, 1, 1], [2, 2, 3, 3], [0, 0, 5, 5]]), 2, n_positions=6)",
     "ValueError: steps[0] repeats a position"),
    ("windows beyond n_positions",
     "C.sequence_misses(np.array([[0, 1]]), 4, windows=np.array([[7, 900]]), n_positions=8)",
     "ValueError: windows holds 900 but n_positions = 8"),
    ("a validated trace written to afterwards",
     "t = Trace(np.array([[[[0, 1], [1, 2]]]], np.int32), 8, 2)\n"
     "t.indices[0, 0, 1, 0] = 5_000_000\n"
     "C.trace_misses(t, capacity=2, warmup=False)",
     "ValueError: assignment destination is read-only"),
    ("a validated trace made writeable again",
     "t = Trace(np.array([[[[0, 1], [1, 2]]]], np.int32), 8, 2)\n"
     "t.indices.setflags(write=True)",
     "ValueError: cannot set WRITEABLE flag to True of this array"),
    ("the transfer kernel called directly with a row past the end",
     "from ess.kernels.transfer.numba_cpu import copy_rows\n"
     "copy_rows(np.zeros((4, 8), np.uint8), np.array([0]), np.zeros((4, 8), np.uint8), np.array([1 << 40]))",
     "ValueError: dst_idx must lie in [-1, 4), got [1099511627776, 1099511627776]"),
    ("the storage's unchecked copy with a row past the end",
     "from ess.kernels.transfer import copy_rows_unchecked\n"
     "copy_rows_unchecked(np.zeros((4, 8), np.uint8), np.array([9]), np.zeros((4, 8), np.uint8), np.array([0]),"
     " backend='numba')",
     "ValueError: src_idx must lie in [-1, 4), got [9, 9]"),
    ("the sparse-MLA kernel called directly with an index past the pool",
     "from ess.kernels.attention import numba_cpu as k\n"
     "from ess.attention import latent_format\n"
     "from ess.layout import latent_entry_bytes\n"
     "from ess.specs import model_spec\n"
     "m = model_spec('tiny')\n"
     "q = np.ones((1, m.n_heads, m.latent_dim), np.float32)\n"
     "out, lse = np.empty((1, m.n_heads, m.kv_lora_rank), np.float32), np.empty((1, m.n_heads), np.float32)\n"
     "k.sparse_mla_decode(q, np.zeros((4, latent_entry_bytes(m)), np.uint8), np.array([[1 << 40]]), 0.1,"
     " *latent_format(m), out, lse)",
     "ValueError: attention kernel arguments: indices must lie in [-1, 4)"),
    ("the indexer kernel called directly with keys narrower than D + 4",
     "from ess.kernels.attention import numba_cpu as k\n"
     "k.indexer_scores(np.ones((1, 2, 8), np.float32), np.ones((1, 2), np.float32), np.zeros((1, 5, 8), np.uint8),"
     " np.array([5]), np.empty((1, 5), np.float32))",
     "ValueError: attention kernel arguments: keys must have shape (B=1, L, D + 4 = 12)"),
]


@pytest.mark.parametrize("case,script,expected", CRASHES, ids=[c[0] for c in CRASHES])
def test_former_crash_gives_a_clear_error(case, script, expected):
    proc = subprocess.run([sys.executable, "-c", SETUP + textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, f"{case}: exit code {proc.returncode} (negative = killed by a signal)\n{proc.stderr}"
    last = proc.stderr.strip().splitlines()[-1]
    assert expected in last, f"{case}: {last}"


def test_the_caller_keeps_its_array_and_the_trace_keeps_its_copy():
    a = np.array([[[[0, 1], [1, 2], [3, 0]]]], np.int32)
    t = Trace(a, 8, 2)
    want = C.trace_misses(t, capacity=2, warmup=False)
    a[0, 0, 1, 0] = 5_000_000                    # the caller's array is not frozen, and not the trace's
    assert a.flags.writeable and t.indices[0, 0, 1, 0] == 1 and not t.indices.flags.writeable
    assert np.array_equal(C.trace_misses(t, capacity=2, warmup=False), want)
    assert want[0, 0].tolist() == [2, 1, 2]      # 0,1 | 2 evicts 0 | 3, 0 both miss


def test_index_rows_copies_and_checks():
    rows = np.array([[3, -1, 2], [0, 1, -1]], np.int64)
    out, n = index_rows("steps", rows)
    assert out.dtype == np.int32 and out.flags.c_contiguous and n == 4 and not np.shares_memory(out, rows)
    assert index_rows("steps", rows, 10)[1] == 10
    for bad, err, match in [(rows.astype(float), TypeError, "steps must hold integers"),
                            (rows.tolist(), TypeError, "NumPy integer array"),
                            (rows[0], ValueError, "2-D"),
                            (np.array([[0, -2]]), ValueError, "steps holds -2"),
                            (np.array([[4, 4]]), ValueError, r"steps\[0\] repeats")]:
        with pytest.raises(err, match=match):
            index_rows("steps", bad)
