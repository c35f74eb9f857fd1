"""Fit and choose the synthetic locality models on the evidence, by the rule of data/locality/README.md, and write
data/locality/fit.yaml (the file ess.locality reads: the drift model's rho per reading, the default model).

    .venv/bin/python tools/fit_locality.py            # about 10 minutes on two cores

For each reading of Fig. 2 (fraction, jaccard) the drift model's rho is fitted on vLLM's 2 x K hit rate (0.85, and
the range's ends 0.80 and 0.90) in setting S; then each of the four candidates (uniform, drift) x (fraction,
jaccard) is measured against every piece of evidence (vLLM's hit rate, GVR's overlaps, the real traces' shape when
data/traces/ holds any), scored, and the default chosen. Notebook 04 recomputes the numbers and checks them; the
file is written atomically (a temporary file, then a rename).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ess.atomic import write_text_atomic  # noqa: E402
from ess.locality import READINGS  # noqa: E402
from ess.studies import locality as loc  # noqa: E402
from ess.tracegen import DATA_DIR  # noqa: E402

SETTING = {"context_len": 32768, "mtp": 1, "k": 2048, "n_layers": 61, "warmup_windows": 32, "policy": "lru",
           "steps": 128, "window": "steps 64..127", "batch": 2, "seed": 0, "buffer": "2 x K"}
VLLM = "vLLM RFC #48203 via paper-facts.md (80-90 % LRU hit rate with a 2 x top-k buffer, DeepSeek-V3.2)"


def _r(x, nd=4):
    return None if x is None else round(float(x), nd)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DATA_DIR / "fit.yaml")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rho, hit_eval = {}, {}
    for reading in READINGS:
        evaluated = {}
        rho[reading] = {}
        for at, target in loc.FIT_HIT_RATE.items():
            f = loc.fit_drift_rho(target, reading=reading, evaluated=evaluated)
            rho[reading][at] = {"rho": f["rho"], "hit_rate": _r(f["hit_rate"]), "reachable": f["reachable"]}
            print(f"{reading}: hit rate {target} -> rho {f['rho']} (hit {f['hit_rate']:.4f}, reachable "
                  f"{f['reachable']}), {time.perf_counter() - t0:.0f} s", flush=True)
        hit_eval[reading] = {_r(k): _r(v) for k, v in sorted(evaluated.items())}
    real = loc.real_traces()
    real_shape = {name: {k: _r(v) for k, v in loc.trace_shape(tr).items()} for name, tr in real.items()}
    cands = loc.candidates({rd: rho[rd]["central"]["rho"] for rd in READINGS})
    known = {c.name: hit_eval[c.reading][_r(c.drift_rho)] for c in cands if c.trace_model == "drift"}
    table, _ = loc.measure_evidence(cands, context_len=SETTING["context_len"], hit_rates=known, real=real)
    scores = {(r.trace_model, r.reading): r.score for r in table.itertuples()}
    evidence = {name: {k: (None if v is None or (isinstance(v, float) and v != v) else
                           (_r(v) if isinstance(v, float) else v)) for k, v in row.items()}
                for name, row in table.drop(columns=["trace_model", "reading"]).to_dict("index").items()}
    for name, ev in evidence.items():
        print(f"{name}: {ev}", flush=True)
    tm, rd = loc.choose_locality(scores)
    doc = {
        "setting": {"value": SETTING, "source": "data/locality/README.md, setting S (the statistic h2K)"},
        "drift_rho": {"value": {r: {at: v["rho"] for at, v in rho[r].items()} for r in READINGS},
                      "source": f"fitted by tools/fit_locality.py (ess.studies.locality.fit_drift_rho) on {VLLM}: "
                                "per reading of Fig. 2, the rho in [0, 0.95] at which the 2 x K hit rate of setting S "
                                "is 0.85 (central), 0.80 (at_80) and 0.90 (at_90), bisection to 0.005; a target "
                                "outside the reachable hit rates takes the nearer end"},
        "drift_rho_fit": {"value": rho, "source": "the fits behind drift_rho: hit rate reached, target reachable"},
        "hit_rate_evaluations": {"value": hit_eval, "source": "every (rho: 2 x K hit rate) the bisections evaluated"},
        "real_traces": {"value": real_shape or None,
                        "source": "the shape statistics (E4) of each mtp-1 trace in data/traces/, "
                                  "ess.studies.locality.trace_shape" if real_shape else
                                  "data/traces/ held no mtp-1 trace when this file was written: E4 left out of "
                                  "every score"},
        "evidence": {"value": evidence,
                     "source": "each candidate against the evidence of data/locality/README.md "
                               "(ess.studies.locality.measure_evidence): hit_2k (E2), gvr_deep / gvr_shallow (E3), "
                               "e1_max_error (E1), model_* / real_* shape statistics (E4), the distances and the "
                               "score"},
        "default": {"value": {"trace_model": tm, "reading": rd},
                    "source": "the rule of data/locality/README.md (smallest d_E2 + d_E3 + d_E4; a tie within 0.005 "
                              "keeps drift / fraction): scores " +
                              ", ".join(f"{a}/{b} {v:.4f}" for (a, b), v in scores.items())},
    }
    text = ("# The synthetic locality models fitted and chosen on the evidence by the rule of data/locality/README.md.\n"
            "# Written by tools/fit_locality.py; notebook 04 recomputes these numbers and checks them.\n"
            + yaml.safe_dump(doc, sort_keys=False, width=120))
    write_text_atomic(args.out, text)
    print(f"default {tm} / {rd}; wrote {args.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
