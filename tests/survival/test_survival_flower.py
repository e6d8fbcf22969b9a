"""fedstats.survival on Flower's simulation engine: the same answers as in process (1e-10), and
under secure aggregation (1e-6), where the server receives no client's count or sum at an event
time (record check)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedstats.federation.flower import FlowerSession  # noqa: E402
from fedstats.federation.flower.secure import SecureAggregation  # noqa: E402
from fedstats.survival import CoxPH, KaplanMeier, logrank_test  # noqa: E402
from fedstats.survival.simulate import proportional_hazards  # noqa: E402

from ..federation.test_flower import Recorder  # noqa: E402


@pytest.fixture(scope="module")
def data():
    # times on a coarse grid: every count the deployment's default rules check is at least 5
    fd = proportional_hazards(4, seed=4, rows=(60, 80, 100, 120), beta=(0.6, -0.4), resolution=1.0)
    X = {c: np.asarray(fd[c].X) for c in fd.clients}
    y = {c: np.minimum(np.asarray(fd[c].y), 3.0) for c in fd.clients}
    X = {c: np.column_stack([x[:, :2], (np.arange(len(x)) % 2).astype(float), x[:, 2]]) for c, x in X.items()}
    from fedstats import FederatedData

    return FederatedData(X, y, feature_names=["x0", "x1", "arm", "event"], target_name="time")


@pytest.fixture(scope="module")
def session():
    with FlowerSession(
        num_supernodes=4, timeout=300, backend_config={"client_resources": {"num_cpus": 0.5, "num_gpus": 0.0}}
    ) as s:
        s.assign(list(range(4)))
        yield s


def numbers(data, every=True, **kw):
    """The fits' numbers; ``every=False``: the exchanges with arrays at the event times only
    (the unstratified Cox fit and the curves)."""
    out = []
    models = [CoxPH(event="event")]
    if every:
        models.append(CoxPH(event="event", ties="breslow", stratify=True, robust=True))
    for model in models:
        res = model.fit(data, **kw)
        out += [res.coef, res.bse.to_numpy(), [res.llf]]
        if every:  # within clients (a stratified fit), and over all pairs at the event times (small cells allowed)
            c = res.concordance(data.with_rules(min_cell_count=1), risk_bins=3, **kw)
            out.append([c.estimate, c.lower, c.upper])
    km = KaplanMeier(event="event", group="arm").fit(data, **kw)
    out += [km.survival.ravel(), km.greenwood.ravel()]
    for stratify in (False, True) if every else ():
        out.append([logrank_test(data, "event", "arm", stratify=stratify, **kw).statistic])
    return np.concatenate([np.ravel(v) for v in out])


def test_flower_equals_in_process_and_secure_aggregation_hides_every_client(data, session, monkeypatch):
    np.testing.assert_allclose(numbers(data, backend=session), numbers(data), rtol=1e-10, atol=1e-10)
    rec = Recorder(session, monkeypatch)
    local = numbers(data, every=False)  # in process: the recorder keeps every client's declared-sum arrays
    monkeypatch.setattr(session, "secure_aggregation", SecureAggregation())
    np.testing.assert_allclose(numbers(data, every=False, backend=session), local, rtol=1e-6, atol=1e-6)
    rec.check_no_client_value(SecureAggregation())


def test_hierarchical_cox_on_flower_equals_in_process(data, session, monkeypatch):
    """EP sampled per client: the node steps its client alone, as in process with batched=False;
    each client expands its rows into pieces on its node. Under secure aggregation only the
    summed rounds before EP (checks, time sum, the cut search) change, to within 1e-6."""
    from fedstats.survival import HierarchicalCox

    model = HierarchicalCox(event="event", intervals=2, rounds=2, num_draws=200)

    def fit(**kw):
        with pytest.warns(RuntimeWarning, match="EP did not converge"):
            res = model.fit(data, seed=2, progress=False, **kw)
        g = res.global_posterior()
        return np.concatenate([g.mean, g.sd, res.client_posterior("site0").mean, res.edges])

    local = fit(batched=False)
    np.testing.assert_allclose(fit(backend=session), local, rtol=1e-10, atol=1e-10)
    monkeypatch.setattr(session, "secure_aggregation", SecureAggregation())
    np.testing.assert_allclose(fit(backend=session), local, rtol=1e-6, atol=1e-6)
