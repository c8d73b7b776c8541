"""LLVM options of the engine, judged by the kernels: each record of a store rebuilt under every
setting, the build timed, and the kernels of all settings timed in turns.

``benchmarks/codegen_pipeline.py`` asks whether a cheaper setting emits the same object code; a
setting that changes it may still make kernels as fast. Here every valid record the engine
measured in a store (a tuning run's; any dialect whose records lower to the engine) is lowered
once for the target it was timed on (``record.measured_target``), then compiled under each
setting (LLVM options set for that build and reset after it; the settings take turns record by
record, rotated), and every kernel is timed on the same arrays: ``--rounds`` rounds, the settings
in turns (reversed every other round), each timing an untimed run then one repeat of at least 5
ms; a kernel's time is its fastest. ``engine_again`` builds with the engine's own options a
second time: how far two builds of the same code move apart under this timing (the noise floor).

    lorien tune configs/samples/meta_schedule.yaml --store parquet:/tmp/ms-store
    python benchmarks/codegen_kernels.py /tmp/ms-store

Last line: ``kernels=N build_time_vs_engine=<setting>:R,... kernel_time_vs_engine=<setting>:G,...``
(R: the setting's compile seconds over the engine's, same run; G: geomean of each kernel's time
under the setting over its time under the engine's options; both below 1 mean cheaper / faster).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: name -> (LLVM options set for the build, the options that restore the engine's own): the
#: engine's options (``build``, ``lorien apply``: ``_codegen_options``), the same again, those of
#: its measurement builds (``measurement_codegen_options``: no pre-RA machine scheduler), and
#: those without loop strength reduction as well.
SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "engine": ((), ()),
    "engine_again": ((), ()),
    "measurement": (("-enable-misched=false",), ("-enable-misched=true",)),
    "no_lsr": (("-enable-misched=false", "-disable-lsr"), ("-enable-misched=true", "-disable-lsr=false")),
}


def lowered_records(store_uri: str, limit: int | None) -> list[tuple[object, object, str, str]]:
    """(CPU target timed on, lowered program, function name, IR text) of the store's valid engine
    records."""
    from lorien.engine import cpu
    from lorien.engine.codegen import llvm as llvm_codegen
    from lorien.engine.lower import lower
    from lorien.plugins import get_dialect
    from lorien.record import MEASURED_BY_ENGINE, TuningRecord
    from lorien.warehouse import open_store

    out = []
    with open_store(store_uri) as store:
        rows = store.scan().to_pylist()
        for row in rows:
            record = TuningRecord.from_row(row)
            if record.measured_by != MEASURED_BY_ENGINE or not record.is_valid:
                continue
            target = record.measured_target or record.target
            with cpu.building_for(target) as built_for:
                schedule, args = get_dialect(record.dialect).schedule_record(record, store)
                program = lower(schedule, list(args), "kernel")
            name = f"kernel_{len(out)}"
            out.append((built_for, program, name, llvm_codegen.render(program, name)))
            if limit is not None and len(out) >= limit:
                break
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("store", help="a store URI or parquet directory holding engine-measured records")
    parser.add_argument("--settings", help=f"comma-separated, of {', '.join(SETTINGS)} (engine always runs; "
                                           "default: all)")
    parser.add_argument("--limit", type=int, help="at most this many records")
    parser.add_argument("--rounds", type=int, default=7, help="timings of each kernel, settings in turns (default 7)")
    args = parser.parse_args(argv)
    import llvmlite.binding as llvm

    from lorien.engine.arrays import pack_arguments
    from lorien.engine.build import Kernel
    from lorien.engine.codegen import llvm as llvm_codegen
    from lorien.engine.lower import Program
    from lorien.engine.measure import _fresh_logical_arrays
    from lorien.engine.race import rotated

    names = ["engine", *[n for n in (args.settings.split(",") if args.settings else SETTINGS) if n != "engine"]]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; known: {', '.join(SETTINGS)}")
    store = args.store if ":" in args.store.split("/")[0] else f"parquet:{args.store}"
    records = lowered_records(store, args.limit)
    if not records:
        print(f"codegen_kernels: no valid engine-measured record in {store}")
        return 1
    llvm_codegen._codegen_options()
    compile_s = dict.fromkeys(names, 0.0)
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    for index, (target, program, fn_name, ir_text) in enumerate(records):
        machine = target.machine()
        kernels = {}
        for name in rotated(names, index):
            options, reset = SETTINGS[name]
            symbol = f"{fn_name}_{name}"
            for option in options:
                llvm.set_option("codegen_kernels", option)
            try:
                started = time.perf_counter()
                module = llvm_codegen.parse_module(ir_text.replace(fn_name, symbol), machine)
                llvm_codegen.run_passes(module, machine)
                obj = machine.emit_object(module)
                compile_s[name] += time.perf_counter() - started
            finally:
                for option in reset:
                    llvm.set_option("codegen_kernels", option)
            address = llvm_codegen.load_object(obj, symbol)
            kernels[name] = Kernel(Program(program.name, [], program.args), address, "", symbol, target.num_cores)
        arrays = pack_arguments(program.args, _fresh_logical_arrays(program.args, 0))
        fastest = dict.fromkeys(names, math.inf)
        for round_number in range(args.rounds):
            for name in (names if round_number % 2 == 0 else names[::-1]):
                costs = kernels[name].time(*arrays, number=1, repeat=1, min_repeat_ms=5)
                fastest[name] = min(fastest[name], float(min(costs)))
        for name in names[1:]:
            ratios[name].append(fastest[name] / fastest["engine"])
    print(f"codegen_kernels: {len(records)} kernels of {store}, {args.rounds} rounds")
    for name in names:
        line = f"  {name:14s} compile {compile_s[name]:7.2f} s  vs engine {compile_s[name] / compile_s['engine']:.3f}"
        if name in ratios:
            values = np.array(ratios[name])
            line += (f"  kernel time vs engine: geomean {math.exp(float(np.log(values).mean())):.4f}, "
                     f"p10 {np.percentile(values, 10):.3f}, p90 {np.percentile(values, 90):.3f}, "
                     f"min {values.min():.3f}, max {values.max():.3f}")
        print(line)
    print(f"kernels={len(records)} build_time_vs_engine="
          + ",".join(f"{n}:{compile_s[n] / compile_s['engine']:.3f}" for n in names[1:])
          + " kernel_time_vs_engine="
          + ",".join(f"{n}:{math.exp(float(np.log(np.array(ratios[n])).mean())):.4f}" for n in names[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
