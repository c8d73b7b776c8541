"""`lorien tune --store dynamodb:... --commit-log-to s3://...`: records served from DynamoDB, the
full log archived to S3 (a real moto server process)."""

from __future__ import annotations

import uuid

from lorien.cli import main
from lorien.formats import read_log
from lorien.warehouse import open_store
from lorien.warehouse.archive import read_text_uri

TINY_CONFIG = """\
tuner: random
trials: 2
batch_size: 2
seed: 0
commit_nbest: 5
measure: {number: 1, repeat: 1, min_repeat_ms: 0, build_timeout_s: 30, run_timeout_s: 10}
workloads:
  - dense: {M: 16, N: 16, K: 16}
"""


def test_tune_serves_from_dynamodb_and_archives_the_full_log_to_s3(moto_server, s3_bucket, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    store_uri = f"dynamodb:tune-{uuid.uuid4().hex[:8]}?endpoint_url={moto_server}&region=us-west-2&create=1"
    dest = f"s3://{s3_bucket}/runs?endpoint_url={moto_server}&region=us-east-1"
    code = main(["tune", str(config), "--store", store_uri, "--log-dir", str(tmp_path / "logs"),
                 "--no-progress", "--commit-log-to", dest])
    out = capsys.readouterr().out
    assert code == 0
    (archived,) = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("archived ")]
    assert archived.startswith(f"s3://{s3_bucket}/runs/")
    local_log = next((tmp_path / "logs").glob("*.log"))
    assert read_text_uri(archived) == local_log.read_text()
    logged = read_log(local_log).records
    with open_store(store_uri.replace("&create=1", "")) as store:
        best = store.best(logged[0].workload_key, logged[0].target, k=5)
    assert best and best[0].cost_s == min(r.cost_s for r in logged if r.is_valid)
