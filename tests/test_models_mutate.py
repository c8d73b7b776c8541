"""lorien mutate: rules that vary fields, filters, determinism, no duplicates."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lorien.cli import main
from lorien.errors import ConfigError
from lorien.models import Task
from lorien.models.mutate import Rules, load_rules, mutate_tasks, parse_rules, read_task_config
from lorien.tune.config import load_tune_config

REPO = Path(__file__).resolve().parent.parent
RESNET18 = REPO / "configs" / "samples" / "resnet18.yaml"


def _conv(**params) -> Task:
    return Task("conv2d", {"C": 64, "H": 56, "W": 56, "K": 64, "kernel": 3, "padding": 1, **params}, name="conv")


def _rules(*rules, filters=(), **options) -> Rules:
    return parse_rules({"rules": list(rules), "filters": list(filters), **options})


def test_lists_ranges_scales_and_same_as_make_the_cartesian_product():
    rules = _rules({"op": "conv2d", "vary": {"N": [1, 8], "H": {"range": [14, 28], "step": 7}, "W": {"same_as": "H"},
                                             "K": {"scale": [0.5, 2]}}}, keep_originals=False)
    report = mutate_tasks([_conv()], rules)
    got = {(t.params["N"], t.params["H"], t.params["W"], t.params["K"]) for t in report.tasks}
    assert got == {(n, h, h, k) for n in (1, 8) for h in (14, 21, 28) for k in (32, 128)}
    assert all(task.weight == 1 and task.name.startswith("conv~") for task in report.tasks)


def test_same_seed_same_output_other_seed_other_sample():
    tasks, _ = read_task_config(RESNET18)
    rules = load_rules(REPO / "configs" / "models" / "mutate-rules.yaml")
    first = [task.to_entry() for task in mutate_tasks(tasks, rules, seed=3).tasks]
    again = [task.to_entry() for task in mutate_tasks(tasks, rules, seed=3).tasks]
    other = [task.to_entry() for task in mutate_tasks(tasks, rules, seed=4).tasks]
    assert first == again
    assert first != other


def test_output_has_no_duplicates_and_keeps_originals_first():
    tasks, _ = read_task_config(RESNET18)
    rules = _rules({"op": "conv2d", "vary": {"C": [64, 128, 256], "K": [64, 128, 256]}})
    report = mutate_tasks(tasks, rules)
    keys = [task.key for task in report.tasks]
    assert len(keys) == len(set(keys))
    assert keys[:len(tasks)] == [task.key for task in tasks]
    assert report.duplicates > 0  # several layers mutate into the same shapes, and into the originals


def test_shapes_that_cannot_exist_are_dropped():
    rules = _rules({"op": "conv2d", "vary": {"H": [1, 2, 56], "padding": [0]}}, keep_originals=False)
    report = mutate_tasks([_conv()], rules)  # a 3x3 kernel without padding needs 3 input rows
    assert [task.params["H"] for task in report.tasks] == [56]
    assert sum(report.invalid.values()) == 2
    assert "output 0x54 is empty" in " ".join(report.invalid)


def test_filters_drop_mutants_by_field_and_by_flop():
    rules = _rules({"op": "conv2d", "vary": {"C": [3, 16, 30, 512]}},
                   filters=[{"field": "C", "multiple_of": 8}, {"field": "gflop", "max": 1.0}], keep_originals=False)
    report = mutate_tasks([_conv()], rules)
    assert [task.params["C"] for task in report.tasks] == [16]
    assert sum(report.filtered.values()) == 3


def test_samples_draws_a_subset_of_the_combinations():
    rules = _rules({"op": "conv2d", "vary": {"H": {"range": [8, 64], "step": 1}, "K": [16, 32, 64]}, "samples": 5},
                   keep_originals=False)
    report = mutate_tasks([_conv()], rules)
    assert report.generated == 5 and len(report.tasks) == 5


def test_rules_only_touch_tasks_of_their_op():
    dense = Task("dense", {"M": 1, "N": 1000, "K": 512}, name="fc")
    report = mutate_tasks([_conv(), dense], _rules({"op": "dense", "vary": {"M": [1, 16]}}))
    assert [task.name for task in report.tasks] == ["conv", "fc", "fc~r0m1"]


@pytest.mark.parametrize(("document", "message"), [
    ({"rules": [{"op": "conv3d", "vary": {"C": [1]}}]}, r"rules\[0\]: unknown op 'conv3d'"),
    ({"rules": [{"op": "dense", "vary": {"C": [1]}}]}, r"rules\[0\]: cannot vary 'C'"),
    ({"rules": [{"vary": {"H": {"range": [9, 3]}}}]}, r"rules\[0\]: vary.H: range needs"),
    ({"rules": [{"vary": {"W": {"same_as": "H"}}}]}, r"vary.W: same_as names a field"),
    ({"rules": [{"vary": {"C": [8]}}], "filters": [{"field": "C", "less": 3}]}, r"filters\[0\]: tests must be"),
    ({"rules": []}, "non-empty 'rules' list"),
])
def test_bad_rules_are_errors_naming_the_rule(document, message):
    with pytest.raises(ConfigError, match=message):
        parse_rules(document, "rules.yaml")


def test_mutate_cli_writes_a_config_tune_loads(tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"seed": 1, "rules": [{"op": "dense", "vary": {"M": [4, 16]}}]}))
    out = tmp_path / "train.yaml"
    assert main(["mutate", str(RESNET18), "--rules", str(rules), "-o", str(out)]) == 0
    assert "12 input tasks, 2 mutants generated" in capsys.readouterr().out
    config = load_tune_config(out)
    assert len(config.jobs) == 14
    assert config.settings["trials"] == 200  # the input's top-level settings are kept
    assert [job["args"][0][1] for job in config.jobs[-2:]] == [[4, 512], [16, 512]]
