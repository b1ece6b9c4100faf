"""Sharing one engine fairly when demand exceeds it: priority, admission by capacity, per-user limits.

Everything here is applied in one place, `Admission.admit` (service.py), the one way to the engine
for chat, documents and the API: a request waits for a slot in the shared waiting line
(waiting_line.py), runs with its place as vLLM's priority, and gives the slot back on every exit.
The chat handler opens a turn with `Admission.turn` (per-user limits) and shows what
`WaitingFeedback` says; chat and documents reach `admit` through `AdmittedEngine.generate`, and
the API (services/api/gate.py) admits each request as a turn of its own. Per-person limits are
this process's (limits.py) and, with replicas on PostgreSQL, every replica's (shared_limits.py).
"""
