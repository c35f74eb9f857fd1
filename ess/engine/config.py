"""What one sparse decode run of the engine is set to: :class:`DecodeConfig`, a frozen dataclass checked when it is
made (every error names the field and what was expected), passed whole to :meth:`ess.engine.DecodeEngine.start`
and recorded with the run (:meth:`DecodeConfig.to_dict`).

What depends on the prefilled batch (``"dba"`` needs two requests, a pool that holds one step's K entries, the
model's context) is checked by :meth:`~ess.engine.DecodeEngine.start`, before anything is decoded.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import validate
from ..decode import SCHEDULES
from ..kernels import BACKENDS
from ..link import CLOCKS
from ..policies import ONLINE_POLICIES, make_policy

__all__ = ["DecodeConfig", "TOPK_DIVISOR", "WARMUP_WINDOWS", "default_topk"]

# K = L / 16: DeepSeek-V3.2-Exp reads 2,048 entries of a 32K context (paper-facts.md "DeepSeek-V3.2-Exp geometry":
# top-k 2,048; the paper's setting, 32K context)
TOPK_DIVISOR = 16
# LRU-Warmup feeds the top-K of the last 32 prefill positions ([ARX], paper-facts.md "The design")
WARMUP_WINDOWS = 32


def default_topk(context_len: int) -> int:
    """K for a context of ``context_len`` tokens: ``max(1, context_len // 16)``."""
    return max(1, validate.positive_int("context_len", context_len) // TOPK_DIVISOR)


@dataclass(frozen=True)
class DecodeConfig:
    """One sparse decode run's settings.

    Attributes
    ----------
    offload : bool
        ``True``: the K/V entries in a :class:`ess.storage.TieredCache` (host pool + a device pool of ``ratio``);
        ``False``: every entry resident (:class:`ess.storage.ResidentCache`) -- the same step, the same logits.
    ratio : float in (0, 1]
        The device pool's share of the context: slots = floor(ratio x L rounded up to 64-token pages)
        (:func:`ess.layout.pool_slots`), L the longest prompt. Offload only.
    policy : ``"lru"``, ``"fifo"`` or ``"heat"`` (:data:`ess.policies.ONLINE_POLICIES`)
    policy_options : dict, optional
        Passed to the policy (``{"decay": ...}`` for heat).
    schedule : ``"none"``, ``"da"`` or ``"dba"`` (:data:`ess.decode.SCHEDULES`; ``"dba"`` needs 2 requests)
    link_GB_per_s : float > 0, optional
        The emulated host-to-device link's bandwidth (GB = 1e9 B) on the CPU; ``None``: the machine's own copy speed.
    emulate_link : bool
        ``False``: the copies run in the compute thread (:class:`ess.link.SyncLink`). On CUDA the link is a copy
        stream either way.
    topk : int, optional
        K, the entries each request reads per layer (default :func:`default_topk` of the longest prompt).
    warmup : bool
        LRU-Warmup: the device pool seeded from the top-K of the last 32 prompt positions. Offload only.
    keep_logits : bool
        Keep every step's logits in the run (bit-for-bit comparisons).
    timing : bool
        Time every operation (:class:`ess.metrics.OpTimer`).
    clock : ``"wall"`` or ``"cpu"`` (:data:`ess.link.CLOCKS`)
        What the timer, the step times and the emulated link run on.
    backend : ``"auto"``, ``"reference"``, ``"numba"`` or ``"torch"``
        The kernels of the indexer and of top-K (:func:`ess.kernels.resolve_backend`: ``"auto"`` is Numba on the
        CPU, torch on CUDA). ``"torch"`` on the CPU runs what a GPU runs.
    """

    offload: bool = True
    ratio: float = 0.5
    policy: str = "lru"
    policy_options: dict | None = None
    schedule: str = "none"
    link_GB_per_s: float | None = None
    emulate_link: bool = True
    topk: int | None = None
    warmup: bool = True
    keep_logits: bool = False
    timing: bool = True
    clock: str = "wall"
    backend: str = "auto"

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)                   # noqa: E731 (frozen: normal forms)
        for name in ("offload", "emulate_link", "warmup", "keep_logits", "timing"):
            set_(name, validate.boolean(name, getattr(self, name)))            # np.True_ as True (JSON records)
        set_("ratio", validate.ratio("ratio", self.ratio))
        validate.one_of("policy", self.policy, ONLINE_POLICIES)
        if self.policy_options is not None:
            if not isinstance(self.policy_options, dict):
                raise TypeError(f"policy_options must be a dict of the policy's options, got "
                                f"{type(self.policy_options).__name__}")
            try:
                make_policy(self.policy, 1, **self.policy_options)
            except TypeError as exc:
                raise TypeError(f"policy_options: {exc}") from None
            set_("policy_options", dict(self.policy_options))
        validate.one_of("schedule", self.schedule, SCHEDULES)
        if self.link_GB_per_s is not None:
            set_("link_GB_per_s", validate.real("link_GB_per_s", self.link_GB_per_s, lo=0.0, lo_open=True))
        if self.topk is not None:
            set_("topk", validate.positive_int("topk", self.topk))
        validate.one_of("clock", self.clock, tuple(CLOCKS))
        validate.one_of("backend", self.backend, BACKENDS + ("auto",))

    def replace(self, **changes) -> "DecodeConfig":
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The settings as a plain dict (for records)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) }
