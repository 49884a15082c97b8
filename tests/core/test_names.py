"""Metric keys made from user input (class names) always fit the store and stay distinct."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.names import CLASS_ACC_PREFIX, MAX_CLASS_NAME, MAX_METRIC_KEY, class_acc_key


def test_short_class_names_are_kept_as_they_are():
    assert class_acc_key("cat") == "val/acc_class/cat"
    name = "n" * MAX_CLASS_NAME
    assert class_acc_key(name) == CLASS_ACC_PREFIX + name and len(class_acc_key(name)) == MAX_METRIC_KEY


def test_long_names_sharing_a_prefix_get_different_keys_that_fit():
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    assert class_acc_key(a) != class_acc_key(b)
    assert len(class_acc_key(a)) == MAX_METRIC_KEY and class_acc_key(a).startswith(CLASS_ACC_PREFIX + "x" * 100)


@given(st.text(min_size=1, max_size=400))
def test_every_class_name_makes_a_key_the_store_accepts(name):
    key = class_acc_key(name)
    assert len(key) <= MAX_METRIC_KEY and key.startswith(CLASS_ACC_PREFIX)
    assert class_acc_key(name) == key  # stable: the same name gives the same key in every attempt
