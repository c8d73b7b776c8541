"""The ``lorien`` command line. One parser, read top to bottom; each command is a thin
call into the library.

  lorien tune CONFIG.yaml          tune workloads (here, Dask, AWS Batch), stream records into the warehouse
  lorien apply                     build and measure a given config (a TopHub line, an Ansor record)
  lorien query                     best records of a workload; --build, --predict
  lorien ingest LOG...             pour TVM logs into the warehouse
  lorien export                    write records back as TVM logs
  lorien extract MODEL...          tunable tasks of ONNX files / torch modules, with weights, as a tune YAML
  lorien mutate TASKS.yaml         grow a task list into a training set with YAML rules
  lorien featurize                 records -> normalized CSV/Parquet features per template
  lorien train                     train and evaluate a cost model
  lorien warehouse stats|compact|workloads|dynamodb ...
  lorien generate                  build a training set by tuning a spread of workloads
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from lorien import __version__
from lorien.errors import LorienError

STORE_HELP = (
    "store URI: parquet:PATH, parquet:s3://bucket/prefix, dynamodb:TABLE?endpoint_url=..&region=..; "
    "default $LORIEN_STORE or ./lorien-warehouse"
)


def _parser(subparsers, name: str, help_text: str, example: str) -> argparse.ArgumentParser:
    return subparsers.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorien",
        description="Lorien: tune tensor programs, warehouse the records, train cost models.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lorien {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    # ---- tune -------------------------------------------------------------------------
    tune = _parser(sub, "tune", "tune the workloads of a YAML config (here, or as jobs on a Dask cluster "
                   "or AWS Batch), streaming records into the warehouse", "lorien tune configs/samples/quick.yaml --store parquet:./lorien-warehouse\n"
                   "  lorien tune configs/samples/quick.yaml --tuner xgb --cost-model models/program")
    tune.add_argument("config", nargs="?", help="tuning YAML (see docs/tuning.md and configs/samples/)")
    tune.add_argument("--store", help=STORE_HELP + " (overrides the config's store)")
    tune.add_argument("--log-dir", help="where full AutoTVM logs go (default: <store>/logs)")
    tune.add_argument("--commit-log-to", metavar="DEST",
                      help="also archive each full log to DEST (a directory or s3://bucket/prefix)")
    tune.add_argument("--trials", type=int,
                      help="override the trials of every workload (with a task_scheduler: the network's budget)")
    tune.add_argument("--tuner", help="override the tuner of every workload (grid, random, ga, xgb)")
    tune.add_argument("--cost-model", metavar="PATH",
                      help="a pre-trained program-feature model (lorien featurize --features program, then lorien "
                           "train) that guides the xgb tuner of every workload, any dialect, from its first batch "
                           "and keeps learning online (needs --tuner xgb or tuner: xgb; docs/costmodel.md)")
    tune.add_argument("--no-progress", action="store_true", help="no progress bars or lines on stderr")
    tune.add_argument("--json", action="store_true",
                      help="print the summary as JSON (per workload, or per job with --manager)")
    # a config with a task_scheduler tunes its workloads as one network (docs/auto_scheduler.md)
    tune.add_argument("--strategy", choices=["gradient", "round-robin"],
                      help="task scheduler: override the config's strategy")
    tune.add_argument("--resume-log", metavar="LOG",
                      help="task scheduler: commit this Ansor log's records to the store first, then resume "
                           "(trials already measured are not measured again)")
    # orchestration flags (docs/orchestration.md); lorien.tune.master.tune_command runs them
    tune.add_argument("--manager", choices=["local", "dask", "aws-batch"],
                      help="run the config's jobs through a job manager (retries, trace, resume)")
    tune.add_argument("--scheduler", metavar="ADDRESS",
                      help="dask: a running scheduler, e.g. tcp://10.0.0.5:8786 (default: a local cluster)")
    tune.add_argument("--workers", type=int, help="local/dask: worker processes (default: local CPU count, dask 2)")
    tune.add_argument("--measure-slots", type=int,
                      help="jobs measuring at once per host, each pinned to its share of cores (default 1)")
    tune.add_argument("--trace-file", metavar="FILE",
                      help="append every job state change to FILE; rerun with it to resume")
    tune.add_argument("--max-retries", type=int, default=2, help="retries of a job whose worker died (default 2)")
    tune.add_argument("--job", metavar="URI",
                      help="run one job spec (local path or s3://...) here and commit to the store")
    tune.add_argument("--job-queue", help="aws-batch: job queue name or ARN")
    tune.add_argument("--job-definition", help="aws-batch: job definition running the lorien image")
    tune.add_argument("--spec-prefix", metavar="S3_URI", help="aws-batch: where job specs are uploaded")
    tune.add_argument("--region", help="aws-batch: AWS region (default: the standard AWS chain)")
    tune.set_defaults(run=_run_tune)

    # ---- apply ------------------------------------------------------------------------
    apply = _parser(sub, "apply", "build and measure one logged or given config on this machine (e.g. a TopHub "
                    "line, an Ansor record, a MetaSchedule record: its steps or trace replayed and checked "
                    "against NumPy)",
                    "lorien apply --log ../shared/data/tophub/llvm_v0.04.log --line 12\n"
                    "  lorien apply --log ../shared/data/ansor/matmul.json --line 2\n"
                    "  lorien apply --log ../shared/data/meta_schedule/conv_56_64 --line 1")
    apply.add_argument("--log", help="a tuning log (a MetaSchedule database: its directory); with --line, the "
                                      "record to apply (its format picks the dialect)")
    apply.add_argument("--line", type=int, help="1-based line number in --log (comment lines count)")
    apply.add_argument("--workload-key", help="a workload key (autotvm: task#arg#..., auto_scheduler: "
                       "[\"func\", arg, ...]), with --config")
    apply.add_argument("--config", help="with --workload-key: the config as JSON (autotvm: an index, entity list "
                                         "or config object; auto_scheduler: a list of steps)")
    apply.add_argument("--dialect", help="with --workload-key: the dialect (default: auto_scheduler for a JSON list "
                                         "key, else autotvm)")
    apply.add_argument("--target", help="target to build and measure for, e.g. 'llvm -mcpu=haswell -num-cores=1' "
                                        "(default: this host)")
    apply.add_argument("--measure", default="{}", help='measure options as JSON, e.g. \'{"repeat": 5}\'')
    apply.add_argument("--store", help=STORE_HELP + "; commit the measured record there (with --commit)")
    apply.add_argument("--commit", action="store_true", help="commit the measured record to --store")
    apply.set_defaults(run=_run_apply)

    # ---- query ------------------------------------------------------------------------
    query = _parser(sub, "query", "best stored records of a workload on a target",
                    "lorien query --workload-key 'dense_nopack.x86#_TENSOR__1_512__float32_#...' "
                    "--target 'llvm -mcpu=skylake-avx512' --nbest 3")
    query.add_argument("--workload-key", required=True, help="the workload key (with --prefix, a prefix of it)")
    query.add_argument("--target", required=True,
                       help="target string, e.g. 'llvm' or 'llvm -mcpu=skylake-avx512': matches every stored "
                            "target that agrees on the options it names (its own target first)")
    query.add_argument("--nbest", type=int, default=1, help="number of records (per layout with --per-layout)")
    query.add_argument("--layout", help="only this layout (NCHW, NHWC, NCHW8c, ...)")
    query.add_argument("--per-layout", action="store_true", help="the best --nbest of each layout")
    query_match = query.add_mutually_exclusive_group()
    query_match.add_argument("--exact", action="store_true",
                             help="only records of exactly this target (no other matching stored target)")
    query_match.add_argument("--alternate-key", action="store_true",
                             help="also every other target of the same family (llvm_cpu, cuda_gpu, ...)")
    query.add_argument("--prefix", action="store_true", help="treat --workload-key as a prefix")
    query.add_argument("--format", default="table",
                       help="table (default), json, or the native log lines of a line-log format "
                            "(autotvm, ansor, or a dialect plugin's)")
    query.add_argument("--store", help=STORE_HELP)
    query.add_argument("--predict", action="store_true",
                       help="zero-shot: propose configs with a cost model (--model) instead of reading records")
    query.add_argument("--model", help="with --predict: cost model directory written by `lorien train`")
    query.add_argument("--topk", type=int, default=5, help="with --predict: number of proposals (default 5)")
    query.add_argument("--measure", type=int, default=0, metavar="K",
                       help="with --predict: measure the best K proposals on the engine and commit them")
    query.add_argument("--build", action="store_true",
                       help="also compile the best record into a kernel (lorien.compile); without records, "
                            "build a default schedule and say so")
    query.set_defaults(run=_run_query)

    # ---- ingest -----------------------------------------------------------------------
    ingest = _parser(sub, "ingest", "pour TVM tuning logs (files or directories) into the warehouse",
                     "lorien ingest ../shared/data/tophub ../shared/data/ansor --store parquet:./lorien-warehouse")
    ingest.add_argument("paths", nargs="+", metavar="PATH", help="log files or directories (walked)")
    ingest.add_argument("--format", default="auto",
                        help="auto (default), autotvm, ansor, meta_schedule, or a dialect plugin's format")
    ingest.add_argument("--strict", action="store_true",
                        help="refuse the whole ingest, committing nothing, if any line fails to parse")
    ingest.add_argument("--nbest", type=int, help="best records kept per workload for serving (default 20)")
    ingest.add_argument("--batch-size", type=int, default=65536, metavar="RECORDS",
                        help="records per commit (default 65536); ingest memory grows with it, not with the "
                             "logs' size: smaller batches use less memory and make more, smaller files")
    ingest.add_argument("--store", help=STORE_HELP)
    ingest.add_argument("--no-serving-index", action="store_true",
                        help="do not build the persisted serving index after the commits (a local parquet "
                             "store; the first warm query of a later process builds it instead)")
    ingest.add_argument("--json", action="store_true", help="print the report (per file and in total) as JSON")
    ingest.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    ingest.set_defaults(run=_run_ingest)

    # ---- export -----------------------------------------------------------------------
    export = _parser(sub, "export", "write stored records back as a TVM log (by default the best "
                     "record per workload, like TopHub); --format meta_schedule writes a JSONDatabase "
                     "directory TVM loads, converting workloads tuned by Lorien's meta_schedule dialect "
                     "to TVM modules (needs apache-tvm; or --lorien-workloads)",
                     "lorien export --target 'llvm -mcpu=skylake-avx512' --format autotvm -o best.log\n"
                     "  lorien export --target llvm --format meta_schedule -o ./ms_database")
    export.add_argument("--target", required=True, help="target string")
    export.add_argument("--format", required=True,
                        help="autotvm, ansor, meta_schedule (a directory format: -o names a directory), or a "
                             "dialect plugin's format")
    selection = export.add_mutually_exclusive_group()
    selection.add_argument("--best-only", dest="best_only", action="store_true", default=True,
                           help="the fastest valid record per workload (default)")
    selection.add_argument("--all", dest="best_only", action="store_false", help="every record")
    export_match = export.add_mutually_exclusive_group()
    export_match.add_argument("--exact", action="store_true",
                              help="only records of exactly this target (default: every stored target that "
                                   "agrees on the options --target names)")
    export_match.add_argument("--alternate-key", action="store_true",
                              help="also every other target of the same family (llvm_cpu, cuda_gpu, ...)")
    export.add_argument("-o", "--output", help="output file (default: standard output)")
    export.add_argument("--lorien-workloads", action="store_true",
                        help="meta_schedule: write workloads tuned by Lorien's own dialect as Lorien compute "
                             "DAGs, which lorien ingest reads back but TVM does not (default: convert them to "
                             "TVM modules, which needs apache-tvm)")
    export.add_argument("--measure-with-tvm", action="store_true",
                        help="meta_schedule: re-measure with TVM the records Lorien's engine measured and "
                             "write TVM's latencies as run_secs (needs apache-tvm; default: write the "
                             "engine's and say how many records carry them)")
    export.add_argument("--store", help=STORE_HELP)
    export.add_argument("--json", action="store_true",
                        help="print what was written as JSON (needs -o: the records go to the file)")
    export.set_defaults(run=_run_export)

    # ---- extract ----------------------------------------------------------------------
    extract = _parser(sub, "extract", "write the tunable tasks of ONNX files and torch modules (conv2d, depthwise, "
                      "dense, batch_matmul; weight = occurrences; epilogues seen) as a `lorien tune` YAML, "
                      "identical tasks merged across models; unsupported operators are counted",
                      "lorien extract resnet50.onnx torchvision.models:mobilenet_v2 --input x:1x3x224x224 "
                      "-o tasks.yaml")
    extract.add_argument("models", nargs="+", metavar="MODEL",
                         help="an ONNX file, or a torch factory module:function or module:function(key=value, ...) "
                              "(needs the torch extra), e.g. torchvision.models:resnet18")
    extract.add_argument("--input", action="append", default=[], metavar="[NAME:]SHAPE[:DTYPE]",
                         help="shape of an input, e.g. input:1x3x224x224 or ids:1x128:int64 (no NAME: the only "
                              "input of a model); needed for dynamic dimensions and for torch modules; repeatable")
    extract.add_argument("--batch-size", type=int, help="set dimension 0 of every input")
    extract.add_argument("-o", "--output", help="YAML file to write (default: standard output)")
    extract.add_argument("--json", action="store_true",
                         help="print the summary (models, tasks, unsupported operators) as JSON; needs -o")
    extract.add_argument("--dialect", help="the tasks as this dialect's tuning system sees them, e.g. meta_schedule: "
                         "TVM's relax tasks of ONNX models, verbatim, named by structural hash, their modules "
                         "written beside the YAML (needs -o and apache-tvm; docs/models.md); auto_scheduler: "
                         "the op shorthands under dialect: auto_scheduler, each checked to be tunable as the model "
                         "computes it (NCHW, bias/relu fused), no TVM needed")
    extract.add_argument("--target", help="with --dialect: the target the tasks are extracted for (TVM's JSON "
                         "dict or string; default llvm)")
    extract.add_argument("--skip-untunable", action="store_true",
                         help="with --dialect: leave out, with a line naming each, the tasks Lorien's engine cannot "
                              "tune (default: such a task is an error and nothing is written)")
    extract.set_defaults(run=_run_extract)

    # ---- mutate -----------------------------------------------------------------------
    mutate = _parser(sub, "mutate", "grow a task list into a training set: YAML rules vary fields (lists of "
                     "values, ranges with a step, scale factors), filters drop shapes; same seed, same output; "
                     "no duplicates (rule format: docs/models.md)",
                     "lorien mutate tasks.yaml --rules configs/models/mutate-rules.yaml --seed 1 -o train.yaml")
    mutate.add_argument("tasks", help="a tuning YAML of op shorthands (what `lorien extract` writes)")
    mutate.add_argument("--rules", required=True, help="mutation rules YAML")
    mutate.add_argument("--seed", type=int, help="random seed (default: the rules file's seed, else 0)")
    mutate.add_argument("-o", "--output", help="YAML file to write (default: standard output)")
    mutate.add_argument("--json", action="store_true", help="print the summary as JSON; needs -o")
    mutate.set_defaults(run=_run_mutate)

    # ---- featurize --------------------------------------------------------------------
    # (section owned by the features work)
    featurize = _parser(sub, "featurize", "records -> normalized per-template features (CSV, .meta, Parquet)",
                        "lorien featurize --store parquet:./lorien-warehouse -o features/\n"
                        "  lorien featurize --store parquet:./lorien-warehouse --features program -o program-features/")
    featurize.add_argument("logs", nargs="*", metavar="LOG", help="log files or directories (instead of --store)")
    featurize.add_argument("--store", help="read records from this store instead of logs; " + STORE_HELP)
    featurize.add_argument("-o", "--output", required=True, help="output directory")
    featurize.add_argument("--template", action="append", help="only this template (task name); repeatable")
    featurize.add_argument("--target", help="only records of this canonical target string")
    featurize.add_argument("--target-key", help="only records of this alternate target key (e.g. llvm_cpu)")
    featurize.add_argument("--dialect", help="only records of this dialect")
    featurize.add_argument("--jobs", type=int, help="worker processes (default: CPU count, at most 4; 1: none)")
    featurize.add_argument("--batch-size", type=int, default=65536, help="records per phase-1 batch, at most")
    featurize.add_argument("--batch-mib", type=float, default=12.0, metavar="MIB",
                           help="a phase-1 batch from a local store ends once its record columns hold this many "
                                "MiB (default 12: a worker then peaks near 250 MiB; memory follows this, not the "
                                "store's size)")
    featurize.add_argument("--extractor", default="auto", choices=["auto", "builtin", "dialect"],
                           help="auto (default; builtin: the same): each dialect's batch featurizer (column-wise "
                                "where the dialect offers it); dialect: every dialect's featurize(record), one by one")
    featurize.add_argument("--features", default="dialect", choices=["dialect", "program"],
                           help="dialect (default): each dialect's knob features, one output per template; program: "
                                "features of the lowered loop nest, the same for every dialect, one output 'program', "
                                "throughput from each record's fastest repeat (what `lorien tune --cost-model` models "
                                "are trained on; docs/costmodel.md)")
    featurize.add_argument("--keep-spill", action="store_true", help="keep the phase-1 spill files")
    featurize.add_argument("--quiet", action="store_true", help="no progress on stderr")
    featurize.add_argument("--json", action="store_true", help="print the report as JSON")
    featurize.set_defaults(run=_run_featurize)

    # ---- train ------------------------------------------------------------------------
    # (section owned by the cost-model work)
    train = _parser(sub, "train", "train a cost model on featurized records; evaluate with workloads held out",
                    "lorien train features/ -o models/dense --kind xgb-rank --template dense_pack.x86\n"
                    "  lorien train features/ -o models/zen4 --target 'llvm -mcpu=znver4' "
                    "--transfer-from 'llvm -mcpu=haswell -num-cores=1' --target-fraction 0.1 --curve 0,0.05,0.1,1")
    train.add_argument("features", help="directory written by `lorien featurize`")
    train.add_argument("-o", "--output", required=True, help="model directory (model.json, report.json, plots)")
    train.add_argument("--kind", default="xgb-rank", choices=["xgb-rank", "xgb-reg", "ridge"],
                       help="estimator to save (default xgb-rank)")
    train.add_argument("--baseline", default="random-forest", choices=["random-forest", "ridge", "none"],
                       help="scikit-learn baseline evaluated beside it (default random-forest)")
    train.add_argument("--template", action="append", help="only this template; repeatable (default: all)")
    train.add_argument("--folds", type=int, default=5, help="workload-held-out folds (default 5)")
    train.add_argument("--n-estimators", type=int, help="boosting rounds (XGBoost)")
    train.add_argument("--max-depth", type=int, help="tree depth (XGBoost)")
    train.add_argument("--learning-rate", type=float, help="learning rate (XGBoost)")
    train.add_argument("--parallel-trees", type=int, metavar="N",
                       help="trees grown per boosting round, averaged (XGBoost num_parallel_tree; default 3 for "
                            "the program template, 1 for the others)")
    train.add_argument("--target", help="train on the records of the targets this one matches (as a query "
                                        "target does: same family, same value of every option it names)")
    train.add_argument("--transfer-from", metavar="SOURCE",
                       help="also train on this source target's records; evaluate on held-out --target workloads "
                            "against a model of the --target data alone")
    train.add_argument("--target-fraction", type=float, default=1.0, metavar="F",
                       help="use this fraction (0-1) of each --target workload's records (default 1)")
    train.add_argument("--curve", type=_fractions, metavar="F,F,...",
                       help="with --transfer-from: also evaluate at these target fractions and plot the "
                            "transfer curve, e.g. 0,0.05,0.1,1")
    train.add_argument("--name", help="model name (records it proposes get source model:<name>)")
    train.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    train.add_argument("--quiet", action="store_true", help="no progress on stderr")
    train.add_argument("--json", action="store_true", help="print the report (report.json) as JSON")
    train.set_defaults(run=_run_train)

    # ---- warehouse --------------------------------------------------------------------
    # (section owned by the warehouse work; dynamodb table subcommands by the cloud work)
    warehouse = _parser(sub, "warehouse", "inspect and maintain the warehouse",
                        "lorien warehouse stats --store parquet:./lorien-warehouse")
    warehouse.set_defaults(run=lambda _args: warehouse.print_help() or 2)
    warehouse_sub = warehouse.add_subparsers(dest="warehouse_command", metavar="ACTION")
    stats = _parser(warehouse_sub, "stats", "count records, workloads, targets and files",
                    "lorien warehouse stats --json")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument("--store", help=STORE_HELP)
    stats.set_defaults(run=_run_warehouse_stats)
    compact = _parser(warehouse_sub, "compact",
                      "merge small files and rebuild the serving view; query answers do not change",
                      "lorien warehouse compact --store parquet:s3://bucket/lorien")
    compact.add_argument("--store", help=STORE_HELP)
    compact.set_defaults(run=_run_warehouse_compact)
    workloads = _parser(warehouse_sub, "workloads", "list the stored workload keys, each with a readable name "
                        "(task and tensor shapes), tab-separated",
                        "lorien warehouse workloads --target 'llvm -mcpu=skylake-avx512'")
    workloads.add_argument("--target", help="only workloads of this target")
    workloads.add_argument("--store", help=STORE_HELP)
    workloads.set_defaults(run=_run_warehouse_workloads)

    # ---- warehouse dynamodb -------------------------------------------------------
    dynamodb = _parser(warehouse_sub, "dynamodb",
                       "create, list, describe, delete, scan and load DynamoDB tables (awslabs/lorien schema)",
                       "lorien warehouse dynamodb create lorien-records --endpoint-url http://127.0.0.1:5000")
    dynamodb.set_defaults(run=lambda _args: dynamodb.print_help() or 2)
    dynamodb_sub = dynamodb.add_subparsers(dest="dynamodb_command", metavar="ACTION")
    dynamodb_actions = {
        "create": ("create a table with hash key Target, range key PrimaryRangeKey and GSI TargetIDKeysIndex",
                   "lorien warehouse dynamodb create lorien-records --region us-west-2"),
        "list": ("list the tables at the endpoint", "lorien warehouse dynamodb list --endpoint-url http://127.0.0.1:5000"),
        "describe": ("show a table's keys, index, status and size", "lorien warehouse dynamodb describe lorien-records"),
        "delete": ("delete a table and every item in it", "lorien warehouse dynamodb delete lorien-records --yes"),
        "scan": ("list the items of a table: target, workload key, configs, best latency "
                 "(--json: a dump, one DynamoDB-typed item a line)",
                 "lorien warehouse dynamodb scan lorien-records --target 'llvm -mcpu=skylake-avx512'"),
        "load": ("write the items of a `scan --json` dump into a table (batch writes; unprocessed items retried)",
                 "lorien warehouse dynamodb load lorien-records items.jsonl"),
    }
    for action, (help_text, example) in dynamodb_actions.items():
        action_parser = _parser(dynamodb_sub, action, help_text, example)
        if action != "list":
            action_parser.add_argument("table", help="DynamoDB table name")
        action_parser.add_argument("--endpoint-url", help="endpoint override (e.g. a local DynamoDB); "
                                   "default: boto3's (AWS_ENDPOINT_URL_DYNAMODB or AWS)")
        action_parser.add_argument("--region", help="AWS region (default: the AWS config's, else us-west-2)")
        if action == "delete":
            action_parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        if action == "scan":
            action_parser.add_argument("--target", help="only items of this target")
            action_parser.add_argument("--json", action="store_true",
                                       help="print each item as one DynamoDB-typed JSON line (a dump `load` reads)")
        if action == "load":
            action_parser.add_argument("dump", help="JSON lines written by `scan --json`")
        action_parser.set_defaults(run=_run_warehouse_dynamodb, dynamodb_command=action)

    # ---- generate ---------------------------------------------------------------------
    # (section owned by the cost-model work)
    generate = _parser(sub, "generate", "build a training set: tune a spread of dense, conv2d, depthwise and "
                       "batch_matmul workloads with the random tuner (or --tuner) on this machine, in one dialect "
                       "or several",
                       "lorien generate --size medium --exclude configs/models/all.yaml --store parquet:./train\n"
                       "  lorien generate --size medium --target 'llvm -mcpu=haswell -num-cores=1' --store parquet:./train\n"
                       "  lorien generate --size small --dialect autotvm --dialect auto_scheduler --dialect meta_schedule "
                       "--tuner xgb --trials 32 --store parquet:./train")
    generate.add_argument("--size", default="small", choices=["small", "medium", "large", "none"],
                          help="the workload spread (small: a few workloads for CI; default small)")
    generate.add_argument("--workload", action="append", default=[], metavar="OP:K=V,...",
                          help="an extra workload, e.g. dense:M=16,N=256,K=256; repeatable")
    generate.add_argument("--op", action="append", choices=["dense", "conv2d", "depthwise_conv2d", "batch_matmul"],
                          help="only these ops of the spread; repeatable")
    generate.add_argument("--exclude", action="append", default=[], metavar="CONFIG.yaml",
                          help="leave out the spread's workloads this tuning config names (e.g. the networks a "
                               "model is judged on zero-shot); repeatable")
    generate.add_argument("--trials", type=int, help="measured configs per workload (default by size: 8/64/200)")
    generate.add_argument("--tuner", default="random",
                          help="tuner (default random; xgb: tuning runs, as a warehouse holds them: the programs a "
                               "search converges to beside random ones)")
    generate.add_argument("--dialect", action="append", metavar="DIALECT",
                          help="tune the spread in this dialect (autotvm, auto_scheduler, meta_schedule); repeatable: "
                               "one program-feature model ranks every dialect's candidates (default autotvm)")
    generate.add_argument("--target", help="target to build and measure for, e.g. 'llvm -mcpu=haswell -num-cores=1' "
                                           "(default: this host's CPU, llvm -mcpu=<host>)")
    generate.add_argument("--seed", type=int, default=0,
                          help="random seed (the same seed measures the same configs on every target)")
    generate.add_argument("--store", help=STORE_HELP)
    generate.add_argument("--quiet", action="store_true", help="no progress on stderr")
    generate.add_argument("--json", action="store_true", help="print the per-workload summary as JSON")
    generate.set_defaults(run=_run_generate)

    return parser


# ======================================================================================
# Command implementations: each parses nothing, calls the library, prints, returns a code.
# ======================================================================================

# ---- run functions: tune -----------------------------------------------------------------

def measured_by_phrase(jobs: list[dict], runtime: str) -> str:
    """Who measured a config's jobs, for the end of ``lorien tune``'s summary: Lorien's engine
    (and its runtime), or TVM's builder and runner for jobs with ``measure_with: tvm``."""
    by_tvm = sum(1 for job in jobs if str(job.get("measure_with", "lorien")) == "tvm")
    if jobs and by_tvm == len(jobs):
        return "measured by TVM's builder and runner"
    if by_tvm:
        return f"{by_tvm} of {len(jobs)} jobs measured by TVM, the others by Lorien's engine, runtime {runtime}"
    return f"measured by Lorien's engine, runtime {runtime}"


def _run_tune(args: argparse.Namespace) -> int:
    from lorien.tune.config import load_tune_config

    config = load_tune_config(args.config) if args.config and not args.job else None
    if config is not None and args.cost_model:
        _set_cost_model(config.jobs, args)
    if config is not None and config.task_scheduler is not None:
        return _run_tune_network(args, config)
    if args.strategy or args.resume_log:
        raise LorienError("--strategy and --resume-log need a config with a task_scheduler (docs/auto_scheduler.md)")
    if args.job or args.manager or args.trace_file or config is None:
        from lorien.tune.master import tune_command

        return tune_command(args)
    from lorien.tune.local import format_summary, tune_config

    for job in config.jobs:
        if args.trials is not None:
            job["trials"] = args.trials
        if args.tuner is not None:
            job["tuner"] = args.tuner
            job.pop("tuner_options", None)
    from lorien.warehouse import resolve_store_uri

    store_uri = resolve_store_uri(args.store, config.store_uri)
    show = _tune_json if args.json else format_summary
    try:
        summaries = tune_config(config, progress=not args.no_progress, log_dir=args.log_dir, store_uri=store_uri)
    except KeyboardInterrupt as exc:
        print(show(getattr(exc, "summaries", [])))
        print(f"interrupted: the records measured so far are in {store_uri}", file=sys.stderr)
        raise
    archived = []
    if args.commit_log_to:
        from pathlib import Path

        from lorien.warehouse.archive import archive_log

        archived = [archive_log(summary.log_path, args.commit_log_to) for summary in summaries
                    if summary.log_path and Path(summary.log_path).is_file()]
    from lorien.warehouse.base import build_serving_indexes

    # as after a network or a master's run: queries of new processes read it (no index written
    # on a read); an index already up to date is only found
    build_serving_indexes(store_uri)
    print(show(summaries, archived) if args.json else show(summaries))
    if not args.json:
        from lorien.engine.runtime import chosen_runtime

        print(f"records committed to {store_uri} ({measured_by_phrase(config.jobs, chosen_runtime())})"
              + "".join(f"\narchived {uri}" for uri in archived))
    return 0


def _set_cost_model(jobs: list[dict], args: argparse.Namespace) -> None:
    """``--cost-model PATH`` (and ``--tuner``) on every job, checked as a job's ``cost_model`` is."""
    from pathlib import Path

    from lorien.tune.job import TuneJob

    path = str(Path(args.cost_model).resolve())
    for index, job in enumerate(jobs):
        job["cost_model"] = path
        if args.tuner is not None:
            job["tuner"] = args.tuner
            job.pop("tuner_options", None)
        TuneJob.from_spec(job, f"--cost-model: workloads[{index}]")


def _run_tune_network(args: argparse.Namespace, config) -> int:
    import json

    from lorien.tune.network import format_network_summary, tune_network
    from lorien.warehouse import resolve_store_uri

    if args.trace_file or args.job_queue:
        raise LorienError("a task_scheduler run resumes from the warehouse; --trace-file and aws-batch are for "
                          "batches of independent jobs")
    settings = dict(config.task_scheduler)
    if args.trials is not None:
        settings["trials"] = args.trials
    if args.strategy is not None:
        settings["strategy"] = args.strategy
    for job in config.jobs:
        if args.tuner is not None:
            job["tuner"] = args.tuner
            job.pop("tuner_options", None)
    options = {"workers": args.workers, "measure_slots": args.measure_slots}
    if args.manager == "dask":
        options["scheduler"] = args.scheduler
    store_uri = resolve_store_uri(args.store, config.store_uri)

    def show(summary) -> str:
        return json.dumps(summary.to_dict(), indent=2) if args.json else format_network_summary(summary)

    try:
        summary = tune_network(config, settings, store_uri, manager=args.manager,
                               log_dir=args.log_dir or config.log_dir, resume_log=args.resume_log,
                               progress=not args.no_progress, **options)
    except KeyboardInterrupt as exc:
        if getattr(exc, "summary", None) is not None:
            print(show(exc.summary))
        print(f"interrupted: the rounds finished so far are in {store_uri}", file=sys.stderr)
        raise
    from lorien.warehouse.base import build_serving_indexes

    build_serving_indexes(store_uri)
    print(show(summary))
    return 1 if summary.failures else 0


def _tune_json(summaries: list, archived: Sequence[str] = ()) -> str:
    import json

    from lorien.engine.runtime import chosen_runtime

    return json.dumps({"store": summaries[0].store_uri if summaries else None, "engine_runtime": chosen_runtime(),
                       "trials": sum(s.trials for s in summaries), "errors": sum(s.errors for s in summaries),
                       "committed": sum(s.committed for s in summaries),
                       "workloads": [s.to_dict() for s in summaries], "archived": list(archived)}, indent=2)


# ---- run functions: apply ----------------------------------------------------------------

def _run_apply(args: argparse.Namespace) -> int:
    import json

    from lorien.dialect import dialect_of_workload_key, format_owner, get_dialect
    from lorien.errors import ConfigError

    try:
        measure = json.loads(args.measure)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--measure is not JSON: {args.measure!r}") from exc
    from lorien.warehouse import resolve_store_uri

    options = {"target": args.target, "measure": measure,
               "store_uri": resolve_store_uri(args.store) if args.commit else None}
    if args.log and args.line:
        from lorien.formats import detect_format

        dialect = get_dialect(format_owner(detect_format(args.log)))
        applied = dialect.apply_log_line(args.log, args.line, **options)
    elif args.workload_key and args.config:
        dialect = get_dialect(args.dialect or dialect_of_workload_key(args.workload_key))
        applied = dialect.apply_config(args.workload_key, args.config, **options)
    else:
        raise ConfigError("give --log FILE --line N, or --workload-key KEY --config JSON")
    record = applied.record
    print(f"workload  {record.workload_key}")
    print(f"config    {applied.config_text}")
    for note in applied.notes:
        print(f"note      {note}")
    if record.is_valid:
        print(f"latency   {record.cost_s * 1e3:.4f} ms")
        print(f"GFLOPS    {record.gflops:.2f}" if record.gflops is not None else "GFLOPS    -")
        if applied.logged_cost_s is not None:
            print(f"logged    {applied.logged_cost_s * 1e3:.4f} ms on {applied.logged_target}")
        return 0
    print(f"error     {record.error_no} {applied.error_msg}")
    return 1


def _open_for_reading(uri: str | None):
    """Open a store for a command that only reads it; a local store directory that does not
    exist is an error (a mistyped --store), not an empty warehouse."""
    import os

    from lorien.errors import StoreError
    from lorien.warehouse import open_store

    store = open_store(uri)
    path = getattr(store, "local_root", None)
    if path is not None:
        if not os.path.isdir(path):
            store.close()
            raise StoreError(f"no warehouse at {path!r} (the directory does not exist; "
                             "check --store or $LORIEN_STORE)")
    return store


# ---- run functions: query ----------------------------------------------------------------

def _query_records(args: argparse.Namespace) -> tuple[list, list[str]]:
    """(records, the family's other stored targets holding the workload when none matched)."""
    if not args.build:
        from lorien.quick_query import quick_best

        records = quick_best(args.store, args.workload_key, args.target, k=args.nbest, layout=args.layout,
                             by_alternate_key=args.alternate_key, prefix=args.prefix,
                             per_layout=args.per_layout, exact=args.exact)
        if records:
            return records, []
    from lorien.warehouse import open_store

    # With --build a missing store is fine: the default schedule is built, and said so.
    opener = open_store if args.build else _open_for_reading
    with opener(args.store) as store:
        records = store.best(args.workload_key, args.target, k=args.nbest, layout=args.layout,
                             by_alternate_key=args.alternate_key, prefix=args.prefix,
                             per_layout=args.per_layout, exact=args.exact)
        others = [] if records or args.alternate_key else store.best(
            args.workload_key, args.target, k=5, by_alternate_key=True, prefix=args.prefix)
    return records, list(dict.fromkeys(record.target for record in others))


def _print_records(records: list, output_format: str) -> None:
    if output_format not in ("table", "json"):
        from lorien.formats import encode_record, line_formats

        if output_format not in line_formats():
            raise LorienError(f"query --format {output_format!r}: give table, json or a line-log format "
                              f"({', '.join(line_formats())})")
        for record in records:
            print(encode_record(record, output_format))
        return
    from lorien.record import record_summary

    rows = [record_summary(record) for record in records]
    if output_format == "json":
        import json

        print(json.dumps(rows, indent=2))
        return
    print(f"{'#':>3}  {'cost_us':>12}  {'gflops':>9}  {'layout':<8}  {'target':<32}  {'path':<18}  config")
    for rank, row in enumerate(rows, 1):
        gflops = "-" if row["gflops"] is None else f"{row['gflops']:.2f}"
        print(f"{rank:>3}  {row['cost_us']:>12.3f}  {gflops:>9}  {row['layout']:<8}  "
              f"{row['target']:<32}  {row['path'] or '-':<18}  {row['config']}")


def _say_matched_targets(target: str, records: list) -> None:
    """Name the stored targets an answer came from where they are not the query's own."""
    from lorien.target import parse_target

    canonical = parse_target(target).canonical
    for stored in dict.fromkeys(record.target for record in records):
        if stored != canonical:
            print(f"lorien query: --target {target!r} matched stored target {stored!r}", file=sys.stderr)


def _run_query(args: argparse.Namespace) -> int:
    if args.predict:
        from lorien.costmodel.zeroshot import run_predict_query

        return run_predict_query(args)
    records, others = _query_records(args)
    if args.build:
        _build_queried(args, bool(records))
    _say_matched_targets(args.target, records)
    if not records:
        print(f"lorien query: no valid record of workload {args.workload_key!r} on target "
              f"{args.target!r}{' (--exact)' if args.exact else ''}", file=sys.stderr)
        if others:
            hint = "drop --exact (or use --alternate-key)" if args.exact else \
                "--alternate-key answers from those, or name fewer options in --target"
            print(f"lorien query: the same family holds it on {', '.join(map(repr, others))}; {hint}",
                  file=sys.stderr)
        return 1
    _print_records(records, args.format)
    return 0


def _build_queried(args: argparse.Namespace, found: bool) -> None:
    """`query --build`: compile the workload from the warehouse (default schedule without records)."""
    import warnings

    from lorien.build import FallbackScheduleWarning, compile_from_warehouse

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackScheduleWarning)
        kernel = compile_from_warehouse(args.workload_key, args.target, store=args.store, exact=args.exact,
                                        by_alternate_key=args.alternate_key)
    source = "best stored config" if kernel.from_warehouse else f"DEFAULT schedule ({kernel.fallback_reason})"
    arrays = ", ".join(f"{a.name}:{a.dtype}{list(a.shape)}" for a in kernel.args)
    packed = [a for a in kernel.args if getattr(a, "packing", None) is not None]
    note = ("; " + ", ".join(f"{a.name} packed from {list(a.packing.logical_shape)}" for a in packed)
            + " (layout rewrite: kernel.pack_arguments(...) makes the arrays from logical ones)") if packed else ""
    print(f"built kernel {kernel.name} from the {source}; call it with numpy arrays ({arrays}){note}",
          file=sys.stderr if not found else sys.stdout)

# ---- run functions: ingest ---------------------------------------------------------------

def _run_ingest(args: argparse.Namespace) -> int:
    from lorien.allocator import set_ingest_allocator_env

    set_ingest_allocator_env()  # before pyarrow loads: mimalloc reads its options then
    from lorien.errors import RecordParseError
    from lorien.ingest import expand_paths, ingest_paths
    from lorien.progress import Progress

    files = len(expand_paths(args.paths))
    with Progress(files, "ingest", unit="file", enabled=files > 1 and not args.no_progress) as bar:
        try:
            report = ingest_paths(args.paths, store_uri=args.store, strict=args.strict, nbest=args.nbest,
                                  format=args.format, batch_size=args.batch_size, on_file=lambda done, _total: bar.step(
                                      f"{done.path}: {done.records} records"),
                                  serving_index=not args.no_serving_index)
        except RecordParseError as exc:
            bar.close()
            print(f"lorien ingest: error: {exc} (--strict: nothing was committed)", file=sys.stderr)
            return 1
    if args.json:
        import json

        print(json.dumps(report.to_dict(), indent=2))
        return 0
    for file_report in report.files:
        print(file_report.summary())
        for error in file_report.errors:
            print(f"  skipped {error}")
        if file_report.flop_unknown:
            print(f"  {file_report.flop_note()}")
    print(report.summary())
    return 0

# ---- run functions: export ---------------------------------------------------------------

def _run_export(args: argparse.Namespace) -> int:
    from lorien.dialect import format_owner, get_dialect
    from lorien.formats import codec_of, encode_record
    from lorien.record import MEASURED_BY_ENGINE
    from lorien.warehouse.query import export_records

    if args.json and not args.output:
        raise LorienError("export --json prints a summary: give the records a file with -o FILE")
    codec = codec_of(args.format)
    if args.lorien_workloads and not hasattr(codec, "referenced_hashes"):
        raise LorienError(f"--lorien-workloads is for formats whose records name their workload by hash "
                          f"(meta_schedule), not {args.format!r}")
    workloads: dict[str, str] = {}
    with _open_for_reading(args.store) as store:
        records = export_records(store, args.target, args.format, best_only=args.best_only,
                                 by_alternate_key=args.alternate_key, exact=args.exact)
        if hasattr(codec, "referenced_hashes"):
            workloads = store.get_workloads(codec.referenced_hashes(records))
    if not records:
        print(f"lorien export: no {args.format} records of target {args.target!r}", file=sys.stderr)
        return 1
    engine_measured = sum(1 for record in records if record.measured_by == MEASURED_BY_ENGINE)
    if args.measure_with_tvm and not args.output:
        raise LorienError("export --measure-with-tvm writes a file or directory: give it with -o")
    if args.output:
        dialect = get_dialect(format_owner(args.format))
        count = dialect.write_log(records, args.format, args.output, workloads,
                                  lorien_workloads=args.lorien_workloads, measure_with_tvm=args.measure_with_tvm)
        remeasured, engine_measured = (engine_measured, 0) if args.measure_with_tvm else (0, engine_measured)
        if args.json:
            import json

            print(json.dumps({"output": args.output, "format": args.format, "target": args.target,
                              "records": count, "workloads": len({record.workload_key for record in records}),
                              "stored_targets": sorted({record.target for record in records}),
                              "engine_measured_records": engine_measured, "remeasured_with_tvm": remeasured},
                             indent=2))
        else:
            print(f"wrote {count} records to {args.output}"
                  + (f" ({remeasured} re-measured with TVM)" if remeasured else ""), file=sys.stderr)
    elif codec.LOG_SUFFIX is None:
        raise LorienError(f"export --format {args.format} writes a directory: give it with -o DIR")
    else:
        for record in records:
            print(encode_record(record, args.format))
    if engine_measured:
        print(f"lorien export: {engine_measured} of {len(records)} records carry latencies measured by Lorien's "
              f"engine, not by TVM (--measure-with-tvm re-measures meta_schedule records with TVM)", file=sys.stderr)
    return 0

# ---- run functions: extract, mutate -------------------------------------------------------

def _write_yaml(args: argparse.Namespace, text: str, summary: str, report: dict) -> None:
    """The YAML to ``--output`` (whole or not at all) or standard output; the summary (or,
    with --json, the report) beside it."""
    if args.output is None:
        if args.json:
            raise LorienError(f"{args.command} --json prints a summary: give the YAML a file with -o FILE")
        sys.stdout.write(text)
        print(summary, file=sys.stderr)
        return
    from lorien.models.extract import write_text_atomic

    write_text_atomic(args.output, text)
    if args.json:
        import json

        print(json.dumps({"output": args.output, **report}, indent=2))
    else:
        print(f"{summary}\nwrote {args.output}")


def _run_extract(args: argparse.Namespace) -> int:
    from lorien.models import extract_models

    if args.dialect:
        return _extract_for_dialect(args)
    if args.target or args.skip_untunable:
        raise LorienError("--target and --skip-untunable go with --dialect (tasks as a dialect's tuning system "
                          "sees them)")
    extraction = extract_models(args.models, args.input, batch_size=args.batch_size)
    _write_yaml(args, extraction.to_yaml(args.command_line), extraction.summary(), extraction.to_dict())
    return 0


def _extract_for_dialect(args: argparse.Namespace) -> int:
    """``lorien extract --dialect NAME -o FILE``: the dialect's own tasks; the files that define
    their workloads go beside the YAML, before it."""
    from pathlib import Path

    from lorien.dialect import get_dialect
    from lorien.models.extract import write_text_atomic

    if args.output is None:
        raise LorienError(f"lorien extract --dialect {args.dialect} writes workload files beside the YAML: "
                          f"give it a file with -o FILE")
    tasks = get_dialect(args.dialect).extract_model_tasks(list(args.models), list(args.input), args.batch_size,
                                                          args.target, args.skip_untunable)
    for name, text in tasks.files.items():
        write_text_atomic(Path(args.output).parent / name, text)
    _write_yaml(args, tasks.to_yaml(args.command_line), tasks.summary(), tasks.report)
    return 0


def _run_mutate(args: argparse.Namespace) -> int:
    from lorien.models.extract import tasks_yaml
    from lorien.models.mutate import load_rules, mutate_tasks, read_task_config

    tasks, settings = read_task_config(args.tasks)
    report = mutate_tasks(tasks, load_rules(args.rules), seed=args.seed)
    header = [f"lorien mutate: {len(report.tasks)} tasks.", f"Made by: {args.command_line}",
              *report.summary().splitlines()]
    _write_yaml(args, tasks_yaml([task.to_entry() for task in report.tasks], header, settings), report.summary(),
                report.to_dict())
    return 0

# ---- run functions: featurize ------------------------------------------------------------

def _run_featurize(args: argparse.Namespace) -> int:
    from lorien.features import featurize
    from lorien.warehouse import resolve_store_uri

    if args.logs and args.store:
        raise LorienError("featurize reads log files or a store, not both: drop --store or the LOG paths")
    filters = {name: value for name, value in (("target", args.target), ("target_key", args.target_key),
                                               ("dialect", args.dialect)) if value}
    store = None if args.logs else resolve_store_uri(args.store)
    if store is not None:
        _open_for_reading(store).close()  # a mistyped store is an error, not an empty warehouse
    report = featurize(args.output, store=store, paths=args.logs, filters=filters,
                       templates=args.template, jobs=args.jobs, batch_size=args.batch_size,
                       batch_mib=args.batch_mib,
                       extractor="program" if args.features == "program" else args.extractor,
                       progress=not args.quiet,
                       keep_spill=args.keep_spill)
    if args.json:
        import json

        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.summary())
    return 0

# ---- run functions: train ----------------------------------------------------------------

def _fractions(text: str) -> list[float]:
    """``0,0.05,0.1,1`` -> [0.0, 0.05, 0.1, 1.0] (argparse type of --curve)."""
    try:
        return [float(item) for item in text.split(",") if item.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions such as 0,0.05,0.1,1, got {text!r}") from exc


def _run_train(args: argparse.Namespace) -> int:
    from lorien.costmodel import train_cost_model

    params = {name: value for name, value in (("n_estimators", args.n_estimators), ("max_depth", args.max_depth),
                                              ("learning_rate", args.learning_rate),
                                              ("parallel_trees", args.parallel_trees)) if value is not None}
    if args.kind == "ridge" and params:
        raise LorienError("--n-estimators/--max-depth/--learning-rate/--parallel-trees apply to XGBoost kinds only")
    if args.parallel_trees is not None and args.parallel_trees < 1:
        raise LorienError(f"--parallel-trees must be at least 1, got {args.parallel_trees}")
    report = train_cost_model(args.features, args.output, kind=args.kind, templates=args.template,
                              folds=args.folds, params=params,
                              baseline=None if args.baseline == "none" else args.baseline,
                              name=args.name, plots=not args.no_plots, progress=not args.quiet,
                              target=args.target, transfer_from=args.transfer_from,
                              target_fraction=args.target_fraction, curve=args.curve)
    if args.json:
        from lorien.costmodel.train import report_json

        print(report_json(report))
        return 0
    for template, entry in report["templates"].items():
        summary = entry["cv"]["summary"] if entry["cv"] else None
        line = f"{template}: {entry['rows']} rows, {entry['workloads']} workloads"
        if summary:
            line += "; held-out " + ", ".join(f"{k}={summary[k]:.3f}" for k in
                                              ("r2", "spearman", "pairwise_accuracy", "top1", "top5"))
        if entry.get("baseline_cv"):
            base = entry["baseline_cv"]
            line += f"; baseline top1={base['top1']:.3f} top5={base['top5']:.3f}"
        print(line)
        for fraction, point in entry.get("transfer_curve", {}).items():
            print(f"  {float(fraction):.0%} of {args.target}: " + "; ".join(
                f"{label} top1={scores['top1']:.3f} top5={scores['top5']:.3f} "
                f"pairwise={scores['pairwise_accuracy']:.3f}"
                for label, scores in (("with source", point["transfer"]), ("alone", point["own"])) if scores))
    for template, reason in report["skipped"].items():
        print(f"{template}: skipped ({reason})")
    print(f"model and report written to {args.output}")
    return 0

# ---- run functions: warehouse ------------------------------------------------------------

def _run_warehouse_stats(args: argparse.Namespace) -> int:

    with _open_for_reading(args.store) as store:
        stats = store.stats()
    if args.json:
        import json

        print(json.dumps(stats, indent=2))
    else:
        for name, value in stats.items():
            print(f"{name:>16}: {value}")
    return 0


def _run_warehouse_compact(args: argparse.Namespace) -> int:

    with _open_for_reading(args.store) as store:
        summary = store.compact()
    for name, value in summary.items():
        print(f"{name:>22}: {value}")
    return 0


def _run_warehouse_workloads(args: argparse.Namespace) -> int:
    from lorien.warehouse.names import workload_names

    with _open_for_reading(args.store) as store:
        for workload_key, name in workload_names(store, args.target):
            print(f"{workload_key}\t{name}")
    return 0

# ---- run functions: warehouse dynamodb ---------------------------------------------------

def _run_warehouse_dynamodb(args: argparse.Namespace) -> int:
    from lorien.warehouse import dynamodb

    location = dynamodb.DynamoDBLocation(table=getattr(args, "table", ""),
                                         endpoint_url=args.endpoint_url, region=args.region)
    action = args.dynamodb_command
    if action == "list":
        for name in dynamodb.list_tables(location):
            print(name)
    elif action == "create":
        table = dynamodb.create_table(location)
        print(f"{table['TableName']}: {table.get('TableStatus', '?')} {table.get('TableArn', '')}".rstrip())
    elif action == "describe":
        for name, value in dynamodb.table_summary(dynamodb.describe_table(location)).items():
            print(f"{name:>14}: {value}")
    elif action == "delete":
        if not args.yes and input(f"delete table {location.table!r} and all its items? [y/N] ").lower() != "y":
            print("not deleted")
            return 1
        dynamodb.delete_table(location)
        print(f"deleted {location.table}")
    elif action == "scan":
        import json

        with dynamodb.DynamoDBStore(location) as store:
            # a dump of the whole table keeps the workload entries its MetaSchedule records name
            for item in store.scan_items(args.target, include_workloads=args.json and args.target is None):
                if args.json:
                    print(json.dumps(item, sort_keys=True))
                else:
                    print("\t".join(str(value) for value in dynamodb.item_summary(item).values()))
    elif action == "load":
        with dynamodb.DynamoDBStore(location) as store:
            written = dynamodb.write_items(store.client, location, dynamodb.read_item_dump(args.dump))
        print(f"loaded {written} items into {location.table}")
    return 0

# ---- run functions: generate -------------------------------------------------------------

def _run_generate(args: argparse.Namespace) -> int:
    from lorien.costmodel.generate import generate_training_set
    from lorien.warehouse import resolve_store_uri

    store_uri = resolve_store_uri(args.store)
    summaries = generate_training_set(store_uri, size=args.size, workloads=args.workload, trials=args.trials,
                                      target=args.target, tuner=args.tuner, seed=args.seed, ops=args.op,
                                      progress=not args.quiet, exclude_configs=args.exclude, dialects=args.dialect)
    if args.json:
        print(_tune_json(summaries))
        return 0
    measured = sum(summary.trials for summary in summaries)
    dialects = set(args.dialect or ())
    jobs = f"{len(summaries)} jobs ({len(dialects)} dialects)" if len(dialects) > 1 else f"{len(summaries)} workloads"
    print(f"generated {measured} measurements of {jobs} into {store_uri}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = "lorien " + shlex.join(sys.argv[1:] if argv is None else argv)
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help()
        return 2
    try:
        return int(run(args) or 0)
    except LorienError as exc:
        print(f"lorien {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"lorien {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`lorien warehouse workloads | head`): stop quietly as Unix tools do,
        # and point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
