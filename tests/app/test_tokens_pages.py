"""The API tokens page (app/app_pages/tokens.py, app/ui/tokens_view.py) in team mode: a signed-in member makes a
token and sees its secret once (with the two variables a script sets), until they dismiss it or leave the page,
and never again; their tokens are listed (not anyone else's) with a revoke button per live one, which asks first.
Local mode makes none: the page says so and shows the variables for this machine."""

from __future__ import annotations

from test_auth import ANA, BOB, claims, team, team_page, user  # noqa: F401 - `team` is a fixture

from app import auth
from app.services import tokens

LABEL, MAKE, DISMISS = "tokens.label", "Make token", "tokens.dismiss"
REDIRECT = "https://deck.example.com/oauth2callback"


def _button(at, label: str):
    return next(b for b in at.button if b.label == label)


def _secrets_shown(at) -> list[str]:
    return [c.value for c in at.code if "MLFLOW_TRACKING_TOKEN" in c.value]


def _text(at) -> str:
    return str(at.main) + "".join(m.value for m in at.markdown) + "".join(c.value for c in at.code)


def make_on_page(at, label: str):
    at.text_input(key=LABEL).set_value(label)
    _button(at, MAKE).click()
    return at.run()


def test_a_member_makes_a_token_and_sees_its_secret_once(team, engine, monkeypatch):
    monkeypatch.setenv(auth.OIDC_ENV["redirect_uri"], REDIRECT)
    at = team_page("tokens.py", claims(ANA))
    assert not at.exception and at.title[0].value == "API tokens"
    assert "MLFLOW_TRACKING_URI" in _text(at) and not _secrets_shown(at)
    at = make_on_page(at, "laptop")
    assert not at.exception and not at.error
    (record,) = tokens.mine(user(ANA), engine=engine)
    (shown,) = _secrets_shown(at)
    secret = shown.split("MLFLOW_TRACKING_TOKEN=", 1)[1].strip()
    assert secret.startswith(f"tdk_{record.id}_")
    assert "export MLFLOW_TRACKING_URI=https://deck.example.com/_torchdeck/mlflow" in shown
    assert tokens.authenticate(secret, engine=engine).id == user(ANA).id  # the secret shown is the token
    assert any("will not be shown again" in w.value for w in at.warning)
    at.run()  # a rerun of the page (any other click on it) keeps it until it is dismissed
    assert _secrets_shown(at) == [shown]
    at.button(key=DISMISS).click()
    at.run()
    assert not _secrets_shown(at) and secret not in _text(at)
    assert "laptop" in _text(at)  # listed, without its secret


def test_the_secret_is_gone_once_the_page_was_left(team, engine):
    at = make_on_page(team_page("tokens.py", claims(ANA)), "laptop")
    assert _secrets_shown(at)
    at.switch_page("app_pages/runs.py")
    assert not at.run().exception
    at.switch_page("app_pages/tokens.py")
    at.run()
    assert not at.exception and not _secrets_shown(at)
    assert "tokens.shown" not in at.session_state  # not kept in the session either
    assert tokens.mine(user(ANA), engine=engine)[0].live


def test_a_label_that_is_no_label_is_refused_on_the_page(team, engine):
    at = make_on_page(team_page("tokens.py", claims(ANA)), "   ")
    assert any("No token made" in e.value and "give a name" in e.value for e in at.error)
    assert not _secrets_shown(at) and tokens.mine(user(ANA), engine=engine) == []


def test_the_list_shows_only_my_tokens_and_revoking_asks_first(team, engine):
    ana = user(ANA)
    kept, _ = tokens.make(ana, "desktop", engine=engine)
    doomed, doomed_secret = tokens.make(ana, "old *laptop*", engine=engine)
    tokens.make(user(BOB), "bobs-secret-box", engine=engine)
    at = team_page("tokens.py", claims(ANA))
    assert "desktop" in _text(at) and "old \\*laptop\\*" in _text(at)  # a label is text, never Markdown
    assert "bobs-secret-box" not in _text(at)
    at.button(key=f"tokens.revoke.{doomed.id}").click()
    at.run()
    assert any("Revoke token" in w.value and "cannot be undone" in w.value for w in at.warning)
    assert tokens.authenticate(doomed_secret, engine=engine) is not None  # nothing revoked before the confirmation
    _button(at, "Keep").click()
    at.run()
    assert not any("Revoke token" in w.value for w in at.warning)
    assert all(t.live for t in tokens.mine(ana, engine=engine))  # kept
    at.button(key=f"tokens.revoke.{doomed.id}").click()
    at.run()
    _button(at, "Revoke permanently").click()
    at.run()
    assert not at.exception and any("revoked" in s.value for s in at.success)
    assert tokens.authenticate(doomed_secret, engine=engine) is None
    assert {t.id: t.live for t in tokens.mine(ana, engine=engine)} == {kept.id: True, doomed.id: False}
    assert not [b for b in at.button if b.key == f"tokens.revoke.{doomed.id}"]  # revoked: no button any more
    assert [b for b in at.button if b.key == f"tokens.revoke.{kept.id}"]


def test_local_mode_needs_no_token_and_shows_the_variables_for_this_machine(page, engine, monkeypatch):
    monkeypatch.delenv(auth.MODE_ENV, raising=False)
    at = page("tokens.py")
    assert not at.exception and at.title[0].value == "API tokens"
    assert any("no token" in i.value for i in at.info)
    assert [c.value for c in at.code] == ["export MLFLOW_TRACKING_URI=http://127.0.0.1:8501/_torchdeck/mlflow"]
    assert not [b for b in at.button if b.label == MAKE] and not at.text_input
