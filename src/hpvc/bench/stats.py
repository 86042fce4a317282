"""Summaries shared by every benchmark: min / median / max of the samples."""

from __future__ import annotations

import statistics


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
    }
