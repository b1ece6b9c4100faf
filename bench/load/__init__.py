"""Load: many people at once, first come first served against the admission rules."""
