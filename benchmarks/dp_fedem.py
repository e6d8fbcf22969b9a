"""Differentially private FedEM (FederatedGaussianMixture(dp=...)): parameter error against epsilon.

50 clients x 200 rows in 2 dimensions from three unit-variance Gaussian components with known
means (-3, 0), (3, 0), (0, 4), each client with its own weights (Dirichlet(2)). Every fit starts
from the same public ``means_init`` (the truth moved by about 0.6 sd, seeded), full covariances,
per-client weights. For each noise multiplier z (0: the plain, non-private FedEM from the same
start, 15 rounds) and each placement of the noise, ``--seeds`` federations (data, start and noise
seeded together) are fitted with ``dp=DifferentialPrivacy(z, clip=4.0, placement=...)``: the
private covariance start and 15 EM rounds, 16 releases. Reported, averaged over the seeds: the
spent epsilon (delta = 1e-6, RDP); the largest error of a mean coordinate against the truth and
against the plain fit, in component sds; the largest covariance error against the truth; the mean
over clients of the largest error of a client's weights; and how often the 95% DP-noise intervals
of ``include_dp_noise=True`` cover the plain fit's means (they hold the DP noise only, so the
plain fit, not the truth, is what they should cover). In process nothing is summed securely, so
with ``placement="client"`` the ledger charges each release with one client's share of the noise
(``z / sqrt(50)``): its epsilon is that of a server reading every reply; under secure
aggregation it is the central one. Each row's fits (and the plain fits) are timed, with their peak
resident memory, and so is the whole run. Writes ``benchmarks/results/dp_fedem.json`` and ``.md``
(``dp_fedem_quick.*`` with ``--quick``).

    python benchmarks/dp_fedem.py [--quick] [--seeds S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from pathlib import Path

import numpy as np
from _measure import fmt_mib, measure, mib, record, rss_note

from fedstats.mixture import FederatedGaussianMixture
from fedstats.privacy import DifferentialPrivacy

RESULTS = Path(__file__).parent / "results"
MU = np.array([[-3.0, 0.0], [3.0, 0.0], [0.0, 4.0]])
CLIP = 4.0  # the radius: 4 component sds
ROUNDS = 15
ZS = (2.0, 5.0, 10.0, 20.0, 40.0, 80.0)


def federation(seed: int, n_clients: int = 50, n: int = 200):
    rng = np.random.default_rng([seed, 1])
    Xs, W = [], []
    for _ in range(n_clients):
        w = rng.dirichlet(np.full(3, 2.0))
        z = rng.choice(3, n, p=w)
        Xs.append(MU[z] + rng.normal(size=(n, 2)))
        W.append(w)
    start = MU + np.random.default_rng([seed, 2]).normal(0, 0.45, MU.shape)
    return Xs, np.array(W), start


def quiet(f):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f()


def errors(res, W, plain=None):
    out = {
        "mean_err": float(np.abs(res.means - MU).max()),
        "cov_err": float(np.abs(res.covariances - np.eye(2)).max()),
        "weights_err": float(np.mean([np.abs(res.weights[c] - W[i]).max() for i, c in enumerate(res.weights)])),
    }
    if plain is not None:
        out["vs_plain"] = float(np.abs(res.means - plain.means).max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 seeds, three noise levels")
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    seeds = 2 if args.quick else args.seeds
    zs = (2.0, 10.0, 40.0) if args.quick else ZS
    with measure() as m_run:
        rows, plain_fits = run(seeds, zs)
    seconds = m_run.seconds
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    meta = record(m_run.scope)
    suffix = "_quick" if args.quick else ""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"dp_fedem{suffix}.json").write_text(
        json.dumps(
            {
                "machine": machine,
                "seconds": seconds,
                "peak_rss_mib": mib(m_run),
                "plain_fits": plain_fits,
                **meta,
                "rows": rows,
            },
            indent=2,
        )
    )
    lines = [
        f"# Differentially private FedEM: parameter error against epsilon ({machine})",
        "",
        f"50 clients x 200 rows, three unit-variance components in 2 dimensions with known means, per-client "
        f"Dirichlet(2) weights; {seeds} seeds (data, start and noise) per row, averaged. Every fit starts from the "
        f"same public `means_init` (the truth moved by about 0.6 sd); `dp=DifferentialPrivacy(z, clip={CLIP})` "
        f"(the radius: 4 sds), the private covariance start and {ROUNDS} EM rounds: {ROUNDS + 1} releases; "
        "epsilon at delta = 1e-6 (RDP). Errors in component sds: the largest error of a mean coordinate "
        "(against the truth, and against the plain FedEM fit from the same start), the largest covariance "
        "entry error, the mean over clients of the largest error of its weights. Coverage: how often the 95% "
        "DP-noise intervals of `include_dp_noise=True` (the final M-step's noise, propagated) hold the plain "
        "fit's means. In process nothing is summed securely: with client placement the ledger charges one "
        "client's share of the noise (z / sqrt(50)), the epsilon of a server reading every reply; under secure "
        "aggregation it equals the central row's. Seconds and peak RSS: the row's fits, all seeds (the plain "
        "row: the plain fits).",
        "",
        "| placement | z | epsilon | max mean err vs truth | max mean err vs plain | max cov err | weights err "
        "| coverage of plain | seconds | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['placement'] if r['placement'] != 'none' else 'none (plain FedEM)'} | {r['z']:g} "
            f"| {r['epsilon']:.3g} | {r['mean_err']:.3f} | {r['vs_plain']:.3f} | {r['cov_err']:.3f} "
            f"| {r['weights_err']:.3f} | {r['coverage']:.2f} | {r['seconds']:.1f} | {fmt_mib(r['peak_rss_mib'])} |"
        )
    lines += [
        "",
        f"Run time {seconds:.0f} s, peak RSS {fmt_mib(mib(m_run))} MiB.",
        "",
        f"{rss_note(meta['peak_rss_scope'])} Written {meta['written']} on {meta['machine_details']}.",
    ]
    (RESULTS / f"dp_fedem{suffix}.md").write_text("\n".join(lines) + "\n")


def run(seeds, zs):
    """The table's rows, and the plain fits' time and peak."""
    feds = {s: federation(s) for s in range(seeds)}
    with measure() as m_plain:
        plains = {
            s: quiet(lambda: FederatedGaussianMixture(3, means_init=st, rounds=ROUNDS, tol=None).fit(Xs, seed=s))
            for s, (Xs, _, st) in feds.items()
        }
    plain_fits = {"seconds": round(m_plain.seconds, 2), "peak_rss_mib": mib(m_plain)}
    rows = []
    for placement in ("none", "central", "client"):
        for z in (0.0,) if placement == "none" else zs:
            acc: dict[str, list[float]] = {}
            eps = float("inf")
            with measure() as m_row:
                for s in range(seeds):
                    (Xs, W, start), plain = feds[s], plains[s]
                    if placement == "none":
                        e = errors(plain, W, plain)
                        e["coverage"] = float("nan")
                    else:
                        dp = DifferentialPrivacy(noise_multiplier=z, clip=CLIP, placement=placement)
                        res = quiet(
                            lambda: FederatedGaussianMixture(
                                3, means_init=start, dp=dp, dp_rounds=ROUNDS, include_dp_noise=True
                            ).fit(Xs, seed=s)
                        )
                        eps = res.privacy.epsilon
                        e = errors(res, W, plain)
                        sd = res.dp_noise_sd["means"]
                        e["coverage"] = float(np.mean(np.abs(res.means - plain.means) <= 1.96 * sd))
                    for k, v in e.items():
                        acc.setdefault(k, []).append(v)
            m = m_plain if placement == "none" else m_row  # the plain row's fits are the plain fits
            row = {"placement": placement, "z": z, "epsilon": eps, "seeds": seeds}
            row.update({k: float(np.mean(v)) for k, v in acc.items()})
            row.update({"seconds": round(m.seconds, 2), "peak_rss_mib": mib(m)})
            rows.append(row)
            print(row, flush=True)
    return rows, plain_fits


if __name__ == "__main__":
    main()
