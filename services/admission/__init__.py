"""Sharing one engine fairly when demand exceeds it: priority, admission by capacity, per-user limits.

Everything here is applied in one place, `AdmittedEngine.generate`, which chat
and documents call instead of the engine's own; the handler opens a turn with
`Admission.turn` (per-user limits) and shows what `WaitingReporter` says.
"""
