"""notebooks/train_cost_model.ipynb runs end to end: real measurements on the engine ->
features -> training -> plots -> measured zero-shot proposals committed to the store ->
the same configs measured for a second target and the transfer curve plotted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "train_cost_model.ipynb"


def _kernel_name() -> str:
    """The ``python3`` kernel (ipykernel's spec: the ``python`` of this environment)."""
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME, KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(NATIVE_KERNEL_NAME)
    except NoSuchKernel:
        pytest.fail(f"no {NATIVE_KERNEL_NAME!r} kernel: install ipykernel in this environment")
    return NATIVE_KERNEL_NAME


@pytest.mark.slow
def test_notebook_trains_evaluates_and_proposes_for_an_unseen_workload(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    store_uri = f"parquet:{tmp_path / 'warehouse'}"
    monkeypatch.setenv("LORIEN_NOTEBOOK_WORKDIR", str(tmp_path))
    monkeypatch.setenv("LORIEN_NOTEBOOK_STORE", store_uri)
    monkeypatch.setenv("LORIEN_NOTEBOOK_TRIALS", "6")
    monkeypatch.setenv("LORIEN_NOTEBOOK_MEASURE", "2")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, kernel_name=_kernel_name(), timeout=600,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = "\n".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                        for output in cell.get("outputs", []))
    assert "zero-shot proposals of model 'notebook'" in outputs
    assert (tmp_path / "model" / "model.json").is_file()
    assert (tmp_path / "features" / "dense_pack.x86.csv").is_file()
    images = [output for cell in notebook.cells for output in cell.get("outputs", [])
              if "image/png" in output.get("data", {})]
    assert len(images) == 3  # predicted vs measured, top-k per workload, the transfer curve
    transfer = json.loads((tmp_path / "transfer-model" / "report.json").read_text())
    assert set(transfer["templates"]["dense_pack.x86"]["transfer_curve"]) == {"0", "0.25", "0.5", "1"}

    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        proposed = store.scan({"source": "model:notebook"}, columns=["source", "cost_s"])
    assert proposed.num_rows == 2
