"""Mechanisms as map–reduce jobs over partitions of a dataset (docs/scaling.md).

Framework-free: pure per-partition *map* functions and per-bucket *reduce* functions over
numpy/torch arrays, with the randomness each task draws made explicit. Any scheduler can run
them; ``worker/dask_release.py`` runs them on ``dask.distributed``. Two jobs:

- ``record``: DPMix's record assignment (every record joins k = ⌈Tℓ/n⌉ distinct mixtures,
  uniform among the T, independently per record), reduced by mixture id;
- ``classes``: DP-CDA's per-class mixing (every mixture the mean of ℓ distinct records of its
  class, uniform, independently per mixture), by rank requests routed to the partitions that
  hold the ranks.

Both produce rows with exactly the law of the single-machine generators
(``dpcore.mechanisms.dpmix.generate.generate_by_record``, ``dpcore.mechanisms.dpcda.generate
.generate``): the argument is in each module's docstring, the tests compare the two
(``tests/unit/test_distributed_*.py``). The accountants and the declared noise are the
single-machine ones, unchanged. Cost model and measurements: docs/scaling.md.
"""
