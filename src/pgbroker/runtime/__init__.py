"""The consumer runtime: App runs Workers (a queue each), StreamWorkers (a stream's consumer group
each) and the scheduler in one process. Its modules are private: import from here."""

from pgbroker.runtime._app import App, WorkerOptions
from pgbroker.runtime._stream_worker import StreamHandler, StreamWorker
from pgbroker.runtime._worker import Handler, Worker
from pgbroker.runtime._worker_stats import WorkerStats

__all__ = ["App", "Handler", "StreamHandler", "StreamWorker", "Worker", "WorkerOptions", "WorkerStats"]
