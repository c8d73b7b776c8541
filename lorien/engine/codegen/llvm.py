"""LLVM renderer: UOps -> LLVM IR text with llvmlite, then O3 + MCJIT for the target CPU.

Each ALU op is one row of a table; the walker keeps a loop/if stack and outlines parallel
loops into ``<kernel>_par<n>(ctx, begin, end)`` functions driven by ``lorien_parallel_for``.
A kernel has the signature ``void kernel(void **args)``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir

from lorien.engine import cpu, runtime
from lorien.engine.lower import Program, UOp

I1, I32, I64, PTR = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.PointerType()
DTYPES = {"float32": ir.FloatType(), "float64": ir.DoubleType(), "int32": I32, "int64": I64, "bool": I1}
FLOATS = ("float32", "float64")
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}


def _opaque(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """``value`` as an opaque ``ptr`` (llvmlite may build typed pointers for allocas)."""
    cast = ir.instructions.CastInstr(builder.block, "bitcast", value, PTR)
    builder._insert(cast)
    return cast


def _mangle(ty: ir.Type) -> str:
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_mangle(ty.element)}"
    return {"float": "f32", "double": "f64"}.get(str(ty), str(ty))


def _nbytes(ty: ir.Type) -> int:
    if isinstance(ty, ir.VectorType):
        return ty.count * _nbytes(ty.element)
    if isinstance(ty, ir.PointerType):
        return 8
    return {32: 4, 64: 8, 1: 1}.get(getattr(ty, "width", 0), 4 if isinstance(ty, ir.FloatType) else 8)


@functools.cache
def vtype(dtype: str, lanes: int) -> ir.Type:
    """The LLVM type of ``lanes`` values of ``dtype``; one object per pair (llvmlite keeps a
    type's text on it, so the module is written faster)."""
    return DTYPES[dtype] if lanes == 1 else ir.VectorType(DTYPES[dtype], lanes)


@functools.cache
def _lane(lane: int) -> ir.Constant:
    """``i32 lane``: one constant object per lane (llvmlite keeps a constant's text on it)."""
    return ir.Constant(I32, lane)


@functools.cache
def _undef(dtype: str, lanes: int) -> ir.Constant:
    return ir.Constant(vtype(dtype, lanes), ir.Undefined)


@functools.cache
def _splat_mask(lanes: int) -> ir.Constant:
    """The shufflevector mask that copies lane 0 into every lane."""
    return ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)


def _fcmp(pred):
    return lambda r, x, y: r.b.fcmp_ordered(pred, x, y)


def _icmp(pred):
    return lambda r, x, y: r.b.icmp_signed(pred, x, y)


def _libm(name: str):
    """A C math library function (``erff``/``erf``...), called lane by lane on a vector."""
    def call(r, x):
        element = x.type.element if isinstance(x.type, ir.VectorType) else x.type
        fn = r.extern(name + ("f" if isinstance(element, ir.FloatType) else ""), element, [element])
        if not isinstance(x.type, ir.VectorType):
            return r.b.call(fn, [x])
        vec = ir.Constant(x.type, ir.Undefined)
        for lane in range(x.type.count):
            part = r.b.call(fn, [r.b.extract_element(x, _lane(lane))])
            vec = r.b.insert_element(vec, part, _lane(lane))
        return vec
    return call


def _one(x: ir.Value) -> ir.Constant:
    return ir.Constant(x.type, 1.0) if not isinstance(x.type, ir.VectorType) else \
        ir.Constant(x.type, [ir.Constant(x.type.element, 1.0)] * x.type.count)


FLOAT_ALU = {
    "add": lambda r, x, y: r.b.fadd(x, y), "sub": lambda r, x, y: r.b.fsub(x, y),
    "mul": lambda r, x, y: r.b.fmul(x, y), "div": lambda r, x, y: r.b.fdiv(x, y),
    "max": lambda r, x, y: r.b.select(r.b.fcmp_ordered(">", x, y), x, y),
    "min": lambda r, x, y: r.b.select(r.b.fcmp_ordered("<", x, y), x, y),
    "lt": _fcmp("<"), "le": _fcmp("<="), "eq": _fcmp("=="), "ne": _fcmp("!="),
    "fma": lambda r, x, y, z: r.b.call(r.intrinsic("llvm.fma", x.type), [x, y, z]),
    "exp": lambda r, x: r.b.call(r.intrinsic("llvm.exp", x.type), [x]),
    "sqrt": lambda r, x: r.b.call(r.intrinsic("llvm.sqrt", x.type), [x]),
    "log": lambda r, x: r.b.call(r.intrinsic("llvm.log", x.type), [x]),
    "fabs": lambda r, x: r.b.call(r.intrinsic("llvm.fabs", x.type), [x]),
    "rsqrt": lambda r, x: r.b.fdiv(_one(x), r.b.call(r.intrinsic("llvm.sqrt", x.type), [x])),
    "sigmoid": lambda r, x: r.b.fdiv(_one(x), r.b.fadd(_one(x), r.b.call(
        r.intrinsic("llvm.exp", x.type), [r.b.fneg(x)]))),
    "tanh": _libm("tanh"), "erf": _libm("erf"),
    "pow": lambda r, x, y: r.b.call(r.intrinsic("llvm.pow", x.type), [x, y]),
}
INT_ALU = {
    "add": lambda r, x, y: r.b.add(x, y), "sub": lambda r, x, y: r.b.sub(x, y),
    "mul": lambda r, x, y: r.b.mul(x, y), "div": lambda r, x, y: r.b.sdiv(x, y),
    "floordiv": lambda r, x, y: r.b.sdiv(x, y), "mod": lambda r, x, y: r.b.srem(x, y),
    "max": lambda r, x, y: r.b.select(r.b.icmp_signed(">", x, y), x, y),
    "min": lambda r, x, y: r.b.select(r.b.icmp_signed("<", x, y), x, y),
    "lt": _icmp("<"), "le": _icmp("<="), "eq": _icmp("=="), "ne": _icmp("!="),
    "and": lambda r, x, y: r.b.and_(x, y), "or": lambda r, x, y: r.b.or_(x, y),
    "not": lambda r, x: r.b.not_(x),
}


def _cast(r, x, src: str, dst: str, ty: ir.Type):
    if src == dst:
        return x
    if src in FLOATS and dst in FLOATS:
        return r.b.fpext(x, ty) if dst == "float64" else r.b.fptrunc(x, ty)
    if src in FLOATS:
        return r.b.fptosi(x, ty)
    if dst in FLOATS:
        return r.b.uitofp(x, ty) if src == "bool" else r.b.sitofp(x, ty)
    widths = {"bool": 1, "int32": 32, "int64": 64}
    if widths[dst] > widths[src]:
        return r.b.zext(x, ty) if src == "bool" else r.b.sext(x, ty)
    return r.b.trunc(x, ty)


class _Function:
    """One LLVM function being filled: an alloca block, the body builder, value map."""

    def __init__(self, module: ir.Module, name: str, args: list[ir.Type]):
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name)
        self.fn.attributes.add("nounwind")
        self.alloca_block = self.fn.append_basic_block("allocas")
        self.allocas = ir.IRBuilder(self.alloca_block)
        self.b = ir.IRBuilder(self.fn.append_basic_block("body"))

    def finish(self) -> None:
        self.b.ret_void()
        self.allocas.branch(self.fn.blocks[1])


class LLVMRenderer:
    """Walks a Program's uops and emits an ``ir.Module``."""

    def __init__(self, program: Program, name: str):
        self.p, self.name = program, name
        self.module = ir.Module(name=name)
        self.module.triple = llvm.get_process_triple()
        self.values: dict[int, ir.Value] = {}
        self.constants: dict[tuple, ir.Constant] = {}  # per CONST uop's (dtype, lanes, repr(value))
        self.n_parallel = 0
        self.ends = self._match_ends(program.uops)

    @staticmethod
    def _match_ends(uops: list[UOp]) -> dict[int, int]:
        ends, stack = {}, []
        for i, u in enumerate(uops):
            if u.op == "LOOP":
                stack.append(i)
            elif u.op == "ENDLOOP":
                ends[stack.pop()] = i
        return ends

    def intrinsic(self, name: str, ty: ir.Type) -> ir.Function:
        arity = {"llvm.fma": 3, "llvm.pow": 2}.get(name, 1)
        return self.extern(f"{name}.{_mangle(ty)}", ty, [ty] * arity)

    def extern(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        if name in self.module.globals:
            return self.module.globals[name]
        return ir.Function(self.module, ir.FunctionType(ret, args), name)

    def _impl(self, name: str, params: list[ir.Type]) -> _Function:
        """An always-inlined function whose pointer parameters are ``noalias`` (the buffers of one
        kernel never overlap); inlining turns that into alias scopes, so LLVM can keep values in
        registers across stores."""
        impl = _Function(self.module, name, params)
        impl.fn.linkage = "internal"
        impl.fn.attributes.add("alwaysinline")
        for arg, ty in zip(impl.fn.args, params, strict=True):
            if isinstance(ty, ir.PointerType):
                arg.add_attribute("noalias")
        return impl

    def _call(self, caller: _Function, callee: _Function, values: list[ir.Value]) -> None:
        caller.b.call(callee.fn, values)
        caller.finish()

    def render(self) -> ir.Module:
        wrapper = _Function(self.module, self.name, [PTR])
        wrapper.fn.args[0].name = "args"
        self.f = self._impl(f"{self.name}_impl", [PTR] * len(self.p.args))
        self.b = self.f.b
        self.render_range(0, len(self.p.uops))
        self.f.finish()
        pointers = [wrapper.b.load(wrapper.b.gep(wrapper.fn.args[0], [ir.Constant(I64, i)], source_etype=PTR), typ=PTR)
                    for i in range(len(self.p.args))]
        self._call(wrapper, self.f, pointers)
        return self.module

    def render_range(self, start: int, stop: int) -> None:
        loops: list[tuple] = []
        i = start
        while i < stop:
            u = self.p.uops[i]
            if u.op == "LOOP" and u.arg[2] == "parallel":
                self.render_parallel(i)
                i = self.ends[i] + 1
                continue
            self.render_uop(i, u, loops)
            i += 1

    def value(self, i: int) -> ir.Value:
        return self.values[i]

    def render_uop(self, i: int, u: UOp, loops: list) -> None:
        """Emit uop ``i``: one row of :data:`UOP_RULES`, handed the uop, its operands' values, its
        LLVM type and the stack of open loops and conditionals; its result (if any) is kept."""
        rule = UOP_RULES.get(u.op)
        if rule is None:
            raise ValueError(f"LLVM renderer: unknown uop {u.op!r} at %{i}")
        src = [self.values[s] for s in u.src] if u.op not in ("ENDLOOP", "ENDIF") else []
        value = rule(self, u, src, vtype(u.dtype, u.lanes), loops)
        if value is not None:
            self.values[i] = value

    def close_loop(self, phi, extent) -> None:
        b = self.b
        nxt = b.add(phi, ir.Constant(I64, 1))
        phi.add_incoming(nxt, b.block)
        after = self.f.fn.append_basic_block("endloop")
        b.cbranch(b.icmp_signed("<", nxt, extent), phi.parent, after)
        b.position_at_end(after)

    def render_parallel(self, start: int) -> None:
        """Outline LOOP(parallel)..ENDLOOP into a function run by ``lorien_parallel_for``."""
        stop = self.ends[start]
        inner = set(range(start, stop + 1))
        captured = sorted({s for u in self.p.uops[start + 1 : stop] for s in u.src
                           if s not in inner and not isinstance(self.values.get(s), ir.Constant)})
        types = [self.values[s].type for s in captured]
        outer_f = self.f
        ctx_slots = outer_f.allocas.alloca(ir.ArrayType(I64, 8 * max(1, len(captured))), name=f"par{self.n_parallel}_ctx")
        ctx_slots.align = 64
        ctx = _opaque(outer_f.allocas, ctx_slots)

        def slot(builder, base, field, ty):
            """Field ``field`` of the context: 64-byte slots addressed in units of ``ty``."""
            return builder.gep(base, [ir.Constant(I64, field * 64 // _nbytes(ty))], source_etype=ty)

        outer_b = self.b
        for field, s in enumerate(captured):
            outer_b.store(self.values[s], slot(outer_b, ctx, field, types[field]))
        name = f"{self.name}_par{self.n_parallel}"
        self.n_parallel += 1
        body = _Function(self.module, name, [PTR, I64, I64])
        ctx_arg, begin, end = body.fn.args
        loaded = [body.b.load(slot(body.b, ctx_arg, field, ty), typ=ty) for field, ty in enumerate(types)]
        impl = self._impl(f"{name}_impl", [*types, I64, I64])
        saved = {s: self.values[s] for s in captured}
        self.f, self.b = impl, impl.b
        for k, s in enumerate(captured):
            self.values[s] = impl.fn.args[k]
        pre = impl.b.block
        header = impl.fn.append_basic_block("par_loop")
        impl.b.branch(header)
        impl.b.position_at_end(header)
        phi = impl.b.phi(I64, name=self.p.uops[start].arg[0].replace(".", "_"))
        phi.add_incoming(impl.fn.args[-2], pre)
        self.values[start] = phi
        self.render_range(start + 1, stop)
        self.close_loop(phi, impl.fn.args[-1])
        impl.finish()
        self._call(body, impl, [*loaded, begin, end])
        self.f, self.b = outer_f, outer_b
        self.values.update(saved)
        launch = self.extern("lorien_parallel_for", ir.VoidType(), [PTR, PTR, I64])
        self.b.call(launch, [body.fn, ctx, ir.Constant(I64, self.p.uops[start].arg[1])])


# ---------------------------------------------------------------- JIT

_LOCK = threading.Lock()
_STATE: dict = {}


def _engine():
    if "engine" not in _STATE:
        for name, address in runtime.symbol_addresses().items():
            llvm.add_symbol(name, address)
        _STATE["engine"] = llvm.create_mcjit_compiler(llvm.parse_assembly(""), cpu.host_cpu().machine())
        _STATE["cache"] = {}
    return _STATE["engine"]


def render(program: Program, name: str | None = None) -> str:
    """LLVM IR text of ``program``."""
    return str(LLVMRenderer(program, name or program.name).render())


def compile_ir(ir_text: str, fn_name: str, target: cpu.CpuTarget | None = None) -> int:
    """Optimize (O3) and JIT ``ir_text`` for ``target`` (default this host); returns the
    address of ``fn_name``.

    Cached by the hash of the IR and the CPU: in memory for this process, and as object
    files in ``~/.cache/lorien/kernels`` across processes.
    """
    target = target or cpu.host_cpu()
    key = hashlib.sha256(f"{target.cpu}|{target.features}|{ir_text}".encode()).hexdigest()
    with _LOCK:
        _engine()
        if key in _STATE["cache"]:
            return _STATE["cache"][key]
    path = runtime.cache_dir() / "kernels" / f"{key}.o"
    if path.exists():
        obj = path.read_bytes()
    else:
        obj = compile_object(ir_text, target)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(obj)
        os.replace(tmp, path)
    address = load_object(obj, fn_name)
    with _LOCK:
        _STATE["cache"][key] = address
    return address


def assembly(ir_text: str, target: cpu.CpuTarget | None = None) -> str:
    """Assembly of ``ir_text`` after O3 for ``target`` (default this host), as code generation
    makes it (for inspecting register tiles and the instructions used)."""
    machine = (target or cpu.host_cpu()).machine()
    return machine.emit_assembly(_optimized_module(ir_text, machine))


@functools.cache
def _codegen_options() -> None:
    """LLVM options of this process, set once: no post-RA list scheduling (on znver4 it took
    10 to 25% of the compile time of tuning candidates, large unrolled kernels most, and the
    kernels ran as fast without it)."""
    llvm.set_option("lorien", "-post-RA-scheduler=false")


@functools.cache
def measurement_codegen_options() -> None:
    """LLVM options of a measurement build worker (tuning candidates' builds), set once: those of
    :func:`_codegen_options` and no pre-RA machine scheduler. On znver3 the scheduler took 13-14 % of
    the compile time of ResNet-18's guided tuning candidates (5-9 % of the BERT layer's, 3-8 % of the
    MobileNetV2 block's) and their kernels ran as fast without it, the BERT layer's and the block's
    about 1 % slower (``benchmarks/codegen_kernels.py``, docs/engine.md). A candidate's time only
    ranks it among the others, so its build skips the scheduler; a kernel built to be used
    (``build``, ``lorien apply``, ``lorien.compile``) keeps it."""
    _codegen_options()
    llvm.set_option("lorien", "-enable-misched=false")


def parse_module(ir_text: str, machine):
    """``ir_text`` parsed and verified as a module for this process's triple and ``machine``'s data layout."""
    mod = llvm.parse_assembly(ir_text)
    mod.triple = llvm.get_process_triple()
    mod.data_layout = str(machine.target_data)
    mod.verify()
    return mod


def run_passes(mod, machine, speed_level: int = 3, **tuning: bool) -> None:
    """The engine's IR pipeline on ``mod``: LLVM's ``speed_level`` module pipeline without its
    loop and SLP vectorizers (schedules vectorize explicitly; LLVM's own vectorizers only double
    the compile time); ``tuning`` sets other pipeline tuning options (benchmarks/codegen_pipeline.py)."""
    pto = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    pto.loop_vectorization = False
    pto.slp_vectorization = False
    for name, value in tuning.items():
        setattr(pto, name, value)
    pb = llvm.create_pass_builder(machine, pto)
    pb.getModulePassManager().run(mod, pb)


def _optimized_module(ir_text: str, machine):
    _codegen_options()
    mod = parse_module(ir_text, machine)
    run_passes(mod, machine)
    return mod


def compile_object(ir_text: str, target: cpu.CpuTarget | None = None) -> bytes:
    """O3 object code of ``ir_text`` for ``target`` (default this host): what a builder
    process ships to a runner."""
    machine = (target or cpu.host_cpu()).machine()
    dump_dir = os.environ.get("LORIEN_DUMP_IR")
    if dump_dir:
        _dump_ir(ir_text, dump_dir)
    return machine.emit_object(_optimized_module(ir_text, machine))


def _dump_ir(ir_text: str, dump_dir: str) -> None:
    """Write ``ir_text`` to ``<dump_dir>/<sha256>.ll`` ($LORIEN_DUMP_IR: a corpus of the IR the
    engine really builds, for ``benchmarks/codegen_pipeline.py``)."""
    path = Path(dump_dir) / f"{hashlib.sha256(ir_text.encode()).hexdigest()[:24]}.ll"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ir_text)


def load_object(obj: bytes, fn_name: str) -> int:
    """Link an object made by ``compile_object`` into this process; returns ``fn_name``'s address."""
    key = hashlib.sha256(obj).hexdigest()
    with _LOCK:
        engine = _engine()
        cache = _STATE["cache"]
        if key not in cache:
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            engine.finalize_object()
            cache[key] = engine.get_function_address(fn_name)
        return cache[key]


# ---- one row per uop: (renderer, uop, operand values, LLVM type, open loops) -> value or None ----

def _alloc(r: Any, u: UOp, src: list, ty: Any, loops: list) -> ir.Value:
    name, size, scope = u.arg
    if scope == "global":
        alloc = r.extern("lorien_alloc", PTR, [I64])
        return r.b.call(alloc, [ir.Constant(I64, size * ITEMSIZE[u.dtype])])
    slot = r.f.allocas.alloca(ir.ArrayType(DTYPES[u.dtype], size), name=name.replace(".", "_"))
    slot.align = 64
    return _opaque(r.f.allocas, slot)


def _free(r: Any, u: UOp, src: list, ty: Any, loops: list) -> None:
    r.b.call(r.extern("lorien_free", ir.VoidType(), [PTR]), src)


def _const(r: Any, u: UOp, src: list, ty: Any, loops: list) -> ir.Value:
    key = (u.dtype, u.lanes, repr(u.arg))  # repr: -0.0 is not 0.0, True is not 1
    value = r.constants.get(key)
    if value is None:
        elem = DTYPES[u.dtype]
        value = r.constants[key] = ir.Constant(elem, u.arg) if u.lanes == 1 else \
            ir.Constant(ty, [ir.Constant(elem, v) for v in u.arg])
    return value


def _loop(r: Any, u: UOp, src: list, ty: Any, loops: list) -> ir.Value:
    pre = r.b.block
    header = r.f.fn.append_basic_block(f"loop_{u.arg[0].replace('.', '_')}")
    r.b.branch(header)
    r.b.position_at_end(header)
    phi = r.b.phi(I64, name=u.arg[0].replace(".", "_"))
    phi.add_incoming(ir.Constant(I64, 0), pre)
    loops.append((phi, ir.Constant(I64, u.arg[1])))
    return phi


def _if(r: Any, u: UOp, src: list, ty: Any, loops: list) -> None:
    then, after = r.f.fn.append_basic_block("then"), r.f.fn.append_basic_block("endif")
    r.b.cbranch(src[0], then, after)
    r.b.position_at_end(then)
    loops.append(after)


def _endif(r: Any, u: UOp, src: list, ty: Any, loops: list) -> None:
    after = loops.pop()
    r.b.branch(after)
    r.b.position_at_end(after)


@functools.cache
def _widening_masks(lanes: int, wide: int) -> tuple[ir.Constant, ir.Constant, ir.Constant]:
    """For a masked load of ``lanes`` lanes done as one of ``wide``: the all-false mask of
    ``lanes`` lanes, the shufflevector mask that widens a lane mask with false lanes and the one
    that keeps the first ``lanes`` lanes of the wide value."""
    return (ir.Constant(ir.VectorType(I1, lanes), None),
            ir.Constant(ir.VectorType(I32, wide), list(range(lanes)) + [lanes] * (wide - lanes)),
            ir.Constant(ir.VectorType(I32, lanes), list(range(lanes))))


def _load(r: Any, u: UOp, src: list, ty: Any, loops: list) -> ir.Value:
    ptr = r.b.gep(src[0], [src[1]], source_etype=DTYPES[u.dtype])
    if len(src) == 3:  # masked
        return _masked_load(r, u, ptr, src[2], ty)
    return r.b.load(ptr, typ=ty, align=4)


def _masked_load(r: Any, u: UOp, ptr: ir.Value, mask: ir.Value, ty: Any) -> ir.Value:
    """``llvm.masked.load`` of ``u.lanes`` lanes, zero where ``mask`` is false. A lane count that
    is not a power of two is loaded as the next power of two with the extra lanes masked off (they
    touch no memory), then narrowed: LLVM 22 splits a 9-lane masked load for AVX2 into 8 masked
    lanes and a ninth it loads and keeps whatever its mask says (a padded 7x7 convolution input
    read as 9 lanes, one of TVM's own ResNet-18 traces, stored the input's next value where the
    padding's zero belongs; docs/engine.md). AVX-512's mask registers never split it."""
    lanes = u.lanes
    wide = 1 << (lanes - 1).bit_length()
    if wide == lanes:
        masked = r.extern(f"llvm.masked.load.{_mangle(ty)}.p0", ty, [PTR, I32, ir.VectorType(I1, lanes), ty])
        return r.b.call(masked, [ptr, ir.Constant(I32, 4), mask, ir.Constant(ty, None)])
    wide_ty = vtype(u.dtype, wide)
    off, widen, narrow = _widening_masks(lanes, wide)
    masked = r.extern(f"llvm.masked.load.{_mangle(wide_ty)}.p0", wide_ty, [PTR, I32, ir.VectorType(I1, wide), wide_ty])
    loaded = r.b.call(masked, [ptr, ir.Constant(I32, 4), r.b.shuffle_vector(mask, off, widen), ir.Constant(wide_ty, None)])
    return r.b.shuffle_vector(loaded, _undef(u.dtype, wide), narrow)


def _store(r: Any, u: UOp, src: list, ty: Any, loops: list) -> None:
    r.b.store(src[2], r.b.gep(src[0], [src[1]], source_etype=DTYPES[u.dtype]), align=4)


def _alu(r: Any, u: UOp, src: list, ty: Any, loops: list) -> ir.Value:
    if u.arg == "where":
        return r.b.select(*src)
    table = FLOAT_ALU if r.p.uops[u.src[0]].dtype in FLOATS else INT_ALU
    return table[u.arg](r, *src)


def _broadcast(r: Any, u: UOp, src: list, ty: Any, loops: list) -> ir.Value:
    undef = _undef(u.dtype, u.lanes)
    first = r.b.insert_element(undef, src[0], _lane(0))
    return r.b.shuffle_vector(first, undef, _splat_mask(u.lanes))


def _vector(r: Any, u: UOp, src: list, ty: Any, loops: list) -> ir.Value:
    vec = _undef(u.dtype, u.lanes)
    for lane, part in enumerate(src):
        vec = r.b.insert_element(vec, part, _lane(lane))
    return vec


UOP_RULES: dict[str, Any] = {
    "ARG": lambda r, u, src, ty, loops: r.f.fn.args[u.arg[0]],
    "ALLOC": _alloc,
    "FREE": _free,
    "CONST": _const,
    "LOOP": _loop,
    "ENDLOOP": lambda r, u, src, ty, loops: r.close_loop(*loops.pop()),
    "IF": _if,
    "ENDIF": _endif,
    "LOAD": _load,
    "STORE": _store,
    "ALU": _alu,
    "CAST": lambda r, u, src, ty, loops: _cast(r, src[0], r.p.uops[u.src[0]].dtype, u.dtype, ty),
    "BROADCAST": _broadcast,
    "VECTOR": _vector,
    "EXTRACT": lambda r, u, src, ty, loops: r.b.extract_element(src[0], _lane(u.arg)),
}
