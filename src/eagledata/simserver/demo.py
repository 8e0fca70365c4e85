"""The demo's server: the bundled simulated server, started when the config asks for it
(``[server.simulated] enabled = true``, as ``configs/demo.toml`` does)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from eagledata.config import AppConfig, resolve_bundled
from eagledata.simserver.config import SimConfig
from eagledata.simserver.runner import SimServerThread


@contextlib.contextmanager
def simulated_server(config: AppConfig) -> Iterator[AppConfig]:
    """Start the bundled simulated server when the config asks for it (the demo)."""
    if not config.server.simulated.enabled:
        yield config
        return
    options = dict(config.server.simulated.options)
    options.setdefault("tokenizer_path", resolve_bundled(config.tokenizer.name))
    with SimServerThread(SimConfig(**options)) as sim:
        server = config.server.model_copy(update={"urls": [sim.url]})
        yield config.model_copy(update={"server": server})
