"""weighted_cross_entropy and token_log_probs against the full logits, over many chunks, and what they hold."""

from __future__ import annotations

import pytest
import torch

import packing_collators.loss._chunked as chunked
from packing_collators.loss import LogitTransform, chunk_rows, token_log_probs, weighted_cross_entropy

TRANSFORMS = [LogitTransform(), LogitTransform(scale=0.3), LogitTransform(scale=2.0, softcap=3.0),
              LogitTransform(temperature=0.7), LogitTransform(scale=2.0, softcap=3.0, temperature=1.5)]  # fmt: skip


# Each chunk path with every transform, but Triton's (its interpreter runs a Python program per row: seconds a test)
# with the plain one and the one that has them all (scale, soft cap, temperature); its kernel meets every transform
# over several vocabulary blocks in test_the_triton_rows_compute_the_eager_chunks_numbers_over_several_vocabulary_blocks
PATHS = [(path, t) for path in ("eager", "gpu") for t in TRANSFORMS] + [("triton", TRANSFORMS[0]), ("triton", TRANSFORMS[4])]


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunked, "_CHUNK_BYTES", 128 * 50 * 4)  # chunks of 128 tokens at a vocabulary of 50 (float32)


@pytest.fixture
def gpu_chunks(monkeypatch):
    """The GPU's way through a chunk (logits in the projection's dtype, the gradient over them), uncompiled."""
    monkeypatch.setattr(chunked, "_compiled", lambda compiled, *where: chunked._chunk_in_place if compiled else None)


@pytest.fixture
def triton_chunks(monkeypatch):
    """The GPU's Triton kernel (one program per row: the loss, the gradient over the logits, the statistics), run by
    Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET before Triton is imported)."""
    pytest.importorskip("triton")  # scripts/install.sh adds it (Linux x86-64); in the oldest venv where CUDA torch brought it
    monkeypatch.setattr(chunked, "_compiled", lambda compiled, *where: chunked._triton_rows.chunk if compiled else None)


@pytest.fixture(params=["eager", "gpu", "triton"])
def chunk_path(request, small_chunks, monkeypatch):
    """Each way through a chunk: eager (float32 logits), the GPU's without Triton (see ``gpu_chunks``), and with it.
    Its value is the rows a test makes: 300 in chunks of 128; Triton's interpreter (a Python program per row) 40 in
    chunks of 16 (three chunks, the last one short, either way)."""
    if request.param == "gpu":
        request.getfixturevalue("gpu_chunks")
    if request.param == "triton":
        request.getfixturevalue("triton_chunks")
        monkeypatch.setattr(chunked, "chunk_rows", lambda vocab, max_rows=None, element_size=4: 16)
        return 40
    return 300


def _inputs(bias: bool, n: int = 300, hidden: int = 16, vocab: int = 50, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g).requires_grad_()
    w = torch.randn(vocab, hidden, generator=g).requires_grad_()
    b = torch.randn(vocab, generator=g).requires_grad_() if bias else None
    return h, w, b, torch.randint(0, vocab, (n,), generator=g), torch.rand(n, generator=g)


def _grads(*tensors):
    out = [t.grad.clone() for t in tensors if t is not None]
    for t in tensors:
        if t is not None:
            t.grad = None
    return out


@pytest.mark.parametrize(("chunk_path", "transform"), PATHS, indirect=["chunk_path"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_weighted_loss_and_its_gradients_are_the_full_logits_ones(small_chunks, chunk_path, transform, bias):
    h, w, b, targets, weights = _inputs(bias, n=chunk_path)
    rows = chunked.chunk_rows(50)
    assert 2 * rows < h.shape[0] < 3 * rows  # three chunks, the last one short
    logits = transform.apply(h @ w.t() + (b if bias else 0))
    full = (weights * torch.nn.functional.cross_entropy(logits, targets, reduction="none")).sum()
    full.backward()
    expected = _grads(h, w, b)
    loss = weighted_cross_entropy(h, w, b, targets, weights, transform)
    loss.backward()
    assert float(loss) == pytest.approx(float(full), rel=1e-6)
    for got, want in zip(_grads(h, w, b), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("chunk_path", "transform"), PATHS, indirect=["chunk_path"])
def test_token_log_probs_and_their_gradients_are_the_full_logits_ones(small_chunks, chunk_path, transform):
    h, w, b, targets, upstream = _inputs(True, n=chunk_path)
    full = torch.log_softmax(transform.apply(h @ w.t() + b), -1).gather(1, targets[:, None])[:, 0]
    (full * upstream).sum().backward()
    expected = _grads(h, w, b)
    ours = token_log_probs(h, w, b, targets, transform)
    (ours * upstream).sum().backward()
    torch.testing.assert_close(ours, full.detach(), rtol=1e-5, atol=1e-5)
    for got, want in zip(_grads(h, w, b), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_loss_alone_without_gradients_makes_none(small_chunks, monkeypatch):
    h, w, _, targets, weights = _inputs(False)
    made = []
    monkeypatch.setattr(chunked._Chunks, "__init__", lambda self, *a: made.append(1) or None)
    with torch.no_grad():
        loss = weighted_cross_entropy(h, w, None, targets, weights)
    assert made == [] and loss.grad_fn is None
    full = (weights * torch.nn.functional.cross_entropy(h @ w.t(), targets, reduction="none")).sum()
    assert float(loss) == pytest.approx(float(full), rel=1e-6)


def test_no_target_gives_a_zero_loss_that_still_backpropagates():
    h, w, _, _, _ = _inputs(False, n=0)
    loss = weighted_cross_entropy(h, w, None, torch.zeros(0, dtype=torch.long), torch.zeros(0))
    loss.backward()
    assert float(loss) == 0.0 and float(w.grad.abs().sum()) == 0.0


def test_chunks_hold_at_most_4096_tokens_and_about_a_gib_of_logits():
    assert [chunk_rows(v) for v in (512, 32_000, 151_936, 248_320)] == [4096, 4096, 1664, 1024]
    assert all(chunk_rows(v) * v * 4 <= (1 << 30) for v in (151_936, 248_320))
    # the compiled chunk's logits in bf16: as many bytes, twice the rows (half the passes over dW's accumulator)
    assert [chunk_rows(v, element_size=2) for v in (512, 151_936, 248_320)] == [4096, 3456, 2048]
    assert all(chunk_rows(v, element_size=2) * v * 2 <= (1 << 30) for v in (151_936, 248_320))


def test_under_autocast_the_projection_runs_in_the_autocast_dtype_and_accumulates_in_float32():
    h, w, _, targets, _ = _inputs(False, n=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).float(), targets)
        loss = weighted_cross_entropy(h, w, None, targets, torch.full((64,), 1 / 64))
    assert float(loss) == pytest.approx(float(reference), rel=1e-2)  # the reference rounds its logits to bf16
    loss.backward()
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.float32


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_the_compiled_chunk_computes_the_eager_chunks_numbers_and_writes_the_gradient_over_the_logits(transform):
    # what torch.compile fuses on a GPU: the same arithmetic, the gradient in place (run here uncompiled)
    g = torch.Generator().manual_seed(0)
    z, targets, weights = torch.randn(40, 50, generator=g), torch.randint(0, 50, (40,), generator=g), torch.rand(40)
    t = transform.temperature
    eager = chunked._chunk_eager(z.clone(), targets, weights, transform.scale, transform.softcap, torch.float32, True, t)
    in_place = z.clone()
    numbers = chunked._chunk_in_place(in_place, targets, weights, transform.scale, transform.softcap, True, t)
    for a, b in zip(eager, (*numbers, in_place)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # bf16 logits: the softmax and the gradient computed in float32 from them, the gradient rounded once
    low = z.to(torch.bfloat16)
    expected = chunked._chunk_eager(low.float(), targets, weights, transform.scale, transform.softcap, torch.bfloat16, True, t)
    numbers = chunked._chunk_in_place(low, targets, weights, transform.scale, transform.softcap, True, t)
    for a, b in zip(expected[:3], numbers):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert low.dtype == torch.bfloat16 and torch.equal(low, expected[3])


def test_compiled_the_chunk_writes_its_gradient_into_the_logits_buffer():
    # torch.compile with an input mutated in place (aot_eager here: the graph Inductor gets on a GPU)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(7, 50, generator=g).to(torch.bfloat16)
    targets, weights = torch.randint(0, 50, (7,), generator=g), torch.rand(7, generator=g)
    expected = chunked._chunk_eager(z.float(), targets, weights, 0.5, 3.0, torch.bfloat16, True)
    buffer = z.clone()
    numbers = torch.compile(chunked._chunk_in_place, backend="aot_eager", dynamic=True)(
        buffer, targets, weights, 0.5, 3.0, True
    )
    for a, b in zip(expected[:3], numbers):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(buffer, expected[3])


def test_in_bf16_the_gpu_path_has_the_full_logit_losss_bf16_logits(small_chunks, gpu_chunks):
    h, w, _, targets, _ = _inputs(False, n=300, hidden=64)
    h, w = h.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_()
    logits = torch.nn.functional.linear(h, w)  # bf16, as a bf16 model's head returns them
    reference = torch.nn.functional.cross_entropy(logits.float(), targets)
    reference.backward()
    expected = _grads(h, w)
    loss = weighted_cross_entropy(h, w, None, targets, torch.full((300,), 1 / 300))
    loss.backward()
    assert float(loss) == pytest.approx(float(reference), rel=1e-5)  # the same bf16 logits, each softmax in float32
    for got, want in zip(_grads(h, w), expected):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-3)


def test_a_weight_not_in_float32_gets_its_gradient_from_float32_blocks_converted_one_at_a_time(monkeypatch):
    h, w, _, targets, weights = _inputs(False, n=64, hidden=16, vocab=300)
    h, w = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    weighted_cross_entropy(h, w, None, targets, weights).backward()
    whole = _grads(h, w)
    monkeypatch.setattr(chunked, "_BLOCK_ELEMENTS", 150 * 16)  # 150 rows, rounded down to 128, per block
    made = []
    original = chunked._Chunks.result
    monkeypatch.setattr(chunked._Chunks, "result", lambda self, *a: made.append(len(self.dw)) or original(self, *a))
    weighted_cross_entropy(h, w, None, targets, weights).backward()
    assert made == [3]  # 128 + 128 + 44 rows
    for got, want in zip(_grads(h, w), whole):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("transform", [LogitTransform(scale=0.5), LogitTransform(scale=2.0, softcap=3.0, temperature=1.5)])
def test_token_statistics_are_the_full_logits_ones(small_chunks, chunk_path, transform):
    h, w, b, targets, _ = _inputs(True, n=chunk_path)
    logits = transform.apply(h @ w.t() + b)
    targets[::4] = logits.argmax(-1)[::4]  # some tokens are top-1 (the rest by chance)
    stats = {}
    token_log_probs(h, w, b, targets, transform, stats=stats)
    log_p = torch.log_softmax(logits, -1)
    torch.testing.assert_close(stats["entropy"], -(log_p.exp() * log_p).sum(-1).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats["mean_logits"], logits.mean(-1).detach(), rtol=1e-5, atol=1e-6)
    assert torch.equal(stats["is_top1"], (logits.argmax(-1) == targets).float())
    assert 0 < float(stats["is_top1"].sum()) < len(targets)  # some tokens are top-1, some not
    square = torch.log((log_p.exp() ** 2).sum(-1)).detach()  # WPO's log sum p^2
    torch.testing.assert_close(stats["log_sum_sq_probs"], square, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("chunk_path", "transform"), PATHS, indirect=["chunk_path"])
def test_entropies_asked_with_gradients_backpropagate_as_the_full_logits_ones(small_chunks, chunk_path, transform):
    """An entropy bonus (TRL's entropy_coef) differentiates each token's entropy too: the backward of
    ``log p(target) * a + entropy * b`` equals the full logits' through the transform; asked without, the
    entropies carry no gradient (what trainers log)."""
    h, w, b, targets, upstream = _inputs(True, n=chunk_path)
    bonus = torch.rand(len(targets), generator=torch.Generator().manual_seed(1))
    log_p = torch.log_softmax(transform.apply(h @ w.t() + b), -1)
    full_entropy = -(log_p.exp() * log_p).sum(-1)
    ((log_p.gather(1, targets[:, None])[:, 0] * upstream).sum() + (full_entropy * bonus).sum()).backward()
    expected = _grads(h, w, b)
    stats = {}
    ours = token_log_probs(h, w, b, targets, transform, stats=stats, entropy_grad=True)
    ((ours * upstream).sum() + (stats["entropy"] * bonus).sum()).backward()
    torch.testing.assert_close(stats["entropy"].detach(), full_entropy.detach(), rtol=1e-5, atol=1e-5)
    for got, want in zip(_grads(h, w, b), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    logged = {}
    token_log_probs(h, w, b, targets, transform, stats=logged)
    assert not logged["entropy"].requires_grad


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_the_triton_rows_compute_the_eager_chunks_numbers_over_several_vocabulary_blocks(transform):
    # one program per row reads the vocabulary 2,048 columns at a time: two full blocks and a short one here
    pytest.importorskip("triton")
    from packing_collators.loss import _triton_rows

    vocab, g = 2 * 2048 + 7, torch.Generator().manual_seed(2)
    z = torch.randn(6, vocab, generator=g) * 4
    targets, weights, t = torch.tensor([0, 2047, 2048, 4102, vocab - 1, 4100]), torch.rand(6, generator=g), transform.temperature
    z[5, [17, 4100]] = z[5].max() + 1  # a tie for the largest logit: is_top1 is argmax's, the first of them (not 4100)
    expected = chunked._chunk_eager(z.clone(), targets, weights, transform.scale, transform.softcap, torch.float32, True, t)
    in_place = z.clone()
    numbers = _triton_rows.chunk(in_place, targets, weights, transform.scale, transform.softcap, True, t)
    for a, b in zip(expected, (*numbers, in_place)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    found = _triton_rows.row_stats(z, targets, transform.scale, transform.softcap, t)
    logits = transform.apply(z)
    log_p = torch.log_softmax(logits, -1)
    torch.testing.assert_close(found["entropy"], -(log_p.exp() * log_p).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(found["mean_logits"], logits.mean(-1), rtol=1e-5, atol=1e-6)
    assert torch.equal(found["is_top1"], (logits.argmax(-1) == targets).float()) and found["is_top1"][5] == 0
    torch.testing.assert_close(found["log_sum_sq_probs"], torch.log((log_p.exp() ** 2).sum(-1)), rtol=1e-5, atol=1e-5)
    # bf16 logits, as the GPU path holds them: float32 arithmetic from them, the gradient rounded once in place
    low = z.to(torch.bfloat16)
    expected = chunked._chunk_eager(low.float(), targets, weights, transform.scale, transform.softcap, torch.bfloat16, True, t)
    numbers = _triton_rows.chunk(low, targets, weights, transform.scale, transform.softcap, True, t)
    for a, b in zip(expected[:3], numbers):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), expected[3].float(), rtol=2**-7, atol=1e-6)  # one bf16 step apart at most


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_log_probs_whose_entropy_nothing_differentiates_take_the_plain_backward(monkeypatch, entropy_grad):
    # the entropy's autograd path recomputes each chunk's softmax under autograd in small chunks: only for a loss that
    # rewards the entropy (with it unused, or not asked for, the backward is the weighted gradient's)
    h, w, b, targets, _ = _inputs(True)
    expected = torch.autograd.grad(torch.log_softmax(h @ w.t() + b, -1)[torch.arange(len(targets)), targets].sum(), (h, w, b))
    monkeypatch.setattr(chunked, "_log_prob_and_entropy_grad", lambda *a: pytest.fail("the entropy's autograd path"))
    out = token_log_probs(h, w, b, targets, stats={}, entropy_grad=entropy_grad)
    for got, want in zip(torch.autograd.grad(out.sum(), (h, w, b)), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_entropy_bonus_alone_backpropagates_through_the_entropy():
    h, w, b, targets, _ = _inputs(True)
    log_p = torch.log_softmax(h @ w.t() + b, -1)
    expected = torch.autograd.grad(-(log_p.exp() * log_p).sum(), (h, w, b))
    stats = {}
    token_log_probs(h, w, b, targets, stats=stats, entropy_grad=True)
    for got, want in zip(torch.autograd.grad(stats["entropy"].sum(), (h, w, b)), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_triton_kernel_is_checked_on_its_device_once_and_left_for_the_compiled_chunk_where_it_fails(monkeypatch):
    pytest.importorskip("triton")
    from packing_collators.loss import _triton_rows

    _triton_rows._trusted.works_on.cache_clear()
    assert _triton_rows._trusted.works_on("cpu")  # the interpreter's numbers are torch's
    monkeypatch.setattr(_triton_rows, "chunk", lambda *a: (_ for _ in ()).throw(RuntimeError("no sm_99 target")))
    _triton_rows._trusted.works_on.cache_clear()
    with pytest.warns(UserWarning, match="Triton kernel failed on cpu .RuntimeError: no sm_99 target"):
        assert not _triton_rows._trusted.works_on("cpu")

    def wrong(z, *args):  # a kernel that runs and writes other numbers
        z.zero_()
        return torch.zeros(()), torch.zeros(z.shape[0]), torch.zeros(z.shape[0])

    monkeypatch.setattr(_triton_rows, "chunk", wrong)
    _triton_rows._trusted.works_on.cache_clear()
    with pytest.warns(UserWarning, match="other numbers than torch's softmax"):
        assert not _triton_rows._trusted.works_on("cpu")
    _triton_rows._trusted.works_on.cache_clear()
