"""Stratified, seeded selections of rows by label, shared by prepare (subsets, splits) and train."""

from __future__ import annotations

import numpy as np


def stratified_take(labels: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted rows of at most `count` items, each class in proportion (largest remainder)."""
    if count >= len(labels):
        return np.arange(len(labels))
    classes, sizes = np.unique(labels, return_counts=True)
    exact = sizes * count / len(labels)
    quota = np.floor(exact).astype(int)
    by_remainder = np.argsort(-(exact - quota), kind="stable")
    quota[by_remainder[: count - quota.sum()]] += 1
    rows = [
        rng.permutation(np.flatnonzero(labels == label))[:take]
        for label, take in zip(classes, quota, strict=True)
    ]
    return np.sort(np.concatenate(rows)) if rows else np.arange(0)


def stratified_split(
    labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(rows taken, rows left): `fraction` of the items, stratified by class."""
    taken = stratified_take(labels, round(fraction * len(labels)), rng)
    return taken, np.setdiff1d(np.arange(len(labels)), taken)
