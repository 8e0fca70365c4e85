"""The one exception tree of eagledata.

Two families matter to the pipeline:

* ``ItemError`` and its children concern one (prompt, sample) pair. They never stop a run: the
  item is retried (``RetryableItemError``) or lands in the failure file with ``reason``.
* Every other ``EagledataError`` is fatal to the run. The CLI prints ``str(error)`` as one line on
  stderr and exits non-zero; everything already committed stays committed and the run resumes.

Outside exceptions (httpx, OSError, pydantic, datasets) are translated into this tree at the module
that talks to the outside world; nothing above that module sees them.
"""

from __future__ import annotations


class EagledataError(Exception):
    """Base of every error eagledata raises on purpose. ``str()`` is one line naming the fix."""

    exit_code = 1

    def naming_run_dir(self, path: object) -> EagledataError:
        """Put the real run directory where a message says ``RUN_DIR`` (errors raised below the
        pipeline do not know it), so the fix can be pasted as it is."""
        self.args = (str(self).replace("RUN_DIR", str(path)),)
        return self


# --- fatal to the run -----------------------------------------------------------------------


class ConfigError(EagledataError):
    """A config file or flag is invalid. The message lists one ``key.path: problem`` per line."""

    exit_code = 2


class DatasetError(EagledataError):
    """The dataset as a whole cannot be read: unknown name, missing file, unreadable format."""

    exit_code = 2


class TokenizerError(EagledataError):
    """The tokenizer or its chat template cannot be loaded or used."""

    exit_code = 2


class ServerError(EagledataError):
    """The server cannot be used for this run."""

    exit_code = 3


class ServerUnavailableError(ServerError):
    """No server answered within the configured deadline. The run is resumable."""


class ServerRefusedError(ServerError):
    """A server failed a check (KV cache dtype, model): nothing it produced may land."""

    exit_code = 4


class CanaryDriftError(ServerRefusedError):
    """The logprob canary says a server no longer computes what the baseline did (quality/)."""


class BaselineChangedError(ServerRefusedError):
    """The server changed while the canary's baseline was being measured: the baseline would
    have learned the change as noise, so it is refused (quality/canary_selfcheck.py)."""


class RunDirError(EagledataError):
    """The run directory cannot be used: other schema, changed settings, locked, unwritable."""

    exit_code = 5


class StorageError(RunDirError):
    """Writing to the run directory failed (disk full, permissions). Committed data is intact."""


class LaunchError(EagledataError):
    """launch-server refused or failed to start the server."""

    exit_code = 6


class UsageError(EagledataError):
    """The library was called in a way that cannot work (``regenerate`` inside a running event
    loop: ``await aregenerate`` there instead)."""

    exit_code = 2


class NothingWrittenError(EagledataError):
    """A run's plan finished and every item failed: not one record was written."""

    exit_code = 7


class ExportError(EagledataError):
    """``eagledata export`` cannot run as asked: bad option, unusable output path, no tokenizer."""

    exit_code = 2


# --- per item: never fatal ------------------------------------------------------------------


class ItemError(EagledataError):
    """One item failed. ``reason`` is the short cause written to the failure file."""

    reason = "error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class BadRowError(ItemError):
    """A dataset row cannot be turned into a prompt (malformed, empty, unknown role, ...)."""

    reason = "bad_row"


class PromptTooLongError(ItemError):
    """The templated prompt exceeds the server's ``max_req_input_len`` or the configured cap."""

    reason = "prompt_too_long"


class RejectedRequestError(ItemError):
    """The server refused the request itself (HTTP 400): retrying cannot help."""

    reason = "rejected"


class ContractViolationError(ItemError):
    """The response broke the token contract (counts mismatch, unknown finish reason)."""

    reason = "contract_violation"


class RetryableItemError(ItemError):
    """A transient failure of one attempt: connect error, reset, 5xx, 503, timeout, 200+abort."""

    reason = "transient"
    server: str | None = None
    """The server the attempt went to (set by the client): was it the item, or the server?"""
