"""Codegen pipeline benchmark: build time of real candidates' LLVM IR under cheaper settings, and
whether each setting emits the same object code as the engine's O3 pipeline.

The corpus is a directory of ``.ll`` files the engine really built (``LORIEN_DUMP_IR=DIR lorien
tune ...`` writes one per candidate). Every file is built once per setting, the settings taking
turns file by file (rotated, so load hits them alike); for each setting the script prints the
seconds spent in the IR passes and in object emission over the corpus, its build time over the
baseline's (same run), and on how many files its object is byte-identical to the baseline's.

    LORIEN_DUMP_IR=/tmp/corpus lorien tune configs/samples/meta_schedule.yaml --trials 24
    python benchmarks/codegen_pipeline.py /tmp/corpus

Last line: ``files=N identical=<setting>:K/N,... build_time_vs_o3=<setting>:R,...`` (R < 1: cheaper).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import llvmlite.binding as llvm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lorien.engine import cpu  # noqa: E402
from lorien.engine.codegen import llvm as llvm_codegen  # noqa: E402
from lorien.engine.race import rotated  # noqa: E402


def _pipeline(speed_level: int, **options: bool) -> Callable:
    """The engine's IR pipeline (``llvm_codegen.run_passes``) at ``speed_level`` with ``options``."""
    return lambda mod, machine: llvm_codegen.run_passes(mod, machine, speed_level, **options)


def _explicit(mod: llvm.ModuleRef, machine) -> None:
    """A short hand-made pipeline of what llvmlite exposes (it has no LICM, GVN, EarlyCSE or
    IndVarSimplify, which O3 runs)."""
    pb = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
    mpm = llvm.create_new_module_pass_manager()
    mpm.add_always_inliner_pass()
    mpm.add_global_dead_code_eliminate_pass()
    for name in ("sroa", "instruction_combine", "simplify_cfg", "loop_simplify", "lcssa", "loop_rotate",
                 "loop_unroll", "instruction_combine", "new_gvn", "sccp", "dead_store_elimination",
                 "aggressive_dce", "instruction_combine", "simplify_cfg"):
        getattr(mpm, f"add_{name}_pass")()
    mpm.run(mod, pb)


#: LLVM options (set, then reset to their defaults) each of which left the object code of the
#: first corpus (112 files) unchanged: passes with nothing to do on the engine's kernels.
NOOP_OPTIONS = (("-enable-constraint-elimination=false", "-enable-constraint-elimination=true"),
                ("-enable-infer-alignment-pass=false", "-enable-infer-alignment-pass=true"),
                ("-enable-loop-load-elim=false", "-enable-loop-load-elim=true"),
                ("-enable-post-pgo-loop-rotation=false", "-enable-post-pgo-loop-rotation=true"),
                ("-disable-consthoist", "-disable-consthoist=false"),
                ("-disable-early-ifcvt", "-disable-early-ifcvt=false"),
                ("-disable-early-taildup", "-disable-early-taildup=false"),
                ("-disable-mergeicmps", "-disable-mergeicmps=false"),
                ("-disable-separate-const-offset-from-gep", "-disable-separate-const-offset-from-gep=false"),
                ("-disable-tail-duplicate", "-disable-tail-duplicate=false"),
                ("-disable-x86-domain-reassignment", "-disable-x86-domain-reassignment=false"),
                ("-x86-cmov-converter=false", "-x86-cmov-converter=true"),
                ("-x86-disable-avoid-SFB", "-x86-disable-avoid-SFB=false"))


def settings(target: cpu.CpuTarget) -> dict[str, tuple[Callable, object, object, bool]]:
    """name -> (IR passes, machine the passes get, machine that emits, NOOP_OPTIONS set)."""
    o3 = target.machine()
    o2 = cpu._llvm_target().create_target_machine(cpu=target.cpu, features=target.features, opt=2,
                                                  codemodel="jitdefault")
    return {
        "o3": (_pipeline(3), o3, o3, False),
        "noop_options": (_pipeline(3), o3, o3, True),
        "ir_o2": (_pipeline(2), o3, o3, False),
        "ir_o1": (_pipeline(1), o3, o3, False),
        "codegen_o2": (_pipeline(3), o3, o2, False),
        "ir_o3_no_unroll": (_pipeline(3, loop_unrolling=False), o3, o3, False),
        "explicit": (_explicit, o3, o3, False),
    }


def _set(options: bool) -> None:
    for on, off in NOOP_OPTIONS:
        llvm.set_option("codegen_pipeline", on if options else off)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="directory of .ll files (LORIEN_DUMP_IR of a tuning run)")
    parser.add_argument("--settings", help="comma-separated subset of the settings (o3 always runs)")
    parser.add_argument("--limit", type=int, help="at most this many files (sorted by name)")
    args = parser.parse_args()
    llvm_codegen._codegen_options()
    target = cpu.host_cpu()
    table = settings(target)
    if args.settings:
        table = {name: table[name] for name in ["o3", *args.settings.split(",")] if name in table}
    files = sorted(args.corpus.rglob("*.ll"))[: args.limit]
    passes_s = dict.fromkeys(table, 0.0)
    emit_s = dict.fromkeys(table, 0.0)
    identical = dict.fromkeys(table, 0)
    names = list(table)
    for index, path in enumerate(files):
        ir_text = path.read_text()
        objects = {}
        for name in rotated(names, index):
            run, pass_machine, emit_machine, options = table[name]
            _set(options)
            mod = llvm_codegen.parse_module(ir_text, emit_machine)
            start = time.perf_counter()
            run(mod, pass_machine)
            middle = time.perf_counter()
            objects[name] = emit_machine.emit_object(mod)
            passes_s[name] += middle - start
            emit_s[name] += time.perf_counter() - middle
        for name in names:
            identical[name] += objects[name] == objects["o3"]
        if any(objects[name] != objects["o3"] for name in names):
            print(f"{path.name}: differs in {[n for n in names if objects[n] != objects['o3']]}", file=sys.stderr)
    base = passes_s["o3"] + emit_s["o3"]
    for name in names:
        total = passes_s[name] + emit_s[name]
        print(f"{name:18s} passes {passes_s[name]:7.2f} s  emit {emit_s[name]:7.2f} s  total {total:7.2f} s  "
              f"vs_o3 {total / base:.3f}  identical {identical[name]}/{len(files)}")
    print(f"files={len(files)} identical=" + ",".join(f"{n}:{identical[n]}/{len(files)}" for n in names)
          + " build_time_vs_o3=" + ",".join(f"{n}:{(passes_s[n] + emit_s[n]) / base:.3f}" for n in names))


if __name__ == "__main__":
    main()
