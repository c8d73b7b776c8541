"""Tasks as TVM sees them: the fused PrimFuncs of TVM's relax pipeline, verbatim.

``lorien extract model.onnx --dialect meta_schedule -o tasks/model.yaml`` imports each ONNX
model with TVM's relax ONNX frontend, runs the passes TVM runs before tuning (LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR) and takes the tasks of MetaSchedule's
``extract_tasks``: every fused function, matmuls and convolutions with their epilogues as
much as softmax, layer_norm, reshapes and fused elementwise ones. Each task's module is
written as one line of ``database_workload.json`` (TVM's JSONDatabase form, beside the YAML),
and each job names its task by TVM's structural hash with ``workload_file`` pointing at that
file. Tuning such a job reads the module into a compute DAG (:func:`dag_of_module`) and
commits records that carry TVM's entry unchanged, so ``lorien export --format meta_schedule``
writes TVM's own module and TVM applies the records by its own hash. Needs apache-tvm and onnx
to extract; tuning the YAML needs neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lorien.errors import DialectError, LorienError

#: The JSONDatabase workload file written beside the YAML.
WORKLOAD_FILE = "database_workload.json"
#: The target tasks are extracted for unless one is given.
DEFAULT_TARGET = "llvm"


def _tvm() -> tuple[Any, Any, Any]:
    try:
        import tvm
        import tvm.s_tir.meta_schedule as ms
        from tvm import relax
    except ImportError as exc:
        raise DialectError(f"lorien extract --dialect meta_schedule takes TVM's own relax tasks and needs apache-tvm "
                           f"(pip install 'lorien[tvm]'): {exc}. Without it, lorien extract (no --dialect) writes "
                           f"op shorthands the meta_schedule dialect tunes") from exc
    return tvm, ms, relax


def relax_module(onnx_path: str, shapes: dict[str, list[int]] | None = None) -> Any:
    """An ONNX model imported by TVM's relax ONNX frontend (weights bound as constants): the
    module to give ``compile_relax``, which runs the passes of :func:`fused_relax_module` itself
    (given the fused module, it fuses again and no task's hash matches the database)."""
    _, _, _ = _tvm()
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    try:
        model = onnx.load(onnx_path)
    except (OSError, onnx.onnx_cpp2py_export.checker.ValidationError, ValueError) as exc:
        raise DialectError(f"{onnx_path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    return from_onnx(model, shape_dict=shapes or None, keep_params_in_input=False)


def fused_relax_module(onnx_path: str, shapes: dict[str, list[int]] | None = None) -> Any:
    """An ONNX model as TVM tunes it (what ``extract_tasks`` takes): :func:`relax_module`, then
    LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps and FuseTIR."""
    tvm, _, relax = _tvm()
    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
              relax.transform.FuseOps(), relax.transform.FuseTIR()]
    return tvm.transform.Sequential(passes)(relax_module(onnx_path, shapes))


def untunable_reason(module_json: Any) -> str | None:
    """Why Lorien's engine cannot tune a TVM workload module (None: it can): its DAG does not
    read, or no design space is made for it."""
    from dialects.meta_schedule.space import TraceSpace
    from dialects.meta_schedule.workload import dag_of_module

    try:
        TraceSpace(dag_of_module(module_json))
    except LorienError as exc:
        return str(exc)
    return None


def extract_model_tasks(models: Sequence[str], inputs: Sequence[str] = (), batch_size: int | None = None,
                        target: str | None = None, skip_untunable: bool = False) -> Any:
    """The relax tasks of ONNX models, merged across models by structural hash (weights add),
    as a :class:`lorien.models.extract.ModelTasks`. A task the engine cannot tune is a
    DialectError naming it, or, with ``skip_untunable``, left out with a summary line."""
    from lorien.formats.meta_schedule import entry_text
    from lorien.models.extract import ModelTasks, is_onnx_path
    from lorien.models.frontend import parse_input_spec

    tvm, ms, _ = _tvm()
    if not models:
        raise DialectError("no model given: name ONNX files")
    specs = [parse_input_spec(spec) for spec in inputs]
    if batch_size is not None:
        raise DialectError("--batch-size is not taken with --dialect meta_schedule: give each input's shape with "
                           "--input NAME:SHAPE")
    tvm_target = tvm.target.Target(_target_value(target or DEFAULT_TARGET))
    tasks: dict[str, dict[str, Any]] = {}
    modules: dict[str, str] = {}
    lines: list[str] = []
    skipped: list[str] = []
    for model in models:
        if not is_onnx_path(model):
            raise DialectError(f"{model}: --dialect meta_schedule reads ONNX files only (TVM's relax ONNX frontend)")
        name = Path(model).stem
        shapes = {spec.name: list(spec.shape) for spec in specs if spec.name}
        extracted = ms.relax_integration.extract_tasks(fused_relax_module(model, shapes), tvm_target)
        for task in extracted:
            shash, module_json = ms.database.Workload(task.dispatched[0]).as_json()
            task_name = str(task.task_name)
            shash = str(shash)
            if shash in tasks:
                tasks[shash]["weight"] += int(task.weight)
                tasks[shash]["models"] = list(dict.fromkeys([*tasks[shash]["models"], name]))
                continue
            reason = untunable_reason(module_json)
            if reason is not None:
                if not skip_untunable:
                    raise DialectError(f"{model}: task {task_name} (structural hash {shash}) cannot be tuned by "
                                       f"Lorien's engine: {reason}; pass --skip-untunable to leave it out")
                skipped.append(f"skipped {name}/{task_name} ({shash}): {reason}")
                continue
            modules[shash] = entry_text([shash, module_json])
            tasks[shash] = {"name": f"{name}/{task_name}", "workload_key": shash, "task_name": task_name,
                            "weight": int(task.weight), "models": [name]}
        lines.append(f"{name} ({model}): {len(extracted)} relax tasks")
    lines += skipped
    lines.append(f"total: {len(tasks)} tasks (weight {sum(t['weight'] for t in tasks.values())}) from {len(models)} "
                 f"model(s); {len(skipped)} skipped; modules in {WORKLOAD_FILE}")
    report = {"tasks": len(tasks), "skipped": len(skipped), "workload_file": WORKLOAD_FILE,
              "task_names": [task["task_name"] for task in tasks.values()]}
    return ModelTasks(entries=list(tasks.values()), settings={"dialect": "meta_schedule", "workload_file": WORKLOAD_FILE},
                      files={WORKLOAD_FILE: "".join(f"{modules[shash]}\n" for shash in tasks)},
                      summary_lines=lines, report=report)


def _target_value(text: str) -> Any:
    """TVM's target from a JSON dict or a target string."""
    import json

    return json.loads(text) if text.lstrip().startswith("{") else text


def workload_of_file(path: str, workload_key: str) -> list[Any]:
    """The entry ``[shash, module]`` of ``workload_key`` in a JSONDatabase workload file;
    DialectError names the file and the key when it is not there."""
    from lorien.errors import RecordParseError
    from lorien.formats.meta_schedule import read_workloads

    try:
        workloads, _ = read_workloads(path)
    except RecordParseError as exc:
        raise DialectError(f"workload_file {path}: {exc}") from exc
    for workload in workloads.values():
        if workload.shash == workload_key:
            return list(workload.entry)
    raise DialectError(f"workload_file {path} has no workload with structural hash {workload_key} "
                       f"({len(workloads)} workloads there)")
