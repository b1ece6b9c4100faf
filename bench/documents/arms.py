"""The sides ("arms") summary_quality.py runs side by side on one engine, and how each sets the engine up.

- `before`: the summary code before the summary rework (legacy_summaries.py), loop guard off,
  no answer-token quoting;
- `after`: the code as it is now;
- `unguarded`: the code as it is now without the forbidden instruction phrases (echo_guard.py), so
  the sampler's part of the echo fix is measured apart from the prompts';
- `prompts@REV`: the code as it is now with the summary prompts of git revision REV
  (services/documents/prompts.py read with `git show`, e.g. `prompts@main` or a commit id),
  so a prompt change is measured against the prompts it replaces, in the same run.

Each run enters `engine_for(side)`, which sets the engine's loop guard and answer-token
cache for that side and puts the engine's own back when the run ends, so no side's
setup leaks into the next run.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import types
from collections.abc import Iterator

from bench.common import ROOT
from bench.documents.legacy_summaries import LOOP_GUARD_OFF, LegacyChatService
from services.chat.service import ChatService
from services.config import Settings
from services.documents.echo_guard import StepGuards
from services.documents.prompts import SummaryPrompts
from services.documents.summarizer import Summarizer, SummaryJob
from services.engine import AnswerTokens, ChatEngine, LoopGuardConfig
from services.engine.answer_tokens import ANSWER_TOKEN_CACHE_TOKENS

REVISION_PREFIX = "prompts@"
PROMPTS_PATH = "services/documents/prompts.py"


def prompts_at(revision: str) -> tuple[type[SummaryPrompts], str]:
    """SummaryPrompts as services/documents/prompts.py defines it at `revision`, and the commit id."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True)
        return done.stdout

    commit = git("rev-parse", "--verify", f"{revision}^{{commit}}").strip()
    name = f"bench_prompts_{commit[:12]}"
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__file__ = f"{commit}:{PROMPTS_PATH}"
        sys.modules[name] = module  # dataclasses look their module up while the class is made
        exec(compile(git("show", f"{commit}:{PROMPTS_PATH}"), module.__file__, "exec"), module.__dict__)
    return sys.modules[name].SummaryPrompts, commit


class RevisionSummarizer(Summarizer):
    """Today's summarizer speaking another revision's prompts."""

    def __init__(self, engine: ChatEngine, settings: Settings, prompts_class: type[SummaryPrompts]) -> None:
        super().__init__(engine, settings)
        self.prompts_class = prompts_class

    def prompts(self, job: SummaryJob) -> SummaryPrompts:
        today = super().prompts(job)
        return self.prompts_class(today.language, today.request)


class NothingForbidden(StepGuards):
    def _guard(self, messages: list) -> tuple[str, ...]:
        return ()


class UnguardedSummarizer(Summarizer):
    """Today's summarizer with no step's instructions forbidden."""

    def step_guards(self, prompts: SummaryPrompts, job: SummaryJob) -> StepGuards:
        return NothingForbidden(prompts, job.text, self.engine.count_tokens)


class UnguardedChatService(ChatService):
    def __init__(self, engine: ChatEngine, settings: Settings) -> None:
        super().__init__(engine, settings)
        self.summarizer = UnguardedSummarizer(engine, settings)


class RevisionChatService(ChatService):
    def __init__(self, engine: ChatEngine, settings: Settings, revision: str) -> None:
        super().__init__(engine, settings)
        prompts_class, self.commit = prompts_at(revision)
        self.summarizer = RevisionSummarizer(engine, settings, prompts_class)


def make_sides(engine: ChatEngine, settings: Settings, names: tuple[str, ...]) -> dict[str, ChatService]:
    """The chat service of each named side (before, after, unguarded, prompts@REV)."""
    made: dict[str, ChatService] = {}
    for name in names:
        if name == "before":
            made[name] = LegacyChatService(engine, settings)
        elif name == "after":
            made[name] = ChatService(engine, settings)
        elif name == "unguarded":
            made[name] = UnguardedChatService(engine, settings)
        elif name.startswith(REVISION_PREFIX):
            made[name] = RevisionChatService(engine, settings, name.removeprefix(REVISION_PREFIX))
        else:
            raise SystemExit(f"unknown side {name!r}: before, after, unguarded or {REVISION_PREFIX}REVISION")
    return made


@contextlib.contextmanager
def engine_for(engine: ChatEngine, side: str, settings: Settings) -> Iterator[None]:
    """The engine set up as `side` ran it, for one run; the engine's own setup after it."""
    kept = engine.loop_guard, engine.answer_tokens
    before = side == "before"
    engine.loop_guard = LOOP_GUARD_OFF if before else LoopGuardConfig.from_settings(settings)
    # "before" re-encoded the summary for its follow-up; the others quote the ids the engine wrote
    engine.answer_tokens = AnswerTokens(0 if before else ANSWER_TOKEN_CACHE_TOKENS, 3600)
    try:
        yield
    finally:
        engine.loop_guard, engine.answer_tokens = kept


def revisions(services: dict[str, ChatService]) -> dict[str, str]:
    """The commit each prompts@REV side ran."""
    return {name: chat.commit for name, chat in services.items() if isinstance(chat, RevisionChatService)}
