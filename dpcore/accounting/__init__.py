"""Privacy accountants (replace-one neighbours, n public) and ledger composition."""

from dpcore.accounting.composition import Cost, compose_epsilon
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp

__all__ = ["ORDERS", "Cost", "compose_epsilon", "epsilon_from_rdp"]
