"""Dynamic hash-table embeddings: the table resource and the Keras layers over it."""
from ttf.embedding._layers import DynamicEmbedding, FusedEmbedding, embedding_of, shard_of
from ttf.embedding._table import EmbeddingTable, RowInitializer

__all__ = ["DynamicEmbedding", "EmbeddingTable", "FusedEmbedding", "RowInitializer", "embedding_of", "shard_of"]
