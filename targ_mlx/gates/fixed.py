"""The two fixed policies: Never-RAG (answer from memory) and Always-RAG (always read)."""

from __future__ import annotations

from targ_mlx.gates.base import Gate, GateDecision, GateParams, Signals, register


class _Fixed(Gate):
    read: bool = False

    def score(self, sig: Signals, p: GateParams = GateParams()) -> None:
        return None

    def decide(self, sig: Signals, tau: float, p: GateParams = GateParams(), u: float | None = None) -> GateDecision:
        why = "gate always → read" if self.read else "gate never → answered from memory"
        return GateDecision(self.read, None, tau, self.name, why)


class NeverGate(_Fixed):
    name, read = "never", False


class AlwaysGate(_Fixed):
    name, read = "always", True


register(NeverGate())
register(AlwaysGate())
