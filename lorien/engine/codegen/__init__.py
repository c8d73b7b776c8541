"""Renderers: each turns a lowered ``Program`` (flat UOps) into code for one kind of device.

``llvm.py`` renders LLVM IR for the host CPU and JIT-compiles it. A renderer only needs the
uop kinds listed in ``lorien.engine.lower``; unrolling and vectorization are already done,
so a CUDA C renderer maps the same list to C text (a later issue).
"""
