"""The workload registry under the names of TVM's ``tvm.auto_scheduler.workload_registry``.

Ansor's users register workloads through the auto-scheduler (``register_workload``,
``make_workload_key``, ``workload_key_to_tensors``, save/load of the registry); those names
keep working here. The registry describes computations, not a tuning system, so it lives in
the core (:mod:`lorien.workload_registry`) and every dialect that tunes a compute DAG shares
it; this module only re-exports it.
"""

from lorien.workload_registry import (
    REFERENCES,
    WORKLOAD_FUNC_REGISTRY,
    UnregisteredWorkloadError,
    deserialize_workload_registry_entry,
    is_hashed,
    load_workload_func_registry,
    make_workload_key,
    parse_workload_key,
    reference_of,
    register_workload,
    register_workload_tensors,
    registered_names,
    save_workload_func_registry,
    serialize_args,
    serialize_workload_registry_entry,
    workload_dag,
    workload_key_to_tensors,
)

__all__ = [
    "REFERENCES", "WORKLOAD_FUNC_REGISTRY", "UnregisteredWorkloadError", "deserialize_workload_registry_entry",
    "is_hashed", "load_workload_func_registry", "make_workload_key", "parse_workload_key", "reference_of",
    "register_workload", "register_workload_tensors", "registered_names", "save_workload_func_registry",
    "serialize_args", "serialize_workload_registry_entry", "workload_dag", "workload_key_to_tensors",
]
