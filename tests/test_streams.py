"""Random streams by construction (issue 42, item 5): every stream a fit draws is
``[seed, purpose tag, *indices]`` with a fixed number of indices per purpose, each run of the
runtime under its own seed; a fit of every model with 20 clients and at least 12 rounds draws
no stream twice."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedstats import FederatedData, streams
from fedstats.datasets.synthetic import gmm_federation, hierarchical_logistic, hm2_federation
from fedstats.survival.simulate import proportional_hazards


def test_purposes_have_distinct_tags_and_fixed_indices():
    tags = [tag for tag, _ in streams.PURPOSES.values()]
    assert len(set(tags)) == len(tags) and 0 not in tags
    assert streams.key(5, "client step", 3, 2) == (5, streams.PURPOSES["client step"][0], 3, 2)
    with pytest.raises(ValueError, match="takes 2 indices"):
        streams.stream(5, "client step", 3)
    with pytest.raises(ValueError, match="unknown random stream purpose"):
        streams.stream(5, "no such purpose")
    # why a purpose has a fixed number of indices: numpy pads a short seed list with zeros,
    # so [s, 7] and [s, 7, 0] are one stream (the old scheme's round 7 participants and
    # client 0's final tilted draw)
    same = [np.random.default_rng(k).integers(2**62) for k in ([3, 7], [3, 7, 0])]
    assert same[0] == same[1]


def test_runs_of_different_kinds_draw_different_streams():
    assert streams.run_seed(0, "EP rounds") != streams.run_seed(0, "federated scaling")
    assert streams.run_seed(0, "EP rounds") == streams.run_seed(0, "EP rounds")


def _fits():
    """``(name, thunk)``: a fit of every model of the registry (its first example, with the
    parameters that make it run at least 12 rounds) with 20 clients."""
    from fedstats.registry import declarations

    sources = {
        "regression": lambda: hm2_federation(n_clients=20, n_obs=30, mu=[0.5, -0.3], tau=[0.1, 0.1], sigma=0.5, seed=1)[
            0
        ],
        "binary": lambda: hierarchical_logistic(20, seed=1),
        "features": lambda: gmm_federation(n_clients=20, n_components=2, d=2, n_obs=40, seed=1)[0],
        "survival": lambda: proportional_hazards(20, seed=1, rows=30, resolution=0.1),
    }

    def fit(d, ex):
        model = d.estimator_class(**{**ex.params, **ex.long})
        if ex.data == "stream":  # twelve time steps of 20 clients
            rng = np.random.default_rng(0)
            for _ in range(12):
                batch = FederatedData.from_arrays([rng.normal(size=(12, 2)) for _ in range(20)], min_rows=1)
                getattr(model, ex.method)(batch, **ex.fit)
            return model
        return getattr(model, ex.method)(ex.data_for(sources, n_clients=20, seed=1), **ex.fit)

    return [(n, lambda d=d: fit(d, d.examples[0])) for n, d in declarations().items() if d.examples]


NAMES = [name for name, _ in _fits()]


@pytest.mark.parametrize("name", NAMES)
def test_a_fit_draws_no_stream_twice(name):
    thunk = dict(_fits())[name]
    with streams.recording() as drawn, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        thunk()
    assert drawn, f"{name}: the fit drew no stream through fedstats.streams"
    repeated = {k: n for k in set(drawn) if (n := drawn.count(k)) > 1}
    assert not repeated, f"{name}: streams drawn more than once (seed, tag, indices): {sorted(repeated)[:5]}"
