"""Entry point of a measurement worker process: ``python -m lorien.engine.worker RECV_FD SEND_FD``."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from lorien.engine.measure import worker_main

if __name__ == "__main__":
    worker_main(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
