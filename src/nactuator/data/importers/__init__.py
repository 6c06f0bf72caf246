"""Importers: NAD CSV folders (OMX, SO-101, Franka) and BAM XL330 JSON logs -> datasets.

One module per importer: ``nad`` (:func:`import_nad`, :func:`read_nad_csv`) and ``bam``
(:func:`import_bam`, :func:`read_bam_log`); ``common`` holds what they share. Raw register
units are converted to SI here, once, using the unit table in each platform's ``data:``
section (conf/platform/*.yaml). Every file is parsed and validated before the first byte is
written, so a bad file leaves the output dataset untouched. Each episode keeps its source
file's sha256 (``source_sha256``), so importing a file whose content is already in the
dataset is skipped and reported (``allow_duplicates=True`` imports it anyway).
"""

from nactuator.data.importers.bam import import_bam, read_bam_log
from nactuator.data.importers.nad import expand_header, import_nad, read_nad_csv

__all__ = ["expand_header", "import_bam", "import_nad", "read_bam_log", "read_nad_csv"]
