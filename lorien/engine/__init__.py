"""The kernel engine: compute DSL, schedules, loop-nest IR, LLVM codegen and measurement.

    from lorien.engine import build, create_schedule, te
    A = te.placeholder((M, K), "float32", name="A")
    ...
    s = create_schedule(C)
    kernel = build(s, [A, B, C])
    kernel(a, b, c)
"""

from lorien.engine import te
from lorien.engine.build import Kernel, build, build_program
from lorien.engine.lower import Program, lower
from lorien.engine.schedule import Schedule, ScheduleError, create_schedule

__all__ = ["te", "build", "build_program", "create_schedule", "lower", "Kernel", "Program", "Schedule", "ScheduleError"]
