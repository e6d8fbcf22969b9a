"""Named random streams: the tags that keep fedstats's seeded random streams apart.

Every random choice of a fit derives from the user's ``seed`` and fixed tags, as
``numpy.random.default_rng([seed, *tags])``: the same seed gives the same fit on every
backend (in process or on Flower), and two uses of one seed never share a stream. The tags
are fixed values: changing one changes every seeded result that uses it.
"""

from __future__ import annotations

import numpy as np

#: initialisation (``init_server``, ``init_client``): beyond every round number (``rounds``
#: must stay below it), so initial streams never meet a round's
INIT = 2**31 - 1
#: within a round ``r``: the server's participant sampling is ``[seed, r, PARTICIPATION]``,
#: client ``i``'s step ``[seed, r, CLIENT, i]``
PARTICIPATION = 0
CLIENT = 1
#: FGPR's with-replacement draws of participants (``[seed, round, FGPR_DRAWS]``)
FGPR_DRAWS = 0x6770
#: the federated k-means start of the mixtures (choice among candidate starts)
MIXTURE_START = 7919
#: draws of a fitted Gaussian posterior mapped to the data's scale (``global_posterior``)
SCALE_MAP = 13
#: minibatches of the Separate baseline's one-round fit, device ``k``: ``[seed, SEPARATE_BATCHES, k]``
SEPARATE_BATCHES = 5
#: an EP fit's final tilted distribution of device ``i`` (``[seed, FINAL_TILTED, i]``), and the
#: normals of device ``i``'s coefficient posterior drawn from it (``[seed, DEVICE_POSTERIOR, i]``)
FINAL_TILTED = 7
DEVICE_POSTERIOR = 11
#: the server's noise of a differentially private round ``r`` (central placement): ``[seed, r, DP_NOISE]``
DP_NOISE = 17


def stream(seed: int, *tags: int) -> np.random.Generator:
    """The generator of ``[seed, *tags]``."""
    return np.random.default_rng([seed, *tags])
