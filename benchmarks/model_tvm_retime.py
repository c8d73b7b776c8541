"""Builds of one model from databases of several kept runs, timed together taking turns.

``benchmarks/model_tvm.py`` compares Lorien's build with TVM's within one run; which run drew
better traces is noise there. This builds the same model from the databases of several runs
(``--keep-work`` directories: ``DIR/MODEL/lorien_db``, ``lorien_engine_db``, ``tvm_db``) with
``compile_relax``, checks every output against the untuned build's, and times all builds in one
process taking turns (one call each per round, medians), so runs tuned at different loads and
with different tuners are compared on the same moment's machine.

    python benchmarks/model_tvm_retime.py mobilenet_block DIR1 DIR2 ... [--rounds 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DATABASES = ("lorien_db", "lorien_engine_db", "tvm_db")
#: the input shapes benchmarks/model_tvm.py gives the relax frontend (none: the ONNX file's own)
INPUT_SHAPES = {"bert_layer": {"hidden_states": [1, 64, 256]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("model", help="the model's name in the kept directories (e.g. mobilenet_block)")
    parser.add_argument("work", nargs="+", type=Path, help="directories benchmarks/model_tvm.py --keep-work kept")
    parser.add_argument("--rounds", type=int, default=200, help="timed calls of each build, taking turns (default 200)")
    parser.add_argument("--databases", default=",".join(DATABASES),
                        help=f"which databases of each run (default {','.join(DATABASES)})")
    args = parser.parse_args(argv)
    import numpy as np
    import tvm
    import tvm.s_tir.meta_schedule as ms
    from tvm import relax

    from dialects.meta_schedule.relax_tasks import relax_module
    from lorien.engine.cpu import host_cpu_name

    first = args.work[0] / args.model
    onnx_path = first / f"{args.model}.onnx"
    shapes = INPUT_SHAPES.get(args.model, {})
    raw = relax_module(str(onnx_path), shapes)
    # the target benchmarks/model_tvm.py tunes and builds for: this host's CPU, all its cores
    target = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu_name(), "num-cores": os.cpu_count() or 1})
    rng = np.random.default_rng(0)
    inputs = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)))
              for p in raw["main"].params]
    machines = {"untuned": relax.VirtualMachine(relax.build(raw, target=target), tvm.cpu())}
    for work in args.work:
        for name in args.databases.split(","):
            folder = work / args.model / name
            if not folder.is_dir():
                continue
            database = ms.database.JSONDatabase(work_dir=str(folder), allow_missing=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                executable = ms.relax_integration.compile_relax(database, raw, target, params=None)
            machines[f"{work.name}/{name}"] = relax.VirtualMachine(executable, tvm.cpu())
    outputs = {label: vm["main"](*inputs).numpy() for label, vm in machines.items()}
    scale = float(np.max(np.abs(outputs["untuned"]))) or 1.0
    for label, value in outputs.items():
        error = float(np.max(np.abs(value - outputs["untuned"]))) / scale
        if error > 1e-3:
            raise SystemExit(f"{label} computes something else than the untuned build (max error {error:.2g})")
    samples: dict[str, list[float]] = {label: [] for label in machines if label != "untuned"}
    for _ in range(args.rounds):
        for label in samples:
            started = time.perf_counter()
            machines[label]["main"](*inputs)
            samples[label].append(time.perf_counter() - started)
    for label, times in samples.items():
        print(f"{label:<48} {statistics.median(times) * 1e3:8.3f} ms  (p10 {np.percentile(times, 10) * 1e3:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
