"""Stored conversations: what persistence costs, and what retention sweeps do to the heap."""
