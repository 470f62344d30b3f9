"""A job's settings as frozen dataclasses, validated when made: a bad value is one
ValueError naming the field and the fix, before anything starts."""
import dataclasses
import math
from typing import Optional

ROW_DTYPES = ("fp32", "fp16", "int8")
PRECISIONS = ("fp32", "bf16", "loss")
RESUMES = ("refuse", "warm_start")


def _positive(owner, name, value, allow_none=False, number=int):
    if value is None and allow_none:
        return
    types = (int, float) if number is float else int  # seconds may be given as an int
    ok = isinstance(value, types) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        kind = "a number of seconds" if number is float else "an int"
        raise ValueError(f"{owner}.{name} must be {kind} > 0{' or None' if allow_none else ''}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class PublishConfig:
    """Publishing the model to serving while it trains (ttf.serving.Publisher).

    Attributes:
      base: the serving base path (any file system tf.io.gfile reaches: local, gs://, ...): a
        base version base/<N>/ (TF Serving's layout), then deltas base/deltas/<N>/<seq>/ of
        the rows touched and the ids deleted since the last one, each process writing its own
        rows, none while nothing changed; ttf.serving.DeltaFollower(base).start() serves it.
      every: seconds between deltas (default 10).
      dense_every: 0 (default): the dense weights go with every delta in which they changed;
        S > 0: at most every S seconds (the rows served may then run up to S seconds ahead of
        the dense weights).
      rebase_every: seconds between new base versions (default 3600).
      row_dtype: "fp32" (default), "fp16" or "int8" (row-wise: a float scale and bias per row,
        dequantized by stock ops in the export's graph): the published rows' precision.
    """

    base: str
    every: float = 10.0
    dense_every: float = 0.0
    rebase_every: float = 3600.0
    row_dtype: str = "fp32"

    def __post_init__(self):
        if not self.base:
            raise ValueError("PublishConfig.base must be a folder path, got an empty one")
        for name in ("every", "rebase_every"):
            _positive("PublishConfig", name, getattr(self, name), number=float)
        dense_every = self.dense_every
        if not (isinstance(dense_every, (int, float)) and not isinstance(dense_every, bool)
                and math.isfinite(dense_every) and dense_every >= 0):
            raise ValueError(f"PublishConfig.dense_every must be a number of seconds >= 0 (0: with every delta in "
                             f"which they changed), got {dense_every!r}")
        if self.row_dtype not in ROW_DTYPES:
            raise ValueError(f"PublishConfig.row_dtype must be one of {ROW_DTYPES}, got {self.row_dtype!r}")


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """How `ttf.distribute.Job` trains, saves and reports.

    Attributes:
      batch_size: examples per step and input share (per worker or rank).
      steps: global steps to train to (None: `epochs`, or a stream until stopped).
      epochs: passes over the data instead of `steps` (batch training).
      steps_per_call: training steps per tf.function call (progress and checkpoints then
        fall on multiples of it; a parameter-server job runs this many per worker call).
      log_every: steps between progress lines (and TensorBoard scalars).
      checkpoint_dir: save here and resume from its latest checkpoint when present. The
        checkpoint must hold this model (its fingerprint: tables, variables, input schema).
      resume: what to do when checkpoint_dir holds a checkpoint of a different model:
        "refuse" (default: one ValueError naming the first difference, nothing read or
        written) or "warm_start" (load the tables and variables that match by name and shape,
        each listed, and start at step 0 from the start of the input).
      checkpoint_every: steps between checkpoints.
      full_every: every M-th checkpoint is full, the others deltas of the touched rows.
      max_to_keep: full checkpoints kept.
      max_non_finite_steps: stop with NonFiniteTrainingError after this many steps in a row
        whose loss or gradient was NaN/Inf (each skipped whole); 0 never stops.
      precision: "fp32", "bf16" or "loss" (ttf.precision's loss-driven switch); see
        ttf.precision.resolve_precision for "auto".
      seed: the input order's seed.
      logdir: write TensorBoard scalars here at every progress line (the chief only).
      auc_window: rows of the rolling training AUC (train/auc_window) with `logdir`.
      publish: a PublishConfig to publish to serving while training, or None.
      ttl_seconds: event-time TTL on a stream: evict ids not trained on an example newer than
        this many seconds before the newest one (ttf.embedding.EventTimeTTL).
      journal: append one line per stream step (the step, then its example ids) here.
      pipeline: synchronous ranks (SyncWorkers, HorovodRanks) route the next batch's ids to
        their owners while this batch trains (fit only; a model whose call changes no state,
        unless functional). The same updates in the same order as without it; docs/sync.md,
        "Pipelined steps".
      max_bad_fraction: stop with BadInputError when more than this fraction of the lines read
        so far (after the first 1,000) were skipped as bad (a lenient Reader or stream,
        strict=False): input that went bad stops the job rather than training on what is left.
    """

    batch_size: int = 256
    steps: Optional[int] = None
    epochs: Optional[int] = None
    steps_per_call: int = 1
    log_every: int = 50
    checkpoint_dir: Optional[str] = None
    resume: str = "refuse"
    checkpoint_every: int = 100
    full_every: int = 1
    max_to_keep: int = 3
    max_non_finite_steps: int = 20
    precision: str = "fp32"
    seed: int = 0
    logdir: Optional[str] = None
    auc_window: int = 65_536
    publish: Optional[PublishConfig] = None
    ttl_seconds: Optional[float] = None
    journal: Optional[str] = None
    max_bad_fraction: float = 0.1
    pipeline: bool = False

    def __post_init__(self):
        for name in ("batch_size", "steps_per_call", "log_every", "checkpoint_every", "full_every", "max_to_keep",
                     "auc_window"):
            _positive("JobConfig", name, getattr(self, name))
        for name in ("steps", "epochs"):
            _positive("JobConfig", name, getattr(self, name), allow_none=True)
        if self.steps is not None and self.epochs is not None:
            raise ValueError("JobConfig: give steps or epochs, not both")
        if not isinstance(self.max_non_finite_steps, int) or self.max_non_finite_steps < 0:
            raise ValueError(f"JobConfig.max_non_finite_steps must be an int >= 0 (0: never stop), "
                             f"got {self.max_non_finite_steps!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"JobConfig.precision must be one of {PRECISIONS} (resolve 'auto' with "
                             f"ttf.precision.resolve_precision), got {self.precision!r}")
        if not (isinstance(self.max_bad_fraction, (int, float)) and 0 <= self.max_bad_fraction <= 1):
            raise ValueError(f"JobConfig.max_bad_fraction must be a number in [0, 1], got {self.max_bad_fraction!r}")
        if not isinstance(self.pipeline, bool):
            raise ValueError(f"JobConfig.pipeline must be True or False, got {self.pipeline!r}")
        if self.pipeline and self.steps_per_call > 1:
            raise ValueError("JobConfig: pipeline=True runs one step per call, each routing the next batch's ids; "
                             f"give steps_per_call=1 (got {self.steps_per_call})")
        if self.resume not in RESUMES:
            raise ValueError(f"JobConfig.resume must be one of {RESUMES}, got {self.resume!r}")
        _positive("JobConfig", "ttl_seconds", self.ttl_seconds, allow_none=True, number=float)
        if self.publish is not None and not isinstance(self.publish, PublishConfig):
            raise ValueError(f"JobConfig.publish must be a ttf.distribute.PublishConfig or None, "
                             f"got {type(self.publish).__name__}")
