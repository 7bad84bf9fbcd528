"""Data preparation: any data source in, a prepared dataset (Parquet + metadata.json) out."""

from ampbench.data.dataset import prepare_dataset
from ampbench.data.sources import SourceOptions

__all__ = ["SourceOptions", "prepare_dataset"]
