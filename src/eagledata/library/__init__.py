"""The Python API a training process calls: regenerate rounds of fresh samples of the same
prompts, read them back typed or as a ``datasets.Dataset`` (docs/library.md).

``regenerate``/``aregenerate`` (``calls.py``) run one round as ``eagledata generate`` does, into
``OUT/round-NNNN`` (``source.py``), embedded in the caller's process; ``records``/``dataset``
(``reading.py``) read rounds back; ``RunSummary`` (``summary.py``) is what a call returns.
"""

from eagledata.library.calls import aregenerate, regenerate
from eagledata.library.reading import dataset, records, rounds
from eagledata.library.summary import RunSummary
from eagledata.run.embedded import ProgressEvent

__all__ = [
    "ProgressEvent",
    "RunSummary",
    "aregenerate",
    "dataset",
    "records",
    "regenerate",
    "rounds",
]
