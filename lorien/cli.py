"""The ``lorien`` command line. One parser, read top to bottom; each command is a thin
call into the library.

  lorien tune CONFIG.yaml          tune workloads, stream records into the warehouse
  lorien apply                     build and measure a given config (e.g. a TopHub line)
  lorien query                     best records of a workload; --build, --predict
  lorien ingest LOG...             pour TVM logs into the warehouse
  lorien export                    write records back as TVM logs
  lorien featurize                 records -> normalized CSV/Parquet features per template
  lorien train                     train and evaluate a cost model
  lorien warehouse stats|compact|workloads|dynamodb ...
  lorien generate                  build a training set by tuning a spread of workloads
"""

from __future__ import annotations

import argparse
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
    # (section owned by the engine/tune work)

    # ---- apply ------------------------------------------------------------------------
    # (section owned by the engine/autotvm work)

    # ---- query ------------------------------------------------------------------------
    # (section owned by the warehouse work)

    # ---- ingest -----------------------------------------------------------------------
    # (section owned by the warehouse work)

    # ---- export -----------------------------------------------------------------------
    # (section owned by the warehouse work)

    # ---- featurize --------------------------------------------------------------------
    # (section owned by the features work)

    # ---- train ------------------------------------------------------------------------
    # (section owned by the cost-model work)

    # ---- warehouse --------------------------------------------------------------------
    # (section owned by the warehouse work; dynamodb table subcommands by the cloud work)

    # ---- generate ---------------------------------------------------------------------
    # (section owned by the cost-model work)

    return parser


# ======================================================================================
# Command implementations: each parses nothing, calls the library, prints, returns a code.
# ======================================================================================

# ---- run functions: tune -----------------------------------------------------------------

# ---- run functions: apply ----------------------------------------------------------------

# ---- run functions: query ----------------------------------------------------------------

# ---- run functions: ingest ---------------------------------------------------------------

# ---- run functions: export ---------------------------------------------------------------

# ---- run functions: featurize ------------------------------------------------------------

# ---- run functions: train ----------------------------------------------------------------

# ---- run functions: warehouse ------------------------------------------------------------

# ---- run functions: generate -------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
