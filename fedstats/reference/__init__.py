"""Pooled reference fits: the models of fedstats fitted with every client's rows pooled in one
process, by NumPyro's NUTS, as a statistician holding all the data would fit them.

They pool data by design: they are the gold standards that tests, notebooks and benchmarks
compare the federated fits with, never a federated method.

* :func:`fedstats.reference.hierarchical.pooled_nuts`: the hierarchical linear model (HM2);
* :func:`fedstats.reference.shrinkage.pooled_nuts`: the Bayesian lasso and ridge (what
  :meth:`~fedstats.linear.BayesianShrinkage.fit_centralized` returns);
* :func:`fedstats.reference.glm.pooled_nuts`: the Bayesian and hierarchical GLMs;
* :func:`fedstats.reference.custom.pooled_nuts`: your own NumPyro model of
  :func:`~fedstats.inference.custom.federated_ep`.
"""
