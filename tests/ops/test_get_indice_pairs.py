"""get_indice_pairs: the shared op tester's checks (every backend exactly equal to the loop reference, the
whole contract, order included, on the unit cases with int32 and int64 indices; contiguity, zero elements,
bad input, opcheck, compile, export) and what is get_indice_pairs' own: the output contract, hand-computed maps,
a dense-convolution oracle, the numba subm map, network scale, the MLU-OPS statuses."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import cvops
from cvops import mluops
from tests.support.cases import case_id, load_cases
from cvops._core.errors import BadParamError, Status
from tests.support.inputs import get_indice_pairs as voxels
from tests.conftest import CPU_PATHS, requires_triton
from tests.support.op_tester import OpTester, Sample

# both CPU backends (the numba loops and plain torch)
FAST_BACKENDS = CPU_PATHS + [pytest.param("triton", marks=requires_triton)]
UNIT = load_cases("get_indice_pairs", "unit")
NETWORK = load_cases("get_indice_pairs", "network")
INDEX_DTYPES = (torch.int32, torch.int64)


def assert_same(actual, expected):
    for name, a, e in zip(("out_indices", "indice_pairs", "indice_num"), actual, expected):
        assert a.dtype == torch.int32, name
        assert a.shape == e.shape, (name, a.shape, e.shape)
        assert torch.equal(a, e), name


def run(case, backend, indices=None):
    idx = voxels.case_indices(case) if indices is None else indices
    return cvops.get_indice_pairs(idx, backend=backend, **voxels.case_kwargs(case))


def _tuple(v, n):
    return tuple(v) if isinstance(v, (list, tuple)) else (v,) * n


GOOD = dict(batch_size=2, spatial_shape=[5, 6, 7], kernel_size=3, stride=1, padding=1, dilation=1)


def _idx():
    return voxels.uniform_voxels(10, 2, [5, 6, 7], seed=1)


def _bad_param(change, pattern):
    return (" ".join(f"{k}={v}" for k, v in change.items()),
            lambda b: cvops.get_indice_pairs(_idx(), **{**GOOD, **change, "backend": change.get("backend", b)}),
            BadParamError, pattern)


def _bad_indices(name, change, pattern, subm=False):
    return (name, lambda b: cvops.get_indice_pairs(change(_idx()), **GOOD, subm=subm, backend=b), BadParamError,
            pattern)


def _set(row, col, value):
    def change(idx):
        idx[row, col] = value
        return idx
    return change


@st.composite
def _maps(draw):
    """Any valid or invalid map of at most 30 sites on a grid of 1 to 4 dimensions."""
    ndim, batch = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 6)) for _ in range(ndim)]
    volume = batch * torch.Size(shape).numel()
    L = draw(st.integers(1, min(volume, 30)))
    idx = voxels.uniform_voxels(L, batch, shape, seed=draw(st.integers(0, 99)))
    subm = draw(st.booleans())
    transpose = not subm and draw(st.booleans())
    k = [draw(st.integers(1, 4)) for _ in range(ndim)]
    s = [1] * ndim if subm else [draw(st.integers(1, 3)) for _ in range(ndim)]
    d = [draw(st.integers(1, 2)) if s[i] == 1 else 1 for i in range(ndim)]
    p = [draw(st.integers(0, 2)) for _ in range(ndim)]
    return Sample(indices=idx, kw=dict(batch_size=batch, spatial_shape=shape, kernel_size=k, stride=s, padding=p,
                                       dilation=d, subm=subm, transpose=transpose))


@st.composite
def _small_maps(draw):
    """Maps of 25 sites on a 4 x 5 x 6 grid (the Triton interpreter's size)."""
    subm, k, s = draw(st.booleans()), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    idx = voxels.uniform_voxels(25, 2, [4, 5, 6], seed=draw(st.integers(0, 50)))
    return Sample(indices=idx, kw=dict(batch_size=2, spatial_shape=[4, 5, 6], kernel_size=k,
                                       stride=1 if subm else s, padding=k // 2, dilation=1, subm=subm))


class TestGetIndicePairs(OpTester):
    op = "get_indice_pairs"
    exact = True
    dtypes = INDEX_DTYPES          # the index dtypes: the results are int32 either way
    case_dtypes = INDEX_DTYPES
    base_dtype = torch.int32
    property_examples = {"torch": 40, "numba": 40, "triton": 6}
    bad_inputs = tuple(_bad_param(change, pattern) for change, pattern in [
        (dict(batch_size=0), "batch_size must be >= 1"),
        (dict(batch_size=2.0), "batch_size must be an int"),
        (dict(spatial_shape=[5, 6]), r"indices must be \[L, NDim \+ 1\]"),
        (dict(spatial_shape=[5, 0, 7]), "spatial_shape must be >= 1"),
        (dict(spatial_shape=[2, 2, 2, 2, 2]), "1 to 4 dimensions"),
        (dict(spatial_shape=5), "spatial_shape must be a sequence"),
        (dict(kernel_size=0), "kernel_size must be >= 1"),
        (dict(kernel_size=[3, 3]), "kernel_size must be an int or 3 ints"),
        (dict(stride=0), "stride must be >= 1"),
        (dict(padding=-1), "padding must be >= 0"),
        (dict(dilation=0), "dilation must be >= 1"),
        (dict(stride=2, dilation=2), "cannot both be > 1"),
        (dict(stride=[1, 2, 1], dilation=[1, 2, 1]), "dimension 1 cannot both be > 1"),
        (dict(kernel_size=9, padding=0), "output spatial shape .* must be positive"),
        (dict(subm=True, stride=2), "subm requires stride 1"),
        (dict(subm=True, transpose=True), "subm and transpose"),
        (dict(subm=True, out_spatial_shape=[5, 6, 8]), "subm requires out_spatial_shape"),
        (dict(out_spatial_shape=[5, 0, 7]), "out_spatial_shape must be >= 1"),
        (dict(out_padding=-1), "out_padding must be >= 0"),
        (dict(backend="gpu"), "backend"),
    ]) + (
        _bad_indices("float indices", lambda i: i.float(), "dtype"),
        _bad_indices("3-D indices", lambda i: i[None], "2-D"),
        _bad_indices("list indices", lambda i: i.tolist(), "torch.Tensor"),
        *(_bad_indices(f"{what} {value}", _set(3, col, value), f"indices {what} must lie in")
          for col, value, what in ((0, 2, "batch"), (0, -1, "batch"), (1, 5, "coordinate 0"), (3, 7, "coordinate 2"),
                                   (2, -1, "coordinate 1"))),
        _bad_indices("subm duplicate rows", lambda i: torch.cat([i, i[2:3]]), "duplicate", subm=True),
    )

    def case_samples(self, case, layout, dtype):
        return [Sample(indices=voxels.case_indices(case).to(dtype), kw=voxels.case_kwargs(case))]

    def small_samples(self, layout, dtype):
        idx = voxels.uniform_voxels(50, 2, [5, 6, 7], seed=2).to(dtype)
        return [Sample(indices=idx, kw=dict(GOOD, subm=subm)) for subm in (False, True)]

    def deterministic_samples(self, layout, backend):
        if backend not in ("torch", "numba"):
            return self.small_samples(layout, torch.int32)
        idx = voxels.lidar_voxels(2000, 2, [11, 64, 64], seed=9)
        return [Sample(indices=idx, kw=dict(GOOD, spatial_shape=[11, 64, 64], stride=stride, subm=subm))
                for subm, stride in ((True, 1), (False, 2))]

    def grad_samples(self, layout):
        idx = voxels.uniform_voxels(30, 2, [5, 6, 7], seed=3)
        return [Sample(indices=idx, kw=dict(GOOD, stride=stride, subm=subm))
                for subm, stride in ((False, 2), (True, 1))]

    def zero_samples(self, layout):
        idx = torch.zeros((0, 4), dtype=torch.int32)
        return [(Sample(indices=idx, kw=dict(GOOD, subm=subm)), ((0, 4), (27, 2, 0), (27,))) for subm in (False, True)]

    def check_zero(self, results, sample):
        assert all(r.dtype == torch.int32 for r in results) and not results[2].any()

    def run(self, s, backend):
        return cvops.get_indice_pairs(s.indices, backend=backend, **s.kw)

    def strategy(self, backend):
        return _small_maps() if backend == "triton" else _maps()


def check_contract(indices, out_indices, pairs, num, *, batch_size, spatial_shape, kernel_size=3, stride=1,
                   padding=0, dilation=1, out_padding=0, subm=False, transpose=False, out_spatial_shape=None):
    """The output contract of decisions.md, checked independently of any backend (vectorised)."""
    n = len(spatial_shape)
    k, s, p, d = (_tuple(v, n) for v in (kernel_size, stride, padding, dilation))
    if out_spatial_shape is None:
        if subm:
            out_spatial_shape = spatial_shape
        elif transpose:
            out_spatial_shape = cvops.get_deconv_output_size(spatial_shape, k, s, p, d, out_padding)
        else:
            out_spatial_shape = cvops.get_conv_output_size(spatial_shape, k, s, p, d)
    K, L = 1, indices.shape[0]
    for kk in k:
        K *= kk
    assert pairs.shape == (K, 2, L) and num.shape == (K,) and out_indices.shape[1] == n + 1
    assert pairs.dtype == num.dtype == out_indices.dtype == torch.int32
    M = out_indices.shape[0]
    if subm:
        assert torch.equal(out_indices, indices.to(torch.int32))
    else:  # sorted strictly ascending by (b, *coords): unique and lexicographic
        key = torch.zeros(M, dtype=torch.int64)
        for c, size in enumerate([batch_size] + list(out_spatial_shape)):
            assert bool((out_indices[:, c] >= 0).all() and (out_indices[:, c] < size).all())
            key = key * size + out_indices[:, c].long()
        assert bool((key[1:] > key[:-1]).all())
    slots = torch.arange(L)
    used = torch.zeros(M, dtype=torch.bool)
    offsets = list(itertools.product(*[range(kk) for kk in k]))
    for kk, t in enumerate(offsets):
        c = int(num[kk])
        assert torch.equal(pairs[kk, :, c:], torch.full_like(pairs[kk, :, c:], -1))
        i, j = pairs[kk, 0, :c].long(), pairs[kk, 1, :c].long()
        assert bool((i[1:] > i[:-1]).all()), "pairs of one offset ascend by input row"
        assert bool((i >= 0).all() and (i < L).all() and (j >= 0).all() and (j < M).all())
        src, dst = indices[i].long(), out_indices[j].long()
        assert torch.equal(src[:, 0], dst[:, 0])
        expect_valid = torch.ones(L, dtype=torch.bool)
        for dim in range(n):
            pd = indices[:, dim + 1].long()
            if transpose:
                o = pd * s[dim] - p[dim] + t[dim] * d[dim]
                ok = (o >= 0) & (o < out_spatial_shape[dim])
            else:
                num_ = pd + p[dim] - t[dim] * d[dim]
                o = torch.div(num_, s[dim], rounding_mode="floor")
                ok = (num_ >= 0) & (num_ % s[dim] == 0) & (o < out_spatial_shape[dim])
            expect_valid &= ok
            assert torch.equal(dst[:, dim + 1], o[i]), "pair maps input to its output position"
        if subm:  # a tap counts iff its output position is an input site
            assert bool(expect_valid[i].all())
        else:
            assert torch.equal(slots[expect_valid], i), "every in-grid tap yields a pair"
        used[j] = True
    if not subm:
        assert bool(used.all()), "every output site comes from some pair"


# -------------------------------------------------------------------------------- the semantics itself
def test_hand_computed_1d_sparse():
    # spatial 4, k3 s2 p1: out size 2, o = (p + 1 - t) / 2 when exact
    idx = torch.tensor([[0, 0], [0, 1], [0, 3]], dtype=torch.int32)
    for backend in ("reference", "torch"):
        out, pairs, num = cvops.get_indice_pairs(idx, 1, [4], 3, 2, 1, 1, backend=backend)
        assert out.tolist() == [[0, 0], [0, 1]]
        assert num.tolist() == [1, 1, 2]
        assert pairs[0].tolist() == [[1, -1, -1], [1, -1, -1]]
        assert pairs[1].tolist() == [[0, -1, -1], [0, -1, -1]]
        assert pairs[2].tolist() == [[1, 2, -1], [0, 1, -1]]


def test_single_site_subm_identity_at_padding_offset():
    idx = torch.tensor([[0, 1, 1, 1]], dtype=torch.int32)
    out, pairs, num = cvops.get_indice_pairs(idx, 1, [3, 3, 3], 3, 1, 1, 1, subm=True)
    assert num.tolist() == [0] * 13 + [1] + [0] * 13
    assert pairs[13].tolist() == [[0], [0]]
    # padding as given (MLU-OPS), not forced to k // 2: with padding 0 the identity sits at offset 0
    out, pairs, num = cvops.get_indice_pairs(idx, 1, [3, 3, 3], 3, 1, 0, 1, subm=True)
    assert num.tolist() == [1] + [0] * 26 and pairs[0].tolist() == [[0], [0]]


def test_out_indices_sorted_not_first_encounter():
    idx = torch.tensor([[1, 0, 0, 0], [0, 2, 2, 2]], dtype=torch.int32)
    out, pairs, num = cvops.get_indice_pairs(idx, 2, [3, 3, 3], 1, 1, 0, 1)
    assert out.tolist() == [[0, 2, 2, 2], [1, 0, 0, 0]]
    assert pairs[0].tolist() == [[0, 1], [1, 0]]


@pytest.mark.parametrize("case", [c for c in UNIT if not c.get("subm") and not c.get("transpose")
                                  and c.get("dilation", 1) == 1], ids=case_id)
def test_output_sites_match_dense_convolution(case):
    """An independent oracle: the active output sites are where a dense conv of the occupancy is > 0."""
    idx = voxels.case_indices(case)
    kw = voxels.case_kwargs(case)
    shape = kw["spatial_shape"]
    if len(shape) not in (1, 2, 3) or case["batch_size"] * torch.Size(shape).numel() > 5e6:
        pytest.skip("dense oracle for small 1-3D grids")
    n = len(shape)
    occ = torch.zeros([case["batch_size"], 1] + list(shape), dtype=torch.float64)
    occ[(idx[:, 0].long(), 0) + tuple(idx[:, c + 1].long() for c in range(n))] = 1
    conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    k = _tuple(kw["kernel_size"], n)
    dense = conv(occ, torch.ones((1, 1) + k, dtype=torch.float64), stride=kw["stride"], padding=kw["padding"],
                 dilation=kw["dilation"])
    sites = (dense[:, 0] > 0).nonzero().to(torch.int32)
    assert torch.equal(cvops.get_indice_pairs(idx, **kw)[0], sites)




@pytest.mark.parametrize("case", UNIT, ids=case_id)
def test_unit_case_reference_meets_the_contract(case):
    """The reference's maps of the unit cases (which the tester compares every backend with) meet the contract,
    and int64 indices give the same int32 results as int32 ones."""
    idx = voxels.case_indices(case)
    expected = run(case, "reference", idx)
    assert_same(run(case, "reference", idx.long()), expected)
    check_contract(idx, *expected, **voxels.case_kwargs(case))


@pytest.mark.parametrize("shape,k,p,d", [((20, 30, 25), 3, 1, 1), ((9, 11, 7), (3, 1, 5), (0, 2, 1), (2, 1, 1)),
                                         ((6, 5, 4, 7), 3, 1, 1), ((9, 11, 7), 3, 1, 2), ((9, 11, 7), 3, 2, 2)])
def test_subm_numba_merge_equals_torch_join(shape, k, p, d):
    """The numba subm map (one merge of sorted keys per offset) is the torch join's map, bit for bit, on
    unsorted sites (the pairs listed in input-row order either way)."""
    from cvops._core import jit
    if not jit.numba_available():
        pytest.skip("numba not installed")
    n = len(shape)
    idx = voxels.uniform_voxels(400, 2, list(shape), seed=3)
    idx = idx[torch.randperm(idx.shape[0], generator=torch.Generator().manual_seed(0))]
    args = (idx, 2, list(shape), list(_tuple(k, n)), [1] * n, list(_tuple(p, n)), list(_tuple(d, n)))
    results = []
    for backend in ("torch", "numba"):
        results.append(cvops.get_indice_pairs(*args, subm=True, backend=backend))
    assert int(results[0][2].sum()) > idx.shape[0]
    assert_same(results[1], results[0])


@pytest.mark.parametrize("p", [1, 0])  # centred (mirrored offsets) and not
def test_subm_numba_map_same_on_two_threads(p):
    """Large enough for the compiled subm map to share its offsets among two threads: the torch join's map."""
    from cvops._core import jit
    if not jit.numba_available():
        pytest.skip("numba not installed")
    idx = voxels.uniform_voxels(60000, 2, [21, 200, 176], seed=5)
    idx = idx[torch.randperm(idx.shape[0], generator=torch.Generator().manual_seed(1))]
    args = (idx, 2, [21, 200, 176], 3, 1, p, 1)
    threads = torch.get_num_threads()
    results = []
    try:
        for backend, count in (("torch", 1), ("numba", 2)):
            torch.set_num_threads(count)
            assert jit.use_parallel(27 * idx.shape[0] * 4) == (count == 2)
            results.append(cvops.get_indice_pairs(*args, subm=True, backend=backend))
    finally:
        torch.set_num_threads(threads)
    assert_same(results[1], results[0])


# -------------------------------------------------------------------------------- network scale
@pytest.fixture(scope="module", params=NETWORK, ids=case_id)
def network(request):
    # many mid-size ops: one intra-op thread avoids OpenMP stalls when the other core is busy
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    case = request.param
    idx = voxels.case_indices(case)
    return case, idx, run(case, "cpu", idx)


@pytest.mark.slow
def test_network_case_contract(network):
    case, idx, result = network
    out, pairs, num = result
    expect = case["expect"]
    assert list(idx.shape) == [case["num"], 4]
    assert list(pairs.shape) == expect["indice_pairs"] and list(num.shape) == expect["indice_num"]
    if "out_indices" in expect:
        assert list(out.shape) == expect["out_indices"]
    if "out_spatial_shape" in expect:
        assert cvops.get_conv_output_size(case["spatial_shape"], 3, case["stride"], case["padding"], 1) == \
            expect["out_spatial_shape"]
    key = idx[:, 0].long()
    for c, size in enumerate(case["spatial_shape"]):
        key = key * size + idx[:, c + 1].long()
    assert key.unique().numel() == idx.shape[0], "generator: duplicate-free"
    check_contract(idx, out, pairs, num, **voxels.case_kwargs(case))
    if case.get("subm"):  # centred kernel: identity at the centre, mirrored offsets pair up
        assert int(num[13]) == idx.shape[0] and torch.equal(pairs[13, 0], pairs[13, 1])
        assert torch.equal(num, num.flip(0))
    else:  # LiDAR-like, not uniform noise: stride-2 outputs cluster (fewer sites than inputs)
        assert out.shape[0] < idx.shape[0]


def _subsample(case, idx, n):
    keep = torch.randperm(idx.shape[0], generator=torch.Generator().manual_seed(0))[:n]
    return idx[keep.sort().values]


@pytest.mark.slow
def test_network_subsample_cpu_equals_reference(network):
    case, idx, _ = network
    small = _subsample(case, idx, 1500)
    assert_same(run(case, "cpu", small), run(case, "reference", small))


@requires_triton
@pytest.mark.slow
def test_network_subsample_cpu_equals_triton(network):
    case, idx, _ = network
    small = _subsample(case, idx, 3000)
    assert_same(run(case, "triton", small), run(case, "cpu", small))


def test_output_size_helpers():
    assert cvops.get_conv_output_size([11, 360, 360], 3, 2, [0, 1, 1], 1) == [5, 180, 180]
    assert cvops.get_conv_output_size([41, 1440, 1440], 3, 1, 1, 1) == [41, 1440, 1440]
    assert cvops.get_conv_output_size([10, 10], [-1, 3], 1, 0, 2) == [1, 6]
    assert cvops.get_deconv_output_size([5, 180, 180], 3, 2, [0, 1, 1], 1, 0) == [11, 359, 359]
    assert cvops.get_deconv_output_size([4], 3, 2, 1, 1, 1) == [8]
    with pytest.raises(BadParamError, match="global"):
        cvops.get_deconv_output_size([4], -1, 2, 1, 1)


def test_mmcv_style_arguments():
    idx = voxels.uniform_voxels(30, 2, [5, 6, 7], seed=8)
    expected = cvops.get_indice_pairs(idx, 2, [5, 6, 7], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1],
                                      backend="reference")
    assert_same(cvops.get_indice_pairs(idx, 2, torch.tensor([5, 6, 7]), ksize=3, stride=2, padding=1), expected)
    assert_same(cvops.get_indice_pairs(idx, 2, (5, 6, 7), 3, (2, 2, 2), 1, 1, [0, 0, 0], False, False), expected)


def test_out_spatial_shape_override():
    idx = voxels.uniform_voxels(40, 2, [5, 6, 7], seed=4)
    out, pairs, num = cvops.get_indice_pairs(idx, 2, [5, 6, 7], 3, 2, 1, 1, out_spatial_shape=[2, 2, 2])
    ref = cvops.get_indice_pairs(idx, 2, [5, 6, 7], 3, 2, 1, 1, out_spatial_shape=[2, 2, 2], backend="reference")
    assert_same((out, pairs, num), ref)
    assert int(out[:, 1:].max()) <= 1
    check_contract(idx, out, pairs, num, batch_size=2, spatial_shape=[5, 6, 7], stride=2, padding=1,
                   out_spatial_shape=[2, 2, 2])


# -------------------------------------------------------------------------------- MLU-OPS layer
def _mlu(idx, *, batch=2, space=(5, 6, 7), out_space=None, k=3, stride=1, pad=1, dil=1, subm=0, out_rows=None,
         pairs_k=None, pairs_l=None, dtype=torch.int32, with_data=True, workspace_size=0, workspace=None):
    handle = mluops.create_handle()
    desc = mluops.create_sparse_convolution_descriptor()
    out_space = out_space or (space if subm else tuple(cvops.get_conv_output_size(space, k, stride, pad, dil)))
    status = mluops.set_sparse_convolution_descriptor(desc, 5, batch, [pad] * 3, [stride] * 3, [dil] * 3, space,
                                                      [k] * 3, out_space, subm, 0, 0)
    assert status == Status.SUCCESS
    L = idx.shape[0]
    K = k ** 3 if pairs_k is None else pairs_k
    idx = idx.to(dtype)
    pairs = torch.full((K, 2, L if pairs_l is None else pairs_l), 7, dtype=dtype)
    volume = batch
    for o in out_space:
        volume *= o
    out = torch.full((min(L * K, volume) if out_rows is None else out_rows, 4), 7, dtype=dtype)  # as mmcv-MLU
    num = torch.full((K,), 7, dtype=dtype)
    d = mluops.descriptor_of
    status = mluops.get_indice_pairs(handle, desc, d(idx), idx if with_data else None, workspace, workspace_size,
                                     d(pairs), pairs, d(out), out, d(num), num)
    return status, handle, desc, out, pairs, num


@pytest.mark.parametrize("subm,stride", [(1, 1), (0, 2), (0, 1)])
def test_mluops_success_writes_outputs(subm, stride):
    idx = voxels.uniform_voxels(40, 2, [5, 6, 7], seed=5)
    status, handle, desc, out, pairs, num = _mlu(idx, subm=subm, stride=stride)
    assert status == Status.SUCCESS, handle.last_error
    ref = cvops.get_indice_pairs(idx, 2, [5, 6, 7], 3, stride, 1, 1, subm=bool(subm), backend="reference")
    st_, m = mluops.get_sparse_convolution_num_act_out(desc)
    assert st_ == Status.SUCCESS and m == ref[0].shape[0]
    assert torch.equal(out[:m], ref[0]) and (out[m:] == 7).all()   # rows past num_act_out untouched
    assert torch.equal(pairs, ref[1]) and torch.equal(num, ref[2])
    status, ws = mluops.get_indice_pairs_workspace_size(handle, desc, *(mluops.descriptor_of(t) for t in
                                                                          (idx.int(), pairs, out, num)))
    assert status == Status.SUCCESS and ws > 0


def test_mluops_zero_elements_success_untouched():
    idx = torch.zeros((0, 4), dtype=torch.int32)
    status, handle, desc, out, pairs, num = _mlu(idx, out_rows=5, with_data=False)
    assert status == Status.SUCCESS and (num == 7).all() and (out == 7).all()
    assert mluops.get_sparse_convolution_num_act_out(desc) == (Status.SUCCESS, 0)
    st_, ws = mluops.get_indice_pairs_workspace_size(handle, desc, *(mluops.descriptor_of(t) for t in
                                                                       (idx, pairs, out, num)))
    assert st_ == Status.SUCCESS and ws == 0
    # the workspace query answers 0 for zero elements before any other check, as MLU-OPS does
    d = mluops.descriptor_of
    st_, ws = mluops.get_indice_pairs_workspace_size(handle, desc, d(idx), d(torch.zeros(26, 2, 5, dtype=torch.int32)),
                                                     d(out), d(num))
    assert st_ == Status.SUCCESS and ws == 0
    assert mluops.get_indice_pairs_workspace_size(handle, desc, None, d(pairs), d(out), d(num))[0] == Status.BAD_PARAM


def test_mluops_statuses():
    idx = voxels.uniform_voxels(20, 2, [5, 6, 7], seed=6)
    assert _mlu(idx)[0] == Status.SUCCESS
    assert _mlu(idx, dtype=torch.int64)[0] == Status.BAD_PARAM               # int32 only
    assert _mlu(idx, with_data=False)[0] == Status.BAD_PARAM                 # null pointer
    assert _mlu(idx, workspace_size=64)[0] == Status.BAD_PARAM               # null workspace, size > 0
    assert _mlu(idx, workspace_size=64, workspace=torch.empty(64, dtype=torch.uint8))[0] == Status.SUCCESS
    assert _mlu(idx, pairs_k=26)[0] == Status.BAD_PARAM                      # K != prod(filter)
    assert _mlu(idx, pairs_l=21)[0] == Status.BAD_PARAM                      # pairs dims[2] != L
    assert _mlu(idx, out_rows=2 * 3 * 4 * 4 + 1, stride=2)[0] == Status.BAD_PARAM  # > B * prod(out)
    assert _mlu(idx, subm=1, out_space=(5, 6, 8))[0] == Status.BAD_PARAM     # subm: in == out
    assert _mlu(idx, subm=1, dil=2, pad=2)[0] == Status.BAD_PARAM            # subm: dilation 1
    assert _mlu(idx, stride=2, dil=2, pad=2)[0] == Status.BAD_PARAM          # stride > 1 and dil > 1
    assert _mlu(idx, k=17, pad=8)[0] == Status.BAD_PARAM                     # K = 4913 > 4096
    status, handle, *_ = _mlu(idx, out_rows=3, stride=2)                     # fewer rows than sites
    assert status == Status.BAD_PARAM and "active output sites" in handle.last_error
    bad = idx.clone()
    bad[0, 1] = 9
    status, handle, *_ = _mlu(bad)
    assert status == Status.BAD_PARAM and "coordinate 0" in handle.last_error


def test_mluops_limits_and_descriptor_setter():
    desc = mluops.create_sparse_convolution_descriptor()
    ok = ([1] * 3, [1] * 3, [1] * 3, [5, 6, 7], [3] * 3, [5, 6, 7])
    assert mluops.set_sparse_convolution_descriptor(desc, 5, 2, *ok) == Status.SUCCESS
    assert mluops.set_sparse_convolution_descriptor(desc, 4, 2, *ok) == Status.BAD_PARAM      # 3-D only
    assert mluops.set_sparse_convolution_descriptor(desc, 5, 0, *ok) == Status.BAD_PARAM      # batch > 0
    assert mluops.set_sparse_convolution_descriptor(desc, 5, 2, *ok, 0, 1, 0) == Status.BAD_PARAM  # transpose
    assert mluops.set_sparse_convolution_descriptor(desc, 5, 2, *ok, 0, 0, 1) == Status.BAD_PARAM  # inverse
    assert mluops.set_sparse_convolution_descriptor(None, 5, 2, *ok) == Status.BAD_PARAM
    for pos, bad in ((0, [-1, 1, 1]), (1, [1, 0, 1]), (2, [0, 1, 1]), (3, [5, 0, 7]), (4, [3, 0, 3]), (5, [0, 6, 7])):
        arrays = list(ok)
        arrays[pos] = bad
        assert mluops.set_sparse_convolution_descriptor(desc, 5, 2, *arrays) == Status.BAD_PARAM, pos
    assert mluops.get_sparse_convolution_num_act_out(None)[0] == Status.NOT_INITIALIZED
    # L <= 1e6 and L <= B * prod(in) are descriptor checks: no data needed to see them
    handle = mluops.create_handle()
    mluops.set_sparse_convolution_descriptor(desc, 5, 1, [1] * 3, [1] * 3, [1] * 3, [200, 200, 200], [3] * 3,
                                             [200, 200, 200], 1)
    D = mluops.create_tensor_descriptor
    A, I32 = mluops.Layout.ARRAY, mluops.DataType.INT32
    for L, expected in ((1_000_000, Status.SUCCESS), (1_000_001, Status.BAD_PARAM)):
        status, _ = mluops.get_indice_pairs_workspace_size(handle, desc, D(A, I32, (L, 4)), D(A, I32, (27, 2, L)),
                                                           D(A, I32, (L, 4)), D(A, I32, (27,)))
        assert status == expected, L
    mluops.set_sparse_convolution_descriptor(desc, 5, 1, [1] * 3, [1] * 3, [1] * 3, [2, 2, 2], [3] * 3, [2, 2, 2], 1)
    status, _ = mluops.get_indice_pairs_workspace_size(handle, desc, D(A, I32, (9, 4)), D(A, I32, (27, 2, 9)),
                                                       D(A, I32, (8, 4)), D(A, I32, (27,)))
    assert status == Status.BAD_PARAM and "prod(input_space)" in handle.last_error
    big = 2**31 // 4 + 1
    mluops.set_sparse_convolution_descriptor(desc, 5, 1, [1] * 3, [1] * 3, [1] * 3, [2000] * 3, [1] * 3, [2000] * 3, 0)
    status, _ = mluops.get_indice_pairs_workspace_size(handle, desc, D(A, I32, (10, 4)), D(A, I32, (1, 2, 10)),
                                                       D(A, I32, (big, 4)), D(A, I32, (1,)))
    assert status == Status.NOT_SUPPORTED
    assert mluops.get_indice_pairs(None, desc, None, None, None, 0, None, None, None, None, None, None) == \
        Status.BAD_PARAM


@pytest.mark.parametrize("backend", ["reference", *FAST_BACKENDS])
@pytest.mark.parametrize("kernel,padding,dilation", [(3, 1, 2), ((3, 3, 5), (1, 2, 2), (2, 1, 1)), (3, 2, 2)])
def test_subm_dilated_kernel_not_centred_by_padding(backend, kernel, padding, dilation):
    # subm k3 p1 d2 is NOT a centred kernel (that needs p = d): a shortcut that calls it centred (and
    # mirrors offsets) gives wrong pairs. Compared with the independent test-only builder.
    from tests.ops._sparse_kmap import build_kernel_map
    idx = voxels.uniform_voxels(60, 2, [5, 6, 7], seed=12)
    got = cvops.get_indice_pairs(idx, 2, [5, 6, 7], kernel, 1, padding, dilation, subm=True, backend=backend)
    n = 3
    expected = build_kernel_map(idx, 2, [5, 6, 7], _tuple(kernel, n), (1, 1, 1), _tuple(padding, n),
                                _tuple(dilation, n), subm=True)
    assert_same(got, expected)
    check_contract(idx, *got, batch_size=2, spatial_shape=[5, 6, 7], kernel_size=kernel, padding=padding,
                   dilation=dilation, subm=True)
