"""Ansor's layout rewrite: weights packed in the order the tiled loops read them, with real
kernels checked against NumPy, records that say so, and kernels that refuse unpacked weights."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from conftest import F32, LAYER_OPS, auto_scheduler_job

from dialects.auto_scheduler.compile import check_kernel, compile_record
from dialects.auto_scheduler.layout import layout_free_placeholders
from dialects.auto_scheduler.records import layout_rewritten
from dialects.auto_scheduler.space import SketchSpace
from dialects.auto_scheduler.steps import replay_steps
from lorien import workload_registry
from lorien.engine import build
from lorien.engine.arrays import Packing
from lorien.engine.build import KernelArgumentError
from lorien.errors import ConfigError
from lorien.tune.config import parse_tune_config
from lorien.tune.loop import tune_job
from lorien.warehouse import open_store

#: SSRSRS tiling of the conv's accumulator (n, y, x, k | ry, rx, rc), fused into the epilogue:
#: the weight [3, 3, 8, 16] is read by loops k (2) k (2) rc (2) k (2) ry (3) rx (3) rc (4) k (2).
CONV_STEPS = [
    ["SP", 3, 0, 1, [1, 1, 1], 1], ["SP", 3, 4, 10, [1, 2, 5], 1], ["SP", 3, 8, 10, [2, 1, 5], 1],
    ["SP", 3, 12, 16, [2, 2, 2], 1], ["SP", 3, 16, 3, [3], 1], ["SP", 3, 18, 3, [3], 1], ["SP", 3, 20, 8, [4], 1],
    ["RE", 3, [0, 4, 8, 12, 1, 5, 9, 13, 16, 18, 20, 2, 6, 10, 14, 17, 19, 21, 3, 7, 11, 15]],
    ["FSP", 5, 0, 0, 1], ["FSP", 5, 2, 1, 1], ["FSP", 5, 4, 2, 1], ["FSP", 5, 6, 3, 1],
    ["RE", 5, [0, 2, 4, 6, 1, 3, 5, 7]], ["CA", 3, 5, 3], ["CI", 1], ["FU", 5, [0, 1, 2, 3]], ["AN", 5, 0, 3],
    ["AN", 3, 21, 2], ["AN", 5, 4, 2],
]


def _key(op: str) -> str:
    return workload_registry.make_workload_key(*LAYER_OPS[op])


def _replay(op: str, steps: list, rewrite: bool = True):
    return replay_steps(workload_registry.workload_dag(_key(op)), steps, layout_rewrite=rewrite)


def test_weights_of_convolutions_and_dense_layers_are_layout_free_and_activations_are_not():
    names = {op: layout_free_placeholders(workload_registry.workload_dag(_key(op))) for op in LAYER_OPS}
    assert names["conv2d NHWC+bias+relu"] == ["kernel"] and names["dense"] == ["weight"]
    assert names["conv2d NCHW stride 2"] == ["kernel"] and names["batch_matmul"] == []
    assert names["depthwise+bias+relu"] == []  # its kernel is read at [c // multiplier, c % multiplier, ...]


def test_the_weight_is_packed_in_the_order_its_reader_loops_walk_it_and_the_kernel_matches_numpy():
    replay = _replay("conv2d NHWC+bias+relu", CONV_STEPS)
    kernel = build(replay.schedule, replay.args)
    (packed,) = [a for a in kernel.args if a.packing is not None]
    assert packed.name == "kernel" and packed.packing.logical_shape == (3, 3, 8, 16)
    # k = 2 x 2 x 2 x 2, rc = 2 x 4, ry and rx inner; loops of extent 1 dropped
    assert packed.shape == (2, 2, 2, 2, 3, 3, 4, 2) and "layout rewritten" in replay.notes[0]
    assert packed.packing.perm == (4, 5, 2, 6, 0, 1, 3, 7)
    assert check_kernel(kernel, _key("conv2d NHWC+bias+relu")) < 1e-3
    plain = build(*(lambda r: (r.schedule, r.args))(_replay("conv2d NHWC+bias+relu", CONV_STEPS, rewrite=False)))
    assert all(a.packing is None for a in plain.args)
    weight = np.random.default_rng(1).uniform(-1, 1, (3, 3, 8, 16)).astype(F32)
    data = np.random.default_rng(2).uniform(-1, 1, (1, 10, 10, 8)).astype(F32)
    bias = np.random.default_rng(3).uniform(-1, 1, (16,)).astype(F32)
    out_packed, out_plain = np.zeros((1, 10, 10, 16), F32), np.zeros((1, 10, 10, 16), F32)
    kernel(*kernel.pack_arguments(data, weight, bias, out_packed))
    plain(data, weight, bias, out_plain)
    np.testing.assert_allclose(out_packed, out_plain, rtol=1e-5, atol=1e-5)


def test_a_kernel_given_the_weight_unpacked_says_how_to_pack_it():
    replay = _replay("conv2d NHWC+bias+relu", CONV_STEPS)
    kernel = build(replay.schedule, replay.args)
    arrays = [np.zeros(a.packing.logical_shape if a.packing else a.shape, F32) for a in kernel.args]
    with pytest.raises(KernelArgumentError, match=r"argument 'kernel'.*pack the \[3, 3, 8, 16\] array with kernel.pack_arguments"):
        kernel(*arrays)
    with pytest.raises(KernelArgumentError, match=r"argument 'kernel': expected shape \[3, 3, 8, 16\]"):
        kernel.pack_arguments(arrays[0], arrays[0], arrays[2], arrays[3])


@pytest.mark.parametrize("op", list(LAYER_OPS))
def test_every_sketch_with_rewritten_weights_matches_numpy(op):
    space = SketchSpace(workload_registry.workload_dag(_key(op)))
    rng = np.random.default_rng(11)
    packed = 0
    for sketch_id in range(len(space.sketches)):
        positions = [int(rng.integers(dim)) for dim in space.dims]
        positions[0] = sketch_id
        replay = _replay(op, space.get(space.index_of_knobs(positions)))
        kernel = build(replay.schedule, replay.args)
        packed += bool(kernel.packed_args)
        assert check_kernel(kernel, _key(op)) < 1e-3
    # a sketch tiles the weight's loops out of its own order where the op has a weight to pack
    assert bool(packed) == bool(layout_free_placeholders(workload_registry.workload_dag(_key(op))))


def test_a_split_that_does_not_divide_the_loop_leaves_the_weight_as_it_is():
    steps = [["SP", 2, 1, 32, [5], 1], ["SP", 2, 3, 16, [4], 1], ["RE", 2, [0, 1, 3, 4, 2]]]  # 32 = 7 x 5, not exact
    replay = _replay("dense", steps)
    assert all(getattr(t.op, "packing", None) is None for t in replay.args) and replay.notes == []
    assert check_kernel(build(replay.schedule, replay.args), _key("dense")) < 1e-3


def test_packing_is_a_reshape_and_transpose_that_unpacks_back():
    packing = Packing((4, 6), (2, 2, 3, 2), (2, 0, 3, 1))
    logical = np.arange(24, dtype=F32).reshape(4, 6)
    packed = packing.pack(logical)
    assert packed.shape == packing.shape == (3, 2, 2, 2) and packed.ctypes.data % 64 == 0
    assert packed[1, 0, 1, 1] == logical[0 * 2 + 1, 1 * 2 + 1]  # [i0, i1, j0, j1] -> [j0, i0, j1, i1]
    np.testing.assert_array_equal(packing.unpack(packed), logical)


def _job(**changes):
    return auto_scheduler_job(**{"args": [8, 32, 16, False, False, F32], "trials": 12, "batch_size": 12, "seed": 3,
                                 **changes})


def test_tuning_measures_with_packed_weights_and_its_records_say_so(store_uri, tmp_path):
    progress = tune_job(_job(), store_uri, log_path=tmp_path / "dense.json")
    assert progress.errors == 0
    lines = [json.loads(line) for line in (tmp_path / "dense.json").read_text().splitlines()]
    assert {line["i"][0][4] for line in lines} == {2}  # TVM's REWRITE_FOR_PRE_TRANSFORMED
    with open_store(store_uri) as store:
        records = store.scan(columns=None).to_pylist()
    from lorien.record import TuningRecord

    kernels = [compile_record(TuningRecord(**{k: v for k, v in row.items() if k in TuningRecord.__dataclass_fields__}))
               for row in records]
    assert any(k.packed_args == ["weight"] for k in kernels)
    for kernel in kernels:
        assert check_kernel(kernel, kernel.workload_key) < 1e-3


def test_layout_rewrite_can_be_turned_off_and_is_an_auto_scheduler_option(store_uri, tmp_path):
    tune_job(_job(layout_rewrite=False, trials=4, batch_size=4), store_uri, log_path=tmp_path / "plain.json")
    lines = [orjson.loads(line) for line in (tmp_path / "plain.json").read_text().splitlines()]
    assert {line["i"][0][4] for line in lines} == {0}
    with open_store(store_uri) as store:
        best = store.best(_key_of_job(), "llvm -keys=cpu", k=1)[0]
    assert not layout_rewritten(best) and compile_record(best).packed_args == []
    workloads = [{"dense": {"M": 4, "N": 8, "K": 8}}]
    with pytest.raises(ConfigError, match="'layout_rewrite' must be true or false"):
        parse_tune_config({"dialect": "auto_scheduler", "layout_rewrite": "yes", "workloads": workloads})
    with pytest.raises(ConfigError, match="'layout_rewrite' is an option of auto_scheduler"):
        parse_tune_config({"dialect": "autotvm", "layout_rewrite": True, "workloads": workloads})


def _key_of_job() -> str:
    job = _job()
    return workload_registry.make_workload_key(job["task_name"], job["args"])
