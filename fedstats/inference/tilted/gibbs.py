"""Metropolis-within-Gibbs over a client's tilted target (for sites with exact conditionals)."""

from __future__ import annotations

import numpy as np

from ...result_file import register
from ..gaussian import symmetrize
from .base import SiteModel, TiltedEstimator, TiltedResult
from .chains import chain_results
from .kernels import KERNELS, cavity_precision, jit_kernel, pad_batch, prepare_stats, stack_stats

#: chains in one call of the compiled kernel (clients x chains): larger batches run faster
#: per chain; each holds its kept draws (state, coefficients and their conditional mean,
#: score: about 0.5 MB for 30 predictors and the default lengths)
CHAINS_PER_CALL = 80


@register
class GibbsTilted(TiltedEstimator):
    """Metropolis-within-Gibbs on a tilted target whose coefficients and local scales have
    closed-form conditionals (the shrinkage site), vectorised over clients and chains.

    Each iteration (all clients and chains in lockstep, every step of fixed cost):

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
    kernel's time at 30 predictors), R-hat and ESS from the chains. With ``keep_draws``,
    ``draws["theta_draw"]`` holds the coefficients drawn from their conditional at each kept
    (phi, z), and, where the site gives that conditional's mean (``model.theta_mean``), their
    reflections through it, each with its (phi, z) again: antithetic pairs, so the client's
    posterior mean of the coefficients is the average of the conditional means
    (Rao-Blackwellised; on Table 2's Case III this took the largest difference from pooled
    NUTS over 620 client coefficients from 0.08-0.12 sd to 0.051-0.056 over seven seeds). NUTS in
    lockstep waits for the longest trajectory of the batch; these steps do not. One call runs at most ``CHAINS_PER_CALL`` chains (clients in equal
    chunks: one compiled shape per fit), whose paths it holds in memory.

    A client's chains continue in its next call from where they stopped (``resume``, the
    ``state`` of its last result, which EP keeps on the client): a warm start, with
    ``resume_warmup`` adaptation iterations from the proposal they had (its scale adapted
    further, its covariance kept), instead of ``num_warmup`` from the cavity. The proposal is
    frozen after the warm-up. (50 iterations were too few after an undamped EP step: R-hat
    up to 1.08 and ESS 59-95 on Table 2's Case II; 150 gave 1.01 and 350-520.)

    Parameters
    ----------
    num_warmup, num_samples, num_chains, thin : int
        Per chain: ``num_warmup`` adaptation iterations, then ``num_samples`` kept draws,
        one every ``thin`` iterations.
    resume_warmup : int
        Adaptation iterations of a warm start.
    control_variates, precision_correction : bool
        As in :class:`NUTSTilted`.
    """

    name = "gibbs"
    sampled = True
    resumable = True

    def __init__(
        self,
        *,
        num_warmup: int = 300,
        num_samples: int = 500,
        num_chains: int = 4,
        thin: int = 2,
        resume_warmup: int = 150,
        control_variates: bool = True,
        precision_correction: bool = True,
    ) -> None:
        self.num_warmup, self.num_samples = int(num_warmup), int(num_samples)
        self.num_chains, self.thin = int(num_chains), int(thin)
        self.resume_warmup = int(resume_warmup)
        if min(self.num_warmup, self.num_samples, self.num_chains, self.thin) < 1:
            raise ValueError("num_warmup, num_samples, num_chains and thin must be >= 1")
        if self.resume_warmup < 0:
            raise ValueError("resume_warmup must be >= 0")
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

        key = ("gibbs", model.cache_key(), self.num_samples, self.thin)
        if key in KERNELS:
            return KERNELS[key]
        self.check_model(model)
        p, m = model.phi_dim, int(model.mh_locals)
        q = p + m
        v = model.invariant_direction() if hasattr(model, "invariant_direction") else None
        S, T = self.num_samples, self.thin
        d = model.theta_dim

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

        def step(carry, key, i, args, L0, n_warm, adapted):
            """One iteration; the first ``n_warm`` adapt the proposal (after them it is fixed)."""
            x, lt, factor, n, s1, s2, log_scale, log_step = carry
            ks = jax.random.split(key, 6)
            warm = i < n_warm
            rate = (1.0 + adapted + i) ** -0.6  # Robbins-Monro, continued over a chain's calls
            # 1. (phi, z_mh) by adaptive random-walk Metropolis, theta integrated out
            L = jnp.linalg.cholesky(proposal_cov(n, s1, s2, L0, adapted))
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
            return (x, lt, factor, n, s1, s2, log_scale, log_step), a

        def proposal_cov(n, s1, s2, L0, adapted):
            """A cold chain's running sample covariance once there are 10 q points, else
            ``L0 L0^T`` (a warm chain keeps the covariance it adapted in its first call: a
            short warm-up's few correlated points would estimate it poorly)."""
            emp = s2 / jnp.maximum(n, 1.0) - jnp.outer(s1, s1) / jnp.maximum(n, 1.0) ** 2
            use = (n > 10 * q) & (adapted == 0)
            return jnp.where(use, emp, L0 @ L0.T) + 1e-10 * jnp.eye(q, dtype=L0.dtype)

        def one_chain(key, x0, cav_mean, cav_prec, stats, log_scale, log_step, L0, n_warm, adapted):
            """A chain from x0 and the proposal (scale, step, factor L0): ``n_warm`` adapting
            iterations (traced, the same for every chain of a call: a warm start runs fewer
            with the same compiled kernel), then ``S * T`` more, every T-th kept."""
            args = (cav_mean, cav_prec, prepare_stats(model, stats))
            lt0, factor0 = target(x0, *args)
            zero = jnp.zeros((), x0.dtype)
            chain = (x0, lt0, factor0, zero, jnp.zeros(q, x0.dtype), jnp.zeros((q, q), x0.dtype), log_scale, log_step)
            D = x0.shape[0]
            kept = tuple(jnp.zeros((S, k), x0.dtype) for k in (D, d, d, D))  # state, theta, its mean, score

            def at_kept(x, factor, k_theta):
                """At a kept draw x: the score of the target (control variates), and the
                coefficients drawn from their conditional given x, with its mean (the factor
                of x's prior variances is at hand: step 4 keeps them)."""
                centre = model.theta_mean(factor) if hasattr(model, "theta_mean") else jnp.zeros(d, x.dtype)
                return score_at(x, factor, *args), model.draw_theta(factor, k_theta), centre

            def skipped(x, factor, k_theta):
                return jnp.zeros_like(x), jnp.zeros(d, x.dtype), jnp.zeros(d, x.dtype)

            def body(i, c):
                chain, kept, acc = c
                k_step, k_theta = jax.random.split(jax.random.fold_in(key, i))
                chain, a = step(chain, k_step, i, args, L0, n_warm, adapted)
                j = i - n_warm  # sampling iteration
                # ``i`` and ``n_warm`` are the same for every chain: a branch under vmap
                score, theta, centre = jax.lax.cond(
                    (j >= 0) & (j % T == T - 1), at_kept, skipped, chain[0], chain[2], k_theta
                )
                # every iteration writes its block's slot, and a block's last (kept) one stays
                slot = jnp.clip(j // T, 0, S - 1)
                kept = tuple(b.at[slot].set(val) for b, val in zip(kept, (chain[0], theta, centre, score)))
                return chain, kept, acc + jnp.where(j >= 0, a, 0.0)

            chain, (path, thetas, centres, scores), acc = jax.lax.fori_loop(
                0, n_warm + S * T, body, (chain, kept, jnp.zeros((), x0.dtype))
            )
            L = jnp.linalg.cholesky(proposal_cov(*chain[3:6], L0, adapted))
            end = {"x": chain[0], "log_scale": chain[6], "log_step": chain[7], "L": L, "adapted": adapted + n_warm}
            return path, thetas, centres, scores, acc / (S * T), end

        # one batch axis over (client, chain) pairs: half the tracing of a vmap over chains
        # inside a vmap over clients
        fn = jit_kernel(jax.vmap(one_chain, in_axes=(0, 0, 0, 0, 0, 0, 0, 0, None, 0)))
        KERNELS[key] = fn
        return fn

    def _chunk(self, B: int) -> int:
        """Clients per call of the kernel for a batch of ``B``: at most ``CHAINS_PER_CALL``
        chains, in equal chunks."""
        per_call = max(1, CHAINS_PER_CALL // self.num_chains)
        return -(-B // -(-B // per_call))

    def _starts(self, model, cavity_mean, cavity_cov, stats, seeds, resume):
        """Per client and chain: the key, the start, the proposal (log scale, log step along
        the invariant direction, factor of the covariance) and the warm-up length. A client
        whose ``resume`` state fits continues from it with ``resume_warmup`` iterations; the
        others start over the cavity (so that R-hat can see poor mixing) with ``num_warmup``."""
        B, p, C = len(stats), model.phi_dim, self.num_chains
        D, q = p + model.local_dim, p + int(model.mh_locals)
        x0, keys = np.empty((B, C, D)), np.empty((B, C, 2), dtype=np.uint32)
        log_scale, log_step = np.full((B, C), np.log(2.38 / np.sqrt(q))), np.full((B, C), np.log(0.1))
        L0, warm = np.empty((B, C, q, q)), np.zeros(B, dtype=bool)
        adapted = np.zeros((B, C))  # adaptation iterations before this call
        for b in range(B):
            rng = np.random.default_rng(int(seeds[b]))
            keys[b] = rng.integers(0, 2**32 - 1, size=(C, 2), dtype=np.uint32)
            st = resume[b] if resume is not None else None
            if st is not None and np.shape(st["x"]) == (C, D) and np.shape(st["L"]) == (C, q, q) and "adapted" in st:
                x0[b], log_scale[b], log_step[b], L0[b] = st["x"], st["log_scale"], st["log_step"], st["L"]
                warm[b], adapted[b] = True, st["adapted"]
                continue
            _, z0 = model.init_local(stats[b])
            L = np.linalg.cholesky(symmetrize(cavity_cov[b]))
            for c in range(C):
                x0[b, c] = np.concatenate([cavity_mean[b] + 0.5 * L @ rng.standard_normal(p), z0])
            init = np.eye(q) * 0.01
            init[:p, :p] = 0.25 * cavity_cov[b]
            L0[b] = np.linalg.cholesky(symmetrize(init))
        return (keys, x0, log_scale, log_step, L0, adapted), warm

    def estimate(
        self,
        model: SiteModel,
        cavity_mean: np.ndarray,
        cavity_cov: np.ndarray,
        stats: list[dict[str, np.ndarray]],
        seeds: np.ndarray,
        *,
        keep_draws: bool = False,
        resume: list[dict[str, np.ndarray] | None] | None = None,
    ) -> list[TiltedResult]:
        import jax

        B, p, C = len(stats), model.phi_dim, self.num_chains
        starts, warm = self._starts(model, cavity_mean, np.asarray(cavity_cov), stats, seeds, resume)
        fn = self._compiled(model)
        cav_prec = cavity_precision(cavity_cov)
        size = self._chunk(B)  # clients per call, the same for cold and warm calls (one compiled shape)
        got: list = [None] * B
        # cold clients and warm ones in separate calls: each call's warm-up length is one
        # number, and a client's result does not depend on the others of its batch
        for is_warm in (False, True):
            todo = np.flatnonzero(warm == is_warm)
            for lo in range(0, len(todo), size):
                sel = todo[lo : lo + size]
                per_chain = lambda a: np.repeat(pad_batch(a[sel], size), C, axis=0)  # noqa: E731
                chains = lambda a: pad_batch(a[sel], size).reshape(size * C, *a.shape[2:])  # noqa: E731
                keys, x0, log_scale, log_step, L0, adapted = (chains(a) for a in starts)
                with jax.enable_x64(True):
                    out = fn(
                        keys,
                        x0,
                        per_chain(cavity_mean),
                        per_chain(cav_prec),
                        {k: np.repeat(v, C, axis=0) for k, v in stack_stats([stats[i] for i in sel], size).items()},
                        log_scale,
                        log_step,
                        L0,
                        np.int32(self.resume_warmup if is_warm else self.num_warmup),
                        adapted,
                    )
                    out = jax.tree_util.tree_map(lambda a: np.asarray(a).reshape(size, C, *a.shape[1:]), out)
                for j, b in enumerate(sel):
                    got[b] = jax.tree_util.tree_map(lambda a: a[j], out)  # noqa: B023
        zs, thetas, centres, scores, acc = (np.stack([g[i] for g in got]) for i in range(5))
        ends = {k: np.stack([g[5][k] for g in got]) for k in got[0][5]}
        n_warm = np.where(warm, self.resume_warmup, self.num_warmup).astype(float)
        out = chain_results(
            zs,
            scores,
            p,
            0,
            control_variates=self.control_variates,
            precision_correction=self.precision_correction,
            keep_draws=keep_draws,
            extra={"acceptance": acc.mean(axis=-1), "warmup": n_warm},
            label="Gibbs",
        )
        for b, r in enumerate(out):  # where each client's chains stopped: its next call continues there
            if r.ok:
                r.state = {k: v[b].copy() for k, v in ends.items()}
        if keep_draws:
            # the coefficients the sampler drew from their conditional at each kept draw's
            # (phi, z_mh), and their reflections through the conditional's mean (antithetic
            # pairs: where the site gives that mean, ``model.theta_mean``): draws of the
            # client posterior of theta, each pair with its draw of (phi, z), whose average is
            # the Rao-Blackwellised mean (the average of the conditional means)
            for r, th, mu in zip(out, thetas, centres):
                if r.draws is not None:
                    th, mu = th.reshape(-1, th.shape[-1]), mu.reshape(-1, mu.shape[-1])
                    if hasattr(model, "theta_mean"):
                        r.draws = {k: np.concatenate([a, a]) for k, a in r.draws.items()}
                        th = np.concatenate([th, 2 * mu - th])
                    r.draws["theta_draw"] = th
        return out
