"""What one session does with each work item: sends it (``ItemSender``), feeds the plan's
conversations turn by turn (``TurnSource``), writes a result every check vouched for, gives back
one whose server went down, and watches for a stall (``Watchdog``).
"""

from __future__ import annotations

import asyncio

from eagledata.run.attempts import ItemSender
from eagledata.run.records import ExaminedAnswer, record_of
from eagledata.run.session_base import RunBase
from eagledata.run.session_state import SessionParts
from eagledata.run.signals import (
    write_task_dump,
)
from eagledata.run.turns import TurnSource
from eagledata.run.watchdog import Watchdog, watchdog_bound, where_it_waits
from eagledata.server.responses import GenerateResult
from eagledata.source.workitem import WorkItem
from eagledata.source.workplan import WorkPlan


class SessionItems(RunBase):
    """A session's handling of its work items (``RunBase`` holds the state)."""

    async def _turn_source(self, parts: SessionParts) -> TurnSource:
        """The plan of this session, and what feeds it to the scheduler with each
        conversation's next turns (run/turns.py)."""
        assert parts.tokenizer is not None
        config = self.config
        done = parts.files.totals.done_ids
        state = await asyncio.to_thread(self.plan_state.finish, done)
        parts.plan = WorkPlan(
            self.mix,
            generation=config.generation,
            template_kwargs=config.tokenizer.chat_template_kwargs,
            row_limit=config.run.limit,
            tokenizer=parts.tokenizer,
            limit=parts.limit,
            done=done,
            state=state,
        )
        return TurnSource(
            parts.plan,
            tokenizer=parts.tokenizer,
            failures=parts.files.failures,
            progress=parts.bar,
            scheduler=parts.scheduler,
            holder=parts.holder,
            # room for what is in flight and what the checks hold
            max_open=self._ceiling() + config.server.guard_max_held,
            on_outcome=self._count_failure,
            reasoning_field=parts.plan.reasoning_field,
        )

    def _give_back(self, parts: SessionParts, item: WorkItem) -> None:
        """A held result whose server went down: a conversation's turn is sent again at once,
        anything else once this pass of the plan is done."""
        if self.turns is None or not self.turns.given_back(item):
            parts.redo.append(item)

    def _watchdog(self, parts: SessionParts) -> Watchdog:
        """Says where the run waits when it stops progressing (run/watchdog.py)."""
        bound = watchdog_bound(self.config)
        holder = parts.holder

        def report(idle_s: float, where: str) -> None:
            dump = write_task_dump(self.run_dir.path, "stalled")
            stacks = f"; every task's stack is in {dump}" if dump is not None else ""
            parts.bar.note(
                f"warning: no progress for {idle_s:.0f} s (no answer, record or check; the "
                f"watchdog's bound is {bound:g} s): waiting on {where}{stacks}; the run goes on "
                f"(Ctrl-C stops it, 'eagledata resume {self.run_dir.path}' continues it)"
            )

        return Watchdog(
            bound,
            progress=lambda: (holder.progress, self.counts.failures, self.counts.records),
            where=lambda: where_it_waits(parts.client, holder, parts.scheduler.stats.in_flight),
            report=report,
        )

    def _sender(self, parts: SessionParts) -> ItemSender:
        server = self.config.server
        return ItemSender(
            client=parts.client,
            guard=parts.holder,
            failures=parts.files.failures,
            progress=parts.bar,
            policy=self.policy,
            sampling_params=self.sampling_params,
            down_deadline_s=server.down_deadline_s,
            on_failure=self._count_failure,
            load=parts.controller,
            stopped=parts.scheduler.stopped,
            examine=lambda item, result: self._examine(parts, item, result),
        )

    def _examine(
        self, parts: SessionParts, item: WorkItem, result: GenerateResult
    ) -> ExaminedAnswer:
        """What an answer's record says of it, read as it arrives (it decodes and re-encodes
        the answer: ``quality/flags.py``'s round trip)."""
        # results exist only when the plan had work
        assert parts.flagger is not None and self.turns is not None
        flags = parts.flagger.flags(
            input_ids=item.input_ids,
            output_ids=result.output_ids,
            finish_reason=result.finish_reason,
            matched=result.matched,
        )
        reasoning = self.turns.answers.reasoning_tokens(
            item.input_ids, result.output_ids, result.finish_reason, result.matched
        )
        return ExaminedAnswer(item, result, flags, reasoning)

    def _release(self, parts: SessionParts, answer: ExaminedAnswer) -> None:
        """A result every check vouched for: write it, count it."""
        assert self.turns is not None
        item, result = answer.item, answer.result
        parts.files.writer.write(record_of(answer))
        # committed: the conversation's next turn may be built on it now
        self.turns.committed(item, result)
        self.counts.records += 1
        self.counts.tokens += result.completion_tokens
        load = parts.load
        parts.bar.advance(
            tokens=result.completion_tokens,
            in_flight=parts.scheduler.stats.in_flight
            if load is None or not load.auto
            else sum(lane.in_flight for lanes in load.lanes.values() for lane in lanes),
            load=None if load is None else load.bar_fields(),
        )
