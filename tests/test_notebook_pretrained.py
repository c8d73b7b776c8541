"""notebooks/pretrained_curves.ipynb plots the pre-trained benchmark's curves (best so far
against trials, from scratch and with the model) from the JSON the benchmark wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "pretrained_curves.ipynb"
CURVES = ROOT / "docs" / "figures" / "pretrained-300.json"  # the notebook's default


def test_the_committed_curves_hold_what_the_notebook_and_docs_quote():
    result = json.loads(CURVES.read_text())
    for key in ("pretrained_trials_speedup_autotvm", "pretrained_trials_speedup_auto_scheduler",
                "pretrained_trials_speedup_meta_schedule", "pretrained_final_vs_scratch"):
        assert result[key] > 0
    assert {entry["dialect"] for entry in result["layers"]} == {"autotvm", "auto_scheduler", "meta_schedule"}
    for entry in result["layers"]:
        assert len(entry["curve_scratch_ms"]) == len(entry["curve_pretrained_ms"]) == result["trials"]


def test_notebook_plots_both_curves_of_every_layer(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("LORIEN_PRETRAINED_CURVES", str(CURVES))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]
    text = "\n".join(output.get("text", "") for output in outputs)
    assert "pretrained_trials_speedup_meta_schedule=" in text
    assert sum(1 for output in outputs if "image/png" in output.get("data", {})) == 1
    assert list(tmp_path.iterdir()) == []  # the PNG it wrote is removed
