"""Target parsing: TVM CLI strings and JSON dicts give one canonical string and alternate key."""

import pytest

from lorien.errors import TargetError
from lorien.target import parse_target


@pytest.mark.parametrize(
    "text, canonical, alternate",
    [
        ("llvm -mcpu=skylake-avx512", "llvm -keys=cpu -mcpu=skylake-avx512", "llvm_cpu"),
        ("llvm -keys=cpu -mcpu=core-avx2", "llvm -keys=cpu -mcpu=core-avx2", "llvm_cpu"),
        ("cuda -model=titanx", "cuda -keys=cuda,gpu -model=titanx", "cuda_gpu"),
        ("rocm -model=gfx900", "rocm -keys=rocm,gpu -model=gfx900", "rocm_gpu"),
        (
            "cuda -keys=cuda,gpu -max_num_threads=1024 -thread_warp_size=32",
            "cuda -keys=cuda,gpu -max_num_threads=1024 -thread_warp_size=32",
            "cuda_gpu",
        ),
        (
            "ext_dev -device=vta -keys=cpu -model=pynq_1x16_i8w8a32_15_15_18_17",
            "ext_dev -device=vta -keys=cpu -model=pynq_1x16_i8w8a32_15_15_18_17",
            "ext_dev_cpu",
        ),
        ("llvm", "llvm -keys=cpu", "llvm_cpu"),
    ],
)
def test_cli_strings_parse_to_canonical_form(text, canonical, alternate):
    target = parse_target(text)
    assert target.canonical == canonical
    assert target.alternate_key == alternate


def test_option_order_does_not_change_the_canonical_string():
    assert parse_target("llvm -mcpu=znver3 -keys=cpu").canonical == parse_target(
        "llvm -keys=cpu -mcpu=znver3"
    ).canonical


def test_json_dict_form_matches_cli_form():
    json_form = '{"keys":["cpu"],"kind":"llvm","mcpu":"znver3","num-cores":2,"tag":""}'
    assert parse_target(json_form).canonical == parse_target("llvm -mcpu=znver3 -num-cores=2").canonical
    assert parse_target('{"kind": "llvm", "mcpu": "znver3"}').alternate_key == "llvm_cpu"


@pytest.mark.parametrize("bad", ["", "   ", "notakind -mcpu=x", "llvm mcpu=x", "{not json", '{"mcpu": "x"}'])
def test_unparseable_targets_raise_naming_the_value(bad):
    with pytest.raises(TargetError, match="unparseable target|unknown target kind") as info:
        parse_target(bad)
    assert repr(bad)[1:-1] in str(info.value) or "empty string" in str(info.value)
