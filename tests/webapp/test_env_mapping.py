"""`KEY=VALUE,...` settings (TROVE_RL_TOKENIZERS): a typo is an error at start that names the variable and the
item, not a ValueError from deep inside the settings module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from webapp.env import ConfigError, env_mapping

REPO = Path(__file__).resolve().parents[2]


def test_items_become_a_mapping_and_a_value_may_hold_an_equals_sign(monkeypatch):
    monkeypatch.setenv("TROVE_T_MAP", " lab-vllm = /models/q/tokenizer.json , odd=/m/a=b.json ")
    assert env_mapping("TROVE_T_MAP") == {"lab-vllm": "/models/q/tokenizer.json", "odd": "/m/a=b.json"}
    monkeypatch.setenv("TROVE_T_MAP", "")
    assert env_mapping("TROVE_T_MAP") == {}


@pytest.mark.parametrize(("raw", "says"), [
    ("lab-vllm", "'lab-vllm' is not KEY=VALUE"),
    ("lab-vllm=", "'lab-vllm=' is not KEY=VALUE"),
    ("=/models/tokenizer.json", "is not KEY=VALUE"),
    ("a=/x.json,a=/y.json", "'a' is given twice"),
])
def test_a_malformed_item_is_refused_naming_the_variable_and_the_item(monkeypatch, raw, says):
    monkeypatch.setenv("TROVE_T_MAP", raw)
    with pytest.raises(ConfigError, match="TROVE_T_MAP: ") as refused:
        env_mapping("TROVE_T_MAP")
    assert says in str(refused.value)


def test_a_malformed_tokenizer_setting_stops_the_start_with_a_clear_error():
    env = {**os.environ, "TROVE_RL_TOKENIZERS": "lab-vllm /models/tokenizer.json", "SECRET_KEY": "x",
           "DJANGO_SETTINGS_MODULE": "webapp.settings"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "TROVE_RL_TOKENIZERS: 'lab-vllm /models/tokenizer.json' is not KEY=VALUE" in result.stderr
