"""Per-class precision, recall and F1 from confusion counts. Torch-free and importing nothing of ours: the
training core writes them into each evaluation event and the dashboard recomputes them from a stored matrix."""

from __future__ import annotations

from collections.abc import Sequence

SCORE_KEYS = ("precision", "recall", "f1", "support")


def class_scores(
    tp: Sequence[float], support: Sequence[float], predicted: Sequence[float], digits: int = 4
) -> dict[str, list[float]]:
    """Per class: precision tp / predicted, recall tp / support, F1 their harmonic mean (0 where undefined)
    and the support (validation samples of the class)."""
    precision = [t / p if p else 0.0 for t, p in zip(tp, predicted, strict=True)]
    recall = [t / s if s else 0.0 for t, s in zip(tp, support, strict=True)]
    f1 = [2 * p * r / (p + r) if p + r else 0.0 for p, r in zip(precision, recall, strict=True)]
    return {
        "precision": [round(v, digits) for v in precision],
        "recall": [round(v, digits) for v in recall],
        "f1": [round(v, digits) for v in f1],
        "support": [int(s) for s in support],
    }


def macro_f1(tp: Sequence[float], support: Sequence[float], predicted: Sequence[float]) -> float:
    """The mean F1 over the classes that occur, as truth or as prediction (scikit-learn's f1_score with
    average="macro"): every class counts the same, so a rare class done badly shows where accuracy hides it."""
    f1 = [2 * t / (s + p) for t, s, p in zip(tp, support, predicted, strict=True) if s + p]
    return sum(f1) / len(f1) if f1 else 0.0


def balanced_accuracy(tp: Sequence[float], support: Sequence[float]) -> float:
    """The mean recall over the classes that occur in the truth (scikit-learn's balanced_accuracy_score): a
    classifier that always answers the majority class scores 1 / (classes) however large that class is."""
    recall = [t / s for t, s in zip(tp, support, strict=True) if s]
    return sum(recall) / len(recall) if recall else 0.0


def scores_from_confusion(confusion: Sequence[Sequence[float]]) -> dict[str, list[float]]:
    """class_scores of a confusion matrix whose rows are the true classes and columns the predicted ones."""
    c = len(confusion)
    tp = [confusion[i][i] for i in range(c)]
    support = [sum(row) for row in confusion]
    predicted = [sum(confusion[i][j] for i in range(c)) for j in range(c)]
    return class_scores(tp, support, predicted)
