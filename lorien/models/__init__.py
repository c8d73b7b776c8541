"""Workloads from models: ONNX and torch importers, task weights, mutation rules.

``extract_models`` reads models into weighted tasks (``lorien extract``); ``mutate_tasks``
grows a task list into a training set (``lorien mutate``). Both write ``lorien tune`` YAML.
"""

from lorien.models.extract import Extraction, extract_models
from lorien.models.frontend import ExtractError, InputSpec, ModelReport, parse_input_spec
from lorien.models.tasks import Task, merge_tasks

__all__ = ["ExtractError", "Extraction", "InputSpec", "ModelReport", "Task", "extract_models", "merge_tasks",
           "parse_input_spec"]
