"""Make the relax JSONDatabases of ``tests/data`` with real TVM 0.27 MetaSchedule (needs apache-tvm).

Two small models are written with ``tvm.relax.frontend.nn``:

- ``relax_convnet``: NCHW, batch 1: conv2d+bias+relu twice, then two dense layers with bias;
- ``relax_bert_layer``: one BERT-style encoder layer (seq 16, hidden 64, 2 heads): q/k/v/output
  projections with bias, scaled QK^T batch matmul, softmax, residual adds, layer_norm, and a
  feed-forward block with GELU through ``erf``.

Each model goes through the passes TVM's relax pipeline runs before tuning (LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR), its tasks come from
``extract_tasks``, and MetaSchedule tunes them for a few trials each into the JSONDatabase
pair ``tests/data/<name>/database_{workload,tuning_record}.json``. The records are what TVM's
llvm design space emits for these tasks (GetConsumers, RFactor, ``"None"`` split factors,
DecomposeReduction, ReverseComputeInline, ``meta_schedule.*`` annotations, ...); the tests
replay them on Lorien's engine without TVM.

Run from the repository root (a few minutes on 2 cores)::

    python tests/data/make_relax_databases.py [--trials 8] [--only relax_convnet]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm import relax
from tvm.relax.frontend import nn

from dialects.meta_schedule.tvm_measure import forked_builder

HERE = Path(__file__).parent
TARGET = {"kind": "llvm", "num-cores": 2}


class ConvNet(nn.Module):
    """conv2d+bias+relu x2 (NCHW), flatten, dense+bias, relu, dense+bias."""

    def __init__(self) -> None:
        self.conv1 = nn.Conv2D(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2D(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 8 * 8, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        x = nn.op.relu(self.conv1(x))
        x = nn.op.relu(self.conv2(x))
        x = nn.op.reshape(x, (1, 16 * 8 * 8))
        return self.fc2(nn.op.relu(self.fc1(x)))


class BertLayer(nn.Module):
    """One post-norm encoder layer: self-attention, add & layer_norm, FFN with erf GELU, add & layer_norm."""

    def __init__(self, seq: int = 16, hidden: int = 64, heads: int = 2, ffn: int = 128) -> None:
        self.seq, self.hidden, self.heads = seq, hidden, heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.output = nn.Linear(hidden, hidden)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.ffn_in, self.ffn_out = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def _heads(self, x: nn.Tensor) -> nn.Tensor:
        x = nn.op.reshape(x, (1, self.seq, self.heads, self.hidden // self.heads))
        return nn.op.permute_dims(x, [0, 2, 1, 3])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        head_dim = self.hidden // self.heads
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) * (1.0 / head_dim**0.5)
        context = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
        context = nn.op.reshape(nn.op.permute_dims(context, [0, 2, 1, 3]), (1, self.seq, self.hidden))
        x = self.norm1(x + self.output(context))
        return self.norm2(x + self.ffn_out(nn.op.gelu(self.ffn_in(x))))


MODELS = {
    "relax_convnet": (ConvNet, {"x": nn.spec.Tensor((1, 3, 8, 8), "float32")}),
    "relax_bert_layer": (BertLayer, {"x": nn.spec.Tensor((1, 16, 64), "float32")}),
}


def fused_module(name: str) -> tvm.IRModule:
    """The model as TVM tunes it: legalized, annotated, folded and fused."""
    model, inputs = MODELS[name]
    mod, _ = model().export_tvm(spec={"forward": inputs})
    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
              relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    return tvm.transform.Sequential(passes)(mod)


def make_database(name: str, trials_per_task: int, seed: int) -> Path:
    """Tune every task of model ``name`` for ``trials_per_task`` trials into ``tests/data/<name>``."""
    target = tvm.target.Target(TARGET)
    tasks = ms.relax_integration.extract_tasks(fused_module(name), target)
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    database = ms.database.JSONDatabase(path_workload=str(out / "database_workload.json"),
                                        path_tuning_record=str(out / "database_tuning_record.json"))
    with tempfile.TemporaryDirectory() as work_dir:
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            tasks, work_dir, num_threads=1, seed=seed)
        ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir,
                      max_trials_global=trials_per_task * len(contexts), max_trials_per_task=trials_per_task,
                      num_trials_per_iter=trials_per_task, builder=forked_builder(),
                      runner=ms.runner.LocalRunner(timeout_sec=120), database=database, cost_model="random")
    print(f"{name}: {len(contexts)} tasks, {len(database)} records in {out}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="trials per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=sorted(MODELS), help="make one database")
    args = parser.parse_args()
    for name in [args.only] if args.only else MODELS:
        make_database(name, args.trials, args.seed)


if __name__ == "__main__":
    main()
