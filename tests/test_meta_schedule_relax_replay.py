"""Every record TVM 0.27's llvm design space made for two relax models replays on Lorien's engine,
each kernel checked against NumPy.

The databases under tests/data (a conv net and a BERT-style encoder layer, tuned by real TVM
MetaSchedule: tests/data/make_relax_databases.py; and relax_resnet18_pad9, two records TVM made
for one ResNet-18 task in benchmarks/model_tvm.py, kept for an AVX2 code generation bug) are data:
replaying them needs no TVM.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from dialects.meta_schedule.apply import read_database_line
from dialects.meta_schedule.compile import check_kernel, replay_database, workload_dag
from dialects.meta_schedule.trace import replay_trace
from lorien.cli import main
from lorien.engine import te
from lorien.engine.build import build
from lorien.engine.reference import NUMPY_CALLS
from lorien.engine.schedule import create_schedule
from lorien.formats.meta_schedule import workload_texts

DATA = Path(__file__).parent / "data"
DATABASES = ["relax_convnet", "relax_bert_layer"]


def _lines(database: str) -> list[list]:
    return [orjson.loads(line) for line in (DATA / database / "database_tuning_record.json").read_text().splitlines()]


def _first_line(predicate) -> tuple[str, int]:
    """(database, 1-based line) of the first record whose instructions satisfy ``predicate``."""
    for database in DATABASES:
        for number, line in enumerate(_lines(database), 1):
            if predicate(line[1][0][0]):
                return database, number
    raise AssertionError("no committed record has the instruction")


def _replay_and_check(database: str, number: int, trace: list | None = None) -> float:
    record = read_database_line(DATA / database, number)
    dag = workload_dag(record, entries=workload_texts(DATA / database))
    replay = replay_trace(dag, trace if trace is not None else orjson.loads(record.config))
    return check_kernel(build(replay.schedule, replay.args), dag)


@pytest.mark.parametrize("database", DATABASES)
def test_every_record_of_a_relax_database_replays_and_matches_numpy(database):
    outcomes = replay_database(DATA / database)
    replayed = [o for o in outcomes if o.status == "ok"]
    assert [o.summary() for o in outcomes if o.status != "ok"] == []
    assert len(replayed) == len(_lines(database)) == {"relax_convnet": 37, "relax_bert_layer": 70}[database]


@pytest.mark.parametrize("instruction", ["GetConsumers", "GetProducers", "RFactor", "DecomposeReduction",
                                         "ComputeAt", "ReverseComputeAt", "ComputeInline", "CacheWrite"])
def test_a_record_using_the_instruction_replays_and_matches_numpy(instruction):
    database, number = _first_line(lambda insts: any(inst[0] == instruction for inst in insts))
    assert _replay_and_check(database, number) < 1e-3


def test_a_split_factor_tvm_writes_as_the_string_none_is_inferred():
    database, number = _first_line(lambda insts: any(inst[0] == "Split" and "None" in inst[1] for inst in insts))
    assert _replay_and_check(database, number) < 1e-3


@pytest.mark.parametrize("key", ["meta_schedule.tiling_structure", "meta_schedule.parallel", "meta_schedule.vectorize",
                                 "meta_schedule.unroll_explicit", "meta_schedule.random_compute_producer",
                                 "pragma_auto_unroll_max_step", "pragma_unroll_explicit"])
def test_a_record_with_the_annotation_replays_and_matches_numpy(key):
    database, number = _first_line(lambda insts: any(inst[0] == "Annotate" and inst[2][0] == key for inst in insts))
    assert _replay_and_check(database, number) < 1e-3


def test_hint_only_instructions_are_accepted_and_listed_in_the_notes():
    database, number = _first_line(lambda insts: any(inst[0] == "DecomposeReduction" for inst in insts))
    record = read_database_line(DATA / database, number)
    replay = replay_trace(workload_dag(record, entries=workload_texts(DATA / database)), orjson.loads(record.config))
    hints = [note for note in replay.notes if note.startswith("hints for TVM")]
    assert len(hints) == 1 and "DecomposeReduction" in hints[0] and "meta_schedule.parallel" in hints[0]


def _reverse_inlined_trace() -> tuple[str, int, list]:
    """A conv-net record (matmul -> bias add -> relu) whose ComputeInline of the bias add is
    replaced by ReverseComputeInline of the relu into it (TVM applies it: see the tvm test)."""
    database, number = "relax_convnet", 14
    trace = _lines(database)[number - 1][1][0]
    assert trace[0][1] == ["GetSBlock", [], ["T_add", "main"], ["b1"]]
    assert trace[0][3] == ["ComputeInline", ["b1"], [], []]
    trace[0][1] = ["GetSBlock", [], ["compute", "main"], ["b1"]]
    trace[0][3] = ["ReverseComputeInline", ["b1"], [], []]
    return database, number, trace


def test_reverse_compute_inline_computes_the_consumer_in_its_producer_s_loops():
    database, number, trace = _reverse_inlined_trace()
    assert _replay_and_check(database, number, trace) < 1e-3


@pytest.mark.tvm
def test_tvm_applies_the_reverse_compute_inline_trace():
    pytest.importorskip("tvm")
    import tvm.s_tir.meta_schedule as ms
    from tvm import s_tir

    database, number, trace = _reverse_inlined_trace()
    key = _lines(database)[number - 1][0]
    entry = orjson.loads((DATA / database / "database_workload.json").read_text().splitlines()[key])
    schedule = s_tir.Schedule(ms.database.Workload.from_json(entry).mod)
    s_tir.schedule.Trace.apply_json_to_schedule(trace, schedule)
    assert "T_add" in schedule.mod.script() and "sblock(\"compute\")" not in schedule.mod.script()


@pytest.mark.parametrize("task, intrinsic", [("softmax", "exp"), ("layer_norm", "rsqrt"), ("gelu", "erf")])
def test_records_of_tasks_needing_an_intrinsic_replay_and_match_numpy(task, intrinsic):
    texts = workload_texts(DATA / "relax_bert_layer")
    for number in range(1, len(_lines("relax_bert_layer")) + 1):
        record = read_database_line(DATA / "relax_bert_layer", number)
        dag = workload_dag(record, entries=texts)
        calls = {node.fn for t in dag.ops if isinstance(t.op, te.ComputeOp) for node in te.walk(t.op.body)
                 if isinstance(node, te.Call)}
        if intrinsic in calls:
            assert _replay_and_check("relax_bert_layer", number) < 1e-3
            return
    raise AssertionError(f"no {task} record uses {intrinsic}")


@pytest.mark.parametrize("intrinsic", te.INTRINSICS)
def test_an_intrinsic_vectorized_on_the_engine_matches_numpy(intrinsic):
    data = te.placeholder((4, 16), "float32", "data")
    positive = intrinsic in ("log", "sqrt", "rsqrt")
    out = te.compute((4, 16), lambda i, j: te.intrinsic(intrinsic, te.intrinsic("fabs", data[i, j]) + 0.5
                                                         if positive else data[i, j]), name="out")
    schedule = create_schedule(out)
    _, inner = schedule[out].split("j", factor=8)
    schedule[out].vectorize(inner)
    kernel = build(schedule, [data, out])
    x = np.random.default_rng(0).uniform(-3, 3, (4, 16)).astype("float32")
    got = np.zeros_like(x)
    kernel(x, got)
    want = NUMPY_CALLS[intrinsic](np.abs(x) + 0.5 if positive else x)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pow_vectorized_on_the_engine_matches_numpy():
    """ONNX Pow (layer norm's square in lorien.models.bert) legalizes to tirx.pow."""
    base = te.placeholder((4, 16), "float32", "base")
    exponent = te.placeholder((4, 16), "float32", "exponent")
    out = te.compute((4, 16), lambda i, j: te.power(te.intrinsic("fabs", base[i, j]) + 0.5, exponent[i, j]),
                     name="out")
    squared = te.compute((4, 16), lambda i, j: te.power(base[i, j], 2.0), name="squared")
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-3, 3, (2, 4, 16)).astype("float32")
    for tensor, args, want in ((out, [base, exponent, out], np.power(np.abs(x) + 0.5, y)),
                               (squared, [base, squared], x * x)):
        schedule = create_schedule(tensor)
        _, inner = schedule[tensor].split("j", factor=8)
        schedule[tensor].vectorize(inner)
        got = np.zeros_like(x)
        build(schedule, args)(*([x, y, got] if len(args) == 3 else [x, got]))
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.tvm
def test_a_relax_task_using_pow_reads_into_a_dag_that_matches_numpy(tmp_path):
    """An ONNX Pow through TVM's relax pipeline is a task whose module the engine reads and tunes."""
    tvm = pytest.importorskip("tvm")
    ms = pytest.importorskip("tvm.s_tir.meta_schedule")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from dialects.meta_schedule.relax_tasks import fused_relax_module, untunable_reason
    from dialects.meta_schedule.workload import dag_of_module

    graph = helper.make_graph([helper.make_node("Pow", ["x", "two"], ["y"])], "pow",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                              [numpy_helper.from_array(np.float32(2), "two")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "pow.onnx"))
    (task,) = ms.relax_integration.extract_tasks(fused_relax_module(str(tmp_path / "pow.onnx")),
                                                 tvm.target.Target("llvm"))
    module = ms.database.Workload(task.dispatched[0]).as_json()[1]
    assert "pow" in str(task.dispatched[0]) and untunable_reason(module) is None
    dag = dag_of_module(module)
    data = np.random.default_rng(0).uniform(-2, 2, (2, 8)).astype("float32")
    (got,) = dag.evaluate(data)
    np.testing.assert_allclose(got, data * data, rtol=1e-6)


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")  # the NaN is the point
def test_a_kernel_giving_nan_where_numpy_does_is_right_and_measured():
    """Random inputs in [-1, 1) make a layer norm task's sqrt NaN in NumPy too: not a wrong answer."""
    from dialects.meta_schedule.compile import measure_traces
    from dialects.meta_schedule.space import TraceSpace
    from lorien.engine.dag import ComputeDAG

    data = te.placeholder((4, 16), "float32", "data")
    out = te.compute((4, 16), lambda i, j: te.sqrt(data[i, j]), name="out")
    dag = ComputeDAG([data, out])
    space = TraceSpace(dag)
    (result,) = measure_traces(dag, [space.get(0)], {"number": 1, "repeat": 1})
    assert result.error_no == 0, result.error_msg
    schedule = create_schedule(out)
    check_kernel(build(schedule, [data, out]), dag)  # raises WorkloadError on a mismatch; NaN matches NaN


def test_lorien_apply_measures_a_relax_record(capsys):
    database, number = _first_line(lambda insts: any(inst[0] == "RFactor" for inst in insts))
    assert main(["apply", "--log", str(DATA / database), "--line", str(number),
                 "--measure", '{"repeat": 1, "number": 1}']) == 0
    out = capsys.readouterr().out
    assert "latency" in out and "logged" in out


@pytest.mark.tvm
@pytest.mark.parametrize("database", DATABASES)
def test_the_committed_workloads_are_the_tasks_tvm_extracts_from_the_model(database):
    tvm = pytest.importorskip("tvm")
    import importlib.util

    import tvm.s_tir.meta_schedule as ms

    spec = importlib.util.spec_from_file_location("make_relax_databases", DATA / "make_relax_databases.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tasks = ms.relax_integration.extract_tasks(script.fused_module(database), tvm.target.Target(script.TARGET))
    extracted = {str(ms.database.Workload(task.dispatched[0]).as_json()[0]) for task in tasks}
    committed = {str(orjson.loads(line)[0])
                 for line in (DATA / database / "database_workload.json").read_text().splitlines()}
    assert extracted == committed


def _host_runs_avx2() -> bool:
    from lorien.engine.cpu import host_cpu_features

    return "+avx2" in host_cpu_features().split(",")


@pytest.mark.skipif(not _host_runs_avx2(), reason="the kernels are built for an AVX2 CPU and run here")
@pytest.mark.parametrize("number", [1, 2])
def test_a_padded_input_read_as_nine_lanes_is_right_when_built_for_avx2(number):
    """Two of TVM's own records of a ResNet-18 task (conv2d 512x512 3x3 on 7x7, bias, relu) read a
    padded row of 9 as one vector: a masked load of 9 lanes, which LLVM 22 compiled for AVX2 into
    8 masked lanes and an unmasked ninth (the next input value where the padding's zero belongs;
    found replaying TVM's records on an AMD znver3). Built for haswell, whatever this host is."""
    database = DATA / "relax_resnet18_pad9"
    record = read_database_line(database, number)
    dag = workload_dag(record, entries=workload_texts(database))
    replay = replay_trace(dag, orjson.loads(record.config))
    assert check_kernel(build(replay.schedule, replay.args, target="llvm -mcpu=haswell"), dag) < 1e-3


def test_a_masked_load_of_lanes_not_a_power_of_two_is_done_as_the_next_power_of_two():
    from lorien.engine.codegen.llvm import render
    from lorien.engine.cpu import building_for
    from lorien.engine.lower import lower

    data = te.placeholder((4, 7), "float32", "data")
    padded = te.compute((4, 9), lambda i, j: te.if_then_else(te.all(j >= 1, j < 8), data[i, j - 1], 0.0),
                        name="padded")
    schedule = create_schedule(padded)
    schedule[padded].vectorize("j")
    with building_for("llvm -mcpu=haswell"):
        text = render(lower(schedule, [data, padded], "kernel"))
    assert "llvm.masked.load.v16f32" in text and "llvm.masked.load.v9f32" not in text
    got = np.zeros((4, 9), np.float32)
    x = np.random.default_rng(0).uniform(-1, 1, (4, 7)).astype(np.float32)
    build(schedule, [data, padded], target="llvm -mcpu=haswell")(x, got)
    assert np.array_equal(got, np.pad(x, ((0, 0), (1, 1))))
