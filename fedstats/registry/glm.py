"""The generalised linear models' declarations: the exact federated GLM, the Bayesian GLM and
the hierarchical GLM."""

from __future__ import annotations

from .common import converged_text, given, no_intercept, rounds
from .exchanges import DP_NOTE, ELPD, GLM_CHECK, ROWS_EP, SCALING, dp_exchange, exchange
from .spec import Array, CLIError, Command, Declaration, Disclosure, Example, Expect, Option

#: the special columns of a GLM (not predictors)
ROLES = ("offset", "exposure", "weights", "trials")
_FAMILIES = ("gaussian", "binomial", "poisson", "gamma", "negative_binomial")
#: the options every GLM of the command line takes
OPTIONS = (
    no_intercept("one intercept shared by every client; hglm: each client's own around the population's"),
    Option(
        "--family",
        "the outcome's distribution (required; binomial: 0/1 rows, or successes with --trials)",
        {"choices": _FAMILIES},
        param="family",
    ),
    Option(
        "--link",
        "the link (default: the family's canonical link)",
        {"choices": ("identity", "log", "inverse", "logit", "probit", "cloglog")},
        param="link",
    ),
    Option("--alpha", "with negative_binomial: the fixed dispersion", {"type": float}, param="alpha"),
    Option("--offset", "a column added to the linear predictor (not a predictor)", param="offset"),
    Option("--exposure", "a column whose log is added to the linear predictor (rates)", param="exposure"),
    Option("--weights", "a column of frequency weights", param="weights"),
    Option("--trials", "with binomial: a column of trials (the target then counts successes)", param="trials"),
)
_IRLS_ROUNDS = rounds("IRLS iterations, at most")
_EP_ROUNDS = rounds("EP rounds, stopping when converged")
_ROBUST = Option("--robust", "HC0 sandwich standard errors (one more round)", {"action": "store_true"})
_EXP = Option(
    "--exp",
    "also report exp of the coefficients with their intervals: odds ratios (logit link), risk or rate ratios "
    '(log link); the JSON\'s "ratios"',
    {"action": "store_true"},
)


def _links(model: str) -> dict[str, tuple[str, ...]]:
    from ..glm import BAYES_LINKS, FAMILIES

    if model == "glm":
        return {f: FAMILIES[f].links for f in FAMILIES}
    links = dict(BAYES_LINKS)
    return {f: links[f] for f in ("binomial", "poisson", "negative_binomial")} if model == "hglm" else links


def _check(args) -> None:
    links = _links(args.model)
    if args.family is None or args.family not in links:
        raise CLIError(f"--model {args.model} needs --family, one of: {', '.join(links)}")
    if args.link is not None and args.link not in links[args.family]:
        raise CLIError(
            f"the {args.family} family takes --link {', '.join(links[args.family])} with --model {args.model}, "
            f"got {args.link}"
        )
    if args.trials is not None and args.family != "binomial":
        raise CLIError("--trials is for --family binomial")
    if args.alpha is not None and args.family != "negative_binomial":
        raise CLIError("--alpha is for --family negative_binomial")
    if args.alpha is not None and not args.alpha > 0:
        raise CLIError(f"--alpha must be positive, got {args.alpha}")
    if getattr(args, "exp", False):
        from ..glm import FAMILIES
        from ..glm.hypotheses import ratio_kind

        link = args.link or FAMILIES[args.family].links[0]
        if ratio_kind(args.family, link) is None:
            raise CLIError(f"--exp needs the log or logit link (exp of a coefficient is then a ratio), got {link}")
    used = [c for c in (getattr(args, r) for r in ROLES) if c is not None]
    if args.features and any(c not in args.features for c in used):  # the special columns are read too
        args.features = [*args.features, *(c for c in used if c not in args.features)]


def _notes(args, res) -> list[str]:
    if getattr(res, "scaling", None) is None:
        return []
    return [
        "(fitted on predictors standardised with federated moments, the priors on that scale; reported on the "
        "data's scale; 0/1 predictors keep their coding)"
    ]


def _model_fields(res) -> dict:
    return {"family": res.family, "link": res.link, "alpha": res.alpha if res.family == "negative_binomial" else None}


def _roles(args) -> dict:
    return {r: getattr(args, r) for r in ROLES if getattr(args, r) is not None}


# --------------------------------------------------------------------------- the exact GLM
_WALD = Option(
    "--wald",
    "a Wald test that these coefficients are all 0 (a predictor's name tests all its levels); the JSON's \"tests\"",
    {"nargs": "+", "metavar": "NAME"},
)
_LR = Option(
    "--lr-test",
    'fit again without these predictors and compare by a likelihood-ratio test; the JSON\'s "tests"',
    {"nargs": "+", "metavar": "NAME"},
)
_GLM_OPTIONS = (*OPTIONS, _IRLS_ROUNDS, _ROBUST, _EXP, _WALD, _LR)


def _glm_build(args):
    from ..glm import FederatedGLM

    robust = {"cov_type": "HC0"} if args.robust else {}
    return FederatedGLM(**given(args, _GLM_OPTIONS), **robust), {}


def _glm_header(args, res, runtime: float) -> str:
    errors = "HC0 sandwich" if args.robust else "model-based"
    return (
        f"GLM, {res.family} family, {res.link} link, maximum likelihood by federated IRLS: {res.rounds} rounds "
        f"({converged_text(res)}), {len(res.clients)} clients, {runtime:.1f} s; Wald {100 * args.level:g}% "
        f"intervals, {errors} standard errors; deviance {res.deviance:.4f} on {res.df_resid:g} df, "
        f"AIC {res.aic:.2f}, dispersion {res.scale:.4g}"
    )


def _ratios(args, res) -> list[dict]:
    """With ``--exp``: one record per coefficient on the ratio scale (:meth:`GLMResult.ratios`)."""
    t = res.ratios(args.level)
    return [
        {"name": str(n), "kind": t.attrs["ratio"], **{c: float(v) for c, v in row.items()}} for n, row in t.iterrows()
    ]


def _matching(names: list[str], asked: list[str], what: str) -> list[str]:
    """The coefficients or columns among ``names`` that ``asked`` names: each exactly, or a
    categorical predictor's every level (``smoker`` -> ``smoker[yes]``, ...)."""
    out: list[str] = []
    for a in asked:
        hit = [n for n in names if n == a or n.startswith(f"{a}[")]
        if not hit:
            raise CLIError(f"{what}: no coefficient {a!r}; the coefficients are {', '.join(names)}")
        out += [n for n in hit if n not in out]
    return out


def _tests(args, res, data) -> list[dict]:
    """With ``--wald`` / ``--lr-test``: the tests' records (:meth:`GLMResult.wald_test`,
    :meth:`GLMResult.lr_test` against a fit without the named predictors)."""
    out = []
    if args.wald:
        names = _matching(list(res.names), args.wald, "--wald")
        out.append({"test": "wald", "coefficients": names, **res.wald_test(names).to_dict()})
    if args.lr_test:
        import numpy as np

        from ..data import FederatedData

        roles = set(_roles(args).values())
        drop = _matching([c for c in data.feature_names if c not in roles], args.lr_test, "--lr-test")
        keep = [j for j, c in enumerate(data.feature_names) if c not in drop]
        smaller = FederatedData(  # each client leaves the columns out of its own rows
            {c: np.asarray(data[c].X)[:, keep] for c in data.clients},
            {c: np.asarray(data[c].y) for c in data.clients},
            feature_names=[data.feature_names[j] for j in keep],
            target_name=str(data.target_name),
            min_rows=data.min_rows,
            min_cell_count=data.min_cell_count,
        )
        small = _glm_build(args)[0].fit(smaller, progress=False)  # the same options
        out.append({"test": "likelihood ratio", "dropped": drop, **res.lr_test(small).to_dict()})
    return out


def _glm_notes(args, res) -> list[str]:
    import pandas as pd

    from ..results import printed_p_values

    lines = _notes(args, res)
    for t in getattr(args, "glm_tests", []):
        what = ", ".join(t.get("coefficients") or t.get("dropped"))
        p = printed_p_values(pd.DataFrame({"p_value": [t["p_value"]]}))["p_value"].iloc[0]
        lines.append(
            f"{t['test'].capitalize()} test that {what} {'are' if ',' in what else 'is'} 0: "
            f"chi-square {t['statistic']:.4f} on {t['df']:g} df, p-value {p}"
        )
    return _ratio_notes(args, res, lines, f"exp of the coefficients, Wald {100 * args.level:g}% intervals")


def _ratio_notes(args, res, lines: list[str], what: str) -> list[str]:
    """``lines``, then with ``--exp`` the ratio table (``what`` says how it was formed)."""
    if not args.exp:
        return lines
    import pandas as pd

    from ..results import printed_p_values

    t = res.ratios(args.level)
    test = "p_value tests a ratio of 1" if res.estimates == "estimate" else "p_value: tail probability of a ratio of 1"
    with pd.option_context("display.width", 120, "display.float_format", "{:.4f}".format):
        shown = printed_p_values(t).to_string()
    return [*lines, f"{t.attrs['ratio'].capitalize()}s: {what}; {test}", shown, "", "Coefficients (log scale)"]


def _glm_extras(args, res, data, scaler) -> dict:
    args.glm_tests = _tests(args, res, data)  # printed by _glm_notes, which comes after
    return {
        **({"ratios": _ratios(args, res)} if args.exp else {}),
        **({"tests": args.glm_tests} if args.glm_tests else {}),
        **_model_fields(res),
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
        "roles": _roles(args),
    }


GLM = Declaration(
    "glm",
    "fedstats.glm:FederatedGLM",
    "fedstats.glm:GLMResult",
    "generalised linear model by exact maximum likelihood (federated IRLS), equal to the pooled fit",
    (
        Disclosure(
            "FederatedGLM",
            (
                GLM_CHECK,
                exchange(
                    "IRLS rounds",
                    "IRLS",
                    "every round",
                    (
                        Array("xtwx", "X'WX, its Fisher information", "its design's weighted second moments"),
                        Array("xtwz", "X'Wz, its score's part", "with `xtwx`: its own IRLS step, close to its own fit"),
                        Array("dev", "its deviance", "how well the fit describes its rows"),
                        Array("pearson", "its Pearson statistic", "see `dev`"),
                        Array("ll", "its log-likelihood", "see `dev`"),
                        Array(
                            "edge",
                            "rows at the edge of the outcome's range",
                            "how many of its rows are predicted at a boundary",
                        ),
                    ),
                    "all",
                ),
                exchange(
                    "sandwich round",
                    "Sandwich",
                    "once, with cov_type='HC0'",
                    (
                        Array("hessian", "its information at the fit", "as `xtwx`"),
                        Array(
                            "meat",
                            "the sum of its rows' score outer products",
                            "its rows' residual-weighted second moments",
                        ),
                    ),
                    "all",
                ),
            ),
            "nothing.",
        ),
        Disclosure(
            "FederatedGLM (dp=)",
            (
                dp_exchange(
                    "design check",
                    "DPDesignCheck",
                    "once, before the rounds",
                    "n: frequency weights; sum_y: weighted outcomes",
                ),
                dp_exchange(
                    "IRLS rounds", "DPIRLS", "every round (dp_rounds)", "xtwx: information w x x'; score: scores"
                ),
                dp_exchange(
                    "dispersion round", "DPDispersion", "once, for gaussian and gamma", "pearson: Pearson terms"
                ),
                dp_exchange(
                    "sandwich round",
                    "Sandwich",
                    "once, with cov_type='HC0'",
                    "hessian: Hessian terms; meat: score products",
                ),
            ),
            "nothing.",
            note=DP_NOTE,
        ),
    ),
    Command(
        "glm",
        "generalised linear model (logistic, Poisson, ...) by exact maximum likelihood, needs --family",
        _GLM_OPTIONS,
        _glm_build,
        _glm_header,
        notes=_glm_notes,
        extras=_glm_extras,
        check=_check,
        standard_errors=True,
    ),
    reference="statsmodels.api:GLM",
    examples=(
        Example(
            "glm",
            {"family": "gaussian"},
            {"seed": 0, "progress": False},
            expect=Expect(remedy="BayesianGLM", new_client="shared", client_rows=False, summary_sd=True, bands=True),
        ),
    ),
    bad_parameter=("family", "weibull"),
)


# --------------------------------------------------------------------------- Bayesian GLMs
_BAYES_OPTIONS = (*OPTIONS, _EP_ROUNDS, _EXP)
_BAYES = Disclosure(
    "BayesianGLM, HierarchicalGLM",
    (
        GLM_CHECK,
        SCALING,
        ROWS_EP,
        exchange(
            "client posteriors",
            "_ClientPosteriors",
            "HierarchicalGLM: once, after the rounds",
            (
                Array("mean", "its coefficients' posterior mean", "its own coefficients"),
                Array("cov", "their posterior covariance", "their uncertainty"),
            ),
        ),
        ELPD,
    ),
    "its EP site (its rows are rebuilt from its own data at each step, never kept).",
)


def _bayes_command(name: str, cls: str, help: str, what: str) -> Command:
    def build(args):
        from .spec import load

        return load(cls)(**given(args, _BAYES_OPTIONS)), {}

    def header(args, res, runtime: float) -> str:
        return (
            f"Bayesian GLM, {res.family} family, {res.link} link, {what}, by federated EP: {res.rounds} rounds "
            f"({converged_text(res)}), {len(res.clients)} clients, {runtime:.1f} s; {100 * args.level:g}% credible "
            "intervals"
        )

    def extras(args, res, data, scaler) -> dict:
        return {**({"ratios": _ratios(args, res)} if args.exp else {}), **_model_fields(res), "roles": _roles(args)}

    def notes(args, res) -> list[str]:
        return _ratio_notes(args, res, _notes(args, res), "posterior means and credible intervals, exponentiated")

    return Command(name, help, _BAYES_OPTIONS, build, header, notes=notes, extras=extras, check=_check)


_BINARY_FIT = {"seed": 0, "progress": False}
BGLM = Declaration(
    "bglm",
    "fedstats.glm:BayesianGLM",
    "fedstats.glm:BayesianGLMResult",
    "Bayesian GLM: coefficients shared by every client with a prior, posteriors by federated EP",
    (_BAYES,),
    _bayes_command(
        "bglm", "fedstats.glm:BayesianGLM", "the glm with a prior and posteriors", "coefficients shared by every client"
    ),
    reference="fedstats.reference.glm:pooled_nuts",
    examples=(
        Example(
            "bglm",
            {"family": "binomial", "rounds": 3, "num_draws": 400},
            _BINARY_FIT,
            data="binary",
            expect=Expect(
                (True, False),
                "HierarchicalGLM",
                "shared",
                client_rows=False,
                bands=True,
                discrete=True,
                unconverged=True,
            ),
            long={"rounds": 12, "num_draws": 200},
        ),
    ),
    bad_parameter=("prior_scale", 0.0),
)
HGLM = Declaration(
    "hglm",
    "fedstats.glm:HierarchicalGLM",
    "fedstats.glm:HierarchicalGLMResult",
    "hierarchical GLM: each client's coefficients around a population, posteriors by federated EP",
    (_BAYES,),
    _bayes_command(
        "hglm",
        "fedstats.glm:HierarchicalGLM",
        "each client's own coefficients around a population, with posteriors",
        "each client's coefficients around the population mean mu (tau: their variances)",
    ),
    reference="fedstats.reference.glm:pooled_nuts",
    examples=(
        Example(
            "hglm",
            {"family": "binomial", "rounds": 2, "num_draws": 400},
            _BINARY_FIT,
            data="binary",
            expect=Expect((True, True), new_client="population", discrete=True, unconverged=True),
            long={"rounds": 12, "num_draws": 200},
        ),
    ),
    bad_parameter=("family", "gaussian"),
)

DECLARATIONS = (GLM, BGLM, HGLM)
