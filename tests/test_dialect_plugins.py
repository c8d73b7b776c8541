"""The plugin boundary: a third-party package adds a dialect with one entry point."""

import subprocess
import sys
import textwrap

import pytest

from lorien.dialect import (
    Dialect,
    available_dialects,
    dialect_formats,
    dialect_of_workload_key,
    format_owner,
    get_dialect,
    native_log_format,
)
from lorien.errors import DialectError, UnknownFormatError

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


def test_the_builtin_table_is_what_pyproject_registers_and_loads_the_same_objects():
    from importlib.metadata import entry_points

    from lorien.plugins import BUILTIN_DIALECTS, ENTRY_POINT_GROUP

    registered = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name in BUILTIN_DIALECTS}
    assert {name: ep.value for name, ep in registered.items()} == BUILTIN_DIALECTS
    assert all(get_dialect(name) is ep.load() for name, ep in registered.items())


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


def test_format_owners_come_from_the_dialects_record_formats():
    assert {"autotvm": "autotvm", "ansor": "auto_scheduler", "meta_schedule": "meta_schedule"}.items() \
        <= dialect_formats().items()
    assert format_owner("ansor") == "auto_scheduler"


def test_every_codec_writes_the_dialect_that_owns_its_format():
    from lorien import formats

    for log_format in formats.BUILTIN_CODECS:
        assert getattr(formats, log_format).DIALECT == format_owner(log_format)


def test_an_unknown_format_names_the_value_and_the_known_ones():
    with pytest.raises(UnknownFormatError, match="'nosuch'.*ansor"):
        format_owner("nosuch")


def test_native_line_logs_of_the_dialects():
    assert native_log_format("autotvm") == ("autotvm", ".log")
    assert native_log_format("auto_scheduler") == ("ansor", ".json")
    assert native_log_format("meta_schedule") is None  # a JSONDatabase directory
    assert native_log_format("nosuch") is None


@pytest.mark.parametrize(("key", "dialect"), [
    ('["matmul", 64, 64, 64, "float32"]', "auto_scheduler"),
    ("  12345678901234567890", "meta_schedule"),
    ("dense_nopack.x86#1x64#64x64", "autotvm"),
])
def test_each_dialect_claims_its_own_workload_keys(key, dialect):
    assert dialect_of_workload_key(key) == dialect


class _Claims(Dialect):
    def __init__(self, name, claim):
        self.name, self._claim = name, claim

    def record_formats(self):
        return []

    def claims_workload_key(self, workload_key):
        return self._claim


def _registered(monkeypatch, *dialects):
    import lorien.dialect

    by_name = {dialect.name: dialect for dialect in dialects}
    monkeypatch.setattr(lorien.dialect, "available_dialects", lambda: sorted(by_name))
    monkeypatch.setattr(lorien.dialect, "get_dialect", by_name.__getitem__)


def test_a_key_two_dialects_claim_is_refused_naming_both(monkeypatch):
    _registered(monkeypatch, _Claims("one", True), _Claims("two", True))
    with pytest.raises(DialectError, match="'k'.*one, two"):
        dialect_of_workload_key("k")


def test_a_key_nobody_claims_without_a_fallback_is_refused(monkeypatch):
    _registered(monkeypatch, _Claims("one", False))
    with pytest.raises(DialectError, match="no dialect claims workload key 'k'"):
        dialect_of_workload_key("k")
