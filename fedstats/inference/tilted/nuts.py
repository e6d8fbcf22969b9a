"""NumPyro NUTS over a client's tilted target, chains and clients vectorised."""

from __future__ import annotations

import numpy as np

from ...result_file import register
from ..gaussian import symmetrize
from .base import SiteModel, TiltedEstimator, TiltedResult
from .chains import chain_results
from .kernels import KERNELS, bucket, cavity_precision, pad_batch, prepare_stats, stack_stats


@register
class NUTSTilted(TiltedEstimator):
    """NumPyro NUTS on each client's tilted target, vectorised over clients and chains.

    Parameters
    ----------
    num_warmup, num_samples, num_chains : int
        Per client; the phi moments use all ``num_chains * num_samples`` draws.
    target : {"augmented", "collapsed"}
        ``augmented`` samples (phi, theta_k, z) as in the paper and its public code and
        keeps the phi draws; ``collapsed`` integrates theta_k out analytically (lower
        dimension, same phi marginal) when the model provides ``log_collapsed``.
    dense_mass : bool
        Adapt a dense mass matrix during warm-up.
    precision_correction : bool
        Without control variates: scale the estimated precision by ``(n - p - 2) / (n - 1)``
        with ``n`` the smallest effective sample size (the bias of inverting a noisy
        covariance).
    control_variates : bool
        Estimate the moments with zero-variance control variates built from the scores
        NUTS computes anyway (:func:`zero_variance_moments`): exact for a Gaussian tilted,
        and far less noisy near one. EP's sites are differences of nearly equal
        precisions, so this noise reduction is what makes sampled EP work for many clients.
    vectorize : {"all", "chains"}
        ``"all"`` vectorises clients and chains; ``"chains"`` runs the clients one after
        another, each with its chains vectorised. Vectorised NUTS moves in lockstep, every
        iteration as long as the longest trajectory in the batch, so "all" pays off only
        for cheap, similar targets; for targets whose trajectories differ in length across
        clients, "chains" is faster.
    """

    name = "nuts"
    sampled = True

    def __init__(
        self,
        *,
        num_warmup: int = 500,
        num_samples: int = 1000,
        num_chains: int = 4,
        target: str = "augmented",
        dense_mass: bool = True,
        target_accept_prob: float = 0.8,
        max_tree_depth: int = 8,
        precision_correction: bool = True,
        control_variates: bool = True,
        vectorize: str = "all",
    ) -> None:
        if target not in ("augmented", "collapsed"):
            raise ValueError(f"target must be 'augmented' or 'collapsed', not {target!r}")
        self.num_warmup, self.num_samples, self.num_chains = int(num_warmup), int(num_samples), int(num_chains)
        if min(self.num_warmup, self.num_samples, self.num_chains) < 1:
            raise ValueError("num_warmup, num_samples and num_chains must be >= 1")
        self.target = target
        self.dense_mass = bool(dense_mass)
        self.target_accept_prob = float(target_accept_prob)
        self.max_tree_depth = int(max_tree_depth)
        self.precision_correction = bool(precision_correction)
        self.control_variates = bool(control_variates)
        if vectorize not in ("chains", "all"):
            raise ValueError(f"vectorize must be 'chains' or 'all', not {vectorize!r}")
        self.vectorize = vectorize

    def __repr__(self) -> str:
        return (
            f"NUTSTilted(num_warmup={self.num_warmup}, num_samples={self.num_samples}, "
            f"num_chains={self.num_chains}, target={self.target!r})"
        )

    def _compiled(self, model):
        import jax
        import jax.numpy as jnp
        from numpyro.infer.hmc import hmc

        key = (
            "nuts",
            model.cache_key(),
            self.num_warmup,
            self.num_samples,
            self.target,
            self.vectorize,
            self.dense_mass,
            self.target_accept_prob,
            self.max_tree_depth,
        )
        if key in KERNELS:
            return KERNELS[key]
        p, d = model.phi_dim, model.theta_dim
        augmented = self.target == "augmented"
        W, S = self.num_warmup, self.num_samples

        def log_target(x, cav_mean, cav_prec, stats):
            phi = x[:p]
            dphi = phi - cav_mean
            lp = -0.5 * dphi @ cav_prec @ dphi
            if augmented:
                return lp + model.log_augmented(phi, x[p : p + d], x[p + d :], stats)
            return lp + model.log_collapsed(phi, x[p:], stats)

        def potential_gen(cav_mean, cav_prec, stats):
            return lambda x: -log_target(x, cav_mean, cav_prec, stats)

        init_kernel, sample_kernel = hmc(potential_fn_gen=potential_gen, algo="NUTS")

        def one_chain(key, x0, cav_mean, cav_prec, stats):
            args = (cav_mean, cav_prec, prepare_stats(model, stats))
            state = init_kernel(
                x0,
                num_warmup=W,
                dense_mass=self.dense_mass,
                target_accept_prob=self.target_accept_prob,
                max_tree_depth=self.max_tree_depth,
                model_args=args,
                rng_key=key,
            )

            def body(s, _):
                s = sample_kernel(s, model_args=args)
                return s, (s.z, -s.z_grad, s.diverging)  # score = -grad(potential)

            _, (zs, scores, div) = jax.lax.scan(body, state, None, length=W + S)
            return zs[W:], scores[W:], jnp.sum(div[W:])

        chains = jax.vmap(one_chain, in_axes=(0, 0, None, None, None))
        if self.vectorize == "all":  # cheap, similar targets (HM2's 9 dimensions at K = 100)
            fn = jax.jit(jax.vmap(chains))
        else:  # clients one after another, each client's chains in lockstep
            fn = jax.jit(lambda *args: jax.lax.map(lambda a: chains(*a), args))
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

        B, p, d, C = len(stats), model.phi_dim, model.theta_dim, self.num_chains
        Bp = bucket(B)
        x0 = np.empty((B, C, p + (d if self.target == "augmented" else 0) + model.local_dim))
        keys = np.empty((B, C, 2), dtype=np.uint32)
        for b in range(B):
            rng = np.random.default_rng(int(seeds[b]))
            theta0, z0 = model.init_local(stats[b])
            L = np.linalg.cholesky(symmetrize(cavity_cov[b]))
            for c in range(C):
                # Start chains over the cavity so that R-hat can see poor mixing.
                phi0 = cavity_mean[b] + 0.5 * L @ rng.standard_normal(p)
                parts = [phi0, theta0] if self.target == "augmented" else [phi0]
                x0[b, c] = np.concatenate(parts + [z0])
            keys[b] = rng.integers(0, 2**32 - 1, size=(C, 2), dtype=np.uint32)
        fn = self._compiled(model)
        with jax.enable_x64(True):
            zs, scores, ndiv = fn(
                pad_batch(keys, Bp),
                pad_batch(x0, Bp),
                pad_batch(cavity_mean, Bp),
                pad_batch(cavity_precision(cavity_cov), Bp),
                stack_stats(stats, Bp),
            )
            zs, scores, ndiv = np.asarray(zs)[:B], np.asarray(scores)[:B], np.asarray(ndiv)[:B]
        return chain_results(
            zs,
            scores,
            p,
            d if self.target == "augmented" else 0,
            control_variates=self.control_variates,
            precision_correction=self.precision_correction,
            keep_draws=keep_draws,
            extra={"divergences": ndiv.sum(axis=-1)},
            label="NUTS",
        )
