"""Extraction benchmark: how long `lorien extract` takes on the sample models.

    python benchmarks/extract.py            # ResNet-18, ResNet-50, MobileNetV2, BERT-base layer; 5 runs each
    python benchmarks/extract.py --quick    # the same models, 1 run each

The torchvision models (random weights) are exported to ONNX with torch's exporter and saved
as single files with their weights inside (ResNet-50: 102 MB), and the BERT-base encoder
layer is built with onnx.helper (lorien.models.bert), into a temporary directory; exporting
is not timed. Each model is then extracted from its ONNX file (load
without weights, shape inference, task matching) and, for the torchvision ones, from its
torch factory (built on the meta device, torch.export, task matching); the median of the
runs is reported. The first torch extraction of a process also imports torch and
torchvision; it is run once before timing.

Baseline: TVM (when apache-tvm is installed; one line says so when not). What a TVM user runs
to get a model's tuning tasks with weights: ``relax.frontend.onnx.from_onnx`` on the same ONNX
file (weights kept out of the module), the passes that make tunable kernels (LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR) and MetaSchedule's
``relax_integration.extract_tasks``; timed the same way (median of the runs, loading the ONNX
file included, TVM's import not). TVM's tasks are every fused kernel (elementwise and layout
ones too), so its task count is printed beside ours, not compared.
The last line: models, merged tasks, unsupported operators (ONNX path, all models),
extract_s (sum of the ONNX medians), resnet50_s, torch_s (sum of the torch medians),
tvm_s (sum of TVM's medians on the same ONNX files) and vs_tvm = tvm_s / extract_s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TORCHVISION_MODELS = ("resnet18", "resnet50", "mobilenet_v2")
IMAGE = "x:1x3x224x224"
TOKENS = "hidden_states:1x128x768"


def export_models(directory: Path) -> dict[str, str]:
    """ONNX files of the sample models."""
    import onnx
    import torch

    from lorien.models.bert import bert_encoder_layer
    from lorien.models.torch_frontend import import_module

    zoo = import_module("torchvision.models")
    paths = {}
    for name in TORCHVISION_MODELS:
        path = directory / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(getattr(zoo, name)().eval(), (torch.randn(1, 3, 224, 224),), str(path), verbose=False)
        # one self-contained file, weights inside (the exporter put them beside it)
        onnx.save(onnx.load(str(path)), str(path))
        Path(f"{path}.data").unlink(missing_ok=True)
        paths[name] = str(path)
    paths["bert_base_layer"] = str(directory / "bert_base_layer.onnx")
    onnx.save(bert_encoder_layer(), paths["bert_base_layer"])
    return paths


def tvm_extractor():
    """A function ONNX path, input shapes -> TVM's MetaSchedule tasks, or None without TVM."""
    import importlib.util

    if importlib.util.find_spec("tvm") is None:
        return None
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.s_tir import meta_schedule as ms

    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    passes = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                       relax.transform.FoldConstant(), relax.transform.FuseOps(),
                                       relax.transform.FuseTIR()])

    def extract(path: str, shapes: dict[str, list[int]]):
        module = from_onnx(onnx.load(path), shape_dict=shapes, keep_params_in_input=True)
        module, _params = relax.frontend.detach_params(module)
        return ms.relax_integration.extract_tasks(passes(module), target)

    return extract


def median_time(function, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run per model")
    args = parser.parse_args()
    runs = 1 if args.quick else 5

    from lorien.models import extract_models

    with tempfile.TemporaryDirectory() as tmp:
        print("exporting the sample models to ONNX (not timed) ...", flush=True)
        paths = export_models(Path(tmp))
        onnx_s, torch_s = {}, {}
        for name, path in paths.items():
            inputs = [TOKENS if name.startswith("bert") else IMAGE]
            extraction = extract_models([path], inputs)
            onnx_s[name] = median_time(lambda path=path, inputs=inputs: extract_models([path], inputs), runs)
            print(f"{name:<16} onnx   {onnx_s[name]:7.3f} s  {extraction.models[0].summary()}", flush=True)
        tvm_s = {}
        tvm_extract = tvm_extractor()
        if tvm_extract is None:
            print("TVM baseline: skipped (apache-tvm is not installed: pip install -e '.[tvm]')")
        for name, path in paths.items() if tvm_extract is not None else ():
            shapes = {"hidden_states": [1, 128, 768]} if name.startswith("bert") else None
            if shapes is None:
                import onnx

                graph = onnx.load(path, load_external_data=False).graph
                shapes = {graph.input[0].name: [1, 3, 224, 224]}
            tasks = tvm_extract(path, shapes)
            tvm_s[name] = median_time(lambda path=path, shapes=shapes: tvm_extract(path, shapes), runs)
            print(f"{name:<16} tvm    {tvm_s[name]:7.3f} s  {len(tasks)} MetaSchedule tasks "
                  f"(total weight {sum(task.weight for task in tasks)})", flush=True)
        extract_models(["torchvision.models:resnet18"], [IMAGE])
        for name in TORCHVISION_MODELS:
            factory = f"torchvision.models:{name}"
            extraction = extract_models([factory], [IMAGE])
            torch_s[name] = median_time(lambda factory=factory: extract_models([factory], [IMAGE]), runs)
            print(f"{name:<16} torch  {torch_s[name]:7.3f} s  {extraction.models[0].summary()}", flush=True)
        merged = extract_models(list(paths.values()), [IMAGE, TOKENS])
    print(merged.summary().splitlines()[-1])
    tvm_total = sum(tvm_s.values()) if tvm_s else float("nan")
    print(f"models={len(paths)} tasks={len(merged.tasks)} unsupported={sum(merged.unsupported.values())} "
          f"extract_s={sum(onnx_s.values()):.3f} resnet50_s={onnx_s['resnet50']:.3f} "
          f"torch_s={sum(torch_s.values()):.3f} tvm_s={tvm_total:.3f} "
          f"vs_tvm={tvm_total / sum(onnx_s.values()):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
