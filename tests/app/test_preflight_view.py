"""The pre-flight panel's overfit-one-batch verdict in words (app/ui/preflight_view.py): the loss that fell
is said with its numbers; one that did not fall is a warning saying what that usually means."""

from __future__ import annotations

from app.ui.preflight_view import overfit_message

MODEL = {"parameters": 1200, "trainable": 1200}
BASE = {"initial_loss": 2.31, "batch": 16, "lr": 0.003, "max_steps": 40, "budget_s": 20.0}


def test_a_passed_check_says_the_loss_fell_and_by_how_much() -> None:
    kind, text = overfit_message(
        {**BASE, "final_loss": 0.04, "batch_acc": 1.0, "steps": 40, "passed": True, "fell": True}, MODEL
    )
    assert kind == "success" and "from 2.31 to 0.04 in 40 steps" in text


def test_a_loss_that_did_not_fall_is_a_warning_with_its_usual_causes() -> None:
    kind, text = overfit_message(
        {**BASE, "final_loss": 2.4, "batch_acc": 0.1, "steps": 40, "passed": False, "fell": False}, MODEL
    )
    assert kind == "warning" and "did **not** fall" in text and "from 2.31 to 2.4" in text
    for cause in ("learning rate too low or too high", "labels misaligned", "frozen model"):
        assert cause in text


def test_a_check_cut_short_by_its_budget_says_so() -> None:
    kind, text = overfit_message(
        {**BASE, "final_loss": 1.9, "batch_acc": 0.4, "steps": 7, "passed": False, "fell": True}, MODEL
    )
    assert kind == "warning" and "after 7 of 40 steps" in text and "not memorised" in text


def test_skipped_and_broken_checks_say_why() -> None:
    assert overfit_message({"skipped": "the shape check failed"}, MODEL) == (
        "info",
        "Overfit one batch skipped: the shape check failed.",
    )
    kind, text = overfit_message({"error": "RuntimeError: out of memory"}, MODEL)
    assert kind == "warning" and "out of memory" in text
