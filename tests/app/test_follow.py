"""Following runs: followed from the Run page; when a followed run ends, every page of the session says so in a
toast, once; opening the app does not replay old ends; unfollowing stops it."""

from __future__ import annotations

from seeding import seed_run

from app.auth import local_user
from db import repo


def _toasts(at) -> list[str]:
    return [t.value for t in at.toast]


def _followed_links(at) -> list[tuple[str, str]]:
    """The followed runs the sidebar lists: (label, query string) of its links to runs."""
    return [
        (el.proto.label, el.proto.query_string)
        for el in at.sidebar.get("page_link")
        if el.proto.query_string.startswith("id=")
    ]


def test_a_followed_run_that_ends_is_told_once_on_any_page(page, engine):
    r = seed_run(engine, "watched", status="running", steps=5)
    other = seed_run(engine, "ignored", status="running")
    at = page("run.py", id=r.id)
    assert not at.exception
    assert at.button(key="run.follow").label == "Follow"
    at.button(key="run.follow").click().run()
    assert at.button(key="run.follow").label == "Unfollow"
    assert [row.run_id for row in repo.followed(engine, local_user().id)] == [r.id]
    assert ("watched · running", f"id={r.id}") in _followed_links(at)  # listed in the sidebar
    assert _toasts(at) == []
    repo.finish_run(engine, other.id, "failed", error="boom")  # not followed: never told
    repo.finish_run(engine, r.id, "completed", summary={"status": "completed"})
    at.switch_page("app_pages/runs.py")
    at.run()
    assert not at.exception
    told = _toasts(at)
    assert len(told) == 1 and "watched" in told[0] and "completed" in told[0]
    assert at.toast[0].icon == ":material/check_circle:"
    assert ("watched · completed", f"id={r.id}") in _followed_links(at)
    at.run()
    assert _toasts(at) == []  # once
    at.switch_page("app_pages/overview.py")
    assert _toasts(at.run()) == []


def test_opening_the_app_does_not_replay_old_ends_and_later_ends_are_told(page, engine):
    me = local_user().id
    old = seed_run(engine, "ended-before", status="completed")
    live = seed_run(engine, "diverges", status="running")
    for run in (old, live):
        repo.follow(engine, me, run.id)
    at = page("runs.py")
    assert not at.exception and _toasts(at) == []  # the first look only records
    assert len(_followed_links(at)) == 2
    repo.finish_run(engine, live.id, "diverged", summary={"status": "diverged"})
    told = _toasts(at.run())
    assert len(told) == 1 and "diverges" in told[0] and "diverged" in told[0]
    assert at.toast[0].icon == ":material/warning:"
    assert _toasts(at.run()) == []


def test_a_run_followed_elsewhere_is_told_only_if_it_ends_after_the_session_started(page, engine):
    me = local_user().id
    earlier = seed_run(engine, "long-done", status="completed")
    later = seed_run(engine, "fails", status="running")
    watching = seed_run(engine, "watching", status="running")
    repo.follow(engine, me, watching.id)
    at = page("runs.py")
    assert _toasts(at) == []
    repo.follow(engine, me, earlier.id)  # followed in another tab: it ended before this session looked
    repo.follow(engine, me, later.id)
    repo.finish_run(engine, later.id, "failed", error="out of memory")
    told = _toasts(at.run())
    assert len(told) == 1 and "fails" in told[0] and "failed" in told[0]


def test_unfollowing_stops_the_notices(page, engine):
    r = seed_run(engine, "dropped", status="running")
    at = page("run.py", id=r.id)
    at.button(key="run.follow").click().run()
    at.button(key="run.follow").click().run()
    assert at.button(key="run.follow").label == "Follow"
    assert repo.followed(engine, local_user().id) == []
    assert _followed_links(at) == []
    repo.finish_run(engine, r.id, "completed", summary={"status": "completed"})
    assert _toasts(at.run()) == []
    at.switch_page("app_pages/runs.py")
    assert _toasts(at.run()) == []


def test_following_goes_through_the_service_and_a_run_deleted_meanwhile_is_said_to_be_gone(page, engine, monkeypatch):
    from app.services import runs

    r = seed_run(engine, "watched", status="running")
    calls = []
    for name in ("follow", "unfollow"):
        real = getattr(runs, name)
        monkeypatch.setattr(
            runs,
            name,
            lambda run_id, engine=None, *, by, _real=real, _name=name: (
                calls.append((_name, run_id, by.id)) or _real(run_id, engine, by=by)
            ),
        )
    at = page("run.py", id=r.id)
    at.button(key="run.follow").click().run()
    at.button(key="run.follow").click().run()
    me = local_user().id
    assert calls == [("follow", r.id, me), ("unfollow", r.id, me)]
    assert repo.followed(engine, me) == []
    repo.delete_run(engine, r.id, force=True)  # deleted in another tab while this page still shows it
    at.button(key="run.follow").click().run()
    assert not at.exception and any("it may have been deleted" in e.value for e in at.error)
