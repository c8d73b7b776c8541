"""The plugin boundary: a third-party package adds a dialect with one entry point."""

import subprocess
import sys
import textwrap

import pytest

from lorien.dialect import available_dialects, get_dialect
from lorien.errors import DialectError

THIRD_PARTY_DIALECT = textwrap.dedent(
    """
    from lorien.dialect import Dialect

    class ToyDialect(Dialect):
        name = "toy"

        def record_formats(self):
            return ["toy-jsonl"]

    DIALECT = ToyDialect()
    """
)


def test_builtin_dialects_are_registered():
    assert {"autotvm", "auto_scheduler", "meta_schedule"} <= set(available_dialects())


def test_unknown_dialect_names_the_value_and_the_known_ones():
    with pytest.raises(DialectError, match="'nosuch'.*autotvm"):
        get_dialect("nosuch")


def test_a_third_party_package_registers_a_dialect_without_touching_lorien(tmp_path):
    package = tmp_path / "toy_dialect"
    package.mkdir()
    (package / "__init__.py").write_text(THIRD_PARTY_DIALECT)
    dist_info = tmp_path / "toy_dialect-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-dialect\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[lorien.dialects]\ntoy = toy_dialect:DIALECT\n")
    script = (
        "from lorien.dialect import available_dialects, get_dialect\n"
        "assert 'toy' in available_dialects(), available_dialects()\n"
        "print(get_dialect('toy').record_formats())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['toy-jsonl']"


def test_the_core_never_imports_a_dialect_package():
    import re
    from pathlib import Path

    core = Path(__file__).resolve().parent.parent / "lorien"
    offenders = [f"{path.relative_to(core.parent)}:{number}" for path in sorted(core.rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if re.match(r"\s*(from|import)\s+dialects\b", line)]
    assert offenders == []
