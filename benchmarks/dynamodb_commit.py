"""DynamoDB commit throughput with concurrent committer processes, and configs lost.

Each of ``committers`` processes commits records one at a time (the way tuning workers stream
results), round-robin over the same ``workloads`` items, so every item has all committers
racing on it. Lorien's store merges with conditional writes; the seed's
pattern (read the item, merge in Python, ``SET BestConfigs`` unconditionally) does the same merge
work but writes without a condition. Configs lost = committed records missing from the table.

    python benchmarks/dynamodb_commit.py            # starts a moto server on 127.0.0.1
    python benchmarks/dynamodb_commit.py --quick
    python benchmarks/dynamodb_commit.py --endpoint http://127.0.0.1:5000

``run(endpoint, committers=8, ...)`` is imported by benchmarks/scale.py; give it an endpoint
from ``moto_server()`` here (one request at a time: moto's threaded server does not make
conditional writes atomic, real DynamoDB does). The last line printed is
``ddb_rps=.. ddb_lost=.. naive_lost=..``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import orjson

from lorien.record import TuningRecord
from lorien.warehouse.dynamodb import (
    CONFIGS_ATTRIBUTE,
    DynamoDBLocation,
    DynamoDBStore,
    create_table,
    delete_table,
    item_key,
    merged_item,
)

TARGET = "llvm -keys=cpu -mcpu=znver3"
REGION = "us-west-2"


def benchmark_record(committer: int, index: int, workloads: int) -> TuningRecord:
    """The ``index``-th record of one committer, spread round-robin over ``workloads`` items."""
    return TuningRecord(
        dialect="meta_schedule", target=TARGET, target_key="llvm_cpu",
        workload_key=f"dense#bench#{index % workloads}", task_name="dense", args="[[256, 256], [256, 256]]",
        layout="NA", config=orjson.dumps({"committer": committer, "index": index}).decode(),
        costs=[1e-4 * (1 + committer + index / 1000)], timestamp=1_700_000_000.0 + committer * 10_000 + index,
        build='{"engine": "bench"}',
    )


def _committer(mode: str, location: DynamoDBLocation, committer: int, count: int, workloads: int,
               start, ready) -> None:
    store = DynamoDBStore(location)
    records = [benchmark_record(committer, index, workloads) for index in range(count)]
    ready.release()
    start.wait()
    for record in records:
        if mode == "conditional":
            store.commit([record])
        else:
            _naive_commit(store, record)


def _naive_commit(store: DynamoDBStore, record: TuningRecord) -> None:
    """The seed's read-modify-write: the same merge, then ``SET BestConfigs`` with no condition."""
    key = (record.target, record.workload_key)
    item = store.get_item(key)
    new_item, _condition, _values, _outcome = merged_item(key, [record], 100, None, item)
    if item is None:
        store.client.put_item(TableName=store.location.table, Item=new_item)
        return
    store.client.update_item(
        TableName=store.location.table, Key=item_key(key),
        UpdateExpression=f"SET {CONFIGS_ATTRIBUTE} = :configs",
        ExpressionAttributeValues={":configs": new_item[CONFIGS_ATTRIBUTE]})


def _run_mode(mode: str, endpoint: str, committers: int, count: int, workloads: int) -> dict[str, float]:
    location = DynamoDBLocation(f"lorien-bench-{mode}-{uuid.uuid4().hex[:8]}", endpoint, REGION)
    create_table(location)
    context = multiprocessing.get_context("spawn")
    start, ready = context.Event(), context.Semaphore(0)
    processes = [context.Process(target=_committer,
                                 args=(mode, location, committer, count, workloads, start, ready))
                 for committer in range(committers)]
    for process in processes:
        process.start()
    for _ in processes:
        ready.acquire()
    began = time.perf_counter()
    start.set()
    for process in processes:
        process.join()
    elapsed_s = time.perf_counter() - began
    failed = [process.exitcode for process in processes if process.exitcode != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} {mode} committer process(es) failed: exit codes {failed}")
    expected = {benchmark_record(c, i, workloads).record_id for c in range(committers) for i in range(count)}
    with DynamoDBStore(location) as store:
        stored = set(store.scan(columns=["record_id"]).column("record_id").to_pylist())
        conflicts = store.conflicts
    delete_table(location)
    return {"records": len(expected), "seconds": elapsed_s, "rps": len(expected) / elapsed_s,
            "lost": len(expected - stored), "conflicts": conflicts}


def run(endpoint: str, committers: int = 8, records_per_committer: int = 24, workloads: int = 8) -> dict:
    """Commit throughput and lost configs, conditional (Lorien) vs naive (seed) read-modify-write.

    ``committers * records_per_committer / workloads`` must stay within the 100 configs an item
    holds, so that every committed record should be present afterwards.
    """
    per_item = committers * records_per_committer / workloads
    if per_item > 100:
        raise ValueError(f"{per_item:.0f} records per item exceed the 100-config cap; raise workloads")
    conditional = _run_mode("conditional", endpoint, committers, records_per_committer, workloads)
    naive = _run_mode("naive", endpoint, committers, records_per_committer, workloads)
    return {
        "ddb_rps": round(conditional["rps"], 1),
        "ddb_lost": conditional["lost"],
        "naive_lost": naive["lost"],
        "naive_rps": round(naive["rps"], 1),
        "records": conditional["records"],
        "committers": committers,
    }


#: moto's server in one thread. Its default threaded server checks a write's condition and then
#: writes without a lock, so two conditional writes can both pass; real DynamoDB is atomic per
#: item, and serving one request at a time gives moto the same guarantee.
SERIAL_MOTO = (
    "import sys; from werkzeug.serving import run_simple; "
    "from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app; "
    "run_simple('127.0.0.1', int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), threaded=False)"
)


@contextmanager
def moto_server() -> Iterator[str]:
    """A one-thread moto server process on a free 127.0.0.1 port; yields its endpoint URL.

    Use this endpoint (not moto's threaded default) for ``run``: see :data:`SERIAL_MOTO`.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-c", SERIAL_MOTO, str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"moto server did not start at {url}") from None
                time.sleep(0.1)
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 committers x 10 records")
    parser.add_argument("--endpoint", help="an existing DynamoDB-compatible endpoint (default: start moto)")
    parser.add_argument("--committers", type=int, default=8)
    parser.add_argument("--records", type=int, default=24, help="records per committer")
    parser.add_argument("--workloads", type=int, default=8, help="items the records spread over")
    args = parser.parse_args()
    committers, records = (4, 10) if args.quick else (args.committers, args.records)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(name, value)
    with moto_server() if args.endpoint is None else _given(args.endpoint) as endpoint:
        result = run(endpoint, committers=committers, records_per_committer=records,
                     workloads=args.workloads)
    print(f"{result['committers']} committer processes, {result['records']} records over "
          f"{args.workloads} items, one commit each")
    print(f"  conditional (Lorien): {result['ddb_rps']} records/s, {result['ddb_lost']} configs lost")
    print(f"  naive (seed pattern): {result['naive_rps']} records/s, {result['naive_lost']} configs lost")
    print(f"ddb_rps={result['ddb_rps']} ddb_lost={result['ddb_lost']} naive_lost={result['naive_lost']}")


@contextmanager
def _given(endpoint: str) -> Iterator[str]:
    yield endpoint


if __name__ == "__main__":
    main()
