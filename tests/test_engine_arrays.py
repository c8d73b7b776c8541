"""Aligned arrays for kernels (lorien.engine.arrays)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lorien.engine.arrays import aligned_copy, aligned_empty, aligned_zeros, argument_arrays


@pytest.mark.parametrize("shape,dtype", [((7, 5), "float32"), ((3,), "int8"), ((2, 3, 4), "float64"), ((0,), "float32")])
def test_aligned_arrays_start_on_a_64_byte_boundary(shape, dtype):
    for _ in range(8):  # fresh allocations land at different offsets
        arr = aligned_empty(shape, dtype)
        assert arr.ctypes.data % 64 == 0 or arr.size == 0
        assert arr.shape == shape and arr.dtype == np.dtype(dtype) and arr.flags.c_contiguous and arr.flags.writeable
    assert not aligned_zeros(shape, dtype).any()


def test_aligned_copy_keeps_values_and_reuses_aligned_arrays():
    raw = np.arange(65, dtype=np.float32)
    unaligned = raw[1:] if raw.ctypes.data % 64 == 0 else raw[(-raw.ctypes.data % 64) // 4 + 1:]
    assert unaligned.ctypes.data % 64 != 0
    copy = aligned_copy(unaligned)
    assert copy.ctypes.data % 64 == 0 and np.array_equal(copy, unaligned)
    assert aligned_copy(copy) is copy
    assert aligned_copy(np.arange(12.0).reshape(3, 4).T).flags.c_contiguous


def test_argument_arrays_are_numpys_random_inputs_and_zeroed_outputs():
    specs = [SimpleNamespace(shape=(4, 8), dtype="float32", is_output=False),
             SimpleNamespace(shape=(3,), dtype="int32", is_output=False),
             SimpleNamespace(shape=(4, 3), dtype="float32", is_output=True)]
    data, index, out = argument_arrays(specs, seed=3)
    rng = np.random.default_rng(3)
    assert np.array_equal(data, rng.uniform(-1, 1, (4, 8)).astype("float32"))
    assert np.array_equal(index, rng.integers(0, 4, (3,)).astype("int32"))
    assert not out.any() and out.dtype == np.float32
    assert all(a.ctypes.data % 64 == 0 for a in (data, index, out))
