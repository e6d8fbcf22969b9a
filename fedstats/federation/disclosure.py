"""What the server receives, model by model: the declarations the threat-model page is built from.

Every exchange of every fit is a run of the runtime (:func:`fedstats.federation.run`) with a
label (``communication.by_kind``), an algorithm and the algorithm's declared reply arrays, some
of them declared summed (:attr:`~fedstats.federation.FederatedAlgorithm.summed_keys`: the
server step receives only their sum over the clients that answered). :data:`MODELS` lists, for
each model, every such exchange with what each array is and what one client's copy tells
whoever reads it; :func:`fedstats.federation.threat_page.threat_model_tables` renders them as the tables of the
docs' threat-model page. A test fits every model, records each run the runtime makes (its label,
algorithm, reply keys and summed keys) and checks that this module lists exactly those, so the
page cannot drift from the code.

Example
-------
>>> from fedstats.federation.disclosure import MODELS
>>> [e.kind for e in MODELS["FederatedGLM"].exchanges]
['design check', 'IRLS rounds', 'sandwich round']
>>> MODELS["FederatedGLM"].exchanges[1].summed == MODELS["FederatedGLM"].exchanges[1].keys
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Array", "Exchange", "ModelDisclosure", "MODELS"]


@dataclass(frozen=True)
class Array:
    """One reply array: its key, what it is, and (per client) what one copy of it reveals."""

    key: str
    what: str
    reveals: str = ""


@dataclass(frozen=True)
class Exchange:
    """One run of the runtime within a fit.

    ``kind`` is its label in ``communication.by_kind``, ``algorithm`` the class name of the
    algorithm the runtime runs, ``when`` the condition or schedule (every round, once before
    the rounds, with an option), ``arrays`` the reply arrays and ``summed`` the keys the
    algorithm declares summed (it must declare exactly these: a test checks it)."""

    kind: str
    algorithm: str
    when: str
    arrays: tuple[Array, ...]
    summed: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """The reply keys, in declaration order."""
        return tuple(a.key for a in self.arrays)

    def __post_init__(self) -> None:
        unknown = set(self.summed) - set(self.keys)
        if unknown:
            raise ValueError(f"{self.kind}: summed keys {sorted(unknown)} are not reply arrays")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"{self.kind}: a reply key is listed twice")


@dataclass(frozen=True)
class ModelDisclosure:
    """A model's exchanges, and what a client's final state holds when it goes to the server
    at the end of a run on Flower (``final_state``)."""

    exchanges: tuple[Exchange, ...]
    final_state: str
    note: str = ""
    #: test fixture names of the fits that exercise this entry (see tests/conftest.py)
    fits: tuple[str, ...] = field(default=(), compare=False)


MODELS: dict[str, ModelDisclosure] = {}


def _x(kind: str, algorithm: str, when: str, arrays: tuple[Array, ...], summed: tuple[str, ...] | str = ()) -> Exchange:
    keys = tuple(a.key for a in arrays)
    return Exchange(kind, algorithm, when, arrays, keys if summed == "all" else tuple(summed))


_A = Array
_ROWS = "with the others' values, the client's row count"
_DP_REVEALS = "client placement: its sums plus its 1/n share of the noise (weak alone); central: its exact clipped sums"
_DP_NOTE = "Differentially private (`dp=`): rows clipped on the client, every release noised (cost: `result.privacy`)."


def _dp(kind: str, algorithm: str, when: str, arrays: str) -> Exchange:
    """A differentially private exchange: ``arrays`` is ``"key: terms; ..."``, every array summed."""
    what, pairs = "its rows' clipped {}, summed, with noise", (a.split(": ", 1) for a in arrays.split("; "))
    return _x(kind, algorithm, when, tuple(_A(k, what.format(w), _DP_REVEALS) for k, w in pairs), "all")


_FGPR_CURVATURE = _x(
    "hyperparameter curvature",
    "HessianShare",
    "once after the rounds (unless laplace=False), and once per Newton step (newton_steps)",
    (
        _A(
            "nll", "its negative log marginal likelihood at the broadcast hyperparameters", "how well they fit its rows"
        ),
        _A("gradient", "its gradient in the log hyperparameters", "its own pull on them"),
        _A("hessian", "its Hessian in the log hyperparameters (p x p)", "how precisely its rows determine them"),
    ),
    "all",
)
_GLM_DP = (
    _dp("design check", "DPDesignCheck", "once, before the rounds", "n: frequency weights; sum_y: weighted outcomes"),
    _dp("IRLS rounds", "DPIRLS", "every round (dp_rounds)", "xtwx: information w x x'; score: scores"),
    _dp("dispersion round", "DPDispersion", "once, for gaussian and gamma", "pearson: Pearson terms"),
    _dp("sandwich round", "Sandwich", "once, with cov_type='HC0'", "hessian: Hessian terms; meat: score products"),
)
_MOMENTS_DP = (
    _dp("moments: sums", "_DPMomentSums", "once", "n: counts (1 each); sum_x: values; sum_y: targets (with y)"),
    _dp("moments: squares", "_DPMomentSquares", "once, after the sums", "m2_x: squared deviations; m2_y: the same, y"),
)

# ---------------------------------------------------------------- shared exchanges
SCALING = _x(
    "federated scaling",
    "_Moments",
    "once, before the rounds (standardize=True, the default): two rounds",
    (
        _A("n", "row count (first round)", "the client's row count"),
        _A(
            "sum_x",
            "column sums of the predictors, then squared deviations about the federation's means",
            "the client's column means and sds",
        ),
        _A("sum_y", "the same for the target", "the client's mean and sd of the target"),
        _A("not_binary", "1 per column that is not 0/1 at this client", "which of its columns are not dummies"),
        _A("overflow", "1 per column whose sums overflowed", "that its values are huge"),
    ),
    "all",
)
EP_ROUNDS = _x(
    "EP rounds",
    "LinearEP",
    "every round",
    (
        _A(
            "dr",
            "the change of the client's EP site, natural mean",
            "with `dQ`, the client's site: a Gaussian summary of its likelihood of the global parameters",
        ),
        _A("dQ", "the change of the client's EP site, precision", "see `dr`"),
    ),
    "all",
)
ROWS_EP = EP_ROUNDS.__class__("EP rounds", "RowsEP", EP_ROUNDS.when, EP_ROUNDS.arrays, EP_ROUNDS.summed)
CURVATURE = _x(
    "step-size curvature",
    "_CurvatureShare",
    "once, with lr='auto' (the default)",
    (_A("curvature", "the largest eigenvalue of the client's scaled X'X", "a scale of its predictors"),),
)
DESIGN = _x(
    "design check",
    "OneShotSums",
    "once, before the rounds",
    (
        _A("n", "row count", "its row count"),
        _A("sx", "each predictor's sum", "its predictors' means"),
        _A("xtx", "X'X of its predictors", "its predictors' second moments"),
        _A("within", "its predictors' scatter about its own means", "how its predictors vary together"),
        _A("overflow", "1 per predictor whose sums overflowed", "that a value of that predictor is huge"),
    ),
    "all",
)
LASSO_CHECK = _x(
    "per-client design report",
    "OneShot",
    "once, before the rounds",
    (
        _A("n", "row count", "its row count"),
        _A("const", "1 per constant column", "which columns are constant at the client"),
        _A("rank", "rank of its design", "whether its columns are dependent"),
        _A("varying", "1 per column that varies", "see `const`"),
    ),
)
GLM_CHECK = _x(
    "design check",
    "DesignCheck",
    "once, before the rounds",
    (
        _A("n_rows", "row count", "its row count"),
        _A("sum_y", "sum of the outcome", "its outcome's mean"),
        _A("wnobs", "weighted row count", _ROWS),
        _A("xtx", "X'X of its design", "its design's second moments (with `sum_y`: not its outcome)"),
        _A("non_integer", "how many of its counts are not whole numbers", "whether its outcome has fractions"),
    ),
    ("sum_y", "wnobs", "xtx", "non_integer"),
)
MIX_STATS = (
    _A(
        "N",
        "change of its soft counts since its last reply (first: the counts)",
        "its component weights times its row count",
    ),
    _A("S1", "the same for its first moments about the broadcast means", "its rows' mean within each component"),
    _A("S2", "the same for its second moments", "its rows' covariance within each component"),
)
KMEANS = (
    _x(
        "k-means initialisation",
        "OneShot",
        "once, without means_init (the default)",
        (
            _A(
                "centres",
                "up to M k-means centres of its rows, each the mean of at least d + 1 rows",
                "where its rows cluster; never a single row",
            ),
            _A("sizes", "their cluster sizes", "its row count and cluster sizes"),
        ),
    ),
    _x(
        "k-means initialisation",
        "OneShotSums",
        "once: hard-assignment statistics of every candidate start",
        tuple(
            _A(a.key, f"hard-assignment {a.what.split(' since')[0].replace('change of its ', '')}", a.reveals)
            for a in MIX_STATS
        ),
        "all",
    ),
    _x(
        "k-means initialisation",
        "OneShotSums",
        "once: each candidate's log-likelihood",
        (_A("loglik", "its log-likelihood per candidate", "how well each candidate fits its rows"),),
        "all",
    ),
)
SCORING = _x(
    "scoring round",
    "OneShotSums",
    "once, after the rounds",
    (_A("loglik", "its log-likelihood at the fit", "how well the fit describes its rows"),),
    "all",
)
EM_ARRAYS = MIX_STATS + (
    _A("loglik", "its log-likelihood at the broadcast parameters", "how well they fit its rows"),
    _A("entropy", "change of its responsibilities' entropy", "how mixed its rows are"),
    _A("weight_term", "change of sum_j N_j log pi_j", "with `N`, its weights"),
    _A("n", "its soft-count total", "its row count"),
)

_NODE_POSTERIOR = (
    "nothing of its data: the server sends the final q, the node forms the client's posterior "
    "from its cavity and its X'X, X'y, y'y, writes it to its owner's file and sends the name of "
    'that file, and, where its policy says release = "posterior", the posterior (coefficients, '
    "noise sd, sampler diagnostics)."
)

MODELS.update(
    {
        "HierarchicalLinearModel (HM2)": ModelDisclosure(
            (DESIGN, SCALING, EP_ROUNDS), _NODE_POSTERIOR, fits=("hm2", "hm2-nuts")
        ),
        "BayesianLasso, BayesianRidge": ModelDisclosure(
            (LASSO_CHECK, DESIGN, SCALING, EP_ROUNDS), _NODE_POSTERIOR, fits=("lasso", "ridge", "lasso-centralised")
        ),
        "StructuralCovarianceModel (HM1)": ModelDisclosure(
            (
                DESIGN,
                SCALING,
                CURVATURE,
                _x(
                    "HM1 rounds",
                    "HM1Algorithm",
                    "every round",
                    (
                        _A(
                            "theta",
                            "its updated coefficients",
                            "its regression coefficients: the server learns Omega from all of them",
                        ),
                    ),
                ),
                _x(
                    "information share",
                    "InformationShare",
                    "once, with uncertainty='auto' (the default) or True; on Flower only from nodes whose "
                    "policy says release_statistics = true",
                    (
                        _A("information", "X'X / sigma^2", "its design's second moments"),
                        _A("score", "X'y / sigma^2", "with `information`: its least-squares fit"),
                        _A("noise_var", "its residual variance sigma^2", "its fit's residual variance"),
                    ),
                ),
            ),
            "nothing.",
            fits=("hm1", "hm1-point"),
        ),
        "FederatedGLM": ModelDisclosure(
            (
                GLM_CHECK,
                _x(
                    "IRLS rounds",
                    "IRLS",
                    "every round",
                    (
                        _A("xtwx", "X'WX, its Fisher information", "its design's weighted second moments"),
                        _A("xtwz", "X'Wz, its score's part", "with `xtwx`: its own IRLS step, close to its own fit"),
                        _A("dev", "its deviance", "how well the fit describes its rows"),
                        _A("pearson", "its Pearson statistic", "see `dev`"),
                        _A("ll", "its log-likelihood", "see `dev`"),
                        _A(
                            "edge",
                            "rows at the edge of the outcome's range",
                            "how many of its rows are predicted at a boundary",
                        ),
                    ),
                    "all",
                ),
                _x(
                    "sandwich round",
                    "Sandwich",
                    "once, with cov_type='HC0'",
                    (
                        _A("hessian", "its information at the fit", "as `xtwx`"),
                        _A(
                            "meat",
                            "the sum of its rows' score outer products",
                            "its rows' residual-weighted second moments",
                        ),
                    ),
                    "all",
                ),
            ),
            "nothing.",
            fits=("glm",),
        ),
        "FederatedGLM (dp=)": ModelDisclosure(_GLM_DP, "nothing.", note=_DP_NOTE),
        "BayesianGLM, HierarchicalGLM": ModelDisclosure(
            (
                GLM_CHECK,
                SCALING,
                ROWS_EP,
                _x(
                    "client posteriors",
                    "_ClientPosteriors",
                    "HierarchicalGLM: once, after the rounds",
                    (
                        _A("mean", "its coefficients' posterior mean", "its own coefficients"),
                        _A("cov", "their posterior covariance", "their uncertainty"),
                    ),
                ),
            ),
            "its EP site (its rows are rebuilt from its own data at each step, never kept).",
            fits=("bglm", "hglm"),
        ),
        "FGPR": ModelDisclosure(
            (
                _x(
                    "row counts",
                    "CountShare",
                    "once, before the rounds",
                    (_A("n", "its row count N_k", "its row count"),),
                ),
                _x(
                    "FGPR rounds",
                    "FGPRAlgorithm",
                    "every round",
                    (
                        _A(
                            "lengthscale",
                            "w_k g(lengthscale_k) (its weight times its hyperparameter in the averaging space)",
                            "its locally trained lengthscales",
                        ),
                        _A("outputscale", "the same for its output scale", "its locally trained output scale"),
                        _A("noise", "the same for its noise variance", "its locally trained noise variance"),
                    ),
                    "all",
                ),
                _FGPR_CURVATURE,
            ),
            "sizes, step count, optimiser moments.",
            note="With ARD the lengthscale has `d` entries; a constant mean adds one more array.",
            fits=("fgpr",),
        ),
        "FedAvg, Ditto": ModelDisclosure(
            (
                DESIGN,
                CURVATURE,
                _x(
                    "rounds",
                    "_Averaging",
                    "every round",
                    (_A("theta", "its locally updated coefficients", "its own coefficients after a few local steps"),),
                    "all",
                ),
            ),
            "FedAvg nothing; Ditto its personal coefficients.",
            fits=("fedavg", "ditto"),
        ),
        "Separate": ModelDisclosure(
            (
                DESIGN,
                CURVATURE,
                _x(
                    "local fits",
                    "_SeparateFit",
                    "once",
                    (_A("theta", "its own fitted coefficients (the result)", "its own regression"),),
                ),
            ),
            "nothing.",
            fits=("separate",),
        ),
        "DistributedRidge": ModelDisclosure(
            (
                DESIGN,
                _x(
                    "ridge statistics",
                    "_OneShotRidge",
                    "once",
                    (_A("theta", "its own ridge solution", "its own regression"),),
                    "all",
                ),
            ),
            "nothing.",
            fits=("distributed-ridge",),
        ),
        "FederatedGaussianMixture (FedEM)": ModelDisclosure(
            KMEANS
            + (
                _x("EM rounds", "FedEMAlgorithm", "every round", EM_ARRAYS, "all"),
                SCORING,
                _x(
                    "Wald round",
                    "OneShotSums",
                    "result.wald_intervals(data): once",
                    (
                        _A(
                            "A",
                            "its part of the means' information (an Md x Md Schur complement)",
                            "its rows' second moments within the components",
                        ),
                    ),
                    "all",
                ),
                _x(
                    "Wald round",
                    "OneShot",
                    "result.wald_intervals(data): then the means' covariance goes down; nothing comes back",
                    (),
                ),
            ),
            "its mixture weights and row count (not the statistics it last sent); after the scoring round, its "
            "log-likelihood at the fit (the result's per-client log-likelihood).",
            note="With `shared_weights=True` there is no `weight_term` (the server holds the weights).",
            fits=("fedem",),
        ),
        "FederatedGaussianMixture (FedEM, dp=)": ModelDisclosure(
            (
                _x(
                    "covariance initialisation",
                    "DPFedEMAlgorithm",
                    "once, before the rounds, without covariances_init (means_init is required)",
                    (
                        _A("N", "hard-assignment counts at means_init, with noise", _DP_REVEALS),
                        _A(
                            "S1",
                            "hard-assignment first moments, deviations clipped at the radius, with noise",
                            _DP_REVEALS,
                        ),
                        _A("S2", "hard-assignment second moments, the same, with noise", _DP_REVEALS),
                    ),
                    "all",
                ),
                _x(
                    "EM rounds",
                    "DPFedEMAlgorithm",
                    "every round (dp_rounds of them), every client",
                    (
                        _A("N", "its full soft counts (not a change), with noise", _DP_REVEALS),
                        _A(
                            "S1",
                            "its full first moments about the broadcast means, deviations clipped at the radius, "
                            "with noise",
                            _DP_REVEALS,
                        ),
                        _A("S2", "its full second moments, the same, with noise", _DP_REVEALS),
                    ),
                    "all",
                ),
            ),
            "its mixture weights, drawn from its own noisy counts (part of the same mechanism); no row count.",
            note=_DP_NOTE
            + " No log-likelihood, entropy or row count is released; there is no k-means start, scoring round "
            "or Wald round.",
        ),
        "VariationalGaussianMixture": ModelDisclosure(
            (
                _x(
                    "prior round",
                    "OneShotSums",
                    "once, for scikit-learn's default priors",
                    (
                        _A("n", "row count", "its row count"),
                        _A("s", "its column sums", "its mean"),
                        _A("ss", "its sum of squares about its mean", "its covariance"),
                    ),
                    ("ss",),
                ),
            )
            + KMEANS
            + (
                _x(
                    "variational rounds",
                    "VBFedEMAlgorithm",
                    "every round",
                    EM_ARRAYS[:5]
                    + (
                        _A("weight_term", "change of its Dirichlet term log C(alpha)", "with `N`, its weights"),
                        EM_ARRAYS[6],
                    ),
                    "all",
                ),
            ),
            "its Dirichlet parameters and row count (not the statistics it last sent).",
            fits=("vb-fedem",),
        ),
        "DecentralizedGaussianMixture (D-FedEM)": ModelDisclosure(
            KMEANS
            + (
                _x(
                    "gossip rounds",
                    "DFedEMAlgorithm",
                    "every round (no server: each client gossips with its neighbours)",
                    MIX_STATS[:0]
                    + (
                        _A("N", "its soft counts after gossip", "its neighbourhood's mixed statistics"),
                        _A("S1", "its first moments after gossip", "see `N`"),
                        _A("S2", "its second moments after gossip", "see `N`"),
                        _A("loglik", "its log-likelihood", "how well the fit describes its rows"),
                        _A("entropy", "its responsibilities' entropy", "how mixed its rows are"),
                    ),
                    ("loglik", "entropy"),
                ),
            ),
            "its mixture weights and row count.",
            fits=("d-fedem",),
        ),
        "FEMOMD": ModelDisclosure(
            KMEANS
            + (
                _x(
                    "FEM-OMD step",
                    "FEMOMDStep",
                    "every inner round of every time step",
                    MIX_STATS + (_A("g", "its weights' gradient (n_c g_c, and n_c)", "its weight estimate"),),
                    "all",
                ),
            ),
            "its weights and row count.",
            note="With `pooling='local'` only `g` is summed (each client's statistics are its own model's).",
            fits=("fem-omd-result",),
        ),
        "federated_moments (dp=)": ModelDisclosure(_MOMENTS_DP, "nothing.", note=_DP_NOTE),
        "federated_ep (your own NumPyro model)": ModelDisclosure(
            (
                ROWS_EP,
                _x(
                    "client posteriors",
                    "_LocalPosteriors",
                    "with local latents: once, after the rounds",
                    (
                        _A("mean", "its local latents' posterior mean", "its own latents"),
                        _A("cov", "their posterior covariance", "their uncertainty"),
                    ),
                ),
            ),
            "its EP site (in process only: not on Flower).",
        ),
    }
)
