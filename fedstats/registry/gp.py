"""The Gaussian-process models' declarations: FGPR."""

from __future__ import annotations

from .common import given, rounds
from .exchanges import exchange
from .spec import Array, Command, Declaration, Disclosure, Example, Option

_OPTIONS = (
    rounds("communication rounds"),
    Option("--kernel", "GP kernel", {"choices": ("rbf", "matern")}, param="kernel"),
    Option("--ard", "one lengthscale per feature", {"action": "store_const", "const": True}, param="ard"),
)


def _build(args):
    from ..gp import FGPR

    # Newton steps after the rounds: the hyperparameters' intervals belong at the likelihood's maximum
    return FGPR(**given(args, _OPTIONS)), {}


def _header(args, res, runtime: float) -> str:
    ard = ", ARD" if res.options["ard"] else ""
    return (
        f"FGPR ({res.options['kernel']}{ard}): {res.rounds} rounds, {len(res.clients)} clients, {runtime:.1f} s. "
        "Shared hyperparameters (outputscale and noise are variances on each client's standardised scale):"
    )


def _extras(args, res, data, scaler) -> dict:
    return {
        "kernel": res.options["kernel"],
        "ard": bool(res.options["ard"]),
        "input_scaling": {"mean": scaler.mean.tolist(), "sd": scaler.sd.tolist()},
    }


FGPR = Declaration(
    "fgpr",
    "fedstats.gp:FGPR",
    "fedstats.gp:FGPRResult",
    "federated Gaussian process regression: shared hyperparameters, each client's GP on its own rows",
    (
        Disclosure(
            "FGPR",
            (
                exchange(
                    "row counts",
                    "CountShare",
                    "once, before the rounds",
                    (Array("n", "its row count N_k", "its row count"),),
                ),
                exchange(
                    "FGPR rounds",
                    "FGPRAlgorithm",
                    "every round",
                    (
                        Array(
                            "lengthscale",
                            "w_k g(lengthscale_k) (its weight times its hyperparameter in the averaging space)",
                            "its locally trained lengthscales",
                        ),
                        Array("outputscale", "the same for its output scale", "its locally trained output scale"),
                        Array("noise", "the same for its noise variance", "its locally trained noise variance"),
                    ),
                    "all",
                ),
                exchange(
                    "hyperparameter curvature",
                    "HessianShare",
                    "once after the rounds (unless laplace=False), and once per Newton step (newton_steps)",
                    (
                        Array(
                            "nll",
                            "its negative log marginal likelihood at the broadcast hyperparameters",
                            "how well they fit its rows",
                        ),
                        Array("gradient", "its gradient in the log hyperparameters", "its own pull on them"),
                        Array(
                            "hessian",
                            "its Hessian in the log hyperparameters (p x p)",
                            "how precisely its rows determine them",
                        ),
                    ),
                    "all",
                ),
            ),
            "sizes, step count, optimiser moments.",
            note="With ARD the lengthscale has `d` entries; a constant mean adds one more array.",
        ),
    ),
    Command(
        "fgpr",
        "federated Gaussian process regression",
        _OPTIONS,
        _build,
        _header,
        extras=_extras,
        new_clients="FGPR predicts a client from its own training rows",
        scale_inputs=True,
    ),
    reference="fedstats.gp:FGPR.fit_centralised",
    examples=(Example("fgpr", {"rounds": 3, "newton_steps": 5}, {"seed": 0, "progress": False}),),
    bad_parameter=("kernel", "cubic"),
)

DECLARATIONS = (FGPR,)
