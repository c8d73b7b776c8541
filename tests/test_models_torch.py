"""lorien extract on torchvision models: exported to ONNX in the test, and traced from torch."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

from lorien.models import ExtractError, extract_models
from lorien.models.mutate import read_task_config

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
# torchvision is imported through lorien (it may need its operator declarations, see torch_frontend)
if importlib.util.find_spec("torchvision") is None:
    pytest.skip("torchvision is not installed", allow_module_level=True)

SAMPLE = Path(__file__).resolve().parent.parent / "configs" / "samples" / "resnet18.yaml"


def _export(name: str, path: Path) -> str:
    """A torchvision model with random weights, exported with torch's ONNX exporter."""
    from lorien.models.torch_frontend import import_module

    model = getattr(import_module("torchvision.models"), name)().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), str(path), verbose=False)
    return str(path)


@pytest.fixture(scope="module")
def resnet18_onnx(tmp_path_factory) -> str:
    return _export("resnet18", tmp_path_factory.mktemp("resnet18") / "resnet18.onnx")


@pytest.fixture(scope="module")
def mobilenet_onnx(tmp_path_factory) -> str:
    return _export("mobilenet_v2", tmp_path_factory.mktemp("mobilenet") / "mobilenet_v2.onnx")


def _shapes_and_weights(tasks) -> dict:
    return {(task.op, tuple(sorted(task.params.items()))): task.weight for task in tasks}


def test_resnet18_onnx_tasks_agree_with_the_hand_written_sample(resnet18_onnx):
    extraction = extract_models([resnet18_onnx])
    sample, _ = read_task_config(SAMPLE)
    assert _shapes_and_weights(extraction.tasks) == _shapes_and_weights(sample)
    assert extraction.models[0].tunable_ops == 21  # 20 convolutions and the classifier


def test_resnet18_traced_from_torch_agrees_with_its_onnx_export(resnet18_onnx):
    from_torch = extract_models(["torchvision.models:resnet18"], ["x:1x3x224x224"])
    from_onnx = extract_models([resnet18_onnx])
    assert _shapes_and_weights(from_torch.tasks) == _shapes_and_weights(from_onnx.tasks)
    assert [task.name for task in from_torch.tasks][:2] == ["resnet18/conv1", "resnet18/layer1.0.conv1"]
    # batch norm folds into a bias; the second conv of each block takes the residual add
    assert from_torch.tasks[1].epilogues == {"bias+relu": 2, "bias+add+relu": 2}
    assert from_torch.unsupported == {"max_pool2d": 1, "adaptive_avg_pool2d": 1, "flatten": 1}


def test_mobilenet_v2_depthwise_convolutions_are_their_own_tasks(mobilenet_onnx):
    extraction = extract_models([mobilenet_onnx])
    depthwise = [task for task in extraction.tasks if task.op == "depthwise_conv2d"]
    assert sum(task.weight for task in depthwise) == 17
    assert {task.params["stride"] for task in depthwise} == {(1, 1), (2, 2)}
    assert all(task.epilogues == {"relu6": task.weight} for task in depthwise)
    assert sum(task.weight for task in extraction.tasks) == 53  # 52 convolutions and the classifier


def test_merging_models_adds_the_weights_of_identical_tasks(resnet18_onnx):
    merged = extract_models([resnet18_onnx, "torchvision.models:resnet18"], ["x:1x3x224x224"])
    alone = extract_models([resnet18_onnx])
    assert _shapes_and_weights(merged.tasks) == {key: 2 * weight for key, weight in
                                                  _shapes_and_weights(alone.tasks).items()}
    assert all(task.models == ["resnet18", "resnet18#2"] for task in merged.tasks)


def test_torch_factory_with_literal_arguments_and_fused_attention():
    extraction = extract_models(["torch.nn:TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True)"],
                                ["src:1x8x64"])
    shapes = {(task.op, *(task.params[k] for k in ("B", "M", "N", "K") if k in task.params))
              for task in extraction.tasks}
    assert {("batch_matmul", 4, 8, 8, 16), ("batch_matmul", 4, 8, 16, 8), ("dense", 8, 128, 64),
            ("dense", 8, 64, 128)} <= shapes


def test_torch_module_needs_its_input_shapes():
    with pytest.raises(ExtractError, match=r"input 'x' needs a shape: give --input x:"):
        extract_models(["torchvision.models:resnet18"])


def test_unknown_factory_is_an_error_naming_it():
    with pytest.raises(ExtractError, match="has no attribute 'resnet_nineteen'"):
        extract_models(["torchvision.models:resnet_nineteen"], ["1x3x224x224"])
    with pytest.raises(ExtractError, match="cannot import 'no_such_module_here'"):
        extract_models(["no_such_module_here:net"], ["1x3x8x8"])


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2"])
def test_sample_configs_are_what_extract_writes_today(name):
    path = Path(__file__).resolve().parent.parent / "configs" / "models" / f"{name}.yaml"
    command = f"lorien extract torchvision.models:{name} --input x:1x3x224x224 -o configs/models/{name}.yaml"
    assert extract_models([f"torchvision.models:{name}"], ["x:1x3x224x224"]).to_yaml(command) == path.read_text()
