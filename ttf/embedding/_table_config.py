"""TableConfig: a table's memory bounds (capacity and eviction, the DRAM + SSD tier), checked
when made, and whether they hold one training update's rows (`check_fits`)."""
import dataclasses
import os
import tempfile
from typing import Union

from ttf.embedding._table import check_rows, parse_capacity, parse_size, tier_row_bytes

EVICT_POLICIES = ("lru", "lfu", "ttl")


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """The bounds of every ttf table of a model (each process's shard of each table).

    Attributes:
      capacity: rows a shard keeps at most after an update, plus that update's new ids (an
        int; 0: unbounded), or bytes of rows with a unit ("512M", "2G": value, optimizer
        slots, metadata and index entry; not with dram_budget). Rows beyond it are evicted.
      evict_policy: "lru" (least recently updated first), "lfu" (fewest updates first) or
        "ttl" (every id not updated in ttl_steps steps; LRU above a capacity). With a
        dram_budget, also the order rows move to disk in.
      ttl_steps: steps without an update after which "ttl" evicts an id.
      dram_budget: bytes of DRAM rows a shard keeps (an int, or "2G"); the rest live in
        ssd_dir and come back when trained. 0: all in DRAM.
      ssd_dir: a writable directory for the disk tier (its files are unlinked caches).
      num_shards: lock shards inside each table shard (parallelism within one process; each
        must hold one row).
      rows: how rows are stored: "fp32", "bf16" or "int8", with optimizer slots to match
        (docs/table_rows.md); with dram_budget, the disk tier holds them as stored.

    Raises ValueError naming the field and the fix.

    Example:
      >>> config = TableConfig(capacity=1_000_000, evict_policy="lfu")
      >>> layer = ttf.FusedEmbedding(16, num_fields=26, **config.layer_options())  # doctest: +SKIP
    """

    capacity: Union[int, str] = 0
    evict_policy: str = "lru"
    ttl_steps: int = 0
    dram_budget: Union[int, str] = 0
    ssd_dir: str = ""
    num_shards: int = 16
    rows: str = "fp32"

    def __post_init__(self):
        if not isinstance(self.num_shards, int) or self.num_shards < 1:
            raise ValueError(f"num_shards must be an int >= 1, got {self.num_shards!r}")
        try:
            _, capacity_bytes = parse_capacity(self.capacity)
        except ValueError:
            raise ValueError(f"capacity must be rows (an integer >= 0, 0: unbounded) or bytes with a unit K, M, G or T "
                             f"(e.g. 512M, 2G), got {self.capacity!r}") from None
        if self.evict_policy not in EVICT_POLICIES:
            raise ValueError(f"evict_policy must be one of {EVICT_POLICIES}, got {self.evict_policy!r}")
        if (self.evict_policy == "ttl") != (self.ttl_steps > 0):
            raise ValueError("evict_policy ttl needs ttl_steps S > 0, and ttl_steps needs evict_policy ttl")
        try:
            budget = parse_size(self.dram_budget)
        except ValueError as err:
            raise ValueError(f"dram_budget: {err}") from None
        if bool(budget) != bool(self.ssd_dir):
            raise ValueError("dram_budget and ssd_dir go together: give both for a DRAM + SSD tier, or neither")
        check_rows(self.rows)
        if budget and capacity_bytes:
            raise ValueError(f"capacity {self.capacity} (bytes) with dram_budget: a tiered table's RAM is already "
                             "bounded by dram_budget; give capacity in rows to bound both tiers")
        if self.ssd_dir:
            try:
                os.makedirs(self.ssd_dir, exist_ok=True)
                tempfile.TemporaryFile(dir=self.ssd_dir).close()
            except OSError as err:
                raise ValueError(f"ssd_dir {self.ssd_dir} cannot be written ({err.strerror}); give a writable "
                                 "directory") from None

    @property
    def bounded(self):
        """True when the tables are capped, expire ids or keep rows on disk (compressed rows
        bound nothing)."""
        return bool(self.capacity or self.evict_policy == "ttl" or parse_size(self.dram_budget))

    def layer_options(self):
        """The keyword arguments of ttf.DynamicEmbedding / FusedEmbedding these bounds set."""
        return dict(capacity=self.capacity, evict_policy=self.evict_policy, ttl_steps=self.ttl_steps,
                    dram_budget=parse_size(self.dram_budget), ssd_dir=self.ssd_dir, num_shards=self.num_shards,
                    rows=self.rows)

    def check_fits(self, dim, num_slots, batch_rows, optimizer="the optimizer"):
        """Raises ValueError when a shard cannot hold what one update needs: a capacity in
        bytes below one row (with `num_slots` optimizer slots of `dim` floats) for each lock
        shard, or a dram_budget below one batch's `batch_rows` rows (each update's rows are in
        DRAM while it runs). A row counts fp32's bytes here: at most what a bf16 or int8 row
        takes, so a compressed table may be refused a budget it would just fit."""
        row_bytes = tier_row_bytes(dim, num_slots)
        _, capacity_bytes = parse_capacity(self.capacity)
        if capacity_bytes and capacity_bytes < self.num_shards * row_bytes:
            raise ValueError(
                f"capacity {self.capacity} ({capacity_bytes} bytes) is below one row for each of a table's "
                f"{self.num_shards} lock shards ({row_bytes} bytes a row with {optimizer}'s slots): give at least "
                f"{self.num_shards * row_bytes}")
        budget = parse_size(self.dram_budget)
        if budget and budget < batch_rows * row_bytes:
            raise ValueError(
                f"dram_budget {budget} bytes holds {budget // row_bytes} rows, below one batch's {batch_rows} "
                f"({row_bytes} bytes a row, counted as fp32's): give at least {batch_rows * row_bytes}")
