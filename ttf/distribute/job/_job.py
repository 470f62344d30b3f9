"""`Job`: the job runtime for any Keras model with ttf tables, on any topology.

A job is your model, optimizer and loss, a topology (one process, a parameter-server
cluster, Horovod ranks) and a `JobConfig`. It gives your model every mechanic a production
job needs, written once over the topology:

- each worker or rank reads its own input share; where each share continues is part of
  the checkpoint (`fit` over a `ttf.data.Reader`);
- full and delta checkpoints, each process writing its own rows, and resume;
- a stream's position in the same checkpoint, so a restart neither skips nor repeats
  (`follow`), and a rollback when a lost worker's step was run again;
- the NaN guard (a step with a NaN/Inf loss or gradient is skipped whole and counted);
- the precision switch (fp32, bf16, or the loss-driven one);
- publishing deltas to serving while training, event-time TTL;
- progress lines, TensorBoard scalars and the rolling AUC;
- SIGTERM/SIGINT finish the step, checkpoint and return.

Example (one process; the same script is the chief of a cluster with
`topology=ttf.distribute.ParameterServers(cluster)`):

    topology = ttf.distribute.OneProcess()
    with topology.scope():
        model = make_model()                       # ttf.FusedEmbedding inside; returns logits
        optimizer = ttf.optimizers.Adam(1e-3)
    job = ttf.distribute.Job(model, optimizer, topology=topology,
                             config=ttf.distribute.JobConfig(batch_size=1024, epochs=1, checkpoint_dir="ck"))
    job.fit(ttf.data.Reader(["day_0.tsv"], "criteo"))
    print(job.evaluate(ttf.data.Reader(["day_1.tsv"], "criteo")))
"""
import contextlib
import dataclasses
import time

import numpy as np
import tensorflow as tf

from ttf._durable import absolute_path
from ttf.checkpoint import CheckpointManager
from ttf.checkpoint._fingerprint import ModelFingerprint, warm_start
from ttf.data import InputPosition, best_auc, zero_features
from ttf.distribute import _errors
from ttf.distribute.job import _checks, _loops, _user_data
from ttf.distribute.job._config import JobConfig
from ttf.distribute.topology import OneProcess
from ttf.embedding import EventTimeTTL, tables_in
from ttf.precision import policy_for
from ttf.summary import _scalars as _summary


def sigmoid_cross_entropy(labels, logits):
    """The examples' losses of a binary model that outputs logits."""
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, logits.dtype), logits=logits)


def _print(message):
    print(f"[ttf] {message}", flush=True)


class Job:
    """Trains, follows a stream with, and evaluates a Keras model with ttf tables.

    Args:
      model: a built or unbuilt Keras model (Keras 2 or 3), made inside `topology.scope()`;
        `model(features, training=...)` returns one logit per example [B] or [B, 1] (or see
        `forward`). It is checkpointed as "model".
      optimizer: a ttf optimizer (ttf.optimizers) or a Keras one, made inside the scope.
      loss: `loss(labels, outputs) -> per-example losses [B]` (default: sigmoid
        cross-entropy on logits). The job averages it over every process's examples.
      forward: what training and evaluation run instead of `model` (a Keras layer sharing
        its weights, e.g. one returning logits where the model returns probabilities).
      topology: OneProcess() (default), ParameterServers(cluster), HorovodRanks() or
        SyncWorkers(worker_hosts, task_index).
      config: a JobConfig.
      log: `log(message)` for progress lines; called on the chief only (default: print with
        a "[ttf] " prefix).
      checkpoint_extras: {name: trackable} saved and restored with the job (e.g. a learning
        rate schedule's state).

    Raises (from fit / follow / evaluate): BadInputError, LostParameterServerError,
    LostRankError (another rank of a synchronous job), SaveFailedError, NonFiniteTrainingError (ttf.distribute / ttf.precision).
    """

    def __init__(self, model, optimizer, loss=None, *, forward=None, topology=None, config=None, log=None,
                 checkpoint_extras=None):
        self.topology = topology or OneProcess()
        config = config or JobConfig()
        if not isinstance(config, JobConfig):
            raise ValueError(f"config must be a ttf.distribute.JobConfig, got {type(config).__name__}")
        # Every task reads the chief's folders: a relative path would mean each task's own.
        publish = config.publish and dataclasses.replace(config.publish, base=absolute_path(config.publish.base))
        self.config = config = dataclasses.replace(config, checkpoint_dir=absolute_path(config.checkpoint_dir),
                                                   publish=publish)
        if self.config.steps_per_call > self.topology.max_steps_per_call:
            raise ValueError(f"steps_per_call={self.config.steps_per_call}: a {self.topology.name} job runs one step "
                             f"per call at most {self.topology.max_steps_per_call} (its collectives take a new instance "
                             "key at each call); give steps_per_call=1")
        self.model = model
        self.forward = forward or model
        self.loss = loss or sigmoid_cross_entropy
        self._log = log or _print
        _checks.check_in_scope(self.topology, model, optimizer)
        with self.topology.scope():
            self.optimizer = self.topology.prepare(model, _checks.job_optimizer(model, optimizer))
            self.position = InputPosition(self.topology.num_shares)
            self.precision = policy_for(self.config.precision)
            self.auc_window = _summary.RollingAUC(self.config.auc_window) if self.config.logdir else None
        self._extras = dict(checkpoint_extras or {})
        self.runner = self.topology.step_runner(self)  # each step here, or on a parameter-server job's workers
        self.stream = self.event_ttl = self.manager = self.publisher = None
        self.stop = None
        self._reader, self._bad_before = None, 0  # fit's lenient Reader: its bad lines count as skipped input
        self._ready = False
        self._summary = None
        self.timed_cpu = None

    # ---- set-up: variables, checkpoint, resume (once, by fit or follow) ----

    def log(self, message):
        if self.topology.is_chief:
            self._log(message)

    def _setup(self, sample_features, what, stream=None, schema=None):
        """Builds and checks the model on `sample_features` (a batch of `what`), then restores
        checkpoint_dir's latest checkpoint when it holds this model."""
        if self._ready:
            return
        config, topology = self.config, self.topology
        with topology.scope():
            if not self.model.built:  # variables (on the ps tasks in a cluster)
                _checks.call_on(self.model, sample_features, what)
            _checks.check_output(self.forward, sample_features, what)
            parts = {"model": self.model, "optimizer": self.optimizer, "input_position": self.position}
            if stream is not None:
                parts["stream_position"] = stream
            if config.ttl_seconds:  # its notes (table step at event time) go with the tables they describe
                self.event_ttl = EventTimeTTL(tables_in(self.model), config.ttl_seconds)
                parts["event_ttl"] = self.event_ttl
            if self.auc_window is not None:  # a resumed job continues its window
                parts["auc_window"] = self.auc_window
            if self.precision is not None:
                parts["precision"] = self.precision
            self.runner.build(parts)
            parts.update(self._extras)
            fingerprint = ModelFingerprint.of(tf.train.Checkpoint(**parts), schema)
            parts["fingerprint"] = fingerprint.variable()  # every checkpoint knows the model it holds
            self.checkpoint = tf.train.Checkpoint(**parts)
        if config.checkpoint_dir:
            self.manager = CheckpointManager(self.checkpoint, config.checkpoint_dir, full_every=config.full_every,
                                             max_to_keep=config.max_to_keep)
            resumed = self._resume(fingerprint)
            _checks.check_reachable(topology, config.checkpoint_dir)
            if resumed:
                self.log(f"resumed from {self.manager.latest} at step {self.step()}")
                self.log("input position: " + ", ".join(
                    f"share {i} at epoch {e}, line {line} + {k} batch(es)" if line >= 0 else f"share {i} not started"
                    for i, (e, _, _, line, k) in enumerate(self.position.state.numpy()))
                    + f"; {self.position.examples_trained()} examples trained so far")
                if stream is not None:
                    self.log(f"stream position: {stream.describe()}")
            if stream is not None:  # each rank takes its share of the merged position
                stream.adopt_share()
        topology.broadcast_model(self.model)  # the chief's dense weights everywhere
        self.runner.restored()
        self.examples_before = self.position.examples_trained()
        # Only the chief writes; the others' calls do nothing.
        self._summary = _summary.JobSummary(config.logdir, writer=topology.is_chief) if config.logdir else None
        self.step_before = self.step()
        self._ready = True

    def _resume(self, fingerprint):
        """Restores checkpoint_dir's latest checkpoint if it holds this model (True); refuses one
        of another model in one line, or warm-starts from its matching parts (False: step 0)."""
        directory = self.config.checkpoint_dir
        latest = self.manager.latest or tf.train.latest_checkpoint(directory)
        if latest is None:
            return False
        saved = ModelFingerprint.saved_in(latest)
        difference = fingerprint.first_difference(saved)
        if difference is None:
            self._check_auc_window()
            return self.manager.restore_latest() is not None
        if self.config.resume == "refuse":
            raise ValueError(f"checkpoint_dir {directory} holds a checkpoint of another model: {difference}. Nothing "
                             "was restored or written; give a new checkpoint_dir, or JobConfig(resume='warm_start') "
                             "to start this model from the parts that match")
        self.log(f"checkpoint_dir {directory} holds another model ({difference}): warm start at step 0")
        warm_start(fingerprint, saved, directory, self.log)
        return False

    def step_loss(self):
        """The step's loss: the mean of the examples' losses over every process's batch (so
        the averaged gradients are the global batch's), after recording the AUC window."""
        mean = self.topology.mean_loss() or tf.reduce_mean

        def loss_fn(labels, outputs):
            outputs = tf.reshape(outputs, tf.shape(labels))
            loss = mean(self.loss(labels, outputs))
            if self.auc_window is None:
                return loss
            with tf.control_dependencies([self.auc_window.record(labels, outputs)]):
                return tf.identity(loss)
        return loss_fn

    def _check_auc_window(self):
        """auc_window must be the size the checkpoint's window was saved with."""
        if self.auc_window is None or self.manager.latest is None:
            return
        shapes = tf.train.load_checkpoint(self.manager.latest).get_variable_to_shape_map()
        saved = shapes.get("auc_window/_probs/.ATTRIBUTES/VARIABLE_VALUE")
        if saved is not None and saved != [self.auc_window.capacity]:
            raise ValueError(f"auc_window={self.auc_window.capacity} differs from the {saved[0]} rows of the window "
                             f"saved in {self.manager.latest}: give auc_window={saved[0]} (or a new checkpoint_dir)")

    # ---- counters ----

    def step(self):
        """The global step: steps applied, plus steps skipped as non-finite."""
        return int(self.optimizer.iterations.numpy()) + self.skipped_steps()

    def skipped_steps(self):
        return self.runner.skipped_steps()

    def bf16_fraction(self, steps_run):
        return self.runner.low_steps() / max(steps_run, 1)

    @property
    def train_step(self):
        """The job's ttf.precision.PrecisionTrainStep (a parameter-server job's is scheduled on its workers)."""
        return self.runner.train_step

    def examples_trained(self):
        """(rows trained over every run restored into this one, rows trained by this run)."""
        self.topology.sync_positions(self.position)
        total = self.position.examples_trained()
        return total, total - self.examples_before

    def skipped_input(self):
        """{"bad_lines", "empty_files"} skipped by this run (strict=False's bad lines of the
        Reader or stream, a folder stream's empty files). Raises BadInputError past
        config.max_bad_fraction of the lines read."""
        if self.stream is not None:
            progress, _ = self.topology.stream_progress(self.stream)
            bad, empty, examples = progress["bad_lines"], progress["empty_files"], progress["examples"]
        else:
            bad = self._reader.bad_lines - self._bad_before if self._reader is not None else 0
            empty, examples = 0, self.examples_trained()[1]
        read = bad + examples
        if read >= 1000 and bad > self.config.max_bad_fraction * read:
            raise _errors.BadInputError(
                f"{bad} of the last {read} input lines were bad ({100 * bad / read:.1f}%, over max_bad_fraction="
                f"{self.config.max_bad_fraction}): the input went bad; fix it, or raise JobConfig.max_bad_fraction")
        return {"bad_lines": bad, "empty_files": empty}

    def skipped_text(self, skipped=None):
        """', K bad lines skipped' (and empty files) for a progress line, or '' (of
        `skipped`, skipped_input()'s value, when given)."""
        skipped = skipped or self.skipped_input()
        text = f", {skipped['bad_lines']} bad line(s) skipped" if skipped["bad_lines"] else ""
        return text + (f", {skipped['empty_files']} empty file(s) skipped" if skipped["empty_files"] else "")

    def table_summary(self):
        """(ids stored, checksum, value sum) over every shard of the model's ttf tables, or None."""
        return self.topology.table_summary(self.model) if tables_in(self.model) else None

    def table_progress(self):
        """', table rows R (E evicted)' for bounded ttf tables, the tiers for tiered ones, else
        '': of every parameter server's shard (numbers only travel), of this rank's on Horovod."""
        tables = [t for layer in tables_in(self.model) for t in layer.tables]
        if not any(t.capacity or t.evict_policy == "ttl" or t.dram_budget for t in tables):
            return ""
        shard = self.topology.table_note
        if any(t.dram_budget for t in tables):
            return tier_progress([t.tier_stats() for t in tables], sum(t.dram_budget for t in tables)) + shard
        rows = sum(int(t.size()) for t in tables)
        evicted = sum(int(t.stats().rows_evicted) for t in tables)
        return f", table rows {rows} ({evicted} evicted){shard}"

    # ---- checkpoints, publishing, summaries ----

    def save(self, step=None):
        """Saves a checkpoint now (every process calls it; each writes its own rows). Raises
        SaveFailedError naming the last complete checkpoint when the save fails."""
        step = self.step() if step is None else step
        saving = self.manager.last_step != step  # (on Horovod only rank 0's manager knows and prints)
        if saving:
            self.log(f"checkpoint at step {step}: saving ({'full' if self.manager.delta_plan() is None else 'delta'})")
        started = time.perf_counter()
        self.topology.sync_positions(self.position, self.stream)
        try:
            self.topology.save(self.manager, step)
        except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError):
            raise  # a lost task, not a failed write: the caller's error
        except (OSError, RuntimeError, tf.errors.OpError) as err:
            raise _errors.SaveFailedError(
                f"the checkpoint of step {step} was not saved ({_errors.error_summary(err)}); nothing was recorded: "
                f"the last complete checkpoint is {self.manager.latest or 'none'}") from err
        if saving:
            self.log(f"checkpoint at step {step}: saved in {time.perf_counter() - started:.2f} s")

    def maybe_checkpoint(self, step, before):
        """Saves when the steps from `before` to `step` passed a multiple of checkpoint_every."""
        every = self.config.checkpoint_every
        if self.manager is not None and step // every > before // every:
            self.save(step)

    def _save_at_end(self):
        if self.manager is not None:  # (not again at a saved step: topology.save knows, on every process)
            self.save(self.step())

    def maybe_publish(self, final=False):
        """A base, then a delta every `publish.every` seconds (each process writes its own
        rows); final: publish now. A full disk pauses publishing with one line, never stops
        training. Returns (base version, sequence) when something was published."""
        publish = self.config.publish
        if publish is None:
            return None
        if self.publisher is None:
            self.publisher = self.topology.publisher(
                self.model, publish.base, publish_every=publish.every, dense_publish_every=publish.dense_every,
                rebase_every=publish.rebase_every, row_dtype=_row_dtype(publish.row_dtype))
        # The last publish carries the dense weights too: serving ends on the job's final model.
        published = self.publisher.publish(with_dense=True) if final else self.publisher.maybe_publish()
        if published is not None and final:
            self.log(f"published to {publish.base}: base {published[0]}, sequence {published[1]}")
        return published

    def write_summary(self, step, loss, steps_per_sec=0.0, extra=None, skipped=None):
        """The scalars of a progress line (ttf.summary) plus `extra` ({tag: number}); `skipped`:
        skipped_input()'s value when the caller has it. Every process calls it (the table counts
        may be a collective); the chief writes."""
        if self._summary is None:
            return
        values = {_summary.LOSS: loss, _summary.AUC: self.auc_window.auc(),
                  _summary.BAD_LINES: (skipped or self.skipped_input())["bad_lines"],
                  _summary.EXAMPLES_PER_SEC: steps_per_sec * self.config.batch_size * self.topology.num_ranks,
                  _summary.BF16_SHARE: self.bf16_fraction(step - self.step_before),
                  _summary.SKIPPED_STEPS: self.skipped_steps()}
        if self.publisher is not None and self.publisher.version is not None:
            values["publish/sequence"] = self.publisher.sequence
        values.update(extra or {})
        layers = tables_in(self.model)
        if layers:
            values.update(self.topology.sum_counts(_summary.table_scalars(layers)))
        self._summary.scalars(values, step)

    def export_for_serving(self, base, row_dtype="fp32"):
        """Writes the next serving version base/<N>/ (stock TF ops only; each process freezes
        its own rows) and returns its folder (None on ranks other than 0)."""
        return self.topology.export_for_serving(self.model, base, _row_dtype(row_dtype))

    # ---- training ----

    def fit(self, data, split="all"):
        """Trains on `data` to config.steps (or for config.epochs); then checkpoints and
        publishes a last time. Returns {"steps", "timed_steps", "seconds", ...} of this run;
        "data_ran_out_at_step" is the step where the data ended before config.steps (also a
        warning line), else None.

        Args:
          data: a ttf.data.Reader (each worker or rank reads its own share; the position is
            checkpointed); or your own pipeline, `dataset_fn(input_context) -> tf.data.Dataset`
            of (features, labels) batches of config.batch_size rows, called once per input share
            with a tf.distribute.InputContext (every topology: each worker or rank its
            input_pipeline_id); or one tf.data.Dataset (one process and synchronous ranks; each
            rank keeps its slice of every batch). With epochs the job repeats a pipeline
            `epochs` times. Where a pipeline stands is checkpointed (docs/job.md, "Your own
            tf.data pipeline"); where it cannot be kept exactly, one line says so at start.
          split: "all", "train" (every 5th line held out) of a Reader.
        """
        config = self.config
        if config.steps is None and config.epochs is None:
            raise ValueError("JobConfig needs steps or epochs for fit (follow runs a stream until stopped)")
        user = None
        if _user_data.is_user_data(data):
            user = _user_data.UserData(self, data)
            if user.checkpointable and (not self._ready or _user_data.ITERATOR_ENTRY in self._extras):
                # One process: the iterator's own state goes into the checkpoint (a slot made once).
                user.slot = self._extras.setdefault(_user_data.ITERATOR_ENTRY, tf.Module())
            first, dataset = user.sample_features, user.share_dataset
            what, schema = user.what, None
        else:
            first = lambda: next(iter(data.dataset(2, shuffle=False)))[0]  # noqa: E731
            what, schema = f"the reader's batches (schema {data.schema.name!r})", data.schema
            # Its counter lives in this process: a parameter-server job's workers parse (and count) elsewhere.
            self._reader = data if self.runner.input_here else None
            dataset = lambda share: data.share_dataset(  # noqa: E731
                config.batch_size, share, self.topology.num_shares, position=self.position, seed=config.seed,
                split=split, num_epochs=None if config.steps else config.epochs)
        with self._errors():
            sample = first()  # (its iterator is gone: the lines it parsed ahead are counted by now)
            if self._reader is not None:
                self._bad_before = self._reader.bad_lines
            self._setup(sample, what, schema=schema)
            if user is not None:
                user.resume()
            start = self.step()
            # A Reader's shares with steps never end; every other input may, on any rank.
            steps, seconds, ran_out = _loops.fit(self, dataset, finite=user is not None or not config.steps)
            self._save_at_end()
            if self.manager is not None:
                self.log(f"checkpoint {self.manager.latest}")
            self.maybe_publish(final=True)
        result = self._result(start, steps, seconds)
        result["data_ran_out_at_step"] = ran_out
        return result

    def follow(self, spec, schema=None, strict=True, poll_seconds=1.0, kafka_config=None):
        """Trains on a stream until SIGTERM/SIGINT (or config.steps): folder:DIR or
        kafka:HOST:PORT/TOPIC (ttf.data.open_stream). Each batch's position is committed after
        its update, so every checkpoint pairs the model with the stream position it has seen;
        on a stop it publishes and checkpoints, then returns this run's numbers. Each worker
        or rank trains its share (Kafka partitions, folder files by name). schema: the stream's
        columns (a ttf.data.Schema, "criteo" (the default), "avazu" or a JSON file)."""
        if self.config.epochs is not None:
            raise ValueError("follow runs a stream until stopped (or JobConfig.steps): drop JobConfig.epochs")
        with self._errors():
            with self.topology.scope():  # its position lives where the job's variables do
                self.stream = self.topology.open_stream(spec, schema=schema or "criteo", strict=strict, poll_seconds=poll_seconds,
                                                        kafka_config=kafka_config)
            self.stream.on_idle = self.maybe_publish  # an idle stream still publishes its last steps' rows
            what = (f"the stream's features by schema {schema!r}" if schema is not None else
                    "the stream's features by the default schema 'criteo' (give follow(schema=...) for another)")
            self._setup(zero_features(self.stream.schema), what, self.stream, schema=self.stream.schema)
            start = self.step()
            steps, seconds = _loops.follow(self)
            self.maybe_publish(final=True)
            self._save_at_end()
        progress, _ = self.topology.stream_progress(self.stream)
        result = self._result(start, steps, seconds)
        result.update(examples_trained=progress["examples"], stream_progress=progress,
                      stopped_by=self.stop.signal_name if self.stop else None)
        return result

    def _result(self, start, steps, seconds):
        steps_run = self.step() - start
        return {**self.skipped_input(), "steps": self.step(), "steps_run": steps_run, "timed_steps": steps, "seconds": seconds,
                "steps_per_sec": steps / seconds if seconds > 0 else float("nan"),
                "bf16_fraction": self.bf16_fraction(steps_run), "skipped_steps": self.skipped_steps(),
                "cpu_seconds_per_step": self.timed_cpu / steps if self.timed_cpu is not None and steps else None}

    def evaluate(self, data, split="all", batch_size=None):
        """AUC and logloss of the model on `data` (a ttf.data.Reader, its `split` of "all" or
        "eval", or a tf.data.Dataset of (features, labels)). Returns {"auc", "logloss", "rows"}."""
        topology = self.topology
        batch = topology.eval_batch_size(batch_size or self.config.batch_size)
        dataset = data if isinstance(data, tf.data.Dataset) else data.dataset(batch, shuffle=False, split=split)
        dataset = topology.slice_batches(dataset, batch_size or self.config.batch_size)
        predict = tf.function(lambda features: tf.sigmoid(tf.reshape(self.forward(features, training=False), [-1])))
        labels, probs = [], []
        with self._errors():
            for features, y in dataset:
                labels.append(np.reshape(y.numpy(), [-1]))
                probs.append(predict(features).numpy())
        labels, probs = np.concatenate(labels), np.concatenate(probs)
        labels, probs = topology.gather_rows(labels, "eval_labels"), topology.gather_rows(probs, "eval_probs")
        probs = np.clip(probs, 1e-7, 1 - 1e-7)
        logloss = float(-np.mean(labels * np.log(probs) + (1 - labels) * np.log(1 - probs)))
        auc = best_auc(labels, probs) if 0 < labels.sum() < len(labels) else float("nan")
        if self._summary is not None:  # the eval numbers beside the training curves
            self._summary.scalars({"eval/auc": auc, "eval/logloss": logloss}, self.step())
        return {"auc": auc, "logloss": logloss, "rows": len(labels)}

    def close(self):
        """Flushes and closes the TensorBoard writer."""
        if self._summary is not None:
            self._summary.close()

    @contextlib.contextmanager
    def _errors(self):
        """TensorFlow's errors of a job as ttf's typed ones (the message names the cause)."""
        try:
            yield
        except tf.errors.OpError as err:
            # A bad input line is the reader's; any other argument error is the caller's own.
            error = _errors.bad_input(err) or (None if isinstance(err, tf.errors.InvalidArgumentError)
                                               else self.topology.lost(err))
            if error is None:
                raise
            raise error from err


def _row_dtype(name):
    return {"fp16": tf.float16, "int8": tf.int8}.get(name, tf.float32)


def tier_progress(stats, dram_budget):
    """', rows D DRAM + S disk, DRAM hit rate H% (since start), W% of disk reads from the
    device, B bytes of RAM a key' over the tier stats of some tables (TtfTableTierStats) whose
    budgets add up to dram_budget; and a warning while a lock shard's disk index takes over half
    of its share of the budget (tier_stats' crowded_shards)."""
    total = {name: sum(s[name] for s in stats) for name in stats[0]}
    rows = total["dram_rows"] + total["disk_rows"]
    lookups = total["dram_hits"] + total["disk_hits"]
    hit_rate = 100.0 * total["dram_hits"] / lookups if lookups else 100.0
    waited = 100.0 * total["disk_waits"] / total["disk_hits"] if total["disk_hits"] else 0.0
    ram_per_key = (total["dram_bytes"] + total["disk_index_bytes"]) / max(rows, 1)
    crowded = total["crowded_shards"] > 0
    return (f", rows {total['dram_rows']} DRAM + {total['disk_rows']} disk, DRAM hit rate {hit_rate:.1f}% since start, "
            f"{waited:.0f}% of disk reads from the device (the rest page cache), {ram_per_key:.0f} bytes of RAM a key"
            + (f"; the disk index takes {total['disk_index_bytes']} of the {dram_budget} bytes of dram_budget, "
               "leaving few rows in DRAM: raise dram_budget" if crowded else ""))
