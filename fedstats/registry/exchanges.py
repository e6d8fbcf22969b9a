"""The exchanges several models share (the design checks, federated scaling, EP rounds, the
mixtures' k-means start), and the helpers the declaration modules write exchanges with.

Every exchange of every fit is a run of the runtime (:func:`fedstats.federation.run`) with a
label (``communication.by_kind``), an algorithm and the algorithm's declared reply arrays, some
of them declared summed (:attr:`~fedstats.federation.FederatedAlgorithm.summed_keys`: the
server step receives only their sum over the clients that answered). Each model's declaration
lists every such exchange of its fits (:class:`~fedstats.registry.spec.Disclosure`), with what
each array is and what one client's copy tells whoever reads it; the threat-model page shows
them (:mod:`fedstats.registry.threat_page`). A test fits every model, records each run the
runtime makes and checks that its declaration lists exactly those, so the page cannot drift
from the code.

Example
-------
>>> from fedstats.registry.exchanges import EP_ROUNDS
>>> EP_ROUNDS.kind, EP_ROUNDS.keys == EP_ROUNDS.summed
('EP rounds', True)
"""

from __future__ import annotations

from .spec import Array, Exchange


def exchange(
    kind: str, algorithm: str, when: str, arrays: tuple[Array, ...], summed: tuple[str, ...] | str = ()
) -> Exchange:
    """An exchange; ``summed="all"``: every reply array is summed."""
    keys = tuple(a.key for a in arrays)
    return Exchange(kind, algorithm, when, arrays, keys if summed == "all" else tuple(summed))


_ROWS = "with the others' values, the client's row count"
DP_REVEALS = "client placement: its sums plus its 1/n share of the noise (weak alone); central: its exact clipped sums"
DP_NOTE = "Differentially private (`dp=`): rows clipped on the client, every release noised (cost: `result.privacy`)."


def dp_exchange(kind: str, algorithm: str, when: str, arrays: str) -> Exchange:
    """A differentially private exchange: ``arrays`` is ``"key: terms; ..."``, every array summed."""
    what, pairs = "its rows' clipped {}, summed, with noise", (a.split(": ", 1) for a in arrays.split("; "))
    return exchange(kind, algorithm, when, tuple(Array(k, what.format(w), DP_REVEALS) for k, w in pairs), "all")


# ---------------------------------------------------------------- shared exchanges
SCALING = exchange(
    "federated scaling",
    "_Moments",
    "once, before the rounds (standardize=True, the default): two rounds",
    (
        Array("n", "row count (first round)", "the client's row count"),
        Array(
            "sum_x",
            "column sums of the predictors, then squared deviations about the federation's means",
            "the client's column means and sds",
        ),
        Array("sum_y", "the same for the target", "the client's mean and sd of the target"),
        Array("not_binary", "1 per column that is not 0/1 at this client", "which of its columns are not dummies"),
        Array("overflow", "1 per column whose sums overflowed", "that its values are huge"),
    ),
    "all",
)
EP_ROUNDS = exchange(
    "EP rounds",
    "LinearEP",
    "every round",
    (
        Array(
            "dr",
            "the change of the client's EP site, natural mean",
            "with `dQ`, the client's site: a Gaussian summary of its likelihood of the global parameters",
        ),
        Array("dQ", "the change of the client's EP site, precision", "see `dr`"),
    ),
    "all",
)
ROWS_EP = EP_ROUNDS.__class__("EP rounds", "RowsEP", EP_ROUNDS.when, EP_ROUNDS.arrays, EP_ROUNDS.summed)
#: PSIS-LOO and WAIC from sums over the clients (fedstats.inference.elpd), on request
ELPD = exchange(
    "LOO and WAIC sums",
    "_ELPDRound",
    "on request, after the fit: result.loo(data) or result.waic(data)",
    (
        Array("n", "row count", "its row count"),
        Array(
            "loo", "the sum of its rows' leave-one-out log predictive densities", "how well the fit predicts its rows"
        ),
        Array("loo_sq", "their sum of squares", "their spread"),
        Array("lppd", "the sum of its rows' log predictive densities", "see `loo`"),
        Array("bad_k", "its rows with a Pareto shape past ArviZ's threshold", "how many of its rows are influential"),
        Array("waic", "the sum of its rows' WAIC terms", "see `loo`"),
        Array("waic_sq", "their sum of squares", "their spread"),
        Array("p_waic", "the sum of its rows' log-likelihood variances", "see `loo`"),
        Array("high_var", "its rows whose variance ArviZ would warn about", "see `bad_k`"),
    ),
    "all",
)
CURVATURE = exchange(
    "step-size curvature",
    "_CurvatureShare",
    "once, with lr='auto' (the default)",
    (Array("curvature", "the largest eigenvalue of the client's scaled X'X", "a scale of its predictors"),),
)
DESIGN = exchange(
    "design check",
    "OneShotSums",
    "once, before the rounds",
    (
        Array("n", "row count", "its row count"),
        Array("sx", "each predictor's sum", "its predictors' means"),
        Array("xtx", "X'X of its predictors", "its predictors' second moments"),
        Array("within", "its predictors' scatter about its own means", "how its predictors vary together"),
        Array("overflow", "1 per predictor whose sums overflowed", "that a value of that predictor is huge"),
    ),
    "all",
)
LASSO_CHECK = exchange(
    "per-client design report",
    "OneShot",
    "once, before the rounds",
    (
        Array("n", "row count", "its row count"),
        Array("const", "1 per constant column", "which columns are constant at the client"),
        Array("rank", "rank of its design", "whether its columns are dependent"),
        Array("varying", "1 per column that varies", "see `const`"),
    ),
)
GLM_CHECK = exchange(
    "design check",
    "DesignCheck",
    "once, before the rounds",
    (
        Array("n_rows", "row count", "its row count"),
        Array("sum_y", "sum of the outcome", "its outcome's mean"),
        Array("wnobs", "weighted row count", _ROWS),
        Array("xtx", "X'X of its design", "its design's second moments (with `sum_y`: not its outcome)"),
        Array("non_integer", "how many of its counts are not whole numbers", "whether its outcome has fractions"),
    ),
    ("sum_y", "wnobs", "xtx", "non_integer"),
)
MIX_STATS = (
    Array(
        "N",
        "change of its soft counts since its last reply (first: the counts)",
        "its component weights times its row count",
    ),
    Array("S1", "the same for its first moments about the broadcast means", "its rows' mean within each component"),
    Array("S2", "the same for its second moments", "its rows' covariance within each component"),
)
KMEANS = (
    exchange(
        "k-means initialisation",
        "OneShot",
        "once, without means_init (the default)",
        (
            Array(
                "centres",
                "up to M k-means centres of its rows, each the mean of at least d + 1 rows",
                "where its rows cluster; never a single row",
            ),
            Array("sizes", "their cluster sizes", "its row count and cluster sizes"),
        ),
    ),
    exchange(
        "k-means initialisation",
        "OneShotSums",
        "once: hard-assignment statistics of every candidate start",
        tuple(
            Array(a.key, f"hard-assignment {a.what.split(' since')[0].replace('change of its ', '')}", a.reveals)
            for a in MIX_STATS
        ),
        "all",
    ),
    exchange(
        "k-means initialisation",
        "OneShotSums",
        "once: each candidate's log-likelihood",
        (Array("loglik", "its log-likelihood per candidate", "how well each candidate fits its rows"),),
        "all",
    ),
)
SCORING = exchange(
    "scoring round",
    "OneShotSums",
    "once, after the rounds",
    (Array("loglik", "its log-likelihood at the fit", "how well the fit describes its rows"),),
    "all",
)
EM_ARRAYS = MIX_STATS + (
    Array("loglik", "its log-likelihood at the broadcast parameters", "how well they fit its rows"),
    Array("entropy", "change of its responsibilities' entropy", "how mixed its rows are"),
    Array("weight_term", "change of sum_j N_j log pi_j", "with `N`, its weights"),
    Array("n", "its soft-count total", "its row count"),
)
