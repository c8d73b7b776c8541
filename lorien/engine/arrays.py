"""Arrays for kernels: 64-byte aligned, as TVM's runtime allocates tensors, and packed where a
schedule rewrote an input's layout.

NumPy's buffers are only 16-byte aligned, and where a buffer starts within a 64-byte cache
line changes from one process to the next. A kernel whose vector loads straddle cache lines
runs measurably slower (up to 15 % on a 3x3 convolution with AVX-512), so a kernel measured
on one allocation and timed again on another could differ by more than the tuner's margins.
Measurements therefore run on aligned arrays, whatever NumPy hands out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Packing:
    """How a kernel takes an input whose layout its schedule rewrote (Ansor's layout rewrite of
    constant weights): the kernel's array is ``logical.reshape(split_shape).transpose(perm)``,
    made once, outside the kernel, as TVM does for weights it pre-transforms.

    ``logical_shape`` is the tensor's shape in the computation; ``split_shape`` splits each of
    its dimensions into the extents of the loops that walk it (outer first); ``perm`` puts those
    in loop order.
    """

    logical_shape: tuple[int, ...]
    split_shape: tuple[int, ...]
    perm: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The packed (kernel) shape."""
        return tuple(self.split_shape[p] for p in self.perm)

    def pack(self, logical: np.ndarray) -> np.ndarray:
        """The kernel's aligned array of a tensor given in its logical layout."""
        if tuple(logical.shape) != self.logical_shape:
            raise ValueError(f"expected shape {list(self.logical_shape)}, got {list(logical.shape)}")
        return aligned_copy(np.ascontiguousarray(logical.reshape(self.split_shape).transpose(self.perm)))

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """The logical array of a packed one."""
        inverse = tuple(int(i) for i in np.argsort(self.perm))
        return np.ascontiguousarray(packed.reshape(self.shape).transpose(inverse)).reshape(self.logical_shape)


def logical_shape(spec: Any) -> tuple[int, ...]:
    """The shape of a kernel argument in the computation: its packing's logical shape where
    the schedule rewrote its layout, else its own."""
    packing = getattr(spec, "packing", None)
    return tuple(packing.logical_shape if packing is not None else spec.shape)


def logical_arrays(specs: Sequence[Any], seed: int | np.random.Generator = 0) -> list[np.ndarray]:
    """Aligned arrays for a kernel's arguments (objects with ``shape``, ``dtype``, ``is_output``
    and optionally ``packing``) in their logical layouts: outputs zeroed, inputs random from
    ``seed`` in argument order."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        shape = logical_shape(spec)
        arrays.append(aligned_zeros(shape, spec.dtype) if spec.is_output else random_array(shape, spec.dtype, rng))
    return arrays


def pack_arguments(specs: Sequence[Any], arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The kernel's arrays of arguments given in their logical layouts (packed inputs packed)."""
    packed = []
    for spec, array in zip(specs, arrays, strict=True):
        packing = getattr(spec, "packing", None)
        try:
            packed.append(packing.pack(array) if packing is not None else array)
        except ValueError as exc:
            raise ValueError(f"argument {spec.name!r}: {exc}") from exc
    return packed


def argument_arrays(specs: Sequence[Any], seed: int | np.random.Generator = 0) -> list[np.ndarray]:
    """Aligned arrays for a kernel's arguments, in the kernel's layouts: outputs zeroed, inputs
    random from ``seed`` in argument order (the same values :func:`logical_arrays` gives,
    packed where the kernel takes an input packed)."""
    return pack_arguments(specs, logical_arrays(specs, seed))
