"""Variable selection and posterior tests of the federated lasso and ridge (Section 4.3 of the
linear-models paper): the mixin :class:`_Selection` of :class:`~fedstats.linear.ShrinkageResult`
and :class:`~fedstats.linear.CentralizedShrinkageResult`."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
from scipy import stats as st

if TYPE_CHECKING:
    from ..inference.posterior import GaussianPosterior, SamplePosterior

    class _SelectionHost(Protocol):
        """What :class:`_Selection` needs of the result it is mixed into."""

        @property
        def feature_names(self) -> list[str]: ...

        @property
        def clients(self) -> list: ...

        def client_posterior(self, client: Hashable) -> GaussianPosterior | SamplePosterior: ...

        def _penalised(self) -> list[str]: ...


class _Selection:
    """Selection by credible intervals and posterior tests; needs ``clients``,
    ``client_posterior(c)`` and ``feature_names`` (the intercept is never tested)."""

    def _penalised(self: _SelectionHost) -> list[str]:
        return [n for n in self.feature_names if n != "intercept"]

    def selected(self: _SelectionHost, level: float = 0.9, kind: str = "eti") -> pd.DataFrame:
        """Per client and predictor: mean, sd, interval at ``level``, p_value and
        ``selected`` (the interval excludes 0)."""
        frames = []
        for c in self.clients:
            s = self.client_posterior(c).summary(level=level, kind=kind).loc[self._penalised()]
            s = s[["mean", "sd", "lower", "upper", "p_value"]].rename_axis("parameter").reset_index()
            s["selected"] = (s["lower"] > 0) | (s["upper"] < 0)
            s.insert(0, "client", c)
            frames.append(s)
        return pd.concat(frames, ignore_index=True)

    def test(
        self: _SelectionHost,
        level: float = 0.9,
        names: Sequence[str] | None = None,
        clients: Iterable[Hashable] | None = None,
    ) -> pd.DataFrame:
        """Posterior tests of each coefficient's sign, per client.

        Columns: ``p_positive`` = P(beta > 0 | data), ``p_negative``, ``p_value`` = p_B =
        2 min(p_positive, p_negative) (the two-sided posterior tail probability) and
        ``reject`` = p_B < 1 - level, which holds exactly when the equal-tailed interval at
        ``level`` excludes 0.
        """
        names = self._penalised() if names is None else list(names)
        rows = []
        for c in self.clients if clients is None else clients:
            post = self.client_posterior(c)
            idx = [post.names.index(n) for n in names]
            pos = post.prob_positive()[idx]
            neg = 1.0 - pos  # draws exactly at 0 count half on each side
            pb = post.tail_probability()[idx]
            for n, a, b, p in zip(names, pos, neg, pb):
                rows.append(
                    {
                        "client": c,
                        "parameter": n,
                        "p_positive": float(a),
                        "p_negative": float(b),
                        "p_value": float(p),
                        "reject": bool(p < 1 - level),
                    }
                )
        return pd.DataFrame(rows)

    def joint_test(self: _SelectionHost, names: Sequence[str], client: Hashable, level: float = 0.9) -> dict[str, Any]:
        """Is beta = 0 for a group of coefficients credible at ``level``?

        With m and C the posterior mean and covariance of the group (size g), the Gaussian
        approximation's ``level`` credible ellipsoid is ``{b: (b - m)^T C^-1 (b - m) <=
        chi2_g(level)}``. Returns the statistic ``m^T C^-1 m``, ``p_value`` = the posterior
        mass of the Gaussian approximation outside the ellipsoid through 0
        (``1 - F_chi2_g(stat)``), and ``reject`` = 0 lies outside the ellipsoid
        (``p_value < 1 - level``). For g = 1 it is the Gaussian version of p_B.
        """
        names = list(names)
        post = self.client_posterior(client)
        missing = [n for n in names if n not in post.names]
        if missing or not names:
            raise ValueError(f"unknown coefficient(s) {missing}; choose from {self._penalised()}")
        idx = [post.names.index(n) for n in names]
        m, C = post.mean[idx], post.cov[np.ix_(idx, idx)]
        stat = float(m @ np.linalg.solve(C, m))
        p = float(st.chi2.sf(stat, df=len(idx)))
        return {
            "client": client,
            "names": names,
            "statistic": stat,
            "df": len(idx),
            "p_value": p,
            "reject": p < 1 - level,
        }
