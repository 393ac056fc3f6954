"""The wire in training, one cut in one process: int8's gradient comes back as int8, and lowrank's error
feedback keeps both ends' copies equal while the error it leaves shrinks epoch after epoch."""

from __future__ import annotations

import pytest
import torch

from remote.floor.wire import parse_format
from remote.toolkit.codec import Codec


def _cross(sender: Codec, receiver: Codec, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """x through the cut as gloo would carry it: the receiver gets the payload's bytes, not its graph."""
    payload = sender.encode((x,))
    received = tuple(t.detach().clone().requires_grad_(True) for t in payload)
    (state,) = receiver.decode(received)
    return state, (payload, received)


@pytest.mark.parametrize("shape", [(2, 17, 96), (2, 24, 4, 7)])  # a ViT's tokens; a CNN map of odd width
def test_int8_sends_a_byte_a_value_forward_and_back(shape: tuple[int, ...]) -> None:
    fmt = parse_format("int8")
    sender, receiver = Codec(None, fmt), Codec(fmt, None, [torch.Size((1, *shape[1:]))])
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    state, (payload, received) = _cross(sender, receiver, x)
    rows, width = x.numel() // shape[-1], shape[-1]
    sent = sum(t.numel() * t.element_size() for t in payload)
    assert sent == rows * (4 * -(-width // 4)) + 4 * rows  # each row's values padded to 4 bytes, and its scale
    step = x.detach().abs().amax(-1, keepdim=True) / 127
    assert bool(((state - x).abs() <= step / 2 + 1e-6).all())
    grad = torch.randn(shape)
    state.backward(grad)
    back = [t.grad for t in received]
    assert all(g is not None for g in back)
    assert sum(g.numel() * g.element_size() for g in back) == sent  # the gradient comes back the same size
    torch.autograd.backward(payload, back)
    gstep = grad.abs().amax(-1, keepdim=True) / 127
    assert bool(((x.grad - grad).abs() <= gstep / 2 + 1e-6).all()) and not torch.equal(x.grad, grad)


def _epochs(feedback: bool, epochs: int = 4) -> tuple[list[float], Codec, Codec]:
    fmt = parse_format("lowrank:2")
    sender, receiver = Codec(None, fmt, feedback=feedback), Codec(fmt, None, [torch.Size((1, 17, 96))],
                                                                 feedback=feedback)
    images = torch.randn(8, 17, 96, generator=torch.Generator().manual_seed(1))
    micro = [[0, 1, 2, 3], [4, 5, 6, 7]]
    errors = []
    for _ in range(epochs):
        for codec in (sender, receiver):
            codec.expect(micro)
        for m in micro:
            x = images[m].clone().requires_grad_(True)
            state, _ = _cross(sender, receiver, x)
            errors.append(float((state - x).detach().norm() / x.detach().norm()))
    return [max(errors[i:i + 2]) for i in range(0, len(errors), 2)], sender, receiver


def test_lowrank_error_feedback_shrinks_the_error_and_keeps_both_copies_equal() -> None:
    plain, _, _ = _epochs(feedback=False)
    fed, sender, receiver = _epochs(feedback=True)
    assert plain[0] == pytest.approx(fed[0])  # the first epoch sends the states themselves
    assert all(e == pytest.approx(plain[0]) for e in plain)  # without feedback: the same error every epoch
    assert all(b < 0.93 * a for a, b in zip(fed, fed[1:], strict=False)), fed  # with it: smaller each epoch
    assert sender.sent is not None and receiver.received is not None
    kept_s, kept_r = sender.sent._kept, receiver.received._kept  # noqa: SLF001  (the copies themselves)
    assert kept_s.keys() == kept_r.keys() == set(range(8))
    assert all(torch.equal(kept_s[n][0], kept_r[n][0]) for n in kept_s)
    assert sender.sent.nbytes == 8 * 17 * 96 * 4
    # Evaluation (no gradient) compresses the state itself and leaves the copies alone.
    before = {n: kept_s[n][0].clone() for n in kept_s}
    with torch.no_grad():
        sender.expect([[0, 1]])
        receiver.expect([[0, 1]])
        state, _ = _cross(sender, receiver, torch.randn(2, 17, 96))
    assert all(torch.equal(before[n], kept_s[n][0]) for n in kept_s)
