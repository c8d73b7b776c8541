"""A model tuned by Lorien, compiled and run by TVM (needs the ``tvm`` extra: apache-tvm 0.27, onnx).

For each model of the run (default: ResNet-18 from torchvision, a BERT-style encoder layer and a
MobileNetV2-style inverted-residual block, all through ONNX and TVM's relax ONNX frontend):

1. ``lorien extract model.onnx --dialect meta_schedule`` takes TVM's own relax tasks (the
   passes before tuning, then MetaSchedule's ``extract_tasks``); a fixed subset is tuned: the
   ``--tasks`` tasks with the most FLOPs x weight (ResNet-18; every task of the other two).
2. The same tasks, the same trials per task, tuned four ways:
   - **TVM**: MetaSchedule ``tune_tasks`` into a JSONDatabase (TVM's LocalBuilder, timeout
     120 s, and LocalRunner, measuring as Lorien does: number 1, repeat 3, min_repeat_ms 10);
     every record TVM commits also goes through Lorien's adapter into a warehouse
     (``warehouse_database``: the adapter row). TVM builds candidates in forked copies of the
     benchmark's process by default (``forked_builder``: no import, as many at once as cores, 30 s per
     build, as LocalBuilder's default; ``--tvm-builder local``: its LocalBuilder, whose fresh workers
     spend 45 to 80 s per batch importing TVM here, which would only add to TVM's tuning time);
   - **Lorien**: ``lorien tune`` of the extracted YAML on Lorien's engine (the job's default
     tuner, ``random``: the YAML names none; ``--tuner xgb`` writes ``tuner: xgb`` and ``--cost-model
     DIR`` also ``cost_model: DIR``, a pre-trained program-feature model guiding it; the same measure
     options) with ``remeasure_with_tvm: N``: the best N traces of each task
     are built and timed by TVM and committed as TVM-measured records; ``lorien export
     --format meta_schedule`` then writes each task's best TVM-measured record;
   - **Lorien, engine only**: each task's best record as Lorien's engine timed it (from the
     same tuning run);
   - with ``--measure-with-tvm``, also a second Lorien run with ``measure_with: tvm`` (every
     candidate built and timed by TVM).
3. Every database is built with ``compile_relax`` (and the untuned model with ``relax.build``);
   the tasks ``MetaScheduleApplyDatabase`` schedules are counted; every build's output is
   checked against the untuned build's on the same input; the builds are timed taking turns
   (:func:`time_taking_turns`: rounds in which who goes first rotates every round, each timed
   call right after an untimed call of the same build; medians): the untuned build ``--rounds``
   rounds, the tuned builds as many rounds as give each at least ``--min-timed-s`` seconds of
   timed calls (:func:`rounds_for`; at least ``--rounds``).
4. Every record TVM made is replayed on Lorien's engine (``replay_database``: output checked
   against NumPy).

Last line: ``tasks_applied=A/B lorien_vs_tvm_latency=X tuning_time_vs_tvm=Y replay_tvm_ok=C/D``:
A of the B tuned tasks (all models) scheduled from Lorien's export; X the TVM-tuned model's
median latency over the Lorien-tuned one's, on the model where Lorien does worst (above 1:
Lorien's build is faster); Y TVM's tuning wall time (its own extraction as a TVM user runs it: the
ONNX frontend, the same passes, ``extract_tasks``; then ``tune_tasks``) over Lorien's (``lorien
extract`` + tune + re-measure), all models; C of the D records TVM made replayed on Lorien's engine.

    python benchmarks/model_tvm.py                 # ResNet-18 8 tasks x 32 trials, the two small models x 8
    python benchmarks/model_tvm.py --quick         # ResNet-18 3 tasks x 8 trials, the small models x 4
    python benchmarks/model_tvm.py --models resnet18 --tasks 4 --trials 16
    python benchmarks/model_tvm.py --models mobilenet_block --tuner xgb --cost-model models/program
    python benchmarks/model_tvm.py --tuner xgb --train-store spread-store   # the guided row, model trained in the run
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MEASURE = {"number": 1, "repeat": 3, "min_repeat_ms": 10}
MODELS = ("resnet18", "bert_layer", "mobilenet_block")


# ---- the models, as ONNX files ----------------------------------------------------------------

def resnet18_onnx(path: Path) -> tuple[Path, dict[str, list[int]]]:
    """torchvision's ResNet-18 (random weights), exported with torch's ONNX exporter."""
    import torch

    from lorien.models.torch_frontend import import_module

    model = import_module("torchvision.models").resnet18().eval()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), str(path), verbose=False)
    return path, {}


def bert_layer_onnx(path: Path) -> tuple[Path, dict[str, list[int]]]:
    """The BERT-style encoder layer of lorien.models.bert (hidden 256, 4 heads, FFN 1024, seq 64),
    its zero weights replaced by random ones so that outputs can be compared."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from lorien.models.bert import bert_encoder_layer

    model = bert_encoder_layer(hidden=256, heads=4, ffn=1024)
    rng = np.random.default_rng(0)
    for index, tensor in enumerate(model.graph.initializer):
        value = numpy_helper.to_array(tensor)
        if value.dtype == np.float32 and value.ndim >= 1 and not value.any():
            scale = 1.0 if tensor.name.endswith("norm.weight") else 0.05
            value = (rng.standard_normal(value.shape) * scale + (1.0 if tensor.name.endswith("norm.weight") else 0))
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(value.astype(np.float32), tensor.name))
    onnx.save(model, str(path))
    return path, {"hidden_states": [1, 64, 256]}


def mobilenet_block_onnx(path: Path) -> tuple[Path, dict[str, list[int]]]:
    """A MobileNetV2 inverted-residual block (NCHW, 1x32x28x28): 1x1 expand to 192 + Clip(0, 6),
    3x3 depthwise + Clip(0, 6), 1x1 project to 32, residual Add; biases as folded BatchNorm."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def const(name: str, *shape: int, scale: float = 0.2) -> Any:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    weights = [const("w_expand", 192, 32, 1, 1), const("b_expand", 192), const("w_dw", 192, 1, 3, 3),
               const("b_dw", 192), const("w_project", 32, 192, 1, 1), const("b_project", 32),
               numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.float32(6), "six")]
    nodes = [helper.make_node("Conv", ["x", "w_expand", "b_expand"], ["e"]),
             helper.make_node("Clip", ["e", "zero", "six"], ["e6"]),
             helper.make_node("Conv", ["e6", "w_dw", "b_dw"], ["d"], group=192, pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["d", "zero", "six"], ["d6"]),
             helper.make_node("Conv", ["d6", "w_project", "b_project"], ["p"]),
             helper.make_node("Add", ["p", "x"], ["y"])]
    graph = helper.make_graph(nodes, "mobilenet_v2_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 28, 28])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, {}


BUILDERS = {"resnet18": resnet18_onnx, "bert_layer": bert_layer_onnx, "mobilenet_block": mobilenet_block_onnx}


# ---- one model ---------------------------------------------------------------------------------

@dataclass
class ModelRun:
    name: str
    tasks: int = 0
    all_tasks: int = 0
    applied: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    max_error: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    tvm_tuning_s: float = 0.0
    lorien_tuning_s: float = 0.0
    lorien_tvm_tuning_s: float = 0.0
    replay_ok: int = 0
    replay_total: int = 0
    replay_failures: list[str] = field(default_factory=list)


def cli(*argv: str) -> None:
    """``lorien ARGV`` in this process, its output kept quiet; a failure stops the benchmark."""
    from lorien.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"lorien {' '.join(argv)} failed ({code}):\n{out.getvalue()}{err.getvalue()}")


def select_tasks(tasks: list[Any], count: int | None) -> list[Any]:
    """The ``count`` tasks with the most FLOPs x weight (all when None), in extraction order."""
    import tvm.s_tir.meta_schedule as ms

    from dialects.meta_schedule.workload import dag_of_module

    if count is None or count >= len(tasks):
        return list(tasks)
    work = {}
    for task in tasks:
        dag = dag_of_module(ms.database.Workload(task.dispatched[0]).as_json()[1])
        work[task.task_name] = (dag.flop() or 0) * int(task.weight)
    chosen = set(sorted(work, key=lambda name: -work[name])[:count])
    return [task for task in tasks if task.task_name in chosen]


def tune_with_tvm(tasks: list[Any], trials: int, json_dir: Path, store_uri: str, target: Any,
                  builder: str) -> float:
    """MetaSchedule tunes ``tasks`` into a JSONDatabase; every commit also goes to a Lorien store
    through the adapter. Returns TVM's tuning wall time (s)."""
    import tvm.s_tir.meta_schedule as ms
    from tvm.ir.utils import derived_object

    from dialects.meta_schedule.tvm_database import warehouse_database

    json_dir.mkdir(parents=True, exist_ok=True)
    json_db = ms.database.JSONDatabase(work_dir=str(json_dir))
    adapter = warehouse_database(store_uri, target=target)

    @derived_object
    class Both(ms.database.PyDatabase):
        """TVM's JSONDatabase answers; every workload and record is also committed through the adapter."""

        def has_workload(self, mod: Any) -> bool:
            return json_db.has_workload(mod)

        def commit_workload(self, mod: Any) -> Any:
            adapter.commit_workload(mod)
            return json_db.commit_workload(mod)

        def commit_tuning_record(self, record: Any) -> None:
            json_db.commit_tuning_record(record)
            adapter.commit_tuning_record(record)

        def get_top_k(self, workload: Any, top_k: int) -> list[Any]:
            return json_db.get_top_k(workload, top_k)

        def get_all_tuning_records(self) -> list[Any]:
            return json_db.get_all_tuning_records()

        def query_tuning_record(self, mod: Any, target: Any, workload_name: str | None = None) -> Any:
            return json_db.query_tuning_record(mod, target, workload_name)

        def __len__(self) -> int:
            return len(json_db)

    from dialects.meta_schedule.tvm_measure import forked_builder

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work_dir:
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, seed=0)
        evaluator = ms.runner.EvaluatorConfig(number=MEASURE["number"], repeat=MEASURE["repeat"],
                                              min_repeat_ms=MEASURE["min_repeat_ms"])
        ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir,
                      max_trials_global=trials * len(contexts), max_trials_per_task=trials,
                      num_trials_per_iter=min(trials, 64),
                      builder=forked_builder() if builder == "forked" else ms.builder.LocalBuilder(timeout_sec=120),
                      runner=ms.runner.LocalRunner(timeout_sec=120, evaluator_config=evaluator),
                      database=Both())
    elapsed = time.perf_counter() - started
    adapter.lorien.close()
    return elapsed


def lorien_label(tuner: str | None, cost_model: Path | None) -> str:
    """How the Lorien row tuned: the job's default tuner, or the tuner named, guided by a model or not."""
    if tuner is None:
        return "random (job default)"
    return f"{tuner}, cost model {cost_model.name}" if cost_model is not None else tuner


def tune_with_lorien(onnx_path: Path, shapes: dict[str, list[int]], selected: list[Any], trials: int,
                     remeasure: int, measure_with: str, work: Path, target_json: str,
                     tuner: str | None = None, cost_model: Path | None = None) -> tuple[float, float, str]:
    """``lorien extract --dialect meta_schedule`` then ``lorien tune`` of the selected tasks (with
    ``tuner`` and ``cost_model`` in the YAML when given; else the job's default tuner); returns the
    wall time of both, that of the extract alone, and the store's URI."""
    import yaml

    store = f"parquet:{work / 'store'}"
    config = work / "tasks" / f"{onnx_path.stem}.yaml"
    started = time.perf_counter()
    inputs = [arg for name, shape in shapes.items() for arg in ("--input", f"{name}:{'x'.join(map(str, shape))}")]
    cli("extract", str(onnx_path), "--dialect", "meta_schedule", "-o", str(config), "--target", target_json, *inputs)
    extract_s = time.perf_counter() - started
    spec = yaml.safe_load(config.read_text())
    keys = {task_key(task) for task in selected}
    spec["workloads"] = [entry for entry in spec["workloads"] if entry["workload_key"] in keys]
    assert len(spec["workloads"]) == len(selected), "extract and the benchmark see other tasks"
    spec.update({"trials": trials, "measure": MEASURE, "measure_with": measure_with})
    if tuner is not None:
        spec["tuner"] = tuner
    if cost_model is not None:
        spec["cost_model"] = str(cost_model)
    if remeasure:
        spec["remeasure_with_tvm"] = remeasure
    config.write_text(yaml.safe_dump(spec, sort_keys=False))
    cli("tune", str(config), "--store", store, "--no-progress")
    return time.perf_counter() - started, extract_s, store


def extract_as_tvm_user(onnx_path: Path, shapes: dict[str, list[int]], target: Any, count: int | None,
                        expected: list[Any]) -> tuple[list[Any], float]:
    """TVM's own extraction of the tasks it tunes, as a TVM user runs it: the relax ONNX frontend,
    the passes before tuning (what ``lorien extract`` runs too), ``extract_tasks``, the same subset.
    Returns the tasks and the wall time, which counts in TVM's tuning time as ``lorien extract``
    counts in Lorien's."""
    import tvm.s_tir.meta_schedule as ms

    from dialects.meta_schedule.relax_tasks import fused_relax_module

    started = time.perf_counter()
    tasks = select_tasks(ms.relax_integration.extract_tasks(fused_relax_module(str(onnx_path), shapes), target), count)
    elapsed = time.perf_counter() - started
    if [task_key(task) for task in tasks] != [task_key(task) for task in expected]:
        raise SystemExit(f"{onnx_path.name}: TVM's extraction found other tasks than the benchmark's")
    return tasks, elapsed


def task_key(task: Any) -> str:
    import tvm.s_tir.meta_schedule as ms

    return str(ms.database.Workload(task.dispatched[0]).as_json()[0])


def engine_best_database(store_uri: str, out: Path) -> None:
    """Each workload's best record as Lorien's engine timed it, as a JSONDatabase TVM loads."""
    from dialects.meta_schedule.tvm_database import write_tvm_database
    from lorien.record import MEASURED_BY_ENGINE, TuningRecord
    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        records = [TuningRecord.from_row(row) for row in store.scan({"dialect": "meta_schedule"}).to_pylist()]
        best: dict[str, TuningRecord] = {}
        for record in records:
            if record.measured_by == MEASURED_BY_ENGINE and record.cost_s is not None:
                if record.workload_key not in best or record.cost_s < best[record.workload_key].cost_s:
                    best[record.workload_key] = record
        write_tvm_database(best.values(), out, store=store)


def applied_tasks(mod: Any, database: Any, target: Any, names: set[str]) -> int:
    """How many of the tasks ``names`` MetaScheduleApplyDatabase schedules from ``database``."""
    import tvm
    from tvm import relax

    with target, database, tvm.transform.PassContext(opt_level=3):
        applied = relax.transform.MetaScheduleApplyDatabase()(mod)
    return sum(1 for gv, func in applied.functions.items()
               if isinstance(func, tvm.tirx.PrimFunc) and "tirx.is_scheduled" in (func.attrs or {})
               and gv.name_hint in names)


def time_taking_turns(calls: dict[str, Any], rounds: int) -> dict[str, float]:
    """The median seconds of each of ``calls`` (label -> a call of a built model), timed taking
    turns: ``rounds`` rounds, who goes first rotating every round, each timed call right after an
    untimed call of the same build, so that its caches hold that build's data, as when a model
    serves call after call. Called in a fixed order instead, a build was timed right after the one
    before it in the list and paid for its data: two identical builds of the MobileNetV2 block
    timed 0.991 and 0.832 ms, the one after the untuned build (ten times their working set) the
    slower; rotated with the untimed call, 0.800 and 0.795 ms (2026-11-28, znver3)."""
    from lorien.engine.race import rotated

    samples: dict[str, list[float]] = {label: [] for label in calls}
    for round_index in range(rounds):
        for label in rotated(list(calls), round_index):
            calls[label]()  # untimed: this build's data in the caches
            started = time.perf_counter()
            calls[label]()
            samples[label].append(time.perf_counter() - started)
    return {label: statistics.median(times) for label, times in samples.items() if times}


def rounds_for(calls: dict[str, Any], rounds: int, min_timed_s: float, cap: int = 5000) -> int:
    """How many rounds :func:`time_taking_turns` gives ``calls`` so that each build is timed for
    at least ``min_timed_s`` seconds in all (never fewer than ``rounds``, at most ``cap``): the
    fastest call, timed once after an untimed call, decides. Thirty rounds of the BERT layer's
    4 ms builds are 0.12 s of timing each, and two builds of TVM's same records then timed
    3.576 and 3.930 ms in one run (2026-11-28, znver3): a moment of other work decided it."""
    fastest = math.inf
    for call in calls.values():
        call()
        started = time.perf_counter()
        call()
        fastest = min(fastest, time.perf_counter() - started)
    if not math.isfinite(fastest) or fastest <= 0:
        return rounds
    return max(rounds, min(cap, math.ceil(min_timed_s / fastest)))


def run_model(name: str, args: argparse.Namespace, root: Path, target: Any, target_json: str) -> ModelRun:
    import numpy as np
    import tvm
    import tvm.s_tir.meta_schedule as ms
    from tvm import relax

    from dialects.meta_schedule.compile import replay_database
    from dialects.meta_schedule.relax_tasks import fused_relax_module, relax_module
    from dialects.meta_schedule.tvm_database import warehouse_database

    run = ModelRun(name)
    work = root / name
    work.mkdir()
    onnx_path, shapes = BUILDERS[name](work / f"{name}.onnx")
    mod = fused_relax_module(str(onnx_path), shapes)  # what extract_tasks takes
    raw = relax_module(str(onnx_path), shapes)        # what compile_relax and relax.build take: they fuse it
    tasks = ms.relax_integration.extract_tasks(mod, target)
    selected = select_tasks(tasks, args.tasks if name == "resnet18" else None)
    trials = args.trials if name == "resnet18" else args.small_trials
    run.tasks, run.all_tasks = len(selected), len(tasks)
    names = {task.task_name for task in selected}
    print(f"{name}: {len(tasks)} relax tasks, tuning {len(selected)} x {trials} trials: "
          f"{', '.join(sorted(names))}", flush=True)

    run.lorien_tuning_s, lorien_extract_s, lorien_store = tune_with_lorien(
        onnx_path, shapes, selected, trials, args.remeasure, "lorien", work / "lorien", target_json,
        args.tuner, args.cost_model)
    print(f"{name}: Lorien tuned (engine, tuner {lorien_label(args.tuner, args.cost_model)}, re-measuring the "
          f"best {args.remeasure} with TVM) in {run.lorien_tuning_s:.1f} s (lorien extract "
          f"{lorien_extract_s:.1f} s + tune {run.lorien_tuning_s - lorien_extract_s:.1f} s)", flush=True)
    databases: dict[str, Any] = {}
    cli("export", "--format", "meta_schedule", "--target", "llvm", "--alternate-key", "-o",
        str(work / "lorien_db"), "--store", lorien_store)
    databases["lorien"] = ms.database.JSONDatabase(work_dir=str(work / "lorien_db"), allow_missing=False)
    engine_best_database(lorien_store, work / "lorien_engine_db")
    databases["lorien_engine"] = ms.database.JSONDatabase(work_dir=str(work / "lorien_engine_db"),
                                                          allow_missing=False)
    if args.measure_with_tvm:
        run.lorien_tvm_tuning_s, _, tvm_store = tune_with_lorien(onnx_path, shapes, selected, trials, 0, "tvm",
                                                                 work / "lorien_tvm", target_json,
                                                                 args.tuner, args.cost_model)
        print(f"{name}: Lorien tuned (measure_with: tvm) in {run.lorien_tvm_tuning_s:.1f} s", flush=True)
        cli("export", "--format", "meta_schedule", "--target", "llvm", "--alternate-key", "-o",
            str(work / "lorien_tvm_db"), "--store", tvm_store)
        databases["lorien_measure_with_tvm"] = ms.database.JSONDatabase(work_dir=str(work / "lorien_tvm_db"),
                                                                        allow_missing=False)

    adapter_store = f"parquet:{work / 'adapter_store'}"
    tvm_tasks, tvm_extract_s = extract_as_tvm_user(onnx_path, shapes, target,
                                                   args.tasks if name == "resnet18" else None, selected)
    tvm_tune_s = tune_with_tvm(tvm_tasks, trials, work / "tvm_db", adapter_store, target, args.tvm_builder)
    run.tvm_tuning_s = tvm_extract_s + tvm_tune_s
    print(f"{name}: TVM tuned in {run.tvm_tuning_s:.1f} s (extract {tvm_extract_s:.1f} s + tune_tasks "
          f"{tvm_tune_s:.1f} s)", flush=True)
    databases["tvm"] = ms.database.JSONDatabase(work_dir=str(work / "tvm_db"), allow_missing=False)
    databases["tvm_adapter"] = warehouse_database(adapter_store, target=target)

    for label, database in databases.items():
        run.applied[label] = applied_tasks(mod, database, target, names)

    rng = np.random.default_rng(0)
    params = list(raw["main"].params)
    inputs = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)))
              for p in params]
    machines = {"untuned": relax.VirtualMachine(relax.build(raw, target=target), tvm.cpu())}
    for label, database in databases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            executable = ms.relax_integration.compile_relax(database, raw, target, params=None)
        machines[label] = relax.VirtualMachine(executable, tvm.cpu())
    outputs = {label: vm["main"](*inputs).numpy() for label, vm in machines.items()}
    scale = float(np.max(np.abs(outputs["untuned"]))) or 1.0
    for label, value in outputs.items():
        run.max_error[label] = float(np.max(np.abs(value - outputs["untuned"]))) / scale
        if run.max_error[label] > 1e-3:
            raise SystemExit(f"{name}: the {label} build computes something else than the untuned build "
                             f"(max error {run.max_error[label]:.2g} of the output's magnitude)")
    calls = {label: (lambda vm=vm: vm["main"](*inputs)) for label, vm in machines.items()}
    # the untuned build (10-50x slower: a reference only) takes its --rounds; the tuned builds, which
    # the figures compare, are timed for at least --min-timed-s each, taking turns
    tuned = {label: call for label, call in calls.items() if label != "untuned"}
    run.rounds = rounds_for(tuned, args.rounds, args.min_timed_s)
    timed = {**time_taking_turns({"untuned": calls["untuned"]}, args.rounds), **time_taking_turns(tuned, run.rounds)}
    run.latency_ms = {label: timed[label] * 1e3 for label in calls}

    outcomes = replay_database(work / "tvm_db")
    run.replay_total = len(outcomes)
    run.replay_ok = sum(1 for outcome in outcomes if outcome.status == "ok")
    run.replay_failures = [outcome.summary() for outcome in outcomes if outcome.status != "ok"][:5]

    print(f"{name}: build (compile_relax)      tasks applied   median latency   max rel. error vs untuned   "
          f"(tuned builds: median of {run.rounds} timed calls each, untuned {args.rounds})")
    for label in machines:
        applied = "-" if label == "untuned" else f"{run.applied[label]}/{run.tasks}"
        print(f"{name}:   {label:<24} {applied:>13} {run.latency_ms[label]:12.3f} ms   {run.max_error[label]:.1e}"
              + (f"   (tuner {lorien_label(args.tuner, args.cost_model)})" if label.startswith("lorien") else ""))
    print(f"{name}: TVM/Lorien latency {run.latency_ms['tvm'] / run.latency_ms['lorien']:.3f}; "
          f"tuning time TVM {run.tvm_tuning_s:.1f} s, Lorien {run.lorien_tuning_s:.1f} s "
          f"({run.tvm_tuning_s / run.lorien_tuning_s:.2f}x); TVM's {run.replay_total} records replayed on Lorien's "
          f"engine: {run.replay_ok} ok", flush=True)
    for failure in run.replay_failures:
        print(f"{name}:   replay failed: {failure}")
    return run


def train_guide(store: Path, work: Path) -> Path:
    """The program-feature model of ``--train-store``: benchmarks/costmodel.py's training spread, measured
    into ``store`` where it lacks it (its jobs resume from what the store holds), featurized and
    trained in ``work``; returns the model's directory."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_costmodel", Path(__file__).resolve().parent / "costmodel.py")
    costmodel = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = costmodel  # its dataclasses look their module up
    spec.loader.exec_module(costmodel)
    started = time.perf_counter()
    model, facts = costmodel.train_program_model(work, costmodel.PRETRAINED_SPREAD, trials=16, store_path=store)
    print(f"guide: a program-feature model of {store}'s training spread ({facts.get('records', '?')} records), "
          f"trained in {time.perf_counter() - started:.1f} s (not tuning time): {model}", flush=True)
    return Path(model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 ResNet-18 tasks x 8 trials, the others x 4")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--tasks", type=int, help="ResNet-18 tasks tuned (most FLOPs x weight; default 8)")
    parser.add_argument("--trials", type=int, help="trials per ResNet-18 task (default 32)")
    parser.add_argument("--small-trials", type=int, help="trials per task of the other models (default 8)")
    parser.add_argument("--remeasure", type=int, default=4, help="remeasure_with_tvm: best traces per task "
                                                                 "re-measured by TVM (default 4)")
    parser.add_argument("--measure-with-tvm", action="store_true",
                        help="also tune with measure_with: tvm (every candidate timed by TVM; slow)")
    parser.add_argument("--tvm-builder", choices=["forked", "local"], default="forked",
                        help="TVM's builder: forked (default: forked copies of this process, 30 s per "
                             "candidate, as Lorien's TVM re-measuring builds) or local (TVM's LocalBuilder: fresh workers every batch, 45-80 s each here)")
    parser.add_argument("--tuner", choices=["random", "xgb"],
                        help="the Lorien rows' tuner, written into the extracted YAML as `tuner` (default: none "
                             "written: the job's default, random)")
    parser.add_argument("--cost-model", type=Path, metavar="DIR",
                        help="a pre-trained program-feature model (lorien train --template program -o DIR) guiding "
                             "the Lorien rows' xgb tuner, written into the YAML as `cost_model` (needs --tuner xgb)")
    parser.add_argument("--train-store", type=Path, metavar="DIR",
                        help="with --tuner xgb and no --cost-model: train the guiding model on the records of "
                             "benchmarks/costmodel.py's training spread (24 conv2d / depthwise / dense / batch_matmul "
                             "workloads, none a task of these models, x 3 dialects x 16 random trials) kept in the "
                             "parquet store DIR; the spread is measured into DIR first where DIR lacks it (minutes; "
                             "not counted as tuning time: it is the warehouse's earlier records)")
    parser.add_argument("--rounds", type=int, help="timed calls of the untuned build, and the fewest of each tuned "
                        "build, taking turns, each after an untimed call of the same build (default 30; --quick 10)")
    parser.add_argument("--min-timed-s", type=float, default=2.0, metavar="S",
                        help="time each tuned build for at least S seconds of timed calls (more rounds than "
                             "--rounds where its calls are short; default 2.0)")
    parser.add_argument("--keep-work", type=Path, metavar="DIR",
                        help="work in DIR (created; must not exist) and keep it: the ONNX files, stores and "
                             "databases of every model, for a per-task study (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.tasks = args.tasks or (3 if quick else 8)
    args.trials = args.trials or (8 if quick else 32)
    args.small_trials = args.small_trials or (4 if quick else 8)
    args.rounds = args.rounds or (10 if quick else 30)
    if args.train_store is not None and (args.cost_model is not None or args.tuner != "xgb"):
        parser.error("--train-store trains the model guiding --tuner xgb: give it with --tuner xgb and without "
                     "--cost-model")
    if args.cost_model is not None:
        if args.tuner != "xgb":
            parser.error(f"--cost-model guides the xgb tuner: add --tuner xgb (got "
                         f"{'--tuner ' + args.tuner if args.tuner else 'no --tuner'})")
        from lorien.costmodel.pretrained import check_cost_model_path
        from lorien.errors import ConfigError

        args.cost_model = args.cost_model.resolve()
        try:
            check_cost_model_path(str(args.cost_model), "--cost-model")
        except ConfigError as exc:
            parser.error(str(exc))
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in models if name not in BUILDERS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    try:
        import onnx  # noqa: F401
        import tvm
        import tvm.s_tir.meta_schedule  # noqa: F401
    except ImportError as exc:
        print(f"model_tvm: skipped: needs the tvm extra (pip install 'lorien[tvm]': apache-tvm and onnx): {exc}")
        return 0
    import subprocess

    from dialects.meta_schedule.tvm_measure import keeping_thread_affinity
    from lorien.engine.cpu import host_cpu_name

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")),
                      "unknown CPU")
    target_value = {"kind": "llvm", "mcpu": host_cpu_name(), "num-cores": os.cpu_count() or 1}
    import json

    target_json = json.dumps(target_value)
    target = tvm.target.Target(target_value)
    import logging

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)  # TVM's per-task tables
    print(f"model_tvm: {model_name} ({host_cpu_name()}, {os.cpu_count()} cores), TVM {tvm.__version__}, "
          f"target {target_json}; measure {MEASURE}", flush=True)
    if args.keep_work is not None:
        args.keep_work.mkdir(parents=True)
    root = args.keep_work or Path(tempfile.mkdtemp(prefix="lorien-model-tvm-"))
    os.environ.setdefault("LORIEN_JOURNAL_DIR", str(root / "journal"))
    try:
        if args.train_store is not None:
            args.cost_model = train_guide(args.train_store.resolve(), root)
        runs = []
        for name in models:
            # the timed builds run relax VMs here, and TVM's pool pins this thread to one core:
            # the next model's tuning (and the engine's build workers it starts) must not inherit it
            with keeping_thread_affinity():
                runs.append(run_model(name, args, root, target, target_json))
    finally:
        if args.keep_work is None:
            shutil.rmtree(root, ignore_errors=True)
    applied = sum(run.applied["lorien"] for run in runs)
    tasks = sum(run.tasks for run in runs)
    ratio = min(run.latency_ms["tvm"] / run.latency_ms["lorien"] for run in runs)
    tuning = sum(run.tvm_tuning_s for run in runs) / sum(run.lorien_tuning_s for run in runs)
    replay_ok, replay_total = sum(run.replay_ok for run in runs), sum(run.replay_total for run in runs)
    print(f"lorien tuner: {lorien_label(args.tuner, args.cost_model)}")
    print(f"tasks_applied={applied}/{tasks} lorien_vs_tvm_latency={ratio:.3f} tuning_time_vs_tvm={tuning:.2f} "
          f"replay_tvm_ok={replay_ok}/{replay_total}")
    return 0 if math.isfinite(ratio) else 1


if __name__ == "__main__":
    raise SystemExit(main())
