"""Reproductions of the seed papers and case studies: the drivers that the notebooks, the
benchmarks and the statistical tests run. They are not part of the modelling API (the model
packages hold only models and results); each returns tidy tables.

* :mod:`~fedstats.experiments.linear_paper`: the linear-models paper's Table 1 (HM1 and its
  baselines), Table 2 and Table 3 (variable selection) and its turbofan study;
* :mod:`~fedstats.experiments.multifidelity_paper`: the FGPR paper's multi-fidelity table
  under the published code's protocol;
* :mod:`~fedstats.experiments.fgpr_case_studies`: the FGPR paper's SARCOS and C-MAPSS studies;
* :mod:`~fedstats.experiments.regret`: streams of federated mixtures and the regret of online
  learners (FEM-OMD);
* :mod:`~fedstats.experiments.mfbo`: cost-aware multi-fidelity Bayesian optimisation with the
  federated AR1 surrogate, a pooled multi-fidelity GP and a single-fidelity GP (notebook 08).
"""
