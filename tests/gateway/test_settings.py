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
    assert (
        GatewaySettings.model_validate({"llm_routes": ROUTES, "default_route": "qwen"}).route_for_default()
        == "qwen"
    )
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
    assert (
        GatewaySettings.model_validate({"storage_config": {"db_url": "/tmp/plain.db"}}).storage_type
        == "sqlite"
    )
    with pytest.raises(
        ValidationError, match="storage_config.db_url: storage '/nowhere/x.db': the folder /nowhere"
    ):
        GatewaySettings.model_validate({"storage_config": {"db_url": "/nowhere/x.db"}})
    with pytest.raises(
        ValidationError, match="unsupported storage URL 'mysql://db/x': use a file path, sqlite://"
    ):
        GatewaySettings.model_validate({"storage_config": {"db_url": "mysql://db/x"}})


def test_listen_port_is_a_port_number() -> None:
    assert GatewaySettings.model_validate({"listen_port": 0}).listen_port == 0
    assert GatewaySettings.model_validate({"listen_port": 65535}).listen_port == 65535
    for bad in (-1, 65536, 70000):
        with pytest.raises(ValidationError, match="listen_port"):
            GatewaySettings.model_validate({"listen_port": bad})


def test_config_errors_are_one_line_per_problem_naming_the_file_field_or_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("listen_port: 70000\nbogus: 1\nllm_routes:\n  a:\n    base_url: 3\n")
    with pytest.raises(ConfigError) as ei:
        load_settings(cfg)
    assert str(ei.value).splitlines() == [
        f"gateway config {cfg}: listen_port: Input should be less than or equal to 65535",
        f"gateway config {cfg}: llm_routes.a.base_url: Input should be a valid string",
        f"gateway config {cfg}: bogus: unknown key",
    ]
    cfg.write_text("listen_prot: 8000\nllm_routes:\n  a: {base_url: http://x, api_kye: k}\n")
    with pytest.raises(ConfigError) as ei:  # an unknown key with the nearest valid one, nested ones too
        load_settings(cfg)
    assert str(ei.value).splitlines() == [
        f"gateway config {cfg}: llm_routes.a.api_kye: unknown key (did you mean 'api_key'?)",
        f"gateway config {cfg}: listen_prot: unknown key (did you mean 'listen_port'?)",
    ]
    cfg.write_text("listen_port: 8000\n")
    with pytest.raises(ConfigError) as ei:  # a flag's value is blamed on the flag, not the file
        load_settings(cfg, host="127.0.0.1", port=99999, db_url=str(tmp_path))
    assert str(ei.value).splitlines() == ["--port: Input should be less than or equal to 65535"]
    with pytest.raises(ConfigError) as ei:
        load_settings(cfg, db_url=str(tmp_path))
    assert str(ei.value) == f"--db-url: storage '{tmp_path}': {tmp_path} is a folder, not a SQLite file"
    cfg.write_text(f"storage_config:\n  db_url: {tmp_path}\n")
    with pytest.raises(ConfigError) as ei:  # the same value in the file names the file and the field
        load_settings(cfg)
    assert str(ei.value) == (
        f"gateway config {cfg}: storage_config.db_url: storage '{tmp_path}': {tmp_path} is a "
        "folder, not a SQLite file"
    )
    assert "pydantic.dev" not in str(ei.value) and "validation error" not in str(ei.value)
