"""What the scheduler is fed: the plan's work, and each conversation's next turn once the turn
before it is committed (``turns = "all"``).

Turn k+1 of a conversation is built only from turn k's *committed* answer: its record written to
the run directory after the KV check and the canary released it (``committed``). Its messages
are turn k's, then turn k's answer as a chat client sends it back (``source/answers.py``), then
the next user message; its ids are the chat template applied to them, once. So no record lands
whose context holds an answer that did not land: a turn held when a canary drift stops the run
is dropped, and what would have been built on it is never sent; ``resume`` continues each
conversation from its last committed turn (the plan yields it as ``Answered``).

A turn that ends in the failure file ends its conversation: its later turns are written there
too, as ``previous_turn_failed`` (``resume --retry-failed`` tries them all again, in order). A
turn its server took down with it (given back by the holder) is sent again, before new work.

Conversations run in parallel, their turns in order. At most ``max_open`` conversations are open
at once (a turn queued, in flight, held, or its next turn being built): memory stays bounded, and
the bound leaves room for what the checks hold (``server.guard_max_held``) besides what is in
flight. When every open conversation waits on a held turn, the holder is asked for a round of
checks now (``HoldAndRelease.request_round``) instead of at its next period: at the tail of a run
there are not enough held results to make the checks due on their own.

Items of ``turns = "last"`` datasets pass straight through: nothing waits on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from eagledata.errors import ItemError
from eagledata.run.holding import HoldAndRelease
from eagledata.run.progress import Progress
from eagledata.run.scheduler import Scheduler
from eagledata.run.writer import FailureLog
from eagledata.rundir.records import failure_line, turn_id
from eagledata.server.responses import GenerateResult
from eagledata.source.answers import AnswerReader
from eagledata.source.conversations import turn_messages
from eagledata.source.tokenization import PromptTokenizer, check_length, check_size
from eagledata.source.workitem import PREVIOUS_TURN_FAILED, Answered, Outcome, WorkItem

PLAN_BATCH = 64
IDLE_CHECK_S = 1.0
"""How often a source with nothing to send looks again whether the session is stopping (a
commit, a failure or a given-back turn wakes it at once)."""


class TurnSource:
    """The scheduler's source for one session (see the module docstring)."""

    def __init__(
        self,
        plan: Iterator[WorkItem | Answered | Outcome],
        *,
        tokenizer: PromptTokenizer,
        failures: FailureLog,
        progress: Progress,
        scheduler: Scheduler[WorkItem],
        max_open: int,
        on_outcome: Callable[[], None],
        reasoning_field: bool = False,
    ) -> None:
        self.plan = plan
        self.reasoning_field = reasoning_field
        """Every answer sent back carries ``reasoning_content`` (``WorkPlan.reasoning_field``)."""
        self.tokenizer = tokenizer
        self.answers = AnswerReader(tokenizer.hf)
        self.failures = failures
        self.progress = progress
        self.scheduler = scheduler
        self.max_open = max_open
        self.on_outcome = on_outcome
        """Called for every failure-file entry written here (the session counts them)."""
        self.open = 0
        """Conversations not ended: a turn queued, in flight, held, or its next being built."""
        self.sent = 0
        """Turns of conversations handed to the scheduler and not yet handled by a sender."""
        self._ready: deque[Answered] = deque()
        self._resend: deque[WorkItem] = deque()
        self._plan_done = False
        self._round_asked = False
        self._wake = asyncio.Event()

    # --- what the session tells it ----------------------------------------------------------

    def committed(self, item: WorkItem, result: GenerateResult) -> None:
        """``item``'s record was written: build its conversation's next turn, or end it."""
        conversation = item.conversation
        if conversation is None:
            return
        if item.turn + 1 < conversation.turns:
            self._ready.append(
                Answered(item, result.output_ids, result.finish_reason, result.matched)
            )
        else:
            self.open -= 1
        self._changed()

    def failed(self, item: WorkItem) -> None:
        """``item`` ended in the failure file: so do its conversation's later turns."""
        conversation = item.conversation
        if conversation is None:
            return
        self._fail_later(item, item.turn + 1, "failed")
        self.open -= 1
        self._changed()

    def given_back(self, item: WorkItem) -> bool:
        """A held turn whose server went down before a check vouched for it: sent again. False
        for an item that is not a conversation's turn (the session generates it again later)."""
        if item.conversation is None:
            return False
        self._resend.append(item)
        self._changed()
        return True

    def wake(self) -> None:
        self._wake.set()

    def handler(
        self, send: Callable[[WorkItem], Awaitable[None]]
    ) -> Callable[[WorkItem], Awaitable[None]]:
        """``send`` for the scheduler, telling the source when a turn has been handled (held,
        failed or given back): it may be what every open conversation waits on."""

        async def handle(item: WorkItem) -> None:
            try:
                await send(item)
            finally:
                if item.conversation is not None:
                    self.sent -= 1
                    self._wake.set()

        return handle

    # --- what it yields ----------------------------------------------------------------------

    async def items(self, holder: HoldAndRelease[Any]) -> AsyncIterator[WorkItem]:
        """Given-back turns, then next turns, then the plan's new work; ends when the plan is
        read to its end and every conversation has ended (or the session stops). ``holder``
        holds the turns sent: asked for a round of checks when every open conversation waits
        on one of them."""
        while not self.scheduler.stopping:
            self._wake.clear()
            if self._resend:
                item = self._resend.popleft()
                self.sent += 1
                yield item
                continue
            if self._ready:
                answered = [self._ready.popleft() for _ in range(min(PLAN_BATCH, len(self._ready)))]
                for built in await asyncio.to_thread(self._next_turns, answered):
                    if isinstance(built, WorkItem):
                        self.sent += 1
                        yield built
                        continue
                    before, problem = built  # this turn cannot be sent: the conversation ends
                    self._fail_later(before.item, before.item.turn + 1, problem)
                    self.open -= 1
                continue
            if not self._plan_done and self.open < self.max_open:
                batch = await asyncio.to_thread(self._plan_batch)
                if not batch:
                    self._plan_done = True
                for entry in batch:
                    if isinstance(entry, Outcome):
                        self._write(entry)
                    elif isinstance(entry, Answered):
                        self.open += 1
                        self._ready.append(entry)
                    else:
                        if entry.conversation is not None:
                            self.open += 1
                            self.sent += 1
                        yield entry
                continue
            if self._plan_done and self.open <= 0:
                return
            if self.sent == 0 and holder.held and not self._round_asked:
                # every open conversation waits on a held turn: the checks, now
                self._round_asked = True
                holder.request_round("held")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_CHECK_S):
                    await self._wake.wait()

    def _plan_batch(self) -> list[WorkItem | Answered | Outcome]:
        return list(itertools.islice(self.plan, PLAN_BATCH))

    def _next_turns(self, batch: list[Answered]) -> list[WorkItem | tuple[Answered, ItemError]]:
        """Build each answered turn's next turn (in a worker thread: templating is CPU work;
        nothing is written from here). A turn that cannot be sent comes back with why."""
        built: list[WorkItem | tuple[Answered, ItemError]] = []
        for answered in batch:
            item = answered.item
            conversation = item.conversation
            assert conversation is not None
            turn = item.turn + 1
            try:
                messages = turn_messages(
                    item.messages, self._answer(answered), conversation.segment(turn)
                )
                check_size(messages, conversation.limit)
                input_ids = self.tokenizer.encode(messages, conversation.template_kwargs)
                check_length(input_ids, conversation.limit)
            except ItemError as exc:
                built.append((answered, exc))
                continue
            built.append(
                WorkItem(
                    turn_id(conversation.conversation_id, turn),
                    item.row_id,
                    item.sample,
                    messages,
                    input_ids,
                    dataset=item.dataset,
                    params=item.params,
                    prompt_key=item.prompt_key,
                    turn=turn,
                    conversation=conversation,
                    row_hash=item.row_hash,
                )
            )
        return built

    def _answer(self, answered: Answered) -> dict[str, str]:
        parts = self.answers.split(
            answered.item.input_ids,
            answered.output_ids,
            answered.finish_reason,
            answered.matched,
        )
        return parts.message(reasoning_field=self.reasoning_field)

    def _fail_later(self, item: WorkItem, start: int, problem: ItemError | str) -> None:
        """Failure-file entries for turns ``start``.. of ``item``'s conversation: the first
        with ``problem``'s own reason when it is an ``ItemError`` (that turn could not be sent),
        the others because the turn before them ended without a record."""
        conversation = item.conversation
        assert conversation is not None
        for turn in range(start, conversation.turns):
            if isinstance(problem, ItemError) and turn == start:
                reason, message = problem.reason, str(problem)
            else:
                failed = start if isinstance(problem, ItemError) else start - 1
                reason = PREVIOUS_TURN_FAILED
                message = f"not sent: turn {failed} of the conversation ended without a record"
            entry = failure_line(
                item_id=turn_id(conversation.conversation_id, turn),
                dataset=item.dataset,
                row_id=item.row_id,
                sample=item.sample,
                reason=reason,
                message=message,
                attempts=0,
                prompt_key=item.prompt_key,
            )
            self._write(Outcome(entry))

    def _write(self, outcome: Outcome) -> None:
        self.failures.write(outcome.entry)
        self.on_outcome()
        self.progress.advance()

    def _changed(self) -> None:
        self._round_asked = False
        self._wake.set()
