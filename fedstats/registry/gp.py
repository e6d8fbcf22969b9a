"""The Gaussian-process models' declarations: FGPR and the multi-fidelity chains."""

from __future__ import annotations

from .common import given, rounds
from .exchanges import exchange
from .spec import Array, Command, Declaration, Disclosure, Example, Expect, Option

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
    reference="fedstats.gp:FGPR.fit_centralized",
    examples=(
        Example(
            "fgpr",
            {"rounds": 3, "newton_steps": 5},
            {"seed": 0, "progress": False},
            # the Laplace approximation of its hyperparameters; a new client predicted from its own rows
            expect=Expect((True, False), "predict", "data", client_rows=False, bands=True),
            long={"rounds": 12, "participation": 5},
        ),
    ),
    bad_parameter=("kernel", "cubic"),
)

# --------------------------------------------------------------------------- multi-fidelity
_CHAIN = Disclosure(
    "FederatedAR1, FederatedNARGP",
    (
        exchange(
            "chain",
            "ChainFit",
            "every round, one fidelity's client per round (ask, answer, fit; lowest fidelity first), then every fidelity's "
            "release",
            (
                Array("queries", "ask: its inputs (design points)", "where its rows are, not its outputs"),
                Array(
                    "mean",
                    "answer: its predictive means at the asking fidelity's inputs (NARGP: per path)",
                    "its fitted function there, given the fidelities below",
                ),
                Array("var", "answer: the predictive variances there", "see `mean`"),
                Array("n", "release: its row count", "its row count"),
                Array("mu", "release: its outputs' mean", "its outputs' mean"),
                Array("sd", "release: its outputs' sd", "its outputs' sd"),
                Array(
                    "rho",
                    "release (AR1): its link to the fidelity below",
                    "how its outputs follow the lower fidelity's",
                ),
                Array("lengthscale", "release: its GP's lengthscales", "its fitted hyperparameters"),
                Array("outputscale", "release: its GP's output scale", "see `lengthscale`"),
                Array("noise", "release: its GP's noise variance", "see `lengthscale`"),
            ),
        ),
    ),
    "nothing (its fitted fidelity stays on its node: its release was its last reply).",
    note="Each reply holds every array, empty where the round's task has none. The queries after the fit "
    "(`predict`, `fidelity_moments`, `to_botorch`) travel the chain in process, not as runs: the query points go "
    "down, the fidelities' moments come up (`query_communication`).",
)
_GP = "fedstats.gp"
AR1 = Declaration(
    "ar1",
    f"{_GP}.multifidelity:AR1CoKriging",
    f"{_GP}.ar1_result:AR1Result",
    "autoregressive multi-fidelity co-kriging, centralised (every fidelity's rows in one place)",
)
FEDERATED_AR1 = Declaration(
    "federated-ar1",
    f"{_GP}.multifidelity:FederatedAR1",
    f"{_GP}.ar1_result:FederatedAR1Result",
    "autoregressive multi-fidelity co-kriging with one fidelity per client, equal to the centralised fit",
    (_CHAIN,),
    reference=f"{_GP}.multifidelity:AR1CoKriging",
)
NARGP = Declaration(
    "nargp",
    f"{_GP}.nargp:NARGP",
    f"{_GP}.nargp_result:NARGPResult",
    "nonlinear autoregressive multi-fidelity GP, centralised",
)
FEDERATED_NARGP = Declaration(
    "federated-nargp",
    f"{_GP}.nargp:FederatedNARGP",
    f"{_GP}.nargp_result:FederatedNARGPResult",
    "nonlinear autoregressive multi-fidelity GP with one fidelity per client, equal to the centralised fit",
    (_CHAIN,),
    reference=f"{_GP}.nargp:NARGP",
)

DECLARATIONS = (FGPR, AR1, FEDERATED_AR1, NARGP, FEDERATED_NARGP)
