"""Synthetic AutoTVM logs made by varying real ones, for ingest benchmarks and scale tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from lorien.formats.base import is_skipped


def make_autotvm_log(base_logs: list[str | Path], path: str | Path, n_records: int, seed: int = 0,
                     batch_sizes: tuple[int, ...] = (1, 2, 4, 8)) -> int:
    """Write ``n_records`` AutoTVM lines to ``path`` by varying the records of ``base_logs``.

    Each output line is a base record with its batch size (the first dimension of its first
    tensor argument) taken from ``batch_sizes``, its config index shifted, its costs scaled by
    a random factor and its timestamp moved, so the log has ``len(batch_sizes)`` times as many
    distinct workloads as the base logs and no two lines are the same measurement.
    """
    bases = []
    for base in base_logs:
        with open(base, encoding="utf-8") as handle:
            for line in handle:
                if is_skipped(line):
                    continue
                try:
                    bases.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a truncated base line contributes nothing
    if not bases:
        raise ValueError(f"no AutoTVM records in {base_logs!r}")
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as out:
        for i in range(n_records):
            record = json.loads(json.dumps(bases[i % len(bases)]))
            round_no = i // len(bases)
            first = record["input"][2][0] if record["input"][2] else None
            if isinstance(first, list) and first and first[0] == "TENSOR" and first[1]:
                first[1][0] = batch_sizes[round_no % len(batch_sizes)]
            record["config"]["index"] = record["config"].get("index", 0) + round_no
            scale = rng.uniform(0.5, 2.0)
            record["result"][0] = [cost * scale for cost in record["result"][0]]
            record["result"][3] = record["result"][3] + i
            out.write(json.dumps(record))
            out.write("\n")
    return n_records
