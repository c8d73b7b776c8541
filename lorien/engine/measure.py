"""Measurement with TVM's semantics, candidates isolated in reusable worker processes.

``Builder.create("local")`` lowers and compiles candidates to object code in a pool of
worker processes (``build_timeout_s`` each); ``Runner.create("local")`` links the object in
a runner process, checks the output against the NumPy reference and times it
(``number``, ``repeat``, ``min_repeat_ms``, ``flush_cache``, ``run_timeout_s``). A worker
that crashes or hangs is killed and replaced; the candidate gets the matching ``ErrorNo``:

    INSTANTIATION_ERROR (1) invalid schedule    COMPILE_HOST (2)  code generation failed
    RUNTIME_DEVICE (4)      kernel crashed      WRONG_ANSWER (5)  output != NumPy reference
    BUILD_TIMEOUT (6)       build took too long RUN_TIMEOUT (7)   run took too long

A candidate's ``target`` is built and run as its CPU target says (:mod:`lorien.engine.cpu`):
``llvm -mcpu=haswell -num-cores=1`` gets AVX2 code run on one thread; code this host
cannot run (wider vectors than it has) fails with RUNTIME_DEVICE before it runs.
"""

from __future__ import annotations

import abc
import atexit
import hashlib
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from lorien.engine import cpu
from lorien.engine.arrays import aligned_empty, logical_arrays, logical_shape, pack_arguments
from lorien.errors import LorienError, TargetError
from lorien.record import FAILED_COST_S, ErrorNo


@dataclass
class MeasureOption:
    """How to build and time candidates (TVM's meaning for each field)."""

    number: int = 1
    repeat: int = 3
    min_repeat_ms: float = 0
    flush_cache: bool = False
    build_timeout_s: float = 10
    run_timeout_s: float = 10
    check_correctness: bool = True
    rtol: float = 1e-3
    atol: float = 1e-3
    seed: int = 0
    #: Stop timing a candidate once its repeats so far sum to ``repeat`` x the fastest mean of
    #: its tuning job so far (:func:`keeping_fastest`): its mean of all ``repeat`` could not be
    #: below that, so it cannot become the fastest; its record has fewer costs. A slow candidate
    #: of a tuning job is then timed once instead of ``repeat`` times.
    stop_slower_repeats: bool = True
    #: Time a built candidate while the batch's other candidates still build, where the
    #: candidates' threads (their target's ``-num-cores``) leave a core free: the builds then
    #: take the free cores only, and a candidate waiting to be timed goes before the next build
    #: (:func:`measure_batch`). Off: the whole batch is built, then timed, every core idle but
    #: the kernel's.
    overlap_runs: bool = True

    def __post_init__(self) -> None:
        # a yes/no option given anything but true/false (YAML's ``maybe``, a quoted "false") would
        # read as true without a word; a TypeError, which every dialect reports as a bad option
        for name in ("flush_cache", "check_correctness", "stop_slower_repeats", "overlap_runs"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be true or false, got {value!r}")


@dataclass
class MeasureInput:
    """One candidate: ``builder()`` returns ``(schedule, args)``; ``reference(*inputs)`` the expected outputs.

    Both must pickle (module-level functions, ``functools.partial`` of them, or picklable
    callable objects): they run in worker processes. ``target`` (default this host) is the
    CPU target string the candidate is built for and run as: its ``-mcpu``/``-mattr`` pick
    the instructions (and the vector width ``builder`` sees), ``-num-cores`` the threads.
    """

    builder: Callable
    reference: Callable | None = None
    name: str = ""
    target: str | None = None


@dataclass
class BuildResult:
    artifact: dict | None
    error_no: int = ErrorNo.NO_ERROR
    error_msg: str = ""
    time_cost_s: float = 0.0


@dataclass
class MeasureResult:
    """Seconds per run for each repeat (``costs``), error code and message, wall time, timestamp."""

    costs: list[float]
    error_no: int
    all_cost: float
    timestamp: float
    error_msg: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error_no == ErrorNo.NO_ERROR

    @property
    def mean_cost_s(self) -> float:
        return float(np.mean(self.costs)) if self.ok and self.costs else FAILED_COST_S


class MeasureError(LorienError):
    """Raised inside a worker with the error code the candidate gets."""

    def __init__(self, error_no: ErrorNo, message: str):
        super().__init__(message)
        self.error_no = error_no


# ---------------------------------------------------------------- worker side

def _task_build(payload: bytes) -> dict:
    from lorien.engine.codegen import llvm as llvm_codegen
    from lorien.engine.lower import Program, lower

    # This is the isolation boundary: whatever a candidate's builder or the compiler raises
    # becomes the candidate's error (with its traceback), and the worker lives on.
    try:
        candidate = pickle.loads(payload)
        with cpu.building_for(candidate.target) as target:
            schedule, args = candidate.builder()
        program = lower(schedule, list(args), "kernel")
    except Exception as err:  # noqa: BLE001
        raise MeasureError(ErrorNo.INSTANTIATION_ERROR, _describe(err)) from err
    fn_name = f"kernel_{hashlib.sha256(str(program).encode()).hexdigest()[:16]}"
    llvm_codegen.measurement_codegen_options()
    try:
        ir_text = llvm_codegen.render(program, fn_name)
        obj = llvm_codegen.compile_object(ir_text, target)
    except Exception as err:  # noqa: BLE001
        raise MeasureError(ErrorNo.COMPILE_HOST, _describe(err)) from err
    # the runner needs the kernel's arguments, not its loop nest: a lowered conv's uops pickle to
    # 10-80 KB and went worker -> tuner -> runner with every candidate
    return {"object": obj, "fn_name": fn_name, "program": Program(program.name, [], program.args), "target": target}


def _describe(err: BaseException) -> str:
    """``Type: message`` plus the innermost frames of the traceback."""
    frames = traceback.format_tb(err.__traceback__)[-3:]
    return f"{type(err).__name__}: {err}\n{''.join(frames)}".rstrip()


def _arguments_key(specs) -> tuple:
    """What a kernel's random inputs (and so its reference outputs) are made from, besides the seed:
    its arguments' names, logical shapes, dtypes and which are outputs."""
    return tuple((a.name, logical_shape(a), a.dtype, a.is_output) for a in specs)


_EXPECTED: dict = {}


def _expected_outputs(reference: Callable, inputs: list[np.ndarray], specs, seed: int) -> list[np.ndarray]:
    """``reference(*inputs)`` as a list, memoized: inputs (in their logical layouts) are a
    function of (specs, seed), so every candidate of one workload shares one reference
    computation, whatever layout its schedule takes the inputs in."""
    key = (pickle.dumps(reference), _arguments_key(specs), seed)
    if key not in _EXPECTED:
        expected = reference(*inputs)
        _EXPECTED.clear()
        _EXPECTED[key] = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    return _EXPECTED[key]


_INPUTS: dict = {}


def _fresh_logical_arrays(specs: Sequence[Any], seed: int) -> list[np.ndarray]:
    """``logical_arrays(specs, seed)``, the random inputs drawn once per workload in a runner (the
    candidates of a job share them, as they share the reference outputs): each call gets fresh
    aligned copies, so a kernel that writes where it must not cannot change the next one's inputs."""
    key = (_arguments_key(specs), seed)
    if key not in _INPUTS:
        _INPUTS.clear()
        _INPUTS[key] = logical_arrays(specs, seed)
    fresh = []
    for spec, array in zip(specs, _INPUTS[key], strict=True):
        copy = aligned_empty(array.shape, array.dtype)
        if spec.is_output:
            copy.fill(0)
        else:
            copy[...] = array
        fresh.append(copy)
    return fresh


def _task_run(payload: tuple) -> list[float]:
    from lorien.engine.build import Kernel
    from lorien.engine.codegen import llvm as llvm_codegen

    artifact, reference, option, slower_than_s = payload
    program, target = artifact["program"], artifact["target"]
    try:
        target.check_runnable()
    except TargetError as err:
        raise MeasureError(ErrorNo.RUNTIME_DEVICE, str(err)) from err
    address = llvm_codegen.load_object(artifact["object"], artifact["fn_name"])
    kernel = Kernel(program, address, "", artifact["fn_name"], target.num_cores)
    logical = _fresh_logical_arrays(program.args, option.seed)  # 64-byte aligned, as TVM's runtime allocates
    arrays = pack_arguments(program.args, logical)  # inputs whose layout the schedule rewrote, packed
    # the untimed first run: it warms up the timing below, gives the output checked here, and its
    # time tells the timing how many runs fill min_repeat_ms (starting_number)
    first_run_s = kernel.time(*arrays, number=1, repeat=1, warmup=False)[0]
    if option.check_correctness and reference is not None:
        inputs = [arr for arr, spec in zip(logical, program.args, strict=True) if not spec.is_output]
        outputs = [arr for arr, spec in zip(arrays, program.args, strict=True) if spec.is_output]
        expected = _expected_outputs(reference, inputs, program.args, option.seed)
        if len(expected) != len(outputs):
            raise MeasureError(ErrorNo.WRONG_ANSWER, f"reference returned {len(expected)} outputs, kernel has {len(outputs)}")
        for spec, got, want in zip([a for a in program.args if a.is_output], outputs, expected, strict=True):
            # NaN where NumPy has NaN is right (a sqrt of a negative random input, e.g. a layer norm's)
            if not np.allclose(got, want, rtol=option.rtol, atol=option.atol, equal_nan=True):
                worst = float(np.max(np.abs(got.astype(np.float64) - np.asarray(want, np.float64))))
                raise MeasureError(ErrorNo.WRONG_ANSWER, f"output {spec.name!r} differs from the NumPy reference "
                                                         f"(max abs error {worst:.3g})")
    return kernel.time(*arrays, number=option.number, repeat=option.repeat, min_repeat_ms=option.min_repeat_ms,
                       flush_cache=option.flush_cache, warmup=False, slower_than_s=slower_than_s, run_s=first_run_s)


def _task_call(payload: tuple) -> Any:
    """``function(argument)`` in a worker (a module-level function, pickled by name): other work
    the idle build workers can take, e.g. a tuner's candidates featurized
    (:func:`lorien.features.program.point_features_in_workers`)."""
    function, argument = payload
    return function(argument)


_TASKS = {"build": _task_build, "run": _task_run, "call": _task_call}


def _reply(kind: str, payload) -> bytes:
    """The pickled answer to one task: its result, or the error code and message the candidate gets."""
    try:
        return pickle.dumps(("ok", _TASKS[kind](payload)))
    except MeasureError as err:
        return pickle.dumps(("error", int(err.error_no), str(err)))
    except Exception as err:  # noqa: BLE001  (a failing kernel run or reference, reported with its cause)
        return pickle.dumps(("error", int(ErrorNo.RUNTIME_DEVICE), _describe(err)))


def worker_main(recv_conn: Connection, send_conn: Connection) -> None:
    """Serve build/run tasks until the parent closes the pipe (see ``lorien.engine.worker``).

    A parent that is gone (killed, even with SIGKILL) closes both pipes: the worker then
    exits quietly, whether it was waiting for a task (EOF) or answering one (broken pipe)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import lorien.engine.codegen.llvm  # noqa: F401  (import cost paid before the first task)

    try:
        send_conn.send(("ready", None))
        while True:
            try:
                kind, payload = recv_conn.recv()
            except EOFError:
                return
            send_conn.send_bytes(_reply(kind, payload))
    except BrokenPipeError:
        return


# ---------------------------------------------------------------- parent side

class _Worker:
    """One worker process (``python -m lorien.engine.worker``); killed and replaced after a crash
    or timeout. A plain subprocess, so callers need no ``if __name__ == "__main__"`` guard."""

    def __init__(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # One BLAS thread for references: spinning BLAS threads would steal cores from the kernels.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "lorien.engine.worker", str(to_child_r), str(from_child_w)],
                                     pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        if not self.conn.poll(120):
            self.kill()
            raise LorienError("measurement worker did not start within 120 s")
        self.conn.recv()
        self.tasks = 0

    def call(self, kind: str, payload, timeout_s: float) -> tuple:
        try:
            self.send_conn.send((kind, payload))
        except (BrokenPipeError, OSError):
            self.kill()
            return ("died", self.proc.returncode)
        if not self.conn.poll(timeout_s):
            self.kill()
            return ("timeout",)
        try:
            return self.conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            self.kill()
            return ("died", self.proc.returncode)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for conn in (self.conn, self.send_conn):
            if not conn.closed:
                conn.close()


class WorkerPool:
    """A fixed number of reusable worker processes; dead ones are replaced on next use, and each
    is recycled after ``max_tasks`` tasks (the JIT of a runner keeps every kernel it loaded)."""

    def __init__(self, size: int, max_tasks: int = 256):
        self.size, self.max_tasks = max(1, int(size)), max_tasks
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
        return _Worker()

    def _give(self, worker: _Worker) -> None:
        worker.tasks += 1
        if worker.tasks >= self.max_tasks:
            worker.kill()
        elif worker.alive():
            with self._lock:
                self._idle.append(worker)

    def call(self, kind: str, payload, timeout_s: float) -> tuple:
        worker = self._take()
        try:
            return worker.call(kind, payload, timeout_s)
        finally:
            self._give(worker)

    def map(self, kind: str, payloads: Sequence, timeout_s: float) -> list[tuple]:
        if self.size == 1 or len(payloads) <= 1:
            return [self.call(kind, p, timeout_s) for p in payloads]
        with ThreadPoolExecutor(self.size) as executor:
            return list(executor.map(lambda p: self.call(kind, p, timeout_s), payloads))

    def shutdown(self) -> None:
        with self._lock:
            for worker in self._idle:
                worker.kill()
            self._idle.clear()


def _signal_name(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class Builder(abc.ABC):
    """Turns measure inputs into loadable artifacts."""

    @abc.abstractmethod
    def build(self, inputs: Sequence[MeasureInput], option: MeasureOption,
              ahead: Sequence[MeasureInput] = ()) -> list[BuildResult]:
        """One BuildResult per input, in order; failures carry an error code and message.
        ``ahead``: inputs later calls will ask for, built with these where the builder can (a
        later call then hands out their results without building them again, as long as every
        call in between names them ``ahead`` too)."""

    @staticmethod
    def create(kind: str = "local", **kwargs) -> Builder:
        if kind == "local":
            return LocalBuilder(**kwargs)
        raise LorienError(f"unknown builder kind {kind!r}; available: 'local'")


class Runner(abc.ABC):
    """Runs built artifacts, checks them and times them."""

    @abc.abstractmethod
    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            option: MeasureOption, best_cost_s: float = math.inf) -> list[MeasureResult]:
        """One MeasureResult per input, in order. ``best_cost_s``: the fastest mean of the tuning
        job so far (see ``MeasureOption.stop_slower_repeats``)."""

    @staticmethod
    def create(kind: str = "local", **kwargs) -> Runner:
        if kind == "local":
            return LocalRunner(**kwargs)
        raise LorienError(f"unknown runner kind {kind!r}; available: 'local'")


class LocalBuilder(Builder):
    """Builds in ``n_parallel`` worker processes (default: number of CPUs)."""

    def __init__(self, n_parallel: int | None = None):
        self.pool = WorkerPool(n_parallel or os.cpu_count() or 1)
        #: Builds of ``ahead`` inputs, by pickled input, until a call asks for them or no longer
        #: names them.
        self._built_ahead: dict[bytes, BuildResult] = {}

    def build(self, inputs: Sequence[MeasureInput], option: MeasureOption,
              ahead: Sequence[MeasureInput] = (), costs: Sequence[float] | None = None) -> list[BuildResult]:
        """Build ``inputs`` (and ``ahead``, kept for later calls) on the workers; ``costs``: a guess
        at each input's build time: the longest are started first (then ``ahead``), so the workers
        end the batch together rather than one waiting on a long build started last."""
        results, payloads = self._plan(inputs, ahead, costs)
        started = time.perf_counter()
        replies = self.pool.map("build", [p for _, p in payloads], option.build_timeout_s) if payloads else []
        elapsed = (time.perf_counter() - started) / max(1, len(payloads))
        for (i, payload), reply in zip(payloads, replies, strict=True):
            results[i] = _build_result(reply, elapsed, option)
            if i >= len(inputs):
                self._built_ahead[payload] = results[i]
        return results[:len(inputs)]

    def build_as_done(self, inputs: Sequence[MeasureInput], option: MeasureOption, gate: CpuGate,
                      ahead: Sequence[MeasureInput] = (), costs: Sequence[float] | None = None,
                      ) -> Iterator[tuple[int, BuildResult]]:
        """As :meth:`build`, but ``(index, result)`` of each input as soon as it is built (those
        built before first), each build holding one of ``gate``'s cores while it runs."""
        results, payloads = self._plan(inputs, ahead, costs)

        def build_one(payload: bytes) -> BuildResult:
            with gate.building():
                started = time.perf_counter()
                reply = self.pool.call("build", payload, option.build_timeout_s)
                return _build_result(reply, time.perf_counter() - started, option)

        executor = ThreadPoolExecutor(self.pool.size)
        try:
            futures = {executor.submit(build_one, payload): (i, payload) for i, payload in payloads}
            for i, result in enumerate(results[:len(inputs)]):
                if result is not None:  # built before (or failed to pickle): timed while the rest build
                    yield i, result
            for future in as_completed(futures):
                i, payload = futures[future]
                if i >= len(inputs):
                    self._built_ahead[payload] = future.result()
                else:
                    yield i, future.result()
        finally:
            executor.shutdown(wait=True, cancel_futures=True)

    def _plan(self, inputs: Sequence[MeasureInput], ahead: Sequence[MeasureInput],
              costs: Sequence[float] | None) -> tuple[list[BuildResult | None], list[tuple[int, bytes]]]:
        """The results known before building (a candidate that does not pickle, one built ahead
        by an earlier call) and the ``(index, pickled input)`` to build, longest first by ``costs``
        (then ``ahead``); forgets the earlier builds no input names."""
        built_before, self._built_ahead = self._built_ahead, {}
        payloads, results = [], [None] * (len(inputs) + len(ahead))
        for i, inp in enumerate([*inputs, *ahead]):
            try:
                payload = pickle.dumps(inp)
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                results[i] = BuildResult(None, ErrorNo.INSTANTIATION_ERROR, f"candidate does not pickle: {err}")
                continue
            if payload in built_before:
                results[i] = built_before[payload]
                if i >= len(inputs):
                    self._built_ahead[payload] = results[i]
            else:
                payloads.append((i, payload))
        if costs is not None:
            if len(costs) != len(inputs):
                raise ValueError(f"{len(costs)} build costs for {len(inputs)} inputs")
            payloads.sort(key=lambda item: (item[0] >= len(inputs), -costs[item[0]] if item[0] < len(inputs) else 0.0))
        return results, payloads


def _build_result(reply: tuple, elapsed: float, option: MeasureOption) -> BuildResult:
    """A build worker's reply as the candidate's BuildResult."""
    if reply[0] == "ok":
        return BuildResult(reply[1], ErrorNo.NO_ERROR, "", elapsed)
    if reply[0] == "error":
        return BuildResult(None, reply[1], reply[2], elapsed)
    if reply[0] == "timeout":
        return BuildResult(None, ErrorNo.BUILD_TIMEOUT, f"build exceeded build_timeout_s={option.build_timeout_s}",
                           elapsed)
    return BuildResult(None, ErrorNo.COMPILE_HOST, f"build worker died ({_signal_name(reply[1])})", elapsed)


class LocalRunner(Runner):
    """Runs candidates one at a time in a reusable runner process (so timings do not overlap)."""

    def __init__(self) -> None:
        self.pool = WorkerPool(1)

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            option: MeasureOption, best_cost_s: float = math.inf) -> list[MeasureResult]:
        results: list[MeasureResult] = []
        for inp, built in zip(inputs, builds, strict=True):
            if results and results[-1].ok:  # the fastest so far includes this batch's candidates timed before
                best_cost_s = min(best_cost_s, results[-1].mean_cost_s)
            results.append(self.run_one(inp, built, option, best_cost_s))
        return results

    def run_one(self, inp: MeasureInput, built: BuildResult, option: MeasureOption,
                best_cost_s: float = math.inf) -> MeasureResult:
        """One candidate checked and timed (``best_cost_s`` as for :meth:`run`)."""
        started = time.perf_counter()
        if built.error_no != ErrorNo.NO_ERROR:
            return MeasureResult([FAILED_COST_S], int(built.error_no), built.time_cost_s, time.time(), built.error_msg)
        slower_than_s = best_cost_s if option.stop_slower_repeats else math.inf
        reply = self.pool.call("run", (built.artifact, inp.reference, option, slower_than_s), option.run_timeout_s)
        all_cost = built.time_cost_s + time.perf_counter() - started
        if reply[0] == "ok":
            return MeasureResult(list(reply[1]), int(ErrorNo.NO_ERROR), all_cost, time.time())
        if reply[0] == "error":
            return MeasureResult([FAILED_COST_S], reply[1], all_cost, time.time(), reply[2])
        if reply[0] == "timeout":
            return MeasureResult([FAILED_COST_S], int(ErrorNo.RUN_TIMEOUT), all_cost, time.time(),
                                 f"run exceeded run_timeout_s={option.run_timeout_s}")
        return MeasureResult([FAILED_COST_S], int(ErrorNo.RUNTIME_DEVICE), all_cost, time.time(),
                             f"kernel crashed the runner ({_signal_name(reply[1])})")


class CpuGate:
    """This machine's cores shared by a batch's builds (one core each) and the timing of its
    candidates (as many cores as a kernel's threads): a timing waits until its cores are free
    and, while it waits, no build starts; a build waits for a free core."""

    def __init__(self, cores: int):
        self.cores = max(1, int(cores))
        self._busy = 0
        self._timings_waiting = 0
        self._changed = threading.Condition()

    @contextmanager
    def building(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self._timings_waiting == 0 and self._busy < self.cores)
            self._busy += 1
        try:
            yield
        finally:
            self._release(1)

    @contextmanager
    def timing(self, threads: int) -> Iterator[None]:
        threads = min(max(1, int(threads)), self.cores)
        with self._changed:
            self._timings_waiting += 1
            try:
                self._changed.wait_for(lambda: self._busy + threads <= self.cores)
            finally:
                self._timings_waiting -= 1
            self._busy += threads
        try:
            yield
        finally:
            self._release(threads)

    def _release(self, cores: int) -> None:
        with self._changed:
            self._busy -= cores
            self._changed.notify_all()


_DEFAULT: dict = {}


def _shutdown_default() -> None:
    for part in _DEFAULT.values():
        part.pool.shutdown()


def _default_parts() -> None:
    if not _DEFAULT:
        _DEFAULT["builder"], _DEFAULT["runner"] = Builder.create("local"), Runner.create("local")
        atexit.register(_shutdown_default)


def default_builder() -> LocalBuilder:
    """The builder ``measure_batch`` uses when given none (its worker pool also featurizes a
    tuner's candidates: :func:`lorien.features.program.point_features_in_workers`)."""
    _default_parts()
    return _DEFAULT["builder"]


def measure_batch(inputs: Sequence[MeasureInput], option: MeasureOption | None = None,
                  builder: Builder | None = None, runner: Runner | None = None,
                  best_cost_s: float = math.inf, ahead: Sequence[MeasureInput] = (),
                  build_costs: Sequence[float] | None = None) -> list[MeasureResult]:
    """Build all candidates (in parallel), then run them one by one; one result per input. With
    ``MeasureOption.overlap_runs``, candidates of fewer threads than cores are each timed as soon
    as built, the rest building on the free cores (:class:`CpuGate`). ``best_cost_s``: the fastest mean of the tuning job so far (``MeasureOption.stop_slower_repeats``);
    ``ahead``: candidates later calls will measure, built now with these; ``build_costs``: a guess at
    each input's build time, the longest started first (``LocalBuilder.build``)."""
    option = option or MeasureOption()
    if builder is None or runner is None:
        _default_parts()
        builder = builder or _DEFAULT["builder"]
        runner = runner or _DEFAULT["runner"]
    options = {"costs": build_costs} if build_costs is not None else {}
    if option.overlap_runs and isinstance(builder, LocalBuilder) and isinstance(runner, LocalRunner) and len(inputs) > 1:
        threads, cores = _timing_threads(inputs), os.cpu_count() or 1
        if threads < cores:
            return _measure_overlapping(inputs, option, builder, runner, best_cost_s, ahead, options,
                                        CpuGate(cores), threads)
    builds = builder.build(inputs, option, ahead, **options) if ahead else builder.build(inputs, option, **options)
    return runner.run(inputs, builds, option, best_cost_s)


def _timing_threads(inputs: Sequence[MeasureInput]) -> int:
    """The most threads any of ``inputs`` runs on (its target's ``-num-cores``, else the runtime's
    default); all the cores for a target that does not parse (its build reports why)."""
    try:
        return max((cpu.cpu_target(target).threads for target in {inp.target for inp in inputs}), default=1)
    except (LorienError, ValueError):
        return os.cpu_count() or 1


def _measure_overlapping(inputs: Sequence[MeasureInput], option: MeasureOption, builder: LocalBuilder,
                         runner: LocalRunner, best_cost_s: float, ahead: Sequence[MeasureInput],
                         options: dict[str, Any], gate: CpuGate, threads: int) -> list[MeasureResult]:
    """``measure_batch`` with ``overlap_runs``: each candidate timed as soon as it is built, on
    ``threads`` of ``gate``'s cores, the batch's remaining builds on the others (the fastest so
    far counts the candidates timed before it, in the order they were built)."""
    results: list[MeasureResult | None] = [None] * len(inputs)
    for i, built in builder.build_as_done(inputs, option, gate, ahead, **options):
        with gate.timing(threads):
            results[i] = runner.run_one(inputs[i], built, option, best_cost_s)
        if results[i].ok:
            best_cost_s = min(best_cost_s, results[i].mean_cost_s)
    return results  # type: ignore[return-value] - every input has its result once the builds are done


def keeping_fastest(measure: Callable[..., list[MeasureResult]]) -> Callable[..., list[MeasureResult]]:
    """A tuning job's ``measure(candidates, *more)`` that calls ``measure(candidates, best_cost_s,
    *more)`` with the fastest mean it has measured so far (inf at first), so that candidates which
    cannot beat it stop their repeats early (``MeasureOption.stop_slower_repeats``)."""
    fastest = [math.inf]

    def measure_keeping_fastest(candidates: list, *more: Any, **options: Any) -> list[MeasureResult]:
        results = measure(candidates, fastest[0], *more, **options)
        fastest[0] = min([fastest[0], *(result.mean_cost_s for result in results if result.ok)])
        return results

    return measure_keeping_fastest
