"""The dashboard's server options (app.cli.processes.ui_command): what `torchdeck up` and `torchdeck ui` serve."""

from __future__ import annotations

from app.cli.processes import ui_command


def _options(cmd: list[str]) -> dict[str, str]:
    return {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}


def test_the_dashboard_is_served_as_a_product_not_a_dev_server(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHDECK_MODE", raising=False)
    opts = _options(ui_command(tmp_path, 8599))
    assert opts["--server.port"] == "8599" and opts["--server.address"] == "127.0.0.1"
    assert opts["--client.toolbarMode"] == "viewer"  # no Deploy button
    # A live page refreshes several times a second: no whole-heap collection after each refresh, and
    # no polling of the source files for edits.
    assert opts["--runner.postScriptGC"] == "false" and opts["--server.fileWatcherType"] == "none"
