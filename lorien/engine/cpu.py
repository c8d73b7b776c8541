"""The CPU a kernel is built for and run on: LLVM CPU name and features, vector width, threads.

A target string chooses it: ``-mcpu`` (an LLVM CPU name, default the host's), ``-mattr``
(features added or removed, e.g. ``+avx2,-avx512f``) and ``-num-cores`` (threads of parallel
loops, default all). ``llvm -mcpu=haswell -num-cores=1`` on an AVX-512 host builds AVX2 code
(256-bit vectors) and runs it on one thread: another machine, measured on this one.

Schedules read the vector width of the CPU they are built for from :func:`current`, which
:func:`building_for` sets; code generation gets a :class:`CpuTarget` explicitly.
"""

from __future__ import annotations

import contextvars
import functools
import os
import platform
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import orjson

from lorien.errors import TargetError
from lorien.target import Target, parse_target

#: Target kinds the CPU engine builds.
CPU_KINDS = ("llvm", "c")
#: A function on 16 floats: the widest register LLVM legalizes it into is the vector width.
_PROBE_IR = """
define void @probe(ptr %p) {
  %v = load <16 x float>, ptr %p
  %w = fadd <16 x float> %v, %v
  store <16 x float> %w, ptr %p
  ret void
}
"""
_REGISTER_LANES = (("zmm", 16), ("ymm", 8), ("xmm", 4))
_LOCK = threading.Lock()


@dataclass(frozen=True)
class CpuTarget:
    """What code is generated for (``cpu``, ``features``) and how many threads run it."""

    cpu: str
    features: str = ""
    num_cores: int | None = None

    @property
    def lanes(self) -> int:
        """float32 lanes of the widest vector register the generated code uses."""
        return _vector_lanes(self.cpu, self.features)

    @property
    def is_host(self) -> bool:
        """Code for exactly this machine's CPU and features."""
        return self.cpu == host_cpu_name() and self.features == host_cpu_features()

    @property
    def threads(self) -> int:
        """Threads of parallel loops: ``num_cores``, else the runtime's default."""
        if self.num_cores is not None:
            return self.num_cores
        from lorien.engine.runtime import default_num_threads

        return default_num_threads()

    def machine(self) -> Any:
        """The LLVM target machine generating code for this CPU (O3, cached)."""
        return _target_machine(self.cpu, self.features)

    def check_runnable(self) -> None:
        """Raise :class:`TargetError` when this host cannot run the code (wider vectors than it has)."""
        host = host_cpu()
        if self.lanes > host.lanes:
            raise TargetError(f"code for -mcpu={self.cpu} uses {32 * self.lanes}-bit vectors; this host "
                              f"({host.cpu}) has {32 * host.lanes}-bit ones and cannot run it")

    def build_fields(self) -> dict[str, Any]:
        """What a measurement record says about its build (who measured it: ``measured_by`` Lorien's
        engine; engine, LLVM, CPUs, vectors, threads, caches)."""
        from lorien import __version__
        from lorien.record import MEASURED_BY_ENGINE

        return {"measured_by": MEASURED_BY_ENGINE, "engine": f"lorien-{__version__}",
                "llvm": ".".join(str(v) for v in llvm.llvm_version_info), "cpu": host_cpu_name(),
                "machine": platform.machine(), "mcpu": self.cpu, "vector_lanes": self.lanes,
                "threads": self.threads, **host_cache_kb()}

    def build_json(self) -> str:
        """:meth:`build_fields` as the JSON a record's ``build`` holds (keys sorted)."""
        return orjson.dumps(self.build_fields(), option=orjson.OPT_SORT_KEYS).decode()


@functools.cache
def host_cpu_name() -> str:
    """LLVM's name of this machine's CPU (``znver4``, ``haswell``, ...)."""
    llvm.initialize_native_target()
    return llvm.get_host_cpu_name()


@functools.cache
def host_cpu_features() -> str:
    """LLVM feature string of this machine's CPU (``+avx2,+fma,-avx512f,...``)."""
    llvm.initialize_native_target()
    return llvm.get_host_cpu_features().flatten()


def host_cpu() -> CpuTarget:
    """This machine's CPU with all its features, threads as the runtime decides."""
    return CpuTarget(host_cpu_name(), host_cpu_features())


@functools.cache
def host_cache_kb() -> dict[str, int]:
    """Data cache sizes of one core of this machine, ``{"l1d_kb": .., "l2_kb": .., "l3_kb": ..}``
    (from sysfs; empty where the system does not say)."""
    sizes: dict[str, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size[:-1].isdigit():
            continue
        kilobytes = int(size[:-1]) * {"K": 1, "M": 1024, "G": 1024 * 1024}.get(size[-1], 0)
        if kilobytes:
            sizes[f"l{level}{'d' if level == 1 else ''}_kb"] = kilobytes
    return sizes


def engine_target(target: str | None) -> str | None:
    """The CPU target the engine builds a record of ``target`` for: the target itself on a CPU,
    this host (None) for a GPU target, whose bindings run as CPU loops here, or for None."""
    return target if target is not None and parse_target(target).kind in CPU_KINDS else None


def cpu_target(target: str | Target | None = None) -> CpuTarget:
    """The CPU of a target string (``None``: this host).

    Raises :class:`TargetError` for a target that is not a CPU target, an ``-mcpu`` LLVM does
    not know, an ``-mtriple`` of another architecture, or a ``-num-cores`` that is not a
    positive integer.
    """
    if target is None:
        return host_cpu()
    parsed = parse_target(target) if isinstance(target, str) else target
    if parsed.kind not in CPU_KINDS:
        raise TargetError(f"target {parsed.canonical!r} is not a CPU target (kinds: {', '.join(CPU_KINDS)})")
    triple = parsed.get("mtriple")
    if triple is not None and str(triple).split("-")[0] != llvm.get_process_triple().split("-")[0]:
        raise TargetError(f"target {parsed.canonical!r}: the engine builds for this host's architecture "
                          f"({llvm.get_process_triple()}), not -mtriple={triple}")
    num_cores = parsed.get("num-cores")
    if num_cores is not None and (isinstance(num_cores, bool) or not isinstance(num_cores, int) or num_cores < 1):
        raise TargetError(f"target {parsed.canonical!r}: -num-cores must be a positive integer, got {num_cores!r}")
    mattr = ",".join(str(feature) for feature in parsed.get("mattr", ()))  # type: ignore[union-attr]
    for feature in filter(None, mattr.split(",")):
        if feature[0] not in "+-":
            raise TargetError(f"target {parsed.canonical!r}: -mattr feature {feature!r} must start with + or -")
    mcpu = parsed.get("mcpu")
    host = host_cpu_name()
    if mcpu is None or mcpu == host:
        features = ",".join(filter(None, [host_cpu_features(), mattr]))
        return CpuTarget(host, features, num_cores)
    check_cpu_name(str(mcpu))
    return CpuTarget(str(mcpu), mattr, num_cores)


@functools.cache
def check_cpu_name(name: str) -> None:
    """Raise :class:`TargetError` unless LLVM knows CPU ``name`` for this architecture.

    LLVM only prints a warning for an unknown CPU (and later aborts the process), so the
    warning is caught from the standard error of a trial target machine.
    """
    with _LOCK:
        warning = _stderr_of(lambda: _llvm_target().create_target_machine(cpu=name, features=""))
    if "not a recognized processor" in warning:
        raise TargetError(f"-mcpu={name} is not a CPU LLVM {'.'.join(map(str, llvm.llvm_version_info))} knows "
                          f"for {llvm.get_process_triple()} (e.g. {host_cpu_name()}, haswell, skylake-avx512, x86-64)")


def _stderr_of(action: Any) -> str:
    """What ``action()`` writes to file descriptor 2 (other writers' output is passed on)."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            action()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    passed_on = "".join(line for line in text.splitlines(keepends=True) if "not a recognized processor" not in line)
    if passed_on:
        sys.stderr.write(passed_on)
    return text


def _llvm_target() -> Any:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_triple(llvm.get_process_triple())


@functools.cache
def _target_machine(cpu: str, features: str) -> Any:
    return _llvm_target().create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault")


@functools.cache
def _vector_lanes(cpu: str, features: str) -> int:
    assembly = _target_machine(cpu, features).emit_assembly(llvm.parse_assembly(_PROBE_IR))
    return next((lanes for register, lanes in _REGISTER_LANES if register in assembly), 1)


_CURRENT: contextvars.ContextVar[CpuTarget | None] = contextvars.ContextVar("lorien_cpu_target", default=None)


def current() -> CpuTarget:
    """The CPU schedules are being built for (this host outside :func:`building_for`)."""
    return _CURRENT.get() or host_cpu()


@contextmanager
def building_for(target: str | Target | CpuTarget | None) -> Iterator[CpuTarget]:
    """Build schedules for ``target``'s CPU inside the block (its vector width, see :func:`current`)."""
    cpu = target if isinstance(target, CpuTarget) else cpu_target(target)
    token = _CURRENT.set(cpu)
    try:
        yield cpu
    finally:
        _CURRENT.reset(token)
