"""Acoustic Similarity Group tables: build them from embeddings, store, load, and coarse-grain with them."""

from asg_tables.build import build_asg
from asg_tables.table import ASGTable

__all__ = ["ASGTable", "build_asg"]
