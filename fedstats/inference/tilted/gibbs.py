"""Metropolis-within-Gibbs over a device's tilted target (for sites with exact conditionals)."""

from __future__ import annotations

import numpy as np

from ...results import register
from ..gaussian import symmetrize
from .base import SiteModel, TiltedEstimator, TiltedResult
from .chains import chain_results
from .kernels import KERNELS, cavity_precision, jit_kernel, pad_batch, prepare_stats, stack_stats

#: chains in one call of the compiled kernel (devices x chains): larger batches run faster
#: per chain; each holds its path (state, coefficients, score per iteration: about 1 MB for
#: 30 predictors and the default lengths)
CHAINS_PER_CALL = 80


@register
class GibbsTilted(TiltedEstimator):
    """Metropolis-within-Gibbs on a tilted target whose coefficients and local scales have
    closed-form conditionals (the shrinkage site), vectorised over devices and chains.

    Each iteration (all devices and chains in lockstep, every step of fixed cost):

    1. adaptive random-walk Metropolis on (phi, the first ``model.mh_locals`` entries of z)
       with the coefficients integrated out (``model.collapsed_factor``); the proposal
       covariance is the warm-up sample covariance (Haario et al. 2001) scaled to accept
       about 30%, both frozen after warm-up;
    2. the coefficients from their Gaussian conditional (``model.draw_theta``, from the
       factor of the current point that step 1 computed or kept);
    3. the remaining locals from their conditional (``model.draw_locals``);
    4. when ``model.invariant_direction()`` gives a direction along which the likelihood is
       constant, a random-walk Metropolis step along it (an interweaving move: for the
       lasso it updates lambda with the prior variances held fixed); only the cavity and
       ``model.log_locals_prior`` change along it, so it factorises nothing.

    Two factorisations per iteration (the proposal's, and the current point's after step 3).
    Steps 1-3 are a blocked Gibbs sampler of (phi, z_mh, theta) | z_rest and z_rest | rest,
    so (phi, z) keeps the collapsed tilted target of NUTS, and the moments of phi come out
    the same way: zero-variance control variates from the scores of that target at the
    kept draws (computed inside the loop, where the batch is small, from the factor the
    iteration already has where the site can: ``model.collapsed_score``, 15% of the
    kernel's time at 30 predictors), R-hat and ESS from the chains. With ``keep_draws`` the coefficients drawn in step 2 come back as
    ``draws["theta_draw"]``: draws of the device's coefficient posterior, paired with the
    kept (phi, z). NUTS in lockstep waits for the longest trajectory of the batch; these
    steps do not. One call runs at most ``CHAINS_PER_CALL`` chains (devices in equal
    chunks: one compiled shape per fit), whose paths it holds in memory.

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
        num_warmup: int = 300,
        num_samples: int = 500,
        num_chains: int = 4,
        thin: int = 2,
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
        need = ["collapsed_factor", "draw_theta", "draw_locals", "mh_locals"]
        if hasattr(model, "invariant_direction"):
            need.append("log_locals_prior")
        missing = [a for a in need if not hasattr(model, a)]
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

        def cavity_term(x, cav_mean, cav_prec):
            dphi = x[:p] - cav_mean
            return -0.5 * dphi @ cav_prec @ dphi

        def target(x, cav_mean, cav_prec, stats):
            """(log target, the factor of theta's conditional) at x = (phi, z)."""
            value, factor = model.collapsed_factor(x[:p], x[p:], stats)
            return cavity_term(x, cav_mean, cav_prec) + value, factor

        def log_target(x, *args):
            return target(x, *args)[0]

        def score_at(x, factor, cav_mean, cav_prec, stats):
            """The gradient of the log target at x, whose factor (or that of a point with the
            same prior variances, such as x before step 4) is ``factor``."""
            if not hasattr(model, "collapsed_score"):
                return jax.grad(log_target)(x, cav_mean, cav_prec, stats)
            d_phi, d_z = model.collapsed_score(x[:p], x[p:], stats, factor)
            return jnp.concatenate([d_phi - cav_prec @ (x[:p] - cav_mean), d_z])

        def accept(key, lt, lty):
            a = jnp.exp(jnp.minimum(0.0, jnp.nan_to_num(lty - lt, nan=-jnp.inf)))
            return jax.random.uniform(key, dtype=lt.dtype) < a, a

        def step(carry, inp, args, init_cov):
            x, lt, factor, n, s1, s2, log_scale, log_step = carry
            key, i = inp
            ks = jax.random.split(key, 6)
            warm = i < W
            rate = (1.0 + i) ** -0.6
            # 1. (phi, z_mh) by adaptive random-walk Metropolis, theta integrated out
            emp = s2 / jnp.maximum(n, 1.0) - jnp.outer(s1, s1) / jnp.maximum(n, 1.0) ** 2
            cov = jnp.where(n > 10 * q, emp, init_cov) + 1e-10 * jnp.eye(q, dtype=x.dtype)
            L = jnp.linalg.cholesky(cov)
            y = x.at[:q].add(jnp.exp(log_scale) * L @ jax.random.normal(ks[0], (q,), dtype=x.dtype))
            lty, factor_y = target(y, *args)
            acc, a = accept(ks[1], lt, lty)
            x, lt = jnp.where(acc, y, x), jnp.where(acc, lty, lt)
            factor = jax.tree_util.tree_map(lambda new, old: jnp.where(acc, new, old), factor_y, factor)
            log_scale = jnp.where(warm, log_scale + rate * (a - 0.3), log_scale)
            n, s1, s2 = (
                jnp.where(warm, n + 1, n),
                jnp.where(warm, s1 + x[:q], s1),
                jnp.where(warm, s2 + jnp.outer(x[:q], x[:q]), s2),
            )
            # 2-3. theta from its conditional at the current point (its factor is at hand),
            # then the other locals given theta
            theta = model.draw_theta(factor, ks[2])
            x = jnp.concatenate([x[:p], model.draw_locals(x[:p], theta, x[p:], args[2], ks[3])])
            lt, factor = target(x, *args)
            if v is not None:
                # 4. along the invariant direction only the cavity and p(z) change, and the
                # factor stays that of x
                y = x + jnp.exp(log_step) * jax.random.normal(ks[4], dtype=x.dtype) * jnp.asarray(v, dtype=x.dtype)
                lty = (
                    lt
                    + cavity_term(y, *args[:2])
                    - cavity_term(x, *args[:2])
                    + model.log_locals_prior(y[:p], y[p:])
                    - model.log_locals_prior(x[:p], x[p:])
                )
                acc2, a2 = accept(ks[5], lt, lty)
                x, lt = jnp.where(acc2, y, x), jnp.where(acc2, lty, lt)
                log_step = jnp.where(warm, log_step + rate * (a2 - 0.44), log_step)
            # the score of a kept draw (for the control variates), here where the batch is
            # small; ``i`` is the same for every chain, so this stays a branch under vmap
            kept = (i >= W) & ((i - W) % T == T - 1)
            score = jax.lax.cond(kept, lambda x: score_at(x, factor, *args), jnp.zeros_like, x)
            return (x, lt, factor, n, s1, s2, log_scale, log_step), (x, theta, score, a)

        def one_chain(key, x0, cav_mean, cav_prec, cav_cov, stats):
            args = (cav_mean, cav_prec, prepare_stats(model, stats))
            init_cov = jnp.eye(q, dtype=x0.dtype) * 0.01
            init_cov = init_cov.at[:p, :p].set(0.25 * cav_cov)
            lt0, factor0 = target(x0, *args)
            carry = (
                x0,
                lt0,
                factor0,
                jnp.zeros((), x0.dtype),
                jnp.zeros(q, x0.dtype),
                jnp.zeros((q, q), x0.dtype),
                jnp.log(2.38 / np.sqrt(q)),
                jnp.log(0.1),
            )
            # one scan over warm-up and sampling (the step is compiled once); every T-th
            # state after warm-up is kept
            n_iter = W + S * T
            _, (path, thetas, scores, acc) = jax.lax.scan(
                lambda c, inp: step(c, inp, args, init_cov), carry, (jax.random.split(key, n_iter), jnp.arange(n_iter))
            )
            kept = slice(W + T - 1, None, T)
            return path[kept], thetas[kept], scores[kept], jnp.mean(acc[W:])

        # one batch axis over (device, chain) pairs: half the tracing of a vmap over chains
        # inside a vmap over devices
        fn = jit_kernel(jax.vmap(one_chain))
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
        per_call = max(1, CHAINS_PER_CALL // C)
        size = -(-B // -(-B // per_call))
        for lo in range(0, B, size):
            sl = slice(lo, min(lo + size, B))
            nb = sl.stop - lo
            per_chain = lambda a: np.repeat(pad_batch(a, size), C, axis=0)  # noqa: E731
            with jax.enable_x64(True):
                out = fn(
                    pad_batch(keys[sl], size).reshape(size * C, 2),
                    pad_batch(x0[sl], size).reshape(size * C, -1),
                    per_chain(cavity_mean[sl]),
                    per_chain(cav_prec[sl]),
                    per_chain(cavity_cov[sl]),
                    {k: np.repeat(v, C, axis=0) for k, v in stack_stats(stats[sl], size).items()},
                )
                parts.append([np.asarray(a).reshape(size, C, *a.shape[1:])[:nb] for a in out])
        zs, thetas, scores, acc = (np.concatenate([pt[i] for pt in parts]) for i in range(4))
        out = chain_results(
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
        if keep_draws:
            # the coefficients the sampler drew from their conditional at each kept draw's
            # (phi, z_mh): draws of the device posterior of theta, paired with the draws of
            # phi (what coefficient_posterior would otherwise draw afresh)
            for r, th in zip(out, thetas):
                if r.draws is not None:
                    r.draws["theta_draw"] = th.reshape(-1, th.shape[-1])
        return out
