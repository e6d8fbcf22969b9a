"""FedEM against scikit-learn's GaussianMixture on the pooled data, in the same run.

For each federation (Gaussian clusters, Dirichlet(0.4) client weights):

* per-iteration time: scikit-learn on the pooled rows (``(t(K2) - t(K1)) / (K2 - K1)`` with
  ``tol=0``, so its initialisation does not count) against one FedEM round through the
  federated runtime (``history[r].seconds``: every client's E-step and statistics, message
  validation and copies, the server's M-step), both from the same start;
* exactness: FedEM with ``shared_weights=True`` is the same model as scikit-learn's, so the
  final parameters must agree (max |difference| reported);
* quality: the final log-likelihood per point of scikit-learn (shared weights) and of FedEM
  with private weights (the per-client model, which should fit better), both run to
  convergence from their own initialisations (scikit-learn: k-means on the pooled rows;
  FedEM: the federated k-means start).

and the peak resident memory of each method's timed fits (scikit-learn: the 5- and 25-iteration
fits; FedEM: the runs whose rounds are timed). Writes ``benchmarks/results/fedem.json`` and
``.md`` (``fedem_quick.*`` with ``--quick``).

    python benchmarks/fedem.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import numpy as np
from _measure import fmt_mib, measure, mib, record, rss_note
from sklearn.mixture import GaussianMixture

from fedstats.datasets.synthetic import gmm_federation
from fedstats.mixture import FederatedGaussianMixture

RESULTS = Path(__file__).parent / "results"


def quiet(f):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f()


def sk_seconds(X, M, ct, K, start):
    m0, w0, prec0 = start
    gm = GaussianMixture(
        M,
        covariance_type=ct,
        tol=0,
        max_iter=K,
        means_init=m0,
        weights_init=w0,
        precisions_init=prec0,
        init_params="random_from_data",
        random_state=0,
    )
    t0 = time.perf_counter()
    quiet(lambda: gm.fit(X))
    return time.perf_counter() - t0, gm


def case(name, C, n, d, M, ct, K1=5, K2=25, seed=0):
    data, truth = gmm_federation(n_clients=C, n_components=M, d=d, n_obs=n, min_separation=3.0, spread=5.0, seed=seed)
    X = np.concatenate([data[c].X for c in data.clients])
    N = X.shape[0]
    # a common start: the truth's means moved by 0.5, unit covariances, uniform weights
    rng = np.random.default_rng(seed)
    m0 = truth["means"] + 0.5 * rng.standard_normal(truth["means"].shape)
    cov0 = {"full": np.stack([np.eye(d)] * M), "tied": np.eye(d), "diag": np.ones((M, d)), "spherical": np.ones(M)}[ct]
    w0 = np.full(M, 1.0 / M)
    start = (m0, w0, cov0)  # identity covariances are their own precisions
    # scikit-learn: per-iteration time by difference, best of 3
    with measure() as m_sk:
        per_sk = min(
            (sk_seconds(X, M, ct, K2, start)[0] - sk_seconds(X, M, ct, K1, start)[0]) / (K2 - K1) for _ in range(3)
        )
        _, gm = sk_seconds(X, M, ct, K2, start)
    m_fed = {}
    fits = {}
    for shared in (True, False):
        model = FederatedGaussianMixture(
            M,
            covariance_type=ct,
            rounds=K2,
            tol=0,
            shared_weights=shared,
            means_init=m0,
            covariances_init=cov0,
            weights_init=w0,
        )
        model.fit(data, seed=0)  # warm-up (imports, caches)
        with measure() as m:
            runs = [model.fit(data, seed=0) for _ in range(3)]
        m_fed[shared] = m
        fits[shared] = min(runs, key=lambda r: np.median([h.seconds for h in r.history]))
    fed = fits[True]
    per_fed = float(np.median([r.seconds for r in fed.history]))
    per_private = float(np.median([r.seconds for r in fits[False].history]))
    diff = max(
        np.abs(fed.means - gm.means_).max(),
        np.abs(fed.covariances - gm.covariances_).max(),
        np.abs(fed.weights[data.clients[0]] - gm.weights_).max(),
    )
    # converged fits from each method's own initialisation
    sk_conv = quiet(lambda: GaussianMixture(M, covariance_type=ct, tol=1e-6, max_iter=500, random_state=0).fit(X))
    fed_conv = quiet(lambda: FederatedGaussianMixture(M, covariance_type=ct, rounds=500, tol=1e-6).fit(data, seed=0))
    fed_sh = quiet(
        lambda: FederatedGaussianMixture(M, covariance_type=ct, rounds=500, tol=1e-6, shared_weights=True).fit(
            data, seed=0
        )
    )

    def ll(res):
        return sum(res.score(data[c].X, c) * data.n_obs[c] for c in data.clients) / N

    return {
        "case": name,
        "clients": C,
        "points": N,
        "d": d,
        "M": M,
        "covariance_type": ct,
        "iterations": K2,
        "s_per_iter_sklearn": per_sk,
        "s_per_round_fedem_shared": per_fed,
        "s_per_round_fedem_private": per_private,
        "peak_rss_mib_sklearn": mib(m_sk),
        "peak_rss_mib_fedem_shared": mib(m_fed[True]),
        "peak_rss_mib_fedem_private": mib(m_fed[False]),
        "ratio_shared": per_fed / per_sk,
        "ratio_private": per_private / per_sk,
        "max_abs_diff_shared_vs_sklearn": float(diff),
        "loglik_per_point_sklearn": float(sk_conv.score(X)),
        "sklearn_iters": int(sk_conv.n_iter_),
        "loglik_per_point_fedem_shared": ll(fed_sh),
        "fedem_shared_rounds": fed_sh.rounds,
        "loglik_per_point_fedem_private": ll(fed_conv),
        "fedem_private_rounds": fed_conv.rounds,
        "bytes_per_round_up": int(fed.communication.bytes_up / fed.rounds),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small federations only (smoke run)")
    args = ap.parse_args()
    if args.quick:
        cases = [("quick: 10 clients x 500, d=4, M=3, full", 10, 500, 4, 3, "full")]
    else:
        cases = [
            ("50 clients x 2000, d=10, M=5, full (the issue's size)", 50, 2000, 10, 5, "full"),
            ("50 clients x 2000, d=10, M=5, diag", 50, 2000, 10, 5, "diag"),
            ("50 clients x 2000, d=10, M=5, spherical", 50, 2000, 10, 5, "spherical"),
            ("50 clients x 2000, d=10, M=5, tied", 50, 2000, 10, 5, "tied"),
            ("1000 clients x 100, d=10, M=5, full (many small clients)", 1000, 100, 10, 5, "full"),
        ]
    rows = [case(*c) for c in cases]
    machine = f"{platform.machine()}, {__import__('os').cpu_count()} cores, CPU only"
    RESULTS.mkdir(exist_ok=True)
    suffix = "_quick" if args.quick else ""
    meta = record()
    (RESULTS / f"fedem{suffix}.json").write_text(json.dumps({"machine": machine, **meta, "rows": rows}, indent=2))
    lines = [
        f"# FedEM against scikit-learn GaussianMixture on the pooled data ({machine})",
        "",
        "| federation | s/iter sklearn | s/round FedEM (shared weights) | ratio | s/round FedEM (private weights) "
        "| ratio | max abs diff shared vs sklearn | loglik/point sklearn (iters) | FedEM shared (rounds) "
        "| FedEM private (rounds) | bytes up/round | peak RSS MiB sklearn / FedEM shared / private |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['s_per_iter_sklearn']:.4f} | {r['s_per_round_fedem_shared']:.4f} | "
            f"{r['ratio_shared']:.2f} | {r['s_per_round_fedem_private']:.4f} | {r['ratio_private']:.2f} | "
            f"{r['max_abs_diff_shared_vs_sklearn']:.1e} | {r['loglik_per_point_sklearn']:.4f} ({r['sklearn_iters']}) | "
            f"{r['loglik_per_point_fedem_shared']:.4f} ({r['fedem_shared_rounds']}) | "
            f"{r['loglik_per_point_fedem_private']:.4f} ({r['fedem_private_rounds']}) | {r['bytes_per_round_up']} | "
            f"{fmt_mib(r['peak_rss_mib_sklearn'])} / {fmt_mib(r['peak_rss_mib_fedem_shared'])} / "
            f"{fmt_mib(r['peak_rss_mib_fedem_private'])} |"
        )
    lines += [
        "",
        "Per-iteration times from the same start (tol=0); scikit-learn's by difference of a 25- and a "
        "5-iteration fit, FedEM's the median round of a 25-round fit through the federated runtime; best of 3 for both, run one after the other on an otherwise idle machine. Log-likelihoods "
        "per point on all rows after each method ran to convergence (tol 1e-6) from its own start; the "
        "private-weights model has more parameters, so its likelihood is higher.",
        "",
        f"{rss_note(meta['peak_rss_scope'])} Written {meta['written']} on {meta['machine_details']}.",
    ]
    (RESULTS / f"fedem{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
