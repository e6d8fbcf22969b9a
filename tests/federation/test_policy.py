"""A node's release policy, checked without Flower (the simulation tests are in test_flower.py,
the deployment's in test_flower_deployment.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.federation import NodePolicy, PolicyRefusal
from fedstats.federation.oneshot import OneShot
from fedstats.federation.policy import data_shape, policy_of
from fedstats.mixture.fedem_algorithm import FedEMAlgorithm


def fedem(M=3, d=2, **kw):
    return FedEMAlgorithm(np.zeros((M, d)), np.stack([np.eye(d)] * M), **kw)


def rows(n, d=2, target=True):
    fd = FederatedData.from_arrays([np.arange(n * d, dtype=float).reshape(n, d)], [np.zeros(n)] if target else None)
    return fd[0]


def refused(policy, algorithm, data, rule):
    with pytest.raises(PolicyRefusal, match=f"rule {rule}") as info:
        policy.check(algorithm, data)
    assert info.value.rule == rule
    return str(info.value)


def test_the_defaults_refuse_fewer_than_ten_rows_and_thin_regressions():
    p = NodePolicy()
    assert (p.min_rows, p.min_rows_per_parameter, p.min_cell_count, p.algorithms) == (10, 3.0, 5, None)
    assert "4 rows, fewer than 10" in refused(p, fedem(), rows(4, target=False), "min_rows")
    p.check(fedem(), rows(10, target=False))  # no target: no per-parameter rule
    msg = refused(p, fedem(), rows(12, d=5), "min_rows_per_parameter")  # a regression on 5 columns needs 15
    assert "12 rows for a regression on 5 columns" in msg and "(15)" in msg
    p.check(fedem(), rows(15, d=5))
    # the runtime's views of a client's data: (X, y, ...) tuples and bare arrays count alike
    assert data_shape((np.ones((7, 4)), np.ones(7), None)) == (7, 4, True)
    assert data_shape(np.ones((6, 2))) == (6, 2, False)
    assert "cannot count the rows of a dict" in refused(p, fedem(), {"X": 1}, "min_rows")


def test_algorithms_and_option_ranges():
    p = NodePolicy(
        algorithms=("FedEMAlgorithm", "OneShot"),
        options={
            "FedEMAlgorithm": {"M": [1, 4], "cov_type": ["full", "diag"], "shared": False},
            "OneShot": {"client_fn": ["_score"]},
        },
    )
    data = rows(10, target=False)
    p.check(fedem(M=4), data)
    assert "FedEMAlgorithm.M = 5" in refused(p, fedem(M=5), data, "options")
    assert "'tied'" in refused(p, fedem(covariance_type="tied"), data, "options")
    refused(p, fedem(shared_weights=True), data, "options")

    def _score(payload, X, rng, private):
        return {}

    def _centres(payload, X, rng, private):
        return {}

    p.check(OneShot(("loglik",), {}, _score), data)
    assert "client_fn = '_centres'" in refused(p, OneShot(("c",), {}, _centres), data, "options")
    assert "does not run IRLS" in refused(p, type("IRLS", (), {})(), data, "algorithms")
    # an option the algorithm does not have is refused, not ignored
    q = NodePolicy(options={"FedEMAlgorithm": {"n_components": [1, 3]}})
    assert "no option 'n_components'" in refused(q, fedem(), data, "options")


def test_a_policy_file(tmp_path):
    f = tmp_path / "policy.toml"
    f.write_text(
        'min_rows = 20\nmin_rows_per_parameter = 10\nalgorithms = ["IRLS", "DesignCheck"]\n'
        "[options.IRLS]\nmax_iter = [1, 50]\n"
    )
    p = policy_of(f)
    assert (p.min_rows, p.min_rows_per_parameter, p.algorithms) == (20, 10, ("IRLS", "DesignCheck"))
    assert p.options == {"IRLS": {"max_iter": [1, 50]}}
    assert policy_of(None) == NodePolicy() and policy_of(p) is p
    with pytest.raises(ValueError, match=r"unknown policy keys \['min_row'\]"):
        NodePolicy.from_toml("min_row = 3")
    for bad in ("min_rows = 0", "min_rows = 2.5", "min_rows_per_parameter = -1", 'algorithms = "IRLS"'):
        with pytest.raises(ValueError):
            NodePolicy.from_toml(bad)
    with pytest.raises(TypeError, match="NodePolicy, a TOML file path or None"):
        policy_of(5)


def test_what_leaves_the_node_at_the_end_and_the_information_share():
    from fedstats.linear.hm1_algorithm import InformationShare

    p = NodePolicy()
    assert (p.release, p.release_statistics, p.posterior_dir) == ("messages", False, None)
    data = rows(20, d=2)
    # HM1's information share is the client's X'X / s^2 and X'y / s^2: refused by default
    msg = refused(p, InformationShare(None), data, "release_statistics")
    assert "sufficient statistics" in msg and "release_statistics = true" in msg
    NodePolicy(release_statistics=True).check(InformationShare(None), data)
    q = NodePolicy.from_toml('release = "posterior"\nrelease_statistics = true\nposterior_dir = "kept"\n')
    assert (q.release, q.release_statistics, q.posterior_dir) == ("posterior", True, "kept")
    for bad in ('release = "everything"', 'release_statistics = "yes"', 'posterior_dir = ""'):
        with pytest.raises(ValueError):
            NodePolicy.from_toml(bad)
