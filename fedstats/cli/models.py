"""What differs between the command's models: the estimator and its options, the checks of
the options, the header line and a few model-specific JSON fields. Everything else goes through
the result contract (:mod:`fedstats.results`): summary, client_summary, predict, communication."""

from __future__ import annotations

from pathlib import Path

from ..glm import ROLES as GLM_ROLES
from .errors import CLIError
from .inputs import id_key

MODELS = ("hm2", "lasso", "ridge", "hm1", "fgpr", "gmm", "glm", "bglm", "hglm")
GLMS = ("glm", "bglm", "hglm")
REGRESSIONS = ("hm2", "lasso", "ridge")


def estimator(args):
    """``--model``'s estimator with the command's options, and its extra ``fit`` arguments.
    An option not given (``--rounds``) leaves the estimator's own default."""
    rounds = {} if args.rounds is None else {"rounds": args.rounds}
    if args.model in REGRESSIONS:
        from ..linear import BayesianLasso, BayesianRidge, HierarchicalLinearModel

        cls = {"hm2": HierarchicalLinearModel, "lasso": BayesianLasso, "ridge": BayesianRidge}[args.model]
        return cls(**rounds, standardize=args.standardize, fit_intercept=args.intercept), {}
    if args.model == "hm1":
        from ..linear import StructuralCovarianceModel

        # the model's defaults (at most 1000 rounds, stopping when converged; lr "auto"; eig_floor
        # 0.3) unless given
        given = {**rounds, "eig_floor": hm1_option(args, "eig_floor"), "lr": hm1_option(args, "learning_rate")}
        return (
            StructuralCovarianceModel(
                fit_intercept=args.intercept,
                standardize=args.standardize,
                **{k: v for k, v in given.items() if v is not None},
            ),
            {"uncertainty": True if args.uncertainty else "auto"},
        )
    if args.model == "fgpr":
        from ..gp import FGPR

        # Newton steps after the rounds: the hyperparameters' intervals belong at the likelihood's maximum
        return FGPR(**rounds, kernel=args.kernel, ard=args.ard), {}
    if args.model in GLMS:
        from ..glm import BayesianGLM, FederatedGLM, HierarchicalGLM

        cls = {"glm": FederatedGLM, "bglm": BayesianGLM, "hglm": HierarchicalGLM}[args.model]
        extra = {"cov_type": "HC0" if args.robust else "nonrobust"} if args.model == "glm" else {}
        return cls(
            args.family,
            args.link,
            alpha=args.alpha,
            fit_intercept=args.intercept,
            **rounds,
            **extra,
            **{r: getattr(args, r) for r in GLM_ROLES},
        ), {}
    from ..mixture import FederatedGaussianMixture, VariationalGaussianMixture

    if args.bayesian:
        return VariationalGaussianMixture(args.components, covariance_type=args.covariance_type, **rounds), {}
    return (
        FederatedGaussianMixture(args.components, covariance_type=args.covariance_type, **rounds),
        {"uncertainty": args.uncertainty},
    )


HM1_OPTIONS = ("eig_floor", "learning_rate")


def add_arguments(parser) -> None:
    """HM1's own options on the ``fit`` parser: ``--eig-floor`` and ``--learning-rate``
    (``StructuralCovarianceModel``'s ``eig_floor`` and ``lr``)."""
    parser.add_argument(
        "--eig-floor",
        type=float,
        default=None,
        help="hm1 only: raise Omega's eigenvalues to at least this fraction of its mean variance after every "
        "round (default 0.3; 0 is the paper's algorithm, which has no fixed point with more clients than "
        "coefficients)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="hm1 only: Algorithm 1's step size on the standardised scale (default: half the largest stable "
        "step, from one scalar per client)",
    )


def hm1_option(args, name: str):
    """The value of one of HM1's options, ``None`` when not given (or not on this parser)."""
    return getattr(args, name, None)


# Models without a prediction for a client that took no part in the fit (checked before the
# fit, so that nobody waits for a fit that then cannot predict); the others predict such a
# client from the population (hm2, lasso, ridge) or from its own rows' weights (gmm).
NO_NEW_CLIENTS = {
    "hm1": "HM1 has no model of a client that took no part in the fit",
    "fgpr": "FGPR predicts a client from its own training rows",
}


def converged_text(res) -> str:
    if res.converged is None:  # e.g. FGPR without its curvature exchange: nothing to tell it by
        return "convergence not assessed"
    return "converged" if res.converged else "NOT converged: stopped at the round limit (raise --rounds)"


def header(args, res, runtime: float) -> str:
    conv = converged_text(res)
    if args.model in REGRESSIONS:
        return (
            f"Global posterior ({100 * args.level:g}% credible intervals), {res.rounds} EP rounds ({conv}), "
            f"{runtime:.1f} s"
        )
    if args.model == "hm1":
        scale = "standardised scale" if res.scaling is not None else "the data's units"
        return (
            f"HM1 (Algorithm 1): {res.rounds} rounds ({conv}), learning rate {res.lr:.3g} ({scale}), "
            f"eigenvalue floor {res.options['eig_floor']:g}, {runtime:.1f} s"
        )
    if args.model == "fgpr":
        return (
            f"FGPR ({args.kernel}{', ARD' if args.ard else ''}): {res.rounds} rounds, {len(res.clients)} clients, "
            f"{runtime:.1f} s. Shared hyperparameters (outputscale and noise are variances on each client's "
            "standardised scale):"
        )
    if args.model == "glm":
        errors = "HC0 sandwich" if args.robust else "model-based"
        return (
            f"GLM, {res.family} family, {res.link} link, maximum likelihood by federated IRLS: {res.rounds} rounds "
            f"({conv}), {len(res.clients)} clients, {runtime:.1f} s; Wald {100 * args.level:g}% intervals, "
            f"{errors} standard errors (sd); deviance {res.deviance:.4f} on {res.df_resid:g} df, "
            f"AIC {res.aic:.2f}, dispersion {res.scale:.4g}"
        )
    if args.model in ("bglm", "hglm"):
        what = (
            "coefficients shared by every client"
            if args.model == "bglm"
            else "each client's coefficients around the population mean mu (tau: their variances)"
        )
        return (
            f"Bayesian GLM, {res.family} family, {res.link} link, {what}, by federated EP: {res.rounds} rounds "
            f"({conv}), {len(res.clients)} clients, {runtime:.1f} s; {100 * args.level:g}% credible intervals"
        )
    kind = "variational FedEM" if args.bayesian else "FedEM"
    what = "credible intervals" if args.bayesian else "Wald intervals" if args.uncertainty else "point estimates"
    return (
        f"Gaussian mixture, {args.components} components ({args.covariance_type}), {kind}: {res.rounds} rounds "
        f"({conv}), {len(res.clients)} clients, {runtime:.1f} s; {what}"
    )


def extras(args, res, data, scaler) -> dict:
    """The model-specific fields of the JSON (beside the contract's)."""
    if args.model == "hm1":
        out = {"learning_rate": res.lr}
        if args.output:
            omega_path = Path(args.output).with_suffix(".omega.csv")
            om = res.posterior_omega if res.has_uncertainty else res.omega
            om.index = om.columns = [id_key(c) for c in data.clients]
            try:
                om.to_csv(omega_path)
            except OSError as exc:
                raise CLIError(f"cannot write {omega_path}: {exc.strerror}") from None
            out["omega_file"] = omega_path.name
        return out
    if args.model == "fgpr":
        return {
            "kernel": args.kernel,
            "ard": bool(args.ard),
            "input_scaling": {"mean": scaler.mean.tolist(), "sd": scaler.sd.tolist()},
        }
    if args.model == "gmm":
        return {
            "components": args.components,
            "covariance_type": args.covariance_type,
            "bayesian": bool(args.bayesian),
            "intervals": "credible" if args.bayesian else ("wald" if args.uncertainty else None),
            "loglik": None if args.bayesian else res.loglik_,
            "elbo": float(res.elbo_trace()[-1]) if args.bayesian else None,
        }
    if args.model in ("bglm", "hglm"):
        return {
            "family": res.family,
            "link": res.link,
            "alpha": res.alpha if res.family == "negative_binomial" else None,
            "roles": {r: getattr(args, r) for r in GLM_ROLES if getattr(args, r) is not None},
        }
    if args.model == "glm":
        return {
            "family": res.family,
            "link": res.link,
            "alpha": res.alpha if res.family == "negative_binomial" else None,
            "cov_type": res.cov_type,
            "deviance": res.deviance,
            "pearson_chi2": res.pearson_chi2,
            "llf": res.llf,
            "aic": res.aic,
            "bic": res.bic,
            "dispersion": res.scale,
            "df_model": res.df_model,
            "df_resid": res.df_resid,
            "n_iter": res.n_iter,
            "roles": {r: getattr(args, r) for r in GLM_ROLES if getattr(args, r) is not None},
        }
    return {}


def check_args(args) -> None:
    if args.model not in MODELS:
        raise CLIError(f"unknown model {args.model!r}; choose one of: {', '.join(MODELS)}")
    if not 0 < args.level < 1:
        raise CLIError(f"--level must lie in (0, 1), got {args.level}")
    if args.min_rows < 1:
        raise CLIError(f"--min-rows must be at least 1, got {args.min_rows}")
    if args.min_cell_count < 1:
        raise CLIError(f"--min-cell-count must be at least 1, got {args.min_cell_count}")
    if args.model == "gmm":
        if args.target is not None:
            raise CLIError("--model gmm takes no --target (a mixture models all feature columns)")
        if args.components is None or args.components < 1:
            raise CLIError("--model gmm needs --components M (M >= 1)")
    else:
        if args.target is None:
            raise CLIError(f"--model {args.model} needs --target")
        if args.components is not None or args.bayesian or args.covariance_type != "full":
            raise CLIError("--components, --bayesian and --covariance-type apply to --model gmm only")
    if not args.standardize and args.model not in (*REGRESSIONS, "hm1"):
        raise CLIError("--no-standardize applies to --model hm2, lasso, ridge and hm1 only")
    hm1_given = [f"--{o.replace('_', '-')}" for o in HM1_OPTIONS if hm1_option(args, o) is not None]
    if hm1_given and args.model != "hm1":
        raise CLIError(f"{', '.join(hm1_given)}: for --model hm1 only")
    eig_floor, lr = hm1_option(args, "eig_floor"), hm1_option(args, "learning_rate")
    if eig_floor is not None and not (eig_floor >= 0 and eig_floor < float("inf")):
        raise CLIError(f"--eig-floor must be a number >= 0, got {eig_floor}")
    if lr is not None and not (lr > 0 and lr < float("inf")):
        raise CLIError(f"--learning-rate must be a positive number, got {lr}")
    if not args.intercept and args.model not in (*REGRESSIONS, "hm1", *GLMS):
        raise CLIError("--no-intercept applies to the regressions (hm2, lasso, ridge, hm1, glm, bglm, hglm) only")
    glm_only = [
        f"--{o}" for o in ("family", "link", "alpha", *GLM_ROLES, "robust") if getattr(args, o) not in (None, False)
    ]
    if args.model not in GLMS and glm_only:
        raise CLIError(f"{', '.join(glm_only)}: for --model glm, bglm and hglm only")
    if args.robust and args.model != "glm":
        raise CLIError("--robust (sandwich standard errors) is for --model glm only")
    if args.model in GLMS:
        from ..glm import BAYES_LINKS, FAMILIES

        links = {f: FAMILIES[f].links for f in FAMILIES} if args.model == "glm" else dict(BAYES_LINKS)
        if args.model == "hglm":
            links = {f: links[f] for f in ("binomial", "poisson", "negative_binomial")}
        if args.family is None or args.family not in links:
            raise CLIError(f"--model {args.model} needs --family, one of: {', '.join(links)}")
        if args.link is not None and args.link not in links[args.family]:
            raise CLIError(
                f"the {args.family} family takes --link {', '.join(links[args.family])} with --model "
                f"{args.model}, got {args.link}"
            )
        if args.trials is not None and args.family != "binomial":
            raise CLIError("--trials is for --family binomial")
        if args.alpha is not None and args.family != "negative_binomial":
            raise CLIError("--alpha is for --family negative_binomial")
        args.alpha = 1.0 if args.alpha is None else args.alpha
        if args.alpha <= 0:
            raise CLIError(f"--alpha must be positive, got {args.alpha}")
        used = [c for c in (getattr(args, r) for r in GLM_ROLES) if c is not None]
        if args.features and any(c not in args.features for c in used):
            args.features = [*args.features, *(c for c in used if c not in args.features)]
    if args.rounds is not None and args.rounds < 1:
        raise CLIError(f"--rounds must be at least 1, got {args.rounds}")
    if args.uncertainty and args.model not in ("hm1", "gmm"):
        raise CLIError("--uncertainty applies to --model hm1 and gmm only (the Bayesian models always give intervals)")
    if args.uncertainty and args.bayesian:
        raise CLIError("--uncertainty (Wald intervals) and --bayesian (credible intervals) exclude each other")
    if (args.kernel != "rbf" or args.ard) and args.model != "fgpr":
        raise CLIError("--kernel and --ard apply to --model fgpr only")
