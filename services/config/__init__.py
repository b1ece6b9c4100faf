"""Settings of the service: one frozen object, read from env vars once (see settings.py)."""

from services.config.engine import EngineSettings
from services.config.fields import SettingsError
from services.config.settings import Settings

__all__ = ["EngineSettings", "Settings", "SettingsError"]
