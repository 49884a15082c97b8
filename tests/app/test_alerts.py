"""Alert rules as people manage them (the service, the CLI, the pages) and firings as the Run page and the sidebar
show them. Who may: global rules are an admin's, a run's rules its owner's (or an admin's)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from seeding import seed_run
from typer.testing import CliRunner

from app.auth import PermissionDenied, User
from app.cli import app as cli
from app.services import alerts
from db import alerts as store
from db import repo
from db.types import MetricPoint, utcnow
from worker.alerts import evaluate

ADMIN = User("iss#admin", "Ada", is_admin=True)
MEMBER = User("iss#member", "Mo")
OTHER = User("iss#other", "Oz")


def test_a_member_cannot_add_or_remove_a_global_rule_and_an_admin_can(engine):
    rule = alerts.RuleInput("worker_silent", minutes=10)
    with pytest.raises(PermissionDenied, match="only an admin"):
        alerts.add_rule(MEMBER, rule, engine)
    assert store.list_rules(engine) == []
    made = alerts.add_rule(ADMIN, rule, engine)
    assert made.scope == "global" and made.created_by == ADMIN.id
    with pytest.raises(PermissionDenied):
        alerts.remove_rule(MEMBER, made.id, engine)
    assert alerts.remove_rule(ADMIN, made.id, engine) and store.list_rules(engine) == []


def test_a_runs_owner_adds_rules_to_their_run_and_nobody_else_but_an_admin_does(engine):
    mine = seed_run(engine, "mine", status="running", owner=MEMBER.id)
    rule = alerts.RuleInput("metric", run_id=mine.id, key="val/loss", op="above", threshold=2.0)
    made = alerts.add_rule(MEMBER, rule, engine)
    assert (made.scope, made.run_id) == ("run", mine.id)
    with pytest.raises(PermissionDenied, match="may not add alert rules of run"):
        alerts.add_rule(OTHER, rule, engine)
    with pytest.raises(PermissionDenied):
        alerts.remove_rule(OTHER, made.id, engine)
    assert alerts.add_rule(ADMIN, rule, engine).run_id == mine.id
    assert alerts.remove_rule(MEMBER, made.id, engine)


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        (alerts.RuleInput("metric", key="val/loss", op="above"), "needs a metric key"),
        (alerts.RuleInput("stalled"), "needs epochs or minutes"),
        (alerts.RuleInput("data_wait", threshold=1.5, minutes=5), "needs a fraction"),
        (alerts.RuleInput("queued", minutes=-1), "minutes: more than 0"),
        (alerts.RuleInput("sweep_finished", run_id="abc"), "is global"),
        (alerts.RuleInput("cpu_on_fire"), "alert kind 'cpu_on_fire'"),
    ],
)
def test_a_rule_missing_what_its_kind_needs_is_refused_saying_what(engine, rule, words):
    with pytest.raises(ValueError, match=words):
        alerts.add_rule(ADMIN, rule, engine)


def test_the_cli_adds_lists_and_removes_rules(engine):
    runner = CliRunner()
    added = runner.invoke(cli, ["alerts", "add", "metric", "--key", "val/loss", "--above", "2.5", "--cooldown", "5"])
    assert added.exit_code == 0, added.output
    rule_id = added.output.split()[0]
    assert "global: val/loss above 2.5 (cooldown 5 min)" in added.output
    listed = runner.invoke(cli, ["alerts", "list"])
    assert listed.exit_code == 0 and rule_id in listed.output
    refused = runner.invoke(cli, ["alerts", "add", "stalled"])
    assert refused.exit_code == 2 and "needs epochs or minutes" in refused.output
    assert runner.invoke(cli, ["alerts", "remove", rule_id]).exit_code == 0
    assert store.list_rules(engine) == []
    assert runner.invoke(cli, ["alerts", "remove", rule_id]).exit_code == 1


def fired_at(engine, run_id: str):
    (firing,) = store.list_firings(engine, run_ids=[run_id])
    return firing.fired_at


def _rule(engine):
    return store.add_rule(engine, "metric", created_by="a", key="train/loss", op="above", threshold=3.0)


def _fired_on(engine, *, ruled: bool = False):
    r = seed_run(engine, "hot <b>run</b>", status="running")
    t0 = utcnow()
    repo.append_metrics(engine, r.id, [MetricPoint("train/loss", 1, 9.5, 1, t0.timestamp())])
    if not ruled:
        _rule(engine)
    assert len(evaluate(engine, t0 + timedelta(minutes=1))) == 1
    return r


def test_the_run_page_lists_when_and_why_an_alert_fired(page, engine):
    r = _fired_on(engine)
    at = page("run.py", id=r.id)
    assert not at.exception
    (section,) = [e for e in at.expander if e.label.startswith("Alerts")]
    assert section.label == "Alerts (1)"
    (table,) = [d.value for d in section.dataframe]
    assert table.iloc[0]["why"] == 'train/loss is 9.5, above 3 in run "hot <b>run</b>"'
    assert table.iloc[0]["fired"] == f"{fired_at(engine, r.id):%Y-%m-%d %H:%M:%S}" and table.iloc[0]["cleared"] == ""


def test_the_sidebar_tells_an_admin_of_a_new_alert_once(page, engine):
    _rule(engine)  # sidebars poll for notices once a rule exists
    at = page("runs.py")  # the session starts watching now
    r = _fired_on(engine, ruled=True)
    at.run()
    assert not at.exception
    told = [t.value for t in at.toast]
    assert len(told) == 1 and "train/loss is 9.5" in told[0]
    assert any(link.proto.query_string == f"id={r.id}" for link in at.sidebar.get("page_link"))
    at.run()
    assert [t.value for t in at.toast] == []


def test_the_workers_page_lists_global_rules_for_an_admin_to_manage(page, engine):
    made = alerts.add_rule(ADMIN, alerts.RuleInput("queued", minutes=30), engine)
    at = page("workers.py")
    assert not at.exception
    assert any(made.id in m.value and "queued for 30 min" in m.value for m in at.markdown)
    at.button(key=f"alerts.global.remove.{made.id}").click().run()
    assert store.list_rules(engine) == []


def test_a_member_hears_of_alerts_on_runs_they_follow_only(engine):
    since = utcnow() - timedelta(minutes=1)
    r = _fired_on(engine)
    assert alerts.notices(MEMBER, since, engine) == []
    repo.follow(engine, MEMBER.id, r.id)
    (notice,) = alerts.notices(MEMBER, since, engine)
    assert notice.run_id == r.id and notice.kind == "metric"
    assert len(alerts.notices(ADMIN, since, engine)) == 1 and alerts.notices(None, since, engine) == []


def test_a_rule_added_on_the_run_page_watches_that_run(page, engine):
    r = seed_run(engine, "mine", status="queued")
    at = page("run.py", id=r.id)
    at.selectbox(key="alerts.run.kind").set_value("queued")
    at.number_input(key="alerts.run.minutes").set_value(45.0)
    (submit,) = [b for b in at.button if b.label == "Add rule"]
    submit.click().run()
    assert not at.exception
    (rule,) = store.list_rules(engine)
    assert (rule.kind, rule.run_id, rule.minutes, rule.key) == ("queued", r.id, 45.0, None)
    assert any("queued for 45 min" in m.value for m in at.success)
