"""TVM-true latencies: meta_schedule traces built and timed by apache-tvm (needs the ``tvm`` extra).

Lorien's engine is a different machine model from TVM's: the same trace compiles to other code
and times differently (14.7 vs 21.1 us on a small dense; 62.4 vs 91.1 us on a larger one), so a
latency the engine measured is not what TVM would see when it compiles that trace. Here a trace
is applied to the workload's TVM module (:func:`~dialects.meta_schedule.tvm_database.tvm_module_of`,
blocks named as TVM names them) with ``tvm.s_tir.Schedule``, built with MetaSchedule's own
``default_build`` and timed with the module's ``time_evaluator`` under the job's ``measure``
settings (``number``, ``repeat``, ``min_repeat_ms``, ``flush_cache`` as TVM's
``cache_flush_cpu_non_first_arg``), the output checked against NumPy first. The traces of one
call (a batch of ``measure_with: tvm``, the best traces of ``remeasure_with_tvm``) are all built
first and then timed taking turns, one timing of each per round, ``repeat`` rounds, so that
the load of a shared machine falls on all of them alike.

Candidates are not built by TVM's LocalBuilder, whose fresh workers spend most of a minute
importing TVM on a small machine: each is built in a forked copy of this process
(:func:`build_in_fork`), which has TVM imported already, under the job's ``build_timeout_s``.
Some candidates of TVM's own design space make LLVM run for more than 15 minutes (a softmax
whose ``pragma_auto_unroll_max_step`` unrolls 64 dependent 64-lane strided gathers); such a
build is killed at the timeout and the candidate fails with ``BUILD_TIMEOUT``. Kernels run in
this process, so ``run_timeout_s`` does not apply. A candidate TVM cannot apply, build or run
becomes a record with the matching error code, as on the engine. Every record measured here says so in its
``build`` JSON: ``measured_by: "tvm"``, ``tvm_version``, ``runner``, the ``tvm_target`` it was
built for and the runtime's ``threads``.

A target without ``-mcpu`` is built for this host's CPU, as Lorien's engine builds it (TVM itself
would generate generic x86-64 code for plain ``llvm``); TVM's runtime uses as many threads as it
decides (``TVM_NUM_THREADS``), as it will when the model runs.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.connection
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from lorien.engine.dag import ComputeDAG
from lorien.errors import ConfigError, DialectError
from lorien.record import FAILED_COST_S, MEASURED_BY_TVM, ErrorNo, TuningRecord

#: Who measures a meta_schedule job's candidates (its ``measure_with`` option).
MEASURE_WITH = ("lorien", "tvm")
#: How candidates are timed here, as the ``runner`` of a TVM-measured record's build says.
RUNNER = "tvm default_build + time_evaluator, in process"
#: How ``lorien export --measure-with-tvm`` times records: MetaSchedule's default
#: ``EvaluatorConfig`` (``number`` 3, ``min_repeat_ms`` 100), repeated 3 times, not once, so
#: that one busy moment of a shared machine does not become the latency.
EXPORT_MEASURE = {"number": 3, "repeat": 3, "min_repeat_ms": 100}
#: Re-measured finalists whose medians are within this fraction of the leader's are a tie: the
#: race ends (:meth:`TvmMeasurer._race`).
RACE_TIE = 0.02
#: :func:`forked_builder`'s limit on one candidate's build, TVM's LocalBuilder default.
BUILD_TIMEOUT_S = 30.0


@contextlib.contextmanager
def keeping_thread_affinity() -> Iterator[None]:
    """Run the body, then give the calling thread back the CPUs it was allowed before (where
    the system has affinities at all)."""
    getter = getattr(os, "sched_getaffinity", None)
    before = getter(0) if getter is not None else None
    try:
        yield
    finally:
        if before is not None and os.sched_getaffinity(0) != before:
            os.sched_setaffinity(0, before)


@dataclass(frozen=True)
class CandidateFailure:
    """Why a candidate could not be timed: its error code and TVM's (or the check's) message."""

    error_no: ErrorNo
    message: str


class BuildTimeout(Exception):
    """A candidate's build ran past its time limit; its worker was killed."""


def _build_child(build: Callable[[], str], conn: Any) -> None:
    try:
        conn.send(("ok", build()))
    except BaseException as exc:  # noqa: BLE001 - the parent raises it, named, for this candidate
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def build_in_fork(build: Callable[[], str], timeout_s: float) -> str:
    """``build()`` (which writes an artifact and returns its path) run in a forked copy of this
    process, so that it needs no fresh import of TVM and can be stopped: past ``timeout_s`` the
    copy is killed and :class:`BuildTimeout` raised; an exception in the copy is raised here as
    RuntimeError with its type and message. A build that never returns (LLVM on a huge unrolled
    function) cannot be interrupted in this process's own thread."""
    outcome = build_in_forks([build], timeout_s, parallel=1)[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def build_in_forks(builds: Sequence[Callable[[], str]], timeout_s: float,
                   parallel: int | None = None) -> list[str | Exception]:
    """Each of ``builds`` run as :func:`build_in_fork` runs one, up to ``parallel`` forked copies at
    a time (default: this machine's CPU count; TVM's LocalBuilder also builds a batch on every
    core), each under its own ``timeout_s``. One outcome per build, in order: the artifact's path,
    or the :class:`BuildTimeout` / RuntimeError that build raised."""
    context = multiprocessing.get_context("fork")
    outcomes: list[str | Exception | None] = [None] * len(builds)
    pending = list(enumerate(builds))[::-1]
    running: dict[Any, tuple[int, Any, float]] = {}  # receiving end -> (index, worker, deadline)
    limit = max(1, parallel or os.cpu_count() or 1)
    try:
        while pending or running:
            while pending and len(running) < limit:
                index, build = pending.pop()
                receive, send = context.Pipe(duplex=False)
                worker = context.Process(target=_build_child, args=(build, send), daemon=True)
                worker.start()
                send.close()
                running[receive] = (index, worker, time.monotonic() + timeout_s)
            nearest = min(deadline for _, _, deadline in running.values())
            ready = multiprocessing.connection.wait(list(running), max(0.0, nearest - time.monotonic()))
            now = time.monotonic()
            for receive in list(running):
                index, worker, deadline = running[receive]
                if receive in ready:
                    outcomes[index] = _received(receive, worker)
                elif now >= deadline:
                    outcomes[index] = BuildTimeout(f"the build ran past its {timeout_s:g} s limit and was stopped")
                else:
                    continue
                del running[receive]
                _stop(worker, receive)
    finally:
        for receive, (_, worker, _) in running.items():
            _stop(worker, receive)
    return outcomes  # type: ignore[return-value] - every build has its outcome once the loop ends


def _received(receive: Any, worker: Any) -> str | Exception:
    """What a build's forked copy sent: the artifact's path, or RuntimeError with its error (or death)."""
    try:
        status, value = receive.recv()
    except EOFError:
        worker.join()
        return RuntimeError(f"the build's worker died (exit code {worker.exitcode})")
    return value if status == "ok" else RuntimeError(value)


def _stop(worker: Any, receive: Any) -> None:
    if worker.is_alive():
        worker.kill()
    worker.join()
    receive.close()


def require_tvm(why: str) -> Any:
    """The ``tvm`` module, or DialectError saying ``why`` it is needed and what to install."""
    try:
        import tvm
        import tvm.s_tir.meta_schedule  # noqa: F401 - the builder measuring needs
    except ImportError as exc:
        raise DialectError(f"{why} needs apache-tvm, which does not import here ({exc}); install it with "
                           f"pip install 'lorien[tvm]'") from exc
    return tvm


def tvm_target_dict(target: str) -> dict[str, Any]:
    """TVM's JSON dict of a CPU target string, built for this host's CPU when it names no ``-mcpu``."""
    from dialects.meta_schedule.records import target_dict
    from lorien.engine.cpu import CPU_KINDS, host_cpu_name
    from lorien.target import parse_target

    parsed = parse_target(target)
    if parsed.kind not in CPU_KINDS:
        raise DialectError(f"measuring through TVM is for CPU targets here, not {target!r}")
    value = target_dict(parsed)
    value.setdefault("mcpu", host_cpu_name())
    return value


@functools.lru_cache(maxsize=8)
def tvm_build_info(target: str) -> str:
    """The ``build`` JSON of a record TVM measured here for ``target``: ``measured_by: "tvm"``,
    TVM's version, LLVM and runner, the target it built for, the host's CPU, vectors, caches
    and TVM's runtime threads (keys sorted, as the engine's)."""
    tvm = require_tvm("measuring with TVM")
    from lorien.engine.cpu import cpu_target

    tvm_target = tvm_target_dict(target)
    fields = cpu_target(f"llvm -mcpu={tvm_target['mcpu']}").build_fields()
    del fields["engine"]
    with keeping_thread_affinity():  # asking for TVM's threads starts its pool, which pins this thread
        threads = int(tvm.get_global_func("runtime.NumThreads")())
    fields.update({"measured_by": MEASURED_BY_TVM, "tvm_version": tvm.__version__, "runner": RUNNER,
                   "tvm_target": tvm_target, "llvm": str(tvm.target.codegen.llvm_version_major()),
                   "threads": threads})
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS).decode()


def tvm_runtime_threads() -> int:
    """Threads TVM's CPU runtime runs a parallel loop on in a process started as this one is,
    by TVM 0.27's rule and without importing TVM: ``TVM_NUM_THREADS``, else ``OMP_NUM_THREADS``,
    else half the online CPUs on x86-64 (TVM assumes two hardware threads a core) and all of
    them elsewhere; at least 1, at most the online CPUs. On a 2-vCPU machine without SMT that is
    1: a TVM-built model runs its parallel loops on one thread there, where the engine would use two."""
    online = os.sysconf("SC_NPROCESSORS_ONLN")
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        wanted = os.environ.get(name, "").strip()
        if wanted:
            if not wanted.isdigit() or int(wanted) < 1:
                raise ConfigError(f"${name} is {wanted!r}; TVM's runtime takes a positive thread count")
            return max(1, min(int(wanted), online))
    halved = platform.machine().lower() in ("x86_64", "amd64")
    return max(1, online // 2 if halved else online)


def check_measure_with(value: Any, target: str) -> None:
    """Check a job's ``measure_with``: one of :data:`MEASURE_WITH`; ``tvm`` needs apache-tvm
    and a CPU target. DialectError names what is wrong, before anything is measured."""
    if value not in MEASURE_WITH:
        raise DialectError(f"'measure_with' must be one of {list(MEASURE_WITH)}, got {value!r}")
    if value == "tvm":
        require_tvm("'measure_with: tvm' (candidates built and timed by TVM)")
        tvm_target_dict(target)


class TvmMeasurer:
    """``measure(traces) -> results`` of a job measured through TVM: each trace applied to the
    workload's TVM module, built, checked against NumPy and timed by TVM; one
    :class:`lorien.engine.measure.MeasureResult` each, whose ``extra["build"]`` is the
    record's build JSON (:func:`tvm_build_info`)."""

    def __init__(self, dag: ComputeDAG, measure: dict[str, Any] | None, target: str,
                 entry: Sequence[Any] | None = None, race_from: int | None = None):
        from lorien.engine.measure import MeasureOption

        self.tvm = require_tvm("measuring with TVM")
        try:
            self.option = MeasureOption(**(measure or {}))
        except TypeError as exc:
            raise ConfigError(f"bad measure options {measure}: {exc}") from exc
        self.dag, self.target = dag, target
        #: TVM's ``[shash, module]`` of the workload when it is a TVM task (``lorien extract
        #: --dialect meta_schedule``): its module is scheduled as it is; else the DAG's.
        self.entry = None if entry is None or isinstance(entry[1], dict) else list(entry)
        #: From this round on, a trace whose fastest timing is slower than the slowest timing of
        #: the trace ahead (the lowest median) is timed no more, and once one trace is left (or
        #: those left tie with the leader) the rounds end (:meth:`_race`); None, or a call with one
        #: trace to time: every trace is timed ``repeat`` times (a lone finalist's mean is its
        #: exported latency).
        self.race_from = race_from
        self.tvm_target = self.tvm.target.Target(tvm_target_dict(target))
        self.build = tvm_build_info(target)
        self._module: Any = None
        self._inputs: list[np.ndarray] | None = None
        self._expected: list[np.ndarray] | None = None

    def __call__(self, traces: Sequence[Any]) -> list[Any]:
        return self.measure_taking_turns(traces)

    def measure_one(self, trace: Any) -> Any:
        """One trace built and timed by TVM (a MeasureResult; a failure has its error code)."""
        return self.measure_taking_turns([trace])[0]

    def measure_taking_turns(self, traces: Sequence[Any]) -> list[Any]:
        """Traces built, checked and timed by TVM, one MeasureResult each, their ``repeat``
        timings taken in turns after a warm-up round that is not recorded (:meth:`_calibrated_number`):
        every trace once (``number`` runs, at least ``min_repeat_ms``), then every trace again,
        ``repeat`` rounds. A burst of load from another process then
        falls on all of them alike rather than on the one trace being timed, which matters
        where their TVM latencies choose between them (``remeasure_with_tvm``).

        TVM's thread pool pins the thread that runs a parallel kernel to one core (its
        ``TVM_BIND_THREADS`` default); that thread's CPU affinity is given back afterwards, so
        the rest of the process (Lorien's engine, NumPy) is not left on one core."""
        with keeping_thread_affinity():
            return self._measure_taking_turns(traces)

    def _measure_taking_turns(self, traces: Sequence[Any]) -> list[Any]:
        from lorien.engine.measure import MeasureResult

        results: list[Any] = [None] * len(traces)
        ready: list[tuple[int, Any, list[Any]]] = []
        started = time.time()
        for index, prepared in enumerate(self._prepare(traces)):
            if isinstance(prepared, CandidateFailure):
                results[index] = MeasureResult([FAILED_COST_S], int(prepared.error_no), time.time() - started,
                                               time.time(), prepared.message[:2000], extra={"build": self.build})
            else:
                ready.append((index, *prepared))
        costs: dict[int, list[float]] = {index: [] for index, *_ in ready}
        numbers: dict[int, int] = {}  # runs per timing that reach min_repeat_ms, found by the warm-up round
        failed: dict[int, str] = {}
        dropped: set[int] = set()
        for round_number in range(0, max(1, int(self.option.repeat)) + 1):
            for index, kernel, arrays in ready:
                if index in failed or index in dropped:
                    continue
                try:
                    seconds = self._time_once(kernel, arrays, numbers.get(index))
                except Exception as exc:  # noqa: BLE001 - the candidate's runtime error, as in measure_one
                    failed[index] = f"{type(exc).__name__}: {exc}"
                    continue
                if round_number == 0:  # the warm-up round: not recorded
                    numbers[index] = self._calibrated_number(seconds)
                else:
                    costs[index].append(seconds)
            if round_number == 0:
                continue
            if self.race_from is not None and round_number >= self.race_from and len(ready) > 1:
                racing = {index: costs[index] for index, _, _ in ready if index not in failed and index not in dropped}
                dropped |= self._race(racing)
                if len(racing) - len(racing.keys() & dropped) <= 1:
                    break
        for index, _, _ in ready:
            error_no, message = ((ErrorNo.RUNTIME_DEVICE, failed[index]) if index in failed
                                 else (ErrorNo.NO_ERROR, ""))
            results[index] = MeasureResult(costs[index] if index not in failed else [FAILED_COST_S], int(error_no),
                                           time.time() - started, time.time(), message[:2000],
                                           extra={"build": self.build})
        return results

    def _prepare(self, traces: Sequence[Any]) -> list[tuple[Any, list[Any]] | CandidateFailure]:
        """Each trace applied, built and its output checked: ``(kernel, arrays)`` ready to time, or
        the failure of the stage that failed. The applied traces are built together, in parallel
        forked copies of this process (:meth:`_build_all`)."""
        # The isolation boundary, as in the engine's workers: whatever TVM raises applying,
        # building or running one candidate becomes that candidate's error, with its message.
        prepared: list[Any] = [None] * len(traces)
        scheduled: dict[int, Any] = {}
        for index, trace in enumerate(traces):
            try:
                scheduled[index] = self._schedule(trace)
            except Exception as exc:  # noqa: BLE001 - see above
                prepared[index] = CandidateFailure(ErrorNo.INSTANTIATION_ERROR, f"{type(exc).__name__}: {exc}")
        built = self._build_all(list(scheduled.values()), [traces[index] for index in scheduled])
        for index, kernel in zip(scheduled, built, strict=True):
            if isinstance(kernel, BuildTimeout):
                prepared[index] = CandidateFailure(ErrorNo.BUILD_TIMEOUT, str(kernel))
                continue
            if isinstance(kernel, Exception):
                prepared[index] = CandidateFailure(ErrorNo.COMPILE_HOST, f"{type(kernel).__name__}: {kernel}")
                continue
            try:
                arrays = self._arrays()
                wrong = self._check(kernel, arrays)
            except Exception as exc:  # noqa: BLE001 - see above
                prepared[index] = CandidateFailure(ErrorNo.RUNTIME_DEVICE, f"{type(exc).__name__}: {exc}")
                continue
            prepared[index] = CandidateFailure(ErrorNo.WRONG_ANSWER, wrong) if wrong else (kernel, arrays)
        return prepared

    def _schedule(self, trace: Any) -> Any:
        from tvm import s_tir

        from dialects.meta_schedule.tvm_database import tvm_block_names, tvm_module_of

        if self._module is None:
            if self.entry is not None:
                import tvm.s_tir.meta_schedule as ms

                self._module = ms.database.Workload.from_json(self.entry).mod
            else:
                self._module = tvm_module_of(self.dag)
        schedule = s_tir.Schedule(self._module)
        s_tir.schedule.Trace.apply_json_to_schedule(tvm_block_names(trace), schedule)
        return schedule

    def _build_all(self, schedules: Sequence[Any], traces: Sequence[Any]) -> list[Any]:
        """The scheduled modules built as MetaSchedule's ``default_build`` builds them
        (``RemoveWeightLayoutRewriteBlock``, then ``tvm.build``), each in a forked copy of this
        process under ``build_timeout_s``, as many at once as there are cores
        (:func:`build_in_forks`), and loaded here: one module each, or the exception its build
        raised. ``default_build`` first imports TVM's tensor intrinsics (hundreds of TVMScript
        functions, about a minute on a small machine); they are imported, here before the forks,
        only when a trace tensorizes."""
        if any(_tensorizes(trace) for trace in traces):
            import tvm.s_tir.tensor_intrin  # noqa: F401 - registers the intrinsics Tensorize names

        with tempfile.TemporaryDirectory(prefix="lorien-tvm-build-") as out:
            builds = [functools.partial(_export_built, schedule.mod, self.tvm_target, str(Path(out) / f"kernel{i}.so"))
                      for i, schedule in enumerate(schedules)]
            libraries = build_in_forks(builds, self.option.build_timeout_s)
            return [library if isinstance(library, Exception) else self.tvm.runtime.load_module(library)
                    for library in libraries]

    def _arrays(self) -> list[Any]:
        """The kernel's arguments: the reference inputs, zeroed outputs."""
        from dialects.meta_schedule.compile import reference_inputs

        if self._inputs is None:
            self._inputs = reference_inputs(self.dag, self.option.seed)
        given = iter(self._inputs)
        outputs = [t for t in self.dag.io_tensors if t in self.dag.outputs]
        return [self.tvm.runtime.tensor(np.zeros(t.shape, t.dtype) if t in outputs else next(given))
                for t in self.dag.io_tensors]

    @staticmethod
    def _race(costs: dict[int, list[float]]) -> set[int]:
        """The traces to time no more: those whose fastest timing so far is slower than the
        slowest timing of the trace with the lowest median. Their ranges no longer overlap, so
        no further rounds are needed to tell which is faster (only load that slowed every one of
        their rounds and none of the leader's could have put them behind); their records keep the
        timings taken (fewer than ``repeat``), as the engine's ``stop_slower_repeats`` does. On
        the re-measured finalists of ResNet-18, the BERT layer and the MobileNetV2 block (9 rounds
        from the third on) this left 40 to 65 % of the timings.

        When every trace left has a median within :data:`RACE_TIE` of the leader's, they are all
        timed no more too (a tie): which of them wins moves the task's latency by less than that.
        Ties ran all ``repeat`` rounds before: two or more finalists did on 7 of the BERT layer's 13
        tasks with several finalists and on 3 of ResNet-18's 8 in one guided tuning run."""
        if len(costs) < 2:
            return set()
        medians = {index: float(np.median(timings)) for index, timings in costs.items()}
        leader = min(costs, key=lambda index: (medians[index], index))
        slowest = max(costs[leader])
        behind = {index for index, timings in costs.items() if index != leader and min(timings) > slowest}
        if all(medians[index] <= medians[leader] * (1 + RACE_TIE) for index in costs.keys() - behind):
            return set(costs) - {leader}
        return behind

    def _calibrated_number(self, seconds_per_run: float) -> int:
        """Runs per timing for a kernel whose warm-up timing gave ``seconds_per_run``: the job's
        ``number``, or as many as fill ``min_repeat_ms`` with a tenth to spare (the engine's
        :func:`~lorien.engine.build.starting_number`). TVM's evaluator finds
        that count anew in every call: it times ``number`` runs, then more, until one timing lasts
        ``min_repeat_ms``, so a fresh call per round spent about twice ``min_repeat_ms`` a timing (on
        the BERT layer's re-measured traces, 20 ms a timing against 10). The rounds start from the
        count the warm-up round reached, which keeps what each timing is (at least ``min_repeat_ms``
        of runs) in one pass; TVM's own runner does the same within its ``repeat``.

        The warm-up round is not recorded: right after the traces were built and checked, the first
        timings of a call ran up to 2.4x the later ones (15 of the 16 finalists of the BERT layer's
        four large matmul tasks in one tuning run, the NumPy reference's BLAS threads among the
        suspects), and a finalist's mean, which chooses the exported trace, carried it."""
        from lorien.engine.build import starting_number

        return starting_number(int(self.option.number), self.option.min_repeat_ms, seconds_per_run)

    def _check(self, kernel: Any, arrays: list[Any]) -> str:
        """Why the kernel's output differs from NumPy's ("" when it does not, or is not checked)."""
        if not self.option.check_correctness:
            return ""
        kernel(*arrays)
        if self._expected is None:
            self._expected = self.dag.evaluate(*self._inputs)
        outputs = [t for t in self.dag.io_tensors if t in self.dag.outputs]
        got = [array.numpy() for array, t in zip(arrays, self.dag.io_tensors, strict=True) if t in outputs]
        for tensor, value, want in zip(outputs, got, self._expected, strict=True):
            if not np.allclose(value, want, rtol=self.option.rtol, atol=self.option.atol, equal_nan=True):
                error = float(np.max(np.abs(value.astype(np.float64) - want.astype(np.float64))))
                return f"output {tensor.name!r} differs from the NumPy reference (max abs error {error:.3g})"
        return ""

    def _time_once(self, kernel: Any, arrays: list[Any], number: int | None = None) -> float:
        """One timing (seconds per run): ``number`` runs (default the job's), more until
        ``min_repeat_ms`` passed (TVM's evaluator grows the count and times again)."""
        option = self.option
        evaluator = kernel.time_evaluator(kernel.entry_name, self.tvm.cpu(0), number=number or option.number, repeat=1,
                                          min_repeat_ms=int(option.min_repeat_ms),
                                          f_preproc="cache_flush_cpu_non_first_arg" if option.flush_cache else "")
        return float(evaluator(*arrays).results[0])


def _export_built(mod: Any, target: Any, path: str) -> str:
    """``mod`` built for ``target`` as ``default_build`` builds it, written as a shared library at ``path``."""
    import warnings

    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    with warnings.catch_warnings():  # TVM's own builder calls its deprecated tvm.build
        warnings.filterwarnings("ignore", "build is deprecated", DeprecationWarning)
        built = tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)
    built.export_library(path, fcompile=link_shared)
    return path


def link_shared(output: str, objects: Sequence[str] | str, options: Sequence[str] | None = None, **kwargs: Any) -> None:
    """``export_library``'s link of a built module's object files into a shared library with the
    linker itself (``ld -shared``, libm where the kernels call it), not through the C++ compiler's
    driver as TVM's default ``create_shared`` does (g++ -> collect2 -> ld: 20 ms quiet, 100-140 ms
    a trace on a loaded 2-core machine, against about 10 ms); the same object code is linked.
    Anything else (C sources, options, no ``ld`` on the PATH) goes to TVM's ``create_shared``."""
    from tvm.support import cc

    files = [objects] if isinstance(objects, str) else list(objects)
    linker = shutil.which("ld")
    if linker is None or options or kwargs or not files or not all(name.endswith(".o") for name in files):
        cc.create_shared(output, files, options, **kwargs)
        return
    command = [linker, "-shared", "-o", output, *files, "--as-needed", "-lm"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"linking {output} failed ({' '.join(command)}): {done.stdout}{done.stderr}")


def _tensorizes(trace: Any) -> bool:
    """Whether a trace tensorizes (a ``Tensorize`` instruction or an ``auto_tensorize`` annotation)."""
    text = orjson.dumps(trace)
    return b'"Tensorize"' in text or b"auto_tensorize" in text


def measure_traces_with_tvm(dag: ComputeDAG, traces: Sequence[Any], measure: dict[str, Any] | None,
                            target: str) -> list[Any]:
    """Build and time traces of a DAG with TVM for ``target``; one MeasureResult each."""
    return TvmMeasurer(dag, measure, target)(traces)


def remeasure_with_tvm(records: Sequence[TuningRecord], measure: dict[str, Any] | None = None, store: Any = None,
                       entries: dict[str, str] | None = None, source: str | None = None) -> list[TuningRecord]:
    """TVM-measured copies of meta_schedule records of workloads tuned here (Lorien compute DAGs):
    the same trace, workload and target, its costs, error, timestamp and build from TVM
    (``source``: the copies' tag, default the record's own). A record whose workload is a TVM
    module is refused: its latency is the log's, not the engine's."""
    from dialects.meta_schedule.compile import is_lorien_entry, workload_dag, workload_entry

    groups: dict[tuple[str, str], list[int]] = {}
    for index, record in enumerate(records):
        if not is_lorien_entry(workload_entry(record, store, entries)):
            raise DialectError(f"record {record.record_id} ({record.task_name}): its workload is a TVM module; "
                               f"re-measuring with TVM is for workloads tuned by Lorien's meta_schedule dialect")
        groups.setdefault((record.workload_key, record.target), []).append(index)
    measured: list[TuningRecord | None] = [None] * len(records)
    for indices in groups.values():  # one measuring call per workload: built together, timed in turns
        first = records[indices[0]]
        measurer = TvmMeasurer(workload_dag(first, store, entries), measure, first.target)
        results = measurer([orjson.loads(records[index].config) for index in indices])
        for index, result in zip(indices, results, strict=True):
            record = records[index]
            measured[index] = record.with_changes(costs=list(result.costs), error_no=int(result.error_no),
                                                  all_cost=float(result.all_cost), timestamp=float(result.timestamp),
                                                  build=result.extra["build"], source=source or record.source)
    return measured  # type: ignore[return-value] - every record is in one group


def remeasure_engine_records(records: Sequence[TuningRecord], entries: dict[str, str] | None = None,
                             measure: dict[str, Any] | None = None) -> list[TuningRecord]:
    """``lorien export --measure-with-tvm``: the records Lorien's engine measured replaced by
    their TVM-measured copies (:func:`remeasure_with_tvm`, timed as :data:`EXPORT_MEASURE`
    unless ``measure`` says otherwise); the others as they are, in the same order."""
    from lorien.record import MEASURED_BY_ENGINE

    require_tvm("lorien export --measure-with-tvm")
    engine = [record for record in records if record.measured_by == MEASURED_BY_ENGINE]
    measured = iter(remeasure_with_tvm(engine, measure or EXPORT_MEASURE, entries=entries))
    return [next(measured) if record.measured_by == MEASURED_BY_ENGINE else record for record in records]


def forked_builder(timeout_s: float = BUILD_TIMEOUT_S, parallel: int | None = None) -> Any:
    """A MetaSchedule builder that builds each candidate with ``default_build`` in a forked copy
    of this process, ``parallel`` copies at a time (default: the CPU count, as LocalBuilder's
    workers; :func:`build_in_forks`): TVM's LocalBuilder starts fresh workers for every
    batch, and each spends 45 to 80 s on a 2-core machine importing TVM's tensor intrinsics before
    it builds anything. A build past ``timeout_s`` is stopped and its candidate fails with a
    BuilderResult error saying so, as LocalBuilder's timeout does; one TVM cannot build fails
    with TVM's message."""
    import tvm.s_tir.meta_schedule as ms
    import tvm.s_tir.tensor_intrin  # noqa: F401 - default_build imports them; once, before the forks
    from tvm.ir.utils import derived_object

    @derived_object
    class ForkedBuilder(ms.builder.PyBuilder):
        def build(self, build_inputs: list[Any]) -> list[Any]:
            artifacts = build_in_forks([functools.partial(_default_build_export, build_input.mod, build_input.target)
                                        for build_input in build_inputs], timeout_s, parallel)
            return [ms.builder.BuilderResult(None, f"BuildTimeout: {artifact}") if isinstance(artifact, BuildTimeout)
                    else ms.builder.BuilderResult(None, str(artifact)) if isinstance(artifact, Exception)
                    else ms.builder.BuilderResult(artifact, None)
                    for artifact in artifacts]

    return ForkedBuilder()


def _default_build_export(mod: Any, target: Any) -> str:
    """MetaSchedule's ``default_build`` then ``default_export``: the artifact's path."""
    import warnings

    from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return default_export(default_build(mod, target, None))
