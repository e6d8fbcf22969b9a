"""The linear models' declarations: HM2, the Bayesian lasso and ridge, HM1, and the baselines
(Separate, FedAvg, Ditto, DistributedRidge)."""

from __future__ import annotations

from .common import STANDARDIZE, converged_text, given, no_intercept, rounds, uncertainty
from .exchanges import CURVATURE, DESIGN, ELPD, EP_ROUNDS, LASSO_CHECK, SCALING, exchange
from .spec import Array, CLIError, Command, Declaration, Disclosure, Example, Expect, Option

_NODE_POSTERIOR = (
    "nothing of its data: the server sends the final q, the node forms the client's posterior "
    "from its cavity and its X'X, X'y, y'y, writes it to its owner's file and sends the name of "
    'that file, and, where its policy says release = "posterior", the posterior (coefficients, '
    "noise sd, sampler diagnostics)."
)
_EP_FIT = {"seed": 0, "progress": False}
_TWELVE = {"rounds": 12, "tol": 0.0}  # twelve rounds, whatever has converged
#: the EP models' examples: both posteriors, a new client from the population, stopped unconverged
_EP_EXPECT = Expect(posteriors=(True, True), new_client="population", unconverged=True)
_UNCERTAINTY, _HM2 = "uncertainty=True", "HierarchicalLinearModel"  # what a missing posterior's error names
_EP_ROUNDS = rounds("EP rounds, stopping when converged")
_INTERCEPT = no_intercept("one per client")


def _scaled_note(args, res, penalised: bool = False) -> list[str]:
    """The line under the header of a fit on the standardised scale (``penalised``: the
    shrinkage models, whose lambda acts on that scale)."""
    if getattr(res, "scaling", None) is None:
        return []
    penalty = "; lambda penalises the standardised coefficients" if penalised else ""
    return [
        "(fitted on predictors and target standardised with federated moments, reported on the data's scale"
        f"{penalty}; --no-standardize fits the data as given)"
    ]


# --------------------------------------------------------------------------- HM2, lasso, ridge
def _ep_header(args, res, runtime: float) -> str:
    return (
        f"Global posterior ({100 * args.level:g}% credible intervals), {res.rounds} EP rounds "
        f"({converged_text(res)}), {runtime:.1f} s"
    )


def _ep_command(name: str, cls: str, help: str, penalised: bool = False) -> Command:
    options = (_EP_ROUNDS, STANDARDIZE, _INTERCEPT)

    def build(args):
        from .spec import load

        return load(cls)(**given(args, options)), {}

    def notes(args, res) -> list[str]:
        return _scaled_note(args, res, penalised)

    return Command(name, help, options, build, _ep_header, notes=notes)


HM2 = Declaration(
    "hm2",
    "fedstats.linear:HierarchicalLinearModel",
    "fedstats.linear:HierarchicalResult",
    "hierarchical linear regression: each client's coefficients around a population, by federated EP",
    (Disclosure("HierarchicalLinearModel (HM2)", (DESIGN, SCALING, EP_ROUNDS, ELPD), _NODE_POSTERIOR),),
    _ep_command("hm2", "fedstats.linear:HierarchicalLinearModel", "hierarchical regression"),
    reference="fedstats.reference.hierarchical:pooled_nuts",
    examples=(
        Example("hm2", {"rounds": 3}, _EP_FIT, expect=_EP_EXPECT, long=_TWELVE),
        Example(
            "hm2-nuts",
            {
                "rounds": 1,
                "estimator": "nuts",
                "estimator_options": {"num_warmup": 50, "num_samples": 50, "num_chains": 1},
            },
            _EP_FIT,
            expect=_EP_EXPECT,
        ),
    ),
    bad_parameter=("rounds", 0),
)
_SHRINKAGE = Disclosure(
    "BayesianLasso, BayesianRidge", (LASSO_CHECK, DESIGN, SCALING, EP_ROUNDS, ELPD), _NODE_POSTERIOR
)
_SELECTION = "with per-client variable selection"
LASSO = Declaration(
    "lasso",
    "fedstats.linear:BayesianLasso",
    "fedstats.linear:ShrinkageResult",
    "Bayesian lasso: per-client coefficients shrunk towards 0, with variable selection, by federated EP",
    (_SHRINKAGE,),
    _ep_command("lasso", "fedstats.linear:BayesianLasso", f"Bayesian lasso {_SELECTION}", penalised=True),
    reference="fedstats.linear.shrinkage_pooled:pooled_nuts",
    examples=(
        Example("lasso", {"rounds": 2}, _EP_FIT, expect=_EP_EXPECT, long=_TWELVE),
        Example(
            "lasso-centralised",
            {},
            {"seed": 0, "num_warmup": 100, "num_samples": 100},
            method="fit_centralized",
            expect=Expect(posteriors=(True, True), new_client="population"),
        ),
    ),
    bad_parameter=("damping", 1.5),
)
RIDGE = Declaration(
    "ridge",
    "fedstats.linear:BayesianRidge",
    "fedstats.linear:ShrinkageResult",
    "Bayesian ridge: per-client coefficients with a Gaussian shrinkage prior, by federated EP",
    (_SHRINKAGE,),
    _ep_command("ridge", "fedstats.linear:BayesianRidge", f"Bayesian ridge {_SELECTION}", penalised=True),
    reference="fedstats.linear.shrinkage_pooled:pooled_nuts",
    examples=(Example("ridge", {"rounds": 2}, _EP_FIT, expect=_EP_EXPECT, long=_TWELVE),),
    bad_parameter=("tol", -1),
)


# --------------------------------------------------------------------------- HM1
_HM1_OPTIONS = (
    rounds("communication rounds, stopping when converged"),
    STANDARDIZE,
    _INTERCEPT,
    uncertainty(
        "require the conditional posteriors (each client shares X^T X / sigma^2 once; by default they are given "
        "whenever every client can share, else Algorithm 1's point with a warning)"
    ),
    Option(
        "--eig-floor",
        "raise Omega's eigenvalues to at least this fraction of its mean variance after every round (0 is the "
        "paper's algorithm, which has no fixed point with more clients than coefficients)",
        {"type": float},
        param="eig_floor",
    ),
    Option(
        "--learning-rate",
        "Algorithm 1's step size on the standardised scale (auto: half the largest stable step, from one "
        "scalar per client)",
        {"type": float},
        param="lr",
    ),
)


def _hm1_build(args):
    from ..linear import StructuralCovarianceModel

    return StructuralCovarianceModel(**given(args, _HM1_OPTIONS)), {"uncertainty": True if args.uncertainty else "auto"}


def _hm1_check(args) -> None:
    if args.eig_floor is not None and not (args.eig_floor >= 0 and args.eig_floor < float("inf")):
        raise CLIError(f"--eig-floor must be a number >= 0, got {args.eig_floor}")
    if args.learning_rate is not None and not (args.learning_rate > 0 and args.learning_rate < float("inf")):
        raise CLIError(f"--learning-rate must be a positive number, got {args.learning_rate}")


def _hm1_header(args, res, runtime: float) -> str:
    scale = "standardised scale" if res.scaling is not None else "the data's units"
    return (
        f"HM1 (Algorithm 1): {res.rounds} rounds ({converged_text(res)}), learning rate {res.lr:.3g} ({scale}), "
        f"eigenvalue floor {res.options['eig_floor']:g}, {runtime:.1f} s"
    )


def _hm1_notes(args, res) -> list[str]:
    out = _scaled_note(args, res)
    if res.has_uncertainty:
        out.append(
            f"estimate: Algorithm 1's point; mean, sd, {100 * args.level:g}% interval: the posterior given Omega "
            "re-estimated from the shared information (the interval is centred at mean)"
        )
    return out


def _hm1_extras(args, res, data, scaler) -> dict:
    from pathlib import Path

    from ..data.validation import client_key

    out = {"learning_rate": res.lr}
    if args.output:
        omega_path = Path(args.output).with_suffix(".omega.csv")
        om = res.posterior_omega if res.has_uncertainty else res.omega
        om.index = om.columns = [client_key(c) for c in data.clients]
        try:
            om.to_csv(omega_path)
        except OSError as exc:
            raise CLIError(f"cannot write {omega_path}: {exc.strerror}") from None
        out["omega_file"] = omega_path.name
    return out


_HM1_FIT = {"seed": 0, "progress": False}
HM1 = Declaration(
    "hm1",
    "fedstats.linear:StructuralCovarianceModel",
    "fedstats.linear:StructuralResult",
    "per-client regressions sharing a learned covariance between clients (Algorithm 1)",
    (
        Disclosure(
            "StructuralCovarianceModel (HM1)",
            (
                DESIGN,
                SCALING,
                CURVATURE,
                exchange(
                    "HM1 rounds",
                    "HM1Algorithm",
                    "every round",
                    (
                        Array(
                            "theta",
                            "its updated coefficients",
                            "its regression coefficients: the server learns Omega from all of them",
                        ),
                    ),
                ),
                exchange(
                    "information share",
                    "InformationShare",
                    "once, with uncertainty='auto' (the default) or True; on Flower only from nodes whose "
                    "policy says release_statistics = true",
                    (
                        Array("information", "X'X / sigma^2", "its design's second moments"),
                        Array("score", "X'y / sigma^2", "with `information`: its least-squares fit"),
                        Array("noise_var", "its residual variance sigma^2", "its fit's residual variance"),
                    ),
                ),
            ),
            "nothing.",
        ),
    ),
    Command(
        "hm1",
        "per-client regressions sharing a learned covariance between clients",
        _HM1_OPTIONS,
        _hm1_build,
        _hm1_header,
        notes=_hm1_notes,
        extras=_hm1_extras,
        check=_hm1_check,
        new_clients="HM1 has no model of a client that took no part in the fit",
        min_clients=2,
    ),
    reference="fedstats.linear:StructuralCovarianceModel.fit_centralized",
    examples=(
        Example(
            "hm1",
            {"rounds": 5},
            {**_HM1_FIT, "uncertainty": True},
            expect=Expect((False, True), _UNCERTAINTY),
            long={"rounds": 12},
        ),
        Example("hm1-point", {"rounds": 5}, {**_HM1_FIT, "uncertainty": False}, expect=Expect(remedy=_UNCERTAINTY)),
    ),
    bad_parameter=("posterior_omega", "mle"),
)


# --------------------------------------------------------------------------- baselines
def _local(kind: str, algorithm: str, what: str, reveals: str, summed: str | tuple = ()):
    return exchange(
        kind, algorithm, "once" if kind != "rounds" else "every round", (Array("theta", what, reveals),), summed
    )


_AVERAGING = (
    DESIGN,
    CURVATURE,
    _local(
        "rounds",
        "_Averaging",
        "its locally updated coefficients",
        "its own coefficients after a few local steps",
        "all",
    ),
)
_BASELINES = "fedstats.linear.baselines"
SEPARATE = Declaration(
    "separate",
    f"{_BASELINES}:Separate",
    "fedstats.linear.local:PointResult",
    "each client's own regression, no sharing (a baseline)",
    (
        Disclosure(
            "Separate",
            (
                DESIGN,
                CURVATURE,
                _local("local fits", "_SeparateFit", "its own fitted coefficients (the result)", "its own regression"),
            ),
            "nothing.",
        ),
    ),
    reference="numpy.linalg:lstsq",
    examples=(Example("separate", expect=Expect(remedy=_HM2, global_rows=False), long={"rounds": 12}),),
    bad_parameter=("method", "qr"),
)
_FEDAVG_DITTO = Disclosure("FedAvg, Ditto", _AVERAGING, "FedAvg nothing; Ditto its personal coefficients.")
FEDAVG = Declaration(
    "fedavg",
    f"{_BASELINES}:FedAvg",
    "fedstats.linear.local:PointResult",
    "one shared regression by federated averaging (a baseline)",
    (_FEDAVG_DITTO,),
    reference="numpy.linalg:lstsq",
    examples=(Example("fedavg", expect=Expect(remedy=_HM2, new_client="shared"), long={"rounds": 12}),),
    bad_parameter=("local_steps", 0),
)
DITTO = Declaration(
    "ditto",
    f"{_BASELINES}:Ditto",
    "fedstats.linear.local:PointResult",
    "personalised regressions pulled towards a federated average (a baseline)",
    (_FEDAVG_DITTO,),
    reference=f"{_BASELINES}:PooledOracle",
    examples=(Example("ditto", {"lam": 1.0}, expect=Expect(remedy=_HM2, global_rows=False), long={"rounds": 12}),),
    bad_parameter=("grad_reduction", "max"),
)
DISTRIBUTED_RIDGE = Declaration(
    "distributed-ridge",
    f"{_BASELINES}:DistributedRidge",
    "fedstats.linear.local:PointResult",
    "one shared ridge regression from one round of sufficient statistics (a baseline)",
    (
        Disclosure(
            "DistributedRidge",
            (
                DESIGN,
                _local("ridge statistics", "_OneShotRidge", "its own ridge solution", "its own regression", "all"),
            ),
            "nothing.",
        ),
    ),
    reference="sklearn.linear_model:Ridge",
    examples=(Example("distributed-ridge", expect=Expect(remedy=_HM2, new_client="shared")),),
)

DECLARATIONS = (HM2, LASSO, RIDGE, HM1, SEPARATE, FEDAVG, DITTO, DISTRIBUTED_RIDGE)
