"""The bench's value check: fingerprints add up over any split of a tensor and tell misplaced values apart."""

from __future__ import annotations

import itertools

import pytest


torch = pytest.importorskip("torch")

from loadpolicy_lab.perf import fingerprint as fp  # noqa: E402


def _tensor() -> object:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 10, generator=generator).to(torch.bfloat16)


def _parts(flat: object, bounds: list[int]) -> tuple[float, float]:
    signed = 0.0
    for start, end in itertools.pairwise(bounds):
        signed += fp.fingerprint(flat[start:end], start)[0]
    return signed, 0.0


def test_the_parts_of_any_split_add_up_to_the_whole() -> None:
    flat = _tensor().reshape(-1)
    whole = fp.fingerprint(flat, 0)
    for bounds in ([0, 60], [0, 30, 60], [0, 7, 31, 44, 60], [0, 1, 2, 59, 60]):
        assert fp.matches(_parts(flat, bounds), whole), bounds


def test_chunks_smaller_than_the_tensor_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    flat = _tensor().reshape(-1)
    whole = fp.fingerprint(flat, 0)
    monkeypatch.setattr(fp, "CHUNK", 7)
    assert fp.matches(fp.fingerprint(flat, 0), whole)


def test_a_neighbours_partition_in_place_of_ones_own_is_told_apart() -> None:
    flat = _tensor().reshape(-1)
    whole = fp.fingerprint(flat, 0)
    # rank 1's partition read at rank 0's place and the other way round: the same values, misplaced
    swapped = fp.fingerprint(flat[30:], 0)[0] + fp.fingerprint(flat[:30], 30)[0]
    assert not fp.matches((swapped, 0.0), whole)


def test_swapped_rows_and_one_changed_value_are_told_apart() -> None:
    tensor = _tensor()
    whole = fp.fingerprint(tensor.reshape(-1), 0)
    assert not fp.matches(fp.fingerprint(tensor.flip(0).reshape(-1), 0), whole)
    changed = tensor.clone()
    changed[3, 4] += 1
    assert not fp.matches(fp.fingerprint(changed.reshape(-1), 0), whole)


def test_nan_never_matches() -> None:
    tensor = _tensor()
    whole = fp.fingerprint(tensor.reshape(-1), 0)
    tensor[0, 0] = float("nan")
    assert not fp.matches(fp.fingerprint(tensor.reshape(-1), 0), whole)
    assert not fp.matches((float("nan"), 0.0), whole)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_blocks_along_any_dimension_add_up_to_the_whole(dim: int) -> None:
    tensor = torch.randn(4, 6, 5, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    whole = fp.fingerprint(tensor.reshape(-1), 0)
    total = 0.0
    for index, block in enumerate(tensor.chunk(2, dim=dim)):
        offsets = [0, 0, 0]
        offsets[dim] = index * tensor.chunk(2, dim=dim)[0].shape[dim]
        total += fp.fingerprint_block(block, tuple(offsets), tuple(tensor.shape))[0]
    assert fp.matches((total, 0.0), whole)
    # the two blocks at each other's offsets: misplaced, told apart
    first, second = tensor.chunk(2, dim=dim)
    size = first.shape[dim]
    offsets_first = [0, 0, 0]
    offsets_first[dim] = size
    swapped = fp.fingerprint_block(first, tuple(offsets_first), tuple(tensor.shape))[0]
    swapped += fp.fingerprint_block(second, (0, 0, 0), tuple(tensor.shape))[0]
    assert not fp.matches((swapped, 0.0), whole)
