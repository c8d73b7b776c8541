"""Tile sizes, as the template-free search spaces (the auto_scheduler's sketches, MetaSchedule's
design spaces) choose them: the ordered factorizations of a loop extent, and the mutation that
moves one prime factor between tile levels (Ansor's and MetaSchedule's tile-size mutation)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Largest innermost tile a factorization may have by default.
MAX_INNERMOST = 64


def divisors(value: int) -> list[int]:
    """Every divisor of a positive integer, ascending."""
    small = [d for d in range(1, math.isqrt(value) + 1) if value % d == 0]
    return sorted(set(small + [value // d for d in small]))


def factorizations(extent: int, parts: int, max_innermost: int = MAX_INNERMOST) -> list[tuple[int, ...]]:
    """Every way to write ``extent`` as an ordered product of ``parts`` factors (outermost
    first), the innermost at most ``max_innermost``."""
    if parts == 1:
        return [(extent,)] if extent <= max_innermost else []
    return [(first, *rest) for first in divisors(extent)
            for rest in factorizations(extent // first, parts - 1, max_innermost)]


def prime_factors(value: int) -> list[int]:
    """The prime factors of a positive integer with multiplicity, ascending."""
    primes, p = [], 2
    while p * p <= value:
        while value % p == 0:
            primes.append(p)
            value //= p
        p += 1
    return primes + ([value] if value > 1 else [])


def other_choice(current: int, size: int, rng: np.random.Generator) -> int:
    """A uniformly chosen value in ``range(size)`` other than ``current``."""
    choice = int(rng.integers(size - 1))
    return choice if choice < current else choice + 1


def move_factor(entities: Sequence[tuple[int, ...]], entity_index: dict[tuple[int, ...], int], position: int,
                rng: np.random.Generator) -> int:
    """The tile-size mutation: the factorization ``entities[position]`` with one prime factor
    moved from one level to another; another entity when no move lands on one.
    ``entity_index`` maps each entity back to its position."""
    parts = list(entities[position])
    sources = [i for i, v in enumerate(parts) if v > 1]
    for _ in range(8):
        src = sources[int(rng.integers(len(sources)))]
        dst = other_choice(src, len(parts), rng)
        primes = prime_factors(parts[src])
        prime = primes[int(rng.integers(len(primes)))]
        moved = list(parts)
        moved[src] //= prime
        moved[dst] *= prime
        found = entity_index.get(tuple(moved))
        if found is not None:
            return found
    return other_choice(position, len(entities), rng)
