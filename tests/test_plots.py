"""fedstats.plots: what each figure draws is the result's numbers (intervals, bands, densities,
components, regret), checked on the artists themselves; ``fedstats fit --plot`` writes a PNG."""

import warnings

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from fedstats import FederatedData, HierarchicalLinearModel, plots
from fedstats.cli import main
from fedstats.glm import FederatedGLM

from .conftest import SITES


@pytest.fixture(scope="module")
def sites():
    return FederatedData.from_dataframe(pd.read_csv(SITES), by="site", target="y")


@pytest.fixture(scope="module")
def hm2(sites):
    return HierarchicalLinearModel().fit(sites, seed=0)


def test_forest_draws_every_clients_interval_and_the_population(hm2, sites):
    fig = plots.forest(hm2, ["x1", "x3"], level=0.9)
    assert [ax.get_title() for ax in fig.axes] == ["x1", "x3"]
    ax = fig.axes[0]
    rows = hm2.client_summary(0.9).query("parameter == 'x1'")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [str(c) for c in rows["client"]] + ["mu[x1]"]
    segments = ax.collections[0].get_segments()  # the clients' intervals, top to bottom
    np.testing.assert_allclose([s[0][0] for s in segments], rows["lower"])
    np.testing.assert_allclose([s[1][0] for s in segments], rows["upper"])
    pop = ax.collections[1].get_segments()[0]
    mu = hm2.summary(0.9).loc["mu[x1]"]
    np.testing.assert_allclose([pop[0][0], pop[1][0]], [mu["lower"], mu["upper"]])
    with pytest.raises(ValueError, match="no parameter"):
        plots.forest(hm2, "x9")


def test_forest_of_a_model_without_client_parameters_shows_the_shared_ones(sites):
    res = FederatedGLM("gaussian").fit(sites)
    fig = plots.forest(res)
    assert [ax.get_title() for ax in fig.axes] == list(res.names)
    seg = fig.axes[1].collections[0].get_segments()[0]
    ci = res.conf_int(0.95).loc[res.names[1]]
    np.testing.assert_allclose([seg[0][0], seg[1][0]], [ci["lower"], ci["upper"]])


def test_densities_are_the_posterior(hm2, sites):
    from fedstats.glm import BayesianGLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bglm = BayesianGLM("gaussian").fit(sites, seed=0)
    post = bglm.global_posterior()  # Gaussian: the exact curve
    fig = plots.densities(bglm, ["x1"])
    x, y = fig.axes[0].lines[0].get_xdata(), fig.axes[0].lines[0].get_ydata()
    assert np.trapezoid(y, x) == pytest.approx(1.0, abs=1e-3)
    assert x[np.argmax(y)] == pytest.approx(post.mean[post.names.index("x1")], abs=x[1] - x[0])
    fig = plots.densities(hm2, ["mu[x1]"])  # HM2's population: draws, a histogram
    bars = list(fig.axes[0].containers[0])  # the histogram (the shaded interval is a patch too)
    assert sum(b.get_height() * b.get_width() for b in bars) == pytest.approx(1.0, rel=1e-6)
    top = max(bars, key=lambda b: b.get_height())
    mean = hm2.summary().loc["mu[x1]", "mean"]
    assert abs(top.get_x() + top.get_width() / 2 - mean) < 3 * hm2.summary().loc["mu[x1]", "sd"] / 4


def test_predictive_band_is_the_prediction(sites):
    from fedstats.gp import FGPR

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = FGPR(rounds=5).fit(sites, seed=0)
    grid = np.column_stack([np.linspace(-2, 2, 30), np.zeros(30), np.zeros(30)])
    fig = plots.predictive_band(res, grid, client="north", level=0.9, names=["x1", "x2", "x3"])
    pred = res.predict(grid, client="north", level=0.9)
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), pred["mean"])
    assert ax.get_xlabel() == "x1"
    band = ax.collections[1].get_paths()[0].vertices  # the band of the mean
    assert band[:, 1].min() == pytest.approx(pred["lower"].min()) and band[:, 1].max() == pytest.approx(
        pred["upper"].max()
    )


def test_mixture_and_regret_curves():
    from fedstats.experiments.regret import MixtureStream, simulate
    from fedstats.mixture import FEMOMD, FederatedGaussianMixture

    rng = np.random.default_rng(0)
    Xs = [np.vstack([rng.normal(size=(40, 2)), rng.normal(size=(40, 2)) + 6]) for _ in range(3)]
    res = FederatedGaussianMixture(2).fit(FederatedData.from_arrays(Xs), seed=0)
    fig = plots.mixture(res, Xs[0], client=0)
    assert len(fig.axes[0].patches) == 2
    assert {round(float(p.center[0])) for p in fig.axes[0].patches} == {0, 6}
    stream = MixtureStream(n_clients=4, n=10, d=2, n_components=2, process="fixed", seed=0)
    learners = {
        "FEM-OMD": FEMOMD(2, means_init=stream.means, horizon=8),
        "local": FEMOMD(2, means_init=stream.means, horizon=8, pooling="local"),
    }
    curves, _ = simulate(stream, learners, T=8)
    fig = plots.regret(curves)
    assert [line.get_label() for line in fig.axes[0].lines] == ["FEM-OMD", "local", "linear growth"]
    with pytest.raises(ValueError, match="learner, t, regret"):
        plots.regret(curves.drop(columns="regret"))


def test_convergence_traces_the_models_own_quantities(hm2):
    fig = plots.convergence(hm2)
    titles = [ax.get_title() for ax in fig.axes]
    assert "max_mean_change_sd" in titles and "bytes_up" not in titles
    h = hm2.history.to_dataframe()
    ax = fig.axes[titles.index("max_mean_change_sd")]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), h["max_mean_change_sd"])


def test_cli_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "fit.png"
    assert (
        main(
            [
                "fit",
                str(SITES),
                "--by",
                "site",
                "--target",
                "y",
                "--model",
                "glm",
                "--family",
                "gaussian",
                "--plot",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote plot" in capsys.readouterr().out
    assert main(["fit", str(SITES), "--by", "site", "--target", "y", "--plot", str(tmp_path / "x.txt"), "-q"]) == 2
    assert "--plot writes .png, .svg or .pdf" in capsys.readouterr().err
    assert isinstance(
        plots.plot(
            FederatedGLM("gaussian").fit(FederatedData.from_dataframe(pd.read_csv(SITES), by="site", target="y"))
        ),
        Figure,
    )
