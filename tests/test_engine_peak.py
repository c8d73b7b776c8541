"""The host's peak, measured by the engine's JIT-compiled microkernels (lorien.engine.peak), and
the register tiles sized from a vector width and register count."""

from __future__ import annotations

import platform

import pytest

from lorien.engine import cpu
from lorien.engine.peak import HostPeak, fma_ir, measure_host_peak, vector_widths
from lorien.engine.x86 import dense_register_tiles, vector_registers


def test_full_rate_width_is_the_widest_within_reach_of_the_best_rate():
    # znver4: 512-bit FMAs issue as two 256-bit halves, so 8 and 16 lanes give the same FLOP/cycle
    assert HostPeak(3e9, {4: 16.0, 8: 32.0, 16: 32.0}, cores=2).lanes == 16
    # a core whose 512-bit FMAs run at half the rate of its 256-bit ones
    halved = HostPeak(3e9, {4: 16.0, 8: 32.0, 16: 16.0}, cores=2)
    assert halved.lanes == 8
    assert halved.fmas_per_cycle == 2.0
    assert halved.flops == 2 * 3e9 * 32.0


def test_fma_kernel_has_independent_chains_of_the_asked_width():
    text = fma_ir(8, chains=5)
    assert text.count("call <8 x float> @llvm.fma.v8f32") == 5
    assert "@lorien_peak_fma_8(" in text


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64", "aarch64"), reason="clock kernel per architecture")
def test_measured_peak_is_a_plausible_fma_throughput_of_this_host():
    peak = measure_host_peak(cores=1, quick=True)
    assert 0.2e9 < peak.clock_hz < 7e9
    assert set(peak.flop_per_cycle) == set(vector_widths())
    assert peak.lanes in vector_widths()
    # at least one 4-lane FMA every other cycle, at most four of the widest per cycle
    assert 4.0 <= peak.core_flop_per_cycle <= 4 * 2 * max(vector_widths()) * 1.1
    assert peak.flops == pytest.approx(peak.clock_hz * peak.core_flop_per_cycle)


@pytest.mark.parametrize("lanes, registers", [(16, 32), (8, 16)])
def test_register_tiles_fit_the_registers_and_divide_n(lanes, registers):
    tiles = dense_register_tiles(1024, 768, lanes, registers)
    assert tiles
    for mr, nr in tiles:
        vectors = nr // lanes
        assert nr % lanes == 0 and 768 % nr == 0
        assert mr * vectors + vectors + 1 <= registers
    assert (registers - 2, lanes) in tiles  # one vector of columns: all registers but two accumulate
    for nr in {nr for _, nr in tiles}:  # and for every width a tile whose rows divide M, to pack the data
        assert any(1024 % mr == 0 and width == nr for mr, width in tiles)


def test_register_count_follows_the_vector_width_of_the_target():
    with cpu.building_for("llvm -mcpu=haswell"):
        assert vector_registers() == 16
