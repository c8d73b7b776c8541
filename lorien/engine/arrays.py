"""Arrays for kernels: 64-byte aligned, as TVM's runtime allocates tensors.

NumPy's buffers are only 16-byte aligned, and where a buffer starts within a 64-byte cache
line changes from one process to the next. A kernel whose vector loads straddle cache lines
runs measurably slower (up to 15 % on a 3x3 convolution with AVX-512), so a kernel measured
on one allocation and timed again on another could differ by more than the tuner's margins.
Measurements therefore run on aligned arrays, whatever NumPy hands out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

ALIGNMENT = 64  # bytes: a cache line, and TVM's kAllocAlignment


def aligned_empty(shape: Sequence[int], dtype: Any, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an ``alignment``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes].view(dtype).reshape(tuple(shape))


def aligned_zeros(shape: Sequence[int], dtype: Any, alignment: int = ALIGNMENT) -> np.ndarray:
    out = aligned_empty(shape, dtype, alignment)
    out.fill(0)
    return out


def aligned_copy(array: np.ndarray, alignment: int = ALIGNMENT) -> np.ndarray:
    """``array`` itself when it is C-contiguous and aligned, else an aligned copy."""
    if array.flags.c_contiguous and array.ctypes.data % alignment == 0:
        return array
    out = aligned_empty(array.shape, array.dtype, alignment)
    out[...] = array
    return out


def random_array(shape: Sequence[int], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Uniform in [-1, 1) for floating types, small integers in [0, 4) otherwise; aligned."""
    if np.issubdtype(np.dtype(dtype), np.floating):
        return aligned_copy(rng.uniform(-1, 1, tuple(shape)).astype(dtype))
    return aligned_copy(rng.integers(0, 4, tuple(shape)).astype(dtype))


def argument_arrays(specs: Sequence[Any], seed: int | np.random.Generator = 0) -> list[np.ndarray]:
    """Aligned arrays for a kernel's arguments (objects with ``shape``, ``dtype`` and
    ``is_output``): outputs zeroed, inputs random from ``seed`` in argument order."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return [aligned_zeros(spec.shape, spec.dtype) if spec.is_output else random_array(spec.shape, spec.dtype, rng)
            for spec in specs]
