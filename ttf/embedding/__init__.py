"""Dynamic hash-table embeddings: the table resource and the Keras layers over it (FusedLookup:
what ttf.accelerate turns a model's Keras Embeddings into)."""
from ttf.embedding._event_ttl import EventTimeTTL
from ttf.embedding._fused_lookup import FusedLookup, TableLookup
from ttf.embedding._layers import DynamicEmbedding, FusedEmbedding, embedding_of, tables_in
from ttf.embedding._logical import merge_exports, shard_of, table_summary
from ttf.embedding._table import EmbeddingTable, RowInitializer, parse_capacity, parse_size, tier_row_bytes
from ttf.embedding._table_config import TableConfig

__all__ = ["DynamicEmbedding", "EventTimeTTL", "EmbeddingTable", "FusedEmbedding", "FusedLookup", "RowInitializer",
           "TableConfig", "TableLookup", "embedding_of", "merge_exports", "parse_capacity", "parse_size", "shard_of",
           "table_summary", "tables_in", "tier_row_bytes"]
