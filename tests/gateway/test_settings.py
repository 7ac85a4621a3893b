"""Gateway config validation (``GatewaySettings``, ``load_settings``): mistakes fail at load with
a message that names them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import ConfigError, GatewaySettings, load_settings

ROUTES = {"local": {"base_url": "http://127.0.0.1:8081/v1"}, "qwen": {"base_url": "http://127.0.0.1:8001/v1"}}


def test_default_route_must_name_a_route() -> None:
    with pytest.raises(ValidationError) as ei:
        GatewaySettings.model_validate({"llm_routes": ROUTES, "default_route": "lcoal"})
    msg = str(ei.value)
    assert "default_route 'lcoal'" in msg and "known routes: local, qwen" in msg
    with pytest.raises(ValidationError, match="known routes: none"):
        GatewaySettings.model_validate({"default_route": "local"})


def test_default_route_naming_a_route_or_unset() -> None:
    assert GatewaySettings.model_validate({"llm_routes": ROUTES, "default_route": "qwen"}).route_for_default() == "qwen"
    assert GatewaySettings.model_validate({"llm_routes": ROUTES}).route_for_default() == "local"
    assert GatewaySettings.model_validate({}).route_for_default() is None


def test_load_settings_reports_a_bad_default_route_with_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("default_route: gpt\nllm_routes:\n  local:\n    base_url: http://127.0.0.1:8081/v1\n")
    with pytest.raises(ConfigError) as ei:
        load_settings(cfg)
    assert str(cfg) in str(ei.value) and "default_route 'gpt'" in str(ei.value) and "local" in str(ei.value)


def test_close_grace_s_default_and_bounds() -> None:
    assert GatewaySettings.model_validate({}).close_grace_s == 30.0
    assert GatewaySettings.model_validate({"close_grace_s": 0}).close_grace_s == 0
    with pytest.raises(ValidationError, match="close_grace_s"):
        GatewaySettings.model_validate({"close_grace_s": -1})


def test_shipped_config_is_valid() -> None:
    settings = load_settings(Path(__file__).resolve().parents[2] / "configs" / "gateway.yaml")
    assert settings.route_for_default() in settings.llm_routes


def test_storage_type_is_derived_from_the_db_url_and_must_agree_with_it() -> None:
    pg = {"db_url": "postgresql://u:s3cret@db/trajs"}
    assert GatewaySettings.model_validate({}).storage_type == "sqlite"
    assert GatewaySettings.model_validate({"storage_config": pg}).storage_type == "postgresql"
    assert GatewaySettings.model_validate({"storage_type": "sqlite"}).storage_type == "sqlite"
    with pytest.raises(ValidationError) as ei:
        GatewaySettings.model_validate({"storage_type": "sqlite", "storage_config": pg})
    assert "storage_type is sqlite but storage_config.db_url is a postgresql URL" in str(ei.value)
    assert "s3cret" not in str(ei.value)  # a URL's password is never echoed
    assert GatewaySettings.model_validate({"storage_config": {"db_url": "/tmp/plain.db"}}).storage_type == "sqlite"
    with pytest.raises(ValidationError, match="storage_config.db_url: storage '/nowhere/x.db': the folder /nowhere"):
        GatewaySettings.model_validate({"storage_config": {"db_url": "/nowhere/x.db"}})
    with pytest.raises(ValidationError, match="unsupported storage URL 'mysql://db/x': use a file path, sqlite://"):
        GatewaySettings.model_validate({"storage_config": {"db_url": "mysql://db/x"}})
