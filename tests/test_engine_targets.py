"""The engine builds and runs kernels for the CPU a target names: -mcpu, -mattr, -num-cores."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lorien.engine import build, reference
from lorien.engine.codegen import llvm as llvm_codegen
from lorien.engine.cpu import building_for, cpu_target, current, host_cpu
from lorien.engine.measure import Builder, MeasureInput, MeasureOption, Runner, measure_batch
from lorien.engine.x86 import dense_candidate
from lorien.errors import TargetError
from lorien.record import ErrorNo

REPO_ROOT = Path(__file__).resolve().parent.parent
HASWELL = "llvm -mcpu=haswell -num-cores=1"
AVX512_HOST = host_cpu().lanes == 16


def _dense_kernel(target: str | None):
    with building_for(target):
        schedule, tensors = dense_candidate(16, 64, 32, mr=4, nr=32)
    return build(schedule, tensors, target=target)


def _run_dense(kernel) -> None:
    rng = np.random.default_rng(0)
    data, weight = rng.uniform(-1, 1, (16, 32)).astype("float32"), rng.uniform(-1, 1, (64, 32)).astype("float32")
    out = np.zeros((16, 64), "float32")
    kernel(data, weight, out)
    np.testing.assert_allclose(out, reference.dense(data, weight), rtol=1e-4, atol=1e-4)


def test_a_kernel_built_for_haswell_uses_no_avx512_instructions():
    kernel = _dense_kernel(HASWELL)
    assembly = llvm_codegen.assembly(kernel.ir_text, cpu_target(HASWELL))
    assert "ymm" in assembly and "zmm" not in assembly
    _run_dense(kernel)


@pytest.mark.skipif(not AVX512_HOST, reason="the host has no AVX-512")
def test_a_kernel_built_for_the_avx512_host_uses_512_bit_registers():
    kernel = _dense_kernel(None)
    assert "zmm" in llvm_codegen.assembly(kernel.ir_text)
    _run_dense(kernel)


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None, reason="no C compiler")
def test_the_c_renderer_compiles_for_the_target_cpu_and_its_threads():
    target = "c -mcpu=haswell -num-cores=1"
    with building_for(target):
        schedule, tensors = dense_candidate(16, 64, 32, mr=4, nr=32)
    kernel = build(schedule, tensors, target=target)
    assert "#pragma omp parallel for num_threads(1)" in kernel.ir_text
    _run_dense(kernel)


def test_schedules_built_for_a_target_see_its_vector_width():
    with building_for("llvm -mcpu=haswell"):
        assert current().lanes == 8
        with building_for("llvm -mcpu=x86-64"):
            assert current().lanes == 4
    assert current() == host_cpu()


def test_mattr_removes_features_from_the_host_cpu():
    if not AVX512_HOST:
        pytest.skip("the host has no AVX-512 to remove")
    assert cpu_target("llvm -mattr=-avx512f").lanes == 8


@pytest.mark.parametrize("target, message", [
    ("llvm -mcpu=pentium-9000", "-mcpu=pentium-9000 is not a CPU LLVM"),
    ("cuda", "is not a CPU target"),
    ("llvm -num-cores=0", "-num-cores must be a positive integer, got 0"),
    ("llvm -mtriple=aarch64-linux-gnu", "not -mtriple=aarch64-linux-gnu"),
    ("llvm -mattr=avx2", "must start with \\+ or -"),
])
def test_targets_the_engine_cannot_build_for_are_clear_errors(target, message):
    with pytest.raises(TargetError, match=message):
        cpu_target(target)


def test_build_fields_name_the_cpu_code_was_made_for_its_vectors_and_threads():
    fields = cpu_target(HASWELL).build_fields()
    assert (fields["mcpu"], fields["vector_lanes"], fields["threads"]) == ("haswell", 8, 1)
    assert fields["cpu"] == host_cpu().cpu and fields["engine"].startswith("lorien-")


def test_a_kernel_for_one_core_says_so_and_leaves_the_runtime_as_it_was():
    from lorien.engine import runtime

    before = runtime.num_threads()
    kernel = _dense_kernel(HASWELL)
    assert kernel.num_threads == 1
    _run_dense(kernel)
    assert runtime.num_threads() == before


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to tell one thread from several")
def test_a_kernel_for_one_core_runs_its_parallel_loops_on_the_calling_thread_only():
    """CPU time of the runtime's worker threads (from /proc) while a parallel kernel runs:
    none with -num-cores=1, some with the default thread count."""
    script = textwrap.dedent("""
        import time
        from pathlib import Path
        import numpy as np
        from lorien.engine import build, te
        from lorien.engine.schedule import create_schedule

        def worker_cpu_ticks():
            ticks = 0
            for task in Path("/proc/self/task").iterdir():
                if int(task.name) != threading_main:
                    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                    ticks += int(fields[11]) + int(fields[12])
            return ticks

        import threading
        threading_main = threading.get_native_id()
        a = te.placeholder((1 << 16,), name="a")
        out = te.compute((1 << 16,), lambda i: a[i] * 2.0 + 1.0, name="out")
        s = create_schedule(out)
        outer, inner = s[out].split(out.op.axis[0], factor=256)
        s[out].parallel(outer)
        s[out].vectorize(inner)
        x, y = np.ones(1 << 16, "float32"), np.zeros(1 << 16, "float32")
        for target in ("llvm", "llvm -num-cores=1", "llvm"):
            kernel = build(s, [a, out], target=target)
            kernel(x, y)
            time.sleep(0.2)  # workers stop spinning and sleep
            before = worker_cpu_ticks()
            started = time.process_time()
            while time.process_time() - started < 0.5:
                kernel.time(x, y, number=200)
            print(target, worker_cpu_ticks() - before)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), LORIEN_NUM_THREADS="2", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    output = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    ticks = [int(line.rsplit(" ", 1)[1]) for line in output.splitlines()]
    assert ticks[1] == 0, output
    assert ticks[0] > 0 and ticks[2] > 0, output


def _vector_registers(obj: bytes, tmp_path) -> set[str]:
    """The kinds of vector register (xmm, ymm, zmm) an object file's code uses (objdump -d)."""
    path = tmp_path / f"kernel{len(list(tmp_path.iterdir()))}.o"
    path.write_bytes(obj)
    text = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"%([xyz]mm)\d+", text))


def test_the_builder_builds_each_candidate_for_its_own_target(tmp_path):
    builder, runner = Builder.create("local", n_parallel=1), Runner.create("local")
    try:
        inputs = [MeasureInput(functools.partial(dense_candidate, 8, 64, 32, 4, 32), reference.dense, target=target)
                  for target in (HASWELL, "llvm -mcpu=x86-64")]
        built = builder.build(inputs, MeasureOption())
        assert [result.artifact["target"].cpu for result in built] == ["haswell", "x86-64"]
        # the objects themselves: 256-bit (ymm) vectors for haswell, 128-bit (xmm) ones only for x86-64
        registers = [_vector_registers(result.artifact["object"], tmp_path) for result in built]
        assert "ymm" in registers[0] and registers[1] == {"xmm"}, registers
        results = runner.run(inputs, built, MeasureOption())
        assert [r.error_no for r in results] == [ErrorNo.NO_ERROR] * 2, [r.error_msg for r in results]
    finally:
        builder.pool.shutdown()
        runner.pool.shutdown()


@pytest.mark.skipif(AVX512_HOST, reason="an AVX-512 host runs every x86 vector width")
def test_code_with_wider_vectors_than_the_host_has_fails_before_it_runs():
    inp = MeasureInput(functools.partial(dense_candidate, 8, 64, 32, 4, 32), reference.dense,
                       target="llvm -mcpu=skylake-avx512")
    (result,) = measure_batch([inp], MeasureOption())
    assert result.error_no == ErrorNo.RUNTIME_DEVICE and "512-bit vectors" in result.error_msg
