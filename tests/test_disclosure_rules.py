"""Disclosure defaults (issue 41, item 3): one set of rules for Python, the command line and
nodes (at least 10 rows per client, 3 rows per column of a regression, 0/1 cells of 0 or at
least 5); with defaults every model refuses a 3-row client in one line naming the rule, the
client and the option; relaxed only explicitly. With small clients allowed, the messages a
3-row client sends in a GLM and an HM2 fit do not determine its rows (another 3 rows send the
very same messages), and none of them holds a row's value (the GLM's design check sends no
column extremes). FedEM's per-client statistics, read one client at a time, do determine a
small client's rows (one round suffices for 3 rows): the evidence is the attack below; its
protection is secure aggregation (see the threat-model page)."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import least_squares
from scipy.stats import multivariate_normal

from fedstats import FederatedData, HierarchicalLinearModel
from fedstats.cli import build_parser, main
from fedstats.data import DisclosureError
from fedstats.data.disclosure import MIN_CELL_COUNT, MIN_ROWS, MIN_ROWS_PER_PARAMETER, NO_RULES
from fedstats.federation import runner
from fedstats.federation.policy import NodePolicy
from fedstats.glm import FederatedGLM
from fedstats.mixture import FEMOMD

SITES = os.path.join(os.path.dirname(__file__), "..", "examples", "sites.csv")


def with_small_client(n=3, seed=0):
    """The example sites plus a client 'small' of ``n`` rows."""
    df = pd.read_csv(SITES)
    return pd.concat([df, df.sample(n, random_state=seed).assign(site="small")], ignore_index=True)


def test_one_set_of_defaults_for_python_the_command_line_and_nodes():
    fd = FederatedData.from_arrays([np.ones((3, 1))], [np.ones(3)])
    assert (fd.min_rows, fd.min_cell_count) == (MIN_ROWS, MIN_CELL_COUNT) == (10, 5)
    policy = NodePolicy()
    assert (policy.min_rows, policy.min_rows_per_parameter, policy.min_cell_count) == (10, 3.0, 5)
    assert MIN_ROWS_PER_PARAMETER == 3.0
    args = build_parser().parse_args(["fit", "x.csv", "--by", "site"])
    assert (args.min_rows, args.min_cell_count) == (MIN_ROWS, MIN_CELL_COUNT)


def test_every_model_refuses_a_3_row_client_in_one_line_naming_rule_client_and_option(model_fits):
    df = with_small_client()
    data = FederatedData.from_dataframe(df, by="site", target="y")
    gm = FederatedData.from_dataframe(df[["site", "x1", "x2"]], by="site")
    tried, fits = [], model_fits(data, gm, df)
    for name, thunk in fits:
        if name in ("fem-omd", "lasso-centralised"):  # its own stream below; a pooled fit sends nothing
            continue
        with pytest.raises(DisclosureError) as info:
            thunk()
        msg = str(info.value)
        assert "\n" not in msg and "(rule min_rows)" in msg and "client 'small'" in msg, (name, msg)
        assert "min_rows=3" in msg and "--min-rows 3" in msg, (name, msg)
        tried.append(name)
    assert len(tried) == len(fits) - 2 >= 18  # every model of the registry but the two above
    rng = np.random.default_rng(0)
    with pytest.raises(DisclosureError, match=r"FEMOMD refuses client 1 \(rule min_rows\)"):
        FEMOMD(2, horizon=3).partial_fit([rng.normal(size=(30, 2)), rng.normal(size=(3, 2))])


def test_the_command_line_refuses_a_3_row_client_and_min_rows_relaxes_it(tmp_path, capsys):
    path = tmp_path / "sites.csv"
    with_small_client().to_csv(path, index=False)
    base = ["fit", str(path), "--by", "site", "--target", "y", "--model", "glm", "--family", "gaussian", "-q"]
    assert main(base) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "client 'small' (rule min_rows)" in err and "--min-rows 3" in err, err
    assert main([*base, "--min-rows", "3"]) == 2  # 3 rows pass; a regression on 3 columns needs 9
    assert "(rule min_rows_per_parameter)" in capsys.readouterr().err
    assert main([*base, "--min-rows", "1"]) == 0


def test_each_rule_is_relaxed_only_explicitly():
    rng = np.random.default_rng(1)
    # rows per column: 20 rows on 8 columns need 24
    wide = FederatedData.from_arrays(
        [rng.normal(size=(40, 8)), rng.normal(size=(20, 8))], [rng.normal(size=40), rng.normal(size=20)]
    )
    with pytest.raises(
        DisclosureError, match=r"client 1 \(rule min_rows_per_parameter\).*8 columns.*\(24\).*min_rows=1"
    ):
        FederatedGLM("gaussian").fit(wide)
    assert np.isfinite(FederatedGLM("gaussian").fit(wide.with_rules(min_rows=1)).params).all()
    # a category's dummy that 2 rows of a client have
    X = np.column_stack([rng.normal(size=60), (np.arange(60) < 2).astype(float)])
    cells = FederatedData.from_arrays(
        {"a": X[:30], "b": X[30:]},
        {"a": rng.normal(size=30), "b": rng.normal(size=30)},
        feature_names=["age", "sex[m]"],
    )
    with pytest.raises(
        DisclosureError,
        match=r"client 'a' \(rule min_cell_count\): 2 of its rows have 'sex\[m\]' = 1.*min_cell_count=2",
    ):
        FederatedGLM("gaussian").fit(cells)
    # the rule reads every 0/1 column, the outcome too (28 of 30 rows at 1: a cell of 2 zeros)
    y01 = {"a": (np.arange(30) >= 2).astype(float), "b": (np.arange(30) % 2).astype(float)}
    binary = FederatedData.from_arrays({"a": X[:30, :1], "b": X[30:, :1]}, y01, target_name="event")
    with pytest.raises(DisclosureError, match=r"client 'a' \(rule min_cell_count\): 2 of its rows have 'event' = 0"):
        FederatedGLM("binomial").fit(binary)
    assert np.isfinite(FederatedGLM("binomial").fit(binary.with_rules(min_cell_count=2)).params).all()
    # derived data keep their rules; simulated data come without them
    assert wide.with_rules(min_rows=1).subset([0]).min_rows == 1
    assert FederatedData.from_arrays([np.ones((2, 1))], **NO_RULES).min_rows == 1
    with pytest.raises(Exception, match="min_rows must be an integer >= 1"):
        FederatedData.from_arrays([np.ones((2, 1))], min_rows=0)


def test_a_node_policy_refuses_what_the_rules_refuse():
    from fedstats.federation.policy import PolicyRefusal
    from fedstats.glm._irls import IRLS

    rng = np.random.default_rng(2)
    algorithm = object.__new__(IRLS)
    for X, y, rule in [
        (rng.normal(size=(3, 1)), rng.normal(size=3), "min_rows"),
        (rng.normal(size=(20, 8)), rng.normal(size=20), "min_rows_per_parameter"),
        (np.c_[rng.normal(size=30), np.arange(30) < 1], rng.normal(size=30), "min_cell_count"),
    ]:
        with pytest.raises(PolicyRefusal, match=f"rule {rule}"):
            NodePolicy().check(algorithm, (X, y))
    NodePolicy(min_rows=1, min_cell_count=1).check(algorithm, (rng.normal(size=(3, 1)), rng.normal(size=3)))


# ---------------------------------------------------------------- what a 3-row client's messages tell
@contextlib.contextmanager
def replies_of(client):
    """Every reply ``client`` sends in the runs inside the block, in order."""
    seen, real = [], runner._run

    def spy(r):
        if client in r.ids:
            i, rr = r.ids.index(client), r.client_side.run_round

            def recording(rnd, idx, messages, batched):
                outcomes, fallback = rr(rnd, idx, messages, batched)
                seen.extend(o.reply for j, o in zip(idx, outcomes) if j == i and o.reply is not None)
                return outcomes, fallback

            r.client_side.run_round = recording
        return real(r)

    runner._run = spy
    try:
        yield seen
    finally:
        runner._run = real


def same_moments(rows, angle=np.pi / 2):
    """Other rows with the same sums and cross-products of every column (the rows' deviations
    from their mean rotated about the all-ones direction)."""
    n = len(rows)
    u = np.ones(n) / np.sqrt(n)
    basis = np.linalg.qr(np.c_[u, np.eye(n)[:, : n - 1]])[0][:, 1:]  # orthonormal, orthogonal to u
    c, s = np.cos(angle), np.sin(angle)
    Q = np.eye(n) + basis @ (np.array([[c - 1, -s], [s, c - 1]]) @ basis.T)
    mean = rows.mean(axis=0)
    return mean + Q @ (rows - mean)


@pytest.mark.parametrize("model", ["glm", "hm2"])
def test_the_messages_of_a_3_row_client_do_not_determine_its_rows(model):
    df = with_small_client()
    columns = [c for c in df.columns if c != "site"]
    small = df[df.site == "small"][columns].to_numpy()
    other = same_moments(small)
    # other rows altogether: none of them within 0.1 of one of the client's
    assert np.min(np.linalg.norm(small[:, None] - other[None], axis=2)) > 0.1
    sent = []
    for rows in (small, other):
        frame = df.copy()
        frame.loc[frame.site == "small", columns] = rows
        data = FederatedData.from_dataframe(frame, by="site", target="y", min_rows=1)
        with replies_of("small") as seen:
            if model == "glm":
                FederatedGLM("gaussian").fit(data)
            else:
                HierarchicalLinearModel(rounds=3).fit(data, seed=0, progress=False)
        sent.append(seen)
    assert len(sent[0]) == len(sent[1]) >= 2
    for a, b in zip(*sent):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(
                np.asarray(b[k], dtype=float), np.asarray(a[k], dtype=float), rtol=1e-7, atol=1e-9, err_msg=k
            )
        # and no message holds one of its values (the design check sends no column extremes)
        values = np.concatenate([np.ravel(np.asarray(v, dtype=float)) for v in a.values()])
        assert not np.isin(np.round(small.ravel(), 12), np.round(values, 12)).any()


def test_fedem_statistics_of_one_client_determine_a_small_clients_rows():
    # the evidence for the threat-model page: one EM round's soft counts and moments of a 3-row
    # client, read on their own (no secure aggregation), rebuild its rows to rounding
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(3, 2)) * 2
    means, covs, w = np.array([[-1.0, 0.0], [1.5, 0.5]]), np.stack([np.eye(2) * 1.5, np.eye(2)]), np.array([0.4, 0.6])

    def statistics(X):
        logp = np.stack([np.log(w[j]) + multivariate_normal(means[j], covs[j]).logpdf(X) for j in range(2)], 1)
        resp = np.exp(logp - np.logaddexp.reduce(logp, axis=1, keepdims=True))
        return np.r_[resp.sum(0), (resp.T @ X).ravel(), np.einsum("nj,nd,ne->jde", resp, X, X).ravel()]

    sent = statistics(rows)
    fits_ = [least_squares(lambda z: statistics(z.reshape(3, 2)) - sent, rng.normal(size=6) * 2) for _ in range(10)]
    rebuilt = min(fits_, key=lambda f: f.cost).x.reshape(3, 2)
    np.testing.assert_allclose(np.sort(rebuilt, axis=0), np.sort(rows, axis=0), atol=1e-6)
