"""packing_collators/_compat.py holds every use of another library's private API."""

import re
from pathlib import Path

import pytest

from packing_collators import _compat

PACKAGE = Path(_compat.__file__).parent


def _uses(pattern: str) -> list[str]:
    """``file:line: text`` of every line of the package, outside _compat.py, that matches ``pattern``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_compat.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("name", _compat.PRIVATE_NAMES)
def test_a_private_name_of_another_library_is_used_only_in_compat(name):
    uses = _uses(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])")
    assert not uses, f"{name} is another library's private name: reach it through packing_collators._compat\n" + "\n".join(
        uses
    )


def test_the_positional_collator_is_found_only_in_compat():
    assert not _uses(r"len\(args\)\s*[<>]"), "Trainer's positional data_collator: use _compat.positional_collator"
    assert _compat.positional_collator(("model", "args", "collator")) is True
    assert _compat.positional_collator(("model", "args")) is False


def test_every_listed_name_is_wrapped_in_compat():
    source = Path(_compat.__file__).read_text()
    code = source.split('"""', 2)[2]  # below the module docstring
    for name in _compat.PRIVATE_NAMES:
        assert code.count(name) >= 2, f"{name} is listed but never used in _compat.py"  # the list and a use


def test_the_wrappers_read_what_transformers_and_datasets_hold():
    datasets = pytest.importorskip("datasets")
    from transformers import LlamaConfig

    assert callable(_compat.attention_registry()["sdpa"])
    config = LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    _compat.set_attn_implementation(config, "eager")
    assert _compat.attn_implementation(config) == "eager"
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]]})
    assert _compat.dataset_indices(dataset) is None
    assert _compat.dataset_indices(dataset.select([1, 0])) is not None  # a reordering view
    assert issubclass(_compat.BaseExamplesIterable, object)
    assert _compat.examples_iterable(dataset.to_iterable_dataset()) is not None
