"""ttf tables sharded over the workers of a synchronous job, written once over the
collectives interface (ttf/distribute/collectives/_tf.py): TensorFlow's collectives or Horovod.

Every worker runs the whole model on its slice of the global batch. Each id of a ttf table
lives on exactly one worker, `ttf.embedding.shard_of(id, size)`. A training step:

  forward:  each worker de-duplicates its batch's ids (per table, over all its fields and
            calls) and one alltoall sends each id to its owner; the owner finds the rows (a
            new id: the row its update will insert) and one alltoall brings them back;
  backward: one alltoall carries each id's row gradient to its owner, which sums it over
            the workers and applies the fused optimizer once per id (ttf.optimizers);
            dense gradients are allreduced (averaged, fused into one buffer).

Table gradients are averaged over the workers like dense ones, so with every worker's loss
the mean over its slice, N workers of batch B compute what one process computes on the
global batch of N x B. A backend whose alltoall has fixed sizes (TensorFlow's) pads each
block to the largest; the one small gather of every worker's id counts per step lets every
worker compute all three alltoalls' sizes, so none needs its own count exchange.
"""
import warnings

import tensorflow as tf

from ttf._keras import KERAS3, graph as _graph
from ttf._ops import ops
from ttf.distribute.collectives._tf import CollectiveMisuseError
from ttf.distribute.collectives._wire import from_wire, itemsize, to_wire, wire_dtype
from ttf.embedding import DynamicEmbedding, embedding_of, shard_of, tables_in


def _exchange_name(layers):
    return f"ttf_{layers[0].name}" if len(layers) == 1 else f"ttf_{len(layers)}_tables"


def _row_slots(offsets, dim):
    """[N] offsets of rows in a flat buffer -> [N, dim] indices of their elements."""
    return tf.cast(offsets, tf.int32)[:, None] + tf.range(dim)[None, :]


class TableSharding:
    """Makes a ttf embedding layer's table one shard of a table spread over the workers of
    `collectives`: this worker holds the ids with shard_of(id, size) == rank. Set by shard_tables.

    Args:
      collectives: a ttf.distribute Collectives (TFCollectives, HorovodCollectives).
      compression: "none", "fp16" or "bf16": the precision rows and row gradients travel in.
    """

    def __init__(self, collectives, compression="none"):
        self.collectives = collectives
        self.wire_dtype = wire_dtype(compression)
        self.compression = compression
        self.rank, self.size = collectives.rank, collectives.size
        self._restores = {}  # layer name -> restores on this worker
        self._grouped = {}  # id(layer) -> [(training, keys shape, embeddings)] while a grouped model runs
        self.grouping = None  # the sharded model's Grouping (_group_lookups; a pipelined step's)
        self.recording = None  # [(layer, keys, row_splits, trains)] while a Grouping records a call's lookups
        self.prefetched = None  # {trains: routing} of the ids of the call being traced (a pipelined step)

    def lookup(self, layer, keys, row_splits, training):
        """The layer's lookup of `keys` (a flat id list with row_splits for ragged ids, else
        any shape), through the owners; training: new ids read their initial rows and gradients are routed
        (the owners' fused update inserts the rows).
        Inside a model grouped by shard_tables, the model's one exchange has already
        brought this call's rows."""
        if self.recording is not None:  # a Grouping's recording pass: note the ids, exchange nothing
            self.recording.append((layer, keys, row_splits, training))
            return layer._combine(tf.zeros([tf.size(keys), layer.dim]), keys, row_splits)  # pylint: disable=protected-access
        queue = self._grouped.get(id(layer))
        if queue and queue[0][0] == training:
            _, shape, embeddings = queue.pop(0)
            if not keys.shape.is_compatible_with(shape):
                raise RuntimeError(f"{layer.name}: the grouped exchange looked up ids of shape {shape}, the layer "
                                   f"was called with {keys.shape}; report this as a ttf bug")
            return embeddings
        return self.exchange([(layer, keys, row_splits)], training)[0]

    def exchange(self, requests, training, routed=None):
        """Looks up every request (layer, keys, row_splits) through the owners with one
        alltoall per direction for all of them: ids out, rows back and, in the backward
        pass, row gradients out. Returns each request's embeddings.
        routed: these requests' ids already sent to their owners (route_ids, a pipelined
        step's previous call); only the rows then travel here."""
        layers = list({id(layer): layer for layer, _, _ in requests}.values())
        if routed is None:
            routed = self.route_ids(requests, layers, training)
        else:  # routed by an earlier call: it must be these ids' routing
            requests = _checked_against(requests, layers, routed)
        if not training:
            return self.fetch_rows(requests, layers, routed, training=False)[0]
        for layer in layers:
            if not layer.built:
                layer.build(None)

        @tf.custom_gradient
        def lookup(*anchors):
            del anchors  # connect the tape to the layers' anchor variables; their values are unused
            embeddings, route = self.fetch_rows(requests, layers, routed, training=True)

            def grad(*upstream):
                return self._route_gradients(requests, layers, upstream, route)

            return embeddings, grad

        return lookup(*[tf.convert_to_tensor(layer.anchor) for layer in layers])

    # The exchange's stages, as TorchRec splits a sharded module into input_dist / compute /
    # output_dist: route_ids reads no table, so a pipelined step runs it for batch N+1 while
    # batch N trains; fetch_rows reads the owners' rows and must follow batch N's update.

    def route_ids(self, requests, layers, training):
        """Stage 1: each table's ids de-duplicated, sent to their owners, and de-duplicated
        again on the owner (the same id can come from several workers). Worker r's ids travel
        as one block: the count of each table's ids, then table 0's ids, table 1's, ...
        Returns the routing (a dict of tensors and lists of tensors, one entry per table) that
        fetch_rows and the backward pass need; it depends on the ids only."""
        coll, num_tables, size = self.collectives, len(layers), self.size
        name = _exchange_name(layers)
        table_of = {id(layer): t for t, layer in enumerate(layers)}
        dims = tf.constant([layer.dim for layer in layers], tf.int32)
        # Each table's ids de-duplicated over all its requests (a shared layer's calls too).
        flat = [[] for _ in layers]
        for layer, keys, _ in requests:
            flat[table_of[id(layer)]].append(tf.reshape(keys, [-1]))
        unique = [tf.unique(tf.concat(parts, 0), out_idx=tf.int32) for parts in flat]
        counts = tf.stack([tf.size(u.y) for u in unique])
        tags = tf.repeat(tf.range(num_tables), counts)
        all_keys = tf.concat([u.y for u in unique], 0)
        bucket = shard_of(all_keys, size) * num_tables + tags  # (owner, table)
        order = tf.argsort(bucket, stable=True)
        pair_counts = tf.reshape(tf.math.bincount(bucket, minlength=size * num_tables,
                                                  maxlength=size * num_tables, dtype=tf.int32), [size, num_tables])
        # Every worker's counts [sender, owner, table], for a backend that pads its alltoalls.
        every_counts = (coll.allgather(pair_counts[None], f"{name}_counts", count=training, same_shape=True)
                        if coll.pads_alltoall else None)
        send = tf.concat([tf.RaggedTensor.from_tensor(tf.cast(pair_counts, tf.int64)),
                          tf.RaggedTensor.from_row_lengths(tf.gather(all_keys, order),
                                                            tf.reduce_sum(tf.cast(pair_counts, tf.int64), 1))],
                         axis=1)
        received, received_splits = coll.alltoall(
            send.values, tf.cast(send.row_lengths(), tf.int32), f"{name}_ids", count=training,
            all_splits=None if every_counts is None else num_tables + tf.reduce_sum(every_counts, 2))
        received = tf.RaggedTensor.from_row_lengths(received, tf.cast(received_splits, tf.int64))
        received_counts = tf.cast(received[:, :num_tables].to_tensor(shape=[size, num_tables]), tf.int32)
        received_keys = received[:, num_tables:].values
        received_tags = tf.repeat(tf.tile(tf.range(num_tables), [size]), tf.reshape(received_counts, [-1]))
        # The owner: each table's ids once, and where their rows go in the flat buffer back.
        widths = tf.gather(dims, received_tags)
        received_offsets = tf.cumsum(widths, exclusive=True)
        owned_keys, owned_index, owned_slots = [], [], []
        for t, layer in enumerate(layers):
            where = tf.where(tf.equal(received_tags, t))[:, 0]
            keys_t, index_t = tf.unique(tf.gather(received_keys, where), out_idx=tf.int32)
            owned_keys.append(keys_t)
            owned_index.append(index_t)
            owned_slots.append(_row_slots(tf.gather(received_offsets, where), layer.dim))
        rows_out = tf.math.unsorted_segment_sum(widths, tf.repeat(tf.range(size), tf.reduce_sum(received_counts, 1)),
                                                size)
        # The requester: table t's unique ids sit in `send` at these places.
        sent_offsets = tf.cumsum(tf.gather(dims, tf.gather(tags, order)), exclusive=True)
        places = tf.split(tf.math.invert_permutation(order), counts, num=num_tables)
        routed = dict(unique_keys=[u.y for u in unique], unique_index=[u.idx for u in unique],
                      unique_slots=[_row_slots(tf.gather(sent_offsets, places[t]), layer.dim)
                                    for t, layer in enumerate(layers)],
                      owned_keys=owned_keys, owned_index=owned_index, owned_slots=owned_slots, rows_out=rows_out)
        if every_counts is not None:  # floats each requester sends each owner (row gradients), = rows back, transposed
            routed["float_counts"] = tf.reduce_sum(every_counts * dims, 2)
        return routed

    def fetch_rows(self, requests, layers, routed, training):
        """Stage 2: the owners look their ids up (a new id: the row its update will insert)
        and one alltoall brings the rows back, as one flat float buffer with each id's row (its
        table's width) in the place of the id. Returns (each request's embeddings, what the
        backward pass needs)."""
        coll, name = self.collectives, _exchange_name(layers)
        table_of = {id(layer): t for t, layer in enumerate(layers)}
        rows = [tf.reshape(tf.gather(layer.tables[0].lookup(routed["owned_keys"][t], training),
                                     routed["owned_index"][t]), [-1]) for t, layer in enumerate(layers)]
        float_counts = routed.get("float_counts")
        flat_rows, rows_in = coll.alltoall(
            to_wire(tf.dynamic_stitch([tf.reshape(s, [-1]) for s in routed["owned_slots"]], rows), self.wire_dtype),
            routed["rows_out"], f"{name}_rows", count=training,
            all_splits=None if float_counts is None else tf.transpose(float_counts))
        flat_rows = from_wire(flat_rows, self.wire_dtype)
        embeddings, start = [], [0] * len(layers)
        for layer, keys, row_splits in requests:
            t = table_of[id(layer)]
            n = tf.size(keys)
            index = routed["unique_index"][t][start[t]:start[t] + n]
            per_key = tf.gather(flat_rows, tf.gather(routed["unique_slots"][t], index))
            start[t] += n
            embeddings.append(layer._combine(per_key, keys, row_splits))  # pylint: disable=protected-access
        route = dict(routed, rows_in=rows_in, float_counts=float_counts, name=name)
        return embeddings, route

    def _route_gradients(self, requests, layers, upstream, route):
        """The requests' row gradients -> their owners in one alltoall (the rows' way back) ->
        summed over the workers per owned id: one IndexedSlices per layer's anchor."""
        table_of = {id(layer): t for t, layer in enumerate(layers)}
        per_key = [[] for _ in layers]
        for (layer, _, row_splits), up in zip(requests, upstream):
            up = tf.cast(tf.convert_to_tensor(up), tf.float32)
            per_key[table_of[id(layer)]].append(
                tf.reshape(layer._per_key_gradient(up, row_splits), [-1, layer.dim]))  # pylint: disable=protected-access
        unique_grads = [ops().ttf_embedding_grad(tf.concat(per_key[t], 0), route["unique_index"][t],
                                                 route["unique_keys"][t]) for t in range(len(layers))]
        flat = tf.dynamic_stitch([tf.reshape(s, [-1]) for s in route["unique_slots"]],
                                 [tf.reshape(g, [-1]) for g in unique_grads])
        received, _ = self.collectives.alltoall(to_wire(flat, self.wire_dtype), route["rows_in"],
                                                f"{route['name']}_grads", all_splits=route["float_counts"], count=True)
        received = from_wire(received, self.wire_dtype)
        grads = []
        for keys_t, index_t, slots_t in zip(route["owned_keys"], route["owned_index"], route["owned_slots"]):
            # Sum each owned id's gradient over the workers; / size averages like the dense allreduce.
            summed = tf.math.unsorted_segment_sum(tf.gather(received, slots_t), index_t, tf.size(keys_t))
            grads.append(tf.IndexedSlices(summed / self.size, keys_t))
        return grads

    # -- checkpoints: each worker writes and reads its own part

    def note_restore(self, layer):
        """Counts restores of `layer` on this worker (broadcast_variables checks every worker restored)."""
        self._restores[layer.name] = self._restores.get(layer.name, 0) + 1

    def export_table(self, layer, since_step=None, reset_deleted=False):
        """The logical table of `layer` (every worker's ids), for tf.saved_model.save's refusal,
        export_for_serving and model.save: gathered now (a collective). A sharded checkpoint
        does not come here: each worker writes its own part."""
        return self.gather_export(layer, since_step, reset_deleted)

    def import_table(self, layer, tensors):
        """Restores this worker's part of a logical table written by any topology (a full
        export or a delta): the ids it owns (shard_of(id, size) == rank), filtered by the
        import op itself."""
        self.note_restore(layer)
        return layer.tables[0].restore(tensors, num_partitions=self.size, partition=self.rank)

    def gather_export(self, layer, since_step=None, reset_deleted=False):
        """The logical table of `layer` (a delta since table step since_step, with every
        worker's deleted ids): every worker's export concatenated (a collective: every worker
        must call it, in the same order of layers)."""
        if not tf.executing_eagerly():  # a SavedModel or a traced function would hold a collective op
            raise ValueError(
                f"{layer.name} is sharded over {self.size} {self.collectives.workers_name}: its export gathers every "
                f"worker's ids (a collective) and cannot be traced into a graph. {self.collectives.export_hint}")
        local = layer.tables[0].export(since_step, reset_deleted)
        gathered = dict(local)
        with self.collectives.guard(f"gathering {layer.name} (model.save, export_for_serving)"):
            for field in ("keys", "values", "meta", "candidate_keys", "candidate_meta", "deleted_keys"):
                if field in local:
                    gathered[field] = self.collectives.allgather(local[field], f"ttf_{layer.name}_export_{field}")
        return gathered


def shard_tables(model, collectives, compression="none", group=None, make_sharding=None):
    """Shards every ttf table of `model` over the workers of `collectives` (create it before
    the model). Returns the sharded layers. A layer already sharded over parameter servers
    (shard_devices) cannot also be sharded over workers. A functional tf_keras model makes
    one exchange per step for all its tables (Keras 2 or 3); a subclassed model one per table.
    (group, make_sharding: a backend's own grouping function and TableSharding maker.)"""
    layers = tables_in(model)
    if not layers:
        raise ValueError(f"{model.name} has no ttf embedding layer (ttf.FusedEmbedding / ttf.DynamicEmbedding) "
                         "to shard")
    sharding = make_sharding() if make_sharding is not None else TableSharding(collectives, compression)
    for layer in layers:
        if len(layer.tables) != 1:
            raise ValueError(f"{layer.name} is sharded over {len(layer.tables)} devices (shard_devices); "
                             f"to shard it over {collectives.workers_name}, build it without shard_devices")
        layer.sharding = sharding  # its export_table/import_table now gather / keep this worker's ids
        if tf.executing_eagerly() and int(layer.tables[0].size()) > 0:
            # Rows already there (ttf.accelerate's, a restore before sharding): keep the owned ones.
            sharding.import_table(layer, layer.tables[0].export())
    grouped = (group or _group_lookups)(model, sharding)
    apart = [layer.name for layer in layers if id(layer) not in grouped]
    if len(layers) > 1 and apart:
        warnings.warn(
            f"ttf: {len(apart)} of the {len(layers)} ttf tables of {model.name} ({', '.join(apart)}) each make "
            "their own exchange per step, since they are not called at the top level of a functional model "
            "(subclassed or nested models): more, smaller alltoalls. Build the model functionally to exchange "
            "every table's ids, rows and gradients in one alltoall each.", stacklevel=2)
    return layers


def _checked_against(requests, layers, routed):
    """`requests` with their keys made to wait for a check that `routed` (route_ids' output)
    routed as many ids of each table as they hold."""
    held = [0] * len(layers)
    table_of = {id(layer): t for t, layer in enumerate(layers)}
    for layer, keys, _ in requests:
        held[table_of[id(layer)]] += tf.size(keys)
    checks = [tf.debugging.assert_equal(tf.size(routed["unique_index"][t]), held[t], message=(
        f"ttf: the ids routed ahead for {layer.name} are not this batch's (a pipelined step fed another batch); "
        "report this as a ttf bug")) for t, layer in enumerate(layers)]
    with tf.control_dependencies(checks):
        return [(layer, tf.identity(keys), row_splits) for layer, keys, row_splits in requests]


class Grouping:
    """A model's ttf lookups made as one exchange: the ttf layer calls one call of `model`
    makes, and the call that exchanges all their ids at once (install).

    The calls' ids are known before the model runs in one of two ways: a functional model's
    sub-model from its inputs to those ids (`ids_model`, `ids_structure`: the layers' calls in
    the order the graph runs them), or, for any other model (subclassed, or a wrapper such as a
    job's `forward`), a recording pass of its own call in which each ttf lookup notes its ids
    and returns zeros: only the ids are used, so TensorFlow prunes the rest of that pass."""

    def __init__(self, model, sharding, layers, ids_model=None, ids_structure=None):
        self.model, self.sharding, self.layers = model, sharding, layers
        self.ids_model, self.ids_structure = ids_model, ids_structure
        self.every_call = False  # True once installed for every call, not for pipelined calls only
        self._call = None  # the model's own call, once install replaced it

    def requests(self, inputs, training):
        """{trains: [(layer, keys, row_splits)]} of one call on `inputs`: a frozen table takes
        part in a find-only exchange."""
        if self.ids_model is None:
            noted = self._recorded(inputs, training)
        else:
            flat_ids = self.ids_model(inputs, training=training)
            ids = tf.nest.pack_sequence_as(self.ids_structure, flat_ids if isinstance(flat_ids, list) else [flat_ids])
            noted = [(layer, *layer.keys_of(x), layer.trains(training)) for layer, x in zip(self.layers, ids)]
        groups = {}
        for layer, keys, row_splits, flag in noted:
            groups.setdefault(flag, []).append((layer, keys, row_splits))
        return {flag: groups[flag] for flag in sorted(groups)}

    def route_ids(self, inputs, training):
        """Stage 1 of the exchange of a call on `inputs` (ids to their owners): {trains: routing}."""
        return {flag: self.sharding.route_ids(chosen, _distinct(chosen), flag)
                for flag, chosen in self.requests(inputs, training).items()}

    def install(self, every_call=False):
        """Replaces the model's call by the grouped call (once). every_call: every call then
        exchanges once; else only calls with a pipelined step's routing (sharding.prefetched),
        the others run the model's own call."""
        self.every_call = self.every_call or every_call
        if self._call is None:
            self._call = self.model.call
            self.model.call = self._grouped_call  # Keras calls self.call

    def _grouped_call(self, inputs, *args, **kwargs):
        routed = self.sharding.prefetched  # a pipelined step's routing of these inputs' ids, or None
        if (any(layer._serving_table is not None for layer in self.layers)  # pylint: disable=protected-access
                or (routed is None and not self.every_call) or self.sharding.recording is not None):
            # export_for_serving is tracing (no exchange), or an outer Grouping records the lookups
            return self._call(inputs, *args, **kwargs)
        queues = {}
        for flag, chosen in self.requests(inputs, kwargs.get("training", args[0] if args else None)).items():
            ahead = {} if routed is None else {"routed": routed[flag]}  # (a wrapped exchange may take 2 arguments)
            for (layer, keys, _), embeddings in zip(chosen, self.sharding.exchange(chosen, flag, **ahead)):
                queues.setdefault(id(layer), []).append((flag, keys.shape, embeddings))
        outer, self.sharding._grouped = self.sharding._grouped, queues  # pylint: disable=protected-access
        try:
            return self._call(inputs, *args, **kwargs)
        finally:
            self.sharding._grouped = outer  # pylint: disable=protected-access

    def _recorded(self, inputs, training):
        """[(layer, keys, row_splits, trains)] of the model's ttf lookups in one call on
        `inputs`, from a pass of its own call (traced: the pass must change no state, since it
        runs beside the real call)."""
        call = self._call or self.model.call
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        before = len(graph.get_operations()) if graph is not None else 0
        outer, self.sharding.recording = self.sharding.recording, []
        try:
            call(inputs, training=training)
            noted = self.sharding.recording
        finally:
            self.sharding.recording = outer
        changing = sorted({op.type for op in (graph.get_operations()[before:] if graph is not None else [])
                           if op._is_stateful and op.type not in _READS})  # pylint: disable=protected-access
        if changing:
            raise ValueError(f"{self.model.name}: its call changes state ({', '.join(changing)}: dropout, a batch "
                             "norm's statistics, ...), so its ttf lookups' ids cannot be computed ahead by running "
                             "it twice; build it functionally (its ids then come from a sub-model), or drop pipeline")
        return noted

    @classmethod
    def recorded(cls, model, sharding):
        """The Grouping of any model's lookups, found by a recording pass of its call."""
        return cls(model, sharding, tables_in(model))


_READS = {"ReadVariableOp", "VarHandleOp", "Assert", "PrintV2", "NoOp"}  # stateful ops that change nothing


def _distinct(requests):
    return list({id(layer): layer for layer, _, _ in requests}.values())


def _group_lookups(model, sharding):
    """Makes a functional model (Keras 2 or 3, or a Sequential) look up all its ttf tables in
    one exchange: each call first computes the ids of every ttf layer call (a sub-model from
    the inputs to those ids), exchanges them all at once, and the layers then take their rows
    from that exchange. Returns the ids of the grouped layers (none for a subclassed model,
    or one ttf call). A model with one ttf call keeps its layer's own exchange, but gets its
    Grouping too (sharding.grouping): a pipelined step routes the next batch's ids with it."""
    functional = _graph.functional(model)
    if functional is None:
        return set()
    by_depth = _graph.nodes_by_depth(functional)
    nodes = [node for depth in sorted(by_depth, reverse=True) for node in by_depth[depth]  # the order the graph runs
             if not node.is_input and isinstance(_graph.layer(node), DynamicEmbedding)
             and _graph.layer(node).sharding is sharding]
    if not nodes:
        return set()
    layers = [_graph.layer(node) for node in nodes]
    ids_structure = [_graph.first_argument(node, "ids") for node in nodes]
    try:
        if any(ids is None for ids in ids_structure):
            raise ValueError("a ttf layer was called without its ids as the first argument")
        ids_model = tf.keras.Model(_graph.structures(functional)[0], tf.nest.flatten(ids_structure),
                                   name=f"{model.name}_ttf_ids")
    except (ValueError, TypeError) as err:
        if len(nodes) > 1:
            warnings.warn(f"ttf: cannot group the ttf lookups of {model.name} into one exchange ({err}); "
                          "each table makes its own", stacklevel=3)
        return set()
    sharding.grouping = Grouping(functional, sharding, layers, ids_model, ids_structure)
    if len(layers) == 1:
        # One ttf call keeps its layer's own exchange and Keras' own call until a pipelined
        # step installs the grouped call (its calls then take the routing): with the call
        # replaced, a one-table model's eager call after a Horovod serving export ran a graph
        # traced by the export (test_horovod_misuse).
        return set()
    sharding.grouping.install(every_call=True)  # this model's calls exchange once
    return {id(layer) for layer in layers}


def table_size(model, collectives):
    """Ids stored over all workers, summed over the model's ttf tables (a collective)."""
    local = tf.add_n([tf.cast(layer.size(), tf.int64) for layer in tables_in(model)])
    with collectives.guard("table_size"):
        return int(collectives.allreduce(local, "sum", "ttf_table_size"))


def broadcast_variables(variables, collectives, root=0):
    """Worker `root`'s values of `variables` (e.g. model.variables after building) everywhere.
    ttf tables are not variables and are not broadcast: each worker owns its own ids.

    Raises:
      CollectiveMisuseError (on every worker): a sharded table among `variables` was restored
        on some workers only ("restore on worker 0, then broadcast" would keep the ids worker
        0 owns, 1/N of the table). Restore the checkpoint on every worker instead: each keeps
        the ids it owns.
    """
    variables = list(variables)
    layers = {}
    for variable in variables:
        layer = embedding_of(variable)
        if layer is not None and getattr(layer, "sharding", None) is not None:
            layers[layer.name] = layer
    who = collectives.workers_name
    if layers:
        with collectives.guard("broadcast_variables"):
            counts = collectives.allgather_object({name: layer.sharding._restores.get(name, 0)  # pylint: disable=protected-access
                                                   for name, layer in sorted(layers.items())}, "ttf_restore_counts")
        uneven = sorted(name for name in layers if len({c.get(name) for c in counts}) > 1)
        if uneven:
            restored_on = [rank for rank, c in enumerate(counts) if c.get(uneven[0])]
            raise CollectiveMisuseError(
                f"ttf: {', '.join(uneven)} was restored on {who} {restored_on} only, then broadcast: a table sharded "
                f"over {who} keeps on each only the ids it owns, and broadcast_variables cannot "
                "send rows (tables are not variables), so 1/N of the table would survive. Restore the checkpoint "
                "everywhere (each keeps the ids it owns), then broadcast the dense variables.")
    with collectives.guard("broadcast_variables"):
        collectives.broadcast_variables(variables, root)


def allreduce_dense(grads, collectives, compression="none", name="ttf_dense"):
    """Averages a list of dense gradient tensors over the workers, fused into one buffer.

    float32: one allreduce. 16-bit: a reduce-scatter (alltoall of the 16-bit buffer, summed
    in float32 by each slice's owner) then an allgather of the 16-bit sums: the bytes of a
    ring allreduce in 16 bits, without summing in 16 bits."""
    dtype = wire_dtype(compression)
    size = collectives.size
    if not grads:
        return []
    flat = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in grads], 0)
    n = int(flat.shape[0])
    if dtype == tf.float32:
        reduced = collectives.allreduce(flat, "mean", f"{name}_allreduce", count=True)
    else:
        chunk = -(-n // size)
        padded = tf.pad(flat, [[0, chunk * size - n]])
        received = collectives.alltoall_even(to_wire(padded, dtype), f"{name}_reduce_scatter", count=True)
        mine = tf.reduce_sum(tf.reshape(from_wire(received, dtype), [size, chunk]), 0) / size
        reduced = from_wire(collectives.allgather(to_wire(mine, dtype), f"{name}_allgather", count=True,
                                                  same_shape=True), dtype)[:n]
    out, offset = [], 0
    for g in grads:
        count = int(tf.size(g)) if g.shape.num_elements() is None else g.shape.num_elements()
        out.append(tf.cast(tf.reshape(reduced[offset:offset + count], tf.shape(g)), g.dtype))
        offset += count
    return out


def DistributedOptimizer(optimizer, collectives, compression="none"):  # noqa: N802 (named like hvd.DistributedOptimizer)
    """Wraps a ttf (or Keras) optimizer for a synchronous job: apply_gradients averages the
    dense gradients over the workers (one fused allreduce) and hands ttf table gradients,
    which the sharded lookup has already summed on their owners, to the fused table update.
    Works with model.compile/fit and with tape.gradient + apply_gradients."""
    wire_dtype(compression)
    base = type(optimizer)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        if KERAS3 and not self.built:
            # Keras 3 makes its slots in the first traced step, and TensorFlow then runs that
            # step through a conditional initialisation that cannot feed the collectives'
            # per-call instance keys: make them now, outside the function.
            with tf.init_scope():
                self.build([v for _, v in grads_and_vars])
        dense = [i for i, (g, v) in enumerate(grads_and_vars) if g is not None and embedding_of(v) is None]
        for i in dense:
            if isinstance(grads_and_vars[i][0], tf.IndexedSlices):
                raise TypeError(f"{grads_and_vars[i][1].name} has a sparse gradient: in a synchronous job, use ttf "
                                "embedding layers for sparse features")
        # A gradient has its variable's shape; stated, so that the fused buffer's size is static.
        reduced = allreduce_dense([tf.ensure_shape(grads_and_vars[i][0], grads_and_vars[i][1].shape) for i in dense],
                                  collectives, compression)
        for i, g in zip(dense, reduced):
            grads_and_vars[i] = (g, grads_and_vars[i][1])
        return base.apply_gradients(self, grads_and_vars, *args, **kwargs)

    cls = type(base.__name__, (base,), {"apply_gradients": apply_gradients, "__module__": base.__module__})
    object.__setattr__(optimizer, "__class__", cls)  # same state and config; only apply_gradients changes
    return optimizer


__all__ = ["DistributedOptimizer", "Grouping", "TableSharding", "allreduce_dense", "broadcast_variables", "shard_tables",
           "table_size"]
