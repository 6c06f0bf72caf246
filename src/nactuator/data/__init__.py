"""nactuator.data: NAD shards on disk, importers, dataset info and the training DataModule.

Only the format (writer/reader) is imported here, so recorders and synth pay nothing for
Lightning/torch. Import ``nactuator.data.datamodule`` for :class:`NADDataModule`,
``nactuator.data.importers`` for the NAD/BAM importers, ``nactuator.data.info`` for
``describe``.
"""

from nactuator.data.format import (
    FEATURES,
    REQUIRED_KEYS,
    SPLITS,
    DataFormatError,
    Dataset,
    DatasetWriter,
    Episode,
    read_dataset,
)

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
