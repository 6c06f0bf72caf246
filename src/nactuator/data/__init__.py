"""nactuator.data: nactuator datasets on disk, importers, dataset info and the training DataModule.

Only the format (writer/reader) is imported here, so recorders and synth pay nothing for
Lightning/torch. Import ``nactuator.data.datamodule`` for :class:`NADDataModule`,
``nactuator.data.importers`` for the NAD/BAM importers, ``nactuator.data.info`` for
``describe``.
"""

from nactuator.data.reader import read_dataset
from nactuator.data.schema import FEATURES, REQUIRED_KEYS, SPLITS, DataFormatError, Dataset, Episode
from nactuator.data.writer import DatasetWriter

__all__ = [
    "FEATURES",
    "REQUIRED_KEYS",
    "SPLITS",
    "DataFormatError",
    "Dataset",
    "DatasetWriter",
    "Episode",
    "read_dataset",
]
