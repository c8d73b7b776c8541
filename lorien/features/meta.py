"""Feature metadata (the ``.meta`` file) and the transform it describes.

A ``.meta`` file has one line per feature column, in column order, as Lorien wrote it::

    in_0,numeric,1.0,1.0
    an_unroll,category,none,unroll

that is ``name,numeric,mean,std`` or ``name,category,value0,value1,...`` (a category's code is
its position in the list). The target column ``thrpt`` is not listed; it is never normalized.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lorien.errors import LorienError

TARGET_COLUMN = "thrpt"
#: Identifier columns kept in the Parquet output beside the features (never model inputs).
ID_COLUMNS = ("workload_key", "target_key", "target")
#: Code given to a category value a model never saw in training.
UNSEEN_CATEGORY = -1


class FeatureMetaError(LorienError):
    """A ``.meta`` file or a feature table that does not match what a model expects."""


@dataclass
class FeatureColumn:
    """One feature: a standardized number or an enumerated string."""

    name: str
    kind: str  # "numeric" | "category"
    mean: float = 0.0
    std: float = 1.0
    categories: list[str] = field(default_factory=list)

    def to_line(self) -> str:
        if self.kind == "numeric":
            return f"{self.name},numeric,{self.mean!r},{self.std!r}"
        return ",".join([self.name, "category", *self.categories])

    @classmethod
    def from_line(cls, line: str, where: str) -> FeatureColumn:
        parts = line.rstrip("\n").split(",")
        if len(parts) < 2 or parts[1] not in ("numeric", "category"):
            raise FeatureMetaError(f"{where}: expected 'name,numeric|category,...', got {line.strip()!r}")
        if parts[1] == "numeric":
            if len(parts) != 4:
                raise FeatureMetaError(f"{where}: numeric feature needs mean and std, got {line.strip()!r}")
            try:
                mean, std = float(parts[2]), float(parts[3])
            except ValueError as exc:
                raise FeatureMetaError(f"{where}: bad mean/std in {line.strip()!r}") from exc
            return cls(parts[0], "numeric", mean, std)
        return cls(parts[0], "category", categories=parts[2:])


@dataclass
class FeatureMeta:
    """Column order and normalization of one template's features."""

    template: str
    columns: list[FeatureColumn]

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    def write(self, path: str | Path) -> None:
        Path(path).write_text("".join(column.to_line() + "\n" for column in self.columns))

    @classmethod
    def read(cls, path: str | Path, template: str | None = None) -> FeatureMeta:
        path = Path(path)
        if not path.is_file():
            raise FeatureMetaError(f"feature metadata file not found: {path}")
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        columns = [FeatureColumn.from_line(line, f"{path}:{i + 1}") for i, line in enumerate(lines)]
        return cls(template or path.stem, columns)

    def to_dict(self) -> dict[str, Any]:
        return {"template": self.template, "lines": [column.to_line() for column in self.columns]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureMeta:
        lines = data["lines"]
        columns = [FeatureColumn.from_line(line, f"meta of {data['template']}") for line in lines]
        return cls(data["template"], columns)

    def transform(self, raw: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """Normalized feature matrix (float32) of raw phase-1 feature dicts.

        A missing numeric feature becomes the training mean (0 after standardizing), a missing
        or unseen category value becomes :data:`UNSEEN_CATEGORY`.
        """
        rows = list(raw)
        matrix = np.zeros((len(rows), len(self.columns)), dtype=np.float32)
        for j, column in enumerate(self.columns):
            if column.kind == "numeric":
                values = np.array([_as_float(row.get(column.name), column.mean) for row in rows], dtype=np.float64)
                matrix[:, j] = (values - column.mean) / column.std
            else:
                codes = {value: i for i, value in enumerate(column.categories)}
                matrix[:, j] = [codes.get(_as_category(row.get(column.name)), UNSEEN_CATEGORY) for row in rows]
        return matrix


def _as_float(value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return default
    else:
        number = float(value)
    return number if math.isfinite(number) else default


def _as_category(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(int(value))
    return str(value)
