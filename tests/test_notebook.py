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
    temp_root = tmp_path / "tmp"  # the kernel's tempfile directory: the notebook makes its workdir in it
    temp_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp_root))
    monkeypatch.delenv("LORIEN_NOTEBOOK_WORKDIR", raising=False)
    monkeypatch.setenv("LORIEN_NOTEBOOK_STORE", store_uri)
    monkeypatch.setenv("LORIEN_NOTEBOOK_TRIALS", "6")
    monkeypatch.setenv("LORIEN_NOTEBOOK_MEASURE", "2")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    *cells, cleanup = notebook.cells
    client = NotebookClient(notebook, kernel_name=_kernel_name(), timeout=600,
                            resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for index, cell in enumerate(cells):
            client.execute_cell(cell, index)

        outputs = "\n".join(output.get("text", "") for cell in cells if cell.cell_type == "code"
                            for output in cell.get("outputs", []))
        assert "zero-shot proposals of model 'notebook'" in outputs
        (workdir,) = temp_root.iterdir()
        assert (workdir / "model" / "model.json").is_file()
        assert (workdir / "features" / "dense_pack.x86.csv").is_file()
        images = [output for cell in cells for output in cell.get("outputs", [])
                  if "image/png" in output.get("data", {})]
        assert len(images) == 3  # predicted vs measured, top-k per workload, the transfer curve
        transfer = json.loads((workdir / "transfer-model" / "report.json").read_text())
        assert set(transfer["templates"]["dense_pack.x86"]["transfer_curve"]) == {"0", "0.25", "0.5", "1"}

        client.execute_cell(cleanup, len(cells))
    assert list(temp_root.iterdir()) == []  # the temporary workdir is removed, nothing else left behind

    from lorien.warehouse import open_store

    with open_store(store_uri) as store:
        proposed = store.scan({"source": "model:notebook"}, columns=["source", "cost_s"])
    assert proposed.num_rows == 2
