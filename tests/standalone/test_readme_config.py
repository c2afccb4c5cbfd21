"""The README's configuration reference names every setting there is."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic_settings import BaseSettings

from service.config import Settings
from workers.settings import WorkerSettings

README = Path(__file__).resolve().parents[2] / "README.md"


def _variables(settings: type[BaseSettings]) -> set[str]:
    prefix = str(settings.model_config.get("env_prefix") or "")
    return {f"{prefix}{name}".upper() for name in settings.model_fields}


def test_every_setting_is_in_the_configuration_reference() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Configuration")
    section = text[start : text.index("\n## ", start + 1)]
    documented = set(re.findall(r"`(QM_[A-Z0-9_]+)`", section))
    known = _variables(Settings) | _variables(WorkerSettings)
    known |= {"QM_TEST_DATABASE_URL", "QM_TEST_BROKER_URL"}  # tests/harness.py reads them
    assert sorted(known - documented) == [], "settings missing from README's Configuration"
    assert sorted(documented - known) == [], "README documents settings that do not exist"
