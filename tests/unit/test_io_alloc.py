"""Weighted max-min fairness (hpvc.coordinator.alloc): examples and properties.

The properties characterise the one weighted max-min fair allocation:
nobody above demand, the sum within the capacity, the whole capacity given
out while someone wants more, and every claim that wants more holding the
highest share per unit of weight (water-filling optimality).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpvc.coordinator.alloc import Claim, allocate, fair_shares

MB = 1_000_000


def test_shares_follow_priorities_1_2_4() -> None:
    got = fair_shares(70 * MB, [Claim("a", 1), Claim("b", 2), Claim("c", 4)])
    assert got == {"a": Fraction(10 * MB), "b": Fraction(20 * MB), "c": Fraction(40 * MB)}


def test_when_one_leaves_the_others_get_a_third_and_two_thirds() -> None:
    got = allocate(70 * MB, [Claim("a", 1), Claim("b", 2)])
    assert got == {"a": 70 * MB // 3, "b": 140 * MB // 3}
    assert sum(got.values()) <= 70 * MB


def test_a_demand_below_its_share_is_met_and_the_rest_goes_to_the_others() -> None:
    got = fair_shares(70 * MB, [Claim("a", 1), Claim("b", 2), Claim("c", 4, demand=5 * MB)])
    assert got["c"] == 5 * MB
    assert got["a"] == Fraction(65 * MB, 3) and got["b"] == Fraction(130 * MB, 3)


def test_everyone_satisfied_leaves_capacity_unused() -> None:
    got = fair_shares(100, [Claim("a", 1, demand=10), Claim("b", 5, demand=20)])
    assert got == {"a": 10, "b": 20}


def test_a_chain_of_demands_is_filled_in_order() -> None:
    # level rises: a stops at 10, then b at 30, c takes the rest
    got = fair_shares(100, [Claim("c", 1), Claim("b", 1, demand=30), Claim("a", 1, demand=10)])
    assert got == {"c": 60, "b": 30, "a": 10}


def test_no_claims_and_zero_capacity() -> None:
    assert fair_shares(10, []) == {}
    assert allocate(0, [Claim("a", 3)]) == {"a": 0}


@pytest.mark.parametrize(
    "claims",
    [
        [Claim("a", 0)],
        [Claim("a", 1, demand=-1)],
        [Claim("a", 1), Claim("a", 2)],
    ],
)
def test_bad_claims_are_refused(claims: list[Claim]) -> None:
    with pytest.raises(ValueError):
        fair_shares(10, claims)


claims_st = st.lists(
    st.tuples(st.integers(1, 1000), st.one_of(st.none(), st.integers(0, 10**9))),
    min_size=0,
    max_size=12,
).map(lambda xs: [Claim(f"c{i}", w, d) for i, (w, d) in enumerate(xs)])


@settings(max_examples=400, deadline=None)
@given(capacity=st.integers(0, 10**10), claims=claims_st)
def test_water_filling_properties(capacity: int, claims: list[Claim]) -> None:
    shares = fair_shares(capacity, claims)
    assert set(shares) == {c.name for c in claims}
    assert sum(shares.values()) <= capacity
    for c in claims:
        assert shares[c.name] >= 0
        if c.demand is not None:
            assert shares[c.name] <= c.demand  # nobody above demand
    wanting = [c for c in claims if c.demand is None or shares[c.name] < c.demand]
    if wanting:  # work-conserving: leftovers are redistributed
        assert sum(shares.values()) == capacity
    for c in wanting:  # optimality: a claim that wants more has the top share per weight
        level = shares[c.name] / c.weight
        for other in claims:
            assert shares[other.name] / other.weight <= level


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 10**10), claims=claims_st)
def test_rounded_allocation_stays_within_capacity_and_demand(
    capacity: int, claims: list[Claim]
) -> None:
    got = allocate(capacity, claims)
    exact = fair_shares(capacity, claims)
    assert sum(got.values()) <= capacity
    for c in claims:
        assert exact[c.name] - 1 < got[c.name] <= exact[c.name]
        if c.demand is not None:
            assert got[c.name] <= c.demand


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 10**9), weights=st.lists(st.integers(1, 100), min_size=1))
def test_without_demands_shares_are_proportional_to_priority(
    capacity: int, weights: list[int]
) -> None:
    claims = [Claim(f"c{i}", w) for i, w in enumerate(weights)]
    shares = fair_shares(capacity, claims)
    total = sum(weights)
    for c in claims:
        assert shares[c.name] == Fraction(capacity * c.weight, total)
