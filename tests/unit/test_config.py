from __future__ import annotations

from pathlib import Path

import pytest

from asyncbk.config import BookieConfig, ClientConfig, from_mapping, load_toml
from asyncbk.errors import ConfigError


def test_file_values_and_types(tmp_path: Path) -> None:
    f = tmp_path / "b.toml"
    f.write_text("[bookie]\njournal_group_wait_ms_max = 1\nlease_ttl_s = 6\n")
    cfg = from_mapping(BookieConfig, load_toml(f), str(f))
    assert cfg.journal_group_wait_ms_max == 1.0
    assert cfg.lease_ttl_s == 6


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"no_such_setting": 1}, "unknown setting"),
        ({"lease_ttl_s": "ten"}, "must be int"),
        ({"lease_ttl_s": True}, "must be int"),
        ({"lease_ttl_s": 1}, "lease_ttl_s"),
        ({"journal_queue_entries_max": 0}, "must be > 0"),
        ({"port": 70000}, "port"),
        ({"malloc_tuning": "yes"}, "'malloc_tuning' must be bool"),
        ({"journal_preallocate_bytes": -1}, "journal_preallocate_bytes must be >= 0"),
    ],
)
def test_bad_values_named(values: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        from_mapping(BookieConfig, values)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(bad)


def test_client_options() -> None:
    assert from_mapping(ClientConfig, {"add_timeout_s": 2}).add_timeout_s == 2.0
    with pytest.raises(ConfigError):
        from_mapping(ClientConfig, {"add_timeout_s": -1})
