"""Weighted max-min fair shares of one device's bandwidth (pure).

Each claim has a weight (its priority) and a demand (bytes/s, or None: as
much as it can get). Water-filling: the level rises for every claim at once,
each claim getting ``weight x level``, until the capacity is spent; a claim
whose demand is reached stops there, and what it leaves is shared by the
others in proportion to their weights. So:

- nobody gets more than its demand, and the sum never exceeds the capacity;
- while some claim wants more, the whole capacity is given out;
- every claim that wants more has the highest share per unit of weight:
  nobody can get more without taking from a claim with an equal or lower
  share per weight (the definition of weighted max-min fairness).

``fair_shares`` computes the exact shares (fractions); ``allocate`` rounds
them down to whole bytes/s (what a throttle file takes), so the sum of the
rounded shares is still within the capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Claim:
    name: str
    weight: int  # >= 1: the priority
    demand: int | None = None  # bytes/s; None: no cap


def _normalized_demand(c: Claim) -> Fraction | None:
    return None if c.demand is None else Fraction(c.demand, c.weight)


def fair_shares(capacity: int, claims: Sequence[Claim]) -> dict[str, Fraction]:
    """Exact weighted max-min fair shares of ``capacity`` among ``claims``."""
    if capacity < 0:
        raise ValueError(f"capacity {capacity} is negative")
    names = [c.name for c in claims]
    if len(set(names)) != len(names):
        raise ValueError(f"claims named twice: {sorted(n for n in names if names.count(n) > 1)}")
    for c in claims:
        if c.weight < 1 or (c.demand is not None and c.demand < 0):
            raise ValueError(f"claim {c.name}: weight {c.weight}, demand {c.demand}")
    # Claims that stop first (lowest demand per weight) come first; no cap last.
    order = sorted(claims, key=lambda c: (c.demand is None, _normalized_demand(c) or 0))
    out: dict[str, Fraction] = {}
    left = Fraction(capacity)
    weights = sum(c.weight for c in order)
    for i, c in enumerate(order):
        level = left / weights
        demand = _normalized_demand(c)
        if demand is not None and demand <= level:
            out[c.name] = Fraction(c.demand or 0)
            left -= out[c.name]
            weights -= c.weight
            continue
        for rest in order[i:]:  # nobody left reaches its demand at this level
            out[rest.name] = rest.weight * level
        break
    return {c.name: out[c.name] for c in claims}


def allocate(capacity: int, claims: Sequence[Claim]) -> dict[str, int]:
    """``fair_shares`` rounded down to whole bytes/s."""
    return {name: int(share) for name, share in fair_shares(capacity, claims).items()}
