"""Chainlit's step upsert, kept within the step's own conversation."""

from __future__ import annotations

import json
from typing import Any


def step_upsert(step_dict: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Chainlit's step upsert (`SQLAlchemyDataLayer.create_step`), except that a stored step of
    another conversation is left as it is: a user message's id is chosen by the browser, and
    Chainlit's `ON CONFLICT (id) DO UPDATE` moved anyone's step into the sender's conversation."""
    step = dict(step_dict)
    step["showInput"] = str(step.get("showInput", "")).lower() if "showInput" in step else None
    parameters = {
        key: value
        for key, value in step.items()
        if value is not None and not (isinstance(value, dict) and not value)
    }
    parameters["metadata"] = json.dumps(step.get("metadata", {}))
    parameters["generation"] = json.dumps(step.get("generation", {}))
    columns = ", ".join(f'"{key}"' for key in parameters)
    values = ", ".join(f":{key}" for key in parameters)
    updates = ", ".join(f'"{key}" = :{key}' for key in parameters if key != "id")
    query = (
        f"INSERT INTO steps ({columns}) VALUES ({values}) "
        f'ON CONFLICT (id) DO UPDATE SET {updates} WHERE steps."threadId" = :threadId'
    )
    return query, parameters
