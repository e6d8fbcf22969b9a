"""Multi-fidelity test functions of the FGPR paper (its Application I, Section 5, and the test
functions of its appendix; the 1-D pairs come from Cutajar et al., 2019).

Each problem is a :class:`Problem`: its fidelities from highest to lowest (``"HF"``,
then ``"MF"`` where there is one, then ``"LF"``), its input box, and the paper's training
sizes per fidelity. Every function takes ``X`` of shape ``(n, d)`` in the problem's original
units and returns ``(n,)``.

The paper's formulas are the default. ``code_compat=True`` gives the published R code's
variants where it departs from them: BRANIN's middle fidelity without the square
root, BRANIN's low fidelity taking ``-3 x2`` at the transformed input, and Hartmann with the
usual minus sign.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .._deprecation import renamed_attribute

__all__ = [
    "Problem",
    "PROBLEMS",
    "problem",
    "currin",
    "park",
    "branin",
    "hartmann3",
    "borehole",
    "linear_1d",
    "nonlinear_1d",
    "forrester",
    "FORRESTER_DESIGN",
]


def _cols(X, d):
    X = np.asarray(X, dtype=float)
    X = X[:, None] if X.ndim == 1 else X
    if X.ndim != 2 or X.shape[1] != d:
        raise ValueError(f"X must have shape (n, {d}), got {np.shape(X)}")
    return [X[:, j] for j in range(d)]


# --------------------------------------------------------------------------- CURRIN (2-D)


def currin_hf(X):
    x1, x2 = _cols(X, 2)
    with np.errstate(divide="ignore"):
        factor = 1 - np.where(x2 > 0, np.exp(-1 / (2 * np.where(x2 > 0, x2, 1))), 0.0)
    return factor * (2300 * x1**3 + 1900 * x1**2 + 2092 * x1 + 60) / (100 * x1**3 + 500 * x1**2 + 4 * x1 + 20)


def currin_lf(X):
    x1, x2 = _cols(X, 2)
    lo = np.maximum(0, x2 - 0.05)
    f = lambda a, b: currin_hf(np.column_stack([a, b]))  # noqa: E731
    return 0.25 * (f(x1 + 0.05, x2 + 0.05) + f(x1 + 0.05, lo)) + 0.25 * (f(x1 - 0.05, x2 + 0.05) + f(x1 - 0.05, lo))


# --------------------------------------------------------------------------- PARK (4-D)


def park_hf(X):
    x1, x2, x3, x4 = _cols(X, 4)
    return (x1 / 2) * (np.sqrt(1 + (x2 + x3**2) * x4 / x1**2) - 1) + (x1 + 3 * x4) * np.exp(1 + np.sin(x3))


def park_lf(X):
    x1, x2, x3, x4 = _cols(X, 4)
    return (1 + np.sin(x1) / 10) * park_hf(X) - 2 * x1 + x2**2 + x3**2 + 0.5


# --------------------------------------------------------------------------- BRANIN (2-D, 3 fidelities)


def branin_hf(X):
    x1, x2 = _cols(X, 2)
    return (-1.275 * x1**2 / np.pi**2 + 5 * x1 / np.pi + x2 - 6) ** 2 + (10 - 5 / (4 * np.pi)) * np.cos(x1) + 10


def branin_mf(X, code_compat: bool = False):
    x1, x2 = _cols(X, 2)
    h = branin_hf(np.column_stack([x1 - 2, x2 - 2]))
    return 10 * (h if code_compat else np.sqrt(h)) + 2 * (x1 - 0.5) - 3 * (3 * x2 - 1) - 1


def branin_lf(X, code_compat: bool = False):
    x1, x2 = _cols(X, 2)
    Z = 1.2 * (np.column_stack([x1, x2]) + 2)
    return branin_mf(Z, code_compat) - 3 * (Z[:, 1] if code_compat else x2) + 1


# --------------------------------------------------------------------------- Hartmann-3D (3 fidelities)

_H_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_H_DELTA = np.array([0.01, -0.01, -0.1, 0.1])
_H_A = np.array([[3, 10, 30], [0.1, 10, 35], [3, 10, 30], [0.1, 10, 35]], dtype=float)
_H_P = np.array(
    [[0.3689, 0.1170, 0.2673], [0.4699, 0.4387, 0.7470], [0.1091, 0.8732, 0.5547], [0.0381, 0.5743, 0.8828]]
)


def hartmann3(X, t: int = 3, code_compat: bool = False):
    """Fidelity ``t`` in {1, 2, 3} (3 is the highest): ``sum_i alpha_t,i exp(-sum_j A_ij (x_j - P_ij)^2)``
    with ``alpha_t = alpha + (3 - t) delta``; ``code_compat`` negates it (the usual sign)."""
    if t not in (1, 2, 3):
        raise ValueError(f"t must be 1, 2 or 3, got {t!r}")
    X = np.column_stack(_cols(X, 3))
    alpha = _H_ALPHA + (3 - t) * _H_DELTA
    inner = ((X[:, None, :] - _H_P[None]) ** 2 * _H_A[None]).sum(-1)  # (n, 4)
    out = np.exp(-inner) @ alpha
    return -out if code_compat else out


# --------------------------------------------------------------------------- Borehole (8-D)


def _borehole(X, num, a):
    x1, x2, x3, x4, x5, x6, x7, x8 = _cols(X, 8)
    lg = np.log(x2 / x1)
    return num * np.pi * x3 * (x4 - x6) / (lg * (a + 2 * x7 * x3 / (lg * x1**2 * x8) + x3 / x5))


def borehole_hf(X):
    return _borehole(X, 2, 1.0)


def borehole_lf(X):
    return _borehole(X, 5, 1.5)


# --------------------------------------------------------------------------- 1-D examples


def linear_1d_hf(X):
    (x,) = _cols(X, 1)
    return (6 * x - 2) ** 2 * np.sin(12 * x - 4)


def linear_1d_lf(X):
    (x,) = _cols(X, 1)
    return 0.5 * linear_1d_hf(X) + 10 * (x - 0.5) + 5


def forrester_hf(X):
    """Forrester, Sobester and Keane's one-dimensional high fidelity on [0, 1] ("Multi-fidelity
    optimization via surrogate modelling", Proc. R. Soc. A 2007): ``(6x - 2)^2 sin(12x - 4)``,
    the same function as :func:`linear_1d_hf`."""
    return linear_1d_hf(X)


def forrester_lf(X):
    """Forrester et al.'s low fidelity ``A f_h(x) + B (x - 0.5) + C`` with their ``A = 0.5``,
    ``B = 10``, ``C = -5`` (:func:`linear_1d_lf` is Cutajar et al.'s variant, ``C = +5``)."""
    (x,) = _cols(X, 1)
    return 0.5 * forrester_hf(X) + 10 * (x - 0.5) - 5


#: the nested design of Forrester, Sobester and Keane ("Engineering Design via Surrogate
#: Modelling", 2008, Section 8.5): 11 equally spaced low-fidelity points and 4 high-fidelity
#: points among them
FORRESTER_DESIGN = {"HF": np.array([0.0, 0.4, 0.6, 1.0]), "LF": np.linspace(0.0, 1.0, 11)}


def nonlinear_1d_lf(X):
    (x,) = _cols(X, 1)
    return np.cos(15 * x)


def nonlinear_1d_hf(X):
    (x,) = _cols(X, 1)
    return x * np.exp(nonlinear_1d_lf(2 * x - 0.2)) - 1


# --------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """A multi-fidelity problem: ``fidelities`` maps "HF" ("MF") "LF" to functions, highest first."""

    name: str
    bounds: np.ndarray  # (d, 2) input box in original units
    fidelities: dict[str, Callable]  # highest fidelity first
    sizes: dict[str, int]  # the paper's training sizes per fidelity
    grid: bool = False  # 1-D examples: equally spaced inputs (the published code)
    low_open: tuple = field(default=())  # inputs sampled from (lo, hi] instead of [lo, hi)
    levels = renamed_attribute("fidelities")  # the former name, one release

    @property
    def d(self) -> int:
        return self.bounds.shape[0]

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` inputs uniform on the box (``x1`` of PARK kept away from 0)."""
        U = rng.uniform(size=(n, self.d))
        for j in self.low_open:
            U[:, j] = 1 - U[:, j]
        return self.bounds[:, 0] + U * (self.bounds[:, 1] - self.bounds[:, 0])

    def to_unit(self, X) -> np.ndarray:
        """Map inputs affinely from the box to [0, 1]^d (the paper does not say how it scales
        inputs; on Borehole the choice decides the result)."""
        return (np.asarray(X, dtype=float) - self.bounds[:, 0]) / (self.bounds[:, 1] - self.bounds[:, 0])


def _box(*pairs):
    return np.array(pairs, dtype=float)


def problem(name: str, code_compat: bool = False) -> Problem:
    """The problem ``name`` (see :data:`PROBLEMS`), with the published code's variants when
    ``code_compat``."""
    key = name.lower()
    if key == "currin":
        return Problem("CURRIN", _box((0, 1), (0, 1)), {"HF": currin_hf, "LF": currin_lf}, {"HF": 40, "LF": 200})
    if key == "park":
        return Problem(
            "PARK",
            _box((0, 1), (0, 1), (0, 1), (0, 1)),
            {"HF": park_hf, "LF": park_lf},
            {"HF": 50, "LF": 300},
            low_open=(0,),
        )
    if key == "branin":
        return Problem(
            "BRANIN",
            _box((-5, 10), (0, 15)),
            {"HF": branin_hf, "MF": lambda X: branin_mf(X, code_compat), "LF": lambda X: branin_lf(X, code_compat)},
            {"HF": 20, "MF": 40, "LF": 200},
        )
    if key in ("hartmann", "hartmann3", "hartmann-3d"):
        return Problem(
            "Hartmann-3D",
            _box((0, 1), (0, 1), (0, 1)),
            {
                "HF": lambda X: hartmann3(X, 3, code_compat),
                "MF": lambda X: hartmann3(X, 2, code_compat),
                "LF": lambda X: hartmann3(X, 1, code_compat),
            },
            {"HF": 50, "MF": 100, "LF": 200},
        )
    if key == "borehole":
        return Problem(
            "Borehole",
            _box(
                (0.05, 0.15),
                (100, 50000),
                (63070, 115600),
                (990, 1110),
                (63.1, 115),
                (700, 820),
                (1120, 1680),
                (9855, 12045),
            ),
            {"HF": borehole_hf, "LF": borehole_lf},
            {"HF": 50, "LF": 200},
        )
    if key == "linear_1d":
        return Problem(
            "linear 1-D", _box((0, 1)), {"HF": linear_1d_hf, "LF": linear_1d_lf}, {"HF": 20, "LF": 100}, grid=True
        )
    if key == "nonlinear_1d":
        return Problem(
            "nonlinear 1-D",
            _box((0, 2)),
            {"HF": nonlinear_1d_hf, "LF": nonlinear_1d_lf},
            {"HF": 20, "LF": 100},
            grid=True,
        )
    if key == "forrester":  # fidelity_data spaces each fidelity evenly; FORRESTER_DESIGN is the book's
        return Problem(
            "Forrester", _box((0, 1)), {"HF": forrester_hf, "LF": forrester_lf}, {"HF": 4, "LF": 11}, grid=True
        )
    raise ValueError(f"unknown problem {name!r}; choose one of {PROBLEMS}")


PROBLEMS = ("currin", "park", "branin", "hartmann", "borehole", "linear_1d", "nonlinear_1d", "forrester")

# short aliases of the high-fidelity functions
currin, park, branin, borehole = currin_hf, park_hf, branin_hf, borehole_hf
linear_1d, nonlinear_1d, forrester = linear_1d_hf, nonlinear_1d_hf, forrester_hf
