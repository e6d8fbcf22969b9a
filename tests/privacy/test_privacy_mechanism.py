"""The differential-privacy mechanism (fedstats.privacy): per-row clipping, the sensitivity
it gives under adding or removing one row, the Gaussian noise (central, and the clients'
shares summing to it, also when fewer answer), the option's checks, and a noiseless release
that equals the non-private sums. None of this needs dp-accounting."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fedstats.privacy import DifferentialPrivacy, clip_rows, effective_noise_multiplier, gaussian_noise, noise_scales

KEYS = ("n", "a", "b")


def rows(seed: int, n: int = 40) -> dict[str, np.ndarray]:
    """Per-row contributions of three keys of different shapes, norms spread over 0.01..100."""
    rng = np.random.default_rng(seed)
    size = np.exp(rng.uniform(np.log(0.01), np.log(100.0), size=n))
    return {
        "n": np.ones(n),
        "a": rng.standard_normal((n, 3)) * size[:, None],
        "b": rng.standard_normal((n, 2, 2)) * size[:, None, None] / 3,
    }


def row_vectors(contrib: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's contributions concatenated over the keys, (n_rows, total size)."""
    n = len(contrib["n"])
    return np.hstack([np.asarray(contrib[k], dtype=float).reshape(n, -1) for k in KEYS])


def one_row(contrib: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    return {k: v[i : i + 1] for k, v in contrib.items()}


def flat(sums: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.ravel(sums[k]) for k in KEYS])


# ------------------------------------------------------------------------------- clipping


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_joint_clipping_bounds_each_row_and_leaves_rows_under_the_bound(seed):
    contrib, bound = rows(seed), 5.0
    norms = np.linalg.norm(row_vectors(contrib), axis=1)
    assert (norms > bound).any() and (norms <= bound).any()  # both kinds of rows present
    clipped = [flat(clip_rows(one_row(contrib, i), bound).sums) for i in range(len(norms))]
    for i, c in enumerate(clipped):
        raw = row_vectors(one_row(contrib, i))[0]
        assert np.linalg.norm(c) <= bound * (1 + 1e-12)
        if norms[i] <= bound:
            assert np.array_equal(c, raw)  # untouched, to the bit
        else:
            assert np.linalg.norm(c) == pytest.approx(bound, rel=1e-12)
            np.testing.assert_allclose(c, raw * bound / norms[i], rtol=1e-13)  # scaled, same direction
    out = clip_rows(contrib, bound)
    assert out.n_rows == len(norms) and out.n_clipped == int((norms > bound).sum())
    np.testing.assert_allclose(flat(out.sums), np.sum(clipped, axis=0), rtol=1e-12, atol=1e-12)
    assert out.sums["n"].shape == () and out.sums["a"].shape == (3,) and out.sums["b"].shape == (2, 2)


@pytest.mark.parametrize("seed", [3, 4])
def test_per_key_clipping_bounds_each_key_of_each_row(seed):
    contrib = rows(seed)
    bounds = {"n": 1.0, "a": 4.0, "b": 0.5}
    n = len(contrib["n"])
    over = np.zeros(n, dtype=bool)
    for k, c in bounds.items():
        over |= np.linalg.norm(contrib[k].reshape(n, -1), axis=1) > c
    out = clip_rows(contrib, bounds)
    assert out.n_clipped == int(over.sum()) and 0 < out.n_clipped < n
    assert out.sums["n"] == n  # a row count with a bound of 1 is never clipped
    for i in range(n):
        single = clip_rows(one_row(contrib, i), bounds).sums
        for k, c in bounds.items():
            raw = contrib[k][i]
            norm = np.linalg.norm(raw)
            assert np.linalg.norm(single[k]) <= c * (1 + 1e-12)
            if norm <= c:
                assert np.array_equal(single[k], raw)
            else:
                np.testing.assert_allclose(single[k], raw * c / norm, rtol=1e-13)


def test_clipping_with_nothing_over_the_bound_gives_the_plain_sums_to_the_bit():
    contrib = rows(5)
    out = clip_rows(contrib, 1e6)
    assert out.n_clipped == 0
    for k in KEYS:
        assert np.array_equal(out.sums[k], contrib[k].sum(axis=0))


def test_a_client_without_rows_sends_zeros():
    for bound in (1.0, {"n": 1.0, "a": 1.0}):
        out = clip_rows({"n": np.ones(0), "a": np.zeros((0, 3))}, bound)
        assert out.n_rows == 0 and out.n_clipped == 0
        assert np.array_equal(out.sums["n"], np.zeros(())) and np.array_equal(out.sums["a"], np.zeros(3))


# ----------------------------------------------------------------------------- sensitivity


@pytest.mark.parametrize("seed", range(6))
def test_removing_one_row_moves_the_sums_by_at_most_the_sensitivity(seed):
    contrib = rows(seed, n=25)
    rng = np.random.default_rng(100 + seed)
    bound = 3.0
    bounds = {"n": 1.0, "a": 2.0, "b": 0.7}
    scales = noise_scales(bounds, KEYS)
    full_joint, full_keys = clip_rows(contrib, bound), clip_rows(contrib, bounds)
    for j in rng.choice(25, size=8, replace=False):
        rest = {k: np.delete(v, j, axis=0) for k, v in contrib.items()}
        d = flat(full_joint.sums) - flat(clip_rows(rest, bound).sums)
        assert np.linalg.norm(d) <= bound * (1 + 1e-9)
        np.testing.assert_allclose(d, flat(clip_rows(one_row(contrib, j), bound).sums), atol=1e-9)
        dk = {k: np.ravel(full_keys.sums[k] - clip_rows(rest, bounds).sums[k]) for k in KEYS}
        for k in KEYS:
            assert np.linalg.norm(dk[k]) <= bounds[k] * (1 + 1e-9)
        # the sums over their noise scales: joint sensitivity 1 (one Gaussian mechanism of z)
        assert math.sqrt(sum(np.sum((dk[k] / scales[k]) ** 2) for k in KEYS)) <= 1 + 1e-9


def test_the_sensitivity_is_reached_by_one_large_row():
    contrib = rows(7, n=10)
    contrib["a"][4] = [3e3, -4e3, 0.0]
    rest = {k: np.delete(v, 4, axis=0) for k, v in contrib.items()}
    d = flat(clip_rows(contrib, 2.5).sums) - flat(clip_rows(rest, 2.5).sums)
    assert np.linalg.norm(d) == pytest.approx(2.5, rel=1e-9)


def test_noise_scales():
    assert noise_scales(2.0, KEYS) == {"n": 2.0, "a": 2.0, "b": 2.0}
    s = noise_scales({"n": 1.0, "a": 2.0, "b": 0.5}, KEYS)
    assert s == pytest.approx({"n": math.sqrt(3), "a": 2 * math.sqrt(3), "b": 0.5 * math.sqrt(3)})


# ----------------------------------------------------------------------------------- noise


def test_central_noise_has_the_stated_variance_per_key():
    scales = {"a": 2.5, "b": 0.4}
    z = 1.3
    noise = gaussian_noise({"a": (200, 250), "b": (50_000,)}, scales, z, np.random.default_rng(11))
    for k, v in noise.items():
        # the sample variance of N = 50,000 draws has relative standard error sqrt(2/N) = 0.63%
        assert v.var() == pytest.approx((z * scales[k]) ** 2, rel=0.025)
        assert abs(v.mean()) < 4 * z * scales[k] / math.sqrt(v.size)
    assert noise["a"].shape == (200, 250)


def test_client_shares_sum_to_the_stated_variance():
    z, s, n_clients = 0.9, 3.0, 8
    shares = [
        gaussian_noise({"a": (40_000,)}, s, z, np.random.default_rng([21, c]), placement="client", n_clients=n_clients)[
            "a"
        ]
        for c in range(n_clients)
    ]
    for share in shares:
        assert share.var() == pytest.approx((z * s) ** 2 / n_clients, rel=0.03)
    total = np.sum(shares, axis=0)
    assert total.var() == pytest.approx((z * s) ** 2, rel=0.03)
    # fewer answering: the sum carries the answering clients' shares only, as noise_std says
    dp = DifferentialPrivacy(noise_multiplier=z, clip=s, placement="client")
    three = np.sum(shares[:3], axis=0)
    assert three.var() == pytest.approx(dp.noise_std(["a"], n_clients=8, n_answered=3)["a"] ** 2, rel=0.05)
    assert dp.noise_std(["a"], n_clients=8, n_answered=3)["a"] == pytest.approx(z * s * math.sqrt(3 / 8))


def test_noise_is_reproducible_and_zero_noise_draws_nothing():
    a = gaussian_noise({"x": (5,)}, 1.0, 2.0, np.random.default_rng(3))
    b = gaussian_noise({"x": (5,)}, 1.0, 2.0, np.random.default_rng(3))
    assert np.array_equal(a["x"], b["x"]) and np.all(a["x"] != 0)
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    zero = gaussian_noise({"x": (5,), "y": ()}, {"x": 1.0, "y": 2.0}, 0.0, rng, placement="client", n_clients=4)
    assert rng.bit_generator.state == before
    assert np.array_equal(zero["x"], np.zeros(5)) and zero["y"].shape == ()


def test_effective_noise_multiplier():
    assert effective_noise_multiplier(2.0, "central", 9, 3, secure_aggregation=False) == 2.0
    assert effective_noise_multiplier(2.0, "client", 9, 9, secure_aggregation=True) == pytest.approx(2.0)
    assert effective_noise_multiplier(2.0, "client", 9, 4, secure_aggregation=True) == pytest.approx(4 / 3)
    # without secure aggregation the server reads each reply, carrying one client's share
    assert effective_noise_multiplier(2.0, "client", 9, 9, secure_aggregation=False) == pytest.approx(2 / 3)
    dp = DifferentialPrivacy(noise_multiplier=2.0, clip=1.0)
    assert dp.effective_noise_multiplier(n_clients=9, n_answered=4, secure_aggregation=True) == pytest.approx(4 / 3)
    with pytest.raises(ValueError, match="n_answered must be an integer >= 1"):
        effective_noise_multiplier(1.0, "client", 3, 0, secure_aggregation=True)
    with pytest.raises(TypeError, match="secure_aggregation must be True or False"):
        effective_noise_multiplier(1.0, "client", 3, 3, secure_aggregation="yes")  # type: ignore[arg-type]


# ------------------------------------------------------------- a noiseless fit, and a noisy one


def moments(data: list[np.ndarray], dp: DifferentialPrivacy, seed: int) -> tuple[float, float]:
    """A federated mean and variance from the clients' noisy sums of 1, x and x^2."""
    replies = [
        dp.client_sums(
            {"n": np.ones(len(x)), "s": x, "ss": x**2}, np.random.default_rng([seed, c]), n_clients=len(data)
        )
        for c, x in enumerate(data)
    ]
    sums = dp.server_sums({k: sum(r.sums[k] for r in replies) for k in ("n", "s", "ss")}, np.random.default_rng(seed))
    n, s, ss = float(sums["n"]), float(sums["s"]), float(sums["ss"])
    return s / n, ss / n - (s / n) ** 2


@pytest.mark.parametrize("placement", ["client", "central"])
def test_with_no_noise_the_result_equals_the_non_private_fit(placement):
    rng = np.random.default_rng(8)
    data = [rng.normal(1.0, 2.0, size=m) for m in (30, 55, 12)]
    pooled = np.concatenate(data)
    bound = {"n": 1.0, "s": 100.0, "ss": 1e4}  # no row reaches its bound
    mean, var = moments(data, DifferentialPrivacy(noise_multiplier=0.0, clip=bound, placement=placement), 0)
    assert mean == pytest.approx(pooled.mean(), rel=1e-13)
    assert var == pytest.approx(pooled.var(), rel=1e-12)
    # X'X from per-row outer products (what a GLM client would clip) equals X.T @ X to rounding
    X = rng.standard_normal((40, 3))
    dp = DifferentialPrivacy(noise_multiplier=0.0, clip=1e3, placement=placement)
    got = dp.server_sums(dp.client_sums({"xtx": np.einsum("ij,ik->ijk", X, X)}, rng, n_clients=1).sums, rng)
    np.testing.assert_allclose(got["xtx"], X.T @ X, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("placement", ["client", "central"])
def test_noisy_sums_scatter_around_the_exact_ones_as_stated(placement):
    rng = np.random.default_rng(9)
    data = [rng.uniform(-1, 1, size=m) for m in (20, 35, 15, 30)]
    dp = DifferentialPrivacy(noise_multiplier=2.0, clip={"n": 1.0, "s": 1.0}, placement=placement)
    exact = sum(float(x.sum()) for x in data)
    draws = []
    for seed in range(400):
        replies = [
            dp.client_sums({"n": np.ones(len(x)), "s": x}, np.random.default_rng([seed, c]), n_clients=4)
            for c, x in enumerate(data)
        ]
        sums = dp.server_sums({k: sum(r.sums[k] for r in replies) for k in ("n", "s")}, np.random.default_rng(seed))
        draws.append(float(sums["s"]) - exact)
    sd = dp.noise_std(["n", "s"], n_clients=4, n_answered=4)["s"]
    assert sd == pytest.approx(2.0 * math.sqrt(2))
    # 400 draws: the sample sd has relative standard error about 3.5%
    assert np.std(draws) == pytest.approx(sd, rel=0.15)
    assert abs(np.mean(draws)) < 4 * sd / math.sqrt(400)


# ------------------------------------------------------------------------------ the option


def test_the_option_is_checked_and_frozen():
    dp = DifferentialPrivacy(noise_multiplier=1, clip={"n": 1, "s": 2.5})
    assert dp.noise_multiplier == 1.0 and dp.clip == {"n": 1.0, "s": 2.5}
    assert dp.delta == 1e-6 and dp.accountant == "rdp" and dp.placement == "client"
    with pytest.raises(dataclasses.FrozenInstanceError):
        dp.noise_multiplier = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        dp.clip["n"] = 5.0  # type: ignore[index]
    same = DifferentialPrivacy(noise_multiplier=1.0, clip={"s": 2.5, "n": 1.0})
    assert same == dp and hash(same) == hash(dp)
    assert dp.as_dict() == {
        "noise_multiplier": 1.0,
        "clip": {"n": 1.0, "s": 2.5},
        "delta": 1e-6,
        "accountant": "rdp",
        "placement": "client",
        "warn_epsilon": 10.0,
    }


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"noise_multiplier": -0.1}, ValueError, "noise_multiplier must be a finite number >= 0"),
        ({"noise_multiplier": math.nan}, ValueError, "noise_multiplier must be a finite number >= 0"),
        ({"noise_multiplier": math.inf}, ValueError, "noise_multiplier must be a finite number >= 0"),
        ({"noise_multiplier": True}, ValueError, "noise_multiplier must be a finite number >= 0"),
        ({"clip": 0.0}, ValueError, "clip must be a finite number > 0"),
        ({"clip": -1.0}, ValueError, "clip must be a finite number > 0"),
        ({"clip": "1"}, ValueError, "clip must be a finite number > 0"),
        ({"clip": {}}, ValueError, "clip mapping is empty"),
        ({"clip": {"s": 0.0}}, ValueError, "clip bound of key 's' must be a finite number > 0"),
        ({"clip": {"s": math.inf}}, ValueError, "clip bound of key 's' must be a finite number > 0"),
        ({"clip": {1: 1.0}}, TypeError, "clip mapping keys must be key names"),
        ({"delta": 0.0}, ValueError, r"delta must be a number in \(0, 1\)"),
        ({"delta": 1.0}, ValueError, r"delta must be a number in \(0, 1\)"),
        ({"delta": math.nan}, ValueError, r"delta must be a number in \(0, 1\)"),
        ({"accountant": "moments"}, ValueError, "accountant must be 'rdp' or 'pld'"),
        ({"placement": "server"}, ValueError, "placement must be 'client' or 'central'"),
    ],
)
def test_bad_options_raise_clearly(kwargs, error, match):
    args = {"noise_multiplier": 1.0, "clip": 1.0} | kwargs
    with pytest.raises(error, match=match):
        DifferentialPrivacy(**args)


def test_bad_contributions_raise_clearly():
    with pytest.raises(ValueError, match="non-empty mapping"):
        clip_rows({}, 1.0)
    with pytest.raises(ValueError, match="key 'b' has 2 rows, the other keys 3"):
        clip_rows({"a": np.ones(3), "b": np.ones((2, 2))}, 1.0)
    with pytest.raises(ValueError, match="key 'a' are not all finite"):
        clip_rows({"a": [1.0, np.nan]}, 1.0)
    with pytest.raises(ValueError, match="first axis of rows"):
        clip_rows({"a": 1.0}, 1.0)
    with pytest.raises(ValueError, match=r"missing \['b'\], not released \['c'\]"):
        clip_rows({"a": np.ones(2), "b": np.ones(2)}, {"a": 1.0, "c": 1.0})
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        gaussian_noise({"a": (2,)}, 1.0, 1.0, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no noise scale for keys"):
        gaussian_noise({"a": (2,)}, {"b": 1.0}, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_clients must be an integer >= 1"):
        gaussian_noise({"a": (2,)}, 1.0, 1.0, np.random.default_rng(0), placement="client", n_clients=0)


def test_check_delta_warns_when_delta_is_not_below_one_over_n():
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip=1.0, delta=1e-4)
    dp.check_delta(9_999)  # 1e-4 < 1/9999: quiet
    with pytest.warns(UserWarning, match="not below 1/n"):
        dp.check_delta(10_000)
