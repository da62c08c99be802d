"""Data: readers (one per raw format) -> canonical frame -> preprocess -> ``SeqData`` (DESIGN.md
"Data protocol"). Entry points: ``dataset_config(name)`` and ``load_dataset(cfg)``."""
from bftrec.data.config import DatasetConfig, ExpectedStats, SyntheticConfig
from bftrec.data.datasets import (
    dataset_config,
    dataset_names,
    download,
    load_dataset,
    verify_checksum,
)
from bftrec.data.preprocess import SeqData, SplitView, preprocess
from bftrec.data.readers import READERS, DataFormatError

__all__ = [
    "READERS", "DataFormatError", "DatasetConfig", "ExpectedStats", "SeqData", "SplitView",
    "SyntheticConfig", "dataset_config", "dataset_names", "download", "load_dataset",
    "preprocess", "verify_checksum",
]
