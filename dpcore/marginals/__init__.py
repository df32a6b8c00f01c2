"""What the marginal-based mechanisms (MST, AIM) share: the public discretisation of a table
(``discretise``), the exact exponential mechanism on integer scores (``exponential``), noisy
histograms (``histograms``), the graphical model fitted to noisy marginals and records drawn
from it (``model``), and exact inference on that model in numpy (``inference``).

Nothing here names a mechanism: each mechanism's folder holds its accountant and its loop and
passes its sensitivities in.
"""
