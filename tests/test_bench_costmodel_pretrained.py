"""The pre-trained section of benchmarks/costmodel.py: its trials-to-95 % arithmetic, and that
its training spread holds no layer of any extracted network while every layer it judges is one."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "costmodel.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_costmodel", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_costmodel"] = module
    spec.loader.exec_module(module)
    return module


def _record(cost_s: float | None):
    return SimpleNamespace(cost_s=cost_s, is_valid=cost_s is not None)


def test_curve_and_trials_to_reach(bench):
    curve = bench._curve([_record(None), _record(4.0), _record(5.0), _record(2.0), _record(1.9)])
    assert curve == [math.inf, 4.0, 4.0, 2.0, 1.9]
    threshold = curve[-1] / 0.95  # 2.0: within 95 % of the best throughput
    assert bench.trials_to_reach(curve, threshold) == 4
    assert bench.trials_to_reach(curve, 1.0) is None
    assert bench.geomean([4.0, 1.0]) == pytest.approx(2.0)
    assert math.isnan(bench.geomean([]))


def test_the_spread_is_held_out_and_the_judged_layers_are_network_layers(bench):
    bench.check_spread_held_out(bench.PRETRAINED_SPREAD)
    names = {name for name, _, _ in bench.network_layers()}
    assert set(bench.PRETRAINED_QUICK.values()) <= names
    assert set(bench.PRETRAINED_FULL) <= names
    layer = next(item for item in bench.network_layers() if item[0] == "resnet50/layer3.1.conv2")
    with pytest.raises(SystemExit, match="network layers"):
        bench.check_spread_held_out([*bench.PRETRAINED_SPREAD, (layer[1], layer[2])])
