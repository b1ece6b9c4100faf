"""Keeping memory flat and visible: maintenance, process-tree memory and the leak slope, metrics, reports."""
