"""The Gaussian mixtures' declarations: FedEM, variational FedEM, D-FedEM and FEM-OMD."""

from __future__ import annotations

from .common import converged_text, given, rounds, uncertainty
from .exchanges import DP_NOTE, DP_REVEALS, EM_ARRAYS, KMEANS, MIX_STATS, SCORING, exchange
from .spec import Array, CLIError, Command, Declaration, Disclosure, Example, Expect, Option

_FEDEM = Disclosure(
    "FederatedGaussianMixture (FedEM)",
    KMEANS
    + (
        exchange("EM rounds", "FedEMAlgorithm", "every round", EM_ARRAYS, "all"),
        SCORING,
        exchange(
            "Wald round",
            "OneShotSums",
            "result.wald_intervals(data): once",
            (
                Array(
                    "A",
                    "its part of the means' information (an Md x Md Schur complement)",
                    "its rows' second moments within the components",
                ),
            ),
            "all",
        ),
        exchange(
            "Wald round",
            "OneShot",
            "result.wald_intervals(data): then the means' covariance goes down; nothing comes back",
            (),
        ),
    ),
    "its mixture weights and row count (not the statistics it last sent); after the scoring round, its "
    "log-likelihood at the fit (the result's per-client log-likelihood).",
    note="With `shared_weights=True` there is no `weight_term` (the server holds the weights).",
)
_FEDEM_DP = Disclosure(
    "FederatedGaussianMixture (FedEM, dp=)",
    (
        exchange(
            "covariance initialisation",
            "DPFedEMAlgorithm",
            "once, before the rounds, without covariances_init (means_init is required)",
            (
                Array("N", "hard-assignment counts at means_init, with noise", DP_REVEALS),
                Array("S1", "hard-assignment first moments, deviations clipped at the radius, with noise", DP_REVEALS),
                Array("S2", "hard-assignment second moments, the same, with noise", DP_REVEALS),
            ),
            "all",
        ),
        exchange(
            "EM rounds",
            "DPFedEMAlgorithm",
            "every round (dp_rounds of them), every client",
            (
                Array("N", "its full soft counts (not a change), with noise", DP_REVEALS),
                Array(
                    "S1",
                    "its full first moments about the broadcast means, deviations clipped at the radius, with noise",
                    DP_REVEALS,
                ),
                Array("S2", "its full second moments, the same, with noise", DP_REVEALS),
            ),
            "all",
        ),
    ),
    "its mixture weights, drawn from its own noisy counts (part of the same mechanism); no row count.",
    note=DP_NOTE + " No log-likelihood, entropy or row count is released; there is no k-means start, scoring round "
    "or Wald round.",
)
_VB = Disclosure(
    "VariationalGaussianMixture",
    (
        exchange(
            "prior round",
            "OneShotSums",
            "once, for scikit-learn's default priors",
            (
                Array("n", "row count", "its row count"),
                Array("s", "its column sums", "its mean"),
                Array("ss", "its sum of squares about its mean", "its covariance"),
            ),
            ("ss",),
        ),
    )
    + KMEANS
    + (
        exchange(
            "variational rounds",
            "VBFedEMAlgorithm",
            "every round",
            EM_ARRAYS[:5]
            + (
                Array("weight_term", "change of its Dirichlet term log C(alpha)", "with `N`, its weights"),
                EM_ARRAYS[6],
            ),
            "all",
        ),
    ),
    "its Dirichlet parameters and row count (not the statistics it last sent).",
)
_DFEDEM = Disclosure(
    "DecentralizedGaussianMixture (D-FedEM)",
    KMEANS
    + (
        exchange(
            "gossip rounds",
            "DFedEMAlgorithm",
            "every round (no server: each client gossips with its neighbours)",
            MIX_STATS[:0]
            + (
                Array("N", "its soft counts after gossip", "its neighbourhood's mixed statistics"),
                Array("S1", "its first moments after gossip", "see `N`"),
                Array("S2", "its second moments after gossip", "see `N`"),
                Array("loglik", "its log-likelihood", "how well the fit describes its rows"),
                Array("entropy", "its responsibilities' entropy", "how mixed its rows are"),
            ),
            ("loglik", "entropy"),
        ),
    ),
    "its mixture weights and row count.",
)
_FEMOMD = Disclosure(
    "FEMOMD",
    KMEANS
    + (
        exchange(
            "FEM-OMD step",
            "FEMOMDStep",
            "every inner round of every time step",
            MIX_STATS + (Array("g", "its weights' gradient (n_c g_c, and n_c)", "its weight estimate"),),
            "all",
        ),
    ),
    "its weights and row count.",
    note="With `pooling='local'` only `g` is summed (each client's statistics are its own model's).",
)


# --------------------------------------------------------------------------- the command's gmm
_OPTIONS = (
    rounds("EM rounds, at most"),
    Option("--components", "number of mixture components (required)", {"type": int}, param="n_components"),
    Option(
        "--covariance-type",
        "covariance structure",
        {"choices": ("full", "tied", "diag", "spherical")},
        param="covariance_type",
    ),
    Option(
        "--bayesian", "variational FedEM with credible intervals for components and weights", {"action": "store_true"}
    ),
    uncertainty("Wald intervals from the observed information (each client shares a Schur complement once)"),
)


def _check(args) -> None:
    if args.components is None or args.components < 1:
        raise CLIError("--model gmm needs --components M (M >= 1)")
    if args.uncertainty and args.bayesian:
        raise CLIError("--uncertainty (Wald intervals) and --bayesian (credible intervals) exclude each other")


def _build(args):
    from ..mixture import FederatedGaussianMixture, VariationalGaussianMixture

    if args.bayesian:
        return VariationalGaussianMixture(**given(args, _OPTIONS)), {}
    return FederatedGaussianMixture(**given(args, _OPTIONS)), {"uncertainty": args.uncertainty}


def _header(args, res, runtime: float) -> str:
    kind = "variational FedEM" if args.bayesian else "FedEM"
    what = "credible intervals" if args.bayesian else "Wald intervals" if args.uncertainty else "point estimates"
    return (
        f"Gaussian mixture, {res.n_components} components ({res.covariance_type}), {kind}: {res.rounds} rounds "
        f"({converged_text(res)}), {len(res.clients)} clients, {runtime:.1f} s; {what}"
    )


def _extras(args, res, data, scaler) -> dict:
    return {
        "components": res.n_components,
        "covariance_type": res.covariance_type,
        "bayesian": bool(args.bayesian),
        "intervals": "credible" if args.bayesian else ("wald" if args.uncertainty else None),
        "loglik": None if args.bayesian else res.loglik,
        "elbo": float(res.elbo_trace()[-1]) if args.bayesian else None,
    }


def _explain(exc: BaseException) -> str | None:
    import numpy as np

    if isinstance(exc, np.linalg.LinAlgError):
        return (
            "the information matrix is singular (a weight at 0 or components that cannot be told apart): no Wald "
            "intervals; try fewer --components or --bayesian"
        )
    return None


_SEED = {"seed": 0}
#: the maximum-likelihood mixtures: no posteriors (the variational one has them)
_POINT_MIXTURE = Expect(remedy="VariationalGaussianMixture", mixture=True)
FEDEM = Declaration(
    "fedem",
    "fedstats.mixture:FederatedGaussianMixture",
    "fedstats.mixture:GaussianMixtureResult",
    "Gaussian mixture with shared components and per-client weights, by federated EM (FedEM)",
    (_FEDEM, _FEDEM_DP),
    Command(
        "gmm",
        "Gaussian mixture with per-client weights, by FedEM (--bayesian: variational FedEM)",
        _OPTIONS,
        _build,
        _header,
        extras=_extras,
        check=_check,
        explain=_explain,
        target=False,
    ),
    reference="sklearn.mixture:GaussianMixture",
    examples=(
        Example(
            "fedem",
            {"n_components": 3},
            _SEED,
            data="features",
            expect=_POINT_MIXTURE,
            long={"n_components": 2, "rounds": 12, "tol": None, "participation": 0.5},
        ),
    ),
    bad_parameter=("n_components", 0),
)
VB_FEDEM = Declaration(
    "vb-fedem",
    "fedstats.mixture:VariationalGaussianMixture",
    "fedstats.mixture:BayesianMixtureResult",
    "variational Bayesian Gaussian mixture, by federated variational EM (on the command line: gmm --bayesian)",
    (_VB,),
    reference="sklearn.mixture:BayesianGaussianMixture",
    examples=(
        Example(
            "vb-fedem",
            {"n_components": 3},
            _SEED,
            data="features",
            expect=Expect((True, True), mixture=True),
            long={"n_components": 2, "rounds": 12, "tol": None},
        ),
    ),
    bad_parameter=("mean_precision_prior", -1.0),
)
D_FEDEM = Declaration(
    "d-fedem",
    "fedstats.mixture:DecentralizedGaussianMixture",
    "fedstats.mixture:DecentralizedMixtureResult",
    "Gaussian mixture without a server: clients gossip with their neighbours (D-FedEM)",
    (_DFEDEM,),
    reference="sklearn.mixture:GaussianMixture",
    examples=(
        Example(
            "d-fedem",
            {"n_components": 3, "graph": "ring"},
            _SEED,
            data="features",
            expect=_POINT_MIXTURE,
            long={"n_components": 2, "rounds": 12},
        ),
    ),
    bad_parameter=("mixing", "slow"),
)
FEM_OMD = Declaration(
    "fem-omd",
    "fedstats.mixture:FEMOMD",
    "fedstats.mixture:GaussianMixtureResult",
    "online federated Gaussian mixture: one step per batch of a stream, weights by mirror descent (FEM-OMD)",
    (_FEMOMD,),
    reference="sklearn.mixture:GaussianMixture",
    examples=(
        Example(
            "fem-omd",
            {"n_components": 2, "horizon": 3},
            _SEED,
            data="stream",
            method="partial_fit",
            expect=_POINT_MIXTURE,
            long={"horizon": 12},
        ),
    ),
)

DECLARATIONS = (FEDEM, VB_FEDEM, D_FEDEM, FEM_OMD)
