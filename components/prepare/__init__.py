"""The prepare step: any data source in, a prepared dataset (Parquet + metadata.json) out."""

from ampbench.components.prepare.dataset import prepare_dataset
from ampbench.components.prepare.sources import SourceOptions

__all__ = ["SourceOptions", "prepare_dataset"]
