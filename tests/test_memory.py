"""The recycling allocator behind large CPU outputs (_core.memory)."""
import pytest
import torch

from cvops._core import memory

BIG = (1 << 19,)  # 2 MiB of float32: large enough to be recycled


@pytest.fixture(autouse=True)
def _clean_pool(monkeypatch):
    monkeypatch.delenv("CVOPS_RECYCLE", raising=False)
    memory.empty_cache()
    yield
    memory.empty_cache()


def test_buffer_is_reused_only_after_every_view_is_gone():
    first = memory.new_empty(BIG, torch.float32)
    ptr = first.data_ptr()
    view = first[3:].view(-1)
    del first
    second = memory.new_empty(BIG, torch.float32)
    assert second.data_ptr() != ptr, "a live view still uses the buffer"
    del view
    third = memory.new_empty(BIG, torch.float32)
    assert third.data_ptr() == ptr
    del second, third


def test_dtype_shape_and_zeros():
    a = memory.new_empty(BIG, torch.float32)
    a.fill_(7.0)
    del a
    z = memory.new_zeros((512, 1024), torch.float64)  # 4 MiB: a second buffer
    assert z.dtype == torch.float64 and z.shape == (512, 1024) and bool((z == 0).all())
    del z
    b = memory.new_zeros((1024, 256, 2), torch.bfloat16)  # 1 MiB: below the threshold, plain torch
    assert b.dtype == torch.bfloat16 and bool((b == 0).all())
    h = memory.new_zeros((2, 1 << 18), torch.float16)  # 1 MiB
    r = memory.new_zeros((1 << 19,), torch.float32)  # reuses the 7.0-filled buffer: zeroed
    assert bool((r == 0).all())
    del h, b, r


def test_disabled_and_capped(monkeypatch):
    monkeypatch.setenv("CVOPS_RECYCLE", "0")
    a = memory.new_empty(BIG, torch.float32)
    assert a.shape == BIG and memory._RECYCLER.held_bytes() == 0
    del a
    monkeypatch.setenv("CVOPS_RECYCLE", "1")
    monkeypatch.setenv("CVOPS_RECYCLE_MB", "3")  # room for one 2 MiB buffer
    keep = [memory.new_empty(BIG, torch.float32) for _ in range(3)]
    assert memory._RECYCLER.held_bytes() == 2 << 20
    del keep
    assert memory.empty_cache() == 2 << 20 and memory._RECYCLER.held_bytes() == 0
