"""C renderer: UOps -> portable C99 text, compiled with the system C compiler.

The second renderer of the same loop-nest IR (target ``"c"``): a debugging and portability
backend, and the shape a CUDA C renderer takes. Each ALU op is one row of a format table; a
vector value is a small array filled by a lane loop (the C compiler vectorizes it); parallel
loops become ``#pragma omp parallel for``.
"""

from __future__ import annotations

import ctypes
import hashlib
import math

from lorien.engine.lower import Program, UOp
from lorien.native import NativeBuildError, compile_shared

CTYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t", "bool": "_Bool"}
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}

ALU = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "floordiv": "{0} / {1}", "mod": "{0} % {1}",
    "max": "({0} > {1} ? {0} : {1})", "min": "({0} < {1} ? {0} : {1})",
    "lt": "{0} < {1}", "le": "{0} <= {1}", "eq": "{0} == {1}", "ne": "{0} != {1}",
    "and": "{0} && {1}", "or": "{0} || {1}", "not": "!{0}", "where": "({0} ? {1} : {2})",
    "fma": "fma{f}({0}, {1}, {2})", "exp": "exp{f}({0})", "sqrt": "sqrt{f}({0})",
    "log": "log{f}({0})", "fabs": "fabs{f}({0})", "rsqrt": "(1 / sqrt{f}({0}))", "tanh": "tanh{f}({0})",
    "erf": "erf{f}({0})", "sigmoid": "(1 / (1 + exp{f}(-{0})))", "pow": "pow{f}({0}, {1})",
}


class CCompileError(NativeBuildError):
    """The C compiler rejected a rendered kernel."""


def _literal(value, dtype: str) -> str:
    if dtype in ("float32", "float64"):
        suffix = "f" if dtype == "float32" else ""
        if math.isnan(value):
            return "NAN"
        if math.isinf(value):
            return "INFINITY" if value > 0 else "-INFINITY"
        return f"{float(value)!r}{suffix}"
    if dtype == "bool":
        return "1" if value else "0"
    return f"(({CTYPES[dtype]}){int(value)})"


class CRenderer:
    """Walks a Program's uops and writes one C function ``void name(void **args)``."""

    def __init__(self, program: Program, name: str, num_threads: int | None = None):
        self.p, self.name, self.num_threads = program, name, num_threads
        self.lines: list[str] = []
        self.depth = 1

    def ref(self, i: int, lane: str | None) -> str:
        """Operand ``i`` in a lane expression (scalars are the same in every lane)."""
        u = self.p.uops[i]
        if u.op == "CONST" and u.lanes == 1:
            return _literal(u.arg, u.dtype)
        return f"v{i}[{lane}]" if u.lanes > 1 and lane is not None else f"v{i}"

    def put(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def define(self, i: int, u: UOp, lane_expr) -> None:
        """Declare value ``i``: ``lane_expr(lane)`` gives its C expression for one lane."""
        ty = CTYPES[u.dtype]
        if u.lanes == 1:
            self.put(f"{ty} v{i} = {lane_expr(None)};")
        else:
            self.put(f"{ty} v{i}[{u.lanes}];")
            self.put(f"for (int l = 0; l < {u.lanes}; l++) v{i}[l] = {lane_expr('l')};")

    def render(self) -> str:
        head = ["#include <math.h>", "#include <stdint.h>", "#include <stdlib.h>", "",
                f"void {self.name}(void **args) {{"]
        for i, u in enumerate(self.p.uops):
            self.render_uop(i, u)
        return "\n".join(head + self.lines + ["}", ""])

    def render_uop(self, i: int, u: UOp) -> None:
        ty, src = CTYPES[u.dtype], u.src
        if u.op == "ARG":
            self.put(f"{ty} *restrict v{i} = ({ty} *)args[{u.arg[0]}];")
        elif u.op == "ALLOC":
            name, size, scope = u.arg
            if scope == "global":
                nbytes = -(-size * ITEMSIZE[u.dtype] // 64) * 64
                self.put(f"{ty} *v{i} = ({ty} *)aligned_alloc(64, {nbytes});  /* {name} */")
            else:
                self.put(f"{ty} v{i}[{size}] __attribute__((aligned(64)));  /* {name} */")
        elif u.op == "FREE":
            self.put(f"free(v{src[0]});")
        elif u.op == "CONST":
            if u.lanes > 1:
                self.put(f"const {ty} v{i}[{u.lanes}] = {{{', '.join(_literal(v, u.dtype) for v in u.arg)}}};")
        elif u.op == "LOOP":
            name, extent, kind = u.arg
            if kind == "parallel":
                self.put("#pragma omp parallel for"
                         + (f" num_threads({self.num_threads})" if self.num_threads else ""))
            self.put(f"for (int64_t v{i} = 0; v{i} < {extent}; v{i}++) {{  /* {name} */")
            self.depth += 1
        elif u.op == "IF":
            self.put(f"if ({self.ref(src[0], None)}) {{")
            self.depth += 1
        elif u.op in ("ENDLOOP", "ENDIF"):
            self.depth -= 1
            self.put("}")
        elif u.op == "LOAD":
            buf, idx = f"v{src[0]}", self.ref(src[1], None)
            if len(src) == 3:
                self.define(i, u, lambda lane: f"({self.ref(src[2], lane)} ? {buf}[{idx} + {lane}] : 0)")
            else:
                self.define(i, u, lambda lane: f"{buf}[{idx}]" if lane is None else f"{buf}[{idx} + {lane}]")
        elif u.op == "STORE":
            buf, idx = f"v{src[0]}", self.ref(src[1], None)
            if u.lanes == 1:
                self.put(f"{buf}[{idx}] = {self.ref(src[2], None)};")
            else:
                self.put(f"for (int l = 0; l < {u.lanes}; l++) {buf}[{idx} + l] = {self.ref(src[2], 'l')};")
        elif u.op == "ALU":
            operand = self.p.uops[src[-1] if u.arg == "where" else src[0]].dtype
            form = ALU[u.arg]
            self.define(i, u, lambda lane: "(" + form.format(*[self.ref(s, lane) for s in src],
                                                             f="f" if operand == "float32" else "") + ")")
        elif u.op == "CAST":
            self.define(i, u, lambda lane: f"({ty})({self.ref(src[0], lane)})")
        elif u.op == "BROADCAST":
            self.define(i, u, lambda lane: self.ref(src[0], None))
        elif u.op == "VECTOR":
            self.put(f"{ty} v{i}[{u.lanes}] = {{{', '.join(self.ref(s, None) for s in src)}}};")
        elif u.op == "EXTRACT":
            self.put(f"{ty} v{i} = v{src[0]}[{u.arg}];")
        else:
            raise ValueError(f"C renderer: unknown uop {u.op!r} at %{i}")


def render(program: Program, name: str | None = None, num_threads: int | None = None) -> str:
    """C source of ``program`` (parallel loops on ``num_threads`` threads, default OpenMP's)."""
    return CRenderer(program, name or program.name, num_threads).render()


_LIBS: dict[str, ctypes.CDLL] = {}


def compile_c(source: str, fn_name: str, march: str = "native") -> int:
    """Compile ``source`` for CPU ``march`` into a shared object (cached by source and CPU);
    address of ``fn_name``."""
    key = hashlib.sha256(f"{march}|{source}".encode()).hexdigest()
    if key not in _LIBS:
        path = compile_shared(source, "kernel", ("-O3", f"-march={march}", "-ffp-contract=fast", "-fopenmp", "-std=gnu11"),
                              subdir="kernels", error=CCompileError, libs=("-lm",))
        _LIBS[key] = ctypes.CDLL(str(path))
    return ctypes.cast(getattr(_LIBS[key], fn_name), ctypes.c_void_p).value
