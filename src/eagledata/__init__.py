"""eagledata: token-faithful EAGLE-3 drafter training data from an SGLang server (bf16 KV only)."""

import logging as _logging

__version__ = "0.1.0"

# A library logs, the application decides where: nothing reaches stderr from eagledata's loggers
# unless a handler is added (a session adds its run directory's run.log, rundir/runlog.py).
_logging.getLogger("eagledata").addHandler(_logging.NullHandler())
