"""Acoustic Similarity Group tables: build them from embeddings, store, load, and coarse-grain with them."""

from pcgtts.asg_tables.build import build_asg
from pcgtts.asg_tables.table import ASGTable

__all__ = ["ASGTable", "build_asg"]
