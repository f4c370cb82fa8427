"""DartStats: what one DART `generate` call did, step by step (`draft.stats` after the call)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DartStats:
    """What one DART `generate` call did. Times are wall-clock seconds.

    tau (mean acceptance length) = tokens committed by verify steps / verify steps, the bonus token included;
    the token that follows the prompt comes from the prefill and is not counted in tau. Verify steps include the
    `lookup_steps` (a context-lookup chain verified instead of a drafted tree); `budgets`, `tree_sizes` and
    `tree_kinds` are the drafted trees' ("drawn": a chain of drawn tokens; "tree": a deterministic tree).

    A batch (`dart_hf.batch`): `verify_steps` and `plain_steps` count the batch's steps; `accepted_lengths`,
    `tree_sizes`, `budgets` and `tree_kinds` hold one entry per row per verified step (tau is per row), and
    `lookup_steps` counts rows' context-lookup chains.
    """

    verify_steps: int = 0
    new_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    tree_kinds: list[str] = field(default_factory=list)
    plain_steps: int = 0
    lookup_steps: int = 0
    prefill_time: float = 0.0
    draft_time: float = 0.0
    tree_time: float = 0.0
    verify_time: float = 0.0
    plain_time: float = 0.0
    lookup_time: float = 0.0
    total_time: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step (bonus token included); 0 without verify steps."""
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def chosen_budget(self) -> int | None:
        """The tree budget used most often (the adaptive controller's choice), None without verify steps."""
        return max(set(self.budgets), key=self.budgets.count) if self.budgets else None

    @property
    def plain_fraction(self) -> float:
        """Share of the decoding steps that fell back to plain decoding (drafting did not pay)."""
        return self.plain_steps / max(self.plain_steps + self.verify_steps, 1)

    @property
    def lookup_fraction(self) -> float:
        """Share of the decoding steps that verified a context-lookup chain."""
        return self.lookup_steps / max(self.plain_steps + self.verify_steps, 1)
