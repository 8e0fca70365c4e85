"""A prefix cache for the simulated server: what SGLang's radix cache does to ``cached_tokens``.

Every request's prompt is inserted once the scheduler has taken it (SGLang inserts a prompt into
the radix tree once its prefill is done; a ``max_new_tokens: 0`` request is a prefill and nothing
else, which is how a client warms a prompt). A request refused with 503 ("the request queue is
full") never reaches the tree, so its retry is not cheaper. A later prompt that starts with a
cached one reports the matched length as ``cached_tokens``. Matching follows SGLang 0.5.9
(docs/sglang.md, "Teacher-forced logprobs and the prefix cache"):

* it is capped at ``len(input_ids) - 1`` (the last token is always computed), and
* with ``return_logprob`` at ``logprob_start_len``: the tokens whose logprobs are asked for are
  always computed, never taken from the cache.

With several DP ranks (``dp_size`` > 1, attention ranks or replicas) each rank has a cache of its
own, as each of SGLang's DP schedulers has its own radix tree; a request goes to its
``data_parallel_rank`` pin, else to the next rank round robin, the DP controller's default
(``--load-balance-method auto``, docs/sglang.md "DP ranks", S9
``managers/data_parallel_controller.py``). So a prompt warmed on one rank is cold on the others
(``requests.dispatch_rank``; a batch body goes to one rank here).

Prefixes are kept as hashes at every ``PAGE``-token boundary, least recently used evicted past
``MAX_PAGES``: memory stays bounded whatever the run.
"""

from __future__ import annotations

import hashlib
from array import array

PAGE = 16
MAX_PAGES = 1 << 20


class PrefixCache:
    def __init__(self) -> None:
        self._pages: dict[bytes, None] = {}

    def _boundaries(self, ids: list[int]) -> list[bytes]:
        """Hashes of ids[:PAGE], ids[:2*PAGE], ...: each chains the previous one."""
        keys, previous = [], b""
        for end in range(PAGE, len(ids) + 1, PAGE):
            chunk = array("q", ids[end - PAGE : end]).tobytes()
            previous = hashlib.blake2b(previous + chunk, digest_size=12).digest()
            keys.append(previous)
        return keys

    def match(self, ids: list[int], cap: int | None = None) -> int:
        """Cached tokens for this prompt (at most ``cap``); the cache is left as it was."""
        matched = 0
        for index, key in enumerate(self._boundaries(ids)):
            if key not in self._pages:
                break
            matched = (index + 1) * PAGE
        limit = len(ids) - 1 if cap is None else min(cap, len(ids) - 1)
        return max(0, min(matched, limit))

    def insert(self, ids: list[int]) -> None:
        """Remember a prompt the server took (or refresh it as most recently used)."""
        for key in self._boundaries(ids):
            self._pages.pop(key, None)
            self._pages[key] = None
        while len(self._pages) > MAX_PAGES:
            del self._pages[next(iter(self._pages))]

    def clear(self) -> None:
        self._pages.clear()
