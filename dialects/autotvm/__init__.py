"""The autotvm dialect: AutoTVM knob spaces, templates, records, features and tuning."""

from dialects.autotvm.dialect import AutoTVMDialect

DIALECT = AutoTVMDialect()


def apply_config(*args, **kwargs):
    """Build and measure one config of a workload (see :func:`dialects.autotvm.apply.apply_config`)."""
    from dialects.autotvm.apply import apply_config as _apply_config

    return _apply_config(*args, **kwargs)


__all__ = ["DIALECT", "AutoTVMDialect", "apply_config"]
