"""The host's float32 peak, measured rather than looked up: the core clock and the FMA
throughput of one core, each by a microkernel JIT-compiled through the engine's LLVM path.

A table of "FMA units x vector width" per CPU is wrong as often as it is right: znver4 has
AVX-512 but issues a 512-bit FMA as two 256-bit halves (one 16-lane FMA per cycle, not two);
some Intel parts have one 512-bit FMA port, others two. So the throughput is measured at every
vector width the CPU has (4, 8, 16 float32 lanes), with enough independent FMA chains to
cover the FMA latency of any of them, and the widest width that runs at the best rate is the
one kernels should use.

Both microkernels are timed by the thread's CPU time (``time.thread_time``) over many short
rounds, so that a core shared with other processes (a loaded machine) does not lower the
figures: time the thread was descheduled is not counted. FLOP per cycle is the median over
rounds of each round's FMA FLOP over the cycles its clock run counted, so that a clock that
moves between rounds cancels out (the fastest runs of each kernel alone, taken at different
moments, once gave 34 FLOP/cycle for two 8-lane FMA pipes that can do 32).
"""

from __future__ import annotations

import ctypes
import math
import platform
import statistics
import time
from dataclasses import dataclass

#: Independent FMA chains of the throughput kernel: latency (4-5 cycles) x FMA ports (2) of
#: current x86-64 and AArch64 cores is at most 10; 12 accumulators and the multiplier fit the 16
#: vector registers of AVX2.
FMA_CHAINS = 12
#: Dependent integer adds per iteration of the clock kernel (1 cycle of latency each).
CLOCK_ADDS = 200
#: A width whose throughput is within this fraction of the best width's counts as full rate.
FULL_RATE = 0.95

_CLOCK_IR = r"""
define i64 @lorien_peak_clock(i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %x = phi i64 [ 0, %entry ], [ %y, %loop ]
  %y = call i64 asm sideeffect ".rept ADDS\0AADD\0A.endr", "=r,0"(i64 %x)
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %exit
exit:
  ret i64 %y
}
"""
#: One dependent integer add in each architecture's assembly.
_CLOCK_ADD = {"x86_64": "addq $$1, $0", "AMD64": "addq $$1, $0", "aarch64": "add $0, $0, #1"}


@dataclass(frozen=True)
class HostPeak:
    """What one core of this host was measured to do, and the peak of ``cores`` of them."""

    clock_hz: float
    #: float32 FLOP per cycle of one core issuing independent FMAs, per vector width (lanes).
    flop_per_cycle: dict[int, float]
    cores: int

    @property
    def lanes(self) -> int:
        """The widest vector width (float32 lanes) whose FMAs run at the best measured rate."""
        best = max(self.flop_per_cycle.values())
        return max(lanes for lanes, rate in self.flop_per_cycle.items() if rate >= FULL_RATE * best)

    @property
    def core_flop_per_cycle(self) -> float:
        """float32 FLOP per cycle of one core at its best width (2 x lanes x FMAs per cycle)."""
        return max(self.flop_per_cycle.values())

    @property
    def fmas_per_cycle(self) -> float:
        """FMA instructions per cycle of one core at :attr:`lanes`."""
        return self.flop_per_cycle[self.lanes] / (2 * self.lanes)

    @property
    def flops(self) -> float:
        """Peak float32 FLOP/s: cores x clock x FLOP per cycle of a core (FMA width x rate x 2)."""
        return self.cores * self.clock_hz * self.core_flop_per_cycle

    def describe(self) -> str:
        widths = ", ".join(f"{lanes} lanes {rate:.1f}" for lanes, rate in sorted(self.flop_per_cycle.items()))
        return (f"clock {self.clock_hz / 1e9:.2f} GHz; FLOP/cycle/core by FMA width: {widths}; full rate at "
                f"{self.lanes} lanes ({self.fmas_per_cycle:.2f} FMA/cycle); peak {self.cores} cores x "
                f"{self.clock_hz / 1e9:.2f} GHz x {self.core_flop_per_cycle:.1f} FLOP/cycle = {self.flops / 1e9:.0f} GFLOPS")


def _cpu_s(call) -> float:
    """This thread's CPU time of one ``call``."""
    start = time.thread_time()
    call()
    return time.thread_time() - start


def _clock_kernel():
    """The clock microkernel, ``chain(n)``: ``n`` x :data:`CLOCK_ADDS` dependent adds; None on an
    architecture without an entry in the add table."""
    import llvmlite.binding as llvm

    from lorien.engine.codegen import llvm as llvm_codegen

    add = _CLOCK_ADD.get(platform.machine())
    if add is None:
        return None
    llvm.initialize_native_asmparser()
    ir_text = _CLOCK_IR.replace("ADDS", str(CLOCK_ADDS)).replace("ADD", add)
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(llvm_codegen.compile_ir(ir_text, "lorien_peak_clock"))


def fma_ir(lanes: int, chains: int = FMA_CHAINS) -> str:
    """LLVM IR of ``lorien_peak_fma_<lanes>(n, s)``: ``chains`` independent ``lanes``-wide FMA
    chains, ``n`` iterations; the sum of the chains is returned so none is optimized away."""
    vec, name = f"<{lanes} x float>", f"lorien_peak_fma_{lanes}"
    lines = [f"declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})",
             f"define float @{name}(i64 %n, float %s) {{", "entry:",
             f"  %one = insertelement {vec} undef, float %s, i32 0",
             f"  %b = shufflevector {vec} %one, {vec} undef, <{lanes} x i32> zeroinitializer",
             "  br label %loop", "loop:", "  %i = phi i64 [ 0, %entry ], [ %next, %loop ]"]
    lines += [f"  %a{c} = phi {vec} [ %b, %entry ], [ %f{c}, %loop ]" for c in range(chains)]
    lines += [f"  %f{c} = call {vec} @llvm.fma.v{lanes}f32({vec} %a{c}, {vec} %b, {vec} %b)" for c in range(chains)]
    lines += ["  %next = add i64 %i, 1", "  %more = icmp slt i64 %next, %n",
              "  br i1 %more, label %loop, label %exit", "exit:", "  %s0 = fadd " + vec + " %f0, %f1"]
    lines += [f"  %s{c - 1} = fadd {vec} %s{c - 2}, %f{c}" for c in range(2, chains)]
    lines += [f"  %r = extractelement {vec} %s{chains - 2}, i32 0", "  ret float %r", "}"]
    return "\n".join(lines)


def _fma_kernel(lanes: int):
    from lorien.engine.codegen import llvm as llvm_codegen

    address = llvm_codegen.compile_ir(fma_ir(lanes), f"lorien_peak_fma_{lanes}")
    return ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_float)(address)


def vector_widths() -> tuple[int, ...]:
    """float32 vector widths this host runs: 4 up to its widest register (16 with AVX-512)."""
    from lorien.engine.cpu import host_cpu

    widest = host_cpu().lanes
    return tuple(lanes for lanes in (4, 8, 16) if lanes <= widest)


def measure_host_peak(cores: int | None = None, quick: bool = False) -> HostPeak:
    """Measure this host's clock and per-core FMA throughput at every vector width; ``cores``
    (default: the engine's threads) scales the peak. ``quick``: fewer runs (tests).

    FLOP per cycle is measured in cycles, not seconds: each round runs the clock kernel and then
    every FMA kernel, and a width's FLOP/cycle is the median over rounds of its FLOP over the
    cycles the clock kernel counted in that round, so a clock that moves between rounds (boost,
    a neighbour's load on a shared host) cancels out. The clock is the fastest round's."""
    from lorien.engine import runtime

    rounds = 11 if quick else 61
    clock_iterations, fma_iterations = 5000, 50000
    chain = _clock_kernel()
    if chain is None:
        return HostPeak(math.nan, {lanes: math.nan for lanes in vector_widths()}, cores or runtime.num_threads())
    kernels = {lanes: _fma_kernel(lanes) for lanes in vector_widths()}
    chain(clock_iterations)
    for fma in kernels.values():
        fma(fma_iterations, 0.5)
    clock_runs: list[float] = []
    per_cycle: dict[int, list[float]] = {lanes: [] for lanes in kernels}
    for _ in range(rounds):
        clock_s = _cpu_s(lambda: chain(clock_iterations))
        clock_runs.append(clock_s)
        hz = CLOCK_ADDS * clock_iterations / clock_s
        for lanes, fma in kernels.items():
            fma_s = _cpu_s(lambda fma=fma: fma(fma_iterations, 0.5))
            per_cycle[lanes].append(FMA_CHAINS * lanes * 2 * fma_iterations / (fma_s * hz))
    clock = CLOCK_ADDS * clock_iterations / min(clock_runs)
    rates = {lanes: statistics.median(values) for lanes, values in per_cycle.items()}
    return HostPeak(clock, rates, cores or runtime.num_threads())
