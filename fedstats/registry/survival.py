"""Survival analysis's declarations: the Cox proportional hazards model (``fedstats fit --model
cox``) and the hierarchical Cox model (``--model hcox``), with the threat-model tables of their
exchanges and of the Kaplan-Meier curve and log-rank test (functions, not models)."""

from __future__ import annotations

from .common import STANDARDIZE, converged_text, given, rounds
from .exchanges import ROWS_EP, exchange
from .spec import Array, Command, Declaration, Disclosure, Example, Expect, Option

_TIMES = "where its event times lie (all of them, after enough rounds), and how many events at each"
_SEARCH = (
    Array("counts", "per interval of times (and group, event or censored), how many of its rows lie in it", _TIMES),
    Array("limbs", "per interval, the sums and sums of squares of the bytes of its times' keys", "see `counts`"),
)
_CHECK = exchange(
    "design check",
    "_CoxCheck",
    "once, first",
    (
        Array("rows", "its row count", "its row count"),
        Array("events", "its number of events", "its number of events"),
        Array("sx", "its predictors' sums", "its predictors' means"),
        Array("sxx", "its predictors' cross-products", "their spread and correlation"),
        Array("xd", "the sums of its events' predictors", "its events' predictor means"),
    ),
    "all",
)
COX = Disclosure(
    "CoxPH",
    (
        _CHECK,
        exchange("time counts", "_TimeCounts", "unstratified: at most 17 rounds, after the check", _SEARCH, "all"),
        exchange(
            "risk-set counts",
            "_Leaving",
            "unstratified: once, before the Newton rounds",
            (Array("leaving", "per event time, how many of its rows leave the risk set after it", _TIMES),),
            "all",
        ),
        exchange(
            "Newton rounds",
            "_CoxNewton",
            "unstratified: two rounds a Newton step",
            (
                Array("s0", "per event time, the sum of exp(x'b) over its rows at risk", "its rows' risk scores"),
                Array(
                    "s1",
                    "per event time, the sum of exp(x'b) x over its rows at risk",
                    "with `s0`: the predictors of the rows that leave between two times",
                ),
                Array("d0", "Efron: per tied event time, the sum of exp(x'b) over its events there", "see `s1`"),
                Array("d1", "Efron: per tied event time, the sum of exp(x'b) x over its events there", "see `s1`"),
                Array(
                    "h2",
                    "its rows' exp(x'b) x x', weighted by the event times they are at risk at",
                    "its predictors' weighted spread",
                ),
            ),
            "all",
        ),
    ),
    "nothing (no state is kept on a client).",
    note="Every reply is summed: under secure aggregation the server learns only sums over the clients. "
    "Unstratified, it learns the pooled event times and events at each, and the risk-set sums: two "
    "consecutive ones differ by the rows that left the risk set between the two times, so the data's "
    "`min_cell_count` applies to those groups (and to tied events under Efron's ties), checked on their "
    "counts before any sum is sent; `bins=` coarsens the times on the clients. `stratify=True` sends "
    "only each client's summed value, score and information: no time leaves a client.",
)
COX_OPTIONS = Disclosure(
    "CoxPH (stratify=True, robust=True, the proportional hazards test, the concordance)",
    (
        exchange(
            "Newton rounds",
            "_CoxStrata",
            "stratify=True: one round a Newton step",
            (
                Array("ll", "its own log partial likelihood", "how well the coefficients fit its rows"),
                Array("score", "its own score", "with `info`: its own Newton step, close to its own fit"),
                Array("info", "its own information", "its predictors' weighted spread"),
            ),
            "all",
        ),
        exchange(
            "score residuals",
            "_CoxScores",
            "robust=True: once, at the fit",
            (Array("meat", "the sum of its rows' score-residual outer products", "its rows' residual spread"),),
            "all",
        ),
        exchange(
            "Schoenfeld residuals",
            "_Schoenfeld",
            "result.proportional_hazards_test(data): once",
            (
                Array(
                    "r", "the sum of its events' Schoenfeld residuals", "its events' predictors against the risk sets"
                ),
                Array("gr", "their sum weighted by the events' transformed times", "how they move with time"),
                Array("g", "the sum of its events' transformed times", "its events' times, on average"),
                Array("gg", "the sum of their squares", "their spread"),
                Array("d", "its number of events", "its number of events"),
            ),
            "all",
        ),
        exchange(
            "concordant pairs",
            "_WithinPairs",
            "result.concordance(data, within_clients=True): once",
            (
                Array("correct", "its concordant pairs (of its own rows)", "how well the model ranks its rows"),
                Array("tied", "its pairs tied in risk", "see `correct`"),
                Array("pairs", "its comparable pairs", "with its row count: roughly its censoring"),
            ),
            "all",
        ),
        exchange(
            "risk sums",
            "_RiskSums",
            "result.concordance(data) over all pairs: once",
            (
                Array("n", "its row count", "its row count"),
                Array("s1", "the sum of its risk scores", "its rows' mean risk"),
                Array("s2", "their sum of squares", "their spread"),
            ),
            "all",
        ),
        exchange(
            "risk table",
            "_RiskTable",
            "result.concordance(data) over all pairs: once, after the risk sums",
            (
                Array("events", "per time cell and risk bin, its events", "its events' times and risk bins"),
                Array("censored", "per time cell and risk bin, its censored rows", "see `events`"),
            ),
            "all",
        ),
    ),
    "nothing (no state is kept on a client).",
    note="`stratify=True` replaces the time counts, risk-set counts and Newton rounds above by these Newton "
    "rounds: each client's own summed value, score and information, no time or risk-set sum. The "
    "concordance over all pairs releases the summed table of counts (time cells by risk bins), under the "
    "data's `min_cell_count`; within clients, three summed counts.",
)
KM = Disclosure(
    "Kaplan-Meier and log-rank (fedstats.survival)",
    (
        exchange("time counts", "_TimeCounts", "KaplanMeier, logrank_test: at most 17 rounds", _SEARCH, "all"),
        exchange(
            "binned counts",
            "_BinnedCounts",
            "with bins=: once",
            (Array("counts", "per bin and group, its events and censored rows", "its binned counts"),),
            "all",
        ),
        exchange(
            "log-rank strata",
            "_LogRankStrata",
            "logrank_test(stratify=True): once",
            (
                Array("o_e", "per group, its observed minus expected events", "its groups' excess events"),
                Array("v", "their covariance", "its at-risk balance"),
                Array("rows", "its row count", "its row count"),
            ),
            "all",
        ),
    ),
    "nothing (the functions keep no state on a client).",
    note="Every reply is summed. Exact times: the server learns the pooled distinct times and, at each, the "
    "summed events and censored rows per group (the curve's counts); a count of 1 to `min_cell_count - 1` "
    "is refused before anything is returned. `bins=`: one round of counts in public bins, no exact time. "
    "`logrank_test(stratify=True)`: only the summed test terms.",
)

_OPTIONS = (
    Option("--event", "the 0/1 column of events (1: the event at the time; 0: censored); required", param="event"),
    Option("--ties", "how tied event times count", {"choices": ("efron", "breslow")}, param="ties"),
    Option(
        "--stratify", "every client its own baseline hazard", {"action": "store_const", "const": True}, param="stratify"
    ),
    Option("--robust", "sandwich standard errors from score residuals (one more round)", {"action": "store_true"}),
    Option(
        "--bins",
        "bin edges: each time becomes the upper edge of its bin (coarser times, fewer disclosure refusals)",
        {"type": float, "nargs": "+", "metavar": "EDGE"},
        param="bins",
    ),
    rounds("Newton steps, at most"),
)


def _needs_event(model: str):
    """The command line's check of ``--model model``: ``--event`` given, and read with the features."""

    def check(args) -> None:
        from .spec import CLIError

        if args.event is None:
            raise CLIError(f"--model {model} needs --event, the 0/1 column of events")
        if args.features and args.event not in args.features:  # the event column is read too
            args.features = [*args.features, args.event]

    return check


def _build(args):
    from ..survival import CoxPH

    return CoxPH(**given(args, _OPTIONS), robust=bool(args.robust)), {}


def _header(args, res, runtime: float) -> str:
    strata = "stratified by client" if res.stratified else "one baseline hazard"
    return (
        f"Cox proportional hazards, {res.ties} ties, {strata}, by federated Newton steps: {res.rounds} rounds "
        f"({converged_text(res)}), {len(res.clients)} clients, {res.nobs} rows, {res.n_events} events, "
        f"{runtime:.1f} s; Wald {100 * args.level:g}% intervals, {res.cov_type} standard errors; log partial "
        f"likelihood {res.llf:.4f}"
    )


def _extras(args, res, data, scaler) -> dict:
    lr = res.lr_test()
    return {
        "event": res.event_name,
        "ties": res.ties,
        "stratified": res.stratified,
        "cov_type": res.cov_type,
        "bins": list(res.bins) if res.bins is not None else None,
        "llf": res.llf,
        "llf_null": res.llf_null,
        "n_events": res.n_events,
        "n_iter": res.n_iter,
        "lr_test": {k: float(v) for k, v in lr.items()},
        "hazard_ratios": [
            {"name": str(n), **{c: float(v) for c, v in row.items()}}
            for n, row in res.hazard_ratios(args.level).iterrows()
        ],
    }


CPH = Declaration(
    "cox",
    "fedstats.survival:CoxPH",
    "fedstats.survival:CoxResult",
    "Cox proportional hazards model by exact maximum partial likelihood, equal to the pooled fit",
    (COX, COX_OPTIONS, KM),
    Command(
        "cox",
        "Cox proportional hazards (the target is the time), needs --event",
        _OPTIONS,
        _build,
        _header,
        extras=_extras,
        check=_needs_event("cox"),
        standard_errors=True,
    ),
    reference="statsmodels.duration.hazard_regression:PHReg",
    examples=(
        Example(
            "cox",
            {"event": "event"},
            {"seed": 0, "progress": False},
            data="survival",
            expect=Expect(remedy="HierarchicalCox", new_client="shared", client_rows=False, summary_sd=True),
        ),
    ),
    bad_parameter=("ties", "exact"),
)


# --------------------------------------------------------------------------- hierarchical Cox
_PIECES = "its rows' times, as the intervals they reach"
HCOX_TABLE = Disclosure(
    "HierarchicalCox",
    (
        _CHECK,
        exchange(
            "time sum",
            "_GroupMoments",
            "standardize=True: once, after the check",
            (
                Array("n", "its row count", "its row count"),
                Array("s1", "the sum of its times", "its mean time"),
                Array("s2", "the sum of their squares", "their spread"),
                Array("cross", "their cross-product (one column: s2 again)", "see `s2`"),
            ),
            "all",
        ),
        exchange(
            "quantile search",
            "_QuantileSearch",
            "without cuts=: at most 16 rounds",
            (Array("below", "per threshold, how many of its event times are at or below it", _TIMES),),
            "all",
        ),
        exchange(
            "design check",
            "DesignCheck",
            "once, before the EP rounds",
            (
                Array("n_rows", "its number of pieces (a row's intervals up to its time)", _PIECES),
                Array("sum_y", "its number of events", "its number of events"),
                Array("wnobs", "its number of pieces", "see `n_rows`"),
                Array("xtx", "X'X of its pieces", "its pieces per interval and its predictors' moments"),
                Array("non_integer", "0 (events are whole numbers)", "nothing"),
            ),
            ("sum_y", "wnobs", "xtx", "non_integer"),
        ),
        ROWS_EP,
        exchange(
            "client posteriors",
            "_ClientPosteriors",
            "once, after the EP rounds",
            (
                Array("mean", "its log baseline hazards' and coefficients' posterior mean", "its own hazards"),
                Array("cov", "their posterior covariance", "their uncertainty"),
            ),
        ),
    ),
    "its EP site (its pieces are made again from its own rows at each step, never kept).",
    note="Each client splits its rows into pieces (one per interval a row lives into) on its own node. The "
    "server learns the summed rows, events, predictor moments and times, the interval cuts (order statistics "
    "of the pooled event times; none with `cuts=`), each client's number of pieces, and what every EP model "
    "learns: each client's EP site, and after the fit its posterior of its own hazards and coefficients.",
)
_HCOX_OPTIONS = (
    _OPTIONS[0],
    Option(
        "--intervals", "intervals of the baseline hazard, cut at event-time quantiles", {"type": int}, param="intervals"
    ),
    Option(
        "--cuts",
        "the interval edges instead (increasing times > 0; public: no event time is searched for)",
        {"type": float, "nargs": "+", "metavar": "TIME"},
        param="cuts",
    ),
    STANDARDIZE,
    rounds("EP rounds, stopping when converged"),
)


def _hcox_build(args):
    from ..survival import HierarchicalCox

    return HierarchicalCox(**given(args, _HCOX_OPTIONS)), {}


def _hcox_header(args, res, runtime: float) -> str:
    return (
        f"hierarchical Cox model, {len(res.edges)} intervals of a piecewise-constant baseline hazard, each "
        f"client's own around the population (mu; tau: their variances), by federated EP: {res.rounds} rounds "
        f"({converged_text(res)}), {len(res.clients)} clients, {res.events} events, {runtime:.1f} s; "
        f"{100 * args.level:g}% credible intervals"
    )


def _hcox_extras(args, res, data, scaler) -> dict:
    return {
        "event": res.event_name,
        "edges": [float(e) for e in res.edges],
        "events": res.events,
        "hazard_ratios": [
            {"name": str(n), **{c: float(v) for c, v in row.items()}}
            for n, row in res.hazard_ratios(level=args.level).iterrows()
        ],
    }


HCOX = Declaration(
    "hcox",
    "fedstats.survival:HierarchicalCox",
    "fedstats.survival:HierarchicalCoxResult",
    "hierarchical Cox model: each client's baseline hazard and coefficients around a population, by federated EP",
    (HCOX_TABLE,),
    Command(
        "hcox",
        "hierarchical Cox model (the target is the time), needs --event",
        _HCOX_OPTIONS,
        _hcox_build,
        _hcox_header,
        extras=_hcox_extras,
        check=_needs_event("hcox"),
    ),
    reference="fedstats.reference.glm:pooled_nuts",
    examples=(
        Example(
            "hcox",
            {"event": "event", "intervals": 2, "rounds": 2, "num_draws": 400},
            {"seed": 0, "progress": False},
            data="survival",
            expect=Expect((True, True), new_client="population", bands=False, unconverged=True),
            long={"rounds": 12, "num_draws": 200},
        ),
    ),
    bad_parameter=("intervals", 0),
)

DECLARATIONS = (CPH, HCOX)
