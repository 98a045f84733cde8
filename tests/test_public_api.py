"""The public surface: what a user needs leaves through ``packing_collators``, each name documented;
what moved under its folder says where it lives now."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import packing_collators

ROOT = Path(__file__).resolve().parents[1]
MOVED = {
    "CompileReport": "packing_collators.trainer",
    "warm_up_compiled": "packing_collators.trainer",
    "FA4_ATTENTION": "packing_collators.attention",
    "VARLEN_ATTENTION": "packing_collators.attention",
}


def test_every_public_name_resolves_and_the_list_is_sorted():
    assert packing_collators.__all__ == sorted(packing_collators.__all__)
    for name in packing_collators.__all__:
        assert getattr(packing_collators, name) is not None, name


def test_every_public_name_is_documented():
    text = "".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    undocumented = [name for name in packing_collators.__all__ if not re.search(rf"\b{name}\b", text)]
    assert not undocumented, f"public but in no page of the manual: {undocumented}"


@pytest.mark.parametrize("name, home", sorted(MOVED.items()))
def test_a_moved_name_says_where_it_lives(name, home):
    assert name not in packing_collators.__all__
    with pytest.raises(AttributeError, match=rf"from {re.escape(home)} import {name}"):
        getattr(packing_collators, name)
    module = __import__(home, fromlist=[name])
    assert getattr(module, name) is not None


def test_an_unknown_name_is_an_ordinary_attribute_error():
    with pytest.raises(AttributeError, match="module 'packing_collators' has no attribute 'nothing'"):
        packing_collators.nothing  # noqa: B018


@pytest.mark.parametrize("name", ["TokenBudget", "check_token_budget", "measure_token_budget"])
def test_a_budget_name_imported_from_the_trainer_says_it_moved_to_budget(name):
    import packing_collators.budget
    import packing_collators.trainer

    with pytest.raises(AttributeError, match=rf"from packing_collators\.budget \(or packing_collators\) import {name}"):
        getattr(packing_collators.trainer, name)
    assert getattr(packing_collators.budget, name) is getattr(packing_collators, name)
