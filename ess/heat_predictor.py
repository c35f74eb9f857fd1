"""Predicting which cache entries the next decode step selects: decayed heat and a small LSTM "heat predictor".

The article adds a learned heat-prediction model to ESS's LRU: from the history of an entry's selections it predicts
whether the next step selects it; the prediction orders evictions (keep what will be needed) and picks entries to
prefetch speculatively (:mod:`ess.prefetch`). Here:

* :class:`History` -- the selection history of one pool (one request, one layer): the last ``history`` steps' sets as bits
  and an exponentially decayed access count ("heat") per position. Features of an entry at step ``t``: for each of
  the last ``history`` steps, ``(selected, heat after that step)``; shape ``(N, history, 2)``.
* :class:`HeatScorer` -- score = heat (no learning): the decayed selection count of :mod:`ess.policies`' heat, with
  the same decay (:data:`ess.policies.DEFAULT_HEAT_DECAY`), counted over the whole observed history of a position
  (the eviction policy counts from the entry's load only, all a pool knows).
* :class:`LSTMHeatPredictor` -- a one-layer LSTM (``hidden`` units) over those ``history`` feature vectors and a linear
  read-out to the logit of "selected at ``t + 1``"; trained with binary cross-entropy on a trace's own history
  (every entry seen in the last ``history`` steps, plus as many never-recently-seen entries), seeded and reproducible.

Scores are only compared with each other: a higher score means "more likely selected next step".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .policies import DEFAULT_HEAT_DECAY
from .validate import fraction, int_array, integer, positive_int

__all__ = ["History", "HeatScorer", "LSTMHeatPredictor", "PredictorReport", "evaluate_predictor"]



def _check_seq(seq: Any) -> np.ndarray:
    seq = int_array("seq", seq, ndim=2, lo=-1, shape_doc="(steps, width) of one pool's index sets, -1 padded")
    if seq.shape[0] < 2 or not (seq >= 0).any():
        raise ValueError(f"seq must hold at least 2 steps with entries, got shape {seq.shape}")
    return seq


class History:
    """Selection history of one pool over positions ``0 .. n_positions - 1``."""

    def __init__(self, n_positions: int, history: int = 8, decay: float = DEFAULT_HEAT_DECAY):
        self.n_positions = positive_int("n_positions", n_positions)
        self.history = positive_int("history", history)
        self.decay = fraction("decay", decay)
        self.bits = np.zeros((self.history, self.n_positions), np.bool_)      # ring of the last `history` sets
        self.heats = np.zeros((self.history, self.n_positions), np.float32)   # heat after each of those steps
        self.heat = np.zeros(self.n_positions, np.float32)
        self.t = 0                                                            # steps observed

    def observe(self, indices: np.ndarray) -> None:
        """One step's index set: a 1-D NumPy integer array of positions in ``[0, n_positions)``, -1 = padding."""
        indices = int_array("indices", indices, ndim=1, lo=-1, shape_doc="(K,), -1 = padding")
        s = indices[indices >= 0]
        if s.size and s.max() >= self.n_positions:
            raise ValueError(f"indices reach {int(s.max())}, beyond n_positions = {self.n_positions}")
        r = self.t % self.history
        self.heat *= self.decay
        self.heat[s] += 1.0
        self.bits[r] = False
        self.bits[r, s] = True
        self.heats[r] = self.heat
        self.t += 1

    def recent(self) -> np.ndarray:
        """Positions selected in any of the last ``history`` steps."""
        return np.flatnonzero(self.bits.any(axis=0))

    def features(self, candidates: np.ndarray) -> np.ndarray:
        """(N, history, 2) float32, oldest step first; steps before the first observed one are zeros."""
        c = np.asarray(candidates, np.int64)
        n_hist = self.history
        out = np.zeros((c.size, n_hist, 2), np.float32)
        for j in range(n_hist):                  # j = n_hist - 1 is the latest step
            back = n_hist - 1 - j
            if back >= self.t:
                continue
            r = (self.t - 1 - back) % n_hist
            out[:, j, 0] = self.bits[r, c]
            out[:, j, 1] = self.heats[r, c]
        return out


class HeatScorer:
    """Score = the entry's decayed access count (no learning)."""

    name = "heat"

    def score(self, hist: History, candidates: np.ndarray) -> np.ndarray:
        return hist.heat[np.asarray(candidates, np.int64)].astype(np.float64)


@dataclass(frozen=True)
class PredictorReport:
    """Next-step prediction quality: precision of the top-n guesses (n = |S(t+1)|), averaged over steps."""
    precision: float
    random_precision: float
    heat_precision: float
    steps: int


class LSTMHeatPredictor:
    """A small seeded LSTM that predicts, from an entry's last ``history`` steps, whether the next step selects it.

    >>> import numpy as np
    >>> seq = np.array([[0, 1, 2], [0, 1, 3], [0, 1, 4], [0, 1, 5]] * 4, np.int32)
    >>> p = LSTMHeatPredictor(history=2, hidden=4, seed=0).fit([seq], epochs=3)
    >>> s = p.score_after(seq[:3], np.array([0, 7]))     # 0 is always selected, 7 never
    >>> bool(s[0] > s[1])
    True
    """

    name = "lstm"

    def __init__(self, *, history: int = 8, hidden: int = 16, decay: float = DEFAULT_HEAT_DECAY, seed: int = 0):
        self.history = positive_int("history", history)
        self.hidden = positive_int("hidden", hidden)
        self.decay = fraction("decay", decay)
        self.seed = integer("seed", seed, lo=0)
        self.model = None
        self.losses: list[float] = []

    def _build(self):
        import torch
        torch.manual_seed(self.seed)

        class Net(torch.nn.Module):
            def __init__(self, hidden):
                super().__init__()
                self.lstm = torch.nn.LSTM(2, hidden, batch_first=True)
                self.out = torch.nn.Linear(hidden, 1)

            def forward(self, x):                     # x (N, history, 2)
                h, _ = self.lstm(x)
                return self.out(h[:, -1]).squeeze(-1)  # (N,) logits

        return Net(self.hidden)

    def training_set(self, seqs: Sequence[np.ndarray], *, max_samples: int = 40_000) -> tuple[np.ndarray, np.ndarray]:
        """Features (N, history, 2) and labels (N,) from pools' step sequences (each (steps, width), -1 padded)."""
        max_samples = positive_int("max_samples", max_samples)
        rng = np.random.default_rng(self.seed)
        X, y = [], []
        for seq in seqs:
            seq = _check_seq(seq)
            n_pos = int(seq.max()) + 1
            hist = History(n_pos, self.history, self.decay)
            for t in range(seq.shape[0] - 1):
                hist.observe(seq[t])
                nxt = seq[t + 1][seq[t + 1] >= 0]
                recent = hist.recent()
                others = rng.integers(0, n_pos, recent.size)                  # mostly never-seen entries
                cand = np.unique(np.concatenate([recent, others]))
                label = np.isin(cand, nxt)
                X.append(hist.features(cand))
                y.append(label.astype(np.float32))
        X, y = np.concatenate(X), np.concatenate(y)
        if X.shape[0] > max_samples:
            keep = rng.choice(X.shape[0], max_samples, replace=False)
            X, y = X[keep], y[keep]
        return X, y

    def fit(self, seqs: Sequence[np.ndarray], *, epochs: int = 8, lr: float = 1e-2, batch_size: int = 256,
            max_samples: int = 40_000) -> "LSTMHeatPredictor":
        """Train on the history of ``seqs`` (a list of per-pool step sequences). Deterministic for a given seed.

        Runs torch on one thread (restored afterwards): the model is tiny, and more threads only contend."""
        import torch
        max_samples = positive_int("max_samples", max_samples)
        batch_size = positive_int("batch_size", batch_size)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._fit(seqs, epochs=epochs, lr=lr, batch_size=batch_size, max_samples=max_samples)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, seqs, *, epochs, lr, batch_size, max_samples) -> "LSTMHeatPredictor":
        import torch
        if not isinstance(seqs, (list, tuple)) or not seqs:
            raise ValueError("seqs must be a non-empty list of (steps, width) index arrays")
        epochs = positive_int("epochs", epochs)
        X, y = self.training_set(seqs, max_samples=max_samples)
        self.model = self._build()
        opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
        g = torch.Generator().manual_seed(self.seed)
        self.losses = []
        for _ in range(epochs):
            perm = torch.randperm(Xt.shape[0], generator=g)
            total = 0.0
            for i in range(0, Xt.shape[0], batch_size):
                b = perm[i:i + batch_size]
                opt.zero_grad()
                loss = loss_fn(self.model(Xt[b]), yt[b])
                loss.backward()
                opt.step()
                total += float(loss.detach()) * b.numel()
            self.losses.append(total / Xt.shape[0])
        self.model.eval()
        return self

    def score(self, hist: History, candidates: np.ndarray) -> np.ndarray:
        """Logits of "selected next step" for ``candidates`` given a pool's :class:`History`."""
        import torch
        if self.model is None:
            raise ValueError("the predictor is not trained; call fit() first")
        if hist.history != self.history:
            raise ValueError(f"History keeps {hist.history} steps but the predictor was built for {self.history}")
        c = np.asarray(candidates, np.int64)
        if c.size == 0:
            return np.zeros(0)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                return self.model(torch.from_numpy(hist.features(c))).numpy().astype(np.float64)
        finally:
            torch.set_num_threads(threads)

    def score_after(self, seq: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Scores for ``candidates`` after observing every row of ``seq``."""
        seq = np.asarray(seq)
        hist = History(max(int(seq.max()), int(np.max(candidates))) + 1, self.history, self.decay)
        for row in seq:
            hist.observe(row)
        return self.score(hist, candidates)

    def state_dict(self) -> dict:
        if self.model is None:
            raise ValueError("the predictor is not trained")
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def evaluate_predictor(predictor: Any, seq: np.ndarray, *, start: int = 1, seed: int = 0,
                       history: int | None = None) -> PredictorReport:
    """Precision of the top-n predicted entries of each next step (n = that step's size) on one pool's sequence,
    beside a random guess (n entries drawn from the context seen so far) and the heat ranking.

    Entries outside the recent history all have the same features, so candidates are the recent entries; the
    rest of the top-n (if any) is filled at random from the others, for every method alike.
    """
    seq = _check_seq(np.asarray(seq))
    start = integer("start", start, lo=1)
    seed = integer("seed", seed, lo=0)
    rng = np.random.default_rng(seed)
    n_hist = getattr(predictor, "history", 8) if history is None else positive_int("history", history)
    n_pos = int(seq.max()) + 1
    hist = History(n_pos, n_hist, getattr(predictor, "decay", DEFAULT_HEAT_DECAY))
    heat = HeatScorer()
    prec, rnd, hp = [], [], []
    for t in range(seq.shape[0] - 1):
        hist.observe(seq[t])
        if t + 1 < start:
            continue
        nxt = seq[t + 1][seq[t + 1] >= 0]
        n = nxt.size
        ctx = max(int(seq[: t + 2].max()) + 1, n)
        cand = hist.recent()

        def top(scores):
            order = cand[np.argsort(-scores, kind="stable")][:n]
            if order.size < n:
                rest = np.setdiff1d(np.arange(ctx), order)
                order = np.concatenate([order, rng.choice(rest, n - order.size, replace=False)])
            return np.isin(order, nxt).mean()

        prec.append(top(predictor.score(hist, cand)))
        hp.append(top(heat.score(hist, cand)))
        rnd.append(np.isin(rng.choice(ctx, n, replace=False), nxt).mean())
    if not prec:
        raise ValueError(f"start={start} leaves no step to evaluate in a sequence of {seq.shape[0]} steps")
    return PredictorReport(float(np.mean(prec)), float(np.mean(rnd)), float(np.mean(hp)), len(prec))
