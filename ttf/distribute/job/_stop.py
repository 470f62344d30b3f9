"""Stopping a job that runs for ever: SIGTERM (or SIGINT) finishes the step, then stops.

Example (a user's own stream loop):

    stream = ttf.data.open_stream("folder:/data/incoming")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, stream_position=stream)
    with ttf.distribute.StopOnSignal(stream) as stop:
        for batch in ttf.data.stream_batches(stream, 4096, stop):
            train_step(batch.features, batch.labels)
            stream.commit(batch)          # after the update: the position moves past the batch
    checkpoint.save(...)                  # stopped: model and stream position together
"""
import signal
import threading


class StopOnSignal:
    """A context manager: while inside it, SIGTERM / SIGINT set `requested` (and stop the
    stream's wait) instead of killing the process, so the loop ends after its current step.
    The previous handlers come back on exit. Install it from the main thread.

    Attributes:
      requested: True once a signal arrived (or `request()` was called).
      signal_name: "SIGTERM" / "SIGINT" / None.
    """

    def __init__(self, stream=None, signals=(signal.SIGTERM, signal.SIGINT)):
        self._stream, self._signals, self._previous = stream, signals, {}
        self._event = threading.Event()
        self.signal_name = None

    @property
    def requested(self):
        return self._event.is_set()

    def request(self, name="request"):
        self.signal_name = self.signal_name or name
        self._event.set()
        if self._stream is not None:
            self._stream.stop()

    def _handle(self, signum, _frame):
        self.request(signal.Signals(signum).name)

    def __enter__(self):
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        return False
