"""The attribute codec: Python values <-> DynamoDB attribute values encoded the way the seed
encodes them, the attributes of an item, its size, and the ``BestConfigs`` entries (one map per
record: the native log line, the seed's fields and Lorien's full record)."""

from __future__ import annotations

from typing import Any

import orjson

from lorien.errors import RecordParseError, StoreError, UnknownFormatError
from lorien.record import TuningRecord
from lorien.target import parse_target
from lorien.warehouse.dynamodb.table import HASH_KEY, RANGE_KEY

CONFIGS_ATTRIBUTE = "BestConfigs"
VERSION_ATTRIBUTE = "LorienVersion"
FAILED_ATTRIBUTE = "FailedRecordIds"
#: Hash key of the items holding workload entries that records refer to by content hash
#: (MetaSchedule IRModules); the range key is the hash, the entry is in ENTRY_ATTRIBUTE.
WORKLOADS_HASH_KEY = "lorien:workloads"
ENTRY_ATTRIBUTE = "WorkloadEntry"
#: DynamoDB's item size limit.
ITEM_SIZE_LIMIT_BYTES = 400 * 1024


# ---- DynamoDB attribute values, encoded the way the seed encodes them -------------------------


def to_attribute(value: Any) -> dict[str, Any]:
    """A DynamoDB attribute value as the seed encodes one: None becomes the string "None",
    booleans become numbers (the seed's reader knows only S, N, L and M)."""
    if isinstance(value, bool):
        return {"N": "1" if value else "0"}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, (int, float)):
        return {"N": repr(value) if isinstance(value, float) else str(value)}
    if isinstance(value, (list, tuple)):
        return {"L": [to_attribute(item) for item in value]}
    if isinstance(value, dict):
        return {"M": {str(name): to_attribute(item) for name, item in value.items()}}
    if value is None:
        return {"S": "None"}
    raise StoreError(f"cannot store {value!r} ({type(value).__name__}) in DynamoDB")


def from_attribute(attribute: dict[str, Any]) -> Any:
    """The Python value of a DynamoDB attribute value (the string "None" becomes None)."""
    (kind, value), = attribute.items()
    if kind == "S":
        return None if value == "None" else value
    if kind == "N":
        text = str(value)
        if any(char in text for char in ".eEnN"):
            return float(text)
        return int(text)
    if kind == "L":
        return [from_attribute(item) for item in value]
    if kind == "M":
        return {name: from_attribute(item) for name, item in value.items()}
    if kind in ("SS", "NS"):
        return sorted(from_attribute({kind[0]: element}) for element in value)
    if kind == "BOOL":
        return bool(value)
    if kind == "NULL":
        return None
    raise StoreError(f"unsupported DynamoDB attribute type {kind!r}")


def attribute_size(attribute: dict[str, Any]) -> int:
    """DynamoDB's size of an attribute value in bytes (an upper-bound estimate)."""
    (kind, value), = attribute.items()
    if kind == "S":
        return len(value.encode("utf-8"))
    if kind == "N":
        return (len(str(value)) + 1) // 2 + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(attribute_size(item) + 1 for item in value)
    if kind == "M":
        return 3 + sum(len(name.encode("utf-8")) + attribute_size(item) + 1
                       for name, item in value.items())
    return len(orjson.dumps(value))


def item_key(key: tuple[str, str]) -> dict[str, Any]:
    """The DynamoDB key of (target, workload key)."""
    return {HASH_KEY: {"S": key[0]}, RANGE_KEY: {"S": key[1]}}


def item_size(item: dict[str, Any]) -> int:
    return sum(len(name.encode("utf-8")) + attribute_size(value) for name, value in item.items())


# ---- configs: one map per record in BestConfigs -----------------------------------------------


def seed_build_config(build: str) -> Any:
    """A record's ``build`` JSON as the seed's ``framework_build_config`` ("unknown" when empty)."""
    value = orjson.loads(build or "{}")
    return value if value else "unknown"


def build_group(framework_build_config: Any) -> tuple:
    """The seed's grouping of build configs: sorted (name, value) pairs, or the bare value."""
    if isinstance(framework_build_config, dict):
        return tuple(sorted((str(name), str(value)) for name, value in framework_build_config.items()))
    return (str(framework_build_config),)


def native_line(record: TuningRecord) -> str:
    """The record as the seed stores it in ``config``: its native TVM log line, where its
    dialect has a line log (:func:`lorien.dialect.native_log_format`), else its config."""
    from lorien.dialect import native_log_format

    native = native_log_format(record.dialect)
    if native is None:
        return record.config
    from lorien.formats import encode_record

    return encode_record(record, native[0]).strip()


def config_entry(record: TuningRecord, log_path: str | None) -> dict[str, Any]:
    """The ``BestConfigs`` map of one record: the seed's fields plus Lorien's full record."""
    row = record.to_row()
    row.pop("cost_s", None)
    return {"M": {
        "config": {"S": native_line(record)},
        "latency": to_attribute(float(record.cost_s or 0.0)),
        "framework_build_config": to_attribute(seed_build_config(record.build)),
        "log_path": {"S": log_path or " "},
        "record_id": {"S": record.record_id},
        "lorien_record": {"S": orjson.dumps(row).decode()},
    }}


def entry_latency(entry: dict[str, Any]) -> float:
    """A config's latency in seconds; infinite when it has none (a failed or unmeasured config)."""
    latency = entry["M"].get("latency")
    if latency is None:
        return float("inf")
    value = from_attribute(latency)
    return float(value) if isinstance(value, (int, float)) and value > 0 else float("inf")


def entry_layout(entry: dict[str, Any]) -> str:
    """A config's layout from Lorien's record; empty for configs the seed wrote."""
    stored = entry["M"].get("lorien_record")
    if stored is None:
        return ""
    return str(orjson.loads(stored["S"]).get("layout", ""))


def entry_group(entry: dict[str, Any]) -> tuple:
    """A config's build-config group (:func:`build_group` of its ``framework_build_config``)."""
    value = entry["M"].get("framework_build_config")
    return build_group(from_attribute(value) if value is not None else "unknown")


def entry_record(entry: dict[str, Any], item: dict[str, Any]) -> TuningRecord:
    """The record held by one config map, whichever project wrote it."""
    fields = entry["M"]
    target_text = item[HASH_KEY]["S"]
    workload_key = item[RANGE_KEY]["S"]
    stored = fields.get("lorien_record")
    if stored is not None:
        return TuningRecord.from_row(orjson.loads(stored["S"]))
    from lorien.formats import decode_line, format_of_line

    line = fields["config"]["S"]
    try:
        record = decode_line(line, format_of_line(line))
    except (RecordParseError, UnknownFormatError, orjson.JSONDecodeError) as exc:
        raise StoreError(f"item ({target_text!r}, {workload_key!r}) holds a config that does not "
                         f"decode as a TVM log line: {exc}") from exc
    build = from_attribute(fields["framework_build_config"]) if "framework_build_config" in fields else None
    target = parse_target(target_text)
    log_path = from_attribute(fields["log_path"]) if "log_path" in fields else None
    return record.with_changes(
        target=target.canonical,
        target_key=target.alternate_key,
        workload_key=workload_key,
        build=orjson.dumps(build if isinstance(build, dict) else {}).decode(),
        source=(log_path or "").strip() or record.source,
    )


# ---- keys and metadata spelled the way the seed spells them ------------------------------------


def seed_target_spelling(target: str) -> str:
    """The seed's canonical target string: kind, ``-keys=`` in order, other options sorted, no libs."""
    parsed = parse_target(target)
    parts = [parsed.kind]
    if parsed.keys:
        parts.append("-keys=" + ",".join(parsed.keys))
    for name in sorted(parsed.options):
        if name in ("keys", "libs"):
            continue
        value = parsed.options[name]
        if isinstance(value, (list, tuple)):
            text = ",".join(sorted(str(item) for item in value))
        elif isinstance(value, bool):
            text = "1" if value else "0"
        else:
            text = str(value)
        parts.append(f"-{name}={text}")
    return " ".join(parts)


def seed_alternate_key(target: str) -> str:
    """The seed's ``TargetIDKeys``: kind, underscore, device keys joined by dashes (``cuda_cuda-gpu``)."""
    parsed = parse_target(target)
    return f"{parsed.kind}_{'-'.join(parsed.keys)}"


def task_metadata(record: TuningRecord) -> dict[str, Any]:
    """``OpName``, ``TaskName`` and ``Args`` as the seed puts them on an AutoTVM item."""
    metadata: dict[str, Any] = {"Dialect": {"S": record.dialect}}
    if record.task_name:
        metadata["OpName"] = {"S": record.task_name}
        metadata["TaskName"] = {"S": record.task_name}
    try:
        args = orjson.loads(record.args) if record.args else None
    except orjson.JSONDecodeError:
        args = None
    if isinstance(args, list):
        metadata["Args"] = to_attribute(args)
    return metadata

