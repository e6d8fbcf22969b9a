"""Metropolis-within-Gibbs over a device's tilted target (for sites with exact conditionals)."""

from __future__ import annotations

import numpy as np

from ...results import register
from ..gaussian import symmetrize
from .base import SiteModel, TiltedEstimator, TiltedResult
from .chains import chain_results
from .kernels import KERNELS, bucket, cavity_precision, pad_batch, prepare_stats, stack_stats


@register
class GibbsTilted(TiltedEstimator):
    """Metropolis-within-Gibbs on a tilted target whose coefficients and local scales have
    closed-form conditionals (the shrinkage site), vectorised over devices and chains.

    Each iteration (all devices and chains in lockstep, every step of fixed cost):

    1. adaptive random-walk Metropolis on (phi, the first ``model.mh_locals`` entries of z)
       with the coefficients integrated out (``model.log_collapsed``); the proposal
       covariance is the warm-up sample covariance (Haario et al. 2001) scaled to accept
       about 30%, both frozen after warm-up;
    2. the coefficients from their Gaussian conditional (``model.draw_theta``);
    3. the remaining locals from their conditional (``model.draw_locals``);
    4. when ``model.invariant_direction()`` gives a direction along which the likelihood is
       constant, a random-walk Metropolis step along it (an interweaving move: for the
       lasso it updates lambda with the prior variances held fixed).

    Steps 1-3 are a blocked Gibbs sampler of (phi, z_mh, theta) | z_rest and z_rest | rest,
    so (phi, z) keeps the collapsed tilted target of NUTS, and the moments of phi come out
    the same way: zero-variance control variates from the scores of that target at the
    kept draws, R-hat and ESS from the chains. NUTS in lockstep waits for the longest
    trajectory of the batch; these steps do not.

    Parameters
    ----------
    num_warmup, num_samples, num_chains, thin : int
        Per chain: ``num_warmup`` adaptation iterations, then ``num_samples`` kept draws,
        one every ``thin`` iterations.
    control_variates, precision_correction : bool
        As in :class:`NUTSTilted`.
    """

    name = "gibbs"
    sampled = True

    def __init__(
        self,
        *,
        num_warmup: int = 500,
        num_samples: int = 1000,
        num_chains: int = 4,
        thin: int = 4,
        control_variates: bool = True,
        precision_correction: bool = True,
    ) -> None:
        self.num_warmup, self.num_samples = int(num_warmup), int(num_samples)
        self.num_chains, self.thin = int(num_chains), int(thin)
        if min(self.num_warmup, self.num_samples, self.num_chains, self.thin) < 1:
            raise ValueError("num_warmup, num_samples, num_chains and thin must be >= 1")
        self.control_variates = bool(control_variates)
        self.precision_correction = bool(precision_correction)

    def __repr__(self) -> str:
        return (
            f"GibbsTilted(num_warmup={self.num_warmup}, num_samples={self.num_samples}, "
            f"num_chains={self.num_chains}, thin={self.thin})"
        )

    def check_model(self, model: SiteModel) -> None:
        missing = [a for a in ("draw_theta", "draw_locals", "mh_locals", "log_collapsed") if not hasattr(model, a)]
        if missing:
            raise ValueError(
                f"{type(model).__name__} has no {missing[0]!r}: the Gibbs estimator needs closed-form "
                "conditionals (the lasso and ridge sites have them); use 'nuts' or 'importance'"
            )

    def _compiled(self, model):
        import jax
        import jax.numpy as jnp

        key = ("gibbs", model.cache_key(), self.num_warmup, self.num_samples, self.thin)
        if key in KERNELS:
            return KERNELS[key]
        self.check_model(model)
        p, m = model.phi_dim, int(model.mh_locals)
        q = p + m
        v = model.invariant_direction() if hasattr(model, "invariant_direction") else None
        W, S, T = self.num_warmup, self.num_samples, self.thin

        def log_target(x, cav_mean, cav_prec, stats):
            dphi = x[:p] - cav_mean
            return -0.5 * dphi @ cav_prec @ dphi + model.log_collapsed(x[:p], x[p:], stats)

        def metropolis(key, x, lt, y, args):
            lty = log_target(y, *args)
            a = jnp.exp(jnp.minimum(0.0, jnp.nan_to_num(lty - lt, nan=-jnp.inf)))
            acc = jax.random.uniform(key, dtype=x.dtype) < a
            return jnp.where(acc, y, x), jnp.where(acc, lty, lt), a

        def step(carry, key, i, args, init_cov):
            x, lt, n, s1, s2, log_scale, log_step = carry
            ks = jax.random.split(key, 6)
            warm = i < W
            rate = (1.0 + i) ** -0.6
            emp = s2 / jnp.maximum(n, 1.0) - jnp.outer(s1, s1) / jnp.maximum(n, 1.0) ** 2
            cov = jnp.where(n > 10 * q, emp, init_cov) + 1e-10 * jnp.eye(q, dtype=x.dtype)
            L = jnp.linalg.cholesky(cov)
            y = x.at[:q].add(jnp.exp(log_scale) * L @ jax.random.normal(ks[0], (q,), dtype=x.dtype))
            x, lt, a = metropolis(ks[1], x, lt, y, args)
            log_scale = jnp.where(warm, log_scale + rate * (a - 0.3), log_scale)
            n, s1, s2 = (
                jnp.where(warm, n + 1, n),
                jnp.where(warm, s1 + x[:q], s1),
                jnp.where(warm, s2 + jnp.outer(x[:q], x[:q]), s2),
            )
            theta = model.draw_theta(x[:p], x[p:], args[2], ks[2])
            x = jnp.concatenate([x[:p], model.draw_locals(x[:p], theta, x[p:], args[2], ks[3])])
            lt = log_target(x, *args)
            if v is not None:
                y = x + jnp.exp(log_step) * jax.random.normal(ks[4], dtype=x.dtype) * jnp.asarray(v, dtype=x.dtype)
                x, lt, a2 = metropolis(ks[5], x, lt, y, args)
                log_step = jnp.where(warm, log_step + rate * (a2 - 0.44), log_step)
            return (x, lt, n, s1, s2, log_scale, log_step), a

        def one_chain(key, x0, cav_mean, cav_prec, cav_cov, stats):
            args = (cav_mean, cav_prec, prepare_stats(model, stats))
            init_cov = jnp.eye(q, dtype=x0.dtype) * 0.01
            init_cov = init_cov.at[:p, :p].set(0.25 * cav_cov)
            carry = (
                x0,
                log_target(x0, *args),
                jnp.zeros((), x0.dtype),
                jnp.zeros(q, x0.dtype),
                jnp.zeros((q, q), x0.dtype),
                jnp.log(2.38 / np.sqrt(q)),
                jnp.log(0.1),
            )
            kw, ks = jax.random.split(key)

            def warm_body(c, inp):
                c, _ = step(c, inp[0], inp[1], args, init_cov)
                return c, None

            carry, _ = jax.lax.scan(warm_body, carry, (jax.random.split(kw, W), jnp.arange(W)))

            def sample_body(c, k):
                def inner(j, ca):
                    c2, acc = ca
                    c2, a = step(c2, jax.random.fold_in(k, j), W, args, init_cov)
                    return c2, acc + a

                c, acc = jax.lax.fori_loop(0, T, inner, (c, jnp.zeros((), x0.dtype)))
                return c, (c[0], acc / T)

            _, (xs, acc) = jax.lax.scan(sample_body, carry, jax.random.split(ks, S))
            scores = jax.vmap(jax.grad(log_target), in_axes=(0, None, None, None))(xs, *args)
            return xs, scores, jnp.mean(acc)

        chains = jax.vmap(one_chain, in_axes=(0, 0, None, None, None, None))
        fn = jax.jit(jax.vmap(chains))
        KERNELS[key] = fn
        return fn

    def estimate(
        self,
        model: SiteModel,
        cavity_mean: np.ndarray,
        cavity_cov: np.ndarray,
        stats: list[dict[str, np.ndarray]],
        seeds: np.ndarray,
        *,
        keep_draws: bool = False,
    ) -> list[TiltedResult]:
        import jax

        B, p, C = len(stats), model.phi_dim, self.num_chains
        x0 = np.empty((B, C, p + model.local_dim))
        keys = np.empty((B, C, 2), dtype=np.uint32)
        for b in range(B):
            rng = np.random.default_rng(int(seeds[b]))
            _, z0 = model.init_local(stats[b])
            L = np.linalg.cholesky(symmetrize(cavity_cov[b]))
            for c in range(C):  # chains start over the cavity, so that R-hat can see poor mixing
                x0[b, c] = np.concatenate([cavity_mean[b] + 0.5 * L @ rng.standard_normal(p), z0])
            keys[b] = rng.integers(0, 2**32 - 1, size=(C, 2), dtype=np.uint32)
        fn = self._compiled(model)
        cav_prec, cavity_cov = cavity_precision(cavity_cov), np.asarray(cavity_cov)
        parts = []
        # Devices go in chunks of at most 8 (one compiled shape): XLA's CPU runtime was seen
        # to stall, idle, on one call with 64 or more chains of this kernel.
        for lo in range(0, B, 8):
            sl = slice(lo, min(lo + 8, B))
            nb = sl.stop - lo
            bp = bucket(nb)
            with jax.enable_x64(True):
                out = fn(
                    pad_batch(keys[sl], bp),
                    pad_batch(x0[sl], bp),
                    pad_batch(cavity_mean[sl], bp),
                    pad_batch(cav_prec[sl], bp),
                    pad_batch(cavity_cov[sl], bp),
                    stack_stats(stats[sl], bp),
                )
                parts.append([np.asarray(a)[:nb] for a in out])
        zs, scores, acc = (np.concatenate([pt[i] for pt in parts]) for i in range(3))
        return chain_results(
            zs,
            scores,
            p,
            0,
            control_variates=self.control_variates,
            precision_correction=self.precision_correction,
            keep_draws=keep_draws,
            extra={"acceptance": acc.mean(axis=-1)},
            label="Gibbs",
        )
