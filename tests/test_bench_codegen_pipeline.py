"""benchmarks/codegen_pipeline.py on a one-kernel corpus: every setting built, O3 compared with itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lorien.engine import lower, ops, te
from lorien.engine.codegen import llvm as llvm_codegen
from lorien.engine.schedule import create_schedule

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "codegen_pipeline.py"


def test_last_line_counts_identical_objects_of_each_setting(tmp_path):
    data, weight = te.placeholder((8, 8), name="data"), te.placeholder((8, 8), name="weight")
    out = ops.dense(data, weight)
    ir_text = llvm_codegen.render(lower(create_schedule(out), [data, weight, out]), "kernel")
    (tmp_path / "dense.ll").write_text(ir_text)
    result = subprocess.run([sys.executable, str(BENCHMARK), str(tmp_path), "--settings", "noop_options,ir_o2"],
                            capture_output=True, text=True, check=True)
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("files=1 identical=o3:1/1,noop_options:1/1,ir_o2:")
    assert "build_time_vs_o3=o3:1.000," in last
