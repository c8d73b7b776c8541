"""build(): schedule -> lowered program -> LLVM -> a callable ``Kernel``."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import weakref
from collections.abc import Callable

import numpy as np

from lorien.engine import cpu, runtime, te
from lorien.engine.codegen import c as c_codegen
from lorien.engine.codegen import llvm as llvm_codegen
from lorien.engine.lower import Program, lower
from lorien.engine.schedule import Schedule
from lorien.errors import LorienError
from lorien.target import parse_target

KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@functools.lru_cache(maxsize=64)
def build_info(target: str | None = None) -> str:
    """JSON of the build configuration that produces measurements for ``target`` (default this
    host): the ``build`` of every record Lorien measures (engine, LLVM, host CPU, the CPU code
    is generated for, vector lanes, threads, cache sizes)."""
    return cpu.cpu_target(target).build_json()


class KernelArgumentError(LorienError, ValueError):
    """A kernel called with an array of the wrong shape, dtype or layout."""


_FLUSH: dict = {}


def flush_cpu_cache(nbytes: int = 96 << 20) -> None:
    """Write a buffer larger than the last-level cache so the next run starts cold."""
    buf = _FLUSH.get(nbytes)
    if buf is None:
        buf = _FLUSH[nbytes] = np.empty(nbytes // 8, dtype=np.float64)
    buf.fill(1.0)


def _no_array() -> None:
    """Stands for a dead weak reference before a kernel's first call: no array is it."""


#: :func:`starting_number` aims this much above ``min_repeat_ms``: a repeat just short of it
#: is timed again with more runs.
NUMBER_MARGIN = 1.1


def starting_number(number: int, min_repeat_ms: float, run_s: float | None) -> int:
    """The runs a first repeat starts with: ``number``, or (with ``min_repeat_ms`` and the seconds
    ``run_s`` one untimed run took just before) as many as fill ``min_repeat_ms`` with
    :data:`NUMBER_MARGIN` to spare. Started at ``number``, a repeat of a kernel shorter than
    ``min_repeat_ms`` was timed, found short and timed again with about 1.2x the runs it needed.
    A first run slower than the rest (cold caches) only makes the start short, and ``number``
    grows from there as before; what a timing is does not change: each repeat lasts at least
    ``min_repeat_ms``."""
    if min_repeat_ms <= 0 or run_s is None or not run_s > 0:
        return number
    return max(number, min(1 << 30, math.ceil(min_repeat_ms / 1e3 / run_s * NUMBER_MARGIN)))


class Kernel:
    """A compiled kernel. ``kernel(*arrays)`` runs in place (outputs are written) without the GIL."""

    def __init__(self, program: Program, address: int, ir_text: str, fn_name: str, num_threads: int | None = None):
        self.program, self.address, self.ir_text, self.name = program, address, ir_text, fn_name
        self.num_threads = num_threads  # threads of its parallel loops (None: the runtime's default)
        self.args = program.args
        self._fn = KERNEL_FN(address)
        self.last_number = 0
        # what a call checks, computed once: (shape, dtype, output) per argument
        self._expected = [(tuple(spec.shape), np.dtype(spec.dtype), bool(spec.is_output)) for spec in self.args]
        self._pointer_array = ctypes.c_void_p * len(self.args)
        # the arrays of the last call (weak references) and their pointers: a kernel called again
        # on the same arrays (inference, timing loops) skips ``ndarray.ctypes``, about 1 us each.
        # One attribute holds both, read once per call: threads calling the same kernel on
        # different arrays never pair one call's arrays with another's pointers.
        self._last_call: tuple[list, ctypes.Array | None] = ([_no_array] * len(self.args), None)

    def _pointers(self, arrays) -> ctypes.Array:
        # The common case checked in one pass (a call's overhead is a few microseconds, which
        # small kernels feel); anything unusual takes the checks below, which name the problem.
        last, last_pointers = self._last_call
        if len(arrays) == len(self._expected) == len(last):
            same = True
            for (shape, dtype, output), arr, ref in zip(self._expected, arrays, last, strict=True):
                if type(arr) is not np.ndarray or arr.shape != shape or arr.dtype != dtype:
                    break
                flags = arr.flags
                if not flags.c_contiguous or (output and not flags.writeable):
                    break
                same = same and ref() is arr
            else:
                if same:
                    return last_pointers
                pointers = self._pointer_array(*[a.ctypes.data for a in arrays])
                self._last_call = ([weakref.ref(a) for a in arrays], pointers)
                return pointers
        return self._checked_pointers(arrays)

    def _checked_pointers(self, arrays) -> ctypes.Array:
        if len(arrays) != len(self.args):
            raise KernelArgumentError(f"kernel {self.name} takes {len(self.args)} arrays "
                                      f"({[a.name for a in self.args]}), got {len(arrays)}")
        for spec, arr in zip(self.args, arrays, strict=False):
            if not isinstance(arr, np.ndarray):
                raise KernelArgumentError(f"argument {spec.name!r}: expected a numpy array, got {type(arr).__name__}")
            if arr.shape != spec.shape or arr.dtype != np.dtype(spec.dtype):
                packing = getattr(spec, "packing", None)
                hint = (f" (the schedule rewrote its layout: pack the {list(packing.logical_shape)} array with "
                        f"kernel.pack_arguments(...))" if packing is not None else "")
                raise KernelArgumentError(f"argument {spec.name!r}: expected {spec.dtype}{list(spec.shape)}, "
                                          f"got {arr.dtype}{list(arr.shape)}{hint}")
            if not arr.flags.c_contiguous or (spec.is_output and not arr.flags.writeable):
                raise KernelArgumentError(f"argument {spec.name!r}: array must be C-contiguous and writeable")
        return (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])

    def pack_arguments(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """The arrays this kernel takes, from arrays in their logical layouts: inputs whose
        layout the schedule rewrote (``spec.packing``) are packed, the others passed as given.
        Pack constant weights once and reuse them across calls."""
        from lorien.engine.arrays import pack_arguments

        if len(arrays) != len(self.args):
            raise KernelArgumentError(f"kernel {self.name} takes {len(self.args)} arrays "
                                      f"({[a.name for a in self.args]}), got {len(arrays)}")
        try:
            return pack_arguments(self.args, arrays)
        except ValueError as exc:
            raise KernelArgumentError(f"kernel {self.name}: {exc}") from exc

    @property
    def packed_args(self) -> list[str]:
        """Names of the inputs this kernel takes in a rewritten layout."""
        return [spec.name for spec in self.args if getattr(spec, "packing", None) is not None]

    def __call__(self, *arrays: np.ndarray) -> None:
        pointers = self._pointers(arrays)
        if self.num_threads is None:  # the runtime's threads: no context to enter
            self._fn(pointers)
            return
        with runtime.threads(self.num_threads):
            self._fn(pointers)

    def bind(self, *arrays: np.ndarray) -> Callable[[], None]:
        """A call of this kernel on ``arrays`` with nothing left to do per call: the arrays are
        checked and their pointers taken now, once; the returned callable (no arguments) holds
        them alive and hands the pointers straight to the native kernel (about 0.2 us of Python a
        call against 2-3 us for ``kernel(*arrays)``, which checks every time). For calling a kernel
        again and again on the same buffers: inference, a benchmark's timed calls. Do not resize
        or reshape a bound array in place."""
        pointers = self._checked_pointers(arrays)
        fn = KERNEL_FN(self.address)
        fn.arrays, fn.pointers = arrays, pointers   # kept alive as long as the call is
        if self.num_threads is None:  # the runtime's threads: a C-level call, no Python frame
            return functools.partial(fn, ctypes.addressof(pointers))

        def call() -> None:
            with runtime.threads(self.num_threads):
                fn(pointers)
        return call

    def time(self, *arrays: np.ndarray, number: int = 1, repeat: int = 1, min_repeat_ms: float = 0,
             flush_cache: bool = False, warmup: bool = True, slower_than_s: float = math.inf,
             run_s: float | None = None) -> list[float]:
        """Seconds per run for each of ``repeat`` repeats of ``number`` runs (TVM semantics).

        With ``min_repeat_ms``, ``number`` grows until one repeat lasts at least that long.
        One untimed run comes first, as in TVM's time evaluator, unless ``warmup`` is False
        (the caller has just run the kernel on these arrays, e.g. to check its output).
        ``slower_than_s``: the repeats stop (fewer costs) once their sum reaches ``repeat`` x
        ``slower_than_s``: the mean of all ``repeat`` could then not be below it, whatever the
        rest gave (a tuner's fastest so far: this kernel cannot beat it). ``run_s``: how long the
        caller's own run took (without ``warmup``); with the untimed run's own time, ``number``
        starts where one repeat fills ``min_repeat_ms`` (:func:`starting_number`).
        """
        ptrs = self._pointers(arrays)
        with runtime.threads(self.num_threads):
            return self._time(ptrs, number, repeat, min_repeat_ms, flush_cache, warmup, slower_than_s, run_s)

    def _time(self, ptrs: ctypes.Array, number: int, repeat: int, min_repeat_ms: float,
              flush_cache: bool, warmup: bool = True, slower_than_s: float = math.inf,
              run_s: float | None = None) -> list[float]:
        if warmup:
            run_s = runtime.time_kernel(self.address, ptrs, 1)
        number = starting_number(number, min_repeat_ms, run_s)
        costs: list[float] = []
        for _ in range(repeat):
            if sum(costs) >= repeat * slower_than_s:
                break
            while True:
                if flush_cache:
                    flush_cpu_cache()
                elapsed = runtime.time_kernel(self.address, ptrs, number)
                if elapsed * 1e3 >= min_repeat_ms or min_repeat_ms <= 0:
                    break
                scale = min_repeat_ms / max(elapsed * 1e3, 1e-3)
                number = max(number + 1, int(math.ceil(number * scale * 1.2)))
            costs.append(elapsed / number)
        self.last_number = number
        return costs

    def __repr__(self) -> str:
        return f"Kernel({self.name}, args={[a.name for a in self.args]})"


def build(s: Schedule, args: list[te.Tensor], target: str | None = None, name: str = "kernel") -> Kernel:
    """Compile schedule ``s`` into a kernel taking ``args`` (numpy arrays) in order.

    ``target``: None (this host) or an ``llvm ...`` string (LLVM JIT), or ``c ...`` (C source
    compiled with the system C compiler); its ``-mcpu``/``-mattr`` choose the instructions and
    ``-num-cores`` the threads of parallel loops (see :mod:`lorien.engine.cpu`). Build the
    schedule inside ``cpu.building_for(target)`` so its vectors match the CPU's width.
    """
    kind = "llvm" if target is None else parse_target(target).kind
    if kind not in cpu.CPU_KINDS:
        raise LorienError(f"build: target {target!r} is not a CPU target; supported kinds are 'llvm' and 'c'")
    return build_program(lower(s, args, name), kind, cpu.cpu_target(target))


def build_program(program: Program, kind: str = "llvm", target: cpu.CpuTarget | None = None) -> Kernel:
    """Compile an already lowered program with the ``llvm`` (JIT) or ``c`` (C compiler) renderer
    for ``target`` (default this host).

    Both are cached by the hash of the generated code and the CPU. ``kernel.ir_text`` is that code.
    """
    target = target or cpu.host_cpu()
    digest = hashlib.sha256(str(program).encode()).hexdigest()[:16]
    fn_name = f"{program.name}_{digest}"
    if kind == "c":
        source = c_codegen.render(program, fn_name, target.num_cores)
        march = "native" if target.is_host else target.cpu
        return Kernel(program, c_codegen.compile_c(source, fn_name, march), source, fn_name)
    ir_text = llvm_codegen.render(program, fn_name)
    address = llvm_codegen.compile_ir(ir_text, fn_name, target)
    return Kernel(program, address, ir_text, fn_name, target.num_cores)
