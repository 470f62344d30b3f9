"""A user's own tf.data pipeline in a job: `dataset_fn(input_context)` called once per input
share (or one tf.data.Dataset), and where each share stands kept in the checkpoint.

Each share is the user's batches of (features, labels), repeated `epochs` times, each batch
given a position (ttf.data.POSITION_FIELDS: share, then its index in the share at
"batch"), which the step records in the job's InputPosition after the update, as a Reader's.
So a share's state says how many of its batches were trained ((0, 0, 0, 0, n); start byte
0: started), and the rows trained are counted as for a Reader.

Where the position lives:
- one process, a pipeline TensorFlow can checkpoint: the iterator's own state, saved with
  the job (tf.train.Checkpoint of the iterator: shuffle buffers and RNG included, so even an
  unseeded shuffle resumes exactly);
- otherwise (parameter-server workers, whose iterators live on the workers; synchronous
  ranks, each rank its own iterator; a pipeline TensorFlow cannot save): the count. A share
  is made again with `skip(n)` of the batches it trained. That is exact when the pipeline
  yields the same batches each time it is made; where it may not (an unseeded shuffle,
  Python, deterministic=False, an unseeded random op), the job says so in one line at start.
"""
import tensorflow as tf

# The checkpoint entry (Job's checkpoint parts) of a one-process job's iterator slot.
ITERATOR_ENTRY = "input_iterator"
_ITERATOR_KEY = ITERATOR_ENTRY + "/iterator/.ATTRIBUTES/ITERATOR_STATE"
_PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
# Stateful random ops: without a seed each run draws other numbers (e.g. a sampled filter).
_RANDOM_OPS = ("RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "RandomShuffle",
               "RandomGamma", "RandomPoisson", "RandomPoissonV2", "Multinomial", "ParameterizedTruncatedNormal")
_FIXES = {"python": "build it from tf.data ops (TFRecordDataset, map of TensorFlow functions)",
          "shuffle": "give shuffle (and sample_from_datasets) a seed",
          "parallel": "drop deterministic=False",
          "random": "give the random op a seed, or use a stateless one (tf.random.stateless_*)"}


def is_user_data(data):
    """True for a tf.data.Dataset or a dataset_fn (anything callable): Job.fit's own pipelines."""
    return isinstance(data, tf.data.Dataset) or callable(data)


class UserData:
    """A user's pipeline split into `job.topology`'s input shares (see the module doc).

    Args:
      job: the ttf.distribute.Job (its topology, config, position and log).
      data: `dataset_fn(input_context) -> tf.data.Dataset` of (features, labels) batches of
        config.batch_size rows, or one tf.data.Dataset (one process and synchronous ranks:
        every rank reads it whole and keeps its slice of each batch).

    Raises:
      ValueError: a Dataset on a parameter-server job, Python in a parameter-server job's
        pipeline, steps_per_call > 1 on synchronous ranks, or not a dataset.
    """

    def __init__(self, job, data):
        self.job, self.topology, self.config = job, job.topology, job.config
        self.dataset_fn = None if isinstance(data, tf.data.Dataset) else data
        self.data = data
        topology = self.topology
        # Input made here (one process, ranks), or by a parameter-server job's workers.
        self.input_here = job.runner.input_here
        if self.dataset_fn is None and not self.input_here:
            raise ValueError("a parameter-server job's workers make their own input: pass fit() a "
                             "dataset_fn(input_context) (or a ttf.data.Reader) instead of a tf.data.Dataset")
        if topology.num_ranks > 1 and self.config.steps_per_call > 1:
            raise ValueError("steps_per_call > 1 on synchronous ranks needs a ttf.data.Reader (ranks whose own "
                             "pipelines end at different steps would wait on each other inside one call); give "
                             "steps_per_call=1")
        self.kind = "dataset_fn" if self.dataset_fn else "dataset"
        self.what = f"the {self.kind}'s batches"  # (in the job's one-line errors about the model's input)
        first = self._pipeline(0)
        if not isinstance(first, tf.data.Dataset):
            raise ValueError(f"dataset_fn must return a tf.data.Dataset of (features, labels) batches, got "
                             f"{type(first).__name__}")
        self.element_spec = first.element_spec
        if not isinstance(self.element_spec, tuple) or len(self.element_spec) != 2:
            raise ValueError(f"the {self.kind}'s elements must be (features, labels) batches, got "
                             f"{self.element_spec}")
        self.reason = nondeterminism(first)
        if not self.input_here and self.reason and self.reason[0] == "python":
            raise ValueError(f"the dataset_fn of a parameter-server job runs on the workers, which cannot run this "
                             f"process's Python, and it {self.reason[1]}: {_FIXES['python']}")
        # One process: the iterator's own state is the position, when TensorFlow can save it.
        self.checkpointable = (self.input_here and topology.num_shares == 1 and bool(self.config.checkpoint_dir)
                               and not (self.reason and self.reason[0] in ("python", "random"))
                               and _saves(self._batches(0)))
        self.slot = None  # the job's iterator slot (a tf.Module), given by Job.fit when it holds one
        self.layout = f"{self.kind}/{topology.num_shares}"

    # ---- the pipeline of a share ----

    def _pipeline(self, share):
        """The user's batches of `share` (not repeated, no positions)."""
        topology = self.topology
        if self.dataset_fn is None:
            return self.data
        replicas = topology.num_shares if self.input_here else 1  # a PS worker's steps are its own
        context = tf.distribute.InputContext(num_input_pipelines=topology.num_shares, input_pipeline_id=share,
                                             num_replicas_in_sync=replicas)
        return self.dataset_fn(context)

    def _batches(self, share, skip=0):
        """Share `share`'s batches with positions: (features, labels, position int64 [9]),
        from its batch `skip` on."""
        dataset = self._pipeline(share)
        if self.config.epochs is not None and self.config.epochs > 1:  # (one epoch: the iterator saved by steps fits)
            dataset = dataset.repeat(self.config.epochs)
        if self.dataset_fn is None:  # every rank reads the whole Dataset: its slice of each batch
            dataset = self.topology.slice_batches(dataset, self.config.batch_size)
        if not isinstance(skip, int) or skip:
            dataset = dataset.skip(skip)
        share_index = tf.constant(share, tf.int64)

        def with_position(index, batch):
            zero = tf.zeros([], tf.int64)
            position = tf.stack([share_index, zero, zero, zero, zero, index, zero, zero, zero])
            return batch[0], batch[1], position

        return dataset.enumerate(tf.cast(skip, tf.int64)).map(with_position)

    def share_dataset(self, share):
        """Share `share`'s batches for the job's loops: from where its position says (a
        parameter-server worker reads it where the dataset is made), or the one-process
        iterator, restored."""
        if self.slot is not None:
            return self.slot.iterator
        state = self.job.position.states[share]
        trained = tf.where(state[2] >= 0, state[4], tf.zeros([], tf.int64))  # batches this share trained
        return self._batches(share, int(trained) if self.input_here else trained)

    def sample_features(self):
        """Zeros shaped as a batch of 2 of the features, to build and check the model (no input
        is read)."""
        specs = self.element_spec[0]
        if all(isinstance(s, tf.TensorSpec) and s.shape.rank is not None for s in tf.nest.flatten(specs)):
            return tf.nest.map_structure(lambda s: tf.zeros([d or 2 for d in s.shape], s.dtype), specs)
        return next(iter(self._pipeline(0)))[0]  # ragged or sparse features: the first batch

    # ---- the position: checked and resumed after the job's restore ----

    def resume(self):
        """After the job's restore: keeps the shares' positions only when they belong to this
        input, attaches the one-process iterator (its saved state restores into it), and says
        in one line where each share resumes, or that no position can be kept."""
        job, position = self.job, self.job.position
        saved = position.layout.numpy().decode()
        if saved and saved != self.layout and any(int(state[2]) >= 0 for state in position.state.numpy()):
            job.log(f"warning: the checkpoint's input position belongs to another input ({saved}, this one is "
                    f"{self.layout}): every share reads its {self.kind} from the start")
            for state in position.states:
                state.assign([0, 0, -1, -1, 0])
        position.layout.assign(self.layout)
        trained = [int(state[4]) if state[2] >= 0 else 0 for state in position.state.numpy()]
        how = "skipped"
        if self.slot is not None:
            how = self._attach(trained[0])
        if any(trained):
            job.log(f"input position: {self.kind} share(s) resume after {', '.join(map(str, trained))} trained "
                    f"batch(es) ({how})")
        if self.reason and self.config.checkpoint_dir and not self.checkpointable:
            job.log(f"warning: the input position cannot be kept exactly: your {self.kind} {self.reason[1]}, so it "
                    f"may yield other batches each time it is made; a resume skips as many batches as each share "
                    f"trained, which may train some rows twice and miss others: {_FIXES[self.reason[0]]}")

    def _attach(self, trained):
        """Puts the one-process iterator in the job's slot: the checkpoint's saved state
        restores into it there (deferred restore); a checkpoint without one (another topology
        saved it) is resumed by reading the trained batches. Returns how it resumed."""
        latest = self.job.manager.latest if self.job.manager is not None else None
        # A restore is pending only for the slot's first iterator (a later fit continues by count).
        saved = (not hasattr(self.slot, "iterator") and latest is not None
                 and _ITERATOR_KEY in tf.train.load_checkpoint(latest).get_variable_to_shape_map())
        try:
            self.slot.iterator = iter(self._batches(0))
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError) as err:
            self.job.log(f"warning: the checkpoint's iterator state belongs to another pipeline (the dataset "
                         f"changed: {err.message.splitlines()[0][:200]}); skipping the {trained} batch(es) trained")
            self.slot.iterator, saved = iter(self._batches(0)), False
        if saved or not trained:
            return "the iterator's saved state"
        _advance(self.slot.iterator, tf.constant(trained, tf.int64))
        return "read past"


@tf.function
def _advance(iterator, batches):
    """Reads `batches` batches from `iterator` (fewer when it ends first)."""
    def body(i):
        with tf.control_dependencies([iterator.get_next_as_optional().has_value()]):
            return i + 1
    return tf.while_loop(lambda i: i < batches, body, [tf.constant(0, tf.int64)])


def _saves(dataset):
    """True when TensorFlow can checkpoint an iterator of `dataset` (no Python, no stateful
    op in its functions): tried on a fresh iterator, in memory."""
    try:
        path = tf.train.Checkpoint(iterator=iter(dataset)).write("ram://ttf_iterator_probe/probe")
        for name in tf.io.gfile.glob(path + "*"):
            tf.io.gfile.remove(name)
        return True
    except tf.errors.OpError:  # FailedPrecondition: "EagerPyFunc is stateful", Unimplemented, ...
        return False


def nondeterminism(dataset):
    """Why `dataset` may yield other batches, in another order, each time it is made: (kind,
    phrase), kind one of "python", "shuffle", "parallel", "random"; or None. Read from the
    dataset's graph (ops and the functions they run)."""
    if dataset.options().deterministic is False:
        return "parallel", "sets tf.data.Options().deterministic = False"
    variant = tf.nest.flatten(dataset, expand_composites=True)[0]
    graph = tf.compat.v1.GraphDef.FromString(
        tf.raw_ops.DatasetToGraphV2(input_dataset=variant, external_state_policy=1).numpy())  # 1: ignore state
    scopes = [list(graph.node)] + [list(f.node_def) for f in graph.library.function]
    for nodes in scopes:
        consts = {n.name: tf.make_ndarray(n.attr["value"].tensor) for n in nodes
                  if n.op == "Const" and n.attr["dtype"].type == tf.int64.as_datatype_enum}

        def zero(name):
            value = consts.get(name.lstrip("^").split(":")[0])
            return value is not None and not value.any()

        for node in nodes:
            op = node.op
            if op in _PYTHON_OPS:
                return "python", "runs Python (tf.py_function, tf.numpy_function or Dataset.from_generator)"
            if "deterministic" in node.attr and node.attr["deterministic"].s == b"false" or \
                    node.attr["sloppy"].b:
                return "parallel", f"runs {op} with deterministic=False"
            seeds = node.input[:2] if op.startswith("RandomDataset") else node.input[2:4]
            if ("Shuffle" in op or op.startswith("RandomDataset")) and op.endswith(("Dataset", "DatasetV2",
                                                                                    "DatasetV3")):
                if op == "ShuffleDatasetV2" or all(zero(s) for s in seeds):
                    return "shuffle", f"shuffles or samples without a seed ({op})"
            if op in _RANDOM_OPS and node.attr["seed"].i == 0 and node.attr["seed2"].i == 0:
                return "random", f"draws random numbers without a seed ({op})"
    return None
