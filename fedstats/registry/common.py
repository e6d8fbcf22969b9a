"""What several declarations share: the command-line options more than one model takes, and
the reading of the options a user gave."""

from __future__ import annotations

import argparse
from typing import Any

from .spec import Option


def rounds(what: str) -> Option:
    """``--rounds``: ``what`` the model's rounds are (its default is the estimator's)."""
    return Option("--rounds", what, {"type": int}, param="rounds")


#: hm2, lasso, ridge, hm1: the data as given
STANDARDIZE = Option(
    "--no-standardize",
    "fit the data in its own units (default: standardise predictors and target with federated moments, report "
    "on the data's scale; the priors then act on the standardised scale)",
    {"action": "store_const", "const": False},
    param="standardize",
    dest="standardize",
)


def no_intercept(default: str) -> Option:
    """``--no-intercept``; ``default`` says what the model has without it."""
    return Option(
        "--no-intercept",
        f"no intercept (default: {default})",
        {"action": "store_const", "const": False},
        param="fit_intercept",
        dest="intercept",
    )


def uncertainty(what: str) -> Option:
    """``--uncertainty``: ``what`` it adds to the fit."""
    return Option("--uncertainty", what, {"action": "store_true"})


def given(args: argparse.Namespace, options: tuple[Option, ...]) -> dict[str, Any]:
    """The estimator parameters among ``options`` that the command line gave (the others keep
    the estimator's defaults)."""
    return {o.param: getattr(args, o.dest) for o in options if o.param and getattr(args, o.dest) is not None}


def converged_text(res: Any) -> str:
    """How a result's convergence reads in a header line."""
    if res.converged is None:  # e.g. FGPR without its curvature exchange: nothing to tell it by
        return "convergence not assessed"
    return "converged" if res.converged else "NOT converged: stopped at the round limit (raise --rounds)"
