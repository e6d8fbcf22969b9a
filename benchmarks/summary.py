"""Every ratio the benchmarks report, in one table, with the peak memory of both sides.

Reads every ``benchmarks/results/*.json`` (``*_quick.json`` only with ``--quick``) and writes
``benchmarks/results/summary.md``: one row per benchmark, case (a row of its own table) and ratio
(federated against centralised or pooled time, and the accuracy gaps that are ratios: mean
differences in the reference's sds, sd ratios, errors in standard errors, RMSE ratios), with the
peak resident memory (MiB) of the method and of the reference it is compared with, the machine
the JSON recorded, and when the JSON was written (its ``written`` field; for a file written before
the benchmarks recorded it, the date of its last git commit, or "unknown"). Results recorded
before the benchmarks measured memory say "not recorded"; no number is made up. Nothing is run.

    python benchmarks/summary.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
NOT_RECORDED = "not recorded"
SAME = "same run"  # both sides of the ratio ran in one measured block: its peak is in the method's column


def field(j, key):
    """A top-level field of a result file, or one of its ``meta``; None where there is none."""
    if not isinstance(j, dict):
        return None
    if key in j:
        return j[key]
    meta = j.get("meta")
    return meta.get(key) if isinstance(meta, dict) else None


def num(v) -> str:
    if v is None:
        return NOT_RECORDED
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.3g}"


def span(lo, hi) -> str:
    return f"{num(lo)} to {num(hi)}"


def pk(d, *keys):
    """A peak (MiB) from nested dicts, None where any level is missing."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


# --- one function per benchmark: (case, ratio, value, peak of the method, peak of the reference) ---


def ep_vs_pooled(j):
    case = j.get("example", "")
    ep, nuts = j["ep"], j["pooled_nuts"]
    e, n = ep.get("peak_rss_mib"), nuts.get("peak_rss_mib")
    out = [
        (
            case,
            "pooled NUTS time / federated EP time (EP's first fit in the process, any compilation included)",
            num(j["speedup_pooled_over_ep"]),
            e,
            n,
        )
    ]
    if "speedup_pooled_over_ep_warm" in j:
        out.append(
            (
                case,
                "pooled NUTS time / federated EP time (the same EP fit again)",
                num(j["speedup_pooled_over_ep_warm"]),
                ep.get("peak_rss_mib_warm"),
                n,
            )
        )
    out += [
        (case, "EP vs pooled NUTS: max |mean diff| / NUTS sd", num(j["max_abs_mean_diff_over_sd"]), e, n),
        (case, "EP sd / pooled NUTS sd", span(j["sd_ratio_min"], j["sd_ratio_max"]), e, n),
    ]
    t = j.get("ep_nuts")
    if t:
        m = t.get("peak_rss_mib")
        out += [
            (
                case,
                "pooled NUTS time / federated EP (NUTS tilted moments) time",
                num(t["speedup_pooled_over_ep_nuts"]),
                m,
                n,
            ),
            (
                case,
                "EP (NUTS tilted) vs pooled NUTS: max |mean diff| / NUTS sd",
                num(t["max_abs_mean_diff_over_sd"]),
                m,
                n,
            ),
            (case, "EP (NUTS tilted) sd / pooled NUTS sd", span(t["sd_ratio_min"], t["sd_ratio_max"]), m, n),
        ]
    return out


def shrinkage_vs_pooled(j):
    out = []
    for r in j["runs"]:
        case = f"Case {r['case']} {r['penalty']} (K={r['K']}, d={r['d']})"
        f, p, g = r["federated"], r["pooled_nuts"], r["agreement"]
        e, n = f.get("peak_rss_mib"), p.get("peak_rss_mib")
        out += [
            (case, "pooled NUTS time / federated EP time", num(r["pooled_over_federated"]), e, n),
            (case, "EP vs pooled NUTS: max |mean diff| / NUTS sd", num(g["max_abs_mean_diff_over_sd"]), e, n),
            (case, "EP sd / pooled NUTS sd", span(g["sd_ratio_min"], g["sd_ratio_max"]), e, n),
        ]
        t = r.get("federated_nuts_tilted")
        if t:
            m = t.get("peak_rss_mib")
            out += [
                (case, "EP (NUTS tilted) time / EP (Gibbs tilted) time", num(t["over_gibbs"]), m, e),
                (
                    case,
                    "EP (NUTS tilted) vs pooled NUTS: max |mean diff| / NUTS sd",
                    num(t["agreement"]["max_abs_mean_diff_over_sd"]),
                    m,
                    n,
                ),
            ]
    return out


def _batched_vs_centralised(j, central_key: str, against: str, looped: str):
    """The two ratios of the runtime benchmarks (hm1, fgpr): batched federated against the
    centralised reference, and looped against batched clients."""
    out = []
    for r in j["results"]:
        p = r.get("peak_rss_mib")
        out += [
            (
                r["federation"],
                against,
                num(r["federated_over_centralised"]),
                pk(p, "federated_batched"),
                pk(p, central_key),
            ),
            (
                r["federation"],
                looped,
                num(r["looped_over_batched"]),
                pk(p, "federated_looped"),
                pk(p, "federated_batched"),
            ),
        ]
    return out


def hm1(j):
    return _batched_vs_centralised(
        j, "centralised", "federated (batched) / centralised, s per round", "federated looped / batched, s per round"
    )


def fgpr(j):
    return _batched_vs_centralised(
        j, "centralised_lbfgs", "federated (batched) time / centralised L-BFGS time", "federated looped / batched time"
    )


def fgpr_large(j):
    out = []
    for r in j["results"]:
        case = f"one client, {r['n']:,} rows ({r.get('path', '?')} path)"
        ex, err = r.get("exact"), r.get("max_rel_error")
        if ex:
            out.append(
                (
                    case,
                    "FGPR predict time / dense exact Cholesky time",
                    num(r["seconds"] / ex["seconds"]),
                    r.get("peak_rss_mib"),
                    ex.get("peak_rss_mib"),
                )
            )
        if err:
            out.append(
                (
                    case,
                    "FGPR predict vs dense exact: max relative error of mean, var_f, var_y",
                    ", ".join(num(err[k]) for k in ("mean", "var_f", "var_y")),
                    r.get("peak_rss_mib"),
                    pk(ex, "peak_rss_mib"),
                )
            )
        g = r.get("gpytorch_cg_love")
        if g:
            out.append(
                (
                    case,
                    "GPyTorch CG + LOVE predict time / FGPR predict time",
                    num(g["seconds"] / r["seconds"]),
                    g.get("peak_rss_mib"),
                    r.get("peak_rss_mib"),
                )
            )
    return out


def fedem(j):
    out = []
    for r in j["rows"]:
        sk = r.get("peak_rss_mib_sklearn")
        out += [
            (
                r["case"],
                "FedEM (shared weights) / scikit-learn, s per iteration",
                num(r["ratio_shared"]),
                r.get("peak_rss_mib_fedem_shared"),
                sk,
            ),
            (
                r["case"],
                "FedEM (private weights) / scikit-learn, s per iteration",
                num(r["ratio_private"]),
                r.get("peak_rss_mib_fedem_private"),
                sk,
            ),
        ]
    return out


def fem_omd(j):
    return [
        (
            f"C={r['C']}, n={r['n']}",
            "federated / centralised, s per step",
            num(r["ratio"]),
            r.get("peak_rss_mib_federated"),
            r.get("peak_rss_mib_centralised"),
        )
        for r in j["rows"]
    ]


def fem_omd_defaults(j):
    case = f"T={j.get('T')}, C={j.get('C')}, n={j.get('n')}, d={j.get('d')}, m={j.get('m')}"
    ratio = "none: a regret study, no federated / centralised ratio"
    return [(case, ratio, "-", j.get("peak_rss_mib_workers"), "-")]


def _against_pooled(j, case, reference: str):
    """One line per row of a federated-against-pooled benchmark: ``case(row)``, its ratio."""
    return [
        (case(r), f"federated / pooled {reference} time", num(r["ratio"]), r.get("peak_rss_mib_federated"),
         r.get("peak_rss_mib_pooled"))
        for r in j["rows"]
    ]  # fmt: skip


def glm(j):
    return _against_pooled(
        j, lambda r: f"{r['family']}, {r['clients']} x {r['rows_per_client']} x {r['predictors']}", "statsmodels"
    )


def stats(j):
    return _against_pooled(j, lambda r: f"{r['case']}, {r['clients']} x {r['rows_per_client']}", "pandas or scipy")


def survival(j):
    return [
        (f"{r['case']}, {r['clients']} x {r['rows_per_client']} x {r['covariates']}",
         f"federated / pooled {r.get('reference', 'lifelines').removeprefix('pooled ')} time", num(r["ratio"]), r.get("peak_rss_mib_federated"),
         r.get("peak_rss_mib_pooled"))
        for r in j["rows"]
    ]  # fmt: skip


def glm_hierarchical(j):
    out = []
    for r in j["rows"]:
        for key, name in (("ep", "laplace+importance"), ("is", "importance"), ("laplace", "laplace")):
            case = f"K={r['clients']} ({r['rows']} rows), tilted={name}"
            warm = r.get(f"peak_rss_mib_{key}_warm")
            if f"{key}_first_s" in r:
                out.append(
                    (
                        case,
                        "pooled NUTS time / EP time, first runs (compilation included)",
                        num(r["nuts_first_s"] / r[f"{key}_first_s"]),
                        r.get(f"peak_rss_mib_{key}_first"),
                        r.get("peak_rss_mib_nuts_first"),
                    )
                )
            out += [
                (
                    case,
                    "pooled NUTS time (again) / EP time (warm)",
                    num(r["nuts_again_s"] / r[f"{key}_warm_s"]),
                    warm,
                    r.get("peak_rss_mib_nuts_again"),
                ),
                (
                    case,
                    "EP vs pooled NUTS: max |phi mean diff| / NUTS sd",
                    num(r[f"{key}_max_phi_diff_sd"]),
                    warm,
                    r.get("peak_rss_mib_nuts_first"),
                ),
                (
                    case,
                    "EP sd / pooled NUTS sd (phi)",
                    span(r[f"{key}_sd_ratio_min"], r[f"{key}_sd_ratio_max"]),
                    warm,
                    r.get("peak_rss_mib_nuts_first"),
                ),
                (
                    case,
                    "EP vs pooled NUTS: max |client coefficient mean diff| / NUTS sd",
                    num(r[f"{key}_max_client_diff_sd"]),
                    warm,
                    r.get("peak_rss_mib_nuts_first"),
                ),
            ]
    return out


def flower_overhead(j):
    out = []
    for r in j["rows"]:
        case = f"{r['model']}, {r['clients']} clients"
        f, i = r.get("peak_rss_mib_flower"), r.get("peak_rss_mib_inprocess")
        out += [
            (case, "Flower / in-process, fit time", num(r["fit_ratio"]), f, i),
            (case, "Flower / in-process, s per round", num(r["round_ratio"]), f, i),
        ]
    return out


def dp_glm(j):
    plain = field(j, "plain_fits") or {}
    out = []
    for r in j["rows"]:
        if r["noise_multiplier"] == 0:
            continue  # the plain fit against itself
        case = f"{r['family']}, {r['placement']} noise, z={r['noise_multiplier']:g} (epsilon {r['epsilon']:.3g})"
        ref = pk(plain, r["family"], "peak_rss_mib")
        out += [
            (
                case,
                "private vs plain fit: max |coefficient diff| / se",
                num(r["max_err_plain_over_se"]),
                r.get("peak_rss_mib"),
                ref,
            ),
            (case, "DP noise sd / sampling se", num(r["dp_sd_over_se"]), r.get("peak_rss_mib"), ref),
        ]
    return out


def dp_fedem(j):
    ref = pk(j.get("plain_fits"), "peak_rss_mib")
    return [
        (
            f"{r['placement']} noise, z={r['z']:g} (epsilon {r['epsilon']:.3g})",
            "private vs plain FedEM: max |mean diff| / component sd",
            num(r["vs_plain"]),
            r.get("peak_rss_mib"),
            ref,
        )
        for r in j["rows"]
        if r["placement"] != "none"
    ]


def hm1_defaults(j):
    rows = j if isinstance(j, list) else j["rows"]  # before memory was recorded: the list of rows
    peak = None if isinstance(j, list) else j.get("peak_rss_mib")
    return [
        (
            f"K={r['K']}, rho={r['rho']:g}, sigma={r['sigma']:g}, mean={r['mean']:g}",
            "coefficient RMSE of data-poor clients / their own least squares: default, Algorithm 1, oracle",
            f"{num(r['default'])}, {num(r['algorithm1'])}, {num(r['oracle'])}",
            peak,
            SAME,
        )
        for r in rows
    ]


def many_predictors(j):
    hm2, nuts, lasso = j["hm2"], j["pooled_nuts"], j["lasso"]
    small, large = sorted(hm2, key=int)
    e, n = hm2[large].get("peak_rss_mib"), nuts[large].get("peak_rss_mib")
    case = j.get("example", "")
    return [
        (
            case,
            f"HM2 time, d = {large} / d = {small} (defaults)",
            num(j["hm2_time_ratio"]),
            e,
            hm2[small]["peak_rss_mib"],
        ),
        (case, f"pooled NUTS time / HM2 time, d = {large}", num(j["pooled_nuts_over_hm2"]), e, n),
        (
            case,
            f"HM2 vs pooled NUTS, d = {large}: max |mean diff| / NUTS sd",
            num(j["max_abs_mean_diff_over_sd"]),
            e,
            n,
        ),
        (case, f"HM2 sd / pooled NUTS sd, d = {large}", span(j["sd_ratio_min"], j["sd_ratio_max"]), e, n),
        (
            case,
            f"lasso time, d = {large} / d = {small} (defaults, compilation included)",
            num(j["lasso_time_ratio"]),
            lasso[large].get("peak_rss_mib"),
            lasso[small].get("peak_rss_mib"),
        ),
    ]


def startup(j):
    """Each entry point's import time over ``import pandas``'s (the command line's seconds are on its page)."""
    return [(f"`{r['entry']}`", "import time / import pandas", num(r["ratio"]), None, None) for r in j["imports"][1:]]


# in the order of the documentation's benchmark pages
EXTRACT = {
    f.__name__: f
    for f in (
        ep_vs_pooled,
        many_predictors,
        shrinkage_vs_pooled,
        hm1,
        hm1_defaults,
        glm,
        glm_hierarchical,
        fgpr,
        fgpr_large,
        fedem,
        fem_omd,
        fem_omd_defaults,
        flower_overhead,
        dp_glm,
        dp_fedem,
        stats,
        survival,
        startup,
    )
}


def extractor(stem: str):
    """The benchmark a result file belongs to: its name less ``_quick`` and a device suffix
    (``fgpr_cuda``, ``fgpr_quick_cuda``); None for a benchmark this script does not know."""
    name = stem
    for suffix in ("_cuda", "_quick"):
        name = name.removesuffix(suffix)
    return EXTRACT.get(name)


def utc(iso: str) -> str:
    t = datetime.fromisoformat(iso)
    if t.tzinfo is None:
        return iso
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def when_written(path: Path, j) -> str:
    """The file's ``written`` field, else its last git commit date, else "unknown"."""
    w = field(j, "written")
    if w:
        return utc(w)
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cI", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=30,
        )
        date = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        date = ""
    return f"{utc(date)} (git commit)" if date else "unknown"


def peak_cell(v, recorded: bool, scope) -> str:
    if isinstance(v, str) and not (v == SAME and not recorded):
        return v
    if not recorded or v is None or isinstance(v, str):
        return NOT_RECORDED
    return f"{v:.0f}" + (" (since process start)" if scope == "process" else "")


def cell(text) -> str:
    """A table cell: its pipes escaped."""
    return str(text).replace("|", "\\|")


def summarise(paths) -> list[str]:
    rows = []
    for path in paths:
        j = json.loads(path.read_text())
        scope = field(j, "peak_rss_scope")
        recorded = scope is not None  # the benchmarks record the scope with the first peak
        machine = field(j, "machine_details") or field(j, "machine") or NOT_RECORDED
        written = when_written(path, j)
        f = extractor(path.stem)
        try:
            entries = f(j) if f else [("-", "no ratios known to benchmarks/summary.py", "-", None, None)]
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
            entries = [("-", f"not read: the file lacks {e}", "-", None, None)]
        for case, ratio, value, method, ref in entries:
            rows.append(
                [
                    f"`{path.stem}`",
                    case,
                    ratio,
                    value,
                    peak_cell(method, recorded, scope),
                    peak_cell(ref, recorded, scope),
                    machine,
                    written,
                ]
            )
    head = ["benchmark", "case", "ratio", "value", "peak RSS (MiB), method", "peak RSS (MiB), reference"]
    head += ["machine", "written"]
    lines = [
        "# Benchmarks: every ratio, with peak memory",
        "",
        f"Every ratio the {len(paths)} result files in `benchmarks/results/` report, one row per benchmark, "
        "case and ratio: federated against centralised (or pooled) time, and the accuracy gaps that are ratios "
        "(mean differences in the reference's standard deviations, sd ratios, errors in standard errors, "
        "RMSE ratios). A ratio names the method first and the reference it is compared with second; the "
        "peak RSS columns are the peak resident memory (MiB) of that benchmark's process while each side ran, "
        "as the benchmark recorded it (see its page); *not recorded*: the result predates memory measurement, "
        f"*{SAME}*: both sides ran in one measured block (its peak is in the method's column). Machine and "
        "written: as the result file recorded them (*git commit*: the file records no date, so the date of "
        "its last commit). Written by `benchmarks/summary.py` (the last step of `make bench`) from the "
        "JSON files, without re-running anything.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="also read the *_quick.json files of smoke runs")
    ap.add_argument("--results", default=str(RESULTS), help="the folder of the result files")
    ap.add_argument("--out", help="the table (default: summary.md in the results folder)")
    a = ap.parse_args(argv)
    folder = Path(a.results)
    order = list(EXTRACT)  # unknown benchmarks last
    paths = sorted(
        (p for p in folder.glob("*.json") if a.quick or "_quick" not in p.stem),
        key=lambda p: (order.index(f.__name__) if (f := extractor(p.stem)) else len(order), p.stem),
    )
    lines = summarise(paths)
    out = Path(a.out) if a.out else folder / "summary.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines) - 6} rows from {len(paths)} result files: {out.name}")


if __name__ == "__main__":
    main()
