"""Config spaces follow AutoTVM: knob kinds, split policies, index <-> entity, TopHub indices."""

from __future__ import annotations

import json

import pytest

from dialects.autotvm.space import (
    AnnotateEntity,
    ConfigSpace,
    OtherOptionEntity,
    ReorderEntity,
    SplitEntity,
    get_factors,
)
from lorien.errors import DialectError


def test_factors_policy_enumerates_exact_factorizations():
    space = ConfigSpace()
    space.define_split("tile", 128, num_outputs=2)
    assert len(space) == 8
    sizes = [space.get(i)["tile"].size for i in range(8)]
    assert sizes == [(-1, f) for f in get_factors(128)]


def test_three_way_split_products_divide_the_extent():
    space = ConfigSpace()
    space.define_split("tile", 24, num_outputs=3)
    for config in space:
        inner = config["tile"].size[1] * config["tile"].size[2]
        assert 24 % inner == 0
    assert len(space) == sum(len(get_factors(24 // f)) for f in get_factors(24))


def test_power2_policy_allows_tails_but_not_oversized_inner_loops():
    space = ConfigSpace()
    space.define_split("tile", 12, policy="power2", num_outputs=2)
    inners = [c["tile"].size[1] for c in space]
    assert inners == [1, 2, 4, 8]


def test_verbose_policy_merges_factors_and_powers_of_two():
    space = ConfigSpace()
    space.define_split("tile", 12, policy="verbose", num_outputs=2)
    assert [c["tile"].size[1] for c in space] == [1, 2, 3, 4, 6, 8, 12]


def test_max_factor_limits_every_factor():
    space = ConfigSpace()
    space.define_split("tile", 64, num_outputs=3, max_factor=8)
    assert all(max(c["tile"].size[1:]) <= 8 for c in space)


def test_unknown_split_policy_is_rejected_with_its_name():
    with pytest.raises(DialectError, match="bogus"):
        ConfigSpace().define_split("tile", 8, policy="bogus")


def test_knob_reorder_and_annotate_spaces():
    space = ConfigSpace()
    a, b, c = space.axis(4), space.axis(8), space.axis(2)
    space.define_knob("unroll", [True, False])
    space.define_reorder("order", [a, b, c], policy="all")
    space.define_annotate("ann", [a, b], policy="try_unroll_vec")
    assert space.dims == [2, 6, 8]  # 3x3 annotation pairs minus the one with two "vec"
    config = space.get(len(space) - 1)
    assert isinstance(config["unroll"], OtherOptionEntity)
    assert isinstance(config["order"], ReorderEntity)
    assert isinstance(config["ann"], AnnotateEntity)


def test_index_to_entity_and_back_round_trips_every_point():
    space = ConfigSpace()
    space.define_split("x", 16, num_outputs=3)
    space.define_knob("k", [1, 2, 3])
    for index in range(len(space)):
        entity = space.get(index).to_json_entity()
        assert space.from_json_entity(entity).index == index


def test_first_knob_is_the_least_significant_digit():
    space = ConfigSpace()
    space.define_knob("a", [0, 1, 2])
    space.define_knob("b", [0, 1])
    assert space.get(1)["a"].val == 1 and space.get(1)["b"].val == 0
    assert space.get(3)["a"].val == 0 and space.get(3)["b"].val == 1


def test_entity_json_form_matches_autotvm():
    space = ConfigSpace()
    space.define_split("tile_ic", 3, num_outputs=2)
    space.define_knob("unroll_kw", [True, False])
    config = space.get(3)
    assert json.dumps(config.to_json_entity()) == '[["tile_ic", "sp", [-1, 3]], ["unroll_kw", "ot", false]]'
    assert config.to_json_dict()["index"] == 3


def test_explicit_outer_extent_is_accepted_like_minus_one():
    space = ConfigSpace()
    space.define_split("tile", 64, num_outputs=2)
    assert space.from_json_entity([["tile", "sp", [2, 32]]]).index == space.from_json_entity(
        [["tile", "sp", [-1, 32]]]).index


def test_config_not_in_space_is_rejected_naming_the_knobs():
    space = ConfigSpace()
    space.define_split("tile", 64, num_outputs=2)
    with pytest.raises(DialectError, match="tile"):
        space.from_json_entity([["tile", "sp", [-1, 5]]])
    with pytest.raises(DialectError, match="other"):
        space.from_json_entity([["other", "ot", 1]])


def test_split_entity_resolves_derived_outer_extent():
    assert SplitEntity((-1, 4)).resolved(10) == (3, 4)
    assert SplitEntity((-1, 2, 4)).resolved(64) == (8, 2, 4)


def test_tophub_conv2d_nchwc_indices_are_reproduced(shared_data):
    """Every llvm TopHub config lands on its recorded index in a space built like TopHub's."""
    from dialects.autotvm.templates import instantiate

    checked = 0
    for line in (shared_data / "tophub" / "llvm_v0.04.log").read_text().splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        _, task_name, args, _ = row["input"]
        template = instantiate(task_name, args)
        config = template.space.from_json_entity(row["config"]["entity"])
        assert config.index == row["config"]["index"], line
        checked += 1
    assert checked == 35


def test_define_split_returns_the_same_axes_when_defining_and_when_applying():
    space = ConfigSpace()
    defined = space.define_split("tile", 32, num_outputs=3)
    applied = space.get(0).define_split("tile", 32, num_outputs=3)
    assert len(defined) == len(applied) == 3
